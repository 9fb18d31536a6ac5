"""The shared pieces of the example scripts: timing kernels, output files, memory checks."""

import argparse

import numpy as np
import pytest

from gpuprof import choose_backend
from gpuprof import kernels as gk
from gpuprof.cli import output_file, require_memory, shown_path
from gpuprof.memory_probe import available_memory
from gpuprof.errors import GpuprofError
from conftest import write_exe


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


def test_a_path_is_shown_relative_to_the_repository_when_it_lies_inside_it(tmp_path):
    from gpuprof.artifacts import REPO_ROOT

    assert shown_path(REPO_ROOT / "artifacts" / "ch05" / "t.json.gz") == "artifacts/ch05/t.json.gz"
    assert shown_path(tmp_path / "t.json") == "t.json (in a temporary folder)"  # a scratch file: its name only
    assert shown_path("/opt/elsewhere/t.json") == "/opt/elsewhere/t.json"  # anywhere else: as given


def test_sizes_beyond_the_machine_are_refused_in_a_sentence():
    free = available_memory("cpu")
    assert free is not None and free > 0
    require_memory(1024, "cpu", "A tiny buffer", "--size")
    with pytest.raises(GpuprofError, match=r"would take .* GiB of host memory, but only .* GiB is available.*--size-mib"):
        require_memory(free * 4, "cpu", "This run", "--size-mib")


# ----- running out of memory, whichever library ran out -----

class _CupyOutOfMemory(MemoryError):
    """Stands in for cupy.cuda.memory.OutOfMemoryError (a MemoryError of a module named cupy...)."""


_CupyOutOfMemory.__name__ = "OutOfMemoryError"
_CupyOutOfMemory.__module__ = "cupy.cuda.memory"


@pytest.mark.parametrize("exc, where, asked", [
    (MemoryError("Unable to allocate 97.7 GiB for an array with shape (26214400000,) and data type float32"), "host", "97.70"),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
                  "to allocate 26214400000 bytes. Error code 12 (Cannot allocate memory)"), "host", "24.41"),
    (RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
                  "1.50 GiB is free."), "GPU", "20.00"),
    (_CupyOutOfMemory("Out of memory allocating 1,073,741,824 bytes (allocated so far: 0 bytes)."), "GPU", "1.00"),
])
def test_out_of_memory_is_recognised_and_said_in_one_sentence(exc, where, asked):
    from gpuprof.errors import is_out_of_memory, out_of_memory_sentence

    assert is_out_of_memory(exc)
    text = out_of_memory_sentence(exc)
    assert text.startswith(f"out of {where} memory; one allocation asked for {asked} GiB")
    assert text.endswith("Choose smaller sizes (--help lists the options that set them).") and "\n" not in text


def test_other_errors_are_not_taken_for_out_of_memory():
    from gpuprof.errors import exit_on_error, is_out_of_memory

    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_out_of_memory(ValueError("out of memory"))  # a ValueError is a bug, whatever it says

    @exit_on_error
    def broken() -> None:
        raise RuntimeError("a real bug")

    with pytest.raises(RuntimeError, match="a real bug"):
        broken()


def test_exit_on_error_turns_out_of_memory_into_status_2(capsys):
    from gpuprof.errors import exit_on_error

    @exit_on_error
    def hungry() -> None:
        raise MemoryError("Unable to allocate 4.00 TiB for an array with shape (1,) and data type float32")

    with pytest.raises(SystemExit) as stop:
        hungry()
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("error: out of host memory; one allocation asked for 4,096.00 GiB")


def test_counts_above_a_stated_limit_are_refused():
    import argparse

    from gpuprof.cli import bounded_int

    count = bounded_int(1000, "it would take hours")
    assert count("1000") == 1000
    with pytest.raises(argparse.ArgumentTypeError, match=r"5,000 is above this script's limit of 1,000 \(it would take hours\)"):
        count("5000")
    with pytest.raises(argparse.ArgumentTypeError, match="must be at least 1"):
        count("0")
    assert bounded_int(10, "x", low=0)("0") == 0


