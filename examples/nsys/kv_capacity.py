#!/usr/bin/env python3
"""Measure the largest batch whose KV cache and one decoding step fit beside the weights, against the arithmetic.

The arithmetic (``gpuprof.studies.llm_inference.kv_capacity``) divides the memory left after the weights
by one sequence's KV cache (context x 2 x layers x KV heads x head dim x 2 bytes: 128 KiB per token for
Llama-3-8B's shapes in BF16). A real decoder needs more than that: the step's activations, its logits
([batch, 128,256], in BF16 and as the top-k's input), the rotary tables, cuBLAS's workspace, the caching
allocator's rounding, and, if attention runs on PyTorch's math backend, each layer's keys and values repeated
for the query heads that share them (the backends that accept the step are recorded). This script measures what is left of the prediction: with the weights of
``examples/nsys/llm_decode.py``'s decoder resident (``--model 8b`` on a GPU), it allocates the static KV
cache of ``batch`` sequences of ``context`` tokens (``llm_decode.StaticCache``, the reference rung's) and
runs one real decoding step at the last position (``Decoder.forward`` of one token per sequence, which
attends over the whole cache, then the top-k of its logits): the largest step of a generation that ends
at ``context``. A batch fits if neither raises out of memory. The cache is zeros (nothing is prefilled:
prefill's activations at batch x context tokens are another question, which servers answer by prefilling
in chunks); what is read does not change what is allocated.

The search: the predicted batch first, doubling while it fits, then bisection between the largest batch
that fitted and the smallest that did not; each try's memory is freed (the tensors dropped,
``torch.cuda.empty_cache``) before the next. It assumes that a batch fits whenever a larger one does
(every try is kept in the JSON, so a try that breaks that shows). Recorded per try, on a GPU:
``torch.cuda.max_memory_allocated`` and ``max_memory_reserved`` over the try, ``torch.cuda.mem_get_info``
at its peak (after the step), and what stays allocated after the release (cuBLAS keeps its workspace);
the cache's bytes are counted from its tensors on every device. The prediction is made for the same free
memory: the driver's free memory before the weights were loaded (``mem_get_info``), or
``--memory-limit-gb`` if smaller.

``--memory-limit-gb`` makes the search refuse a try that would hold more than the limit: before
allocating, when the weights and the cache alone pass it, and after the step, when the try's peak
(``max_memory_allocated``, a GPU only) does. On the CPU the limit is required (a search without one would
fill the host's memory) and is the only refusal: the CPU keeps no allocator statistics, so a try there
counts the model's and the cache's tensors only, not the step's working memory. That is enough to test
the search and its bookkeeping with ``--model tiny``; the step's working memory is measured on a GPU only.

Examples:
  python examples/nsys/kv_capacity.py --model 8b --context 4096,32768 --json kv.json      # on a GPU
  python examples/nsys/kv_capacity.py --model tiny --context 256,2048 --memory-limit-gb 0.05   # on a CPU

Without a GPU, ``--model 8b`` is refused with the memory it needs (its weights alone are 15 GiB in BF16).
"""

from __future__ import annotations

import argparse
import gc
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo
sys.path.insert(0, str(Path(__file__).resolve().parent))  # llm_decode.py, beside this file

import llm_decode as ld  # noqa: E402

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.backend import torch_device  # noqa: E402
from gpuprof.cli import bounded_int, distinct_ints, output_file, positive_float, require_memory  # noqa: E402
from gpuprof.errors import GpuprofError, is_out_of_memory  # noqa: E402
from gpuprof.kernels import write_json  # noqa: E402
from gpuprof.studies.llm_inference import kv_capacity  # noqa: E402

GIB = 2**30
DEFAULT_CONTEXTS = {"8b": (4096, 32768), "tiny": (256, 2048)}
# The rotary table is built for the longest context asked; the decoder script allows prompts up to this many positions.
MAX_CONTEXT = ld.LIMITS["prompt"]
MAX_BATCH = ld.LIMITS["batch"]


