#!/usr/bin/env python3
"""Generate tokens with a decoder-only transformer: a prompt's prefill, then greedy decoding steps.

The model has Llama-3-8B's shapes (``--model 8b``: 32 layers, width 4096, 32 query heads sharing
8 key/value heads (grouped-query attention), head dim 128, SwiGLU MLP 14336, vocabulary 128,256,
RMSNorm, rotary embeddings) and random BF16 weights drawn on the GPU from a seeded generator: no
download, and the same arithmetic and memory traffic as the real model. ``--model tiny`` is the same
code at a size a CPU runs in seconds.

Prefill runs the ``--prompt-len`` prompt of each of ``--batch`` sequences through every layer at
once (large matrix products); each of the ``--new-tokens`` decoding steps then reads every weight
to produce one token per sequence. Two KV caches (``--cache``):

  dynamic  the naive loop: each step grows every layer's keys and values with torch.cat, which
           copies the whole cache (allocate, copy, free) every step
  static   preallocated for prompt + new tokens, written in place (index_copy_) and read as a
           slice: no allocation and no copy after prefill

Both compute the same tokens; with both (the default) the script checks that they do.

Printed per cache: prefill ms, decode ms per step (median), tokens per second, and the bytes a
decoding step must read (the weights it uses + the KV cache it attends over) with the rate that
implies. Compare that rate with the GPU's measured copy bandwidth: decode at small batch is
bound by memory, and a loop far below it is bound by something else (the CPU launching kernels).

NVTX ranges: cache_dynamic / cache_static around each timed generation, prefill, and
decode_step_N per step; the timed generations sit between cudaProfilerStart and cudaProfilerStop:

  nsys profile --trace=cuda,nvtx --capture-range=cudaProfilerApi -o decode \\
      python examples/nsys/llm_decode.py --model 8b --batch 1 --new-tokens 32

Examples:
  python examples/nsys/llm_decode.py                            # tiny on a CPU, 8b on a GPU
  python examples/nsys/llm_decode.py --model 8b --batch 8 --prompt-len 512 --new-tokens 128 --json r.json
  python examples/nsys/llm_decode.py --model 8b --cache static --check

Without a GPU the tiny model runs on the CPU (float32, perf_counter timings that mean nothing
for a GPU); ``--model 8b`` there is refused with the memory it would need.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.backend import torch_device  # noqa: E402
from gpuprof.cli import bounded_int, output_file, positive_int, require_memory  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402
from gpuprof.ranges import annotate  # noqa: E402
from gpuprof.kernels import write_json  # noqa: E402
from gpuprof.models import rms_norm  # noqa: E402
from gpuprof.timing import Clock  # noqa: E402

CACHES = ("dynamic", "static")


@dataclass(frozen=True)
class Config:
    """A decoder's shapes. Weights are untied: the embedding table and the output projection are separate."""

    layers: int
    d_model: int
    q_heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5

    @property
    def layer_params(self) -> int:
        d, q, kv = self.d_model, self.q_heads * self.head_dim, self.kv_heads * self.head_dim
        return d * q + 2 * d * kv + q * d + 3 * d * self.ffn + 2 * d  # wq wk wv wo, gate up down, two norms

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + 2 * self.vocab * self.d_model + self.d_model  # + embed, lm_head, final norm

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Keys and values of one token of one sequence, over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


PRESETS = {
    # Llama-3-8B's published configuration (config.json of meta-llama/Meta-Llama-3-8B).
    "8b": Config(layers=32, d_model=4096, q_heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256),
    "tiny": Config(layers=2, d_model=256, q_heads=8, kv_heads=2, head_dim=32, ffn=688, vocab=1024),
}
# Defaults per preset: (batch, prompt, new tokens).
RUN_DEFAULTS = {"8b": (1, 512, 128), "tiny": (2, 32, 16)}


