"""Two captures of the same program compared: what a change did to the step, the GPU and the kernels.

``python -m gpuprof diff BEFORE AFTER`` on two timeline captures (nsys or PyTorch
profiler, in any pairing): the headline numbers side by side with their ratio; kernel
time by kind, and convolution and matrix-product time by the precision their names
say; the kernels that appeared and disappeared; the kernels whose time changed most.

Kernels are matched by their demangled names, one row per template instance (between an nsys
export and a PyTorch profiler trace, by :func:`~gpuprof.report.activity_view.cross_tool_key`, the part
of the name both tools' demanglers print alike): a short
name is often generic (CUTLASS's ``Kernel2`` is an FP32 SIMT GEMM in one capture and a
bf16 tensor-core GEMM in the other, cuDNN's ``Kernel`` a convolution or a split-K
reduction, ATen's ``elementwise_kernel`` every elementwise operator), and matching by it
would hide a change of algorithm. The tables show the short name where it names one kernel
of the two captures, and the name with its template arguments where it names several.

Where both captures have steps, times are per step (the captures may hold different
numbers of steps) and count the work the steps launched; otherwise per capture, and the
page says which. Steps of different sizes (a batch of 32 against one of 1024) compare
only per unit of work: ``items_per_step`` (``--items-per-step``) turns each step into a
throughput.

On two Nsight Compute reports the launches are matched by kernel name (first launch of
each), and duration and Speed Of Light are compared.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..kernel_kinds import time_by_precision
from .activity_view import ActivityView, cross_tool_key, headline, kernel_labels, kernels_by_name
from .page import Page
from .timeline_page import HEADLINE_LABELS

__all__ = ["diff_timelines", "diff_ncu", "kernel_changes", "step_pace_ms"]


def _steps_per_process(view: ActivityView) -> float:
    procs = max(1, int(pd.Series(view.steps["pid"]).nunique())) if "pid" in view.steps else 1
    return len(view.steps) / procs


def _per(view: ActivityView, table: pd.DataFrame, columns: list[str], per_step: bool) -> pd.DataFrame:
    if per_step:
        table = table.copy()
        for c in columns:
            table[c] = table[c] / _steps_per_process(view)
    return table


def _by_cross_tool_key(table: pd.DataFrame) -> pd.DataFrame:
    """``kernels_by_name``'s table keyed by :func:`cross_tool_key` (the names the two tools print alike),
    summing the rows of any two demangled names that reduce to one key."""
    if table.empty:
        return table
    keyed = table.assign(demangled=table["demangled"].map(cross_tool_key))
    g = keyed.groupby("demangled", sort=False)
    return g.agg(name=("name", "first"), kind=("kind", "first"), count=("count", "sum"),
                 total_ms=("total_ms", "sum")).reset_index()[table.columns]


def kernel_changes(before: ActivityView, after: ActivityView) -> tuple[pd.DataFrame, bool]:
    """Per kernel (demangled name) in either capture: its label (:func:`~gpuprof.report.activity_view.kernel_labels`
    over both captures), kind, count and ms before and after (per step when both have steps), the change in
    ms, and the demangled name; the flag says whether the numbers are per step."""
    per_step = len(before.steps) > 0 and len(after.steps) > 0
    pairs = pd.concat([v.in_steps(v.kernels)[["name", "demangled"]] for v in (before, after)
                       if not v.kernels.empty and "demangled" in v.kernels], ignore_index=True)
    labels = kernel_labels(pairs.assign(demangled=pairs["demangled"].fillna(pairs["name"]))) if len(pairs) else {}
    b = _per(before, kernels_by_name(before, labels), ["count", "total_ms"], per_step)
    a = _per(after, kernels_by_name(after, labels), ["count", "total_ms"], per_step)
    if before.tool != after.tool:  # nsys and the PyTorch profiler spell one demangled name two ways
        b, a = _by_cross_tool_key(b), _by_cross_tool_key(a)
    m = b.merge(a, on="demangled", how="outer", suffixes=("_before", "_after"))
    m["name"] = m["name_before"].fillna(m["name_after"])
    m["kind"] = m["kind_before"].fillna(m["kind_after"])
    for c in ("count_before", "count_after", "total_ms_before", "total_ms_after"):
        m[c] = m[c].astype(float).fillna(0.0)
    m["change_ms"] = m["total_ms_after"] - m["total_ms_before"]
    cols = ["name", "kind", "count_before", "count_after", "total_ms_before", "total_ms_after", "change_ms", "demangled"]
    return m[cols].sort_values("change_ms", key=np.abs, ascending=False, ignore_index=True), per_step


def step_pace_ms(facts: dict[str, float]) -> float:
    """The step's pace: the slower of the CPU's start to start and the GPU's first operation to first
    operation. Over a long run the two agree; over a capture they need not: a CPU that runs ahead
    of the GPU opens its steps faster than the GPU ends them (its queue grows until a
    synchronisation), and a GPU that starts behind catches up. NaN without steps."""
    vals = [facts[k] for k in ("step_period_ms", "gpu_step_ms") if k in facts and np.isfinite(facts[k])]
    return max(vals) if vals else float("nan")


def _precision_changes(before: ActivityView, after: ActivityView, per_step: bool) -> pd.DataFrame:
    tb = _per(before, time_by_precision(before.in_steps(before.kernels)), ["kernels", "time_ms"], per_step)
    ta = _per(after, time_by_precision(after.in_steps(after.kernels)), ["kernels", "time_ms"], per_step)
    m = tb.merge(ta, on=["kind", "precision"], how="outer", suffixes=("_before", "_after"))
    for c in ("time_ms_before", "time_ms_after", "share_before", "share_after"):
        m[c] = m[c].astype(float).fillna(0.0)
    cols = ["kind", "precision", "time_ms_before", "share_before", "time_ms_after", "share_after"]
    return m[cols].sort_values(["kind", "precision"], ignore_index=True)


def _pace_change(before: float, after: float) -> str:
    """"2.68x shorter" or "1.96x longer": the larger over the smaller, so the factor is never under 1
    (a step that went from 1.492 to 2.918 ms once read "0.51x longer")."""
    if after == before:
        return "the same"
    return f"{before / after:.2f}x shorter" if after < before else f"{after / before:.2f}x longer"


def diff_timelines(before: ActivityView, after: ActivityView,
                   items_per_step: tuple[float, float] | None = None) -> Page:
    """The diff page for two timeline captures (see the module's text); ``items_per_step`` (before, after),
    the work one step does (a batch size), adds the throughput."""
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
    x, y = step_pace_ms(fb), step_pace_ms(fa)
    if np.isfinite(x) and np.isfinite(y) and y > 0:
        page.facts |= {"step_pace_ms_before": x, "step_pace_ms_after": y}
        rows.append({"measure": "step pace, the slower of the two (ms)", "before": x, "after": y, "after / before": y / x})
        lines.append(f"Step pace (the slower of the CPU's start to start and the GPU's first op to first op): "
                     f"{x:.3f} -> {y:.3f} ms, {_pace_change(x, y)}.")
        if items_per_step is not None:
            ib, ia = (float(v) for v in items_per_step)
            tb, ta = ib / x * 1e3, ia / y * 1e3
            page.facts |= {"items_per_s_before": tb, "items_per_s_after": ta}
            rows.append({"measure": "items per step (given)", "before": ib, "after": ia, "after / before": ia / ib})
            rows.append({"measure": "items per second (items over step pace)", "before": tb, "after": ta,
                         "after / before": ta / tb})
            lines.append(f"Throughput: {ib:,.0f} -> {ia:,.0f} items per step, {tb:,.0f} -> {ta:,.0f} items/s, {ta / tb:.2f}x.")
        elif not np.isclose(fb.get("kernels_per_step", 0), fa.get("kernels_per_step", 0), rtol=0.01):
            lines.append("The steps launch different work: if they process different amounts of data, compare "
                         "throughput (--items-per-step BEFORE,AFTER), not step times.")
    page.add("Summary", text="\n".join(lines), table=pd.DataFrame(rows), terminal_rows=30,
             note="Each capture over its own steps' window; kernels, copies and their times count the work the steps "
                  "launched.")
    kinds = changes.groupby("kind")[["total_ms_before", "total_ms_after", "change_ms"]].sum()
    kinds = kinds.sort_values("change_ms", key=np.abs, ascending=False).reset_index()
    page.add(f"Kernel time by kind, ms {unit}", table=kinds, terminal_rows=14)
    page.add(f"Convolution and matrix-product time by precision, ms {unit}", table=_precision_changes(before, after, per_step),
             terminal_rows=14, note="Precision as the demangled names say it (gpuprof.kernel_kinds.precision): f32f32_tf32f32 "
                                    "is FP32 data on TF32 tensor cores; ffma, simt and sgemm are FP32 on the CUDA cores; "
                                    "'unknown' names say nothing (helper kernels). share: of that kind's time.")
    gone = changes[(changes["count_before"] > 0) & (changes["count_after"] == 0)]
    new = changes[(changes["count_before"] == 0) & (changes["count_after"] > 0)]
    note = (f"Counts and ms {unit}. One row per demangled name: the short name where it names one kernel of the "
            "two captures, with its template arguments where it names several.")
    page.add(f"Kernels that appeared ({len(new)})", table=new[["name", "kind", "count_after", "total_ms_after"]],
             terminal_rows=10, width=90, note=note)
    page.add(f"Kernels that disappeared ({len(gone)})", table=gone[["name", "kind", "count_before", "total_ms_before"]],
             terminal_rows=10, width=90, note=note)
    page.add("Largest changes", table=changes.drop(columns="demangled"), terminal_rows=10, html_rows=60, width=90,
             note=f"ms {unit}, largest |change| first.")
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
