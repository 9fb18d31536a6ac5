"""gpuprof: the helpers that the course's notebooks and example scripts share.

Import what a chapter needs from here; nothing in a notebook re-implements these.

* :mod:`gpuprof.backend`: torch CUDA -> CuPy -> CPU, and the provenance line
* :mod:`gpuprof.timing`: honest timers (warm-up, sync, CUDA events, median and spread)
* :mod:`gpuprof.ranges`: NVTX ranges with or without the ``nvtx`` package or a GPU
* :mod:`gpuprof.tools`: finding nsys / ncu, their versions, counter permission
* :mod:`gpuprof.runner`: running a profiler over a script, atomically
* :mod:`gpuprof.artifacts`: captures, provenance, and the reference fallback
* :mod:`gpuprof.nsys_capture`, :mod:`gpuprof.nsys_session`: nsys captures (and interactive
  sessions) of course scripts, with the reference-capture fallback
* :mod:`gpuprof.nsys_sqlite`, :mod:`gpuprof.ncu_csv`: readers for the tools' exports
* :mod:`gpuprof.trace_analysis`, :mod:`gpuprof.timeline`: measures derived from a capture
  (nsys-stats summaries, busy time, gaps, overlap, latency) and the timeline figure
* :mod:`gpuprof.speed_of_light`, :mod:`gpuprof.setup_checks`, :mod:`gpuprof.plots`:
  chapter 0's measurements, machine checks and figures
* :mod:`gpuprof.cli`, :mod:`gpuprof.book`: example scripts' argument types; glue for the prose
* :mod:`gpuprof.streaming_metrics`: the weight-streaming seed's metric table and report (issue 4 groundwork)
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
