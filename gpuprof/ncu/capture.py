"""Run Nsight Compute over a course script, keep the report with its provenance, or fall back to the reference.

:func:`ncu_capture` runs ``ncu <options> -o <chapter>/<name> python script args``, exports
the details page next to the report (``<name>.details.csv``, the section tables), reads
how many replay passes each kernel took from ncu's own output, and records the exact
command and ncu version in the chapter's provenance. Without a GPU, without ncu, without
permission to read counters (``ERR_NVGPUCTRPERM``), or when ncu profiled nothing, it says
so in one sentence and returns the course's reference report of the same name instead:
nothing already captured is overwritten by a failed run (see :mod:`gpuprof.runner`).

:func:`ncu_listing` runs ncu once without keeping a report, for what its output says
(which kernels a filter selected, how many passes, ``--list-sets``, ``--query-metrics``);
:func:`source_lines` runs it once for per-line source counters and keeps only those lines.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..artifacts import FoundCapture, chapter_output, find_capture, record_file, save_json
from ..errors import GpuprofError
from ..runner import ProfilerFailed, python_target, run_profiler, shell_line
from ..tools import classify_ncu_output, live_tool, require_tool

__all__ = ["NcuCapture", "ncu_capture", "ncu_listing", "Listing", "parse_passes", "parse_profiled", "ncu_said",
           "MAX_REPORT_BYTES", "source_lines"]

MAX_REPORT_BYTES = 3 * 2**20  # the course keeps reference reports small: filter kernels, pick sections
_PASSES = re.compile(r'==PROF== Profiling "([^"]+)"[^\n]*?- (\d+) pass')
_PROFILING = re.compile(r'==PROF== Profiling "([^"]+)"')


def parse_passes(text: str) -> list[tuple[str, int]]:
    """(kernel, replay passes) for every launch ncu profiled, from its ``==PROF== Profiling`` lines."""
    return [(name, int(n)) for name, n in _PASSES.findall(text)]


def ncu_said(log: str) -> list[str]:
    """ncu's own warnings and errors in its output (``==WARNING==`` / ``==ERROR==`` lines), without the prefix."""
    return [line.split("==", 2)[-1].strip() for line in log.splitlines() if "==WARNING==" in line or "==ERROR==" in line]


def parse_profiled(text: str) -> list[str]:
    """The kernel of every launch ncu profiled, in order."""
    return _PROFILING.findall(text)


@dataclass
class NcuCapture:
    """A report (this machine's, or the course's reference) and how it was made."""

    report: FoundCapture
    details: Path | None = None
    command: str = ""
    seconds: float = 0.0
    passes: list[tuple[str, int]] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.report.path

    def describe(self) -> str:
        return self.report.describe()


def _reference(chapter: str, name: str, reason: str) -> NcuCapture:
    print(f"No live ncu capture: {reason}.")
    try:
        found = find_capture(chapter, f"{name}.ncu-rep", prefer="reference")
    except GpuprofError as missing:
        # Some chapters keep only the details page of a large report: its CSV is the reference.
        try:
            csv = find_capture(chapter, f"{name}.details.csv", prefer="reference")
        except GpuprofError:
            raise missing from None
        return NcuCapture(csv, csv.path, str(csv.provenance.get("command", "")))
    details = found.path.with_name(f"{name}.details.csv")
    return NcuCapture(found, details if details.exists() else None, str(found.provenance.get("command", "")),
                      passes=[tuple(p) for p in found.provenance.get("passes", [])])  # type: ignore[misc]


