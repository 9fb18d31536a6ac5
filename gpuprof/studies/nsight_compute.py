"""Measurements that take several ncu runs: what each set costs, what each filter selects, and
one kernel's duration as CUDA events, Nsight Systems and Nsight Compute (under each clock and
cache setting) report it.

Each function runs live on a GPU and returns plain rows (lists of dicts) that a chapter
saves as JSON with provenance; without a GPU the chapter reads the course's reference
rows instead. Nothing here keeps the reports it makes: they go to a temporary folder.
"""

from __future__ import annotations

import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Sequence

from ..errors import GpuprofError
from ..runner import portable_command, python_target, run_profiler
from ..tools import require_tool
from ..ncu.capture import ncu_listing, ncu_said, parse_passes
from ..ncu.csv_reader import parse_details

__all__ = ["parse_list_sets", "set_table", "filter_table", "clock_cache_durations", "nsys_durations",
           "CLOCK_CACHE_CONFIGS", "check_metric_names", "kernels_with_ranges", "metric_rows"]

CLOCK_CACHE_CONFIGS = [("base", "all"), ("base", "none"), ("none", "all"), ("none", "none")]


def parse_list_sets(text: str) -> list[dict]:
    """``ncu --list-sets`` as rows: set, sections (list), enabled by default, estimated metric count.

    The table wraps long section lists onto continuation lines; the column positions
    come from its header, so a wider or narrower terminal does not matter.
    """
    lines = text.splitlines()
    header = next((i for i, line in enumerate(lines) if line.startswith("Identifier")), None)
    if header is None:
        raise GpuprofError("This is not `ncu --list-sets` output (no 'Identifier' header).")
    names = ["Identifier", "Sections", "Enabled", "Estimated Metrics"]
    starts = [lines[header].index(n) for n in names]
    rows: list[dict] = []
    for line in lines[header + 2:]:
        if not line.strip() or set(line.strip()) <= {"-", " "}:
            continue
        cells = [line[a:b].strip() if b else line[a:].strip() for a, b in zip(starts, starts[1:] + [None])]
        if cells[0]:
            rows.append({"set": cells[0], "sections_text": cells[1], "enabled": cells[2] == "yes",
                         "estimated_metrics": int(cells[3]) if cells[3].isdigit() else None})
        elif rows:
            rows[-1]["sections_text"] += cells[1]
    for r in rows:
        r["sections"] = [s.strip() for s in r.pop("sections_text").split(",") if s.strip()]
    return rows


def set_table(script: str | Path, script_args: Sequence[str], kernel_regex: str, sets: Sequence[str]) -> list[dict]:
    """Profile one launch of one kernel with each set: replay passes, wall time, report size, metrics in the report.

    A set this GPU or driver cannot collect becomes a row with its ``error`` instead of
    stopping the table.
    """
    from ..runner import ProfilerFailed
    from ..ncu.report import open_report

    ncu, _ = require_tool("ncu")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in sets:
            t0 = time.perf_counter()
            log = Path(tmp) / f"set_{name}.log"
            try:
                cap = run_profiler(ncu, ["--set", name, "-k", f"regex:{kernel_regex}", "-c", "1", "-o", "{output}"],
                                   python_target(script, *script_args), out_dir=Path(tmp), name=f"set_{name}",
                                   overwrite=True)
                report = cap.file(".ncu-rep")
                wall = time.perf_counter() - t0
                passes = parse_passes(cap.log.read_text())
                kernel = open_report(report).kernels[0]
            except (ProfilerFailed, GpuprofError) as exc:
                said = ncu_said(log.read_text()) if log.exists() else []
                rows.append({"set": name, "error": said[0] if said else str(exc).split(". ")[0]})
                continue
            said = ncu_said(cap.log.read_text())
            rows.append({"set": name, "passes": passes[0][1] if passes else None, "wall_s": wall,
                         "report_mib": report.stat().st_size / 2**20, "metrics_in_report": len(kernel["metrics"]),
                         "rules": len(kernel["rules"]), "kernel": kernel["name"], "ncu_said": said})
    return rows


