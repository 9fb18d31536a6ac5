#!/usr/bin/env python3
"""Launch bursts of tiny kernels inside NVTX ranges: the smallest program worth a timeline.

Each step launches ``--kernels`` one-element additions, so each kernel runs for about
a microsecond while its launch costs several: on the Nsight Systems timeline the GPU
row is mostly gaps, the signature of a launch-bound program. Chapter 0 profiles it to
check that nsys works and to read the launch overhead off a real capture.

NVTX ranges: ``warmup`` (the first step, excluded from analysis), then ``step_N`` for
each measured step. Each range ends with a synchronisation, so the kernels it
launched have finished before it closes.

    nsys profile --trace=cuda,nvtx --sample=none --cpuctxsw=none -o tiny python examples/nsys/tiny_kernels.py

Runs on the CPU too (NumPy), with no kernels to see.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import annotate, choose_backend, exit_on_error  # noqa: E402
from gpuprof.cli import bounded_int, positive_float  # noqa: E402

MAX_KERNELS = 1_000_000
MAX_STEPS = 100_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=bounded_int(MAX_STEPS, "use --seconds for a long run"), default=5,
                   help=f"measured steps after one warm-up step (default: 5; at most {MAX_STEPS:,})")
    p.add_argument("--kernels", type=bounded_int(MAX_KERNELS, "at a few microseconds a launch, a million already "
                                                              "take seconds per step"),
                   default=200, help=f"tiny kernels launched per step (default: 200; at most {MAX_KERNELS:,})")
    p.add_argument("--seconds", type=positive_float, default=None,
                   help="keep running steps for this long instead of --steps (for attaching a profiler later)")
    p.add_argument("--pause-ms", type=float, default=0.0,
                   help="sleep between steps, which keeps long runs' captures small (default: 0)")
    p.add_argument("--backend", choices=["torch", "cupy", "cpu"], default=None,
                   help="force a backend (default: torch CUDA, then CuPy, then CPU)")
    args = p.parse_args(argv)
    if args.pause_ms < 0:
        p.error("--pause-ms must not be negative")
    return args


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    backend = choose_backend(args.backend)
    xp = backend.xp
    if backend.name == "torch":
        x = xp.zeros(1, device=backend.device)
    else:
        x = xp.zeros(1, dtype=xp.float32)
    print(f"tiny_kernels: {args.kernels} launches per step on {backend}")
    if not backend.is_gpu:
        print("no GPU here: these are CPU operations, and a profiler would show no kernels")

    def burst() -> None:
        for _ in range(args.kernels):
            x.__iadd__(1.0)
        backend.synchronize()  # inside the range, so its kernels belong to it

    with annotate("warmup", color="gray"):
        burst()
    step, started, per_launch = 0, time.perf_counter(), []
    while (step < args.steps) if args.seconds is None else (time.perf_counter() - started < args.seconds):
        t0 = time.perf_counter()
        with annotate(f"step_{step}", color="green"):
            burst()
        dt = time.perf_counter() - t0
        per_launch.append(dt / args.kernels)
        if args.pause_ms > 0:
            time.sleep(args.pause_ms / 1e3)
        if args.seconds is None or step % 100 == 0:
            print(f"step_{step}: {dt * 1e3:.2f} ms, {dt / args.kernels * 1e6:.2f} us per launch")
        step += 1
    print(f"median: {statistics.median(per_launch) * 1e6:.3f} us per launch over {step} steps")
    expected = args.kernels * (step + 1)
    got = float(x.item() if hasattr(x, "item") else x[0])
    if got != expected:
        raise SystemExit(f"wrong result: {got} != {expected}")
    print(f"result checked: {got:.0f} additions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
