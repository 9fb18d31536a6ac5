#!/usr/bin/env python3
"""A transformer encoder stack at a small batch, six ways (five by default): many small kernels to one graph launch.

The layer is BERT-base's (post-LayerNorm, d_model 768, 12 heads, feed-forward 3072, GELU),
run for inference on a small batch (4 sequences of 128 tokens, fp32 with TF32 matrix
products): the regime where every kernel is short and the CPU's launches, not the GPU's
arithmetic, set the pace. The variants compute the same
function from the same weights (checked against the first):

  ops        written op by op, as the layer was first found: every projection a matmul plus
             a bias add, LayerNorm as mean/subtract/square/mean/add/rsqrt/multiply/multiply/add,
             GELU's tanh formula and softmax spelled out (about fifty kernels per layer)
  compiled   the same code under torch.compile: automatic fusion of the elementwise chains
  reduce-overhead
             the same code under torch.compile(mode="reduce-overhead"): the fusion, and the
             compiled stack replayed as CUDA graphs (the one-line variant a PyTorch user tries first).
             The weights are plain tensors the compiled function reads from its closure: to
             CUDA-graph trees they are inputs that may move, so before every replay they are
             copied into the graph's own memory (a multi-tensor Copy kernel in the capture)
  reduce-overhead-static
             the same, with the weights held as nn.Parameters (as a module holds them), which
             torch.compile treats as static: the graph reads them in place and only the input is
             copied. Not in the default list: ask for it by name
  fused      library kernels: one QKV projection with its bias, scaled_dot_product_attention,
             F.layer_norm, F.gelu (hand-fused kernels, as a fused-transformer library has them)
  graph      the fused stack captured once in a CUDA graph and replayed: one launch per forward

Each variant is warmed up (torch.compile compiles then), then timed over --repeats windows of
--iterations forwards queued back to back, synchronised at both ends (the host clock).
``--profile-iterations K`` then runs K more forwards of every variant, each variant in an NVTX
range of its name, between cudaProfilerStart and cudaProfilerStop, for
``nsys profile --capture-range=cudaProfilerApi --cuda-graph-trace=node``: the capture holds no
compilation and no timing windows. Without a GPU it runs on the CPU (no graph variants).

Examples:
  python examples/nsys/launch_bound_layer.py
  python examples/nsys/launch_bound_layer.py --variants ops,fused --batch-size 8
  nsys profile --trace=cuda,nvtx --capture-range=cudaProfilerApi --capture-range-end=stop --cuda-graph-trace=node \\
      -o layer python examples/nsys/launch_bound_layer.py --profile-iterations 20
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.backend import torch_device  # noqa: E402
from gpuprof.cli import nonnegative_int, output_file, positive_int, require_memory  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402
from gpuprof.ranges import annotate  # noqa: E402

VARIANTS = ("ops", "compiled", "reduce-overhead", "reduce-overhead-static", "fused", "graph")
# The ladder the chapter captures by default; reduce-overhead-static is its pitfall's cure, asked for by name.
DEFAULT_VARIANTS = ("ops", "compiled", "reduce-overhead", "fused", "graph")
GPU_ONLY = ("reduce-overhead", "reduce-overhead-static", "graph")
# Largest difference from the first variant allowed, relative to its largest value: the
# variants sum in different orders, and bf16 keeps 8 bits of mantissa.
TOLERANCE = {"fp32": 1e-3, "tf32": 1e-2, "bf16": 5e-2}


def variant_list(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown variant(s) {', '.join(unknown) or '(none given)'}; "
                                         f"choose from {', '.join(VARIANTS)}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", type=variant_list, default=list(DEFAULT_VARIANTS),
                   help=f"comma-separated, in order, from {','.join(VARIANTS)} (default: {','.join(DEFAULT_VARIANTS)})")
    p.add_argument("--layers", type=positive_int, default=4, help="encoder layers in the stack (default: 4)")
    p.add_argument("--d-model", type=positive_int, default=768, help="width (default: 768)")
    p.add_argument("--heads", type=positive_int, default=12, help="attention heads (default: 12)")
    p.add_argument("--d-ff", type=positive_int, default=3072, help="feed-forward width (default: 3072)")
    p.add_argument("--dtype", choices=("fp32", "tf32", "bf16"), default="tf32",
                   help="fp32 tensors with TF32 matrix products, plain fp32 (TF32 off), or bf16 weights and "
                        "activations (default: tf32)")
    p.add_argument("--batch-size", type=positive_int, default=4, help="sequences (default: 4)")
    p.add_argument("--seq-len", type=positive_int, default=128, help="tokens per sequence (default: 128)")
    p.add_argument("--warmup", type=positive_int, default=5, help="untimed forwards per variant first (default: 5)")
    p.add_argument("--iterations", type=positive_int, default=200, help="forwards per timed window (default: 200)")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed windows per variant (default: 3)")
    p.add_argument("--profile-iterations", type=nonnegative_int, default=0,
                   help="forwards per variant run between cudaProfilerStart/Stop after the timing (default: 0)")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed for weights and input (default: 0)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even where a GPU is available")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="write the configuration and results to FILE")
    args = p.parse_args(argv)
    if args.d_model % args.heads:
        p.error(f"--d-model {args.d_model} is not divisible by --heads {args.heads}")
    if args.warmup < 2 and any(v.startswith("reduce-overhead") for v in args.variants):
        # CUDA-graph trees run a function's first call eagerly and record its graph on a later one: with one
        # warm-up forward the recording (and the count of inputs it copies) would fall into the timed windows.
        p.error("--warmup must be at least 2 for the reduce-overhead variants (CUDA-graph trees record their "
                "graph on the second call, and the warm-up must hold the recording)")
    return args


def make_weights(args: argparse.Namespace, device: str) -> list[dict[str, Any]]:
    """Per layer: projections stored (in, out) as the op-by-op code multiplies them, biases, LayerNorm's scale and shift."""
    import torch

    gen = torch.Generator().manual_seed(args.seed)
    d, ff = args.d_model, args.d_ff

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    def rnd(*shape: int, scale: float) -> Any:
        return (torch.randn(*shape, generator=gen) * scale).to(device, dtype)

    layers = []
    for _ in range(args.layers):
        w = {name: rnd(d, d, scale=d ** -0.5) for name in ("wq", "wk", "wv", "wo")}
        w.update({name: rnd(d, scale=0.02) for name in ("bq", "bk", "bv", "bo", "b2", "ln1_b", "ln2_b")})
        w.update(w1=rnd(d, ff, scale=d ** -0.5), b1=rnd(ff, scale=0.02), w2=rnd(ff, d, scale=ff ** -0.5))
        w.update(ln1_g=1 + rnd(d, scale=0.02), ln2_g=1 + rnd(d, scale=0.02))
        # The fused variant's layout: one QKV weight (out, in) as F.linear takes it, and its bias.
        w["wqkv_t"] = torch.cat([w["wq"], w["wk"], w["wv"]], dim=1).t().contiguous()
        w["bqkv"] = torch.cat([w["bq"], w["bk"], w["bv"]])
        w.update(wo_t=w["wo"].t().contiguous(), w1_t=w["w1"].t().contiguous(), w2_t=w["w2"].t().contiguous())
        layers.append(w)
    return layers


