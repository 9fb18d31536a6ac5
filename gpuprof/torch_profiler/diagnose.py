"""A bottleneck report for a PyTorch profiler trace: measures with their thresholds, not guesses.

Tutorials often end a profile with a "bottleneck detector" that lists operators whose
``cuda_time_total`` passes a fixed number of milliseconds. That finds big operators, not
bottlenecks: a step can be slow because the GPU waits for the host between small
kernels, because it waits for copies, or because the host waits for the GPU. Each check
here measures one of those from the trace, per ``ProfilerStep``, and states its value
beside the threshold it is judged against, so a reader sees how near the line it is:

=====================  =============================================================  ===========
check                  measure (median over the steps)                                flagged if
=====================  =============================================================  ===========
``gpu_idle``           share of the step during which no GPU work ran                 > 50%
``tiny_kernels``       median kernel time / median launch call time                   < 1
``sync_wait``          share of the step's CPU time inside synchronising CUDA calls   > 30%
``copies``             share of GPU busy time spent in memory copies                  > 10%
``pageable_copies``    host-to-device copies from pageable memory                     any
=====================  =============================================================  ===========

A flagged check is a place to look, not a verdict: ``sync_wait`` is high in any step
that ends by reading a result back while the GPU is busy (the GPU is the bottleneck and
the host waits, as it should).

The report's list of CPU operators by self time has the same trap: a ``record_function``
range around ``loss.backward()`` tops it, yet its self time is its thread waiting while
autograd's thread runs the backward operators. A range for which other threads were inside
operators during at least ``WAIT_SHARE`` of its self time is marked as a wait
(:func:`gpuprof.torch_profiler.summary.range_waits`).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from .. import activity
from .summary import KERNEL_LAUNCHES, gpu_activity, kernel_summary, op_summary, range_waits, step_summary
from .trace import Trace

__all__ = ["checks", "report", "SYNC_CALLS", "WAIT_SHARE"]

SYNC_CALLS = re.compile(r"^cuda(Stream|Device|Event)Synchronize|^cudaMemcpy(?!Async)|^cuStreamSynchronize|^cuCtxSynchronize")
LAUNCH_CALLS = re.compile("^(" + "|".join(KERNEL_LAUNCHES) + ")")
WAIT_SHARE = 0.5  # a range whose self time overlaps other threads' operators this much is waiting for them


def checks(trace: Trace) -> pd.DataFrame:
    """One row per check: check, value, threshold, flagged, meaning. Empty without GPU activity."""
    cols = ["check", "value", "threshold", "flagged", "meaning"]
    steps = trace.steps()
    if not trace.has_gpu_activity or steps.empty:
        return pd.DataFrame(columns=cols)
    per_step = step_summary(trace, rule="window")
    idle = 1 - (per_step["gpu_busy_ms"] / per_step["cpu_ms"]).clip(upper=1)
    kernels = trace.kernels()
    runtime = trace.runtime_calls()
    launches = runtime[runtime["name"].astype(str).str.match(LAUNCH_CALLS)]
    ratio = float(kernels["duration_ns"].median() / launches["duration_ns"].median()) if len(launches) else float("nan")
    sync_share = []
    for s in steps.itertuples():
        calls = activity.inside(runtime, (s.start, s.end))
        waits = calls[calls["name"].astype(str).str.match(SYNC_CALLS)]
        sync_share.append(waits["duration_ns"].sum() / s.duration_ns if s.duration_ns else np.nan)
    work = gpu_activity(trace)
    busy = activity.merge_intervals(work["start"].to_numpy(), work["end"].to_numpy())
    busy_ns = float((busy[1] - busy[0]).sum())
    copies = trace.copies()
    copy_share = float(copies["duration_ns"].sum()) / busy_ns if busy_ns else 0.0
    pageable = 0
    if len(copies):
        names = copies["name"].astype(str)
        pageable = int((names.str.contains("HtoD") & names.str.contains("Pageable")).sum())
    rows = [
        ("gpu_idle", float(np.nanmedian(idle)), 0.5, "the GPU waited for the host for most of the step: fewer, larger "
         "kernels (bigger batches, fused operators, CUDA graphs, torch.compile) or less host work"),
        ("tiny_kernels", ratio, 1.0, "a typical kernel is shorter than the CPU call that launches it: the host cannot "
         "keep the GPU fed one launch at a time"),
        ("sync_wait", float(np.nanmedian(sync_share)), 0.3, "the host spent this share of the step waiting for the GPU "
         "(.item(), .cpu(), printing a tensor, a blocking copy): fine at the step's end, costly in its middle"),
        ("copies", copy_share, 0.1, "memory copies took this share of the GPU's busy time: keep data on the GPU, or "
         "overlap the copies with compute (pinned memory, non_blocking=True, a second stream)"),
        ("pageable_copies", float(pageable), 0.5, "host-to-device copies from pageable memory are staged through a "
         "pinned buffer and cannot overlap compute: pin the source (pin_memory=True in the DataLoader)"),
    ]
    out = []
    for name, value, threshold, meaning in rows:
        flagged = value < threshold if name == "tiny_kernels" else value > threshold
        out.append({"check": name, "value": value, "threshold": threshold, "flagged": bool(flagged and np.isfinite(value)),
                    "meaning": meaning})
    return pd.DataFrame(out, columns=cols)


def report(trace: Trace, *, top: int = 5) -> str:
    """A short plain-text report: what the trace holds, the steps, the top kernels and CPU operators, the checks."""
    lines = [trace.describe(), ""]
    per_step = step_summary(trace, rule="window")
    if len(per_step):
        lines.append("per step (ms): " + "; ".join(
            f"#{int(r.step)} CPU {r.cpu_ms:.2f}, GPU busy {r.gpu_busy_ms:.2f}" for r in per_step.itertuples()))
    ks = kernel_summary(trace)
    if len(ks):
        lines.append(f"top kernels ({len(ks)} distinct, {ks['total_us'].sum() / 1e3:.2f} ms of GPU time):")
        lines += [f"  {r.share:6.1%}  {r.calls:>4} x  {r.name[:70]}" for r in ks.head(top).itertuples()]
    ops = op_summary(trace)
    ops = ops[~ops["key"].str.startswith("ProfilerStep")]
    if len(ops):
        waits = range_waits(trace).set_index("key")["elsewhere_share"]
        lines.append("top CPU operators by self CPU time:")
        for r in ops.head(top).itertuples():
            share = waits.get(r.key, 0.0)
            note = (f"  (a record_function range: other threads ran operators for {share:.0%} of its self time: "
                    "a wait, not work)") if share >= WAIT_SHARE else ""
            lines.append(f"  {r.self_cpu_us / 1e3:8.2f} ms  {r.calls:>4} x  {r.key[:70]}{note}")
    c = checks(trace)
    if len(c):
        lines.append("checks (value against threshold):")
        for r in c.itertuples():
            value = f"{r.value:.0f}" if r.check == "pageable_copies" else (f"{r.value:.2f}" if r.check == "tiny_kernels"
                                                                            else f"{r.value:.0%}")
            threshold = f"{r.threshold:.0%}" if r.check not in ("tiny_kernels", "pageable_copies") else \
                ("1" if r.check == "tiny_kernels" else "0")
            lines.append(f"  {'FLAG' if r.flagged else 'ok  '} {r.check:<16} {value:>6} (flagged {'<' if r.check == 'tiny_kernels' else '>'} {threshold})"
                         + (f": {r.meaning}" if r.flagged else ""))
    else:
        lines.append("checks: none apply (no GPU activity or no ProfilerStep ranges in this trace)")
    return "\n".join(lines)
