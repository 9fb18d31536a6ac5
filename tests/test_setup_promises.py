"""What the README promises about setting up is what the Makefile and the package enforce."""

import re
import shutil
import subprocess

import pytest

from gpuprof.artifacts import REPO_ROOT


def floor_in(text: str, pattern: str) -> str:
    m = re.search(pattern, text)
    assert m, pattern
    return m.group(1)


def test_one_python_floor_everywhere():
    readme = floor_in((REPO_ROOT / "README.md").read_text(), r"Python (3\.\d+)\+")
    pyproject = floor_in((REPO_ROOT / "pyproject.toml").read_text(), r'requires-python = ">=(3\.\d+)"')
    makefile = floor_in((REPO_ROOT / "Makefile").read_text(), r"PYTHON_FLOOR := (3\.\d+)")
    assert readme == pyproject == makefile == "3.11"


@pytest.mark.skipif(not shutil.which("python3.10"), reason="no Python 3.10 on this machine to try")
def test_an_older_python_is_refused_with_a_sentence():
    proc = subprocess.run(["make", "-s", "python-version", "PYTHON=python3.10"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0
    assert "needs Python 3.11 or newer" in proc.stderr and "PYTHON=python3.11" in proc.stderr


def test_the_readme_lists_every_chapter():
    readme = (REPO_ROOT / "README.md").read_text()
    for nb in sorted((REPO_ROOT / "notebooks").glob("*.ipynb")):
        assert f"`{nb.name}`" in readme, f"the README does not list {nb.name}"
