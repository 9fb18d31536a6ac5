import types

import pytest

from gpuprof.studies import speed_of_light as sol
from gpuprof.errors import GpuprofError


def test_cpu_measurement_with_small_sizes():
    figs = sol.measure(copy_bytes=1 << 20, matmul_n=64, repeats=2, launches=50, progress=None)
    keys = [f.key for f in figs]
    assert keys == ["host_memcpy", "matmul_fp32", "launch"]
    assert all(f.value > 0 for f in figs)
    assert "1 MiB, median of 2, perf_counter" in figs[0].how


@pytest.mark.parametrize("kwargs", [{"copy_bytes": -1}, {"repeats": -2}, {"launches": -5}, {"matmul_n": -8}])
def test_bad_sizes(kwargs):
    with pytest.raises(GpuprofError, match="must be positive"):
        sol.measure(progress=None, **kwargs)


def test_cpu_figures_are_never_saved_as_gpu_ceilings(isolated_dirs):
    figs = sol.measure(copy_bytes=1 << 20, matmul_n=32, repeats=1, launches=10, progress=None)
    with pytest.raises(GpuprofError, match="Refusing to save CPU figures"):
        sol.save(figs, command="test")


def test_reference_figures_load_with_provenance():
    figs, found = sol.load(prefer="reference")
    assert found.source == "reference" and found.machine["gpu_name"].startswith("NVIDIA")
    f = sol.by_key(figs)
    assert {"h2d_pinned", "h2d_pageable", "d2h_pinned", "d2d", "matmul_fp32", "launch"} <= set(f)
    table = sol.format_table(figs)
    assert table.splitlines()[0].startswith("figure") and "H2D copy, pinned host memory" in table


@pytest.mark.parametrize("gen,width,gbps", [(5, 16, 63.015), (4, 16, 31.508), (3, 8, 7.877), (2, 16, 8.0)])
def test_pcie_raw_rate(gen, width, gbps):
    assert sol.pcie_theoretical_gbps(gen, width) == pytest.approx(gbps, abs=1e-3)


@pytest.mark.parametrize("gen,width", [(None, 16), (5, None), (7, 16)])
def test_pcie_unknown_link(gen, width):
    assert sol.pcie_theoretical_gbps(gen, width) is None


# ---- the specified peaks and the "of peak" column (review item 5) ----------------------------------------

