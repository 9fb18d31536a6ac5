"""Read Nsight Compute reports (``.ncu-rep``) into pandas tables, through NVIDIA's ``ncu_report`` module.

A report holds, for each profiled kernel launch, every metric ncu collected (with its
unit), the launch configuration, the guided-analysis rule results, per-instruction
source counters, and the NVTX state at launch. ``ncu_report`` reads it without a GPU:
it ships with Nsight Compute (``<install>/extras/python``) and on PyPI as ``ncu-report``
(pin the version of the ncu that wrote the report). Because that native module crashes
the process that loads it after PyTorch or matplotlib, or inside a Jupyter kernel, it
runs in a helper process (:mod:`gpuprof.ncu.report_dump`) whose JSON these functions
read; a report is read once and cached while the file is unchanged.

The tables, one row per kernel launch in profiling order (``id`` 0, 1, ...):

* :func:`kernels`: name, duration and launch configuration;
* :func:`metrics` (long: kernel x metric with unit) and :func:`metric_table` (wide: a
  column per metric asked for);
* :func:`rules`: the guided analysis (OPT/WRN/INF), with the estimated speedup;
* :func:`source_counters`: counters per line of the kernel's source (needs ``-lineinfo``);
* :func:`sass_counters`: the same counters per SASS instruction, with its text;
* :func:`sections`: the section tables of the details page, which ncu renders from
  section definitions rather than storing; they come from ``ncu --import R --csv
  --page details``, exported once next to the report (see :func:`ensure_details_csv`).

Wrong inputs get one sentence: a CSV here says to use :mod:`gpuprof.ncu.csv_reader`,
an Nsight Systems file says so, a file that is not a report says so.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

import pandas as pd

from ..artifacts import gunzipped_copy, stored_file
from ..errors import GpuprofError

__all__ = ["ncu_report_available", "open_report", "kernels", "metrics", "metric_table", "rules", "source_counters",
           "sections", "ensure_details_csv", "clean_message", "RULE_TYPES", "LAUNCH_METRICS", "instances",
           "sass_counters", "section_value"]

RULE_TYPES = {0: "", 1: "INF", 2: "OPT", 3: "WRN", 4: "ERR"}
SPEEDUP_TYPES = {0: "", 1: "local", 2: "global"}
LAUNCH_METRICS = {
    "duration_ns": "gpu__time_duration.sum",
    "grid_size": "launch__grid_size",
    "block_size": "launch__block_size",
    "grid_x": "launch__grid_dim_x", "grid_y": "launch__grid_dim_y", "grid_z": "launch__grid_dim_z",
    "block_x": "launch__block_dim_x", "block_y": "launch__block_dim_y", "block_z": "launch__block_dim_z",
    "registers_per_thread": "launch__registers_per_thread",
    "static_smem_per_block": "launch__shared_mem_per_block_static",
    "dynamic_smem_per_block": "launch__shared_mem_per_block_dynamic",
    "waves_per_sm": "launch__waves_per_multiprocessor",
}


_DUMP = Path(__file__).with_name("report_dump.py")


def ncu_report_available() -> bool:
    """Whether the helper process can load ``ncu_report`` here (installed, or next to ncu)."""
    code = "import sys; sys.path.insert(0, sys.argv[1]); import report_dump; sys.exit(0 if report_dump.find_ncu_report() else 3)"
    return subprocess.run([sys.executable, "-c", code, str(_DUMP.parent)], capture_output=True, timeout=120).returncode == 0


def _run_dump(path: Path, *extra: str) -> dict:
    """Run the dump helper on ``path`` in a fresh interpreter (see the module docstring: why)."""
    proc = subprocess.run([sys.executable, str(_DUMP), str(path), *extra], capture_output=True, text=True,
                          timeout=600, check=False)
    if proc.returncode == 3:
        raise GpuprofError("The ncu_report module (Nsight Compute's Python report reader) is not available here.",
                           "pip install the `ncu-report` version that matches the ncu that wrote the report "
                           "(this course pins it in requirements.txt), or add <Nsight Compute>/extras/python to PYTHONPATH.")
    if proc.returncode != 0:
        tail = " ".join(proc.stderr.strip().splitlines()[-2:])[:300] or f"exit status {proc.returncode}"
        raise GpuprofError(f"Reading {path.name} with ncu_report failed: {tail}.",
                           "Is it an Nsight Compute report written by this ncu version or an older one?")
    return json.loads(proc.stdout)


@dataclass(frozen=True)
class _Report:
    path: Path
    kernels: tuple[dict, ...]  # per launch: id, range, name, demangled, nvtx, metrics {name: [value, unit]}, rules


@lru_cache(maxsize=32)
def _load(path: str, mtime: float) -> _Report:
    return _Report(Path(path), tuple(_run_dump(Path(path))["kernels"]))


def _readable(path: str | Path) -> Path:
    """The plain report for ``path``: a gzipped one (``x.ncu-rep.gz``, or ``x.ncu-rep`` committed only
    gzipped, as the course stores its newer references) decompressed into a cache first, because
    ncu_report opens only plain files."""
    path = Path(path)
    path = stored_file(path) or path
    return gunzipped_copy(path) if path.name.endswith(".ncu-rep.gz") else path


def open_report(path: str | Path) -> _Report:
    """Read a report (cached while the file is unchanged), with one-sentence errors for the usual mistakes.
    A gzipped report (``x.ncu-rep.gz``) is read through a decompressed copy."""
    path = _readable(path)
    if not path.exists():
        raise GpuprofError(f"{path} does not exist.", "Check the path, or profile with `ncu -o NAME ...` first.")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        raise GpuprofError(f"{path} is ncu's CSV output, not a report.", "Read it with gpuprof.ncu.csv_reader.read_details.")
    if suffix in (".nsys-rep", ".qdrep", ".sqlite"):
        raise GpuprofError(f"{path} is an Nsight Systems file, not an Nsight Compute report.",
                           "Read it with gpuprof.nsys.sqlite (export .nsys-rep files to sqlite first).")
    report = _load(str(path.resolve()), path.stat().st_mtime)
    if not report.kernels:
        raise GpuprofError(f"{path} holds no profiled kernel: it is not an Nsight Compute report, or ncu profiled nothing.",
                           "ncu prints 'No kernels were profiled' when the -k/--nvtx filter matched nothing.")
    return report


def _metric(kernel: dict, name: str) -> float | str | None:
    entry = kernel["metrics"].get(name)
    return None if entry is None else entry[0]


def kernels(path: str | Path) -> pd.DataFrame:
    """One row per profiled kernel launch: id, range, name, demangled name, duration and launch
    configuration, and ``nvtx``: the push/pop ranges open on the launching thread (with ``--nvtx``)."""
    rows = []
    for k in open_report(path).kernels:
        row: dict[str, Any] = {"id": k["id"], "range": k["range"], "name": k["name"], "demangled": k["demangled"]}
        for col, metric in LAUNCH_METRICS.items():
            v = _metric(k, metric)
            row[col] = v if isinstance(v, float) else None
        row["nvtx"] = k["nvtx"]
        rows.append(row)
    return pd.DataFrame(rows)


def _select(names: Iterable[str], wanted: str | Sequence[str] | None) -> list[str]:
    names = list(names)
    if wanted is None:
        return names
    if isinstance(wanted, str):
        rx = re.compile(wanted)
        return [n for n in names if rx.search(n)]
    return list(wanted)


def metrics(path: str | Path, names: str | Sequence[str] | None = None) -> pd.DataFrame:
    """Long table: id, kernel, metric, value (float, NaN for text), text (for text metrics), unit.

    ``names`` is a list of exact metric names (missing ones give rows with no unit, so a
    misspelling shows up), a regular expression, or None for every metric.
    """
    rows = []
    for k in open_report(path).kernels:
        for n in _select(k["metrics"], names):
            v, unit = k["metrics"].get(n, (None, None))
            rows.append({"id": k["id"], "kernel": k["name"], "metric": n,
                         "value": v if isinstance(v, float) else float("nan"),
                         "text": v if isinstance(v, str) else None, "unit": unit})
    return pd.DataFrame(rows, columns=["id", "kernel", "metric", "value", "text", "unit"])


def metric_table(path: str | Path, names: Sequence[str], *, missing: str = "raise") -> pd.DataFrame:
    """Wide table: one row per kernel (index ``id``, column ``kernel``), one column per metric name.

    A metric the report lacks raises (``missing="raise"``) with the names it does have
    that look alike, or gives NaN (``missing="nan"``): reports keep only what their
    sections or ``--metrics`` asked for.
    """
    long = metrics(path, list(names))
    absent = sorted(set(long.loc[long["unit"].isna(), "metric"]))
    if absent and missing == "raise":
        have = open_report(path).kernels[0]["metrics"]
        stem = absent[0].split(".")[0]
        near = [n for n in have if n.startswith(stem)][:5]
        raise GpuprofError(f"{Path(path).name} has no metric {absent[0]!r}"
                           + (f" ({len(absent) - 1} more missing)" if len(absent) > 1 else "") + ".",
                           f"Collect it with --metrics or a section that has it; similar names here: {near or 'none'}.")
    wide = long.pivot(index="id", columns="metric", values="value")
    wide.insert(0, "kernel", long.groupby("id")["kernel"].first())
    return wide[["kernel", *names]]


_LINK = re.compile(r"@(?:section|url|sass|source):(?:[^:@]*:)?([^@]*)@")


def clean_message(text: str) -> str:
    """A rule message with ncu's link markup (``@section:Id:Shown text@``) reduced to the shown text."""
    out = re.sub(r"@url:([^:@]+):[^@]*@", r"\1", text)
    out = re.sub(r"@source:[^:@]*:\d+:([^@]*)@", r"\1", out)
    return _LINK.sub(r"\1", out)


