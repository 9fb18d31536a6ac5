#!/usr/bin/env python3
"""What compiled and CUDA-graphed code looks like in the PyTorch profiler, beside the same step in eager mode.

One training step (gradients zeroed, forward and backward, no optimizer) of a small MLP block stack
(LayerNorm -> Linear -> GELU -> Linear, with a residual, --layers times) is run three ways:

  eager      the model as written: one ATen operator, and on a GPU one or more kernels, per op
  compiled   torch.compile(model): TorchInductor fuses the elementwise work into generated
             kernels (Triton on a GPU, C++ on a CPU); the profiler shows the compiled region
             ("Torch-Compiled Region", "CompiledFunction") instead of most ATen operators
  graphed    torch.compile(model, mode="reduce-overhead"): the compiled step replayed as a
             CUDA graph; the profiler shows one cudaGraphLaunch where the kernels' launches
             were (GPU only: on a CPU the mode is skipped, with a sentence saying so)

Every mode is built and warmed up first (--warmup steps, compiling included); then the
modes are timed without the profiler in turn, --rounds rounds of --steps steps each (the
step time is the median of all; the per-round medians show the drift); then each mode has
--profiled-steps steps under torch.profiler (CPU and, on a GPU, CUDA activities), each
inside record_function("step N"), and its trace is read back:
operators, kernels, runtime launch calls by name, the compiled-region and generated-kernel
names, the GPU's busy time per step (median), and the profiler's top rows by self time.
Every timed step is synchronised before and after: the times are per-step latencies, the host
never running ahead into the next step. The model computes in FP32 on purpose (TF32 would
change the matrix multiplies the modes share), so TorchInductor's hint to enable TF32 is
silenced.

  python examples/pytorch_profiler/compiled_and_graphed.py --json compiled.json --trace steps.json.gz

keeps each mode's trace beside the name given: steps.eager.json.gz, steps.compiled.json.gz, ...
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.backend import require_torch  # noqa: E402
from gpuprof.cli import output_file, positive_int  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

MODES = ("eager", "compiled", "graphed")
TOLERANCE = 1e-3  # relative difference of the first step's loss from eager's (fusion reorders float arithmetic)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {', '.join(MODES)} (default: all)")
    p.add_argument("--layers", type=positive_int, default=4, help="MLP blocks (default: 4)")
    p.add_argument("--hidden", type=positive_int, default=1024, help="model width (default: 1024)")
    p.add_argument("--batch", type=positive_int, default=2048, help="rows per step (default: 2048)")
    p.add_argument("--warmup", type=positive_int, default=5, help="untimed steps first, compiling included (default: 5)")
    p.add_argument("--steps", type=positive_int, default=10, help="timed steps per mode in each round (default: 10)")
    p.add_argument("--rounds", type=positive_int, default=5, help="rounds of timing, the modes in turn (default: 5)")
    p.add_argument("--profiled-steps", type=positive_int, default=3, help="steps under the profiler (default: 3)")
    p.add_argument("--trace", type=Path, default=None, metavar="FILE.json.gz",
                   help="keep each mode's trace: FILE.MODE.json.gz beside the name given")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="write the results to FILE")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even where a GPU is available")
    args = p.parse_args(argv)
    if args.trace is not None and not args.trace.name.endswith(".json.gz"):
        p.error(f"--trace {args.trace}: give a name ending in .json.gz (each mode's trace is written gzipped beside it)")
    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.mode_list if m not in MODES]
    if bad or not args.mode_list:
        p.error(f"no mode {bad[0] if bad else '(none given)'}; the modes are {', '.join(MODES)}")
    return args


def build(torch, layers: int, hidden: int, device: str):  # type: ignore[no-untyped-def]
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm, self.up, self.down = nn.LayerNorm(hidden), nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    torch.manual_seed(0)
    return nn.Sequential(*[Block() for _ in range(layers)]).to(device)


def step_fn(torch, model, mode: str):  # type: ignore[no-untyped-def]
    """One training step (forward, loss, backward) for ``mode``."""
    def forward_loss(x):  # type: ignore[no-untyped-def]
        return model(x).float().pow(2).mean()

    # The loss is inside the compiled function: a CUDA graph's outputs are overwritten by its next replay,
    # so the graph must not hand out an activation that autograd saves for a backward outside it.
    run = forward_loss if mode == "eager" else torch.compile(forward_loss,
                                                             mode="reduce-overhead" if mode == "graphed" else "default")

    def step(x):  # type: ignore[no-untyped-def]
        # Gradients set to None, as an optimizer loop's zero_grad does: accumulating into the last step's
        # .grad would read a backward graph's output that this step's replay overwrites.
        model.zero_grad(set_to_none=True)
        if mode == "graphed":
            torch.compiler.cudagraph_mark_step_begin()  # each call is a new step: its outputs may be overwritten
        loss = run(x)
        loss.backward()
        return loss

    return step


def timed(torch, step, x, n: int, gpu: bool, *, ranges: bool = False) -> list[float]:  # type: ignore[no-untyped-def]
    """Wall time of each of ``n`` steps, synchronised on a GPU; ``ranges`` marks each as record_function("step N")."""
    import contextlib

    times = []
    for i in range(n):
        if gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.profiler.record_function(f"step {i}") if ranges else contextlib.nullcontext():
            step(x)
        if gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times


def summarise(trace_path: Path, averages, steps: int) -> dict:  # type: ignore[no-untyped-def]
    """What the trace and key_averages show for one mode, per profiled step where a count is meant to be read."""
    from gpuprof.studies.pytorch_profiler import COMPILED_NAMES, GENERATED_PREFIX, LAUNCH_CALLS
    from gpuprof.torch_profiler.summary import step_summary
    from gpuprof.torch_profiler.trace import read_trace

    t = read_trace(trace_path)
    ops = t.cpu_ops()
    calls = t.runtime_calls()
    kernels = t.kernels() if t.has_gpu_activity else None
    names = set(ops["name"]) | set(t.annotations()["name"])
    launch_counts = {c: int((calls["name"] == c).sum()) for c in LAUNCH_CALLS} if len(calls) else {}
    top = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:8]
    kernel_names = kernels["name"].astype(str) if kernels is not None else None
    busy = step_summary(t, rule="window", pattern=r"step (\d+)")["gpu_busy_ms"] if kernels is not None else None
    return {"profiled_steps": steps, "cpu_ops": int(len(ops)), "aten_ops": int(ops["name"].str.startswith("aten::").sum()),
            "kernels": int(len(kernels)) if kernels is not None else 0,
            "generated_kernels": int(kernel_names.str.startswith(GENERATED_PREFIX).sum()) if kernel_names is not None else 0,
            "generated_kernel_names": sorted(set(kernel_names[kernel_names.str.startswith(GENERATED_PREFIX)]))[:12]
            if kernel_names is not None else [],
            "gpu_busy_ms": float(busy.median()) if busy is not None and len(busy) else None,
            "launch_calls": {k: v for k, v in launch_counts.items() if v},
            "compiled_names": sorted(n for n in names if any(n.startswith(c) for c in COMPILED_NAMES)),
            "top_self_cpu": [{"name": e.key, "calls": int(e.count), "self_cpu_us": float(e.self_cpu_time_total)}
                             for e in top]}


@dataclass
class Prepared:
    """One mode's step, ready to time: compiled (where it compiles) and warmed up."""

    mode: str
    step: Any
    x: Any
    loss: float
    warmup_s: float


