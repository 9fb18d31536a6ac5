"""One view of a timeline capture, whichever tool wrote it: what ``report`` and ``diff`` measure.

An Nsight Systems export and a PyTorch profiler trace record the same things under
different names: kernels, copies and memsets on the GPU, CUDA API calls and annotated
ranges on the CPU. :func:`load` reads either into :class:`ActivityView` (the readers of
:mod:`gpuprof.nsys.sqlite` and :mod:`gpuprof.torch_profiler.trace` already share column
names), finds the program's steps, and the functions below compute the report's measures
from that view only, so the two tools' captures are judged by one definition of each
(those of :mod:`gpuprof.activity`).

Steps are found by :func:`gpuprof.activity.find_steps` (``--steps REGEX`` overrides its
default rule); the rule used is printed with the numbers, so a reader can tell when it
picked wrongly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .. import activity
from ..kernel_kinds import kernel_kind
from ..nsys.sqlite import pid_of

__all__ = ["ActivityView", "load", "step_table", "headline", "idle_by_cause", "kernels_by_name", "step_period_ns",
           "IDLE_MIN_GAP_NS"]

IDLE_MIN_GAP_NS = 10_000  # gaps shorter than 10 us are launch spacing, not idle time worth a row
_COPY_NAME = re.compile(r"Memcpy (\w+)(?: \((\w+) -> (\w+)\))?")
_DIRECTIONS = {"HtoD": "Host-to-Device", "DtoH": "Device-to-Host", "DtoD": "Device-to-Device", "HtoH": "Host-to-Host",
               "PtoP": "Peer-to-Peer"}


@dataclass
class ActivityView:
    """A capture's GPU work and CPU side, in integer nanoseconds on the capture's clock.

    ``kernels``/``copies``/``memsets``: start, end, duration_ns, name, correlationId,
    streamId (kernels also ``demangled``; copies ``bytes`` and ``kind``). ``runtime``: CUDA
    API calls (start, end, name, correlationId, globalTid). ``ranges``: NVTX ranges or
    ``record_function`` annotations (text, start, end, globalTid). ``steps``: the ranges
    taken as steps (step, text, start, end, globalTid) and ``step_rule``, how they were found.
    """

    path: Path
    tool: str                      # "nsys" or "kineto"
    kernels: pd.DataFrame
    copies: pd.DataFrame
    memsets: pd.DataFrame
    runtime: pd.DataFrame
    ranges: pd.DataFrame
    devices: list[str] = field(default_factory=list)
    steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    step_rule: str = ""
    extra: dict = field(default_factory=dict)  # the tool's own reader objects (a Trace), for tool-only tables

    @property
    def work(self) -> pd.DataFrame:
        """Kernels, copies and memsets in one table (start, end, correlationId): everything the GPU ran."""
        parts = [d[["start", "end", "correlationId"]] for d in (self.kernels, self.copies, self.memsets) if not d.empty]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["start", "end", "correlationId"])

    @property
    def window(self) -> tuple[int, int] | None:
        """From the first step's start to the last step's end; without steps, the span of the GPU's work."""
        if not self.steps.empty:
            return int(self.steps["start"].min()), int(self.steps["end"].max())
        w = self.work
        return None if w.empty else activity.window_of(w)


def _nsys(path: Path) -> ActivityView:
    from ..nsys import sqlite as ns

    try:
        kernels = ns.kernels(path, launch=False)
    except ns.NoKernelRows:  # a capture of a program that launched no kernel (or of the CPU only)
        kernels = pd.DataFrame(columns=["start", "end", "duration_ns", "name", "demangled", "correlationId", "streamId"])
    info = ns.gpu_info(path)
    return ActivityView(path=path, tool="nsys", kernels=kernels, copies=ns.memcpy(path), memsets=ns.memset(path),
                        runtime=ns.runtime_calls(path), ranges=ns.nvtx_ranges(path),
                        devices=[str(n) for n in info["name"]] if "name" in info else [])


