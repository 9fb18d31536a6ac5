"""The sharded-training chapter's arithmetic: memory per GPU by category, and a model of the collectives' cost.

The chapter trains one transformer three ways (``examples/nsys/fsdp_training.py``): DDP (every
GPU holds the whole model) and FSDP2 (``torch.distributed.fsdp.fully_shard``) with and without
resharding after forward. This module holds what the chapter computes beside the measurements.

**Memory** (:func:`memory_arithmetic`): per rank, the bytes of the parameters, their gradients
and the optimizer's state (AdamW: two tensors shaped like each parameter). DDP keeps all of
them on every GPU; FSDP2 keeps on rank r the rows ``torch.chunk(dim=0)`` gives it of every
parameter (:func:`shard_numel`: FSDP2 shards each parameter on dim 0, the docs of
``fully_shard`` say so), so about 1/N of each. Activations are not arithmetic here: the script
measures them as the step's peak minus the rest.

**Collectives** (:func:`collective_ms`): the time of an all-gather, reduce-scatter or
all-reduce of S bytes on n ranks, as a bandwidth term plus a latency term. The bandwidth term
uses nccl-tests' bus bandwidth (``doc/PERFORMANCE.md`` of NVIDIA/nccl-tests):
``t = S / busbw * f(n)`` with ``f = 2 (n-1) / n`` for all-reduce and ``(n-1) / n`` for
all-gather and reduce-scatter, S being the whole array (the gathered output, the scattered
input), "independent of the algorithm used (ring, tree, or other)". The latency term counts
the algorithm's steps, each costing one per-step latency: a ring takes n-1 steps for an
all-gather or a reduce-scatter and 2 (n-1) for an all-reduce (a reduce-scatter then an
all-gather; "the latency of ring increases linearly with the communicator size", an NCCL
developer in NVIDIA/nccl#1712); NCCL's tree all-reduce is a reduce up a tree and a broadcast
down it (NVIDIA/nccl#545), 2 ceil(log2 n) steps. NCCL has no tree all-gather or
reduce-scatter ("The Tree algorithm implements multiple reduce/broadcast operations, so it
doesn't apply to allgather/reducescatter", NVIDIA/nccl#1473; its PAT algorithm for them, from
NCCL 2.23, runs one GPU per node only), so asking for one is an error here, not a number.
:func:`fit_link` fits the bus bandwidth and the per-step latency to measured collectives.

**Exposed communication** (:func:`simulate_step`): one training step as a compute stream and
one network link, unit by unit (a unit is what one ``fully_shard`` call wraps): forward
all-gathers, backward all-gathers (when the unit was resharded after forward) and
reduce-scatters (FSDP), or one all-reduce per unit after its backward (DDP, its buckets taken
as one per unit); a unit marked ``kept`` (the root) is not gathered again in backward. Prefetch depth p issues a unit's all-gather when the unit p places earlier
starts computing; p = 0 issues it when the unit before it has finished. The link runs the
collectives one after another in the order they were issued. What the compute waits for is
the exposed communication, by collective. :func:`predict_scaling` runs it with one link per scale
(``SCALES``), :func:`predict_by_scale` at any scales over one link; past one node :func:`predict_scale_out` gives it NCCL's own
ring latency (``NCCL_RING_SIMPLE_US``, ``NCCL_RING_LL128_US``) over a documented bandwidth, and
:func:`group_units` wraps several layers to a unit.

Queueing on one link is what NCCL does, not a simplification: FSDP2 issues its all-gathers and
reduce-scatters on separate streams but on one process group, so one communicator, and NCCL makes
each launch wait on the communicator's own stream (``ncclLaunchPrepare`` in NVIDIA/nccl
``src/enqueue.cc``), so one communicator's kernels run one after another (the chapter's exports
show no overlap between two NCCL kernels of a rank). What the model leaves out, said once: NCCL's kernels take SMs and memory
bandwidth from the computation they overlap (here overlap is free); the memory limit on how
many units FSDP2 keeps gathered; and, within one node, a ring's steps all cost the link's latency
(past one node, :func:`scale_out_link` gives the NVLink and the network steps NCCL's own costs). A prediction is
checked against a measurement at a scale the chapter can run, never trusted past it unread.

**The captures** (Nsight Systems, one report per rank; :mod:`gpuprof.nsys.ranks` reads them):
:func:`mode_steps` finds each mode's timed steps (``mode_<M>`` > ``step_N`` NVTX ranges) and
their GPU windows (to the end of the synchronisation after the step: the GPU runs behind the
CPU's ranges); :func:`collective_table` gives per rank, mode, step and collective the NCCL
kernel time, the part a compute kernel on another stream hid and the exposed rest
(:func:`gpuprof.nsys.ranks.collective_kernels`), :func:`overlap_summary` its medians over the
steps, :func:`exposed_collectives` which collectives of a step were exposed, :func:`hta_beside`
the course's share beside HTA's definition (``get_comm_comp_overlap``), and
:func:`transfer_times` the collectives' own durations (the rank that arrived last waited for
nobody) that :func:`fit_link` fits.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..errors import GpuprofError

__all__ = ["MODES", "BUS_FACTOR", "shard_numel", "memory_arithmetic", "sharded_share", "collective_ms", "latency_steps",
           "Link", "fit_link", "UnitCost", "unit_costs", "units_from_record", "StepPrediction", "simulate_step", "predict_scaling",
           "memory_table", "step_table", "read_rank_results", "SCALES", "COLLECTIVES", "mode_steps", "collective_table",
           "overlap_summary", "exposed_collectives", "arrival_skew", "hta_beside", "unit_order", "transfer_times", "link_rows",
           "predict_by_scale", "compute_stream", "idle_table", "idle_summary", "kernel_streams", "collective_timeline",
           "clock_check", "step_spread", "pattern_time", "state_shares", "slower_rank_steps",
           "predicted_against_measured", "hidden_by_kind", "exposed_against_measured", "NCCL_RING_SIMPLE_US",
           "nccl_ring_latency_us", "scale_out_link", "predict_scale_out", "NCCL_RING_LL128_US", "LL128_BANDWIDTH",
           "group_units"]

MODES = ("ddp", "fsdp_reshard", "fsdp_keep")
SCALES = (2, 4, 8, 64, 1024)
# nccl-tests doc/PERFORMANCE.md: busbw = algbw * factor, so t = S * factor / busbw
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n}


# --- memory -----------------------------------------------------------------------------------------------------

def shard_numel(shape: Sequence[int], world: int, rank: int) -> int:
    """Elements of a parameter of ``shape`` that rank ``rank`` of ``world`` holds under FSDP2.

    FSDP2 shards on dim 0 as ``torch.chunk`` does: chunks of ceil(d0 / world) rows, the last
    ones shorter or empty when d0 does not divide (it pads them for the all-gather; the
    padding is not the parameter's). A 0-dimensional tensor is treated as one row.
    """
    if world < 1 or not 0 <= rank < world:
        raise GpuprofError(f"rank {rank} is not one of {world} rank(s).")
    rows = shape[0] if shape else 1
    rest = math.prod(shape[1:]) if len(shape) > 1 else 1
    chunk = -(-rows // world)
    return max(0, min(chunk, rows - rank * chunk)) * rest


def memory_arithmetic(shapes: Iterable[Sequence[int]], world: int, mode: str, rank: int = 0, *,
                      param_bytes: int = 4, optimizer_states: int = 2) -> dict[str, int]:
    """Bytes per GPU of parameters, gradients and optimizer state for ``mode`` at ``world`` ranks, on ``rank``.

    ``param_bytes``: of each stored element (FP32 4; FSDP2's MixedPrecisionPolicy keeps the
    sharded parameters, their gradients and the optimizer's state in FP32 and casts a copy for
    the all-gather, so 4 either way). Gradients are as large as the parameters they belong to;
    the optimizer keeps ``optimizer_states`` tensors like each (AdamW: 2; its step counters, one
    number per parameter, are left out).
    """
    if mode not in MODES:
        raise GpuprofError(f"no mode {mode!r}; the modes are {', '.join(MODES)}.")
    shapes = [tuple(s) for s in shapes]
    elements = (sum(math.prod(s) for s in shapes) if mode == "ddp"
                else sum(shard_numel(s, world, rank) for s in shapes))
    return {"parameters": elements * param_bytes, "gradients": elements * param_bytes,
            "optimizer_state": elements * param_bytes * optimizer_states}


def sharded_share(shapes: Iterable[Sequence[int]], world: int) -> float:
    """FSDP2's bytes of parameters, gradients and optimizer state per GPU over DDP's (rank 0 holds the most)."""
    shapes = [tuple(s) for s in shapes]
    fsdp = sum(memory_arithmetic(shapes, world, "fsdp_reshard").values())
    return fsdp / sum(memory_arithmetic(shapes, world, "ddp").values())


# --- collectives ------------------------------------------------------------------------------------------------

def latency_steps(kind: str, n: int, algorithm: str = "ring") -> int:
    """How many latency-bound steps ``kind`` takes on ``n`` ranks with ``algorithm`` (see the module's docstring)."""
    if kind not in BUS_FACTOR:
        raise GpuprofError(f"no collective {kind!r}; the collectives are {', '.join(BUS_FACTOR)}.")
    if n < 2:
        return 0
    if algorithm == "ring":
        return 2 * (n - 1) if kind == "all_reduce" else n - 1
    if algorithm == "tree":
        if kind != "all_reduce":
            raise GpuprofError(f"NCCL has no tree {kind.replace('_', '-')}: its tree is a reduce and a broadcast, "
                               "an all-reduce only (NVIDIA/nccl#1473).", "Use algorithm='ring'.")
        return 2 * math.ceil(math.log2(n))
    raise GpuprofError(f"no algorithm {algorithm!r}; the model knows ring and tree.")


@dataclass(frozen=True)
class Link:
    """What the model knows of the GPUs' interconnect: nccl-tests' bus bandwidth and one step's latency."""

    busbw_gbps: float
    step_latency_us: float


def collective_ms(kind: str, nbytes: float, n: int, link: Link, algorithm: str = "ring") -> float:
    """Milliseconds of one ``kind`` collective of ``nbytes`` (the whole array) on ``n`` ranks over ``link``."""
    if n < 2:
        return 0.0
    bandwidth = nbytes * BUS_FACTOR[kind](n) / (link.busbw_gbps * 1e9) * 1e3
    return bandwidth + latency_steps(kind, n, algorithm) * link.step_latency_us / 1e3


def fit_link(measured: Sequence[dict[str, Any]]) -> Link:
    """The bus bandwidth and per-step latency that fit measured collectives best (least squares on the times).

    Each row: ``kind``, ``n`` (ranks), ``bytes`` (the whole array) and ``ms``. The model is
    ``ms = steps(kind, n) * latency + bytes * factor(kind, n) / busbw`` (ring), linear in
    ``latency`` and ``1 / busbw``. Two rows that differ in bytes (or in n) are the least that
    separates the two; with one, or all of one size, the latency is set to 0 and the whole time
    read as bandwidth (a lower bound on the bandwidth), which the caller can see in the result.
    """
    import numpy as np

    if not measured:
        raise GpuprofError("no measured collective to fit the link to.")
    steps = np.array([latency_steps(r["kind"], int(r["n"])) for r in measured], dtype=float)
    load = np.array([r["bytes"] * BUS_FACTOR[r["kind"]](int(r["n"])) for r in measured], dtype=float)
    seconds = np.array([r["ms"] for r in measured], dtype=float) / 1e3
    if len({(s, l) for s, l in zip(steps, load)}) >= 2:
        (latency_s, per_byte), *_ = np.linalg.lstsq(np.vstack([steps, load]).T, seconds, rcond=None)
        if latency_s >= 0 and per_byte > 0:
            return Link(busbw_gbps=float(1 / per_byte / 1e9), step_latency_us=float(latency_s * 1e6))
    per_byte = float(np.sum(seconds * load) / np.sum(load * load))  # through the origin
    if per_byte <= 0:
        raise GpuprofError("the measured collectives take no time: nothing to fit.")
    return Link(busbw_gbps=1 / per_byte / 1e9, step_latency_us=0.0)


# --- one step, simulated ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class UnitCost:
    """One sharding unit: its compute (ms, per rank) and the bytes of its collectives (whole arrays)."""

    forward_ms: float
    backward_ms: float
    gather_bytes: float   # the unit's parameters in the all-gather's type (bf16 under MixedPrecisionPolicy)
    reduce_bytes: float   # its gradients in the reduction's type (FP32)
    kept: bool = False    # never resharded after forward (the root): no all-gather in backward


def unit_costs(units: int, forward_ms: float, backward_ms: float, gather_bytes: float,
               reduce_bytes: float) -> list[UnitCost]:
    """``units`` equal units sharing a step's forward and backward time and the model's bytes evenly."""
    return [UnitCost(forward_ms / units, backward_ms / units, gather_bytes / units, reduce_bytes / units)] * units


def units_from_record(record: dict[str, Any], mode: str = "ddp", *, gather_element: int = 4,
                      reduce_element: int = 4) -> list[UnitCost]:
    """The units of a run of ``fsdp_training.py`` (one rank's JSON record), for :func:`simulate_step`.

    The root (embeddings, final norm, head) first and kept gathered, as the script shards it,
    then the units of layers. Each unit's forward and backward time is the run's median,
    shared in proportion to the unit's parameters (a matrix product's work is proportional to
    its weights per token; attention's score products, which have no weights, are shared the
    same way, an approximation the chapter checks against the four-GPU measurement). Read the
    compute from a run on one process (``world_size`` 1: no communication in it); element
    sizes: 2 for BF16 all-gathers (``--mp bf16``), 4 for FP32.
    """
    import statistics

    runs = {run["mode"]: run for run in record["runs"]}
    if mode not in runs:
        raise GpuprofError(f"the record has no {mode} run; it has {', '.join(runs)}.")
    steps = runs[mode]["steps"]
    forward = statistics.median(s["forward"] for s in steps)
    backward = statistics.median(s["backward"] for s in steps)
    counts = record["unit_parameters"]
    total = sum(counts)
    return [UnitCost(forward * c / total, backward * c / total, c * gather_element, c * reduce_element, kept=i == 0)
            for i, c in enumerate(counts)]


@dataclass(frozen=True)
class StepPrediction:
    """A simulated step: compute, communication issued, and the part of it the compute waited for, per collective."""

    mode: str
    n: int
    compute_ms: float
    comm_ms: float
    exposed_ms: float
    exposed_by_collective: dict[str, float]
    step_ms: float
    # each wait by the collective waited for: (kind, its position among that kind's collectives of the step in
    # issue order, ms), the order the exports' per-collective table (:func:`exposed_collectives`) uses
    exposed_at: tuple[tuple[str, int, float], ...] = ()

    @property
    def hidden_share(self) -> float:
        """The share of the communication that ran under compute (1 with no communication)."""
        return 1.0 if self.comm_ms == 0 else 1 - self.exposed_ms / self.comm_ms


def simulate_step(units: Sequence[UnitCost], mode: str, n: int, link: Link, *, prefetch: int = 1,
                  optimizer_ms: float = 0.0, algorithm: str = "ring") -> StepPrediction:
    """One training step of ``units`` (forward order) on ``n`` ranks: when the compute waits for the link.

    ``mode``: ``ddp`` (one all-reduce per unit, issued when its backward ends), ``fsdp_reshard``
    (all-gather before each unit's forward and again before its backward, reduce-scatter after
    its backward) or ``fsdp_keep`` (no all-gather in backward). ``prefetch``: how many units
    ahead an all-gather is issued (0: when the unit before has finished computing). The
    all-reduce may use ``algorithm`` tree; all-gathers and reduce-scatters are rings.
    Exposed time is attributed to the collective the compute waited for; the wait after the
    last backward (the last reduce-scatters or all-reduces) to that collective.
    """
    if mode not in MODES:
        raise GpuprofError(f"no mode {mode!r}; the modes are {', '.join(MODES)}.")
    if prefetch < 0:
        raise GpuprofError(f"prefetch must not be negative, got {prefetch}.")
    units = list(units)
    count = len(units)

    def cost(kind: str, nbytes: float) -> float:
        return collective_ms(kind, nbytes, n, link, algorithm if kind == "all_reduce" else "ring")

    clock = link_free = 0.0
    comm = 0.0
    exposed = {"all_gather": 0.0, "reduce_scatter": 0.0, "all_reduce": 0.0}
    issued = {"all_gather": 0, "reduce_scatter": 0, "all_reduce": 0}
    position: dict[float, int] = {}  # an all-gather's finish time -> its position (finish times only grow)
    waits: list[tuple[str, int, float]] = []

    def issue(kind: str, nbytes: float, at: float) -> float:
        nonlocal link_free, comm
        took = cost(kind, nbytes)
        start = max(at, link_free)
        link_free = start + took
        comm += took
        position[link_free] = issued[kind]
        issued[kind] += 1
        return link_free

    def wait(until: float) -> None:
        nonlocal clock
        if until > clock:
            exposed["all_gather"] += until - clock
            waits.append(("all_gather", position[until], until - clock))
            clock = until

    sharded = mode != "ddp"

    def gather_ahead(done: dict[int, float], sequence: list[int], k: int) -> None:
        """At the start of unit ``sequence[k]``'s compute, issue the next ``prefetch`` units' all-gathers, in order."""
        for ahead in range(1, prefetch + 1):
            if k + ahead < len(sequence) and sequence[k + ahead] not in done and \
                    not (done is regathered and units[sequence[k + ahead]].kept):
                j = sequence[k + ahead]
                done[j] = issue("all_gather", units[j].gather_bytes, clock)

    forward = list(range(count))
    gathered: dict[int, float] = {}
    regathered: dict[int, float] = {}
    for k, i in enumerate(forward):
        if sharded:
            if i not in gathered:  # the first unit, or every unit without prefetch: issued when it is reached
                gathered[i] = issue("all_gather", units[i].gather_bytes, clock)
            wait(gathered[i])
            gather_ahead(gathered, forward, k)
        clock += units[i].forward_ms
    backward = forward[::-1]
    reduced = 0.0
    for k, i in enumerate(backward):
        if mode == "fsdp_reshard" and not units[i].kept:
            if i not in regathered:
                regathered[i] = issue("all_gather", units[i].gather_bytes, clock)
            wait(regathered[i])
            gather_ahead(regathered, backward, k)
        clock += units[i].backward_ms
        reduced = issue("all_reduce" if mode == "ddp" else "reduce_scatter", units[i].reduce_bytes, clock)
    reduction = "all_reduce" if mode == "ddp" else "reduce_scatter"
    if reduced > clock:
        exposed[reduction] += reduced - clock
        waits.append((reduction, issued[reduction] - 1, reduced - clock))
    compute = sum(u.forward_ms + u.backward_ms for u in units) + optimizer_ms
    kinds = ("all_reduce",) if mode == "ddp" else ("all_gather", "reduce_scatter")
    total_exposed = sum(exposed.values())
    return StepPrediction(mode, n, compute, comm, total_exposed, {k: exposed[k] for k in kinds}, compute + total_exposed,
                          tuple(waits))


def predict_scaling(units: Sequence[UnitCost], links: dict[int, Link], *, modes: Sequence[str] = MODES,
                    scales: Sequence[int] = SCALES, prefetch: int = 1, optimizer_ms: float = 0.0) -> Any:
    """A table of simulated steps, one row per mode and number of GPUs (and algorithm, for DDP's all-reduce).

    ``links`` maps a number of GPUs to the link its collectives run over (the intra-node link
    fitted on two GPUs for up to a node, an inter-node one beyond); a scale with no link gives
    no row. The per-rank compute is the same at every scale (each GPU keeps its batch: weak
    scaling), so what changes is the collectives' cost alone.
    """
    import pandas as pd

    rows = []
    for n in scales:
        if n not in links:
            continue
        for mode in modes:
            for algorithm in (("ring", "tree") if mode == "ddp" else ("ring",)):
                p = simulate_step(units, mode, n, links[n], prefetch=prefetch, optimizer_ms=optimizer_ms, algorithm=algorithm)
                rows.append({"gpus": n, "mode": mode, "algorithm": algorithm, "compute_ms": p.compute_ms,
                             "comm_ms": p.comm_ms, "exposed_ms": p.exposed_ms, "hidden_share": p.hidden_share,
                             "step_ms": p.step_ms, **{f"exposed_{k}_ms": v for k, v in p.exposed_by_collective.items()}})
    return pd.DataFrame(rows)


# --- the script's results ---------------------------------------------------------------------------------------

def read_rank_results(paths: Iterable[Any]) -> list[dict[str, Any]]:
    """The per-rank JSON files ``fsdp_training.py --json`` writes, sorted by rank."""
    import json
    from pathlib import Path

    out = [json.loads(Path(p).read_text()) for p in paths]
    if not out:
        raise GpuprofError("no per-rank results to read.")
    return sorted(out, key=lambda d: d["rank"])


def memory_table(results: Sequence[dict[str, Any]]) -> Any:
    """Per mode and rank: each memory category measured (MiB) beside the arithmetic, and the peak; where the run
    recorded them (GPU runs of ``fsdp_training.py`` since the phases were probed), each phase's peak
    (``forward_peak_mib`` ...), the bytes allocated at the end of forward and those resident when the mode began."""
    import pandas as pd

    rows = []
    for r in results:
        for run in r["runs"]:
            m = run["memory"]
            row = {"mode": run["mode"], "rank": r["rank"]}
            for cat in ("parameters", "gradients", "optimizer_state"):
                row[f"{cat}_mib"] = m["measured"][cat] / 2**20
                row[f"{cat}_arith_mib"] = m["arithmetic"][cat] / 2**20
            row["activations_mib"] = None if m.get("activations") is None else m["activations"] / 2**20
            row["peak_mib"] = None if m.get("peak") is None else m["peak"] / 2**20
            for phase, b in (m.get("phase_peaks") or {}).items():  # runs recorded since the phases were probed
                row[f"{phase}_peak_mib"] = b / 2**20
            for key in ("after_forward", "resident_before"):
                if m.get(key) is not None:
                    row[f"{key}_mib"] = m[key] / 2**20
            rows.append(row)
    return pd.DataFrame(rows)


def step_table(results: Sequence[dict[str, Any]]) -> Any:
    """Per mode and rank: median step, forward, backward and optimizer times (ms) and the last loss."""
    import statistics

    import pandas as pd

    rows = []
    for r in results:
        for run in r["runs"]:
            steps = run["steps"]
            row = {"mode": run["mode"], "rank": r["rank"]}
            for k in ("step", "forward", "backward", "optimizer"):
                row[f"{k}_ms"] = statistics.median(s[k] for s in steps)
            row["last_loss"] = steps[-1]["loss"]
            rows.append(row)
    return pd.DataFrame(rows)



# --- the captures: the collectives seen, hidden and exposed --------------------------------------------------------

COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")
MODE_RANGE = re.compile(r"mode_(\w+)")


def mode_steps(d: Any) -> Any:
    """One rank's timed steps (a :class:`gpuprof.nsys.ranks.RankData` read with ``runtime=True``), per mode.

    Columns: mode (from the enclosing ``mode_<M>`` range; ``-`` where the script ran one mode
    without one), step (N of ``step_N``), start (the step's NVTX start), end (the end of the
    synchronisation that follows the step: its GPU work is done by then) and gpu_ms (end - start).
    The warm-up steps are not ``step_N`` ranges, so they are left out by name.
    """
    import pandas as pd

    from .. import activity as ta
    from ..nsys.ranks import synced_windows

    if d.runtime is None:
        raise GpuprofError("the steps' GPU windows need the CUDA API calls: read the reports with "
                           "rank_data(paths, runtime=True).")
    steps = synced_windows(ta.step_ranges(d.ranges), d.runtime)
    if steps["gpu_end"].isna().any():
        raise GpuprofError(f"rank {d.rank}: a step_N range has no synchronisation after it, so its GPU window is "
                           "unknown.", "The script synchronises after every timed step; was the capture cut short?")
    modes = d.ranges[d.ranges["text"].astype(str).str.fullmatch(MODE_RANGE.pattern)]
    rows = []
    for s in steps.itertuples():
        around = modes[(modes["start"] <= s.start) & (modes["end"] >= s.end)]
        mode = MODE_RANGE.fullmatch(str(around["text"].iloc[-1])).group(1) if len(around) else "-"
        rows.append({"mode": mode, "step": int(s.step), "start": int(s.start), "end": int(s.gpu_end),
                     "gpu_ms": (s.gpu_end - s.start) / 1e6})
    return pd.DataFrame(rows, columns=["mode", "step", "start", "end", "gpu_ms"])


def collective_table(data: dict[int, Any]) -> Any:
    """Per rank, mode, step and collective kind: kernels, comm_ms (their kernel time), hidden_ms (under a compute
    kernel on another stream), exposed_ms (the rest), and the step's gpu_ms; plus one row of kind ``any`` per step
    whose comm_ms is the wall time some NCCL kernel ran (their union) and exposed_ms the wall time it ran with
    no compute kernel beside it (:func:`gpuprof.activity.exposed_ns`), the time the step would lose to
    communication if nothing else delayed it.
    """
    import pandas as pd

    from .. import activity as ta
    from ..nsys.ranks import collective_kernels

    rows = []
    for rank, d in data.items():
        for s in mode_steps(d).itertuples():
            window = (s.start, s.end)
            per = collective_kernels(d, window)
            base = {"rank": rank, "mode": s.mode, "step": s.step, "gpu_ms": s.gpu_ms}
            for kind, g in per.groupby("kind", sort=False):
                rows.append({**base, "kind": kind, "kernels": len(g), "comm_ms": g["duration_ns"].sum() / 1e6,
                             "hidden_ms": g["hidden_ns"].sum() / 1e6, "exposed_ms": g["exposed_ns"].sum() / 1e6})
            nccl = d.nccl[(d.nccl["end"] > s.start) & (d.nccl["start"] < s.end)]
            compute = d.compute[(d.compute["end"] > s.start) & (d.compute["start"] < s.end)]
            union = ta.exposed_ns(nccl, pd.DataFrame(columns=["start", "end"]), window) / 1e6
            exposed = ta.exposed_ns(nccl, compute, window) / 1e6
            rows.append({**base, "kind": "any", "kernels": len(per), "comm_ms": union, "hidden_ms": union - exposed,
                         "exposed_ms": exposed})
    return pd.DataFrame(rows, columns=["rank", "mode", "step", "kind", "kernels", "comm_ms", "hidden_ms", "exposed_ms",
                                       "gpu_ms"])


def overlap_summary(table: Any) -> Any:
    """:func:`collective_table` per mode, collective kind and rank: each column's median over the timed steps (ms),
    taken column by column, so a row mixes steps and its hidden and exposed parts need not add up to its comm_ms;
    the exposed time's smallest and largest step (``exposed_min_ms``, ``exposed_max_ms``: the steps differ more
    than a median says); and ``hidden_share``, the hidden time over the kernel time summed over the timed steps."""
    g = table.groupby(["mode", "kind", "rank"], sort=False)
    out = g[["kernels", "comm_ms", "hidden_ms", "exposed_ms", "gpu_ms"]].median()
    out.insert(0, "steps", g.size())
    out["exposed_min_ms"] = g["exposed_ms"].min()
    out["exposed_max_ms"] = g["exposed_ms"].max()
    out["hidden_share"] = g["hidden_ms"].sum() / g["comm_ms"].sum()
    return out.reset_index()


def exposed_collectives(data: dict[int, Any], mode: str, *, top: int = 5) -> Any:
    """Which collectives of ``mode``'s steps were exposed: per rank, kind and position in the step (the i-th
    all-gather, say, in issue order on the GPU), the median over the steps of its kernel time and exposed time
    (ms), the ``top`` most exposed per rank."""
    import pandas as pd

    from ..nsys.ranks import collective_kernels

    rows = []
    for rank, d in data.items():
        for s in mode_steps(d).itertuples():
            if s.mode != mode:
                continue
            per = collective_kernels(d, (s.start, s.end)).sort_values("start", kind="stable")
            per["position"] = per.groupby("kind").cumcount()
            per["of"] = per.groupby("kind")["kind"].transform("size")
            for r in per.itertuples():
                rows.append({"rank": rank, "kind": r.kind, "position": r.position, "of": r.of, "step": s.step,
                             "comm_ms": r.duration_ns / 1e6, "exposed_ms": r.exposed_ns / 1e6})
    if not rows:
        raise GpuprofError(f"no timed steps of mode {mode!r} in the captures.")
    t = pd.DataFrame(rows).groupby(["rank", "kind", "position", "of"], sort=False)[["comm_ms", "exposed_ms"]].median()
    t = t.reset_index().sort_values(["rank", "exposed_ms"], ascending=[True, False], kind="stable")
    return t.groupby("rank", sort=False).head(top).reset_index(drop=True)


def arrival_skew(data: dict[int, Any]) -> Any:
    """Per mode, collective kind and rank (other than the first): how much earlier or later than the first rank each
    collective's kernel started (median over the timed steps' collectives, ms; negative: the first rank started
    first) and the share of them the first rank started first. A rank that starts a collective first waits inside
    it for the others, and that wait counts as its kernel time."""
    import pandas as pd

    from ..nsys.ranks import collective_kernels

    first = min(data)
    starts: dict[tuple[int, str, str], list[int]] = {}
    for rank, d in data.items():
        for s in mode_steps(d).itertuples():
            per = collective_kernels(d, (s.start, s.end)).sort_values("start", kind="stable")
            for kind, g in per.groupby("kind", sort=False):
                starts.setdefault((rank, s.mode, kind), []).extend(g["start"].tolist())
    rows = []
    for (rank, mode, kind), mine in starts.items():
        if rank == first:
            continue
        ref = starts.get((first, mode, kind), [])
        if len(ref) != len(mine):
            raise GpuprofError(f"rank {rank} ran {len(mine)} {kind} kernels in {mode} and rank {first} {len(ref)}: "
                               "they cannot be matched by order.")
        skew = [(a - b) / 1e6 for a, b in zip(ref, mine)]  # first rank's start minus this rank's
        rows.append({"mode": mode, "kind": kind, "rank": rank, "collectives": len(skew),
                     f"rank{first}_minus_rank_ms": float(pd.Series(skew).median()),
                     f"rank{first}_first_share": float(sum(x < 0 for x in skew) / len(skew))})
    return pd.DataFrame(rows)


def hta_beside(data: dict[int, Any]) -> Any:
    """Per rank and mode, over the timed steps' GPU windows: the share of the NCCL kernels' wall time (their
    union) that compute kernels hid, by the course's measure (the ``any`` rows of :func:`collective_table`) and
    by HTA's definition (:func:`gpuprof.torch_profiler.hta_compat.comm_comp_overlap`: communication kernels by
    name, the other kernels on any stream as computation), with their difference."""
    import pandas as pd

    from ..torch_profiler import hta_compat

    table = collective_table(data)
    anyrows = table[table["kind"] == "any"].groupby(["rank", "mode"], sort=False)[["comm_ms", "hidden_ms"]].sum()
    rows = []
    for rank, d in data.items():
        steps = mode_steps(d)
        for mode, group in steps.groupby("mode", sort=False):
            parts = []
            for s in group.itertuples():
                k = d.kernels[(d.kernels["end"] > s.start) & (d.kernels["start"] < s.end)]
                parts.append(k.assign(start=k["start"].clip(s.start, s.end), end=k["end"].clip(s.start, s.end)))
            k = pd.concat(parts, ignore_index=True)
            hta = hta_compat.comm_comp_overlap(k.assign(kind="kernel")[["kind", "name", "start", "end"]])
            ours = anyrows.loc[(rank, mode)]
            share = float(ours["hidden_ms"] / ours["comm_ms"])
            rows.append({"rank": rank, "mode": mode, "course_hidden": share, "hta_hidden": hta,
                         "difference": share - hta})
    return pd.DataFrame(rows)


def unit_order(kind: str, mode: str, units: int) -> list[int]:
    """The units (0: the root, 1..units: the layers' units) whose ``kind`` collectives a step of ``fsdp_training.py``
    runs, in issue order: forward all-gathers root first; backward all-gathers (``fsdp_reshard``) from the last
    unit back, the kept root not regathered; reduce-scatters from the last unit back, the root's last (its
    backward ends with the embeddings'). :func:`transfer_times` checks the order against the kernels' durations."""
    layers = list(range(1, units + 1))
    if kind == "all_gather":
        return [0, *layers] + (layers[::-1] if mode == "fsdp_reshard" else [])
    if kind == "reduce_scatter":
        return [*layers[::-1], 0]
    raise GpuprofError(f"no unit order for {kind!r} in {mode!r}.")


def transfer_times(data: dict[int, Any], record: dict[str, Any], *, element_bytes: int = 4) -> Any:
    """The all-gathers' and reduce-scatters' own durations in FSDP2 modes, with the bytes each moved.

    A collective's kernel on a rank that arrived early spins until the last rank arrives; on
    the rank that arrived last it is the transfer alone (plus whatever the compute beside it took
    from it). So each collective, matched by its position in the step across ranks, is read as
    the shortest of its kernels on the ranks. Its bytes are its unit's parameters
    (``record["unit_parameters"]``, the gathered whole array, ``element_bytes`` each).
    Columns: mode, step, kind, position, unit, bytes, ms, n (ranks).
    """
    import pandas as pd

    from ..nsys.ranks import collective_kernels

    counts = record["unit_parameters"]
    units = len(counts) - 1
    per_rank = []
    for rank, d in data.items():
        for s in mode_steps(d).itertuples():
            if s.mode not in ("fsdp_reshard", "fsdp_keep", "-"):
                continue
            mode = s.mode if s.mode != "-" else "fsdp_reshard"
            per = collective_kernels(d, (s.start, s.end)).sort_values("start", kind="stable")
            for kind in ("all_gather", "reduce_scatter"):
                k = per[per["kind"] == kind]
                order = unit_order(kind, mode, units)
                if len(k) != len(order):
                    raise GpuprofError(f"rank {rank}, {mode} step {s.step}: {len(k)} {kind} kernels, the script "
                                       f"issues {len(order)}.")
                per_rank.append(pd.DataFrame({"rank": rank, "mode": mode, "step": s.step, "kind": kind,
                                              "position": range(len(k)), "unit": order,
                                              "ms": k["duration_ns"].to_numpy() / 1e6}))
    t = pd.concat(per_rank, ignore_index=True)
    out = t.groupby(["mode", "step", "kind", "position", "unit"], sort=False)["ms"].min().reset_index()
    out["bytes"] = out["unit"].map(lambda u: counts[u] * element_bytes)
    out["n"] = len(data)
    return out


def link_rows(transfers: Any) -> list[dict[str, Any]]:
    """:func:`transfer_times` as :func:`fit_link`'s rows: one per kind and size, the median over its collectives."""
    med = transfers.groupby(["kind", "bytes", "n"], sort=False)["ms"].median().reset_index()
    return [{"kind": r.kind, "n": int(r.n), "bytes": float(r.bytes), "ms": float(r.ms)} for r in med.itertuples()]


def predict_by_scale(units: Sequence[UnitCost], link: Link, optimizer_ms: float, *, scales: Sequence[int] = (2, 4, 8),
                     modes: Sequence[str] = MODES, prefetch: int = 1) -> Any:
    """:func:`simulate_step` at each scale over one ``link`` (a node's, or :func:`scale_out_link`'s past one), the optimizer's time per rank
    ``optimizer_ms`` (one GPU's, for the whole model) divided by the ranks under FSDP2 (each steps its shard)."""
    import pandas as pd

    rows = []
    for n in scales:
        for mode in modes:
            opt = optimizer_ms if mode == "ddp" else optimizer_ms / n
            p = simulate_step(units, mode, n, link, prefetch=prefetch, optimizer_ms=opt)
            rows.append({"gpus": n, "mode": mode, "compute_ms": p.compute_ms, "comm_ms": p.comm_ms,
                         "exposed_ms": p.exposed_ms, "hidden_share": p.hidden_share, "step_ms": p.step_ms,
                         **{f"exposed_{k}_ms": v for k, v in p.exposed_by_collective.items()}})
    return pd.DataFrame(rows)


# --- what the step lost: the compute stream's idle time, and the kinds of kernels on it -----------------------------

def compute_stream(d: Any, window: tuple[int, int] | None = None) -> int:
    """The stream that ran most of rank ``d``'s non-NCCL kernel time (in ``window``): the one the layers'
    matrix products run on. FSDP2 puts its own copies on streams of its own, and some of them run on this one
    (:func:`kernel_streams` says which), so "computation" and "the compute stream" are not the same set."""
    k = d.compute if window is None else d.compute[(d.compute["end"] > window[0]) & (d.compute["start"] < window[1])]
    if k.empty:
        raise GpuprofError(f"rank {d.rank}: no computation kernels in the window, so no compute stream.")
    return int(k.groupby("streamId")["duration_ns"].sum().idxmax())


def idle_table(data: dict[int, Any]) -> Any:
    """Per rank, mode and timed step: what the compute stream did with the step's GPU window.

    Columns: gpu_ms (the window, :func:`mode_steps`), busy_ms (the union of the compute stream's kernels in
    it), idle_ms (the rest: the time the step lost on the compute stream, whatever the cause: a wait for an
    all-gather, for a copy on another stream, or for the CPU to launch), exposed_any_ms (the NCCL kernels' wall
    time with no kernel of *any* other stream beside it, the ``any`` rows of :func:`collective_table`),
    exposed_stream_ms (the same with only the compute stream's kernels counted as hiding), and comm_ms (the NCCL
    kernels' union) and other_idle_ms (idle_ms minus exposed_stream_ms: compute-stream idle time with no NCCL kernel
    running, a wait for something else: the CPU, or a copy on another stream). That rest is split in two:
    side_only_ms (a non-NCCL kernel ran on another stream, no NCCL kernel and nothing on the compute stream: the
    compute stream waited on FSDP2's copies there) and no_kernel_ms (no kernel ran anywhere on the GPU: launch and
    dependency gaps, the CPU, or copies and memsets, which these kernel tables do not hold). Each step's three
    parts add up to its idle_ms; :func:`idle_summary`'s medians, taken column by column, need not.
    """
    import pandas as pd

    from .. import activity as ta

    rows = []
    empty = pd.DataFrame(columns=["start", "end"])
    for rank, d in data.items():
        for s in mode_steps(d).itertuples():
            window = (s.start, s.end)
            k = d.kernels[(d.kernels["end"] > s.start) & (d.kernels["start"] < s.end)]
            nccl, compute = k[k["nccl"]], k[~k["nccl"]]
            on_main = compute["streamId"] == compute_stream(d, window)
            main, side = compute[on_main], compute[~on_main]
            busy = (ta.exposed_ns(main, empty, window)) / 1e6
            rows.append({"rank": rank, "mode": s.mode, "step": s.step, "gpu_ms": s.gpu_ms, "busy_ms": busy,
                         "idle_ms": s.gpu_ms - busy, "comm_ms": ta.exposed_ns(nccl, empty, window) / 1e6,
                         "exposed_any_ms": ta.exposed_ns(nccl, compute, window) / 1e6,
                         "exposed_stream_ms": ta.exposed_ns(nccl, main, window) / 1e6,
                         "side_only_ms": ta.exposed_ns(side, pd.concat([main, nccl]), window) / 1e6,
                         "no_kernel_ms": s.gpu_ms - ta.exposed_ns(k, empty, window) / 1e6})
    t = pd.DataFrame(rows, columns=["rank", "mode", "step", "gpu_ms", "busy_ms", "idle_ms", "comm_ms",
                                    "exposed_any_ms", "exposed_stream_ms", "side_only_ms", "no_kernel_ms"])
    t["other_idle_ms"] = t["idle_ms"] - t["exposed_stream_ms"]
    return t


def idle_summary(table: Any) -> Any:
    """:func:`idle_table` per mode and rank: the median step's figures (ms), and the NCCL wall time hidden over the
    timed steps counted two ways: ``hidden_any`` (behind a kernel on any other stream, :func:`overlap_summary`'s
    share) and ``hidden_stream`` (behind the compute stream's kernels only). Each column is its own median over the
    steps, so a row mixes steps and its parts need not add up."""
    g = table.groupby(["mode", "rank"], sort=False)
    out = g[["gpu_ms", "busy_ms", "idle_ms", "comm_ms", "exposed_any_ms", "exposed_stream_ms", "other_idle_ms",
             "side_only_ms", "no_kernel_ms"]].median()
    comm = g["comm_ms"].sum()
    out["hidden_any"] = 1 - g["exposed_any_ms"].sum() / comm
    out["hidden_stream"] = 1 - g["exposed_stream_ms"].sum() / comm
    return out.reset_index()


def kernel_streams(data: dict[int, Any], mode: str, pattern: str, *, column: str = "name") -> Any:
    """Per rank, the kernels of ``mode``'s timed steps whose name matches ``pattern`` (a regular expression), by
    name and stream: count and milliseconds per step (median over the steps), and whether the stream is the
    compute stream (:func:`compute_stream`). Which stream a copy kernel runs on decides whether it can overlap
    the layers' computation or runs in series with it. ``column`` ``demangled`` matches the full signature
    instead (a template argument, say, which the short name leaves out)."""
    import pandas as pd

    rows = []
    for rank, d in data.items():
        for s in mode_steps(d).itertuples():
            if s.mode != mode:
                continue
            window = (s.start, s.end)
            main = compute_stream(d, window)
            k = d.kernels[(d.kernels["end"] > s.start) & (d.kernels["start"] < s.end)]
            k = k[k[column].astype(str).str.contains(pattern, regex=True)]
            for (name, stream), g in k.groupby(["name", "streamId"], sort=False):
                rows.append({"rank": rank, "step": s.step, "name": str(name), "stream": int(stream),
                             "compute_stream": int(stream) == main, "kernels": len(g),
                             "ms": g["duration_ns"].sum() / 1e6})
    if not rows:
        raise GpuprofError(f"no kernel matching {pattern!r} in the timed steps of {mode!r}.")
    t = pd.DataFrame(rows)
    return t.groupby(["rank", "name", "stream", "compute_stream"], sort=False)[["kernels", "ms"]].median().reset_index()


def collective_timeline(data: dict[int, Any], mode: str, kind: str, positions: Sequence[int]) -> Any:
    """When the ``positions``-th ``kind`` collectives of ``mode``'s steps ran, per rank: start (ms after the step's
    start), duration, and ``after_previous_ms``, the gap from the end of the previous collective of the same
    kind to this one's start (negative: they overlapped), each a median over the timed steps. A collective
    queued behind the one before it on the link starts as that one ends (a gap near zero); one issued late
    starts well after it."""
    import pandas as pd

    from ..nsys.ranks import collective_kernels

    rows = []
    for rank, d in data.items():
        for s in mode_steps(d).itertuples():
            if s.mode != mode:
                continue
            per = collective_kernels(d, (s.start, s.end))
            per = per[per["kind"] == kind].sort_values("start", kind="stable").reset_index(drop=True)
            for p in positions:
                if p >= len(per):
                    raise GpuprofError(f"rank {rank}, {mode} step {s.step}: {len(per)} {kind} kernels, no position {p}.")
                r = per.iloc[p]
                gap = (r["start"] - per.iloc[p - 1]["end"]) / 1e6 if p > 0 else float("nan")
                rows.append({"rank": rank, "position": p, "step": s.step, "start_ms": (r["start"] - s.start) / 1e6,
                             "ms": r["duration_ns"] / 1e6, "after_previous_ms": gap,
                             "exposed_ms": r["exposed_ns"] / 1e6})
    if not rows:
        raise GpuprofError(f"no timed steps of mode {mode!r} in the captures.")
    t = pd.DataFrame(rows)
    return t.groupby(["rank", "position"], sort=False)[["start_ms", "ms", "after_previous_ms", "exposed_ms"]].median() \
        .reset_index()


def clock_check(data: dict[int, Any], patterns: Sequence[str] = ("AllGather", "ReduceScatter", "AllReduce")) -> Any:
    """:func:`gpuprof.nsys.ranks.collective_end_skew` summarised per collective: how far apart the ends of the same
    collective lie on the ranks once their reports share one axis (median, 5th and 95th percentile, µs). A
    collective ends on every rank within microseconds of the others, so a spread of microseconds says the
    reports' clocks agree to that, and a skew of a millisecond between the ranks' starts is real."""
    import pandas as pd

    from ..nsys.ranks import collective_end_skew

    rows = []
    for p in patterns:
        sk = collective_end_skew(data, p)
        if sk.empty:
            continue
        us = sk["end_skew_ns"] / 1e3
        rows.append({"collective": p, "kernels": len(sk), "end_skew_median_us": float(us.median()),
                     "p5_us": float(us.quantile(0.05)), "p95_us": float(us.quantile(0.95))})
    return pd.DataFrame(rows, columns=["collective", "kernels", "end_skew_median_us", "p5_us", "p95_us"])


def step_spread(results: Sequence[dict[str, Any]]) -> Any:
    """Per mode and rank: the timed steps' count, minimum, median and maximum (ms). A median of five hides a drift;
    the spread shows whether the steps were steady."""
    import statistics

    import pandas as pd

    rows = []
    for r in results:
        for run in r["runs"]:
            t = [s["step"] for s in run["steps"]]
            rows.append({"mode": run["mode"], "rank": r["rank"], "steps": len(t), "min_ms": min(t),
                         "median_ms": statistics.median(t), "max_ms": max(t)})
    return pd.DataFrame(rows)


def pattern_time(data: dict[int, Any], pattern: str) -> Any:
    """Per mode and rank: the kernels whose name matches ``pattern`` (a regular expression), their count and summed
    time per timed step (median over the steps, ms). Compares one family of kernels (the matrix products, say)
    across modes: the same work taking longer beside communication is the contention a model that counts
    overlap as free leaves out."""
    import pandas as pd

    rows = []
    for rank, d in data.items():
        for s in mode_steps(d).itertuples():
            k = d.kernels[(d.kernels["end"] > s.start) & (d.kernels["start"] < s.end)]
            k = k[k["name"].astype(str).str.contains(pattern, regex=True)]
            rows.append({"mode": s.mode, "rank": rank, "step": s.step, "kernels": len(k),
                         "ms": k["duration_ns"].sum() / 1e6})
    t = pd.DataFrame(rows, columns=["mode", "rank", "step", "kernels", "ms"])
    return t.groupby(["mode", "rank"], sort=False)[["kernels", "ms"]].median().reset_index()


# --- the issue's checks on a run of n GPUs (the four-GPU run against the two-GPU fit) ------------------------------

STATE = ("parameters", "gradients", "optimizer_state")


def state_shares(results: Sequence[dict[str, Any]]) -> Any:
    """Per mode: the world size, the largest state per GPU over the ranks (parameters, gradients and optimizer
    state, MiB, measured), and its share of DDP's. FSDP2 keeps 1/n of each on every GPU, so at n GPUs the share
    is about 1/n (exactly, when every parameter's first dimension divides by n). Needs a ``ddp`` run."""
    t = memory_table(results)
    t["state_mib"] = t[[f"{c}_mib" for c in STATE]].sum(axis=1)
    out = t.groupby("mode", sort=False)["state_mib"].max().reset_index()
    if "ddp" not in set(out["mode"]):
        raise GpuprofError("the records hold no ddp run, so no share of DDP's state can be given.",
                           "Run fsdp_training.py with --mode ddp among the modes.")
    out.insert(1, "gpus", int(results[0].get("world_size", len(results))))
    out["share_of_ddp"] = out["state_mib"] / float(out.loc[out["mode"] == "ddp", "state_mib"].iloc[0])
    return out


def slower_rank_steps(results: Sequence[dict[str, Any]]) -> Any:
    """Per mode: the slower rank's median step and phases (ms): a data-parallel step is as slow as its slowest
    rank. Columns as :func:`step_table`'s, one row per mode, with ``gpus``."""
    t = step_table(results)
    t = t.sort_values("step_ms", kind="stable").groupby("mode", sort=False).tail(1)
    t.insert(1, "gpus", int(results[0].get("world_size", len(results))))
    return t.reset_index(drop=True)


def predicted_against_measured(pred: Any, measured: Any, *, tolerance: float = 0.15) -> Any:
    """:func:`predict_by_scale`'s rows beside :func:`slower_rank_steps`' at the same GPU counts and modes:
    predicted_ms, measured_ms, error (predicted / measured - 1) and ``within`` (|error| <= tolerance). Only the
    pairs present in both are kept, so a prediction at 8 GPUs with no 8-GPU run is left out, not compared."""
    m = measured[["gpus", "mode", "step_ms"]].rename(columns={"step_ms": "measured_ms"})
    p = pred[["gpus", "mode", "step_ms", "exposed_ms"]].rename(columns={"step_ms": "predicted_ms",
                                                                       "exposed_ms": "predicted_exposed_ms"})
    out = p.merge(m, on=["gpus", "mode"], how="inner")
    if out.empty:
        raise GpuprofError("no GPU count and mode are both predicted and measured.",
                           f"Predicted: {sorted(set(pred['gpus']))} GPUs; measured: {sorted(set(measured['gpus']))}.")
    out["error"] = out["predicted_ms"] / out["measured_ms"] - 1
    out["within"] = out["error"].abs() <= tolerance
    # the same model without its communication: when this error is within the tolerance too, the step check
    # cannot tell the model's communication from none (at these sizes the exposed part is under 1% of a step)
    out["no_comm_error"] = (out["predicted_ms"] - out["predicted_exposed_ms"]) / out["measured_ms"] - 1
    return out


def exposed_against_measured(pred: Any, summary: Any, *, tolerance: float = 0.5) -> Any:
    """The model's exposed time per collective kind (:func:`predict_by_scale`'s ``exposed_<kind>_ms``) beside the
    run's (:func:`overlap_summary`, median step), at the GPU count both have, per mode and kind. The run's side is
    the rank with the *smaller* exposed time: an NCCL kernel's time holds its wait for the peer, which the model
    leaves out, and the rank that arrived last waited least. Columns: predicted_ms, measured_ms, error
    (predicted / measured - 1) and ``within`` (|error| <= tolerance). Unlike the step, this fails a model whose
    communication is wrong even when the step's total is near."""
    import pandas as pd

    rows = []
    measured = summary[summary["kind"] != "any"].groupby(["mode", "kind"], sort=False)["exposed_ms"].min()
    for r in pred.itertuples():
        for kind in COLLECTIVES:
            col = f"exposed_{kind}_ms"
            if col in pred.columns and pd.notna(getattr(r, col)) and (r.mode, kind) in measured.index:
                m = float(measured[(r.mode, kind)])
                rows.append({"gpus": r.gpus, "mode": r.mode, "kind": kind, "predicted_ms": float(getattr(r, col)),
                             "measured_ms": m})
    if not rows:
        raise GpuprofError("no mode and collective kind is both predicted and measured.")
    out = pd.DataFrame(rows)
    out["error"] = out["predicted_ms"] / out["measured_ms"] - 1
    out["within"] = out["error"].abs() <= tolerance
    return out


def hidden_by_kind(summary: Any) -> Any:
    """:func:`overlap_summary` per mode and collective kind, on the worse rank: the lowest hidden share, and the
    largest exposed time of a median step (ms). The issue's check reads the ``any`` row of each FSDP2 mode; the
    per-kind rows name where the exposed remainder sits."""
    g = summary.groupby(["mode", "kind"], sort=False)
    out = g.agg(ranks=("rank", "size"), comm_ms=("comm_ms", "max"), exposed_ms=("exposed_ms", "max"),
                hidden_share=("hidden_share", "min"))
    return out.reset_index()


# --- past one node: NCCL's own cost model for the latency, a documented network for the bandwidth ---------------------

# NCCL's tuning model (NVIDIA/nccl v2.28.9-1, src/graph/tuning.cc: baseLatencies and hwLatencies, Ring, protocol
# Simple; the same values in v2.30.7-1): a ring collective's latency is the base plus, per step, the NVLink step's
# latency inside a node and the network step's across nodes. NCCL uses these to choose an algorithm; they are its
# estimates, not measurements (section 7 measured a 70.1 us intercept per collective on four GPUs where this gives
# 18.6 us).
NCCL_RING_SIMPLE_US = {"base": 8.4, "nvlink_step": 3.4, "net_step": 14.0}
# The same table's LL128 protocol (ring): lower latency per step, 0.92 of Simple's bandwidth (tuning.cc: "busBw * (0.92
# /*120.0/128.0*/)"). NCCL picks, per collective, the algorithm and protocol its estimate says is fastest, and on
# Hopper LL128 is allowed across nodes where the GPU-to-NIC path is at most PXN (a NIC per GPU, as a DGX H100 has), so for
# large rings its estimate favours LL128. NCCL also caps LL128's bandwidth per channel, which the model leaves out.
NCCL_RING_LL128_US = {"base": 14.0, "nvlink_step": 1.9, "net_step": 4.0}
LL128_BANDWIDTH = 0.92


def nccl_ring_latency_us(kind: str, n: int, per_node: int = 8, constants: dict[str, float] = NCCL_RING_SIMPLE_US) -> float:
    """NCCL's estimate of a ring ``kind``'s latency on ``n`` ranks, ``per_node`` to a node: ``base + (steps -
    inter) x nvlink_step + inter x net_step``, with ``steps`` the ring's (``latency_steps``) and ``inter`` the steps
    that cross nodes (``nodes - 1``, twice that for an all-reduce), as tuning.cc counts them. (tuning.cc also takes the NVLink step as at least the CPU's network overhead,
    ``max(intraLat, netOverhead)``: 1 us on Intel, 2 us on AMD, three times that for Simple; on Intel hosts, as a
    DGX H100 has, 3.4 us already exceeds it, on AMD the Simple step would be 6 us.)"""
    steps = latency_steps(kind, n, "ring")
    nodes = max(1, math.ceil(n / per_node))
    inter = 0 if nodes == 1 else (2 * (nodes - 1) if kind == "all_reduce" else nodes - 1)
    return constants["base"] + (steps - inter) * constants["nvlink_step"] + inter * constants["net_step"]


def scale_out_link(n: int, busbw_gbps: float, per_node: int = 8, *, constants: dict[str, float] = NCCL_RING_SIMPLE_US,
                   extra_us: float = 0.0) -> Link:
    """The model's :class:`Link` on ``n`` ranks: ``busbw_gbps`` and, per ring step, NCCL's latency estimate for
    an all-gather (:func:`nccl_ring_latency_us` with ``constants``) plus ``extra_us`` per collective, spread over
    its ``n - 1`` steps, so that the model's all-gathers and reduce-scatters cost that much latency each. An
    all-reduce gets the same per-step latency, so the model charges it twice the all-gather's latency (NCCL counts
    the base once, and adds its 1.4x "plateau" factor to multi-node ring all-reduces): approximate past one node. ``extra_us`` is a sensitivity: the course measured a larger intercept per collective on four GPUs
    than NCCL estimates, and it did not grow with the ring's steps (chapter 13, section 7)."""
    return Link(busbw_gbps, (nccl_ring_latency_us("all_gather", n, per_node, constants) + extra_us) / max(1, n - 1))


def predict_scale_out(units: Sequence[UnitCost], optimizer_ms: float, busbw_gbps: float, *,
                      scales: Sequence[int] = (8, 64, 1024, 2048, 4096), per_node: int = 8,
                      modes: Sequence[str] = ("fsdp_reshard",), prefetch: int = 1,
                      constants: dict[str, float] = NCCL_RING_SIMPLE_US, extra_us: float = 0.0) -> Any:
    """:func:`predict_by_scale` at each of ``scales`` over :func:`scale_out_link`: the same per-GPU computation
    (each GPU keeps its batch), collectives at ``busbw_gbps`` with NCCL's ring latency (``constants``) plus
    ``extra_us`` per collective. Adds each collective's latency (``ring_latency_ms``) to each row."""
    import pandas as pd

    rows = []
    for n in scales:
        link = scale_out_link(n, busbw_gbps, per_node, constants=constants, extra_us=extra_us)
        t = predict_by_scale(units, link, optimizer_ms, scales=(n,), modes=modes, prefetch=prefetch)
        rows.append(t.assign(ring_latency_ms=(nccl_ring_latency_us("all_gather", n, per_node, constants) + extra_us) / 1e3))
    return pd.concat(rows, ignore_index=True)


def group_units(units: Sequence[UnitCost], per_unit: int) -> list[UnitCost]:
    """The same model wrapped ``per_unit`` layers to a sharding unit (``--unit block:K``): the first unit (the
    root, kept) stays as it is, the layers after it are summed ``per_unit`` at a time (compute and bytes), so each
    unit's collectives move that many layers' bytes and pay one latency instead of ``per_unit``."""
    root, layers = list(units[:1]), list(units[1:])
    grouped = [UnitCost(sum(u.forward_ms for u in chunk), sum(u.backward_ms for u in chunk),
                        sum(u.gather_bytes for u in chunk), sum(u.reduce_bytes for u in chunk), False)
               for chunk in (layers[i:i + per_unit] for i in range(0, len(layers), per_unit))]
    return root + grouped
