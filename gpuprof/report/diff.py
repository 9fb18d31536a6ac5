"""Two captures of the same program compared: what a change did to the step, the GPU and the kernels.

``python -m gpuprof diff BEFORE AFTER`` on two timeline captures (nsys or PyTorch
profiler, in any pairing): the headline numbers side by side with their ratio; kernel
time by kind; the kernels that appeared and disappeared (by name: a change of algorithm
shows as one cuDNN kernel leaving and another arriving); the kernels whose time changed
most. Where both captures have steps, times are per step (the captures may hold
different numbers of steps); otherwise per capture, and the page says which.

On two Nsight Compute reports the launches are matched by kernel name (first launch of
each), and duration and Speed Of Light are compared.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .activity_view import ActivityView, headline, kernels_by_name
from .page import Page
from .timeline_page import HEADLINE_LABELS

__all__ = ["diff_timelines", "diff_ncu", "kernel_changes"]


def _per(view: ActivityView, table: pd.DataFrame, columns: list[str], per_step: bool) -> pd.DataFrame:
    if per_step:
        table = table.copy()
        for c in columns:
            table[c] = table[c] / len(view.steps)
    return table


def kernel_changes(before: ActivityView, after: ActivityView) -> tuple[pd.DataFrame, bool]:
    """Per kernel name in either capture: kind, count and ms before and after (per step when both have
    steps), and the change in ms; the flag says whether the numbers are per step."""
    per_step = len(before.steps) > 0 and len(after.steps) > 0
    b = _per(before, kernels_by_name(before), ["count", "total_ms"], per_step)
    a = _per(after, kernels_by_name(after), ["count", "total_ms"], per_step)
    m = b.merge(a, on="name", how="outer", suffixes=("_before", "_after"))
    m["kind"] = m["kind_before"].fillna(m["kind_after"])
    for c in ("count_before", "count_after", "total_ms_before", "total_ms_after"):
        m[c] = m[c].astype(float).fillna(0.0)
    m["change_ms"] = m["total_ms_after"] - m["total_ms_before"]
    cols = ["name", "kind", "count_before", "count_after", "total_ms_before", "total_ms_after", "change_ms"]
    return m[cols].sort_values("change_ms", key=np.abs, ascending=False, ignore_index=True), per_step


def diff_timelines(before: ActivityView, after: ActivityView) -> Page:
    """The diff page for two timeline captures (see the module's text)."""
    page = Page(title=f"{before.path.name} -> {after.path.name}", path=after.path, kind="diff")
    fb, fa = headline(before), headline(after)
    rows = []
    for key, label in HEADLINE_LABELS.items():
        if key in fb or key in fa:
            x, y = float(fb.get(key, np.nan)), float(fa.get(key, np.nan))
            rows.append({"measure": label, "before": x, "after": y,
                         "after / before": y / x if x and np.isfinite(x) and np.isfinite(y) else np.nan})
    page.facts = {f"{k}_before": float(v) for k, v in fb.items()} | {f"{k}_after": float(v) for k, v in fa.items()}
    changes, per_step = kernel_changes(before, after)
    unit = "per step" if per_step else "per capture (one of them has no steps)"
    lines = [f"Before: {before.path.name}, steps by {before.step_rule}.", f"After: {after.path.name}, steps by {after.step_rule}."]
    if "step_period_ms" in fb and "step_period_ms" in fa and fa["step_period_ms"]:
        x, y = fb["step_period_ms"], fa["step_period_ms"]
        lines.append(f"Step (start to start) {x:.3f} -> {y:.3f} ms: {x / y:.2f}x "
                     f"{'faster' if y < x else 'slower' if y > x else 'the same'}.")
    page.add("Summary", text="\n".join(lines), table=pd.DataFrame(rows), terminal_rows=20,
             note="Each capture over its own steps' window (first step's start to last step's end).")
    kinds = changes.groupby("kind")[["total_ms_before", "total_ms_after", "change_ms"]].sum()
    kinds = kinds.sort_values("change_ms", key=np.abs, ascending=False).reset_index()
    page.add(f"Kernel time by kind, ms {unit}", table=kinds, terminal_rows=14)
    gone = changes[(changes["count_before"] > 0) & (changes["count_after"] == 0)]
    new = changes[(changes["count_before"] == 0) & (changes["count_after"] > 0)]
    page.add(f"Kernels that appeared ({len(new)})", table=new[["name", "kind", "count_after", "total_ms_after"]],
             terminal_rows=10, note=f"Counts and ms {unit}.")
    page.add(f"Kernels that disappeared ({len(gone)})", table=gone[["name", "kind", "count_before", "total_ms_before"]],
             terminal_rows=10, note=f"Counts and ms {unit}.")
    page.add("Largest changes", table=changes, terminal_rows=10, html_rows=60, note=f"ms {unit}, largest |change| first.")
    return page


def diff_ncu(before: Path, before_kind: str, after: Path, after_kind: str) -> Page:
    """Two Nsight Compute captures: per kernel name (its first launch), duration and Speed Of Light before and after."""
    from .ncu_page import launch_table

    tb, _ = launch_table(before, before_kind)
    ta, _ = launch_table(after, after_kind)
    cols = ["duration_us", "sm_pct", "memory_pct", "dram_pct", "achieved_occupancy_pct"]
    b = tb.groupby("kernel")[cols].first()
    a = ta.groupby("kernel")[cols].first()
    m = b.merge(a, how="outer", left_index=True, right_index=True, suffixes=("_before", "_after")).reset_index()
    m["speedup"] = m["duration_us_before"] / m["duration_us_after"]
    page = Page(title=f"{before.name} -> {after.name}", path=after, kind="diff")
    order = ["kernel", "duration_us_before", "duration_us_after", "speedup"] + \
        [f"{c}_{w}" for c in cols[1:] for w in ("before", "after")]
    page.add("Per kernel (first launch of each name)", table=m[order], terminal_rows=20,
             note="speedup: duration before over after. Kernels in one report only have blanks on the other side.")
    return page
