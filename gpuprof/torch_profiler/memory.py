"""CUDA memory over a training step, from PyTorch's allocator history (a "memory snapshot").

``torch.cuda.memory._record_memory_history()`` makes the caching allocator log every
allocation and free; ``torch.cuda.memory._snapshot()`` (or ``_dump_snapshot(file)``,
a pickle) returns that log as ``device_traces``: one list per GPU of entries with an
``action`` (``alloc``, ``free_requested``, ``free_completed``, ``segment_alloc``...),
``addr``, ``size``, ``stream`` and the stack (``frames``) that asked. This is what
replaces ``profile(...).export_memory_timeline``, which warns that it is deprecated.

This module reads such a log, from a live snapshot dict, a ``_dump_snapshot`` pickle, or
the compact JSON the course stores (:func:`compact`), and turns it into:

* :func:`trace_entries`: the log as a table, one row per allocator event, in order;
* :func:`lifetimes`: one row per allocation: the events at which it was allocated and
  freed, its size, and the innermost stack frame of the caller's own code;
* :func:`categorise`: each allocation's category from the phases it was allocated and
  freed in (allocated in ``forward`` and freed in ``backward``: activations kept for the
  backward pass; allocated in ``backward`` and freed at the optimizer's ``zero_grad``:
  gradients...), given the phase boundaries;
* :func:`curve`: allocated bytes after every event, by category, for a stacked figure.

The x-axis is the allocator's event number, not time, as in PyTorch's own viewer
(https://pytorch.org/memory_viz): an allocation's place in the sequence is exact, and
needs no clock.

Phase boundaries come from the recording script. ``examples/pytorch_profiler/
memory_snapshot.py`` marks the end of each phase by allocating and freeing a block of
a size nothing else uses (:data:`MARKER_BASE` + phase number, times 512 bytes); the
markers are found in the log and removed (:func:`split_markers`). A snapshot of another
program has no markers: its curve is drawn by size class, or by the stack frame that
allocated.
"""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..errors import GpuprofError

__all__ = ["MARKER_BASE", "marker_bytes", "block_bytes", "BLOCK_BYTES", "allocator_slack", "check_against_allocator", "trace_entries", "split_markers", "lifetimes", "categorise", "curve",
           "compact", "read_snapshot", "CATEGORY_NAMES"]

# Marker blocks: 512-byte multiples (the allocator's rounding) of sizes no tensor of the course's models has.
MARKER_BASE = 1_003  # 513,536 bytes and up: half a MiB, in the allocator's small pool


def marker_bytes(index: int) -> int:
    """Size of the marker block that ends phase ``index`` (0, 1, 2...)."""
    return 512 * (MARKER_BASE + index)


def _user_frame(frames: Sequence[dict[str, Any]] | None) -> str:
    """The innermost frame outside PyTorch's own files: the line of the program that asked for memory."""
    for f in frames or ():
        name = str(f.get("filename", ""))
        if name and "/torch/" not in name and not name.startswith("??") and "<frozen" not in name \
                and not name.endswith((".cpp", ".h", ".cu", ".cuh")):
            return f"{Path(name).name}:{f.get('line', '?')} {f.get('name', '')}".strip()
    return ""


def trace_entries(snapshot: dict[str, Any], device: int | None = None) -> pd.DataFrame:
    """The allocator log of one GPU as a table: event, action, addr, size, stream, frame (and time_us where
    the snapshot has it). ``device`` None takes the GPU with the most events."""
    if "entries" in snapshot:  # the course's compact form
        return pd.DataFrame(snapshot["entries"]).rename_axis("event").reset_index()
    traces = snapshot.get("device_traces")
    if traces is None:
        raise GpuprofError("This snapshot has no 'device_traces': it was taken without an allocation history.",
                           "Call torch.cuda.memory._record_memory_history() before the code you want to see.")
    if device is None:
        device = int(np.argmax([len(t) for t in traces])) if traces else 0
    if device >= len(traces) or not traces[device]:
        raise GpuprofError(f"The snapshot holds no allocator events for GPU {device}.",
                           "Was memory history recording on while the program ran?")
    rows = [{"action": e.get("action"), "addr": e.get("addr"), "size": int(e.get("size", 0)),
             "stream": e.get("stream"), "time_us": e.get("time_us"), "frame": _user_frame(e.get("frames"))}
            for e in traces[device]]
    df = pd.DataFrame(rows)
    if df["time_us"].isna().all():
        df = df.drop(columns="time_us")
    return df.rename_axis("event").reset_index()


