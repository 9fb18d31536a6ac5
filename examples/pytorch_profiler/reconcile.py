#!/usr/bin/env python3
"""Time the same training steps three ways: CUDA events alone, under torch.profiler, under nsys.

CUPTI, the library both profilers read the GPU through, serves one profiler at a time,
so the three measurements are three runs of this script, each in its own process:

* ``--mode events``: no profiler. Each step is bracketed by two CUDA events on the
  compute stream, and by the host's clock around the step and a synchronize.
* ``--mode profiler``: the same, inside ``torch.profiler.profile`` (CPU and CUDA
  activities, no options; one warm-up step in the schedule). The trace is written to
  ``--trace`` and read back with gpuprof: for each ``ProfilerStep#N``, the span of its GPU
  work (first kernel start to last kernel end) and the time the GPU was busy in it.
* ``--mode nvtx``: the same, each step in an NVTX range ``step_N``, the timed steps
  between ``cudaProfilerStart``/``Stop``, for
  ``nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop``; the
  notebook reads the capture with the same gpuprof functions.

Every mode records the CUDA events too, so each run also says what its profiler did to
the event timings. Warm-up steps (cuDNN's and cuBLAS's first calls) come first, untimed.
In the two profiled modes, --baseline-steps steps are also timed without the profiler in
the same process, before the profiled steps and again after them (under nsys: outside the
capture range), so that the profiler's cost is a ratio within one process: a step whose
host sets the pace drifts between processes by as much as a profiler costs.

Every timed step is synchronised before and after (``torch.cuda.synchronize()``): the
times are per-step latencies of a loop in which the host never runs ahead into the next
step and the GPU drains at every step's end. A training loop without those syncs overlaps
one step's host work with the last step's kernels, so its step time and idle share differ.

Examples:
  python examples/pytorch_profiler/reconcile.py --mode events
  python examples/pytorch_profiler/reconcile.py --mode profiler --trace steps.json.gz
  nsys profile --trace=cuda,nvtx --capture-range=cudaProfilerApi --capture-range-end=stop -o steps \\
      python examples/pytorch_profiler/reconcile.py --mode nvtx
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.backend import require_torch  # noqa: E402
from gpuprof.cli import nonnegative_int, output_file, positive_int, shown_path  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

MODES = ("events", "profiler", "nvtx")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=MODES, default="events", help="how the steps are timed (default: events)")
    p.add_argument("--steps", type=positive_int, default=20, help="timed steps (default: 20)")
    p.add_argument("--warmup", type=nonnegative_int, default=5, help="untimed steps first (default: 5)")
    p.add_argument("--baseline-steps", type=nonnegative_int, default=20,
                   help="--mode profiler and nvtx: steps timed without the profiler in the same process, before the "
                        "profiled steps and again after them (default: 20)")
    p.add_argument("--batch", type=positive_int, default=256, help="images per step (default: 256)")
    p.add_argument("--trace", type=output_file, default=Path("reconcile.json.gz"), metavar="FILE",
                   help="--mode profiler: where the trace goes (default: reconcile.json.gz)")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="also write the timings to FILE")
    return p.parse_args(argv)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch = require_torch("reconcile.py")
    from gpuprof.models import check_loss_fell, require_training_memory, small_cnn, synthetic_batch, train_step

    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    print(f"reconcile: mode {args.mode}, {args.warmup} warm-up + {args.steps} timed steps of batch {args.batch} on "
          f"{torch.cuda.get_device_name() if gpu else 'the CPU'}", flush=True)
    if not gpu:
        print("  no GPU here: CUDA events and GPU activity cannot be measured; only the host's clock is used")
    torch.manual_seed(0)
    require_training_memory(small_cnn, (3, 32, 32), args.batch, device, "--batch", optimizer_states=1)  # SGD, momentum
    model = small_cnn().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = synthetic_batch(args.batch, device)

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize()

    losses = [float(train_step(model, opt, x, y).item()) for _ in range(args.warmup)]
    sync()
    wall_ms: list[float] = []
    pairs = []

    def timed_step(walls: list[float] = wall_ms, events: list = pairs) -> None:  # type: ignore[type-arg]
        sync()
        t0 = time.perf_counter()
        if gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        loss = train_step(model, opt, x, y)
        if gpu:
            end.record()
            events.append((start, end))
        sync()
        walls.append((time.perf_counter() - t0) * 1e3)
        losses.append(float(loss.item()))

    baseline: dict[str, tuple[list[float], list]] = {"baseline": ([], []), "after": ([], [])}  # type: ignore[type-arg]

    def unprofiled(when: str) -> None:
        """--baseline-steps steps in this process, outside the profiler (before or after its steps)."""
        if args.mode != "events":
            for _ in range(args.baseline_steps):
                timed_step(*baseline[when])

    result: dict = {"mode": args.mode, "batch": args.batch, "steps": args.steps, "warmup": args.warmup,
                    "torch": torch.__version__}
    if args.mode == "events":
        for _ in range(args.steps):
            timed_step()
    elif args.mode == "nvtx":
        unprofiled("baseline")
        if gpu:
            torch.cuda.cudart().cudaProfilerStart()
        for i in range(args.steps):
            with torch.cuda.nvtx.range(f"step_{i}") if gpu else contextlib.nullcontext():
                timed_step()
        if gpu:
            torch.cuda.cudart().cudaProfilerStop()
        unprofiled("after")
    else:
        from torch.profiler import ProfilerActivity, profile, schedule

        from gpuprof.torch_profiler import read_trace, step_summary

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
        args.trace.parent.mkdir(parents=True, exist_ok=True)
        sched = schedule(wait=0, warmup=1, active=args.steps, repeat=1)
        unprofiled("baseline")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*clears events.*")  # one cycle here: nothing is cleared
            with profile(activities=activities, schedule=sched,
                         on_trace_ready=lambda p: p.export_chrome_trace(str(args.trace))) as prof:
                train_step(model, opt, x, y)  # the profiler's own warm-up step: traced, then discarded
                sync()
                prof.step()
                for _ in range(args.steps):
                    timed_step()
                    prof.step()
        unprofiled("after")
        trace = read_trace(args.trace)
        steps = step_summary(trace, rule="window")
        if len(steps) != args.steps:
            raise GpuprofError(f"the trace holds {len(steps)} ProfilerStep ranges for {args.steps} timed steps.")
        result["profiler_steps"] = steps.to_dict(orient="records")
        result["trace"] = str(args.trace)
        print(f"  trace {shown_path(args.trace)} ({args.trace.stat().st_size / 1e6:.2f} MB): {trace.describe()}")
        if gpu:
            print(f"  torch.profiler per step (median): GPU span {median(steps['gpu_span_ms'].tolist()):.3f} ms, "
                  f"GPU busy {median(steps['gpu_busy_ms'].tolist()):.3f} ms, {int(steps['launches'].median())} launches")
    event_ms = [s.elapsed_time(e) for s, e in pairs]
    print(check_loss_fell(losses))
    result.update(wall_ms=wall_ms, event_ms=event_ms, loss=losses, synchronised_steps=True)
    print(f"  per step (median of {args.steps}): host clock {median(wall_ms):.3f} ms"
          + (f", CUDA events {median(event_ms):.3f} ms" if event_ms else ""))
    if args.mode != "events" and args.baseline_steps:
        for when, (walls, events) in baseline.items():
            ms = [s.elapsed_time(e) for s, e in events]
            result[f"{when}_wall_ms"], result[f"{when}_event_ms"] = walls, ms
        before, after = (result[f"{w}_event_ms" if gpu else f"{w}_wall_ms"] for w in ("baseline", "after"))
        print(f"  same process without the profiler ({'CUDA events' if gpu else 'host clock'}, median of "
              f"{args.baseline_steps}): {median(before):.3f} ms before the profiled steps, {median(after):.3f} ms after")
    if args.json:
        from gpuprof.kernels import write_json

        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
