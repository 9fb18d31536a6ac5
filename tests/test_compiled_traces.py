"""Chapter 5's readers of eager, compiled and CUDA-graphed steps (gpuprof.studies.pytorch_profiler).

A hand-built trace in Kineto's format, whose answers are known by construction, checks
that a graph launch's kernels are linked to the one ``cudaGraphLaunch`` through their
shared correlation id, that calls outside the step are left out, and that generated
kernels are told apart. The stored GPU reference (made by ``compiled_and_graphed.py``)
is checked against what its own traces say where both exist.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from gpuprof.artifacts import REPO_ROOT
from gpuprof.torch_profiler import read_trace
from gpuprof.studies.pytorch_profiler import GRAPH_LAUNCH, launch_pace, mode_table, same_process_baseline, step_launches

REF = REPO_ROOT / "artifacts" / "ch05"


def _x(cat, name, ts, dur, pid, tid, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def graphed_trace(tmp_path):
    """Steps 0 and 1 (record_function 'step N'); step 1 makes one ordinary launch (k0) and one graph launch
    that runs three kernels (one generated), and a launch from the autograd thread; a launch after the step."""
    ev = [
        _x("user_annotation", "step 0", 0.0, 50.0, 100, 1),
        _x("cuda_runtime", "cudaLaunchKernel", 10.0, 2.0, 100, 1, correlation=1),
        _x("kernel", "k_prev", 15.0, 3.0, 0, 7, device=0, stream=7, correlation=1),
        _x("user_annotation", "step 1", 100.0, 100.0, 100, 1),
        _x("cuda_runtime", "cudaLaunchKernel", 110.0, 2.0, 100, 1, correlation=2),
        _x("cuda_runtime", GRAPH_LAUNCH, 120.0, 10.0, 100, 1, correlation=3),
        _x("cuda_runtime", "cuLaunchKernel", 150.0, 2.0, 100, 2, correlation=4),
        _x("cuda_runtime", "cudaLaunchKernel", 250.0, 2.0, 100, 1, correlation=5),
        _x("kernel", "k0", 115.0, 5.0, 0, 7, device=0, stream=7, correlation=2),
        _x("kernel", "gemm", 131.0, 8.0, 0, 7, device=0, stream=7, correlation=3),
        _x("kernel", "triton_poi_fused_add_0", 140.0, 2.0, 0, 7, device=0, stream=7, correlation=3),
        _x("kernel", "gemm", 143.0, 8.0, 0, 7, device=0, stream=7, correlation=3),
        _x("kernel", "triton_red_fused_sum_1", 155.0, 4.0, 0, 7, device=0, stream=7, correlation=4),
        _x("kernel", "k_after", 255.0, 3.0, 0, 7, device=0, stream=7, correlation=5),
    ]
    path = tmp_path / "g.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"schemaVersion": 1, "traceEvents": ev}).encode()))
    return read_trace(path)


def test_a_graph_launch_owns_its_kernels_and_the_step_window_holds(tmp_path):
    calls, kernels, start = step_launches(graphed_trace(tmp_path), 1)
    assert start == 100_000  # ns
    assert list(calls["name"]) == ["cudaLaunchKernel", GRAPH_LAUNCH, "cuLaunchKernel"]  # not step 0's, not the one after
    assert list(calls["kernels"]) == [1, 3, 1]
    assert calls["start_ms"].tolist() == pytest.approx([0.010, 0.020, 0.050])
    assert list(kernels["name"]) == ["k0", "gemm", "triton_poi_fused_add_0", "gemm", "triton_red_fused_sum_1"]
    assert list(kernels["launched_by"]) == ["cudaLaunchKernel", GRAPH_LAUNCH, GRAPH_LAUNCH, GRAPH_LAUNCH, "cuLaunchKernel"]
    assert list(kernels["generated"]) == [False, False, True, False, True]
    with pytest.raises(KeyError, match="no step 7"):
        step_launches(graphed_trace(tmp_path), 7)


def test_mode_table_counts_per_step_and_the_busy_share_uses_the_unprofiled_time():
    run = {"modes": [
        {"mode": "eager", "profiled_steps": 2, "step_ms": 4.0, "traced_step_ms": 8.0, "aten_ops": 100, "kernels": 40,
         "generated_kernels": 0, "launch_calls": {"cudaLaunchKernel": 30, "cuLaunchKernel": 10}, "gpu_busy_ms": 1.0},
        {"mode": "graphed", "profiled_steps": 2, "step_ms": 2.0, "traced_step_ms": 2.5, "aten_ops": 10, "kernels": 42,
         "generated_kernels": 12, "launch_calls": {"cudaLaunchKernel": 6, GRAPH_LAUNCH: 4}, "gpu_busy_ms": 1.0},
        {"mode": "compiled", "profiled_steps": 2, "step_ms": 1.0, "traced_step_ms": 1.0, "aten_ops": 20, "kernels": 0,
         "generated_kernels": 0, "launch_calls": {}, "gpu_busy_ms": None},  # a CPU run: no GPU activity
    ]}
    t = mode_table(run)
    assert t.loc["eager", "kernel launches"] == 20 and t.loc["eager", "graph launches"] == 0
    assert t.loc["graphed", "kernel launches"] == 3 and t.loc["graphed", "graph launches"] == 2
    assert t.loc["graphed", "ATen ops"] == 5 and t.loc["graphed", "generated"] == 6
    assert t.loc["eager", "busy share"] == 0.25 and t.loc["graphed", "busy share"] == 0.5
    assert t.loc["compiled", "busy share"] is None or t["busy share"].isna()["compiled"]
    assert t.loc["eager", "profiled x"] == 2.0 and t.loc["graphed", "profiled x"] == 1.25


def test_launch_pace_separates_the_calls_from_the_host_time_between_them(tmp_path):
    pace = launch_pace(graphed_trace(tmp_path)).set_index("step")
    assert pace.loc[1, "launches"] == 3 and pace.loc[1, "step_ms"] == pytest.approx(0.1)
    assert pace.loc[1, "calls_ms"] == pytest.approx(0.014) and pace.loc[1, "call_us"] == pytest.approx(2)
    assert pace.loc[1, "gap_us"] == pytest.approx(8)  # 112 -> 120 us on thread 1; thread 2's one call has no gap
    assert pace.loc[0, "launches"] == 1 and np.isnan(pace.loc[0, "gap_us"])


def test_same_process_baseline_reads_the_unprofiled_steps_and_skips_older_captures():
    from types import SimpleNamespace

    found = lambda d: SimpleNamespace(json=lambda: d)  # noqa: E731  (a capture whose JSON is d)
    runs = SimpleNamespace(profiler=found({"event_ms": [3.0, 3.0, 3.3], "baseline_event_ms": [2.0, 2.4],
                                           "after_event_ms": [2.2, 2.8]}),
                           nvtx=found({"event_ms": [2.5]}))  # made before the script timed unprofiled steps
    t = same_process_baseline(runs)
    assert list(t.index) == ["torch.profiler"]
    assert t.loc["torch.profiler", "unprofiled before ms"] == pytest.approx(2.2)
    assert t.loc["torch.profiler", "unprofiled after ms"] == pytest.approx(2.5)
    assert t.loc["torch.profiler", "profiled / before"] == pytest.approx(3.0 / 2.2)  # not pooled with the steps after
    assert t.loc["torch.profiler", "profiled / after"] == pytest.approx(3.0 / 2.5)


def test_the_stored_reference_agrees_with_its_own_traces():
    run = json.loads((REF / "compiled_64.json").read_text())
    assert run["device"] == "cuda" and [m["mode"] for m in run["modes"]] == ["eager", "compiled", "graphed"]
    for m in run["modes"]:
        trace = read_trace(REF / m["trace"])
        steps = trace.steps(r"step (\d+)")
        assert len(steps) == m["profiled_steps"]
        launched = sum(step_launches(trace, s)[0]["kernels"].sum() for s in steps["step"])
        assert launched == m["kernels"]  # every kernel of the trace is linked to a launch call inside a step
        graph = sum((step_launches(trace, s)[0]["name"] == GRAPH_LAUNCH).sum() for s in steps["step"])
        assert graph == m["launch_calls"].get(GRAPH_LAUNCH, 0)


def test_span_ends_finds_the_loss_copy_after_the_last_kernel_in_the_committed_runs(capsys):
    """reconcile.py reads the loss after the step's end event but inside its range: every profiled step's span ends
    on that copy, after the last kernel; the span to the last kernel is shorter, and the table's span is the full one."""
    from gpuprof.studies.pytorch_profiler import reconcile_runs, reconcile_table, span_ends

    runs = reconcile_runs("ch05", REPO_ROOT / "examples" / "pytorch_profiler" / "reconcile.py", 256)
    capsys.readouterr()
    ends, table = span_ends(runs), reconcile_table(runs)
    assert list(ends.index) == ["torch.profiler", "nsys"]
    assert (ends["steps ending on a copy"] == "20 of 20").all()
    assert (ends["after the last kernel ms"] > 0).all() and (ends["kernels' span ms"] < ends["GPU span ms"]).all()
    for run in ends.index:
        assert ends.loc[run, "GPU span ms"] == pytest.approx(table.loc[run, "GPU span ms"])
