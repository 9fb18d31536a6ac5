"""One training step timed by CUDA events, by ``torch.profiler`` and by Nsight Systems, side by side.

``examples/pytorch_profiler/reconcile.py`` runs the same steps in three processes (CUPTI
serves one profiler at a time): ``--mode events`` (no profiler), ``--mode profiler`` and
``--mode nvtx`` under ``nsys profile --capture-range=cudaProfilerApi``. Every run records
CUDA events around each step; the profilers' runs also say, per step, the span of the
step's GPU work and the time the GPU was busy. :func:`reconcile_runs` runs the three (or
falls back to the course's references), :func:`reconcile_table` puts their medians in one
table, computed for both profilers by :func:`gpuprof.activity.range_busy`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .. import activity
from ..artifacts import FoundCapture, chapter_output, find_capture, record_file
from ..nsys import sqlite as nsql
from ..nsys.capture import QUIET, NsysCapture, nsys_capture
from ..script_results import run_for_json

__all__ = ["ReconcileRuns", "reconcile_runs", "reconcile_table", "nsys_steps"]


@dataclass
class ReconcileRuns:
    batch: int
    events: FoundCapture
    profiler: FoundCapture
    nsys: NsysCapture
    nvtx: FoundCapture


def reconcile_runs(chapter: str, script: str | Path, batch: int, *, steps: int = 20, warmup: int = 5) -> ReconcileRuns:
    """Run the three timings of ``reconcile.py`` at one batch size (or find the references)."""
    common = ["--steps", str(steps), "--warmup", str(warmup), "--batch", str(batch)]
    events = run_for_json(chapter, f"reconcile_{batch}_events.json", script, ["--mode", "events", *common])
    profiler = run_for_json(chapter, f"reconcile_{batch}_profiler.json", script, ["--mode", "profiler", *common],
                            files={"--trace": f"reconcile_{batch}_steps.json.gz"})
    nvtx_name = f"reconcile_{batch}_nvtx.json"
    nvtx_json = chapter_output(chapter) / nvtx_name
    cap = nsys_capture(chapter, f"reconcile_{batch}_nsys", script, ["--mode", "nvtx", *common, "--json", str(nvtx_json)],
                       options=[*QUIET, "--capture-range=cudaProfilerApi", "--capture-range-end=stop"])
    if cap.sqlite.source == "this machine" and nvtx_json.exists():
        record_file(chapter, nvtx_name, cap.commands[0])
    nvtx = find_capture(chapter, nvtx_name, prefer="this machine" if cap.sqlite.source == "this machine" else "reference")
    for found in (events, profiler, cap.sqlite, nvtx):
        print(found.describe())
    return ReconcileRuns(batch, events, profiler, cap, nvtx)


def nsys_steps(sqlite: str | Path) -> pd.DataFrame:
    """Per ``step_N`` NVTX range of an Nsight Systems export: GPU work launched in it, busy time, span."""
    ranges = nsql.nvtx_ranges(sqlite)
    ranges = ranges[ranges["text"].astype(str).str.match(r"^step_\d+$")]
    work = pd.concat([nsql.kernels(sqlite), nsql.memcpy(sqlite), nsql.memset(sqlite)], ignore_index=True)
    return activity.range_busy(work.dropna(subset=["correlationId"]), nsql.runtime_calls(sqlite), ranges, rule="window")


def reconcile_table(runs: ReconcileRuns) -> pd.DataFrame:
    """Medians per run: host ms, CUDA events ms, GPU span ms and GPU busy ms (NaN where a run cannot say)."""
    ev = json.loads(runs.events.path.read_text())
    pr = json.loads(runs.profiler.path.read_text())
    nj = json.loads(runs.nvtx.path.read_text())
    prof_steps = pd.DataFrame(pr["profiler_steps"])
    ns = nsys_steps(runs.nsys.path)

    def med(values) -> float:  # type: ignore[no-untyped-def]
        return float(pd.Series(values, dtype=float).median())

    nan = float("nan")
    return pd.DataFrame([
        {"run": "no profiler", "host ms": med(ev["wall_ms"]), "CUDA events ms": med(ev["event_ms"]),
         "GPU span ms": nan, "GPU busy ms": nan},
        {"run": "torch.profiler", "host ms": med(pr["wall_ms"]), "CUDA events ms": med(pr["event_ms"]),
         "GPU span ms": med(prof_steps["gpu_span_ms"]), "GPU busy ms": med(prof_steps["gpu_busy_ms"])},
        {"run": "nsys", "host ms": med(nj["wall_ms"]), "CUDA events ms": med(nj["event_ms"]),
         "GPU span ms": med(ns["gpu_span_ms"]), "GPU busy ms": med(ns["gpu_busy_ms"])},
    ]).set_index("run")
