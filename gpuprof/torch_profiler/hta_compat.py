"""Holistic Trace Analysis' first answers, computed from a trace with HTA's definitions or exactly.

HTA (``holistictraceanalysis``, Meta's analyser of PyTorch profiler traces) starts with
``get_temporal_breakdown`` (per rank: the span of the GPU's work, its idle time) and
``get_gpu_kernel_breakdown`` (per kernel: total, mean, min, max time). gpuprof answers
the same questions from the same file, and the course's tests hold the two equal. Two
choices of HTA's must be known to compare them:

* **Whole microseconds, shrunk inwards.** HTA rounds every event's start *up* and its end
  *down* to a whole microsecond (``round_down_time_stamps``, because some traces' events
  overlapped at nanosecond resolution: pytorch/pytorch#122425), so an event shorter than
  a microsecond can get a duration of -1 and every interval loses up to 2 µs. Busy time
  comes out lower and idle time higher than the nanoseconds in the file say (chapter 9
  prints both on chapter 5's training trace). A copy or memset with a negative duration can
  also make HTA 0.5's temporal breakdown stop on its own check that non-compute time is not
  negative: it does on chapter 5's training trace of 2026-11-24 (four memsets of 0.7-0.8 µs),
  where this module still gives HTA's definition's answer.
* **What counts as GPU work**: every event with a stream, i.e. kernels, copies and memsets,
  and also ``cuda_sync`` events (a stream or event wait that Kineto records on the stream)
  where the trace has them; gpuprof's own measures count kernels, copies and memsets.

``rounding="hta"`` and ``include_sync=True`` reproduce HTA's numbers exactly (tested on
chapter 5's and 8's traces and on HTA's own test traces), except where a trace's timestamps
are absolute Unix-epoch microseconds (about 1.7e15): float64 then holds them only to a
quarter of a microsecond, and HTA's ceil and floor of those floats differ from the
nanoseconds gpuprof reads by a few microseconds in millions. One HTA behaviour is not
reproduced: it counts any event with a ``stream`` argument as GPU work, and the CPU-side
operator Triton's launcher records carries ``"stream": 0``, so HTA's span of HTA's Triton
test trace is that CPU operator's 94 µs, not the kernel's 1 µs.
The defaults give the file's own nanoseconds.

:func:`idle_gaps` and :func:`idle_time_breakdown` add HTA's third answer,
``get_idle_time_breakdown``: each stream's gaps between its GPU events, sorted by why the GPU
waited (the rule of HTA 0.5's ``BreakdownAnalysis._analyze_idle_time_for_stream``, quoted there).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

import gzip
import json
import re
from pathlib import Path

from .. import activity
from ..errors import GpuprofError
from .summary import gpu_activity
from .trace import KINDS, Trace, _to_ns

__all__ = ["gpu_intervals", "gpu_events", "temporal_breakdown", "kernel_breakdown", "comm_comp_overlap",
           "idle_gaps", "idle_time_breakdown", "IDLE_CATEGORIES"]

_GPU_KINDS = {"kernel", "memcpy", "memset"}
_WS = re.compile(r"[\s,]*")


def gpu_events(path: str | Path) -> pd.DataFrame:
    """The GPU events of a trace file (kernels, copies, memsets, stream syncs): kind, name, start, end (ns),
    streamId, read one event at a time.

    :func:`gpuprof.torch_profiler.trace.read_trace` builds every table of a trace, and holds
    every event while it does; the two questions here need a tenth of the events. Each event
    is decoded from the file's text and dropped unless it is GPU work, so the peak memory is
    about the text itself (on a 103 MB trace, 0.41x HTA's peak memory in 0.19x its time on the
    course's 2-core CPU machine: ``scripts/bench_torch_trace.py``, five whole processes of each in
    ``artifacts/tools/bench_torch_trace_processes.txt``). Times convert exactly as
    ``read_trace`` converts them, so the answers equal those from a :class:`Trace` (tested).
    """
    path = Path(path)
    with path.open("rb") as fh:
        opener = gzip.open if fh.read(2) == b"\x1f\x8b" else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise GpuprofError(f"{path} cannot be read as a trace ({exc}).", "Give a .json or .json.gz trace.") from None
    start = text.lstrip()[:1]
    if start == "[":
        i = text.index("[") + 1
    elif '"traceEvents"' in text:
        i = text.index("[", text.index('"traceEvents"')) + 1
    else:
        from .trace import read_trace

        read_trace(path)  # says in one sentence what the file is instead
        raise GpuprofError(f"{path} has no traceEvents list.")
    decode = json.JSONDecoder().raw_decode
    rows: dict[str, list] = {"kind": [], "name": [], "ts": [], "dur": [], "streamId": []}
    n = len(text)
    try:
        while True:
            i = _WS.match(text, i).end()
            if i >= n or text[i] == "]":
                break
            e, i = decode(text, i)
            kind = KINDS.get(str(e.get("cat", "")).lower()) if isinstance(e, dict) else None
            if kind in _GPU_KINDS or kind == "sync":
                if e.get("ph") != "X":
                    continue
                rows["kind"].append(kind)
                rows["name"].append(e.get("name"))
                rows["ts"].append(e.get("ts"))
                rows["dur"].append(e.get("dur"))
                rows["streamId"].append((e.get("args") or {}).get("stream"))
    except json.JSONDecodeError as exc:
        raise GpuprofError(f"{path} is not complete JSON (at character {exc.pos:,}: {exc.msg}).",
                           "A trace cut short cannot be read: export it again.") from None
    del text
    ts = pd.to_numeric(pd.Series(rows["ts"], dtype=object), errors="coerce").to_numpy(dtype=float)
    dur = pd.to_numeric(pd.Series(rows["dur"], dtype=object), errors="coerce").to_numpy(dtype=float)
    start_ns = _to_ns(ts)
    out = pd.DataFrame({"kind": rows["kind"], "name": rows["name"], "start": start_ns,
                        "end": start_ns + _to_ns(np.where(np.isfinite(dur), dur, 0.0)),
                        "streamId": pd.array(rows["streamId"], dtype="object")})
    return out


def gpu_intervals(trace: Trace | str | Path | pd.DataFrame, *, rounding: str = "ns", include_sync: bool = False) -> pd.DataFrame:
    """The GPU's work as name, start, end (ns, or whole µs with ``rounding="hta"``), from a :class:`Trace`,
    straight from a trace file, or from the table :func:`gpu_events` read from one (a fraction of the memory)."""
    if rounding not in ("ns", "hta"):
        raise ValueError(f"rounding must be 'ns' or 'hta', not {rounding!r}")
    if isinstance(trace, (str, Path, pd.DataFrame)):
        ev = gpu_events(trace) if not isinstance(trace, pd.DataFrame) else trace
        keep = ev["kind"].isin(_GPU_KINDS) | ((ev["kind"] == "sync") & ev["streamId"].notna() if include_sync else False)
        w = ev.loc[keep, ["name", "start", "end"]].reset_index(drop=True)
    else:
        parts = [gpu_activity(trace)[["name", "start", "end"]]]
        if include_sync and len(trace.events("sync")):
            sync = trace.events("sync")
            parts.append(sync[sync["streamId"].notna()][["name", "start", "end"]])
        w = pd.concat(parts, ignore_index=True)
    if rounding == "hta":  # ceil(start), floor(end) in whole microseconds, as HTA's parser does
        s, e = w["start"].to_numpy(dtype=np.int64), w["end"].to_numpy(dtype=np.int64)
        w = w.assign(start=-(-s // 1000), end=e // 1000)
    return w


def temporal_breakdown(trace: Trace | str | Path | pd.DataFrame, *, rounding: str = "ns", include_sync: bool = False) -> dict[str, float]:
    """span_us (first start to last end of the GPU's work: HTA's "kernel_time"), busy_us (their
    union), idle_us (span minus busy) and idle_share."""
    w = gpu_intervals(trace, rounding=rounding, include_sync=include_sync)
    if w.empty:
        return {"span_us": 0.0, "busy_us": 0.0, "idle_us": 0.0, "idle_share": float("nan")}
    s, e = activity.merge_intervals(w["start"].to_numpy(), w["end"].to_numpy())
    scale = 1.0 if rounding == "hta" else 1e3
    span = float(e.max() - s[0]) / scale  # HTA: end of the last merged interval minus start of the first
    busy = float((e - s).sum()) / scale
    return {"span_us": span, "busy_us": busy, "idle_us": span - busy, "idle_share": (span - busy) / span if span else float("nan")}


def kernel_breakdown(trace: Trace | str | Path | pd.DataFrame, *, rounding: str = "ns", include_sync: bool = False) -> pd.DataFrame:
    """Per name of kernel, copy or memset (and sync event, with ``include_sync``): count, sum_us, mean_us,
    min_us, max_us (HTA's kernel metrics with ``include_memory_kernels=True``)."""
    w = gpu_intervals(trace, rounding=rounding, include_sync=include_sync)
    d = (w["end"] - w["start"]).astype(float) / (1.0 if rounding == "hta" else 1e3)
    g = d.groupby(w["name"].astype(str))
    out = pd.DataFrame({"count": g.size(), "sum_us": g.sum(), "mean_us": g.mean(), "min_us": g.min(), "max_us": g.max()})
    return out.sort_values("sum_us", ascending=False).rename_axis("name").reset_index()


# HTA's kernel types, by name: communication (NCCL), memory (copies, memsets), computation (everything else,
# a stream sync event included when it is counted as GPU work).
_COMM = re.compile(r"^nccl.*Kernel")  # HTA's NCCL_KERNEL_RE
_MEMORY = re.compile(r"^(?:Memcpy|Memset|dma)")


def comm_comp_overlap(trace: Trace | str | Path | pd.DataFrame, *, rounding: str = "ns", include_sync: bool = False) -> float:
    """HTA's ``get_comm_comp_overlap`` for one rank: the share of the communication kernels' time (their
    union) during which a computation kernel (the union of the rest, copies and memsets left out) ran.

    It is chapter 8's "hidden" share asked of one trace, with one difference of definition: chapter 8
    counts a compute kernel only on *another* stream (:func:`gpuprof.activity.copy_compute_overlap`),
    HTA on any stream; NCCL runs on streams of its own, so the two agree on DDP traces.
    """
    w = gpu_intervals(trace, rounding=rounding, include_sync=include_sync)
    names = w["name"].astype(str)
    is_comm = names.map(lambda n: _COMM.match(n) is not None).to_numpy(dtype=bool)
    is_memory = names.map(lambda n: _MEMORY.match(n) is not None).to_numpy(dtype=bool)
    comm, comp = w[is_comm], w[~is_comm & ~is_memory]
    if comm.empty:
        return float("nan")
    cs, ce = activity.merge_intervals(comm["start"].to_numpy(), comm["end"].to_numpy())
    ks, ke = activity.merge_intervals(comp["start"].to_numpy(), comp["end"].to_numpy())
    # HTA's rounding (start up, end down) leaves a sub-microsecond kernel ending before it starts;
    # alone, it covers nothing (HTA's sweep counts none of it), so it must not subtract from the sums
    keep = ke > ks
    ks, ke = ks[keep], ke[keep]
    cum = np.concatenate([[0], np.cumsum(ke - ks)])
    hidden = sum(activity._covered(ks, ke, cum, int(a), int(b)) for a, b in zip(cs, ce))
    return float(hidden) / float((ce - cs).sum())


# ---- HTA's idle time breakdown ----------------------------------------------------------------------------------

IDLE_CATEGORIES = ("host_wait", "kernel_wait", "other")


def idle_gaps(trace: Trace | str | Path, *, rounding: str = "ns", kernel_wait_us: float = 30.0) -> pd.DataFrame:
    """Every gap between consecutive GPU events (kernels, copies, memsets) of one stream, with HTA's reason for it.

    One row per event after a stream's first: streamId, name (the event after the gap), gap_start (the previous
    event's end), gap_end (this event's start), launched (its launching runtime or driver call's start, found by
    correlation id; NaN when the trace lacks it), idle_us (may be negative where two events of a stream overlap
    after rounding, as HTA leaves them) and category, by HTA 0.5's rule:

    * ``host_wait``: the CPU called the launch *after* the previous event on the stream had ended, so the
      stream waited for the CPU;
    * ``kernel_wait``: launched before that, and the gap is shorter than ``kernel_wait_us``;
    * ``other``: launched before that, and a longer gap: the stream waited for something else (HTA's own
      example: a CUDA event recorded on another stream).

    HTA's ``consecutive_kernel_delay`` defaults to 30 and is documented in nanoseconds, but its code compares it
    with timestamps in whole microseconds, so it acts as 30 µs; ``kernel_wait_us`` is that number, in µs
    either way. Times are ns (``rounding="ns"``) or whole µs rounded inwards as HTA rounds (``"hta"``).
    Cudasync events are not GPU events here, as in HTA's breakdown (unlike its temporal breakdown).
    """
    if rounding not in ("ns", "hta"):
        raise ValueError(f"rounding must be 'ns' or 'hta', not {rounding!r}")
    if not isinstance(trace, Trace):
        from .trace import read_trace

        trace = read_trace(trace)
    ev = gpu_activity(trace)[["name", "start", "end", "streamId", "correlationId"]]
    calls = trace.runtime_calls()[["correlationId", "start"]].drop_duplicates("correlationId", keep="last")
    ev = ev.merge(calls.rename(columns={"start": "launched"}), on="correlationId", how="left")
    ev = ev[ev["streamId"].notna()]
    start = ev["start"].to_numpy(dtype=np.int64)
    end = ev["end"].to_numpy(dtype=np.int64)
    launched = pd.to_numeric(ev["launched"], errors="coerce").to_numpy(dtype=float)
    if rounding == "hta":  # HTA rounds the launch's start up like every event's (trace_parser.round_down_time_stamps)
        start, end, launched, scale = -(-start // 1000), end // 1000, np.ceil(launched / 1000), 1.0
    else:
        scale = 1e3
    w = pd.DataFrame({"streamId": ev["streamId"].astype("int64").to_numpy(), "name": ev["name"].to_numpy(),
                      "start": start, "end": end, "launched": launched})
    w = w.sort_values(["streamId", "start"], kind="stable", ignore_index=True)
    prev_end = w.groupby("streamId")["end"].shift(1)
    gaps = pd.DataFrame({"streamId": w["streamId"], "name": w["name"], "gap_start": prev_end, "gap_end": w["start"],
                         "launched": w["launched"], "idle_us": (w["start"] - prev_end) / scale})
    gaps = gaps[prev_end.notna()].reset_index(drop=True)
    host = (gaps["launched"] > gaps["gap_start"]).to_numpy()
    kernel = ~host & (gaps["idle_us"] < kernel_wait_us).to_numpy()
    gaps["category"] = np.where(host, "host_wait", np.where(kernel, "kernel_wait", "other"))
    return gaps


def idle_time_breakdown(trace: Trace | str | Path, *, rounding: str = "ns", kernel_wait_us: float = 30.0) -> pd.DataFrame:
    """HTA's ``get_idle_time_breakdown`` for one rank: per stream and category (:data:`IDLE_CATEGORIES`, all three
    always present), gaps (their number), idle_us (their sum) and idle_share (of the stream's idle time).

    With ``rounding="hta"`` the idle_us column equals HTA 0.5's ``idle_time`` and idle_share its
    ``idle_time_ratio`` before its rounding to two decimals (tested on chapter 8's traces). See :func:`idle_gaps`.
    """
    gaps = idle_gaps(trace, rounding=rounding, kernel_wait_us=kernel_wait_us)
    idx = pd.MultiIndex.from_product([sorted(gaps["streamId"].unique()), IDLE_CATEGORIES], names=["streamId", "category"])
    g = gaps.groupby(["streamId", "category"])["idle_us"]
    out = pd.DataFrame({"gaps": g.size(), "idle_us": g.sum()}).reindex(idx, fill_value=0)
    out["gaps"] = out["gaps"].astype(int)
    total = out.groupby(level="streamId")["idle_us"].transform("sum")
    out["idle_share"] = (out["idle_us"] / total).where(total != 0)
    return out.reset_index()