def _kineto(path: Path) -> ActivityView:
    from ..torch_profiler.trace import read_trace

    t = read_trace(path)
    copies = t.copies().copy()
    for table in (copies,):
        if "bytes" not in table:  # ROCm traces (and old Kineto) leave the size out: unknown, not 0
            table["bytes"] = np.nan
    if not copies.empty:
        parts = copies["name"].astype(str).str.extract(_COPY_NAME)
        copies["kind"] = parts[0].map(lambda k: _DIRECTIONS.get(k, k) if isinstance(k, str) else "unknown")
        copies["src_memory"] = parts[1].fillna("")
        copies["dst_memory"] = parts[2].fillna("")
    kernels = t.kernels().copy()
    kernels["demangled"] = kernels["name"]
    memsets = t.memsets().copy()
    if "bytes" not in memsets:
        memsets["bytes"] = np.nan
    devices = [str(n) for n in t.devices["name"]] if not t.devices.empty and "name" in t.devices else []
    return ActivityView(path=path, tool="kineto", kernels=kernels, copies=copies, memsets=memsets,
                        runtime=t.runtime_calls(), ranges=t.annotations(), devices=devices, extra={"trace": t})


def load(path: str | Path, kind: str, *, steps: str | None = None) -> ActivityView:
    """Read a capture (``kind`` from :func:`gpuprof.report.detect.capture_kind`) and find its steps."""
    path = Path(path)
    if kind in ("nsys", "nsys-rep"):
        from ..nsys.sqlite import ensure_sqlite

        if kind == "nsys-rep" and path.suffix not in (".nsys-rep", ".qdrep"):
            from ..errors import GpuprofError

            raise GpuprofError(f"{path} is an Nsight Systems report (by its first bytes) without the .nsys-rep suffix.",
                               "Rename it to .nsys-rep, or export it: `nsys export --type sqlite -o OUT.sqlite REPORT`.")
        view = _nsys(ensure_sqlite(path) if kind == "nsys-rep" else path)
    elif kind == "kineto":
        view = _kineto(path)
    else:
        raise ValueError(f"not a timeline capture: {kind}")
    view.steps, view.step_rule = activity.find_steps(view.ranges, steps)
    view.steps["pid"] = _pids(view, view.steps)
    return view


def _pids(view: ActivityView, rows: pd.DataFrame) -> np.ndarray:
    """The process of each row: nsys packs it into globalTid (bits 24-47); Kineto tables carry it."""
    if len(rows) == 0:
        return np.array([], dtype=np.int64)
    if view.tool == "kineto":
        if "pid" not in view.ranges:
            return np.zeros(len(rows), dtype=np.int64)
        first_pid: dict = {}
        for key, pid in zip(zip(view.ranges["start"], view.ranges["globalTid"]), view.ranges["pid"]):
            first_pid.setdefault(key, pid)  # the first range at that start on that thread
        return np.array([first_pid.get((s, g), 0) for s, g in zip(rows["start"], rows["globalTid"])], dtype=object)
    return pid_of(rows["globalTid"].to_numpy(dtype=np.int64))


def step_table(view: ActivityView) -> pd.DataFrame:
    """Per step: step, cpu_ms (the range), launches (GPU operations launched in it, on any thread),
    kernels, gpu_busy_ms, gpu_span_ms, busy_share; see :func:`gpuprof.activity.range_busy`.
    Attribution is by time window on any thread: a PyTorch step's backward pass is launched from
    autograd's own thread, which nsys's thread rule would leave out."""
    cols = ["step", "cpu_ms", "launches", "kernels", "gpu_busy_ms", "gpu_span_ms", "busy_share"]
    several = "pid" in view.steps and pd.Series(view.steps["pid"]).nunique() > 1
    if several:  # one report around a multi-process job: say whose step each row is
        cols = ["step", "pid", *cols[1:]]
    if view.steps.empty:
        return pd.DataFrame(columns=cols)
    ranges = view.steps.assign(text=view.steps["step"].astype(str) + "#" + view.steps.index.astype(str))
    work = view.work.dropna(subset=["correlationId"])
    runtime = view.runtime.dropna(subset=["correlationId"])
    out = activity.range_busy(work, runtime, ranges, rule="window")
    hits = activity.attribute_kernels(view.kernels.dropna(subset=["correlationId"]), runtime, ranges, rule="window")
    per = hits.groupby("range_start").size() if len(hits) else pd.Series(dtype=int)
    out["kernels"] = out["start"].map(per).fillna(0).astype(int)
    out["step"] = view.steps["step"].to_numpy()
    if several:
        out["pid"] = view.steps["pid"].to_numpy()
    return out[cols]


