#!/usr/bin/env python3
"""Regenerate every reference capture and execute every notebook in place, on a GPU.

One command for the course's GPU run (``make capture``):

1. executes each notebook in ``notebooks/`` in place, in order, with
   ``GPUPROF_OUTPUT_DIR=artifacts`` so that its captures become the new reference
   captures (with provenance), each within its time budget;
2. writes ``artifacts/provenance.md``, the table the book's provenance page shows;
3. runs strict nbval over the freshly executed notebooks (captures going to a scratch
   folder, so the references just written are not touched), with the sanitize file
   (``--skip-nbval`` leaves it out; ``scripts/gpu_nbval.py`` runs it alone, on any machine);
4. optionally packs notebooks, artifacts and logs into one archive (``--archive``).

It refuses to run without a GPU: reference captures from a CPU would be worthless.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuprof import describe_machine, exit_on_error  # noqa: E402
from gpuprof.artifacts import gzip_reference  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

# Seconds each notebook may take on an H100/H200. A run over every notebook plus strict
# nbval takes longer than one 10-minute command of the course's device tool: there it
# is split with --notebooks (each call refreshes the provenance table and its own rows).
# Chapters 4 and 6 took up to 511 s and 555 s on fresh machines (strict nbval, 2026-11-24):
# near the device tool's 600 s per command, so a chapter that grows there needs splitting.
# Chapter 8 took 521 s strict on 2 x H100 (2026-11-25) after its channel and first-bucket jobs.
# Chapter 1 took 404 s (2026-11-24); review 2 added a capture (alloc_async) and six nsys analyze runs.
BUDGET_S = {"00__setting_up.ipynb": 150, "01__nsight_systems.ipynb": 480, "02__nvtx.ipynb": 150,
            "03__weight_streaming.ipynb": 240, "04__nsight_compute.ipynb": 540,
            "05__pytorch_profiler.ipynb": 330, "06__cnn_training.ipynb": 570,
            "07__transformer.ipynb": 540, "08__multi_gpu.ipynb": 570, "09__your_own_captures.ipynb": 120,
            "10__mixed_precision.ipynb": 420, "11__matmul_ladder.ipynb": 240,
            # reads its committed references only (the decode runs are started by scripts/capture_ch12.py) and runs
            # the small configuration on the CPU (seconds)
            "12__llm_inference.ipynb": 120,
            # reads its committed references only (the FSDP2 runs are started by hand: artifacts/ch13/provenance.json)
            "13__sharded_training.ipynb": 120}
DEFAULT_BUDGET_S = 120
CELL_TIMEOUT_S = 540


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--notebooks", nargs="*", default=None, help="notebook files (default: all in notebooks/)")
    p.add_argument("--skip-nbval", action="store_true", help="do not run strict nbval afterwards")
    p.add_argument("--archive", type=Path, default=None, help="write notebooks, artifacts and logs to this .tgz")
    p.add_argument("--log-dir", type=Path, default=ROOT / "_build" / "capture", help="where logs go")
    p.add_argument("--keep-going", action="store_true",
                   help="execute every cell even after one fails, and list the failures (for developing a chapter: "
                        "a notebook with errors is not a capture to commit)")
    return p.parse_args(argv)


def shrink_figures(nb) -> int:  # type: ignore[no-untyped-def]
    """Store fully opaque RGBA figures as RGB PNGs: the same pixels, about 15% fewer bytes.

    Matplotlib writes RGBA even when nothing is transparent; the notebooks are committed
    with their figures, so every byte counts (tests/test_notebooks.py caps their size).
    Returns the bytes saved. Lossless: a figure with any transparency is left as it is.
    """
    import base64
    import io

    from PIL import Image

    saved = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "image/png" not in data:
                continue
            raw = base64.b64decode(data["image/png"])
            im = Image.open(io.BytesIO(raw))
            if im.mode != "RGBA" or im.getchannel("A").getextrema() != (255, 255):
                continue
            buf = io.BytesIO()
            im.convert("RGB").save(buf, format="PNG", optimize=True)
            if len(buf.getvalue()) < len(raw):
                data["image/png"] = base64.b64encode(buf.getvalue()).decode()
                saved += len(raw) - len(buf.getvalue())
    return saved


def execute_in_place(nb_path: Path, env: dict[str, str], keep_going: bool = False) -> float:
    """Execute one notebook with nbclient in its own folder; return seconds taken."""
    import nbclient
    import nbformat
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(nb_path, as_version=4)
    os.environ.update(env)  # the kernel inherits this process's environment
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", allow_errors=keep_going,
                                     resources={"metadata": {"path": str(nb_path.parent)}})
    t0 = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as exc:
        nbformat.write(nb, nb_path)  # keep the outputs up to the failing cell, for reading
        last = [line for line in str(exc).splitlines() if line.strip()][-1]
        raise GpuprofError(f"{nb_path.name} failed in a cell: {last}", "Its outputs so far are saved in place.") from None
    seconds = time.perf_counter() - t0
    shrink_figures(nb)
    nbformat.write(nb, nb_path)
    failed = [i for i, c in enumerate(nb.cells) for o in c.get("outputs", []) if o.get("output_type") == "error"]
    if failed:
        raise GpuprofError(f"{nb_path.name}: cells {failed} failed (executed with --keep-going).",
                           "Read their outputs in the notebook, saved in place.")
    return seconds


def escaped_pipes(text: str) -> str:
    """``text`` with each ``|`` written ``\\|``: a GFM table cell's pipe, which MyST reads as ``|`` even inside code."""
    return text.replace("|", "\\|")


