"""Read Nsight Systems sqlite exports into pandas tables, trusting the file's schema, not our memory of it.

``nsys export --type sqlite`` writes one table per kind of event. Names and columns
move between nsys versions (NVTX text inline in ``text`` or as an id in ``textId``;
kernel names as ids into ``StringIds``), and a capture that recorded no kernel has
no kernel table at all. Every reader here looks at what the file holds and says
clearly what is missing and why it usually is.

Times are integer nanoseconds on the capture's clock, as nsys stores them. This module only
reads; what rewrites an export (scrubbing the environment, trimming a reference) is in
:mod:`gpuprof.nsys.export_edit`.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..artifacts import gunzipped_copy, stored_file
from ..errors import GpuprofError

__all__ = ["NoKernelRows", "open_export", "table_names", "kernels", "nvtx_ranges", "runtime_calls",
           "attribute_to_ranges", "nvtx_marks", "ensure_sqlite", "memcpy", "memset", "synchronization", "streams", "gpu_info",
           "memory_usage", "thread_names", "nvtx_strings", "LAUNCH_COLUMNS", "pid_of", "tid_of", "gpu_metrics",
           "gpu_metric_means"]

_SQLITE_MAGIC = b"SQLite format 3\x00"
KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX_RANGE_TYPES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange


class NoKernelRows(GpuprofError):
    """The capture holds no GPU kernel rows."""


def pid_of(global_id: pd.Series | np.ndarray | int) -> Any:
    """The process id inside an nsys ``globalTid`` or ``globalPid`` (bits 24-47 of the serialised id).

    nsys stores one 64-bit id per thread (and per process) instead of a (pid, tid) pair; every
    reader that asks "which process?" unpacks it here. A Series gives a Series on the same
    index, anything else an int64 array (a NumPy integer for one id).
    """
    if isinstance(global_id, pd.Series):
        return pd.Series(np.right_shift(global_id.to_numpy(dtype=np.int64), 24) & 0xFFFFFF, index=global_id.index)
    return np.right_shift(np.asarray(global_id, dtype=np.int64), 24) & 0xFFFFFF


def tid_of(global_tid: pd.Series | np.ndarray | int) -> Any:
    """The thread id inside an nsys ``globalTid`` (its low 24 bits), shaped as :func:`pid_of` returns."""
    if isinstance(global_tid, pd.Series):
        return pd.Series(global_tid.to_numpy(dtype=np.int64) & 0xFFFFFF, index=global_tid.index)
    return np.asarray(global_tid, dtype=np.int64) & 0xFFFFFF


def ensure_sqlite(path: str | Path) -> Path:
    """The sqlite export for ``path``: itself if it is one (a ``.sqlite.gz``, or a ``.sqlite`` stored only
    gzipped as the course's references are, is decompressed into a cache first); for a ``.nsys-rep``, its
    sibling ``.sqlite``, exported with nsys first when that file does not exist yet and nsys is installed
    (otherwise an error that says how to export it)."""
    path = stored_file(Path(path)) or Path(path)
    if path.name.endswith(".sqlite.gz"):
        return _gunzipped(path)
    if path.suffix not in (".nsys-rep", ".qdrep"):
        return path
    target = path.with_suffix(".sqlite")
    if target.exists():
        return target
    if not path.exists():
        raise GpuprofError(f"{path} does not exist.", "Check the path.")
    from ..runner import run_profiler
    from ..tools import find_tool

    try:
        nsys = find_tool("nsys")
    except GpuprofError:
        raise GpuprofError(f"{path} is an Nsight Systems report, not its sqlite export, and nsys is not installed here to export it.",
                           f"Export it where nsys is: `nsys export --type sqlite -o {target} {path}`.") from None
    # overwrite=True only lets the runner share the report's name: the .sqlite does not
    # exist (checked above), and export writes nothing else.
    run_profiler(nsys, ["export", "--type", "sqlite", "-o", "{output}.sqlite", str(path)], out_dir=path.parent,
                 name=path.stem, overwrite=True)
    return target


def _gunzipped(path: Path) -> Path:
    """A gzipped export (the course commits its larger ones so) decompressed once into a cache
    folder, so that SQLite can open it (:func:`gpuprof.artifacts.gunzipped_copy`)."""
    return gunzipped_copy(path)


def open_export(path: str | Path) -> sqlite3.Connection:
    """Open an nsys sqlite export read-only, with a clear message for the usual wrong files.

    A ``.nsys-rep`` report is exported to sqlite first when nsys is installed (see
    :func:`ensure_sqlite`).
    """
    path = ensure_sqlite(path)
    if not path.exists():
        raise GpuprofError(f"{path} does not exist.", "Check the path, or export the report first.")
    with path.open("rb") as fh:
        head = fh.read(16)
    if head != _SQLITE_MAGIC:
        if path.suffix in (".nsys-rep", ".qdrep"):
            raise GpuprofError(f"{path} is an Nsight Systems report, not its sqlite export.",
                               f"Export it with `nsys export --type sqlite -o {path.with_suffix('.sqlite')} {path}`.")
        raise GpuprofError(f"{path} is not an SQLite file (it may be truncated or another format).",
                           "Re-export it with `nsys export --type sqlite`.")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise GpuprofError(f"{path} is damaged: {exc}.", "Re-export it with `nsys export --type sqlite`.") from None
    return conn


def table_names(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_info('{table}')")}


def _strings(conn: sqlite3.Connection) -> dict[int, str]:
    if "StringIds" not in table_names(conn):
        return {}
    return dict(conn.execute("SELECT id, value FROM StringIds").fetchall())


def rowid_range(conn: sqlite3.Connection, table: str) -> tuple[int, int] | None:
    """The table's smallest and largest rowid (None: no rows). Two queries: SQLite answers ``max(rowid)`` or
    ``min(rowid)`` alone from the b-tree's edge, but ``SELECT min(rowid), max(rowid)`` by reading every row
    (0.27 s a query at 5 million kernels)."""
    hi = conn.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0]
    if hi is None:
        return None
    return int(conn.execute(f"SELECT min(rowid) FROM {table}").fetchone()[0]), int(hi)


READ_CHUNK_ROWS = 1 << 20
"""Rows read from SQLite per step (of :func:`_read_table`): each step's values pass through one temporary array
of this many rows, so reading a table of 20 million rows holds the finished columns and one step, not a second
copy of the whole table."""


def _read_table(conn: sqlite3.Connection, table: str, columns: list[str], where: str = "",
                params: Sequence[Any] = ()) -> pd.DataFrame:
    """Read integer columns fast: straight into one int64 array per column, skipping pandas' type inference.

    nsys stores times, ids and name references as integers; where an older export holds
    text (or NULLs) in one of the columns, fall back to pandas' general reader. The rows come
    in steps of :data:`READ_CHUNK_ROWS` into arrays sized by the table's rowid range (SQLite's
    rowids only grow, so it bounds the row count; pages never written are never resident), so the
    peak is the finished columns plus one step. ``where``: an SQL condition with ``?`` for ``params``.
    """
    import itertools

    sql = f"SELECT {', '.join(columns)} FROM {table}" + (f" WHERE {where}" if where else "")
    span = rowid_range(conn, table)
    capacity = 0 if span is None else span[1] - span[0] + 1
    out = [np.empty(capacity, dtype=np.int64) for _ in columns]
    n = 0
    try:  # the rows' values streamed into int64 arrays: no list of tuples, no per-row conversion
        cursor = conn.execute(sql, tuple(params))
        while True:
            flat = np.fromiter(itertools.chain.from_iterable(itertools.islice(cursor, READ_CHUNK_ROWS)), dtype=np.int64)
            if len(flat) == 0:
                break
            rows = flat.reshape(-1, len(columns))
            for col, dest in zip(rows.T, out):
                dest[n:n + len(rows)] = col
            n += len(rows)
    except (TypeError, ValueError, OverflowError):  # a NULL or a text value: the general reader
        return pd.DataFrame.from_records(conn.execute(sql, tuple(params)).fetchall(), columns=columns)
    # a copy only where most rows were left out (a WHERE): pages past n were never touched, so never resident
    return pd.DataFrame({c: (a[:n] if 2 * n > capacity else a[:n].copy()) for c, a in zip(columns, out)}, copy=False)


def _window_sql(window: tuple[int, int] | None) -> tuple[str, tuple[int, ...]]:
    """The SQL condition for rows that overlap ``window`` (end after its start, start before its end)."""
    if window is None:
        return "", ()
    return "end > ? AND start < ?", (int(window[0]), int(window[1]))


def _resolve(ids: pd.Series, strings: dict[int, str]) -> pd.Series:
    """Map StringIds ids to text in one vectorised step (a million rows in well under a second).

    Columns that already hold text (older exports) pass through unchanged.
    """
    if not pd.api.types.is_integer_dtype(ids):
        return ids
    # A capture has a million kernels but a few hundred names: look up each distinct id once per step of
    # READ_CHUNK_ROWS rows (a sort of every id at once cost three more arrays of the column's size).
    values = ids.to_numpy()
    out = np.empty(len(values), dtype=object)
    for a in range(0, len(values), READ_CHUNK_ROWS):
        uniq, inverse = np.unique(values[a:a + READ_CHUNK_ROWS], return_inverse=True)
        names = np.array([strings.get(int(u), str(u)) for u in uniq], dtype=object)
        out[a:a + READ_CHUNK_ROWS] = names[inverse.ravel()]
    return pd.Series(out, index=ids.index, dtype=object)


LAUNCH_COLUMNS = ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread",
                  "staticSharedMemory", "dynamicSharedMemory", "localMemoryPerThread")


KERNEL_BASE_COLUMNS = ("start", "end", "deviceId", "streamId", "correlationId", "globalPid", "name", "demangled")


def kernels(path: str | Path, *, launch: bool = True, only: Sequence[str] | None = None,
            window: tuple[int, int] | None = None) -> pd.DataFrame:
    """One row per kernel: start, end, duration_ns, name (short), demangled (full), stream, device,
    correlation id, and its launch configuration: grid and block sizes (``gridX`` ... ``blockZ``),
    ``registersPerThread``, ``staticSharedMemory`` and ``dynamicSharedMemory`` (bytes per block),
    ``localMemoryPerThread``, plus ``threads`` (grid x block, all dimensions), where the export
    records them.

    ``nsys stats`` reports kernels by their demangled names; the short name is what the
    timeline shows and what fits in a table. The launch configuration is what Nsight
    Compute's Launch Statistics section starts from: a timeline already tells you whether
    a kernel ran 40 blocks on a 132-SM GPU. ``launch=False`` leaves those ten columns out,
    which halves the time to read a large export when only times and names are needed.
    ``only`` reads just the columns it names (of :data:`KERNEL_BASE_COLUMNS`; ``start`` and
    ``end`` always, and ``duration_ns``): reading costs about 0.1 s per column per million
    kernels, so a per-name summary of a large export reads ``only=("name",)``. ``window`` (start, end in ns)
    reads only the kernels that overlap it, SQLite filtering, so a figure of one step of a long capture does not
    hold every kernel in Python.
    """
    with closing(open_export(path)) as conn:
        if KERNEL_TABLE not in table_names(conn):
            raise NoKernelRows(
                f"{Path(path).name} holds no kernel table: nsys recorded no GPU kernel.",
                "Usual reasons: the program ran on the CPU (no GPU, or a CPU build of PyTorch); "
                "--trace did not include cuda; the capture range ended before the kernels ran "
                "(synchronise inside the range); or the program exited before nsys flushed its buffers.",
            )
        cols = _columns(conn, KERNEL_TABLE)
        short = next((c for c in ("shortName", "demangledName", "mangledName") if c in cols), None)
        full = next((c for c in ("demangledName", "mangledName", "shortName") if c in cols), None)
        extra = LAUNCH_COLUMNS if launch and only is None else ()
        keep = set(KERNEL_BASE_COLUMNS) if only is None else {"start", "end", *only}
        unknown = keep - set(KERNEL_BASE_COLUMNS)
        if unknown:
            raise ValueError(f"only= names columns this reader does not make: {sorted(unknown)}; "
                             f"choose from {KERNEL_BASE_COLUMNS}")
        wanted = [c for c in ("start", "end", "deviceId", "streamId", "correlationId", "globalPid", *extra)
                  if c in cols and (c in keep or c in extra)]
        names = sorted({c for c, want in ((short, "name"), (full, "demangled")) if c and want in keep})
        df = _read_table(conn, KERNEL_TABLE, wanted + names, *_window_sql(window))
        strings = _strings(conn)

    def text(col: str | None) -> pd.Series:
        if col is None:
            return pd.Series("?", index=df.index)
        return _resolve(df[col], strings)

    if "name" in keep:
        df["name"] = text(short)
    if "demangled" in keep:
        df["demangled"] = text(full)
    df = df.drop(columns=names)
    df["duration_ns"] = df["end"] - df["start"]
    if all(c in df for c in ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ")):
        df["threads"] = (df["gridX"] * df["gridY"] * df["gridZ"] * df["blockX"] * df["blockY"] * df["blockZ"]).astype("int64")
    if df["start"].is_monotonic_increasing:  # exports are usually in time order already
        return df.reset_index(drop=True)
    return df.sort_values("start", ignore_index=True, kind="stable")


def _enum(conn: sqlite3.Connection, table: str) -> dict[int, str]:
    """An ENUM_* table of the export as {id: label}; empty when the export lacks it."""
    if table not in table_names(conn):
        return {}
    return {int(i): str(label) for i, label in conn.execute(f"SELECT id, label FROM {table}")}


def _activity(path: str | Path, table: str, columns: list[str]) -> tuple[pd.DataFrame, sqlite3.Connection | None]:
    conn = open_export(path)
    if table not in table_names(conn):
        conn.close()
        return pd.DataFrame(columns=columns), None
    have = _columns(conn, table)
    cols = [c for c in columns if c in have]
    return pd.read_sql_query(f"SELECT {', '.join(cols)} FROM {table}", conn), conn


def memcpy(path: str | Path) -> pd.DataFrame:
    """Memory copies: start, end, duration_ns, bytes, kind (Host-to-Device, ...), src/dst memory
    kind (Pageable, Pinned, Device), stream, and the achieved bandwidth in GB/s."""
    df, conn = _activity(path, "CUPTI_ACTIVITY_KIND_MEMCPY",
                         ["start", "end", "deviceId", "streamId", "correlationId", "bytes", "copyKind", "srcKind", "dstKind"])
    if conn is not None:
        with closing(conn):
            kinds, mem = _enum(conn, "ENUM_CUDA_MEMCPY_OPER"), _enum(conn, "ENUM_CUDA_MEM_KIND")
    else:
        kinds, mem = {}, {}
    df["duration_ns"] = df["end"] - df["start"]
    df["kind"] = df["copyKind"].map(lambda k: kinds.get(int(k), str(k))) if len(df) else pd.Series(dtype=str)
    for col in ("srcKind", "dstKind"):
        if col in df:
            df[col.replace("Kind", "_memory")] = df[col].map(lambda k: mem.get(int(k), str(k)))
    df["gbps"] = df["bytes"] / df["duration_ns"].where(df["duration_ns"] > 0)
    return df.sort_values("start", ignore_index=True)


def memset(path: str | Path) -> pd.DataFrame:
    """Memsets: start, end, duration_ns, bytes, stream."""
    df, conn = _activity(path, "CUPTI_ACTIVITY_KIND_MEMSET",
                         ["start", "end", "deviceId", "streamId", "correlationId", "bytes", "value"])
    if conn is not None:
        conn.close()
    df["duration_ns"] = df["end"] - df["start"]
    return df.sort_values("start", ignore_index=True)


def memory_usage(path: str | Path) -> pd.DataFrame:
    """GPU memory allocations and frees nsys saw (``--cuda-memory-usage=true``): start, bytes,
    signed_bytes (+ allocated, - freed), memory kind (Device, Pinned, Device Static, ...),
    operation. Empty when the capture was made without the option."""
    df, conn = _activity(path, "CUDA_GPU_MEMORY_USAGE_EVENTS",
                         ["start", "deviceId", "address", "bytes", "memKind", "memoryOperationType", "streamId", "correlationId"])
    kinds, ops = {}, {}
    if conn is not None:
        with closing(conn):
            kinds, ops = _enum(conn, "ENUM_CUDA_MEM_KIND"), _enum(conn, "ENUM_CUDA_DEV_MEM_EVENT_OPER")
    df["memory"] = df["memKind"].map(lambda k: kinds.get(int(k), str(k))) if len(df) else pd.Series(dtype=str)
    df["operation"] = df["memoryOperationType"].map(lambda k: ops.get(int(k), str(k))) if len(df) else pd.Series(dtype=str)
    df["signed_bytes"] = df["bytes"].where(df["operation"] != "Deallocation", -df["bytes"]) if len(df) else pd.Series(dtype=int)
    return df.sort_values("start", ignore_index=True)


def synchronization(path: str | Path) -> pd.DataFrame:
    """CUDA synchronisation activity as the driver saw it: start, end, duration_ns, type, stream."""
    df, conn = _activity(path, "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
                         ["start", "end", "deviceId", "streamId", "correlationId", "syncType"])
    types = {}
    if conn is not None:
        with closing(conn):
            types = _enum(conn, "ENUM_CUPTI_SYNC_TYPE")
    df["duration_ns"] = df["end"] - df["start"]
    df["type"] = df["syncType"].map(lambda k: types.get(int(k), str(k))) if len(df) else pd.Series(dtype=str)
    return df.sort_values("start", ignore_index=True)


def streams(path: str | Path) -> pd.DataFrame:
    """The CUDA streams of the capture: streamId, priority, flags (empty if not recorded)."""
    df, conn = _activity(path, "TARGET_INFO_CUDA_STREAM", ["streamId", "contextId", "priority", "flag"])
    if conn is not None:
        conn.close()
    return df


def gpu_info(path: str | Path) -> pd.DataFrame:
    """The GPUs nsys saw: name, memory, bandwidth, SM count, compute capability."""
    df, conn = _activity(path, "TARGET_INFO_GPU", ["id", "name", "totalMemory", "memoryBandwidth", "smCount",
                                                    "computeMajor", "computeMinor", "l2CacheSize", "clockRate"])
    if conn is not None:
        conn.close()
    return df


def gpu_metrics(path: str | Path) -> pd.DataFrame:
    """The GPU's own counters, sampled by ``nsys profile --gpu-metrics-devices``: one row per sample,
    ``timestamp`` (ns), ``metric`` (its name as this nsys and GPU call it, e.g. a DRAM bandwidth or a
    PCIe throughput, often in percent of peak: the name says its unit), ``value`` and ``typeId``
    (which GPU). A CUDA trace has no device-memory traffic; these samples do, at the sampling rate.

    The names are read from the export (``TARGET_INFO_GPU_METRICS``), never assumed: they differ
    between GPU generations and nsys versions. Empty when the capture was made without the option.
    """
    columns = ["timestamp", "metric", "value", "typeId"]
    with closing(open_export(path)) as conn:
        tables = table_names(conn)
        if not {"GPU_METRICS", "TARGET_INFO_GPU_METRICS"} <= tables:
            return pd.DataFrame(columns=columns)
        df = pd.read_sql_query("SELECT m.timestamp, n.metricName AS metric, m.value, m.typeId FROM GPU_METRICS m "
                               "JOIN TARGET_INFO_GPU_METRICS n ON m.typeId = n.typeId AND m.metricId = n.metricId", conn)
    return df.sort_values(["timestamp", "metric"], ignore_index=True)[columns]


def gpu_metric_means(path: str | Path, window: tuple[int, int]) -> pd.DataFrame:
    """Per metric, the samples inside ``window`` (ns): how many, their mean and their maximum.

    A mean over a window is only as good as the samples in it: at the default sampling rate a
    pass of tens of milliseconds holds hundreds of samples, a kernel of microseconds none.
    """
    samples = gpu_metrics(path)
    lo, hi = window
    inside = samples[(samples["timestamp"] >= lo) & (samples["timestamp"] < hi)]
    if inside.empty:
        return pd.DataFrame(columns=["metric", "samples", "mean", "max"])
    out = inside.groupby("metric").agg(samples=("value", "size"), mean=("value", "mean"), max=("value", "max"))
    return out.reset_index()


def runtime_calls(path: str | Path, *, window: tuple[int, int] | None = None) -> pd.DataFrame:
    """CUDA runtime API calls (launches, copies, syncs): start, end, name, correlation id, thread;
    ``window`` (start, end in ns): only the calls that overlap it (see :func:`kernels`)."""
    with closing(open_export(path)) as conn:
        if RUNTIME_TABLE not in table_names(conn):
            return pd.DataFrame(columns=["start", "end", "name", "correlationId", "globalTid"])
        df = _read_table(conn, RUNTIME_TABLE, ["start", "end", "nameId", "correlationId", "globalTid"],
                         *_window_sql(window))
        strings = _strings(conn)
    df["name"] = _resolve(df.pop("nameId"), strings)
    start = df["start"].to_numpy()
    if len(start) < 2 or (start[1:] > start[:-1]).all():  # in order, no two at one time: any sort leaves it as it is
        return df.reset_index(drop=True)
    return df.sort_values("start", ignore_index=True)


def thread_names(path: str | Path) -> dict[int, str]:
    """{globalTid: name} for the threads the capture named (``ThreadNames``); empty if none were."""
    with closing(open_export(path)) as conn:
        if "ThreadNames" not in table_names(conn):
            return {}
        rows = conn.execute("SELECT globalTid, nameId FROM ThreadNames").fetchall()
        strings = _strings(conn)
    return {int(tid): strings.get(int(name_id), str(name_id)) for tid, name_id in rows}


NVTX_MARK, NVTX_CATEGORY, NVTX_DOMAIN_CREATE = 34, 33, 75
_PAYLOAD_COLUMNS = ("int64Value", "uint64Value", "doubleValue", "int32Value", "uint32Value", "floatValue")


def _nvtx_events(path: str | Path) -> tuple[pd.DataFrame, dict[int, str]]:
    """All NVTX events with their text resolved, plus the domain names; empty if none were recorded."""
    with closing(open_export(path)) as conn:
        names = table_names(conn)
        table = next((t for t in ("NVTX_EVENTS", "NVTX_EVENTS_V2") if t in names), None)
        if table is None:
            return pd.DataFrame(), {}
        cols = _columns(conn, table)
        wanted = ["start", "end", "eventType", "globalTid"] + [c for c in ("text", "textId", "domainId", "category",
                                                                          "endGlobalTid", *_PAYLOAD_COLUMNS) if c in cols]
        df = pd.read_sql_query(f"SELECT {', '.join(wanted)} FROM {table}", conn)
        strings = _strings(conn)
    text = df["text"] if "text" in df else pd.Series([None] * len(df), index=df.index, dtype=object)
    if "textId" in df:
        from_id = df["textId"].map(lambda i: strings.get(int(i)) if pd.notna(i) else None)
        text = text.where(text.notna(), from_id)
    df["text"] = text.fillna("?")
    domain_id = df["domainId"] if "domainId" in df else pd.Series(0, index=df.index)
    domains = {int(d): t for d, t, e in zip(domain_id, df["text"], df["eventType"]) if e == NVTX_DOMAIN_CREATE}
    df["domain"] = domain_id.map(lambda d: domains.get(int(d), "default") if pd.notna(d) else "default")
    categories = {int(c): t for c, t, e in zip(df.get("category", pd.Series(dtype=float)), df["text"], df["eventType"])
                  if e == NVTX_CATEGORY and pd.notna(c)}
    if "category" in df:
        df["category"] = df["category"].map(lambda c: categories.get(int(c), str(int(c))) if pd.notna(c) else "")
    payload = pd.Series([None] * len(df), index=df.index, dtype=object)
    for c in _PAYLOAD_COLUMNS:
        if c in df:
            payload = payload.where(payload.notna(), df[c].astype(object).where(df[c].notna(), None))
    df["payload"] = payload
    return df, domains


def nvtx_ranges(path: str | Path) -> pd.DataFrame:
    """NVTX push/pop and start/end ranges: start, end, duration_ns, text, domain, category, payload,
    thread (``globalTid``; ``endGlobalTid`` where a start/end range ended on another thread), depth,
    and ``style``: ``PushPop`` or ``StartEnd``, as ``nsys stats`` names the two kinds.

    ``depth`` is the nesting level on its thread (0 = outermost), computed from the
    intervals, because the export does not store it.
    """
    df, _ = _nvtx_events(path)
    cols = ["start", "end", "duration_ns", "text", "domain", "category", "payload", "globalTid", "endGlobalTid", "depth",
            "style"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    df = df[df["eventType"].isin(NVTX_RANGE_TYPES) & df["end"].notna()].copy()
    df["style"] = df["eventType"].map({NVTX_RANGE_TYPES[0]: "PushPop", NVTX_RANGE_TYPES[1]: "StartEnd"})
    df["end"] = df["end"].astype("int64")
    df["duration_ns"] = df["end"] - df["start"]
    df["category"] = df["category"].fillna("").astype(str) if "category" in df else ""
    if "endGlobalTid" in df:  # set only for start/end ranges; a push/pop range ends where it started
        df["endGlobalTid"] = df["endGlobalTid"].fillna(df["globalTid"]).astype("int64")
    else:
        df["endGlobalTid"] = df["globalTid"]
    df = df.sort_values(["globalTid", "start"], ignore_index=True)
    depth: list[int] = []
    for _, group in df.groupby("globalTid", sort=False):
        open_ends: list[int] = []
        for end, start in zip(group["end"], group["start"]):
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            depth.append(len(open_ends))
            open_ends.append(end)
    df["depth"] = depth
    return df[cols]


def nvtx_strings(path: str | Path) -> pd.DataFrame:
    """How each NVTX message reached the tool: one row per (event kind, domain, text), with
    ``registered`` and ``events`` (how many).

    The export keeps the two kinds of message apart: a registered string (the program
    handed NVTX the text once, ``nvtxDomainRegisterStringA``, then only its handle) is a
    ``textId`` into ``StringIds``; a plain one (``nvtxRangePushA("...")``, or an event
    attribute with an ASCII message) is the ``text`` column, copied at every event. Which
    kind a binding sends decides what an event costs and whether ``--capture-range=nvtx``
    matches it by default, and bindings do not document it; this reads it from the capture.
    ``event`` is the export's name for the kind (``NvtxPushPopRange``, ``NvtxMark``,
    ``NvtxDomainCreate``, ...; the number where the export lacks the table of names).
    """
    cols = ["event", "domain", "text", "registered", "events"]
    with closing(open_export(path)) as conn:
        names = table_names(conn)
        table = next((t for t in ("NVTX_EVENTS", "NVTX_EVENTS_V2") if t in names), None)
        if table is None:
            return pd.DataFrame(columns=cols)
        kinds = (dict(conn.execute("SELECT id, name FROM ENUM_NSYS_EVENT_TYPE").fetchall())
                 if "ENUM_NSYS_EVENT_TYPE" in names else {})
        registered = pd.read_sql_query(f"SELECT eventType, text IS NULL AND textId IS NOT NULL AS registered "
                                       f"FROM {table}", conn)["registered"].astype(bool)
    df, _ = _nvtx_events(path)
    if df.empty:
        return pd.DataFrame(columns=cols)
    df = df.assign(registered=registered.to_numpy(), event=df["eventType"].map(lambda e: kinds.get(int(e), str(e))))
    df = df[df["text"] != "?"]  # events that carry no message (a pop, a domain's destruction)
    out = df.groupby(["event", "domain", "text", "registered"], sort=True).size().rename("events").reset_index()
    return out[cols]


def nvtx_marks(path: str | Path) -> pd.DataFrame:
    """NVTX marks (instantaneous events): time, text, domain, thread."""
    df, _ = _nvtx_events(path)
    if df.empty:
        return pd.DataFrame(columns=["start", "text", "domain", "globalTid"])
    return df[df["eventType"] == NVTX_MARK][["start", "text", "domain", "globalTid"]].reset_index(drop=True)


def attribute_to_ranges(path: str | Path, names: str | Sequence[str], *, rule: str) -> pd.DataFrame:
    """Kernels launched inside the NVTX ranges called ``names`` (one name or several), read from
    the file once, with each kernel's range (``range_text``, ``range_index``: which occurrence).

    ``rule="thread"`` is nsys's own rule (its NVTX projection, ``nvtx_kern_sum``): the CPU
    call that launched the kernel lay inside the range *on the range's thread*.
    ``rule="window"`` asks only whether the launch fell inside the range's time window, on
    any thread. They differ when a program hands work to other threads: PyTorch's autograd
    engine launches the backward pass from a thread of its own, so under nsys's rule the
    backward kernels belong to no ``step_N`` range of the main thread. See
    :func:`gpuprof.activity.attribute_kernels`.
    """
    from ..activity import attribute_kernels

    wanted = [names] if isinstance(names, str) else list(names)
    ranges = nvtx_ranges(path)
    ranges = ranges[ranges["text"].isin(wanted)]
    if ranges.empty:
        return attribute_kernels(pd.DataFrame(columns=["start", "end", "correlationId"]), runtime_calls(path), ranges,
                                 rule=rule)
    return attribute_kernels(kernels(path), runtime_calls(path), ranges, rule=rule)


def session_start(path: str | Path) -> int | None:
    """The report's session start as nanoseconds since 1970 (UTC), or None where the export lacks it.

    Every timestamp of an export counts from its own session's start, so two reports
    (one per rank, say) share an axis only after each is shifted by its start.
    """
    with closing(open_export(path)) as conn:
        if "TARGET_INFO_SESSION_START_TIME" not in table_names(conn):
            return None
        row = conn.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
    return int(row[0]) if row and row[0] is not None else None


def launch_backtrace(path: str | Path, correlation_id: int) -> pd.DataFrame:
    """The CPU call stack nsys recorded for the runtime call with ``correlation_id`` (its kernel's launch).

    Recorded only with ``--cudabacktrace`` and CPU sampling on (``--sample=process-tree``;
    with ``--sample=none`` nsys warns and records none). Rows from the innermost frame
    (depth 0, inside the CUDA driver) outwards: depth, symbol, module (file name only),
    resolved (False where only an address is known). Empty when the call has no backtrace.
    """
    cols = ["depth", "symbol", "module", "resolved"]
    with closing(open_export(path)) as conn:
        names = table_names(conn)
        if "CUDA_CALLCHAINS" not in names or "callchainId" not in _columns(conn, RUNTIME_TABLE):
            return pd.DataFrame(columns=cols)
        row = conn.execute(f"SELECT callchainId FROM {RUNTIME_TABLE} WHERE correlationId = ? AND callchainId IS NOT NULL",
                           (int(correlation_id),)).fetchone()
        if row is None:
            return pd.DataFrame(columns=cols)
        frames = conn.execute("SELECT stackDepth, symbol, module, unresolved FROM CUDA_CALLCHAINS WHERE id = ? "
                              "ORDER BY stackDepth", (row[0],)).fetchall()
        strings = _strings(conn)
    return pd.DataFrame([{"depth": d, "symbol": strings.get(s, str(s)) if s is not None else "?",
                          "module": Path(strings.get(m, "")).name if m is not None else "",
                          "resolved": not u} for d, s, m, u in frames], columns=cols)