def _busy_ns(df: pd.DataFrame, window: tuple[int, int]) -> float:
    return activity.busy_fraction(df, window) * (window[1] - window[0]) if not df.empty else 0.0


def headline(view: ActivityView) -> dict[str, float]:
    """The numbers a capture is summed up by (and that ``diff`` compares), over :attr:`ActivityView.window`.

    window_ms, steps, step_period_ms (mean start-to-start of consecutive steps), step_ms (median CPU range of a
    step), kernels, kernels_per_step (all GPUs), kernel_ms (sum of
    kernel durations), gpu_busy (union of kernels, copies and memsets over the window),
    kernel_busy (kernels alone), idle_ms, copies, copy_ms, copy_bytes, api_calls.
    """
    w = view.window
    if w is None:
        return {"window_ms": 0.0, "steps": 0, "kernels": 0}
    inside = lambda d: activity.inside(d, w) if not d.empty else d  # noqa: E731
    k, c = inside(view.kernels), inside(view.copies)
    span = w[1] - w[0]
    busy = _busy_ns(inside(view.work), w)
    out: dict[str, float] = {
        "window_ms": span / 1e6, "steps": len(view.steps), "kernels": len(k),
        "kernel_ms": float(k["duration_ns"].sum()) / 1e6 if len(k) else 0.0,
        "gpu_busy": busy / span if span else 0.0, "kernel_busy": _busy_ns(k, w) / span if span else 0.0,
        "idle_ms": (span - busy) / 1e6, "copies": len(c), "copy_ms": float(c["duration_ns"].sum()) / 1e6 if len(c) else 0.0,
        "copy_bytes": float(c["bytes"].sum(min_count=1)) if len(c) else 0.0, "api_calls": len(inside(view.runtime)),
    }
    if len(view.steps):
        d = (view.steps["end"] - view.steps["start"]).to_numpy() / 1e6
        # One report around a multi-process job (nsys around torchrun) holds every rank's steps:
        # a step is then one range per process, and the step count is per process.
        procs = max(1, int(pd.Series(view.steps["pid"]).nunique())) if "pid" in view.steps else 1
        per_process = len(view.steps) / procs
        if procs > 1:
            out["processes"] = procs
        # Two step times: the window over the steps (what throughput sees: CPU and GPU together, the
        # occasional step that waits for the GPU included) and the median CPU range (what the CPU spends
        # per step; in an asynchronous loop it is shorter than the GPU's work and says little of pace).
        out["step_period_ms"] = step_period_ns(view.steps, fallback=span / per_process) / 1e6
        out["step_ms"] = float(np.median(d))
        out["kernels_per_step"] = len(k) / per_process
    return out