def decode_step_bytes(cfg: Config, batch: int, context: int, dtype_bytes: int) -> int:
    """Bytes one decoding step must read from memory, at ``context`` cached tokens (the new one included).

    Every weight matrix once, the whole batch sharing it; of the embedding table only the ``batch``
    rows looked up (the rest is never touched); every cached key and value of every sequence.
    The least a step can move: a naive loop moves more (torch.cat copies the cache), and writes
    and activations are left out (they grow with the batch; at batch 1 they are vectors beside
    the weights' matrices).
    """
    weights = (cfg.params - cfg.vocab * cfg.d_model + batch * cfg.d_model) * dtype_bytes
    return weights + batch * context * cfg.kv_bytes_per_token(dtype_bytes)


def memory_needed(cfg: Config, batch: int, prompt: int, new: int, dtype_bytes: int) -> tuple[int, int, int]:
    """(weights, KV cache, prefill's largest activations) in bytes: the least the run allocates."""
    weights = cfg.params * dtype_bytes
    kv = batch * (prompt + new) * cfg.kv_bytes_per_token(dtype_bytes)
    # Prefill's widest moment: the MLP's gate, up and their product, beside the residual stream and the attention's q, k, v.
    acts = batch * prompt * (3 * cfg.ffn + 4 * cfg.d_model) * dtype_bytes
    return weights, kv, acts


def check_fits(cfg: Config, model: str, batch: int, prompt: int, new: int, device: str, dtype_bytes: int) -> None:
    """Refuse before allocating anything: 8b on a CPU, or weights + KV cache + prefill beyond the free memory."""
    if device == "cpu" and model == "8b":
        weights, kv, acts = memory_needed(cfg, batch, prompt, new, 2)  # what it takes in bfloat16, as on a GPU
        raise GpuprofError(f"--model 8b needs a GPU: in bfloat16 its weights ({weights / 2**30:,.1f} GiB), a KV cache of "
                           f"{kv / 2**30:,.2f} GiB for batch {batch} x {prompt + new} tokens and prefill's activations "
                           f"take at least {(weights + kv + acts) / 2**30:,.1f} GiB, and a CPU would spend seconds per token.",
                           "Run --model tiny here.")
    weights, kv, acts = memory_needed(cfg, batch, prompt, new, dtype_bytes)
    require_memory(weights + kv + acts, device,
                   f"--model {model} at batch {batch:,} x ({prompt:,} + {new:,}) tokens (weights {weights / 2**30:,.1f} GiB, "
                   f"KV cache {kv / 2**30:,.2f} GiB, prefill activations {acts / 2**30:,.2f} GiB)",
                   "--batch, --prompt-len or --new-tokens", lower_bound=True)


