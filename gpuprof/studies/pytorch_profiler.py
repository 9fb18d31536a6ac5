"""Chapter 5's two experiments with the PyTorch profiler.

**Three clocks.** One training step timed by CUDA events, by ``torch.profiler`` and by Nsight
Systems, side by side.

``examples/pytorch_profiler/reconcile.py`` runs the same steps in three processes (CUPTI
serves one profiler at a time): ``--mode events`` (no profiler), ``--mode profiler`` and
``--mode nvtx`` under ``nsys profile --capture-range=cudaProfilerApi``. Every run records
CUDA events around each step; the profilers' runs also say, per step, the span of the
step's GPU work and the time the GPU was busy. :func:`reconcile_runs` runs the three (or
falls back to the course's references), :func:`reconcile_table` puts their medians in one
table, computed for both profilers by :func:`gpuprof.activity.range_busy`.

**Eager, compiled and graphed.** The three kinds of step side by side, as the profiler records them.

``examples/pytorch_profiler/compiled_and_graphed.py`` runs one training step three ways and
keeps a trace of each; these functions turn its JSON and traces into what chapter 5 reads:
per-step counts (operators, kernels, the calls that launched them) and, for one step, which
CPU call launched which GPU kernels.

What the three modes look like in a Kineto trace (checked on torch 2.11 with an H100):

* eager: one ``aten::`` operator per op, each launching its kernels with ``cudaLaunchKernel``
  (PyTorch's own kernels), ``cudaLaunchKernelExC`` or ``cuLaunchKernel`` (cuBLAS);
* compiled: the operators replaced by ``Torch-Compiled Region: F/G`` and ``CompiledFunction``
  (forward) / ``CompiledFunctionBackward``, the fused elementwise work as generated kernels
  named ``triton_<kind>_fused_<ops>_<n>`` launched with ``cuLaunchKernel``;
* graphed (``mode="reduce-overhead"``): the same compiled regions, but each region's kernels
  launched by one ``cudaGraphLaunch``; the kernels still appear, each with the graph launch's
  correlation id, so the profiler links them to that one call.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .. import activity
from ..artifacts import FoundCapture, chapter_output, find_capture, record_file
from ..nsys import sqlite as nsql
from ..nsys.capture import QUIET, NsysCapture, nsys_capture
from ..script_results import run_for_json
from ..torch_profiler.summary import KERNEL_LAUNCHES
from ..torch_profiler.trace import Trace

__all__ = ["ReconcileRuns", "reconcile_runs", "reconcile_table", "nsys_steps",
           "KERNEL_LAUNCHES", "GRAPH_LAUNCH", "LAUNCH_CALLS", "COMPILED_NAMES", "GENERATED_PREFIX",
           "mode_table", "step_launches", "launch_pace", "same_process_baseline", "span_ends"]


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
                            files={"--trace": _trace_name(batch)})
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


def _trace_name(batch: int) -> str:
    """The file ``reconcile.py --mode profiler`` writes its trace to, beside its JSON."""
    return f"reconcile_{batch}_steps.json.gz"


def _nsys_work(sqlite: str | Path) -> pd.DataFrame:
    """Kernels, copies and memsets of an Nsight Systems export in one table, each with its ``kind``."""
    return pd.concat([nsql.kernels(sqlite).assign(kind="kernel"), nsql.memcpy(sqlite).assign(kind="memcpy"),
                      nsql.memset(sqlite).assign(kind="memset")], ignore_index=True)


def nsys_steps(sqlite: str | Path) -> pd.DataFrame:
    """Per ``step_N`` NVTX range of an Nsight Systems export: GPU work launched in it, busy time, span."""
    ranges = activity.step_ranges(nsql.nvtx_ranges(sqlite))
    work = _nsys_work(sqlite)
    return activity.range_busy(work.dropna(subset=["correlationId"]), nsql.runtime_calls(sqlite), ranges, rule="window")


def reconcile_table(runs: ReconcileRuns) -> pd.DataFrame:
    """Medians per run: host ms, CUDA events ms, GPU span ms and GPU busy ms (NaN where a run cannot say)."""
    ev, pr, nj = runs.events.json(), runs.profiler.json(), runs.nvtx.json()
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


def _step_ends(work: pd.DataFrame, runtime: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    """Per range: the span of all the GPU work launched in it, the span of its kernels alone, and the last piece."""
    hits = activity.attribute_kernels(work, runtime, ranges, rule="window")
    rows = []
    for _, g in hits.groupby(["range_start", "range_text"], sort=False):
        k = g[g["kind"] == "kernel"]
        last = g.loc[g["end"].idxmax()]
        rows.append({"span_ms": (g["end"].max() - g["start"].min()) / 1e6,
                     "kernel_span_ms": (k["end"].max() - k["start"].min()) / 1e6 if len(k) else np.nan,
                     "after_last_kernel_ms": (g["end"].max() - k["end"].max()) / 1e6 if len(k) else np.nan,
                     "last_is_copy": last["kind"] == "memcpy"})
    return pd.DataFrame(rows)


def span_ends(runs: ReconcileRuns) -> pd.DataFrame:
    """Where each profiled step's GPU span ends, for both profiled runs (medians over the steps).

    Why: the table's GPU span runs from the step's first GPU operation to its last, copies and
    memsets included, and ``reconcile.py`` reads the loss (``loss.item()``, a device-to-host copy)
    after the step's end event and closing sync but inside the step's range. So the span ends at
    that copy, after the interval the CUDA events time, while it starts at the first kernel,
    after the events' start (the host's lead-in). This prints the span to the last kernel beside
    it, and how often the last piece is a copy.
    """
    rows = []
    trace_path = runs.profiler.path.parent / _trace_name(runs.batch)
    found = []
    if trace_path.exists():
        from ..torch_profiler.summary import gpu_activity
        from ..torch_profiler.trace import read_trace

        trace = read_trace(trace_path)
        steps = trace.steps()
        found.append(("torch.profiler", gpu_activity(trace), trace.runtime_calls(),
                      steps.assign(text=steps["step"].astype(str)), runs.profiler.json()))
    sql = runs.nsys.path
    found.append(("nsys", _nsys_work(sql), nsql.runtime_calls(sql), activity.step_ranges(nsql.nvtx_ranges(sql)),
                  runs.nvtx.json()))
    for name, work, runtime, ranges, js in found:
        ends = _step_ends(work.dropna(subset=["correlationId"]), runtime.dropna(subset=["correlationId"]), ranges)
        events = float(np.median(js["event_ms"]))
        rows.append({"run": name, "CUDA events ms": events, "GPU span ms": float(ends["span_ms"].median()),
                     "kernels' span ms": float(ends["kernel_span_ms"].median()),
                     "after the last kernel ms": float(ends["after_last_kernel_ms"].median()),
                     "steps ending on a copy": f"{int(ends['last_is_copy'].sum())} of {len(ends)}",
                     "kernels' span / events": float(ends["kernel_span_ms"].median()) / events})
    return pd.DataFrame(rows).set_index("run")


GRAPH_LAUNCH = "cudaGraphLaunch"
LAUNCH_CALLS = (*KERNEL_LAUNCHES, GRAPH_LAUNCH)
COMPILED_NAMES = ("Torch-Compiled Region", "CompiledFunction", "CompiledFunctionBackward")
GENERATED_PREFIX = "triton_"  # TorchInductor's kernels on a GPU


def mode_table(run: dict[str, Any]) -> pd.DataFrame:
    """One row per mode of a ``compiled_and_graphed.py`` JSON: step times (ms), and counts per profiled step.

    ``step ms`` is the unprofiled median, ``rounds`` the range of its per-round medians (the
    modes were timed in turn, round after round), ``profiled ms`` the median under the profiler;
    ``generated`` counts TorchInductor's kernels; ``profiled x`` is how much longer the step is under
    the profiler (profiled over unprofiled). Counts are divided by the number of profiled steps, so runs with different step counts
    compare; ``kernel launches`` counts the calls that launch one kernel each, ``graph
    launches`` the ``cudaGraphLaunch`` calls (each of which runs many kernels). ``busy
    share`` is the GPU's busy time per profiled step (kernels barely change under the
    profiler) over the *unprofiled* step time: the share section 6's report would give
    without the profiler slowing the host side.
    """
    rows = []
    for m in run["modes"]:
        n = m["profiled_steps"]
        launches = m.get("launch_calls", {})
        rounds = m.get("step_ms_rounds") or [m["step_ms"]]
        rows.append({"mode": m["mode"], "step ms": m["step_ms"], "rounds": f"{min(rounds):.2f}-{max(rounds):.2f}",
                     "profiled ms": m["traced_step_ms"],
                     "ATen ops": m["aten_ops"] / n, "kernels": m["kernels"] / n, "generated": m["generated_kernels"] / n,
                     "kernel launches": sum(v for k, v in launches.items() if k in KERNEL_LAUNCHES) / n,
                     "graph launches": launches.get(GRAPH_LAUNCH, 0) / n, "GPU busy ms": m.get("gpu_busy_ms"),
                     "profiled x": m["traced_step_ms"] / m["step_ms"],
                     "busy share": m["gpu_busy_ms"] / m["step_ms"] if m.get("gpu_busy_ms") else None})
    return pd.DataFrame(rows).set_index("mode")


def step_launches(trace: Trace, step: int, pattern: str = r"step (\d+)") -> tuple[pd.DataFrame, pd.DataFrame, float]:
    """The launch calls made during one step (any thread: autograd launches the backward from its
    own) and the kernels they launched, linked by correlation id; times in ms from the step's start.

    Returns (calls, kernels, step_start_ns). ``calls`` has name, start_ms, end_ms and kernels (how
    many kernels that call launched); ``kernels`` has name, start_ms, end_ms, launched_by (the
    call's name) and generated (a TorchInductor kernel).
    """
    steps = trace.steps(pattern).set_index("step")
    if step not in steps.index:
        raise KeyError(f"{trace.path.name} has no step {step}; it has {list(steps.index)}")
    start, end = int(steps.loc[step, "start"]), int(steps.loc[step, "end"])
    calls = trace.runtime_calls().dropna(subset=["correlationId"])
    calls = calls[calls["name"].isin(LAUNCH_CALLS) & (calls["start"] >= start) & (calls["start"] < end)]
    kernels = trace.kernels().dropna(subset=["correlationId"])
    kernels = kernels.merge(calls[["correlationId", "name"]].rename(columns={"name": "launched_by"}), on="correlationId")
    per_call = kernels.groupby("correlationId").size()
    out_calls = pd.DataFrame({"name": calls["name"].to_numpy(), "start_ms": (calls["start"].to_numpy() - start) / 1e6,
                              "end_ms": (calls["end"].to_numpy() - start) / 1e6,
                              "kernels": calls["correlationId"].map(per_call).fillna(0).astype(int).to_numpy()})
    out_kernels = pd.DataFrame({"name": kernels["name"].astype(str).to_numpy(),
                                "start_ms": (kernels["start"].to_numpy() - start) / 1e6,
                                "end_ms": (kernels["end"].to_numpy() - start) / 1e6,
                                "launched_by": kernels["launched_by"].to_numpy(),
                                "generated": kernels["name"].astype(str).str.startswith(GENERATED_PREFIX).to_numpy()})
    return out_calls, out_kernels.sort_values("start_ms", ignore_index=True), float(start)


def launch_pace(trace: Trace, pattern: str = r"step (\d+)") -> pd.DataFrame:
    """Per step: the launch calls' own time against the host time between them.

    A step whose host sets the pace can be slow because each launch call is slow, or because
    of the host work between launches (Python, the dispatcher, autograd, a compiled
    module's wrapper calling each generated kernel). Columns: step, step_ms (the range on the
    CPU), launches (calls that launch kernels or graphs, any thread), calls_ms (their summed
    duration), call_us (median call), gap_us (median time from one launch call's end to the
    next one's start on the same thread).
    """
    steps = trace.steps(pattern)
    calls = trace.runtime_calls()
    calls = calls[calls["name"].isin(LAUNCH_CALLS)]
    rows = []
    for s in steps.itertuples():
        c = calls[(calls["start"] >= s.start) & (calls["start"] < s.end)].sort_values("start")
        gaps = np.concatenate([g["start"].to_numpy()[1:] - g["end"].to_numpy()[:-1] for _, g in c.groupby("globalTid")]) \
            if len(c) else np.array([])
        rows.append({"step": s.step, "step_ms": s.duration_ns / 1e6, "launches": len(c),
                     "calls_ms": c["duration_ns"].sum() / 1e6,
                     "call_us": float(c["duration_ns"].median()) / 1e3 if len(c) else np.nan,
                     "gap_us": float(np.median(gaps)) / 1e3 if len(gaps) else np.nan})
    return pd.DataFrame(rows, columns=["step", "step_ms", "launches", "calls_ms", "call_us", "gap_us"])


def same_process_baseline(runs: ReconcileRuns) -> pd.DataFrame:
    """For each profiled run of ``reconcile.py``: CUDA-event step times without the profiler in the same process
    (before and after the profiled steps), beside the profiled steps, and the profiled steps' ratio to each.

    Comparing the profiled run with the separate run of ``--mode events`` compares two
    processes, and a host-bound step drifts between processes; the unprofiled steps of the
    same process remove that drift from the ratio. The steps before and after are kept apart
    (a pooled median of the two falls between them when they differ, and describes neither):
    after ``torch.profiler`` stops, Kineto may keep CUPTI attached (it tears CUPTI down only
    with ``TEARDOWN_CUPTI=1``; pytorch/pytorch#144455), so the steps after are not a clean
    baseline. Empty for captures made before the script timed them (their JSON has no
    ``baseline_event_ms``).
    """
    rows = []
    for name, found in (("torch.profiler", runs.profiler), ("nsys", runs.nvtx)):
        r = found.json()
        before, after = r.get("baseline_event_ms"), r.get("after_event_ms")
        if not before or not r.get("event_ms"):
            continue
        profiled = float(np.median(r["event_ms"]))
        b = float(np.median(before))
        a = float(np.median(after)) if after else np.nan
        rows.append({"run": name, "unprofiled before ms": b, "unprofiled after ms": a, "profiled ms": profiled,
                     "profiled / before": profiled / b, "profiled / after": profiled / a})
    return pd.DataFrame(rows, columns=["run", "unprofiled before ms", "unprofiled after ms", "profiled ms",
                                       "profiled / before", "profiled / after"]).set_index("run")
