#!/usr/bin/env python3
"""Time chapter 6's CNN training step under PyTorch's FP32 switches, in both memory layouts.

PyTorch's defaults let cuDNN run FP32 convolutions on TF32 tensor cores
(``torch.backends.cudnn.allow_tf32 = True``) and keep cuBLAS's FP32 matrix products in FP32
(``torch.backends.cuda.matmul.allow_tf32 = False``; ``torch.set_float32_matmul_precision("high")``
turns it on). The arithmetic variants:

  fp32      TF32 nowhere: both switches off (true FP32 on the CUDA cores)
  default   PyTorch's defaults: TF32 in cuDNN's convolutions, FP32 in the Linear layer's product
  tf32      TF32 everywhere: both switches on
  bf16      autocast to bfloat16 (the arithmetic of the ladder's rung 6), for scale

each in NCHW (PyTorch's default layout) and NHWC (``channels_last``). Each variant is the
step of the ladder's fastest loop without the data: forward, backward and fused Adam
captured in one CUDA graph (``cnn_training.Trainer``), under that variant's switches, on a
fixed batch already on the GPU. A graph keeps the kernels chosen when it was captured, so
all eight live side by side in one process. They are timed in turn: --rounds rounds, each
replaying every variant's graph --steps times between two CUDA events (the order rotates
from round to round); a variant's time is the median of its rounds, and the rounds' range
shows the noise. Then one replay of each runs under torch.profiler, and its kernels'
names say which arithmetic cuDNN and cuBLAS chose (gpuprof.kernel_kinds.precision). Each
variant's first step, eager and profiled before its graph is captured, names the operator
that launches each kernel (a replay's kernels all hang off one cudaGraphLaunch), so a GEMM
that cuDNN runs inside a convolution is not taken for the Linear layer's.

The first loss of each variant (the same initial weights and batch) is compared with fp32's: TF32
and bf16 round the inputs of the products, so they differ a little, never by much.

  python examples/nsys/cnn_precision.py --json precision.json
  nsys profile --trace=cuda,nvtx -o precision python examples/nsys/cnn_precision.py --rounds 2

Without a GPU the variants run eagerly on the CPU at a small batch, where the TF32 switches
have nothing to act on (it says so).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo
sys.path.insert(0, str(Path(__file__).resolve().parent))  # cnn_training.py, beside this file

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.backend import require_torch  # noqa: E402
from gpuprof.cli import output_file, positive_int  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402
from gpuprof.ranges import annotate  # noqa: E402

ARITHMETIC = ("fp32", "default", "tf32", "bf16")
LAYOUTS = ("nchw", "nhwc")
# (cudnn.allow_tf32, cuda.matmul.allow_tf32) per variant; bf16 keeps PyTorch's defaults for what autocast leaves in FP32
SWITCHES = {"fp32": (False, False), "default": (True, False), "tf32": (True, True), "bf16": (True, False)}
TOLERANCE = {"fp32": 0.0, "default": 1e-2, "tf32": 1e-2, "bf16": 5e-2}  # first loss, relative to fp32's


@dataclass
class Variant:
    arithmetic: str
    layout: str
    trainer: Any = None
    batch: tuple[Any, Any] | None = None  # one fixed batch, on the device, in the variant's layout
    first_loss: float = float("nan")
    op_of: dict[str, str] | None = None  # kernel name -> the ATen operator that launched it (GPU only)

    @property
    def name(self) -> str:
        return f"{self.arithmetic} {self.layout}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arithmetic", default=",".join(ARITHMETIC),
                   help=f"comma-separated subset of {', '.join(ARITHMETIC)} (default: all)")
    p.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated subset of nchw, nhwc (default: both)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="images per step (default: 1024 on a GPU, where its kernels set the step's pace; 32 on a CPU)")
    p.add_argument("--steps", type=positive_int, default=20, help="replays per variant in each round (default: 20)")
    p.add_argument("--rounds", type=positive_int, default=5, help="rounds of timing, the variants in turn (default: 5)")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="write the results to FILE")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even where a GPU is available")
    args = p.parse_args(argv)
    args.arithmetic_list = [a.strip() for a in args.arithmetic.split(",") if a.strip()]
    args.layout_list = [a.strip() for a in args.layouts.split(",") if a.strip()]
    for given, allowed, what in ((args.arithmetic_list, ARITHMETIC, "arithmetic"), (args.layout_list, LAYOUTS, "layout")):
        bad = [a for a in given if a not in allowed]
        if bad or not given:
            p.error(f"no {what} {bad[0] if bad else '(none given)'}; the choices are {', '.join(allowed)}")
    return args


def set_switches(torch: Any, arithmetic: str) -> list[str]:
    """Set the two TF32 switches for ``arithmetic``; returns the warnings recorded while setting them, if any.

    PyTorch 2.9 printed a deprecation notice for these legacy flags; the libraries of 2.11 and 2.13 hold only the
    error for a mix of the legacy and new APIs (``Context.cpp``), so with those versions an empty list means that
    setting the flags raised no warning.
    """
    cudnn_tf32, matmul_tf32 = SWITCHES[arithmetic]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.backends.cudnn.allow_tf32 = cudnn_tf32
        torch.backends.cuda.matmul.allow_tf32 = matmul_tf32
    return sorted({str(w.message).splitlines()[0] for w in caught})


def build(torch: Any, cnn: Any, v: Variant, batch: int, gpu: bool) -> list[str]:
    """The variant's trainer, its batch placed, and on a GPU its step captured as a CUDA graph under its switches."""
    from gpuprof.models import synthetic_batch

    flags = ["--data-on-gpu", "--fused-adam", "--batch-size", str(batch)]
    flags += ["--cuda-graphs"] if gpu else []
    flags += ["--bf16"] if v.arithmetic == "bf16" else []
    flags += ["--channels-last"] if v.layout == "nhwc" else []
    device = "cuda" if gpu else "cpu"
    said = set_switches(torch, v.arithmetic)
    v.trainer = cnn.Trainer(cnn.parse_args(flags), device)  # seeds the weights: every variant starts from the same ones
    x, y = v.batch = v.trainer.place(*synthetic_batch(batch, device, seed=0))
    if gpu:
        # The first step, eager and profiled, under this variant's switches (the flags are global: the
        # next variant changes them): which operator launches each kernel. Its autograd graph is freed
        # when it ends, before the graph's warm-up steps run on their side stream.
        v.first_loss, v.op_of = eager_attribution(torch, v)
        v.trainer.warm_graph(x, y, 3)
    else:
        v.first_loss = float(v.trainer.eager_step(x, y))
    return said