def test_training_memory_bound_counts_what_autograd_keeps():
    """The bound counts what autograd keeps for backward, each tensor once, and the weights' states."""
    torch = pytest.importorskip("torch")
    from gpuprof.models import small_cnn, training_bytes

    bound = training_bytes(small_cnn, (3, 32, 32), 512, optimizer_states=0)
    # the saved tensors of small_cnn at batch 512, counted by hand: the input, the first ReLU's output, the first
    # pool's output and int64 indices, the second ReLU's output and the second pool's indices, the flattened
    # features; and the weights and their gradients (the Linear layer's transposed weight is the weight's memory)
    per_image = 4 * (3 * 32 * 32 + 64 * 32 * 32 + 64 * 16 * 16 + 128 * 16 * 16 + 128) + 8 * (64 * 16 * 16 + 128 * 8 * 8)
    params = sum(p.numel() for p in small_cnn().parameters()) * 4
    assert bound == 512 * per_image + 2 * params
    assert training_bytes(small_cnn, (3, 32, 32), 512, optimizer_states=2) == bound + 2 * params


# ---- finding nvcc and building a course .cu file (run on every machine, GPU or not) ----

def _program(path, executable: bool):
    """A stand-in nvcc (conftest.write_exe), with its execute bits taken away when ``executable`` is False."""
    write_exe(path, "exit 0")
    if not executable:
        path.chmod(0o644)
    return path


def test_find_nvcc_takes_an_executable_nvcc_env_var_first(tmp_path, monkeypatch):
    mine = _program(tmp_path / "cuda" / "nvcc", executable=True)
    on_path = _program(tmp_path / "bin" / "nvcc", executable=True)
    monkeypatch.setenv("NVCC", str(mine))
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert gk.find_nvcc() == str(mine)


def test_find_nvcc_skips_an_nvcc_env_var_that_cannot_run(tmp_path, monkeypatch):
    broken = _program(tmp_path / "cuda" / "nvcc", executable=False)
    on_path = _program(tmp_path / "bin" / "nvcc", executable=True)
    monkeypatch.setenv("NVCC", str(broken))
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert gk.find_nvcc() == str(on_path)
    monkeypatch.setenv("NVCC", str(tmp_path / "missing" / "nvcc"))
    assert gk.find_nvcc() == str(on_path)


@pytest.mark.parametrize("device,nvcc,reason", [
    ("cpu", "/some/nvcc", "there is no GPU on this machine"),
    ("cuda", None, "nvcc was not found"),
])
def test_build_cuda_example_without_a_gpu_or_nvcc_says_why_and_returns_none(monkeypatch, capsys, device, nvcc, reason):
    from types import SimpleNamespace

    from gpuprof.artifacts import REPO_ROOT

    monkeypatch.setattr(gk, "describe_machine", lambda: SimpleNamespace(device=device, compute_capability="9.0"))
    monkeypatch.setattr(gk, "find_nvcc", lambda: nvcc)
    source = next((REPO_ROOT / "examples").rglob("*.cu"))
    assert gk.build_cuda_example(source) is None
    said = capsys.readouterr().out
    assert f"Not building {source.name}: {reason}" in said


def test_build_cuda_example_on_this_machine_returns_none_without_a_gpu(capsys):
    from gpuprof.artifacts import REPO_ROOT

    if gk.describe_machine().device == "cuda":
        pytest.skip("this machine has a GPU: the build runs for real in the chapters' notebooks")
    source = next((REPO_ROOT / "examples").rglob("*.cu"))
    assert gk.build_cuda_example(source) is None
    assert "Not building" in capsys.readouterr().out


@pytest.mark.parametrize("exit_code", [0, 1])
def test_build_cuda_example_runs_nvcc_for_this_gpu_and_says_the_command(tmp_path, monkeypatch, capsys, exit_code):
    """The whole function on any machine: a stand-in nvcc (a shell script) plays the compiler."""
    from types import SimpleNamespace

    from gpuprof.artifacts import REPO_ROOT

    fake = tmp_path / "nvcc"
    fake.write_text(f"#!/bin/sh\necho 'error: stand-in' >&2\nexit {exit_code}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(gk, "describe_machine", lambda: SimpleNamespace(device="cuda", compute_capability="9.0"))
    monkeypatch.setattr(gk, "find_nvcc", lambda: str(fake))
    source = next((REPO_ROOT / "examples").rglob("*.cu"))
    built = gk.build_cuda_example(source)
    said = capsys.readouterr().out
    assert f"$ nvcc -arch=sm_90 -o {source.stem}" in said
    if exit_code == 0:
        assert built is not None and len(built) == 1 and built[0].endswith(source.stem)
    else:
        assert built is None and "nvcc failed: error: stand-in" in said
