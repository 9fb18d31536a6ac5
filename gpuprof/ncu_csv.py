"""Read Nsight Compute's CSV output (``ncu --import R.ncu-rep --csv --page details``).

The CSV is one row per (kernel launch, section, metric). ncu may print its own
``==PROF==`` lines and the program's output around the table, writes numbers with
thousands separators (``"1,234.5"``), and leaves the value empty where a metric does
not apply. This reader finds the table, keeps the text, and adds a numeric column.
"""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd

from .errors import GpuprofError

__all__ = ["read_details", "metric", "to_seconds"]

_REQUIRED = {"Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"}


def read_details(path: str | Path) -> pd.DataFrame:
    """Load a ``--page details`` CSV; ``value`` holds the metric as a float where it is one."""
    path = Path(path)
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        raise GpuprofError(f"{path} does not exist.", "Export it with `ncu --import R.ncu-rep --csv --page details`.") from None
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise GpuprofError(f"{path} holds no ncu CSV table (no header line starting with \"ID\").",
                           "Was the report empty? ncu prints 'No kernels were profiled' when the filter matched nothing.")
    table = [line for line in lines[start:] if line.startswith('"')]
    df = pd.read_csv(io.StringIO("\n".join(table)), dtype=str, keep_default_na=False)
    missing = _REQUIRED - set(df.columns)
    if missing:
        raise GpuprofError(f"{path} lacks the columns {sorted(missing)}.", "Export with `--page details` (the default page).")
    df["value"] = pd.to_numeric(df["Metric Value"].str.replace(",", "", regex=False), errors="coerce")
    return df


def metric(df: pd.DataFrame, name: str, section: str | None = None) -> pd.DataFrame:
    """Rows for one metric name (optionally within one section), one per profiled launch."""
    rows = df[df["Metric Name"] == name]
    if section is not None:
        rows = rows[rows["Section Name"] == section]
    if rows.empty:
        known = ", ".join(sorted(df["Metric Name"].unique())[:12])
        raise GpuprofError(f"No metric named {name!r} in this report.", f"It has: {known} ...")
    return rows


_TIME_UNITS = {"ns": 1e-9, "nsecond": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3,
               "s": 1.0, "second": 1.0}


def to_seconds(value: float, unit: str) -> float:
    """Convert an ncu time metric to seconds; ncu 2025.3 writes ``us``, older versions ``usecond``."""
    try:
        return value * _TIME_UNITS[unit.strip()]
    except KeyError:
        raise GpuprofError(f"Unknown time unit {unit!r} in the ncu report.", f"Known units: {', '.join(_TIME_UNITS)}.") from None
