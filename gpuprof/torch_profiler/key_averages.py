"""``key_averages()`` as plain records, and which of its names work on the installed PyTorch.

The averages live in the profiling process; saving them as records next to the trace
(:func:`records`, :func:`save_records`) lets a later reader, or a test, compare the
trace's own summary (:mod:`gpuprof.torch_profiler.summary`) with the profiler's.

Names have moved: the CUDA-specific attributes became device ones (``cuda_time_total``
-> ``device_time_total``, ``self_cuda_memory_usage`` -> ``self_device_memory_usage``),
some old names still work with a ``FutureWarning``, some are gone, and ``table(sort_by=...)``
accepts old names that the attributes no longer have. :func:`check_names` asks the
installed version rather than repeating a changelog.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

__all__ = ["records", "save_records", "load_records", "check_names", "ATTRIBUTES", "SORT_KEYS", "FIELDS"]

# The record's fields, each with the attribute names that have held it (newest first).
FIELDS = {
    "count": ("count",),
    "cpu_total_us": ("cpu_time_total",),
    "self_cpu_us": ("self_cpu_time_total",),
    "device_total_us": ("device_time_total", "cuda_time_total"),
    "self_device_us": ("self_device_time_total", "self_cuda_time_total"),
    "cpu_memory_bytes": ("cpu_memory_usage",),
    "self_cpu_memory_bytes": ("self_cpu_memory_usage",),
    "device_memory_bytes": ("device_memory_usage", "cuda_memory_usage"),
    "self_device_memory_bytes": ("self_device_memory_usage", "self_cuda_memory_usage"),
    "flops": ("flops",),
}
# Attribute names a reader meets in tutorials (the course's sources among them) and today's.
ATTRIBUTES = ("cpu_time_total", "self_cpu_time_total", "cuda_time_total", "self_cuda_time_total", "device_time_total",
              "self_device_time_total", "cuda_time", "device_time", "cuda_memory_usage", "self_cuda_memory_usage",
              "device_memory_usage", "self_device_memory_usage", "cpu_memory_usage", "self_cpu_memory_usage", "flops",
              "input_shapes", "stack")
SORT_KEYS = ("cpu_time_total", "self_cpu_time_total", "cuda_time_total", "self_cuda_time_total", "device_time_total",
             "self_device_time_total", "cpu_memory_usage", "self_cpu_memory_usage", "cuda_memory_usage",
             "self_cuda_memory_usage", "device_memory_usage", "self_device_memory_usage", "flops", "count")


def _quiet_get(obj: Any, names: Iterable[str]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            try:
                return getattr(obj, name)
            except AttributeError:
                continue
    return None


def records(averages: Iterable[Any]) -> list[dict[str, Any]]:
    """One dict per row of ``key_averages()`` (any grouping): key, the :data:`FIELDS` (times in us, memory
    in bytes), and input shapes and stack when the profile grouped by them."""
    out = []
    for e in averages:
        r: dict[str, Any] = {"key": str(e.key)}
        for f, names in FIELDS.items():
            v = _quiet_get(e, names)
            r[f] = float(v) if isinstance(v, (int, float)) else None
        shapes = _quiet_get(e, ("input_shapes",))
        if shapes:
            r["input_shapes"] = str(shapes)
        stack = _quiet_get(e, ("stack",))
        if stack:
            r["stack"] = list(stack)
        out.append(r)
    return out


def save_records(path: str | Path, averages: Iterable[Any], **meta: Any) -> Path:
    """Write :func:`records` to a JSON file, with whatever run description ``meta`` holds."""
    path = Path(path)
    path.write_text(json.dumps({**meta, "key_averages": records(averages)}, indent=1))
    return path


def load_records(path: str | Path) -> pd.DataFrame:
    data = json.loads(Path(path).read_text())
    return pd.DataFrame(data["key_averages"])


def check_names(averages: Any) -> pd.DataFrame:
    """For each attribute of :data:`ATTRIBUTES` and ``sort_by`` key of :data:`SORT_KEYS`: does it work on
    this PyTorch? ``result`` is ``ok``, ``warns`` (with the warning's text) or ``fails`` (with the error).

    ``averages`` is a ``key_averages()`` result with at least one row.
    """
    rows = []
    first = next(iter(averages))
    for kind, names in (("attribute", ATTRIBUTES), ("sort_by", SORT_KEYS)):
        for name in names:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    if kind == "attribute":
                        getattr(first, name)
                    else:
                        averages.table(sort_by=name, row_limit=1)
                    result, detail = "ok", ""
                except Exception as exc:  # noqa: BLE001 - what fails, and how, is the finding
                    result, detail = "fails", f"{type(exc).__name__}: {exc}"
            if result == "ok" and caught:
                result, detail = "warns", f"{caught[0].category.__name__}: {caught[0].message}"
            rows.append({"kind": kind, "name": name, "result": result, "detail": detail.splitlines()[0] if detail else ""})
    return pd.DataFrame(rows)
