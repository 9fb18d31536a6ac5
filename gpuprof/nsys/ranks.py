"""One capture's (or several captures') GPU work split by rank: which process ran what, on one clock.

A distributed job runs one process per GPU, and a profile of it is either one report per
rank or one report around the launcher holding every process. Either way a question about
communication (did the all-reduce hide under compute? who waited for whom?) is asked per
rank, so :func:`rank_data` reads the reports into one :class:`RankData` per rank: its
kernels (NCCL's flagged by :func:`gpuprof.kernel_kinds.is_communication`) and its NVTX
ranges, shifted onto the earliest report's clock. :func:`collective_end_skew` checks that
shift; :func:`overlap_by_rank` and :func:`comm_overlap` measure how much communication time
compute kernels hid. Nothing here depends on what the program is: a process's rank comes
from a ``rank_R`` NVTX range when the program opens one, else from PID order.
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

__all__ = ["RANK_RANGE", "RankData", "rank_data", "collective_end_skew", "comm_overlap", "overlap_by_rank"]

RANK_RANGE = re.compile(r"rank_(\d+)")


@dataclass
class RankData:
    """One rank's share of a capture: its kernels (NCCL ones flagged) and NVTX ranges, on the report's clock."""

    rank: int
    pid: int
    kernels: pd.DataFrame
    ranges: pd.DataFrame
    source: str

    @property
    def nccl(self) -> pd.DataFrame:
        return self.kernels[self.kernels["nccl"]]

    @property
    def compute(self) -> pd.DataFrame:
        return self.kernels[~self.kernels["nccl"]]


def rank_data(paths: str | Path | Sequence[str | Path]) -> dict[int, RankData]:
    """Every rank found in one report or in several (one per rank), keyed by rank.

    A process's rank is read from the ``rank_R`` range the course's scripts open around
    their work; its kernels are those whose ``globalPid`` is that process. A report
    of another program (no such range) gives each process with kernels a rank in PID order.

    Each report counts time from its own session's start; several reports are put on one
    axis (the earliest report's) by shifting each by its session start time
    (:func:`gpuprof.nsys.sqlite.session_start`), which nsys takes from the host's clock.
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
        for df in (kernels, ranges):
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
            out[rank] = RankData(rank, pid, kernels[kpid == pid].reset_index(drop=True),
                                 ranges[ranges["pid"] == pid].reset_index(drop=True), str(path))
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
