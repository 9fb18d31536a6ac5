"""What each ``nsys profile`` switch adds to a capture, measured: tables and rows, size, run time.

A command copied from a guide (``nsys profile -y 10 -d 50 -w true -t cuda,cudnn,osrt,nvtx
--cuda-memory-usage=true --force-overwrite true ./app``) turns on several things at once. To
know what each one records and costs, run the same program under a baseline and with one
switch more at a time, export every report, and compare the exports' tables: a switch that
records something adds a table (or rows to one); a switch that records nothing adds nothing.

The readers here (:func:`api_calls`, :func:`process_streams`, :func:`memory_in_use`) read
the tables those switches fill, by the names and columns found in the file.
"""
from __future__ import annotations

import shutil
import tempfile
from contextlib import closing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import pandas as pd

from ..errors import GpuprofError
if TYPE_CHECKING:
    from ..artifacts import FoundCapture
from ..runner import portable_text, run_with_limit
from ..nsys.export_edit import scrub_environment
from ..nsys.sqlite import _resolve, _strings, open_export, table_names

#: NVTX domains that libraries (or nsys's library traces) fill, not the program.
LIBRARY_DOMAINS = ("cuBLAS", "cuDNN", "NCCL", "CUDA", "PyTorch")


@dataclass
class SwitchRun:
    """One run of the program under one set of switches (or none)."""

    label: str
    switches: list[str]
    returncode: int | None
    wall_s: float
    report_bytes: int | None = None
    export_bytes: int | None = None
    tables: dict[str, int] = field(default_factory=dict)
    program_lines_on_console: int = 0
    nsys_said: list[str] = field(default_factory=list)
    program_result: dict | None = None
    window: dict[str, float] | None = None
    nvtx_domains: dict[str, int] = field(default_factory=dict)
    nvtx_names: dict[str, int] = field(default_factory=dict)
    diagnostics: list[dict] = field(default_factory=list)
    error: str | None = None


def export_tables(path: str | Path) -> dict[str, int]:
    """Every table of an export with its row count (nsys leaves out tables it has no rows for)."""
    with closing(open_export(path)) as conn:
        names = sorted(n for n in table_names(conn) if not n.startswith("sqlite_"))
        return {n: int(conn.execute(f'SELECT count(*) FROM "{n}"').fetchone()[0]) for n in names}


def tables_added(runs: Sequence[dict], baseline: str) -> dict[str, dict[str, int]]:
    """Per run: the tables it has that the baseline run lacks, with their rows.

    ``ENUM_*`` tables (label lists nsys writes with every export) and the bookkeeping tables
    that exist in every export are compared like the rest: only what is new shows up.
    """
    base = next(r for r in runs if r["label"] == baseline)
    known = set(base["tables"])
    return {r["label"]: {t: n for t, n in r["tables"].items() if t not in known}
            for r in runs if r["tables"] and r["label"] != baseline}


def api_calls(path: str | Path, table: str) -> pd.DataFrame:
    """Calls of a traced API from its table (``OSRT_API``, and tables laid out like it): start, end,
    duration_ns, name, thread (``globalTid``) where the table has it.

    ``OSRT_API`` in nsys 2025.3 keeps ``start``, ``end`` and ``nameId`` (an id into
    ``StringIds``); the reader checks the columns the file declares, so an export with a
    different layout gives a clear error rather than wrong rows. An absent table gives no rows.
    """
    with closing(open_export(path)) as conn:
        if table not in table_names(conn):
            return pd.DataFrame(columns=["start", "end", "duration_ns", "name", "thread"])
        cols = [r[1] for r in conn.execute(f"PRAGMA table_info('{table}')")]
        missing = {"start", "end", "nameId"} - set(cols)
        if missing:
            raise GpuprofError(f"{table} in {Path(path).name} has no {', '.join(sorted(missing))} column.",
                               f"Its columns are: {', '.join(cols)}.")
        keep = [c for c in ("start", "end", "nameId", "globalTid") if c in cols]
        df = pd.read_sql_query(f"SELECT {', '.join(keep)} FROM {table}", conn)
        strings = _strings(conn)
    df["name"] = _resolve(df.pop("nameId"), strings)
    df["duration_ns"] = df["end"] - df["start"]
    if "globalTid" in df:
        df = df.rename(columns={"globalTid": "thread"})
    return df.sort_values("start", ignore_index=True)


