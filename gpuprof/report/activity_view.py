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
picked wrongly. The measures cover :attr:`ActivityView.segments`: one stretch per run of
steps (a sweep that restarts its step count holds several runs, and the set-up between
them is no step's), each from its first step's start to its last step's end or to the end
of the GPU work its steps launched, whichever is later.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from .. import activity
from ..kernel_kinds import is_communication, kernel_kind
from ..nsys.sqlite import pid_of

__all__ = ["ActivityView", "load", "find_view_steps", "step_table", "headline", "idle_by_cause", "kernels_by_name", "kernel_labels",
           "compact_name", "step_intervals_ns", "step_period_ns", "IDLE_MIN_GAP_NS", "LAUNCH_PACE_FACTOR", "CAUSES"]

IDLE_MIN_GAP_NS = 10_000  # gaps shorter than 10 us get one row of their own in the idle table, unlabelled
# A gap is launch-bound when the operation that ended it was issued within this many times the CPU's median
# spacing between two issuing calls after the previous one: the CPU was issuing work at its usual pace and
# the GPU still ran dry. A stated choice, not a law: the idle table's note prints it.
LAUNCH_PACE_FACTOR = 2.0
_ISSUE_CALL = re.compile(r"Launch|Memcpy|Memset")  # CUDA calls that put work on the GPU
CAUSES = {
    "queued": "already launched (GPU-side wait)",
    "paced": "launch-bound (CPU issuing at its usual pace)",
    "sync": "synchronize",
    "copy": "copy or memset call",
    "launch": "launch call",
    "other": "other CUDA call",
    "host": "host code (Python, framework, data loading)",
    "short": "gaps under 10 us",
    "untraced": "unknown (no CUDA API calls in the capture)",
}
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
    step_launches: np.ndarray | None = None  # correlation ids of the launches made inside steps (see load)
    _segments: list[tuple[int, int]] | None = field(default=None, repr=False)

    def in_steps(self, df: pd.DataFrame) -> pd.DataFrame:
        """The rows of ``df`` (kernels, copies, memsets) that the steps launched, found by the launching
        call's correlation id; where the capture cannot tell (no CUDA API calls), the rows that start
        inside :attr:`segments`. A step's work may run long after its range closed (a CPU that runs
        ahead), and work launched before the steps may run inside them: the launch decides."""
        if df.empty or self.step_launches is None:
            return _inside(df, self.segments)
        return df[df["correlationId"].isin(self.step_launches)]

    @property
    def work(self) -> pd.DataFrame:
        """Kernels, copies and memsets in one table (start, end, correlationId): everything the GPU ran.

        Built anew at each use, not kept: at 5 million kernels it is 120 MB. What needs only whether
        there is work, or its span, asks :attr:`has_work` or :attr:`work_span`, which build nothing."""
        parts = [d[["start", "end", "correlationId"]] for d in (self.kernels, self.copies, self.memsets) if not d.empty]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["start", "end", "correlationId"])

    @property
    def has_work(self) -> bool:
        """Whether the GPU ran anything: a kernel, a copy or a memset."""
        return any(len(d) for d in (self.kernels, self.copies, self.memsets))

    @property
    def work_span(self) -> tuple[int, int]:
        """The first start and the last end of everything the GPU ran (:func:`gpuprof.activity.window_of` of
        :attr:`work`); needs :attr:`has_work`."""
        parts = [d for d in (self.kernels, self.copies, self.memsets) if len(d)]
        return min(int(d["start"].min()) for d in parts), max(int(d["end"].max()) for d in parts)

    @property
    def window(self) -> tuple[int, int] | None:
        """From the start of the first of :attr:`segments` to the end of the last; None without steps or GPU work."""
        segs = self.segments
        return (segs[0][0], segs[-1][1]) if segs else None

    @property
    def segments(self) -> list[tuple[int, int]]:
        """The stretches of the capture that the report measures, sorted and disjoint.

        One per run of steps: a process's steps up to a restart of their numbering (a step number
        not above the one before it). A sweep that runs its loop five times, each from step 0, holds
        five runs, and the model building and NCCL set-up between them belong to no step. A run's
        stretch goes from its first step's start to its last step's end, or to the end of the last
        GPU work launched inside its steps when that is later: a CPU that runs ahead of the GPU
        closes its last step range while the GPU still has the step's work to do. Stretches that
        overlap (the processes of one job) are merged. Without steps: the span of the GPU's work.
        """
        if self._segments is None:
            self._segments = _segments(self)
        return self._segments


def _nsys(path: Path) -> ActivityView:
    from ..nsys import sqlite as ns

    try:  # the columns the report reads (not globalPid: the steps' process comes from the launching thread)
        kernels = ns.kernels(path, launch=False, only=("deviceId", "streamId", "correlationId", "name", "demangled"))
    except ns.NoKernelRows:  # a capture of a program that launched no kernel (or of the CPU only)
        kernels = pd.DataFrame(columns=["start", "end", "duration_ns", "name", "demangled", "correlationId", "streamId"])
    info = ns.gpu_info(path)
    return ActivityView(path=path, tool="nsys", kernels=kernels, copies=ns.memcpy(path), memsets=ns.memset(path),
                        runtime=ns.runtime_calls(path), ranges=ns.nvtx_ranges(path),
                        devices=[str(n) for n in info["name"]] if "name" in info else [])