def rules(path: str | Path) -> pd.DataFrame:
    """The guided analysis: id, kernel, section, rule, type (OPT/WRN/INF/ERR), title, message,
    estimated speedup in percent and its type (NvRules' SpeedupType: global, the proportional reduction in
    runtime of the entire workload; local, the proportional increase in efficiency of the hardware usage
    when viewing the problem in isolation), and the first focus metric with its value."""
    rows = []
    for k in open_report(path).kernels:
        for r in k["rules"]:
            msg = r.get("rule_message") or {}
            speed = r.get("speedup_estimation") or {}
            focus = (r.get("focus_metrics") or [{}])[0]
            rows.append({"id": k["id"], "kernel": k["name"], "section": r.get("section_identifier", ""),
                         "rule": r.get("rule_identifier", ""), "type": RULE_TYPES.get(msg.get("type", 0), ""),
                         "title": msg.get("title", ""), "message": clean_message(msg.get("message", "")),
                         "speedup_pct": speed.get("speedup"), "speedup_type": SPEEDUP_TYPES.get(speed.get("type", 0), ""),
                         "focus_metric": focus.get("name"), "focus_value": focus.get("value")})
    return pd.DataFrame(rows, columns=["id", "kernel", "section", "rule", "type", "title", "message", "speedup_pct",
                                       "speedup_type", "focus_metric", "focus_value"])


