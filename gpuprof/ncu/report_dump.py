"""Dump an Nsight Compute report to JSON with NVIDIA's ``ncu_report`` module, in a process of its own.

``ncu_report`` is a native library that carries its own C++ runtime. In the course's
environment it crashes the process that loaded it (a segmentation fault the first time
a metric's unit is read) when PyTorch or matplotlib were imported before it, and
inside a Jupyter kernel whatever the order. :mod:`gpuprof.ncu.report` therefore never
loads it: it runs this module as ``python -m gpuprof.ncu.report_dump REPORT`` and reads
the JSON it prints. Nothing else is imported here before ``ncu_report``.

Usage: ``python -m gpuprof.ncu.report_dump REPORT`` (every kernel: metrics with units,
rules, NVTX state) or ``python -m gpuprof.ncu.report_dump REPORT --source ID METRIC ...``
(per-instruction counters of kernel ID summed by source line, with the source files
the report holds) or ``... REPORT --instances ID METRIC ...`` (the instance values of
instanced metrics, such as ``sass__inst_executed_per_opcode``, keyed by their
correlation ids: the opcode names).
"""

from __future__ import annotations

import glob
import importlib
import json
import os
import shutil
import sys
from pathlib import Path

INSTALL_GLOBS = ["/opt/nvidia/nsight-compute/*/extras/python", "/usr/local/cuda*/nsight-compute*/extras/python"]


def find_ncu_report():  # type: ignore[no-untyped-def]
    """The ``ncu_report`` module: installed (PyPI ``ncu-report``), or from the Nsight Compute install
    that ``ncu`` belongs to; None if neither is here."""
    try:
        return importlib.import_module("ncu_report")
    except ImportError:
        pass
    folders: list[str] = []
    ncu = os.environ.get("NCU") or shutil.which("ncu")
    if ncu:
        real = Path(ncu).resolve()
        folders += [str(p / "extras" / "python") for p in (real.parent, real.parent.parent)]
    for pattern in INSTALL_GLOBS:
        folders += sorted(glob.glob(pattern), reverse=True)
    for folder in folders:
        if (Path(folder) / "ncu_report.py").exists():
            sys.path.insert(0, folder)
            try:
                return importlib.import_module("ncu_report")
            except ImportError:
                sys.path.remove(folder)
    return None


def _value(metric):  # type: ignore[no-untyped-def]
    """The metric's value as ``ncu --csv --page raw`` prints it: ``None`` (an empty cell) where the report holds
    none. ``value()`` alone reads such a metric as 0.0: the PM-sampling metrics of ``--set full`` (``*.TriageCompute.*``,
    207 samples on a cuBLAS kernel) have instances but no value of their own, and the CSV leaves them empty."""
    if not metric.has_value():
        return None
    v = metric.value()
    if v is None or isinstance(v, str):
        return v
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def _nvtx(action) -> str:  # type: ignore[no-untyped-def]
    state = action.nvtx_state()
    if state is None:
        return ""
    names = []
    for domain_id in state.domains():
        domain = state.domain_by_id(domain_id)
        names += [r if isinstance(r, str) else r.name() for r in domain.push_pop_ranges()]
    return "/".join(names)


def _actions(ncu_report, path: str):  # type: ignore[no-untyped-def]
    ctx = ncu_report.load_report(path)
    out = []
    for r in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(r)
        for i in range(rng.num_actions()):
            out.append((r, rng.action_by_idx(i)))
    return ctx, out


def dump(ncu_report, path: str) -> dict:  # type: ignore[no-untyped-def]
    ctx, actions = _actions(ncu_report, path)
    kernels = []
    for idx, (r, a) in enumerate(actions):
        metrics = {}
        for name in a.metric_names():
            m = a.metric_by_name(name)
            if m is not None:
                metrics[name] = [_value(m), m.unit()]
        kernels.append({"id": idx, "range": r, "name": a.name(), "demangled": a.name(a.NameBase_DEMANGLED),
                        "nvtx": _nvtx(a), "metrics": metrics, "rules": a.rule_results_as_dicts()})
    del ctx
    return {"kernels": kernels}