def test_datasheet_peaks_by_exact_name_and_none_for_other_boards():
    model, sheet = sol.datasheet_of("NVIDIA H100 80GB HBM3")
    assert model == "H100 SXM" and (sheet["hbm_gbps"], sheet["bf16_dense_tflops"], sheet["fp32_tflops"]) == (3350.0, 989.4, 67.0)
    assert sol.datasheet_of("NVIDIA H200")[1]["hbm_gbps"] == 4800.0
    # other products whose names contain a known one: no peak rather than a wrong one
    for name in ("NVIDIA H200 NVL", "NVIDIA GH200 480GB", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA A100-SXM4-80GB", None):
        assert sol.datasheet_of(name) is None and sol.datasheet_bf16_tflops(name) is None


def _found(machine, data, tmp_path):
    import json

    from gpuprof.artifacts import FoundCapture

    path = tmp_path / "speed_of_light.json"
    path.write_text(json.dumps(data))
    return FoundCapture(path, "reference", {"machine": machine})


FIGS = [{"key": "h2d_pinned", "label": "H2D copy, pinned host memory", "value": 50.0, "unit": "GB/s", "how": "h", "spread": 0.01},
        {"key": "duplex_pinned", "label": sol.DUPLEX_LABEL, "value": 100.0, "unit": "GB/s", "how": "h", "spread": 0.01},
        {"key": "d2d", "label": sol.D2D_LABEL, "value": 2000.0, "unit": "GB/s", "how": "h", "spread": 0.01},
        {"key": "matmul_bf16", "label": "bf16 matmul", "value": 500.0, "unit": "TFLOP/s", "how": "h", "spread": 0.01},
        {"key": "launch", "label": "launch", "value": 8.0, "unit": "us", "how": "h", "spread": 0.2}]


def test_peaks_of_the_reference_figures_give_the_shares_the_review_recomputed():
    figs, found = sol.load(prefer="reference")
    table = sol.format_table(figs, sol.peaks(found))
    rows = {line[:46].strip(): line for line in table.splitlines()}
    # the reference of 2026-11-26 (H100 SXM): its own memory record is the device copy's peak
    assert "89% [3]" in rows[sol.D2D_LABEL] and "79% [4]" in rows["bf16 matmul 8192^3"]
    assert "88% [1]" in rows["H2D copy, pinned host memory"] and "74% [2]" in rows[sol.DUPLEX_LABEL]
    assert rows["Eager launch of a tiny PyTorch kernel"].split("%", 1)[1].split()[0] == "-"
    assert "  [3] 3,352.3 GB/s, the GPU's own record" in table
    assert table.splitlines()[0].split()[4:6] == ["of", "peak"]


def test_the_gpus_own_memory_record_wins_over_the_datasheet_and_an_unknown_gpu_says_so(tmp_path):
    h100 = {"gpu_name": "NVIDIA H100 80GB HBM3", "pcie_gen": 5, "pcie_width": 16}
    recorded = _found(h100, {"figures": FIGS, "device": {"memory_bandwidth_gbps": 4000.0}}, tmp_path)
    p = sol.peaks(recorded)
    assert p["d2d"].value == 4000.0 and "own record" in p["d2d"].source
    assert p["duplex_pinned"].value == pytest.approx(2 * p["h2d_pinned"].value)
    table = sol.format_table([sol.Figure.from_dict(d) for d in FIGS], p)
    assert "50% [" in table.splitlines()[3]  # 2000 of 4000 GB/s
    other = sol.peaks(_found({"gpu_name": "NVIDIA A100-SXM4-80GB"}, {"figures": FIGS}, tmp_path))
    assert other["d2d"].value is None and other["matmul_bf16"].value is None and other["h2d_pinned"].value is None
    text = sol.format_table([sol.Figure.from_dict(d) for d in FIGS], other)
    assert "unknown [" in text and "no datasheet for NVIDIA A100-SXM4-80GB" in text


def test_the_table_without_peaks_keeps_its_columns():
    figs, _ = sol.load(prefer="reference")
    assert sol.format_table(figs).splitlines()[0].split() == ["figure", "value", "unit", "spread", "how"]


# ---- the device record: clocks and the GPU's own memory peak (review items 4 and 6) ------------------------

def test_no_device_record_without_a_gpu():
    from gpuprof.backend import choose_backend

    assert sol.device_record(choose_backend("cpu")) is None


def test_the_reference_names_its_host_and_the_clocks_under_load():
    _, found = sol.load(prefer="reference")
    text = sol.format_device(found)
    assert text.startswith("host: ") and "logical cores" in text and "a virtual machine" in text
    assert "GPU clocks under load (nvidia-smi" in text and "GPU memory's peak as the GPU reports it" in text


def test_a_saved_record_is_shown_in_words(tmp_path):
    device = {"memory_bandwidth_gbps": 3352.32, "memory_bandwidth_how": "how", "clocks_how": "nvidia-smi, read while x",
              "clocks": {"sm_mhz": "1980", "max_sm_mhz": "1980", "memory_mhz": "2619", "max_memory_mhz": "2619",
                         "persistence_mode": "Enabled", "event_reasons": "0x0000000000000004"}}
    machine = {"gpu_name": "NVIDIA H100 80GB HBM3", "cpu_model": "Xeon", "cpu_count": 16, "cpu_mhz": 2100.0,
               "virtual_machine": True}
    text = sol.format_device(_found(machine, {"figures": FIGS, "device": device}, tmp_path))
    assert "host: Xeon, 16 logical cores at 2.10 GHz, a virtual machine" in text
    assert "SM 1980 MHz (maximum 1980 MHz), memory 2619 MHz (maximum 2619 MHz)" in text
    assert "persistence mode Enabled; clock event reasons active: software power cap" in text
    assert "3,352 GB/s" in text


def test_figures_are_saved_with_their_device_record(isolated_dirs, monkeypatch):
    from gpuprof.backend import MachineInfo

    monkeypatch.setattr(sol, "describe_machine", lambda: MachineInfo(backend="torch", device="cuda", gpu_name="NVIDIA H200"))
    figs = [sol.Figure.from_dict(d) for d in FIGS]
    sol.save(figs, command="test", device={"memory_bandwidth_gbps": 4800.0, "clocks": None})
    loaded, found = sol.load()
    assert found.source == "this machine" and loaded == figs
    assert sol.saved_device(found) == {"memory_bandwidth_gbps": 4800.0, "clocks": None}


def test_device_record_reads_the_clocks_under_load_and_asks_for_the_first_gpu_when_its_uuid_is_refused(clean_tool_env):
    """A stand-in for PyTorch on a GPU (the products are counted, not run) and for nvidia-smi, which here
    refuses ``-i GPU-<uuid>`` as a driver that does not know the id would."""
    from types import SimpleNamespace

    from conftest import write_exe
    from gpuprof.backend import Backend

    write_exe(clean_tool_env / "nvidia-smi", r"""
for a in "$@"; do [ "$a" = "-i" ] && { echo "No devices were found"; exit 6; }; done
sleep 0.02
case "$1" in
  --query-gpu=clocks.current.sm|--query-gpu=clocks.max.sm) echo 1980 ;;
  --query-gpu=clocks.current.memory|--query-gpu=clocks.max.memory) echo 2619 ;;
  --query-gpu=persistence_mode) echo Enabled ;;
  --query-gpu=clocks_event_reasons.active) echo 0x0000000000000000 ;;
  *) exit 2 ;;
esac""")
    products = []

    class Matrix:
        def __matmul__(self, other):
            products.append(1)
            return self

    props = SimpleNamespace(uuid="58d7a9b6-0000-1111-2222-333344445555", memory_clock_rate=2_619_000, memory_bus_width=5120)
    torch = SimpleNamespace(randn=lambda *a, **k: Matrix(), bfloat16="bf16",
                            cuda=SimpleNamespace(get_device_properties=lambda i: props, synchronize=lambda: None))
    record = sol.device_record(Backend("torch", "cuda", torch), n=16)
    assert record["clocks"] == {"sm_mhz": "1980", "max_sm_mhz": "1980", "memory_mhz": "2619", "max_memory_mhz": "2619",
                                "persistence_mode": "Enabled", "event_reasons": "0x0000000000000000"}
    assert len(products) > 50, "products must keep running while nvidia-smi is asked"
    assert record["clocks_how"].startswith("nvidia-smi, read while bf16 16^3 products ran")
    assert record["memory_bandwidth_gbps"] == pytest.approx(3352.32)


def test_copy_series_measures_the_copy_count_times_with_readings_beside(monkeypatch):
    """copy_series: one row per measurement, in order, each with what sample() read; the busy copies between them."""
    from gpuprof.studies import speed_of_light as s

    calls = {"copies": 0, "measures": 0}

    class FakeXp:
        uint8 = "u8"

        @staticmethod
        def empty(n, dtype=None):
            return [0] * 4

        @staticmethod
        def empty_like(a):
            return list(a)

        @staticmethod
        def copyto(dst, src):
            calls["copies"] += 1

    class FakeBackend:
        name, xp, is_gpu = "cupy", FakeXp, True

        def synchronize(self):
            pass

    def fake_copy(backend, copy_bytes=None, repeats=None):
        calls["measures"] += 1
        return s.Figure("d2d", "copy", 1000.0 + calls["measures"], "GB/s", "test", 0.01)

    monkeypatch.setattr(s, "device_copy", fake_copy)
    clock = iter(range(10**6))  # a clock a millisecond apart at each reading: no real time, so no race on a busy machine
    monkeypatch.setattr(s, "time", types.SimpleNamespace(monotonic=lambda: next(clock) / 1000))
    rows = s.copy_series(FakeBackend(), 3, 0.01, sample=lambda: {"sm_mhz": 1980, "temp_c": 40}, copy_bytes=4)
    assert [r["gbps"] for r in rows] == [1001.0, 1002.0, 1003.0] and calls["measures"] == 3
    assert rows[0]["t_s"] <= rows[1]["t_s"] <= rows[2]["t_s"] and calls["copies"] >= 40  # two busy spells, 20 a batch
    assert rows[1]["sm_mhz"] == 1980 and rows[2]["temp_c"] == 40 and rows[0]["relative_spread"] == 0.01
    assert "sm_mhz" not in s.copy_series(FakeBackend(), 1, 0.0, copy_bytes=4)[0]  # no sampler: no readings invented
    with pytest.raises(s.GpuprofError, match="at least 1"):
        s.copy_series(FakeBackend(), 0, 1.0)
