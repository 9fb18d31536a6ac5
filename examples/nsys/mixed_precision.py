#!/usr/bin/env python3
"""Train a BERT-base-sized encoder in four precisions: what autocast and the loss scaler change, step by step.

The model is written here from torch.nn parts (no download): token and position embeddings,
--layers post-LayerNorm encoder layers (BERT-base: 12 layers, d_model 768, 12 heads, d_ff 3072,
GELU), a classifier on the first token, cross-entropy, AdamW. Every mode starts from the same
weights (--seed) and trains on the same batch every step, so their loss curves can be laid
over one another. The modes:

  fp32           FP32 tensors and FP32 arithmetic: TF32 off for matrix products and cuDNN
  tf32           FP32 tensors, matrix products on TF32 tensor cores (both switches on)
  fp16           torch.autocast(float16) and a GradScaler (loss scaling)
  bf16           torch.autocast(bfloat16), no scaler (bf16 has FP32's exponent range)
  fp16-noscaler  autocast(float16) without the scaler: the failure case, on purpose

Per step it records the loss, the phases' times with CUDA events (forward, backward, optimizer:
for fp16 the scaler's unscale, inf check and update are inside it), the scaler's scale and
whether it skipped the step, and on a GPU each step's peak memory (the peak statistics reset
before each step; the reported peak is over the steps after the first, which alone also holds
the FP32 reference gradients). On a GPU it also records, unless --no-clocks, what NVML said while the
measured steps ran (gpuprof.nvml, read by a thread every 20 ms, outside the timed loop): the median SM
clock, the power and the enforced power limit, and the clock-event reasons, so that a capped or throttled
run can be told from a slow one (the JSON's "nvml"; null, with "nvml_why", where nothing was read). At the first step it also counts the gradient elements that are
exactly zero in this mode but not in an FP32 reference backward of the same batch from the same
weights (zero here, non-zero in the reference: in FP16 mostly underflow, in the other modes
sums that cancel under different rounding). The model trains from random initialisation, at a
fine-tuning learning rate (--lr). NVTX ranges for Nsight Systems: warmup, then step_N with
forward, backward and optimizer_step inside. Without a GPU it runs on the CPU (autocast on the
CPU), for checking the script, not for timing.

With --census FILE it trains nothing: it runs the first step's FP32 reference backward alone (same
weights, batch and seed) and writes where that gradient's elements would fall in FP16's range, per
parameter group, then one unscaled FP16 backward of the same step and what it zeroed, split by group
and by that range, with the command, torch version, machine and date that made it (chapter 10's
breakdown is such a run on the GPU, artifacts/ch10/gpu_census.json, beside an older CPU one).

Examples:
  python examples/nsys/mixed_precision.py --mode bf16
  python examples/nsys/mixed_precision.py --cpu --census artifacts/ch10/cpu/fp16_census.json
  python examples/nsys/mixed_precision.py --mode fp16-noscaler --steps 5 --json f16.json
  nsys profile --trace=cuda,nvtx -o bf16 python examples/nsys/mixed_precision.py --mode bf16
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.backend import require_torch, torch_device  # noqa: E402
from gpuprof.cli import bounded_int, nonnegative_int, output_file, positive_int, require_memory  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402
from gpuprof.ranges import annotate  # noqa: E402

MODES = ("fp32", "tf32", "fp16", "bf16", "fp16-noscaler")
VOCAB = 30522  # BERT's WordPiece vocabulary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=MODES, default="fp32", help="precision (default: fp32)")
    m = p.add_argument_group("the model (default: BERT-base)")
    m.add_argument("--layers", type=bounded_int(48, "a BERT-large has 24"), default=12, help="encoder layers (default: 12)")
    m.add_argument("--d-model", type=positive_int, default=768, help="width (default: 768)")
    m.add_argument("--heads", type=positive_int, default=12, help="attention heads (default: 12)")
    m.add_argument("--d-ff", type=positive_int, default=3072, help="feed-forward width (default: 3072)")
    r = p.add_argument_group("the run")
    r.add_argument("--batch-size", type=positive_int, default=32, help="sequences per step (default: 32)")
    r.add_argument("--seq-len", type=bounded_int(512, "BERT's positions stop at 512"), default=128,
                   help="tokens per sequence (default: 128, at most 512)")
    r.add_argument("--warmup", type=nonnegative_int, default=3, help="untimed steps first (default: 3)")
    r.add_argument("--steps", type=positive_int, default=10, help="measured steps (default: 10)")
    r.add_argument("--lr", type=float, default=2e-5, help="AdamW learning rate (default: 2e-5, a fine-tuning rate)")
    r.add_argument("--seed", type=nonnegative_int, default=0, help="seed for weights and data (default: 0)")
    r.add_argument("--cpu", action="store_true", help="run on the CPU even where a GPU is available")
    r.add_argument("--optimizer", choices=("default", "fused"), default="default",
                   help="AdamW's implementation: default (PyTorch's choice, foreach on a GPU) or fused (the whole update in "
                        "one pass over memory; with a GradScaler, scaler.step makes no host sync: the fused step unscales "
                        "and skips on inf/NaN itself); a cure for the optimizer's share of the step")
    r.add_argument("--compile", action="store_true",
                   help="torch.compile the model (Module.compile, after the FP32 reference pass: compilation falls "
                        "in the warm-up steps); the cure for a host-bound step, one of them")
    r.add_argument("--no-clocks", action="store_true",
                   help="do not read the SM clock, power and clock-event reasons from NVML during the measured steps")
    r.add_argument("--largest-batch-in", type=float, default=None, metavar="GIB",
                   help="instead of training: find the largest batch (a multiple of 8) whose training step fits in "
                        "GIB GiB of GPU memory (the caching allocator's limit), one step per probe; needs a GPU")
    r.add_argument("--json", type=output_file, default=None, metavar="FILE", help="write the configuration and results here")
    r.add_argument("--census", type=output_file, default=None, metavar="FILE",
                   help="instead of training: run the FP32 reference backward of the first step alone and write the "
                        "census of its gradient against FP16's range, per parameter group, and what one unscaled FP16 backward of "
                        "the same step zeroes, split by group and range, with provenance, to FILE")
    args = p.parse_args(argv)
    if args.census is not None and args.largest_batch_in is not None:
        p.error("--census and --largest-batch-in each replace the training run: give one of them")
    if args.census is not None and args.json is not None:
        p.error("--census writes its own file: leave out --json")
    if args.d_model % args.heads:
        p.error(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        p.error("--lr must be a positive number")
    if args.largest_batch_in is not None and not (math.isfinite(args.largest_batch_in) and args.largest_batch_in > 0):
        p.error("--largest-batch-in must be a positive number of GiB")
    return args


def build_model(torch: Any, args: argparse.Namespace) -> Any:
    nn = torch.nn

    class Encoder(nn.Module):
        """BERT's shape: embeddings, post-LN encoder layers, a classifier on the first token."""

        def __init__(self) -> None:
            super().__init__()
            self.tokens = nn.Embedding(VOCAB, args.d_model)
            self.positions = nn.Embedding(512, args.d_model)
            self.norm = nn.LayerNorm(args.d_model)
            layer = nn.TransformerEncoderLayer(args.d_model, args.heads, args.d_ff, dropout=0.0, activation="gelu",
                                               batch_first=True, norm_first=False)
            self.layers = nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)
            self.classify = nn.Linear(args.d_model, 2)

        def forward(self, ids: Any) -> Any:
            pos = torch.arange(ids.shape[1], device=ids.device)
            x = self.norm(self.tokens(ids) + self.positions(pos))
            return self.classify(self.layers(x)[:, 0])

    return Encoder()


