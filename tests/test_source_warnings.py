"""Every Python file of the course compiles without a warning.

The GPU machine runs Python 3.12, where an invalid escape sequence in a string ("\\d" in a
docstring) is a SyntaxWarning printed on import: a notebook cell importing gpuprof then
writes to stderr, and strict nbval fails on the unexpected output. CI's Python may only
deprecate it silently, so the check compiles every file here with warnings turned into errors.
"""

import warnings

import pytest

from gpuprof.artifacts import REPO_ROOT

FILES = sorted(p for folder in ("gpuprof", "examples", "scripts", "tests") for p in (REPO_ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_compiles_without_warnings(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile(path.read_text(), str(path), "exec")
