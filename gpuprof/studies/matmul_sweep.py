"""The matmul ladder's shape sweep (issue 39): each rung's share of cuBLAS per shape, the least favourable
of several processes, per second and per cycle, with the SM clock and power each kernel ran at.

``examples/nsight_compute/matmul_ladder_sweep.py`` writes one JSON file: ``runs``, each one process
of ``matmul_ladder.py`` at one shape (``shape``, ``process``, ``results`` with ``extra.nvml`` when
the clocks were read). This module turns it into the chapter's table and figure:

* :func:`sweep_table`: one row per (shape, kernel): time and rate (median and lowest over the
  processes), the share of cuBLAS's same product and of torch.matmul's BF16 product (each a ratio
  taken within one process, then the median and the least favourable process), FLOP per SM-clock
  cycle (the rate over the clock NVML read during that kernel's own timed runs), clock, power and
  the clock-event reasons seen;
* :func:`share_table`: the table the chapter prints, shapes by rungs; :func:`best_rungs`: per shape,
  the best rung and its least favourable share, against issue 39's 90% target;
* :func:`figure`: the shares per shape and rung beside the clocks and power;
* :func:`from_ladder_runs`: single ``matmul_ladder.py --json`` files (one process per shape, as the
  first H100 run of rungs 9-10 made them) read as a sweep;
* :func:`l2_request_sources`, :func:`cluster_arrives`, :func:`l2_instances`: the ncu counters that showed
  rung 10's defect (L2 requests that neither the SMs' loads nor the L2 fabric made, per cluster-scope arrive
  on a stage barrier; half of those arrives are on the block's own barrier), and how many L2 slices ncu's
  ``lts__`` counters add up over (which is not always ``device__attribute_l2s_count``);
* :func:`against_cublas`, :func:`tile_of`, :func:`padded_work`: rungs 9-10 and cuBLAS in one ncu report, per
  cycle: how busy each kept the tensor pipe, and how much of its tensor work was the product's (a tile that
  does not divide the matrix computes past its edge).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from ..artifacts import REPO_ROOT, FoundCapture, find_capture, save_json
from ..ncu import report as nr
from ..ncu.plots import PIPES, stall_metric

__all__ = ["run_sweep", "SWEEP_SCRIPT", "REFERENCE", "TORCH", "TARGET", "sweep_table", "share_table", "best_rungs", "figure",
           "from_ladder_runs", "shape_name", "l2_request_sources", "cluster_arrives", "l2_instances",
           "LADDER_TILE", "tile_of", "padded_work", "against_cublas"]

SWEEP_SCRIPT = REPO_ROOT / "examples" / "nsight_compute" / "matmul_ladder_sweep.py"
REFERENCE = "cublas_fp32_out"  # cuBLAS computing the same product: BF16 in, FP32 accumulate and out
TORCH = "cublas_bf16_out"  # torch.matmul's BF16 product (BF16 out)
TARGET = 0.90  # issue 39: the best rung at least 90% of cuBLAS's same product, least favourable process
TENSOR_PIPE = PIPES["tensor HMMA (mma.sync + wgmma)"]


def run_sweep(chapter: str, filename: str = "sweep.json", *, timeout_s: float = 560) -> FoundCapture:
    """The sweep on this machine's GPU into ``<chapter>/<filename>`` (about 6 minutes on an H100: the
    script's ``--plan`` prints its estimate); without a GPU, the course's reference."""
    import subprocess
    import sys
    import tempfile

    from ..backend import describe_machine
    from ..errors import GpuprofError
    from ..runner import python_target, shell_line

    if describe_machine().device != "cuda":
        print("No GPU on this machine: showing the course's reference sweep instead.")
        return find_capture(chapter, filename, prefer="reference")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / filename
        proc = subprocess.run([sys.executable, str(SWEEP_SCRIPT), "--json", str(out)], text=True, timeout=timeout_s)
        if not out.exists():
            raise GpuprofError(f"matmul_ladder_sweep.py wrote no results (exit {proc.returncode}); see its output above.")
        data = json.loads(out.read_text())
    command = shell_line(python_target(SWEEP_SCRIPT, "--json", filename))
    save_json(chapter, filename, data, overwrite=True,
              command=f"gpuprof.studies.matmul_sweep.run_sweep: {command} (exit {proc.returncode})")
    return find_capture(chapter, filename)


def _shapes() -> list[tuple[str, tuple[int, int, int], str]]:
    from ..runner import load_script

    return list(load_script(SWEEP_SCRIPT).SHAPES)


def shape_name(size: Sequence[int]) -> str:
    """The sweep's name for a shape (``8192^3``, ``MLP up``, ...), or ``M x N x K`` for one it does not list."""
    for name, known, _ in _shapes():
        if tuple(known) == tuple(size):
            return name
    return " x ".join(map(str, size))


