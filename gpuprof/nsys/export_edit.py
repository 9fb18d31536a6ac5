"""Rewrite an Nsight Systems sqlite export in place: what a capture keeps before it is shared or committed.

:mod:`gpuprof.nsys.sqlite` only reads exports; the functions here change them, so a
reader of a module can tell which of the two it is calling. :func:`scrub_environment` runs
on every export the course writes (the capture machine's environment variables are not
kept); :func:`keep_callchains`, :func:`trim_reference`, :func:`keep_in_windows` and :func:`keep_only_sync_calls` shrink a
course reference to what its chapter reads, and say what they removed.
"""

from __future__ import annotations

import re
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Sequence

from .sqlite import KERNEL_TABLE, RUNTIME_TABLE, nvtx_ranges, open_export, table_names

__all__ = ["ENV_REMOVED", "scrub_environment", "keep_callchains", "trim_reference", "keep_in_windows",
           "keep_launched_in", "SYNC_TABLE", "keep_only_sync_calls"]

SYNC_TABLE = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"

LAUNCHED_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")

ENV_REMOVED = "(removed by gpuprof: the capture machine's environment variables are not kept)"


def scrub_environment(path: str | Path) -> int:
    """Blank the capture machine's environment variables that nsys stores in an export.

    nsys records the profiled process's whole environment twice: as one text in
    ``TARGET_INFO_SYSTEM_ENV`` (``DeviceEnvironment``) and one row per variable in
    ``META_DATA_CAPTURE`` (``PROCESS_<n>:ENVIRONMENT_VARIABLE``): container names, paths,
    and on many machines tokens. A capture meant to be shared should carry neither.
    Returns the rows changed; the file is compacted afterwards.
    """
    path = Path(path)
    open_export(path).close()  # same checks and messages as for reading
    changed = 0
    with closing(sqlite3.connect(path)) as conn:
        names = table_names(conn)
        if "TARGET_INFO_SYSTEM_ENV" in names:
            changed += conn.execute("UPDATE TARGET_INFO_SYSTEM_ENV SET value = ? WHERE name = 'DeviceEnvironment' "
                                    "AND value != ?", (ENV_REMOVED, ENV_REMOVED)).rowcount
        if "META_DATA_CAPTURE" in names:
            # One row per variable: keep one row that says what was removed, drop the rest.
            rows = conn.execute("SELECT rowid, name FROM META_DATA_CAPTURE WHERE name LIKE '%:ENVIRONMENT_VARIABLE' "
                                "AND value != ?", (ENV_REMOVED,)).fetchall()
            changed += len(rows)
            kept: set[str] = set()
            for rowid, name in rows:
                if name in kept:
                    conn.execute("DELETE FROM META_DATA_CAPTURE WHERE rowid = ?", (rowid,))
                else:
                    kept.add(name)
                    conn.execute("UPDATE META_DATA_CAPTURE SET value = ? WHERE rowid = ?", (ENV_REMOVED, rowid))
        conn.commit()
        if changed:
            conn.execute("VACUUM")
    return changed


def keep_callchains(path: str | Path, correlation_ids: Sequence[int]) -> int:
    """Keep the CPU backtraces of the runtime calls with ``correlation_ids`` only; drop the rest of ``CUDA_CALLCHAINS``.

    A capture with ``--cudabacktrace=all`` stores a backtrace of every launch, most of its
    size; a reference capture that shows a few of them need not carry thousands. The
    runtime rows keep their ``callchainId`` (so the count of calls that had a backtrace
    stays readable); only the frames of the others go. Returns the backtraces kept.
    """
    path = Path(path)
    with closing(sqlite3.connect(path)) as conn:
        if "CUDA_CALLCHAINS" not in table_names(conn):
            return 0
        ids = [int(c) for c in correlation_ids]
        marks = ",".join("?" * len(ids)) or "NULL"
        keep = {r[0] for r in conn.execute(f"SELECT callchainId FROM {RUNTIME_TABLE} WHERE callchainId IS NOT NULL "
                                           f"AND correlationId IN ({marks})", ids)}
        conn.execute("CREATE TEMP TABLE keep_ids (id INTEGER PRIMARY KEY)")
        conn.executemany("INSERT INTO keep_ids VALUES (?)", [(k,) for k in keep])
        conn.execute("DELETE FROM CUDA_CALLCHAINS WHERE id NOT IN (SELECT id FROM keep_ids)")
        conn.commit()
        conn.execute("VACUUM")
    return len(keep)


