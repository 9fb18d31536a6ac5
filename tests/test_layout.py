"""The package's layout rule (see gpuprof/__init__.py), read from the imports and strings of every module.

* the core (the top-level modules) imports nothing above it: no tool package, no ``report``, no study;
* a tool package (``nsys``, ``ncu``, ``torch_profiler``) imports the core and itself, nothing else;
* ``report`` imports the core and the tool packages, never a study;
* a study imports the core, the tool packages and ``report``, never another study;
* outside ``studies``, no code names an example script or a chapter (docstrings may point at them);
* no two modules import each other, directly or through others (imports inside functions included).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpuprof"
TOOLS = ("nsys", "ncu", "torch_profiler")


@dataclass(frozen=True)
class Module:
    name: str  # dotted, e.g. gpuprof.nsys.sqlite
    path: Path
    layer: str  # core (a top-level module), a tool package's name, report or studies


def modules(package: Path) -> list[Module]:
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        inside = path.relative_to(package).parts
        layer = "core" if len(inside) == 1 else inside[0]
        if inside == ("__main__.py",):
            layer = "report"  # ``python -m gpuprof`` is the report's command line, and only that
        found.append(Module(".".join(parts), path, layer))
    return found


def imports(module: Module) -> set[str]:
    """The gpuprof modules and packages that ``module`` imports, at the top or inside functions, made absolute."""
    tree = ast.parse(module.path.read_text())
    is_package = module.path.name == "__init__.py"
    here = module.name.split(".") if is_package else module.name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "gpuprof"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "gpuprof":
                continue
            out.add(target)
            out |= {f"{target}.{a.name}" for a in node.names}  # `from gpuprof.studies import x` names a module
    return out


def layer_of(name: str, known: dict[str, Module]) -> str | None:
    """The layer of an imported name, when it is a gpuprof module or package (None for a function or class)."""
    if name == "gpuprof":
        return "core"
    if name not in known:
        return None
    return known[name].layer


def violations(package: Path) -> list[str]:
    """Every import and string that breaks the layout rule, one sentence each."""
    mods = modules(package)
    known = {m.name: m for m in mods}
    allowed = {"core": {"core"}, "report": {"core", "report", *TOOLS}, "studies": {"core", "studies", "report", *TOOLS}}
    allowed |= {tool: {"core", tool} for tool in TOOLS}
    found = []
    for m in mods:
        for name in sorted(imports(m)):
            layer = layer_of(name, known)
            if layer is None or name == m.name:
                continue
            if layer not in allowed.get(m.layer, {"core"}):
                found.append(f"{m.name} ({m.layer}) imports {name} ({layer})")
            elif m.layer == "studies" == layer and name not in ("gpuprof.studies",) and m.name != "gpuprof.studies":
                found.append(f"{m.name} imports another study, {name}")
        if m.layer != "studies":
            found += [f"{m.name} names {text!r} in its code" for text in named_examples_or_chapters(m.path)]
    return found


_EXAMPLE_OR_CHAPTER = re.compile(r"\bexamples([/\\]|$)|^ch\d\d$")


def named_examples_or_chapters(path: Path) -> list[str]:
    """String constants that name the examples folder or a chapter (``"examples"``, ``"ch06"``); docstrings excluded."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
            and _EXAMPLE_OR_CHAPTER.search(n.value)]


def test_the_package_follows_its_layout_rule():
    assert violations(PACKAGE) == []


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "gpuprof" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "gpuprof"


CLEAN = {
    "__init__.py": "", "errors.py": "", "activity.py": "from .errors import x\n",
    "nsys/__init__.py": "", "nsys/sqlite.py": "from ..activity import y\n",
    "report/__init__.py": "", "report/page.py": "from ..nsys import sqlite\n",
    "studies/__init__.py": "", "studies/a.py": "from ..nsys.sqlite import z\nfrom ..report import page\n",
    "studies/b.py": "import gpuprof.activity\nSCRIPT = 'examples/nsys/b.py'\nCHAPTER = 'ch03'\n",
}


def test_the_rule_passes_a_clean_tree(tmp_path):
    assert violations(_write(tmp_path, CLEAN)) == []


@pytest.mark.parametrize("rel, text, said", [
    ("studies/b.py", "from .a import thing\n", "gpuprof.studies.b imports another study, gpuprof.studies.a"),
    ("studies/b.py", "from gpuprof.studies import a\n", "gpuprof.studies.b imports another study, gpuprof.studies.a"),
    ("studies/b.py", "def f():\n    from . import a\n", "gpuprof.studies.b imports another study, gpuprof.studies.a"),
    ("nsys/sqlite.py", "from ..studies import a\n", "gpuprof.nsys.sqlite (nsys) imports gpuprof.studies.a (studies)"),
    ("activity.py", "from .nsys import sqlite\n", "gpuprof.activity (core) imports gpuprof.nsys.sqlite (nsys)"),
    ("report/page.py", "from ..studies.a import z\n", "gpuprof.report.page (report) imports gpuprof.studies.a (studies)"),
    ("nsys/sqlite.py", "HERE = 'examples/nsys/x.py'\n", "gpuprof.nsys.sqlite names 'examples/nsys/x.py' in its code"),
    ("report/page.py", "def f():\n    return find('ch06')\n", "gpuprof.report.page names 'ch06' in its code"),
])
def test_the_rule_catches_each_kind_of_breach(tmp_path, rel, text, said):
    files = dict(CLEAN)
    files[rel] = text
    assert said in violations(_write(tmp_path, files))


def test_a_docstring_may_point_at_an_example(tmp_path):
    files = dict(CLEAN, **{"nsys/sqlite.py": '"""Reads what examples/nsys/x.py writes (chapter 1)."""\n'})
    assert violations(_write(tmp_path, files)) == []


def import_circles(package: Path) -> list[list[str]]:
    """Groups of modules that import one another, directly or through others (imports inside functions count:
    a lazy import hides a circle, it does not remove it). Tarjan's strongly connected components."""
    mods = modules(package)
    known = {m.name for m in mods}
    graph = {m.name: sorted(n for n in imports(m) if n in known and n != m.name) for m in mods}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return circles


def test_the_package_has_no_import_circle():
    assert import_circles(PACKAGE) == []


def test_a_circle_through_a_lazy_import_is_found(tmp_path):
    files = dict(CLEAN, **{"errors.py": "def f():\n    from .activity import y\n"})  # activity imports errors
    assert import_circles(_write(tmp_path, files)) == [["gpuprof.activity", "gpuprof.errors"]]
