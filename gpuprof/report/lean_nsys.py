"""The report on an Nsight Systems export too large to hold: the big tables read in passes, never whole.

:func:`gpuprof.report.activity_view.load` reads an export's kernels and CUDA API calls into memory:
about 100 bytes a kernel, 2.1 GB at 20 million kernels before any measure is taken. :class:`LeanView`
gives :func:`gpuprof.report.timeline_page.timeline_page` the same page (every number, row and order;
tests/test_lean_nsys.py holds the two equal) from SQLite in passes of :data:`CHUNK_ROWS` rows, keeping
per pass only what that measure needs:

* one pass over the kernels in time order: the union of the GPU's work, its busy time and its idle gaps
  (the open interval carried from step to step; the copies and memsets, few, held whole; the short gaps
  counted and summed, the gaps of 10 us or more kept with the operation that ended each), and a code and a
  duration per kernel for the kernel summary, with the count and time of each (name, demangled) pair for
  the kinds;
* one pass over the calls: the idle gaps' causes (the calls that overlap a long gap, the call that launched
  the work ending each gap, the starts of the issuing calls, 8 bytes a call) and a code and a duration per
  call for the API summary;
* kernels by NVTX range: a pass over the calls and one over the kernels;
* the ``nsys stats``-style tables' statistics taken a group of names at a time by the same pandas reductions
  (:func:`gpuprof.nsys.stats.group_stats`): each name's values meet the same arithmetic in the same order.

The rows come out of SQLite packed (:func:`_packed_chunks`: a few 62-bit integers per row, each a
``group_concat`` text per step, parsed by numpy), so no Python object is made per row; calls written a little
out of time order are merged back in order as they pass (:func:`_merged`), not sorted by SQLite.

It covers what a long single-GPU run without step ranges records (the benchmark's 20 million kernels;
its time and memory are in artifacts/tools/bench_torch_trace_big.txt, 3,595 MiB read whole); an export with
steps, several GPUs, NCCL kernels, a kernel whose correlation id several calls share, or NULLs in the
columns read raises :class:`Unsupported`, and the report reads it whole as before.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pandas as pd

from .. import activity
from ..kernel_kinds import is_communication, kinds_of_pairs
from ..nsys import sqlite as ns
from ..nsys import stats
from .activity_view import (CAUSES, IDLE_MIN_GAP_NS, LAUNCH_PACE_FACTOR, _ISSUE_CALL, _exposed_ns, _inside,
                            idle_table, pace_of)

__all__ = ["LeanView", "Unsupported", "lean_view", "wants_lean", "batched_group_stats", "LEAN_MIN_KERNELS",
           "CHUNK_ROWS", "GROUP_ROWS"]

CHUNK_ROWS = 1 << 18
"""Rows per step of a pass: each step is one int64 array of this many rows per column read (2 MiB a column), and
SQLite's texts of it (:func:`_packed_chunks`). At 5 million kernels the report peaked at 323 MiB with these steps,
505 MiB with steps of 1 Mi rows, in the same CPU time (15.8 and 16.1 s; branch big7)."""

LEAN_MIN_KERNELS = 4_000_000
"""Exports with at least this many kernels (by their rowid range) are read in passes where :class:`LeanView`
covers them: at 5 million kernels the in-memory report peaked at 984 MiB (artifacts/tools/bench_torch_trace_big.txt,
2026-11-27, branch big4), the 1 GiB that issue 38 sets. ``GPUPROF_LEAN=1`` reads every export in passes (where
covered), ``GPUPROF_LEAN=0`` none."""

TAIL_STARTS = 50_000
"""Kernel starts the pass over the kernels keeps from the end (the timeline figure's TIMELINE_MAX_OPS last GPU
operations need at most that many of them), so that no second pass over the kernels, or SQLite's sort, finds them."""

GROUP_ROWS = 1 << 21
"""Rows per group of names whose statistics are taken at once (a name with more rows is a group on its own)."""


class Unsupported(Exception):
    """The export holds something the pass-by-pass reader does not cover; the in-memory reader does."""


class _Unsorted(Exception):
    """The table's rowid order is not its time order: the pass starts again in SQLite's sort."""


def wants_lean(path: Path) -> bool:
    """Whether to read ``path`` (an nsys SQLite export) in passes: ``GPUPROF_LEAN``, else its kernel count."""
    env = os.environ.get("GPUPROF_LEAN", "")
    if env in ("0", "1"):
        return env == "1"
    with closing(ns.open_export(path)) as conn:
        if ns.KERNEL_TABLE not in ns.table_names(conn):
            return False
        span = ns.rowid_range(conn, ns.KERNEL_TABLE)
    return span is not None and span[1] - span[0] + 1 >= LEAN_MIN_KERNELS


def _chunks(conn: sqlite3.Connection, sql: str, ncols: int, params: tuple = ()) -> Iterator[np.ndarray]:
    """The query's rows as int64 arrays of shape (rows, ncols), :data:`CHUNK_ROWS` rows at a time."""
    cursor = conn.execute(sql, params)
    while True:
        try:
            flat = np.fromiter(itertools.chain.from_iterable(itertools.islice(cursor, CHUNK_ROWS)), dtype=np.int64)
        except (TypeError, ValueError, OverflowError) as exc:  # a NULL or a text value
            raise Unsupported(f"a value that is not an integer in: {sql}") from exc
        if len(flat) == 0:
            return
        yield flat.reshape(-1, ncols)


WORD_BITS = 62
"""Bits of one packed value (:func:`_packed_chunks`): below SQLite's sign bit, with one to spare."""


SAMPLE_ROWS = 1 << 16
"""Rows at each end of a table (by rowid) whose values set the packing's ranges (:func:`column_ranges`)."""


def column_ranges(conn: sqlite3.Connection, table: str, columns: list[str]) -> dict:
    """Each column's expected (min, max), for packing (``"end"`` stands for ``end - start``): the values of the first
    and last :data:`SAMPLE_ROWS` rows, widened (``start`` to the span of the two samples, the others to four
    times their range: one range below, two above). Only the ends are read: scans of the whole tables for exact
    ranges cost 1.66 s (the kernels) and 1.34 s (the calls) of CPU on the 5 million-kernel export, nearly a
    quarter of its report (12.9 s). A row outside them costs only speed: :func:`_packed_ranges` reads its step
    again unpacked."""
    span = ns.rowid_range(conn, table)
    if span is None:
        return {c: (0, 0) for c in ["start", *columns]}
    exprs = {c: ("end - start" if c == "end" else c) for c in ["start", *columns]}
    sql = f"SELECT {', '.join(f'min({e}), max({e})' for e in exprs.values())} FROM {table} WHERE rowid BETWEEN ? AND ?"
    rows = [conn.execute(sql, (span[0], span[0] + SAMPLE_ROWS - 1)).fetchone(),
            conn.execute(sql, (span[1] - SAMPLE_ROWS + 1, span[1])).fetchone()]
    out = {}
    for i, c in enumerate(exprs):
        seen = [v for r in rows for v in r[2 * i:2 * i + 2] if type(v) is int]
        if not seen:
            raise Unsupported(f"no integer values in {table}.{c}")
        lo, hi = min(seen), max(seen)
        if c != "start":
            pad = hi - lo + 1
            lo, hi = lo - pad, hi + 2 * pad
        out[c] = (lo, hi)
    return out


