#!/usr/bin/env python3
"""One matrix product on CUDA cores (FP32) and on tensor cores (TF32, BF16): hand-written, then cuBLAS.

C = A @ B for n x n matrices. The hand-written kernels are in matmul.cu and share one
tiling plan; they differ in which units do the multiply-adds:

  sgemm_simt       FP32 on CUDA cores (FFMA instructions)
  gemm_wmma_tf32   tensor cores, inputs rounded to TF32, FP32 accumulation
  gemm_wmma_bf16   tensor cores, BF16 inputs, FP32 accumulation

For comparison, cuBLAS (through PyTorch, when it is installed) computes the same
products in FP32 (TF32 off), TF32 and BF16. Each is timed with CUDA events (median)
inside an NVTX range of its name, and sampled rows of C are checked against NumPy.

  ncu --section SpeedOfLight --section ComputeWorkloadAnalysis -k regex:"gemm|sgemm|nvjet|xmma" \
      -o matmul python examples/nsight_compute/matmul.py --warmup 0 --repeats 1

Without a GPU, NumPy computes a small product instead, and there is nothing to profile.
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

CU = Path(__file__).with_name("matmul.cu")
KERNELS = {  # name: (label, input precision, relative tolerance against NumPy on the same inputs)
    "sgemm_simt": ("FP32, CUDA cores (hand-written)", "fp32", 1e-4),
    "gemm_wmma_tf32": ("TF32, tensor cores (hand-written)", "tf32", 5e-3),
    "gemm_wmma_bf16": ("BF16, tensor cores (hand-written)", "bf16", 1e-4),
    "cublas_fp32": ("FP32, cuBLAS (TF32 off)", "fp32", 1e-4),
    "cublas_tf32": ("TF32, cuBLAS", "tf32", 5e-3),
    "cublas_bf16": ("BF16, cuBLAS (BF16 output)", "bf16", 1e-2),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=positive_int, default=None,
                   help="matrix size, a multiple of 64 (default: 4096 on a GPU, 256 on a CPU)")
    p.add_argument("--kernels", default="all", help=f"comma-separated subset of {', '.join(KERNELS)} (default: all)")
    gk.add_bench_arguments(p)
    args = p.parse_args(argv)
    if args.n is not None and args.n % 64:
        p.error(f"--n must be a multiple of 64 (the tile size), not {args.n}")
    args.kernels = gk.choose_kernels(p, args.kernels, list(KERNELS))
    return args


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """Largest difference over the largest value of the exact product: one scale for every row."""
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


def run_cpu(n: int, json_path: Path | None) -> None:
    import time

    # float32 A, B and C, their float64 copies and product for the check, and its difference: checked before any work
    require_memory(52 * n * n, "cpu", f"A {n:,} x {n:,} product in NumPy (and its float64 check)", "--n", lower_bound=True)
    print(f"matmul: no GPU here, so NumPy multiplies two {n} x {n} matrices instead (nothing for ncu to profile)")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    t0 = time.perf_counter()
    c = a @ b
    seconds = time.perf_counter() - t0
    err = relative_error(c, a.astype(np.float64) @ b.astype(np.float64))
    if err > 1e-4:
        raise GpuprofError(f"wrong result: relative error {err:.1e}.")
    print(f"  NumPy float32 matmul: {seconds * 1e3:.2f} ms, {2 * n**3 / seconds / 1e12:.3f} TFLOP/s")
    print(f"result checked: relative error {err:.1e} against float64")
    gk.write_json(json_path, {"cpu": True, "n": n})


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cp = None if args.cpu else gk.cupy_gpu()
    if cp is None:
        run_cpu(args.n or 256, args.json)
        return 0
    n = args.n or 4096
    require_memory(9 * n * n * 4, "cuda", f"Three {n} x {n} products' inputs and outputs", "--n")
    backend = Backend("cupy", "cuda", cp)
    hand = [k for k in args.kernels if not k.startswith("cublas")]
    kernels = gk.compile_kernels(CU, hand, cp) if hand else {}
    torch = None
    if any(k.startswith("cublas") for k in args.kernels):
        try:
            import torch  # noqa: F811

            if not torch.cuda.is_available():
                torch = None
        except ImportError:
            torch = None
        if torch is None:
            print("  (no CUDA build of PyTorch here: the cuBLAS rows are left out)")
    a = cp.random.standard_normal((n, n), dtype=cp.float32)
    b = cp.random.standard_normal((n, n), dtype=cp.float32)
    a16, b16 = gk.bf16_bits(a, cp), gk.bf16_bits(b, cp)
    c = cp.empty((n, n), dtype=cp.float32)
    rows = gk.sample_rows(n)
    host = {"fp32": (cp.asnumpy(a)[rows].astype(np.float64), cp.asnumpy(b).astype(np.float64))}
    host["tf32"] = host["fp32"]  # TF32 is judged against the exact product, with a tolerance for its rounding
    host["bf16"] = (cp.asnumpy(gk.bf16_to_f32(a16, cp))[rows].astype(np.float64), cp.asnumpy(gk.bf16_to_f32(b16, cp)).astype(np.float64))
    exact = {p: x @ y for p, (x, y) in host.items()}
    grid, block = (n // 64, n // 64), {"sgemm_simt": (256,), "gemm_wmma_tf32": (128,), "gemm_wmma_bf16": (128,)}
    print(f"matmul: {n} x {n} x {n}, {2 * n**3 / 1e9:.0f} GFLOP per product")
    variants = []
    for name in args.kernels:
        label, precision, tol = KERNELS[name]
        out = {"c": c}
        if name in kernels:
            inputs = (a16, b16) if precision == "bf16" else (a, b)

            def launch(k=kernels[name], name=name, inputs=inputs) -> None:
                k(grid, block[name], (*inputs, c, np.int32(n)))
        elif torch is not None:
            ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
            if precision == "bf16":
                ta, tb = torch.from_dlpack(a16).view(torch.bfloat16), torch.from_dlpack(b16).view(torch.bfloat16)

            def launch(ta=ta, tb=tb, precision=precision, out=out) -> None:
                torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
                out["c"] = torch.matmul(ta, tb)
        else:
            continue

        def check(precision=precision, tol=tol, out=out) -> str:
            res = out["c"]
            got = cp.asnumpy(res[rows]) if isinstance(res, cp.ndarray) else res[rows].float().cpu().numpy()
            err = relative_error(got, exact[precision])
            if err > tol:
                raise GpuprofError(f"wrong result: relative error {err:.1e} (more than {tol:.0e}).")
            return f"result checked: {len(rows)} rows within {err:.0e} of NumPy"

        variants.append(gk.Variant(name, label, launch, 2 * n**3, unit="TFLOP/s", check=check,
                                   extra={"precision": precision}))
    results = []
    for v in variants:
        c.fill(cp.nan)
        results += gk.bench([v], backend, warmup=args.warmup, repeats=args.repeats)
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
    simt = next((r for r in results if r.name == "sgemm_simt"), None)
    print()
    print(gk.format_results(results, None))
    if simt:
        for r in results:
            print(f"  {r.label:<36} {r.rate / simt.rate:6.1f}x the hand-written FP32 kernel")
    gk.write_json(args.json, {"n": n, "flops_per_product": 2 * n**3, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
