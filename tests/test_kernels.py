"""The shared pieces of the example scripts: timing kernels, output files, memory checks."""

import argparse

import numpy as np
import pytest

from gpuprof import choose_backend
from gpuprof import kernels as gk
from gpuprof.cli import available_memory, output_file, require_memory
from gpuprof.errors import GpuprofError


def test_bench_times_checks_and_rates_each_variant():
    backend = choose_backend("cpu")
    a = np.ones(1 << 16, dtype=np.float32)
    out = np.empty_like(a)
    calls = []

    def launch():
        np.copyto(out, a)
        calls.append(1)

    results = gk.bench([gk.Variant("copy", "a copy", launch, 2 * a.nbytes, check=lambda: "result checked: yes")],
                       backend, warmup=2, repeats=5, progress=None)
    r = results[0]
    assert len(calls) == 7 and r.checked == "result checked: yes" and r.unit == "GB/s"
    assert r.q1_ms <= r.median_ms <= r.q3_ms and r.rate == pytest.approx(2 * a.nbytes / (r.median_ms / 1e3) / 1e9)
    table = gk.format_results(results, results[0], "vs itself")
    assert "a copy" in table and "1.00x" in table


def test_sample_rows_span_the_range_and_repeat():
    rows = gk.sample_rows(1000)
    assert rows[0] == 0 and rows[-1] == 999 and len(rows) <= 8 and rows == sorted(set(rows))
    assert gk.sample_rows(1000) == rows and gk.sample_rows(1) == [0]


def test_no_cupy_gpu_here_or_when_the_cpu_is_asked_for(monkeypatch):
    monkeypatch.setenv("GPUPROF_BACKEND", "cpu")
    assert gk.cupy_gpu() is None


def test_results_are_written_with_the_machine(tmp_path):
    path = tmp_path / "r.json"
    r = gk.Result("k", "kernel", 1.0, 0.9, 1.1, 5.0, "GB/s", "ok")
    gk.write_json(path, {"results": [r], "n": 4})
    import json

    data = json.loads(path.read_text())
    assert data["n"] == 4 and data["results"][0]["name"] == "k" and "device" in data["machine"]
    gk.write_json(None, {"ignored": True})  # no path: nothing written, no error


def test_output_file_is_checked_before_any_work(tmp_path):
    assert output_file(str(tmp_path / "x.json")) == tmp_path / "x.json"
    with pytest.raises(argparse.ArgumentTypeError, match="does not exist"):
        output_file(str(tmp_path / "missing" / "x.json"))
    with pytest.raises(argparse.ArgumentTypeError, match="is a folder"):
        output_file(str(tmp_path))


def test_sizes_beyond_the_machine_are_refused_in_a_sentence():
    free = available_memory("cpu")
    assert free is not None and free > 0
    require_memory(1024, "cpu", "A tiny buffer", "--size")
    with pytest.raises(GpuprofError, match=r"would take .* GiB of host memory, but only .* GiB is available.*--size-mib"):
        require_memory(free * 4, "cpu", "This run", "--size-mib")