def call_summary(calls: pd.DataFrame) -> pd.DataFrame:
    """Per call name: count, total, median, largest (ns), sorted by total: the shape of ``nsys stats``'s
    ``osrt_sum`` (which also gives time share, mean, minimum and spread)."""
    if calls.empty:
        return pd.DataFrame(columns=["name", "calls", "total_ns", "median_ns", "max_ns"])
    g = calls.groupby("name")["duration_ns"]
    out = pd.DataFrame({"calls": g.size(), "total_ns": g.sum(), "median_ns": g.median(), "max_ns": g.max()})
    return out.sort_values(["total_ns", "calls"], ascending=False).reset_index()


def nvtx_domains(path: str | Path) -> dict[str, int]:
    """NVTX ranges per domain name. Some library traces land here, not in a table of their own:
    nsys 2025.3 records cuBLAS calls (``-t cublas``, ``-t cublas-verbose``) as ranges in a
    domain named ``cuBLAS``."""
    from ..nsys.sqlite import nvtx_ranges

    r = nvtx_ranges(path)
    return {str(d): int(n) for d, n in r.groupby("domain").size().items()} if len(r) else {}


def nvtx_names(path: str | Path, limit: int = 20) -> dict[str, int]:
    """The program's NVTX ranges (library domains left out) counted by name, digits folded
    (``step_12`` counts as ``step_N``): how many steps, phases, ... a capture holds."""
    from ..nsys.sqlite import nvtx_ranges

    r = nvtx_ranges(path)
    if not len(r):
        return {}
    own = r[~r["domain"].isin(LIBRARY_DOMAINS)]
    counts = own["text"].astype(str).str.replace(r"\d+", "N", regex=True).value_counts()
    return {str(k): int(v) for k, v in counts.head(limit).items()}


def domains_added(runs: Sequence[dict], baseline: str) -> dict[str, dict[str, int]]:
    """Per run: NVTX domains it has that the baseline lacks, with their range counts."""
    base = set(next(r for r in runs if r["label"] == baseline).get("nvtx_domains", {}))
    return {r["label"]: {d: n for d, n in r.get("nvtx_domains", {}).items() if d not in base}
            for r in runs if r["tables"] and r["label"] != baseline}


def diagnostics(path: str | Path) -> pd.DataFrame:
    """nsys's own messages stored in the export (``DIAGNOSTIC_EVENT``): time_s, severity, text.

    The place to look when a switch recorded nothing: nsys says there which library it could
    not trace and why (a version it does not support, a statically linked library, ...).
    """
    from ..nsys.sqlite import _enum

    with closing(open_export(path)) as conn:
        if "DIAGNOSTIC_EVENT" not in table_names(conn):
            return pd.DataFrame(columns=["time_s", "severity", "text"])
        df = pd.read_sql_query("SELECT timestamp, severity, text FROM DIAGNOSTIC_EVENT", conn)
        levels = _enum(conn, "ENUM_DIAGNOSTIC_SEVERITY_LEVEL")
    return pd.DataFrame({"time_s": df["timestamp"] / 1e9,
                         "severity": [levels.get(int(v), str(v)) for v in df["severity"]],
                         "text": df["text"].astype(str)})


def distinct_diagnostics(path: str | Path, limit: int = 40) -> list[dict]:
    """Each distinct diagnostic text once (first time, severity), in time order, at most ``limit``.

    The texts name files of the capture machine (nsys's session folder under /tmp, the
    interpreter's packages): they are kept with file names only, which is what a reader needs."""
    d = diagnostics(path)
    if d.empty:
        return []
    d = d.assign(text=d["text"].map(lambda t: portable_text(t, every_path=True)))
    d = d.sort_values("time_s").drop_duplicates("text")
    return [{"time_s": round(float(t), 3), "severity": s, "text": x}
            for t, s, x in zip(d["time_s"], d["severity"], d["text"])][:limit]


def process_streams(path: str | Path) -> pd.DataFrame:
    """The program's stdout and stderr as the report keeps them (``ProcessStreams``): file, text."""
    with closing(open_export(path)) as conn:
        if "ProcessStreams" not in table_names(conn):
            return pd.DataFrame(columns=["file", "text"])
        df = pd.read_sql_query("SELECT filenameId, contentId FROM ProcessStreams", conn)
        strings = _strings(conn)
    return pd.DataFrame({"file": [Path(strings.get(int(i), "?")).name for i in df["filenameId"]],
                         "text": [strings.get(int(i), "") for i in df["contentId"]]})