def _layout(columns: list[str], ranges: dict[str, tuple[int, int]]) -> list[list[tuple[int, int, int, int]]]:
    """The columns (``start`` first) packed into 62-bit words: per word its fields (column index, shift, bits,
    offset), each field the value less the column's minimum. A column of one value travels in no word at all.
    First fit, widest first; a column wider than :data:`WORD_BITS` travels as itself (bits 64, offset 0)."""
    words: list[list[tuple[int, int, int, int]]] = []
    room: list[int] = []
    for i, c in sorted(enumerate(["start", *columns]), key=lambda ic: -(ranges[ic[1]][1] - ranges[ic[1]][0])):
        lo, hi = ranges[c]
        bits = int(hi - lo).bit_length()
        if bits == 0 or bits > WORD_BITS:  # a constant: a word of no bits, never read; too wide: a word of its own
            words.append([(i, 0, 0, lo)] if bits == 0 else [(i, 0, 64, 0)])
            room.append(-1)
            continue
        w = next((j for j, r in enumerate(room) if r >= bits), None)
        if w is None:
            words.append([])
            room.append(WORD_BITS)
            w = len(words) - 1
        words[w].append((i, WORD_BITS - room[w], bits, lo))
        room[w] -= bits
    return words


def _packed_chunks(conn: sqlite3.Connection, table: str, columns: list[str],
                   ranges: dict[str, tuple[int, int]]) -> Iterator[np.ndarray]:
    """The table's rows (``start``, then ``columns``; ``end`` as itself) in rowid order as int64 arrays of shape
    (rows, 1 + len(columns)), a rowid range of :data:`CHUNK_ROWS` at a time. Per range one query returns each
    word (:func:`_layout`) as one ``group_concat`` text, parsed by numpy: no Python object per row or value (the
    cursor's tuples cost 0.66 s of CPU per 2 million kernels of five columns, three packed words 0.28 s;
    artifacts/tools/bench_torch_trace_big.txt, branch big7). All the words of a row come from the same step of
    SQLite's scan; the count of each range is checked against the values parsed, and a step whose first word
    leaves a row out (a value outside its range, a NULL, a text) is read again unpacked."""
    for _, rows in _packed_ranges(conn, table, columns, ranges):
        yield rows


def _packed_ranges(conn: sqlite3.Connection, table: str, columns: list[str],
                   ranges: dict[str, tuple[int, int]]) -> Iterator[tuple[int, np.ndarray]]:
    """:func:`_packed_chunks`' steps with the first rowid of each one's range."""
    names = ["start", *columns]
    layout = _layout(columns, ranges)
    exprs = []
    sql_of = {c: ("end - start" if c == "end" else c) for c in names}
    for fields in layout:
        expr = [(sql_of[names[i]], sh, bits, lo) for i, sh, bits, lo in fields]
        if fields[0][2] == 64:
            exprs.append(expr[0][0])
        elif fields[0][2]:
            exprs.append(" | ".join(f"((({e}) - ({lo})) << {sh})" for e, sh, _, lo in expr))
    # every value of the row inside its range, or the first word NULL: group_concat leaves it out, the count differs
    guard = " AND ".join(f"({e}) BETWEEN {ranges[c][0]} AND {ranges[c][1]}" for c, e in sql_of.items()
                         if int(ranges[c][1] - ranges[c][0]).bit_length() <= WORD_BITS)
    if exprs and guard:
        exprs[0] = f"CASE WHEN {guard} THEN {exprs[0]} END"
    elif guard:
        exprs.append(f"CASE WHEN {guard} THEN 0 END")
    span = ns.rowid_range(conn, table)
    if span is None:
        return
    sql = f"SELECT count(*){''.join(f', group_concat({e})' for e in exprs)} FROM {table} WHERE rowid >= ? AND rowid < ?"
    plain = f"SELECT {', '.join(names)} FROM {table} WHERE rowid >= ? AND rowid < ? ORDER BY rowid"
    for a in range(span[0], span[1] + 1, CHUNK_ROWS):
        got = conn.execute(sql, (a, a + CHUNK_ROWS)).fetchone()
        n = int(got[0])
        if n == 0:
            continue
        words = [np.fromstring(t or "", dtype=np.int64, sep=",") for t in got[1:]]
        if any(len(w) != n for w in words):  # a value outside its range, a NULL or a text: this step unpacked
            yield a, np.concatenate(list(_chunks(conn, plain, len(names), (a, a + CHUNK_ROWS))))
            continue
        out = np.empty((n, len(names)), dtype=np.int64)
        texts = iter(words)
        for fields in layout:
            if not fields[0][2]:
                out[:, fields[0][0]] = fields[0][3]
                continue
            w = next(texts)
            if fields[0][2] == 64:
                out[:, fields[0][0]] = w
                continue
            for i, sh, bits, lo in fields:
                col = out[:, i]
                np.right_shift(w, sh, out=col)
                np.bitwise_and(col, (1 << bits) - 1, out=col)
                col += lo
        if "end" in columns:
            out[:, 1 + columns.index("end")] += out[:, 0]
        yield a, out


def _in_order(conn: sqlite3.Connection, table: str, columns: list[str], ordered: bool,
              ranges: dict[str, tuple[int, int]] | None = None) -> Iterator[np.ndarray]:
    """The table's rows (``start`` first, then ``columns``) in the in-memory readers' order, by start then rowid:
    in rowid order, checked as the rows pass (exports are written in time order), or (``ordered``) sorted by
    SQLite. Raises :class:`_Unsorted` where the rowid order turns out not to be the time order. With ``ranges``
    (:func:`column_ranges` of the columns) the rowid order is read packed (:func:`_packed_chunks`)."""
    cols = ", ".join(["start", *columns])
    if ordered:
        yield from _chunks(conn, f"SELECT {cols} FROM {table} ORDER BY start, rowid", len(columns) + 1)
        return
    last = None
    rows_of = (_packed_chunks(conn, table, columns, ranges) if ranges is not None
               else _chunks(conn, f"SELECT {cols} FROM {table} ORDER BY rowid", len(columns) + 1))
    for rows in rows_of:
        s = rows[:, 0]
        if (last is not None and s[0] < last) or not activity.is_sorted(s):
            raise _Unsorted
        last = int(s[-1])
        yield rows


def _capacity(conn: sqlite3.Connection, table: str) -> int:
    """An upper bound of the table's rows (its rowid range: rowids only grow), to size arrays filled in passes."""
    span = ns.rowid_range(conn, table)
    return 0 if span is None else span[1] - span[0] + 1


def _pass(run: Callable[[bool], object]) -> object:
    """``run(ordered)``: ``ordered`` False reads each table as :meth:`LeanView._rows` last found it could
    (rowid order, a local merge, SQLite's sort); each :class:`_Unsorted` moves one table a step down that list and
    the pass starts again; after four, every table in SQLite's sort (``ordered`` True)."""
    for _ in range(4):
        try:
            return run(False)
        except _Unsorted:
            continue
    return run(True)


CARRY_MAX_CHUNKS = 4
"""The local merge (:func:`_merged`) holds at most this many steps' rows back; more, and SQLite sorts the table."""