def prepare(torch, mode: str, args: argparse.Namespace, device: str) -> Prepared:  # type: ignore[no-untyped-def]
    model = build(torch, args.layers, args.hidden, device)
    x = torch.randn(args.batch, args.hidden, device=device, generator=torch.Generator(device).manual_seed(1))
    step = step_fn(torch, model, mode)
    t0 = time.perf_counter()
    loss = float(step(x).detach())  # the first step's loss, the same weights and input in every mode (the check)
    timed(torch, step, x, args.warmup - 1, device == "cuda")
    warmup_s = time.perf_counter() - t0
    print(f"  {mode:<9} ready: first loss {loss:.6f}, warm-up {warmup_s:.1f} s (compiling included)", flush=True)
    return Prepared(mode, step, x, loss, warmup_s)


def time_interleaved(torch, prepared: list[Prepared], args: argparse.Namespace, gpu: bool) -> dict[str, list[list[float]]]:  # type: ignore[no-untyped-def]
    """--rounds rounds of --steps steps per mode, the modes' order rotated each round.

    A host-bound step's time drifts between and within processes (other processes, clocks,
    caches); timing the modes in turn, in one process, puts every mode under the same drift,
    and the per-round medians show how large it was.
    """
    times: dict[str, list[list[float]]] = {p.mode: [] for p in prepared}
    for r in range(args.rounds):
        for p in prepared[r % len(prepared):] + prepared[:r % len(prepared)]:
            times[p.mode].append(timed(torch, p.step, p.x, args.steps, gpu))
    return times