@dataclass(frozen=True)
class Trial:
    """One try of one batch at one context, as the JSON keeps it. Allocator figures are None on the CPU."""

    batch: int
    fits: bool
    why: str  # "fits", or the out-of-memory message's first line, or the limit it passed
    cache_bytes: int  # the static cache's tensors (keys and values of every layer)
    peak_allocated: int | None = None  # torch.cuda.max_memory_allocated over the try (the weights included)
    peak_reserved: int | None = None  # torch.cuda.max_memory_reserved over the try
    free_at_peak: int | None = None  # torch.cuda.mem_get_info's free bytes after the step, before the release
    allocated_after: int | None = None  # torch.cuda.memory_allocated after the release and empty_cache


def largest_fitting(fits: Callable[[int], bool], start: int, cap: int) -> int:
    """The largest n in 1..cap with ``fits(n)``, or 0 if not even 1 fits: ``start`` first, doubling while it fits
    (up to ``cap``), then bisection between the largest n that fitted and the smallest that did not. Assumes
    ``fits`` holds for every n below one it holds for."""
    lo, hi = 0, None  # lo fits (0 trivially); hi does not
    n = max(1, min(start, cap))
    while hi is None:
        if not fits(n):
            hi = n
        elif n == cap:
            return cap
        else:
            lo, n = n, min(2 * n, cap)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def model_bytes(model: ld.Decoder) -> int:
    """Bytes of the decoder's tensors: its weights and its rotary tables, each storage once (a layer's separate
    projections are views into its fused ones, :data:`llm_decode.STORED`)."""
    tensors = [t for w in model.layers for t in w.values()] + [model.embed, model.final_norm, model.lm_head,
                                                                model.cos, model.sin]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


ATTENTION_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")


def attention_backends(model: ld.Decoder, context: int) -> list[str]:
    """The ``scaled_dot_product_attention`` backends that accept the step's attention at ``context`` (batch 1, the
    query laid out as the step lays it out, ``enable_gqa``), each tried alone under ``sdpa_kernel``.

    Why it is recorded: which one runs decides part of the step's working memory. PyTorch's documentation says
    grouped-query attention runs only on the flash and math backends on CUDA; the math one repeats each key/value
    head for the query heads that share it (``repeat_interleave``: 4 times a layer's cache for 8b, transient),
    the flash one reads the cache as it is. The default dispatch takes flash before math when flash accepts."""
    import warnings

    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch, cfg = model.torch, model.cfg
    q = torch.zeros((1, 1, cfg.q_heads * cfg.head_dim), device=model.device, dtype=model.dtype)
    q = q.view(1, 1, cfg.q_heads, cfg.head_dim).transpose(1, 2)
    kv = torch.zeros((1, cfg.kv_heads, context, cfg.head_dim), device=model.device, dtype=model.dtype)
    accepted = []
    for name in ATTENTION_BACKENDS:
        try:
            with warnings.catch_warnings(), sdpa_kernel([getattr(SDPBackend, name)]), torch.inference_mode():
                warnings.simplefilter("ignore")  # each refusing backend warns why; the list says enough
                model.F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
            accepted.append(name)
        except RuntimeError as exc:
            if _refused(exc):
                raise
    return accepted


def _refused(exc: BaseException) -> bool:
    """An allocation that failed for want of memory: the caching allocator's, or cuBLAS's (its workspace's, or a
    handle it could not set up for want of memory, which it reports as not initialised)."""
    return is_out_of_memory(exc) or (isinstance(exc, RuntimeError) and any(
        code in str(exc) for code in ("CUBLAS_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_NOT_INITIALIZED")))


