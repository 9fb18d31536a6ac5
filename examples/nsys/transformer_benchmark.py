#!/usr/bin/env python3
"""Benchmark a decoder-only transformer: forward, backward and optimizer step, timed and marked for Nsight Systems.

The model is a GPT-style language model written in plain PyTorch (no download): token and
position embeddings, pre-LayerNorm blocks of causal self-attention
(``F.scaled_dot_product_attention``) and a GELU feed-forward, a final LayerNorm and a
vocabulary head; AdamW. Inputs are random token ids (the benchmark times the arithmetic,
not learning). Sizes come from the flags, or from the five named sizes of the benchmark the
course grew from (--size small|medium|large|xl|2.7B; ``tiny`` is for quick checks).

Each step is timed with CUDA events placed between its phases (forward, backward,
optimizer), read after the step's synchronisation; the warm-up steps are timed the same way
and reported apart. NVTX ranges for Nsight Systems:

  warmup            all warm-up steps (inside it, warmup_step_N)
  measured_steps    all measured steps: nsys --capture-range=nvtx --nvtx-capture=measured_steps
  step_N            one measured step, inside it forward_pass, backward_pass, optimizer_step

--sweep runs every size in --sizes at every length in --contexts, each in a fresh process
forked from one that imported PyTorch once (gpuprof.fork_runs: one configuration's memory
and autotuning cannot help or hurt the next, and no run pays for the imports), reports
a configuration that runs out of memory as a row and goes on, and records the peak memory
of each.

The benchmark the course grew from spells its flags with underscores (--context_length,
--d_model, --num_layers, --num_heads, --d_ff, --warmup_steps, --num_steps, --forward_only);
those spellings are accepted as written, beside the hyphenated ones.

Examples:
  python examples/nsys/transformer_benchmark.py --size small --context-length 512
  python examples/nsys/transformer_benchmark.py --size small --forward-only --dtype bf16
  nsys profile --trace=cuda,nvtx -o small \\
      python examples/nsys/transformer_benchmark.py --size small --context-length 512 --warmup-steps 5 --num-steps 10
  nsys profile --trace=cuda,nvtx --capture-range=nvtx --nvtx-capture=measured_steps \\
      --env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0 -o measured python examples/nsys/transformer_benchmark.py --size small
  python examples/nsys/transformer_benchmark.py --sweep --dtype bf16 --json sweep.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.backend import require_torch  # noqa: E402
from gpuprof.cli import nonnegative_int, output_file, positive_int, require_memory  # noqa: E402
from gpuprof.errors import GpuprofError, is_out_of_memory, out_of_memory_sentence  # noqa: E402
from gpuprof.fork_runs import run_all  # noqa: E402
from gpuprof.ranges import annotate  # noqa: E402
from gpuprof.timing import Clock  # noqa: E402

# d_model, d_ff, num_layers, num_heads: the sizes of the benchmark's assignment table, plus a tiny one.
PRESETS: dict[str, tuple[int, int, int, int]] = {
    "tiny": (64, 256, 2, 4),
    "small": (768, 3072, 12, 12),
    "medium": (1024, 4096, 24, 16),
    "large": (1280, 5120, 36, 20),
    "xl": (1600, 6400, 48, 25),
    "2.7B": (2560, 10240, 32, 32),
}
VOCAB = 10_000
DTYPES = ("fp32", "tf32", "bf16")
# A configuration that does not fit (refused up front, or out of memory while running) exits 2, as any refused
# run does, and its --json says "out of memory": the sweep reads that and makes it a row.
OOM_EXIT = 2
PHASES = ("forward", "backward", "optimizer")


def size_spec(text: str) -> tuple[str, tuple[int, int, int, int]]:
    """A size for --sizes: a preset name, or ``name:d_model:d_ff:num_layers:num_heads`` as the seed's sweep wrote them."""
    if text in PRESETS:
        return text, PRESETS[text]
    parts = text.split(":")
    if len(parts) == 5:
        try:
            dims = tuple(int(p) for p in parts[1:])
        except ValueError:
            dims = ()
        if len(dims) == 4 and all(d > 0 for d in dims) and parts[0]:
            return parts[0], dims  # type: ignore[return-value]
    raise argparse.ArgumentTypeError(f"{text!r} is neither a size ({', '.join(PRESETS)}) nor "
                                     "name:d_model:d_ff:num_layers:num_heads with positive whole numbers")


