"""gpuprof installs as a wheel, with every subpackage, and its command runs from the installed copy.

An editable install (the Makefile's ``pip install -e .``) reads the source tree and would hide a
wheel that lacks ``report/`` or ``studies/``; this test builds the wheel as ``pip install .``
would, installs it into a folder outside the repository and runs ``python -m gpuprof report
--help`` from there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pip(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)


def test_the_wheel_holds_every_subpackage_and_its_command_runs(tmp_path):
    # Built from a copy: setuptools writes build/ and *.egg-info next to the sources it builds.
    src = tmp_path / "src"
    shutil.copytree(ROOT / "gpuprof", src / "gpuprof", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    build = _pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(tmp_path / "dist"), str(src),
                 cwd=tmp_path)
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("gpuprof-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "gpuprof").rglob("*.py")}
    assert sources - names == set(), "modules missing from the wheel"
    assert "gpuprof/report/cli.py" in names and "gpuprof/studies/__init__.py" in names

    site = tmp_path / "site"
    install = _pip("install", "--no-deps", "--no-index", "--target", str(site), str(wheel), cwd=tmp_path)
    assert install.returncode == 0, install.stderr[-2000:]
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import gpuprof.report.cli as c; print(c.__file__)"], cwd=away,
                           env=env, capture_output=True, text=True, timeout=120, check=False)
    assert where.returncode == 0, where.stderr[-2000:]
    assert Path(where.stdout.strip()).is_relative_to(site), "the installed copy was not the one imported"
    run = subprocess.run([sys.executable, "-m", "gpuprof", "report", "--help"], cwd=away, env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "usage:" in run.stdout and "report" in run.stdout