class Probe:
    """Tries batches at one context on a resident model, keeping every :class:`Trial`; callable as ``fits(batch)``."""

    def __init__(self, model: ld.Decoder, context: int, resident_bytes: int, limit_bytes: int | None) -> None:
        self.model, self.context, self.resident, self.limit = model, context, resident_bytes, limit_bytes
        self.gpu = model.device == "cuda"
        self.per_sequence = context * model.cfg.kv_bytes_per_token(model.torch.empty((), dtype=model.dtype).element_size())
        self.trials: list[Trial] = []

    def __call__(self, batch: int) -> bool:
        trial = self.attempt(batch)
        self.trials.append(trial)
        return trial.fits

    def _step(self, batch: int) -> dict[str, int]:
        """Allocate the cache, run one step at the last position, take the figures; everything is dropped on return."""
        m, torch = self.model, self.model.torch
        with torch.inference_mode():
            cache = ld.StaticCache(m.cfg, torch, batch, self.context, m.device, m.dtype)
            figures = {"cache_bytes": sum(t.nbytes for t in [*cache.k, *cache.v])}
            ids = torch.zeros((batch, 1), dtype=torch.long, device=m.device)
            logits = m.forward(ids, cache, self.context - 1)
            values, top = logits.topk(ld.TOPK, dim=-1)
            if self.gpu:
                torch.cuda.synchronize()
                figures.update(peak_allocated=torch.cuda.max_memory_allocated(),
                               peak_reserved=torch.cuda.max_memory_reserved(),
                               free_at_peak=torch.cuda.mem_get_info()[0])
            del values, top, logits, cache
        return figures

    def attempt(self, batch: int) -> Trial:
        torch = self.model.torch
        planned = batch * self.per_sequence  # what the cache will hold; its tensors' bytes are counted when made
        if self.limit is not None and self.resident + planned > self.limit:
            return Trial(batch, False, f"over the limit: the model's {self.resident / GIB:,.4g} GiB and the cache's "
                                       f"{planned / GIB:,.4g} GiB pass {self.limit / GIB:,.4g} GiB", planned)
        if self.gpu:
            torch.cuda.reset_peak_memory_stats()
        try:
            figures, why = self._step(batch), "fits"
        except (RuntimeError, MemoryError) as exc:
            if not _refused(exc):
                raise
            figures, why = {"cache_bytes": planned}, "out of memory: " + str(exc).strip().splitlines()[0]
            if self.gpu:
                figures.update(peak_allocated=torch.cuda.max_memory_allocated(),
                               peak_reserved=torch.cuda.max_memory_reserved())
        gc.collect()  # the failed try's traceback held the cache until here
        if self.gpu:
            torch.cuda.empty_cache()
            figures["allocated_after"] = torch.cuda.memory_allocated()
        peak = figures.get("peak_allocated")
        if why == "fits" and self.limit is not None and peak is not None and peak > self.limit:
            why = f"over the limit: the try's peak {peak / GIB:,.4g} GiB passes {self.limit / GIB:,.4g} GiB"
        return Trial(batch, why == "fits", why, **figures)


def measure(model: ld.Decoder, context: int, free_bytes: int, resident_bytes: int, limit_bytes: int | None,
            dtype_bytes: int, cap: int = MAX_BATCH) -> dict[str, Any]:
    """One context: the predicted batch for ``free_bytes``, the measured one, and every try."""
    predicted = int(kv_capacity(model.cfg, free_bytes, context, dtype_bytes))
    probe = Probe(model, context, resident_bytes, limit_bytes)
    measured = largest_fitting(probe, predicted, cap)
    at = next((t for t in probe.trials if t.batch == measured and t.fits), None)
    above = next((t for t in probe.trials if t.batch == measured + 1), None)
    fitted = [t.batch for t in probe.trials if t.fits]
    refused = [t.batch for t in probe.trials if not t.fits]
    return {"context": context, "predicted_batch": predicted, "measured_batch": measured, "capped": measured == cap,
            "attention_backends": attention_backends(model, context),
            # every batch that fitted below every one refused: what the bisection assumes (fragmentation could break it)
            "monotone": max(fitted, default=0) < min(refused, default=cap + 1),
            "kv_bytes_per_sequence": context * model.cfg.kv_bytes_per_token(dtype_bytes),
            "at_measured": None if at is None else asdict(at), "first_refused": None if above is None else asdict(above),
            "trials": [asdict(t) for t in probe.trials]}


# argparse type: context lengths separated by commas, each from 1 to the longest the rotary table is built for.
context_list = distinct_ints(bounded_int(MAX_CONTEXT, "llm_decode.py builds its rotary table up to Llama 3.1's "
                                                     "longest context"), "context length", "4096,32768")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(ld.PRESETS), default=None,
                   help="shapes: 8b (Llama-3-8B's) or tiny (default: 8b on a GPU, tiny on a CPU)")
    p.add_argument("--context", type=context_list, default=None,
                   help=f"tokens cached per sequence, several separated by commas (default: 4096,32768 for 8b, "
                        f"256,2048 for tiny; at most {MAX_CONTEXT:,})")
    p.add_argument("--memory-limit-gb", type=positive_float, default=None, metavar="GB",
                   help="refuse a try that would hold more than this many GB (10^9 bytes) with the weights; required "
                        "on the CPU")
    p.add_argument("--max-batch", type=bounded_int(MAX_BATCH, "llm_decode.py's largest batch"), default=MAX_BATCH,
                   help=f"the largest batch tried (default and most: {MAX_BATCH:,}); a context where it fits is "
                        "reported as at least that")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights (default: 0)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even when there is a GPU")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="also write the results to FILE")
    return p.parse_args(argv)