def trim_reference(path: str | Path, *, drop_tables: Sequence[str] = (), keep_kernels_in: str | None = None,
                   keep_windows: Sequence[tuple[int, int]] | None = None, keep_calls: str | None = None) -> str:
    """Make an export small enough to keep as a course reference: drop whole tables a chapter does not read, and
    keep only the kernels that start inside an NVTX range whose text matches ``keep_kernels_in`` (a regex, e.g.
    ``step_\\d+``). Returns a sentence saying what was removed, to append to the file's provenance, because a
    reader comparing the reference with the tool's own report must know it was cut. Only for references: a reader's
    own capture is never changed.

    ``keep_windows`` keeps the kernels that start inside one of these (start, end) windows (ns, on the export's own
    clock) instead: a step's GPU work runs past its NVTX range when the CPU runs ahead, so a chapter that measures
    steps on the GPU passes their GPU windows. ``keep_calls`` keeps only the CUDA API calls whose name matches
    (a regex searched in the name, e.g. ``Synchronize``) and deletes the rest of the runtime table.
    """
    if keep_kernels_in is not None and keep_windows is not None:
        raise ValueError("give keep_kernels_in or keep_windows, not both")
    path = Path(path)
    before = path.stat().st_size
    notes = []
    with closing(sqlite3.connect(path)) as conn:
        present = table_names(conn)
        dropped = [t for t in drop_tables if t in present]
        for t in dropped:
            conn.execute(f'DROP TABLE "{t}"')
        if dropped:
            notes.append("the tables this chapter does not read were dropped: " + ", ".join(dropped))
        conn.commit()
    if keep_calls is not None:
        with closing(sqlite3.connect(path)) as conn:
            if RUNTIME_TABLE in table_names(conn):
                rx = re.compile(keep_calls)
                conn.create_function("keep_call", 1, lambda s: s is not None and rx.search(s) is not None)
                total = conn.execute(f"SELECT count(*) FROM {RUNTIME_TABLE}").fetchone()[0]
                conn.execute(f"DELETE FROM {RUNTIME_TABLE} WHERE NOT keep_call((SELECT value FROM StringIds "
                             f"WHERE StringIds.id = {RUNTIME_TABLE}.nameId))")
                kept = conn.execute(f"SELECT count(*) FROM {RUNTIME_TABLE}").fetchone()[0]
                conn.commit()
                notes.append(f"only the CUDA API calls whose name matches {keep_calls!r} were kept, {kept} of {total}")
    if keep_kernels_in is not None or keep_windows is not None:
        if keep_windows is None:
            ranges = nvtx_ranges(path)
            keep = ranges[ranges["text"].astype(str).map(lambda t: re.fullmatch(keep_kernels_in, t) is not None)]
            windows = [(int(a), int(b)) for a, b in zip(keep["start"], keep["end"])]
            said = f"inside an NVTX range matching {keep_kernels_in!r}"
        else:
            windows = [(int(a), int(b)) for a, b in keep_windows]
            said = f"inside {len(windows)} given GPU windows"
        with closing(sqlite3.connect(path)) as conn:
            total = conn.execute(f"SELECT count(*) FROM {KERNEL_TABLE}").fetchone()[0]
            conn.execute("CREATE TEMP TABLE keep_windows (lo INTEGER, hi INTEGER)")
            conn.executemany("INSERT INTO keep_windows VALUES (?, ?)", windows)
            conn.execute(f"DELETE FROM {KERNEL_TABLE} WHERE NOT EXISTS (SELECT 1 FROM keep_windows "
                         f"WHERE {KERNEL_TABLE}.start >= lo AND {KERNEL_TABLE}.start <= hi)")
            kept = conn.execute(f"SELECT count(*) FROM {KERNEL_TABLE}").fetchone()[0]
            conn.commit()
        notes.append(f"only the kernels that start {said} were kept, {kept} of {total}")
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("VACUUM")
    after = path.stat().st_size
    return "; ".join(notes) + f" ({before / 2**20:.1f} -> {after / 2**20:.1f} MiB)"


def _windows_table(conn: sqlite3.Connection, name: str, windows: Sequence[tuple[int, int]]) -> None:
    """A temporary table ``name`` (lo, hi) of the windows, for the deletes' ``NOT EXISTS`` tests."""
    conn.execute(f"CREATE TEMP TABLE {name} (lo INTEGER, hi INTEGER)")
    conn.executemany(f"INSERT INTO {name} VALUES (?, ?)", [(int(a), int(b)) for a, b in windows])