def ncu_capture(chapter: str, name: str, script: str | Path | None = None, script_args: Sequence[str] = (), *,
                options: Sequence[str] = ("--set", "basic"), target: Sequence[str] | None = None,
                details: bool = True, overwrite: bool = True, echo: bool = True, timeout: float = 540) -> NcuCapture:
    """Profile ``script script_args`` (or ``target``, any argument list) with ``ncu options -o name``.

    The report goes to the chapter's output folder with its details-page CSV; on any
    failure the reference report is returned instead, with the reason printed.
    """
    live = live_tool("ncu")
    if not live:
        return _reference(chapter, name, live.reason)
    ncu, version = live
    out = chapter_output(chapter)
    program = list(target) if target is not None else python_target(script, *script_args)
    t0 = time.perf_counter()
    try:
        cap = run_profiler(ncu, [*options, "-o", "{output}"], program, out_dir=out, name=name, overwrite=overwrite,
                           timeout=timeout)
        report = cap.file(".ncu-rep")
    except (ProfilerFailed, GpuprofError) as exc:
        print(f"The ncu capture failed: {exc}")
        return _reference(chapter, name, "the live capture failed")
    log = cap.log.read_text()
    passes = parse_passes(log)
    command = shell_line(cap.command)
    size = report.stat().st_size
    if size > MAX_REPORT_BYTES:
        print(f"note: {report.name} is {size / 2**20:.1f} MiB, larger than the course keeps as a reference; "
              "filter kernels (-k, -c) or choose fewer sections.")
    csv_path = None
    if details:
        export = run_profiler(ncu, ["--import", str(report), "--csv", "--page", "details"], out_dir=out,
                              name=f"{name}.details", stdout_file=f"{name}.details.csv", overwrite=True)
        csv_path = export.files[0] if export.files else None
    seconds = time.perf_counter() - t0
    if echo:
        print(f"$ {command}\n  ({cap.seconds:.1f} s under ncu {version}; "
              f"{len(passes)} kernel launch(es) profiled, report {size / 2**20:.2f} MiB)")
    entry_tools = {"ncu": version}
    record_file(chapter, report.name, command, entry_tools)
    _remember_passes(out, report.name, passes)
    if csv_path is not None:
        record_file(chapter, csv_path.name, f"ncu --import {report.name} --csv --page details > {csv_path.name}", entry_tools)
    return NcuCapture(find_capture(chapter, report.name), csv_path, command, seconds, passes)


def _remember_passes(folder: Path, report: str, passes: list[tuple[str, int]]) -> None:
    """Keep the replay passes (ncu prints them; the report does not hold them) in the provenance entry."""
    import json

    prov_path = folder / "provenance.json"
    prov = json.loads(prov_path.read_text())
    prov["files"][report]["passes"] = [list(p) for p in passes]
    prov_path.write_text(json.dumps(prov, indent=2, sort_keys=True) + "\n")


@dataclass
class Listing:
    """What one ncu run printed, and what the course reads from it."""

    command: str
    returncode: int
    seconds: float
    output: str
    profiled: list[str]
    passes: list[tuple[str, int]]


def ncu_listing(args: Sequence[str], target: Sequence[str] = (), *, timeout: float = 300) -> Listing:
    """Run ``ncu args target`` keeping no report, and return its output with the profiled kernels.

    Raises :class:`GpuprofError` (one sentence) without a GPU or ncu, or on a counter
    permission error; the caller decides what to fall back to.
    """
    ncu, _ = require_tool("ncu")
    cmd = [str(ncu.path), *args, *map(str, target)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise GpuprofError(f"ncu did not finish within {timeout:.0f} s.") from None
    text = proc.stdout + proc.stderr
    if "ERR_NVGPUCTRPERM" in text:
        raise GpuprofError(classify_ncu_output(text, proc.returncode).detail)
    return Listing(shell_line(cmd), proc.returncode, time.perf_counter() - t0, text,
                   parse_profiled(text), parse_passes(text))


def save_listing_results(chapter: str, filename: str, data: object, command: str) -> Path:
    """File what ncu runs showed (as JSON, with provenance), for the CPU fallback of a chapter."""
    return save_json(chapter, filename, data, command=command, overwrite=True)


def source_lines(script: str | Path, script_args: Sequence[str], options: Sequence[str], kernels: Sequence[str],
                 counters: Sequence[str], *, search: Sequence[Path] = ()) -> list[dict]:
    """One ncu run with ``options`` (which must collect SourceCounters); for each kernel in
    ``kernels``, its per-instruction ``counters`` summed by source line, with the line's text.

    The report is not kept: per-instruction data with the embedded source makes it about a
    megabyte per kernel, while the lines that matter are a few kilobytes of JSON.
    """
    from .report import source_counters

    ncu, _ = require_tool("ncu")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        cap = run_profiler(ncu, [*options, "-o", "{output}"], python_target(script, *script_args),
                           out_dir=Path(tmp), name="source", overwrite=True)
        report = cap.file(".ncu-rep")
        for kernel in kernels:
            df = source_counters(report, kernel, counters, search=search)
            rows += df.drop(columns=["file"]).to_dict("records")
    return rows
