"""Measures over GPU activity tables, whichever tool recorded them: the numbers a timeline makes you guess at.

The inputs are tables with the same columns whether they come from an Nsight Systems
export (:mod:`gpuprof.nsys.sqlite`) or a PyTorch profiler trace
(:mod:`gpuprof.torch_profiler.trace`): ``start`` and ``end`` in integer nanoseconds,
``name``, ``correlationId`` (pairs a kernel with the CPU call that launched it),
``streamId`` and ``globalTid`` (the CPU thread). So the two tools' captures are judged
by one definition of each measure:

* **GPU busy fraction**: the union of kernel intervals over a window (overlapping
  kernels on different streams count once);
* **idle gaps**: where the GPU ran nothing, each with the CUDA API calls the CPU was in
  at the time (a synchronisation, a blocking copy, a library load) and the share that no
  call covers (host code: Python, a library initialising, data loading), labelled by what
  covers at least half of it;
* **copy/compute overlap**: the share of copy time hidden under kernels running on
  other streams;
* **launch latency**: from the CPU's launch call to the kernel's start (:func:`launch_delays`: from
  the call's start and from its end, with the call's own duration);
* **service order**: whether work on several streams ran in the order the CPU issued it,
  and in which runs of one stream's items (:func:`service_order`);
* **synchronisation wait share**: CPU time spent in ``*Synchronize`` calls over a window;
* **attribution** of kernels to ranges (NVTX ranges, ``record_function`` or
  ``ProfilerStep#N`` annotations) by the launching thread or by time window;
* **steps**: which ranges are a program's steps (:func:`find_steps`, :func:`step_ranges`).

Steps. A training or inference loop repeats a step; per-step numbers need to know which
ranges are steps. By default: PyTorch's ``ProfilerStep#N``; else NVTX or
``record_function`` ranges named ``step`` / ``iteration`` with a number (``step_3``,
``iter 12``, ``train_step#4``); else one such name without a number, repeated. A program
that names its steps otherwise gives a regular expression (``--steps 'batch_(\\d+)'``).
:func:`find_steps` returns the rule it used with the steps, so a report can print it and a
reader can tell when it picked wrongly.

Everything is vectorised with NumPy/pandas so that a capture of a million kernels is
analysed in seconds (see ``scripts/bench_trace_analysis.py``). The ``nsys stats``
summaries are in :mod:`gpuprof.nsys.stats`.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd



def api_name(name: str) -> str:
    """A CUDA API function's name without its entry-point version suffix, by nsys's rule.

    An Nsight Systems export stores the versioned entry point (``cudaLaunchKernel_v7000``).
    nsys drops a suffix of exactly six characters that starts with ``_v`` (the four-digit
    CUDA version that introduced the entry point) and keeps every other name as it is, so
    ``cuGetProcAddress_v2`` (a different function from ``cuGetProcAddress``) and the
    five-digit ``cudaStreamIsCapturing_v10000`` keep theirs. PyTorch profiler traces
    carry plain names, which this leaves as they are.
    """
    return name[:-6] if len(name) > 6 and name[-6:-4] == "_v" else name

__all__ = ["api_name", "merge_intervals", "busy_fraction", "idle_gaps", "gap_calls", "HOST_CODE", "calls_with_work", "outside",
           "copy_summary", "copy_compute_overlap", "launch_latency", "launch_delays", "covered_lengths",
           "sync_wait_share", "window_of", "range_window", "last_repeat_window", "inside", "calls_by_range", "copy_curve",
           "exposed_copy_fraction", "exposed_ns", "attribute_kernels", "launches_of", "is_sorted", "name_codes", "ATTRIBUTION_RULES", "find_steps", "step_ranges",
           "STEP_NUMBERED", "STEP_REPEATED", "NUMBERED_STEP", "overlap_ns", "issue_order", "ServiceOrder", "service_order"]

SYNC_API = r"Synchronize"


FACTORIZE_CHUNK_ROWS = 1 << 20
_NA = object()  # the one key of every missing name, as pandas counts NaN and None as one value


def name_codes(values: pd.Series | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize(values, use_na_sentinel=False)`` (codes in order of first appearance, and the distinct values)
    in steps of :data:`FACTORIZE_CHUNK_ROWS` rows.

    pandas sizes its hash table for every row: 26 bytes a row of a column of kernel names, 129 MB at 5 million
    kernels for a few hundred names. Here each step's table is sized for one step, and the distinct values of
    the steps are joined in a dict."""
    arr = values.to_numpy() if isinstance(values, pd.Series) else np.asarray(values)
    codes = np.empty(len(arr), dtype=np.int64)
    index: dict = {}
    uniques: list = []
    for a in range(0, len(arr), FACTORIZE_CHUNK_ROWS):
        c, u = pd.factorize(arr[a:a + FACTORIZE_CHUNK_ROWS], use_na_sentinel=False)
        remap = np.empty(len(u), dtype=np.int64)
        for j, v in enumerate(u):
            key = _NA if pd.isna(v) is True else v
            if key not in index:
                index[key] = len(uniques)
                uniques.append(v)
            remap[j] = index[key]
        codes[a:a + FACTORIZE_CHUNK_ROWS] = remap[c]
    out = np.empty(len(uniques), dtype=object)
    out[:] = uniques
    return codes, out


def is_sorted(values: np.ndarray) -> bool:
    """Whether ``values`` never decrease (then a stable sort would leave them, and what goes with them, in place)."""
    return bool(len(values) < 2 or (values[1:] >= values[:-1]).all())


def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of [start, end) intervals as sorted, disjoint arrays."""
    if len(starts) == 0:
        return np.array([], dtype=np.int64), np.array([], dtype=np.int64)
    s, e = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    if not is_sorted(s):  # kernels and calls come sorted by start: no index array and no sorted copies then
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
    run_end = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    merged_s = s[idx]
    merged_e = np.maximum.reduceat(e, idx)
    return merged_s, merged_e


def _clip(s: np.ndarray, e: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    s2, e2 = np.clip(s, lo, hi), np.clip(e, lo, hi)
    keep = e2 > s2
    return s2[keep], e2[keep]


def window_of(df: pd.DataFrame) -> tuple[int, int]:
    """From the first start to the last end of a table's rows."""
    return int(df["start"].min()), int(df["end"].max())


