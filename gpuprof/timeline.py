"""Draw an Nsight Systems-style timeline from a sqlite export, for a static book.

The GUI is the best way to explore a capture, but a book needs a picture it can
print, drawn from the same data every time. Rows, top to bottom: NVTX ranges (one row
per nesting depth), the CPU's synchronisation calls, then one row per CUDA stream with
its kernels and copies. Colours follow one legend in every chapter.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.patches import Patch

from . import nsys_sqlite as ns
from .trace_analysis import SYNC_API

__all__ = ["draw_timeline", "COLORS"]

COLORS = {
    "kernel": "#4c72b0",
    "Host-to-Device": "#55a868",
    "Device-to-Host": "#c44e52",
    "Device-to-Device": "#8172b2",
    "memset": "#937860",
    "nvtx": "#ccb974",
    "sync": "#dd8452",
}


def _bars(ax: Axes, y: float, df: pd.DataFrame, t0: int, color: str | pd.Series, height: float = 0.7) -> None:
    if df.empty:
        return
    xs = list(zip((df["start"] - t0) / 1e6, (df["end"] - df["start"]) / 1e6))
    colors = color if isinstance(color, str) else list(color)
    ax.broken_barh(xs, (y - height / 2, height), facecolors=colors, edgecolor="none")


def draw_timeline(path: str | Path, *, window: tuple[int, int] | None = None, ax: Axes | None = None,
                  title: str = "", label_ranges: bool = True, stream_labels: dict[int, str] | None = None,
                  max_depth: int | None = None) -> Axes:
    """Draw the capture at ``path`` (an nsys sqlite export) between ``window`` (ns), default all of it.

    ``stream_labels`` names stream rows (``{7: "compute"}``; others stay ``stream N``);
    ``max_depth`` keeps only the outer NVTX rows when ranges nest deeply.
    """
    kernels = _safe(ns.kernels, path)
    copies = ns.memcpy(path)
    sets = ns.memset(path)
    ranges = ns.nvtx_ranges(path)
    runtime = ns.runtime_calls(path)
    every = [d for d in (kernels, copies, sets) if not d.empty]
    if window is None:
        spans = every + ([ranges] if not ranges.empty else [])
        if not spans:
            raise ValueError(f"{path} holds nothing to draw")
        window = (min(int(d["start"].min()) for d in spans), max(int(d["end"].max()) for d in spans))
    lo, hi = window

    def inside(df: pd.DataFrame) -> pd.DataFrame:
        return df[(df["end"] > lo) & (df["start"] < hi)] if not df.empty else df

    kernels, copies, sets, ranges, runtime = map(inside, (kernels, copies, sets, ranges, runtime))
    sync = runtime[runtime["name"].str.contains(SYNC_API, regex=True)] if not runtime.empty else runtime
    stream_ids = sorted(set(kernels.get("streamId", pd.Series(dtype=int))) | set(copies.get("streamId", pd.Series(dtype=int)))
                        | set(sets.get("streamId", pd.Series(dtype=int))))
    if max_depth is not None and not ranges.empty:
        ranges = ranges[ranges["depth"] <= max_depth]
    depth = int(ranges["depth"].max()) + 1 if not ranges.empty else 0
    labels = [f"NVTX{'' if d == 0 else f' (depth {d})'}" for d in range(depth)] + ["CPU: sync calls"]
    names = {int(s): (stream_labels or {}).get(int(s), f"stream {int(s)}") for s in stream_ids}
    labels += [names[int(s)] for s in stream_ids]
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.45 * len(labels) + 1.4))
    y_of = {lab: len(labels) - 1 - i for i, lab in enumerate(labels)}
    for d in range(depth):
        row = ranges[ranges["depth"] == d]
        _bars(ax, y_of[labels[d]], row, lo, COLORS["nvtx"])
        if label_ranges:
            for r in row.itertuples():
                width = (min(r.end, hi) - max(r.start, lo)) / (hi - lo)
                if width > 0.06:
                    x = (max(r.start, lo) + min(r.end, hi)) / 2 - lo
                    ax.text(x / 1e6, y_of[labels[d]], r.text, ha="center", va="center", fontsize=7, clip_on=True)
    _bars(ax, y_of["CPU: sync calls"], sync, lo, COLORS["sync"])
    for s in stream_ids:
        y = y_of[names[int(s)]]
        _bars(ax, y, kernels[kernels["streamId"] == s], lo, COLORS["kernel"])
        c = copies[copies["streamId"] == s]
        _bars(ax, y, c, lo, c["kind"].map(lambda k: COLORS.get(k, "#999999")))
        _bars(ax, y, sets[sets["streamId"] == s], lo, COLORS["memset"])
    ax.set_yticks(list(y_of.values()), list(y_of.keys()), fontsize=8)
    ax.set_xlim(0, (hi - lo) / 1e6)
    ax.set_xlabel("time (ms)")
    if title:
        ax.set_title(title, fontsize=10)
    legend = [Patch(color=COLORS[k], label=k if k != "nvtx" else "NVTX range") for k in
              ("kernel", "Host-to-Device", "Device-to-Host", "memset", "nvtx", "sync")]
    ax.legend(handles=legend, fontsize=7, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.38 if len(labels) < 5 else -0.2),
              frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return ax


def _safe(reader, path):  # type: ignore[no-untyped-def]
    try:
        return reader(path)
    except ns.NoKernelRows:
        return pd.DataFrame(columns=["start", "end", "streamId", "duration_ns", "name"])