def split_markers(entries: pd.DataFrame, phases: Sequence[str]) -> tuple[pd.DataFrame, list[int]]:
    """Remove the phase markers from the log; return the log (renumbered) and, per phase, the event
    number at which it ended (the first event after it)."""
    ends: list[int] = []
    keep = np.ones(len(entries), dtype=bool)
    for i in range(len(phases)):
        hit = np.flatnonzero((entries["size"].to_numpy() == marker_bytes(i)) & (entries["action"] == "alloc").to_numpy())
        if len(hit) != 1:
            raise GpuprofError(f"Found {len(hit)} markers for phase {i} ({phases[i]}) in the allocator log, "
                               "expected 1.", "Was the snapshot recorded by memory_snapshot.py?")
        addr = entries["addr"].iloc[hit[0]]
        same = np.flatnonzero((entries["addr"].to_numpy() == addr) & (entries["size"].to_numpy() == marker_bytes(i)))
        keep[same] = False
        ends.append(int(hit[0]))
    out = entries[keep].drop(columns="event").reset_index(drop=True).rename_axis("event").reset_index()
    removed_before = np.cumsum(~keep) - (~keep)  # removed events strictly before each position
    ends = [int(e - removed_before[e]) for e in ends]
    return out, ends


BLOCK_BYTES = 512  # the caching allocator's smallest block, and its rounding step (unless PYTORCH_CUDA_ALLOC_CONF changes it)


