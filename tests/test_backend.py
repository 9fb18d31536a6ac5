import pytest

from gpuprof import choose_backend, describe_machine
from gpuprof.backend import MachineInfo
from gpuprof.errors import GpuprofError


def test_cpu_machine_falls_back_to_cpu_and_says_so():
    backend = choose_backend()
    assert backend.device == "cpu" and not backend.is_gpu
    assert describe_machine().summary().startswith("CPU only (no CUDA GPU visible)")


def test_forced_cpu_backend(monkeypatch):
    monkeypatch.setenv("GPUPROF_BACKEND", "cpu")
    assert choose_backend().device == "cpu"


@pytest.mark.parametrize("name", ["torch", "cupy"])
def test_forcing_an_unavailable_gpu_backend_is_an_error_not_a_silent_fallback(name):
    with pytest.raises(GpuprofError, match="asked for, but not found"):
        choose_backend(name)


def test_unknown_backend_name():
    with pytest.raises(GpuprofError, match="Unknown backend 'tpu'"):
        choose_backend("tpu")


def test_gpu_summary_names_gpu_driver_link_and_libraries():
    info = MachineInfo(backend="torch", device="cuda", gpu_name="NVIDIA H200", driver_version="580.159.04",
                       cuda_runtime="13.0", compute_capability="9.0", gpu_memory_gib=139.8, sm_count=132,
                       pcie_gen=5, pcie_width=16, libraries={"torch": "2.11.0+cu130"})
    s = info.summary()
    for part in ("NVIDIA H200", "driver 580.159.04", "CUDA runtime 13.0", "139.8 GiB", "132 SMs", "sm_90",
                 "PCIe gen5 x16", "torch 2.11.0+cu130"):
        assert part in s
