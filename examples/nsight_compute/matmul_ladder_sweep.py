#!/usr/bin/env python3
"""The matmul ladder's shape sweep: the rungs that matter and both cuBLAS forms over square sizes and
three LLM shapes, each shape in several fresh processes, with the SM clock and power of every timed kernel.

Each (shape, process) is one run of matmul_ladder.py (--no-check; the very first run also checks
every rung on its three check shapes) with --clocks, so every kernel's result carries NVML's SM
clock, power and clock-event reasons read during its own timed runs, and --min-time-s, so that
every kernel is timed for long enough for those readings to be its own. The processes go round
the shapes (process 1 of every shape, then process 2, ...), so the three processes of one shape
are minutes apart, not back to back. Everything lands in one JSON file, rewritten after every
run (a run cut short by a time limit keeps what it finished); gpuprof.studies.matmul_sweep
turns it into the chapter's table and figure (share of cuBLAS's same product per rung and shape,
the least favourable of the processes, per second and per cycle, clocks and power beside).

The three LLM shapes are Llama 2 7B's (hidden size 4096, MLP intermediate size 11008, as its
Hugging Face config.json gives them) for 8192 tokens, as C = A W^T with W as nn.Linear keeps it
(N x K): MLP up (and gate) projection 8192 x 11008 x 4096, MLP down projection 8192 x 4096 x
11008, attention output projection 8192 x 4096 x 4096 (M x N x K).

  python examples/nsight_compute/matmul_ladder_sweep.py --json sweep.json
  python examples/nsight_compute/matmul_ladder_sweep.py --plan   # the runs and their estimated time

Exit status: 0 every run finished; 2 bad input, or some runs failed or were left out (the JSON
says which); 3 nothing ran (no CUDA GPU here: matmul_ladder.py said so).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.cli import output_file, positive_int  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

LADDER = Path(__file__).with_name("matmul_ladder.py")
NOTHING_RAN = 3
LLAMA = "Llama 2 7B (hidden 4096, MLP 11008), 8192 tokens"
# (name, (M, N, K), where the shape comes from)
SHAPES: list[tuple[str, tuple[int, int, int], str]] = [
    ("2048^3", (2048, 2048, 2048), "square"),
    ("4096^3", (4096, 4096, 4096), "square"),
    ("6144^3", (6144, 6144, 6144), "square"),
    ("8192^3", (8192, 8192, 8192), "square"),
    ("16384^3", (16384, 16384, 16384), "square"),
    ("MLP up", (8192, 11008, 4096), LLAMA),
    ("MLP down", (8192, 4096, 11008), LLAMA),
    ("attention out", (8192, 4096, 4096), LLAMA),
]
RUNGS = "7,8,9,10"
PROCESSES = 3
MIN_TIME_S = 0.5
# The time model of --plan and --budget-s. A process's fixed cost (Python, CuPy and PyTorch start-up,
# the nvcc compile, the inputs) was 9-11 s on the H100 of the first rung-9/10 run (the gaps between its
# processes' power bursts in nvidia-smi's 250 ms log); the check of the first run about 10 s more.
# Each kernel: 5 probe and warm-up launches, then max(--min-time-s, repeats x its time), its time at
# ESTIMATE_TFLOPS or faster (rung 7 ran 16384^3 at about 300 TFLOP/s there; the others were faster)
# plus the timing loop's cost per launch (an event pair and a wait), LAUNCH_S: assumed, not measured.
PROCESS_S = 11.0
LAUNCH_S = 100e-6
CHECK_S = 10.0
ESTIMATE_TFLOPS = 300.0
KERNELS_BESIDE_RUNGS = 2  # cuBLAS FP32 out, and torch.matmul BF16 out


def estimate_run_s(size: tuple[int, int, int], kernels: int, min_time_s: float, repeats: int = 10,
                   warmup: int = 2) -> float:
    """Estimated wall seconds of one matmul_ladder.py process at ``size`` timing ``kernels`` kernels."""
    m, n, k = size
    launch_s = 2 * m * n * k / (ESTIMATE_TFLOPS * 1e12) + LAUNCH_S
    per_kernel = (4 + warmup) * launch_s + max(min_time_s, repeats * launch_s)
    return PROCESS_S + kernels * per_kernel


def plan(shapes: list[tuple[str, tuple[int, int, int], str]], rungs: str, processes: int, min_time_s: float,
         check: bool = True) -> list[dict[str, Any]]:
    """The runs in order (process 1 of every shape, then process 2, ...), each with its estimated seconds."""
    kernels = len([r for r in rungs.split(",") if r.strip()]) + KERNELS_BESIDE_RUNGS
    runs = []
    for p in range(processes):
        for name, size, source in shapes:
            first = check and not runs
            runs.append({"shape": name, "size": list(size), "source": source, "process": p, "check": first,
                         "estimate_s": estimate_run_s(size, kernels, min_time_s) + (CHECK_S if first else 0.0)})
    return runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="where the sweep's results go")
    p.add_argument("--rung", default=RUNGS, help=f"the rungs to time beside cuBLAS (default: {RUNGS})")
    p.add_argument("--shapes", default="all", metavar="NAMES",
                   help="'all' or a comma-separated subset of: " + ", ".join(s[0] for s in SHAPES))
    p.add_argument("--processes", type=positive_int, default=PROCESSES, help=f"fresh processes per shape (default: {PROCESSES})")
    p.add_argument("--min-time-s", type=float, default=MIN_TIME_S, metavar="S",
                   help=f"each kernel timed for at least S seconds (default: {MIN_TIME_S})")
    p.add_argument("--budget-s", type=float, default=500.0, metavar="S",
                   help="start no run that would end, by the estimate, after S seconds (default: 500)")
    p.add_argument("--timeout-s", type=positive_int, default=150, help="one run's limit in seconds (default: 150)")
    p.add_argument("--no-check", action="store_true", help="no check run first")
    p.add_argument("--plan", action="store_true", help="print the runs and the estimated time, run nothing")
    args = p.parse_args(argv)
    names = [s[0] for s in SHAPES]
    if args.shapes == "all":
        args.shape_list = list(SHAPES)
    else:
        wanted = [w.strip() for w in args.shapes.split(",") if w.strip()]
        bad = [w for w in wanted if w not in names]
        if bad or not wanted:
            p.error(f"no shape {bad[0] if bad else '(none given)'!r}; the shapes are {', '.join(names)}")
        args.shape_list = [s for s in SHAPES if s[0] in wanted]
    if not 0 <= args.min_time_s <= 60:
        p.error(f"--min-time-s takes 0 to 60 seconds, not {args.min_time_s}")
    if not args.plan and args.json is None:
        p.error("say where the results go with --json FILE (or ask for --plan)")
    return args


def _write(path: Path, payload: dict[str, Any]) -> None:
    """Atomically: a reader (or a limit that kills this process) never sees half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def run_one(run: dict[str, Any], args: argparse.Namespace, out: Path) -> tuple[int, str, dict[str, Any] | None]:
    """One matmul_ladder.py process: (exit status, the end of its output, its JSON or None)."""
    m, n, k = run["size"]
    cmd = [sys.executable, str(LADDER), "--rung", args.rung, "--size", f"{m},{n},{k}", "--clocks",
           "--min-time-s", str(args.min_time_s), "--json", str(out)] + ([] if run["check"] else ["--no-check"])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
    except subprocess.TimeoutExpired as exc:
        text = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode(errors="replace")
        return 124, f"killed after {args.timeout_s} s: " + " | ".join(text.strip().splitlines()[-3:]), None
    tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
    data = json.loads(out.read_text()) if proc.returncode == 0 and out.exists() else None
    return proc.returncode, tail, data


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = plan(args.shape_list, args.rung, args.processes, args.min_time_s, check=not args.no_check)
    total = sum(r["estimate_s"] for r in runs)
    print(f"matmul_ladder_sweep: {len(args.shape_list)} shapes x {args.processes} processes = {len(runs)} runs of "
          f"matmul_ladder.py --rung {args.rung} (+ cuBLAS FP32 out and torch.matmul BF16 out), each kernel timed "
          f">= {args.min_time_s} s; estimated {total:.0f} s ({total / 60:.1f} min)")
    if args.plan:
        for r in runs:
            print(f"  process {r['process'] + 1}  {r['shape']:<14} {' x '.join(map(str, r['size'])):<20} "
                  f"~{r['estimate_s']:.0f} s{'  (checks first)' if r['check'] else ''}")
        return 0
    path = Path(args.json)
    payload: dict[str, Any] = {"script": "examples/nsight_compute/matmul_ladder_sweep.py", "rungs": args.rung,
                               "processes": args.processes, "min_time_s": args.min_time_s,
                               "shapes": [{"name": n, "size": list(s), "source": src} for n, s, src in args.shape_list],
                               "estimate_s": total, "runs": [], "failed": [], "left_out": []}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for i, run in enumerate(runs):
            spent = time.monotonic() - t0
            if spent + run["estimate_s"] > args.budget_s:
                payload["left_out"].append({**run, "why": f"the budget: {spent:.0f} s spent, ~{run['estimate_s']:.0f} s "
                                                          f"more would pass {args.budget_s:.0f} s"})
                continue
            started = time.monotonic()
            status, tail, data = run_one(run, args, Path(tmp) / f"run{i}.json")
            wall = time.monotonic() - started
            if status == NOTHING_RAN and not payload["runs"]:
                print(f"matmul_ladder_sweep: nothing ran: {tail}")
                return NOTHING_RAN
            if data is None:
                payload["failed"].append({**run, "status": status, "tail": tail, "wall_s": wall})
                print(f"  [{i + 1}/{len(runs)}] {run['shape']} process {run['process'] + 1}: FAILED (exit {status}): {tail}")
            else:
                payload["runs"].append({"shape": run["shape"], "process": run["process"], "wall_s": wall, **data})
                rates = {r["name"]: r for r in data["results"]}
                ref = rates.get("cublas_fp32_out")
                shares = "  ".join(f"{r['extra']['rung']}: {r['rate'] / ref['rate']:.1%}" for r in data["results"]
                                   if ref and "rung" in r["extra"])
                print(f"  [{i + 1}/{len(runs)}] {run['shape']} process {run['process'] + 1} ({wall:.0f} s, estimated "
                      f"{run['estimate_s']:.0f}): share of cuBLAS {shares}", flush=True)
            payload["wall_s"] = time.monotonic() - t0
            _write(path, payload)
    _write(path, payload)
    print(f"results written to {path} ({len(payload['runs'])} runs, {len(payload['failed'])} failed, "
          f"{len(payload['left_out'])} left out; {payload['wall_s'] if payload['runs'] else 0:.0f} s)")
    if not payload["runs"]:
        raise GpuprofError("no run of the sweep finished.", "See the FAILED lines above.")
    return 2 if payload["failed"] or payload["left_out"] else 0


if __name__ == "__main__":
    sys.exit(main())