class Decoder:
    """The model's weights and its forward pass; the KV cache is passed in (see :class:`DynamicCache`, :class:`StaticCache`)."""

    def __init__(self, cfg: Config, torch: Any, device: str, dtype: Any, max_positions: int, seed: int = 0) -> None:
        self.cfg, self.torch, self.F = cfg, torch, torch.nn.functional
        gen = torch.Generator(device=device).manual_seed(seed)

        def rnd(*shape: int) -> Any:
            # Drawn where it will live, in its own dtype: 16 GB of weights never pass through the host.
            return torch.randn(shape, generator=gen, device=device, dtype=dtype) * (1 / math.sqrt(shape[0]))

        d, q, kv = cfg.d_model, cfg.q_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        self.layers = [{"attn_norm": torch.ones(d, device=device, dtype=dtype), "wq": rnd(d, q), "wk": rnd(d, kv),
                        "wv": rnd(d, kv), "wo": rnd(q, d), "mlp_norm": torch.ones(d, device=device, dtype=dtype),
                        "w_gate": rnd(d, cfg.ffn), "w_up": rnd(d, cfg.ffn), "w_down": rnd(cfg.ffn, d)}
                       for _ in range(cfg.layers)]
        self.embed = torch.randn((cfg.vocab, d), generator=gen, device=device, dtype=dtype)
        self.final_norm = torch.ones(d, device=device, dtype=dtype)
        self.lm_head = rnd(d, cfg.vocab)
        # Rotary embeddings: cos and sin of every position up to the cache's length, in float32, then the model's dtype.
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, device=device, dtype=torch.float32) / cfg.head_dim)
        angles = torch.outer(torch.arange(max_positions, device=device, dtype=torch.float32), inv)
        angles = torch.cat([angles, angles], dim=-1)
        self.cos, self.sin = angles.cos().to(dtype), angles.sin().to(dtype)

    def rmsnorm(self, x: Any, w: Any) -> Any:
        return rms_norm(x, w, self.cfg.norm_eps)

    def rope(self, x: Any, pos: int) -> Any:
        """Rotate [batch, heads, tokens, head_dim] by positions pos.. (the rotate-half form Llama's code uses)."""
        t, half = x.shape[2], x.shape[-1] // 2
        cos, sin = self.cos[pos:pos + t], self.sin[pos:pos + t]
        rotated = self.torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def forward(self, tokens: Any, cache: Any, pos: int) -> Any:
        """Logits of the last position, for tokens [batch, t] starting at position ``pos``; updates ``cache``."""
        cfg, F = self.cfg, self.F
        x = self.embed[tokens]
        b, t, _ = x.shape
        for i, w in enumerate(self.layers):
            a = self.rmsnorm(x, w["attn_norm"])
            q = self.rope((a @ w["wq"]).view(b, t, cfg.q_heads, cfg.head_dim).transpose(1, 2), pos)
            k = self.rope((a @ w["wk"]).view(b, t, cfg.kv_heads, cfg.head_dim).transpose(1, 2), pos)
            v = (a @ w["wv"]).view(b, t, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
            keys, values = cache.update(i, k, v, pos)
            # Prefill attends causally within the prompt; a decoding step's one query sees every cached position.
            att = F.scaled_dot_product_attention(q, keys, values, is_causal=t > 1, enable_gqa=True)
            x = x + att.transpose(1, 2).reshape(b, t, -1) @ w["wo"]
            m = self.rmsnorm(x, w["mlp_norm"])
            x = x + (F.silu(m @ w["w_gate"]) * (m @ w["w_up"])) @ w["w_down"]
        return self.rmsnorm(x[:, -1], self.final_norm) @ self.lm_head  # only the last position picks a token


class DynamicCache:
    """The naive cache: every step concatenates the new keys and values onto each layer's, a copy of the whole cache."""

    def __init__(self, layers: int) -> None:
        self.k: list[Any] = [None] * layers
        self.v: list[Any] = [None] * layers

    def update(self, i: int, k: Any, v: Any, pos: int) -> tuple[Any, Any]:
        import torch

        if self.k[i] is None:
            self.k[i], self.v[i] = k, v
        else:
            self.k[i] = torch.cat([self.k[i], k], dim=2)
            self.v[i] = torch.cat([self.v[i], v], dim=2)
        return self.k[i], self.v[i]


class StaticCache:
    """Preallocated for every position the generation will reach; each step writes its slot in place and reads a slice."""

    def __init__(self, cfg: Config, torch: Any, batch: int, positions: int, device: str, dtype: Any) -> None:
        shape = (batch, cfg.kv_heads, positions, cfg.head_dim)
        self.torch = torch
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.index = torch.arange(positions, device=device)

    def update(self, i: int, k: Any, v: Any, pos: int) -> tuple[Any, Any]:
        end = pos + k.shape[2]
        where = self.index[pos:end]
        self.k[i].index_copy_(2, where, k)
        self.v[i].index_copy_(2, where, v)
        return self.k[i][:, :, :end], self.v[i][:, :, :end]


def new_cache(kind: str, model: Decoder, batch: int, positions: int, device: str, dtype: Any) -> Any:
    return DynamicCache(model.cfg.layers) if kind == "dynamic" else StaticCache(model.cfg, model.torch, batch, positions,
                                                                                device, dtype)


def generate(model: Decoder, prompt: Any, new_tokens: int, cache: Any, clock: Clock | None = None) -> tuple[Any, Any]:
    """Greedy generation: prefill, then ``new_tokens`` steps. Returns (token ids [batch, new_tokens + 1], every
    step's logits [steps + 1, batch, vocab]). The next token stays on the device: no step waits for the CPU."""
    torch = model.torch
    mark = clock.mark if clock is not None else (lambda: None)
    out, logits = [], []
    with torch.inference_mode():
        mark()
        with annotate("prefill"):
            last = model.forward(prompt, cache, 0)
        mark()
        pos = prompt.shape[1]
        for step in range(new_tokens):
            token = last.argmax(-1)
            out.append(token)
            logits.append(last)
            with annotate(f"decode_step_{step}"):
                last = model.forward(token[:, None], cache, pos)
            mark()
            pos += 1
        out.append(last.argmax(-1))
        logits.append(last)
    return torch.stack(out, dim=1), torch.stack(logits)


def summarise(cfg: Config, times_ms: list[float], batch: int, prompt: int, new: int, dtype_bytes: int) -> dict[str, Any]:
    """One timed generation as the JSON keeps it: prefill, every step, and the rates they imply."""
    prefill, steps = times_ms[0], times_ms[1:]
    total_bytes = sum(decode_step_bytes(cfg, batch, prompt + s + 1, dtype_bytes) for s in range(new))
    decode_s = sum(steps) / 1e3
    return {"prefill_ms": prefill, "decode_step_ms": steps, "decode_ms_per_step": statistics.median(steps),
            "prefill_tokens_per_s": batch * prompt / (prefill / 1e3),
            "decode_tokens_per_s": batch * new / decode_s,
            "bytes_per_step": total_bytes / new, "decode_gbps": total_bytes / decode_s / 1e9}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(PRESETS), default=None,
                   help="shapes: 8b (Llama-3-8B's) or tiny (default: 8b on a GPU, tiny on a CPU)")
    p.add_argument("--layers", type=bounded_int(1024, "the largest published decoders have under 200"), default=None,
                   help="override the preset's number of layers (e.g. fewer, to fit a smaller GPU)")
    p.add_argument("--batch", type=bounded_int(4096, "each sequence adds its own KV cache"), default=None,
                   help="sequences generated together (default: 1 for 8b, 2 for tiny)")
    p.add_argument("--prompt-len", type=bounded_int(131072, "Llama 3.1's longest context"), default=None,
                   help="prompt tokens per sequence (default: 512 for 8b, 32 for tiny)")
    p.add_argument("--new-tokens", type=bounded_int(100000, "each is one decoding step"), default=None,
                   help="decoding steps after prefill (default: 128 for 8b, 16 for tiny)")
    p.add_argument("--cache", choices=[*CACHES, "both"], default="both",
                   help="KV cache: dynamic (torch.cat), static (preallocated), or both, checked against each other "
                        "(default: both)")
    p.add_argument("--check", action="store_true",
                   help="with one --cache, also generate with the other (untimed) and check the tokens agree "
                        "(always done for the tiny model)")
    p.add_argument("--warmup", type=positive_int, default=1,
                   help="untimed generations per cache before the timed one (default: 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the prompt (default: 0)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even when there is a GPU")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="also write the results to FILE")
    return p.parse_args(argv)