def step_period_ns(steps: pd.DataFrame, *, fallback: float) -> float:
    """The mean time from one step's start to the next one's, over consecutive steps of one process.

    Start to start counts everything a step costs, the CPU's work and its waits for the GPU
    (the one step in fifty that reads the loss back), which the median CPU range does not.
    Only pairs numbered n, n+1 in the same process count: a capture of several runs (a sweep
    that restarts at step 0) has gaps between runs that are no step's. ``fallback`` when no
    such pair exists.
    """
    gaps = []
    for _, g in steps.groupby(steps["pid"] if "pid" in steps else np.zeros(len(steps))):
        g = g.sort_values("start")
        num, start = g["step"].to_numpy(), g["start"].to_numpy(dtype=np.int64)
        ok = np.diff(num) == 1
        gaps.append(np.diff(start)[ok])
    d = np.concatenate(gaps) if gaps else np.array([])
    return float(d.mean()) if len(d) else float(fallback)


def idle_by_cause(view: ActivityView, *, min_gap_ns: int = IDLE_MIN_GAP_NS) -> pd.DataFrame:
    """Where the GPU ran nothing for at least ``min_gap_ns``, grouped by what the CPU was doing.

    Each gap is labelled by the CUDA API call that overlaps it most
    (:func:`gpuprof.activity.idle_gaps`); the causes: ``synchronize`` (the CPU waited for the
    GPU: the GPU had run out of work first), ``copy`` (a blocking copy or memset call),
    ``launch`` (the CPU was launching: launch-bound), ``other CUDA call`` and ``host code``
    (no CUDA call at all: Python, data loading, the program's own work). A gap's time is split:
    the part its call covers goes to the call's cause, the rest to host code.
    Columns: cause, gaps (that have time of this cause), idle_ms, share (of the idle time in such gaps).
    """
    cols = ["cause", "gaps", "idle_ms", "share"]
    w = view.window
    if w is None:
        return pd.DataFrame(columns=cols)
    gaps = activity.idle_gaps(view.work, view.runtime, min_gap_ns=min_gap_ns, window=w)
    if gaps.empty:
        return pd.DataFrame(columns=cols)
    call = gaps["cpu_call"].astype(str)
    cause = np.select([call.str.contains("Synchronize"), call.str.contains("Memcpy|Memset"),
                       call.str.contains("Launch"), call != ""],
                      ["synchronize", "copy", "launch", "other CUDA call"], "host code")
    # The call covers cpu_call_share of its gap; the rest of the gap the CPU spent outside CUDA calls
    # (or in shorter ones): that part is host code, so a 2 ms data-loading gap that ends in a 20 us
    # copy call counts 20 us to copy, not 2 ms.
    dur = gaps["duration_ns"].to_numpy(dtype=float)
    covered = dur * gaps["cpu_call_share"].to_numpy(dtype=float)
    parts = pd.DataFrame({"cause": np.concatenate([cause, np.full(len(gaps), "host code")]),
                          "ns": np.concatenate([covered, dur - covered]),
                          "gap": np.concatenate([np.arange(len(gaps)), np.arange(len(gaps))])})
    parts = parts[parts["ns"] > 0]
    g = parts.groupby("cause")
    out = pd.DataFrame({"gaps": g["gap"].nunique(), "idle_ms": g["ns"].sum() / 1e6}).reset_index()
    out["share"] = out["idle_ms"] / out["idle_ms"].sum()
    return out.sort_values("idle_ms", ascending=False, ignore_index=True)[cols]


def kernels_by_name(view: ActivityView) -> pd.DataFrame:
    """Per kernel name over the window: name, kind, count, total_ms (short names: template instances
    of one kernel are one row), the table ``diff`` compares."""
    w = view.window
    k = activity.inside(view.kernels, w) if w is not None and not view.kernels.empty else view.kernels
    cols = ["name", "kind", "count", "total_ms"]
    if k.empty:
        return pd.DataFrame(columns=cols)
    g = k.groupby("name", sort=False)
    out = pd.DataFrame({"count": g.size(), "total_ms": g["duration_ns"].sum() / 1e6}).reset_index()
    demangled = g["demangled"].first() if "demangled" in k else out["name"]
    out["kind"] = [kernel_kind(n, d) for n, d in zip(out["name"], out["name"].map(demangled))]
    return out.sort_values("total_ms", ascending=False, ignore_index=True)[cols]
