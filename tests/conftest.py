"""Shared fixtures: isolated capture folders and fake profiler executables."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@pytest.fixture
def isolated_dirs(tmp_path, monkeypatch):
    """Point this machine's captures and the reference captures at empty temporary folders."""
    out, ref = tmp_path / "captures", tmp_path / "artifacts"
    out.mkdir()
    ref.mkdir()
    monkeypatch.setenv("GPUPROF_OUTPUT_DIR", str(out))
    monkeypatch.setenv("GPUPROF_ARTIFACTS", str(ref))
    monkeypatch.delenv("GPUPROF_OVERWRITE", raising=False)
    return out, ref


def write_exe(path: Path, body: str) -> Path:
    """Write an executable shell script (a stand-in for nsys or ncu)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def clean_tool_env(monkeypatch, tmp_path):
    """No NSYS/NCU variables and a PATH holding only a private bin folder (plus /bin for sh)."""
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.delenv("NCU", raising=False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/bin{os.pathsep}/usr/bin")
    return bin_dir
