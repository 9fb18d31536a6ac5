#!/usr/bin/env python3
"""A BF16 matrix product, one idea per rung, each checked against cuBLAS and timed beside it.

C = A @ B with A (M x K) and B (K x N) in BF16, row-major, accumulated and written in FP32.
The rungs are kernels in matmul_ladder.cu, compiled with -lineinfo (so that ncu's source
page maps counters to lines):

  1  ladder_1_naive      one output per thread, every operand read from global memory
  2  ladder_2_smem       32 x 32 tiles of A and B staged in shared memory
  3  ladder_3_regtile    128 x 128 tiles, an 8 x 8 patch of C per thread in registers,
                         16-byte loads

The tensor-core rungs (mma.sync with ldmatrix, a cp.async pipeline, Hopper's wgmma fed by
TMA) are not written yet. Every run first checks each rung on three shapes, one of them
not a multiple of any tile, against cuBLAS's FP32 product of the same BF16 values (CuPy's
matmul, TF32 off), then times the rungs and cuBLAS's own BF16 product (through PyTorch,
when it is installed) at --size, in one run, and prints each rung's share of cuBLAS.

  ncu --set full --import-source yes -k regex:ladder_3 -o ladder3 \\
      python examples/nsight_compute/matmul_ladder.py --rung 3 --warmup 0 --repeats 1 --no-check

Without a GPU there is nothing to run: the script says so and exits.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

import numpy as np  # noqa: E402

from gpuprof import Backend, exit_on_error  # noqa: E402
from gpuprof import kernels as gk  # noqa: E402
from gpuprof.cli import require_memory  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

CU = Path(__file__).with_name("matmul_ladder.cu")
RUNGS = {  # rung: (kernel, label, threads per block, tile of C per block, what the shape must be a multiple of)
    1: ("ladder_1_naive", "1 naive, one output per thread", (16, 16), (16, 16), 1),
    2: ("ladder_2_smem", "2 shared-memory tiles", (32, 32), (32, 32), 1),
    3: ("ladder_3_regtile", "3 register tiles, 16-byte loads", (256,), (128, 128), 8),
}
CHECK_SHAPES = [(512, 512, 512), (1000, 1000, 1000), (777, 520, 264)]  # (M, N, K); the last two fit no tile
TOLERANCE = 1e-3  # largest difference over the largest value of cuBLAS's FP32 product of the same inputs


def shape(text: str) -> tuple[int, int, int]:
    """M,N,K (or one number for a square product)."""
    parts = [p for p in text.replace("x", ",").split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected M,N,K or one number, not {text!r}") from None
    if len(values) == 1:
        values *= 3
    if len(values) != 3 or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected three positive sizes M,N,K (or one), not {text!r}")
    return values[0], values[1], values[2]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rung", default="all", help=f"rungs to run: 'all' or a comma-separated subset of {sorted(RUNGS)}")
    p.add_argument("--size", type=shape, default=(4096, 4096, 4096), metavar="M,N,K",
                   help="the timed product's shape (default: 4096,4096,4096)")
    p.add_argument("--no-check", action="store_true", help="skip the three-shape check (under ncu: one launch per rung)")
    gk.add_bench_arguments(p)
    args = p.parse_args(argv)
    try:
        args.rungs = sorted(RUNGS) if args.rung == "all" else sorted({int(r) for r in args.rung.split(",") if r.strip()})
    except ValueError:
        p.error(f"--rung takes 'all' or numbers such as 1,3, not {args.rung!r}")
    bad = [r for r in args.rungs if r not in RUNGS]
    if bad or not args.rungs:
        p.error(f"no rung {bad[0] if bad else '(none given)'}; the rungs written so far are {sorted(RUNGS)}")
    return args


def grid_for(rung: int, m: int, n: int) -> tuple[int, int]:
    tile_m, tile_n = RUNGS[rung][3]
    return (-(-n // tile_n), -(-m // tile_m))


def fits(rung: int, m: int, n: int, k: int) -> str | None:
    """Why ``rung`` cannot take this shape, or None (rung 3's 16-byte loads need K and N multiples of 8)."""
    step = RUNGS[rung][4]
    if step > 1 and (k % step or n % step):
        return f"rung {rung} loads 8 values at a time: K and N must be multiples of {step} (got N={n}, K={k})"
    return None


def make_inputs(cp, m: int, n: int, k: int, seed: int):  # type: ignore[no-untyped-def]
    """A and B as BF16 bit patterns, and the FP32 values they hold."""
    rng = cp.random.default_rng(seed)
    a = gk.bf16_bits(rng.standard_normal((m, k), dtype=cp.float32), cp)
    b = gk.bf16_bits(rng.standard_normal((k, n), dtype=cp.float32), cp)
    return a, b, gk.bf16_to_f32(a, cp), gk.bf16_to_f32(b, cp)


def check_rungs(cp, kernels: dict, rungs: list[int]) -> list[dict]:  # type: ignore[no-untyped-def]
    """Each rung on each check shape against cuBLAS's FP32 product of the same BF16 values."""
    rows = []
    for m, n, k in CHECK_SHAPES:
        a, b, a32, b32 = make_inputs(cp, m, n, k, seed=m + n + k)
        want = cp.matmul(a32, b32)  # cuBLAS SGEMM (CuPy leaves TF32 off unless CUPY_TF32=1)
        scale = float(cp.abs(want).max())
        for rung in rungs:
            why = fits(rung, m, n, k)
            if why:
                rows.append({"rung": rung, "shape": [m, n, k], "skipped": why})
                continue
            c = cp.full((m, n), cp.nan, dtype=cp.float32)
            name, _, block, _, _ = RUNGS[rung]
            kernels[name](grid_for(rung, m, n), block, (a, b, c, np.int32(m), np.int32(n), np.int32(k)))
            err = float(cp.abs(c - want).max()) / scale
            ok = bool(err <= TOLERANCE)  # a NaN (an element never written) fails too
            rows.append({"rung": rung, "shape": [m, n, k], "relative_error": err, "ok": ok})
            print(f"  check rung {rung} on {m} x {n} x {k}: largest difference {err:.1e} of the largest value "
                  f"({'within' if ok else 'OVER'} {TOLERANCE:.0e})")
    failed = [r for r in rows if r.get("ok") is False]
    if failed:
        raise GpuprofError(f"{len(failed)} rung/shape check(s) failed: "
                           + ", ".join(f"rung {r['rung']} at {r['shape']}" for r in failed) + ".",
                           "A rung that writes wrong results is not timed; see the lines above.")
    return rows


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cp = None if args.cpu else gk.cupy_gpu()
    if cp is None:
        print("matmul_ladder: no CUDA GPU here (or --cpu): the rungs are CUDA kernels and there is nothing to run "
              "without one. On a GPU machine: python examples/nsight_compute/matmul_ladder.py")
        gk.write_json(args.json, {"cpu": True})
        return 0
    m, n, k = args.size
    for rung in args.rungs:
        why = fits(rung, m, n, k)
        if why:
            raise GpuprofError(why + ".", "Choose another --size or leave this rung out with --rung.")
    require_memory(2 * (m * k + k * n) * 2 + 2 * m * n * 4, "cuda", f"A {m} x {n} x {k} product's inputs and outputs",
                   "--size")
    names = [RUNGS[r][0] for r in args.rungs]
    kernels = gk.compile_kernels(CU, names, cp)
    print(f"matmul_ladder: {m} x {n} x {k}, BF16 in, FP32 accumulate, {2 * m * n * k / 1e9:,.0f} GFLOP per product")
    checks = [] if args.no_check else check_rungs(cp, kernels, args.rungs)
    a, b, a32, b32 = make_inputs(cp, m, n, k, seed=0)
    c = cp.empty((m, n), dtype=cp.float32)
    backend = Backend("cupy", "cuda", cp)
    variants = []
    for rung in args.rungs:
        name, label, block, _, _ = RUNGS[rung]

        def launch(kern=kernels[name], grid=grid_for(rung, m, n), block=block) -> None:
            kern(grid, block, (a, b, c, np.int32(m), np.int32(n), np.int32(k)))

        variants.append(gk.Variant(name, label, launch, 2 * m * n * k, unit="TFLOP/s", extra={"rung": rung}))
    try:
        import torch

        if torch.cuda.is_available():
            ta, tb = (torch.from_dlpack(x).view(torch.bfloat16) for x in (a, b))
            variants.append(gk.Variant("cublas_bf16", "cuBLAS BF16 (BF16 output)", lambda: torch.matmul(ta, tb),
                                       2 * m * n * k, unit="TFLOP/s"))
    except ImportError:
        print("  (no CUDA build of PyTorch here: no cuBLAS BF16 row to compare with)")
    results = gk.bench(variants, backend, warmup=args.warmup, repeats=args.repeats)
    cublas = next((r for r in results if r.name == "cublas_bf16"), None)
    print()
    print(gk.format_results(results, results[0], "vs rung " + str(args.rungs[0])))
    if cublas:
        for r in results:
            if r is not cublas:
                print(f"  {r.label:<44} {r.rate / cublas.rate:6.1%} of cuBLAS BF16")
    gk.write_json(args.json, {"size": [m, n, k], "flops_per_product": 2 * m * n * k, "checks": checks,
                              "results": results, "tolerance": TOLERANCE})
    return 0


if __name__ == "__main__":
    sys.exit(main())
