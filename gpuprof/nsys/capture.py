"""One call that turns a script into an analysed Nsight Systems capture, or says why it cannot.

``nsys_capture`` runs ``nsys profile`` over a course script, exports the report to
sqlite, runs the ``nsys stats`` reports asked for (as CSV, from that sqlite), removes
the capture machine's environment from the export, and records the exact commands in
the chapter's provenance. Without a GPU or without nsys it prints the reason and
returns the course's reference capture of the same name instead: every chapter runs
everywhere, and says which numbers it is showing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..artifacts import FoundCapture, chapter_output, find_capture, record_file
from .export_edit import scrub_environment
from ..runner import ProfilerFailed, python_target, run_profiler, shell_line
from ..tools import live_tool

__all__ = ["NsysCapture", "nsys_capture", "nsys_capture_ranks", "reference_capture", "QUIET", "nvtx_range_capture"]

# CPU sampling and context-switch tracing make captures large and slow; the course's
# examples do not need them unless a chapter says so.
QUIET = ["--sample=none", "--cpuctxsw=none"]


def nvtx_range_capture(range_name: str) -> list[str]:
    """nsys options that record only while the NVTX range ``range_name`` is open (from its push to its pop).

    By default ``--nvtx-capture`` compares only messages given as NVTX registered strings,
    and ``NSYS_NVTX_PROFILER_REGISTER_ONLY=0`` makes it compare every message (the Nsight
    Systems User Guide, "Run application, start/stop collection using NVTX"). The ``nvtx``
    package (0.2.17) registers every message it is given; ``torch.cuda.nvtx``, which
    :mod:`gpuprof.ranges` falls back to without that package, and C's ``nvtxRangePushA``
    pass plain strings. The variable is set so that the range triggers the capture
    whichever binding opened it.
    """
    return ["--capture-range=nvtx", f"--nvtx-capture={range_name}", "--capture-range-end=stop",
            "--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0"]


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


def reference_capture(chapter: str, name: str, reports: Sequence[str], reason: str) -> NsysCapture:
    """The course's reference capture ``name``, after saying why no live one was made."""
    print(f"No live nsys capture: {reason}.")
    found = find_capture(chapter, f"{name}.sqlite", prefer="reference")
    stats = {r: found.path.with_name(f"{name}_{r}.csv") for r in reports}
    return NsysCapture(found, {r: p for r, p in stats.items() if p.exists()})


def nsys_capture(chapter: str, name: str, script: str | Path | None = None, script_args: Sequence[str] = (), *,
                 target: Sequence[str] | None = None, trace: str = "cuda,nvtx", options: Sequence[str] = QUIET,
                 reports: Sequence[str] = (), overwrite: bool = True, echo: bool = True) -> NsysCapture:
    """Profile ``script`` with nsys into ``<chapter>/<name>.sqlite`` (+ stats CSVs); fall back to the reference.

    ``target`` replaces ``python script args`` with any argument list: ``python -m nvtx
    script``, or a compiled program. A ``target`` of None when no script is given means
    the program could not be built here, and the reference is used.
    """
    if script is None and target is None:
        return reference_capture(chapter, name, reports, "the program to profile could not be built here")
    live = live_tool("nsys")
    if not live:
        return reference_capture(chapter, name, reports, live.reason)
    nsys, version = live
    out = chapter_output(chapter)
    try:
        program = list(target) if target is not None else python_target(script, *script_args)
        cap = run_profiler(nsys, ["profile", f"--trace={trace}", *options, "-o", "{output}"],
                           program, out_dir=out, name=name, overwrite=overwrite)
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
        return reference_capture(chapter, name, reports, "the live capture failed")
    scrub_environment(sqlite)
    commands = [shell_line(r.command) for r in runs]
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


def nsys_capture_ranks(chapter: str, name: str, script: str | Path, script_args: Sequence[str] = (), *, nproc: int = 2,
                       trace: str = "cuda,nvtx", options: Sequence[str] = QUIET, timeout: float = 180,
                       echo: bool = True) -> list[NsysCapture]:
    """One report per rank: torchrun starts ``nsys profile`` as each of its ``nproc`` processes.

    nsys around torchrun would record the launcher, which has no ``RANK``; started inside
    each process, nsys sees that process's ``RANK`` and ``%q{RANK}`` in the output name
    expands to it. Reports become ``<name>_rank<R>.sqlite``. Without nsys, or if the
    run fails, the course's reference captures of the same names.
    """
    import shutil
    import tempfile

    from ..runner import TORCHRUN, run_with_limit

    from ..backend import describe_machine

    names = [f"{name}_rank{r}" for r in range(nproc)]

    def references(reason: str) -> list[NsysCapture]:
        print(f"No live nsys capture: {reason}.")
        return [NsysCapture(find_capture(chapter, f"{n}.sqlite", prefer="reference")) for n in names]

    gpus = describe_machine().gpus
    if gpus < nproc:
        return references("this machine has no GPU" if gpus == 0 else
                          f"this machine has {gpus} GPU(s) and the run needs {nproc}")
    live = live_tool("nsys")
    if not live:
        return references(live.reason)
    nsys, version = live
    out = chapter_output(chapter)
    with tempfile.TemporaryDirectory(dir=out, prefix=f".{name}.", suffix=".partial") as tmp:
        profile = [str(nsys.path), "profile", f"--trace={trace}", *options]
        program = [*python_target(script, *script_args)]
        launcher = [python_target(script)[0], *TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", "--no-python"]
        cmd = [*launcher, *profile, "-o", str(Path(tmp) / f"{name}_rank%q{{RANK}}"), *program]
        shown = shell_line([*launcher, *profile, "-o", f"{name}_rank%q{{RANK}}", *program])
        log = out / f"{name}.log"
        code, text, seconds = run_with_limit(cmd, timeout)
        log.write_text(f"$ {shown}\n# exit status {code}, {seconds:.1f} s\n{text}")
        if code is None:
            return references(f"the run did not finish within {timeout:.0f} s (see {log})")
        reports = [Path(tmp) / f"{n}.nsys-rep" for n in names]
        if code != 0 or not all(r.exists() for r in reports):
            return references(f"the run failed (exit {code}; see {log})")
        for r in reports:
            shutil.move(str(r), out / r.name)
    caps = []
    for n in names:
        try:
            export = run_profiler(nsys, ["export", "--type", "sqlite", "-o", "{output}.sqlite", str(out / f"{n}.nsys-rep")],
                                  out_dir=out, name=n, overwrite=True)
        except ProfilerFailed as exc:
            print(f"The export of {n} failed: {exc}")
            return references("a rank's report could not be exported")
        sqlite = export.file(".sqlite")
        scrub_environment(sqlite)
        export_cmd = shell_line(export.command)
        record_file(chapter, sqlite.name, f"{shown} && {export_cmd}", {"nsys": version})
        caps.append(NsysCapture(find_capture(chapter, sqlite.name), {}, [shown, export_cmd]))
    if echo:
        print(f"$ {shown}\n  ({nproc} reports under nsys {version}: {', '.join(n + '.nsys-rep' for n in names)})")
    return caps
