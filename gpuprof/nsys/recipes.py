"""Nsight Systems' recipes (``nsys recipe``) set beside gpuprof: what each computes, checked on the same reports.

``nsys recipe NAME --input REPORT... --output DIR`` (Nsight Systems 2025.3) runs an
analysis over one or many reports and writes its tables as Parquet (read here from the
CSV copies the course keeps: ``scripts/capture_report_refs.py``). A reader with a folder
of reports reaches for them; these functions say which gpuprof measure each equals and
prove it on the course's captures (``tests/test_report.py``), or say exactly where the
two differ:

* ``cuda_gpu_kern_sum``: per **short** kernel name (template instances merged, unlike
  ``nsys stats``' demangled names), count, mean, min, max, sum: equal to a group-by of
  :func:`gpuprof.nsys.sqlite.kernels` by ``name``; its quartiles and standard deviation
  are marked "(approx)" by the recipe and are not compared.
* ``gpu_time_util``: "In-Use", the percent of the window from the first to the last GPU
  operation (kernels, copies, memsets) in which one ran: :func:`gpuprof.activity.busy_fraction`
  over all the GPU's work, printed by the recipe to one decimal.
* ``nvtx_gpu_proj_sum``: per NVTX range name, the GPU "projection" of each instance (first
  start to last end of the work launched inside it, on the range's own thread) summed:
  :func:`gpuprof.activity.range_busy` with ``rule="thread"``, column ``gpu_span_ms``, over
  kernels, copies and memsets; and the ranges' CPU time.
* ``nccl_gpu_overlap_trace`` (over one report per rank): per kernel, "Compute Overlap", the percent of
  an NCCL kernel's time during which a non-NCCL kernel ran: per NCCL kernel, the ``hidden_ns`` over
  ``duration_ns`` of :func:`gpuprof.nsys.ranks.collective_kernels`, printed to one decimal
  (:func:`overlap_trace_check`; the recipe keeps each report on its own session clock, the course
  puts them on the earliest's);
  Its grouped table is, per kernel name, those percentages weighted by the kernels' durations over the
  whole run (:func:`grouped_overlap_check`), so a few long set-up collectives with no overlap pull it far
  below the timed steps' share;
* ``nccl_sum`` (idem): per NCCL **API call** (``ncclAllGather``, ..., the NVTX ranges NCCL itself
  emits on the CPU: their duration is the call's, not the transfer's), count and statistics per
  rank; its count per collective equals the number of NCCL kernels of that collective the
  overlap trace lists for the rank (:func:`nccl_sum_counts`), one kernel per call here.
* ``diff`` (over two outputs of one statistical recipe): per name of the **first** output,
  first minus second; names only in the second are left out and names only in the first
  get empty values. ``python -m gpuprof diff`` lists both kinds and subtracts the other way
  (after minus before).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .. import activity
from . import sqlite as ns

__all__ = ["kern_sum_check", "time_util_check", "nvtx_proj_check", "diff_check", "read_recipe_csv",
           "overlap_trace_check", "grouped_overlap_check", "nccl_sum_counts"]


def _work(path: str | Path) -> pd.DataFrame:
    parts = [d[["start", "end", "correlationId"]] for d in (ns.kernels(path, launch=False), ns.memcpy(path), ns.memset(path))
             if len(d)]
    return pd.concat(parts, ignore_index=True)


def kern_sum_check(recipe: pd.DataFrame, path: str | Path) -> pd.DataFrame:
    """Per kernel short name: the recipe's Count, Sum, Min, Max, Mean beside gpuprof's, and ``equal``
    (counts and integer nanoseconds exact; the mean to the recipe's 0.1 ns)."""
    k = ns.kernels(path, launch=False)
    g = k.groupby("name")["duration_ns"]
    mine = pd.DataFrame({"count": g.size(), "sum": g.sum(), "min": g.min(), "max": g.max(), "mean": g.mean()})
    r = recipe.set_index("Name")[["Count", "Sum", "Min", "Max", "Mean"]]
    j = mine.join(r, how="outer")
    j["equal"] = ((j["count"] == j["Count"]) & (j["sum"] == j["Sum"]) & (j["min"] == j["Min"]) & (j["max"] == j["Max"])
                  & np.isclose(j["mean"], j["Mean"], atol=0.051))
    return j.reset_index().rename(columns={"index": "Name"})


def time_util_check(recipe: pd.DataFrame, path: str | Path) -> pd.DataFrame:
    """Per window row of ``gpu_time_util``: its In-Use percent beside gpuprof's busy percent over the same
    window, and ``equal`` (to the recipe's one printed decimal)."""
    work = _work(path)
    start = recipe["Start"].to_numpy(dtype=np.int64)
    end = start + recipe["Duration"].to_numpy(dtype=np.int64)
    out = pd.DataFrame({"start_ns": start, "duration_ns": end - start,
                        "recipe_in_use_pct": recipe["In-Use"].to_numpy(dtype=float),
                        "gpuprof_busy_pct": [100 * activity.busy_fraction(work, (int(a), int(b))) for a, b in zip(start, end)]})
    out["equal"] = (out["gpuprof_busy_pct"].round(1) - out["recipe_in_use_pct"]).abs() < 0.051
    return out


def nvtx_proj_check(recipe: pd.DataFrame, path: str | Path) -> pd.DataFrame:
    """Per NVTX range name: the recipe's Count, Sum (projected GPU ns) and CPU sum beside gpuprof's, and ``equal``."""
    rb = activity.range_busy(_work(path), ns.runtime_calls(path), ns.nvtx_ranges(path), rule="thread")
    rb = rb[rb["launches"] > 0]  # a range that launched nothing has no projection
    g = rb.groupby("text")
    mine = pd.DataFrame({"count": g.size(), "gpu_ns": (g["gpu_span_ms"].sum() * 1e6).round(),
                         "cpu_ns": (g["cpu_ms"].sum() * 1e6).round()})
    r = recipe.set_index("Text")[["Count", "Sum", "Sum of NVTX Ranges on CPU"]]
    j = mine.join(r, how="outer")
    j["equal"] = ((j["count"] == j["Count"]) & ((j["gpu_ns"] - j["Sum"]).abs() <= 1)
                  & ((j["cpu_ns"] - j["Sum of NVTX Ranges on CPU"]).abs() <= 1))
    return j.reset_index().rename(columns={"index": "Text"})


def diff_check(recipe: pd.DataFrame, first: pd.DataFrame, second: pd.DataFrame) -> pd.DataFrame:
    """The ``diff`` recipe over two ``cuda_gpu_kern_sum`` outputs, recomputed from those two outputs:
    per name of the first, first minus second; ``equal`` where the recipe says so (both empty for a name
    the second lacks)."""
    r = recipe.set_index("Name")
    a, b = first.set_index("Name"), second.set_index("Name")
    cols = ["Count", "Sum", "Min", "Max", "Mean"]
    mine = (a[cols] - b[cols].reindex(a.index))
    j = mine.merge(r[cols], how="outer", left_index=True, right_index=True, suffixes=("", "_recipe"))
    both_nan = j[cols].isna().all(axis=1) & j[[f"{c}_recipe" for c in cols]].isna().all(axis=1)
    close = np.column_stack([np.isclose(j[c], j[f"{c}_recipe"], atol=1e-6) for c in cols]).all(axis=1)
    j["equal"] = both_nan | close
    j["only_in"] = np.where(~j.index.isin(b.index), "first", "")
    return j.reset_index().rename(columns={"index": "Name"})


def read_recipe_csv(path: str | Path) -> pd.DataFrame:
    """One of a recipe's CSV tables (plain or gzipped, as the course keeps the larger ones)."""
    return pd.read_csv(path, compression="gzip" if str(path).endswith(".gz") else None)


def overlap_trace_check(trace: pd.DataFrame, data: dict) -> pd.DataFrame:
    """``nccl_gpu_overlap_trace``'s rank trace (rows of NCCL kernels; ``Rank`` is the report's place in the
    recipe's ``--input`` list, the course's scripts give them in rank order) beside the course's per-kernel
    hidden share, for every NCCL kernel of ``data`` (:func:`gpuprof.nsys.ranks.rank_data` of the same
    reports, trimmed or not). Matched by rank, name and start and end on the report's own clock: rank_data
    shifted each report by its session start minus the earliest's, shifted back here.

    Columns: rank, kind, name, start (the report's clock), duration_ns, course_pct (100 x hidden / duration),
    recipe_pct ("Compute Overlap"; NaN where the recipe has no such kernel), difference. The recipe prints one
    decimal, so equal measures differ by at most 0.05."""
    from .ranks import collective_kernels

    starts = {r: ns.session_start(d.source) for r, d in data.items()}
    first = min(s for s in starts.values() if s is not None) if all(s is not None for s in starts.values()) else None
    rows = []
    for r, d in sorted(data.items()):
        k = collective_kernels(d)
        shift = (starts[r] - first) if first is not None else 0
        k = k.assign(rank=r, start=k["start"] - shift, end=k["end"] - shift)
        rows.append(k)
    ours = pd.concat(rows, ignore_index=True)
    theirs = trace.rename(columns={"Rank": "rank", "Name": "name", "Start": "start", "End": "end",
                                   "Compute Overlap": "recipe_pct"})[["rank", "name", "start", "end", "recipe_pct"]]
    m = ours.merge(theirs, on=["rank", "name", "start", "end"], how="left")
    m["course_pct"] = 100 * m["hidden_ns"] / m["duration_ns"].where(m["duration_ns"] > 0)
    m["difference"] = m["course_pct"] - m["recipe_pct"]
    return m[["rank", "kind", "name", "start", "duration_ns", "course_pct", "recipe_pct", "difference"]]


def nccl_sum_counts(rank_stats: pd.DataFrame, trace: pd.DataFrame) -> pd.DataFrame:
    """Per rank and collective: ``nccl_sum``'s count of NCCL API calls (its ``rank_stats`` table; the
    communicator's set-up and tear-down calls left out) beside the NCCL kernels the overlap trace lists
    (``collective_kind`` of their names). Both recipes read the whole reports, warm-up steps included."""
    from .ranks import collective_kind, snake_case

    calls = rank_stats[rank_stats["Text"].str.match(r"nccl(?!Comm)")].copy()
    calls["kind"] = calls["Text"].str.replace("nccl", "", n=1).map(snake_case)
    kernels = trace.assign(kind=collective_kind(trace["Name"])).groupby(["Rank", "kind"]).size().rename("kernels")
    out = calls.rename(columns={"Rank": "rank", "Count": "calls"})[["rank", "kind", "calls"]]
    out = out.merge(kernels.reset_index().rename(columns={"Rank": "rank"}), on=["rank", "kind"], how="outer")
    return out.sort_values(["rank", "kind"]).reset_index(drop=True)


def grouped_overlap_check(trace: pd.DataFrame, grouped: pd.DataFrame) -> pd.DataFrame:
    """``nccl_gpu_overlap_trace``'s grouped table (``Name``, ``Count``, ``Compute Overlap``) for the NCCL kernels,
    beside the duration-weighted mean of the rank trace's per-kernel "Compute Overlap" and its plain mean: the
    recipe's figure is the weighted one. Columns: name, count, recipe_pct, weighted_pct, mean_pct, longest_ms
    (the name's longest kernel), difference (recipe minus weighted)."""
    t = trace.assign(dur=trace["End"] - trace["Start"])
    by = t.groupby("Name")
    out = pd.DataFrame({
        "count": by.size(),
        "weighted_pct": by.apply(lambda x: float((x["Compute Overlap"] * x["dur"]).sum() / x["dur"].sum())),
        "mean_pct": by["Compute Overlap"].mean(), "longest_ms": by["dur"].max() / 1e6})
    g = grouped.set_index("Name")
    out.insert(1, "recipe_pct", g.reindex(out.index)["Compute Overlap"])
    out["difference"] = out["recipe_pct"] - out["weighted_pct"]
    return out.rename_axis("name").reset_index()
