#!/usr/bin/env python3
"""Warp divergence: the same work split between two code paths per warp, then per thread.

The kernels are in divergence.cu: half the threads run --iters steps of a float
multiply-add chain, the other half --iters steps of an integer random-number generator.
In branch_per_warp the split follows warps (all 32 threads of a warp agree); in
branch_per_thread it follows even and odd threads, so every warp runs both paths, each
with half its threads idle. Each kernel is timed with CUDA events (median) inside an NVTX
range of its name, and sampled results are checked against NumPy.

  ncu --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats \
      --section WarpStateStats --section SourceCounters -k regex:branch_per \
      -o divergence python examples/nsight_compute/divergence.py --warmup 0 --repeats 1

Without a GPU, NumPy computes a few threads' results instead, and there is nothing to profile.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

import numpy as np  # noqa: E402

from gpuprof import Backend, exit_on_error  # noqa: E402
from gpuprof import kernels as gk  # noqa: E402
from gpuprof.cli import positive_int, require_memory  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

CU = Path(__file__).with_name("divergence.cu")
KERNELS = {"branch_per_warp": "branch per warp (uniform)", "branch_per_thread": "branch per thread (divergent)"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=positive_int, default=1 << 22, help="threads launched (a multiple of --block; default: %(default)s)")
    p.add_argument("--iters", type=positive_int, default=4096, help="steps of each path per thread (default: %(default)s)")
    p.add_argument("--block", type=positive_int, default=256, help="threads per block, a multiple of 64 (default: %(default)s)")
    gk.add_bench_arguments(p)
    args = p.parse_args(argv)
    if args.block % 64 or args.block > 1024:
        p.error(f"--block must be a multiple of 64 (two warps) and at most 1024, not {args.block}")
    if args.threads % args.block:
        p.error(f"--threads ({args.threads}) must be a multiple of --block ({args.block})")
    return args


def expected(idx: np.ndarray, iters: int, path_a: np.ndarray) -> np.ndarray:
    """What the kernels compute for threads ``idx``: path A in float64 (the GPU's fused float32
    multiply-adds round differently, so compare with a tolerance), path B exactly (uint32 wraps)."""
    v = idx.astype(np.float64)
    u = idx.astype(np.uint32)
    for _ in range(iters):
        v = v * np.float64(np.float32(0.999999)) + 0.5
        u = u * np.uint32(1664525) + np.uint32(1013904223)
    return np.where(path_a, v, (u >> np.uint32(8)).astype(np.float64))


def check(got: np.ndarray, idx: np.ndarray, iters: int, path_a: np.ndarray) -> str:
    want = expected(idx, iters, path_a)
    rel = np.abs(got.astype(np.float64) - want) / np.maximum(np.abs(want), 1.0)
    worst_a = float(rel[path_a].max()) if path_a.any() else 0.0
    exact_b = bool(np.array_equal(got[~path_a].astype(np.float64), want[~path_a]))
    if worst_a > 1e-3 or not exact_b:
        raise GpuprofError(f"wrong result: path A off by up to {worst_a:.1e} (relative), path B exact: {exact_b}.")
    return f"result checked: {len(idx)} threads match NumPy (path A within {worst_a:.0e}, path B exactly)"


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cp = None if args.cpu else gk.cupy_gpu()
    idx = np.array(gk.sample_rows(args.threads, 512), dtype=np.int64)
    if cp is None:
        print("divergence: no GPU here, so NumPy computes a sample of threads instead (nothing for ncu to profile)")
        iters = min(args.iters, 256)
        for name, rule in (("branch_per_warp", (idx % args.block) // 32 % 2 == 0), ("branch_per_thread", idx % 2 == 0)):
            want = expected(idx, iters, rule)
            print(f"  {KERNELS[name]}: " + check(want.astype(np.float32), idx, iters, rule))
        print("result checked: NumPy's own results, for the layout of each kernel")
        gk.write_json(args.json, {"cpu": True})
        return 0
    # one float per thread on the GPU, and copied whole to the host for the check: refused before any work
    require_memory(args.threads * 4, "cuda", f"One float for each of {args.threads:,} threads", "--threads")
    require_memory(args.threads * 4, "cpu", f"The copy of {args.threads:,} threads' results", "--threads")
    kernels = gk.compile_kernels(CU, list(KERNELS), cp)
    backend = Backend("cupy", "cuda", cp)
    out = cp.empty(args.threads, dtype=cp.float32)
    grid, block = (args.threads // args.block,), (args.block,)
    lane = idx % args.block
    rules = {"branch_per_warp": (lane // 32) % 2 == 0, "branch_per_thread": lane % 2 == 0}
    print(f"divergence: {args.threads:,} threads, {args.iters} steps per path, {args.block} threads per block")
    results = []
    for name, label in KERNELS.items():
        def launch(k=kernels[name]) -> None:
            k(grid, block, (out, np.int32(args.iters)))

        def verify(name=name) -> str:
            return check(cp.asnumpy(out)[idx], idx, args.iters, rules[name])

        out.fill(cp.nan)
        results += gk.bench([gk.Variant(name, label, launch, args.threads * args.iters * 2, unit="Gop/s",
                                        check=verify)], backend, warmup=args.warmup, repeats=args.repeats)
    print()
    print(gk.format_results(results, results[-1], "vs divergent"))
    gk.write_json(args.json, {"threads": args.threads, "iters": args.iters, "block": args.block, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
