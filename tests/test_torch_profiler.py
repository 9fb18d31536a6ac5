"""The PyTorch profiler trace reader and its summaries.

The CPU tests profile a small training loop live (PyTorch's CPU build runs the profiler)
and check the trace's summary against ``key_averages()`` of the same run. The GPU-side
logic (kernels, copies, correlation, steps) is checked on a small hand-built trace in
Kineto's format whose answers are known by construction; the stored GPU reference trace
and its ``key_averages`` records are checked where they exist.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

import pytest

torch = pytest.importorskip("torch")
from torch.profiler import ProfilerActivity, profile, record_function, schedule  # noqa: E402

from gpuprof.errors import GpuprofError  # noqa: E402
from gpuprof.torch_profiler import key_averages as tk  # noqa: E402
from gpuprof.torch_profiler import schedule as tsched  # noqa: E402
from gpuprof.torch_profiler import summary as ts  # noqa: E402
from gpuprof.torch_profiler import trace as tt  # noqa: E402

from helpers import _x, gpu_events, write  # noqa: E402  (tests/ is on sys.path under pytest)


def _train(prof, steps: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 14 * 14, 10))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 3, 16, 16), torch.zeros(4, dtype=torch.long)
    for _ in range(steps):
        with record_function("train_step"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        prof.step()


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """A CPU profile of five training steps (two recorded), its trace and its key_averages records."""
    path = tmp_path_factory.mktemp("trace") / "cpu.json"
    sched = schedule(wait=1, warmup=1, active=2, repeat=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU], schedule=sched, record_shapes=True) as prof:
            _train(prof, 5)
    prof.export_chrome_trace(str(path))
    return tt.read_trace(path), pd.DataFrame(tk.records(prof.key_averages())), sched


def test_cpu_operator_times_equal_key_averages(cpu_run):
    trace, ka, _ = cpu_run
    ours = ts.op_summary(trace).set_index("key")
    theirs = ka.set_index("key")
    assert set(ours.index) == set(theirs.index)
    joined = ours.join(theirs.add_suffix("_ka"))
    assert (joined["calls"] == joined["count_ka"]).all()
    assert np.allclose(joined["cpu_total_us"], joined["cpu_total_us_ka"], atol=0.01)
    assert np.allclose(joined["self_cpu_us"], joined["self_cpu_us_ka"], atol=0.01)


def test_steps_in_the_trace_are_the_ones_the_schedule_records(cpu_run):
    trace, _, sched = cpu_run
    plan = tsched.actions(sched, 5)
    assert list(plan["action"]) == ["NONE", "WARMUP", "RECORD", "RECORD_AND_SAVE", "NONE"]
    assert list(trace.steps()["step"]) == list(plan.loc[plan["recorded"], "step"]) == [2, 3]


def test_a_cpu_only_trace_has_no_gpu_tables_and_says_so(cpu_run):
    trace, _, _ = cpu_run
    assert not trace.has_gpu_activity and trace.kernels().empty and ts.kernel_summary(trace).empty
    steps = ts.step_summary(trace, rule="window")
    assert list(steps["launches"]) == [0, 0] and (steps["cpu_ms"] > 0).all()
    assert "GPUs: none listed" in trace.describe() and "steps 2, 3" in trace.describe()


def test_self_times_merge_an_only_child_of_the_same_name():
    ev = pd.DataFrame({"name": ["aten::sum", "aten::sum", "aten::add", "other"], "start": [0, 10, 20, 100],
                       "end": [90, 80, 30, 120], "globalTid": [0, 0, 0, 0]})
    ev["duration_ns"] = ev["end"] - ev["start"]
    merged = ts.self_times(ev)
    assert merged.isna().tolist() == [False, True, False, False]
    assert merged[0] == 90 - 10 and merged[2] == 10 and merged[3] == 20  # the parent adopts aten::add
    plain = ts.self_times(ev, merge_duplicates=False)
    assert plain.tolist() == [20, 60, 10, 20]


def test_check_names_reports_what_this_torch_accepts(cpu_run):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            torch.ones(4) + 1
    table = tk.check_names(prof.key_averages()).set_index(["kind", "name"])
    assert table.loc[("attribute", "device_time_total"), "result"] == "ok"
    assert table.loc[("attribute", "self_cpu_time_total"), "result"] == "ok"
    assert set(table["result"]) <= {"ok", "warns", "fails"}
    fails = table[table["result"] == "fails"]
    assert fails["detail"].str.contains("Error").all()


# ---- a hand-built trace in Kineto's format, with known answers -------------------------------

def test_gpu_tables_and_their_link_to_the_cpu(tmp_path):
    t = tt.read_trace(write(tmp_path, gpu_events(), gz=True))
    k = t.kernels()
    assert list(k["name"]) == ["k1", "k2", "k2"] and list(k["duration_ns"]) == [10_000, 20_000, 10_000]
    assert list(k["correlationId"]) == [11, 13, 14] and set(k["streamId"]) == {7}
    assert t.copies()["bytes"].tolist() == [4096]
    assert list(ts.launch_latency(t)) == [15_000, 30_000, 50_000]
    summary = ts.kernel_summary(t).set_index("name")
    assert summary.loc["k2", "calls"] == 2 and summary.loc["k2", "total_us"] == 30.0
    assert summary["share"].sum() == pytest.approx(1.0)
    assert t.thread_names[(100, 2)] == "autograd"


def test_launch_delays_from_the_call_s_start_and_from_its_end(tmp_path):
    t = tt.read_trace(write(tmp_path, gpu_events()))
    d = ts.launch_delays(t)
    assert d["call_ns"].tolist() == [5_000] * 3
    assert d["from_call_start_ns"].tolist() == list(ts.launch_latency(t)) == [15_000, 30_000, 50_000]
    assert d["from_call_end_ns"].tolist() == [10_000, 25_000, 45_000]


def _ranges_trace(tmp_path):
    """Main thread 1: 'forward' (0..100 us) whose operators fill 10..90, projected on the GPU from 20 to 60 us
    (External id 5) over two kernels; 'backward' (200..300) with one operator (200..210) while thread 2 runs
    operators 220..250, 260..290 and 295..320; the backward's GPU projection holds one fill kernel."""
    return tt.read_trace(write(tmp_path, [
        _x("user_annotation", "forward", 0.0, 100.0, 100, 1, **{"External id": 5}),
        _x("cpu_op", "aten::mm", 10.0, 80.0, 100, 1, **{"External id": 6}),
        _x("gpu_user_annotation", "forward", 20.0, 40.0, 0, 7, **{"External id": 5}),
        _x("kernel", "gemm", 20.0, 30.0, 0, 7, device=0, stream=7, correlation=1),
        _x("kernel", "add", 52.0, 8.0, 0, 7, device=0, stream=7, correlation=2),
        _x("user_annotation", "backward", 200.0, 100.0, 100, 1, **{"External id": 7}),
        _x("cpu_op", "aten::ones_like", 200.0, 10.0, 100, 1, **{"External id": 8}),
        _x("gpu_user_annotation", "backward", 230.0, 1.0, 0, 7, **{"External id": 7}),
        _x("kernel", "fill", 230.0, 1.0, 0, 7, device=0, stream=7, correlation=3),
        _x("kernel", "mm_backward", 240.0, 30.0, 0, 7, device=0, stream=7, correlation=4),
        _x("cpu_op", "MmBackward0", 220.0, 30.0, 100, 2),
        _x("cpu_op", "AddBackward0", 260.0, 30.0, 100, 2),
        _x("cpu_op", "AccumulateGrad", 295.0, 25.0, 100, 2),
    ]))


