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
from .sqlite import scrub_environment
from ..runner import ProfilerFailed, portable_command, python_target, run_profiler
from ..tools import live_tool

__all__ = ["NsysCapture", "nsys_capture", "nsys_capture_ranks", "reference_capture", "QUIET", "capture_overhead", "launch_cost", "build_cuda_example"]

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
    if isinstance(live, str):
        return reference_capture(chapter, name, reports, live)
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
    if isinstance(live, str):
        return references(live)
    nsys, version = live
    out = chapter_output(chapter)
    with tempfile.TemporaryDirectory(dir=out, prefix=f".{name}.", suffix=".partial") as tmp:
        profile = [str(nsys.path), "profile", f"--trace={trace}", *options]
        program = [*python_target(script, *script_args)]
        launcher = [python_target(script)[0], *TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", "--no-python"]
        cmd = [*launcher, *profile, "-o", str(Path(tmp) / f"{name}_rank%q{{RANK}}"), *program]
        shown = " ".join(portable_command([*launcher, *profile, "-o", f"{name}_rank%q{{RANK}}", *program]))
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
        export_cmd = " ".join(portable_command(export.command))
        record_file(chapter, sqlite.name, f"{shown} && {export_cmd}", {"nsys": version})
        caps.append(NsysCapture(find_capture(chapter, sqlite.name), {}, [shown, export_cmd]))
    if echo:
        print(f"$ {shown}\n  ({nproc} reports under nsys {version}: {', '.join(n + '.nsys-rep' for n in names)})")
    return caps


def _median_launch_us(text: str) -> float | None:
    import re

    m = re.search(r"median: ([\d.]+) us per launch", text)
    return float(m.group(1)) if m else None


def launch_cost(text: str) -> dict:
    """What tiny_kernels.py reports: its median cost per launch."""
    return {"us_per_launch": _median_launch_us(text)}


def capture_overhead(script: str | Path, script_args: Sequence[str], configs: dict[str, list[str]],
                     parse=launch_cost) -> list[dict]:  # type: ignore[no-untyped-def]
    """Run ``script`` without nsys and under each nsys option set; collect what ``parse`` reads
    from its output (default: tiny_kernels.py's ``median: X us per launch``) and the report size.

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
        return {"configuration": label, "options": "", **parse(run.stdout), "report_mib": 0.0, "wall_s": None}

    rows.append(baseline("no profiler"))
    with tempfile.TemporaryDirectory() as tmp:
        for label, opts in configs.items():
            try:
                cap = run_profiler(nsys, ["profile", *opts, "-o", "{output}"], python_target(script, *script_args),
                                   out_dir=Path(tmp), name=label.replace(" ", "_"), overwrite=True)
                text = cap.log.read_text()
                size = sum(f.stat().st_size for f in cap.files) / 2**20
                rows.append({"configuration": label, "options": " ".join(opts), **parse(text),
                             "report_mib": size, "wall_s": cap.seconds})
            except ProfilerFailed as exc:
                rows.append({"configuration": label, "options": " ".join(opts), **{k: None for k in parse("")},
                             "report_mib": None, "wall_s": None, "error": str(exc).split(". ")[0]})
    # The same program again without the profiler: the spread between the two baselines
    # is the run-to-run noise, and differences smaller than it mean nothing.
    rows.append(baseline("no profiler, again"))
    return rows


def build_cuda_example(source: str | Path) -> list[str] | None:
    """Compile a course .cu file with nvcc for this GPU into a temporary folder.

    Returns the argument list that runs it, or None (with the reason printed) when
    there is no GPU or no nvcc: the caller then falls back to the reference capture.
    """
    import shutil
    import subprocess
    import tempfile

    from ..backend import describe_machine

    machine = describe_machine()
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if machine.device != "cuda" or not nvcc:
        print("Not building " + Path(source).name + ": " + ("there is no GPU on this machine." if machine.device != "cuda"
                                                             else "nvcc was not found (set NVCC or add it to PATH)."))
        return None
    arch = "sm_" + (machine.compute_capability or "9.0").replace(".", "")
    out = Path(tempfile.mkdtemp(prefix="gpuprof-build-")) / Path(source).stem
    cmd = [nvcc, f"-arch={arch}", "-o", str(out), str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    print("$ " + " ".join(portable_command(["nvcc", f"-arch={arch}", "-o", Path(source).stem, str(source)])))
    if proc.returncode != 0:
        print(f"nvcc failed: {proc.stderr.strip()[-400:]}")
        return None
    return [str(out)]
