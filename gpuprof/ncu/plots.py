"""Figures of Nsight Compute data for a static book: each drawn from a report's counters, never a screenshot.

* :func:`throughput_bars`: the Speed Of Light section's compute and memory throughputs per kernel;
* :func:`roofline`: achieved FLOP/s against arithmetic intensity, under the ceilings chapter 0
  measured on the same GPU (memory bandwidth, FP32 and BF16 matrix-multiply rates);
* :func:`stall_bars`: the Warp State Statistics section (cycles per issued instruction, by reason);
* :func:`occupancy_limits`: the Occupancy section's limiters, blocks per SM by resource;
* :func:`occupancy_bandwidth`: achieved bandwidth per block size, labelled with theoretical occupancy;
* :func:`pipe_bars`: the Compute Workload Analysis section's pipe utilisation.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.ticker import NullFormatter, ScalarFormatter

__all__ = ["throughput_bars", "roofline", "stall_bars", "occupancy_limits", "occupancy_bandwidth",
           "pipe_bars", "STALL_REASONS", "SAMPLED_STALLS",
           "stall_metric", "OCCUPANCY_LIMITS", "PIPES"]

# Warp states of ncu's program-counter sampling (Source Counters, smsp__pcsamp_warps_issue_stalled_<state>,
# ncu 2025.3 on Hopper), without "selected" (the warp was issuing: not a stall).
SAMPLED_STALLS = ["long_scoreboard", "short_scoreboard", "mio_throttle", "lg_throttle", "barrier", "wait",
                  "math_pipe_throttle", "not_selected", "dispatch_stall", "branch_resolving", "no_instructions", "drain",
                  "imc_miss", "membar", "misc", "sleeping", "tex_throttle", "warpgroup_arrive"]
STALL_REASONS = ["long_scoreboard", "barrier", "mio_throttle", "short_scoreboard", "lg_throttle", "math_pipe_throttle",
                 "wait", "not_selected", "selected", "dispatch_stall", "branch_resolving", "no_instruction", "drain",
                 "imc_miss", "membar", "misc", "sleeping", "tex_throttle"]
OCCUPANCY_LIMITS = {"registers": "launch__occupancy_limit_registers", "shared memory": "launch__occupancy_limit_shared_mem",
                    "warps": "launch__occupancy_limit_warps", "blocks": "launch__occupancy_limit_blocks"}
PIPES = {"FMA": "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
         "ALU": "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
         "LSU": "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
         "tensor (all)": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
         "tensor HMMA (mma.sync + wgmma)": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"}


def stall_metric(reason: str) -> str:
    """The Warp State Statistics metric for one stall reason: warps stalled per issued instruction."""
    return f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"


def _axes(ax: Axes | None, size: tuple[float, float]) -> Axes:
    if ax is None:
        _, ax = plt.subplots(figsize=size)
    return ax


def throughput_bars(table: pd.DataFrame, labels: Sequence[str], ax: Axes | None = None, title: str = "") -> Axes:
    """Grouped bars per kernel: SM (compute) throughput, memory throughput, and DRAM, L2 and L1 separately,
    in percent of each unit's peak (the Speed Of Light section's first table)."""
    cols = {"compute (SM)": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
            "memory": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
            "DRAM": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
            "L2": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
            "L1/TEX": "l1tex__throughput.avg.pct_of_peak_sustained_active"}
    cols = {k: v for k, v in cols.items() if v in table}
    ax = _axes(ax, (9, 3.6))
    x = np.arange(len(table))
    width = 0.8 / len(cols)
    for i, (label, col) in enumerate(cols.items()):
        ax.bar(x + (i - (len(cols) - 1) / 2) * width, table[col].to_numpy(), width, label=label)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set(ylabel="% of peak", ylim=(0, 105), title=title)
    ax.legend(fontsize=7, ncol=len(cols), loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return ax


def roofline(points: pd.DataFrame, *, bandwidth_gbps: float, ceilings: dict[str, float], ax: Axes | None = None,
             title: str = "") -> Axes:
    """Log-log roofline. ``points`` has columns label, intensity (FLOP per DRAM byte) and tflops;
    ``ceilings`` maps a label to a compute rate in TFLOP/s; ``bandwidth_gbps`` is the memory ceiling.

    Points and ceilings are named in a legend under the axes rather than next to the marks:
    kernels of one study sit close together (and close to a ceiling), where labels would collide.
    """
    ax = _axes(ax, (7.5, 4.8))
    lo = max(min(points["intensity"].min() / 4, 0.1), 1e-3)
    hi = max(points["intensity"].max() * 4, 1e4)
    x = np.logspace(np.log10(lo), np.log10(hi), 200)
    bw = bandwidth_gbps / 1e3  # TB/s: TFLOP/s per FLOP/byte
    ax.plot(x, bw * x, color="gray", lw=1, label=f"memory: {bandwidth_gbps:,.0f} GB/s")
    for label, rate in ceilings.items():
        ridge = rate / bw
        xs = x[x >= ridge]
        ax.plot(xs, np.full_like(xs, rate), lw=1, ls="--", label=f"{label}: {rate:,.0f} TFLOP/s (ridge {ridge:,.0f} FLOP/B)")
    markers = "osD^vP*Xh"
    for i, r in enumerate(points.itertuples()):
        ax.scatter(r.intensity, r.tflops, s=36, zorder=3, marker=markers[i % len(markers)],
                   label=f"{r.label}: {r.tflops:,.1f} TFLOP/s")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP per DRAM byte)", ylabel="TFLOP/s",
           title=title, xlim=(lo, hi))
    ax.grid(alpha=0.3)  # decades only: minor lines over five decades crowd the marks
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
    return ax


def stall_bars(table: pd.DataFrame, labels: Sequence[str], ax: Axes | None = None, top: int = 6, title: str = "") -> Axes:
    """Stacked horizontal bars per kernel: cycles each issued instruction waited, split by stall reason.

    The ``top`` reasons (by their largest value over the kernels) get their own colour;
    the rest are summed as 'other'.
    """
    have = [r for r in STALL_REASONS if stall_metric(r) in table]
    values = pd.DataFrame({r: table[stall_metric(r)].to_numpy() for r in have}, index=list(labels)).fillna(0.0)
    order = values.max().sort_values(ascending=False).index
    shown = list(order[:top])
    values["other"] = values[[r for r in have if r not in shown]].sum(axis=1)
    ax = _axes(ax, (9, 0.5 * len(values) + 1.6))
    left = np.zeros(len(values))
    for reason in shown + ["other"]:
        ax.barh(range(len(values)), values[reason], left=left, label=reason.replace("_", " "))
        left += values[reason].to_numpy()
    ax.set_yticks(range(len(values)), values.index, fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="cycles stalled per issued instruction (warp state statistics)", title=title)
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.25), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return ax


def occupancy_limits(table: pd.DataFrame, labels: Sequence[str], ax: Axes | None = None, title: str = "") -> Axes:
    """Blocks per SM that each resource allows, per launch: the smallest is the limiter (hatched)."""
    cols = {k: v for k, v in OCCUPANCY_LIMITS.items() if v in table}
    ax = _axes(ax, (9, 3.4))
    x = np.arange(len(table))
    width = 0.8 / len(cols)
    values = table[list(cols.values())].to_numpy(dtype=float)
    for i, (label, col) in enumerate(cols.items()):
        bars = ax.bar(x + (i - (len(cols) - 1) / 2) * width, table[col].to_numpy(dtype=float), width, label=label)
        for j, b in enumerate(bars):
            if values[j, i] == np.nanmin(values[j]):  # every resource at the minimum limits (ties included)
                b.set_hatch("///")
                b.set_edgecolor("black")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set(ylabel="blocks per SM allowed", yscale="log", title=title, ylim=(1, None))
    top = int(np.nanmax(values))
    ax.set_yticks([2**k for k in range(int(np.log2(max(top, 1))) + 1)])
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.legend(fontsize=7, ncol=len(cols), loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return ax


def occupancy_bandwidth(blocks: Sequence[int], occupancy_pct: Sequence[float], gbps: Sequence[float], *,
                        reference_gbps: float | None = None, reference_label: str = "", ax: Axes | None = None,
                        title: str = "") -> Axes:
    """Achieved bandwidth per block size (log2 axis), each point labelled with its theoretical occupancy.

    Block size, not occupancy, is the x axis: several block sizes can share one occupancy
    (100% for both 512 and 1024 threads), and their points would fall on each other.
    """
    ax = _axes(ax, (6, 3.6))
    ax.plot(list(blocks), list(gbps), "o-")
    for b, occ, y in zip(blocks, occupancy_pct, gbps):
        ax.annotate(f"{occ:.0f}%", (b, y), textcoords="offset points", xytext=(0, -13), fontsize=7, ha="center")
    top = max(gbps)
    if reference_gbps is not None:
        ax.axhline(reference_gbps, color="gray", ls=":", label=reference_label or f"{reference_gbps:,.0f} GB/s")
        top = max(top, reference_gbps)
        ax.legend(fontsize=7, loc="lower right")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(blocks), [str(b) for b in blocks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set(xlabel="threads per block (labels: theoretical occupancy)", ylabel="GB/s (CUDA events)", title=title,
           ylim=(0, top * 1.12))
    ax.grid(alpha=0.3)
    return ax


def pipe_bars(table: pd.DataFrame, labels: Sequence[str], ax: Axes | None = None, title: str = "") -> Axes:
    """Grouped bars per kernel: how busy each execution pipe was, in percent of its peak while the SM was active.

    ``table`` holds the pipe metrics under their names, or under ``"<pipe> pipe %"`` as
    :func:`gpuprof.ncu.derived.compute_table` names them.
    """
    cols = {k: (f"{k} pipe %" if f"{k} pipe %" in table else v) for k, v in PIPES.items()}
    cols = {k: v for k, v in cols.items() if v in table}
    ax = _axes(ax, (9, 3.6))
    x = np.arange(len(table))
    width = 0.8 / len(cols)
    for i, (label, col) in enumerate(cols.items()):
        ax.bar(x + (i - (len(cols) - 1) / 2) * width, table[col].fillna(0).to_numpy(), width, label=label)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set(ylabel="% of peak (active cycles)", ylim=(0, 105), title=title)
    ax.legend(fontsize=7, ncol=len(cols), loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return ax