def test_a_range_whose_self_time_is_a_wait_for_another_thread(tmp_path):
    w = ts.range_waits(_ranges_trace(tmp_path)).set_index("key")
    assert w.loc["backward", "self_cpu_us"] == pytest.approx(90) and w.loc["forward", "self_cpu_us"] == pytest.approx(20)
    assert w.loc["backward", "elsewhere_us"] == pytest.approx(30 + 30 + 5)  # thread 2's operators, clipped at 300 us
    assert w.loc["backward", "elsewhere_share"] == pytest.approx(65 / 90) and w.loc["forward", "elsewhere_share"] == 0
    assert list(w.index) == ["backward", "forward"]  # largest self time first


def test_a_range_s_gpu_projection_holds_only_what_its_own_thread_launched(tmp_path):
    p = ts.range_projections(_ranges_trace(tmp_path)).set_index("key")
    assert p.loc["forward", "cpu_us"] == pytest.approx(100) and p.loc["forward", "gpu_us"] == pytest.approx(40)
    assert p.loc["forward", "gpu_work"] == 2 and sorted(p.loc["forward", "work_names"]) == ["add", "gemm"]
    assert p.loc["backward", "gpu_us"] == pytest.approx(1) and p.loc["backward", "work_names"] == ["fill"]


def test_step_summary_by_window_and_by_thread(tmp_path):
    t = tt.read_trace(write(tmp_path, gpu_events()))
    w = ts.step_summary(t, rule="window").set_index("step")
    assert w.loc[4, "launches"] == 2 and w.loc[4, "gpu_busy_ms"] == pytest.approx(0.014)
    assert w.loc[4, "gpu_span_ms"] == pytest.approx(0.034)  # 1030 .. 1064 us
    assert w.loc[5, "launches"] == 2 and w.loc[5, "busy_share"] == pytest.approx(30 / 40)
    by_thread = ts.step_summary(t, rule="thread").set_index("step")
    assert by_thread.loc[5, "launches"] == 0  # launched from the autograd thread: nsys's rule misses them


