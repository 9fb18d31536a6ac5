"""``import gpuprof`` is cheap, and every name it re-exports still works (loaded on first use)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import gpuprof
from gpuprof.artifacts import REPO_ROOT


def test_exit_on_error_alone_imports_neither_numpy_nor_nvtx():
    """A script's start-up (``from gpuprof import exit_on_error``) pays for no array library."""
    code = ("import sys; from gpuprof import exit_on_error, GpuprofError; "
            "print(sorted(m for m in ('numpy', 'nvtx', 'torch', 'gpuprof.ranges', 'gpuprof.timing') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_every_exported_name_is_its_home_modules_object():
    for name in gpuprof.__all__:
        value = getattr(gpuprof, name)
        home = importlib.import_module(f"gpuprof.{gpuprof._HOME[name]}")
        assert value is getattr(home, name), name
        assert name in dir(gpuprof)
    assert len(gpuprof.__all__) == len(set(gpuprof.__all__)) == 18


def test_star_import_and_the_modules_import_gpuprof_used_to_load():
    namespace: dict = {}
    exec("from gpuprof import *", namespace)
    assert set(gpuprof.__all__) <= set(namespace)
    for module in ("backend", "errors", "memory_probe", "ranges", "timing"):
        assert getattr(gpuprof, module) is importlib.import_module(f"gpuprof.{module}")
    assert callable(gpuprof.backend.host_description)


def test_an_unknown_name_is_an_attribute_error():
    try:
        gpuprof.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("gpuprof.no_such_name resolved")
