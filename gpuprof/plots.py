"""Figures the chapters share, drawn from captures (never from typed-in numbers)."""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure as MplFigure

from .speed_of_light import Figure

__all__ = ["bandwidth_bars"]


def bandwidth_bars(figures: Sequence[Figure], title: str) -> MplFigure:
    """Horizontal bars of every GB/s figure, on a log axis, each labelled with its value.

    A log axis because the figures span two orders of magnitude (pageable PCIe copies
    at tens of GB/s, HBM at thousands), and the point of the picture is the ratio.
    """
    rows = [f for f in figures if f.unit == "GB/s"]
    fig, ax = plt.subplots(figsize=(7.5, 0.5 * len(rows) + 1.2))
    if not rows:
        ax.text(0.5, 0.5, "no bandwidth figures", ha="center", va="center")
        ax.set_axis_off()
        return fig
    labels = [f.label for f in rows]
    values = [f.value for f in rows]
    colors = ["#4c72b0" if "H2D" in f.label or "D2H" in f.label else "#55a868" for f in rows]
    ax.barh(labels, values, color=colors)
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("GB/s (10^9 bytes per second, log scale)")
    ax.set_title(title, fontsize=10)
    for y, v in enumerate(values):
        ax.text(v * 1.05, y, f"{v:,.0f}", va="center", fontsize=8)
    ax.set_xlim(min(values) / 2, max(values) * 3)
    fig.tight_layout()
    return fig