def busy_fraction(intervals: pd.DataFrame, window: tuple[int, int] | None = None) -> float:
    """Share of ``window`` (default: the rows' own span) covered by at least one interval."""
    if intervals.empty:
        return 0.0
    lo, hi = window or window_of(intervals)
    s, e = merge_intervals(intervals["start"].to_numpy(), intervals["end"].to_numpy())
    s, e = _clip(s, e, lo, hi)
    return float((e - s).sum()) / (hi - lo) if hi > lo else 0.0


#: The label of an idle gap that CUDA calls cover less than half of: the CPU was running its own code.
HOST_CODE = "mostly host code"


def idle_gaps(kernels: pd.DataFrame, runtime: pd.DataFrame | None = None, *, min_gap_ns: int = 10_000,
              window: tuple[int, int] | None = None) -> pd.DataFrame:
    """Stretches of at least ``min_gap_ns`` where no kernel ran, longest first.

    With the runtime table, each gap gets what the CPU was doing during it:

    * ``cpu_call`` and ``cpu_call_share``: the CUDA API call that overlaps the gap most, and
      the share of the gap it covers (``""`` and 0 when none does);
    * ``covered_share``: the share of the gap inside *any* CUDA call (on any thread; nested
      and concurrent calls count once). The rest, ``1 - covered_share``, the CPU spent
      outside CUDA: Python, a library initialising, loading data;
    * ``label``: ``cpu_call`` when that one call covers at least half of the gap,
      :data:`HOST_CODE` when no call covers half of it and most of it is outside every
      call, else ``"several CUDA calls"``.

    A gap covered by ``cudaStreamSynchronize`` is the GPU waiting for nothing while the CPU
    waits for the GPU; a gap mostly outside every call is the CPU busy elsewhere. Naming a
    gap by its largest call alone misleads when that call covers a fifth of it: read
    ``covered_share`` (and :func:`gap_calls` for every call inside one gap) before the label.
    """
    cols = ["start", "end", "duration_ns", "cpu_call", "cpu_call_share", "covered_share", "label"]
    if kernels.empty:
        return pd.DataFrame(columns=cols)
    s, e = merge_intervals(kernels["start"].to_numpy(), kernels["end"].to_numpy())
    lo, hi = window or (int(s[0]), int(e[-1]))
    s, e = _clip(s, e, lo, hi)
    gap_s = np.concatenate([[lo], e])
    gap_e = np.concatenate([s, [hi]])
    keep = (gap_e - gap_s) >= min_gap_ns
    gs_all, ge_all = gap_s[keep], gap_e[keep]
    answers = None
    if runtime is not None and not runtime.empty and len(gs_all):
        rs, re_, names = runtime["start"].to_numpy(), runtime["end"].to_numpy(), runtime["name"].to_numpy()
        if not is_sorted(rs):
            order = np.argsort(rs, kind="stable")
            rs, re_, names = rs[order], re_[order], names[order]
        calls = np.full(len(gs_all), "", dtype=object)  # filled in arrays, assigned once: a cell-by-cell
        shares = np.zeros(len(gs_all))                    # DataFrame write cost a second per 40,000 gaps
        covered = np.zeros(len(gs_all))
        if all(a.dtype.kind in "iu" for a in (rs, re_, gs_all, ge_all)):
            _gap_calls(rs, re_, names, gs_all, ge_all, calls, shares, covered)
        else:  # times that are not integers (a missing one is NaN): call by call, as always
            longest = np.maximum.accumulate(re_ - rs).max() if len(rs) else 0
            for i, (gs, ge) in enumerate(zip(gs_all, ge_all)):
                first = np.searchsorted(rs, gs - longest)
                _one_gap(rs, re_, names, i, gs, ge, first, np.searchsorted(rs, ge), calls, shares, covered)
        answers = (calls, shares, covered)
    return gap_table(gs_all, ge_all, answers)


