"""The ``nsys stats`` summary reports, computed from a sqlite export, column for column.

``nsys stats --report NAME`` prints a table per report; these functions compute the same
tables from the tables :mod:`gpuprof.nsys.sqlite` reads, so that a reader can move
between the tool's report and their own code, filter first (one NVTX range, one
stream), and trust that the numbers mean the same thing. Each is tested against CSVs
that ``nsys stats --format csv`` wrote for a real capture.

=========================  ===============================================================
report                     function
=========================  ===============================================================
``cuda_gpu_kern_sum``      :func:`kernel_summary` (GPU time per kernel name)
``nvtx_sum``               :func:`nvtx_summary` (time per NVTX range name and style)
``cuda_gpu_mem_time_sum``  :func:`memop_time_summary` (GPU time per copy direction / memset)
``cuda_gpu_mem_size_sum``  :func:`memop_size_summary` (megabytes per copy direction / memset)
``cuda_api_sum``           :func:`api_summary` (CPU time per CUDA API function)
=========================  ===============================================================

Conventions taken from nsys itself: statistics are over integer nanoseconds, the
standard deviation is the sample one (n - 1), megabytes are 10**6 bytes, and an API
name that ends in a six-character version suffix (``_v7000``, ``_v3020``) is reported
without it, while longer or shorter suffixes stay (``cudaStreamIsCapturing_v10000``,
``cuGetProcAddress_v2``): see :func:`api_name`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..activity import api_name, name_codes
from .sqlite import pid_of, tid_of

__all__ = ["kernel_summary", "group_stats", "summary_table", "nvtx_kern_parts", "nvtx_kern_table", "outside_table", "nvtx_summary", "nvtx_kern_summary", "memop_time_summary", "memop_size_summary", "api_summary", "api_name",
           "memop_operations", "compare_summaries", "EXACT_COLUMNS", "FLOAT_COLUMNS"]


def group_stats(keys: np.ndarray, values: np.ndarray) -> pd.DataFrame:
    """Per distinct key (in order of first appearance; a missing key left out, as pandas' groupby does): sum, size,
    mean, median, min, max and std (n - 1; NaN for one value) of the integer ``values``.

    Apart from :func:`summary_table` so that a reader of an export too large to hold (gpuprof.report.lean_nsys)
    can compute the same statistics in groups of keys at a time: each group's values, in their order, meet the
    same pandas reductions, so the numbers are the same to the last bit."""
    g = pd.DataFrame({"key": keys, "v": np.asarray(values, dtype=np.int64)}).groupby("key", sort=False)["v"]
    return pd.DataFrame({"sum": g.sum(), "size": g.size(), "mean": g.mean(), "median": g.median(), "min": g.min(),
                         "max": g.max(), "std": g.std(ddof=1)})


def summary_table(stats: pd.DataFrame, key_name: str, *, count: str = "Instances", unit: str = "ns",
                  scale: float = 1.0) -> pd.DataFrame:
    """The ``nsys stats`` table from :func:`group_stats`' statistics (see :func:`_summary`)."""
    out = pd.DataFrame({
        f"Total{' Time' if unit == 'ns' else ''} ({unit})": stats["sum"] / scale,
        count: stats["size"],
        f"Avg ({unit})": stats["mean"] / scale,
        f"Med ({unit})": stats["median"] / scale,
        f"Min ({unit})": stats["min"] / scale,
        f"Max ({unit})": stats["max"] / scale,
        f"StdDev ({unit})": stats["std"].fillna(0.0) / scale,
    })
    total = out.columns[0]
    if unit == "ns":
        out.insert(0, "Time (%)", 100 * out[total] / out[total].sum())
    out.index.name = key_name
    return out.sort_values([total], ascending=False, kind="stable").reset_index()


def _summary(values: pd.Series, keys: pd.Series, key_name: str, *, count: str = "Instances", unit: str = "ns",
             scale: float = 1.0) -> pd.DataFrame:
    """The statistics ``nsys stats`` prints per name: share, total, count, mean, median, min, max, stddev.

    ``values`` are integers (nanoseconds or bytes); ``scale`` divides them for display
    units (bytes to MB) after the integer statistics are taken.
    """
    return summary_table(group_stats(keys.to_numpy(), values.to_numpy(dtype=np.int64)), key_name, count=count,
                         unit=unit, scale=scale)


def kernel_summary(kernels: pd.DataFrame, by: str = "demangled") -> pd.DataFrame:
    """Per kernel, like ``cuda_gpu_kern_sum`` (same columns, same order).

    ``by="demangled"`` groups by full names, as nsys stats does; ``by="name"`` by short
    names, which merges template instances into one row and reads better in a table.
    """
    return _summary(kernels["duration_ns"], kernels[by], "Name")


def nvtx_summary(ranges: pd.DataFrame) -> pd.DataFrame:
    """Per NVTX range name and style, like ``nvtx_sum``: push/pop and start/end ranges.

    ``nsys stats`` names a range ``:text`` (its domain before the colon, empty for the
    default domain) and reports push/pop and start/end ranges of one name as separate
    rows, with a ``Style`` column (``PushPop``, ``StartEnd``); so does this
    summary, so that the two can be compared directly. Ranges read before the ``style``
    column existed count as push/pop.
    """
    domain = ranges["domain"].where(ranges["domain"] != "default", "")
    style = ranges["style"] if "style" in ranges else pd.Series("PushPop", index=ranges.index)
    out = _summary(ranges["duration_ns"], style.astype(str) + "\t" + domain + ":" + ranges["text"], "Range")
    parts = out["Range"].str.split("\t", n=1, expand=True)
    out["Range"] = parts[1] if len(out) else out["Range"]
    out.insert(0, "Style", parts[0] if len(out) else pd.Series(dtype=str))
    return out


def nvtx_kern_summary(kernels: pd.DataFrame, runtime: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    """Kernels per NVTX range, like ``nsys stats --report nvtx_kern_sum`` (same columns, rows, order).

    nsys's rule, read from its output: a kernel belongs to **every** NVTX range open on the
    thread that launched it at the moment of the launch call (so a ``step`` range counts the
    kernels of the ``forward`` range nested in it too); a kernel launched outside every range
    (PyTorch's autograd thread opens none) is a row with an empty range and ``NVTX Inst`` 0. Rows are (range, style, PID, TID, kernel name):
    ``NVTX Inst`` counts the instances of the range that launched the kernel, ``Kern Inst``
    the kernels, then the duration statistics of those kernels. nsys publishes no such
    function (users compose it from ``nvtx_sum`` and ``cuda_gpu_kern_sum``, which cannot
    say which range launched what); this one is tested cell by cell against nsys's CSV.
    """
    return nvtx_kern_table(nvtx_kern_parts(kernels, runtime, ranges))


NVTX_KERN_COLUMNS = ["NVTX Range", "Style", "PID", "TID", "NVTX Inst", "Kern Inst", "Total Time (ns)", "Avg (ns)",
                     "Med (ns)", "Min (ns)", "Max (ns)", "StdDev (ns)", "Kernel Name"]


def nvtx_kern_parts(kernels: pd.DataFrame, runtime: pd.DataFrame, ranges: pd.DataFrame) -> list[pd.DataFrame]:
    """The rows of :func:`nvtx_kern_summary` before they are put together: the groups of the kernels inside ranges,
    then those outside every range (empty list: no kernel with a launching call)."""
    from ..activity import attribute_kernels, launches_of

    # only the columns read below: at 5 million kernels every column more was 40 MB in each of two merges
    k = kernels[["start", "correlationId", "duration_ns", "demangled"]].dropna(subset=["correlationId"])
    if k.empty or runtime.empty:
        return []
    ranges = ranges.reset_index(drop=True)
    # A CUDA graph launch is one call with one correlation id for all its kernels: kernels are
    # told apart by their row (_kid), never by correlation id.
    k = k.assign(_kid=np.arange(len(k)))
    launches = launches_of(k, runtime)  # once, for the kernels inside ranges and those outside
    hits = attribute_kernels(k, runtime, ranges.assign(text=np.arange(len(ranges)).astype(str)), rule="thread",
                             launches=launches)
    rid = hits["range_text"].astype(int).to_numpy()
    r = ranges.loc[rid]
    inside = hits[["_kid", "duration_ns", "demangled"]].assign(
        globalTid=hits["launch_tid"].to_numpy(), instance=rid,
        range=[f"{d}:{t}" for d, t in zip(r["domain"].where(r["domain"] != "default", ""), r["text"])],
        style=r["style"].to_numpy() if "style" in r else "PushPop")
    away = ~launches["_kid"].isin(hits["_kid"]).to_numpy()
    del hits
    outside_part = _outside_groups(launches, away)  # None: grouped as the kernels inside are, below
    outside = (launches.loc[away, ["_kid", "duration_ns", "demangled", "launch_tid"]].rename(columns={"launch_tid": "globalTid"})
               if outside_part is None else launches.iloc[0:0])
    del launches
    # Inside and outside every range are grouped apart (no group holds both: an inside row's range is never "",
    # and the final sort is by every key), so the kernels outside, millions in a long capture, never get range,
    # style and instance columns of their own.
    keys = ["range", "style", "PID", "TID", "demangled"]
    parts = []
    for rows, fixed in ((inside, None), (outside, {"range": "", "style": ""})):
        if fixed is not None and outside_part is not None:
            if len(outside_part):
                parts.append(outside_part.assign(range="", style=""))
            continue
        if rows.empty:
            continue
        tid = rows["globalTid"].to_numpy(dtype=np.int64)  # nsys packs the process and thread ids into one
        rows = rows.assign(PID=pid_of(tid), TID=tid_of(tid))
        g = rows.groupby(keys if fixed is None else keys[2:], sort=False)
        d = g["duration_ns"]
        nvtx_inst = (g["instance"].agg(lambda x: int((x.unique() >= 0).sum())) if fixed is None
                     else pd.Series(0, index=d.size().index))
        part = pd.DataFrame({"NVTX Inst": nvtx_inst,
                             "Kern Inst": d.size(), "Total Time (ns)": d.sum(), "Avg (ns)": d.mean(), "Med (ns)": d.median(),
                             "Min (ns)": d.min(), "Max (ns)": d.max(), "StdDev (ns)": d.std(ddof=1).fillna(0.0)}).reset_index()
        if fixed is not None:
            part.insert(0, "style", fixed["style"])
            part.insert(0, "range", fixed["range"])
        parts.append(part)
    return parts


def nvtx_kern_table(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """:func:`nvtx_kern_summary`'s table from its groups' rows (:func:`nvtx_kern_parts`, then the kernels outside
    every range, as :func:`outside_table` makes them, with empty ``range`` and ``style``)."""
    if not parts:
        return pd.DataFrame(columns=NVTX_KERN_COLUMNS)
    out = pd.concat(parts, ignore_index=True)
    out = out.rename(columns={"range": "NVTX Range", "style": "Style", "demangled": "Kernel Name"})
    out = out.sort_values(["NVTX Range", "Style", "PID", "TID", "Total Time (ns)", "Kernel Name"],
                          ascending=[True, True, True, True, False, True], kind="stable", ignore_index=True)
    return out[NVTX_KERN_COLUMNS]


def _outside_groups(launches: pd.DataFrame, away: np.ndarray) -> pd.DataFrame | None:
    """The statistics of :func:`nvtx_kern_summary`'s kernels outside every range, grouped by one integer key per
    (thread, demangled name) instead of by PID, TID and the name's text: pandas then builds one hash table of
    integers, not three (one of strings), over millions of rows. The groups, and the rows in each, in their
    order, are those of the three keys; None where two threads' ids share a (PID, TID) (then they are not).
    ``away``: which rows of ``launches`` (:func:`gpuprof.activity.launches_of`) are outside every range; they
    are not copied out first."""
    tid_code, tids = name_codes(launches["launch_tid"].to_numpy(dtype=np.int64))
    tids = tids.astype(np.int64)
    if len({(int(p), int(t)) for p, t in zip(pid_of(tids), tid_of(tids))}) != len(tids):
        return None
    dem_code, dems = name_codes(launches["demangled"])
    away = away & ~pd.isna(dems)[dem_code]  # groupby leaves a missing name out
    key = tid_code[away] * len(dems) + dem_code[away]
    del tid_code, dem_code
    stats = group_stats(key, launches["duration_ns"].to_numpy()[away])
    return outside_table(stats, tids, dems)


def outside_table(stats: pd.DataFrame, tids: np.ndarray, dems: np.ndarray) -> pd.DataFrame:
    """:func:`_outside_groups`' rows from :func:`group_stats` keyed by ``thread code * len(dems) + name code``
    (``tids``: the threads' globalTid, ``dems``: the names, by code)."""
    out = pd.DataFrame({"Kern Inst": stats["size"], "Total Time (ns)": stats["sum"], "Avg (ns)": stats["mean"],
                        "Med (ns)": stats["median"], "Min (ns)": stats["min"], "Max (ns)": stats["max"],
                        "StdDev (ns)": stats["std"].fillna(0.0)})
    k = out.index.to_numpy()
    tid = tids[k // len(dems)]
    out.insert(0, "NVTX Inst", 0)
    out.insert(0, "demangled", dems[k % len(dems)])
    out.insert(0, "TID", tid_of(tid))
    out.insert(0, "PID", pid_of(tid))
    return out.reset_index(drop=True)


def memop_operations(copies: pd.DataFrame, memsets: pd.DataFrame | None = None) -> pd.DataFrame:
    """Copies and memsets as one table of operations named the way nsys names them:
    ``[CUDA memcpy Host-to-Device]``, ``[CUDA memset]``; columns operation, duration_ns, bytes."""
    parts = []
    if copies is not None and not copies.empty:
        parts.append(pd.DataFrame({"operation": "[CUDA memcpy " + copies["kind"].astype(str) + "]",
                                   "duration_ns": copies["duration_ns"], "bytes": copies["bytes"]}))
    if memsets is not None and not memsets.empty:
        parts.append(pd.DataFrame({"operation": "[CUDA memset]", "duration_ns": memsets["duration_ns"],
                                   "bytes": memsets["bytes"]}))
    if not parts:
        return pd.DataFrame(columns=["operation", "duration_ns", "bytes"])
    return pd.concat(parts, ignore_index=True)


def memop_time_summary(copies: pd.DataFrame, memsets: pd.DataFrame | None = None) -> pd.DataFrame:
    """GPU time per memory operation, like ``cuda_gpu_mem_time_sum``."""
    ops = memop_operations(copies, memsets)
    return _summary(ops["duration_ns"], ops["operation"], "Operation", count="Count")


def memop_size_summary(copies: pd.DataFrame, memsets: pd.DataFrame | None = None) -> pd.DataFrame:
    """Megabytes (10**6 bytes) per memory operation, like ``cuda_gpu_mem_size_sum``."""
    ops = memop_operations(copies, memsets)
    return _summary(ops["bytes"], ops["operation"], "Operation", count="Count", unit="MB", scale=1e6)


def api_summary(runtime: pd.DataFrame) -> pd.DataFrame:
    """CPU time per CUDA API function, like ``cuda_api_sum``."""
    codes, uniq = name_codes(runtime["name"])  # api_name once per distinct name
    mapped = np.array([api_name(str(u)) for u in uniq], dtype=object)
    names = pd.Series(mapped[codes] if len(uniq) else np.array([], dtype=object), index=runtime.index)
    return _summary(runtime["end"] - runtime["start"], names, "Name", count="Num Calls")


EXACT_COLUMNS = ["Total Time (ns)", "Instances", "Count", "Num Calls", "Min (ns)", "Max (ns)"]
FLOAT_COLUMNS = ["Avg (ns)", "Med (ns)", "StdDev (ns)"]
MB_COLUMNS = ["Total (MB)", "Avg (MB)", "Med (MB)", "Min (MB)", "Max (MB)", "StdDev (MB)"]


def compare_summaries(mine: pd.DataFrame, theirs: pd.DataFrame, key: str, *, float_tol_ns: float = 1.0,
                      mb_tol: float = 0.0006) -> str:
    """Check a summary from this module against the CSV ``nsys stats`` wrote; raise on any disagreement.

    Integer columns (totals, counts, min, max in ns) must be identical; means, medians and
    standard deviations, which nsys prints rounded to one decimal, must agree within
    ``float_tol_ns``; megabyte columns, printed with three decimals, within ``mb_tol``.
    Keys are compared after stripping surrounding whitespace. Returns a one-line verdict.
    """
    a = mine.assign(_k=mine[key].astype(str).str.strip()).set_index("_k")
    b = theirs.assign(_k=theirs[key].astype(str).str.strip()).set_index("_k")
    if set(a.index) != set(b.index):
        only_a, only_b = sorted(set(a.index) - set(b.index))[:5], sorted(set(b.index) - set(a.index))[:5]
        raise AssertionError(f"different {key} sets: only here {only_a}, only in nsys stats {only_b}")
    b = b.loc[a.index]
    if "Style" in a and "Style" in b and not (a["Style"].astype(str) == b["Style"].astype(str)).all():
        raise AssertionError(f"Style differs for {list(a.index[a['Style'].astype(str) != b['Style'].astype(str)][:3])}")
    exact = [c for c in EXACT_COLUMNS if c in a and c in b]
    for col in exact:
        diff = (a[col].astype("int64") - b[col].astype("int64")).abs()
        if diff.max() != 0:
            raise AssertionError(f"{col} differs for {list(diff[diff > 0].index[:3])}: max {diff.max()}")
    worst_ns = worst_mb = 0.0
    for cols, tol, unit in ((FLOAT_COLUMNS, float_tol_ns, "ns"), (MB_COLUMNS, mb_tol, "MB")):
        for col in (c for c in cols if c in a and c in b):
            d = float((a[col].astype(float) - b[col].astype(float)).abs().max())
            if d > tol:
                raise AssertionError(f"{col} differs by up to {d:.4f} {unit} (tolerance {tol} {unit})")
            if unit == "ns":
                worst_ns = max(worst_ns, d)
            else:
                worst_mb = max(worst_mb, d)
    if any(c in a for c in MB_COLUMNS):
        return (f"{len(a)} {key.lower()}s: counts identical to nsys stats; "
                f"megabytes within {worst_mb:.4f} MB (nsys prints three decimals)")
    return (f"{len(a)} {key.lower()}s: totals, counts, min and max identical to nsys stats; "
            f"avg, median and stddev within {worst_ns:.2f} ns")