def from_ladder_runs(paths: Sequence[str | Path]) -> dict[str, Any]:
    """``matmul_ladder.py --json`` files, each one process at one shape, as a sweep (shape named by
    :func:`shape_name`, processes numbered per shape in the order given)."""
    runs: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        name = shape_name(data["size"])
        runs.append({"shape": name, "process": seen.get(name, 0), **data})
        seen[name] = seen.get(name, 0) + 1
    known = [name for name, _, _ in _shapes()]
    order = sorted(dict.fromkeys(r["shape"] for r in runs), key=lambda n: known.index(n) if n in known else len(known))
    return {"runs": runs, "shapes": [{"name": n, "size": next(r["size"] for r in runs if r["shape"] == n)} for n in order],
            "processes": max(seen.values()) if seen else 0}


def _clock_mhz(result: dict[str, Any]) -> float | None:
    nv = result.get("extra", {}).get("nvml") or {}
    return nv.get("sm_mhz_median")


def _power_w(result: dict[str, Any]) -> float | None:
    nv = result.get("extra", {}).get("nvml") or {}
    return nv.get("power_w_energy") or nv.get("power_w_mean")


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def sweep_table(data: dict[str, Any]) -> pd.DataFrame:
    """One row per (shape, kernel), shapes in the sweep's order: see the module docstring. A share is
    taken within each process (one run times the rung and cuBLAS side by side), then summarised."""
    order = [s["name"] for s in data.get("shapes", [])] or list(dict.fromkeys(r["shape"] for r in data["runs"]))
    sizes = {s["name"]: s["size"] for s in data.get("shapes", [])}
    obs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in data["runs"]:
        rates = {r["name"]: r["rate"] for r in run["results"]}
        sizes.setdefault(run["shape"], run.get("size"))
        for r in run["results"]:
            clock = _clock_mhz(r)
            obs.setdefault((run["shape"], r["name"]), []).append({
                "label": r["label"], "rung": r.get("extra", {}).get("rung"), "ms": r["median_ms"], "rate": r["rate"],
                "of_cublas": r["rate"] / rates[REFERENCE] if REFERENCE in rates else None,
                "of_torch": r["rate"] / rates[TORCH] if TORCH in rates else None,
                "clock": clock, "clock_low": (r.get("extra", {}).get("nvml") or {}).get("sm_mhz_min"),
                "per_cycle": r["rate"] * 1e12 / (clock * 1e6) if clock else None, "power": _power_w(r),
                "reasons": (r.get("extra", {}).get("nvml") or {}).get("event_reasons_words")})
    rows = []
    for (shape, name), o in sorted(obs.items(), key=lambda kv: (order.index(kv[0][0]) if kv[0][0] in order else 99,
                                                                 kv[1][0]["rung"] if kv[1][0]["rung"] is not None else 99)):
        pick = lambda key: [x[key] for x in o if x[key] is not None]  # noqa: E731
        reasons = sorted({w for x in o if x["reasons"] for w in x["reasons"].split(", ") if w not in ("none", "")})
        rows.append({"shape": shape, "size": " x ".join(map(str, sizes.get(shape) or [])), "name": name,
                     "rung": o[0]["rung"], "kernel": o[0]["label"], "processes": len(o),
                     "ms": _median(pick("ms")), "tflops": _median(pick("rate")), "tflops_low": min(pick("rate")),
                     "of_cublas": _median(pick("of_cublas")), "of_cublas_low": min(pick("of_cublas"), default=float("nan")),
                     "of_torch": _median(pick("of_torch")), "of_torch_low": min(pick("of_torch"), default=float("nan")),
                     "flop_per_cycle": _median(pick("per_cycle")),
                     "flop_per_cycle_low": min(pick("per_cycle"), default=float("nan")),
                     "sm_mhz": _median(pick("clock")), "sm_mhz_low": min(pick("clock_low"), default=float("nan")),
                     "power_w": _median(pick("power")), "event_reasons": ", ".join(reasons) or "none"})
    return pd.DataFrame(rows)


