#!/usr/bin/env python3
"""Register spills: the same computation with the registers it needs and squeezed into 32, timed and described.

spills.cu has one body compiled as two kernels. Each thread keeps 64 running values live
across a loop: accumulate_in_registers may use as many registers as it needs, while
accumulate_spilled carries __launch_bounds__(256, 8), which caps it at 32 registers per
thread, so the compiler stores the rest in local memory (a spill). This script prints
what the compiler reports for each (nvcc -Xptxas -v, when nvcc is here), what the driver
reports (registers and local memory per thread), and times both (CUDA events, median)
inside NVTX ranges named after them.

  ncu --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \\
      --section MemoryWorkloadAnalysis_Tables -k regex:accumulate -o spills \\
      python examples/nsight_compute/spills.py --warmup 0 --repeats 1

Without a GPU, NumPy computes the same values for a few threads, and there is nothing to profile.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

import numpy as np  # noqa: E402

from gpuprof import Backend, exit_on_error  # noqa: E402
from gpuprof import kernels as gk  # noqa: E402
from gpuprof.cli import bounded_int, positive_int, require_memory  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

CU = Path(__file__).with_name("spills.cu")
KERNELS = ["accumulate_in_registers", "accumulate_spilled"]
NACC = 64  # running values per thread, as in spills.cu
BLOCK = 256
MAX_ITERS = 100_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=positive_int, default=2**20,
                   help=f"threads to launch, a multiple of {BLOCK} (default: %(default)s)")
    p.add_argument("--iters", type=bounded_int(MAX_ITERS, "each iteration is 64 FMAs per thread"), default=256,
                   help=f"loop iterations per thread, 1 to {MAX_ITERS:,} (default: %(default)s)")
    p.add_argument("--n", type=positive_int, default=2**24, help="input elements (floats, read in a ring; default: %(default)s)")
    gk.add_bench_arguments(p)
    args = p.parse_args(argv)
    if args.threads % BLOCK:
        p.error(f"--threads must be a multiple of {BLOCK} (got {args.threads})")
    return args


def reference(x: np.ndarray, threads: int, iters: int, tids: list[int]) -> np.ndarray:
    """What spills.cu computes for threads ``tids``, in float64 (the GPU's FMAs round once, in float32)."""
    k = np.arange(NACC, dtype=np.float64)
    out = []
    for tid in tids:
        acc = k.copy()
        for it in range(iters):
            acc = acc * float(x[(tid + it * threads) % x.size]) + (k + 1)
        out.append(acc.sum())
    return np.array(out)


def check(x: np.ndarray, out, threads: int, iters: int, tids: list[int], cp) -> str:
    got = cp.asnumpy(out[tids]) if cp is not None else out
    want = reference(x, threads, iters, tids)
    err = float(np.max(np.abs(got - want) / np.abs(want)))
    if not err < 1e-4:
        raise GpuprofError(f"wrong result: thread sums differ from NumPy's by up to {err:.1e} (relative).")
    return f"result checked: {len(tids)} threads within {err:.0e} of NumPy"


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cp = None if args.cpu else gk.cupy_gpu()
    rng = np.random.default_rng(0)
    tids = gk.sample_rows(args.threads)
    if cp is None:
        require_memory(args.n * 4, "cpu", f"An input of {args.n * 4 / 2**20:,.0f} MiB", "--n")
        x = rng.uniform(0.0, 0.5, args.n).astype(np.float32)  # |v| < 1: the running values stay bounded
        sums = reference(x, args.threads, args.iters, tids)
        print(f"spills: no GPU here, so NumPy computes {len(tids)} threads' sums instead (nothing to compile or profile)")
        print(check(x, sums, args.threads, args.iters, tids, None))
        gk.write_json(args.json, {"cpu": True, "threads": args.threads, "iters": args.iters})
        return 0
    require_memory((args.n + args.threads) * 4, "cuda", f"An input of {args.n * 4 / 2**20:,.0f} MiB and "
                   f"{args.threads * 4 / 2**20:,.0f} MiB of results", "--n or --threads")
    kernels = gk.compile_kernels(CU, KERNELS, cp)
    ptxas = gk.ptxas_usage(CU, cp)
    host_x = rng.uniform(0.0, 0.5, args.n).astype(np.float32)
    x = cp.asarray(host_x)
    out = cp.empty(args.threads, dtype=cp.float32)
    flop = 2.0 * NACC * args.iters * args.threads  # one FMA per running value per iteration
    print(f"spills: {args.threads:,} threads x {args.iters} iterations x {NACC} running values "
          f"({flop / 1e9:.1f} GFLOP per launch)")
    if ptxas is not None:
        for line in ptxas[1]:
            print(f"  {line}")
    described = {}
    variants = []
    for name in KERNELS:
        kernel = kernels[name]
        attrs = gk.kernel_attributes(kernel)
        described[name] = {**attrs, **(ptxas[0].get(name, {}) if ptxas else {})}
        print(f"  {name}: {attrs['registers']} registers, {attrs['local_bytes']} bytes of local memory per thread (driver)")

        def launch(kernel=kernel) -> None:
            kernel((args.threads // BLOCK,), (BLOCK,), (x, out, np.int32(args.n), np.int32(args.iters)))

        label = f"{name} ({attrs['registers']} registers)"
        variants.append(gk.Variant(name, label, launch, flop, unit="TFLOP/s", extra=described[name],
                                   check=lambda: check(host_x, out, args.threads, args.iters, tids, cp)))
    results = gk.bench(variants, Backend("cupy", "cuda", cp), warmup=args.warmup, repeats=args.repeats)
    print()
    print(gk.format_results(results, results[0], "vs registers"))
    gk.write_json(args.json, {"threads": args.threads, "iters": args.iters, "flop_per_launch": flop,
                              "ptxas": ptxas[1] if ptxas else None, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
