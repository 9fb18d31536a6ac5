"""What a PyTorch profiler trace says, summarised: the tables ``key_averages()`` prints, and per-step measures.

``prof.key_averages()`` exists only in the process that profiled; a trace file outlives
it, and is what a colleague sends. These functions compute from the file the columns a
reader knows from ``key_averages().table()``, so the two can be checked against each
other (the course's tests do, on traces and ``key_averages`` records saved from the same
run), and then go where ``key_averages`` cannot: per-step GPU busy and idle time, and
launch latency, with the same definitions the Nsight Systems chapters use
(:mod:`gpuprof.activity`).

* :func:`self_times`: each CPU event's self time (its duration less its children's on the
  same thread);
* :func:`op_summary`: per name, calls, CPU total and self CPU time, as ``key_averages``;
* :func:`kernel_summary`: per kernel name, calls and GPU time (``key_averages``' self
  device time of the kernel's row);
* :func:`step_summary`: per ``ProfilerStep#N``, CPU time, launches, GPU busy time and share;
* :func:`launch_latency`: per kernel, from the launch call to the kernel's start;
  :func:`launch_delays` from the call's start and from its end, with the call's own duration;
* :func:`range_waits`: per ``record_function`` range, how much of its self time other threads
  spent inside operators (a range whose self time is a wait for another thread);
* :func:`range_projections`: per ``record_function`` range, its CPU time beside its projection on
  the GPU and the GPU work that projection holds;
* :func:`kernel_waves`: one kernel's blocks per SM, the blocks an SM holds at once, and the waves;
* :func:`kernel_operators`: per kernel, the operator that launched it (:func:`kernel_lineage`
  follows one kernel the whole way).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import activity
from ..errors import GpuprofError
from .trace import STEP_PATTERN, Trace

__all__ = ["self_times", "op_summary", "kernel_summary", "step_summary", "launch_latency", "launch_delays", "gpu_activity",
           "key_name", "kernel_lineage", "kernel_operators", "kernel_waves", "range_waits", "range_projections",
           "LAUNCH_FIELDS", "KERNEL_LAUNCHES"]

CPU_KINDS = ("cpu_op", "user_annotation")
# The runtime and driver calls that launch one kernel each, as Kineto names them (PyTorch's own kernels,
# cuBLAS's and cuDNN's, generated Triton kernels); cudaGraphLaunch runs many and is not one of them.
KERNEL_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def key_name(name: str) -> str:
    """The key ``key_averages()`` files an event under: ``ProfilerStep#7`` becomes ``ProfilerStep*``."""
    return "ProfilerStep*" if STEP_PATTERN.match(name) else name


def _parents(events: pd.DataFrame) -> np.ndarray:
    """Position of each event's parent (-1 for none): the innermost event on the same thread that encloses it.

    Events nest properly on one thread, so one pass over each thread's events, sorted by
    start (longest first on ties), with a stack of open events, finds every parent.
    """
    n = len(events)
    parent = np.full(n, -1, dtype=np.int64)
    order = np.lexsort((-events["end"].to_numpy(), events["start"].to_numpy(), events["globalTid"].to_numpy()))
    tids = events["globalTid"].to_numpy()[order]
    starts = events["start"].to_numpy()[order]
    ends = events["end"].to_numpy()[order]
    stack: list[int] = []
    current = None
    for i in range(n):
        if tids[i] != current:
            stack, current = [], tids[i]
        while stack and ends[stack[-1]] <= starts[i]:
            stack.pop()
        if stack:
            parent[order[i]] = order[stack[-1]]
        stack.append(i)
    return parent