def share_table(table: pd.DataFrame, column: str = "of_cublas_low") -> pd.DataFrame:
    """Shapes (rows, the sweep's order) by rung (columns), each cell ``column`` (default: the share of
    cuBLAS's same product in the least favourable process), and torch.matmul BF16's share beside."""
    rungs = table[table["rung"].notna()]
    out = rungs.pivot_table(index="shape", columns="rung", values=column, sort=False)
    out.columns = [f"rung {int(c)}" for c in out.columns]
    torch_rows = table[table["name"] == TORCH].set_index("shape")[column]
    if len(torch_rows):
        out["torch.matmul BF16"] = torch_rows
    return out


def best_rungs(table: pd.DataFrame, target: float = TARGET) -> pd.DataFrame:
    """Per shape: the rung with the highest median rate, its share of cuBLAS's same product (median and
    least favourable process) and whether the least favourable one meets ``target``."""
    rungs = table[table["rung"].notna()]
    best = rungs.loc[rungs.groupby("shape", sort=False)["tflops"].idxmax()]
    out = best[["shape", "rung", "of_cublas", "of_cublas_low", "flop_per_cycle", "sm_mhz"]].copy()
    out["rung"] = out["rung"].astype(int)
    out["meets_target"] = out["of_cublas_low"] >= target
    return out.set_index("shape")


def figure(table: pd.DataFrame, gpu: str):  # type: ignore[no-untyped-def]
    """Left: each rung's share of cuBLAS's same product per shape (bar: least favourable process; dot: median),
    with 100% and issue 39's 90% marked. Right: the SM clock (median; the lowest reading as a tick) and the
    power each kernel ran at, per shape."""
    import matplotlib.pyplot as plt
    import numpy as np

    shapes = list(dict.fromkeys(table["shape"]))
    rungs = sorted(int(r) for r in table["rung"].dropna().unique())
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw={"width_ratios": [1.4, 1]})
    x = np.arange(len(shapes))
    width = 0.8 / max(len(rungs), 1)
    for i, rung in enumerate(rungs):
        rows = table[table["rung"] == rung].set_index("shape").reindex(shapes)
        pos = x - 0.4 + width * (i + 0.5)
        ax.bar(pos, 100 * rows["of_cublas_low"], width, label=f"rung {rung}")
        ax.plot(pos, 100 * rows["of_cublas"], "k.", ms=4)
    ax.axhline(100, color="0.3", lw=1)
    ax.axhline(100 * TARGET, color="0.5", lw=1, ls="--")
    ax.set_xticks(x, shapes, rotation=20, ha="right")
    ax.set_ylim(0, max(110.0, 1.08 * 100 * float(table["of_cublas"].max())))
    ax.set(ylabel="% of cuBLAS, same product", title=f"Share of cuBLAS per shape ({gpu}; bar: least favourable process, dot: median)")
    ax.legend(fontsize=8, ncol=2)
    kernels = [n for n in dict.fromkeys(table["name"])]
    for name in kernels:
        rows = table[table["name"] == name].set_index("shape").reindex(shapes)
        line = bx.plot(x, rows["sm_mhz"], marker="o", ms=4, label=rows["kernel"].dropna().iloc[0][:40])[0]
        bx.plot(x, rows["sm_mhz_low"], "_", color=line.get_color(), ms=8)
    bx.set_xticks(x, shapes, rotation=20, ha="right")
    bx.set(ylabel="SM clock during the timed runs, MHz", title="Clock (line: median, tick: lowest) and power")
    px = bx.twinx()
    power = table.groupby("shape", sort=False)["power_w"].max().reindex(shapes)
    px.bar(x, power, 0.5, color="0.85", zorder=0, label="highest power of the kernels, W")
    px.set_ylabel("W")
    bx.set_zorder(px.get_zorder() + 1)
    bx.patch.set_visible(False)
    bx.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