def _merged(conn: sqlite3.Connection, table: str, columns: list[str],
            ranges: dict[str, tuple[int, int]]) -> Iterator[np.ndarray]:
    """The rows in the order of SQLite's ``ORDER BY start, rowid``, from the packed rowid order of a table whose
    rows are out of time order only locally (an export's calls: 2,318 of its first 2 million rows start before
    an earlier row's start in the benchmark's export). The least start of each later rowid range (one query per
    range, ``start`` alone) bounds what each step may give: the rows held back and the step, in a stable sort by
    start (the held rows all precede the step's in rowid order), are given up to that bound and the rest held.
    Raises :class:`_Unsorted` where more than :data:`CARRY_MAX_CHUNKS` steps' rows are held."""
    span = ns.rowid_range(conn, table)
    if span is None:
        return
    later: dict[int, int | None] = ranges.get(("later", CHUNK_ROWS), {})  # type: ignore[call-overload]
    if not later:  # kept in the table's ranges for the next pass
        least = None
        for a in reversed(range(span[0], span[1] + 1, CHUNK_ROWS)):
            later[a] = least
            m = conn.execute(f"SELECT min(start) FROM {table} WHERE rowid >= ? AND rowid < ?",
                             (a, a + CHUNK_ROWS)).fetchone()[0]
            if m is not None:
                least = m if least is None else min(least, m)
        ranges[("later", CHUNK_ROWS)] = later  # type: ignore[index]
    carry: np.ndarray | None = None
    for a, rows in _packed_ranges(conn, table, columns, ranges):
        buf = rows if carry is None or len(carry) == 0 else np.concatenate([carry, rows])
        if not activity.is_sorted(buf[:, 0]):
            buf = buf[np.argsort(buf[:, 0], kind="stable")]
        bound = later[a]
        k = len(buf) if bound is None else int(np.searchsorted(buf[:, 0], bound, side="left"))
        if k:
            yield buf[:k]
        carry = buf[k:]
        if len(carry) > CARRY_MAX_CHUNKS * CHUNK_ROWS:
            raise _Unsorted


