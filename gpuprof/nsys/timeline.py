"""Draw an Nsight Systems-style timeline from a sqlite export, for a static book.

The GUI is the best way to explore a capture, but a book needs a picture it can
print, drawn from the same data every time. Rows, top to bottom: NVTX ranges, one row
per thread, domain and nesting depth (as the GUI groups them: a range opened on the
autograd thread is not drawn as if the main thread had opened it); the CPU's
synchronisation calls; then one row per CUDA stream with its kernels and copies.
Colours follow one legend in every chapter.

A long capture is drawn in part by giving a ``window``: nanoseconds on the capture's
clock, or NVTX range names (``("step_3", "step_5")`` draws from the start of the first
``step_3`` to the end of the first ``step_5``).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.patches import Patch

from . import sqlite as ns
from ..activity import SYNC_API

__all__ = ["draw_timeline", "resolve_window", "fit_label", "COLORS"]

COLORS = {
    "kernel": "#4c72b0",
    "Host-to-Device": "#55a868",
    "Device-to-Host": "#c44e52",
    "Device-to-Device": "#8172b2",
    "memset": "#937860",
    "nvtx": "#ccb974",
    "sync": "#dd8452",
}

Window = tuple[int, int] | tuple[str, str] | tuple[str, str, int]


def _bars(ax: Axes, y: float, df: pd.DataFrame, t0: int, color: str | pd.Series, height: float = 0.7) -> None:
    if df.empty:
        return
    xs = list(zip((df["start"] - t0) / 1e6, (df["end"] - df["start"]) / 1e6))
    colors = color if isinstance(color, str) else list(color)
    ax.broken_barh(xs, (y - height / 2, height), facecolors=colors, edgecolor="none")


def resolve_window(ranges: pd.DataFrame, window: Window) -> tuple[int, int]:
    """A window in nanoseconds from ``(start_ns, end_ns)`` or ``(first_range, last_range[, occurrence])``.

    With names, the window runs from the start of ``first_range`` to the end of
    ``last_range``, taking each name's ``occurrence``-th appearance in time order
    (default 0, the first; -1 for the last).
    """
    a, b = window[0], window[1]
    if isinstance(a, str) or isinstance(b, str):
        occurrence = int(window[2]) if len(window) > 2 else 0  # type: ignore[misc]

        def pick(name: str) -> pd.Series:
            rows = ranges[ranges["text"] == name].sort_values("start")
            if rows.empty:
                raise KeyError(f"no NVTX range named {name!r} in this capture")
            return rows.iloc[occurrence]

        lo, hi = int(pick(str(a))["start"]), int(pick(str(b))["end"])
        if hi <= lo:
            raise ValueError(f"{b!r} ends before {a!r} starts")
        return lo, hi
    return int(a), int(b)


def fit_label(text: str, width_px: float, fontsize: float, dpi: float) -> str:
    """``text`` cut (with an ellipsis) to what fits in ``width_px`` pixels, or "" if under 3 characters do.

    A character is taken as 0.62 em wide, the average of the default sans-serif font's
    lowercase letters and digits, so that neighbouring labels never run into each other.
    """
    per_char = 0.62 * fontsize * dpi / 72
    fits = int(width_px // per_char)
    if fits >= len(text):
        return text
    return text[: fits - 1] + "\u2026" if fits >= 3 else ""


def _row_label(tid: int, domain: str, depth: int, names: dict[int, str], main_tid: int | None) -> str:
    who = names.get(tid) or ("main thread" if tid == main_tid else f"thread {ns.tid_of(tid)}")
    where = "" if domain == "default" else f" [{domain}]"
    return f"NVTX {who}{where}" + ("" if depth == 0 else f" (depth {depth})")


def draw_timeline(path: str | Path, *, window: Window | None = None, ax: Axes | None = None,
                  title: str = "", label_ranges: bool = True, stream_labels: dict[int, str] | None = None,
                  max_depth: int | None = None) -> Axes:
    """Draw the capture at ``path`` (an nsys sqlite export) over ``window``, default all of it.

    ``window`` is ``(start_ns, end_ns)`` or range names (see :func:`resolve_window`).
    ``stream_labels`` names stream rows (``{7: "compute"}``; others stay ``stream N``);
    ``max_depth`` keeps only the outer NVTX rows when ranges nest deeply.
    """
    copies = ns.memcpy(path)
    sets = ns.memset(path)
    ranges = ns.nvtx_ranges(path)
    if window is None:
        kernels = _safe(ns.kernels, path)
        every = [d for d in (kernels, copies, sets) if not d.empty]
        spans = every + ([ranges] if not ranges.empty else [])
        if not spans:
            raise ValueError(f"{path} holds nothing to draw")
        lo, hi = (min(int(d["start"].min()) for d in spans), max(int(d["end"].max()) for d in spans))
    else:
        lo, hi = resolve_window(ranges, window)
        # only the window's kernels and calls leave SQLite: a step of a capture of millions of kernels
        kernels = _safe(lambda p: ns.kernels(p, window=(lo, hi)), path)
    runtime = ns.runtime_calls(path, window=(lo, hi))

    def inside(df: pd.DataFrame) -> pd.DataFrame:
        return df[(df["end"] > lo) & (df["start"] < hi)] if not df.empty else df

    kernels, copies, sets, ranges, runtime = map(inside, (kernels, copies, sets, ranges, runtime))
    sync = runtime[runtime["name"].str.contains(SYNC_API, regex=True)] if not runtime.empty else runtime
    stream_ids = sorted(set(kernels.get("streamId", pd.Series(dtype=int))) | set(copies.get("streamId", pd.Series(dtype=int)))
                        | set(sets.get("streamId", pd.Series(dtype=int))))
    if max_depth is not None and not ranges.empty:
        ranges = ranges[ranges["depth"] <= max_depth]
    names = ns.thread_names(path) if not ranges.empty else {}
    # The thread that made the most runtime calls is the program's main thread, for labels.
    main_tid = int(runtime["globalTid"].mode().iloc[0]) if not runtime.empty else None
    nvtx_rows: list[tuple[tuple[int, str, int], str]] = []
    if not ranges.empty:
        keys = ranges[["globalTid", "domain", "depth"]].drop_duplicates().sort_values(["globalTid", "domain", "depth"])
        for tid, domain, depth in keys.itertuples(index=False):
            nvtx_rows.append(((int(tid), str(domain), int(depth)), _row_label(int(tid), str(domain), int(depth), names, main_tid)))
    labels = [label for _, label in nvtx_rows] + ["CPU: sync calls"]
    stream_names = {int(s): (stream_labels or {}).get(int(s), f"stream {int(s)}") for s in stream_ids}
    labels += [stream_names[int(s)] for s in stream_ids]
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.45 * len(labels) + 1.4))
    y_of = {i: len(labels) - 1 - i for i in range(len(labels))}
    ax.set_xlim(0, (hi - lo) / 1e6)
    fig = ax.figure
    # The axes shrink later when tight_layout makes room for the row labels: plan labels for
    # 80% of today's width so that they still fit then.
    axes_px = 0.8 * (ax.get_window_extent().width if fig is not None else 800.0)
    px_per_ns = axes_px / (hi - lo)
    for row, ((tid, domain, depth), _) in enumerate(nvtx_rows):
        part = ranges[(ranges["globalTid"] == tid) & (ranges["domain"] == domain) & (ranges["depth"] == depth)]
        _bars(ax, y_of[row], part, lo, COLORS["nvtx"])
        if label_ranges:
            for r in part.itertuples():
                a, b = max(r.start, lo), min(r.end, hi)
                text = fit_label(str(r.text), (b - a) * px_per_ns - 4, 7, fig.dpi if fig is not None else 100)
                if text:
                    ax.text(((a + b) / 2 - lo) / 1e6, y_of[row], text, ha="center", va="center", fontsize=7, clip_on=True)
    sync_row = len(nvtx_rows)
    _bars(ax, y_of[sync_row], sync, lo, COLORS["sync"])
    for i, s in enumerate(stream_ids):
        y = y_of[sync_row + 1 + i]
        _bars(ax, y, kernels[kernels["streamId"] == s], lo, COLORS["kernel"])
        c = copies[copies["streamId"] == s]
        _bars(ax, y, c, lo, c["kind"].map(lambda k: COLORS.get(k, "#999999")))
        _bars(ax, y, sets[sets["streamId"] == s], lo, COLORS["memset"])
    ax.set_yticks([y_of[i] for i in range(len(labels))], labels, fontsize=8)
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
