"""Figures of the PyTorch profiler chapter, drawn from a schedule, a trace or an allocator log."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

__all__ = ["schedule_figure", "memory_figure", "launch_figure"]

ACTION_COLOURS = {"NONE": "#dddddd", "WARMUP": "#f2c14e", "RECORD": "#4c9be8", "RECORD_AND_SAVE": "#1f5fa8"}


def schedule_figure(plans: dict[str, pd.DataFrame], traced: dict[str, list[int]] | None = None) -> Figure:
    """One row per schedule: each step coloured by the action the schedule returns for it, and a dot on
    the steps a real trace holds as ``ProfilerStep#N`` (``traced``, by the same labels)."""
    fig, ax = plt.subplots(figsize=(9, 1.4 + 0.55 * len(plans)))
    for row, (label, plan) in enumerate(plans.items()):
        y = len(plans) - 1 - row
        for r in plan.itertuples():
            ax.barh(y, 0.92, left=r.step - 0.46, height=0.6, color=ACTION_COLOURS.get(r.action, "white"),
                    edgecolor="white")
        for s in (traced or {}).get(label, []):
            ax.plot(s, y, "o", color="black", ms=4)
    ax.set_yticks(range(len(plans)), list(plans)[::-1])
    steps = max(len(p) for p in plans.values())
    ax.set_xticks(range(steps))
    ax.set_xlim(-0.6, steps - 0.4)
    ax.set_xlabel("step (prof.step() calls so far)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ACTION_COLOURS.values()]
    labels = ["not profiled", "warm-up (traced, discarded)", "recorded", "recorded, then trace handed over"]
    if traced:
        handles.append(plt.Line2D([], [], marker="o", color="black", ls="", ms=4))
        labels.append("ProfilerStep#N in the real trace")
    ax.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, fontsize=8, frameon=False)
    ax.spines[["top", "right", "left"]].set_visible(False)
    fig.tight_layout()
    return fig


def memory_figure(curve: pd.DataFrame, ends: list[int], phases: list[str], title: str) -> Figure:
    """Allocated MiB after each allocator event, stacked by category, with the phase boundaries marked."""
    fig, ax = plt.subplots(figsize=(9, 4.2))
    x = np.arange(len(curve))
    ax.stackplot(x, *(curve[c].to_numpy() / 2**20 for c in curve.columns), labels=list(curve.columns), alpha=0.9,
                 step="post")
    top = curve.sum(axis=1).max() / 2**20
    start = 0
    for end, label in zip(ends, phases):
        ax.axvline(end, color="black", lw=0.6, ls=":")
        step, phase = label.split(":", 1)
        ax.text((start + end) / 2, top * 1.02, f"{phase.replace('_', ' ')}\n(step {step})", ha="center", va="bottom",
                fontsize=7)
        start = end
    ax.set_ylim(0, top * 1.18)
    ax.set_xlim(0, len(curve))
    ax.set_xlabel("allocator event (allocations and frees, in order)")
    ax.set_ylabel("allocated MiB")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3, fontsize=8, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


LAUNCH_COLOURS = {"cudaGraphLaunch": "#d62728", "kernel": "#4c9be8", "generated": "#f2a541", "other": "#7f7f7f"}


def launch_figure(steps: dict[str, tuple[pd.DataFrame, pd.DataFrame]], title: str) -> Figure:
    """One panel per mode on one time axis: the step's launch calls on the CPU (one tick each, graph
    launches in red) above the kernels they launched on the GPU (generated kernels in orange).

    ``steps`` maps a mode to :func:`gpuprof.studies.pytorch_profiler.step_launches`' calls and kernels.
    """
    fig, axes = plt.subplots(len(steps), 1, figsize=(9, 0.9 + 1.15 * len(steps)), sharex=True)
    axes = np.atleast_1d(axes)
    right = max(max(c["end_ms"].max(), k["end_ms"].max() if len(k) else 0) for c, k in steps.values())
    for ax, (mode, (calls, kernels)) in zip(axes, steps.items()):
        graph = calls["name"] == "cudaGraphLaunch"
        for rows, colour in ((calls[~graph], LAUNCH_COLOURS["other"]), (calls[graph], LAUNCH_COLOURS["cudaGraphLaunch"])):
            ax.broken_barh(list(zip(rows["start_ms"], (rows["end_ms"] - rows["start_ms"]).clip(lower=right / 600))),
                           (1.1, 0.8), color=colour)
        for rows, colour in ((kernels[~kernels["generated"]], LAUNCH_COLOURS["kernel"]),
                             (kernels[kernels["generated"]], LAUNCH_COLOURS["generated"])):
            ax.broken_barh(list(zip(rows["start_ms"], (rows["end_ms"] - rows["start_ms"]).clip(lower=right / 600))),
                           (0.0, 0.8), color=colour)
        ax.set_yticks([0.4, 1.5], ["GPU kernels", "CPU launches"], fontsize=8)
        ax.set_ylim(-0.2, 2.1)
        ax.set_title(f"{mode}: {len(calls)} launch calls, {len(kernels)} kernels", fontsize=9, loc="left")
        ax.spines[["top", "right"]].set_visible(False)
    axes[-1].set_xlim(0, right * 1.02)
    axes[-1].set_xlabel("ms from the start of the step (record_function range on the CPU)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in LAUNCH_COLOURS.values()]
    labels = ["cudaGraphLaunch", "kernel (cuBLAS, PyTorch)", "generated kernel (triton_...)", "kernel launch call"]
    fig.suptitle(title, fontsize=10)
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig
