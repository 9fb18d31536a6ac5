"""Read a PyTorch profiler trace (Kineto's Chrome-trace JSON) into tables.

``prof.export_chrome_trace(path)`` and ``tensorboard_trace_handler`` write one JSON
object: a few top-level fields (``schemaVersion``, ``deviceProperties``,
``distributedInfo``, ``baseTimeNanoseconds``, the profiler's options...) and
``traceEvents``, a list of Chrome-trace events. This module reads that list once and
splits it by kind, reading the schema from the file rather than assuming it:

* every category the file uses is kept (an unknown one becomes kind ``"other"``, not
  dropped), and the spellings of older Kineto versions (``Kernel``, ``Memcpy``,
  ``Runtime``, ``Operator``...) map to the same kinds as today's;
* every argument a file's events carry becomes a column of that kind's table, under its
  own name; the few the analyses need get the names the Nsight Systems readers use
  (``correlationId``, ``streamId``, ``deviceId``, ``externalId``), so the measures of
  :mod:`gpuprof.activity` apply to both tools' captures unchanged.

Times become integer nanoseconds (``start``, ``end``), like the Nsight Systems readers'.
Kineto writes microseconds with three decimals. Read as float64, a timestamp of the
order of 10**12 us keeps its nanoseconds: Kineto counts ``ts`` from the file's
``baseTimeNanoseconds``, the wall clock rounded down to a three-month boundary (since
2024), so ``ts`` stays below about 8 * 10**12 us. One counted from 1970 (about
1.7 * 10**15 us, as some older writers did) keeps a quarter of a microsecond, and so did
the file that printed it.

The kinds, and the tables that hold them (:class:`Trace` methods):

=======================  =====================================================  ==================
kind                     what it is                                             table
=======================  =====================================================  ==================
``cpu_op``               an ATen operator on a CPU thread                       :meth:`Trace.cpu_ops`
``user_annotation``      ``record_function`` ranges, ``ProfilerStep#N``          :meth:`Trace.annotations`
``gpu_user_annotation``  the same ranges projected onto a GPU stream            :meth:`Trace.annotations`
``python_function``      Python frames (``with_stack=True``)                    :meth:`Trace.events`
``runtime``/``driver``   CUDA runtime / driver API calls                        :meth:`Trace.runtime_calls`
``kernel``               a kernel on a GPU stream                               :meth:`Trace.kernels`
``memcpy``/``memset``    GPU copies and memsets                                 :meth:`Trace.copies`, :meth:`Trace.memsets`
``sync``                 CUDA synchronisation events (``cuda_sync``)            :meth:`Trace.events`
=======================  =====================================================  ==================

Flow events (``ac2g``: a CPU launch to its GPU activity; ``fwdbwd``: a forward operator
to its backward) are in :meth:`Trace.flows`; memory events (``[memory]`` instants of
``profile_memory=True``) in :meth:`Trace.memory_events`.
"""

from __future__ import annotations

import gzip
import json
import re
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..errors import GpuprofError
from .kineto_schema import (ARG_COLUMNS, FLOW_CATEGORIES, KINDS, KNOWN_SCHEMA_VERSIONS, _correlation_from_flows,
                            _numbers, _to_ns)

__all__ = ["Trace", "read_trace", "KINDS", "KNOWN_SCHEMA_VERSIONS", "STEP_PATTERN", "STREAM_ABOVE_BYTES"]

STEP_PATTERN = re.compile(r"^ProfilerStep#(\d+)$")


def _read_bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise GpuprofError(f"{path} is a damaged or truncated gzip file ({exc}).",
                               "Was it copied before the profiler finished writing it?") from exc
    return raw


def _loads(raw: bytes) -> Any:
    """Parse JSON with orjson where it is installed (three to four times faster on large traces), else json."""
    try:
        import orjson
    except ImportError:
        return json.loads(raw.decode("utf-8", errors="replace"))
    return orjson.loads(raw)


def _what_it_is(raw: bytes, path: Path) -> str | None:
    """For a file that is not JSON at all, what it looks like (None when it starts like JSON)."""
    head = raw.lstrip()[:64]
    if head[:1] in (b"{", b"["):
        return None
    if head.startswith(b"SQLite format 3"):
        return "an SQLite database (an Nsight Systems export? read it with gpuprof.nsys.sqlite)"
    if head[:1] == b"\x80":
        return "a Python pickle (a CUDA memory snapshot? read it with gpuprof.torch_profiler.memory)"
    if head.startswith(b"PK"):
        return "a zip archive"
    if path.suffix in (".nsys-rep", ".qdrep"):
        return "an Nsight Systems report (export it to sqlite and read it with gpuprof.nsys.sqlite)"
    if path.suffix == ".ncu-rep":
        return "an Nsight Compute report (read it with gpuprof.ncu.report)"
    if head[:1] == b"<":
        return "HTML or XML"
    try:
        first = raw.lstrip()[:200].decode("utf-8").splitlines()[0]
    except (UnicodeDecodeError, IndexError):
        return "binary data"
    return f"text that does not start like JSON ({first[:40]!r}{', CSV?' if first.count(',') >= 2 else ''})"


def _parse(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise GpuprofError(f"{path} does not exist.", "Give the path of a trace written by export_chrome_trace "
                           "or tensorboard_trace_handler (.json or .json.gz).")
    raw = _read_bytes(path)
    what = _what_it_is(raw, path)
    if what is not None:
        raise GpuprofError(f"{path} is not a PyTorch profiler trace: it is {what}.",
                           "Give a trace written by export_chrome_trace or tensorboard_trace_handler (.json or .json.gz).")
    try:
        data = _loads(raw)
    except (json.JSONDecodeError, ValueError) as exc:  # orjson's error is a ValueError subclass of its own
        ends_early = not raw.rstrip().endswith((b"}", b"]"))  # a whole trace ends with its closing brace
        detail = getattr(exc, "msg", None) or str(exc).split(":")[0]
        where = "it ends early, mid-event" if ends_early else f"at character {getattr(exc, 'pos', 0):,}: {detail}"
        raise GpuprofError(f"{path} is not complete JSON ({where}).",
                           "A trace cut short (a profiler still writing, a full disk, a copy interrupted) "
                           "cannot be read: export it again.") from exc
    if isinstance(data, list):  # the bare Chrome-trace form: a list of events
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        what = f"an object with keys {sorted(data)[:6]}" if isinstance(data, dict) else type(data).__name__
        raise GpuprofError(f"{path} is JSON but not a PyTorch profiler trace: it holds {what}, "
                           "and no 'traceEvents' list.",
                           "An Nsight Systems export is read by gpuprof.nsys.sqlite; a memory snapshot "
                           "(.pickle) by gpuprof.torch_profiler.memory.")
    return data


@dataclass
class Trace:
    """One trace's events, split by kind. Build it with :func:`read_trace`."""

    path: Path
    meta: dict[str, Any]
    categories: dict[str, int]
    _tables: dict[str, pd.DataFrame] = field(repr=False)
    thread_names: dict[tuple[Any, Any], str] = field(default_factory=dict)
    process_names: dict[Any, str] = field(default_factory=dict)

    # --- what the file says about itself -------------------------------------------------
    @property
    def schema_version(self) -> Any:
        return self.meta.get("schemaVersion")

    @property
    def devices(self) -> pd.DataFrame:
        """``deviceProperties``: one row per GPU the profiler saw (empty for a CPU-only run)."""
        return pd.DataFrame(self.meta.get("deviceProperties") or [])

    @property
    def has_gpu_activity(self) -> bool:
        return any(not self._tables[k].empty for k in ("kernel", "memcpy", "memset"))

    def describe(self) -> str:
        """One paragraph: what was recorded, so a reader knows what the tables can answer."""
        n = {k: len(v) for k, v in self._tables.items() if len(v)}
        gpus = ", ".join(sorted(set(self.devices.get("name", pd.Series(dtype=str)).astype(str)))) or "none listed"
        steps = self.steps()
        span = ""
        if len(steps):
            span = f"; steps {', '.join(str(s) for s in steps['step'].tolist()[:8])}" + (" ..." if len(steps) > 8 else "")
        parts = ", ".join(f"{v:,} {k}" for k, v in sorted(n.items(), key=lambda kv: -kv[1]))
        options = [o for o in ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")
                   if self.meta.get(o)]
        return (f"{self.path.name}: schema {self.schema_version}, GPUs: {gpus}; events: {parts}{span}"
                + (f"; options recorded in the file: {', '.join(options)}" if options else ""))

    # --- the tables ----------------------------------------------------------------------
    def events(self, kind: str | None = None) -> pd.DataFrame:
        """Complete (``ph: X``) events of one kind, or all of them with a ``kind`` column."""
        if kind is None:
            return pd.concat([t.assign(kind=k) for k, t in self._tables.items() if k not in ("flow", "memory")
                              and len(t)], ignore_index=True) if self.categories else pd.DataFrame()
        return self._tables.get(kind, pd.DataFrame(columns=["start", "end", "name"]))

    def kernels(self) -> pd.DataFrame:
        """Kernels: start, end, duration_ns, name, deviceId, streamId, correlationId and every argument the
        file gives (grid, block, registers per thread, shared memory, occupancy...)."""
        return self._tables["kernel"]

    def copies(self) -> pd.DataFrame:
        """GPU memory copies, with ``bytes`` and ``kind`` (the copy direction: ``HtoD``, ``DtoH``, ``DtoD``...)."""
        return self._tables["memcpy"]

    def memsets(self) -> pd.DataFrame:
        return self._tables["memset"]

    def runtime_calls(self, *, driver: bool = True, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """CUDA runtime (and driver) API calls on CPU threads, with ``correlationId`` and ``globalTid``.

        ``columns``: only these (the report's view reads five of the ten). On a 2 GB trace the report's view (this
        merged, sorted copy and the copies' parsed names) added 194 MiB to the tables with every column (big3's staged
        run) and 44 MiB with five (big6's; artifacts/tools/bench_torch_trace_big.txt); the rows and their order are
        the same."""
        t = self._tables["runtime"]
        if columns is not None:
            t = t[[c for c in columns if c in t.columns]]
        if driver and len(self._tables["driver"]):
            d = self._tables["driver"]
            d = d[[c for c in columns if c in d.columns]] if columns is not None else d
            t = pd.concat([t, d], ignore_index=True).sort_values("start", ignore_index=True)
        return t

    def cpu_ops(self) -> pd.DataFrame:
        return self._tables["cpu_op"]

    def annotations(self, *, gpu: bool = False) -> pd.DataFrame:
        """``record_function`` ranges (and ``ProfilerStep#N``) on the CPU, or their projection on GPU streams.

        The ``text`` column repeats ``name``, so the table serves as the ``ranges`` of
        :func:`gpuprof.activity.attribute_kernels`.
        """
        return self._tables["gpu_user_annotation" if gpu else "user_annotation"]

    def steps(self, pattern: str | re.Pattern[str] | None = None) -> pd.DataFrame:
        """Step ranges on the CPU side: step, start, end, duration_ns, globalTid.

        By default the ``ProfilerStep#N`` ranges that ``prof.step()`` marks. A trace without
        them (a program that never called ``prof.step()``, or a trace of someone else's
        program) can define its steps by ``pattern``: a regular expression matched against
        the whole name of ``record_function`` / user annotations (``"train_step"``,
        ``r"iteration_(\\d+)"``). With a group, the group is the step number; without one, the
        matching ranges are numbered 0, 1, ... in time order. Nested matches count as they are.
        """
        a = self._tables["user_annotation"]
        cols = ["step", "start", "end", "duration_ns", "globalTid"]
        if a.empty:
            return pd.DataFrame(columns=cols)
        rx = STEP_PATTERN if pattern is None else re.compile(pattern) if isinstance(pattern, str) else pattern
        names = a["name"].astype(str)
        hit = names.map(lambda n: rx.fullmatch(n) is not None)
        s = a[hit].sort_values("start", ignore_index=True).copy()
        if rx.groups:
            s.insert(0, "step", s["name"].astype(str).map(lambda n: int(rx.fullmatch(n).group(1))))
        else:
            s.insert(0, "step", range(len(s)))
        return s[cols]

    def flows(self) -> pd.DataFrame:
        """Flow events: id, cat (``ac2g`` or ``fwdbwd``), phase (``s`` start / ``f`` finish), ts (ns), pid, tid."""
        if "flow" not in self._tables:
            raise GpuprofError(f"This Trace of {self.path.name} was kept without its flow events (the report's view "
                               "lets them go once they have filled the correlation ids).",
                               "Read the trace again with gpuprof.torch_profiler.read_trace(path) for its flows.")
        return self._tables["flow"]

    def memory_events(self) -> pd.DataFrame:
        """``[memory]`` instants (``profile_memory=True``): ts, bytes (+ allocated, - freed), total allocated and
        reserved after the event, device type and id, address."""
        return self._tables["memory"]


def _frame(rows: pd.DataFrame) -> pd.DataFrame:
    """One kind's table from its events: the fixed fields, then one column per argument name the file uses."""
    us_start = _numbers(rows["ts"].tolist())
    us_dur = _numbers(rows["dur"].tolist())
    df = pd.DataFrame({c: rows[c].to_numpy() for c in ("name", "cat", "pid", "tid")})
    df.insert(0, "start", _to_ns(us_start))
    dur = _to_ns(np.where(np.isfinite(us_dur), us_dur, 0.0))
    df.insert(1, "end", df["start"].to_numpy() + dur)
    df.insert(2, "duration_ns", dur)
    args = [a if isinstance(a, dict) else {} for a in rows["args"].tolist()]
    if any(args):
        a = pd.DataFrame.from_records(args)
        a = a.rename(columns={k: v for k, v in ARG_COLUMNS.items() if k in a.columns and v not in df.columns})
        for c in a.columns:
            if c not in df.columns:
                df[c] = a[c].to_numpy()
    for c in ("correlationId", "streamId", "deviceId", "externalId"):
        if c in df.columns:
            df[c] = pd.to_numeric(df[c], errors="coerce").astype("Int64")
    return df


def _thread_ids(tables: dict[str, pd.DataFrame]) -> None:
    """``globalTid``: one integer per (pid, tid) pair over the whole trace, whatever their types in the file."""
    have = [t for t in tables.values() if {"pid", "tid"} <= set(t.columns)]
    keys = [t["pid"].astype(str).to_numpy(dtype=object) + "|" + t["tid"].astype(str).to_numpy(dtype=object) for t in have]
    codes, _ = pd.factorize(np.concatenate(keys) if keys else np.array([], dtype=object))
    at = 0
    for t, k in zip(have, keys):
        t["globalTid"] = codes[at:at + len(k)].astype(np.int64)
        at += len(k)


# Above this much JSON text, read_trace streams the file (gpuprof.torch_profiler.trace_stream).
STREAM_ABOVE_BYTES = 256 * 2**20


def _text_bytes(path: Path) -> int:
    """The JSON text's size: the file's, or for a gzip file the size its trailer records (modulo 4 GiB,
    so at least the compressed size)."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        if fh.read(2) != b"\x1f\x8b" or size < 18:
            return size
        fh.seek(-4, 2)
        return max(size, int.from_bytes(fh.read(4), "little"))


def _check_version(meta: dict[str, Any], path: Path) -> None:
    version = meta.get("schemaVersion")
    if version is not None and version not in KNOWN_SCHEMA_VERSIONS:
        warnings.warn(f"{path.name} says schemaVersion {version!r}; this reader was checked on "
                      f"{sorted(KNOWN_SCHEMA_VERSIONS)}. It reads the events anyway; check the tables "
                      "against the profiler's own summary (key_averages) before trusting them.", stacklevel=3)


def read_trace(path: str | Path, *, stream: bool | None = None) -> Trace:
    """Read a PyTorch profiler trace (``.json`` or ``.json.gz``) into a :class:`Trace`.

    Bad input ends in one :class:`GpuprofError` sentence: a missing file, a truncated or
    damaged one, JSON that is not a trace. A schema version this reader was not checked on
    is read anyway, with a warning that says so.

    ``stream``: read the file a block at a time, keeping of each event only the columns the
    report reads (:mod:`gpuprof.torch_profiler.trace_stream` lists them): the parsing holds one
    block at a time, and what grows with the file is one table row per event; or (False) parse
    it whole and keep every argument as a column.
    By default (None) files above :data:`STREAM_ABOVE_BYTES` of JSON text stream. Why a
    threshold and not always: the whole-file read keeps every argument (``Input Dims``, a
    kernel's grid...), which the chapters' analyses read, and on a 100 MB trace it costs
    872 MiB; above a few hundred MB its 8.5 to 9.1 bytes of memory per byte of text exceed a
    laptop's (4,113 MiB for the report on a 507 MB trace, 663 MiB streamed:
    ``artifacts/tools/bench_torch_trace_big.txt``).
    """
    path = Path(path)
    if stream is None:
        stream = path.is_file() and _text_bytes(path) > STREAM_ABOVE_BYTES
    if stream:
        from .trace_stream import NotStreamable, read_events

        try:
            got = read_events(path)
        except NotStreamable:
            pass  # the whole-file reader says what is wrong with the file, in one sentence
        else:
            _check_version(got.meta, path)
            return Trace(path=path, meta=got.meta, categories=got.categories, _tables=got.tables,
                         thread_names=got.thread_names, process_names=got.process_names)
    data = _parse(path)
    raw_events = data.pop("traceEvents")
    _check_version(data, path)

    kinds = sorted(set(KINDS.values()) | {"other"})
    # One table of every event's top-level fields, built by pandas in C; then split by phase and category.
    ev = pd.DataFrame.from_records([e for e in raw_events if isinstance(e, dict)],
                                   columns=["ph", "cat", "name", "ts", "dur", "pid", "tid", "args", "id"])
    del raw_events
    categories = {str(k): int(v) for k, v in ev["cat"].value_counts().items()}
    cat = ev["cat"].astype(str).str.lower()
    ph = ev["ph"]
    complete = ev[ph == "X"]
    kind_of = cat[ph == "X"].map(KINDS).fillna("other")
    tables = {k: _frame(complete[kind_of == k]) for k in kinds}

    fl = ev[ph.isin(["s", "f", "t"]) & cat.isin(list(FLOW_CATEGORIES))]
    f = pd.DataFrame({"id": fl["id"].to_numpy(), "cat": cat[fl.index].map(FLOW_CATEGORIES).to_numpy(),
                      "phase": fl["ph"].to_numpy(), "ts": _to_ns(_numbers(fl["ts"].tolist())),
                      "pid": fl["pid"].to_numpy(), "tid": fl["tid"].to_numpy(), "name": fl["name"].to_numpy()})
    tables["flow"] = f

    mem_rows = ev[(ph == "i") & (ev["name"] == "[memory]")]
    m = pd.DataFrame.from_records([a if isinstance(a, dict) else {} for a in mem_rows["args"].tolist()]) \
        if len(mem_rows) else pd.DataFrame(columns=["Bytes", "Total Allocated", "Total Reserved", "Device Type",
                                                    "Device Id", "Addr"])
    m.insert(0, "ts", _to_ns(_numbers(mem_rows["ts"].tolist())))
    tables["memory"] = m.rename(columns={"Bytes": "bytes", "Total Allocated": "total_allocated",
                                         "Total Reserved": "total_reserved", "Device Type": "device_type",
                                         "Device Id": "device_id", "Addr": "address"})

    thread_names: dict[tuple[Any, Any], str] = {}
    process_names: dict[Any, str] = {}
    for r in ev[ph == "M"].itertuples():
        a = r.args if isinstance(r.args, dict) else {}
        if r.name == "thread_name":
            thread_names[(r.pid, r.tid)] = str(a.get("name"))
        elif r.name == "process_name":
            process_names[r.pid] = str(a.get("name"))
    del ev
    _thread_ids(tables)
    for k in ("user_annotation", "gpu_user_annotation"):
        tables[k]["text"] = tables[k]["name"]
    for k in ("kernel", "memcpy", "memset", "runtime", "driver"):
        _correlation_from_flows(tables[k], f, gpu=k in ("kernel", "memcpy", "memset"))
        wanted = ("correlationId", "externalId") + (("deviceId", "streamId") if k in ("kernel", "memcpy", "memset") else ())
        for c in wanted:  # present even where the trace has none of these events, so joins need no special case
            if c not in tables[k].columns:
                tables[k][c] = pd.array([pd.NA] * len(tables[k]), dtype="Int64")
    return Trace(path=path, meta=data, categories=categories, _tables=tables, thread_names=thread_names,
                 process_names=process_names)
