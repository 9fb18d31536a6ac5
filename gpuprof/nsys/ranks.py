"""One capture's (or several captures') GPU work split by rank: which process ran what, on one clock.

A distributed job runs one process per GPU, and a profile of it is either one report per
rank or one report around the launcher holding every process. Either way a question about
communication (did the all-reduce hide under compute? who waited for whom?) is asked per
rank, so :func:`rank_data` reads the reports into one :class:`RankData` per rank: its
kernels (NCCL's flagged by :func:`gpuprof.kernel_kinds.is_communication`) and its NVTX
ranges, shifted onto the earliest report's clock. :func:`collective_end_skew` checks that
shift; :func:`overlap_by_rank` and :func:`comm_overlap` measure how much communication time
compute kernels hid. :func:`collective_kernels` answers the same per NCCL kernel, with its
collective (:func:`collective_kind`: all-gather, reduce-scatter, all-reduce ... read from the
kernel's name), so a sharded job's all-gathers and reduce-scatters are told apart;
:func:`synced_windows` gives a CPU range's GPU window (to the end of the synchronisation that
follows it), since the GPU runs behind the CPU's ranges. Nothing here depends on what the
program is: a process's rank comes from a ``rank_R`` NVTX range when the program opens one,
else from PID order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from .. import activity as ta
from ..errors import GpuprofError
from ..kernel_kinds import is_communication
from . import sqlite as ns

__all__ = ["RANK_RANGE", "RankData", "rank_data", "collective_end_skew", "comm_overlap", "overlap_by_rank",
           "collective_kind", "collective_kernels", "synced_windows"]

RANK_RANGE = re.compile(r"rank_(\d+)")


@dataclass
class RankData:
    """One rank's share of a capture: its kernels (NCCL ones flagged) and NVTX ranges, on the report's clock."""

    rank: int
    pid: int
    kernels: pd.DataFrame
    ranges: pd.DataFrame
    source: str
    runtime: pd.DataFrame | None = None  # the process's CUDA API calls, when rank_data(..., runtime=True) read them

    @property
    def nccl(self) -> pd.DataFrame:
        return self.kernels[self.kernels["nccl"]]

    @property
    def compute(self) -> pd.DataFrame:
        return self.kernels[~self.kernels["nccl"]]


def rank_data(paths: str | Path | Sequence[str | Path], *, runtime: bool = False) -> dict[int, RankData]:
    """Every rank found in one report or in several (one per rank), keyed by rank.

    A process's rank is read from the ``rank_R`` range the course's scripts open around
    their work; its kernels are those whose ``globalPid`` is that process. A report
    of another program (no such range) gives each process with kernels a rank in PID order.

    Each report counts time from its own session's start; several reports are put on one
    axis (the earliest report's) by shifting each by its session start time
    (:func:`gpuprof.nsys.sqlite.session_start`), which nsys takes from the host's clock.
    ``runtime=True`` also reads each process's CUDA API calls (large: only when a measure needs
    them, such as :func:`synced_windows`).
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    starts = [ns.session_start(p) for p in paths]
    known = [s for s in starts if s is not None]
    out: dict[int, RankData] = {}
    for path, start in zip(paths, starts):
        shift = (start - min(known)) if start is not None and len(known) == len(paths) else 0
        kernels = ns.kernels(path)
        ranges = ns.nvtx_ranges(path)
        calls = ns.runtime_calls(path) if runtime else None
        for df in (kernels, ranges) if calls is None else (kernels, ranges, calls):
            df["start"] += shift
            df["end"] += shift
        kernels["nccl"] = is_communication(kernels["name"])
        ranges["pid"] = ns.pid_of(ranges["globalTid"].astype("int64"))
        kpid = ns.pid_of(kernels["globalPid"].astype("int64")) if "globalPid" in kernels else pd.Series(0, index=kernels.index)
        named = ranges[ranges["text"].str.fullmatch(RANK_RANGE.pattern)]
        ranks = {int(p): int(RANK_RANGE.fullmatch(t).group(1)) for p, t in zip(named["pid"], named["text"])}
        if not ranks:
            ranks = {int(p): len(out) + i for i, p in enumerate(sorted(kpid.unique()))}
        for pid, rank in ranks.items():
            if rank in out:
                raise ValueError(f"rank {rank} appears twice (in {Path(out[rank].source).name} and {Path(path).name})")
            own_calls = None if calls is None else \
                calls[ns.pid_of(calls["globalTid"].astype("int64")) == pid].reset_index(drop=True)
            out[rank] = RankData(rank, pid, kernels[kpid == pid].reset_index(drop=True),
                                 ranges[ranges["pid"] == pid].reset_index(drop=True), str(path), own_calls)
    return dict(sorted(out.items()))