def check_sizes(cfg: ld.Config, model: str, contexts: list[int], device: str, dtype_bytes: int,
                limit_bytes: int | None) -> None:
    """Refuse before allocating: 8b on a CPU, a CPU search without a limit, or not even one sequence of the longest
    context beside the weights (in the limit, or in the device's free memory)."""
    longest = max(contexts)
    weights, one = cfg.params * dtype_bytes, longest * cfg.kv_bytes_per_token(dtype_bytes)
    if device == "cpu" and model == "8b":
        w2, one2 = cfg.params * 2, longest * cfg.kv_bytes_per_token(2)
        raise GpuprofError(f"--model 8b needs a GPU: in bfloat16 its weights take {w2 / GIB:,.1f} GiB and one sequence "
                           f"of {longest:,} tokens {one2 / GIB:,.4g} GiB of KV cache, and the search fills what the GPU "
                           "has beside them.", "Run --model tiny here, with --memory-limit-gb.")
    if device == "cpu" and limit_bytes is None:
        raise GpuprofError("On the CPU the search needs --memory-limit-gb: without it, it would allocate until the "
                           "host runs out of memory.", f"Try --memory-limit-gb 0.05 with --model {model}.")
    if limit_bytes is not None and weights + one > limit_bytes:
        raise GpuprofError(f"Not even batch 1 fits at context {longest:,} within --memory-limit-gb "
                           f"{limit_bytes / 1e9:g}: the weights take {weights / GIB:,.4g} GiB and one sequence's KV "
                           f"cache {one / GIB:,.4g} GiB, {(weights + one) / GIB:,.4g} GiB in all.",
                           "Raise the limit or shorten --context.")
    require_memory(limit_bytes if device == "cpu" else weights + one, device,
                   f"--model {model} with one sequence of {longest:,} tokens (weights {weights / GIB:,.1f} GiB, KV cache "
                   f"{one / GIB:,.4g} GiB)" if device != "cpu" else f"--memory-limit-gb {limit_bytes / 1e9:g}",
                   "--context or --memory-limit-gb", lower_bound=device != "cpu")


