#!/usr/bin/env python3
"""Check the committed notebooks on a GPU with strict nbval, without re-capturing anything.

Each notebook runs as its own pytest session (``--nbval`` with ``tests/nbval_sanitize.cfg``),
so every notebook gets a full log and a closing line of its own. The notebooks' live
captures go to a scratch folder (``--scratch``, default ``_build/nbval-scratch``), never to
``artifacts/``; the scratch folder is kept between parts, so that a later part sees what an
earlier one measured (chapter 4 draws its roofline under chapter 0's ceilings).

A whole run takes longer than one ten-minute command of the course's device tool, so it is
split into parts, each within that limit on an H100 or H200:

    python scripts/gpu_nbval.py --part 1     # 01
    python scripts/gpu_nbval.py --part 2     # 03, 04
    python scripts/gpu_nbval.py --part 3     # 05
    python scripts/gpu_nbval.py --part 4     # 06
    python scripts/gpu_nbval.py --part 5     # 07
    python scripts/gpu_nbval.py --part 6     # 08 (two GPUs; on one, its two-rank cells show the references)
    python scripts/gpu_nbval.py --part 7     # 00, 02, 09
    python scripts/gpu_nbval.py --part 8     # 10
    python scripts/gpu_nbval.py --part 9     # 11

or ``--notebooks`` for any list. Logs and a summary (``summary.md``: machine, command and
closing line per notebook) go to ``--log-dir``, with every ``check()``'s sentence, values and verdict
(``NN__x.checks.txt``: the values strict nbval masks, so that a passing run keeps what it measured); ``--archive`` packs the logs and the small
results the notebooks measured (JSON, reports under 16 MiB) for reading elsewhere.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuprof import describe_machine, exit_on_error  # noqa: E402
from gpuprof.checks import CHECK_LOG_ENV  # noqa: E402
from gpuprof.cli import output_file  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

PARTS = {1: ["01__nsight_systems.ipynb"],
         2: ["03__weight_streaming.ipynb", "04__nsight_compute.ipynb"], 3: ["05__pytorch_profiler.ipynb"],
         4: ["06__cnn_training.ipynb"], 5: ["07__transformer.ipynb"],
         6: ["08__multi_gpu.ipynb"], 7: ["00__setting_up.ipynb", "02__nvtx.ipynb", "09__your_own_captures.ipynb"],
         8: ["10__mixed_precision.ipynb"],
         9: ["11__matmul_ladder.ipynb", "12__llm_inference.ipynb", "13__sharded_training.ipynb"]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--part", type=int, choices=sorted(PARTS), help="run one part (see above)")
    which.add_argument("--notebooks", nargs="+", help="notebook files to check (default: every notebook)")
    p.add_argument("--log-dir", type=Path, default=ROOT / "_build" / "nbval", help="where logs go (default: _build/nbval)")
    p.add_argument("--scratch", type=Path, default=ROOT / "_build" / "nbval-scratch",
                   help="where the notebooks' live captures go (default: _build/nbval-scratch)")
    p.add_argument("--archive", type=output_file, default=None, metavar="FILE.tgz",
                   help="pack logs, summary and the scratch folder's small files into FILE.tgz")
    return p.parse_args(argv)


def notebooks_for(args: argparse.Namespace) -> list[Path]:
    if args.notebooks:
        paths = [Path(n).resolve() for n in args.notebooks]
    elif args.part:
        paths = [ROOT / "notebooks" / n for n in PARTS[args.part]]
    else:
        paths = sorted((ROOT / "notebooks").glob("*.ipynb"))
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise GpuprofError(f"No such notebook: {', '.join(missing)}.")
    return paths


def check_one(nb: Path, log_dir: Path, scratch: Path) -> tuple[str, int, float]:
    """Strict nbval over one notebook; returns its closing line, exit status and seconds."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env",
           "--nbval-sanitize-with", str(ROOT / "tests" / "nbval_sanitize.cfg"),
           "--durations=15", "--durations-min=5",  # the slowest cells, in the log: what a GPU pass's time goes to
           str(nb)]
    env = {**os.environ, "GPUPROF_OUTPUT_DIR": str(scratch), "GPUPROF_OVERWRITE": "1", "GPUPROF_STRICT": "1",
           "KINETO_LOG_LEVEL": "6",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    log = log_dir / f"{nb.stem}.log"
    checks = log_dir / f"{nb.stem}.checks.txt"  # every check()'s sentence with its values (strict nbval masks them)
    checks.unlink(missing_ok=True)
    env[CHECK_LOG_ENV] = str(checks)
    t0 = time.perf_counter()
    with log.open("w") as fh:
        fh.write("$ " + " ".join(cmd[2:]) + "\n")
        fh.flush()
        proc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env)
    seconds = time.perf_counter() - t0
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    closing = lines[-1].strip("= ") if lines else "no output"
    return closing, proc.returncode, seconds


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    machine = describe_machine()
    if machine.device != "cuda":
        raise GpuprofError("Strict nbval compares a GPU run with the stored GPU outputs; there is no GPU here.",
                           "On a CPU-only machine, `make test` checks the notebooks in lax mode.")
    notebooks = notebooks_for(args)
    # absolute: the notebooks' kernels run in notebooks/, and the check log's path is handed to them
    args.log_dir, args.scratch = args.log_dir.resolve(), args.scratch.resolve()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    args.scratch.mkdir(parents=True, exist_ok=True)
    print(f"strict nbval on: {machine.summary()}", flush=True)
    rows, status = [], 0
    for nb in notebooks:
        print(f"{nb.name} ...", flush=True)
        closing, code, seconds = check_one(nb, args.log_dir, args.scratch)
        print(f"  {closing}  [{seconds:.0f} s]", flush=True)
        if code != 0:
            failed = [line for line in (args.log_dir / f"{nb.stem}.log").read_text().splitlines()
                      if line.startswith(("FAILED", "ERROR"))]
            print("\n".join(f"    {line}" for line in failed[:12]), flush=True)
        rows.append(f"| `{nb.name}` | `{closing}` | {seconds:.0f} s |")
        status = status or code
    summary = "\n".join([f"* **Machine:** {machine.summary()}",
                         f"* **Command:** `python scripts/gpu_nbval.py {' '.join(sys.argv[1:] if argv is None else argv)}`",
                         "", "| notebook | strict nbval | time |", "| --- | --- | --- |", *rows]) + "\n"
    (args.log_dir / "summary.md").write_text(summary)
    if args.archive:
        with tarfile.open(args.archive, "w:gz") as tar:
            for f in sorted(args.log_dir.glob("*")):
                tar.add(f, arcname=f"nbval/{f.name}")
            for f in sorted(args.scratch.rglob("*")):
                if f.is_file() and f.suffix in (".json", ".sqlite", ".ncu-rep", ".csv") and f.stat().st_size < 16 * 2**20:
                    tar.add(f, arcname=f"scratch/{f.relative_to(args.scratch)}")
        print(f"archive: {args.archive} ({args.archive.stat().st_size / 2**20:.1f} MiB)")
    return status


if __name__ == "__main__":
    sys.exit(main())
