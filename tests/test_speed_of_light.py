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