def _source_text(files: dict[str, str], file_name: str, search: Sequence[Path]) -> list[str]:
    """The kernel's source lines: imported into the report, else a file of the same name under ``search``."""
    content = files.get(file_name, "")
    if content:
        return content.splitlines()
    base = Path(file_name).name
    for folder in map(Path, search):
        hits = [folder] if folder.is_file() and folder.name == base else list(folder.rglob(base)) if folder.is_dir() else []
        if hits:
            return hits[0].read_text().splitlines()
    return []


def source_counters(path: str | Path, kernel: int | str, counters: Sequence[str] = ("inst_executed",), *,
                    search: Sequence[Path] = ()) -> pd.DataFrame:
    """Per source line of one kernel: the sum of each per-instruction counter over the SASS that line became.

    ``kernel`` is a kernel id or name (the first launch of that name). The report must
    have been made with a kernel compiled with ``-lineinfo`` and a section that collects
    per-instruction counters (SourceCounters, or ``--set full``). Counters such as
    ``inst_executed`` (warp instructions executed), ``smsp__pcsamp_sample_count``
    (warp samples) and ``smsp__pcsamp_warps_issue_stalled_<reason>`` (samples stalled
    for that reason) are attributed to each instruction's address; this sums them by
    line, and adds the line's text from the report (``--import-source yes``) or from
    a file of the same name under ``search``.
    """
    path = _readable(path)
    kernel = _kernel_id(path, kernel)
    data = _source(str(path.resolve()), path.stat().st_mtime, int(kernel), tuple(counters))
    _require_counters(data, path, counters, "Profile with --section SourceCounters (or --set full) and compile with -lineinfo.")
    rows = []
    for key, vals in data["lines"].items():
        file_name, line = key.rsplit("\t", 1)
        rows.append({"file": file_name, "line": int(line), **vals})
    df = pd.DataFrame(rows)
    for name in data["found"]:
        df[name] = df[name].fillna(0.0) if name in df else 0.0
    df = df.sort_values(["file", "line"], ignore_index=True)
    texts = {f: _source_text(data["files"], f, search) for f in df["file"].unique()}
    df["source"] = [texts[f][line - 1].strip() if 0 < line <= len(texts[f]) else "" for f, line in zip(df["file"], df["line"])]
    df.insert(0, "kernel", data["kernel"])
    return df


