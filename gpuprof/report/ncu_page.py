"""The report on an Nsight Compute capture: per kernel launch, the numbers its first read starts from.

Per launch: duration and launch configuration; the Speed Of Light table (percent of each
unit's peak: SM, memory, DRAM, L1, L2); occupancy, theoretical and achieved; ncu's own
bottleneck verdict (its SOLBottleneck rule); its roofline point where the report has the
roofline's metrics; then every rule finding, the ``global`` estimates before the ``local``
ones, each largest first. NvRules defines the two as different quantities: global, "the
proportional reduction in runtime of the entire workload"; local, "the proportional increase
in efficiency of the hardware usage when viewing the performance problem in isolation". A
local 99% and a global 94% do not compare, and only a global estimate is time saved.

Three inputs, one set of tables: a ``.ncu-rep`` (read through NVIDIA's ``ncu_report``,
:mod:`gpuprof.ncu.report`), ``ncu --csv --page details`` (the section tables as ncu prints
them; its display units turned back into the report's) and ``--page raw`` (metric names
as columns). The values are ncu's: nothing here recomputes a percentage ncu reports.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import GpuprofError
from .page import Page

__all__ = ["ncu_page", "launch_table", "findings", "SOL_COLUMNS"]

# column -> (metric name in the report and the raw page, section and row name in the details page). The
# section matters: "Memory Throughput" is a percentage in the Speed Of Light section and a rate in GB/s in
# Memory Workload Analysis.
_SOL, _OCC, _LAUNCH = "GPU Speed Of Light Throughput", "Occupancy", "Launch Statistics"
SOL_COLUMNS = {
    "duration_us": ("gpu__time_duration.sum", _SOL, "Duration"),
    "sm_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed", _SOL, "Compute (SM) Throughput"),
    "memory_pct": ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", _SOL, "Memory Throughput"),
    "dram_pct": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", _SOL, "DRAM Throughput"),
    "l1_pct": ("l1tex__throughput.avg.pct_of_peak_sustained_active", _SOL, "L1/TEX Cache Throughput"),
    "l2_pct": ("lts__throughput.avg.pct_of_peak_sustained_elapsed", _SOL, "L2 Cache Throughput"),
    "theoretical_occupancy_pct": ("sm__maximum_warps_per_active_cycle_pct", _OCC, "Theoretical Occupancy"),
    "achieved_occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active", _OCC, "Achieved Occupancy"),
    "registers": ("launch__registers_per_thread", _LAUNCH, "Registers Per Thread"),
    "block": ("launch__block_size", _LAUNCH, "Block Size"),
    "grid": ("launch__grid_size", _LAUNCH, "Grid Size"),
}
_FINDING_COLS = ["id", "kernel", "section", "rule", "type", "title", "speedup_pct", "speedup_type", "message"]


def _from_report(path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    from ..ncu import report

    names = [m for m, _, _ in SOL_COLUMNS.values()]
    wide = report.metric_table(path, names, missing="nan")
    out = pd.DataFrame({"id": wide.index.astype(int), "kernel": wide["kernel"].to_numpy()})
    for col, (metric, _, _) in SOL_COLUMNS.items():
        out[col] = wide[metric].to_numpy(dtype=float)
    out["duration_us"] = out["duration_us"] / 1e3
    return out, report.rules(path)


def _from_details(details: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    from ..ncu.csv_reader import to_seconds

    ids = details.groupby("ID")["Kernel Name"].first()
    out = pd.DataFrame({"id": ids.index.astype(int), "kernel": ids.to_numpy()})
    for col, (_, section, row) in SOL_COLUMNS.items():
        rows = details[(details["Section Name"] == section) & (details["Metric Name"] == row)].groupby("ID").first()
        vals = rows["value"]
        if col == "duration_us":  # printed in scaled units (us, ms): back to one unit
            vals = pd.Series([to_seconds(v, u) * 1e6 for v, u in zip(vals, rows["Metric Unit"])], index=vals.index)
        vals.index = vals.index.astype(int)
        out[col] = out["id"].map(vals).astype(float)
    rules = details[details["Rule Name"].astype(str) != ""]
    f = pd.DataFrame({"id": rules["ID"].astype(int).to_numpy(), "kernel": rules["Kernel Name"].to_numpy(),
                      "section": rules["Section Name"].to_numpy(), "rule": rules["Rule Name"].to_numpy(),
                      "type": rules["Rule Type"].astype(str).to_numpy(),
                      "title": "", "message": rules["Rule Description"].to_numpy(),
                      "speedup_pct": pd.to_numeric(rules["Estimated Speedup"], errors="coerce").to_numpy(),
                      "speedup_type": rules["Estimated Speedup Type"].astype(str).str.lower().to_numpy()})
    return out, f


def _from_raw(raw: pd.DataFrame, units: dict[str, str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    from ..ncu.csv_reader import to_seconds

    out = pd.DataFrame({"id": pd.to_numeric(raw["ID"]).astype(int), "kernel": raw["Kernel Name"]})
    for col, (metric, _, _) in SOL_COLUMNS.items():
        out[col] = pd.to_numeric(raw[metric], errors="coerce") if metric in raw else np.nan
    unit = units.get("gpu__time_duration.sum", "ns")  # the raw page's units row names it
    out["duration_us"] = [to_seconds(v, unit) * 1e6 for v in out["duration_us"]]
    return out, pd.DataFrame(columns=_FINDING_COLS)


def launch_table(path: str | Path, kind: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-launch table with the :data:`SOL_COLUMNS`, rule findings) from a report or ncu's CSV."""
    path = Path(path)
    if kind == "ncu":
        return _from_report(path)
    from ..ncu import csv_reader

    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        return _from_details(csv_reader.parse_details(text, str(path)))
    except GpuprofError:
        return _from_raw(*csv_reader.parse_raw(text, str(path)))