def size_list(text: str) -> list[tuple[str, tuple[int, int, int, int]]]:
    return [size_spec(t.strip()) for t in text.split(",") if t.strip()]


def int_list(text: str) -> list[int]:
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more lengths, each at least 1")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    m = p.add_argument_group("the model (a --size sets the four dimensions)")
    m.add_argument("--size", choices=list(PRESETS), default=None, help="a named size (overrides the four below)")
    m.add_argument("--d-model", "--d_model", type=positive_int, default=768, help="width (default: 768)")
    m.add_argument("--d-ff", "--d_ff", type=positive_int, default=3072, help="feed-forward width (default: 3072)")
    m.add_argument("--num-layers", "--num_layers", type=positive_int, default=12, help="blocks (default: 12)")
    m.add_argument("--num-heads", "--num_heads", type=positive_int, default=12, help="attention heads (default: 12)")
    m.add_argument("--context-length", "--context_length", type=positive_int, default=256, help="tokens per sequence (default: 256)")
    r = p.add_argument_group("the run")
    r.add_argument("--batch-size", "--batch_size", type=positive_int, default=4, help="sequences per step (default: 4)")
    r.add_argument("--warmup-steps", "--warmup_steps", type=nonnegative_int, default=5, help="untimed steps first (default: 5)")
    r.add_argument("--num-steps", "--num_steps", type=positive_int, default=10, help="measured steps (default: 10)")
    r.add_argument("--forward-only", "--forward_only", action="store_true", help="time the forward pass alone (under torch.no_grad)")
    r.add_argument("--dtype", choices=DTYPES, default="fp32",
                   help="fp32 (TF32 off), tf32 (fp32 tensors, TF32 matrix products) or bf16 (autocast) (default: fp32)")
    r.add_argument("--attention", choices=("sdpa", "manual"), default="sdpa",
                   help="sdpa: F.scaled_dot_product_attention (a fused kernel); manual: written out (Q K^T, the causal "
                        "mask, softmax, times V), each part in an NVTX range attention_scores / attention_softmax / "
                        "attention_values (default: sdpa)")
    r.add_argument("--compile", action="store_true", help="torch.compile the model (compilation falls in the warm-up)")
    r.add_argument("--checkpoint", action="store_true",
                   help="activation checkpointing: each block through torch.utils.checkpoint (non-reentrant), so forward "
                        "saves only the blocks' inputs and backward runs each block's forward again; training only")
    r.add_argument("--optimizer", choices=OPTIMIZER_IMPLS, default="foreach",
                   help="AdamW's implementation: foreach (PyTorch's default on a GPU: one kernel per operation of the "
                        "update, over all weights at once) or fused (one kernel for the whole update) (default: foreach)")
    r.add_argument("--seed", type=nonnegative_int, default=0, help="seed for weights and tokens (default: 0)")
    r.add_argument("--cpu", action="store_true", help="run on the CPU even where a GPU is available")
    r.add_argument("--json", type=output_file, default=None, metavar="FILE", help="write the configuration and results to FILE")
    s = p.add_argument_group("the sweep")
    s.add_argument("--sweep", action="store_true", help="every size in --sizes at every length in --contexts, one process each")
    s.add_argument("--sizes", type=size_list, default=size_list("small,medium,large,xl,2.7B"),
                   help="comma-separated presets or name:d_model:d_ff:num_layers:num_heads (default: the five sizes)")
    s.add_argument("--contexts", type=int_list, default=int_list("128,256,512,1024"),
                   help="comma-separated context lengths (default: 128,256,512,1024)")
    s.add_argument("--child-timeout", type=positive_int, default=600, help="seconds allowed per configuration (default: 600)")
    args = p.parse_args(argv)
    if args.size:
        args.d_model, args.d_ff, args.num_layers, args.num_heads = PRESETS[args.size]
    if args.checkpoint and args.forward_only:
        p.error("--checkpoint saves memory for backward: it has no meaning with --forward-only (nothing is saved)")
    if not args.sweep and args.d_model % args.num_heads:
        p.error(f"--d-model {args.d_model} is not divisible by --num-heads {args.num_heads}")
    for name, (d, _, _, h) in args.sizes if args.sweep else []:
        if d % h:
            p.error(f"size {name}: d_model {d} is not divisible by num_heads {h}")
    return args


OPTIMIZER_IMPLS = ("foreach", "fused")