def _require_counters(data: dict, path: Path, counters: Sequence[str], hint: str) -> None:
    """Both per-instruction readers stop with the same sentence when the report holds none of the counters."""
    if not data["found"]:
        raise GpuprofError(f"Kernel {data['kernel']!r} in {path.name} has no per-instruction counters among {list(counters)}.",
                           hint)


@lru_cache(maxsize=32)
def _source(path: str, mtime: float, kernel: int, counters: tuple[str, ...]) -> dict:
    return _run_dump(Path(path), "--source", str(kernel), *counters)


def sass_counters(path: str | Path, kernel: int | str, counters: Sequence[str] = ("inst_executed",)) -> pd.DataFrame:
    """Per SASS instruction of one kernel, in address order: its offset from the kernel's first
    instruction, its text, its source line (with ``-lineinfo``) and each per-instruction counter.

    A source line is often several instructions, and a sampled stall lands on the instruction
    that waits, not on the one it waits for: this is the Source page's SASS view, for the cases
    where the line table of :func:`source_counters` hides which instruction it is. The report
    holds the SASS only when SourceCounters (or ``--set full``) was collected.
    """
    path = _readable(path)
    kid = _kernel_id(path, kernel)
    data = _sass(str(path.resolve()), path.stat().st_mtime, int(kid), tuple(counters))
    _require_counters(data, path, counters, "Profile with --section SourceCounters (or --set full).")
    df = pd.DataFrame(data["rows"])
    for name in data["found"]:
        df[name] = df[name].fillna(0.0) if name in df else 0.0
    df.insert(0, "offset", df["pc"] - df["pc"].min())
    df.insert(0, "kernel", data["kernel"])
    return df.drop(columns=["pc"])


@lru_cache(maxsize=32)
def _sass(path: str, mtime: float, kernel: int, counters: tuple[str, ...]) -> dict:
    return _run_dump(Path(path), "--sass", str(kernel), *counters)