def kernels_with_ranges(script: str | Path, script_args: Sequence[str], options: Sequence[str] = ()) -> list[dict]:
    """Every kernel launch of a program with the NVTX ranges open on its launching thread and its
    duration, from one ncu run (``--nvtx``, one metric: one pass per launch).

    The report itself is not kept: for a framework program it embeds the binaries of every
    library kernel it profiled (a hundred megabytes for a few cuDNN convolutions), while
    the table is a few kilobytes.
    """
    from ..ncu.report import kernels

    ncu, _ = require_tool("ncu")
    with tempfile.TemporaryDirectory() as tmp:
        cap = run_profiler(ncu, ["--nvtx", "--metrics", "gpu__time_duration.sum", *options, "-o", "{output}"],
                           python_target(script, *script_args), out_dir=Path(tmp), name="kernels", overwrite=True)
        k = kernels(cap.file(".ncu-rep"))
    return [{"id": int(r.id), "name": r.name, "nvtx": r.nvtx, "duration_ns": r.duration_ns} for r in k.itertuples()]


def metric_rows(script: str | Path, script_args: Sequence[str], options: Sequence[str], metrics: Sequence[str]) -> list[dict]:
    """One ncu run with ``options`` (plus ``--nvtx``); per kernel launch: name, NVTX ranges and the
    values of ``metrics`` (None where the report lacks one). The report is not kept: a library
    kernel's report embeds its binary, tens of megabytes for a few cuBLAS kernels."""
    from ..ncu.report import kernels, metric_table

    ncu, _ = require_tool("ncu")
    with tempfile.TemporaryDirectory() as tmp:
        cap = run_profiler(ncu, ["--nvtx", *options, "-o", "{output}"], python_target(script, *script_args),
                           out_dir=Path(tmp), name="metrics", overwrite=True)
        report = cap.file(".ncu-rep")
        k = kernels(report).set_index("id")
        t = metric_table(report, list(metrics), missing="nan")
    rows = []
    for i, row in t.iterrows():
        values = {m: (None if row[m] != row[m] else float(row[m])) for m in metrics}
        rows.append({"id": int(i), "kernel": row["kernel"], "nvtx": k.loc[i, "nvtx"], **values})
    return rows


def filter_table(script: str | Path, script_args: Sequence[str], filters: dict[str, list[str]],
                 *, metric: str = "gpu__time_duration.sum") -> list[dict]:
    """For each filter (a list of ncu options), the kernels it selected, collecting one metric (one pass each)."""
    rows = []
    for label, options in filters.items():
        target = python_target(script, *script_args) if "--target-processes" not in " ".join(options) else None
        listing = ncu_listing(["--metrics", metric, *options], target or _wrapped(script, script_args))
        rows.append({"filter": label, "options": " ".join(options), "profiled": listing.profiled,
                     "seconds": listing.seconds, "returncode": listing.returncode})
    return rows


def _wrapped(script: str | Path, script_args: Sequence[str]) -> list[str]:
    """``python -c`` that runs ``script`` as a child process: the case --target-processes is about."""
    import sys

    code = (f"import subprocess, sys; sys.exit(subprocess.run([sys.executable, {str(script)!r}, "
            f"*{list(map(str, script_args))!r}]).returncode)")
    return [sys.executable, "-c", code]


def clock_cache_durations(script: str | Path, script_args: Sequence[str], kernel_regex: str,
                          configs: Sequence[tuple[str, str]] = CLOCK_CACHE_CONFIGS) -> list[dict]:
    """Each matching kernel's duration under ncu with each ``(--clock-control, --cache-control)``:
    the median over its profiled launches, with the SM, L2 and DRAM clocks ncu measured meanwhile.

    The three clocks are recorded because a kernel's sensitivity to ``--clock-control`` says
    which unit paces it only if one knows which clocks the setting moved: the L2 slices run
    on a clock of their own (``lts__cycles_elapsed``), not the SM's.
    """
    rows = []
    metrics = ("gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,lts__cycles_elapsed.avg.per_second,"
               "dram__cycles_elapsed.avg.per_second")
    for clock, cache in configs:
        listing = ncu_listing(["--clock-control", clock, "--cache-control", cache, "--metrics", metrics,
                               "-k", f"regex:{kernel_regex}", "--csv"], python_target(script, *script_args))
        if listing.returncode != 0:
            raise GpuprofError(f"ncu with --clock-control {clock} --cache-control {cache} failed "
                               f"(exit {listing.returncode}).")
        df = parse_details(listing.output, "ncu's output")  # with --csv, ncu prints no progress lines
        for kernel, part in df.groupby("Kernel Name", sort=False):
            def median(name: str) -> tuple[float, str]:
                sel = part[part["Metric Name"] == name]
                return float(sel["value"].median()), str(sel["Metric Unit"].iloc[0])

            dur, unit = median("gpu__time_duration.sum")
            sm, sm_unit = median("sm__cycles_elapsed.avg.per_second")
            l2, l2_unit = median("lts__cycles_elapsed.avg.per_second")
            dram, dram_unit = median("dram__cycles_elapsed.avg.per_second")
            rows.append({"kernel": kernel, "tool": "ncu", "clock_control": clock, "cache_control": cache,
                         "launches": int((part["Metric Name"] == "gpu__time_duration.sum").sum()),
                         "median_us": dur * _TIME_TO_US[unit.strip().lower()],
                         "sm_ghz": sm / _HZ_PER_GHZ[sm_unit.strip().lower()],
                         "l2_ghz": l2 / _HZ_PER_GHZ[l2_unit.strip().lower()],
                         "dram_ghz": dram / _HZ_PER_GHZ[dram_unit.strip().lower()]})
    return rows


