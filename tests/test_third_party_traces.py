"""gpuprof.torch_profiler reads traces of programs the course did not write (tests/data/third_party/README.md):
other models, other PyTorch versions, an AMD GPU, a Triton kernel launched through the driver API, no GPU at all."""

from __future__ import annotations

from contextlib import contextmanager

from pathlib import Path

import numpy as np
import pytest

from gpuprof.torch_profiler import diagnose, kernel_summary, launch_latency, op_summary, read_trace, step_summary

DATA = Path(__file__).resolve().parent / "data" / "third_party"
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name, gpu, kernels", [("hta_alexnet_a100", "NVIDIA A100", 79),
                                               ("hta_minitoy_mi250", "AMD", 14),
                                               ("hta_triton_a100", "NVIDIA A100", 1)])
def test_gpu_traces_of_other_programs(name, gpu, kernels):
    t = read_trace(DATA / f"{name}.json.gz")
    assert gpu in t.describe() and len(t.kernels()) == kernels
    ks = kernel_summary(t)
    assert ks["calls"].sum() == kernels and ks["total_us"].sum() * 1e3 == pytest.approx(t.kernels()["duration_ns"].sum())
    lat = launch_latency(t)  # every kernel found its launching call (runtime or driver API) by correlation id
    assert len(lat) == kernels and (lat >= 0).all()
    assert len(op_summary(t)) > 0


def test_a_triton_kernel_is_linked_to_its_driver_call():
    t = read_trace(DATA / "hta_triton_a100.json.gz")
    calls = t.runtime_calls()
    launch = calls[calls["correlationId"] == t.kernels()["correlationId"].iloc[0]]
    assert launch["name"].str.startswith("cuLaunchKernel").all() and len(launch) == 1


def test_steps_and_checks_on_another_program_s_training_loop():
    t = read_trace(DATA / "hta_minitoy_mi250.json.gz")
    steps = step_summary(t, rule="window")
    # step 1 launched the 14 kernels and 2 copies (HIP calls: hipLaunchKernel, hipMemcpyWithStream...);
    # step 2 is a 49 us range at the end of the capture that launched nothing
    assert steps["step"].tolist() == [1, 2] and steps["launches"].tolist() == [16, 0]
    checks = diagnose.checks(t)
    assert set(checks["check"]) == {"gpu_idle", "tiny_kernels", "sync_wait", "copies", "pageable_copies"}


def test_a_cpu_only_trace_of_another_program():
    t = read_trace(DATA / "hta_cpu_only.json.gz")
    assert not t.has_gpu_activity and kernel_summary(t).empty and len(t.steps()) == 1
    assert diagnose.checks(t).empty


# ---- Holistic Trace Analysis 0.5 on the same files: the same idle time and kernel breakdown ----------------

HTA_EXACT = [REPO / "artifacts" / "ch05" / "train_steps.json.gz", REPO / "artifacts" / "ch05" / "small_steps.json.gz",
             REPO / "artifacts" / "ch08" / "ddp_trace_rank0.json.gz", REPO / "artifacts" / "ch08" / "ddp_trace_rank1.json.gz",
             DATA / "hta_minitoy_mi250.json.gz"]


@contextmanager
def _hta_analysis(path, tmp_path):
    """HTA 0.5's TraceAnalysis of one trace, copied alone into a folder, with HTA's logging and warnings silenced:
    it logs its rounding at WARNING on every trace, and its pandas calls raise deprecations that are not ours."""
    import logging
    import shutil
    import warnings

    from hta.trace_analysis import TraceAnalysis

    folder = tmp_path / "trace"
    folder.mkdir()
    shutil.copy(path, folder)
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield TraceAnalysis(trace_dir=str(folder))
    finally:
        logging.disable(logging.NOTSET)


