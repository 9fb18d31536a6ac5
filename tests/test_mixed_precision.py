"""examples/nsys/mixed_precision.py on the CPU, at a tiny size: every mode runs, records what the chapter reads,
and refuses bad input in one sentence. (Its timings and the four modes' numerics are measured on a GPU.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpuprof.artifacts import REPO_ROOT

pytest.importorskip("torch")

SCRIPT = REPO_ROOT / "examples" / "nsys" / "mixed_precision.py"
TINY = ["--layers", "2", "--d-model", "64", "--heads", "4", "--d-ff", "128", "--batch-size", "4", "--seq-len", "16",
        "--warmup", "1", "--steps", "2", "--cpu"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("mode", ["fp32", "tf32", "fp16", "bf16", "fp16-noscaler"])
def test_every_mode_runs_from_the_same_weights_and_batch(mode, tmp_path):
    out = run("--mode", mode, *TINY, "--json", str(tmp_path / "r.json"))
    assert out.returncode == 0, out.stderr
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["mode"] == mode and r["device"] == "cpu" and len(r["steps"]) == 3
    assert [s["measured"] for s in r["steps"]] == [False, True, True]
    assert all(s["loss"] > 0 for s in r["steps"])
    assert r["grad_elements"] > 0 and 0 <= r["underflowed_grad_elements"] <= r["grad_elements"]
    assert (r["steps"][0]["scale"] is not None) == (mode == "fp16")  # only the scaled mode has a scale


def test_the_modes_start_from_the_same_loss(tmp_path):
    first = {}
    for mode in ("fp32", "bf16"):
        assert run("--mode", mode, *TINY, "--json", str(tmp_path / f"{mode}.json")).returncode == 0
        first[mode] = json.loads((tmp_path / f"{mode}.json").read_text())["steps"][0]["loss"]
    assert first["bf16"] == pytest.approx(first["fp32"], rel=0.05)  # bf16 keeps ~3 significant digits


@pytest.mark.parametrize("args,said", [
    (["--d-model", "100", "--heads", "12"], "not a multiple of --heads"),
    (["--seq-len", "1000"], "limit of 512"),
    (["--lr", "-1"], "--lr must be a positive number"),
    (["--mode", "fp8"], "invalid choice"),
])
def test_bad_input_is_one_sentence(args, said):
    out = run(*args, "--cpu")
    assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr


def test_help_names_the_modes_and_ranges():
    out = run("--help")
    assert out.returncode == 0
    for word in ("fp32", "tf32", "fp16-noscaler", "GradScaler", "step_N", "optimizer_step"):
        assert word in out.stdout
