"""gpuprof: the helpers that the course's notebooks and example scripts share.

Import what a chapter needs from here; nothing in a notebook re-implements these. The
shared core is at the top level; each profiler's code is in a package of its own.

Shared core
* :mod:`gpuprof.backend`: torch CUDA -> CuPy -> CPU, and the provenance line
* :mod:`gpuprof.timing`: honest timers (warm-up, sync, CUDA events, median and spread)
* :mod:`gpuprof.ranges`: NVTX ranges with or without the ``nvtx`` package or a GPU
* :mod:`gpuprof.tools`: finding nsys / ncu, their versions, counter permission
* :mod:`gpuprof.runner`: running a profiler over a script, atomically
* :mod:`gpuprof.artifacts`: captures, provenance, and the reference fallback
* :mod:`gpuprof.script_results`: a script's JSON results, run here or the reference
* :mod:`gpuprof.activity`: busy time, idle gaps, overlap, launch latency and attribution to
  ranges over GPU activity tables, from any tool's capture
* :mod:`gpuprof.kernels`: compiling, launching and timing the course's hand-written CUDA kernels
* :mod:`gpuprof.speed_of_light`, :mod:`gpuprof.setup_checks`, :mod:`gpuprof.plots`:
  chapter 0's measurements, machine checks and figures
* :mod:`gpuprof.cli`, :mod:`gpuprof.book`: example scripts' argument types; glue for the prose

By tool
* :mod:`gpuprof.nsys`: Nsight Systems captures, sqlite readers, ``nsys stats`` summaries,
  derived measures and the timeline figure
* :mod:`gpuprof.ncu`: Nsight Compute captures, report and CSV readers, derived tables, figures
* :mod:`gpuprof.torch_profiler`: PyTorch profiler traces read as tables, ``key_averages`` as records,
  schedules

The command line
* :mod:`gpuprof.report`: ``python -m gpuprof report CAPTURE...`` and ``diff BEFORE AFTER``, over
  any tool's capture (the readers above), to the terminal and one HTML page

Case studies
* :mod:`gpuprof.studies.weight_streaming`: chapter 3's target table and report
"""

from .backend import Backend, MachineInfo, choose_backend, describe_machine, gpu_available
from .errors import CaptureExists, GpuprofError, ReferenceMissing, ToolNotFound, exit_on_error
from .ranges import annotate, mark, nvtx_backend, pop_range, push_range
from .timing import Timing, format_seconds, time_call

__all__ = [
    "Backend", "MachineInfo", "choose_backend", "describe_machine", "gpu_available",
    "GpuprofError", "ToolNotFound", "CaptureExists", "ReferenceMissing", "exit_on_error",
    "annotate", "push_range", "pop_range", "mark", "nvtx_backend",
    "Timing", "time_call", "format_seconds",
]
__version__ = "0.1.0"
