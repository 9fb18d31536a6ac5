#!/usr/bin/env python3
"""SAXPY (y = a*x + y) as a hand-written CUDA kernel: one clean kernel for Nsight Compute.

A framework op launches kernels with long template names; this script compiles a
kernel named ``saxpy`` (CuPy RawKernel, through NVRTC) so that ``ncu -k regex:saxpy``
finds exactly it. SAXPY reads 8 bytes and writes 4 per element for 2 flops: it is
memory-bound on every GPU, which is what the Speed Of Light section should show.

    ncu --clock-control none --section SpeedOfLight -k regex:saxpy -c 1 python examples/nsight_compute/saxpy.py

Without CuPy it falls back to PyTorch (kernel name ``vectorized_elementwise_kernel``;
filter with ``-k regex:elementwise``), and without a GPU to NumPy, with no kernel.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

import numpy as np  # noqa: E402

from gpuprof import Backend, annotate, choose_backend, exit_on_error, time_call  # noqa: E402
from gpuprof.cli import positive_int, require_memory  # noqa: E402

KERNEL = r"""
extern "C" __global__ void saxpy(const float a, const float* __restrict__ x, float* __restrict__ y, const long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=positive_int, default=1 << 26, help="vector length in elements (default: 67108864)")
    p.add_argument("--block", type=positive_int, default=256,
                   help="threads per block of the CuPy kernel, at most 1024 (default: 256)")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed launches after one warm-up (default: 5)")
    p.add_argument("--backend", choices=["torch", "cupy", "cpu"], default=None,
                   help="force a backend (default: torch CUDA, then CuPy, then CPU)")
    args = p.parse_args(argv)
    if args.block > 1024:
        p.error("--block must be at most 1024, the CUDA limit on threads per block")
    return args


def _cupy_or_none(backend_is_gpu: bool):
    """CuPy if it can use a GPU here (the named kernel needs it), else None."""
    if not backend_is_gpu:
        return None
    try:
        import cupy as cp

        return cp if cp.cuda.is_available() else None
    except Exception:
        return None


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    backend = choose_backend(args.backend)
    a, n = 2.0, args.n
    calls = 0
    cp = _cupy_or_none(backend.is_gpu)
    # x, y, a copy of y and the check's expected values, plus two temporaries of the same size
    require_memory(6 * 4 * n, "cuda" if backend.is_gpu else "cpu", f"Vectors of {n:,} floats", "--n")
    if cp is not None:
        kernel = cp.RawKernel(KERNEL, "saxpy")
        x = cp.random.standard_normal(n, dtype=cp.float32)
        y = cp.random.standard_normal(n, dtype=cp.float32)
        grid = ((n + args.block - 1) // args.block,)
        impl, timer_backend = "CuPy RawKernel 'saxpy'", Backend("cupy", "cuda", cp)

        def step() -> None:
            nonlocal calls
            kernel(grid, (args.block,), (cp.float32(a), x, y, cp.int64(n)))
            calls += 1
    else:
        if backend.name == "torch":
            x = backend.xp.randn(n, device=backend.device)
            y = backend.xp.randn(n, device=backend.device)
        else:
            rng = np.random.default_rng(0)
            x = rng.standard_normal(n, dtype=np.float32)
            y = rng.standard_normal(n, dtype=np.float32)
        impl = f"{backend} elementwise ops" + ("" if backend.is_gpu else " (no GPU: nothing for ncu to profile)")
        timer_backend = backend

        def step() -> None:
            nonlocal calls
            y.__iadd__(a * x)
            calls += 1
    y0 = y.copy() if cp is not None or backend.name != "torch" else y.clone()
    print(f"saxpy: n={n:,} with {impl}")
    with annotate("saxpy"):
        t = time_call(step, backend=timer_backend, warmup=1, repeats=args.repeats)
    expected = y0 + (a * calls) * x
    err = float(abs(y - expected).max()) / max(1.0, float(abs(expected).max()))
    moved = 12 * n  # read x and y, write y: three 4-byte floats per element
    print(f"time per launch: {t}")
    print(f"effective bandwidth: {moved / t.median / 1e9:.1f} GB/s (12 bytes per element, {calls} launches)")
    if not err < 1e-4:
        raise SystemExit(f"error: result is wrong (relative error {err:.3g} after {calls} launches)")
    print(f"result checked: relative error {err:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
