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

__all__ = ["kern_sum_check", "time_util_check", "nvtx_proj_check", "diff_check"]


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