def model_config(args: argparse.Namespace) -> dict[str, Any]:
    """The configuration as a dict: what --json records and what the chapter's tables are keyed on."""
    return {"size": args.size, "d_model": args.d_model, "d_ff": args.d_ff, "num_layers": args.num_layers,
            "num_heads": args.num_heads, "context_length": args.context_length, "batch_size": args.batch_size,
            "vocab": VOCAB, "dtype": args.dtype, "forward_only": args.forward_only, "compile": args.compile,
            "warmup_steps": args.warmup_steps, "num_steps": args.num_steps, "attention": args.attention,
            "checkpoint": args.checkpoint}


def build_model(cfg: dict[str, Any], device: str) -> Any:
    """The language model, built directly on ``device`` (a 2.7B model initialised on the CPU first takes a minute)."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    def manual_attention(q: Any, k: Any, v: Any) -> Any:
        """Causal attention written out, as a first implementation would be: the t x t scores are materialised."""
        t = q.shape[-2]
        with annotate("attention_scores"):
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        with annotate("attention_softmax"):
            weights = torch.softmax(scores, dim=-1)
        with annotate("attention_values"):
            return weights @ v

    attend = manual_attention if cfg.get("attention") == "manual" else (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))

    class Block(nn.Module):
        def __init__(self, d: int, heads: int, ff: int) -> None:
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
            self.up, self.down = nn.Linear(d, ff, bias=False), nn.Linear(ff, d, bias=False)

        def forward(self, x: Any) -> Any:
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            a = attend(q, k, v)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.down(F.gelu(self.up(self.ln2(x))))

    class LanguageModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = cfg["d_model"]
            self.embed = nn.Embedding(cfg["vocab"], d)
            self.position = nn.Parameter(torch.randn(cfg["context_length"], d) * 0.02)
            self.blocks = nn.ModuleList(Block(d, cfg["num_heads"], cfg["d_ff"]) for _ in range(cfg["num_layers"]))
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, cfg["vocab"], bias=False)

        def forward(self, tokens: Any) -> Any:
            x = self.embed(tokens) + self.position[: tokens.shape[1]]
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    with torch.device(device):
        return LanguageModel()


def matmul_parameters(cfg: dict[str, Any]) -> int:
    """Weights that take part in matrix products per token: the blocks' four projections and the head.

    Embeddings are looked up, not multiplied, and LayerNorm's few weights do no matrix
    product: they are left out, as the usual 6-N-per-token count leaves them out.
    """
    d, ff, layers = cfg["d_model"], cfg["d_ff"], cfg["num_layers"]
    return layers * (4 * d * d + 2 * d * ff) + d * cfg["vocab"]


def least_bytes(cfg: dict[str, Any]) -> int:
    """The least memory a run of ``cfg`` holds, known before anything is allocated: a lower bound.

    The matrix-product weights (:func:`matmul_parameters`, FP32) with, for training, their
    gradients and AdamW's two moments (16 bytes per weight in all, 4 forward-only); the token
    ids (int64, context + 1 per sequence); the logits over the vocabulary (bf16 under
    autocast, else FP32). Activations, embeddings and the allocator's rounding come on top.
    """
    weights = matmul_parameters(cfg) * (4 if cfg["forward_only"] else 16)
    tokens = cfg["batch_size"] * (cfg["context_length"] + 1) * 8
    logits = cfg["batch_size"] * cfg["context_length"] * cfg["vocab"] * (2 if cfg["dtype"] == "bf16" else 4)
    return weights + tokens + logits


def flops_per_step(cfg: dict[str, Any], forward_only: bool) -> int:
    """Model FLOPs of one step: 2 per matmul weight per token forward (6 with backward), plus attention.

    Attention's two products (Q K^T and the weighted sum of V) cost 4 t d per token per
    layer forward; they are counted over the full t x t square, as PaLM's MFU counts them,
    although a causal kernel skips the masked half: a causal model's MFU is then slightly
    flattering, by the same convention as published figures.
    """
    tokens = cfg["batch_size"] * cfg["context_length"]
    forward = 2 * matmul_parameters(cfg) * tokens + 4 * cfg["num_layers"] * tokens * cfg["context_length"] * cfg["d_model"]
    return forward * (1 if forward_only else 3)


def recomputed_flops(cfg: dict[str, Any]) -> int:
    """FLOPs a checkpointed step spends again: each block's forward, recomputed in backward (the head's is not).

    The model FLOPs (:func:`flops_per_step`, what MFU counts) leave them out; hardware FLOPs (HFU) add them. Zero
    without ``checkpoint``.
    """
    if not cfg.get("checkpoint"):
        return 0
    tokens = cfg["batch_size"] * cfg["context_length"]
    d, layers = cfg["d_model"], cfg["num_layers"]
    return 2 * layers * (4 * d * d + 2 * d * cfg["d_ff"]) * tokens + 4 * layers * tokens * cfg["context_length"] * d


def checkpoint_blocks(model: Any) -> None:
    """Each block's forward through ``torch.utils.checkpoint`` (non-reentrant), set on the built model so that
    :func:`build_model`, which the chapter prints, stays the model without it."""
    from torch.utils.checkpoint import checkpoint

    def checkpointed(forward: Any) -> Any:
        return lambda x: checkpoint(forward, x, use_reentrant=False)

    for block in model.blocks:
        block.forward = checkpointed(block.forward)


def summary(values: list[float]) -> dict[str, float]:
    """Mean, standard deviation, min and max of a list of milliseconds."""
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def run(args: argparse.Namespace, device: str) -> dict[str, Any]:
    """Build, warm up, measure; per step the phase times in ms."""
    torch = require_torch("transformer_benchmark.py")
    import torch.nn.functional as F

    gpu = device == "cuda"
    cfg = model_config(args)
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = args.dtype == "tf32"
    torch.backends.cudnn.allow_tf32 = args.dtype == "tf32"
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    model = build_model(cfg, device)
    if args.checkpoint:
        checkpoint_blocks(model)
    forward_model = torch.compile(model) if args.compile else model
    opt = None if args.forward_only else torch.optim.AdamW(model.parameters(), lr=1e-4,
                                                            **{args.optimizer: True})  # foreach=True or fused=True
    gen = torch.Generator(device=device).manual_seed(args.seed)
    tokens = torch.randint(0, VOCAB, (args.batch_size, args.context_length + 1), device=device, generator=gen)
    x, y = tokens[:, :-1], tokens[:, 1:]
    setup_s = time.perf_counter() - t0
    autocast = (torch.autocast(device, dtype=torch.bfloat16) if args.dtype == "bf16" else contextlib.nullcontext())
    clock = Clock(torch, gpu)
    outputs: list[Any] = []  # the loss (or the logits' mean) of every step, read back once at the end

    memory: dict[str, int] = {}  # the last measured step's memory, phase by phase (GPU only)

    def phase_memory(name: str) -> None:
        """Record the allocated bytes now and the peak since the last call, then restart the peak."""
        if gpu and track[0]:
            memory[f"{name}_peak"] = int(torch.cuda.max_memory_allocated())
            memory[f"{name}_end"] = int(torch.cuda.memory_allocated())
            torch.cuda.reset_peak_memory_stats()

    track = [False]

    def step() -> list[float]:
        """One step; returns [forward, backward, optimizer] ms (forward only: [forward])."""
        if gpu and track[0]:
            memory["earlier_peak"] = int(torch.cuda.max_memory_allocated())  # set-up, warm-up, the other steps
            memory["step_start"] = int(torch.cuda.memory_allocated())
            torch.cuda.reset_peak_memory_stats()
        clock.mark()
        if args.forward_only:
            with annotate("forward_pass"), torch.no_grad(), autocast:
                outputs.append(forward_model(x).float().mean())
            clock.mark()
            phase_memory("forward")
        else:
            with annotate("forward_pass"), autocast:
                loss = F.cross_entropy(forward_model(x).flatten(0, 1), y.flatten())
            outputs.append(loss.detach())
            clock.mark()
            phase_memory("forward")
            with annotate("backward_pass"):
                loss.backward()
            clock.mark()
            phase_memory("backward")
            with annotate("optimizer_step"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            clock.mark()
            phase_memory("optimizer")
        if gpu:
            torch.cuda.synchronize()  # as the benchmark does after every step: the step's work is done
        return clock.intervals_ms()

    warmup: list[list[float]] = []
    with annotate("warmup"):
        for i in range(args.warmup_steps):
            with annotate(f"warmup_step_{i}"):
                warmup.append(step())
    measured: list[list[float]] = []
    with annotate("measured_steps"):
        for i in range(args.num_steps):
            track[0] = i == args.num_steps - 1  # phase memory in the last step (its calls are host-side only)
            with annotate(f"step_{i}"):
                measured.append(step())
    phases = PHASES[:1] if args.forward_only else PHASES
    per_phase = {f"{name}_ms": summary([s[j] for s in measured]) for j, name in enumerate(phases)}
    step_ms = [sum(s) for s in measured]
    flops = flops_per_step(cfg, args.forward_only)
    mean_s = statistics.fmean(step_ms) / 1e3
    values = torch.stack(outputs).float()
    result: dict[str, Any] = {
        "finite": bool(values.isfinite().all()), "last_output": float(values[-1]),
        "setup_s": setup_s, "parameters": sum(p.numel() for p in model.parameters()),
        "matmul_parameters": matmul_parameters(cfg), "flops_per_step": flops,
        "warmup_step_ms": [sum(s) for s in warmup], "step_ms_each": step_ms, "phase_ms_each": measured,
        "step_ms": summary(step_ms), **per_phase,
        "tokens_per_s": args.batch_size * args.context_length / mean_s, "achieved_tflops": flops / mean_s / 1e12,
        "peak_memory_bytes": max(v for k, v in memory.items() if k.endswith("_peak")) if gpu else None,
        "optimizer": args.optimizer,
    }
    if gpu:  # what the memory holds: weights, gradients and AdamW's moments are counted, not inferred
        result["memory"] = {**memory, "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
                            "optimizer_state_bytes": 0 if opt is None else sum(
                                t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
                                if torch.is_tensor(t) and t.dim() > 0)}
    if not args.forward_only:  # model FLOPs of forward + backward over their time, the optimizer apart
        fb_s = statistics.fmean([s[0] + s[1] for s in measured]) / 1e3
        result["forward_backward_tflops"] = flops / fb_s / 1e12
        # with checkpointing the GPU also does each block's forward again: hardware FLOPs (HFU) beside model FLOPs
        result["hardware_flops_per_step"] = flops + recomputed_flops(cfg)
        result["achieved_hardware_tflops"] = result["hardware_flops_per_step"] / mean_s / 1e12
    return result


def describe(result: dict[str, Any], cfg: dict[str, Any]) -> str:
    parts = [f"step {result['step_ms']['mean']:.2f} ms (std {result['step_ms']['std']:.2f})"]
    for name in PHASES:
        if f"{name}_ms" in result:
            parts.append(f"{name} {result[f'{name}_ms']['mean']:.2f}")
    rate = f"{result['tokens_per_s']:,.0f} tokens/s, {result['achieved_tflops']:.1f} TFLOP/s (model FLOPs)"
    return "; ".join(parts) + " | " + rate


def write_json(path: Path, data: dict[str, Any]) -> None:
    from gpuprof.kernels import write_json as _write

    _write(path, data)


def single(args: argparse.Namespace) -> int:
    torch = require_torch("transformer_benchmark.py")
    gpu = torch.cuda.is_available() and not args.cpu
    device = "cuda" if gpu else "cpu"
    where = torch.cuda.get_device_name() if gpu else "the CPU"
    cfg = model_config(args)
    what = "forward only" if args.forward_only else "forward + backward + AdamW"
    print(f"transformer_benchmark: d_model {args.d_model}, d_ff {args.d_ff}, {args.num_layers} layers, "
          f"{args.num_heads} heads, context {args.context_length}, batch {args.batch_size}, {args.dtype}"
          f"{', compiled' if args.compile else ''}{', each block checkpointed' if args.checkpoint else ''}, {what}, on {where}",
          flush=True)
    base = {"config": cfg, "device": device, "gpu": where, "torch": torch.__version__}
    try:
        require_memory(least_bytes(cfg), device,
                       f"d_model {args.d_model:,} x {args.num_layers:,} layers at batch {args.batch_size:,} x context "
                       f"{args.context_length:,} ({'weights' if args.forward_only else 'weights, gradients, AdamW state'}, "
                       "token ids, logits)",
                       "--size (or --d-model, --d-ff, --num-layers), --batch-size or --context-length", lower_bound=True)
        result = run(args, device)
    except Exception as exc:  # noqa: BLE001 - only a configuration that does not fit is turned into a result
        if isinstance(exc, GpuprofError):
            refused = exc
        elif is_out_of_memory(exc):
            refused = GpuprofError(out_of_memory_sentence(exc))
        else:
            raise
        if args.json:
            write_json(args.json, {**base, "status": "out of memory", "error": str(refused)})
        raise refused from None
    first = result["warmup_step_ms"][0] if result["warmup_step_ms"] else None
    print(f"  {result['parameters'] / 1e6:,.1f} M parameters; " + describe(result, cfg))
    if first is not None:
        print(f"  first warm-up step {first:.1f} ms, measured steps {result['step_ms']['min']:.2f}-"
              f"{result['step_ms']['max']:.2f} ms")
    if result["peak_memory_bytes"] is not None:
        print(f"  peak GPU memory allocated: {result['peak_memory_bytes'] / 2**30:.2f} GiB")
    if not result["finite"]:
        raise GpuprofError("a step produced a loss (or output) that is not finite: the numbers above time broken arithmetic.")
    what = "output mean" if args.forward_only else "loss"
    print(f"result checked: every step's {what} is finite (last {result['last_output']:.4f}), "
          f"{args.num_steps} measured steps timed")
    if args.json:
        write_json(args.json, {**base, "status": "ok", **result})
    return 0


def child_args(args: argparse.Namespace, name: str, dims: tuple[int, int, int, int], context: int, out: Path) -> list[str]:
    """The command line of one sweep configuration: the run's flags, this size and this length."""
    d, ff, layers, heads = dims
    cmd = [sys.executable, str(Path(__file__).resolve()), "--d-model", str(d), "--d-ff", str(ff),
           "--num-layers", str(layers), "--num-heads", str(heads), "--context-length", str(context),
           "--batch-size", str(args.batch_size), "--warmup-steps", str(args.warmup_steps),
           "--num-steps", str(args.num_steps), "--dtype", args.dtype, "--seed", str(args.seed), "--json", str(out),
           "--optimizer", args.optimizer, "--attention", args.attention]
    for flag in ("forward_only", "compile", "checkpoint", "cpu"):
        if getattr(args, flag):
            cmd.append("--" + flag.replace("_", "-"))
    if name in PRESETS:
        cmd += ["--size", name]
    return cmd