# The tensors the op-by-op layer reads (layer_ops), per layer: what a compiled closure over them takes as inputs.
OPS_WEIGHTS = ("wq", "wk", "wv", "wo", "w1", "w2", "bq", "bk", "bv", "bo", "b1", "b2", "ln1_g", "ln1_b", "ln2_g", "ln2_b")


def ops_input_bytes(config: dict[str, Any]) -> int:
    """Bytes of the tensors the op-by-op stack reads besides what it computes: every layer's
    :data:`OPS_WEIGHTS` (4 d^2 + 2 d d_ff + d_ff + 9 d values) and the input (batch x tokens x d).

    Compiled with ``mode="reduce-overhead"`` from a closure over plain tensors, these are the
    graph's non-static inputs, which CUDA-graph trees copy into the graph's memory before every
    replay. ``config`` is the script's arguments as a dict (the ``config`` of its ``--json``).
    """
    size = 2 if config["dtype"] == "bf16" else 4
    d, ff = config["d_model"], config["d_ff"]
    per_layer = 4 * d * d + 2 * d * ff + ff + 9 * d
    return size * (config["layers"] * per_layer + config["batch_size"] * config["seq_len"] * d)


def static_weights(weights: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same weights as ``nn.Parameter``s (no gradient; the same memory, nothing copied).

    torch.compile marks every parameter static (its address fixed for the graph's lifetime),
    as it does a module's parameters and buffers, and as ``torch._dynamo.mark_static_address``
    marks a plain tensor; CUDA-graph trees then read such an input in place instead of
    copying it into the graph's memory before each replay. New objects, so the plain
    tensors the other variants read stay as they were.
    """
    import torch

    with torch.inference_mode(False):  # a parameter, not an inference tensor, whatever mode the caller is in
        return [{k: torch.nn.Parameter(v, requires_grad=False) for k, v in w.items()} for w in weights]


def least_bytes(args: argparse.Namespace) -> int:
    """What the run holds at the least: every layer's weights in both layouts (8 d^2 + 4 d d_ff values, see
    :func:`make_weights`), the input and the output, and the feed-forward's intermediate."""
    size = 2 if args.dtype == "bf16" else 4
    d, ff, tokens = args.d_model, args.d_ff, args.batch_size * args.seq_len
    return size * (args.layers * (8 * d * d + 4 * d * ff) + tokens * (2 * d + ff))


# --- the layer op by op ---------------------------------------------------------------------------

def layer_norm_ops(x: Any, g: Any, b: Any, eps: float = 1e-12) -> Any:
    """LayerNorm as nine elementwise and reduction ops (BERT's eps)."""
    import torch

    mean = x.mean(-1, keepdim=True)
    xc = x - mean
    var = (xc * xc).mean(-1, keepdim=True)
    return xc * torch.rsqrt(var + eps) * g + b


def gelu_ops(x: Any) -> Any:
    """GELU's tanh approximation, spelled out as BERT's original code wrote it."""
    import torch

    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def softmax_ops(s: Any) -> Any:
    """Softmax over the last axis: max, subtract, exp, sum, divide."""
    import torch

    e = torch.exp(s - s.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def layer_ops(x: Any, w: dict[str, Any], heads: int) -> Any:
    """One post-LayerNorm encoder layer, every piece its own op."""
    import torch

    b, t, d = x.shape

    def split(y: Any) -> Any:
        return y.view(b, t, heads, d // heads).transpose(1, 2)

    q = split(torch.matmul(x, w["wq"]) + w["bq"])
    k = split(torch.matmul(x, w["wk"]) + w["bk"])
    v = split(torch.matmul(x, w["wv"]) + w["bv"])
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(d // heads))
    attn = torch.matmul(softmax_ops(scores), v).transpose(1, 2).reshape(b, t, d)
    x = layer_norm_ops(x + (torch.matmul(attn, w["wo"]) + w["bo"]), w["ln1_g"], w["ln1_b"])
    h = gelu_ops(torch.matmul(x, w["w1"]) + w["b1"])
    return layer_norm_ops(x + (torch.matmul(h, w["w2"]) + w["b2"]), w["ln2_g"], w["ln2_b"])


# --- the layer from library kernels -------------------------------------------------------------------

def layer_fused(x: Any, w: dict[str, Any], heads: int) -> Any:
    """The same layer from library kernels: bias in the matmul, one attention kernel, one LayerNorm kernel."""
    import torch.nn.functional as F

    b, t, d = x.shape
    q, k, v = F.linear(x, w["wqkv_t"], w["bqkv"]).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
    attn = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
    x = F.layer_norm(x + F.linear(attn, w["wo_t"], w["bo"]), (d,), w["ln1_g"], w["ln1_b"], eps=1e-12)
    h = F.gelu(F.linear(x, w["w1_t"], w["b1"]), approximate="tanh")
    return F.layer_norm(x + F.linear(h, w["w2_t"], w["b2"]), (d,), w["ln2_g"], w["ln2_b"], eps=1e-12)


def make_forward(variant: str, weights: list[dict[str, Any]], x: Any, heads: int) -> Callable[[], Any]:
    """A no-argument forward of the whole stack for ``variant`` (the input is fixed: inference on one batch)."""
    import torch

    if variant == "graph":
        static_x = x.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up before capture, on a side stream as PyTorch's docs ask
            for _ in range(3):
                stack(layer_fused, weights, static_x, heads)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = stack(layer_fused, weights, static_x, heads)

        def replay() -> Any:
            graph.replay()
            return static_out

        # A CUDA graph replays addresses and holds no reference to the tensors it read: the forward keeps its input
        # alive (weights are the caller's), else the allocator may hand that memory to another variant's temporaries
        replay.static_input = static_x  # type: ignore[attr-defined]
        return replay
    if variant == "reduce-overhead":  # the whole stack compiled as one function, so one graph covers every layer
        return torch.compile(lambda: stack(layer_ops, weights, x, heads), mode="reduce-overhead")
    if variant == "reduce-overhead-static":  # the same, its weights static: only the input is copied per replay
        held = static_weights(weights)
        return torch.compile(lambda: stack(layer_ops, held, x, heads), mode="reduce-overhead")
    layer = {"ops": layer_ops, "fused": layer_fused, "compiled": torch.compile(layer_ops)}[variant]
    return lambda: stack(layer, weights, x, heads)


def non_static_inputs_recorded() -> int:
    """Inductor's count of the non-static inputs of the CUDA graphs recorded so far in this process.

    CUDA-graph trees copy each such input into the graph's memory before every replay; a
    variant's warm-up, which records its graphs, adds its graphs' count. 0 without graphs.
    """
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_recorded_non_static_inputs"])


def stack(layer: Callable[..., Any], weights: list[dict[str, Any]], x: Any, heads: int) -> Any:
    for w in weights:
        x = layer(x, w, heads)
    return x


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch, device, where = torch_device("launch_bound_layer.py", args.cpu)
    gpu = device == "cuda"
    variants = [v for v in args.variants if gpu or v not in GPU_ONLY]
    skipped = [v for v in args.variants if v not in variants]
    print(f"launch_bound_layer: {args.layers} encoder layers (d_model {args.d_model}, {args.heads} heads, d_ff {args.d_ff}), "
          f"batch {args.batch_size} x {args.seq_len} tokens, {args.dtype} inference, on {where}", flush=True)
    if skipped:
        if not variants:
            raise GpuprofError(f"--variants {','.join(skipped)} needs a GPU (CUDA graphs), and this run is on the CPU.",
                               f"Choose among {', '.join(v for v in VARIANTS if v not in GPU_ONLY)} here.")
        print(f"  no GPU here (or --cpu): {', '.join(skipped)} skipped (CUDA graphs need a GPU)")
    require_memory(least_bytes(args), device, f"{args.layers} layers at d_model {args.d_model:,}, d_ff {args.d_ff:,} and "
                   f"batch {args.batch_size:,} x {args.seq_len:,}", "--layers, --d-model, --d-ff, --batch-size or --seq-len",
                   lower_bound=True)
    torch.backends.cuda.matmul.allow_tf32 = args.dtype == "tf32"
    torch.manual_seed(args.seed)
    weights = make_weights(args, device)
    x = torch.randn(args.batch_size, args.seq_len, args.d_model, generator=torch.Generator().manual_seed(args.seed + 1))
    x = x.to(device, torch.bfloat16 if args.dtype == "bf16" else torch.float32)

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize()

    results: dict[str, Any] = {}
    forwards: dict[str, Callable[[], Any]] = {}
    reference = None
    with torch.inference_mode():
        for variant in variants:
            t0 = time.perf_counter()
            recorded = non_static_inputs_recorded()
            forward = forwards[variant] = make_forward(variant, weights, x, args.heads)
            for _ in range(args.warmup):
                out = forward()
            sync()
            warmup_s = time.perf_counter() - t0
            recorded = non_static_inputs_recorded() - recorded
            if reference is None:
                reference = out.clone()
            error = float((out - reference).abs().max())
            if not error < TOLERANCE[args.dtype] * float(reference.abs().max()):
                raise GpuprofError(f"variant {variant} does not compute what {variants[0]} computes: "
                                   f"largest difference {error:.3g}.")
            windows = []
            for _ in range(args.repeats):
                sync()
                t0 = time.perf_counter()
                for _ in range(args.iterations):
                    forward()
                sync()
                windows.append((time.perf_counter() - t0) / args.iterations * 1e3)
            ms = statistics.median(windows)
            results[variant] = {"ms_per_forward": ms, "windows_ms": windows, "warmup_s": warmup_s, "max_abs_diff": error,
                                "non_static_inputs": recorded}
            base = results[variants[0]]["ms_per_forward"]
            print(f"  {variant:>9}: {ms * 1e3:8.1f} us per forward ({ms * 1e3 / args.layers:6.1f} us per layer), "
                  f"{base / ms:5.2f}x {variants[0]}; windows {min(windows) * 1e3:.1f}-{max(windows) * 1e3:.1f} us; "
                  f"warm-up {warmup_s:.1f} s; max |diff| {error:.1e}"
                  + (f"; its graphs copy {recorded} non-static inputs before each replay" if recorded else ""), flush=True)
        if args.profile_iterations:
            sync()
            if gpu:
                torch.cuda.profiler.start()
            for variant in variants:
                with annotate(variant):
                    for _ in range(args.profile_iterations):
                        forwards[variant]()
                    sync()
            if gpu:
                torch.cuda.profiler.stop()
    worst = max(r["max_abs_diff"] for r in results.values())
    print(f"result checked: every variant computes what {variants[0]} computes (largest difference {worst:.1e}, "
          f"within {TOLERANCE[args.dtype]:g} of the output's largest value)")
    if args.json:
        from gpuprof.kernels import write_json

        write_json(args.json, {"config": {k: v for k, v in vars(args).items() if k != "json"}, "device": device,
                               "gpu": where, "torch": torch.__version__, "variants": variants, "skipped": skipped,
                               "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