def keep_in_windows(path: str | Path, tables: Sequence[str], windows: Sequence[tuple[int, int]], *,
                    keep_calls: str | None = None) -> str:
    """Cut whole activity tables of an export to the rows that start inside ``windows`` ((start, end), ns, the
    export's clock), instead of dropping them: a chapter that reads what ran between its kernels (memory copies and
    memsets, the streams' waits on events, the CUDA calls that launched the work) needs them only in the steps it
    measures. In the CUDA API table, ``keep_calls`` (a regex searched in the call's name, e.g. ``Synchronize``) also
    keeps the matching calls outside the windows. Tables the export lacks are skipped. Returns the sentence for the
    provenance, saying how many rows each table kept."""
    path = Path(path)
    before = path.stat().st_size
    notes = []
    with closing(sqlite3.connect(path)) as conn:
        present = table_names(conn)
        _windows_table(conn, "cut_windows", windows)
        rx = re.compile(keep_calls) if keep_calls is not None else None
        conn.create_function("keep_call", 1, lambda s: rx is not None and s is not None and rx.search(s) is not None)
        for t in tables:
            if t not in present:
                continue
            total = conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]
            spared = (f" AND NOT keep_call((SELECT value FROM StringIds WHERE StringIds.id = \"{t}\".nameId))"
                      if t == RUNTIME_TABLE and rx is not None else "")
            conn.execute(f'DELETE FROM "{t}" WHERE NOT EXISTS (SELECT 1 FROM cut_windows WHERE "{t}".start >= lo '
                         f'AND "{t}".start <= hi){spared}')
            kept = conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]
            notes.append(f"{t} {kept} of {total}")
        conn.commit()
        conn.execute("VACUUM")
    said = f" (and the calls matching {keep_calls!r})" if keep_calls is not None else ""
    if not notes:
        return ""
    return (f"the rows starting inside {len(windows)} given windows were kept{said}: " + ", ".join(notes)
            + f" ({before / 2**20:.1f} -> {path.stat().st_size / 2**20:.1f} MiB)")


def keep_launched_in(path: str | Path, windows: Sequence[tuple[int, int]]) -> str:
    """Keep the CUDA API calls that start inside ``windows`` ((start, end), ns, the export's clock: a chapter's step
    ranges, say) and the GPU work they launched, matched by correlation id (a graph's kernels carry their
    ``cudaGraphLaunch``'s, so they stay with the launch however late they run); delete the rest of the API,
    kernel, copy and memset tables. Why not by time: where the CPU runs ahead, a step's kernels run after its range
    ends, and a window on the GPU's clock would cut them off or take the next step's. Returns the sentence for the
    provenance, with how many rows each table kept."""
    path = Path(path)
    before = path.stat().st_size
    notes = []
    with closing(sqlite3.connect(path)) as conn:
        present = table_names(conn)
        if RUNTIME_TABLE not in present:
            return ""
        _windows_table(conn, "launch_windows", windows)
        for t in (RUNTIME_TABLE, *(x for x in LAUNCHED_TABLES if x in present)):
            total = conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]
            if t == RUNTIME_TABLE:
                conn.execute(f'DELETE FROM "{t}" WHERE NOT EXISTS (SELECT 1 FROM launch_windows '
                             f'WHERE "{t}".start >= lo AND "{t}".start <= hi)')
            else:
                conn.execute(f'DELETE FROM "{t}" WHERE correlationId NOT IN (SELECT correlationId FROM {RUNTIME_TABLE})')
            kept = conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]
            notes.append(f"{t} {kept} of {total}")
        conn.commit()
        conn.execute("VACUUM")
    return (f"only the CUDA API calls starting inside {len(windows)} given windows and the GPU work they launched were "
            "kept: " + ", ".join(notes) + f" ({before / 2**20:.1f} -> {path.stat().st_size / 2**20:.1f} MiB)")


def keep_only_sync_calls(path: str | Path) -> str:
    """Keep of the CUDA API calls only the ``*Synchronize*`` ones (they close each timed step's GPU window) and drop
    CUPTI's synchronization records (the streams' waits on events): kernels, copies, memsets and NVTX ranges stay,
    and a training run's export shrinks about threefold (chapter 13's four-GPU exports: 2.0 -> 0.65 MB gzipped).
    What a stream waited for can no longer be read afterwards. Returns the sentence for the provenance."""
    with closing(sqlite3.connect(path)) as con:
        tables = table_names(con)
        said = []
        if RUNTIME_TABLE in tables:
            before = con.execute(f'SELECT COUNT(*) FROM "{RUNTIME_TABLE}"').fetchone()[0]
            con.execute(f'DELETE FROM "{RUNTIME_TABLE}" WHERE nameId NOT IN '
                        "(SELECT id FROM StringIds WHERE value LIKE '%Synchronize%')")
            after = con.execute(f'SELECT COUNT(*) FROM "{RUNTIME_TABLE}"').fetchone()[0]
            said.append(f"CUDA API calls: the {after} *Synchronize* calls of {before} kept")
        if SYNC_TABLE in tables:
            con.execute(f'DELETE FROM "{SYNC_TABLE}"')
            said.append("CUPTI's synchronization records dropped")
        con.commit()
        con.execute("VACUUM")
    return "lean: " + ", ".join(said) if said else ""