def sweep(args: argparse.Namespace) -> int:
    """Each size at each context length in a fresh process; a row per configuration, whatever its fate."""
    rows: list[dict[str, Any]] = []
    total = len(args.sizes) * len(args.contexts)
    print(f"sweep: {len(args.sizes)} sizes x {len(args.contexts)} context lengths = {total} configurations, "
          f"batch {args.batch_size}, {args.dtype}, {'forward only' if args.forward_only else 'training steps'}", flush=True)
    t_start = time.perf_counter()
    configs = [(name, dims, context) for name, dims in args.sizes for context in args.contexts]
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"{name}_{context}.json" for name, _, context in configs]
        # Each configuration is a process forked from one that imported PyTorch once (gpuprof.fork_runs): a fresh
        # CUDA context, allocator and autotuning cache per configuration, without paying ~6 s of imports each time.
        argvs = [child_args(args, name, dims, context, out)[2:] for (name, dims, context), out in zip(configs, outs)]
        for i, status, wall, log in run_all(Path(__file__).resolve(), argvs, timeout_s=args.child_timeout):
            name, _, context = configs[i]
            row: dict[str, Any] = {"name": name, "context_length": context, "wall_s": wall}
            if outs[i].exists():
                row.update(json.loads(outs[i].read_text()))
            if status == str(OOM_EXIT) and row.get("status") == "out of memory":  # refused up front, or ran out
                note = "out of memory"
            elif status == "0" and row.get("status") == "ok":
                note = describe(row, row["config"])
            else:
                lines = [ln for ln in log.strip().splitlines() if ln.strip()]
                row["status"] = "failed"
                row["error"] = (f"did not finish within {args.child_timeout} s" if status == "timeout"
                                else lines[-1] if lines else f"exit status {status}")
                note = "failed: " + row["error"]
            rows.append(row)
            print(f"  [{len(rows)}/{total}] {name:>7} context {context:>5}: {note} ({row['wall_s']:.0f} s)", flush=True)
    ok = sum(r["status"] == "ok" for r in rows)
    oom = sum(r["status"] == "out of memory" for r in rows)
    print(f"sweep done in {time.perf_counter() - t_start:.0f} s: {ok} ran, {oom} out of memory, {len(rows) - ok - oom} failed")
    if args.json:
        write_json(args.json, {"sweep": {"sizes": [n for n, _ in args.sizes], "contexts": args.contexts,
                                         "batch_size": args.batch_size, "dtype": args.dtype,
                                         "forward_only": args.forward_only}, "rows": rows})
    return 0 if ok + oom == len(rows) else 1


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return sweep(args) if args.sweep else single(args)


if __name__ == "__main__":
    sys.exit(main())
