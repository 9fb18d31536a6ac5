"""One call that turns a script into an analysed Nsight Systems capture, or says why it cannot.

``nsys_capture`` runs ``nsys profile`` over a course script, exports the report to
sqlite, runs the ``nsys stats`` reports asked for (as CSV, from that sqlite), removes
the capture machine's environment from the export, and records the exact commands in
the chapter's provenance. Without a GPU or without nsys it prints the reason and
returns the course's reference capture of the same name instead: every chapter runs
everywhere, and says which numbers it is showing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .artifacts import FoundCapture, chapter_output, find_capture, record_file
from .nsys_sqlite import scrub_environment
from .runner import ProfilerFailed, portable_command, python_target, run_profiler
from .tools import live_tool

__all__ = ["NsysCapture", "nsys_capture", "QUIET"]

# CPU sampling and context-switch tracing make captures large and slow; the course's
# examples do not need them unless a chapter says so.
QUIET = ["--sample=none", "--cpuctxsw=none"]


@dataclass
class NsysCapture:
    """An analysed capture: the sqlite export, its stats CSVs, and where they came from."""

    sqlite: FoundCapture
    stats: dict[str, Path] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def path(self) -> Path:
        return self.sqlite.path

    def describe(self) -> str:
        return self.sqlite.describe()


def _reference(chapter: str, name: str, reports: Sequence[str], reason: str) -> NsysCapture:
    print(f"No live nsys capture: {reason}.")
    found = find_capture(chapter, f"{name}.sqlite", prefer="reference")
    stats = {r: found.path.with_name(f"{name}_{r}.csv") for r in reports}
    return NsysCapture(found, {r: p for r, p in stats.items() if p.exists()})


def nsys_capture(chapter: str, name: str, script: str | Path, script_args: Sequence[str] = (), *,
                 trace: str = "cuda,nvtx", options: Sequence[str] = QUIET, reports: Sequence[str] = (),
                 overwrite: bool = True, echo: bool = True) -> NsysCapture:
    """Profile ``script`` with nsys into ``<chapter>/<name>.sqlite`` (+ stats CSVs); fall back to the reference."""
    live = live_tool("nsys")
    if isinstance(live, str):
        return _reference(chapter, name, reports, live)
    nsys, version = live
    out = chapter_output(chapter)
    try:
        cap = run_profiler(nsys, ["profile", f"--trace={trace}", *options, "-o", "{output}"],
                           python_target(script, *script_args), out_dir=out, name=name, overwrite=overwrite)
        export = run_profiler(nsys, ["export", "--type", "sqlite", "-o", "{output}.sqlite", str(cap.file(".nsys-rep"))],
                              out_dir=out, name=name, overwrite=True)
        sqlite = export.file(".sqlite")
        runs = [cap, export]
        if reports:
            runs.append(run_profiler(nsys, ["stats", "--report", ",".join(reports),
                                            "--format", "csv", "--output", "{output}", str(sqlite)],
                                     out_dir=out, name=name, overwrite=True))
    except ProfilerFailed as exc:
        print(f"The nsys capture failed: {exc}")
        return _reference(chapter, name, reports, "the live capture failed")
    scrub_environment(sqlite)
    commands = [" ".join(portable_command(r.command)) for r in runs]
    if echo:
        print("$ " + "\n$ ".join(commands) + f"\n  ({cap.seconds:.1f} s under nsys {version})")
    record_file(chapter, f"{name}.sqlite", " && ".join(commands[:2]), {"nsys": version})
    stats = {}
    for r in reports:
        path = out / f"{name}_{r}.csv"
        if path.exists():
            record_file(chapter, path.name, commands[-1], {"nsys": version})
            stats[r] = path
    return NsysCapture(find_capture(chapter, f"{name}.sqlite"), stats, commands, cap.seconds)


def _median_launch_us(text: str) -> float | None:
    import re

    m = re.search(r"median: ([\d.]+) us per launch", text)
    return float(m.group(1)) if m else None


def capture_overhead(script: str | Path, script_args: Sequence[str], configs: dict[str, list[str]]) -> list[dict]:
    """Run ``script`` without nsys and under each nsys option set; collect its own per-launch
    cost and the report size. The script must print ``median: X us per launch``.

    Returns one row per configuration, between two runs without the profiler (first and
    last), whose difference is the run-to-run noise; a configuration this
    machine does not support is reported as such instead of failing the whole table.
    """
    import subprocess
    import tempfile

    live = live_tool("nsys")
    if isinstance(live, str):
        raise ProfilerFailed(f"Cannot measure capture overhead: {live}.")
    nsys, _ = live
    rows = []
    def baseline(label: str) -> dict:
        run = subprocess.run(python_target(script, *script_args), capture_output=True, text=True, timeout=300, check=False)
        return {"configuration": label, "options": "", "us_per_launch": _median_launch_us(run.stdout),
                "report_mib": 0.0, "wall_s": None}

    rows.append(baseline("no profiler"))
    with tempfile.TemporaryDirectory() as tmp:
        for label, opts in configs.items():
            try:
                cap = run_profiler(nsys, ["profile", *opts, "-o", "{output}"], python_target(script, *script_args),
                                   out_dir=Path(tmp), name=label.replace(" ", "_"), overwrite=True)
                text = cap.log.read_text()
                size = sum(f.stat().st_size for f in cap.files) / 2**20
                rows.append({"configuration": label, "options": " ".join(opts), "us_per_launch": _median_launch_us(text),
                             "report_mib": size, "wall_s": cap.seconds})
            except ProfilerFailed as exc:
                rows.append({"configuration": label, "options": " ".join(opts), "us_per_launch": None,
                             "report_mib": None, "wall_s": None, "error": str(exc).split(". ")[0]})
    # The same program again without the profiler: the spread between the two baselines
    # is the run-to-run noise, and differences smaller than it mean nothing.
    rows.append(baseline("no profiler, again"))
    return rows