def batched_group_stats(codes: np.ndarray, values: np.ndarray) -> pd.DataFrame:
    """:func:`gpuprof.nsys.stats.group_stats` of integer ``codes`` (negative: missing, left out) and ``values``,
    taken for groups of codes at a time (about :data:`GROUP_ROWS` rows), indexed by code in order of first
    appearance. Each code's values keep their order, so every statistic is that of one groupby over them all;
    a code with more than GROUP_ROWS rows is taken alone by :func:`_one_group` (pandas' groupby makes several
    copies of a group's values: 1.7 GB for 20 million calls of one name)."""
    keep = codes >= 0
    if not keep.all():
        codes, values = codes[keep], values[keep]
    del keep
    if len(codes) == 0:
        return stats.group_stats(np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    order = np.argsort(codes, kind="stable")
    counts = np.bincount(codes)
    present = np.flatnonzero(counts)
    bounds = np.concatenate([[0], np.cumsum(counts[present])])  # each present code's rows in order[...]
    first_row = order[bounds[:-1]]  # each code's first row (the sort is stable)
    parts = []
    g = 0
    while g < len(present):
        h = g + 1  # codes g..h-1 together, up to GROUP_ROWS rows
        while h < len(present) and bounds[h + 1] - bounds[g] <= GROUP_ROWS:
            h += 1
        a, b = int(bounds[g]), int(bounds[h])
        rows = order[a:b]
        if h == g + 1 and b - a > GROUP_ROWS:
            parts.append(_one_group(int(present[g]), values[rows]))
        else:
            parts.append(stats.group_stats(codes[rows], values[rows].astype(np.int64, copy=False)))
        del rows
        g = h
    out = pd.concat(parts)
    return out.iloc[np.argsort(first_row, kind="stable")]


def _one_group(code: int, v: np.ndarray) -> pd.DataFrame:
    """:func:`gpuprof.nsys.stats.group_stats`' row for one code with many values, on arrays (``v`` is a copy: it
    is partitioned in place). Sum, count, min, max exact; the mean is the sum over the count (pandas' compensated
    sum of integers below 2**53 is exact, so the same number); the median the middle value, or the mean of the two
    middle ones, as pandas takes it; the standard deviation in two passes over float64 (pandas' one-pass Welford
    can differ in the last bits: about 1e-16 of the value, below every digit the page prints)."""
    n = len(v)
    total = int(v.sum(dtype=np.int64))
    lo, hi = int(v.min()), int(v.max())
    if lo < 0 or total >= 2**53 or hi >= 2**53:  # the exactness above does not hold: pandas' own way
        return stats.group_stats(np.full(n, code), v.astype(np.int64, copy=False))
    mean = float(total) / n
    ss = 0.0
    for a in range(0, n, CHUNK_ROWS):  # sum of squared deviations, a step at a time (no second array of n)
        d = v[a:a + CHUNK_ROWS] - mean
        ss += float(np.dot(d, d))
    std = float(np.sqrt(ss / (n - 1))) if n > 1 else np.nan
    k = n // 2
    if n % 2:
        v.partition(k)
        median = float(v[k])
    else:
        v.partition([k - 1, k])
        median = (float(v[k]) + float(v[k - 1])) / 2
    return pd.DataFrame({"sum": [total], "size": [n], "mean": [mean], "median": [median], "min": [lo], "max": [hi],
                         "std": [std]}, index=pd.Index([code], name="key"))


@dataclass
class LeanView:
    """What :func:`gpuprof.report.timeline_page.timeline_page` reads of a capture, for an export read in passes:
    the small tables whole (copies, memsets, NVTX ranges), the large ones as answers (:meth:`headline`,
    :meth:`idle_by_cause`, :meth:`kernel_summary`, ...), each computed by its own passes when asked."""

    path: Path
    copies: pd.DataFrame
    memsets: pd.DataFrame
    ranges: pd.DataFrame
    devices: list[str]
    steps: pd.DataFrame
    step_rule: str
    kernel_count: int
    runtime_count: int
    work_span: tuple[int, int]
    kernel_devices: list
    strings: dict[int, str] = field(repr=False)
    short_col: str = "shortName"
    full_col: str = "demangledName"
    tool: str = "nsys"
    lean: bool = True
    extra: dict = field(default_factory=dict)
    _union: dict | None = field(default=None, repr=False)
    order_way: dict = field(default_factory=dict, repr=False)
    """Per big table, how its rows are read in time order: "rowid" (unset), "local" or "sqlite" (:meth:`_rows`)."""
    col_ranges: dict = field(default_factory=dict, repr=False)
    """Per big table, :func:`column_ranges` of the columns its passes read."""

    has_work = True  # a view is made only where kernels exist

    @property
    def segments(self) -> list[tuple[int, int]]:
        """Without steps: the span of the GPU's work, as :attr:`ActivityView.segments`."""
        return [self.work_span]

    @property
    def window(self) -> tuple[int, int]:
        return self.work_span

    def _conn(self) -> sqlite3.Connection:
        return ns.open_export(self.path)

    def _table_columns(self, table: str) -> list[str]:
        """Every column the passes read of ``table`` (beside ``start``)."""
        if table == ns.KERNEL_TABLE:
            return list(dict.fromkeys(["end", "correlationId", "deviceId", self.full_col, self.short_col]))
        return ["end", "nameId", "correlationId", "globalTid"]

    def _rows(self, conn: sqlite3.Connection, table: str, columns: list[str], ordered: bool) -> Iterator[np.ndarray]:
        """The table's rows by start, then rowid (:func:`_in_order`), packed by its columns' ranges (one scan per
        table, kept): in rowid order, checked; where that was found out of order, by a local merge
        (:func:`_merged`); where that held too many rows back, or ``ordered``, in SQLite's sort. A way found
        wanting is noted (:attr:`order_way`) and raises :class:`_Unsorted`: :func:`_pass` starts again."""
        way = "sqlite" if ordered else self.order_way.get(table, "rowid")
        if way == "sqlite":
            return _in_order(conn, table, columns, True)
        if table not in self.col_ranges:
            self.col_ranges[table] = column_ranges(conn, table, self._table_columns(table))
        rows = (_in_order(conn, table, columns, False, self.col_ranges[table]) if way == "rowid"
                else _merged(conn, table, columns, self.col_ranges[table]))
        return self._noting(table, rows, "local" if way == "rowid" else "sqlite")

    def _noting(self, table: str, rows: Iterator[np.ndarray], then: str) -> Iterator[np.ndarray]:
        try:
            yield from rows
        except _Unsorted:
            self.order_way[table] = then
            raise

    def _text(self, ids: np.ndarray) -> np.ndarray:
        """StringIds ids as text (an id not in the table as its number, as the in-memory reader has it)."""
        return np.array([self.strings.get(int(i), str(int(i))) for i in ids], dtype=object)

    # ----- the work's union: busy time, idle gaps -----

    def _small(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Copies and memsets in the in-memory order (time, then copies before memsets): starts, correlation ids
        (float), and their union (starts, ends)."""
        parts = [d[["start", "end", "correlationId"]] for d in (self.copies, self.memsets) if len(d)]
        if not parts:
            empty = np.array([], dtype=np.int64)
            return empty, np.array([]), empty, empty, empty
        small = pd.concat(parts, ignore_index=True)
        order = np.argsort(small["start"].to_numpy(dtype=np.int64), kind="stable")
        ss = small["start"].to_numpy(dtype=np.int64)[order]
        se = small["end"].to_numpy(dtype=np.int64)[order]
        corr = small["correlationId"].to_numpy(dtype=float)[order]
        us, ue = activity.merge_intervals(ss, se)
        return ss, corr, us, ue, se

    def union(self) -> dict:
        """The pass over the kernels (cached): kernel count and summed durations, the kernels' busy ns, the
        work's idle ns, the short gaps (count, ns), the long gaps (start, end, correlation id of the operation
        that ended each, by start), and the kernels that overlap a copy (start, end, deviceId)."""
        if self._union is None:
            self._union, coder, pairs = _pass(self._union_pass)  # type: ignore[misc]
            self.extra[f"summary:{self.full_col}"] = coder.summary("Name", "Instances")  # for kernel_summary
            self.extra["kind_pairs"] = pairs  # for time_by_kind
        return self._union  # type: ignore[return-value]

    def _union_pass(self, ordered: bool) -> dict:
        lo, hi = self.work_span
        ss, s_corr, us, ue, _ = self._small()
        cs, ce = (activity.merge_intervals(self.copies["start"].to_numpy(dtype=np.int64),
                                           self.copies["end"].to_numpy(dtype=np.int64))
                  if len(self.copies) else (np.array([], np.int64), np.array([], np.int64)))
        acc = _Gaps(us, ue, ss, s_corr)
        count = total = kbusy = 0
        tail = np.array([], dtype=np.int64)  # the last TAIL_STARTS kernel starts, for the timeline's window
        near: list[np.ndarray] = []
        cur: tuple[int, int, float] | None = None  # the kernels' open union piece: start, end, first kernel's id
        first: tuple[int, float] | None = None
        sums: dict[tuple[int, int], list[int]] = {}
        with closing(self._conn()) as conn:
            coder = self._coder(conn, ns.KERNEL_TABLE, str)  # the kernel summary's codes, in the same pass
            for rows in self._rows(conn, ns.KERNEL_TABLE, ["end", "correlationId", "deviceId", self.full_col,
                                                           self.short_col], ordered):
                s, e = rows[:, 0], rows[:, 1]
                coder.add(rows[:, 4], e - s)
                _add_pairs(sums, rows[:, 5], rows[:, 4], e - s)
                tail = np.concatenate([tail, s])[-TAIL_STARTS:]
                inside = (s >= lo) & (s < hi)
                count += int(inside.sum())
                total += int((e - s)[inside].sum())
                if len(cs):  # kernels that meet a copy: what can hide its time
                    i = np.clip(np.searchsorted(ce, s, side="left"), 0, len(cs) - 1)
                    hit = (ce[i] >= s) & (cs[i] <= e)
                    if hit.any():
                        near.append(rows[hit][:, [0, 1, 3]])
                corr = rows[:, 2].astype(float)
                if first is None:
                    first = (int(s[0]), float(corr[0]))
                if cur is not None:
                    s, e = np.concatenate([[cur[0]], s]), np.concatenate([[cur[1]], e])
                    corr = np.concatenate([[cur[2]], corr])
                ms, me = activity.merge_intervals(s, e)
                pc = corr[np.searchsorted(s, ms, side="left")]  # each piece's first kernel (rows are in order)
                kbusy += int((me[:-1] - ms[:-1]).sum())
                acc.add(me[:-1], ms[1:], pc[1:])
                cur = (int(ms[-1]), int(me[-1]), float(pc[-1]))
        if cur is None or first is None:
            raise Unsupported("no kernel rows")
        kbusy += cur[1] - cur[0]
        acc.add(np.array([lo]), np.array([first[0]]), np.array([first[1]]))  # before the first kernel
        acc.add(np.array([cur[1]]), np.array([hi]), np.array([np.nan]))        # after the last one
        gs, ge, gc = acc.long()
        return ({"count": count, "total": total, "kbusy": kbusy, "idle": acc.short_ns + int((ge - gs).sum()),
                 "short": {"gaps": acc.short_n, "ns": acc.short_ns}, "gaps": (gs, ge, gc), "tail": tail,
                 "near": pd.DataFrame(np.concatenate(near) if near else np.zeros((0, 3), dtype=np.int64),
                                      columns=["start", "end", "deviceId"])},
                coder, [(a, b, *sums[(a, b)]) for a, b in sorted(sums)])

    def headline(self) -> dict[str, float]:
        """:func:`gpuprof.report.activity_view.headline` for a capture without steps, one GPU, no NCCL."""
        u = self.union()
        segs = self.segments
        lo, hi = self.work_span
        span = hi - lo
        busy = span - u["idle"]
        c = _inside(self.copies, segs)
        with closing(self._conn()) as conn:
            api = int(conn.execute(f"SELECT count(*) FROM {ns.RUNTIME_TABLE} WHERE start >= ? AND start < ?",
                                   (lo, hi)).fetchone()[0])
        return {"window_ms": span / 1e6, "steps": 0, "kernels": u["count"],
                "kernel_ms": float(u["total"]) / 1e6 if u["count"] else 0.0,
                "gpu_busy": busy / span if span else 0.0, "kernel_busy": u["kbusy"] / span if span else 0.0,
                "idle_ms": (span - busy) / 1e6, "copies": len(c),
                "copy_ms": float(c["duration_ns"].sum()) / 1e6 if len(c) else 0.0,
                "copy_exposed_ms": _exposed_ns(self.copies, u["near"], segs) / 1e6,
                "copy_bytes": float(c["bytes"].sum(min_count=1)) if len(c) else 0.0, "api_calls": api}

    def idle_by_cause(self, *, min_gap_ns: int = IDLE_MIN_GAP_NS,
                      pace_factor: float = LAUNCH_PACE_FACTOR) -> pd.DataFrame:
        """:func:`gpuprof.report.activity_view.idle_by_cause`: the long gaps of :meth:`union` and one pass over
        the calls (those that overlap a long gap; the launching call of the work that ended each gap; the
        issuing calls' starts inside the window)."""
        if min_gap_ns != IDLE_MIN_GAP_NS:
            raise Unsupported("the pass over the kernels keeps the gaps of IDLE_MIN_GAP_NS or more")
        u = self.union()
        gs, ge, gc = u["gaps"]
        lo, hi = self.work_span
        want = np.unique(gc[np.isfinite(gc)]).astype(np.int64)
        answers, found, issue, coder = _pass(lambda ordered: self._call_pass(ordered, gs, ge, want))  # type: ignore[misc]
        gaps = activity.gap_table(gs, ge, answers if len(gs) else None)
        short_cause = CAUSES["short"].replace("10 us", f"{min_gap_ns / 1e3:g} us")

        def pace(g: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
            at = np.searchsorted(ge, g["end"].to_numpy(dtype=np.int64))
            cid = gc[np.clip(at, 0, len(gc) - 1)] if len(gc) else np.full(len(g), np.nan)
            pos = np.clip(np.searchsorted(want, np.nan_to_num(cid, nan=-1).astype(np.int64)), 0, max(len(want) - 1, 0))
            ok = np.isfinite(cid) & (want[pos] == cid) if len(want) else np.zeros(len(g), dtype=bool)
            c_start = np.where(ok, found[0][pos] if len(want) else np.nan, np.nan)
            c_end = np.where(ok, found[1][pos] if len(want) else np.nan, np.nan)
            return pace_of(g, c_start, c_end, issue, pace_factor, consume=True)

        table = idle_table(gaps, u["short"], short_cause, pace)
        issue = np.empty(0, dtype=np.int64)  # let go before the API summary's statistics
        self.extra["summary:nameId"] = coder.summary("Name", "Num Calls")  # for api_summary
        return table

    def _call_pass(self, ordered: bool, gs: np.ndarray, ge: np.ndarray,
                   want: np.ndarray) -> tuple[tuple, tuple[np.ndarray, np.ndarray], np.ndarray]:
        lo, hi = self.work_span
        meet = _GapCalls(gs, ge)
        n_issue = 0
        f_start, f_end = np.full(len(want), np.nan), np.full(len(want), np.nan)
        issue_ids = np.array([i for i, t in self.strings.items() if _ISSUE_CALL.search(str(t))], dtype=np.int64)
        with closing(self._conn()) as conn:
            coder = self._coder(conn, ns.RUNTIME_TABLE, lambda t: stats.api_name(str(t)))  # the API summary's codes
            issue = np.empty(_capacity(conn, ns.RUNTIME_TABLE), dtype=np.int64)
            for rows in self._rows(conn, ns.RUNTIME_TABLE, ["end", "nameId", "correlationId"], ordered):
                s, e, name, corr = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3]
                coder.add(name, e - s)
                meet.add(s, e, name)
                if len(want):  # the first call with each wanted id
                    pos = np.clip(np.searchsorted(want, corr), 0, len(want) - 1)
                    hit = np.flatnonzero((want[pos] == corr))
                    if len(hit):
                        p, first = np.unique(pos[hit], return_index=True)
                        new = np.isnan(f_start[p])
                        f_start[p[new]] = s[hit[first[new]]]
                        f_end[p[new]] = e[hit[first[new]]]
                mine = np.isin(name, issue_ids) & (s >= lo) & (s < hi)
                m = int(mine.sum())
                issue[n_issue:n_issue + m] = s[mine]
                n_issue += m
        issue = issue[:n_issue]
        issue.sort()  # in place: they came in time order already where the rows did
        return (meet.answers(lambda i: stats.api_name(self.strings.get(int(i), str(int(i))))), (f_start, f_end), issue,
                coder)

    def _names_of(self, ids: np.ndarray) -> np.ndarray:
        if len(ids) == 0:
            return np.array([], dtype=object)
        uniq, inv = np.unique(ids, return_inverse=True)
        return self._text(uniq)[inv.ravel()]

    # ----- the nsys stats tables -----

    def _coder(self, conn: sqlite3.Connection, table: str, mapper: Callable[[str], str]) -> "_Coder":
        """A :class:`_Coder` for a pass over ``table``."""
        return _Coder(_capacity(conn, table), mapper, self.strings)

    def _codes_pass(self, ordered: bool, column: str, mapper: Callable[[str], str], pair: str | None = None) -> tuple:
        """One pass over the kernels (``column`` is a StringIds column) or the calls (``nameId``): a
        :class:`_Coder` of ``mapper(text)`` and the durations, in the in-memory order; and, with ``pair`` (a second
        StringIds column), the count and summed duration of each (``pair``, ``column``) pair of ids, by ids (what
        SQLite's ``GROUP BY`` of the two gives, in its order), else None."""
        table = ns.RUNTIME_TABLE if column == "nameId" else ns.KERNEL_TABLE
        sums: dict[tuple[int, int], list[int]] = {}
        with closing(self._conn()) as conn:
            coder = self._coder(conn, table, mapper)
            for rows in self._rows(conn, table, ["end", column] + ([pair] if pair else []), ordered):
                if pair:
                    _add_pairs(sums, rows[:, 3], rows[:, 2], rows[:, 1] - rows[:, 0])
                coder.add(rows[:, 2], rows[:, 1] - rows[:, 0])
        return coder, ([(a, b, *sums[(a, b)]) for a, b in sorted(sums)] if pair else None)

    def _summary(self, column: str, mapper: Callable[[str], str], key_name: str, count: str,
                 pair: str | None = None) -> pd.DataFrame:
        done = self.extra.pop(f"summary:{column}", None)  # taken by the pass over the table already
        if done is not None:
            return done
        coder, pairs = _pass(lambda o: self._codes_pass(o, column, mapper, pair))  # type: ignore[misc]
        if pairs is not None:
            self.extra["kind_pairs"] = pairs
        return coder.summary(key_name, count)

    def kernel_summary(self) -> pd.DataFrame:
        """:func:`gpuprof.nsys.stats.kernel_summary` by demangled name."""
        return self._summary(self.full_col, str, "Name", "Instances", pair=self.short_col)

    def api_summary(self) -> pd.DataFrame:
        """:func:`gpuprof.nsys.stats.api_summary`."""
        return self._summary("nameId", lambda t: stats.api_name(str(t)), "Name", "Num Calls")

    def time_by_kind(self) -> pd.DataFrame:
        """:func:`gpuprof.kernel_kinds.time_by_kind`, from the sums per (name, demangled) pair of ids that
        :meth:`kernel_summary`'s pass kept, else from SQLite's ``GROUP BY`` of the two."""
        rows = self.extra.pop("kind_pairs", None)
        if rows is None:
            with closing(self._conn()) as conn:
                rows = conn.execute(f"SELECT {self.short_col}, {self.full_col}, count(*), sum(end - start) "
                                    f"FROM {ns.KERNEL_TABLE} GROUP BY 1, 2").fetchall()
        pairs = pd.DataFrame(rows, columns=["a", "b", "n", "t"])
        pairs = pd.DataFrame({"name": self._text(pairs["a"].to_numpy()), "demangled": self._text(pairs["b"].to_numpy()),
                              "n": pairs["n"].astype(np.int64), "t": pairs["t"].astype(np.int64)})
        pairs = pairs.groupby(["name", "demangled"], sort=False, dropna=False)[["n", "t"]].sum().reset_index()
        return kinds_of_pairs(pairs)

    def recent_window(self, w: tuple[int, int], most: int) -> tuple[tuple[int, int], bool]:
        """:func:`gpuprof.report.timeline_page._recent_window`: the start of the ``most``-th last GPU operation."""
        n = self.kernel_count + len(self.copies) + len(self.memsets)
        if n <= most:
            return w, False
        if most <= TAIL_STARTS:  # kept by the pass over the kernels
            top = self.union()["tail"]
        else:
            with closing(self._conn()) as conn:
                top = np.array([r[0] for r in conn.execute(
                    f"SELECT start FROM {ns.KERNEL_TABLE} ORDER BY start DESC LIMIT ?", (most,))], dtype=np.int64)
        starts = np.concatenate([top] + [d["start"].to_numpy(dtype=np.int64) for d in (self.copies, self.memsets)])
        k = len(starts) - most
        return (max(int(np.partition(starts, k)[k]), w[0]), w[1]), True

    def nvtx_kern_summary(self) -> pd.DataFrame:
        """:func:`gpuprof.nsys.stats.nvtx_kern_summary`: the calls inside a range on their thread (few) read whole
        and passed to it with their kernels; the kernels launched outside every range grouped here by (thread,
        demangled name), as its own fast path groups them."""
        ranges = self.ranges
        if ranges[["start", "end"]].isna().any().any():
            raise Unsupported("an NVTX range without an end")
        inside_calls, out_corr, out_tid, tids, shared = _pass(self._range_pass)  # type: ignore[misc]
        pt = {(int(p), int(t)) for p, t in zip(ns.pid_of(tids), ns.tid_of(tids))} if len(tids) else set()
        if len(pt) != len(tids):
            raise Unsupported("two threads share a (PID, TID)")
        k_in, codes, dur, dems = _pass(lambda o: self._kernel_range_pass(o, inside_calls, out_corr, out_tid, shared))  # type: ignore[misc]
        del out_corr, out_tid
        key = codes[0].astype(np.int64)  # the key outside_table reads: thread code * names + name code, in place
        key *= len(dems)
        key += codes[1]
        del codes
        parts = stats.nvtx_kern_parts(k_in, inside_calls, ranges) if len(k_in) else []
        st = batched_group_stats(key, dur)
        del key, dur
        if len(st):
            parts.append(stats.outside_table(st, tids, dems).assign(range="", style=""))
        return stats.nvtx_kern_table(parts)

    def _range_pass(self, ordered: bool) -> tuple:
        """The calls in one pass: those inside an NVTX range on their own thread whole (start, end, name,
        correlationId, globalTid); of the others the correlation id and a thread code, sorted by id."""
        by_tid: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for tid, g in self.ranges.groupby("globalTid"):  # closed intervals, as attribute_kernels' searchsorted
            s = g["start"].to_numpy(dtype=np.int64)
            e = g["end"].to_numpy(dtype=np.int64)
            o = np.argsort(s, kind="stable")
            s, e = s[o], np.maximum.accumulate(e[o])
            new = np.concatenate([[True], s[1:] > e[:-1]])
            idx = np.flatnonzero(new)
            by_tid[int(tid)] = (s[idx], np.maximum.reduceat(e, idx))
        inside: list[np.ndarray] = []
        tid_index: dict[int, int] = {}
        n_out = 0
        with closing(self._conn()) as conn:
            out_corr = np.empty(_capacity(conn, ns.RUNTIME_TABLE), dtype=np.int64)
            out_tid = np.empty(len(out_corr), dtype=np.int32)
            for rows in self._rows(conn, ns.RUNTIME_TABLE, ["end", "nameId", "correlationId", "globalTid"], ordered):
                s, tid = rows[:, 0], rows[:, 4]
                hit = np.zeros(len(rows), dtype=bool)
                for t in np.unique(tid):
                    if int(t) in by_tid:
                        rs, re_ = by_tid[int(t)]
                        mine = np.flatnonzero(tid == t)
                        i = np.searchsorted(rs, s[mine], side="right") - 1
                        hit[mine] = (i >= 0) & (s[mine] <= re_[np.clip(i, 0, None)])
                if hit.any():
                    inside.append(rows[hit])
                rest = rows[~hit]
                uniq, inv = np.unique(rest[:, 4], return_inverse=True)
                for u in uniq:
                    tid_index.setdefault(int(u), len(tid_index))
                out_corr[n_out:n_out + len(rest)] = rest[:, 3]
                out_tid[n_out:n_out + len(rest)] = np.array([tid_index[int(u)] for u in uniq], dtype=np.int32)[inv.ravel()]
                n_out += len(rest)
                del rest
        out_corr, out_tid = out_corr[:n_out], out_tid[:n_out]
        if not activity.is_sorted(out_corr):
            o = np.argsort(out_corr, kind="stable")
            out_corr, out_tid = out_corr[o], out_tid[o]
            del o
        ins = np.concatenate(inside) if inside else np.zeros((0, 5), dtype=np.int64)
        both = np.sort(np.concatenate([out_corr, ins[:, 3]]))
        shared = np.unique(both[1:][both[1:] == both[:-1]])  # ids of several calls: a kernel with one is not covered
        del both
        calls = pd.DataFrame({"start": ins[:, 0], "end": ins[:, 1], "name": self._names_of(ins[:, 2]),
                              "correlationId": ins[:, 3], "globalTid": ins[:, 4]})
        tids = np.empty(len(tid_index), dtype=np.int64)
        tids[list(tid_index.values())] = list(tid_index.keys())
        return calls, out_corr, out_tid, tids, shared

    def _kernel_range_pass(self, ordered: bool, inside_calls: pd.DataFrame, out_corr: np.ndarray,
                           out_tid: np.ndarray, shared: np.ndarray) -> tuple:
        """The kernels in one pass: those whose call is inside a range as rows (start, correlationId, duration_ns,
        demangled); of those launched outside every range a key (thread code * names + name code) and the
        duration, in the in-memory order; and the names by code."""
        dem_code: dict[str, int] = {}
        in_corr = np.sort(inside_calls["correlationId"].to_numpy(dtype=np.int64))
        k_in: list[np.ndarray] = []
        n_out = 0
        with closing(self._conn()) as conn:
            cap = _capacity(conn, ns.KERNEL_TABLE)
            tcode, dcode = np.empty(cap, dtype=np.int32), np.empty(cap, dtype=np.int32)
            dur = np.empty(cap, dtype=np.int64)
            for rows in self._rows(conn, ns.KERNEL_TABLE, ["end", "correlationId", self.full_col], ordered):
                corr = rows[:, 2]
                if len(shared) and np.isin(corr, shared).any():  # the in-memory merge pairs it with each call
                    raise Unsupported("a kernel whose correlation id several calls share")
                if len(in_corr):
                    p = np.clip(np.searchsorted(in_corr, corr), 0, len(in_corr) - 1)
                    mine = in_corr[p] == corr
                    if mine.any():
                        k_in.append(rows[mine])
                if len(out_corr):
                    p = np.clip(np.searchsorted(out_corr, corr), 0, len(out_corr) - 1)
                    away = np.flatnonzero(out_corr[p] == corr)
                    if len(away):
                        uniq, inv = np.unique(rows[away, 3], return_inverse=True)
                        m = len(away)
                        dcode[n_out:n_out + m] = np.array(
                            [dem_code.setdefault(self.strings.get(int(u), str(int(u))), len(dem_code)) for u in uniq],
                            dtype=np.int32)[inv.ravel()]
                        tcode[n_out:n_out + m] = out_tid[p[away]]
                        dur[n_out:n_out + m] = rows[away, 1] - rows[away, 0]
                        n_out += m
        ki = np.concatenate(k_in) if k_in else np.zeros((0, 4), dtype=np.int64)
        k_df = pd.DataFrame({"start": ki[:, 0], "correlationId": ki[:, 2], "duration_ns": ki[:, 1] - ki[:, 0],
                             "demangled": self._names_of(ki[:, 3])})
        dems = np.empty(max(len(dem_code), 1), dtype=object)
        dems[:] = "?"
        dems[list(dem_code.values())] = list(dem_code.keys())
        return k_df, (tcode[:n_out], dcode[:n_out]), dur[:n_out], dems


def _add_pairs(sums: dict[tuple[int, int], list[int]], a: np.ndarray, b: np.ndarray, d: np.ndarray) -> None:
    """Add each (a, b) pair's row count and summed ``d`` of one step to ``sums`` (exact integers). Where the ids'
    ranges are narrow (a few million pairs at most) and the step's durations sum below 2**53, by ``bincount``
    (its float sums of integers are then exact); else by a sort."""
    if len(a) == 0:
        return
    a0, b0 = int(a.min()), int(b.min())
    width = int(b.max()) - b0 + 1
    span = (int(a.max()) - a0 + 1) * width
    if span <= 1 << 22 and int(d.min()) >= 0 and int(d.sum(dtype=np.int64)) < 2**53:
        key = (a - a0) * width + (b - b0)
        counts = np.bincount(key, minlength=span)
        totals = np.bincount(key, weights=d, minlength=span)
        hit = np.flatnonzero(counts)
        got_keys, got_n, got_t = hit.tolist(), counts[hit].tolist(), [int(t) for t in totals[hit]]
        pairs = [(a0 + k // width, b0 + k % width) for k in got_keys]
    else:
        uniq, inv = np.unique(np.stack([a, b], axis=1), axis=0, return_inverse=True)
        inv = inv.ravel()
        order = np.argsort(inv, kind="stable")
        starts = np.flatnonzero(np.concatenate([[True], np.diff(inv[order]) != 0]))
        got_n = np.diff(np.concatenate([starts, [len(inv)]])).tolist()
        got_t = np.add.reduceat(d[order], starts).tolist()
        pairs = [(x, y) for x, y in uniq.tolist()]
    for pair, k, t in zip(pairs, got_n, got_t):
        got = sums.setdefault(pair, [0, 0])
        got[0] += k
        got[1] += t


class _Coder:
    """Per row of a pass, in order, a code of ``mapper(text)`` of its StringIds id and its duration, into arrays
    sized once by the table's rowid range; and the texts by code. :meth:`summary` is the ``nsys stats`` table."""

    def __init__(self, capacity: int, mapper: Callable[[str], str], strings: dict[int, str]) -> None:
        self.codes = np.empty(capacity, dtype=np.int32)
        self.dur = np.empty(capacity, dtype=np.int32)  # widened to int64 by the first duration that needs it
        self.n = 0
        self.mapper, self.strings = mapper, strings
        self.index: dict[str, int] = {}
        self.of_id: dict[int, int] = {}

    def add(self, ids: np.ndarray, dur: np.ndarray) -> None:
        uniq, inv = np.unique(ids, return_inverse=True)
        for u in uniq:
            if int(u) not in self.of_id:
                text = self.mapper(self.strings.get(int(u), str(int(u))))
                self.of_id[int(u)] = self.index.setdefault(text, len(self.index))
        m = len(ids)
        if self.dur.dtype == np.int32 and m and (int(dur.min()) < -2**31 or int(dur.max()) >= 2**31):
            self.dur = self.dur.astype(np.int64)
        self.codes[self.n:self.n + m] = np.array([self.of_id[int(u)] for u in uniq], dtype=np.int32)[inv.ravel()]
        self.dur[self.n:self.n + m] = dur
        self.n += m

    def summary(self, key_name: str, count: str) -> pd.DataFrame:
        """:func:`gpuprof.nsys.stats.summary_table` of the codes' statistics; the arrays are let go."""
        codes, dur = self.codes[:self.n], self.dur[:self.n]
        self.codes = self.dur = np.empty(0, dtype=np.int32)
        st = batched_group_stats(codes, dur)
        del codes, dur
        names = np.empty(len(self.index), dtype=object)
        names[list(self.index.values())] = list(self.index.keys())
        st.index = pd.Index(names[st.index.to_numpy()], dtype=object)
        return stats.summary_table(st, key_name, count=count)


class _GapCalls:
    """What :func:`gpuprof.activity.idle_gaps` says of each long gap from the CUDA calls, fed the calls in time
    order a step at a time: per gap the call that overlaps it most (the first of equals), and the part of it that
    any call covers, carried from step to step (the union's reach). The same arithmetic as
    :func:`gpuprof.activity._gap_calls`: gaps met by at most GAP_CALLS_AT_ONCE calls of a step in rounds, one
    array operation per call rank; the others gap by gap."""

    def __init__(self, gs: np.ndarray, ge: np.ndarray) -> None:
        self.gs, self.ge = gs, ge
        self.best = np.zeros(len(gs), dtype=np.int64)
        self.name = np.full(len(gs), -1, dtype=np.int64)
        self.union = np.zeros(len(gs), dtype=np.int64)
        self.reach = gs.astype(np.int64).copy()

    def add(self, rs: np.ndarray, re_: np.ndarray, names: np.ndarray) -> None:
        if len(rs) == 0 or len(self.gs) == 0:
            return
        a0 = int(np.searchsorted(self.ge, rs[0], side="right"))  # gaps that end after the step's first call starts
        b0 = int(np.searchsorted(self.gs, re_.max(), side="left"))  # and begin before its last end
        if b0 <= a0:
            return
        idx = np.arange(a0, b0)
        g_s, g_e = self.gs[idx], self.ge[idx]
        run_end = np.maximum.accumulate(re_)
        first = np.searchsorted(run_end, g_s, side="right")
        count = np.maximum(np.searchsorted(rs, g_e, side="left") - first, 0)
        few = count <= activity.GAP_CALLS_AT_ONCE
        for k in range(int(count[few].max()) if few.any() else 0):
            sel = np.flatnonzero(few & (count > k))
            at, gi = first[sel] + k, idx[sel]
            a, b = np.maximum(rs[at], self.gs[gi]), np.minimum(re_[at], self.ge[gi])
            ov = b - a
            better = ov > self.best[gi]
            self.best[gi[better]], self.name[gi[better]] = ov[better], names[at[better]]
            self.union[gi] += np.maximum(0, b - np.maximum(a, self.reach[gi]))
            self.reach[gi] = np.maximum(self.reach[gi], b)
        for j in np.flatnonzero(~few):
            g, f = int(idx[j]), int(first[j])
            at = slice(f, f + int(count[j]))
            a, b = np.maximum(rs[at], self.gs[g]), np.minimum(re_[at], self.ge[g])
            ov = b - a
            m = int(np.argmax(ov))
            if ov[m] > self.best[g]:
                self.best[g], self.name[g] = ov[m], names[f + m]
            prev = np.maximum.accumulate(np.concatenate([[self.reach[g]], b]))[:-1]
            self.union[g] += int(np.maximum(0, b - np.maximum(a, prev)).sum())
            self.reach[g] = max(int(self.reach[g]), int(b.max()))

    def answers(self, call_name: Callable[[int], str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(call, its share, share covered by any call) per gap, as :func:`gpuprof.activity.gap_table` takes them."""
        n = len(self.gs)
        calls = np.full(n, "", dtype=object)
        shares, covered = np.zeros(n), np.zeros(n)
        hit = self.best > 0
        length = self.ge - self.gs
        shares[hit] = self.best[hit] / length[hit]
        covered[hit] = self.union[hit] / length[hit]
        names: dict[int, str] = {}
        calls[hit] = [names.setdefault(int(i), call_name(int(i))) if int(i) not in names else names[int(i)]
                      for i in self.name[hit]]
        return calls, shares, covered


class _Gaps:
    """The idle gaps of the work's union, fed the kernels' gaps in time order: each is first cut by the copies'
    and memsets' union (held whole); pieces under IDLE_MIN_GAP_NS are counted and summed, the others kept with
    the correlation id of the operation that ends them (the kernel, or the first copy or memset starting there)."""

    def __init__(self, us: np.ndarray, ue: np.ndarray, ss: np.ndarray, s_corr: np.ndarray) -> None:
        self.us, self.ue, self.ss, self.s_corr = us, ue, ss, s_corr
        self.short_n = self.short_ns = 0
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def _keep(self, gs: np.ndarray, ge: np.ndarray, gc: np.ndarray) -> None:
        d = ge - gs
        short = d < IDLE_MIN_GAP_NS
        self.short_n += int((d[short] > 0).sum())
        self.short_ns += int(d[short].sum())
        if (~short).any():
            self.parts.append((gs[~short], ge[~short], gc[~short]))

    def add(self, gs: np.ndarray, ge: np.ndarray, gc: np.ndarray) -> None:
        ok = ge > gs
        gs, ge, gc = gs[ok], ge[ok], gc[ok]
        if len(self.us) == 0 or len(gs) == 0:
            self._keep(gs, ge, gc)
            return
        i = np.clip(np.searchsorted(self.ue, gs, side="right"), 0, len(self.us) - 1)
        meets = (self.ue[i] > gs) & (self.us[i] < ge)
        self._keep(gs[~meets], ge[~meets], gc[~meets])
        ps, pe, pc = [], [], []
        for a, b, c, j in zip(gs[meets], ge[meets], gc[meets], i[meets]):
            pos = int(a)
            while j < len(self.us) and self.us[j] < b:
                if self.us[j] > pos:  # idle until this copy or memset starts: it ends the piece
                    ps.append(pos)
                    pe.append(int(self.us[j]))
                    pc.append(self.s_corr[np.searchsorted(self.ss, self.us[j], side="left")])
                pos = max(pos, int(self.ue[j]))
                j += 1
            if pos < b:
                ps.append(pos)
                pe.append(int(b))
                pc.append(c)
        if ps:
            self._keep(np.array(ps, dtype=np.int64), np.array(pe, dtype=np.int64), np.array(pc, dtype=float))

    def long(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self.parts:
            return np.array([], np.int64), np.array([], np.int64), np.array([])
        gs, ge, gc = (np.concatenate(x) for x in zip(*self.parts))
        o = np.argsort(gs, kind="stable")
        return gs[o], ge[o], gc[o]


def lean_view(path: Path, steps: str | None = None) -> LeanView:
    """The :class:`LeanView` of an nsys SQLite export, or :class:`Unsupported` (then read it whole)."""
    path = Path(path)
    with closing(ns.open_export(path)) as conn:
        have = ns.table_names(conn)
        if ns.KERNEL_TABLE not in have or ns.RUNTIME_TABLE not in have:
            raise Unsupported("no kernel or no CUDA API table")
        cols = ns._columns(conn, ns.KERNEL_TABLE)
        short = next((c for c in ("shortName", "demangledName", "mangledName") if c in cols), None)
        full = next((c for c in ("demangledName", "mangledName", "shortName") if c in cols), None)
        if short is None or full is None or not {"correlationId", "deviceId"} <= cols:
            raise Unsupported("kernel names, correlation ids or devices missing")
        n_k, k_lo, k_hi = conn.execute(f"SELECT count(*), min(start), max(end) FROM {ns.KERNEL_TABLE}").fetchone()
        n_r = int(conn.execute(f"SELECT count(*) FROM {ns.RUNTIME_TABLE}").fetchone()[0])
        if not n_k or not n_r:
            raise Unsupported("no kernels or no CUDA API calls")
        devs = [r[0] for r in conn.execute(f"SELECT DISTINCT deviceId FROM {ns.KERNEL_TABLE}")]
        names = [r[0] for r in conn.execute(f"SELECT DISTINCT {short} FROM {ns.KERNEL_TABLE}")]
        strings = ns._strings(conn)
    if len([d for d in devs if d is not None]) > 1:
        raise Unsupported("several GPUs")
    if is_communication(pd.Series([strings.get(int(i), str(i)) for i in names if i is not None], dtype=object)).any():
        raise Unsupported("NCCL kernels")
    ranges = ns.nvtx_ranges(path)
    found, rule = activity.find_steps(ranges, steps)
    if len(found):
        raise Unsupported("steps")
    copies, memsets = ns.memcpy(path), ns.memset(path)
    starts = [int(k_lo)] + [int(d["start"].min()) for d in (copies, memsets) if len(d)]
    ends = [int(k_hi)] + [int(d["end"].max()) for d in (copies, memsets) if len(d)]
    info = ns.gpu_info(path)
    return LeanView(path=path, copies=copies, memsets=memsets, ranges=ranges,
                    devices=[str(n) for n in info["name"]] if "name" in info else [], steps=found, step_rule=rule,
                    kernel_count=int(n_k), runtime_count=n_r, work_span=(min(starts), max(ends)),
                    kernel_devices=[d for d in devs if d is not None], strings=strings, short_col=short, full_col=full)
