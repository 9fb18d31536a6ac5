#!/usr/bin/env python3
"""Occupancy limited by shared memory, changed with the block size: when more warps help, and when not.

The kernel is reverse_chunks in occupancy.cu: each block reverses one 8192-float chunk
through a 32 KiB shared-memory tile, so an SM holds only a few blocks whatever their
size, and the threads per block decide how many warps that is. This script launches it
with each --blocks size, on the same data, and times each (CUDA events, median), inside
an NVTX range named block_<size>. It also asks the CUDA occupancy calculator how many
blocks fit on an SM, the figure Nsight Compute's Occupancy section reports as
theoretical occupancy.

  ncu --section Occupancy --section LaunchStats --section WarpStateStats --section SpeedOfLight \
      -k regex:reverse_chunks -o occupancy python examples/nsight_compute/occupancy.py --warmup 0 --repeats 1

Without a GPU, NumPy reverses the chunks instead, and there is nothing to profile.
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

CU = Path(__file__).with_name("occupancy.cu")
CHUNK = 8192  # floats per block, as in occupancy.cu
WARPS_PER_SM = 64  # Hopper, Ampere A100: the hardware limit on resident warps


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=positive_int, default=None,
                   help="array size in MiB (a multiple of 32 KiB chunks; default: 1024 on a GPU, 16 on a CPU)")
    p.add_argument("--blocks", default="32,64,128,256,512,1024",
                   help="threads per block to try, comma-separated, each a multiple of 32 up to 1024 (default: %(default)s)")
    gk.add_bench_arguments(p)
    args = p.parse_args(argv)
    try:
        args.blocks = [int(b) for b in args.blocks.split(",") if b.strip()]
    except ValueError:
        p.error(f"--blocks must be whole numbers separated by commas, not {args.blocks!r}")
    bad = [b for b in args.blocks if b < 32 or b > 1024 or b % 32]
    if bad or not args.blocks:
        p.error(f"each block size must be a multiple of 32 between 32 and 1024 (got {bad or 'none'})")
    return args


def blocks_per_sm(cp, kernel, block: int) -> int | None:
    """Resident blocks per SM for ``kernel`` at ``block`` threads (CUDA's occupancy calculator), or None."""
    try:
        return int(cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, block, 0))
    except Exception:  # an older CuPy without the binding
        return None


def check_reversed(host_in: np.ndarray, out, chunks: list[int], cp) -> str:
    for c in chunks:
        got = cp.asnumpy(out[c * CHUNK:(c + 1) * CHUNK])
        if not np.array_equal(got, host_in[c * CHUNK:(c + 1) * CHUNK][::-1]):
            raise GpuprofError(f"wrong result: chunk {c} is not the reverse of its input.")
    return f"result checked: {len(chunks)} chunks equal NumPy's reversal"


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cp = None if args.cpu else gk.cupy_gpu()
    n = (args.mib or (1024 if cp is not None else 16)) * 2**20 // 4
    if n % CHUNK:
        raise GpuprofError(f"--mib {args.mib} is not a whole number of 32 KiB chunks.", "Use a whole number of MiB.")
    if cp is None:
        require_memory(2 * n * 4, "cpu", f"Two arrays of {n * 4 / 2**20:,.0f} MiB", "--mib")
        x = np.arange(n, dtype=np.float32)
        out = x.reshape(-1, CHUNK)[:, ::-1].reshape(-1)
        print(f"occupancy: no GPU here, so NumPy reverses {n // CHUNK} chunks instead (nothing for ncu to profile)")
        if not np.array_equal(out[:CHUNK], x[:CHUNK][::-1]):
            raise GpuprofError("wrong result from NumPy's reversal.")
        print("result checked: the first chunk equals its input reversed")
        gk.write_json(args.json, {"cpu": True, "n": n})
        return 0
    require_memory(2 * n * 4, "cuda", f"Two arrays of {n * 4 / 2**20:.0f} MiB", "--mib")
    kernel = gk.compile_kernels(CU, ["reverse_chunks"], cp)["reverse_chunks"]
    backend = Backend("cupy", "cuda", cp)
    x = cp.random.standard_normal(n, dtype=cp.float32)
    out = cp.empty_like(x)
    host_in = cp.asnumpy(x)
    chunks = gk.sample_rows(n // CHUNK)
    props = cp.cuda.runtime.getDeviceProperties(0)
    print(f"occupancy: reverse_chunks over {n * 4 / 2**20:.0f} MiB, {n // CHUNK} blocks of one 32 KiB chunk each, "
          f"on {props['multiProcessorCount']} SMs")
    results = []
    for block in args.blocks:
        fit = blocks_per_sm(cp, kernel, block)
        warps = None if fit is None else min(fit * block // 32, WARPS_PER_SM)
        extra = {"block": block, "blocks_per_sm": fit, "warps_per_sm": warps,
                 "theoretical_occupancy": None if warps is None else warps / WARPS_PER_SM}

        def launch(block=block) -> None:
            kernel((n // CHUNK,), (block,), (x, out))

        out.fill(cp.nan)
        label = f"{block} threads per block" + ("" if warps is None else f" ({warps} warps/SM)")
        results += gk.bench([gk.Variant(f"block_{block}", label, launch, 2 * x.nbytes, extra=extra,
                                        check=lambda: check_reversed(host_in, out, chunks, cp))],
                            backend, warmup=args.warmup, repeats=args.repeats)
    slowest = max(results, key=lambda r: r.median_ms)
    print()
    print(gk.format_results(results, slowest, "vs slowest"))
    gk.write_json(args.json, {"n": n, "bytes_per_launch": 2 * x.nbytes, "results": results,
                              "sm_count": int(props["multiProcessorCount"])})
    return 0


if __name__ == "__main__":
    sys.exit(main())