def require_fit(batch: int, count: int, device: str) -> None:
    """Refuse, before building anything, a batch whose variants (each a model, its optimizer and, on a GPU, a
    graph holding the step's activations) this machine cannot hold side by side."""
    from gpuprof.cli import require_memory
    from gpuprof.models import small_cnn, training_bytes

    step_bytes = training_bytes(small_cnn, (3, 32, 32), batch, optimizer_states=2)  # FP32: the largest variant
    require_memory(count * step_bytes, device, f"{count} variants side by side at batch {batch:,}",
                   "--batch-size, --arithmetic or --layouts", lower_bound=True)


def step(v: Variant) -> None:
    if v.trainer.graph is not None:
        v.trainer.graph.replay()
    else:
        v.trainer.eager_step(*v.batch)


def time_rounds(torch: Any, variants: list[Variant], steps: int, rounds: int, gpu: bool) -> dict[str, list[float]]:
    """Milliseconds per step of each variant in each round; the variants take turns, their order rotating."""
    import time

    per: dict[str, list[float]] = {v.name: [] for v in variants}
    for v in variants:  # one untimed replay each: first-touch costs out of the first round
        step(v)
    for r in range(rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for v in order:
            with annotate(v.name):
                if gpu:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    torch.cuda.synchronize()
                    start.record()
                    for _ in range(steps):
                        step(v)
                    end.record()
                    end.synchronize()
                    per[v.name].append(start.elapsed_time(end) / steps)
                else:
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        step(v)
                    per[v.name].append((time.perf_counter() - t0) * 1e3 / steps)
        shown = ", ".join(f"{v.name} {per[v.name][-1]:.3f}" for v in variants)
        print(f"  round {r + 1}/{rounds} (ms per step): {shown}", flush=True)
    return per


def _profile(torch: Any, run: Any) -> Any:
    """One call of ``run`` under torch.profiler (CPU and CUDA activities), its trace read back."""
    from gpuprof.torch_profiler import read_trace

    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        # one profiler session per variant: its note about acc_events (chapter 5 explains it) says nothing here
        warnings.filterwarnings("ignore", message=".*acc_events.*")
        with torch.profiler.profile(activities=acts) as prof:
            run()
            torch.cuda.synchronize()
        path = Path(tmp) / "step.json"
        prof.export_chrome_trace(str(path))
        return read_trace(path)


def eager_attribution(torch: Any, v: Variant) -> tuple[float, dict[str, str]]:
    """One eager step under torch.profiler: its loss, and for each kernel name the ATen operator that launched it.

    A graph replay's kernels all hang off one cudaGraphLaunch, so its trace cannot say which layer
    each belongs to; an eager step's kernels carry the id of the operator that launched them
    (aten::cudnn_convolution, aten::convolution_backward, aten::addmm, aten::mm, ...). The graph is
    captured right after, under the same switches, so cuDNN and cuBLAS choose the same kernels (a
    replay kernel that the eager step did not run is left unattributed, and the table says so).
    """
    losses: list[Any] = []
    trace = _profile(torch, lambda: losses.append(v.trainer.eager_step(*v.batch)))
    from gpuprof.torch_profiler import kernel_operators

    named = trace.kernels().assign(op=kernel_operators(trace)).dropna(subset=["op"])
    op_of = named.groupby("name")["op"].agg(lambda s: s.mode().iat[0]).to_dict() if not named.empty else {}
    return float(losses[0]), op_of


def profiled_kernels(torch: Any, v: Variant) -> list[dict[str, Any]]:
    """The kernels of one graph replay, by name (launches, total microseconds), each with the operator that
    launched it in the variant's eager first step (``op``; None where that step did not run the kernel)."""
    replay = _profile(torch, lambda: step(v)).kernels()
    if replay.empty:
        return []
    g = replay.groupby("name")["duration_ns"].agg(["size", "sum"]).reset_index()
    return [{"name": str(n), "launches": int(c), "total_us": round(float(s) / 1e3, 3), "op": (v.op_of or {}).get(str(n))}
            for n, c, s in g.sort_values("sum", ascending=False).itertuples(index=False)]


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch = require_torch("cnn_precision.py")
    gpu = torch.cuda.is_available() and not args.cpu
    batch = args.batch_size or (1024 if gpu else 32)
    where = torch.cuda.get_device_name() if gpu else "the CPU"
    import cnn_training as cnn

    variants = [Variant(a, lay) for lay in args.layout_list for a in args.arithmetic_list]
    require_fit(batch, len(variants), "cuda" if gpu else "cpu")
    print(f"cnn_precision: {len(variants)} variants at batch {batch} on {where}", flush=True)
    if not gpu:
        print("  no GPU here (or --cpu): the steps run eagerly on the CPU, where the TF32 switches have nothing to act on")
    defaults = (bool(torch.backends.cudnn.allow_tf32), bool(torch.backends.cuda.matmul.allow_tf32))
    said: set[str] = set()
    try:
        for v in variants:
            said.update(build(torch, cnn, v, batch, gpu))
            print(f"  built {v.name}" + (" (graph captured)" if gpu else ""), flush=True)
        per = time_rounds(torch, variants, args.steps, args.rounds, gpu)
        kernels = {v.name: profiled_kernels(torch, v) if gpu else [] for v in variants}
    except torch.cuda.OutOfMemoryError:
        raise GpuprofError(f"out of GPU memory with {len(variants)} variants at batch {batch} ({where}).",
                           "Choose a smaller --batch-size, or fewer --arithmetic or --layouts.") from None
    finally:
        set_switches(torch, "default")  # leave PyTorch's defaults as they were found
    reference = {v.layout: v.first_loss for v in variants if v.arithmetic == "fp32"}
    rows = []
    for v in variants:
        ms = per[v.name]
        rel = abs(v.first_loss / reference[v.layout] - 1) if v.layout in reference else None
        rows.append({"arithmetic": v.arithmetic, "layout": v.layout, "cudnn_allow_tf32": SWITCHES[v.arithmetic][0],
                     "matmul_allow_tf32": SWITCHES[v.arithmetic][1], "round_ms": [round(m, 5) for m in ms],
                     "ms_per_step": statistics.median(ms), "first_loss": v.first_loss, "loss_vs_fp32": rel,
                     "kernels": kernels[v.name]})
        print(f"  {v.name:<13} {statistics.median(ms):8.3f} ms per step (rounds {min(ms):.3f}-{max(ms):.3f}); first loss "
              f"{v.first_loss:.5f}" + (f", {rel:.1e} from fp32's" if rel is not None else ""))
    bad = [r for r in rows if not (r["first_loss"] == r["first_loss"]) or
           (r["loss_vs_fp32"] is not None and r["loss_vs_fp32"] > TOLERANCE[r["arithmetic"]])]
    if bad:
        raise GpuprofError(f"{bad[0]['arithmetic']} {bad[0]['layout']}: first loss {bad[0]['first_loss']:.5f} is "
                           f"{bad[0]['loss_vs_fp32']} from fp32's, over its tolerance {TOLERANCE[bad[0]['arithmetic']]}.")
    checked = [r for r in rows if r["loss_vs_fp32"] is not None and r["arithmetic"] != "fp32"]
    print(f"result checked: every variant's first loss is finite" + (
        f", and within its tolerance of fp32's ({', '.join(f'{k} {t:g}' for k, t in TOLERANCE.items() if k != 'fp32')})"
        if checked else ""))
    if args.json:
        from gpuprof.kernels import write_json

        write_json(args.json, {"device": "cuda" if gpu else "cpu", "gpu": where, "torch": torch.__version__,
                               "batch": batch, "steps": args.steps, "rounds": args.rounds,
                               "defaults": {"cudnn_allow_tf32": defaults[0], "matmul_allow_tf32": defaults[1]},
                               "switch_warnings": sorted(said), "variants": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
