#!/usr/bin/env python3
"""Launches that can overlap, on two streams and inside a CUDA graph: do they, with and without Nsight Compute?

The kernel (spin in replay_modes.cu) is one warp that spins for --spin-us microseconds
of SM clock cycles and records the GPU's global timer at its start and end. The script
runs two demonstrations, each after one untimed warm-up:

  streams  two launches on two streams, inside an NVTX push/pop range "pair";
  graph    a CUDA graph with two independent kernel nodes (a fork and a join),
           launched inside an NVTX push/pop range "graph".

For each it prints when the two kernels ran, as the kernels themselves recorded it, and
whether they overlapped. Run without a profiler they overlap; under ncu's default kernel
replay they do not (ncu serialises launches); with --replay-mode range, or a graph profiled
with --graph-profiling graph, the range or graph is measured as one workload:

  ncu --nvtx --nvtx-include pair/ python examples/nsight_compute/replay_modes.py --demo streams
  ncu --replay-mode range --nvtx --nvtx-include pair/ python examples/nsight_compute/replay_modes.py --demo streams
  ncu --graph-profiling graph --nvtx --nvtx-include graph/ python examples/nsight_compute/replay_modes.py --demo graph

--run-log FILE appends one line per start of the program, to count how many times ncu's
application replay runs it. Without a GPU there is nothing to launch; the script says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

import numpy as np  # noqa: E402

from gpuprof import exit_on_error  # noqa: E402
from gpuprof import kernels as gk  # noqa: E402
from gpuprof.cli import output_file, positive_float  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402
from gpuprof.ranges import annotate  # noqa: E402

CU = Path(__file__).with_name("replay_modes.cu")
DEMOS = ["streams", "graph"]
MAX_SPIN_US = 1_000_000.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--demo", choices=[*DEMOS, "all"], default="all", help="which demonstration to run (default: all)")
    p.add_argument("--spin-us", type=positive_float, default=2000.0,
                   help="how long each kernel spins, in microseconds at the GPU's maximum SM clock "
                        f"(default: %(default)s; at most {MAX_SPIN_US:,.0f})")
    p.add_argument("--run-log", type=output_file, default=None, metavar="FILE",
                   help="append one line to FILE each time the program starts")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="also write the results to FILE")
    args = p.parse_args(argv)
    if args.spin_us > MAX_SPIN_US:
        p.error(f"--spin-us {args.spin_us:,.0f} is above this script's limit of {MAX_SPIN_US:,.0f} (one second per kernel)")
    return args


def timeline(stamps: np.ndarray) -> dict:
    """Two kernels' [start, end] global-timer stamps (ns) as durations, span and overlap (negative: a gap)."""
    (s1, e1), (s2, e2) = stamps.reshape(2, 2).astype(np.int64)
    return {"kernel_us": [(e1 - s1) / 1e3, (e2 - s2) / 1e3], "span_us": (max(e1, e2) - min(s1, s2)) / 1e3,
            "overlap_us": (min(e1, e2) - max(s1, s2)) / 1e3}


def describe(name: str, t: dict) -> str:
    verdict = "overlapped" if t["overlap_us"] > 0 else "ran one after the other"
    return (f"  {name:<8} kernels {t['kernel_us'][0]:8.1f} and {t['kernel_us'][1]:8.1f} us, span {t['span_us']:8.1f} us: "
            f"{verdict} (overlap {t['overlap_us']:+.1f} us)")


def run_streams(cp, spin, cycles: int) -> dict:
    stamps = cp.zeros(4, dtype=cp.uint64)
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]

    def pair() -> None:
        for i, s in enumerate(streams):
            with s:  # CuPy launches on the current stream
                spin((1,), (32,), (np.int64(cycles), stamps[2 * i:]))
        for s in streams:
            s.synchronize()

    pair()  # warm-up: module load, first-launch costs
    with annotate("pair"):
        pair()
    return timeline(checked(cp.asnumpy(stamps)))


def checked(stamps: np.ndarray) -> np.ndarray:
    """The stamps, if each kernel wrote a start before its end (else the launch did not run as written)."""
    s = stamps.reshape(2, 2).astype(np.int64)
    if not ((s[:, 0] > 0) & (s[:, 1] > s[:, 0])).all():
        raise GpuprofError(f"a kernel did not record its start and end (stamps {stamps.tolist()}).")
    return stamps


def run_graph(cp, spin, cycles: int) -> dict:
    stamps = cp.zeros(4, dtype=cp.uint64)
    main, side = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    main.begin_capture()
    fork = main.record()
    side.wait_event(fork)
    with main:
        spin((1,), (32,), (np.int64(cycles), stamps[0:]))
    with side:
        spin((1,), (32,), (np.int64(cycles), stamps[2:]))
    main.wait_event(side.record())
    graph = main.end_capture()
    graph.launch(stream=main)  # warm-up (uploads the graph)
    main.synchronize()
    with annotate("graph"):
        graph.launch(stream=main)
        main.synchronize()
    return timeline(checked(cp.asnumpy(stamps)))


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.run_log:
        with open(args.run_log, "a") as f:
            f.write(f"{os.getpid()}\n")
    cp = gk.cupy_gpu()
    if cp is None:
        print("replay_modes: no GPU here, so there is nothing to launch or profile "
              "(the chapter reads the course's reference results instead)")
        if args.json:
            Path(args.json).write_text(json.dumps({"cpu": True}) + "\n")
        return 0
    spin = gk.compile_kernels(CU, ["spin"], cp)["spin"]
    clock_khz = int(cp.cuda.runtime.getDeviceProperties(0)["clockRate"])
    cycles = int(args.spin_us * clock_khz / 1e3)
    if not cycles:
        raise GpuprofError("--spin-us is too small to spin for a single clock cycle.")
    demos = DEMOS if args.demo == "all" else [args.demo]
    print(f"replay_modes: two kernels of {cycles:,} SM cycles each ({args.spin_us:.0f} us at {clock_khz / 1e6:.2f} GHz)")
    results = {}
    for name in demos:
        results[name] = (run_streams if name == "streams" else run_graph)(cp, spin, cycles)
        print(describe(name, results[name]))
    print("result checked: every kernel recorded a start before its end")
    if args.json:  # plain JSON: describing the machine would import PyTorch, seconds per start under application replay
        Path(args.json).write_text(json.dumps({"spin_us": args.spin_us, "cycles": cycles, "clock_khz": clock_khz, **results}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
