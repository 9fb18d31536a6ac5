"""Helpers that several test modules share (``tests/`` is on ``sys.path`` under pytest): running a course script as
a program or in this process, and hand-built PyTorch profiler traces."""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from gpuprof.artifacts import REPO_ROOT
from gpuprof.fork_runs import run_all
from gpuprof.runner import load_script

EXAMPLES, SCRIPTS = REPO_ROOT / "examples", REPO_ROOT / "scripts"

# ----- running a course script -----


def run_script(script: Path, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """The script run as a program, from the repository's root, as a reader runs it."""
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO_ROOT)


class ForkedRun(NamedTuple):
    """One run of :func:`forked_json_runs`: it unpacks as ``status, output, result`` and reads as attributes."""

    status: str  # the process's exit status, as text
    output: str  # its stdout and stderr together
    result: dict[str, Any] | None  # its --json file, None when it wrote none


def forked_json_runs(script: Path, runs: dict[str, list[str]], folder: Path, *, timeout_s: float) -> dict[str, ForkedRun]:
    """``script`` once per named argument list, each with ``--json`` into ``folder``, each a process of its own forked
    from a server that imported the script (and PyTorch) once (:mod:`gpuprof.fork_runs`, as the chapters' studies run
    their configurations): separate processes, without one ``import torch`` each. The module fixtures that share a
    script's runs among their tests call this; tests/test_scripts.py still runs every script as a program."""
    names = list(runs)
    argvs = [[*runs[name], "--json", str(folder / f"run{i}.json")] for i, name in enumerate(names)]
    out = {}
    for i, status, _, output in run_all(script, argvs, timeout_s=timeout_s):
        path = folder / f"run{i}.json"
        out[names[i]] = ForkedRun(status, output, json.loads(path.read_text()) if path.exists() else None)
    return out


@dataclass
class InProcessRun:
    """What :func:`run_script_in_process` saw: the fields of a ``CompletedProcess`` that the tests read."""

    returncode: int
    stdout: str
    stderr: str


def _global_state() -> dict:
    """What a script could change for every later test in this process, other than the environment (which
    :func:`run_script_in_process` puts back): the working folder, running threads, and PyTorch's process-wide
    switches and process group."""
    state: dict = {"cwd": os.getcwd(), "threads": threading.active_count()}
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch"] = (torch.get_num_threads(), torch.get_default_dtype(), torch.is_grad_enabled(),
                          torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled(),
                          torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
                          torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
        state["process group"] = torch.distributed.is_available() and torch.distributed.is_initialized()
    return state


def _changes(before: dict, after: dict) -> dict:
    return {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v}


def run_script_in_process(script: Path, *args: str, capsys) -> InProcessRun:  # type: ignore[no-untyped-def]
    """The script's ``main(args)`` called in this process, as ``python script args...`` would call it.

    For the cases that fail (or print ``--help``) before any work: the exit status is ``SystemExit``'s code, the
    output is what ``capsys`` caught, and an exception that escapes ``main`` becomes a traceback on stderr and
    status 1, as it would in a process. The script is imported afresh each time (its module state is its own);
    ``sys.path``, ``sys.argv`` and the random generators are put back; and the test fails if the script changed
    anything else that outlives it (see :func:`_global_state`): a case that must change such things stays a
    subprocess. The modules it added under the course scripts' bare names are dropped. The environment is put back
    too: a script may set variables for itself (``torchrun_place`` sets ``RANK`` and ``WORLD_SIZE`` for a world of
    one) before it refuses an argument.
    """
    try:
        import torch  # noqa: F401  (loaded first, so that its switches are compared before and after)
    except ImportError:
        pass
    saved_path, saved_argv, saved_environ = list(sys.path), sys.argv, dict(os.environ)
    saved_modules = set(sys.modules)
    saved_random = random.getstate()
    numpy = sys.modules.get("numpy")
    saved_numpy_rng = numpy.random.get_state() if numpy is not None else None
    torch = sys.modules.get("torch")
    saved_torch_rng = torch.get_rng_state() if torch is not None else None
    capsys.readouterr()
    before = _global_state()
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.parent))  # as ``python script`` puts the script's folder first
    try:
        module = load_script(script)
        try:
            returned = module.main(list(args))
            code = returned if isinstance(returned, int) else (0 if returned is None else 1)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)  # sys.exit("text") prints the text
        except Exception:  # noqa: BLE001  (a process would print it and exit 1)
            traceback.print_exc()
            code = 1
    finally:
        sys.path[:], sys.argv = saved_path, saved_argv
        os.environ.clear()
        os.environ.update(saved_environ)
        # the script and the course scripts it imported from beside it, under their bare names ("cnn_training")
        for name in set(sys.modules) - saved_modules:
            if str(getattr(sys.modules[name], "__file__", "") or "").startswith((str(EXAMPLES), str(SCRIPTS))):
                del sys.modules[name]
        random.setstate(saved_random)
        if saved_numpy_rng is not None:
            numpy.random.set_state(saved_numpy_rng)
        if saved_torch_rng is not None:
            torch.set_rng_state(saved_torch_rng)
    out, err = capsys.readouterr()
    after = _global_state()
    assert after == before, f"{script.name} {' '.join(args)} changed this process's state: {_changes(before, after)}"
    return InProcessRun(code, out, err)


