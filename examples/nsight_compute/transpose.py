#!/usr/bin/env python3
"""Transpose a matrix four ways, each kernel fixing what Nsight Compute showed wrong with the last.

The kernels are in transpose.cu (read it first): copy_tile (the same traffic without the
transposing: the ceiling), then transpose_naive, transpose_tiled, transpose_padded and
transpose_coarse. Each is timed with CUDA events (median of --repeats after --warmup
launches) inside an NVTX range of its name, checked against NumPy's a.T on sampled rows,
and compared with a device-to-device copy measured in the same process the way chapter 0
measures it.

Profile all of them, one launch each:

  ncu --set full -k regex:"transpose|copy_tile" -o transpose python examples/nsight_compute/transpose.py --warmup 0 --repeats 1 --no-reference

or one step, by its NVTX range: ncu --nvtx --nvtx-include "transpose_padded/" ...

Without a GPU, NumPy transposes a small matrix instead, and there is nothing to profile.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

import numpy as np  # noqa: E402

from gpuprof import Backend, choose_backend, exit_on_error  # noqa: E402
from gpuprof import kernels as gk  # noqa: E402
from gpuprof.cli import positive_int, require_memory  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

CU = Path(__file__).with_name("transpose.cu")
STEPS = {  # kernel: (label, elements of the tile a block handles)
    "copy_tile": ("copy (the ceiling)", 32),
    "transpose_naive": ("1 naive", 32),
    "transpose_tiled": ("2 shared-memory tile", 32),
    "transpose_padded": ("3 padded tile", 32),
    "transpose_coarse": ("4 coarsened (64 x 64 per block)", 64),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=positive_int, default=None,
                   help="matrix size n (n x n floats, a multiple of 64; default: 16384 on a GPU, 1024 on a CPU)")
    p.add_argument("--kernels", default="all", help=f"comma-separated subset of {', '.join(STEPS)} (default: all)")
    p.add_argument("--no-reference", action="store_true", help="skip the device-to-device copy reference (under ncu)")
    gk.add_bench_arguments(p)
    args = p.parse_args(argv)
    if args.n is not None and args.n % 64:
        p.error(f"--n must be a multiple of 64 (the largest tile), not {args.n}")
    args.kernels = gk.choose_kernels(p, args.kernels, list(STEPS))
    return args


def check_transpose(host_a: np.ndarray, out, rows: list[int], cp, transposed: bool) -> str:
    """Compare sampled rows of ``out`` with NumPy's answer from the same input (``host_a``)."""
    for r in rows:
        want = host_a[:, r] if transposed else host_a[r]
        got = cp.asnumpy(out[r])
        if not np.array_equal(got, want):
            bad = int(np.flatnonzero(got != want)[0])
            raise GpuprofError(f"wrong result: row {r}, column {bad} holds {got[bad]} instead of {want[bad]}.")
    return f"result checked: {len(rows)} rows equal NumPy's"


def run_cpu(n: int, json_path: Path | None) -> None:
    import time

    require_memory(2 * n * n * 4, "cpu", f"A {n:,} x {n:,} matrix and its transpose", "--n")
    print(f"transpose: no GPU here, so NumPy transposes a {n} x {n} matrix instead (nothing for ncu to profile)")
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    t0 = time.perf_counter()
    out = np.ascontiguousarray(a.T)
    seconds = time.perf_counter() - t0
    if not all(np.array_equal(out[:, r], a[r]) for r in range(n)):
        raise GpuprofError("wrong result: NumPy's transpose does not hold the input's rows as columns.")
    print(f"  NumPy a.T copied: {seconds * 1e3:.2f} ms, {2 * a.nbytes / seconds / 1e9:.1f} GB/s")
    print("result checked: every column of the copy equals a row of the input")
    gk.write_json(json_path, {"n": n, "cpu": True, "numpy_ms": seconds * 1e3})


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cp = None if args.cpu else gk.cupy_gpu()
    if cp is None:
        run_cpu(args.n or 1024, args.json)
        return 0
    n = args.n or 16384
    require_memory(2 * n * n * 4 + (2 << 30), "cuda", f"A {n} x {n} transpose (plus the 1 GiB copy reference)", "--n")
    kernels = gk.compile_kernels(CU, args.kernels, cp)
    backend = Backend("cupy", "cuda", cp)
    print(f"transpose: {n} x {n} floats ({n * n * 4 / 2**30:.2f} GiB each way) with CuPy kernels from {CU.name}")
    reference = None
    if not args.no_reference:
        from gpuprof.studies import speed_of_light as sol

        reference = sol.device_copy(choose_backend())
        print(f"  device-to-device copy (chapter 0's method, this process): {reference.value:,.1f} GB/s")
    a = cp.random.standard_normal((n, n), dtype=cp.float32)
    out = cp.empty_like(a)
    host_a = cp.asnumpy(a)
    rows = gk.sample_rows(n)
    variants = []
    for name in args.kernels:
        label, tile = STEPS[name]
        grid, block = (n // tile, n // tile), (32, 8)

        def launch(k=kernels[name], grid=grid, block=block) -> None:
            k(grid, block, (a, out, np.int32(n)))

        def check(name=name) -> str:
            return check_transpose(host_a, out, rows, cp, transposed=name != "copy_tile")

        variants.append(gk.Variant(name, label, launch, 2 * a.nbytes, check=check,
                                   extra={"grid": list(grid), "block": list(block)}))
    results = []
    for v in variants:  # clear the output first, so that a kernel that writes nothing cannot pass
        out.fill(cp.nan)
        results += gk.bench([v], backend, warmup=args.warmup, repeats=args.repeats)
    naive = next((r for r in results if r.name == "transpose_naive"), None)
    print()
    print(gk.format_results(results, naive, "vs naive" if naive else ""))
    if reference is not None:
        for r in results:
            print(f"  {r.label:<36} {r.rate / reference.value:6.1%} of the device copy")
    gk.write_json(args.json, {"n": n, "bytes_per_launch": 2 * a.nbytes, "results": results,
                              "device_copy_gbps": reference.value if reference else None,
                              "device_copy_how": reference.how if reference else None})
    return 0


if __name__ == "__main__":
    sys.exit(main())
