"""gpuprof.torch_profiler reads traces of programs the course did not write (tests/data/third_party/README.md):
other models, other PyTorch versions, an AMD GPU, a Triton kernel launched through the driver API, no GPU at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprof.torch_profiler import diagnose, kernel_summary, launch_latency, op_summary, read_trace, step_summary

DATA = Path(__file__).resolve().parent / "data" / "third_party"


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