def block_bytes(requested: np.ndarray | int) -> np.ndarray:
    """What the allocator hands out for a request: the size rounded up to a multiple of 512 bytes."""
    return -(-np.asarray(requested) // BLOCK_BYTES) * BLOCK_BYTES


def lifetimes(entries: pd.DataFrame) -> pd.DataFrame:
    """One row per allocation in the log: alloc_event, free_event (NA if still allocated at the end), bytes,
    requested, frame. A free is the ``free_requested`` of the same address (the program let go of it);
    memory freed in the log but allocated before recording started has no row (it is in the baseline).

    The log records the size the program asked for (``requested``: 4 bytes for a scalar); the
    allocator hands out a block rounded up to 512 bytes, and ``torch.cuda.memory_allocated()``
    counts blocks, so ``bytes`` is the block size (checked against ``memory_allocated`` on a
    real run by ``examples/pytorch_profiler/memory_snapshot.py``)."""
    allocs: dict[Any, tuple[int, int, str]] = {}
    rows = []
    for r in entries.itertuples(index=False):
        if r.action == "alloc":
            allocs[r.addr] = (r.event, r.size, getattr(r, "frame", ""))
        elif r.action == "free_requested" and r.addr in allocs:
            ev, size, frame = allocs.pop(r.addr)
            rows.append((ev, r.event, size, frame))
    rows += [(ev, None, size, frame) for ev, size, frame in allocs.values()]
    out = pd.DataFrame(rows, columns=["alloc_event", "free_event", "requested", "frame"])
    out.insert(2, "bytes", block_bytes(out["requested"].to_numpy(dtype=np.int64)))
    out["free_event"] = out["free_event"].astype("Int64")
    return out.sort_values("alloc_event", ignore_index=True)


# What an allocation is, from the phase it was allocated in and the phase it was freed in, in a training step.
CATEGORY_NAMES = {
    ("forward", "backward"): "activations kept for backward",
    ("forward", "forward"): "forward temporaries",
    ("backward", "backward"): "backward temporaries",
    ("backward", "optimizer_step"): "gradients",
    ("optimizer_step", "optimizer_step"): "optimizer temporaries",
    ("optimizer_step", None): "optimizer state",
    ("forward", None): "kept after the step",
    ("backward", None): "kept after the step",
}


def _phase_at(events: np.ndarray, ends: Sequence[int], labels: Sequence[str]) -> list[str | None]:
    idx = np.searchsorted(np.asarray(ends), events, side="right")
    return [labels[i] if i < len(labels) else None for i in idx]


def categorise(life: pd.DataFrame, ends: Sequence[int], phases: Sequence[str]) -> pd.DataFrame:
    """Add alloc_phase, free_phase (phase names, with the step: ``step 0 forward``) and category.

    ``phases`` are labels like ``"0:forward"`` (step, phase), in order, one per boundary of ``ends``.
    The category is :data:`CATEGORY_NAMES` of the pair of phase names (any step), or
    ``"A -> B"`` where the pair has no name.
    """
    life = life.copy()
    life["alloc_phase"] = _phase_at(life["alloc_event"].to_numpy(), ends, phases)
    free = life["free_event"].to_numpy(dtype=float, na_value=np.nan)
    fp = _phase_at(np.where(np.isnan(free), 10**15, free).astype(np.int64), ends, phases)
    life["free_phase"] = pd.Series([p if not np.isnan(f) else None for p, f in zip(fp, free)], index=life.index,
                                   dtype=object)

    def name(a: str | None, f: str | None) -> str:
        pa = a.split(":", 1)[1] if a else None
        pf = f.split(":", 1)[1] if f else None
        if a and f and a.split(":", 1)[0] != f.split(":", 1)[0]:
            return "kept into the next step"
        return CATEGORY_NAMES.get((pa, pf)) or f"{pa} -> {pf or 'end'}"

    life["category"] = [name(a if isinstance(a, str) else None, f if isinstance(f, str) else None)
                        for a, f in zip(life["alloc_phase"], life["free_phase"])]
    return life


def curve(life: pd.DataFrame, n_events: int, *, by: str = "category", baseline: int = 0) -> pd.DataFrame:
    """Allocated bytes after each event 0 .. n_events - 1, one column per value of ``by``, plus ``baseline``
    (memory allocated before the log started, a constant column) when non-zero."""
    cols = {}
    for key, g in life.groupby(by, sort=False):
        delta = np.zeros(n_events + 1, dtype=np.int64)
        np.add.at(delta, g["alloc_event"].to_numpy(dtype=np.int64), g["bytes"].to_numpy(dtype=np.int64))
        freed = g.dropna(subset=["free_event"])
        np.add.at(delta, freed["free_event"].to_numpy(dtype=np.int64), -freed["bytes"].to_numpy(dtype=np.int64))
        cols[str(key)] = np.cumsum(delta)[:n_events]
    out = pd.DataFrame(cols)
    if baseline:
        out.insert(0, "before the log", baseline)
    return out


UNSPLIT_BYTES = 1 << 20  # a large block is not split when less than this would remain: the program gets it whole


def allocator_slack(life: pd.DataFrame, n_events: int) -> np.ndarray:
    """After each event: how many bytes more than the log's blocks the allocator may count as allocated.

    The caching allocator serves a large request (over 1 MiB) from a cached block and splits
    off the rest only if at least 1 MiB would remain; otherwise the program gets the whole
    block, and ``memory_allocated()`` counts all of it. The log records only the request,
    so each live block over 1 MiB may hide up to 1 MiB more: this is the bound, per event.
    """
    large = life[life["bytes"] > UNSPLIT_BYTES]
    delta = np.zeros(n_events + 1, dtype=np.int64)
    np.add.at(delta, large["alloc_event"].to_numpy(dtype=np.int64), UNSPLIT_BYTES)
    freed = large.dropna(subset=["free_event"])
    np.add.at(delta, freed["free_event"].to_numpy(dtype=np.int64), -UNSPLIT_BYTES)
    return np.cumsum(delta)[:n_events]


def check_against_allocator(life: pd.DataFrame, n_events: int, baseline: int, end_allocated: int,
                            peak_allocated: int, extra_peak: int = 0) -> str:
    """Check a log against the allocator's own counters (``memory_allocated()`` at the end and
    ``max_memory_allocated()``): each must lie between the log's blocks and the log's blocks plus
    :func:`allocator_slack` (and ``extra_peak`` for blocks removed from the log, such as markers).
    Returns a sentence; raises :class:`GpuprofError` when the log cannot be the allocator's."""
    total = curve(life.assign(all_blocks="all"), n_events, by="all_blocks", baseline=baseline).sum(axis=1).to_numpy()
    slack = allocator_slack(life, n_events)
    if not total[-1] <= end_allocated <= total[-1] + slack[-1]:
        raise GpuprofError(f"the log ends at {int(total[-1]):,} bytes allocated (up to {int(slack[-1]):,} more in "
                           f"unsplit blocks), the allocator says {end_allocated:,}: the log is incomplete.")
    if not total.max() <= peak_allocated <= (total + slack).max() + extra_peak:
        raise GpuprofError(f"the log's peak {int(total.max()):,} bytes (up to {int((total + slack).max()):,} with "
                           f"unsplit blocks) does not match max_memory_allocated {peak_allocated:,}.")
    return (f"log checked against the allocator: {n_events:,} events; at the end {end_allocated / 2**20:.1f} MiB "
            f"allocated, peak {peak_allocated / 2**20:.1f} MiB, both within the log's blocks and the allocator's "
            f"rounding")


def compact(snapshot: dict[str, Any], *, device: int | None = None, **meta: Any) -> dict[str, Any]:
    """The part of a snapshot the analyses need (the log's events with one frame each), plus ``meta``:
    small enough to keep beside a chapter, where the pickle's full stacks are megabytes."""
    entries = trace_entries(snapshot, device)
    keep = entries[entries["action"].isin(["alloc", "free_requested", "free_completed", "segment_alloc",
                                           "segment_free", "oom"])]
    records = keep.drop(columns="event").to_dict(orient="records")
    return {"format": "gpuprof-memory-log/1", **meta, "entries": records}


def read_snapshot(path: str | Path) -> dict[str, Any]:
    """Read a snapshot: a ``_dump_snapshot`` pickle, or the course's compact ``.json`` / ``.json.gz``."""
    path = Path(path)
    if not path.exists():
        raise GpuprofError(f"{path} does not exist.", "Give a torch.cuda.memory._dump_snapshot pickle or a "
                           "compact log (the JSON of gpuprof.torch_profiler.memory.compact, as memory_snapshot.py "
                           "writes it).")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if raw[:1] in (b"{", b"["):
        data = json.loads(raw)
        if not isinstance(data, dict) or "entries" not in data:
            raise GpuprofError(f"{path} is JSON but not a memory log (no 'entries').",
                               "A profiler trace is read by gpuprof.torch_profiler.read_trace.")
        return data
    try:
        data = pickle.loads(raw)  # noqa: S301 - a snapshot is a pickle by PyTorch's design; read your own files only
    except Exception as exc:  # noqa: BLE001
        raise GpuprofError(f"{path} is neither a memory snapshot pickle nor a JSON memory log ({exc}).") from None
    if not isinstance(data, dict) or "device_traces" not in data:
        raise GpuprofError(f"{path} is a pickle but not a CUDA memory snapshot (no 'device_traces').")
    return data