def profile_mode(torch, p: Prepared, rounds: list[list[float]], args: argparse.Namespace, gpu: bool,  # type: ignore[no-untyped-def]
                 trace: Path) -> dict:
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if gpu else [])
    from gpuprof.torch_profiler.quiet import kineto_lines_filtered

    with warnings.catch_warnings(), kineto_lines_filtered():
        warnings.simplefilter("ignore")
        with torch.profiler.profile(activities=activities) as prof:
            traced = timed(torch, p.step, p.x, args.profiled_steps, gpu, ranges=True)
        prof.export_chrome_trace(str(trace))  # torch gzips a path ending in .gz
        averages = prof.key_averages()
    untraced = [t for r in rounds for t in r]
    out = {"mode": p.mode, "loss": p.loss, "warmup_s": p.warmup_s, "step_ms": statistics.median(untraced) * 1e3,
           "step_ms_rounds": [statistics.median(r) * 1e3 for r in rounds],
           "step_ms_range": [min(untraced) * 1e3, max(untraced) * 1e3], "traced_step_ms": statistics.median(traced) * 1e3,
           "trace": trace.name, **summarise(trace, averages, args.profiled_steps)}
    spread = out["step_ms_rounds"]
    print(f"  {p.mode:<9} {out['step_ms']:8.2f} ms/step untraced (rounds {min(spread):.2f}-{max(spread):.2f}), "
          f"{out['traced_step_ms']:8.2f} traced; {out['aten_ops']:5d} ATen ops, {out['kernels']:5d} kernels "
          f"({out['generated_kernels']} generated), launches {out['launch_calls'] or 'none (CPU)'}", flush=True)
    return out


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch = require_torch("compiled_and_graphed.py")
    # TorchInductor suggests TF32 when it compiles an FP32 matrix multiply; FP32 is this script's choice.
    warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores", category=UserWarning)
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    modes = list(args.mode_list)
    skipped = []
    if device == "cpu" and "graphed" in modes:
        modes.remove("graphed")
        skipped.append("graphed: CUDA graphs need a GPU; on this machine only eager and compiled run")
        print(f"  skipped {skipped[-1]}")
    if not modes:
        raise GpuprofError("nothing to run on this machine.", "Choose eager or compiled with --modes.")
    print(f"compiled_and_graphed: {args.layers} MLP blocks of width {args.hidden}, batch {args.batch}, on {device}; "
          f"{args.warmup} warm-up steps, {args.rounds} rounds of {args.steps} timed steps (the modes in turn), "
          f"{args.profiled_steps} profiled steps per mode")
    with tempfile.TemporaryDirectory() as tmp:
        base = args.trace or Path(tmp) / "steps.json.gz"
        base.parent.mkdir(parents=True, exist_ok=True)
        stem = base.name[: -len(".json.gz")]
        prepared = [prepare(torch, m, args, device) for m in modes]
        times = time_interleaved(torch, prepared, args, device == "cuda")
        results = [profile_mode(torch, p, times[p.mode], args, device == "cuda", base.with_name(f"{stem}.{p.mode}.json.gz"))
                   for p in prepared]
    eager = next((r["loss"] for r in results if r["mode"] == "eager"), None)
    if eager is not None:
        worst = max(abs(r["loss"] - eager) / abs(eager) for r in results)
        if worst > TOLERANCE:
            raise GpuprofError(f"a compiled mode's first loss differs from eager's by {worst:.1e} of it, over {TOLERANCE:.0e}.",
                               "Compilation should not change the result beyond rounding; report it with your torch version.")
        print(f"result checked: every mode's first loss within {TOLERANCE:.0e} of eager's (largest difference {worst:.1e} of it)")
    if args.json:
        from gpuprof.kernels import write_json

        gpu = torch.cuda.get_device_name() if device == "cuda" else None
        write_json(args.json, {"device": device, "gpu": gpu, "torch": torch.__version__, "layers": args.layers, "hidden": args.hidden,
                               "batch": args.batch, "steps": args.steps, "rounds": args.rounds, "warmup": args.warmup, "skipped": skipped, "tolerance": TOLERANCE,
                               "modes": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
