"""Read a large PyTorch profiler trace in bounded memory: the events streamed, only the report's columns kept.

:func:`gpuprof.torch_profiler.trace.read_trace` parses a whole file at once and builds a
table of every event and every argument. That costs 8.5 to 9.1 bytes per byte of text in
resident memory (872 MiB for a 101 MB trace, ``artifacts/tools/bench_torch_trace.txt``; 4,113 MiB
for a 507 MB one, ``artifacts/tools/bench_torch_trace_big.txt``), so
a 2 GB trace needs more memory than most laptops have. This module reads the same file in
blocks of text (:data:`BLOCK_BYTES`): each block is cut at the end of a whole event, parsed
(orjson where installed), and its events are reduced at once to the columns
``python -m gpuprof report`` reads, in arrays; the events' dictionaries are dropped with the
block. What stays per event is its row in the final tables, with every repeated string (a
name, a category, a thread) held once.

What it keeps, table by table (:class:`~gpuprof.torch_profiler.trace.Trace` has the same
methods and the same kinds):

* complete events (``ph: X``): ``start``, ``end``, ``duration_ns``, ``name``, ``cat``,
  ``pid``, ``tid``, ``globalTid``, and of the arguments only those
  :data:`~gpuprof.torch_profiler.trace.ARG_COLUMNS` renames (correlation, stream, device,
  External id, context, bytes); ``text`` on the annotations;
* flows and ``[memory]`` instants: every column ``read_trace`` gives them;
* the file's own fields (``deviceProperties``, ``schemaVersion``...), thread and process names,
  the category counts.

Every value in those columns equals the whole-file reader's for the same file, with the same dtype
(``tests/test_trace_stream.py`` compares them on every committed trace). What it drops are
the other arguments (``Input Dims``, ``Concrete Inputs``, a kernel's grid and registers...):
they are most of a trace's text and none of the report's measures. Where those are wanted,
``read_trace(path, stream=False)`` reads everything, at the memory cost above.

A file whose text cannot be cut into events (damaged, cut short, not a trace) is handed to
the whole-file reader, whose one-sentence errors say what is wrong with it.

**Two processes parse.** Parsing is most of the time (orjson about 60% of it, the reduction of
each block's events to arrays the rest), so on a file of :data:`PARALLEL_ABOVE_BYTES` or more
(:func:`default_workers`) this process only cuts the text into blocks and two worker processes
parse and reduce them (:func:`_read_parallel`). The cut needs no parse: Kineto writes its events
one to a group of lines, so a ``}``, a comma, a line break and a ``{`` (:data:`_CUT`) lies between
two events; a JSON string cannot hold a raw line break, so it is never inside a string. It can be
inside an event whose arguments hold objects one a line, and then the block before it does not
parse: every block is parsed from a cut the block before it proved, so when all parse, every cut
was between two events. A block that fails, or a file without such cuts (on one line), is read by
the serial reader instead (:attr:`Streamed.reader` says which ran, and why). A worker returns its
block as arrays and codes into the block's distinct values (:func:`_reduce`), never a Python
object per event; this process maps the codes in file order (:class:`_Acc`), so the tables are the
serial reader's, value for value (``tests/test_trace_parallel.py``).
"""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import re
import sys
import zlib
from collections import Counter, deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator

import numpy as np
import pandas as pd
from pandas._libs import lib
from pandas.core.arrays.string_ import StringArray

from ..errors import GpuprofError
from .kineto_schema import ARG_COLUMNS, FLOW_CATEGORIES, KINDS, _correlation_from_flows, _numbers, _to_ns

__all__ = ["read_events", "Streamed", "BLOCK_BYTES", "NotStreamable", "default_workers"]

BLOCK_BYTES = 8 * 2**20  # text parsed at once: its events' dictionaries are the transient part of the peak
PARALLEL_ABOVE_BYTES = 64 * 2**20  # smaller files: starting the workers costs more than it saves
_TRACE_EVENTS = re.compile(rb'"traceEvents"\s*:\s*\[')
_ID_COLUMNS = ("correlationId", "streamId", "deviceId", "externalId")
_MEMORY_NAMES = {"Bytes": "bytes", "Total Allocated": "total_allocated", "Total Reserved": "total_reserved",
                 "Device Type": "device_type", "Device Id": "device_id", "Addr": "address"}