# ----- PyTorch profiler traces built by hand -----


def _x(cat, name, ts, dur, pid, tid, **args):  # type: ignore[no-untyped-def]
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def gpu_events(correlation_args: bool = True) -> list[dict]:
    """Two steps; step 1 launches k1 (10 us) and a copy, step 2 launches k2 twice from another thread.

    Times in microseconds. CPU process 100, main thread 1, autograd thread 2; GPU 0 stream 7.
    """
    c = (lambda i: {"correlation": i}) if correlation_args else (lambda i: {})
    ev = [
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": 2, "args": {"name": "autograd"}},
        _x("user_annotation", "ProfilerStep#4", 1000.0, 100.0, 100, 1),
        _x("cpu_op", "aten::mm", 1010.0, 20.0, 100, 1, **{"External id": 1}),
        _x("cuda_runtime", "cudaLaunchKernel", 1015.0, 5.0, 100, 1, **c(11), **{"External id": 1}),
        _x("cuda_runtime", "cudaMemcpyAsync", 1040.0, 5.0, 100, 1, **c(12)),
        _x("kernel", "k1", 1030.0, 10.0, 0, 7, device=0, stream=7, **c(11)),
        _x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 1060.0, 4.0, 0, 7, device=0, stream=7, bytes=4096, **c(12)),
        _x("user_annotation", "ProfilerStep#5", 1100.0, 100.0, 100, 1),
        _x("cuda_runtime", "cudaLaunchKernel", 1120.0, 5.0, 100, 2, **c(13)),
        _x("cuda_runtime", "cudaLaunchKernel", 1130.0, 5.0, 100, 2, **c(14)),
        _x("kernel", "k2", 1150.0, 20.0, 0, 7, device=0, stream=7, **c(13)),
        _x("kernel", "k2", 1180.0, 10.0, 0, 7, device=0, stream=7, **c(14)),
    ]
    for corr, cpu_ts, gpu_ts, cpu_tid in ((11, 1015.0, 1030.0, 1), (12, 1040.0, 1060.0, 1), (13, 1120.0, 1150.0, 2),
                                          (14, 1130.0, 1180.0, 2)):
        ev.append({"ph": "s", "cat": "ac2g", "id": corr, "name": "ac2g", "ts": cpu_ts, "pid": 100, "tid": cpu_tid})
        ev.append({"ph": "f", "cat": "ac2g", "id": corr, "name": "ac2g", "ts": gpu_ts, "pid": 0, "tid": 7, "bp": "e"})
    return ev


def write(tmp_path, events, name="t.json", gz=False, **meta):  # type: ignore[no-untyped-def]
    """A trace file holding ``events`` (gzipped when ``gz``), as the PyTorch profiler writes one."""
    data = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "A GPU"}], **meta, "traceEvents": events}
    path = tmp_path / (name + (".gz" if gz else ""))
    raw = json.dumps(data).encode()
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


# ----- a stand-in for NVML -----


class FakeNvml:
    """NVML's C functions as the ctypes library presents them (out-parameters passed by reference), for
    ``gpuprof.nvml.Nvml.open(lib=...)``: GPU ``0000:05:00.0`` at 1755 MHz (memory 2619 MHz), 612.5 W of a 700 W limit, reason 0x4
    (software power cap), its energy counter rising 7 mJ a reading, no temperature."""

    def __init__(self):
        self.energy = 1000

    @staticmethod
    def _set(ref, value):
        ref._obj.value = value
        return 0

    def nvmlInit_v2(self):
        return 0

    def nvmlDeviceGetHandleByPciBusId_v2(self, bus, ref):
        return 0 if bus == b"0000:05:00.0" else 999

    def nvmlDeviceGetClockInfo(self, handle, kind, ref):
        return self._set(ref, {1: 1755, 2: 2619}[kind.value]) if kind.value in (1, 2) else 3  # SM, memory

    def nvmlDeviceGetPowerUsage(self, handle, ref):
        return self._set(ref, 612_500)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle, ref):
        self.energy += 7
        return self._set(ref, self.energy)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle, ref):
        return self._set(ref, 4)

    def nvmlDeviceGetTemperature(self, handle, kind, ref):
        return 3  # not supported: the field is None

    def nvmlDeviceGetEnforcedPowerLimit(self, handle, ref):
        return self._set(ref, 700_000)  # milliwatts