def test_correlation_recovered_from_flows_when_arguments_lack_it(tmp_path):
    t = tt.read_trace(write(tmp_path, gpu_events(correlation_args=False)))
    assert list(t.kernels()["correlationId"]) == [11, 13, 14]
    assert list(ts.launch_latency(t)) == [15_000, 30_000, 50_000]


def test_older_category_spellings_are_read_as_today_s(tmp_path):
    ev = [dict(e, cat={"kernel": "Kernel", "cuda_runtime": "Runtime", "cpu_op": "Operator"}.get(e.get("cat"), e.get("cat")))
          for e in gpu_events()]
    t = tt.read_trace(write(tmp_path, ev))
    assert len(t.kernels()) == 3 and len(t.runtime_calls()) == 4 and len(t.cpu_ops()) == 1


def test_unknown_categories_and_arguments_are_kept(tmp_path):
    ev = gpu_events() + [_x("mtia_runtime", "something", 1000.0, 1.0, 100, 1, novel=3)]
    ev[5]["args"]["est. achieved occupancy %"] = 50
    t = tt.read_trace(write(tmp_path, ev))
    assert t.events("other")["novel"].tolist() == [3]
    assert "est. achieved occupancy %" in t.kernels().columns
    assert t.categories["mtia_runtime"] == 1


def test_a_bare_event_list_is_a_trace_too(tmp_path):
    path = tmp_path / "list.json"
    path.write_text(json.dumps(gpu_events()))
    assert len(tt.read_trace(path).kernels()) == 3


def test_an_unknown_schema_version_is_read_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match="schemaVersion 99.*checked on \\[1\\]"):
        t = tt.read_trace(write(tmp_path, gpu_events(), schemaVersion=99))
    assert len(t.kernels()) == 3