_RUNTIME_COLUMNS = ("start", "end", "name", "correlationId", "globalTid")
"""The CUDA calls' columns the report reads (its measures, the steps' launches, the API table)."""


def _kineto(path: Path) -> ActivityView:
    from ..torch_profiler.trace import read_trace

    t = read_trace(path)
    copies = t.copies().copy(deep=False)  # copy-on-write: the columns added here stay out of the Trace, unduplicated
    for table in (copies,):
        if "bytes" not in table:  # ROCm traces (and old Kineto) leave the size out: unknown, not 0
            table["bytes"] = np.nan
    if not copies.empty:
        parts = copies["name"].astype(str).str.extract(_COPY_NAME)
        copies["kind"] = parts[0].map(lambda k: _DIRECTIONS.get(k, k) if isinstance(k, str) else "unknown")
        copies["src_memory"] = parts[1].fillna("")
        copies["dst_memory"] = parts[2].fillna("")
    kernels = t.kernels().copy(deep=False)
    kernels["demangled"] = kernels["name"]
    memsets = t.memsets().copy(deep=False)
    if "bytes" not in memsets:
        memsets["bytes"] = np.nan
    devices = [str(n) for n in t.devices["name"]] if not t.devices.empty and "name" in t.devices else []
    # The view keeps the trace for its operators and memory events; its flow events served only to fill missing
    # correlation ids, which the reading has done. Let go here, they are not held through every later stage of the
    # report (at 2 GB the flow table is the largest table the report does not read again).
    t._tables.pop("flow", None)
    return ActivityView(path=path, tool="kineto", kernels=kernels, copies=copies, memsets=memsets,
                        runtime=t.runtime_calls(columns=_RUNTIME_COLUMNS), ranges=t.annotations(), devices=devices,
                        extra={"trace": t})


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
    return find_view_steps(view, steps)


def find_view_steps(view: ActivityView, steps: str | None = None) -> ActivityView:
    """Find a read capture's steps, their runs, and the GPU work each launched (in place; returns ``view``).

    Apart from :func:`load` so that a timeline built in memory (a test's, with the GPU lagging the
    CPU by many steps) goes through exactly the step rules a file does.
    """
    view.steps, view.step_rule = activity.find_steps(view.ranges, steps)
    view.steps["pid"] = _pids(view, view.steps)
    view.steps["run"] = _runs(view.steps)
    view.steps["gpu_first"], view.steps["gpu_last"], view.step_launches = _step_work(view)
    return view


def _runs(steps: pd.DataFrame) -> np.ndarray:
    """The run of each step: per process, a new run starts where the step number does not go up."""
    run = np.zeros(len(steps), dtype=np.int64)
    if len(steps) == 0:
        return run
    pids = pd.Series(steps["pid"]).astype(str).to_numpy() if "pid" in steps else np.zeros(len(steps)).astype(str)
    first = 0
    for pid in dict.fromkeys(pids):
        idx = np.flatnonzero(pids == pid)
        idx = idx[np.argsort(steps["start"].to_numpy()[idx], kind="stable")]
        num = steps["step"].to_numpy(dtype=np.int64)[idx]
        restart = np.concatenate([[0], (np.diff(num) <= 0).astype(np.int64)])
        run[idx] = first + np.cumsum(restart)
        first = int(run[idx].max()) + 1
    return run