def describe(row: dict[str, Any], free_bytes: int) -> str:
    """One context's result as a sentence or two."""
    per_seq = row["kv_bytes_per_sequence"]
    head = (f"  context {row['context']:,}: largest batch measured {row['measured_batch']:,}"
            f"{' (the --max-batch cap: at least that)' if row['capped'] else ''}, predicted {row['predicted_batch']:,} "
            f"(for {free_bytes / GIB:,.4g} GiB free, {per_seq / 2**20:,.1f} MiB of KV cache per sequence)")
    at, above = row["at_measured"], row["first_refused"]
    if at is not None:
        head += f"; at {at['batch']:,}: cache {at['cache_bytes'] / GIB:,.4g} GiB"
        if at["peak_allocated"] is not None:
            head += (f", peak allocated {at['peak_allocated'] / GIB:,.4g} GiB, reserved {at['peak_reserved'] / GIB:,.4g} "
                     f"GiB, {at['free_at_peak'] / GIB:,.4g} GiB free at the peak")
    if above is not None:
        head += f"; batch {above['batch']:,}: {above['why']}"
    return head + f" ({len(row['trials'])} tries; attention backends that accept the step: " \
        f"{', '.join(row['attention_backends']) or 'none'})"


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch, device, where = torch_device("kv_capacity.py", args.cpu)
    gpu = device == "cuda"
    chosen = ld.choose_precision(torch, gpu, args.model)
    model_name, dtype, dtype_name, dtype_bytes = chosen.model, chosen.dtype, chosen.name, chosen.bytes
    cfg = ld.PRESETS[model_name]
    contexts = args.context or list(DEFAULT_CONTEXTS[model_name])
    limit = None if args.memory_limit_gb is None else int(args.memory_limit_gb * 1e9)
    check_sizes(cfg, model_name, contexts, device, dtype_bytes, limit)
    print(f"kv_capacity: --model {model_name} ({cfg.params:,} parameters, {dtype_name}, "
          f"{cfg.kv_bytes_per_token(dtype_bytes):,} bytes of KV cache per token) on {where}; contexts "
          f"{', '.join(f'{c:,}' for c in contexts)}" + (f"; limit {args.memory_limit_gb:g} GB" if limit else ""), flush=True)

    free_before, total = torch.cuda.mem_get_info() if gpu else (None, None)
    model = ld.Decoder(cfg, torch, device, dtype, max(contexts), args.seed)
    # one small step first: cuBLAS's handle and workspace and the kernels' modules are made here, not in the first
    # try, which runs near the memory's limit (where cuBLAS's own set-up fails in ways no allocator reports)
    warm = ld.StaticCache(cfg, torch, 1, 16, device, dtype)
    model.forward(torch.zeros((1, 8), dtype=torch.long, device=device), warm, 0)
    del warm
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    resident = torch.cuda.memory_allocated() if gpu else model_bytes(model)
    free_after_weights = torch.cuda.mem_get_info()[0] if gpu else None
    free_bytes = min(b for b in (free_before, limit) if b is not None)
    rows = []
    for context in contexts:
        row = measure(model, context, free_bytes, resident, limit, dtype_bytes, args.max_batch)
        print(describe(row, free_bytes), flush=True)
        rows.append(row)
    write_json(args.json, {
        "model": model_name, "config": asdict(cfg), "params": cfg.params, "device": where, "dtype": dtype_name,
        "dtype_bytes": dtype_bytes, "kv_bytes_per_token": cfg.kv_bytes_per_token(dtype_bytes),
        "weight_bytes": cfg.params * dtype_bytes, "resident_bytes": resident,
        "resident_how": ("torch.cuda.memory_allocated after the weights (and rotary tables) were made and one small "
                         "step ran (cuBLAS's workspace included)" if gpu else
                         "the model's tensors' bytes (the CPU keeps no allocator statistics)"),
        "free_before_weights": free_before, "free_after_weights": free_after_weights, "total_memory": total, "memory_limit_bytes": limit,
        "free_bytes": free_bytes, "allocator_figures": gpu,
        "step": "the reference rung's decoding step (Decoder.forward of one token per sequence over a StaticCache of "
                "the whole context, at its last position) and the top-k of its logits",
        "max_batch": args.max_batch, "contexts": rows})
    wrong = [(r["context"], t) for r in rows for t in r["trials"]
             if t["fits"] and t["cache_bytes"] != t["batch"] * r["kv_bytes_per_sequence"]]
    if wrong:
        c, t = wrong[0]
        raise GpuprofError(f"The KV cache of batch {t['batch']:,} at context {c:,} held {t['cache_bytes']:,} bytes, not the "
                           f"arithmetic's {t['batch'] * c * cfg.kv_bytes_per_token(dtype_bytes):,}.",
                           "StaticCache's shape and Config.kv_bytes_per_token disagree: fix one.")
    for r in rows:
        if not r["monotone"]:
            print(f"  note: at context {r['context']:,} a batch fitted above one that was refused (the allocator's "
                  "fragmentation?): the bisection's answer is one of several; every try is in the JSON")
    none = [r["context"] for r in rows if r["measured_batch"] == 0]
    if none:
        first = next(t for r in rows if r["measured_batch"] == 0 for t in r["trials"] if t["batch"] == 1)
        raise GpuprofError(f"Not even batch 1 fits at context {', '.join(f'{c:,}' for c in none)}: "
                           f"{first['why']} (the weights hold {resident / GIB:,.4g} GiB of "
                           f"{free_bytes / GIB:,.4g} GiB).", "Shorten --context, or use a GPU with more memory.")
    print(f"result checked: every cache that fitted held batch x context x {cfg.kv_bytes_per_token(dtype_bytes):,} "
          f"bytes; {sum(r['monotone'] for r in rows)} of {len(rows)} contexts' tries are monotone (each batch that "
          "fitted below each one refused)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