def collective_end_skew(data: dict[int, RankData], pattern: str = "AllReduce") -> pd.DataFrame:
    """Each rank's n-th collective kernel (name containing ``pattern``) against rank 0's n-th, on the shared axis.

    Every rank issues the same collectives in the same order, and a collective's kernel ends
    almost together on all of them (its last step needs every rank's data), whatever time each
    rank reached it. So once :func:`rank_data` has put the reports on one axis, the ends of
    matched kernels should agree within microseconds; a wrong shift between the reports' clocks
    shows as the same offset on every pair. This is the check that catches clock skew when the
    reports come from several hosts. Returns one row per rank and collective: rank, index,
    end_skew_ns (its end minus rank 0's) and start_skew_ns (its start minus rank 0's: who arrived
    first). Refuses ranks with different numbers of such kernels (reports that started or
    stopped at different points cannot be matched by order).
    """
    first = min(data)

    def collectives(d: RankData) -> pd.DataFrame:
        n = d.nccl
        return n[n["name"].astype(str).str.contains(pattern)].sort_values("start", kind="stable")

    ref = collectives(data[first])
    rows = []
    for rank, d in data.items():
        if rank == first:
            continue
        k = collectives(d)
        if len(k) != len(ref):
            raise GpuprofError(f"rank {rank} ran {len(k)} {pattern} kernels and rank {first} {len(ref)}: they cannot be "
                               "matched by order.", "Capture the ranks over the same range of the program.")
        rows.append(pd.DataFrame({"rank": rank, "index": np.arange(len(k)),
                                  "end_skew_ns": k["end"].to_numpy() - ref["end"].to_numpy(),
                                  "start_skew_ns": k["start"].to_numpy() - ref["start"].to_numpy()}))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["rank", "index", "end_skew_ns",
                                                                              "start_skew_ns"])


def comm_overlap(nccl: pd.DataFrame, compute: pd.DataFrame) -> dict[str, float]:
    """NCCL kernel time (ms), the share of it under compute kernels on other streams, and the exposed rest."""
    comm = float(nccl["duration_ns"].sum()) / 1e6
    if nccl.empty:
        return {"comm_ms": 0.0, "hidden": float("nan"), "exposed_ms": 0.0}
    hidden = ta.copy_compute_overlap(nccl, compute)
    return {"comm_ms": comm, "hidden": hidden, "exposed_ms": comm * (1 - hidden)}


def overlap_by_rank(data: dict[int, RankData], window: tuple[int, int] | None = None) -> pd.DataFrame:
    """For any program's capture: per rank, NCCL kernel time, the share of it under compute kernels, and
    the exposed rest, over ``window`` (default: the whole report), without the course's NVTX ranges."""
    rows = []
    for rank, d in data.items():
        nccl, compute = (d.nccl, d.compute) if window is None else (ta.inside(d.nccl, window), ta.inside(d.compute, window))
        rows.append({"rank": rank, "nccl_kernels": len(nccl), **comm_overlap(nccl, compute),
                     "compute_ms": float(compute["duration_ns"].sum()) / 1e6})
    return pd.DataFrame(rows)


_NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")


