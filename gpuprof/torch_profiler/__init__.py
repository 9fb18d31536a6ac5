"""The PyTorch profiler: its traces read as tables, its ``key_averages`` kept as records.

* :mod:`gpuprof.torch_profiler.trace`: a Kineto trace (``.json`` / ``.json.gz``) split into
  CPU operators, annotations, ``ProfilerStep#N``, CUDA API calls, kernels, copies,
  memsets, flows and memory events, with the Nsight Systems readers' column names
* :mod:`gpuprof.torch_profiler.summary`: ``key_averages``-style tables computed from a trace,
  and per-step GPU busy time and launch latency (the measures of :mod:`gpuprof.activity`)
* :mod:`gpuprof.torch_profiler.key_averages`: ``key_averages()`` saved as records, and which of
  its attribute names and sort keys work on the installed PyTorch
* :mod:`gpuprof.torch_profiler.hta_compat`: Holistic Trace Analysis' temporal and kernel
  breakdowns, with HTA's definitions or the file's nanoseconds, read a fraction of the memory
"""

from .summary import kernel_lineage, kernel_operators, kernel_summary, launch_latency, op_summary, step_summary
from .trace import Trace, read_trace

__all__ = ["Trace", "read_trace", "op_summary", "kernel_summary", "step_summary", "launch_latency", "kernel_lineage", "kernel_operators"]