def _hta(path, tmp_path):
    """HTA's temporal breakdown (None where HTA stops on its own assertion) and kernel breakdown of one trace."""
    with _hta_analysis(path, tmp_path) as ta:
        try:
            temporal = ta.get_temporal_breakdown(visualize=False).iloc[0]
        except AssertionError:  # HTA's check that non-compute time is not negative: see the test below
            temporal = None
        _, kernels = ta.get_gpu_kernel_breakdown(visualize=False, num_kernels=100_000, duration_ratio=1.0,
                                                 include_memory_kernels=True)
    return temporal, kernels.set_index("name")


@pytest.mark.parametrize("path", HTA_EXACT, ids=lambda p: p.name)
def test_idle_time_and_kernel_breakdown_equal_htas(path, tmp_path):
    from gpuprof.torch_profiler import hta_compat as hc

    temporal, kernels = _hta(path, tmp_path)
    t = read_trace(path)
    mine = hc.temporal_breakdown(t, rounding="hta", include_sync=True)
    if temporal is None:
        # HTA 0.5 stops on its own assertion (non_compute_time >= 0) only when its rounding (start up, end down)
        # has given some GPU event a negative duration: a copy or memset shorter than a microsecond that lies
        # inside one. Chapter 5's training trace of 2026-11-26 has three such memsets; the others here have none
        # that break the check. The kernel breakdown below still holds, negative sums included.
        w = hc.gpu_intervals(t, rounding="hta", include_sync=True)
        assert (w["end"] < w["start"]).any()
    else:
        assert mine["idle_us"] == temporal["idle_time(us)"] and mine["span_us"] == temporal["kernel_time(us)"]
    kb = hc.kernel_breakdown(t, rounding="hta", include_sync=True).set_index("name")
    both = kernels.join(kb, how="outer")
    assert len(both) == len(kernels) == len(kb)
    for theirs, ours in [("sum (us)", "sum_us"), ("min (us)", "min_us"), ("max (us)", "max_us"), ("mean (us)", "mean_us")]:
        assert np.allclose(both[theirs], both[ours]), theirs
    # and HTA's rounding is what separates its idle time from the file's nanoseconds: never less idle
    exact = hc.temporal_breakdown(t)
    assert exact["idle_us"] <= mine["idle_us"] and abs(exact["span_us"] - mine["span_us"]) <= 2
    # the streaming reader of the file gives the same answers as the whole Trace
    for rounding, sync in (("hta", True), ("ns", False)):
        a, b = hc.temporal_breakdown(t, rounding=rounding, include_sync=sync), hc.temporal_breakdown(path, rounding=rounding,
                                                                                                      include_sync=sync)
        assert a == pytest.approx(b)
        ka = hc.kernel_breakdown(t, rounding=rounding, include_sync=sync).sort_values("name", ignore_index=True)
        kb = hc.kernel_breakdown(hc.gpu_events(path), rounding=rounding, include_sync=sync).sort_values("name", ignore_index=True)
        assert (ka["name"] == kb["name"]).all() and np.allclose(ka.drop(columns="name"), kb.drop(columns="name"))


@pytest.mark.parametrize("path", HTA_EXACT, ids=lambda p: p.name)
def test_without_its_rounding_hta_gives_the_files_nanoseconds(path, tmp_path, monkeypatch):
    """HTA_DISABLE_NS_ROUNDING=1 (hta/configs/env_options.py, read by trace_parser.round_down_time_stamps) switches
    the rounding off: HTA then reads the file's nanoseconds as float microseconds, its temporal breakdown runs
    on chapter 5's training trace too (where the rounding makes it stop), and it equals gpuprof's default answer
    to float precision."""
    from gpuprof.torch_profiler import hta_compat as hc

    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    temporal, kernels = _hta(path, tmp_path)
    assert temporal is not None
    mine = hc.temporal_breakdown(read_trace(path), include_sync=True)
    assert temporal["idle_time(us)"] == pytest.approx(mine["idle_us"], abs=0.01)
    assert temporal["kernel_time(us)"] == pytest.approx(mine["span_us"], abs=0.01)
    kb = hc.kernel_breakdown(read_trace(path), include_sync=True).set_index("name")
    both = kernels.join(kb, how="inner")
    assert len(both) == len(kb) and np.allclose(both["sum (us)"], both["sum_us"], atol=0.01)