_SPEEDUP_ORDER = {"global": 0, "local": 1}  # then anything else (no estimate)


def findings(rules: pd.DataFrame) -> pd.DataFrame:
    """The rule results that suggest a change (OPT) or warn (WRN): global estimates first, then local
    ones, then those without a type, each largest estimated speedup first (see the module's text)."""
    if rules.empty:
        return pd.DataFrame(columns=_FINDING_COLS)
    r = rules[rules["type"].isin(["OPT", "WRN"])].copy()
    r["speedup_pct"] = pd.to_numeric(r["speedup_pct"], errors="coerce")
    kind = r["speedup_type"].astype(str).str.lower() if "speedup_type" in r else pd.Series("", index=r.index)
    r["_order"] = kind.map(_SPEEDUP_ORDER).fillna(2)
    return r.sort_values(["_order", "speedup_pct", "id"], ascending=[True, False, True], na_position="last",
                         ignore_index=True)[[c for c in _FINDING_COLS if c in r]]


def _bottleneck(rules: pd.DataFrame, table: pd.DataFrame) -> pd.Series:
    if rules.empty:
        return pd.Series("", index=table.index)
    sol = rules[rules["rule"] == "SOLBottleneck"].groupby("id")
    # The rule's last sentence names where to look next ("Start by analyzing DRAM in the Memory
    # Workload Analysis section."); its first restates the threshold, the same for every kernel.
    text = sol["message"].first().map(lambda m: [x for x in str(m).rstrip(". ").split(". ") if x][-1] + ".")
    title = sol["title"].first()
    said = {i: (f"{title.get(i, '')}: " if title.get(i, "") else "") + text[i] for i in text.index}
    return table["id"].map(lambda i: said.get(i, ""))


def _roofline(path: Path, table: pd.DataFrame) -> pd.DataFrame | None:
    from ..ncu import derived

    try:
        r = derived.ncu_roofline(path)
    except GpuprofError:
        return None
    if r[["fp32_tflops", "dram_tbps"]].isna().all().all():
        return None
    r = r.reset_index(drop=True)
    r.insert(0, "id", table["id"].to_numpy()[: len(r)])
    return r


def ncu_page(path: str | Path, kind: str, *, top: int = 15) -> Page:
    """The page for one Nsight Compute report or CSV (see the module's text)."""
    path = Path(path)
    table, rules = launch_table(path, kind)
    page = Page(title=path.name, path=path, kind="Nsight Compute report" if kind == "ncu" else "Nsight Compute CSV")
    if table.empty:
        page.add("Summary", text="The report holds no profiled kernel launch.")
        return page
    table["bottleneck"] = _bottleneck(rules, table)
    names = table["kernel"].astype(str).value_counts()
    page.facts = {"launches": len(table), "kernels": len(names), "duration_us": float(table["duration_us"].sum())}
    lines = [f"{len(table):,} profiled launch(es) of {len(names):,} kernel(s), {table['duration_us'].sum():,.1f} us "
             "of kernel time under the profiler (ncu locks clocks to base by default: durations are not the "
             "program's own)."]
    longest = table.loc[table["duration_us"].idxmax()]
    if pd.notna(longest["sm_pct"]):
        lines.append(f"Longest launch: {longest['kernel']} (id {int(longest['id'])}), {longest['duration_us']:,.1f} us, "
                     f"SM {longest['sm_pct']:.1f}% and memory {longest['memory_pct']:.1f}% of peak.")
    page.add("Summary", text="\n".join(lines))
    cols = ["id", "kernel", "duration_us", "sm_pct", "memory_pct", "dram_pct", "l1_pct", "l2_pct"]
    page.add("Speed of light (% of peak)", table=table[cols], terminal_rows=top,
             note="The GPU Speed Of Light section's first table, as ncu reports it.")
    page.add("Occupancy and launch", table=table[["id", "kernel", "grid", "block", "registers",
                                                  "theoretical_occupancy_pct", "achieved_occupancy_pct"]],
             terminal_rows=top)
    if table["bottleneck"].astype(bool).any():
        page.add("Bottleneck (ncu's SOLBottleneck rule)", table=table[["id", "kernel", "bottleneck"]], terminal_rows=top)
    f = findings(rules)
    page.add("Rule findings (OPT and WRN): global estimates, then local, each largest first", table=f,
             terminal_rows=top, html_rows=200,
             note="speedup_pct is ncu's estimate. NvRules' definitions: global, the proportional reduction in runtime "
                  "of the entire workload; local, the proportional increase in efficiency of the hardware usage when "
                  "viewing the performance problem in isolation. Only a global estimate is time saved; the two do not "
                  "compare.")
    if kind == "ncu":
        roof = _roofline(path, table)
        if roof is not None:
            page.add("Roofline point (FP32, as ncu's chart defines it)", table=roof, terminal_rows=top,
                     note="Achieved FP32 FLOP/s (FADD + FMUL + 2 FFMA) at the profiling clock; tensor-core work is not "
                          "in this chart. intensity: FLOP per DRAM byte; ridge: where the roofs meet.")
    return page