def memory_in_use(events: pd.DataFrame) -> pd.DataFrame:
    """Device memory in use over time from ``sqlite.memory_usage`` rows (``--cuda-memory-usage``):
    one row per event, with ``in_use_bytes`` per memory kind, cumulated from the first event.

    What nsys saw allocated through CUDA (``cudaMalloc`` and friends): PyTorch's caching
    allocator asks CUDA for large segments and keeps them, so this is the allocator's reserved
    memory, not the tensors' allocated memory that ``torch.cuda.memory_allocated`` reports.
    """
    if events.empty:
        return events.assign(in_use_bytes=pd.Series(dtype="int64"))
    ev = events.sort_values("start", kind="stable").copy()
    ev["in_use_bytes"] = ev.groupby("memory")["signed_bytes"].cumsum()
    return ev


def console_summary(console: str, program_marker: str) -> tuple[list[str], int]:
    """nsys's warnings and errors in a run's console output (the lines worth reading), and how many
    console lines carry ``program_marker``, a text the program prints once per run (so 0 means the
    program's output did not reach the console, as with ``--show-output=false``)."""
    lines = [ln.rstrip() for ln in console.splitlines() if ln.strip()]
    said = [ln for ln in lines if ln.lstrip().upper().startswith(("WARNING", "ERROR")) and program_marker not in ln]
    return said[:10], sum(1 for ln in lines if program_marker in ln)