def snake_case(word: str) -> str:
    """``AllGather`` -> ``all_gather``: NCCL's collective names (in its kernels' names and its NVTX ranges) in the
    snake case the course's tables use."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", word).lower()


def collective_kind(names: pd.Series) -> pd.Series:
    """The collective each NCCL kernel runs, from its name, in snake case: ``ncclDevKernel_AllGather_RING_LL``
    (NCCL 2.19 and later) and ``ncclKernel_AllGather_RING_LL_Sum_int8_t`` (earlier) give ``all_gather``;
    ``reduce_scatter``, ``all_reduce``, ``broadcast``, ``send_recv`` likewise. A name that is not an NCCL
    kernel's gives ``None``; an NCCL kernel named otherwise, ``other``."""
    names = names.astype(str)
    word = names.str.extract(_NCCL_KERNEL, expand=False)
    kind = word.map(snake_case, na_action="ignore")
    out = kind.astype(object).where(word.notna(), pd.Series(np.where(is_communication(names), "other", None),
                                                            index=names.index, dtype=object))
    return out.where(out.notna(), None)


def collective_kernels(d: RankData, window: tuple[int, int] | None = None) -> pd.DataFrame:
    """One row per NCCL kernel of rank ``d`` (in ``window``, clipped to it): how much of it compute hid.

    Columns: kind (:func:`collective_kind`), name, streamId, start, end, duration_ns (inside the
    window), hidden_ns (the part during which some non-NCCL kernel ran on *another* stream: the
    measure of :func:`comm_overlap`, per kernel) and exposed_ns (the rest). Summed over the kernels
    of a kind, hidden_ns and exposed_ns split that kind's kernel time; two NCCL kernels that ran at
    once (an all-gather beside a reduce-scatter) each count in full, so a sum over kinds can exceed
    the wall time communication took (:func:`gpuprof.activity.exposed_ns` gives that).

    An NCCL kernel's time includes its wait for the peers to arrive: a kernel that starts early
    spins, and that spin is counted, hidden or not, like its transfer.
    """
    columns = ["kind", "name", "streamId", "start", "end", "duration_ns", "hidden_ns", "exposed_ns"]
    nccl, compute = d.nccl, d.compute
    if window is not None:
        lo, hi = window
        nccl = nccl[(nccl["end"] > lo) & (nccl["start"] < hi)].assign(start=lambda x: x["start"].clip(lo, hi),
                                                                        end=lambda x: x["end"].clip(lo, hi))
        compute = compute[(compute["end"] > lo) & (compute["start"] < hi)]
    if nccl.empty:
        return pd.DataFrame(columns=columns)
    out = nccl[["name", "streamId", "start", "end"]].copy()
    out.insert(0, "kind", collective_kind(out["name"]))
    out["duration_ns"] = (out["end"] - out["start"]).astype("int64")
    hidden = np.zeros(len(out), dtype=np.int64)
    streams = out["streamId"].to_numpy()
    for stream in np.unique(streams):
        mine = streams == stream
        others = compute[compute["streamId"] != stream]
        hidden[mine] = ta.covered_lengths(others["start"].to_numpy(), others["end"].to_numpy(),
                                          out["start"].to_numpy()[mine], out["end"].to_numpy()[mine])
    out["hidden_ns"] = hidden
    out["exposed_ns"] = out["duration_ns"] - out["hidden_ns"]
    return out[columns].reset_index(drop=True)


def synced_windows(ranges: pd.DataFrame, runtime: pd.DataFrame) -> pd.DataFrame:
    """Each of ``ranges`` (CPU ranges: NVTX) with the GPU window of its work: from its start to the end of the
    first ``*Synchronize`` call its thread made at or after the range's end.

    The CPU runs ahead of the GPU: the kernels a step launches may still run after the step's NVTX
    range has closed (the CPU waits for them afterwards), so the range alone cuts its own work off.
    A program that synchronises after each step puts all of the step's GPU work before that call
    returns. Adds columns ``gpu_end`` (the call's end; NaN where the thread never synchronised
    afterwards, so no window can be promised) and ``sync`` (the call's name).
    """
    calls = runtime[runtime["name"].astype(str).str.contains(ta.SYNC_API)].sort_values("start", kind="stable")
    out = ranges.copy()
    ends, names = [], []
    for tid, end in zip(out["globalTid"].to_numpy(), out["end"].to_numpy()):
        after = calls[(calls["globalTid"] == tid) & (calls["start"] >= end)]
        ends.append(float(after["end"].iloc[0]) if len(after) else float("nan"))
        names.append(ta.api_name(str(after["name"].iloc[0])) if len(after) else None)
    out["gpu_end"] = ends
    out["sync"] = names
    return out