def set_tf32(torch: Any, on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def underflow_count(torch: Any, model: Any, reference: dict[str, Any]) -> tuple[int, int, dict[str, int]]:
    """(gradient elements exactly zero here but not in the FP32 reference, elements compared, the count per parameter
    where it is not zero)."""
    lost = total = 0
    where: dict[str, int] = {}
    for name, p in model.named_parameters():
        if p.grad is None or name not in reference:
            continue
        ref = reference[name]
        n = int(((p.grad == 0) & (ref != 0)).sum())
        lost += n
        total += ref.numel()
        if n:
            where[name] = n
    return lost, total, where


def parameter_group(name: str) -> str:
    """The group a parameter's name puts it in: autocast computes the ``linear`` group's gradients (the matrix
    products' weights and biases) in half precision, and leaves ``embeddings`` and ``layernorm`` in FP32."""
    if name.startswith(("tokens.", "positions.")):
        return "embeddings"
    return "layernorm" if ".norm" in f".{name}" else "linear"


def gradient_agreement(torch: Any, model: Any, reference: dict[str, Any], scale: float | None) -> dict[str, dict[str, float]]:
    """The first step's gradient against the FP32 reference of the same batch and weights, over all parameters and
    per :func:`parameter_group`: the relative error ||g - g_ref|| / ||g_ref|| and the cosine of the angle between
    them. A precision's cost read directly, where the loss curve cannot separate it from rounding. ``scale``: the
    GradScaler's scale the gradients were multiplied by (None: not scaled)."""
    sums: dict[str, list[float]] = {}
    for name, p in model.named_parameters():
        if p.grad is None or name not in reference:
            continue
        g = p.grad.detach().double() / (scale or 1.0)
        ref = reference[name].double()
        for group in ("all", parameter_group(name)):
            acc = sums.setdefault(group, [0.0, 0.0, 0.0, 0.0])  # |g - ref|^2, |ref|^2, <g, ref>, |g|^2
            acc[0] += float(((g - ref) ** 2).sum())
            acc[1] += float((ref ** 2).sum())
            acc[2] += float((g * ref).sum())
            acc[3] += float((g ** 2).sum())
    return {group: {"relative_error": math.sqrt(d / r) if r else float("nan"),
                    "cosine": dot / math.sqrt(r * gg) if r and gg else float("nan")}
            for group, (d, r, dot, gg) in sums.items()}


CENSUS_GROUPS = ("embeddings", "layernorm", "attention_key_bias", "matrix_weights", "other_biases")


def census_parts(name: str, grad: Any) -> list[tuple[str, Any]]:
    """A parameter's gradient split into the census groups (:data:`CENSUS_GROUPS`). The packed attention input
    projection's bias (``in_proj_bias``: query, key, value, ``d_model`` each) gives its key third a group of its
    own: softmax is unchanged by a term that is the same for every key, and q.b_k is, so the key bias's true
    gradient is exactly zero and what an FP32 backward holds there is rounding noise."""
    group = parameter_group(name)
    if group != "linear":
        return [(group, grad)]
    if name.endswith("in_proj_bias"):
        d = grad.numel() // 3
        return [("other_biases", grad[:d]), ("attention_key_bias", grad[d:2 * d]), ("other_biases", grad[2 * d:])]
    return [("matrix_weights" if name.endswith("weight") else "other_biases", grad)]


def fp16_range_census(torch: Any, reference: dict[str, Any]) -> dict[str, Any]:
    """Where the FP32 reference gradient's elements would fall in FP16: the elements FP16 cannot hold at all
    (0 < |g| < 2^-25: they round to zero), those it holds only as subnormals (2^-25 <= |g| < 2^-14: fewer
    significant bits), and the rest; in all and per :func:`census_parts` group (``by_group``, with each group's
    largest |g|). It counts every parameter, including those whose gradient autocast leaves in FP32 (the
    embeddings', the LayerNorms'), and the key bias, whose true gradient is zero, so it is a census of the FP32
    gradient, not a prediction of what FP16 without loss scaling loses; BF16 has FP32's exponent range."""
    by_group = {g: {"elements": 0, "nonzero": 0, "below_fp16_subnormal": 0, "fp16_subnormal": 0, "max_abs": 0.0}
                for g in CENSUS_GROUPS}
    for name, grad in reference.items():
        for group, g in census_parts(name, grad):
            a = g.abs()
            row = by_group[group]
            row["elements"] += a.numel()
            row["nonzero"] += int((a > 0).sum())
            row["below_fp16_subnormal"] += int(((a > 0) & (a < 2.0 ** -25)).sum())
            row["fp16_subnormal"] += int(((a >= 2.0 ** -25) & (a < 2.0 ** -14)).sum())
            row["max_abs"] = max(row["max_abs"], float(a.max()) if a.numel() else 0.0)
    return {**{k: sum(r[k] for r in by_group.values()) for k in ("nonzero", "below_fp16_subnormal", "fp16_subnormal")},
            "by_group": by_group}


def fp16_loss_split(torch: Any, model: Any, ids: Any, labels: Any, reference: dict[str, Any], device: str) -> dict[str, Any]:
    """What unscaled FP16 loses on the first step, split: the elements exactly zero after one ``autocast(float16)``
    backward without a scaler (TF32 off, the same weights and batch) but not in the FP32 reference, per
    :func:`census_parts` group and by where the reference puts them (``below_fp16_subnormal``, ``fp16_subnormal``,
    ``fp16_normal``). The census of FP32 magnitudes alone cannot say this: half-precision arithmetic upstream can zero
    an element whose FP32 value FP16 could hold, and leave non-zero noise where FP32 is below 2^-25. Its ``lost``
    total is the training run's ``underflowed_grad_elements`` for ``fp16-noscaler`` (the same computation)."""
    set_tf32(torch, False)
    model.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device, dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(model(ids), labels)
    loss.backward()
    ranges = ("below_fp16_subnormal", "fp16_subnormal", "fp16_normal")
    by_group = {g: {"lost": 0, **{r: 0 for r in ranges}} for g in CENSUS_GROUPS}
    for name, param in model.named_parameters():
        if param.grad is None or name not in reference:
            continue
        lost = (param.grad == 0) & (reference[name] != 0)
        for (group, ref), (_, gone) in zip(census_parts(name, reference[name].abs()), census_parts(name, lost)):
            row = by_group[group]
            row["lost"] += int(gone.sum())
            row["below_fp16_subnormal"] += int((gone & (ref < 2.0 ** -25)).sum())
            row["fp16_subnormal"] += int((gone & (ref >= 2.0 ** -25) & (ref < 2.0 ** -14)).sum())
            row["fp16_normal"] += int((gone & (ref >= 2.0 ** -14)).sum())
    model.zero_grad(set_to_none=True)
    return {"lost": sum(r["lost"] for r in by_group.values()), "by_group": by_group,
            **{r: sum(row[r] for row in by_group.values()) for r in ranges}}


def reference_gradients(torch: Any, model: Any, ids: Any, labels: Any) -> tuple[dict[str, Any], float]:
    """The FP32 reference of the first step: each parameter's gradient (a clone) and the loss, from the model's
    current weights, TF32 off, no autocast; the model's gradients are cleared again afterwards."""
    set_tf32(torch, False)
    model.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(ids), labels)
    loss.backward()
    reference = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return reference, float(loss.detach())


