"""Read Nsight Compute's CSV output: ``ncu --csv`` while profiling, or ``ncu --import R.ncu-rep --csv``.

Two pages:

* ``--page details`` (the default): one row per (kernel launch, section, metric), as the
  sections show them; :func:`read_details`.
* ``--page raw``: one row per kernel launch, one column per collected metric, with a
  second header row of units; :func:`read_raw`.

ncu may print its own ``==PROF==`` lines and the program's output around the table,
writes numbers with thousands separators (``"1,234.5"``) unless ``--print-units base``
and plain numbers are asked for, and leaves the value empty where a metric does not
apply. These readers find the table, keep the text, and add numeric values. An
``.ncu-rep`` given here gets a sentence pointing at :mod:`gpuprof.ncu.report`.
"""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd

from ..errors import GpuprofError

__all__ = ["read_details", "parse_details", "read_raw", "parse_raw", "metric", "to_seconds", "metric_columns"]

_REQUIRED = {"Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"}


def _text(path: str | Path) -> str:
    path = Path(path)
    if path.suffix == ".ncu-rep":
        raise GpuprofError(f"{path} is an Nsight Compute report, not its CSV export.",
                           "Read it with gpuprof.ncu.report, or export it: `ncu --import R.ncu-rep --csv --page details`.")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise GpuprofError(f"{path} does not exist.", "Export it with `ncu --import R.ncu-rep --csv --page details`.") from None
    if data.startswith(b"SQLite format 3"):
        raise GpuprofError(f"{path} is an SQLite file (an Nsight Systems export?), not ncu's CSV.", "Read it with gpuprof.nsys.sqlite.")
    return data.decode(errors="replace")


def _table_lines(text: str, source: str) -> list[str]:
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise GpuprofError(f"{source} holds no ncu CSV table (no header line starting with \"ID\").",
                           "Was the report empty? ncu prints 'No kernels were profiled' when the filter matched nothing.")
    header = lines[start]
    # ncu may repeat the header (one table per profiled process, or per kernel while profiling)
    return [header] + [line for line in lines[start + 1:] if line.startswith('"') and line != header]


def _read_table(lines: list[str], source: str) -> pd.DataFrame:
    """The CSV table as text columns; a table cut short (a copy interrupted, ncu killed) is one sentence."""
    try:
        return pd.read_csv(io.StringIO("\n".join(lines)), dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, ValueError) as exc:
        raise GpuprofError(f"{source} is not a complete ncu CSV table: {str(exc).strip().splitlines()[-1][:160]}.",
                           "It looks cut short or edited: export it again with `ncu --import R.ncu-rep --csv --page ...`.") from None


def _numbers(col: pd.Series) -> pd.Series:
    return pd.to_numeric(col.astype(str).str.replace(",", "", regex=False), errors="coerce")


def parse_details(text: str, source: str = "this output") -> pd.DataFrame:
    """The details page from ncu's printed output; ``value`` holds the metric as a float where it is one."""
    df = _read_table(_table_lines(text, source), source)
    missing = _REQUIRED - set(df.columns)
    if missing:
        raise GpuprofError(f"{source} lacks the columns {sorted(missing)}: it is not the details page.",
                           "Export with `--page details` (the default page), or read a raw page with read_raw.")
    df["value"] = _numbers(df["Metric Value"])
    return df


def read_details(path: str | Path) -> pd.DataFrame:
    """Load a ``--page details`` CSV; ``value`` holds the metric as a float where it is one."""
    return parse_details(_text(path), str(path))


def parse_raw(text: str, source: str = "this output") -> tuple[pd.DataFrame, dict[str, str]]:
    """The raw page from ncu's printed output: one row per launch (metrics as floats where they are
    numbers, text otherwise), and the unit of each metric column."""
    df = _read_table(_table_lines(text, source), source)
    if _REQUIRED <= set(df.columns):
        raise GpuprofError(f"{source} is ncu's details page (one row per metric), not the raw page.",
                           "Read it with read_details, or export the raw page: `ncu --import R.ncu-rep --csv --page raw`.")
    units: dict[str, str] = {}
    if len(df) and df.iloc[0]["ID"] == "":  # the second header row holds the units
        units = {c: u for c, u in df.iloc[0].items() if u}
        df = df.iloc[1:].reset_index(drop=True)
    for col in df.columns:
        # A metric ncu leaves empty for some launches (it does not apply there) is missing, not 0 and
        # not a reason to keep the whole column as text: numeric where every non-empty value is a number.
        present = df[col].astype(str).str.strip() != ""
        nums = _numbers(df[col])
        if len(df) and present.any() and nums[present].notna().all():
            df[col] = nums.where(present)
        elif len(df) and not present.any() and col in units:
            df[col] = float("nan")  # a metric (it has a unit) that no launch has a value for: missing everywhere
    return df, units


def read_raw(path: str | Path) -> tuple[pd.DataFrame, dict[str, str]]:
    """Load a ``--page raw`` CSV: (one row per launch, {metric: unit})."""
    return parse_raw(_text(path), str(path))


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


_TO_BASE = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9,
            "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12}


def metric_columns(details: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """One row per profiled launch (``ID``): ``kernel`` and a column per metric in ``names`` that the
    details page holds (the rows ncu prints under "Command line profiler metrics" for ``--metrics``).

    The details page scales units for reading (``74.14 us``, ``33.77 Mbyte``); times are turned
    back into nanoseconds and sizes into bytes, as the report itself stores them, so that a table
    built from the CSV equals one built from the ``.ncu-rep`` (gpuprof.ncu.derived accepts either).
    """
    rows = details[details["Metric Name"].isin(names)].copy()
    factor = rows["Metric Unit"].map(_TO_BASE).fillna(1.0)
    rows["scaled"] = rows["value"] * factor
    wide = rows.pivot_table(index="ID", columns="Metric Name", values="scaled", aggfunc="first")
    kernel = details.groupby("ID")["Kernel Name"].first()
    out = wide.reindex(kernel.index)
    out.insert(0, "kernel", kernel)
    out.index = out.index.astype(int)
    return out.sort_index().rename_axis("id").reset_index(drop=True)