@pytest.mark.parametrize("content, message", [
    (b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "na', "not complete JSON (it ends early, mid-event)"),
    (b'{"a": 1}', "not a PyTorch profiler trace"),
    (b"SQLite format 3\x00", "it is an SQLite database (an Nsight Systems export?"),
    (b"\x80\x04\x95 pickled", "it is a Python pickle (a CUDA memory snapshot?"),
    (b"Name,Calls,Total\nconv,3,4.5\n", "text that does not start like JSON ('Name,Calls,Total', CSV?)"),
    (b"<html><body>404</body></html>", "it is HTML or XML"),
])
def test_bad_files_get_one_sentence(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(GpuprofError, match=re.escape(message)):
        tt.read_trace(path)


def test_truncated_gzip_and_missing_file(tmp_path):
    path = write(tmp_path, gpu_events(), gz=True)
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(GpuprofError, match="damaged or truncated gzip"):
        tt.read_trace(path)
    with pytest.raises(GpuprofError, match="does not exist"):
        tt.read_trace(tmp_path / "nope.json")


# ---- the stored GPU traces of chapter 5 (H100), with key_averages records from the same runs -----------

CH05 = Path(__file__).resolve().parents[1] / "artifacts" / "ch05"


@pytest.mark.parametrize("name", ["train_steps", "small_steps"])
def test_kernel_totals_of_a_stored_gpu_trace_equal_key_averages_self_device_time(name):
    t = tt.read_trace(CH05 / f"{name}.json.gz")
    assert t.has_gpu_activity and len(t.kernels()) > 100
    records = tk.load_records(CH05 / f"{name}.key_averages.json").set_index("key")
    ks = ts.kernel_summary(t).set_index("name")
    both = ks.join(records[["count", "self_device_us"]], how="inner")
    assert len(both) == len(ks)  # every kernel of the trace is a row of key_averages
    assert (both["calls"] == both["count"]).all()
    assert np.allclose(both["total_us"], both["self_device_us"], atol=0.002)  # the trace's 3 decimals of a us
    ops = ts.op_summary(t).set_index("key")[["calls"]].join(records[["count"]], how="inner")
    assert len(ops) > 50 and (ops["calls"] == ops["count"]).all()


def test_steps_of_a_stored_gpu_trace_launch_the_same_work():
    steps = ts.step_summary(tt.read_trace(CH05 / "train_steps.json.gz"), rule="window")
    assert steps["step"].tolist() == [4, 5, 6]
    assert steps["launches"].nunique() == 1 and (steps["gpu_busy_ms"] > 0).all()
    assert (steps["gpu_busy_ms"] <= steps["gpu_span_ms"] + 1e-9).all()


def test_self_cpu_by_thread_partitions_each_threads_time():
    """On the course's GPU trace: the main thread's self time is the steps' wall time; autograd's thread adds more."""
    trace = tt.read_trace(CH05 / "train_steps.json.gz")
    per_thread = ts.op_summary(trace, by="thread").set_index("thread")["self_cpu_us"]
    main = trace.steps()["globalTid"].iloc[0]
    steps_us = ts.step_summary(trace, rule="window")["cpu_ms"].sum() * 1e3
    assert len(per_thread) == 2 and per_thread[main] == pytest.approx(steps_us, rel=1e-3)
    assert per_thread.sum() == pytest.approx(ts.op_summary(trace)["self_cpu_us"].sum())
    assert per_thread.sum() > 1.3 * steps_us
    with pytest.raises(ValueError, match="by must be"):
        ts.op_summary(trace, by="stream")


def test_steps_by_a_name_pattern_when_there_is_no_profiler_step(cpu_run):
    trace, _, _ = cpu_run
    default = trace.steps()
    by_name = trace.steps("train_step")  # no group: numbered in time order
    assert list(by_name["step"]) == [0, 1] and len(by_name) == len(default)
    # each train_step range lies inside its ProfilerStep range
    assert (by_name["start"].to_numpy() >= default["start"].to_numpy()).all()
    assert (by_name["end"].to_numpy() <= default["end"].to_numpy()).all()
    numbered = trace.steps(r"ProfilerStep#(\d+)")
    assert list(numbered["step"]) == list(default["step"])
    assert trace.steps("no_such_range").empty
    assert list(ts.step_summary(trace, pattern="train_step", rule="window")["step"]) == [0, 1]


def test_kernel_operators_of_a_stored_gpu_trace_agree_with_each_kernels_lineage():
    trace = tt.read_trace(CH05 / "train_steps.json.gz")
    ops = ts.kernel_operators(trace)
    kernels = trace.kernels()
    assert ops.index.equals(kernels.index) and ops.notna().mean() > 0.9  # almost every kernel has its operator
    for label in kernels["duration_ns"].nlargest(5).index:  # the longest kernels, followed one by one
        assert ops[label] == ts.kernel_lineage(trace, label)["operator"]["name"]
    assert ops[kernels["name"].str.contains("conv|wgrad|dgrad|fprop", case=False)].str.contains("conv").all()


def test_the_stored_trace_s_ranges_backward_waits_and_projects_onto_one_kernel():
    """The chapter's batch-256 trace: ``backward``'s self time is mostly autograd's thread at work, and its
    GPU projection (like each ``ProfilerStep``'s) holds one piece of work while ``forward``'s holds all of its own."""
    from gpuprof.torch_profiler import diagnose

    trace = tt.read_trace(CH05 / "train_steps.json.gz")
    w = ts.range_waits(trace).set_index("key")["elsewhere_share"]
    assert w["backward"] > 0.5 and w["forward"] == 0
    p = ts.range_projections(trace).set_index("key")
    assert p.loc["backward", "gpu_work"] == 1 and p.loc["ProfilerStep*", "gpu_work"] == 1
    assert p.loc["backward", "gpu_us"] < 2 and p.loc["forward", "gpu_us"] > 500 and p.loc["forward", "gpu_work"] > 10
    lines = diagnose.report(trace).splitlines()
    marked = [line for line in lines if "a wait, not work" in line]
    assert len(marked) == 1 and marked[0].split("x  ")[1].startswith("backward")


def test_waves_of_the_longest_kernel_of_the_stored_trace():
    """max_pool_backward_nchw: 65,536 blocks of 256 threads on 132 SMs; 8 fit on an SM at once (warps and
    registers both allow 8, and Kineto's occupancy estimate says 100%): 62 waves, not the 496.5 blocks per SM."""
    trace = tt.read_trace(CH05 / "train_steps.json.gz")
    w = ts.kernel_waves(trace, ts.kernel_lineage(trace)["kernel"])
    assert w["blocks"] == 65_536 and w["sms"] == 132 and w["blocks_per_sm"] == pytest.approx(496.485, abs=1e-3)
    assert w["resident"] == w["warp_limit"] == w["register_limit"] == 8
    assert w["waves"] == pytest.approx(65_536 / 132 / 8)
    small = trace.kernels()[trace.kernels()["grid"].map(lambda g: int(np.prod(g))) < 132].iloc[0]
    assert ts.kernel_waves(trace, small)["resident"] is None and np.isnan(ts.kernel_waves(trace, small)["waves"])


def test_a_fractional_flow_id_leaves_the_correlation_missing_not_a_crash():
    """Kineto writes whole-number flow ids; a trace with a fractional one (hand-made, or from another writer)
    fills no correlation from it, and the events that match whole ids still get theirs."""
    from gpuprof.torch_profiler.kineto_schema import _correlation_from_flows

    t = pd.DataFrame({"pid": [1, 1], "tid": [2, 2], "start": [100, 200]})
    flows = pd.DataFrame({"cat": ["ac2g", "ac2g"], "phase": ["f", "f"], "pid": [1, 1], "tid": [2, 2],
                          "ts": [100, 200], "id": [0.5, 7.0]})
    _correlation_from_flows(t, flows, gpu=True)
    assert t["correlationId"].isna().tolist() == [True, False] and t["correlationId"].iloc[1] == 7