def _drop_duplicate_children(names: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Which events ``key_averages`` keeps: it drops an event that is the only child of a parent of the
    same name (``aten::sum`` calling another overload of ``aten::sum``), handing its children to the
    parent, and repeats until no such pair is left. Returns a mask of the kept events; ``parent``
    is updated in place to point past the dropped ones."""
    keep = np.ones(len(names), dtype=bool)
    while True:
        live = np.flatnonzero(keep & (parent >= 0))
        counts = np.bincount(parent[live], minlength=len(names))
        drop = live[(names[live] == names[parent[live]]) & (counts[parent[live]] == 1)]
        if len(drop) == 0:
            return keep
        keep[drop] = False
        up = parent.copy()
        while True:  # re-point children of dropped events at the nearest kept ancestor
            moved = (parent >= 0) & ~keep[np.maximum(parent, 0)]
            if not moved.any():
                break
            parent[moved] = up[parent[moved]]


def self_times(events: pd.DataFrame, *, merge_duplicates: bool = True) -> pd.Series:
    """Self time (ns) of each event: its duration less the durations of its direct children.

    A child is an event on the same thread that starts inside its parent. With
    ``merge_duplicates`` (``key_averages``' rule, see :func:`_drop_duplicate_children`) an only
    child of the same name is not an event of its own: its row gets ``NA`` and its parent's
    self time is computed over its children instead.
    """
    if events.empty:
        return pd.Series(np.zeros(0, dtype=np.int64), index=events.index, name="self_ns")
    parent = _parents(events)
    keep = _drop_duplicate_children(events["name"].astype(str).to_numpy(), parent) if merge_duplicates \
        else np.ones(len(events), dtype=bool)
    dur = events["duration_ns"].to_numpy().astype(np.int64)
    live = np.flatnonzero(keep & (parent >= 0))
    children = np.bincount(parent[live], weights=dur[live], minlength=len(events)).astype(np.int64)
    out = pd.Series(dur - children, index=events.index, name="self_ns").astype("Int64")
    out[~keep] = pd.NA
    return out


def op_summary(trace: Trace, *, kinds: tuple[str, ...] = CPU_KINDS, by: str = "key") -> pd.DataFrame:
    """Per key: calls, CPU total and self CPU time in microseconds, like ``key_averages()``' CPU columns.

    Self time is computed over operators and ``record_function`` ranges together, as the
    profiler does, and an only child with its parent's name is merged into the parent, as
    the profiler does. Older PyTorch versions could print negative self times (events
    mis-parented by timestamps truncated to microseconds, pytorch/pytorch#101861, and
    grandchildren subtracted as if direct children, #128479; both fixed in 2024); these, from
    the file's nanoseconds and proper nesting, cannot.
    Sorted by self CPU time, largest first.

    ``by="thread"`` sums per thread instead (column ``thread``: the reader's ``globalTid``): self
    time partitions each thread's time, so a thread's sum is at most its wall time, while the
    sum over threads that ran at once can exceed the wall time of the whole.
    """
    if by not in ("key", "thread"):
        raise ValueError(f"by must be 'key' or 'thread', not {by!r}")
    # Only the columns used, so that the one table of operators and ranges costs five columns, not every argument's.
    need = ["start", "end", "duration_ns", "name", "globalTid"]
    frames = [trace.events(k) for k in kinds if len(trace.events(k))]
    ev = pd.concat([f[[c for c in need if c in f]] for f in frames], ignore_index=True) if frames \
        else pd.DataFrame(columns=["start", "end", "name", "globalTid"])
    cols = ["key", "calls", "cpu_total_us", "self_cpu_us"]
    if ev.empty:
        return pd.DataFrame(columns=cols)
    names = ev["name"].astype(str)
    keys = {n: key_name(n) for n in names.unique()}  # one regular-expression match per distinct name, not per event
    ev = ev.assign(self_ns=self_times(ev), key=names.map(keys))
    ev = ev[ev["self_ns"].notna()]  # only children of a parent of the same name: merged into it
    if by == "thread":
        ev = ev.assign(thread=ev["globalTid"])
        cols[0] = "thread"
    g = ev.groupby(cols[0])
    out = pd.DataFrame({"calls": g.size(), "cpu_total_us": g["duration_ns"].sum() / 1e3,
                        "self_cpu_us": g["self_ns"].sum() / 1e3}).reset_index()
    return out.sort_values(["self_cpu_us", cols[0]], ascending=[False, True], ignore_index=True)[cols]


def gpu_activity(trace: Trace) -> pd.DataFrame:
    """Kernels, copies and memsets in one table (start, end, duration_ns, name, kind, deviceId, streamId,
    correlationId): everything that kept a GPU busy."""
    parts = []
    for kind, t in (("kernel", trace.kernels()), ("memcpy", trace.copies()), ("memset", trace.memsets())):
        if len(t):
            cols = [c for c in ("start", "end", "duration_ns", "name", "deviceId", "streamId", "correlationId") if c in t]
            parts.append(t[cols].assign(kind=kind))
    if not parts:
        return pd.DataFrame(columns=["start", "end", "duration_ns", "name", "deviceId", "streamId", "correlationId",
                                     "kind"])
    return pd.concat(parts, ignore_index=True).sort_values("start", ignore_index=True)


def kernel_summary(trace: Trace, *, include_memory: bool = False) -> pd.DataFrame:
    """Per kernel name: calls, total, mean, min and max GPU time (us), and share of the total; longest first.

    The total equals ``key_averages()``' *self device time* of the kernel's row (a kernel
    has no children). With ``include_memory`` copies and memsets are rows too, under the
    names the trace gives them (``Memcpy HtoD (Pageable -> Device)``...).
    """
    t = gpu_activity(trace) if include_memory else trace.kernels()
    cols = ["name", "calls", "total_us", "mean_us", "min_us", "max_us", "share"]
    if t.empty:
        return pd.DataFrame(columns=cols)
    g = t.groupby(t["name"].astype(str))["duration_ns"]
    out = pd.DataFrame({"calls": g.size(), "total_us": g.sum() / 1e3, "mean_us": g.mean() / 1e3,
                        "min_us": g.min() / 1e3, "max_us": g.max() / 1e3}).reset_index()
    out["share"] = out["total_us"] / out["total_us"].sum()
    return out.sort_values(["total_us", "name"], ascending=[False, True], ignore_index=True)[cols]


def launch_latency(trace: Trace) -> pd.Series:
    """Per kernel: ns from the start of the CPU call that launched it to the kernel's start (as in the
    Nsight Systems chapter: :func:`gpuprof.activity.launch_latency`)."""
    return activity.launch_latency(trace.kernels().dropna(subset=["correlationId"]),
                                   trace.runtime_calls().dropna(subset=["correlationId"]))


def launch_delays(trace: Trace) -> pd.DataFrame:
    """Per kernel: the launch call's duration, and the kernel's start from the call's start and from its end
    (ns; :func:`gpuprof.activity.launch_delays`). From the end is the queue; from the start adds the call."""
    return activity.launch_delays(trace.kernels().dropna(subset=["correlationId"]),
                                  trace.runtime_calls().dropna(subset=["correlationId"]))


def range_waits(trace: Trace) -> pd.DataFrame:
    """Per ``record_function`` range name: its self time, and the part of it during which *other* threads were
    inside CPU operators.

    A range's self time is the time on its thread outside its children. For ``forward`` that
    is Python between operators: work. For a range around ``loss.backward()`` it is mostly the
    thread waiting while autograd runs the backward operators on a thread of its own: no
    work at all, yet ``key_averages()`` ranks it first by self CPU time. A large
    ``elsewhere_share`` tells the two apart. Columns: key, calls, self_cpu_us, elsewhere_us,
    elsewhere_share; largest self time first.
    """
    cols = ["key", "calls", "self_cpu_us", "elsewhere_us", "elsewhere_share"]
    ops, ann = trace.cpu_ops(), trace.annotations()
    if ann.empty:
        return pd.DataFrame(columns=cols)
    ev = pd.concat([ops[["start", "end", "name", "globalTid"]].assign(is_range=False),
                    ann[["start", "end", "name", "globalTid"]].assign(is_range=True)], ignore_index=True)
    parent = _parents(ev)
    rows = []
    for i in np.flatnonzero(ev["is_range"].to_numpy()):
        r = ev.iloc[i]
        kids = ev[parent == i].sort_values("start")
        # The range's self time as intervals: the range less its direct children (disjoint on one thread).
        lo = np.concatenate([[r["start"]], kids["end"].to_numpy()])
        hi = np.concatenate([kids["start"].to_numpy(), [r["end"]]])
        keep = hi > lo
        lo, hi = lo[keep], hi[keep]
        others = ops[ops["globalTid"] != r["globalTid"]]
        elsewhere = activity.covered_lengths(others["start"].to_numpy(), others["end"].to_numpy(), lo, hi).sum()
        rows.append({"key": key_name(str(r["name"])), "self_ns": int((hi - lo).sum()), "elsewhere_ns": int(elsewhere)})
    t = pd.DataFrame(rows)
    g = t.groupby("key")
    out = pd.DataFrame({"calls": g.size(), "self_cpu_us": g["self_ns"].sum() / 1e3,
                        "elsewhere_us": g["elsewhere_ns"].sum() / 1e3}).reset_index()
    out["elsewhere_share"] = (out["elsewhere_us"] / out["self_cpu_us"]).where(out["self_cpu_us"] > 0, 0.0)
    return out.sort_values(["self_cpu_us", "key"], ascending=[False, True], ignore_index=True)[cols]


def range_projections(trace: Trace) -> pd.DataFrame:
    """Per ``record_function`` range (``ProfilerStep#N`` included): its CPU duration beside its projection on the GPU.

    Kineto projects a range onto a GPU stream (``gpu_user_annotation``, same ``External id``)
    from the first to the last GPU activity it links to the range: work launched *on the
    range's own thread*, outside any nested range that claims it. So a range whose kernels
    are launched from another thread (``backward``: autograd's) or by its nested ranges
    (``ProfilerStep#N``: its forward, backward and optimizer) projects onto almost nothing.
    Columns: key, calls, cpu_us (median duration on the CPU), gpu_us (median duration of the
    projection; NaN where a range has none), gpu_work (the median number of kernels, copies
    and memsets inside the projection), work_names (their names, most frequent first).
    """
    cols = ["key", "calls", "cpu_us", "gpu_us", "gpu_work", "work_names"]
    cpu, gpu = trace.annotations(), trace.annotations(gpu=True)
    if cpu.empty:
        return pd.DataFrame(columns=cols)
    work = gpu_activity(trace)
    rows = []
    for r in cpu.itertuples():
        proj = gpu[gpu["externalId"] == r.externalId] if "externalId" in gpu and pd.notna(r.externalId) else gpu.iloc[0:0]
        if proj.empty:
            rows.append({"key": key_name(str(r.name)), "cpu_ns": r.duration_ns, "gpu_ns": np.nan, "n": 0, "names": []})
            continue
        p = proj.iloc[0]
        inside = work[(work["start"] >= p["start"]) & (work["end"] <= p["end"]) & (work["deviceId"] == p["deviceId"])] \
            if "deviceId" in proj else work[(work["start"] >= p["start"]) & (work["end"] <= p["end"])]
        rows.append({"key": key_name(str(r.name)), "cpu_ns": r.duration_ns, "gpu_ns": float(p["duration_ns"]),
                     "n": len(inside), "names": inside["name"].astype(str).tolist()})
    t = pd.DataFrame(rows)
    out = []
    for key, g in t.groupby("key", sort=False):
        names = pd.Series([n for ns in g["names"] for n in ns], dtype=object)
        out.append({"key": key, "calls": len(g), "cpu_us": g["cpu_ns"].median() / 1e3, "gpu_us": g["gpu_ns"].median() / 1e3,
                    "gpu_work": float(g["n"].median()), "work_names": names.value_counts().index.tolist()})
    return pd.DataFrame(out, columns=cols)


def step_summary(trace: Trace, *, rule: str, pattern: str | None = None) -> pd.DataFrame:
    """Per ``ProfilerStep#N`` (or per range matching ``pattern``: see :meth:`Trace.steps`): CPU time,
    GPU work launched in it, and how busy that kept the GPU.

    Columns: step, cpu_ms (the step's range), launches (kernels, copies and memsets whose
    launching call fell in the step), gpu_busy_ms (the union of their intervals: work on
    two streams at once counts once), gpu_span_ms (first start to last end of that work)
    and busy_share (busy over span: below 1, the GPU waited between pieces of the step's
    work). ``rule`` is :func:`gpuprof.activity.attribute_kernels`' rule, and has no default
    (the readers once had two, "thread" for NVTX attribution and "window" here; now every
    caller says which it means): ``"window"`` (any thread: what a step launched, the backward
    pass included, since autograd launches it from a thread of its own) or ``"thread"``
    (only the step's own thread, nsys's rule).
    """
    steps = trace.steps(pattern)
    cols = ["step", "cpu_ms", "launches", "gpu_busy_ms", "gpu_span_ms", "busy_share"]
    if steps.empty:
        return pd.DataFrame(columns=cols)
    ranges = steps.assign(text=steps["step"].astype(str))
    work = gpu_activity(trace).dropna(subset=["correlationId"])
    runtime = trace.runtime_calls().dropna(subset=["correlationId"])
    out = activity.range_busy(work, runtime, ranges, rule=rule)
    return out.assign(step=out["text"].astype(int))[cols]


# What Kineto records about each kernel launch (the "args" of a kernel event), as the trace names them.
LAUNCH_FIELDS = ["grid", "block", "registers per thread", "shared memory", "blocks per SM", "warps per SM",
                 "est. achieved occupancy %"]


def kernel_waves(trace: Trace, kernel: pd.Series) -> dict:
    """How many blocks of one kernel an SM holds at once, and so how many waves its grid takes.

    Kineto writes ``blocks per SM`` as the grid's blocks over the GPU's SMs: the blocks each SM
    runs over the whole grid, not at once. Its ``est. achieved occupancy %`` is the CUDA
    occupancy calculator's answer for the launch configuration (registers, shared memory,
    block size), capped by the grid's blocks per SM: an estimate, not a measurement. Read back,
    it gives the blocks an SM holds at once (``resident``: occupancy x the SM's thread slots /
    the block's threads), and the waves are blocks per SM over that. The two simplest limits are
    computed beside it from ``deviceProperties`` (``warp_limit``: the SM's thread slots over the
    block's threads, rounded up to whole warps; ``register_limit``: the SM's registers over the
    block's, registers allocated per warp in units of 256), so a reader can see which one binds.
    Returns a dict; ``resident`` is None and ``waves`` NaN where the estimate is capped by the grid
    (fewer blocks per SM than fit: at most one wave) or missing.
    """
    dev = trace.devices
    props = dev[dev["id"] == kernel["deviceId"]].iloc[0] if "id" in dev and (dev["id"] == kernel["deviceId"]).any() \
        else dev.iloc[0]
    warp = int(props["warpSize"])
    threads = int(np.prod(kernel["block"]))
    warps = -(-threads // warp)
    blocks = int(np.prod(kernel["grid"]))
    per_sm = blocks / int(props["numSms"])
    slots = int(props["maxThreadsPerMultiprocessor"])
    regs = int(kernel.get("registers per thread", 0) or 0)
    regs_per_warp = -(-regs * warp // 256) * 256
    occupancy = kernel.get("est. achieved occupancy %")
    estimate = float(occupancy) / 100 * slots / threads if occupancy is not None and pd.notna(occupancy) else None
    # Capped by the grid: the estimate is then the grid's blocks per SM, not what an SM could hold (one wave or less).
    capped = estimate is None or round(estimate) < 1 or estimate >= per_sm - 0.5
    resident = None if capped else round(estimate)
    return {"threads": threads, "blocks": blocks, "sms": int(props["numSms"]), "blocks_per_sm": per_sm,
            "occupancy_pct": occupancy, "resident": resident, "warp_limit": slots // (warps * warp),
            "register_limit": int(props["regsPerMultiprocessor"]) // (regs_per_warp * warps) if regs else None,
            "waves": float("nan") if capped else per_sm / resident}


def kernel_operators(trace: Trace) -> pd.Series:
    """For every kernel (the index of ``trace.kernels()``), the name of the CPU operator that was running when it
    was launched: the one whose ``externalId`` the kernel carries (NaN where none does: a kernel a library
    launched outside any operator, or every kernel of a CUDA graph replay, which hang off one ``cudaGraphLaunch``)."""
    kernels, ops = trace.kernels(), trace.cpu_ops()
    if kernels.empty or "externalId" not in kernels or "externalId" not in ops:
        return pd.Series(np.nan, index=kernels.index, dtype=object, name="op")
    name_of = ops.drop_duplicates("externalId").set_index("externalId")["name"]
    return kernels["externalId"].map(name_of).rename("op")


def kernel_lineage(trace: Trace, kernel: int | None = None) -> dict:
    """Follow one kernel back to the operator that launched it, through the ids Kineto records.

    A kernel event carries ``correlation`` in the file (this reader's ``correlationId``, the
    Nsight Systems export's name; shared with the runtime call that launched it:
    ``cudaLaunchKernel`` and its kin) and ``External id`` (``externalId``; shared with the CPU
    operator that was running when the call was made); an ``ac2g`` flow ("async CPU to GPU")
    with the correlation id as its id draws the arrow between call and kernel in Perfetto.
    ``kernel`` is a row label of ``trace.kernels()``; by default the longest kernel. Returns the
    kernel's launch fields and the matching call, operator and flow events (None where the trace
    has no match: a kernel launched by a library outside any operator has no operator).
    """
    kernels = trace.kernels()
    if kernels.empty:
        raise GpuprofError(f"{trace.path.name} has no kernel events.", "Profile with ProfilerActivity.CUDA on a GPU.")
    k = kernels.loc[kernel] if kernel is not None else kernels.loc[kernels["duration_ns"].idxmax()]
    calls = trace.runtime_calls()
    call = calls[calls["correlationId"] == k["correlationId"]]
    ops = trace.cpu_ops()
    op = ops[ops["externalId"] == k["externalId"]] if "externalId" in ops else ops.iloc[0:0]
    flows = trace.flows()
    flow = flows[(flows["cat"] == "ac2g") & (flows["id"] == k["correlationId"])] if not flows.empty else flows
    return {"kernel": k, "launch": {f: k.get(f) for f in LAUNCH_FIELDS if f in k.index},
            "call": None if call.empty else call.iloc[0], "operator": None if op.empty else op.iloc[0],
            "flow_phases": sorted(flow["phase"]) if not flow.empty else []}
