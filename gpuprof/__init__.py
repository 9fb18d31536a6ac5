"""gpuprof: the helpers that the course's notebooks and example scripts share.

Import what a chapter needs from here; nothing in a notebook re-implements these.

The layout rule (``tests/test_layout.py`` reads every module's imports and holds it)
* **The core** (the top-level modules) reads and runs what any program's capture needs, and
  imports nothing above it.
* **The tool packages** (``nsys/``, ``ncu/``, ``torch_profiler/``) read and make one tool's
  captures. Each imports the core and itself, never another tool package.
* **``report/``** builds ``python -m gpuprof report`` pages from the readers: the core and the
  tool packages, never a study.
* **``studies/``** holds every chapter's experiments: the modules that run a named example
  script and return a chapter's tables. A study imports anything below it, never another
  study; what two studies share moves down into the core or a tool package.
* Outside ``studies/``, no code names an example script or a chapter (a docstring may
  point at one).

Shared core
* :mod:`gpuprof.errors`: errors a reader can act on; :mod:`gpuprof.memory_probe`: host and GPU memory
* :mod:`gpuprof.backend`: torch CUDA -> CuPy -> CPU, the provenance line, a script's PyTorch
* :mod:`gpuprof.device_state`: the GPU's clocks under load (``nvidia-smi``) and its own peak memory bandwidth
* :mod:`gpuprof.nvml`: the SM clock, power and clock-event reasons during one timed window (NVML, ctypes)
* :mod:`gpuprof.timing`: honest timers (warm-up, sync, CUDA events, median and spread)
* :mod:`gpuprof.ranges`: NVTX ranges with or without the ``nvtx`` package or a GPU
* :mod:`gpuprof.tools`: finding nsys / ncu, their versions, counter permission, ``require_tool``
* :mod:`gpuprof.runner`, :mod:`gpuprof.fork_runs`: running a profiler or a script, atomically
* :mod:`gpuprof.artifacts`: captures, provenance, and the reference fallback
* :mod:`gpuprof.script_results`: a script's JSON results, run here or the reference
* :mod:`gpuprof.activity`: busy time, idle gaps, overlap, launch latency and attribution to
  ranges over GPU activity tables, from any tool's capture
* :mod:`gpuprof.kernel_kinds`: kernels grouped by what their names say they do
* :mod:`gpuprof.kernels`: compiling, launching and timing hand-written CUDA kernels
* :mod:`gpuprof.models`, :mod:`gpuprof.cnn_data`: the small workloads the examples train
* :mod:`gpuprof.cli`, :mod:`gpuprof.distributed`, :mod:`gpuprof.book`: example scripts' argument
  types, torchrun placement; glue for the prose

By tool
* :mod:`gpuprof.nsys`: Nsight Systems captures, sqlite readers (and the rewriting of exports),
  ``nsys stats`` summaries, a capture split by rank,
  derived measures and the timeline figure
* :mod:`gpuprof.ncu`: Nsight Compute captures, report and CSV readers, derived tables, figures
* :mod:`gpuprof.torch_profiler`: PyTorch profiler traces read as tables, ``key_averages`` as records,
  schedules, memory snapshots

The command line
* :mod:`gpuprof.report`: ``python -m gpuprof report CAPTURE...`` and ``diff BEFORE AFTER``, over
  any tool's capture (the readers above), to the terminal and one HTML page

Case studies (:mod:`gpuprof.studies`), by chapter
* 0: ``speed_of_light``, ``setup_checks``; 1-2: ``capture_overhead``, ``nsys_switches``;
  3: ``weight_streaming``; 4: ``nsight_compute``, ``replay_modes``; 5: ``pytorch_profiler``;
  6: ``cnn_training``, ``cnn_precision``; 7: ``transformer``; 8: ``multi_gpu``;
  10: ``mixed_precision``; 11: ``matmul_ladder``, ``matmul_sweep``; 12: ``llm_inference``; 13 (a draft notebook): ``sharded_training``
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The re-exports below are imported on first use (PEP 562), not with the package: a script that needs only
# ``exit_on_error`` should not pay for NumPy and nvtx (``ranges``) at start-up.
_EXPORTS = {
    "backend": ("Backend", "MachineInfo", "choose_backend", "describe_machine", "gpu_available"),
    "errors": ("GpuprofError", "ToolNotFound", "CaptureExists", "ReferenceMissing", "exit_on_error"),
    "ranges": ("annotate", "push_range", "pop_range", "mark", "nvtx_backend"),
    "timing": ("Timing", "time_call", "format_seconds"),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}
# The modules that ``import gpuprof`` used to load with it stay reachable as attributes (``gpuprof.backend.x``).
_SUBMODULES = {*_EXPORTS, "memory_probe"}

__all__ = [name for names in _EXPORTS.values() for name in names]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from .backend import Backend, MachineInfo, choose_backend, describe_machine, gpu_available
    from .errors import CaptureExists, GpuprofError, ReferenceMissing, ToolNotFound, exit_on_error
    from .ranges import annotate, mark, nvtx_backend, pop_range, push_range
    from .timing import Timing, format_seconds, time_call


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
