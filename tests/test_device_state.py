"""The GPU's clocks read through nvidia-smi (a stand-in here), its event reasons in words, its own memory peak."""

from types import SimpleNamespace

import pytest

from conftest import write_exe
from gpuprof import device_state as ds
from gpuprof.artifacts import REPO_ROOT
from gpuprof.backend import Backend, choose_backend

# A stand-in nvidia-smi that answers each --query-gpu=NAME like the real one: a value, "[N/A]", or the error
# a driver gives for a field it does not know (the newer spellings here, so the fallbacks are used).
FAKE_SMI = r"""
sleep 0.05
case "$1" in
  --query-gpu=clocks.current.sm) echo 1980 ;;
  --query-gpu=clocks.max.sm) echo 1980 ;;
  --query-gpu=clocks.current.memory) echo 'Field "clocks.current.memory" is not a valid field to query.'; exit 2 ;;
  --query-gpu=clocks.mem) echo 2619 ;;
  --query-gpu=clocks.max.memory) echo 2619 ;;
  --query-gpu=persistence_mode) echo '[N/A]' ;;
  --query-gpu=clocks_event_reasons.active) echo 'Field "clocks_event_reasons.active" is not a valid field to query.'; exit 2 ;;
  --query-gpu=clocks_throttle_reasons.active) echo 0x0000000000000000 ;;
  *) exit 9 ;;
esac
"""


def test_clocks_are_read_field_by_field_with_fallbacks_while_the_gpu_is_kept_busy(clean_tool_env):
    write_exe(clean_tool_env / "nvidia-smi", FAKE_SMI)
    calls = []
    clocks = ds.read_clocks(lambda: calls.append(1))
    assert clocks == {"sm_mhz": "1980", "max_sm_mhz": "1980", "memory_mhz": "2619", "max_memory_mhz": "2619",
                      "persistence_mode": None, "event_reasons": "0x0000000000000000"}
    assert len(calls) > 0, "the work must go on while nvidia-smi answers"
    assert ds.describe_event_reasons(clocks["event_reasons"]) == "none"


def test_no_nvidia_smi_no_clocks(clean_tool_env):
    assert ds.read_clocks() is None


def test_a_hanging_nvidia_smi_is_killed_and_not_asked_again(clean_tool_env):
    log = clean_tool_env / "asked"
    write_exe(clean_tool_env / "nvidia-smi", f'echo "$1" >> {log}\nsleep 30')
    clocks = ds.read_clocks(timeout_s=0.2)
    assert clocks is not None and not any(clocks.values())
    assert log.read_text().splitlines() == ["--query-gpu=clocks.current.sm"], "a driver that hangs once is asked no more"


@pytest.mark.parametrize("mask,words", [
    ("0x0000000000000000", "none"),
    ("0x0000000000000004", "software power cap"),
    ("0x0000000000000041", "GPU idle, hardware thermal slowdown"),
    ("0x0000000000001000", "other bits 0x1000"),
    (None, "not reported"),
    ("Active", "Active"),
])
def test_event_reasons_in_words(mask, words):
    assert ds.describe_event_reasons(mask) == words


def test_the_memory_peak_is_the_one_nsys_records_for_the_same_gpu():
    """Memory clock x bus width x 2 transfers: with the H100's 2,619 MHz and 5,120 bits, exactly the
    memoryBandwidth of the reference capture's TARGET_INFO_GPU."""
    from gpuprof.nsys.sqlite import gpu_info

    props = SimpleNamespace(memory_clock_rate=2_619_000, memory_bus_width=5120)  # kHz, bits
    fake = SimpleNamespace(cuda=SimpleNamespace(get_device_properties=lambda i: props))
    gbps = ds.memory_bandwidth_gbps(Backend("torch", "cuda", fake))
    recorded = gpu_info(REPO_ROOT / "artifacts" / "ch00" / "tiny_kernels.sqlite.gz")["memoryBandwidth"].iloc[0]
    assert gbps == pytest.approx(recorded / 1e9, rel=1e-12)


def test_no_memory_peak_on_a_cpu():
    assert ds.memory_bandwidth_gbps(choose_backend("cpu")) is None