class NotStreamable(Exception):
    """The file's text could not be cut into events; the whole-file reader says why."""


def _loads(raw: bytes) -> Any:
    try:
        import orjson
    except ImportError:
        return json.loads(raw.decode("utf-8", errors="replace"))
    return orjson.loads(raw)


def _open(path: Path) -> IO[bytes]:
    with path.open("rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else path.open("rb")


def _try(raw: bytes) -> Any:
    try:
        return _loads(raw)
    except ValueError:  # json.JSONDecodeError and orjson's error are both ValueErrors
        return None


def _head(fh: IO[bytes], block: int) -> tuple[bytes, bytes]:
    """The text before the ``traceEvents`` list's opening bracket, and what was read after it."""
    buf = b""
    while True:
        more = fh.read(block)
        buf += more
        stripped = buf.lstrip()
        if stripped[:1] == b"[":
            return b"", stripped[1:]
        m = _TRACE_EVENTS.search(buf)
        if m:
            return buf[:m.end() - 1], buf[m.end():]
        if not more:
            raise NotStreamable("no traceEvents list")


def _last(buf: bytes, head: bytes) -> tuple[list[Any], dict[str, Any]] | None:
    """The last block's events and the file's other fields: the list's closing bracket is the last ``]`` that
    leaves both sides parsing (tried from the end, 64 at most); None where there is none."""
    end = len(buf)
    for _ in range(64):
        p = buf.rfind(b"]", 0, end)
        if p < 0:
            break
        events = _try(b"[" + buf[:p] + b"]")
        rest = _try(head + b"[]" + buf[p + 1:]) if head else ({} if not buf[p + 1:].strip() else None)
        if events is not None and isinstance(rest, dict):
            return events, rest
        end = p
    return None


def _blocks(fh: IO[bytes], block: int) -> Iterator[list[Any] | dict[str, Any]]:
    """The ``traceEvents`` list's events, a block's worth at a time; last, the file's other fields (a dict).

    A block is cut after the last ``}`` followed by ``,`` and ``{`` whose text before it parses
    as a list of events: a cut inside a string or inside a nested object leaves an unclosed
    string or bracket, which no JSON parser accepts, so the check is exact, not a heuristic.
    """
    head, buf = _head(fh, block)
    while True:
        more = fh.read(block)
        buf += more
        if not more:
            break
        end, tries = len(buf), 0
        while tries < 64:
            j = buf.rfind(b"}", 0, end)
            if j < 0:
                break
            k = j + 1
            rest = buf[k:k + 64].lstrip()
            if rest[:1] == b"," and rest[1:].lstrip()[:1] == b"{":
                tries += 1
                events = _try(b"[" + buf[:k] + b"]")
                if events is not None:
                    yield events
                    buf = buf[k:].lstrip()[1:]
                    break
            end = j
        else:
            raise NotStreamable("no event boundary in 64 candidates")
    got = _last(buf, head)
    if got is None:
        raise NotStreamable("no end of the traceEvents list")
    yield got[0]
    yield got[1]


# The parallel reader's cut: a ``}``, a comma and a line break, then ``{``. Kineto writes its events so (``},`` then
# a new line and ``{``, each event on lines of its own), as does scripts/bench_torch_trace.py. A JSON string cannot
# hold a raw line break, so the match is never inside a string; it can still be inside an event (a list of objects
# written one a line), and then the block before it does not parse (a bracket left open), so every block is parsed
# from a cut that the block before it proved, and one block that fails sends the file to the serial reader.
_CUT = re.compile(rb"\}[ \t\r]*,[ \t\r]*\n[ \t\r\n]*\{")


class _Layout(Exception):
    """The file does not follow the layout the parallel reader cuts at, or a block failed to parse."""


def _last_cut(buf: bytes) -> re.Match[bytes] | None:
    """The last cut in ``buf``, searched in a window at its end that grows until one is found."""
    w = 1 << 16
    while True:
        lo = max(0, len(buf) - w)
        found = None
        for found in _CUT.finditer(buf, lo):
            pass
        if found is not None or lo == 0:
            return found
        w *= 8


def _cut_blocks(fh: IO[bytes], block: int, buf: bytes) -> Iterator[tuple[bytes, bool]]:
    """The events' text in blocks cut at :data:`_CUT` without parsing (``last``: the rest of the file).

    Raises :class:`_Layout` where four blocks' worth of text holds no cut (a one-line file).
    """
    while True:
        more = fh.read(block)
        buf += more
        if not more:
            yield buf, True
            return
        m = _last_cut(buf)
        if m is None:
            if len(buf) > 4 * block:
                raise _Layout("no cut in four blocks")
            continue
        yield buf[:m.start() + 1], False
        buf = buf[m.end() - 1:]


def _work(raw: bytes, last: bool, head: bytes) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
    """A worker's task: parse one block's text and reduce it (:func:`_reduce`); None where it does not parse."""
    if last:
        got = _last(raw, head)
        if got is None:
            return None
        return _reduce(got[0]), got[1]
    events = _try(b"[" + raw + b"]")
    if not isinstance(events, list):
        return None
    return _reduce(events), None


class _Interner:
    """One Python object per distinct value: a name repeated a million times is stored once."""

    def __init__(self) -> None:
        self.seen: dict[Any, Any] = {}


class _Codes:
    """A block's distinct values in order of first use, and each event's code (its index there).

    Values that cannot be hashed get a code each. Mapped through the file's :class:`_Interner` in
    block order (:func:`_lut`), the codes give the same objects the interner would have given event by
    event: the first of equal values is the one kept.
    """

    def __init__(self) -> None:
        self.index: dict[Any, int] = {}
        self.odd: dict[int, Any] = {}

    def __call__(self, values: list[Any]) -> np.ndarray:
        idx = self.index
        try:
            codes = [idx.setdefault(v, len(idx)) for v in values]
        except TypeError:  # an unhashable value (a list as a name): a code of its own
            codes = []
            for v in values:
                if v.__hash__ is None:
                    self.odd[len(idx)] = v
                    idx[object()] = len(idx)
                    codes.append(len(idx) - 1)
                else:
                    codes.append(idx.setdefault(v, len(idx)))
        return np.array(codes, dtype=np.int32)

    def values(self) -> list[Any]:
        return [self.odd[i] if i in self.odd else v for i, v in enumerate(self.index)]


def _lut(values: list[Any], names: "_Interner") -> np.ndarray:
    """A block's distinct values as the file's interned objects, indexable by the block's codes."""
    s = names.seen
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = s.setdefault(v, v) if v.__hash__ is not None else v
    return out


class _Kind:
    """One kind's complete events, as column chunks: grows by a block at a time."""

    def __init__(self) -> None:
        self.chunks: dict[str, list[np.ndarray]] = {c: [] for c in ("start", "dur", "name", "cat", "pid", "tid", "pair")}
        self.args: dict[str, list[tuple[int, np.ndarray]]] = {}  # renamed arg -> (chunk index, values)
        self.n_chunks = 0
        self.lengths: list[int] = []

    def add(self, part: dict[str, Any], lut: np.ndarray, pair_lut: np.ndarray) -> None:
        """Append one block's part (:func:`_reduce_kind`), its value and pair codes turned into this file's."""
        self.chunks["start"].append(part["start"])
        self.chunks["dur"].append(part["dur"])
        for c in ("name", "cat", "pid", "tid"):
            self.chunks[c].append(lut[part[c]])
        self.chunks["pair"].append(pair_lut[part["pair"]])
        for col, values in part["args"].items():
            self.args.setdefault(col, []).append((self.n_chunks, values))
        self.lengths.append(part["n"])
        self.n_chunks += 1


def _reduce_kind(events: list[dict], codes: "_Codes", pairs: "_Codes") -> dict[str, Any]:
    """One kind's events of a block as arrays: numbers as int64, strings and ids as codes into the block's values.

    No Python object per event survives it, so it can cross a pipe from a worker at the cost of its arrays.
    """
    start = _to_ns(_floats([e.get("ts") for e in events]))
    dur = _floats([e.get("dur") for e in events])
    part: dict[str, Any] = {"n": len(events), "start": start, "dur": _to_ns(np.where(np.isfinite(dur), dur, 0.0))}
    part["name"] = codes([e.get("name") for e in events])
    part["cat"] = codes([e.get("cat") for e in events])
    pids = [e.get("pid") for e in events]
    tids = [e.get("tid") for e in events]
    part["pid"] = codes(pids)
    part["tid"] = codes(tids)
    part["pair"] = _pair_codes(pids, tids, pairs)
    args = [a if isinstance(a := e.get("args"), dict) else {} for e in events]
    part["args"] = {}
    for key, col in ARG_COLUMNS.items():
        vals = [a.get(key) for a in args]
        if any(v is not None for v in vals) or any(key in a for a in args):
            part["args"][col] = _column(vals, col)
    return part


def _floats(vals: list[Any]) -> np.ndarray:
    """:func:`~gpuprof.torch_profiler.kineto_schema._numbers` of ``vals``, in C where every value is an int or a
    float (Kineto's timestamps): the same float64 values, without pandas' object inference."""
    if set(map(type, vals)) <= {float, int}:
        try:
            return np.array(vals, dtype=np.float64)
        except OverflowError:
            pass
    return _numbers(vals)


def _pair_codes(pids: list[Any], tids: list[Any], pairs: "_Codes") -> np.ndarray:
    """Codes of the events' ``(str(pid), str(tid))`` pairs, with ``str`` called once per distinct pair, not per
    event. Only where pid and tid are ints, strings or None: there, equal values have the same ``str``, so the
    distinct raw pairs map onto the distinct text pairs (1 and 1.0 are equal but print apart: those go event by event).
    """
    if set(map(type, pids)) | set(map(type, tids)) <= {int, str, type(None)}:
        raw = _Codes()
        local = raw(list(zip(pids, tids)))
        return pairs([(str(p), str(t)) for p, t in raw.values()]).astype(np.int32)[local]
    return pairs([(str(p), str(t)) for p, t in zip(pids, tids)])


def _column(vals: list[Any], col: str) -> Any:
    """One argument's values in a block: the ids as Int64 (as ``read_trace`` converts them), others as pandas infers."""
    if col in _ID_COLUMNS:
        if set(map(type, vals)) == {int}:  # every event has an integer id: no inference needed
            try:
                return pd.arrays.IntegerArray(np.array(vals, dtype=np.int64), np.zeros(len(vals), dtype=bool))
            except OverflowError:
                pass
        return pd.array(pd.to_numeric(pd.Series(vals, dtype=object), errors="coerce"), dtype="Int64") \
            if any(v is not None for v in vals) else pd.array([pd.NA] * len(vals), dtype="Int64")
    return pd.Series(vals).array


def _concat(parts: list[Any], dtype: Any = None) -> Any:
    """The parts as one column. Numpy parts are taken out of ``parts`` (which is left empty) one at a time as each
    is copied into place (as ``dtype`` where given), so a column is never held twice whole: its chunks beside its concatenation were the
    largest step of the 2 GB trace's reading (every column of every table, one after the other)."""
    if not parts:
        return np.array([], dtype=object)
    if isinstance(parts[0], np.ndarray) and all(isinstance(p, np.ndarray) for p in parts):
        out = np.empty(sum(len(p) for p in parts), dtype=np.result_type(*parts) if dtype is None else dtype)
        at = 0
        parts.reverse()  # pop() from the end is O(1); the parts still go in file order
        while parts:
            p = parts.pop()
            out[at:at + len(p)] = p
            at += len(p)
            del p
        return out
    return pd.concat([pd.Series(p) for p in parts], ignore_index=True).array


def _strings(values: np.ndarray) -> pd.Series:
    """Strings as pandas infers them: its string dtype, or object for an empty column (as ``read_trace``'s are)."""
    if not len(values):
        return pd.Series(values, dtype=object)
    dtype = pd.StringDtype("python", na_value=np.nan)
    if values.dtype == object and lib.is_string_array(values, skipna=False):  # every value a str: wrapped, not copied
        return pd.Series(StringArray(values, dtype=dtype, copy=False), copy=False)
    return pd.Series(values, dtype=object).astype(dtype)


def _typed(values: np.ndarray, types: set[type]) -> np.ndarray:
    """``pid``/``tid`` with the dtype pandas gives the whole file's column: int64 when every event has an integer."""
    if types <= {int}:
        return values.astype(np.int64)
    if types <= {int, float, type(None)}:
        return np.array([np.nan if v is None else v for v in values], dtype=float)
    return values


def _table(kind: _Kind, pid_types: set[type], tid_types: set[type]) -> tuple[pd.DataFrame, np.ndarray]:
    c = kind.chunks
    empty = np.array([], dtype=np.int64)
    start = _concat(c.pop("start")) if kind.n_chunks else empty
    dur = _concat(c.pop("dur")) if kind.n_chunks else empty
    df = pd.DataFrame({"start": start, "end": start + dur, "duration_ns": dur}, copy=False)  # a dict is copied by default
    del start
    for col in ("name", "cat"):
        df[col] = _strings(_concat(c.pop(col)))
    df["pid"] = _typed(_concat(c.pop("pid")), pid_types)
    df["tid"] = _typed(_concat(c.pop("tid")), tid_types)
    offsets = np.concatenate([[0], np.cumsum(kind.lengths)]).astype(np.int64)
    for col, parts in kind.args.items():
        have = {i: v for i, v in parts}
        filled = [have[i] if i in have else _column([None] * kind.lengths[i], col) for i in range(kind.n_chunks)]
        values = _concat(filled)
        if col not in _ID_COLUMNS:  # as from_records infers one column of the whole table
            values = pd.Series(list(values)).array if len(values) else values
        df[col] = values
    pair = _concat(c.pop("pair")) if kind.n_chunks else np.array([], dtype=np.int64)
    del offsets
    return df, pair


def _global_tids(tables: dict[str, pd.DataFrame], pair_ids: dict[str, np.ndarray]) -> None:
    """``globalTid`` numbered as ``read_trace`` numbers it: (pid, tid) pairs in order of first row, table by table.

    Each table's pair codes are taken out of ``pair_ids`` once its column is made: held to the end they were
    8 bytes a row of every table (about 56 MiB of the 2 GB trace's 7.4 M events) at the reading's peak."""
    code: dict[int, int] = {}
    for k, t in tables.items():
        if k not in pair_ids:
            continue
        ids = pair_ids.pop(k)
        for p in pd.unique(ids):
            code.setdefault(int(p), len(code))
        lut = np.full(max(code) + 1 if code else 1, -1, dtype=np.int64)
        for p, g in code.items():
            lut[p] = g
        t["globalTid"] = lut[ids] if len(ids) else np.array([], dtype=np.int64)


@dataclass
class Streamed:
    """What :func:`read_events` read: the parts of a :class:`~gpuprof.torch_profiler.trace.Trace`."""

    meta: dict[str, Any]
    categories: dict[str, int]
    tables: dict[str, pd.DataFrame]
    thread_names: dict[tuple[Any, Any], str]
    process_names: dict[Any, str]
    reader: str = "serial"  # or "parallel (N workers)", or "serial (...)": why the parallel reader gave it up


def read_events(path: str | Path, *, block: int = BLOCK_BYTES, workers: int | None = None) -> Streamed:
    """The tables of ``path`` read a block at a time, with the columns this module's docstring lists.

    ``workers``: processes that parse the blocks (:func:`_read_parallel`); 0 or 1 parse them
    here. By default (None) :func:`default_workers` chooses. The tables are the same either way.

    Raises :class:`NotStreamable` when the text cannot be cut into events or the file cannot
    be read to its end (then the whole-file reader gives the error).
    ``gpuprof.torch_profiler.trace.read_trace(path, stream=True)`` makes a Trace of them.
    """
    path = Path(path)
    if workers is None:
        workers = default_workers(path)
    try:
        why = ""
        if workers > 1:
            try:
                got = _read_parallel(path, block, workers)
                got.reader = f"parallel ({workers} workers)"
                return got
            except _Layout as exc:  # not Kineto's layout, or a block that does not parse: the serial reader decides
                why = f" ({exc})"
        got = _read(path, block)
        got.reader = "serial" + why
        return got
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:  # a damaged gzip stream, a file cut short
        raise NotStreamable(str(exc)) from None
    finally:
        _give_back_memory()


def default_workers(path: Path) -> int:
    """Worker processes for ``path``: 2 where the file holds at least :data:`PARALLEL_ABOVE_BYTES` on disk and the
    machine has two cores (the environment variable ``GPUPROF_READ_WORKERS`` overrides it), else 1.

    Two, not one per core: each worker holds a block's parsed events (about 10 times the block's text),
    and the course's target machine has two cores.
    """
    env = os.environ.get("GPUPROF_READ_WORKERS", "").strip()
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise GpuprofError(f"GPUPROF_READ_WORKERS={env!r} is not a number of processes.") from None
    try:
        size = path.stat().st_size
    except OSError:
        return 1
    return 2 if size >= PARALLEL_ABOVE_BYTES and (os.cpu_count() or 1) >= 2 else 1


def _read_parallel(path: Path, block: int, workers: int) -> Streamed:
    """Blocks cut at :data:`_CUT` by this process, parsed and reduced by ``workers`` processes, put together here
    in file order. At most two blocks per worker are in flight, so the text held stays a few blocks.

    Raises :class:`_Layout` where the file cannot be cut so or a block does not parse.
    """
    acc = _Acc()
    meta: dict[str, Any] | None = None
    # fork on Linux (no re-import: the workers start in milliseconds); spawn elsewhere (macOS's system libraries
    # are not safe to fork, and Windows has no fork)
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    pending: deque[Any] = deque()

    taken = 0

    def take() -> None:
        nonlocal meta, taken
        got = pending.popleft().result()
        if got is None:
            raise _Layout("a block does not parse")
        acc.add(got[0])
        if got[1] is not None:
            meta = got[1]
        taken += 1
        if TRIM_EVERY and taken % TRIM_EVERY == 0:
            _give_back_memory()

    with _open(path) as fh, ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        try:
            head, first = _head(fh, block)
            blocks = _cut_blocks(fh, block, first)
            del first
            for raw, last in blocks:
                pending.append(pool.submit(_work, raw, last, head if last else b""))
                del raw
                while len(pending) > 2 * workers:
                    take()
            while pending:
                take()
        except BaseException:
            for f in pending:
                f.cancel()
            raise
    if meta is None:
        raise _Layout("no end of the list")
    return acc.finish(meta)


TRIM_EVERY = 8
"""Blocks between two returns of freed memory to the system while reading (:func:`_give_back_memory`): the
unpickled and reduced blocks leave freed pages in glibc's heap that it would otherwise keep, and the tables grow
around them. On a 202 MB trace (743,083 events, two workers) the report's process held 221 MiB when the last block
came in without it, 135 MiB with it (its peak while reading 224 against 203 MiB). 0: never. The pages returned are
faulted in again when the heap grows, which costs system time: on the 2 GB trace the report with these returns (and
those between its stages) used 5% less memory and about 10% more CPU than without (bench_torch_trace_big.txt,
2026-11-27, big6); which of the two returns costs what was not measured apart."""


def _give_back_memory() -> None:
    """Hand the memory the parsing freed back to the system (:func:`gpuprof.memory_probe.give_back_memory`).

    The blocks' millions of short-lived objects leave glibc's heap with free pages that it keeps
    for later: 140 MiB of the 437 MiB resident after reading a 507 MB trace, counted in the
    resident memory of everything the report does next unless they are returned.
    """
    from ..memory_probe import give_back_memory

    give_back_memory()


def _reduce(events: list[Any]) -> dict[str, Any]:
    """One block's events reduced to what the tables keep: arrays and a few small dicts, no object per event.

    This is the part that runs in the worker processes (:func:`_work`); :class:`_Acc` puts the
    blocks together in file order.
    """
    codes, pairs = _Codes(), _Codes()
    thread_names: dict[tuple[Any, Any], str] = {}
    process_names: dict[Any, str] = {}
    categories: Counter = Counter()
    pid_types: set[type] = set()
    tid_types: set[type] = set()
    id_types: set[type] = set()
    by_kind: dict[str, list[dict]] = {}
    fl: list[dict] = []
    mem: list[dict] = []
    for e in events:  # one pass, each event's dictionary touched once (passes per field cost more: cache misses)
        if not isinstance(e, dict):
            continue
        pid_types.add(type(e.get("pid")))
        tid_types.add(type(e.get("tid")))
        id_types.add(type(e.get("id")))
        cat = e.get("cat")
        if cat is not None:
            categories[cat] += 1
        ph = e.get("ph")
        low = str(cat).lower()
        if ph == "X":
            by_kind.setdefault(KINDS.get(low, "other"), []).append(e)
        elif ph in ("s", "f", "t") and low in FLOW_CATEGORIES:
            fl.append(e)
        elif ph == "i" and e.get("name") == "[memory]":
            mem.append(e)
        elif ph == "M":
            a = e.get("args") if isinstance(e.get("args"), dict) else {}
            if e.get("name") == "thread_name":
                thread_names[(e.get("pid"), e.get("tid"))] = str(a.get("name"))
            elif e.get("name") == "process_name":
                process_names[e.get("pid")] = str(a.get("name"))
    kinds = {k: _reduce_kind(evs, codes, pairs) for k, evs in by_kind.items()}
    flows: dict[str, Any] | None = None
    if fl:
        flows = {"id": _flow_ids([e.get("id") for e in fl]),
                 "cat": codes([FLOW_CATEGORIES[str(e.get("cat")).lower()] for e in fl]),
                 "phase": codes([e.get("ph") for e in fl]),
                 "ts": _to_ns(_floats([e.get("ts") for e in fl]))}
        pids, tids = [e.get("pid") for e in fl], [e.get("tid") for e in fl]
        flows["pid"], flows["tid"] = codes(pids), codes(tids)
        flows["name"] = codes([e.get("name") for e in fl])
        flows["pair"] = _pair_codes(pids, tids, pairs)
    memory = None
    if mem:
        memory = pd.DataFrame.from_records([a if isinstance(a := e.get("args"), dict) else {} for e in mem])
        memory.insert(0, "ts", _to_ns(_numbers([e.get("ts") for e in mem])))
    return {"kinds": kinds, "flows": flows, "memory": memory, "values": codes.values(), "pairs": pairs.values(),
            "categories": categories, "types": (pid_types, tid_types, id_types), "thread_names": thread_names,
            "process_names": process_names}


class _Acc:
    """The tables growing a block at a time, in file order; :meth:`finish` builds them."""

    def __init__(self) -> None:
        self.kinds = sorted(set(KINDS.values()) | {"other"})
        self.acc = {k: _Kind() for k in self.kinds}
        self.names = _Interner()
        self.pairs: dict[tuple[str, str], int] = {}
        self.categories: Counter = Counter()
        self.pid_types: set[type] = set()
        self.tid_types: set[type] = set()
        self.id_types: set[type] = set()
        self.flows: dict[str, list] = {c: [] for c in ("id", "cat", "phase", "ts", "pid", "tid", "name", "pair")}
        self.memory: list[pd.DataFrame] = []
        self.thread_names: dict[tuple[Any, Any], str] = {}
        self.process_names: dict[Any, str] = {}

    def add(self, b: dict[str, Any]) -> None:
        lut = _lut(b["values"], self.names)
        pair_lut = np.array([self.pairs.setdefault(p, len(self.pairs)) for p in b["pairs"]], dtype=np.int32)
        self.categories.update(b["categories"])
        for have, new in zip((self.pid_types, self.tid_types, self.id_types), b["types"]):
            have |= new
        self.thread_names.update(b["thread_names"])
        self.process_names.update(b["process_names"])
        for k, part in b["kinds"].items():
            self.acc[k].add(part, lut, pair_lut)
        f = b["flows"]
        if f is not None:
            self.flows["id"].append(f["id"])
            self.flows["ts"].append(f["ts"])
            for c in ("cat", "phase", "pid", "tid", "name"):
                self.flows[c].append(lut[f[c]])
            self.flows["pair"].append(pair_lut[f["pair"]])
        if b["memory"] is not None:
            self.memory.append(b["memory"])

    def finish(self, meta: dict[str, Any]) -> Streamed:
        meta.pop("traceEvents", None)
        tables: dict[str, pd.DataFrame] = {}
        pair_ids: dict[str, np.ndarray] = {}
        for k in self.kinds:
            tables[k], pair_ids[k] = _table(self.acc.pop(k), self.pid_types, self.tid_types)
        _give_back_memory()  # the kinds' chunks, freed, are glibc's free pages until returned
        flows = self.flows
        pair_ids["flow"] = _concat(flows["pair"]) if flows["pair"] else np.array([], dtype=np.int64)
        tables["flow"] = _flow_table(flows, self.id_types, self.pid_types, self.tid_types)
        if self.memory:
            m = pd.concat(self.memory, ignore_index=True)
            self.memory.clear()
        else:
            m = pd.DataFrame(columns=["Bytes", "Total Allocated", "Total Reserved", "Device Type", "Device Id", "Addr"])
            m.insert(0, "ts", np.array([], dtype=np.int64))
        tables["memory"] = m.rename(columns=_MEMORY_NAMES)
        _global_tids(tables, pair_ids)
        for k in ("user_annotation", "gpu_user_annotation"):
            tables[k]["text"] = tables[k]["name"]
        for k in ("kernel", "memcpy", "memset", "runtime", "driver"):
            _correlation_from_flows(tables[k], tables["flow"], gpu=k in ("kernel", "memcpy", "memset"))
            wanted = ("correlationId", "externalId") + (("deviceId", "streamId") if k in ("kernel", "memcpy", "memset") else ())
            for c in wanted:
                if c not in tables[k].columns:
                    tables[k][c] = pd.array([pd.NA] * len(tables[k]), dtype="Int64")
        return Streamed(meta=meta, categories={str(k): int(v) for k, v in self.categories.items()}, tables=tables,
                        thread_names=self.thread_names, process_names=self.process_names)


def _read(path: Path, block: int) -> Streamed:
    """The serial reader: parse and reduce each block in this process."""
    acc = _Acc()
    meta: dict[str, Any] = {}
    n = 0
    with _open(path) as fh:
        for events in _blocks(fh, block):
            if isinstance(events, dict):
                meta = events
                break
            acc.add(_reduce(events))
            del events
            n += 1
            if TRIM_EVERY and n % TRIM_EVERY == 0:
                _give_back_memory()
    return acc.finish(meta)


def _flow_ids(ids: list[Any]) -> tuple[str, Any]:
    """A block's flow ids without a Python object per id where they are all integers or all floats: ("i", int64),
    ("f", float64), else ("o", the list). Millions of small objects kept to the end of the file would pin the
    memory that the parsing of every block frees around them (Python's allocator returns an arena only when all
    of it is free)."""
    types = set(map(type, ids))
    if types <= {int}:
        try:
            return ("i", np.array(ids, dtype=np.int64))
        except OverflowError:  # beyond 64 bits: kept as they are
            return ("o", ids)
    if types == {float}:
        return ("f", np.array(ids, dtype=float))
    return ("o", ids)


def _flow_table(flows: dict[str, list], id_types: set[type], pid_types: set[type], tid_types: set[type]) -> pd.DataFrame:
    """The flow table, its columns built from ``flows``' chunks, which it empties as it goes (:func:`_concat`)."""
    parts = flows["id"]
    if not parts:
        id_col: Any = np.array([], dtype=float)
    elif id_types <= {int, float, type(None)}:
        ids: list[np.ndarray] = []
        parts.reverse()
        while parts:  # taken out of ``flows`` so that _concat lets each go once copied
            how, v = parts.pop()
            ids.append(v if how != "o" else np.array([np.nan if x is None else x for x in v], dtype=float))
            del v
        id_col = _concat(ids, float)
    else:
        id_col = np.array([x for how, v in parts for x in (v.tolist() if how != "o" else v)], dtype=object)
    parts.clear()
    return pd.DataFrame({"id": id_col, "cat": _strings(_concat(flows["cat"])), "phase": _strings(_concat(flows["phase"])),
                         "ts": _concat(flows["ts"]) if flows["ts"] else np.array([], dtype=np.int64),
                         "pid": _typed(_concat(flows["pid"]), pid_types), "tid": _typed(_concat(flows["tid"]), tid_types),
                         "name": _strings(_concat(flows["name"]))}, copy=False)  # a dict is copied by default