def _step_work(view: ActivityView) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Per step, the first start and the last end of the GPU work launched inside it (on any thread of
    the step's process; NaN for a step that launched nothing), and the correlation ids of every launch
    made inside a step (None when the capture cannot tell: no steps, or no CUDA API calls)."""
    n = len(view.steps)
    first, last = np.full(n, np.nan), np.full(n, np.nan)
    if n == 0:
        return first, last, None
    work = view.work.dropna(subset=["correlationId"])
    runtime = view.runtime.dropna(subset=["correlationId"]) if not view.runtime.empty else view.runtime
    if n == 0 or work.empty or runtime.empty:
        return first, last, None
    ranges = view.steps[["start", "end"]].assign(text=[str(i) for i in range(n)],
                                                  globalTid=view.steps["globalTid"].to_numpy())
    hits = activity.attribute_kernels(work, runtime, ranges, rule="window")
    if len(hits) and view.tool == "nsys" and pd.Series(view.steps["pid"]).nunique() > 1:
        # one report around a multi-process job: a step owns only its own process's launches
        owner = view.steps["pid"].to_numpy()[hits["range_text"].astype(int).to_numpy()]
        hits = hits[pid_of(hits["launch_tid"].to_numpy(dtype=np.int64)) == owner]
    if len(hits):
        g = hits.groupby(hits["range_text"].astype(int))
        idx = g.size().index.to_numpy()
        first[idx] = g["start"].min().to_numpy(dtype=float)
        last[idx] = g["end"].max().to_numpy(dtype=float)
    return first, last, np.unique(hits["correlationId"].to_numpy())


def _segments(view: ActivityView) -> list[tuple[int, int]]:
    if view.steps.empty:
        return [view.work_span] if view.has_work else []
    st = view.steps
    run = st["run"] if "run" in st else pd.Series(np.zeros(len(st), dtype=np.int64))
    lo = st.groupby(run)["start"].min()
    hi = np.maximum(st.groupby(run)["end"].max().to_numpy(dtype=float),
                    st.groupby(run)["gpu_last"].max().fillna(-np.inf).to_numpy(dtype=float)
                    if "gpu_last" in st else -np.inf)
    s, e = activity.merge_intervals(lo.to_numpy(dtype=np.int64), hi.astype(np.int64))
    return [(int(a), int(b)) for a, b in zip(s, e)]


def _inside(df: pd.DataFrame, segs: list[tuple[int, int]]) -> pd.DataFrame:
    """Rows that start inside one of ``segs`` (sorted, disjoint)."""
    if df.empty or not segs:
        return df.iloc[0:0]
    t = df["start"].to_numpy(dtype=np.int64)
    if len(segs) == 1:  # one stretch: two comparisons, no index arrays
        ok = (t >= segs[0][0]) & (t < segs[0][1])
        return df.copy(deep=False) if ok.all() else df[ok]
    lo = np.array([a for a, _ in segs], dtype=np.int64)
    hi = np.array([b for _, b in segs], dtype=np.int64)
    i = np.searchsorted(lo, t, side="right") - 1
    ok = (i >= 0) & (t < hi[np.clip(i, 0, None)])
    # every row (a capture without steps: the window is the work's span): a shallow copy, not a second table
    return df.copy(deep=False) if ok.all() else df[ok]


def _count_inside(df: pd.DataFrame, segs: list[tuple[int, int]]) -> int:
    """``len(_inside(df, segs))``, without the copy of the rows."""
    if df.empty or not segs:
        return 0
    t = df["start"].to_numpy(dtype=np.int64)
    lo = np.array([a for a, _ in segs], dtype=np.int64)
    hi = np.array([b for _, b in segs], dtype=np.int64)
    i = np.searchsorted(lo, t, side="right") - 1
    return int(((i >= 0) & (t < hi[np.clip(i, 0, None)])).sum())


def _gap_lengths(merged: tuple[np.ndarray, np.ndarray], seg: tuple[int, int]) -> np.ndarray:
    """Every stretch of ``seg`` in which no interval of ``merged`` (the work's union, :func:`gpuprof.activity.merge_intervals`)
    ran, clipped to it, as in :func:`gpuprof.activity.idle_gaps`."""
    lo, hi = seg
    s, e = merged
    if len(s) == 0:
        return np.array([hi - lo], dtype=np.int64)
    s2, e2 = np.clip(s, lo, hi), np.clip(e, lo, hi)
    keep = e2 > s2
    s2, e2 = s2[keep], e2[keep]
    gaps = np.concatenate([[lo], e2]) , np.concatenate([s2, [hi]])
    d = gaps[1] - gaps[0]
    return d[d > 0]


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


def _work_union(view: ActivityView) -> tuple[np.ndarray, np.ndarray]:
    """The union of everything the GPU ran (:func:`gpuprof.activity.merge_intervals` of :attr:`ActivityView.work`),
    built per table and then merged: each table comes sorted, so no concatenated copy of the work is sorted."""
    parts = [activity.merge_intervals(d["start"].to_numpy(), d["end"].to_numpy())
             for d in (view.kernels, view.copies, view.memsets) if len(d)]
    if not parts:
        return np.array([], dtype=np.int64), np.array([], dtype=np.int64)
    parts.sort(key=lambda p: -len(p[0]))
    s, e = parts[0]
    for ps, pe in parts[1:]:  # the smaller unions inserted in order (the union does not depend on ties' order)
        at = np.searchsorted(s, ps, side="right")
        s, e = np.insert(s, at, ps), np.insert(e, at, pe)
    return activity.merge_intervals(s, e) if len(parts) > 1 else (s, e)


def _busy_ns(df: pd.DataFrame | tuple[np.ndarray, np.ndarray], segs: list[tuple[int, int]]) -> int:
    """Nanoseconds of ``segs`` covered by at least one row of ``df`` (the union, clipped to each stretch); ``df``
    may be a union already (starts, ends)."""
    if isinstance(df, tuple):
        s, e = df
    elif df.empty:
        return 0
    else:
        s, e = activity.merge_intervals(df["start"].to_numpy(), df["end"].to_numpy())
    total = 0
    for lo, hi in segs:  # the intervals that reach into [lo, hi), their ends clipped: no clipped copy of them all
        i, j = int(np.searchsorted(e, lo, side="right")), int(np.searchsorted(s, hi, side="left"))
        if j > i:
            total += int((e[i:j] - s[i:j]).sum()) - max(0, lo - int(s[i])) - max(0, int(e[j - 1]) - hi)
    return total


def _by_device(df: pd.DataFrame) -> dict:
    """The rows of each GPU (one group when the table does not say which GPU)."""
    if df.empty:
        return {}
    if "deviceId" not in df or df["deviceId"].isna().all():
        return {0: df}
    return {d: g for d, g in df.groupby(df["deviceId"].fillna(-1))}


def _exposed_ns(shown: pd.DataFrame, hiding: pd.DataFrame, segs: list[tuple[int, int]]) -> int:
    """Time in ``segs`` when some of ``shown`` ran on a GPU and none of ``hiding`` ran on that GPU, summed over GPUs."""
    hide = _by_device(hiding)
    total = 0
    for dev, rows in _by_device(shown).items():
        h = hide.get(dev, hiding.iloc[0:0])
        total += sum(activity.exposed_ns(rows, h, seg) for seg in segs)
    return total


def headline(view: ActivityView) -> dict[str, float]:
    """The numbers a capture is summed up by (and that ``diff`` compares), over :attr:`ActivityView.segments`.

    window_ms (their total length), runs (where more than one), steps, step_period_ms (mean CPU
    start-to-start of consecutive steps), gpu_step_ms (the same from each step's first GPU
    operation to the next step's), step_ms (median CPU range of a step); kernels, kernels_per_step
    (all GPUs), kernel_ms (sum of kernel durations), copies, copy_ms and copy_bytes count the work
    the steps launched (:meth:`ActivityView.in_steps`); gpu_busy (union of kernels, copies and memsets
    over the window), kernel_busy (kernels alone), idle_ms, copy_exposed_ms (copy
    time with no kernel running on the same GPU), nccl_ms and nccl_exposed_ms (NCCL kernel time, and
    the part of it with no other kernel running on the same GPU; where NCCL ran; nccl_kernels, their
    count), nccl_overlap (the share
    of the time NCCL kernels ran that other kernels ran too on the same GPU, pooled over GPUs: HTA's
    communication/computation overlap on the file's nanoseconds),
    copy_bytes, api_calls.
    """
    if getattr(view, "lean", False):  # an export read in passes (gpuprof.report.lean_nsys): it answers itself
        return view.headline()
    segs = view.segments
    if not segs:
        return {"window_ms": 0.0, "steps": 0, "kernels": 0}
    k, c = view.in_steps(view.kernels), view.in_steps(view.copies)
    span = sum(b - a for a, b in segs)
    busy = _busy_ns(_work_union(view), segs)
    out: dict[str, float] = {"window_ms": span / 1e6}
    runs = int(view.steps.groupby(view.steps["pid"].astype(str))["run"].nunique().max()) \
        if "run" in view.steps and len(view.steps) else 0  # per process: a sweep's restarts, not a job's ranks
    if runs > 1:
        out["runs"] = runs
    out |= {
        "steps": len(view.steps), "kernels": len(k),
        "kernel_ms": float(k["duration_ns"].sum()) / 1e6 if len(k) else 0.0,
        "gpu_busy": busy / span if span else 0.0, "kernel_busy": _busy_ns(view.kernels, segs) / span if span else 0.0,
        "idle_ms": (span - busy) / 1e6, "copies": len(c), "copy_ms": float(c["duration_ns"].sum()) / 1e6 if len(c) else 0.0,
        "copy_exposed_ms": _exposed_ns(view.copies, view.kernels, segs) / 1e6,
        "copy_bytes": float(c["bytes"].sum(min_count=1)) if len(c) else 0.0, "api_calls": _count_inside(view.runtime, segs),
    }
    comm = is_communication(view.kernels["name"]) if len(view.kernels) else pd.Series(dtype=bool)
    if comm.any():
        nccl = view.kernels[comm.to_numpy()]
        out["nccl_ms"] = float(view.in_steps(nccl)["duration_ns"].sum()) / 1e6
        out["nccl_kernels"] = len(view.in_steps(nccl))
        out["nccl_exposed_ms"] = _exposed_ns(nccl, view.kernels[~comm.to_numpy()], segs) / 1e6
        # HTA's denominator: the time some NCCL kernel ran, per GPU (as the exposed time is), not summed durations
        union = sum(_busy_ns(rows, segs) for rows in _by_device(nccl).values())
        out["nccl_overlap"] = 1 - out["nccl_exposed_ms"] * 1e6 / union if union else float("nan")
    if len(view.steps):
        d = (view.steps["end"] - view.steps["start"]).to_numpy() / 1e6
        # One report around a multi-process job (nsys around torchrun) holds every rank's steps:
        # a step is then one range per process, and the step count is per process.
        procs = max(1, int(pd.Series(view.steps["pid"]).nunique())) if "pid" in view.steps else 1
        per_process = len(view.steps) / procs
        if procs > 1:
            out["processes"] = procs
        # Three step times. Start to start on the CPU counts everything a step costs the CPU, its waits
        # for the GPU included; first GPU operation to the next step's first is the GPU's pace (in a loop
        # whose CPU runs ahead, the CPU's range says little of it); the median CPU range is what the
        # CPU spends inside a step (in an asynchronous loop, shorter than the GPU's work).
        out["step_period_ms"] = step_period_ns(view.steps, fallback=span / per_process) / 1e6
        if "gpu_first" in view.steps and view.steps["gpu_first"].notna().any():
            gpu = view.steps.dropna(subset=["gpu_first"])
            gpu = gpu.assign(start=gpu["gpu_first"].astype(np.int64))
            period = step_period_ns(gpu, fallback=np.nan)
            if np.isfinite(period):
                out["gpu_step_ms"] = period / 1e6
        out["step_ms"] = float(np.median(d))
        out["kernels_per_step"] = len(k) / per_process
    return out


def step_intervals_ns(steps: pd.DataFrame) -> np.ndarray:
    """Each step's start to the next one's, over consecutive steps of one process (ns, in step order).

    Only pairs numbered n, n+1 in the same process count: a capture of several runs (a sweep
    that restarts at step 0) has gaps between runs that are no step's. Given each step's first
    GPU operation as ``start``, these are the GPU's intervals. Kept apart from their mean
    (:func:`step_period_ns`) so that a reader can set the median beside it: in a loop that waits
    for the GPU once in fifty steps, that one wait is in the mean and not in the median.
    """
    gaps = []
    for _, g in steps.groupby(steps["pid"] if "pid" in steps else np.zeros(len(steps))):
        g = g.sort_values("start")
        num, start = g["step"].to_numpy(), g["start"].to_numpy(dtype=np.int64)
        ok = np.diff(num) == 1
        gaps.append(np.diff(start)[ok])
    return np.concatenate(gaps) if gaps else np.array([], dtype=np.int64)


def step_period_ns(steps: pd.DataFrame, *, fallback: float) -> float:
    """The mean time from one step's start to the next one's (:func:`step_intervals_ns`).

    Start to start counts everything a step costs, the CPU's work and its waits for the GPU
    (the one step in fifty that reads the loss back), which the median CPU range does not;
    the mean, not the median, so that it times the number of intervals is the time from the
    first step's start to the last one's: a throughput over the capture.
    ``fallback`` when no pair of consecutive steps exists. Given each step's first GPU
    operation as ``start``, it is the GPU's pace.
    """
    d = step_intervals_ns(steps)
    return float(d.mean()) if len(d) else float(fallback)


def _call_cause(names: pd.Series) -> np.ndarray:
    """Each gap's cause from the name of the call that overlaps it most, as an object array: the rule applied to
    each distinct name once (a numpy array of text of a million gaps took 4 bytes per character of the longest
    cause, about 200 MB, at 20 million kernels)."""
    every = names.astype(str)
    codes, _ = pd.factorize(every, use_na_sentinel=False)
    first = pd.Series(codes).drop_duplicates()  # each distinct name's first row, in code order
    call = every.iloc[first.index.to_numpy()[np.argsort(first.to_numpy())]].reset_index(drop=True)
    cause = np.select([call.str.contains("Synchronize"), call.str.contains("Memcpy|Memset"), call.str.contains("Launch"),
                       call != ""], [CAUSES["sync"], CAUSES["copy"], CAUSES["launch"], CAUSES["other"]],
                      CAUSES["host"]).astype(object)
    return cause[codes] if len(codes) else np.array([], dtype=object)


def _first_rows(keys: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each of ``wanted`` (floats, NaN for none): the index of the first row of ``keys`` equal to it, and whether
    there is one. The lookup ``drop_duplicates(key).set_index(key).reindex(wanted)`` does, on arrays: only the rows
    whose key is wanted are sorted, not a copy of the whole table."""
    found = np.zeros(len(wanted), dtype=bool)
    index = np.zeros(len(wanted), dtype=np.int64)
    want = np.unique(wanted[np.isfinite(wanted)])
    if len(want) == 0 or len(keys) == 0:
        return index, found
    pos = np.clip(np.searchsorted(want, keys), 0, len(want) - 1)
    rows = np.flatnonzero(want[pos] == keys)           # rows whose key is wanted, in table order
    uniq, first = np.unique(keys[rows], return_index=True)  # the first of each key
    if len(uniq) == 0:
        return index, found
    at = np.clip(np.searchsorted(uniq, np.nan_to_num(wanted, nan=-np.inf)), 0, len(uniq) - 1)
    found = uniq[at] == wanted
    index[found] = rows[first[at[found]]]
    return index, found


def _name_matches(names: pd.Series, pattern: re.Pattern) -> np.ndarray:
    """``names.astype(str).str.contains(pattern)`` as a boolean array, each distinct name tested once."""
    codes, uniq = activity.name_codes(names)
    hit = np.array([pattern.search(str(u)) is not None for u in uniq], dtype=bool)
    return hit[codes] if len(uniq) else np.zeros(len(names), dtype=bool)


def _launch_pace(view: ActivityView, gaps: pd.DataFrame, factor: float) -> tuple[np.ndarray, np.ndarray]:
    """Per gap: whether the GPU work that ended it had been launched before the gap began (its launching
    call had returned), and whether it was issued at the CPU's usual pace (see :data:`LAUNCH_PACE_FACTOR`).

    On arrays, not copies of the work and call tables: at 5 million kernels the copies were the report's peak."""
    n = len(gaps)
    queued, paced = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    tables = [d for d in (view.kernels, view.copies, view.memsets) if len(d)]  # the work's rows, in its order
    w_corr = (np.concatenate([d["correlationId"].to_numpy(dtype=float, na_value=np.nan) for d in tables])
              if tables else np.array([]))
    r_corr = view.runtime["correlationId"].to_numpy(dtype=float, na_value=np.nan) if len(view.runtime) else np.array([])
    w_ok, r_ok = np.isfinite(w_corr), np.isfinite(r_corr)
    if n == 0 or not w_ok.any() or not r_ok.any():
        return queued, paced
    # the operation that ends each gap: the first (in time, then table order) to start at the gap's end
    w_start = np.concatenate([d["start"].to_numpy(dtype=np.int64) for d in tables])[w_ok]
    order = np.argsort(w_start, kind="stable")
    starts_sorted = w_start[order]
    ends = gaps["end"].to_numpy(dtype=np.int64)
    at = np.clip(np.searchsorted(starts_sorted, ends, side="left"), 0, len(starts_sorted) - 1)
    cid = np.where(starts_sorted[at] == ends, w_corr[w_ok][order[at]], np.nan)
    del order, starts_sorted
    # its launching call: the first call with that correlation id
    r_rows = np.flatnonzero(r_ok)
    first, found = _first_rows(r_corr[r_ok], cid)
    call_row = r_rows[first]
    c_start = np.where(found, view.runtime["start"].to_numpy()[call_row].astype(float), np.nan)
    c_end = np.where(found, view.runtime["end"].to_numpy()[call_row].astype(float), np.nan)
    issue = _name_matches(view.runtime["name"], _ISSUE_CALL)
    starts = view.runtime["start"].to_numpy(dtype=np.int64)[issue]
    if not view.segments:
        starts = starts[:0]
    elif len(starts):
        lo = np.array([a for a, _ in view.segments], dtype=np.int64)
        hi = np.array([b for _, b in view.segments], dtype=np.int64)
        i = np.searchsorted(lo, starts, side="right") - 1
        starts = starts[(i >= 0) & (starts < hi[np.clip(i, 0, None)])]
    return pace_of(gaps, c_start, c_end, np.sort(starts), factor)


def _median_in_place(d: np.ndarray) -> float:
    """``float(np.median(d))`` of an integer array, partitioning ``d`` itself instead of a copy (at 20 million calls
    the copy was 160 MB): the middle value, or the float64 mean of the two middle ones, as numpy takes it."""
    n = len(d)
    k = n // 2
    if n % 2:
        d.partition(k)
        return float(d[k])
    d.partition([k - 1, k])
    return float(np.mean(d[k - 1:k + 1].astype(np.float64)))


def _diff_in_place(a: np.ndarray, step: int = 1 << 18) -> np.ndarray:
    """``np.diff(a)``, written over ``a``'s first ``len(a) - 1`` places (returned as a view), a step at a time: each
    step reads the next step's first value before that one is overwritten."""
    n = len(a)
    for i in range(0, n - 1, step):
        j = min(i + step, n - 1)
        a[i:j] = a[i + 1:j + 1] - a[i:j]
    return a[:n - 1]


def pace_of(gaps: pd.DataFrame, c_start: np.ndarray, c_end: np.ndarray, starts: np.ndarray,
            factor: float, *, consume: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_launch_pace` from each gap's launching call (``c_start``, ``c_end``: float ns, NaN for none) and the
    sorted starts of the issuing calls inside the segments: apart so that a reader of an export too large to hold
    (:mod:`gpuprof.report.lean_nsys`) finds those in its own passes and decides by the same rule. ``consume``:
    ``starts`` (int64) may be overwritten, so the spacings between them are taken in its place, a step at a time
    (the same values; no second array of 20 million)."""
    n = len(gaps)
    paced = np.zeros(n, dtype=bool)
    queued = np.nan_to_num(c_end, nan=np.inf) <= gaps["start"].to_numpy(dtype=float)
    if len(starts) < 3:
        return queued, paced
    prev_i = np.searchsorted(starts, np.nan_to_num(c_start, nan=-1), side="left") - 1
    prev = np.where(prev_i >= 0, starts[np.clip(prev_i, 0, None)], np.nan)
    usual = _median_in_place(_diff_in_place(starts) if consume else np.diff(starts))
    with np.errstate(invalid="ignore"):
        paced = ~queued & np.isfinite(c_start) & ((c_start - prev) <= factor * usual)
    return queued, paced


def idle_by_cause(view: ActivityView, *, min_gap_ns: int = IDLE_MIN_GAP_NS,
                  pace_factor: float = LAUNCH_PACE_FACTOR) -> pd.DataFrame:
    """Where the GPU ran nothing, grouped by what the CPU was doing; the rows sum to the idle time.

    Each gap of at least ``min_gap_ns`` gets a cause (:data:`CAUSES`), in this order:

    * ``already launched``: the work that ended the gap had been launched before the gap began (its
      call had returned): the GPU waited on something of its own (a dependency between streams,
      an event, a graph's order), not on the CPU;
    * ``launch-bound``: that work was issued less than ``pace_factor`` times the CPU's median
      spacing between two issuing calls after the call before it: the CPU was issuing work at its
      usual pace (Python, the framework's dispatch and the launch call, per operation) and the GPU
      ran each operation faster. The whole gap counts;
    * otherwise the CUDA call that overlaps the gap most (:func:`gpuprof.activity.idle_gaps`) takes the
      part of the gap it covers: ``synchronize`` (the CPU waited for a GPU that had run out of
      work), a blocking ``copy or memset call``, a ``launch call``, ``other CUDA call``; the rest
      of the gap is ``host code`` (no CUDA call: Python, the framework, data loading, the program's
      own work), so a 2 ms data-loading gap that ends in a 20 us copy call counts 20 us to the copy.

    Shorter gaps are one row, unlabelled; a capture without CUDA API calls (nsys without ``-t cuda``)
    says its causes are unknown. Columns: cause, gaps (that have time of this cause), idle_ms, share
    (of all the idle time in the window: the rows add up to :func:`headline`'s idle_ms).
    """
    cols = ["cause", "gaps", "idle_ms", "share"]
    segs = view.segments
    if not segs or not view.has_work:  # no GPU work: nothing ended a gap, so nothing to ask about
        return pd.DataFrame(columns=cols)
    merged = _work_union(view)
    lengths = np.concatenate([_gap_lengths(merged, seg) for seg in segs])
    short = lengths[lengths < min_gap_ns]
    del lengths
    # the short gaps are one row: counted and summed here, not a table row each (millions in a long capture)
    short_cause = CAUSES["short"].replace("10 us", f"{min_gap_ns / 1e3:g} us")
    short_row = {"gaps": int((short > 0).sum()), "ns": int(short.sum())}
    del short
    union = pd.DataFrame({"start": merged[0], "end": merged[1]})  # idle_gaps merges again: the union is its own union
    del merged
    gaps = pd.concat([activity.idle_gaps(union, view.runtime, min_gap_ns=min_gap_ns, window=seg) for seg in segs],
                     ignore_index=True)
    del union
    return idle_table(gaps, short_row, short_cause,
                      None if view.runtime.empty else lambda g: _launch_pace(view, g, pace_factor))


def idle_table(gaps: pd.DataFrame, short_row: dict[str, int], short_cause: str,
               pace: Callable[[pd.DataFrame], tuple[np.ndarray, np.ndarray]] | None) -> pd.DataFrame:
    """:func:`idle_by_cause`'s table from the gaps of :func:`gpuprof.activity.idle_gaps` (over every segment, in
    its order), the short gaps' count and sum (``short_row``: gaps, ns), and ``pace``, which says of each gap
    whether it was already launched and whether launch-bound (None: the capture has no CUDA API calls)."""
    cols = ["cause", "gaps", "idle_ms", "share"]
    parts: list[pd.DataFrame] = []
    if len(gaps):
        dur = gaps["duration_ns"].to_numpy(dtype=float)
        ids = np.arange(len(gaps))
        if pace is None:
            parts.append(pd.DataFrame({"cause": CAUSES["untraced"], "ns": dur, "gap": ids}))
        else:
            queued, paced = pace(gaps)
            whole = np.full(len(gaps), "", dtype=object)  # object, not numpy text: 8 bytes a gap (see _call_cause)
            whole[paced] = CAUSES["paced"]
            whole[queued] = CAUSES["queued"]  # before the launch pace
            split = ~(queued | paced)
            covered = dur * gaps["cpu_call_share"].to_numpy(dtype=float)
            parts += [pd.DataFrame({"cause": whole[~split], "ns": dur[~split], "gap": ids[~split]}),
                      pd.DataFrame({"cause": _call_cause(gaps["cpu_call"])[split], "ns": covered[split], "gap": ids[split]}),
                      pd.DataFrame({"cause": CAUSES["host"], "ns": (dur - covered)[split], "gap": ids[split]})]
    parts = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({"cause": [], "ns": [], "gap": []})
    parts = parts[parts["ns"] > 0]
    g = parts.groupby("cause")
    out = pd.DataFrame({"gaps": g["gap"].nunique(), "idle_ms": g["ns"].sum() / 1e6})
    if short_row["gaps"]:  # in its place in the causes' order, as a group of its own rows would be
        row = pd.DataFrame({"gaps": [short_row["gaps"]], "idle_ms": [short_row["ns"] / 1e6]}, index=[short_cause])
        out = pd.concat([out, row]).sort_index() if len(out) else row
    if out.empty:
        return pd.DataFrame(columns=cols)
    out = out.rename_axis("cause").reset_index()
    out["share"] = out["idle_ms"] / out["idle_ms"].sum()
    return out.sort_values("idle_ms", ascending=False, ignore_index=True)[cols]


# ----- kernels by name, for diff -----

def compact_name(demangled: str) -> str:
    """A demangled kernel name made readable: no return type, no parameter list, no namespaces, no casts
    before template literals (``void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_nn_align1>(T1::Params)``
    becomes ``Kernel2<cutlass_80_simt_sgemm_64x64_8x5_nn_align1>``). For reading only: two names may
    compact to one, which :func:`kernel_labels` checks."""
    s = str(demangled).strip()
    if s.endswith(")"):  # the parameter list: the last parenthesised group, matched from the end
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                if i > 0 and s[:i].count("<") == s[:i].count(">"):
                    s = s[:i]
                break
    s = re.sub(r"\bvoid\s+", "", s)
    s = re.sub(r"(?:<unnamed>|\(anonymous namespace\)|\b[A-Za-z_]\w*)::", "", s)
    s = re.sub(r"\((?:unsigned |signed )?[A-Za-z_]\w*\)(?=-?\d)", "", s)
    return s.strip()


def cross_tool_key(demangled: str) -> str:
    """A demangled kernel name reduced to what nsys and the PyTorch profiler print alike.

    The two tools demangle with different demanglers: nsys writes ``<unnamed>``, ``(int)4``,
    ``(bool)1``, ``[lambda(int) (instance 1)]``, template parameter names in parameter lists
    (``const T1 *``) and ``void`` before nested function names; the PyTorch profiler (the C++ ABI's
    demangler) writes ``(anonymous namespace)``, ``4``, ``true``, ``{lambda(int)#1}``, the types
    themselves and ``1ul``. The key keeps the namespaces, the name and its template arguments,
    normalises those spellings and drops every parenthesised part (parameter lists), so one kernel
    has one key in both tools (all 32 kernels of chapter 5's batch-256 step, and all 30 at batch 2048,
    match one to one between its nsys export and its trace).
    """
    s = str(demangled).replace("(anonymous namespace)", "<unnamed>")
    s = re.sub(r"\[lambda\([^\]]*?\) \(instance (\d+)\)\]", r"lambda#\1", s)
    s = re.sub(r"\{lambda\([^}]*?\)#(\d+)\}", r"lambda#\1", s)
    s = re.sub(r"\(bool\)1\b", "true", s)
    s = re.sub(r"\(bool\)0\b", "false", s)
    s = re.sub(r"\((?:unsigned |signed )?(?:char|short|int|long|long long)\)(-?\d+)", r"\1", s)
    previous = None
    while previous != s:  # innermost parentheses first, until none are left
        previous, s = s, re.sub(r"\([^()]*\)", "", s)
    s = re.sub(r"\b(?:void|const)\b", "", s)
    s = re.sub(r"\b(\d+)(?:ull|ul|ll|u|l)\b", r"\1", s)
    return re.sub(r"\s+", "", s)


def kernel_labels(pairs: pd.DataFrame) -> dict[str, str]:
    """A readable, unique label per demangled name among ``pairs`` (columns name, demangled).

    The short name where it stands for one kernel only; where it stands for several (CUTLASS's
    ``Kernel2`` for an FP32 SIMT GEMM and a bf16 tensor-core one, cuDNN's ``Kernel`` for an fprop
    and a split-K reduction, ATen's ``elementwise_kernel`` for every operator), the name with its
    template arguments (:func:`compact_name`), or the whole demangled name if even that is shared.
    """
    p = pairs[["name", "demangled"]].astype(str).drop_duplicates()
    shared = p.groupby("name")["demangled"].transform("nunique") > 1
    label = np.where(shared, p["demangled"].map(compact_name), p["name"])
    p = p.assign(label=label)
    clash = p.groupby("label")["demangled"].transform("nunique") > 1
    p.loc[clash, "label"] = p.loc[clash, "demangled"]
    return dict(zip(p["demangled"], p["label"]))


def kernels_by_name(view: ActivityView, labels: dict[str, str] | None = None) -> pd.DataFrame:
    """Per kernel over the window, keyed by its demangled name (one row per template instance, so an
    algorithm that changes behind one short name shows): name (the label of :func:`kernel_labels`,
    over ``labels`` when given), demangled, kind, count, total_ms; the table ``diff`` compares."""
    cols = ["name", "demangled", "kind", "count", "total_ms"]
    k = view.in_steps(view.kernels)
    if k.empty:
        return pd.DataFrame(columns=cols)
    k = k.assign(demangled=k["demangled"].fillna(k["name"]).astype(str) if "demangled" in k else k["name"].astype(str))
    g = k.groupby("demangled", sort=False)
    out = pd.DataFrame({"count": g.size(), "total_ms": g["duration_ns"].sum() / 1e6, "short": g["name"].first()}).reset_index()
    labels = labels if labels is not None else kernel_labels(k)
    out["name"] = out["demangled"].map(labels).fillna(out["short"])
    out["kind"] = [kernel_kind(n, d) for n, d in zip(out["short"], out["demangled"])]
    return out.sort_values("total_ms", ascending=False, ignore_index=True)[cols]