def tokens_agree(name_a: str, a: Any, name_b: str, b: Any) -> None:
    """Greedy decoding from the same weights and prompt must pick the same tokens whatever the cache."""
    if a.shape != b.shape or not bool((a == b).all()):
        where = (a != b).nonzero()[0].tolist() if a.shape == b.shape else "their shapes"
        raise GpuprofError(f"the {name_a} and {name_b} caches generated different tokens (first difference at "
                           f"[sequence, token] {where}).", "This is a bug in a cache.")


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch, device, where = torch_device("llm_decode.py", args.cpu)
    gpu = device == "cuda"
    model_name = args.model or ("8b" if gpu else "tiny")
    cfg = PRESETS[model_name] if args.layers is None else replace(PRESETS[model_name], layers=args.layers)
    d_batch, d_prompt, d_new = RUN_DEFAULTS[model_name]
    batch, prompt_len, new = args.batch or d_batch, args.prompt_len or d_prompt, args.new_tokens or d_new
    dtype = torch.bfloat16 if gpu else torch.float32
    dtype_bytes = 2 if gpu else 4
    check_fits(cfg, model_name, batch, prompt_len, new, device, dtype_bytes)
    caches = CACHES if args.cache == "both" else (args.cache,)
    checked = args.cache == "both" or args.check or model_name == "tiny"
    print(f"llm_decode: --model {model_name} ({cfg.layers} layers, width {cfg.d_model}, {cfg.q_heads} query / "
          f"{cfg.kv_heads} KV heads, {cfg.params:,} parameters, {str(dtype).replace('torch.', '')}) on {where}; "
          f"batch {batch} x {prompt_len} prompt tokens, {new} new tokens; cache {', '.join(caches)}", flush=True)
    if not gpu:
        print("no GPU (or --cpu): float32 on the CPU, timed with perf_counter (the timings say nothing about a GPU)")

    model = Decoder(cfg, torch, device, dtype, prompt_len + new, args.seed)
    prompt = torch.randint(0, cfg.vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(args.seed + 1))
    prompt = prompt.to(device)
    positions = prompt_len + new

    def one(kind: str, clock: Clock | None = None) -> tuple[Any, Any]:
        return generate(model, prompt, new, new_cache(kind, model, batch, positions, device, dtype), clock)

    with annotate("warmup"):
        for kind in caches:
            for _ in range(args.warmup):
                one(kind)
    results: dict[str, Any] = {"model": model_name, "config": asdict(cfg), "params": cfg.params, "device": where,
                               "dtype": str(dtype).replace("torch.", ""), "batch": batch, "prompt_len": prompt_len,
                               "new_tokens": new, "timing": "cuda-events" if gpu else "perf_counter",
                               "weight_bytes": cfg.params * dtype_bytes,
                               "kv_cache_bytes": batch * positions * cfg.kv_bytes_per_token(dtype_bytes)}
    tokens: dict[str, Any] = {}
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.profiler.start()  # nsys --capture-range=cudaProfilerApi records from here ...
    for kind in caches:
        clock = Clock(torch, gpu)
        with annotate(f"cache_{kind}"):
            tokens[kind], _ = one(kind, clock)
        if gpu:
            torch.cuda.synchronize()
        results[kind] = summarise(cfg, clock.intervals_ms(), batch, prompt_len, new, dtype_bytes)
    if gpu:
        torch.cuda.profiler.stop()  # ... to here
    for kind in caches:
        r = results[kind]
        print(f"  {kind:<8} prefill {r['prefill_ms']:9.2f} ms ({r['prefill_tokens_per_s']:,.0f} tokens/s); decode "
              f"{r['decode_ms_per_step']:8.3f} ms per step (median of {new}), {r['decode_tokens_per_s']:,.1f} tokens/s; "
              f"{r['bytes_per_step'] / 1e9:.3f} GB read per step: {r['decode_gbps']:.1f} GB/s")
    if checked and len(caches) == 1:
        other = next(c for c in CACHES if c not in caches)
        tokens[other], _ = one(other)
    if checked:
        tokens_agree("dynamic", tokens["dynamic"], "static", tokens["static"])
        results["tokens_identical"] = True
    write_json(args.json, results)
    if checked:
        print(f"result checked: the dynamic and static caches generated the same {batch} x {new + 1} token ids")
    else:
        print("result not checked: one cache, no --check")
    return 0


if __name__ == "__main__":
    sys.exit(main())