def instances(path: str | Path, kernel: int | str, metric: str) -> pd.Series:
    """The instance values of an instanced metric of one kernel launch, by correlation id.

    Some metrics have one value per instance rather than one in all: for
    ``sass__inst_executed_per_opcode`` (the Instruction Statistics section) the instances
    are the SASS opcodes and the values the warp instructions executed of each; that is
    the instruction mix. ``kernel`` is a kernel id or name (its first launch). Sorted by
    value, largest first.
    """
    path = _readable(path)
    kid = _kernel_id(path, kernel)
    data = _run_dump(path, "--instances", str(kid), metric)
    if metric not in data["instances"]:
        raise GpuprofError(f"Kernel {data['kernel']!r} in {path.name} has no instance values of {metric}.",
                           "Collect the section that holds it (InstructionStats for the per-opcode counts).")
    pairs = data["instances"][metric]
    s = pd.Series([v for _, v in pairs], index=[k for k, _ in pairs], name=metric)
    return s.sort_values(ascending=False)


def _kernel_id(path: Path, kernel: int | str) -> int:
    if not isinstance(kernel, str):
        return int(kernel)
    rep = open_report(path)
    matches = [k["id"] for k in rep.kernels if k["name"] == kernel]
    if not matches:
        raise GpuprofError(f"{path.name} has no kernel named {kernel!r}.",
                           f"It has: {', '.join(sorted({k['name'] for k in rep.kernels}))}.")
    return matches[0]


def ensure_details_csv(path: str | Path) -> Path:
    """The details page as CSV next to the report (``R.details.csv``), exported with ncu if it is not there yet."""
    path = Path(path)
    target = path.with_name(path.stem + ".details.csv")
    if target.exists():
        return target
    from ..runner import run_profiler
    from ..tools import find_tool

    try:
        ncu = find_tool("ncu")
    except GpuprofError:
        raise GpuprofError(f"The section tables of {path.name} are rendered by ncu, which is not installed here.",
                           f"Export them where ncu is: `ncu --import {path} --csv --page details > {target}`.") from None
    run_profiler(ncu, ["--import", str(path), "--csv", "--page", "details"], out_dir=path.parent,
                 name=target.stem, stdout_file=target.name, overwrite=True)
    return target


def sections(path: str | Path) -> pd.DataFrame:
    """The details page (section tables as the GUI and CLI show them): one row per kernel, section and metric."""
    from .csv_reader import read_details

    open_report(path)  # same checks and messages as the other readers
    return read_details(ensure_details_csv(path))


def section_value(details: pd.DataFrame, kernel: str, metric: str, section: str | None = None) -> float:
    """One value of the details page (:func:`sections`): ``kernel``'s row named ``metric`` (in ``section``).

    Why not ``details.set_index([...])[(kernel, metric)]``: the page repeats names (``Memory Throughput``
    is a percentage in *GPU Speed Of Light Throughput* and a rate in *Memory Workload Analysis*; every
    rule adds a row with no metric name), and on such a non-unique index pandas 3.0.6 returned a one-row
    Series where 3.1.1 returns the number (both tried on chapter 4's ladder report; the GPU machine's 3.0.6
    stopped the chapter on it). This looks the row up by value and says what it found if that is not
    exactly one row (a kernel profiled twice, a name in two sections: pass ``section``).
    """
    rows = details[(details["Kernel Name"] == kernel) & (details["Metric Name"] == metric)]
    if section is not None:
        rows = rows[rows["Section Name"] == section]
    if len(rows) != 1:
        where = sorted(set(rows["Section Name"])) or sorted(set(details.loc[details["Kernel Name"] == kernel, "Section Name"]))
        raise GpuprofError(f"The details page has {len(rows)} rows named {metric!r} for kernel {kernel!r}"
                           + (f" in section {section!r}" if section else "") + f" (sections: {', '.join(where) or 'none'}).",
                           "Name the section, or filter the page by ID when a kernel was profiled more than once.")
    return float(rows["value"].iloc[0])