def training_ids(torch: Any, args: argparse.Namespace) -> Any:
    """The token ids every step trains on, on the CPU: drawn from a generator of their own (seeded ``--seed`` + 1),
    so they depend neither on the device nor on the weights, and a reader (chapter 10's census comparison) can
    draw them again without building the model."""
    g = torch.Generator().manual_seed(args.seed + 1)
    return torch.randint(0, VOCAB, (args.batch_size, args.seq_len), generator=g)


def first_batch(torch: Any, args: argparse.Namespace, device: str) -> tuple[Any, Any, Any]:
    """The model from ``--seed`` and the batch every step trains on (its generator seeded ``--seed`` + 1), on
    ``device``: the same on every machine, since both are drawn on the CPU."""
    torch.manual_seed(args.seed)
    model = build_model(torch, args).to(device)
    ids = training_ids(torch, args).to(device)
    labels = (ids[:, 1] % 2).long()  # a rule the model can learn: the parity of the second token
    return model, ids, labels


def census_run(args: argparse.Namespace, device: str, command: str) -> dict[str, Any]:
    """``--census``: the first step's FP32 reference backward alone, :func:`fp16_range_census` of it and
    :func:`fp16_loss_split` (one unscaled FP16 backward of the same step, what it zeroed, split), with
    the provenance a committed record needs (the command, torch's version, the date; :func:`write_json` adds
    the machine). No training step runs, so no mode is involved."""
    import datetime

    torch = require_torch("mixed_precision.py")
    model, ids, labels = first_batch(torch, args, device)
    reference, loss = reference_gradients(torch, model, ids, labels)
    census = fp16_range_census(torch, reference)
    split = fp16_loss_split(torch, model, ids, labels, reference, device)
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
              if k not in ("json", "census", "mode", "warmup", "steps", "lr", "largest_batch_in", "optimizer", "compile")}
    return {"what": "the FP32 reference gradient of the first step (TF32 off, no autocast), counted against FP16's "
                    "range: below_fp16_subnormal is 0 < |g| < 2^-25 (rounds to zero in FP16), fp16_subnormal is "
                    "2^-25 <= |g| < 2^-14",
            "provenance": {"command": command, "torch": torch.__version__, "device": device,
                           "cpu_threads": torch.get_num_threads(),
                           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")},
            "config": config, "reference_loss": loss, "census": census, "fp16_noscaler_lost": split}


def largest_batch(args: argparse.Namespace, budget_gib: float) -> dict[str, Any]:
    """The largest batch, a multiple of 8, whose whole training step fits in ``budget_gib`` GiB: measured, not modelled.

    The caching allocator is capped at the budget (``set_per_process_memory_fraction``), and one
    full step (forward, backward, optimizer) runs per probe: batches double from 8 until one runs
    out of memory, then bisection between the last that fitted and the first that did not. The
    weights and AdamW's state stay allocated throughout, as in training; autocast's weight copies
    and the activations are what a larger batch adds. Fragmentation counts against a batch, as it
    would in a real run.
    """
    import gc

    torch = require_torch("mixed_precision.py")
    total = torch.cuda.get_device_properties(0).total_memory
    budget = int(budget_gib * 2**30)
    if budget >= total:
        raise GpuprofError(f"--largest-batch-in {budget_gib:g} GiB is not below this GPU's {total / 2**30:.1f} GiB.",
                           "Choose a smaller budget.")
    torch.cuda.set_per_process_memory_fraction(budget / total)
    torch.manual_seed(args.seed)
    model = build_model(torch, args).cuda()
    set_tf32(torch, args.mode == "tf32")
    dtype = {"fp16": torch.float16, "fp16-noscaler": torch.float16, "bf16": torch.bfloat16}.get(args.mode)
    scaler = torch.amp.GradScaler("cuda") if args.mode == "fp16" else None
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    g = torch.Generator().manual_seed(args.seed + 1)
    probes: list[dict[str, Any]] = []

    def fits(batch: int) -> bool:
        ids = torch.randint(0, VOCAB, (batch, args.seq_len), generator=g).cuda()
        torch.cuda.reset_peak_memory_stats()
        try:
            with torch.autocast(device_type="cuda", dtype=dtype, enabled=dtype is not None):
                loss = torch.nn.functional.cross_entropy(model(ids), (ids[:, 1] % 2).long())
            (scaler.scale(loss) if scaler else loss).backward()
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            torch.cuda.synchronize()
            ok = True
        except torch.OutOfMemoryError:
            ok = False
        opt.zero_grad(set_to_none=True)
        loss = ids = None
        gc.collect()
        peak = int(torch.cuda.max_memory_allocated())
        torch.cuda.empty_cache()
        probes.append({"batch": batch, "fits": ok, "peak_bytes": peak if ok else None})
        print(f"  batch {batch:5d}: " + (f"fits, peak {peak / 2**30:.2f} GiB" if ok else "out of memory"), flush=True)
        return ok

    good, bad = 0, None
    batch = 8
    while bad is None:
        if fits(batch):
            good, batch = batch, batch * 2
            if batch > 65536:
                raise GpuprofError("a batch of 65,536 still fits: the budget is not what limits the batch here.")
        else:
            bad = batch
    if good == 0:
        raise GpuprofError(f"even a batch of 8 does not fit in {budget_gib:g} GiB.", "Choose a larger budget.")
    while bad - good > 8:
        mid = (good + bad) // 16 * 8
        if fits(mid):
            good = mid
        else:
            bad = mid
    peak = next(p["peak_bytes"] for p in probes if p["batch"] == good)
    return {"budget_gib": budget_gib, "largest_batch": good, "first_batch_out_of_memory": bad,
            "peak_bytes_at_largest": peak, "probes": probes}


def run(args: argparse.Namespace, device: str) -> dict[str, Any]:
    import time

    from gpuprof.nvml import describe_window, torch_sampler

    torch = require_torch("mixed_precision.py")
    gpu = device == "cuda"
    model, ids, labels = first_batch(torch, args, device)
    # NVML read by a thread from here on; the measured steps' window is summarised after the loop
    sampler, power_limit, clocks_how = torch_sampler(torch, gpu, not args.no_clocks)
    print(f"  clocks: {clocks_how}", flush=True)
    window = [0.0, 0.0]  # time.monotonic() at the first measured step's start and after the last one's sync

    # The FP32 reference gradient of the first step, from the same weights and batch.
    reference, reference_loss = reference_gradients(torch, model, ids, labels)
    census = fp16_range_census(torch, reference)
    if gpu:  # the FP32 reference pass's peak (FP32 activations, no optimizer state yet) is not the step's
        torch.cuda.reset_peak_memory_stats()

    set_tf32(torch, args.mode == "tf32")
    dtype = {"fp16": torch.float16, "fp16-noscaler": torch.float16, "bf16": torch.bfloat16}.get(args.mode)
    scaler = torch.amp.GradScaler(device) if args.mode == "fp16" else None
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, **({"fused": True} if args.optimizer == "fused" else {}))
    if args.compile:
        model.compile()  # in place: model(ids) below runs the compiled forward; the FP32 reference above did not

    def timer() -> Any:
        return torch.cuda.Event(enable_timing=True) if gpu else None

    def stamp(ev: Any) -> None:
        if ev is not None:
            ev.record()

    steps: list[dict[str, Any]] = []
    first_underflow: tuple[int, int, dict[str, int]] | None = None
    agreement: dict[str, dict[str, float]] = {}
    measured_range = contextlib.ExitStack()  # "measured_steps" holds the measured steps: nsys --capture-range=nvtx
    total = args.warmup + args.steps
    # The scale is read after each step's synchronize, never inside the step: get_scale() copies it to the
    # host, a sync the training loop itself does not need (the scaler's own one is in scaler.step).
    scale = scaler.get_scale() if scaler else None
    for i in range(total):
        measured = i >= args.warmup
        if i == args.warmup:
            window[0] = time.monotonic()  # each step ends in a synchronize: the warm-up's work is done
            measured_range.enter_context(annotate("measured_steps"))
        name = f"step_{i - args.warmup}" if measured else f"warmup_step_{i}"
        marks = [timer() for _ in range(4)]
        with annotate(name):
            stamp(marks[0])
            with annotate("forward"), torch.autocast(device_type=device, dtype=dtype, enabled=dtype is not None):
                loss = torch.nn.functional.cross_entropy(model(ids), labels)
            stamp(marks[1])
            with annotate("backward"):
                (scaler.scale(loss) if scaler else loss).backward()
            stamp(marks[2])
            if first_underflow is None:
                first_underflow = underflow_count(torch, model, reference)
                agreement = gradient_agreement(torch, model, reference, scale)
                reference = {}  # the clone is freed: the steps after the first do not carry it
            with annotate("optimizer_step"):
                if scaler:
                    scaler.step(opt)  # unscale, check for inf/NaN (a host sync), step only if none
                    scaler.update()
                else:
                    opt.step()
                opt.zero_grad(set_to_none=True)
            stamp(marks[3])
        peak = None
        if gpu:
            torch.cuda.synchronize()
            # this step's own peak (reset just before it); read after its sync, outside the timed events
            peak = int(torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
        skipped = False
        if scaler:
            before, scale = scale, scaler.get_scale()
            skipped = scale < before  # the scaler halves its scale when it skips a step
        row = {"step": i, "measured": measured, "loss": float(loss.detach().float()), "scale": scale, "skipped": skipped,
               "peak_bytes": peak}
        if gpu:
            row.update(forward_ms=marks[0].elapsed_time(marks[1]), backward_ms=marks[1].elapsed_time(marks[2]),
                       optimizer_ms=marks[2].elapsed_time(marks[3]), step_ms=marks[0].elapsed_time(marks[3]))
        steps.append(row)
        print(f"  {name}: loss {row['loss']:.4f}" + (f", {row['step_ms']:.2f} ms" if gpu else "")
              + (f", scale {row['scale']:g}" + (" (step skipped)" if skipped else "") if scaler else ""), flush=True)
    window[1] = time.monotonic()
    measured_range.close()
    nvml = None
    if sampler is not None:
        sampler.__exit__(None, None, None)
        nvml = {**sampler.summary(*window), "power_limit_w": power_limit}
        print(f"  during the measured steps: {describe_window(nvml)}", flush=True)
    lost, compared, where = first_underflow or (0, 0, {})
    top = dict(sorted(where.items(), key=lambda kv: -kv[1])[:5])
    out: dict[str, Any] = {"mode": args.mode, "device": device, "steps": steps, "underflowed_grad_elements": lost,
                           "underflow_by_parameter": top, "reference_fp16_census": census,
                           "reference_loss": reference_loss,
                           "grad_elements": compared, "first_step_gradient_vs_fp32": agreement, "parameters": sum(p.numel() for p in model.parameters()),
                           "nvml": nvml, **({} if nvml else {"nvml_why": clocks_how})}
    if gpu:
        later = [s["peak_bytes"] for s in steps[1:]]  # step 0 also holds the reference gradients' clone
        out["step_peak_memory_bytes"] = max(later) if later else None
        out["step_ms_median"] = statistics.median(s["step_ms"] for s in steps if s["measured"])
    return out


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch, device, where = torch_device("mixed_precision.py", args.cpu)
    gpu = device == "cuda"
    where = where if gpu else "the CPU (no timings: for checking the script)"
    print(f"mixed_precision: {args.mode}, {args.layers} layers of {args.d_model} ({args.heads} heads, d_ff {args.d_ff}), "
          f"batch {args.batch_size} x {args.seq_len} tokens, on {where}", flush=True)
    if gpu and args.mode == "bf16" and not torch.cuda.is_bf16_supported():
        raise GpuprofError(f"{where} has no bf16 arithmetic.", "Choose another --mode (bf16 needs compute capability 8.0 or newer).")
    params = 12 * args.layers * args.d_model ** 2 + (VOCAB + 512) * args.d_model  # the encoder's weights, about
    activations = args.batch_size * args.seq_len * args.layers * (16 * args.d_model + 2 * args.d_ff) * 4
    require_memory(16 * params + activations, device, f"{args.layers} layers of {args.d_model:,} at batch "
                   f"{args.batch_size:,} x {args.seq_len:,} (weights, AdamW's state, activations)",
                   "--layers, --d-model, --d-ff, --batch-size or --seq-len", lower_bound=True)
    if args.census is not None:
        import shlex

        from gpuprof.kernels import write_json

        command = shlex.join(["python", "examples/nsys/mixed_precision.py", *(sys.argv[1:] if argv is None else argv)])
        record = census_run(args, device, command)
        c = record["census"]
        print(f"FP32 reference gradient on the {device.upper()}: {c['nonzero']:,} non-zero elements, {c['below_fp16_subnormal']:,} "
              f"below 2^-25 (zero in FP16), {c['fp16_subnormal']:,} FP16 subnormals; below 2^-25 by group: "
              + ", ".join(f"{g} {r['below_fp16_subnormal']:,}" for g, r in c["by_group"].items()))
        write_json(args.census, record)
        return 0
    if args.largest_batch_in is not None:
        if not gpu:
            raise GpuprofError("--largest-batch-in measures GPU memory, and there is no GPU here.",
                               "Run it on a machine with an NVIDIA GPU; the other options work on the CPU.")
        fit = largest_batch(args, args.largest_batch_in)
        print(f"{args.mode}: the largest batch whose step fits in {args.largest_batch_in:g} GiB is {fit['largest_batch']} "
              f"(peak {fit['peak_bytes_at_largest'] / 2**30:.2f} GiB; {fit['first_batch_out_of_memory']} did not fit)")
        if args.json:
            from gpuprof.kernels import write_json

            write_json(args.json, {"config": {k: v for k, v in vars(args).items() if k != "json"},
                                   "torch": torch.__version__, "gpu": where, "mode": args.mode, **fit})
        return 0
    result = run(args, device)
    losses = [s["loss"] for s in result["steps"]]
    if not all(math.isfinite(v) for v in losses):
        raise GpuprofError(f"{args.mode}: a loss that is not finite ({losses}).", "The run diverged: see the scale column.")
    first, ref = losses[0], result["reference_loss"]
    if abs(first - ref) > 0.05 * abs(ref):
        raise GpuprofError(f"{args.mode}: the first step's loss {first:.4f} is not within 5% of the FP32 reference's "
                           f"{ref:.4f} from the same weights and batch.")
    share = result["underflowed_grad_elements"] / max(result["grad_elements"], 1)
    print(f"first step: {result['underflowed_grad_elements']:,} of {result['grad_elements']:,} gradient elements "
          f"({share:.2%}) are zero here but not in the FP32 reference (in FP16 mostly underflow)")
    agree = result["first_step_gradient_vs_fp32"].get("all", {})
    if agree:
        print(f"first step's gradient against the FP32 reference: relative error {agree['relative_error']:.2e}, "
              f"cosine {agree['cosine']:.6f}")
    print(f"result checked: every loss finite; the first step's loss {first:.4f} within 5% of the FP32 reference's {ref:.4f}")
    if args.json:
        from gpuprof.kernels import write_json

        write_json(args.json, {"config": {k: v for k, v in vars(args).items() if k != "json"}, "torch": torch.__version__,
                               "gpu": where, **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