def gap_table(gap_s: np.ndarray, gap_e: np.ndarray,
              answers: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> pd.DataFrame:
    """:func:`idle_gaps`' table from the gaps (in time order) and, where there are CUDA calls, each gap's call that
    overlaps it most, its share and the share covered by any call (``answers``; None: no calls); apart so that a
    reader of an export too large to hold finds the answers in its own pass over the calls."""
    cols = ["start", "end", "duration_ns", "cpu_call", "cpu_call_share", "covered_share", "label"]
    gaps = pd.DataFrame({"start": gap_s, "end": gap_e})
    gaps["duration_ns"] = gaps["end"] - gaps["start"]
    gaps["cpu_call"], gaps["cpu_call_share"], gaps["covered_share"] = "", 0.0, 0.0
    if answers is not None:
        gaps["cpu_call"], gaps["cpu_call_share"], gaps["covered_share"] = answers
    gaps["label"] = np.select([gaps["cpu_call_share"].to_numpy() >= 0.5, gaps["covered_share"].to_numpy() < 0.5],
                              [gaps["cpu_call"].to_numpy(dtype=object), HOST_CODE], "several CUDA calls")
    return gaps.sort_values("duration_ns", ascending=False, ignore_index=True)[cols]


GAP_CALLS_AT_ONCE = 16
"""Gaps overlapped by at most this many CUDA calls are answered together, one array operation per call rank
(:func:`_gap_calls`); a gap that more calls overlap (inside a long synchronize) is answered on its own."""


def _one_gap(rs: np.ndarray, re_: np.ndarray, names: np.ndarray, i: int, gs: int, ge: int, first: int, last: int,
             calls: np.ndarray, shares: np.ndarray, covered: np.ndarray) -> None:
    """Gap ``i`` = [gs, ge) against the calls ``first:last`` (sorted by start): the call that overlaps it most (the
    first of equals), its share, and the share of the gap inside any call."""
    if last <= first:
        return
    cs, ce = np.maximum(rs[first:last], gs), np.minimum(re_[first:last], ge)
    ov = ce - cs
    j = int(np.argmax(ov))
    if ov[j] > 0:
        calls[i] = api_name(str(names[first + j]))
        shares[i] = float(ov[j]) / (ge - gs)
        hit = ov > 0  # starts are sorted, so the clipped intervals' union is one pass
        us, ue = merge_intervals(cs[hit], ce[hit])
        covered[i] = float((ue - us).sum()) / (ge - gs)


def _gap_calls(rs: np.ndarray, re_: np.ndarray, names: np.ndarray, gs: np.ndarray, ge: np.ndarray,
               calls: np.ndarray, shares: np.ndarray, covered: np.ndarray) -> None:
    """:func:`_one_gap` for every gap, on integer times: the calls a gap can meet start at the first call whose
    running maximum of ends passes the gap's start (none before it reaches into the gap) and stop before the gap's
    end. Gaps that at most :data:`GAP_CALLS_AT_ONCE` calls can meet are answered together: for the k-th call of
    each, its overlap (the largest so far kept, the first of equals, as argmax keeps) and its part of the union
    (calls sorted by start: what passes the union's end so far). A million gaps cost one Python step each
    otherwise (19 s at 20 million kernels)."""
    run_end = np.maximum.accumulate(re_)
    first = np.searchsorted(run_end, gs, side="right")
    count = np.maximum(np.searchsorted(rs, ge, side="left") - first, 0)
    few = count <= GAP_CALLS_AT_ONCE
    best = np.zeros(len(gs), dtype=np.int64)
    best_at = np.full(len(gs), -1, dtype=np.int64)
    union = np.zeros(len(gs), dtype=np.int64)
    reach = gs.astype(np.int64).copy()  # the union's end so far, per gap
    for k in range(int(count[few].max()) if few.any() else 0):
        g = np.flatnonzero(few & (count > k))
        at = first[g] + k
        a, b = np.maximum(rs[at], gs[g]), np.minimum(re_[at], ge[g])
        ov = b - a
        better = ov > best[g]
        best[g[better]], best_at[g[better]] = ov[better], at[better]
        union[g] += np.maximum(0, b - np.maximum(a, reach[g]))
        reach[g] = np.maximum(reach[g], b)
    hit = best > 0
    length = ge - gs
    shares[hit] = best[hit] / length[hit]
    covered[hit] = union[hit] / length[hit]
    short_names: dict[Any, str] = {}
    calls[hit] = [short_names.setdefault(n, api_name(str(n))) if n.__hash__ is not None else api_name(str(n))
                  for n in names[best_at[hit]]]
    for i in np.flatnonzero(~few):
        _one_gap(rs, re_, names, int(i), gs[i], ge[i], int(first[i]), int(first[i] + count[i]), calls, shares, covered)


def gap_calls(gap: tuple[int, int], runtime: pd.DataFrame) -> pd.DataFrame:
    """Every CUDA API call inside one idle gap, by name: calls, covered_ns (their time inside the
    gap) and share (of the gap), largest first; the row ``(outside any CUDA call)`` is the rest.

    The names' shares can add up to more than the covered time when calls nest (a driver call
    inside a runtime call) or run on two threads at once; the last row is computed from their
    union, as :func:`idle_gaps`' ``covered_share`` is.
    """
    lo, hi = gap
    cols = ["call", "calls", "covered_ns", "share"]
    r = runtime[(runtime["end"] > lo) & (runtime["start"] < hi)]
    cs, ce = r["start"].clip(lower=lo).to_numpy(), r["end"].clip(upper=hi).to_numpy()
    named = pd.DataFrame({"call": r["name"].astype(str).map(api_name).to_numpy(), "ns": ce - cs})
    g = named.groupby("call")["ns"]
    out = pd.DataFrame({"calls": g.size(), "covered_ns": g.sum()}).reset_index()
    out = out.sort_values(["covered_ns", "call"], ascending=[False, True], ignore_index=True)
    us, ue = merge_intervals(cs, ce)
    rest = (hi - lo) - int((ue - us).sum())
    out = pd.concat([out, pd.DataFrame([{"call": "(outside any CUDA call)", "calls": 0, "covered_ns": rest}])],
                    ignore_index=True)
    out["share"] = out["covered_ns"] / (hi - lo) if hi > lo else 0.0
    return out[cols]


def calls_with_work(runtime: pd.DataFrame, work: pd.DataFrame) -> pd.DataFrame:
    """Each GPU operation (kernel, copy, memset) beside the CUDA API call that queued it.

    The two are paired by ``correlationId``. Added columns: ``api`` (the call's name, without
    its version suffix), ``api_start``, ``api_end``, ``api_ns`` (CPU time inside the call),
    ``lead_ns`` (from the call's start to the work's start: the CPU's staging of a pageable
    copy, or the queue the work waited in) and ``end_to_end_ns`` (from the call's start to
    the later of the call's end and the work's end: what the program waited for, if it waited).

    A GPU-side duration alone cannot see the CPU's share of a copy: a copy from pageable
    memory is staged by the driver into a pinned buffer *before* its DMA starts.
    """
    calls = runtime[["correlationId", "start", "end", "name"]].rename(
        columns={"start": "api_start", "end": "api_end", "name": "api"})
    m = work.merge(calls, on="correlationId", how="inner")
    m["api"] = m["api"].astype(str).map(api_name)
    m["api_ns"] = m["api_end"] - m["api_start"]
    m["lead_ns"] = m["start"] - m["api_start"]
    m["end_to_end_ns"] = np.maximum(m["end"], m["api_end"]) - m["api_start"]
    return m


def outside(df: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``df`` that start outside every one of ``ranges`` (rows with ``start`` and ``end``):
    to leave out, say, the warm-up calls a script marks with a ``warmup`` range."""
    if ranges.empty or df.empty:
        return df
    s, e = merge_intervals(ranges["start"].to_numpy(), ranges["end"].to_numpy())
    t = df["start"].to_numpy()
    i = np.searchsorted(s, t, side="right") - 1
    within = (i >= 0) & (t < e[np.clip(i, 0, None)])
    return df[~within]


def copy_summary(copies: pd.DataFrame) -> pd.DataFrame:
    """Per copy direction and memory kinds: count, bytes, time, and bandwidth (bytes over busy time)."""
    if copies.empty:
        return pd.DataFrame(columns=["kind", "src_memory", "dst_memory", "count", "bytes", "time_ns", "gbps"])
    keys = [c for c in ("kind", "src_memory", "dst_memory") if c in copies]
    g = copies.groupby(keys)
    out = g.agg(count=("bytes", "size"), bytes=("bytes", "sum"), time_ns=("duration_ns", "sum")).reset_index()
    out["gbps"] = out["bytes"] / out["time_ns"]
    return out.sort_values(keys, ignore_index=True)  # a fixed order, whatever the timings


def copy_compute_overlap(copies: pd.DataFrame, kernels: pd.DataFrame) -> float:
    """Share of total copy time during which a kernel on *another* stream was running.

    1.0: every copy was hidden under compute; 0.0: copies and kernels were serialised.
    """
    if copies.empty:
        return 0.0
    total = float(copies["duration_ns"].sum())
    hidden = 0.0
    for stream, group in copies.groupby("streamId"):
        others = kernels[kernels["streamId"] != stream]
        if others.empty:
            continue
        ks, ke = merge_intervals(others["start"].to_numpy(), others["end"].to_numpy())
        cum = np.concatenate([[0], np.cumsum(ke - ks)])
        for cs, ce in zip(group["start"].to_numpy(), group["end"].to_numpy()):
            hidden += _covered(ks, ke, cum, int(cs), int(ce))
    return hidden / total if total else 0.0


def covered_lengths(starts: np.ndarray, ends: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For each window [lo, hi), how much of it the intervals (starts, ends) cover (overlaps counted once).

    The windows may be many (every piece of every range's self time, say): the intervals are
    merged once and each window is answered from prefix sums, without a loop over windows.
    """
    lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
    if len(starts) == 0 or len(lo) == 0:
        return np.zeros(len(lo), dtype=np.int64)
    ks, ke = merge_intervals(np.asarray(starts), np.asarray(ends))
    cum = np.concatenate([[0], np.cumsum(ke - ks)])
    i = np.searchsorted(ke, lo, side="right")  # first interval ending after lo
    j = np.searchsorted(ks, hi, side="left")   # first interval starting at or after hi
    some = j > i
    ii, jj = np.minimum(i, len(ks) - 1), np.maximum(j - 1, 0)
    inner = cum[j] - cum[i] - np.maximum(0, lo - ks[ii]) - np.maximum(0, ke[jj] - hi)
    return np.where(some, np.maximum(0, inner), 0).astype(np.int64)


def _covered(ks: np.ndarray, ke: np.ndarray, cum: np.ndarray, lo: int, hi: int) -> float:
    """Length of [lo, hi) covered by the disjoint sorted intervals (ks, ke), via prefix sums."""
    i = np.searchsorted(ke, lo, side="right")  # first interval ending after lo
    j = np.searchsorted(ks, hi, side="left")   # first interval starting at or after hi
    if j <= i:
        return 0.0
    inner = cum[j] - cum[i]
    inner -= max(0, lo - ks[i])
    inner -= max(0, ke[j - 1] - hi)
    return float(max(0, inner))


def overlap_ns(intervals: pd.DataFrame, cover: pd.DataFrame) -> int:
    """Nanoseconds of ``intervals`` (merged: overlaps count once) during which some row of ``cover`` was running.

    The general form of the overlap measures: how much of the gaps between kernels fell while
    a copy ran, how much of one stream's time another stream shared.
    """
    if intervals.empty or cover.empty:
        return 0
    s, e = merge_intervals(intervals["start"].to_numpy(), intervals["end"].to_numpy())
    cs, ce = merge_intervals(cover["start"].to_numpy(), cover["end"].to_numpy())
    cum = np.concatenate([[0], np.cumsum(ce - cs)])
    return round(sum(_covered(cs, ce, cum, int(a), int(b)) for a, b in zip(s, e)))


def launch_latency(kernels: pd.DataFrame, runtime: pd.DataFrame) -> pd.Series:
    """Per kernel: ns from the start of the CPU call that launched it to the kernel's start."""
    launches = runtime[["correlationId", "start"]].rename(columns={"start": "launch_start"})
    m = kernels[["correlationId", "start"]].merge(launches, on="correlationId", how="inner")
    return (m["start"] - m["launch_start"]).rename("launch_latency_ns")


def launch_delays(kernels: pd.DataFrame, runtime: pd.DataFrame) -> pd.DataFrame:
    """Per kernel: the launch call's own duration, and the kernel's start measured from the call's start and end.

    :func:`launch_latency` counts from the call's *start*, so its figure includes the call
    itself; where the GPU has a long queue (milliseconds) that hardly matters, but where it
    waits for the host, the call's own time (which a profiler lengthens) can be most of it.
    Measured from the call's *end*, the delay is the queue the kernel waited in after the
    host had handed it over; it is negative when the kernel started before the call
    returned. Columns: ``call_ns``, ``from_call_start_ns``, ``from_call_end_ns`` (one row per
    kernel matched to its call by ``correlationId``).
    """
    calls = runtime[["correlationId", "start", "end"]].rename(columns={"start": "call_start", "end": "call_end"})
    m = kernels[["correlationId", "start"]].merge(calls, on="correlationId", how="inner")
    return pd.DataFrame({"call_ns": m["call_end"] - m["call_start"], "from_call_start_ns": m["start"] - m["call_start"],
                         "from_call_end_ns": m["start"] - m["call_end"]})


def sync_wait_share(runtime: pd.DataFrame, window: tuple[int, int]) -> float:
    """Share of ``window`` the CPU spent inside ``*Synchronize`` calls (explicit waits for the GPU)."""
    lo, hi = window
    sync = runtime[runtime["name"].str.contains(SYNC_API, regex=True)]
    if sync.empty or hi <= lo:
        return 0.0
    s, e = merge_intervals(sync["start"].to_numpy(), sync["end"].to_numpy())
    s, e = _clip(s, e, lo, hi)
    return float((e - s).sum()) / (hi - lo)


def range_window(ranges: pd.DataFrame, text: str, index: int = -1) -> tuple[int, int]:
    """(start, end) of one occurrence of an NVTX range (default: the last one)."""
    rows = ranges[ranges["text"] == text]
    if rows.empty:
        raise KeyError(f"no NVTX range named {text!r} in this capture")
    r = rows.iloc[index]
    return int(r["start"]), int(r["end"])


def last_repeat_window(ranges: pd.DataFrame, outer: str, first: str) -> tuple[int, int]:
    """From the last ``first`` range inside the ``outer`` range to the end of ``outer``.

    A timed section repeats its work several times inside one range; this is the window
    of the final repetition, the one to draw.
    """
    lo, hi = range_window(ranges, outer)
    inner = ranges[(ranges["text"] == first) & (ranges["start"] >= lo) & (ranges["end"] <= hi)]
    if inner.empty:
        raise KeyError(f"no {first!r} range inside {outer!r}")
    return int(inner["start"].max()), hi


def inside(df: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    """Rows that start inside ``window``."""
    lo, hi = window
    return df[(df["start"] >= lo) & (df["start"] < hi)]


def calls_by_range(runtime: pd.DataFrame, ranges: pd.DataFrame, pattern: str, texts: list[str]) -> pd.DataFrame:
    """Count and total time of CUDA API calls matching ``pattern`` made inside each named range (same thread)."""
    rows = []
    with warnings.catch_warnings():  # a pattern with groups is fine here: we only test for a match
        warnings.simplefilter("ignore", UserWarning)
        calls = runtime[runtime["name"].str.contains(pattern, regex=True)]
    for text in texts:
        for r in ranges[ranges["text"] == text].itertuples():
            c = calls[(calls["globalTid"] == r.globalTid) & (calls["start"] >= r.start) & (calls["end"] <= r.end)]
            for name, g in c.groupby(c["name"].astype(str).map(api_name)):
                rows.append({"range": text, "call": name, "count": len(g), "total_us": (g["end"] - g["start"]).sum() / 1e3})
    return pd.DataFrame(rows, columns=["range", "call", "count", "total_us"])


def copy_curve(copies: pd.DataFrame) -> pd.DataFrame:
    """Median bandwidth per (direction, source memory, size): the transfer-size curve, from the GPU's own timings.

    Given copies with the columns of :func:`calls_with_work`, also the medians of the CPU's time in
    the copy call (``call_us``), of the DMA (``dma_us``) and from the call's start to the DMA's end
    (``end_to_end_us``, and the bandwidth that gives, ``end_to_end_gbps``): the GPU-side curve cannot
    see a pageable copy's staging on the CPU, which happens before its DMA starts.
    """
    g = copies.groupby(["kind", "src_memory", "bytes"])
    out = g.agg(copies=("gbps", "size"), median_gbps=("gbps", "median"))
    if "end_to_end_ns" in copies:
        out["call_us"] = g["api_ns"].median() / 1e3
        out["dma_us"] = g["duration_ns"].median() / 1e3
        out["end_to_end_us"] = g["end_to_end_ns"].median() / 1e3
        out["end_to_end_gbps"] = out.index.get_level_values("bytes") / out["end_to_end_us"] / 1e3
    return out.reset_index()


def exposed_copy_fraction(copies: pd.DataFrame, kernels: pd.DataFrame, window: tuple[int, int]) -> float:
    """Share of ``window`` in which a copy was running and no kernel was: time the GPU's compute
    spent waiting for data in flight (the part of the transfers that overlap did not hide)."""
    lo, hi = window
    if copies.empty or hi <= lo:
        return 0.0
    cs, ce = _clip(*merge_intervals(copies["start"].to_numpy(), copies["end"].to_numpy()), lo, hi)
    if kernels.empty:
        return float((ce - cs).sum()) / (hi - lo)
    ks, ke = merge_intervals(kernels["start"].to_numpy(), kernels["end"].to_numpy())
    cum = np.concatenate([[0], np.cumsum(ke - ks)])
    hidden = sum(_covered(ks, ke, cum, int(a), int(b)) for a, b in zip(cs, ce))
    return (float((ce - cs).sum()) - hidden) / (hi - lo)


def issue_order(work: pd.DataFrame, runtime: pd.DataFrame) -> pd.DataFrame:
    """Copies (or kernels) with ``issued``, the start of the CPU call that queued each, in the order they ran.

    A timeline shows when each copy ran, not when the CPU asked for it; the CUDA call that
    queued it (same ``correlationId`` in the runtime table) does. Within one stream the GPU
    keeps the order of issue; between streams CUDA promises no order at all (the CUDA C++
    Programming Guide, *Streams*), so what a GPU did is something only a capture can say.
    Rows are sorted by ``start`` and numbered: ``run_rank`` (0, 1, ... in the order they
    ran) and ``issue_rank`` (the same in the order they were issued). Work without a
    matching call (recorded outside the traced API) is left out.
    """
    calls = runtime[["correlationId", "start"]].rename(columns={"start": "issued"})
    df = work.merge(calls, on="correlationId", how="inner")
    df = df.sort_values(["start", "issued"], kind="stable", ignore_index=True)
    df["run_rank"] = np.arange(len(df), dtype=np.int64)
    df["issue_rank"] = (df["issued"].rank(method="first").to_numpy() - 1).astype(np.int64) if len(df) else []
    return df


def _inversions(seq: np.ndarray) -> int:
    """Pairs i < j with ``seq[i] > seq[j]`` in a permutation of 0..n-1, counted with a Fenwick tree (n log n)."""
    n = len(seq)
    tree = np.zeros(n + 1, dtype=np.int64)
    count = 0
    for seen, v in enumerate(seq):
        i, not_greater = int(v) + 1, 0
        while i > 0:
            not_greater += int(tree[i])
            i -= i & -i
        count += seen - not_greater
        i = int(v) + 1
        while i <= n:
            tree[i] += 1
            i += i & -i
    return count


@dataclass(frozen=True)
class ServiceOrder:
    """How the order in which work ran departs from the order in which the CPU issued it.

    ``runs`` has one row per run of consecutive items of one stream, in the order they ran:
    ``streamId``, ``items``, ``start`` and ``end`` (when the run ran), ``first_issued`` and
    ``last_issued`` (when its items were issued), and ``next_issued``: when the CPU issued
    that stream's next item (NaN if none), so that ``next_issued > end`` says the stream had
    nothing queued when the GPU left it.
    """

    items: int
    inverted: int  # pairs of items that ran in the opposite order to their issue
    runs: pd.DataFrame

    @property
    def pairs(self) -> int:
        return self.items * (self.items - 1) // 2

    @property
    def longest(self) -> pd.Series:
        """The run with the most items (the earliest of equals)."""
        return self.runs.loc[self.runs["items"].idxmax()]


def service_order(order: pd.DataFrame) -> ServiceOrder:
    """Count the out-of-order pairs of an :func:`issue_order` table and group it into runs by stream."""
    columns = ["streamId", "items", "start", "end", "first_issued", "last_issued", "next_issued"]
    if order.empty:
        return ServiceOrder(0, 0, pd.DataFrame(columns=columns))
    ranked = order.sort_values("run_rank", kind="stable")
    inverted = _inversions(ranked["issue_rank"].to_numpy())
    block = (ranked["streamId"] != ranked["streamId"].shift()).cumsum()
    runs = ranked.groupby(block, sort=False).agg(
        streamId=("streamId", "first"), items=("streamId", "size"), start=("start", "min"), end=("end", "max"),
        first_issued=("issued", "min"), last_issued=("issued", "max")).reset_index(drop=True)
    runs["next_issued"] = runs.groupby("streamId")["first_issued"].shift(-1)
    return ServiceOrder(len(ranked), inverted, runs[columns])


def exposed_ns(shown: pd.DataFrame, hiding: pd.DataFrame, window: tuple[int, int]) -> int:
    """Nanoseconds of ``window`` in which some row of ``shown`` ran and no row of ``hiding`` did.

    The exposed part of one kind of GPU work behind another: copies not under any kernel (time the
    GPU's compute waited for data), or NCCL kernels not under any compute kernel (communication
    that overlap did not hide). Both tables are merged first, so work on several streams counts
    once; a caller that wants one GPU passes that GPU's rows.
    """
    lo, hi = window
    if shown.empty or hi <= lo:
        return 0
    ss, se = _clip(*merge_intervals(shown["start"].to_numpy(), shown["end"].to_numpy()), lo, hi)
    total = int((se - ss).sum())
    if hiding.empty or total == 0:
        return total
    hs, he = merge_intervals(hiding["start"].to_numpy(), hiding["end"].to_numpy())
    cum = np.concatenate([[0], np.cumsum(he - hs)])
    hidden = sum(_covered(hs, he, cum, int(a), int(b)) for a, b in zip(ss, se))
    return total - int(round(hidden))


ATTRIBUTION_RULES = ("thread", "window")


def launches_of(kernels: pd.DataFrame, runtime: pd.DataFrame) -> pd.DataFrame:
    """Each kernel row beside the call that launched it (same ``correlationId``): its columns plus
    ``launch_start`` and ``launch_tid``; what :func:`attribute_kernels` pairs with ranges.

    An inner merge on the id, kernels' order kept. Where every call has its own integer id (nsys's runtime
    table), it is done on arrays: the kernels' columns are shared, not copied, and pandas' join tables (about
    250 MB at 5 million kernels) are not built; the rows are the merge's, in its order."""
    kc, rc = kernels["correlationId"].to_numpy(), runtime["correlationId"].to_numpy()
    if kc.dtype.kind in "iu" and rc.dtype.kind in "iu" and len(rc) and len(kc):
        order = np.argsort(rc, kind="stable")
        ids = rc[order]
        if (ids[1:] != ids[:-1]).all():  # one call per id: each kernel meets at most one
            pos = np.clip(np.searchsorted(ids, kc), 0, len(ids) - 1)
            hit = ids[pos] == kc
            rows = order[pos[hit]]
            del order, ids, pos
            out = (kernels.copy(deep=False) if hit.all() else kernels[hit]).reset_index(drop=True)
            out["launch_start"] = runtime["start"].to_numpy()[rows]
            out["launch_tid"] = runtime["globalTid"].to_numpy()[rows]
            return out
    return kernels.merge(runtime[["correlationId", "start", "globalTid"]]
                         .rename(columns={"start": "launch_start", "globalTid": "launch_tid"}),
                         on="correlationId", how="inner")


def attribute_kernels(kernels: pd.DataFrame, runtime: pd.DataFrame, ranges: pd.DataFrame, *,
                      rule: str, launches: pd.DataFrame | None = None) -> pd.DataFrame:
    """Pair every kernel with each of ``ranges`` whose span holds the CPU call that launched it.

    A kernel runs after the CPU launches it, often after the range has closed, so the
    kernel's own start says little; the launching call (same ``correlationId`` in the
    runtime table) is what lies inside the range. Two rules answer two questions:

    * ``"thread"``: the launch happened inside the range **on the range's thread**. This is
      nsys's rule; it answers "what did *this code* launch?".
    * ``"window"``: the launch happened while the range was open, **on any thread**. It
      answers "what did the program launch during this phase?", including work that
      libraries launch from threads of their own (PyTorch's autograd engine runs the
      backward pass on one).

    ``rule`` has no default, here or in the readers built on it (:func:`range_busy`,
    ``gpuprof.nsys.sqlite.attribute_to_ranges``, ``gpuprof.torch_profiler.step_summary``):
    on a PyTorch program the two rules give different answers, so a caller says which.

    Returns the kernel rows (a kernel inside nested ranges appears once per range) with
    ``range_text``, ``range_index`` (0 for the first occurrence of that name, in time
    order), ``range_start``, ``range_end``, ``launch_start`` and ``launch_tid``. All
    ranges are handled in one pass over sorted launches: thousands of ranges cost a
    binary search each, not a read of the file each. ``launches``: :func:`launches_of` of the same
    tables, where the caller has it already (it is the largest table built here).
    """
    if rule not in ATTRIBUTION_RULES:
        raise ValueError(f"rule must be one of {ATTRIBUTION_RULES}, not {rule!r}")
    extra = ["range_text", "range_index", "range_start", "range_end", "launch_start", "launch_tid"]
    if kernels.empty or runtime.empty or ranges.empty:
        out = kernels.iloc[0:0].copy()
        for c in extra:
            out[c] = pd.Series(dtype="int64" if c != "range_text" else object)
        return out
    if launches is None:
        launches = launches_of(kernels, runtime)
    ranges = ranges.sort_values("start", kind="stable").reset_index(drop=True)
    # launches no range can hold (before the first range opens, after the last closes, or, by nsys's rule, on a
    # thread without ranges) leave now, keeping their row labels: the rows picked below are the same
    t = launches["launch_start"].to_numpy()
    keep = (t >= ranges["start"].min()) & (t <= ranges["end"].max())
    if rule == "thread":
        keep &= np.isin(launches["launch_tid"].to_numpy(), ranges["globalTid"].unique())
    if not keep.all():
        launches = launches[keep]
    occurrence = ranges.groupby("text", sort=False).cumcount().to_numpy()
    picked: list[np.ndarray] = []
    owner: list[np.ndarray] = []
    if rule == "window":
        groups = [(None, launches.sort_values("launch_start", kind="stable"))]
    else:
        groups = [(tid, g.sort_values("launch_start", kind="stable")) for tid, g in launches.groupby("launch_tid")]
    for tid, group in groups:
        starts = group["launch_start"].to_numpy()
        rows = group.index.to_numpy()
        mine = ranges.index.to_numpy() if tid is None else np.flatnonzero(ranges["globalTid"].to_numpy() == tid)
        lo = np.searchsorted(starts, ranges["start"].to_numpy()[mine], side="left")
        hi = np.searchsorted(starts, ranges["end"].to_numpy()[mine], side="right")
        for r, a, b in zip(mine, lo, hi):
            if b > a:
                picked.append(rows[a:b])
                owner.append(np.full(b - a, r))
    if not picked:
        return attribute_kernels(kernels.iloc[0:0], runtime, ranges.iloc[0:0], rule=rule)
    idx, who = np.concatenate(picked), np.concatenate(owner)
    out = launches.loc[idx].reset_index(drop=True)
    out["range_text"] = ranges["text"].to_numpy()[who]
    out["range_index"] = occurrence[who]
    out["range_start"] = ranges["start"].to_numpy()[who]
    out["range_end"] = ranges["end"].to_numpy()[who]
    return out.sort_values(["range_start", "start"], kind="stable", ignore_index=True)


def range_busy(work: pd.DataFrame, runtime: pd.DataFrame, ranges: pd.DataFrame, *, rule: str) -> pd.DataFrame:
    """Per range: the GPU work launched in it (:func:`attribute_kernels`), and how busy that kept the GPU.

    ``work`` is kernels (and, if wanted, copies and memsets) with ``correlationId``;
    ``ranges`` has ``text``, ``start`` and ``end`` (NVTX ranges, ``ProfilerStep#N``...).
    Columns: text, start, end, cpu_ms (the range's own length), launches, gpu_busy_ms (the
    union of the work's intervals: two streams at once count once), gpu_span_ms (first
    start to last end of that work) and busy_share (busy over span; below 1, the GPU waited
    between pieces of the range's work). The same function serves traces of both tools, so
    the reconciliation of the PyTorch profiler chapter compares like with like.
    """
    cols = ["text", "start", "end", "cpu_ms", "launches", "gpu_busy_ms", "gpu_span_ms", "busy_share"]
    if ranges.empty:
        return pd.DataFrame(columns=cols)
    ranges = ranges.sort_values("start", kind="stable").reset_index(drop=True)
    hits = attribute_kernels(work, runtime, ranges, rule=rule)
    hits = hits[hits["range_text"].notna() & hits["range_start"].notna()]  # as groupby's keys drop them
    n = len(ranges)
    launches = np.zeros(n, dtype=np.int64)
    busy = np.zeros(n, dtype=float)
    span = np.zeros(n, dtype=float)
    if len(hits):
        keys = pd.MultiIndex.from_arrays([hits["range_start"].to_numpy(), hits["range_text"].to_numpy()])
        codes, uniq = keys.factorize()
        b, sp, cnt = _busy_per_group(codes, len(uniq), hits["start"].to_numpy(), hits["end"].to_numpy())
        where = uniq.get_indexer(pd.MultiIndex.from_arrays([ranges["start"].to_numpy(), ranges["text"].to_numpy()]))
        have = where >= 0
        launches[have], busy[have], span[have] = cnt[where[have]], b[where[have]], sp[where[have]]
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(span != 0, busy / np.where(span != 0, span, 1.0), np.nan)
    start, end = ranges["start"].to_numpy(), ranges["end"].to_numpy()
    return pd.DataFrame({"text": list(ranges["text"]), "start": start, "end": end, "cpu_ms": (end - start) / 1e6,
                         "launches": launches, "gpu_busy_ms": busy / 1e6, "gpu_span_ms": span / 1e6,
                         "busy_share": share}, columns=cols)


def _busy_per_group(codes: np.ndarray, n: int, starts: np.ndarray, ends: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group (``codes`` 0..n-1): the length of the union of its intervals (as :func:`merge_intervals` on the
    group's rows gives it), its span (last end minus first start, in the values' own type) and its row count.

    One sort and a few array operations for every group at once: ``range_busy`` over 14,181 steps looped over
    pandas groups, 2.3 s of CPU on a 2 GB trace. The union's running end is taken per group by offsetting each
    group's ends past the previous group's; where the offsets could overflow int64, group by group instead.
    """
    count = np.bincount(codes, minlength=n)
    order = np.lexsort((np.asarray(starts, dtype=np.int64), codes))
    g = codes[order]
    bounds = np.concatenate([[0], np.cumsum(count)])[:-1]
    span = (np.maximum.reduceat(ends[order], bounds) - np.minimum.reduceat(starts[order], bounds)).astype(float)
    s = np.asarray(starts, dtype=np.int64)[order]
    e = np.asarray(ends, dtype=np.int64)[order]
    lo = int(s.min())
    width = max(int(e.max()) - lo, int(s.max()) - lo) + 1
    busy = np.zeros(n, dtype=float)
    if width * (n + 1) < 2**62:
        base = g.astype(np.int64) * width
        run_end = np.maximum.accumulate((e - lo) + base) - base + lo
        new = np.empty(len(s), dtype=bool)
        new[0] = True
        new[1:] = (s[1:] > run_end[:-1]) | (g[1:] != g[:-1])
        idx = np.flatnonzero(new)
        length = np.maximum.reduceat(e, idx) - s[idx]
        firsts = np.searchsorted(g[idx], np.arange(n))  # every group has a row, so each has a first merged piece
        busy = np.add.reduceat(length, firsts).astype(float)
    else:
        for k in range(n):
            ms, me = merge_intervals(s[bounds[k]:bounds[k] + count[k]], e[bounds[k]:bounds[k] + count[k]])
            busy[k] = float((me - ms).sum())
    return busy, span, count


# ----- steps -----

STEP_NUMBERED = re.compile(r"^(?:ProfilerStep#|(?:train(?:ing)?[_ ]?|eval[_ ]?)?(?:step|iter(?:ation)?)[ _#:-]?)(\d+)$",
                           re.IGNORECASE)
STEP_REPEATED = re.compile(r"^(?:train(?:ing)?[_ ]?|eval[_ ]?)?(?:step|iter(?:ation)?)$", re.IGNORECASE)
NUMBERED_STEP = r"step_(\d+)"  # what the course's example scripts name each step's NVTX range
_STEP_COLUMNS = ["step", "text", "start", "end", "globalTid"]


def _repeated_hint(names: pd.Series) -> str:
    """Where no range is named like a step: the range repeated most often, and the ``--steps`` that would use it.

    A loop annotated with ``record_function("forward")`` or an optimizer step repeats a range once per
    iteration even when nothing is called a step; the most repeated name is the likeliest stand-in.
    """
    counts = names[names.str.strip() != ""].value_counts()
    counts = counts[counts >= 2]
    if counts.empty:
        return ""
    name, n = str(counts.index[0]), int(counts.iloc[0])
    import shlex

    return f"; the range repeated most often is {name!r} ({n:,} times): --steps {shlex.quote(re.escape(name))} would use it"


def find_steps(ranges: pd.DataFrame, pattern: str | None = None, *,
               keep: Sequence[str] = ()) -> tuple[pd.DataFrame, str]:
    """The ranges that are the program's steps, and the rule that picked them (see the module's text).

    ``pattern`` is matched against the whole range name; a group in it is the step number.
    Returns (step, text, start, end, globalTid) sorted by start, and the rule in words.
    ``keep`` names more of ``ranges``' columns to carry along after those (``duration_ns``,
    ``pid``), for callers that measure the steps themselves.
    """
    cols = [*_STEP_COLUMNS, *(c for c in keep if c not in _STEP_COLUMNS)]
    empty = pd.DataFrame(columns=cols)
    if ranges.empty:
        return empty, "no annotated ranges in the capture, so no steps"
    names = ranges["text"].astype(str)
    if pattern is not None:
        try:
            rx = re.compile(pattern)
        except re.error as exc:
            from .errors import GpuprofError

            raise GpuprofError(f"--steps {pattern!r} is not a regular expression ({exc}).",
                               "Escape ( ) [ ] . * + ? with a backslash to match them as written, and quote the "
                               "pattern for the shell: --steps 'train_step'.") from None
        hit = names.map(lambda n: rx.fullmatch(n) is not None)
        rule = f"ranges matching {pattern!r}"
    else:
        profiler = names.str.match(r"^ProfilerStep#\d+$")
        numbered = names.map(lambda n: STEP_NUMBERED.match(n) is not None)
        if profiler.any():
            rx, hit, rule = STEP_NUMBERED, profiler, "PyTorch's ProfilerStep#N ranges"
        elif numbered.any():
            rx, hit, rule = STEP_NUMBERED, numbered, "ranges named step/iteration with a number"
        else:
            plain = names[names.map(lambda n: STEP_REPEATED.match(n) is not None)]
            counts = plain.value_counts()
            if counts.empty or counts.iloc[0] < 2:
                return empty, "no range looks like a step (give --steps REGEX)" + _repeated_hint(names)
            name = str(counts.index[0])
            rx, hit, rule = re.compile(re.escape(name)), names == name, f"the repeated range {name!r}"
    s = ranges[hit.to_numpy()].sort_values("start", kind="stable", ignore_index=True)
    if s.empty:
        return empty, f"{rule}: none found"
    if rx.groups:
        s.insert(0, "step", s["text"].astype(str).map(lambda n: int(rx.fullmatch(n).group(1))))
    else:
        s.insert(0, "step", np.arange(len(s)))
    return s[cols].reset_index(drop=True), f"{rule} ({len(s)})"


def step_ranges(ranges: pd.DataFrame, *, keep: Sequence[str] = ()) -> pd.DataFrame:
    """The ``step_N`` ranges (:data:`NUMBERED_STEP`) that the course's example scripts open around each
    step, sorted by start: :func:`find_steps` with that pattern, for code that knows how its steps are
    named and needs no rule in words. ``step`` is N."""
    return find_steps(ranges, NUMBERED_STEP, keep=keep)[0]