def _keep_copy(export: Path, dest: Path) -> None:
    """Copy an export to ``dest`` with the environment blanked; gzipped when ``dest`` ends in ``.gz``."""
    import gzip

    scrub_environment(export)  # the run's own copy, deleted after the run
    if not dest.name.endswith(".gz"):
        shutil.copyfile(export, dest)
        return
    with export.open("rb") as src, gzip.open(dest, "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)


def run_switch_study(nsys: str | Path, program: Sequence[str], configs: dict[str, list[str]], *,
                     program_marker: str, result_file: str | None = None, keep: dict[str, Path] | None = None,
                     longer: dict[str, Sequence[str]] | None = None, timeout: float = 240,
                     progress=print) -> list[dict]:  # type: ignore[no-untyped-def]
    """Run ``program`` without nsys, then under each configuration's switches; export every report.

    ``configs`` maps a label to the switches given to ``nsys profile`` (``-o`` is added).
    ``result_file``: an argument of ``program`` equal to this text is replaced by a fresh
    path per run, and the JSON the program writes there is kept as ``program_result``.
    ``keep`` maps a label to a path where that run's sqlite export is copied, its environment
    blanked, gzipped if the path ends in ``.gz`` (the rest is deleted). ``longer`` maps a label to arguments appended to ``program`` for that run only
    (a ``--delay`` needs a program that outlives it). The baseline run (no profiler) is
    repeated at the end: the two differ by the run-to-run noise. Returns one dict per run
    (:class:`SwitchRun`).
    """
    import json

    keep, longer = keep or {}, longer or {}
    runs: list[SwitchRun] = []
    plan: list[tuple[str, list[str] | None]] = [("no profiler", None), *configs.items(), ("no profiler, again", None)]
    with tempfile.TemporaryDirectory(prefix="gpuprof-switches-") as tmpdir:
        tmp = Path(tmpdir)
        for i, (label, switches) in enumerate(plan):
            progress(f"[{i + 1}/{len(plan)}] {label}", flush=True)
            run_dir = tmp / f"run{i}"
            run_dir.mkdir()
            result = run_dir / "result.json"
            prog = [str(result) if result_file is not None and a == result_file else str(a)
                    for a in (*program, *longer.get(label, ()))]
            cmd = prog if switches is None else [str(nsys), "profile", *switches, "-o", str(run_dir / "report"), *prog]
            rc, console, wall = run_with_limit(cmd, timeout)
            run = SwitchRun(label=label, switches=list(switches or []), returncode=rc, wall_s=round(wall, 2))
            run.nsys_said, run.program_lines_on_console = console_summary(console, program_marker)
            if rc is None:
                run.error = f"did not finish within {timeout:.0f} s"
            if result.exists():
                try:
                    run.program_result = json.loads(result.read_text())
                except ValueError:
                    run.program_result = None
            reports = sorted(run_dir.glob("report*.nsys-rep"))
            if switches is not None and reports:
                run.report_bytes = reports[0].stat().st_size
                export = run_dir / "report.sqlite"
                erc, etext, _ = run_with_limit([str(nsys), "export", "--type", "sqlite", "-o", str(export),
                                                str(reports[0])], timeout)
                if erc == 0 and export.exists():
                    run.export_bytes = export.stat().st_size
                    run.tables = export_tables(export)
                    run.window = delayed_window(export)
                    run.nvtx_domains = nvtx_domains(export)
                    run.nvtx_names = nvtx_names(export)
                    run.diagnostics = distinct_diagnostics(export)
                    if label in keep:
                        dest = Path(keep[label])
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        _keep_copy(export, dest)
                else:
                    run.error = (run.error or "") + f" export failed: {etext.strip()[-300:]}"
            elif switches is not None and run.error is None:
                run.error = "no report was written"
            runs.append(run)
            for p in run_dir.glob("*"):
                if p.is_file():
                    p.unlink()
    return [asdict(r) for r in runs]


def delayed_window(path: str | Path) -> dict[str, float]:
    """A capture's window from the export: the delay and duration nsys wrote in ``META_DATA_CAPTURE``,
    and the first and last CUDA API call it kept, in seconds on the export's clock. That clock starts
    when recording starts: with ``-y 10`` (nsys 2025.3) the first call sat at 0.4 s and
    ``START_DELAY_MS`` read 0, so the delay is seen in what is missing, not in the timestamps."""
    with closing(open_export(path)) as conn:
        meta = dict(conn.execute("SELECT name, value FROM META_DATA_CAPTURE "
                                 "WHERE name IN ('START_DELAY_MS', 'RUN_DURATION_MS')").fetchall())
        names = table_names(conn)
        first = last = None
        if "CUPTI_ACTIVITY_KIND_RUNTIME" in names:
            first, last = conn.execute("SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()
    return {"delay_s": int(meta.get("START_DELAY_MS", 0)) / 1e3, "duration_s": int(meta.get("RUN_DURATION_MS", 0)) / 1e3,
            "first_call_s": (first or 0) / 1e9, "last_call_s": (last or 0) / 1e9}


@dataclass
class SwitchStudy:
    """A switch study's rows (one per run) and the export kept for reading what the switches recorded."""

    runs: list[dict]
    kept: "FoundCapture"
    rows_file: "FoundCapture"
    injection_libraries: list[str] = field(default_factory=list)

    def run(self, label: str) -> dict:
        return next(r for r in self.runs if r["label"] == label)

    def describe(self) -> str:
        return self.rows_file.describe()


def switch_study(chapter: str, name: str, program: Sequence[str], configs: dict[str, list[str]], *, keep: str,
                 program_marker: str, result_file: str | None = None,
                 longer: dict[str, Sequence[str]] | None = None, timeout: float = 240) -> SwitchStudy:
    """Run :func:`run_switch_study` where a GPU and nsys are present and save its rows as
    ``<name>.json`` (with the names of the tracing libraries in nsys's folder, which say
    which library versions it can trace) and the run labelled ``keep`` as
    ``<name>.sqlite.gz`` in the chapter's folder (with provenance); elsewhere, or if it fails, use the course's reference files."""
    from ..artifacts import chapter_output, find_capture, record_file, save_json
    from ..runner import shell_line
    from ..tools import live_tool

    live = live_tool("nsys")
    if not live:
        print(f"No live switch study: {live.reason}; the course's reference runs are read instead.")
    else:
        nsys, version = live
        kept = chapter_output(chapter) / f"{name}.sqlite.gz"
        try:
            runs = run_switch_study(nsys.path, program, configs, program_marker=program_marker,
                                    result_file=result_file, keep={keep: kept}, longer=longer, timeout=timeout)
        except (OSError, GpuprofError) as exc:
            print(f"The switch study failed ({exc}); the course's reference runs are read instead.")
        else:
            shown = shell_line(list(program))
            command = f"gpuprof.studies.nsys_switches.run_switch_study: {shown} without nsys and under {len(configs)} switch sets"
            libs = sorted(p.name for p in Path(nsys.path).resolve().parent.glob("libToolsInjection*"))
            save_json(chapter, f"{name}.json", {"runs": runs, "injection_libraries": libs}, command=command,
                      tools={"nsys": version}, overwrite=True)
            if kept.exists():
                record_file(chapter, kept.name, f"nsys profile {' '.join(configs[keep])} -o {name} {shown} && "
                            f"nsys export --type sqlite -o {name}.sqlite {name}.nsys-rep && gzip -9 {name}.sqlite",
                            {"nsys": version})
    rows_file = find_capture(chapter, f"{name}.json")
    saved = rows_file.json()
    return SwitchStudy(saved["runs"], find_capture(chapter, f"{name}.sqlite.gz"), rows_file,
                       saved.get("injection_libraries", []))


__all__ = ["LIBRARY_DOMAINS", "SwitchRun", "SwitchStudy", "api_calls", "call_summary", "console_summary",
           "delayed_window", "diagnostics", "distinct_diagnostics", "domains_added", "export_tables", "memory_in_use",
           "nvtx_domains", "nvtx_names", "process_streams", "run_switch_study", "switch_study", "tables_added"]
