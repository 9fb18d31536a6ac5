#!/usr/bin/env python3
"""A linear layer's BF16 product, one idea per rung, each checked against cuBLAS and timed beside it.

C = A @ W^T with A (M x K) and W (N x K) in BF16, row-major (W as nn.Linear keeps its
weight), accumulated and written in FP32. The rungs are kernels in matmul_ladder.cu,
compiled with -lineinfo (so that ncu's source page maps counters to lines):

  1  ladder_1_naive          one output per thread, every operand read from global memory
  2  ladder_2_smem           32 x 32 tiles of A and W staged in shared memory
  3  ladder_3_regtile        128 x 128 tiles, an 8 x 8 patch of C per thread, 16-byte loads
  4  ladder_4_conflict_free  rung 3 without shared-memory bank conflicts
  5  ladder_5_mma            tensor cores: mma.sync fed by ldmatrix (sm_80 and later)
  6  ladder_6_pipelined      rung 5 fed by a 4-stage cp.async pipeline
  7  ladder_7_wgmma_tma      Hopper: wgmma fed by TMA, a producer warpgroup and two
                             consumers (sm_90a: H100, H200)
  8  ladder_8_wgmma_overlap  rung 7 with one group of wgmma kept in flight (what rung 7's
                             source page pointed to)
  9  ladder_9_persistent     rung 8 in a persistent grid (one block per SM, each looping over
                             tiles), the tiles in grouped order (--group-m rows of tiles walk
                             along N together) so that A and W stay in L2
 10  ladder_10_cluster_multicast  rung 9 in clusters of two blocks (two tiles of one column)
                             that share each slice of W: each block loads half of it and the
                             TMA multicasts it into both (a third less L2 -> SM traffic)

Rung 10 as first run released its cross-block barrier arrivals at cluster scope: under ncu at
8192^3 it made about 80 more one-sector L2 requests per arrival than rung 9 made in all (the
H100 has 80 L2 slices) and ran at half of rung 9's speed. --arrive-scope cluster runs that
kernel (ladder_10_release_cluster) in rung 10's place, so one run shows the defect and its fix.

Rungs 9 and 10 are the next rungs of issue 39, written for the large shapes (8192^3 and up),
where that issue measured rung 8 at 64% of cuBLAS and below on an H100; the chapter's tables
and figures show rungs 1-8 (gpuprof.studies.matmul_ladder passes --rung 1,2,3,4,5,6,7,8). Their grid is sized from the GPU (SMs,
and for rung 10 the clusters that fit at once), and the check also runs them on a grid of
3 blocks (rung 10: 3 clusters, 6 blocks), so that every block loops over several tiles.

Every run first checks each rung on three shapes, two of them not a multiple of any tile,
against cuBLAS's FP32 product of the same BF16 values (CuPy's matmul, TF32 off), then times
the rungs and cuBLAS at --size, in one run: cuBLAS computing the same product (BF16 in,
FP32 out, cublasGemmEx) and, when PyTorch is installed, torch.matmul's BF16 product (BF16
out, what a bf16 nn.Linear runs), and prints each rung's share of both.

  ncu --set full --import-source yes -k regex:ladder_3 -o ladder3 \\
      python examples/nsight_compute/matmul_ladder.py --rung 3 --warmup 0 --repeats 1 --no-check

Without a CUDA GPU (or with --cpu) there is nothing to run: the rungs are CUDA kernels and
there is no CPU stand-in. The script then says so, with the GPU memory the asked-for product
would need, and exits with status 3.

Exit status: 0 the chosen rungs this GPU can run ran (and, without --no-check, passed their
check); 2 bad input or an error, said in one sentence; 3 nothing ran (no CUDA GPU here, or --cpu).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

import numpy as np  # noqa: E402

from gpuprof import Backend, exit_on_error  # noqa: E402
from gpuprof import kernels as gk  # noqa: E402
from gpuprof.cli import positive_int, require_memory  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

CU = Path(__file__).with_name("matmul_ladder.cu")


@dataclass(frozen=True)
class Rung:
    """One kernel of the ladder and what launching it takes."""

    kernel: str
    label: str
    block: tuple[int, ...]  # threads per block
    tile: tuple[int, int]  # (rows, columns) of C per block
    multiple: int = 1  # K and N must be multiples of this (16-byte loads of 8 values)
    dynamic_smem: int = 0  # bytes of dynamic shared memory per block
    min_cc: int = 0  # compute capability it needs, e.g. 80 for mma.sync
    tensor_maps: bool = False  # launched with TMA tensor maps instead of A and W's addresses
    persistent: bool = False  # a grid sized from the GPU, each block looping over tiles in grouped order
    cluster: int = 1  # blocks per cluster (the .cu fixes it with __cluster_dims__); W's box is tile[1] / cluster


RUNGS = {
    1: Rung("ladder_1_naive", "1 naive, one output per thread", (16, 16), (16, 16)),
    2: Rung("ladder_2_smem", "2 shared-memory tiles", (32, 32), (32, 32)),
    3: Rung("ladder_3_regtile", "3 register tiles, 16-byte loads", (256,), (128, 128), 8),
    4: Rung("ladder_4_conflict_free", "4 no bank conflicts", (256,), (128, 128), 8),
    5: Rung("ladder_5_mma", "5 tensor cores: mma.sync + ldmatrix", (256,), (128, 128), 8, min_cc=80),
    6: Rung("ladder_6_pipelined", "6 cp.async pipeline, 4 stages", (256,), (128, 128), 8,
            dynamic_smem=4 * 256 * 40 * 2, min_cc=80),
    7: Rung("ladder_7_wgmma_tma", "7 wgmma + TMA, warp-specialised", (384,), (128, 256), 8,
            dynamic_smem=4 * (128 + 256) * 64 * 2 + 1024, min_cc=90, tensor_maps=True),
    8: Rung("ladder_8_wgmma_overlap", "8 rung 7, one wgmma group in flight", (384,), (128, 256), 8,
            dynamic_smem=4 * (128 + 256) * 64 * 2 + 1024, min_cc=90, tensor_maps=True),
    9: Rung("ladder_9_persistent", "9 rung 8, persistent, grouped tile order", (384,), (128, 256), 8,
            dynamic_smem=4 * (128 + 256) * 64 * 2 + 1024, min_cc=90, tensor_maps=True, persistent=True),
    10: Rung("ladder_10_cluster_multicast", "10 rung 9, 2-block clusters, W multicast", (384,), (128, 256), 8,
             dynamic_smem=4 * (128 + 256) * 64 * 2 + 1024, min_cc=90, tensor_maps=True, persistent=True, cluster=2),
}
# Rung 10 as first run: its consumers' arrivals on both blocks' empty barriers released at cluster scope.
RUNG10_RELEASE_CLUSTER = dataclasses.replace(RUNGS[10], kernel="ladder_10_release_cluster",
                                             label="10 as first run, arrivals released at cluster scope")
MAX_REPEATS = 100_000  # --min-time-s never asks for more timed launches of one kernel than this
GROUP_M = 16  # rows of tiles that walk along N together (rungs 9-10); see tile_order
SMALL_GRID = 3  # the check also runs the persistent rungs on this many blocks (rung 10: clusters), looping over tiles
CHECK_SHAPES = [(512, 512, 512), (1000, 1000, 1000), (777, 520, 264)]  # (M, N, K); the last two fit no tile
TOLERANCE = 1e-3  # largest difference over the largest value of cuBLAS's FP32 product of the same inputs


INT_LIMIT = 2**31  # the kernels take M, N and K as 32-bit ints
NOTHING_RAN = 3  # the exit status when no rung ran


def tile_order(tiles_m: int, tiles_n: int, group_m: int = GROUP_M) -> list[tuple[int, int]]:
    """The grouped order in which rungs 9 and 10 take tiles: (tile row, tile column) of tile t.

    The same arithmetic as ``grouped_tile`` in matmul_ladder.cu (the test suite compiles that
    function for the CPU and compares). Groups of ``group_m`` rows of tiles (the last group
    may have fewer) come one after the other; inside a group t runs down the rows first, then
    to the next column. So any ``group_m`` x c consecutive tiles use only ``group_m`` rows of
    tiles of A and c columns of tiles of W: with one block per SM, the tiles in flight at once
    share their slices of A and W in L2 instead of each row of blocks streaming all of W.
    """
    if min(tiles_m, tiles_n, group_m) < 1:
        raise ValueError(f"tile counts and group_m must be positive, not {tiles_m}, {tiles_n}, {group_m}")
    order = []
    for t in range(tiles_m * tiles_n):
        group, in_group = divmod(t, group_m * tiles_n)
        first = group * group_m
        rows = min(tiles_m - first, group_m)
        order.append((first + in_group % rows, in_group // rows))
    return order


def unit_grid(rung: int, m: int, n: int) -> tuple[int, int]:
    """Rows and columns of a persistent rung's units of work: tiles (rung 9) or a cluster's
    ``cluster`` tiles of one column (rung 10: rows 2p and 2p + 1 of tiles)."""
    spec = RUNGS[rung]
    tiles_m, tiles_n = -(-m // spec.tile[0]), -(-n // spec.tile[1])
    return -(-tiles_m // spec.cluster), tiles_n


def block_tiles(rung: int, m: int, n: int, clusters: int, group_m: int = GROUP_M) -> list[list[tuple[int, int]]]:
    """What each block of a persistent rung stores, in order: block b's list of (tile row, tile
    column). ``clusters`` is the grid in clusters (rung 9: in blocks); cluster c takes units c,
    c + clusters, ... of the grouped order over units, and its block r the unit's tile r."""
    spec = RUNGS[rung]
    rows, cols = unit_grid(rung, m, n)
    order = tile_order(rows, cols, max(1, group_m // spec.cluster))
    tiles_m = -(-m // spec.tile[0])
    out: list[list[tuple[int, int]]] = []
    for c in range(clusters):
        for r in range(spec.cluster):
            out.append([(um * spec.cluster + r, tn) for um, tn in order[c::clusters] if um * spec.cluster + r < tiles_m])
    return out


def shape(text: str) -> tuple[int, int, int]:
    """M,N,K (or one number for a square product); each under 2**31, since the kernels take them as ints."""
    parts = [p for p in text.replace("x", ",").split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected M,N,K or one number, not {text!r}") from None
    if len(values) == 1:
        values *= 3
    if len(values) != 3 or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected three positive sizes M,N,K (or one), not {text!r}")
    if max(values) >= INT_LIMIT:
        raise argparse.ArgumentTypeError(f"each of M, N and K must be under {INT_LIMIT:,} (the kernels take them as "
                                         f"32-bit ints), not {max(values):,}")
    return values[0], values[1], values[2]


def product_bytes(m: int, n: int, k: int) -> int:
    """GPU memory the timed product holds: A and W in BF16 (and their FP32 sources while made), C in FP32 twice."""
    return 2 * (m * k + k * n) * 2 + 2 * m * n * 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rung", default="all", help=f"rungs to run: 'all' or a comma-separated subset of {sorted(RUNGS)}")
    p.add_argument("--size", type=shape, default=(4096, 4096, 4096), metavar="M,N,K",
                   help="the timed product's shape (default: 4096,4096,4096)")
    p.add_argument("--no-check", action="store_true", help="skip the three-shape check (under ncu: one launch per rung)")
    p.add_argument("--no-cublas", action="store_true", help="time the rungs only (under ncu: no library kernels)")
    p.add_argument("--group-m", type=positive_int, default=GROUP_M, metavar="G",
                   help=f"rungs 9-10: rows of tiles that walk along N together (default: {GROUP_M}; 1 is row by row)")
    p.add_argument("--arrive-scope", choices=("cta", "cluster"), default="cta",
                   help="rung 10's cross-block arrivals: cta (default, the fixed rung) or cluster (rung 10 as first "
                        "run, kernel ladder_10_release_cluster)")
    p.add_argument("--min-time-s", type=float, default=0.0, metavar="S",
                   help="time each kernel for at least S seconds (more repeats than --repeats where needed, so that "
                        "the clocks read during its runs are its own; default: 0, off)")
    p.add_argument("--clocks", action="store_true",
                   help="read the SM clock, power and clock-event reasons from NVML during each kernel's timed runs "
                        "(results' extra.nvml), so that each rate can be stated per cycle")
    gk.add_bench_arguments(p, cpu_help="run nothing even where a GPU is available (there is no CPU stand-in: "
                                       "see the exit status below)")
    args = p.parse_args(argv)
    if not math.isfinite(args.min_time_s) or not 0 <= args.min_time_s <= 60:
        p.error(f"--min-time-s takes 0 to 60 seconds, not {args.min_time_s}")
    try:
        args.rungs = sorted(RUNGS) if args.rung == "all" else sorted({int(r) for r in args.rung.split(",") if r.strip()})
    except ValueError:
        p.error(f"--rung takes 'all' or numbers such as 1,3, not {args.rung!r}")
    bad = [r for r in args.rungs if r not in RUNGS]
    if bad or not args.rungs:
        p.error(f"no rung {bad[0] if bad else '(none given)'}; the rungs are {sorted(RUNGS)}")
    return args


def grid_for(rung: int, m: int, n: int) -> tuple[int, int]:
    tile_m, tile_n = RUNGS[rung].tile
    return (-(-n // tile_n), -(-m // tile_m))


def fits(rung: int, m: int, n: int, k: int) -> str | None:
    """Why ``rung`` cannot take this shape, or None (rungs 3-7 load 8 values at a time: K and N multiples of 8)."""
    step = RUNGS[rung].multiple
    if step > 1 and (k % step or n % step):
        return f"rung {rung} loads 8 values at a time: K and N must be multiples of {step} (got N={n}, K={k})"
    if RUNGS[rung].persistent:
        rows, cols = unit_grid(rung, m, n)
        if rows * cols >= INT_LIMIT:
            return f"rung {rung} numbers its {rows * cols:,} units of work with 32-bit ints"
        return None
    rows = grid_for(rung, m, n)[1]
    if rows > 65535:  # CUDA's limit on gridDim.y, which counts the tiles down M
        return (f"rung {rung} covers M with {rows:,} rows of tiles, more than CUDA's 65,535 for a grid's y dimension "
                f"(M={m:,} over tiles of {RUNGS[rung].tile[0]})")
    return None


def runnable(rungs: list[int], cc: int) -> tuple[list[int], list[str]]:
    """The rungs this GPU (compute capability ``cc``, e.g. 90) can run, and why the others cannot."""
    ok, why = [], []
    for r in rungs:
        need = RUNGS[r].min_cc
        if cc < need:
            why.append(f"rung {r} needs compute capability {need // 10}.{need % 10} or newer (this GPU: {cc // 10}.{cc % 10})")
        elif RUNGS[r].tensor_maps and cc != 90:
            why.append(f"rung {r} uses Hopper's wgmma (sm_90a), which runs on H100/H200-class GPUs only")
        else:
            ok.append(r)
    return ok, why


def make_inputs(cp, m: int, n: int, k: int, seed: int):  # type: ignore[no-untyped-def]
    """A and W as BF16 bit patterns, and the FP32 values they hold."""
    rng = cp.random.default_rng(seed)
    a = gk.bf16_bits(rng.standard_normal((m, k), dtype=cp.float32), cp)
    w = gk.bf16_bits(rng.standard_normal((n, k), dtype=cp.float32), cp)
    return a, w, gk.bf16_to_f32(a, cp), gk.bf16_to_f32(w, cp)


def tensor_map(cp, x, rows: int, k: int, box_rows: int):  # type: ignore[no-untyped-def]
    """A TMA tensor map for a K-contiguous BF16 matrix (rows x k) in boxes of 64 x ``box_rows``,
    128-byte swizzle, zeros past the edges; made by the driver's cuTensorMapEncodeTiled and
    copied to GPU memory (rung 7 reads it from there)."""
    import ctypes

    lib = ctypes.CDLL("libcuda.so.1")
    buf = (ctypes.c_uint64 * 24)()  # 192 bytes: room to align a 128-byte map to 64 bytes
    base = (ctypes.addressof(buf) + 63) // 64 * 64
    dims = (ctypes.c_uint64 * 2)(k, rows)
    strides = (ctypes.c_uint64 * 1)(k * 2)  # bytes between rows; must be a multiple of 16
    box = (ctypes.c_uint32 * 2)(64, box_rows)
    elem = (ctypes.c_uint32 * 2)(1, 1)
    BFLOAT16, INTERLEAVE_NONE, SWIZZLE_128B, L2_256B, OOB_ZERO = 9, 0, 3, 3, 0  # cuda.h's enums
    rc = lib.cuTensorMapEncodeTiled(ctypes.c_void_p(base), BFLOAT16, 2, ctypes.c_void_p(x.data.ptr), dims, strides,
                                    box, elem, INTERLEAVE_NONE, SWIZZLE_128B, L2_256B, OOB_ZERO)
    if rc != 0:
        raise GpuprofError(f"cuTensorMapEncodeTiled failed (CUresult {rc}) for a {rows} x {k} matrix.",
                           "K must be a multiple of 8 and the matrix 16-byte aligned.")
    raw = np.frombuffer(ctypes.string_at(base, 128), dtype=np.uint64)
    return cp.asarray(raw)


def max_active_clusters(kernel, rung: int) -> int | None:  # type: ignore[no-untyped-def]
    """How many clusters of ``rung``'s kernel fit on the GPU at once (the driver's
    cuOccupancyMaxActiveClusters), or None where the driver cannot say. A persistent grid of
    more clusters than fit would run the extra ones after the others: a second, mostly empty wave."""
    import ctypes

    class LaunchConfig(ctypes.Structure):  # cuda.h's CUlaunchConfig
        _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                    ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]

    spec = RUNGS[rung]
    config = LaunchConfig((ctypes.c_uint * 3)(spec.cluster * 64, 1, 1), (ctypes.c_uint * 3)(spec.block[0], 1, 1),
                          spec.dynamic_smem, None, None, 0)
    count = ctypes.c_int(0)
    try:
        # CuPy's RawKernel keeps the driver's CUfunction in .kernel.ptr (a bare Function has .ptr). The first H100
        # run fell back to SMs / 2, most likely because it asked the RawKernel for .ptr (ncu: 66 clusters fit)
        function = getattr(kernel, "kernel", kernel)
        rc = ctypes.CDLL("libcuda.so.1").cuOccupancyMaxActiveClusters(ctypes.byref(count),
                                                                      ctypes.c_void_p(function.ptr), ctypes.byref(config))
    except (OSError, AttributeError):
        return None
    return count.value if rc == 0 and count.value > 0 else None


class Launcher:
    """Launches one rung on given A, W and C (building rungs 7-10's tensor maps once per set of inputs).

    Persistent rungs (9, 10) get a grid sized from the GPU: one block per SM (rung 9) or as many
    clusters as fit at once (rung 10), never more than there are units of work; ``grid``
    overrides it (in clusters) and ``group_m`` sets the tile order's group."""

    def __init__(self, cp, kernels: dict, group_m: int = GROUP_M,  # type: ignore[no-untyped-def]
                 rungs: dict[int, Rung] | None = None) -> None:
        self.cp, self.kernels, self.group_m = cp, kernels, group_m
        self.rungs = rungs or RUNGS  # RUNGS, or with rung 10 as first run in its place
        self._maps: dict[tuple, tuple] = {}
        self.sms = int(cp.cuda.Device().attributes["MultiProcessorCount"])
        self.clusters: dict[int, int] = {}  # per persistent rung: clusters (rung 9: blocks) resident at once
        for r, spec in self.rungs.items():
            if spec.persistent and spec.kernel in kernels:
                fit = max_active_clusters(kernels[spec.kernel], r) if spec.cluster > 1 else None
                if spec.cluster > 1 and fit is None:
                    print(f"  (the driver did not say how many clusters of rung {r} fit at once: assuming "
                          f"{self.sms // spec.cluster}, the SMs over {spec.cluster})")
                self.clusters[r] = fit or self.sms // spec.cluster

    def grid(self, rung: int, m: int, n: int) -> int:
        """Clusters (rung 9: blocks) a persistent rung launches at this shape."""
        rows, cols = unit_grid(rung, m, n)
        return min(rows * cols, self.clusters[rung])

    def __call__(self, rung: int, a, w, c, m: int, n: int, k: int,  # type: ignore[no-untyped-def]
                 grid: int | None = None) -> None:
        spec = self.rungs[rung]
        if spec.tensor_maps:
            key = (a.data.ptr, w.data.ptr, m, n, k, spec.cluster)
            if key not in self._maps:
                self._maps[key] = (tensor_map(self.cp, a, m, k, spec.tile[0]),
                                   tensor_map(self.cp, w, n, k, spec.tile[1] // spec.cluster))
            first, second = self._maps[key]
        else:
            first, second = a, w
        args = (first, second, c, np.int32(m), np.int32(n), np.int32(k))
        if spec.persistent:
            blocks = (grid or self.grid(rung, m, n)) * spec.cluster
            self.kernels[spec.kernel]((blocks,), spec.block, args + (np.int32(self.group_m),), shared_mem=spec.dynamic_smem)
        else:
            self.kernels[spec.kernel](grid_for(rung, m, n), spec.block, args, shared_mem=spec.dynamic_smem)


def check_rungs(cp, launch: Launcher, rungs: list[int]) -> list[dict]:  # type: ignore[no-untyped-def]
    """Each rung on each check shape against cuBLAS's FP32 product of the same BF16 values."""
    rows = []
    for m, n, k in CHECK_SHAPES:
        a, w, a32, w32 = make_inputs(cp, m, n, k, seed=m + n + k)
        want = cp.matmul(a32, w32.T)  # cuBLAS SGEMM (CuPy leaves TF32 off unless CUPY_TF32=1)
        scale = float(cp.abs(want).max())
        for rung in rungs:
            why = fits(rung, m, n, k)
            if why:
                rows.append({"rung": rung, "shape": [m, n, k], "skipped": why})
                continue
            # a persistent rung twice: on its own grid, and on SMALL_GRID clusters, each looping over tiles
            for grid in ([None, SMALL_GRID] if RUNGS[rung].persistent else [None]):
                c = cp.full((m, n), cp.nan, dtype=cp.float32)
                launch(rung, a, w, c, m, n, k, grid=grid)
                err = float(cp.abs(c - want).max()) / scale
                ok = bool(err <= TOLERANCE)  # a NaN (an element never written) fails too
                row = {"rung": rung, "shape": [m, n, k], "relative_error": err, "ok": ok}
                where = ""
                if RUNGS[rung].persistent:
                    row["grid_blocks"] = (grid or launch.grid(rung, m, n)) * RUNGS[rung].cluster
                    where = f" on {row['grid_blocks']} blocks"
                rows.append(row)
                print(f"  check rung {rung} on {m} x {n} x {k}{where}: largest difference {err:.1e} of the largest "
                      f"value ({'within' if ok else 'OVER'} {TOLERANCE:.0e})")
    failed = [r for r in rows if r.get("ok") is False]
    if failed:
        raise GpuprofError(f"{len(failed)} rung/shape check(s) failed: "
                           + ", ".join(f"rung {r['rung']} at {r['shape']}" for r in failed) + ".",
                           "A rung that writes wrong results is not timed; see the lines above.")
    return rows


def cublas_fp32_out(cp, a, w, c, m: int, n: int, k: int):  # type: ignore[no-untyped-def]
    """A launcher for cuBLAS's own C = A W^T, BF16 in, FP32 accumulate and out (cublasGemmEx).

    cuBLAS is column-major: our row-major C (M x N) is its N x M matrix W A^T, with W read
    transposed (op T on a K x N column-major matrix) and A as it is."""
    try:
        from cupy_backends.cuda.libs import cublas
    except ImportError:  # older CuPy
        from cupy.cuda import cublas  # type: ignore[no-redef]

    handle = cp.cuda.device.get_cublas_handle()
    one, zero = np.array(1.0, np.float32), np.array(0.0, np.float32)
    R_16BF, R_32F, COMPUTE_32F, GEMM_DEFAULT = 14, 0, 68, -1  # cudaDataType / cublasComputeType_t values

    def launch() -> None:
        cublas.gemmEx(handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, n, m, k, one.ctypes.data, w.data.ptr, R_16BF, k,
                      a.data.ptr, R_16BF, k, zero.ctypes.data, c.data.ptr, R_32F, n, COMPUTE_32F, GEMM_DEFAULT)

    return launch


def repeats_for(seconds_per_launch: float, min_time_s: float, repeats: int) -> int:
    """Timed launches that fill ``min_time_s`` at ``seconds_per_launch`` (never fewer than ``repeats``, never
    more than MAX_REPEATS)."""
    if min_time_s <= 0:
        return repeats
    return max(repeats, min(MAX_REPEATS, math.ceil(min_time_s / max(seconds_per_launch, 1e-7))))


def time_variants(variants: list, backend: Backend, args: argparse.Namespace, cp) -> list:  # type: ignore[no-untyped-def]
    """Time each kernel as gk.bench does, one at a time: with --min-time-s, after a few probe launches, enough
    repeats to fill that time (wall time, the timing loop's own cost per launch included); with --clocks, NVML's SM clock, power and event reasons during its window
    (extra.nvml), read by a sampler thread (gpuprof.nvml)."""
    from gpuprof.nvml import Nvml, Sampler, describe_window
    from gpuprof.timing import time_call

    nvml = None
    if args.clocks:
        nvml, why = Nvml.open(pci_bus_id=getattr(cp.cuda.Device(), "pci_bus_id", None))
        if nvml is None:
            print(f"  (--clocks: {why}; no clocks recorded)")
    sampler = Sampler(nvml) if nvml else None
    results = []
    try:
        if sampler:
            sampler.__enter__()
        for v in variants:
            repeats = args.repeats
            if args.min_time_s > 0:
                # per launch as the timing loop spends it: one event pair and a wait each, so a kernel of
                # tens of microseconds costs more than its own time (first-call costs go to the untimed launch)
                time_call(v.launch, backend=backend, warmup=1, repeats=1)
                start = time.perf_counter()
                probe = time_call(v.launch, backend=backend, warmup=0, repeats=3).median
                per_launch = max(probe, (time.perf_counter() - start) / 3)
                repeats = repeats_for(per_launch, args.min_time_s, args.repeats)
            t0 = time.monotonic()
            [r] = gk.bench([v], backend, warmup=args.warmup, repeats=repeats)
            t1 = time.monotonic()
            r.extra["repeats"] = repeats
            if sampler:
                r.extra["nvml"] = nv = sampler.summary(t0, t1)
                if nv["sm_mhz_median"]:
                    print(f"    during it: {describe_window(nv)}")
            results.append(r)
    finally:
        if sampler:
            sampler.__exit__(None, None, None)
    return results


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    m, n, k = args.size
    cp = None if args.cpu else gk.cupy_gpu()
    if cp is None:
        print(f"matmul_ladder: no CUDA GPU here (or --cpu): the rungs are CUDA kernels and there is nothing to run "
              f"without one (the {m} x {n} x {k} product would need {product_bytes(m, n, k) / 2**30:,.2f} GiB of GPU "
              "memory). On a GPU machine: python examples/nsight_compute/matmul_ladder.py")
        gk.write_json(args.json, {"cpu": True, "ran": False})
        return NOTHING_RAN
    for rung in args.rungs:
        why = fits(rung, m, n, k)
        if why:
            raise GpuprofError(why + ".", "Choose another --size or leave this rung out with --rung.")
    cc = int(cp.cuda.Device().compute_capability)
    rungs, skipped = runnable(args.rungs, cc)
    for line in skipped:
        print(f"  skipped: {line}")
    if not rungs:
        raise GpuprofError("none of the chosen rungs runs on this GPU.", "Choose others with --rung.")
    require_memory(product_bytes(m, n, k), "cuda", f"A {m} x {n} x {k} product's inputs and outputs",
                   "--size")
    table = {**RUNGS, **({10: RUNG10_RELEASE_CLUSTER} if args.arrive_scope == "cluster" else {})}
    kernels = gk.compile_kernels(CU, [table[r].kernel for r in rungs], cp, arch="sm_90a" if cc == 90 else None,
                                 max_dynamic_shared={table[r].kernel: table[r].dynamic_smem for r in rungs})
    launch = Launcher(cp, kernels, args.group_m, table)
    print(f"matmul_ladder: C = A W^T, {m} x {n} x {k}, BF16 in, FP32 accumulate and out, "
          f"{2 * m * n * k / 1e9:,.0f} GFLOP per product")
    checks = [] if args.no_check else check_rungs(cp, launch, rungs)
    a, w, _, _ = make_inputs(cp, m, n, k, seed=0)
    c = cp.empty((m, n), dtype=cp.float32)
    backend = Backend("cupy", "cuda", cp)
    flops = 2 * m * n * k
    variants = [gk.Variant(table[r].kernel, table[r].label, lambda r=r: launch(r, a, w, c, m, n, k), flops,
                           unit="TFLOP/s", extra={"rung": r, **({"grid_blocks": launch.grid(r, m, n) * table[r].cluster,
                                                                 "group_m": args.group_m} if table[r].persistent else {})})
                for r in rungs]
    if not args.no_cublas:
        try:
            gemm = cublas_fp32_out(cp, a, w, c, m, n, k)
            gemm()  # a failure here is one line, not a lost run
            variants.append(gk.Variant("cublas_fp32_out", "cuBLAS, same product (FP32 out)", gemm, flops,
                                       unit="TFLOP/s"))
        except Exception as exc:  # noqa: BLE001 - CuPy raises its own error types from several modules
            print(f"  (cuBLAS's cublasGemmEx through CuPy did not run here: {exc}; no same-product row)")
        try:
            import torch

            if torch.cuda.is_available():
                ta, tw = (torch.from_dlpack(x).view(torch.bfloat16) for x in (a, w))
                variants.append(gk.Variant("cublas_bf16_out", "cuBLAS via torch.matmul (BF16 out)",
                                           lambda: torch.matmul(ta, tw.T), flops, unit="TFLOP/s"))
        except ImportError:
            print("  (no CUDA build of PyTorch here: no torch.matmul row)")
    results = time_variants(variants, backend, args, cp)
    print()
    print(gk.format_results(results, results[0], f"vs rung {rungs[0]}"))
    refs = [r for r in results if r.name.startswith("cublas")]
    for r in results:
        if r not in refs and refs:
            print(f"  {r.label:<44} " + "   ".join(f"{r.rate / ref.rate:6.1%} of {ref.label}" for ref in refs))
    gk.write_json(args.json, {"size": [m, n, k], "flops_per_product": flops, "checks": checks, "results": results,
                              "tolerance": TOLERANCE, "skipped": skipped})
    return 0


if __name__ == "__main__":
    sys.exit(main())
