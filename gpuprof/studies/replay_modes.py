"""What ncu's replay modes and graph-profiling modes do to launches that could overlap.

:func:`replay_mode_table` runs ``examples/nsight_compute/replay_modes.py`` (two kernels
on two streams, and a CUDA graph with two independent kernel nodes; each kernel records
the GPU's global timer at its start and end) without a profiler and under ncu in each
mode, and returns one row per run: what ncu reported (one result per kernel, or one per
range or graph), the replay passes, how many times the program was started, and when
the kernels ran as the kernels themselves saw it. That last column is the evidence for
what NVIDIA's documentation states: under kernel replay ncu serialises launches; range
replay and whole-graph profiling keep the concurrency inside the range or graph.

It runs live on a GPU only; a chapter saves the rows as JSON with provenance.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from ..errors import GpuprofError
from ..runner import ProfilerFailed, python_target, run_profiler
from ..tools import require_tool
from ..ncu.capture import ncu_said, parse_passes
from ..ncu.csv_reader import to_seconds

__all__ = ["REPLAY_RUNS", "replay_mode_table"]

ONE_METRIC = ["--metrics", "gpu__time_duration.sum"]

# (label, ncu options or None for no profiler, the script's --demo). Application replay
# collects the default set (several passes), so that it has to start the program more than once.
REPLAY_RUNS: list[tuple[str, list[str] | None, str]] = [
    ("no profiler", None, "all"),
    ("kernel replay (default)", ["--nvtx", "--nvtx-include", "pair/", "--nvtx-include", "graph/", *ONE_METRIC], "all"),
    ("range replay", ["--replay-mode", "range", "--nvtx", "--nvtx-include", "pair/", *ONE_METRIC], "streams"),
    ("--graph-profiling graph", ["--graph-profiling", "graph", "--nvtx", "--nvtx-include", "graph/", *ONE_METRIC], "graph"),
    ("kernel replay, --set basic", ["--set", "basic", "--nvtx", "--nvtx-include", "pair/"], "streams"),
    ("application replay, --set basic", ["--replay-mode", "application", "--set", "basic", "--nvtx", "--nvtx-include",
                                         "pair/"], "streams"),
]


def _results(report: Path) -> list[dict]:
    from ..ncu.report import open_report

    rows = []
    for k in open_report(report).kernels:
        dur = k["metrics"].get("gpu__time_duration.sum")
        us = to_seconds(dur[0], dur[1]) * 1e6 if dur is not None and isinstance(dur[0], float) else None
        rows.append({"name": k["name"], "nvtx": k["nvtx"], "duration_us": us})
    return rows


def replay_mode_table(script: str | Path, script_args: Sequence[str] = (),
                      runs: Sequence[tuple[str, list[str] | None, str]] = REPLAY_RUNS) -> list[dict]:
    """One row per run in ``runs`` (see the module docstring). A mode ncu refuses becomes a row with
    ``error`` (ncu's own words) instead of stopping the table."""
    ncu, _ = require_tool("ncu")
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for i, (label, options, demo) in enumerate(runs):
            out_json, run_log = tmp / f"run{i}.json", tmp / f"run{i}.starts"
            program = python_target(script, *script_args, "--demo", demo, "--json", str(out_json), "--run-log", str(run_log))
            row: dict = {"mode": label, "options": " ".join(options) if options is not None else "", "demo": demo}
            t0 = time.perf_counter()
            if options is None:
                proc = subprocess.run(program, capture_output=True, text=True, timeout=300, check=False)
                if proc.returncode != 0:
                    raise GpuprofError(f"{Path(script).name} failed without a profiler: {proc.stderr.strip()[-300:]}")
                log, results, passes = proc.stdout, [], []
            else:
                try:
                    cap = run_profiler(ncu, [*options, "-o", "{output}"], program, out_dir=tmp, name=f"run{i}",
                                       overwrite=True, timeout=300)
                except ProfilerFailed as exc:
                    log = (tmp / f"run{i}.log").read_text() if (tmp / f"run{i}.log").exists() else ""
                    rows.append({**row, "error": (ncu_said(log) or [str(exc)])[0]})
                    continue
                log = cap.log.read_text()
                results = _results(cap.file(".ncu-rep"))
                passes = [n for _, n in parse_passes(log)]
            row.update(wall_s=time.perf_counter() - t0, results=results, passes=passes,
                       program_starts=len(run_log.read_text().split()) if run_log.exists() else 0,
                       ncu_said=ncu_said(log) if options is not None else [],
                       program=json.loads(out_json.read_text()) if out_json.exists() else None)
            rows.append(row)
    return rows


if __name__ == "__main__":  # a quick look on a GPU machine: python -m gpuprof.studies.replay_modes
    root = Path(__file__).resolve().parents[2]
    json.dump(replay_mode_table(root / "examples" / "nsight_compute" / "replay_modes.py"), sys.stdout, indent=1)