def cluster_arrives(m: int, n: int, k: int, tile: tuple[int, int, int] = (128, 256, 64), cluster: int = 2) -> int:
    """Rung 10's consumer arrivals on the stage (``empty``) barriers at M x N x K: per tile, each of 2
    consumer warpgroups releases each K-slice's stage on the barrier of every block of the cluster, its
    own and its partner's. So for a cluster of 2 half of them are on the block's own barrier; in rung 10
    as first written all of them were cluster-scope releases through ``mapa`` (the count the chapter
    divides its extra L2 requests by), in the fixed rung 10 only the partner's half is remote."""
    tiles = -(-m // tile[0]) * -(-n // tile[1])
    return tiles * -(-k // tile[2]) * 2 * cluster


_INSTANCED = ("lts__t_requests", "lts__t_bytes", "lts__cycles_elapsed", "lts__t_sectors")


def l2_instances(report: str | Path) -> pd.Series:
    """Per kernel: how many L2 slices (LTS instances) ncu's ``lts__`` counters add up over, as ``.sum`` /
    ``.avg`` of the first such counter the report holds both of. Why: ``device__attribute_l2s_count`` is
    ``fbp_count`` x ``num_l2s_per_fbp`` and has read 96 on an H100 whose counters add up over 80."""
    for base in _INSTANCED:
        t = nr.metric_table(report, [f"{base}.sum", f"{base}.avg"], missing="nan")
        if t[f"{base}.avg"].notna().all():
            return (t[f"{base}.sum"] / t[f"{base}.avg"]).set_axis(t["kernel"]).rename("l2_instances")
    raise ValueError(f"{report}: no L2 counter with both .sum and .avg ({', '.join(_INSTANCED)}), so the slice count "
                     "the counters add up over cannot be read from it")


L2_METRICS = ["gpu__time_duration.sum", "lts__t_requests.sum", "lts__t_requests_srcunit_tex.sum",
              "lts__t_requests_srcunit_ltcfabric.sum", "lts__t_sectors.sum", "lts__t_sectors_srcunit_tex.sum",
              "lts__t_sectors_srcunit_ltcfabric.sum", TENSOR_PIPE]


def l2_request_sources(report: str | Path) -> pd.DataFrame:
    """Per kernel: L2 requests (and sectors) by source: the SMs' TEX path (their loads, stores and TMA
    copies; its sectors too, for the multicast's saving), the L2 fabric between the two L2 partitions,
    and the rest (``other``: neither); the tensor
    pipe's busy share of active cycles, and the membar stall (Warp State Statistics) where the report has it."""
    membar = stall_metric("membar")
    t = nr.metric_table(report, [*L2_METRICS, membar], missing="nan")
    out = pd.DataFrame({
        "kernel": t["kernel"], "ms": t["gpu__time_duration.sum"] / 1e6,
        "tex_requests_M": t["lts__t_requests_srcunit_tex.sum"] / 1e6,
        "fabric_requests_M": t["lts__t_requests_srcunit_ltcfabric.sum"] / 1e6,
        "tex_sectors_M": t["lts__t_sectors_srcunit_tex.sum"] / 1e6,
        "fabric_sectors_M": t["lts__t_sectors_srcunit_ltcfabric.sum"] / 1e6,
        "other_requests_M": (t["lts__t_requests.sum"] - t["lts__t_requests_srcunit_tex.sum"]
                             - t["lts__t_requests_srcunit_ltcfabric.sum"]) / 1e6,
        "other_sectors_M": (t["lts__t_sectors.sum"] - t["lts__t_sectors_srcunit_tex.sum"]
                            - t["lts__t_sectors_srcunit_ltcfabric.sum"]) / 1e6,
        "tensor_pipe_pct": t[TENSOR_PIPE], "membar_stall": t[membar]})
    return out.set_index("kernel")


LADDER_TILE = (128, 256)  # rungs 7-10's tile of C per block, rows x columns (matmul_ladder.py's RUNGS; tested equal)
# cuBLAS's kernel names carry their tile of C: nvjet_sm90_tss_192x192_64x4_2x1_... is 192 x 192, slices of K of 64,
# 4 stages, 2 x 1 clusters (CUTLASS's names put it the same way, e.g. ..._128x256x64_...)
_NAMED_TILE = re.compile(r"_(\d+)x(\d+)(?:x\d+)?_")


def tile_of(kernel: str) -> tuple[int, int] | None:
    """The tile of C one block computes: the ladder's own (``LADDER_TILE``) for its wgmma rungs, the first
    ``RxC`` in a library kernel's name otherwise, None where the name says nothing."""
    if kernel.startswith("ladder_"):
        return LADDER_TILE if int(kernel.split("_")[1]) >= 7 else None
    found = _NAMED_TILE.search(kernel)
    return (int(found[1]), int(found[2])) if found else None


def padded_work(m: int, n: int, tile: tuple[int, int]) -> float:
    """The tensor work a grid of ``tile``-sized blocks does over an M x N product's own: each block computes a
    whole tile, so where the tile does not divide M or N, the last row or column of tiles computes past the
    edge (16384 over 192 is 85.3: 86 tiles, 16,512 rows). 1.0 where it divides both."""
    rows, cols = tile
    return math.ceil(m / rows) * rows * math.ceil(n / cols) * cols / (m * n)


HGMMA_FLOP = "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32_sparsity_off.sum"  # counts 2 per multiply-add
# Hopper's dense BF16 wgmma peak per SM per cycle: the counter's own peak_sustained in the chapter's 4096^3 report
# (540,672 per cycle over 132 SMs), a report that did not collect it falls back to this
HGMMA_FLOP_PER_SM_CYCLE = 4096
AGAINST_CUBLAS = ["gpc__cycles_elapsed.max", "sm__cycles_active.avg", TENSOR_PIPE, HGMMA_FLOP,
                  "device__attribute_multiprocessor_count", "gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second", "dram__bytes_read.sum", "lts__t_bytes.sum",
                  "smsp__inst_executed.sum", "launch__grid_size", "launch__cluster_size"]


def against_cublas(report: str | Path, m: int, n: int, k: int) -> pd.DataFrame:
    """One row per kernel launch of ``report`` (ncu over ``matmul_ladder.py --rung 9,10`` with cuBLAS), in
    launch order, the columns per cycle rather than per second, because the clock under ncu moves from kernel
    to kernel and under a power cap in a timed run even more:

    * ``cycles_M``: ncu's Elapsed Cycles (``gpc__cycles_elapsed.max``); ``active``: the SMs' active cycles
      (``sm__cycles_active.avg``) over them; ``sm_cycles_M`` and ``active_sm``: the same over the SMs' own elapsed
      cycles (SM Frequency x Duration). The two elapsed counts differ by up to a few percent from kernel to
      kernel (ncu's reports of this chapter: 0.01% to 3.8%, either way round), so a per-cycle comparison says which it uses;
    * ``tensor_pipe_pct``: the tensor pipe's busy share of the SMs' active cycles;
    * ``tensor_over_product``: the BF16 wgmma FLOP counted over the product's 2MNK (1.000: no work wasted),
      beside ``tile`` and ``padded``, what the tile predicts (:func:`padded_work`);
    * ``product_per_cycle``: the product's FLOP per Elapsed Cycle over the tensor pipe's peak per cycle
      (the counter's ``peak_sustained``, else ``HGMMA_FLOP_PER_SM_CYCLE`` per SM), the share of the chip's
      tensor rate that went into the product;
    * ``ms``, ``ghz`` (Elapsed Cycles over the duration) and ``sm_ghz`` (ncu's SM Frequency): the clock the
      launch ran at, which may sit below the base clock ncu asks for, ``dram_read_gb``, ``l2_gb``, ``inst_M``, ``grid``,
      ``cluster``: what else moved.

    The ``active`` and ``tensor_pipe_pct`` columns multiply out to ``product_per_cycle`` x ``tensor_over_product``
    by construction (the busy counter is the counted wgmma work over the pipe's peak per active cycle), so a ratio
    of two rows' cycles splits into them exactly: an accounting, not a second measurement.
    """
    t = nr.metric_table(report, AGAINST_CUBLAS)
    peak = nr.metric_table(report, [f"{HGMMA_FLOP}.peak_sustained"], missing="nan")[f"{HGMMA_FLOP}.peak_sustained"]
    peak = peak.fillna(t["device__attribute_multiprocessor_count"] * HGMMA_FLOP_PER_SM_CYCLE)
    flop = 2 * m * n * k
    tiles = [tile_of(name) for name in t["kernel"]]
    cycles = t["gpc__cycles_elapsed.max"]
    out = pd.DataFrame({
        "kernel": t["kernel"], "cycles_M": cycles / 1e6, "active": t["sm__cycles_active.avg"] / cycles,
        "tensor_pipe_pct": t[TENSOR_PIPE], "tensor_over_product": t[HGMMA_FLOP] / flop,
        "tile": ["x".join(map(str, x)) if x else "?" for x in tiles],
        "padded": [padded_work(m, n, x) if x else float("nan") for x in tiles],
        "product_per_cycle": flop / cycles / peak,
        "sm_cycles_M": t["sm__cycles_elapsed.avg.per_second"] * t["gpu__time_duration.sum"] / 1e15,
        "ms": t["gpu__time_duration.sum"] / 1e6, "ghz": cycles / t["gpu__time_duration.sum"],
        "sm_ghz": t["sm__cycles_elapsed.avg.per_second"] / 1e9, "dram_read_gb": t["dram__bytes_read.sum"] / 1e9,
        "l2_gb": t["lts__t_bytes.sum"] / 1e9, "inst_M": t["smsp__inst_executed.sum"] / 1e6,
        "grid": t["launch__grid_size"].astype(int), "cluster": t["launch__cluster_size"].astype(int).clip(lower=1)})
    out.insert(3, "active_sm", t["sm__cycles_active.avg"].to_numpy() / (out["sm_cycles_M"].to_numpy() * 1e6))
    return out.reset_index(drop=True)