def provenance_markdown(artifacts: Path) -> str:
    """One table row per reference file: what produced it, on which GPU, with which tools."""
    rows = ["| file | GPU | driver | CUDA | libraries | tools | captured | command |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for prov_path in sorted([*artifacts.glob("*/provenance.json"), *artifacts.glob("*/*/provenance.json")]):
        prov = json.loads(prov_path.read_text())
        for name, e in sorted(prov.get("files", {}).items()):
            m = e.get("machine", {})
            libs = ", ".join(f"{k} {v}" for k, v in m.get("libraries", {}).items())
            tools = ", ".join(f"{k} {v}" for k, v in e.get("tools", {}).items()) or "-"
            cmd = e["command"] if isinstance(e["command"], str) else " ".join(e["command"])
            if e.get("stored"):  # a reference committed gzipped (gpuprof.artifacts.gzip_reference)
                cmd += f"; stored as {e['stored']}"
            rows.append(f"| `{prov_path.parent.relative_to(artifacts).as_posix()}/{name}` | {m.get('gpu_name') or 'CPU'} | {m.get('driver_version') or '-'} "
                        f"| {m.get('cuda_runtime') or '-'} | {libs} | {tools} | {e.get('captured_at', '?')} "
                        f"| `{escaped_pipes(cmd)}` |")
    return "\n".join(rows) + "\n"


def tool_facts(artifacts: Path) -> list[str]:
    """Save the tool listings the prose relies on (e.g. ncu's set names), for tests to check."""
    from gpuprof.tools import find_tool, tool_version

    folder = artifacts / "tools"
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, argv in (("nsys", []), ("ncu", ["--list-sets"])):
        try:
            tool = find_tool(name)
            lines.append(f"{name} {tool_version(tool)}")
            if argv:
                out = subprocess.run([str(tool.path), *argv], capture_output=True, text=True, timeout=120, check=False)
                (folder / f"{name}{'_'.join(argv).replace('--', '-')}.txt").write_text(out.stdout)
        except GpuprofError as exc:
            lines.append(f"{name}: {exc}")
    return lines


def run_summary(machine_line: str, timings: list[tuple[str, float, int]], nbval_line: str, tools: list[str],
                command: str = "make capture (python scripts/capture_all.py)") -> str:
    """The provenance page's account of this run, as markdown."""
    import datetime as dt

    from gpuprof.artifacts import git_commit

    rows = ["| notebook | executed in | budget |", "| --- | --- | --- |"]
    rows += [f"| `{name}` | {sec:.0f} s | {budget} s |" for name, sec, budget in timings]
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([
        f"* **Machine:** {machine_line}",
        f"* **Date:** {when}; **commit:** `{git_commit() or 'unknown'}`",
        f"* **Profilers:** {'; '.join(tools)}",
        f"* **Command:** `{command}`",
        f"* **Strict nbval over the executed notebooks:** `{nbval_line}`",
        "",
        *rows,
    ]) + "\n"


def merge_runs(new: str, old: str | None, ran: set[str]) -> str:
    """The new run's summary first, then earlier runs' summaries for notebooks this run did not execute.

    A run over some notebooks (``--notebooks``) must not erase the record of the run that
    produced the others; a summary whose notebooks were all executed again since, by this
    run or by later ones (summaries are kept newest first), is dropped.
    """
    import re

    kept, covered = [], set(ran)
    for sec in (old.split(RUN_SEPARATOR) if old else []):
        notebooks = set(re.findall(r"`(\d\d__\w+\.ipynb)`", sec))
        if sec.strip() and not notebooks <= covered:
            kept.append(sec)
        covered |= notebooks
    return RUN_SEPARATOR.join([new.rstrip("\n") + "\n", *kept])


RUN_SEPARATOR = "\n---\n\n"

ARCHIVE_SKIPS = (".nsys-rep", ".qdstrm", ".log")


def artifacts_written_since(artifacts: Path, started: float) -> list[Path]:
    """The reference files this run wrote or rewrote (modified at or after ``started``), for the archive.

    The archive carries a run's results off a lent GPU machine, which returns files of limited
    size (16 MiB each on the course's device tool): packing every reference of every chapter
    (18 MiB on 2026-11-26, when chapter 8's capture was lost that way) would outgrow it for no
    gain, since the files no notebook of this run touched are the ones already committed.
    Raw reports (``.nsys-rep``) and logs stay out: the exports and provenance are what is committed.
    """
    return sorted(f for f in artifacts.rglob("*")
                  if f.is_file() and f.suffix not in ARCHIVE_SKIPS and f.stat().st_mtime >= started)


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.time()
    machine = describe_machine()
    if machine.device != "cuda":
        raise GpuprofError("capture_all.py needs a CUDA GPU: reference captures from a CPU would be worthless.",
                           "Run it on a GPU machine (`make capture`).")
    print(f"capture: {machine.summary()}", flush=True)
    notebooks = [Path(p).resolve() for p in args.notebooks] if args.notebooks else sorted((ROOT / "notebooks").glob("*.ipynb"))
    args.log_dir.mkdir(parents=True, exist_ok=True)
    env = {"GPUPROF_OUTPUT_DIR": str(ROOT / "artifacts"), "GPUPROF_OVERWRITE": "1", "GPUPROF_STRICT": "1",
           "KINETO_LOG_LEVEL": "6",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    over_budget = []
    failed = []
    timings: list[tuple[str, float, int]] = []
    for nb in notebooks:
        budget = BUDGET_S.get(nb.name, DEFAULT_BUDGET_S)
        print(f"executing {nb.relative_to(ROOT)} (budget {budget} s) ...", flush=True)
        try:
            seconds = execute_in_place(nb, env, args.keep_going)
        except GpuprofError as exc:
            print(f"  FAILED: {exc}", flush=True)
            failed.append(nb.name)
            continue
        timings.append((nb.name, seconds, budget))
        flag = "" if seconds <= budget else "  OVER BUDGET"
        print(f"  done in {seconds:.0f} s{flag}", flush=True)
        if flag:
            over_budget.append(nb.name)
    packed = [gzip_reference(p) for p in sorted((ROOT / "artifacts").glob("*/*.sqlite"))]
    if packed:  # the sqlite references are committed gzipped: the tree must fit the GPU machine's carry limit
        print(f"gzipped {len(packed)} sqlite export(s) in artifacts/", flush=True)
    (ROOT / "artifacts" / "provenance.md").write_text(provenance_markdown(ROOT / "artifacts"))
    print("wrote artifacts/provenance.md", flush=True)
    tools = tool_facts(ROOT / "artifacts")
    status = 1 if failed else 0
    nbval_line = "not run"
    if not args.skip_nbval and not failed:
        scratch = tempfile.mkdtemp(prefix="gpuprof-nbval-")
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env",
               "--nbval-sanitize-with", str(ROOT / "tests" / "nbval_sanitize.cfg"), *map(str, notebooks)]
        print(f"strict nbval: {' '.join(cmd[2:])}", flush=True)
        log = args.log_dir / "nbval_strict.log"
        with log.open("w") as fh:
            proc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                  env={**os.environ, **env, "GPUPROF_OUTPUT_DIR": scratch})
        lines = log.read_text().strip().splitlines()
        print("\n".join(lines[-25:]) if proc.returncode else lines[-1], flush=True)
        nbval_line = lines[-1].strip("= ") if lines else "no output"
        status = proc.returncode
    summary_path = ROOT / "artifacts" / "capture_run.md"
    command = "python scripts/capture_all.py" + (" --notebooks " + " ".join(f"notebooks/{nb.name}" for nb in notebooks)
                                                  if args.notebooks else "")
    summary = run_summary(machine.summary(), timings, nbval_line, tools, command)
    old = summary_path.read_text() if summary_path.exists() else None
    summary_path.write_text(merge_runs(summary, old, {name for name, _, _ in timings}))
    if args.archive:
        args.archive.parent.mkdir(parents=True, exist_ok=True)
        written = artifacts_written_since(ROOT / "artifacts", started)
        with tarfile.open(args.archive, "w:gz") as tar:
            for nb in notebooks:
                tar.add(nb, arcname=str(nb.relative_to(ROOT)))
            for f in written:
                tar.add(f, arcname=str(f.relative_to(ROOT)))
            for f in sorted(args.log_dir.glob("*.log")):
                tar.add(f, arcname=f"capture-logs/{f.name}")
        print(f"archive: {args.archive} ({args.archive.stat().st_size / 2**20:.1f} MiB; the notebooks, the "
              f"{len(written)} artifact files this run wrote, the logs)")
    if over_budget:
        print(f"over budget: {', '.join(over_budget)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