_TIME_TO_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
_HZ_PER_GHZ = {"hz": 1e9, "khz": 1e6, "mhz": 1e3, "ghz": 1.0}


def nsys_durations(script: str | Path, script_args: Sequence[str], kernel_regex: str, last: int) -> list[dict]:
    """Each matching kernel's median duration over its ``last`` launches in an nsys capture (the
    launches before those are the script's warm-up)."""
    from ..nsys import sqlite as ns

    nsys, version = require_tool("nsys")
    with tempfile.TemporaryDirectory() as tmp:
        cap = run_profiler(nsys, ["profile", "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none", "-o", "{output}"],
                           python_target(script, *script_args), out_dir=Path(tmp), name="durations", overwrite=True)
        export = run_profiler(nsys, ["export", "--type", "sqlite", "-o", "{output}.sqlite", str(cap.file(".nsys-rep"))],
                              out_dir=Path(tmp), name="durations", overwrite=True)
        k = ns.kernels(export.file(".sqlite"))
    mine = k[k["name"].str.contains(kernel_regex, regex=True)]  # searched, as ncu -k regex: does
    if mine.empty:
        raise GpuprofError(f"nsys recorded no kernel matching {kernel_regex!r}.")
    rows = []
    for kernel, part in mine.groupby("name", sort=False):
        tail = part.sort_values("start").tail(last)
        rows.append({"kernel": kernel, "tool": "nsys", "clock_control": "-", "cache_control": "-", "launches": len(tail),
                     "median_us": float(statistics.median(tail["duration_ns"])) / 1e3, "nsys": version})
    return rows


def check_metric_names(names: Sequence[str], query_suffix_output: str) -> list[dict]:
    """Check full metric names against ``ncu --query-metrics-mode suffix --metrics <bases>`` output.

    Each row: the name, whether it exists, whether ncu marks it deprecated (and what it
    says to use), and for a missing suffix the valid ones that start the same way.
    """
    listed: dict[str, str] = {}
    current = None
    for line in query_suffix_output.splitlines():
        parts = line.split(None, 3)
        if parts and "__" in parts[0] and not line.startswith(" "):
            current = parts[0]
            listed[current] = line
        elif current and line.startswith(" "):
            listed[current] += " " + line.strip()
    rows = []
    for name in names:
        base, _, suffix = name.partition(".")
        if name in listed:
            text = listed[name]
            dep = re.search(r"\[DEPRECATED: use ([\w.]+)", text)
            rows.append({"metric": name, "exists": True, "deprecated": bool(dep), "use_instead": dep.group(1) if dep else ""})
            continue
        same_base = sorted(n for n in listed if n.startswith(base + "."))
        if not same_base:
            rows.append({"metric": name, "exists": False, "deprecated": False,
                         "use_instead": "(no metric of this base name)"})
            continue
        head = name.rsplit(".", 1)[0] if suffix.count(".") else base
        close = ([n for n in same_base if n.startswith(name)] or [n for n in same_base if n.startswith(head + ".")]
                 or same_base)
        rows.append({"metric": name, "exists": False, "deprecated": False, "use_instead": ", ".join(close[:3])})
    return rows