def _per_instruction(a, counters: list[str], found: list[str]):  # type: ignore[no-untyped-def]
    """Each instance of each per-instruction counter of action ``a``: (counter, pc, value); the counters
    the report holds with instruction addresses are appended to ``found``."""
    for name in counters:
        m = a.metric_by_name(name)
        if m is None or not m.has_correlation_ids():
            continue
        found.append(name)
        ids = m.correlation_ids()
        for j in range(m.num_instances()):
            yield name, int(ids.as_uint64(j)), m.as_double(j) if m.kind() == m.ValueKind_DOUBLE else float(m.as_uint64(j))


def dump_source(ncu_report, path: str, kernel: int, counters: list[str]) -> dict:  # type: ignore[no-untyped-def]
    ctx, actions = _actions(ncu_report, path)
    a = actions[kernel][1]
    lines: dict[str, dict] = {}
    found: list[str] = []
    for name, pc, value in _per_instruction(a, counters, found):
        info = a.source_info(pc)
        if info is None:
            continue
        key = f"{info.file_name()}\t{int(info.line())}"
        entry = lines.setdefault(key, {})
        entry[name] = entry.get(name, 0.0) + value
    files = a.source_files()
    contents = {f: files[f] for f in files}
    del ctx
    return {"kernel": a.name(), "found": found, "lines": lines, "files": contents}


def dump_sass(ncu_report, path: str, kernel: int, counters: list[str]) -> dict:  # type: ignore[no-untyped-def]
    """Per SASS instruction of one kernel: its address, text, source line and each per-instruction counter.

    The report holds the kernel's SASS only when per-instruction counters were collected
    (SourceCounters); then the instructions are those the counters name.
    """
    ctx, actions = _actions(ncu_report, path)
    a = actions[kernel][1]
    rows: dict[int, dict] = {}
    found: list[str] = []
    for name, pc, value in _per_instruction(a, counters, found):
        row = rows.get(pc)
        if row is None:
            info = a.source_info(pc)
            row = rows[pc] = {"pc": pc, "sass": (a.sass_by_pc(pc) or "").strip(),
                              "line": int(info.line()) if info is not None else None}
        row[name] = value
    del ctx
    return {"kernel": a.name(), "found": found, "rows": [rows[pc] for pc in sorted(rows)]}


def dump_instances(ncu_report, path: str, kernel: int, names: list[str]) -> dict:  # type: ignore[no-untyped-def]
    ctx, actions = _actions(ncu_report, path)
    a = actions[kernel][1]
    out: dict[str, list] = {}
    for name in names:
        m = a.metric_by_name(name)
        if m is None or not m.num_instances():
            continue
        ids = m.correlation_ids() if m.has_correlation_ids() else None
        rows = []
        for j in range(m.num_instances()):
            key = None
            if ids is not None:
                key = ids.as_string(j) if ids.kind() == ids.ValueKind_STRING else int(ids.as_uint64(j))
            value = m.as_double(j) if m.kind() == m.ValueKind_DOUBLE else float(m.as_uint64(j))
            rows.append([key, value])
        out[name] = rows
    del ctx
    return {"kernel": a.name(), "instances": out}


def main(argv: list[str]) -> int:
    ncu_report = find_ncu_report()
    if ncu_report is None:
        print(json.dumps({"error": "no ncu_report"}))
        return 3
    path = argv[0]
    if len(argv) > 2 and argv[1] == "--source":
        result = dump_source(ncu_report, path, int(argv[2]), argv[3:])
    elif len(argv) > 2 and argv[1] == "--sass":
        result = dump_sass(ncu_report, path, int(argv[2]), argv[3:])
    elif len(argv) > 2 and argv[1] == "--instances":
        result = dump_instances(ncu_report, path, int(argv[2]), argv[3:])
    else:
        result = dump(ncu_report, path)
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
