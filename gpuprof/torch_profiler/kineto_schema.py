"""Kineto's trace schema as the readers use it: categories by kind, argument columns, time conversion.

Shared by :mod:`gpuprof.torch_profiler.trace` (the whole-file reader) and
:mod:`gpuprof.torch_profiler.trace_stream` (the streamed one), so both read a file by the same
rules and give equal values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

__all__ = ["KINDS", "FLOW_CATEGORIES", "ARG_COLUMNS", "KNOWN_SCHEMA_VERSIONS"]

# Kineto's category names, today's and older spellings, by the kind they hold.
KINDS = {
    "cpu_op": "cpu_op", "operator": "cpu_op",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
    "python_function": "python_function", "python function": "python_function",
    "cuda_runtime": "runtime", "runtime": "runtime", "privateuse1_runtime": "runtime",
    "cuda_driver": "driver", "driver": "driver", "privateuse1_driver": "driver",
    "kernel": "kernel",
    "gpu_memcpy": "memcpy", "memcpy": "memcpy",
    "gpu_memset": "memset", "memset": "memset",
    "cuda_sync": "sync",
    "trace": "trace",
    "cpu_instant_event": "instant",
}
FLOW_CATEGORIES = {"ac2g": "ac2g", "async_cpu_to_gpu": "ac2g", "fwdbwd": "fwdbwd"}
# Argument names of Kineto's events, renamed to the columns the Nsight Systems readers use.
ARG_COLUMNS = {"correlation": "correlationId", "stream": "streamId", "device": "deviceId",
               "External id": "externalId", "context": "contextId", "bytes": "bytes"}
# Schema versions this reader was checked on (Kineto has written 1 since it started to say).
KNOWN_SCHEMA_VERSIONS = {1}


def _numbers(values: list[Any]) -> np.ndarray:
    """Timestamps as float64 microseconds: numbers, or numeric strings in traces that quote them."""
    return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=float)


def _to_ns(us: np.ndarray) -> np.ndarray:
    out = np.full(len(us), np.iinfo(np.int64).min, dtype=np.int64)
    ok = np.isfinite(us)
    out[ok] = np.round(us[ok] * 1000.0).astype(np.int64)
    return out


def _correlation_from_flows(t: pd.DataFrame, flows: pd.DataFrame, *, gpu: bool) -> None:
    """Fill a missing ``correlationId`` from the ``ac2g`` flow that ends (GPU side) or starts (CPU side) at the event.

    Kineto writes the correlation id both as an argument and as the id of a flow event;
    traces that lack the argument still have the flow, bound to the event's thread and
    start time.
    """
    if t.empty or ("correlationId" in t.columns and t["correlationId"].notna().all()):
        return
    fl = flows[(flows["cat"] == "ac2g") & (flows["phase"] == ("f" if gpu else "s"))]
    if fl.empty:
        if "correlationId" not in t.columns:
            t["correlationId"] = pd.array([pd.NA] * len(t), dtype="Int64")
        return
    key = pd.DataFrame({"pid": fl["pid"].astype(str), "tid": fl["tid"].astype(str), "start": fl["ts"],
                        "flow_id": pd.to_numeric(fl["id"], errors="coerce")}).drop_duplicates(["pid", "tid", "start"])
    left = pd.DataFrame({"pid": t["pid"].astype(str), "tid": t["tid"].astype(str), "start": t["start"]})
    ids = left.merge(key, on=["pid", "tid", "start"], how="left")["flow_id"].to_numpy(dtype=float, copy=True)
    ids[ids != np.round(ids)] = np.nan  # a fractional flow id names no launch: Kineto's are whole numbers
    have = t["correlationId"] if "correlationId" in t.columns else pd.Series(pd.NA, index=t.index, dtype="Int64")
    t["correlationId"] = have.fillna(pd.Series(ids, index=t.index)).astype("Int64")
