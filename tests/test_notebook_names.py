"""Every gpuprof name a notebook's code uses exists.

On a CPU the measuring cells fall back to the reference captures, so a lambda that runs only on a
GPU (``measure_or_reference("ch04", ..., lambda: runs.source_lines(...))``) is never called by the
CPU suite: after a function moved, such a call would fail first on a GPU (it did, for
``source_lines``). This test reads every code cell's syntax tree and resolves, without running
anything, each name imported from gpuprof and each attribute taken of an imported gpuprof module.
"""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def code_of(notebook: Path) -> ast.Module:
    """The notebook's code cells as one module (IPython's magics and shell lines left out)."""
    cells = json.loads(notebook.read_text())["cells"]
    lines = [line for c in cells if c["cell_type"] == "code" for line in "".join(c["source"]).splitlines()
             if not line.lstrip().startswith(("%", "!"))]
    return ast.parse("\n".join(lines))


def missing_names(tree: ast.Module) -> list[str]:
    """``from gpuprof.x import y`` where y does not exist, and ``alias.attr`` where alias is a gpuprof module
    without that attribute."""
    modules: dict[str, ModuleType] = {}
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "gpuprof":
                    module = importlib.import_module(a.name)
                    modules[a.asname or a.name.split(".")[0]] = module if a.asname else importlib.import_module("gpuprof")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gpuprof":
            parent = importlib.import_module(node.module)
            for a in node.names:
                try:
                    value = importlib.import_module(f"{node.module}.{a.name}")
                except ModuleNotFoundError:
                    if not hasattr(parent, a.name):
                        missing.append(f"from {node.module} import {a.name}")
                        continue
                    value = getattr(parent, a.name)
                if isinstance(value, ModuleType):
                    modules[a.asname or a.name] = value
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            if not hasattr(modules[node.value.id], node.attr):
                missing.append(f"{node.value.id}.{node.attr} ({modules[node.value.id].__name__})")
    return sorted(set(missing))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_gpuprof_name_a_notebook_uses_exists(notebook):
    assert missing_names(code_of(notebook)) == []


def test_a_moved_function_is_found():
    tree = ast.parse("from gpuprof.studies import nsight_compute as runs\n"
                     "f = lambda: runs.source_lines()\nfrom gpuprof.tools import no_such_thing\n")
    assert missing_names(tree) == ["from gpuprof.tools import no_such_thing",
                                   "runs.source_lines (gpuprof.studies.nsight_compute)"]


def rebound_imports(cells: list[str]) -> list[str]:
    """Names imported from gpuprof in one cell and assigned again in a later cell of the same notebook.

    A notebook shares one namespace, so a later cell's ``within = max(...)`` replaces the ``within`` bound
    that ``from gpuprof.checks import within`` gave every cell after it; the next check that calls it
    fails, but only where that cell runs after the rebinding (chapter 7's ``c7spread1`` did this, caught
    on the CPU before a GPU run). Assignments, ``for`` targets and definitions count; names bound inside
    a comprehension or a function do not leak and do not count.
    """
    imported: dict[str, int] = {}
    found = []
    for i, source in enumerate(cells):
        tree = ast.parse("\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))))
        bound: set[str] = set()
        for node in tree.body:
            for sub in ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) else [node]:
                if isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
                    bound.add(sub.name)
                targets = (sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                           if isinstance(sub, (ast.AugAssign, ast.AnnAssign, ast.For)) else [])
                bound |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        found += [f"cell {i}: {name} (imported in cell {imported[name]})" for name in sorted(bound) if name in imported]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gpuprof":
                imported.update({a.asname or a.name: i for a in node.names})
            elif isinstance(node, ast.Import):
                imported.update({(a.asname or a.name).split(".")[0]: i for a in node.names if a.name.split(".")[0] == "gpuprof"})
    return found


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_cell_rebinds_a_name_imported_from_gpuprof(notebook):
    cells = ["".join(c["source"]) for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    assert rebound_imports(cells) == []


def test_a_rebound_check_is_found():
    cells = ["from gpuprof.checks import check, within\nimport gpuprof.studies.transformer as tr",
             "within = max(1.0, 2.0)\nx = [within for within in range(3)]",
             "for check in range(2):\n    pass\ndef tr():\n    pass",
             "def f():\n    within = 1\n    return within"]
    assert rebound_imports(cells) == ["cell 1: within (imported in cell 0)", "cell 2: check (imported in cell 0)",
                                      "cell 2: tr (imported in cell 0)"]
