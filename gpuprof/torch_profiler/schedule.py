"""Which steps a ``torch.profiler.schedule`` records, asked of the schedule itself.

``schedule(skip_first, wait, warmup, active, repeat)`` returns a function from step
number to a ``ProfilerAction``; the profiler calls it at every ``prof.step()``. Asking
that function, rather than re-deriving its arithmetic, gives the answer of the installed
PyTorch, and the chapter checks it against the ``ProfilerStep#N`` ranges of a real trace
(:meth:`gpuprof.torch_profiler.trace.Trace.steps`).
"""

from __future__ import annotations

from typing import Any, Callable

import pandas as pd

__all__ = ["actions"]


def actions(schedule_fn: Callable[[int], Any], steps: int) -> pd.DataFrame:
    """One row per step 0 .. ``steps`` - 1: the action's name (``NONE``, ``WARMUP``, ``RECORD``,
    ``RECORD_AND_SAVE``), whether the step is recorded, whether a trace is handed to ``on_trace_ready``
    when it ends, and the cycle it belongs to (counting recorded stretches from 0; -1 outside them)."""
    rows, cycle = [], -1
    previous = None
    for step in range(steps):
        name = getattr(schedule_fn(step), "name", str(schedule_fn(step)))
        recorded = name.startswith("RECORD")
        if recorded and previous not in ("RECORD",):
            cycle += 1
        rows.append({"step": step, "action": name, "recorded": recorded, "saved": name == "RECORD_AND_SAVE",
                     "cycle": cycle if recorded else -1})
        previous = name
    return pd.DataFrame(rows)