def test_on_epoch_timestamps_hta_and_gpuprof_differ_only_by_float_precision(tmp_path):
    """HTA's AlexNet trace has absolute timestamps (1.7e15 us), which float64 holds to ~0.25 us."""
    from gpuprof.torch_profiler import hta_compat as hc

    temporal, _ = _hta(DATA / "hta_alexnet_a100.json.gz", tmp_path)
    mine = hc.temporal_breakdown(read_trace(DATA / "hta_alexnet_a100.json.gz"), rounding="hta", include_sync=True)
    assert abs(mine["idle_us"] - temporal["idle_time(us)"]) / temporal["idle_time(us)"] < 1e-4
    assert abs(mine["span_us"] - temporal["kernel_time(us)"]) <= 2


def test_the_streaming_reader_refuses_what_is_not_a_trace(tmp_path):
    from gpuprof.errors import GpuprofError
    from gpuprof.torch_profiler import hta_compat as hc

    bad = tmp_path / "x.json"
    bad.write_text('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "na')
    with pytest.raises(GpuprofError, match="not complete JSON"):
        hc.gpu_events(bad)
    other = tmp_path / "y.json"
    other.write_text('{"a": 1}')
    with pytest.raises(GpuprofError, match="not a PyTorch profiler trace"):
        hc.gpu_events(other)


@pytest.mark.parametrize("rank", [0, 1])
def test_comm_comp_overlap_equals_htas(rank, tmp_path):
    from gpuprof.torch_profiler import hta_compat as hc

    path = REPO / "artifacts" / "ch08" / f"ddp_trace_rank{rank}.json.gz"
    with _hta_analysis(path, tmp_path) as ta:
        theirs = ta.get_comm_comp_overlap(visualize=False)
    ours = hc.comm_comp_overlap(path, rounding="hta", include_sync=True)
    assert round(100 * ours, 2) == theirs["comp_comm_overlap_pctg"].iloc[0]


@pytest.mark.parametrize("path", HTA_EXACT, ids=lambda p: p.name)
def test_idle_time_breakdown_equals_htas(path, tmp_path):
    """HTA 0.5's get_idle_time_breakdown (host wait, kernel wait, other, per stream) against hta_compat's, on HTA's
    rounding and default threshold: every category's idle time equal; a category HTA leaves out has no gap here."""
    from gpuprof.torch_profiler import hta_compat as hc

    with _hta_analysis(path, tmp_path) as ta:
        theirs, _ = ta.get_idle_time_breakdown(ranks=list(ta.t.traces), visualize=False)
    ours = hc.idle_time_breakdown(path, rounding="hta")
    both = ours.merge(theirs.rename(columns={"stream": "streamId", "idle_category": "category"}),
                      on=["streamId", "category"], how="left")
    assert set(theirs["idle_category"]) <= set(hc.IDLE_CATEGORIES) and len(theirs) <= len(ours)
    missing = both["idle_time"].isna()
    assert (both.loc[missing, "gaps"] == 0).all()
    assert np.array_equal(both.loc[~missing, "idle_us"], both.loc[~missing, "idle_time"])
    assert np.allclose(both.loc[~missing, "idle_share"].round(2), both.loc[~missing, "idle_time_ratio"])
    # a threshold of 0 leaves no kernel wait: those gaps move to "other", and the streams' totals stay
    none = hc.idle_time_breakdown(path, rounding="hta", kernel_wait_us=0)
    assert (none.loc[none["category"] == "kernel_wait", "gaps"] == 0).all()
    assert np.allclose(none.groupby("streamId")["idle_us"].sum(), ours.groupby("streamId")["idle_us"].sum())
