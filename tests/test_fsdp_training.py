"""examples/nsys/fsdp_training.py on the CPU: two processes over gloo started with torchrun, and one.

The runs check what does not depend on a GPU: the three modes train the same model to the
same losses; the memory each rank holds, read from the tensors' local sizes, equals the
arithmetic of gpuprof.studies.sharded_training to the byte; FSDP2 holds half of DDP's on
two ranks; the prefetch settings change which units' all-gathers are issued before the unit
is reached (counted from FSDP2's state, on the CPU as on a GPU); sizes that cannot fit are
refused in one sentence. Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest

from gpuprof.artifacts import REPO_ROOT
from gpuprof.runner import load_script, torchrun_target
from helpers import run_script_in_process

SCRIPT = REPO_ROOT / "examples" / "nsys" / "fsdp_training.py"
fsdp = load_script(SCRIPT)
TINY = ["--cpu", "--warmup", "1", "--steps", "2"]


def torchrun(tmp_path: Path, *args: str, nproc: int = 2) -> tuple[subprocess.CompletedProcess, list[dict], dict]:
    """The script under torchrun (``--standalone``: a free port of its own), with a time limit; its JSON files."""
    out = tmp_path / "f.json"
    p = subprocess.run(torchrun_target(SCRIPT, *TINY, *args, "--json", str(out), nproc=nproc), capture_output=True,
                       text=True, timeout=300, cwd=REPO_ROOT, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"f_rank{r}.json").read_text()) for r in range(nproc)]
    return p, ranks, json.loads(out.read_text())


@pytest.fixture(scope="module")
def three_modes(tmp_path_factory) -> tuple[subprocess.CompletedProcess, list[dict], dict]:
    return torchrun(tmp_path_factory.mktemp("fsdp_three_modes"))


@pytest.mark.slow
def test_three_modes_train_the_same_model_on_two_processes(three_modes):
    p, ranks, combined = three_modes
    assert "result checked: the loss fell in every mode on all 2 rank(s)" in p.stdout
    assert [r["rank"] for r in ranks] == [0, 1] and combined["world_size"] == 2
    assert [r["rank"] for r in combined["ranks"]] == [0, 1]
    assert "fsdp_reshard, fsdp_keep against ddp: rank 0's losses within" in p.stdout
    for r in ranks:
        assert r["world_size"] == 2 and r["backend"] == "gloo" and r["timing"] == "perf_counter"
        assert sum(r["unit_parameters"]) == r["parameters"] and len(r["unit_parameters"]) == 1 + r["units"]
        runs = {run["mode"]: run for run in r["runs"]}
        assert list(runs) == ["ddp", "fsdp_reshard", "fsdp_keep"]
        assert all(len(run["steps"]) == 2 and len(run["losses"]) == 3 for run in runs.values())
        # the same initial weights and data: the same losses and weights, whichever way the gradients were averaged
        for mode in ("fsdp_reshard", "fsdp_keep"):
            assert runs[mode]["losses"] == pytest.approx(runs["ddp"]["losses"], rel=1e-5)
            assert runs[mode]["weights_sum"] == pytest.approx(runs["ddp"]["weights_sum"], rel=1e-6)
        assert runs["ddp"]["prefetched"] is None and runs["fsdp_keep"]["prefetched"]["backward"] is None
    # each rank its own data: rank 1's losses are not rank 0's
    assert ranks[0]["runs"][0]["losses"][0] != ranks[1]["runs"][0]["losses"][0]


@pytest.mark.slow
def test_memory_by_category_is_the_arithmetic_to_the_byte_and_fsdp_holds_half(three_modes):
    from gpuprof.studies import sharded_training as st

    _, ranks, _ = three_modes
    table = st.memory_table(ranks)
    for cat in ("parameters", "gradients", "optimizer_state"):
        assert (table[f"{cat}_mib"] == table[f"{cat}_arith_mib"]).all(), table
    assert table["peak_mib"].isna().all()  # no allocator statistics on the CPU: no peak, no activations
    held = table.assign(total=table[["parameters_mib", "gradients_mib", "optimizer_state_mib"]].sum(axis=1))
    by_mode = held.groupby("mode")["total"].max()
    assert by_mode["fsdp_reshard"] == by_mode["fsdp_keep"]
    # the tiny model's dims all divide by 2: exactly half, rank 0 and rank 1 alike
    assert by_mode["fsdp_reshard"] / by_mode["ddp"] == pytest.approx(0.5)
    d = ranks[0]["runs"][0]["memory"]["measured"]
    params = ranks[0]["parameters"]
    assert d == {"parameters": 4 * params, "gradients": 4 * params, "optimizer_state": 8 * params}
    steps = st.step_table(ranks)
    assert len(steps) == 6 and (steps["step_ms"] > 0).all()


@pytest.mark.slow
@pytest.mark.parametrize("prefetch,unit,forward,backward", [
    ("default", "layer", 0, 4),   # forward: issued when the CPU reaches the unit; backward: FSDP2's one ahead
    ("off", "layer", 0, 0),       # nothing issued before the unit is reached
    ("1", "block:2", 2, 2),       # explicit: every unit's all-gather issued before it (2 units of 2 layers)
])
def test_prefetch_settings_change_which_all_gathers_are_issued_ahead(tmp_path, prefetch, unit, forward, backward):
    p, ranks, _ = torchrun(tmp_path, "--mode", "fsdp_reshard", "--prefetch", prefetch, "--unit", unit)
    units = 4 if unit == "layer" else 2
    assert f"unit {unit}, prefetch {prefetch}" in p.stdout
    for r in ranks:
        assert r["units"] == units
        assert r["runs"][0]["prefetched"] == {"units": units, "forward": forward, "backward": backward, "readable": True}


@pytest.mark.slow
def test_bf16_mixed_precision_keeps_fp32_shards_and_trains(tmp_path):
    p, ranks, _ = torchrun(tmp_path, "--mode", "ddp,fsdp_reshard", "--mp", "bf16")
    assert "mp bf16" in p.stdout and "result checked" in p.stdout
    for r in ranks:
        fsdp_run = r["runs"][1]
        assert fsdp_run["memory"]["measured"] == fsdp_run["memory"]["arithmetic"]  # sharded FP32, as without bf16
        # DDP under autocast and FSDP2's BF16 parameters round differently: close, not equal
        assert fsdp_run["losses"] == pytest.approx(r["runs"][0]["losses"], rel=5e-2)


def test_one_process_says_nothing_is_communicated_and_writes_its_json(tmp_path, capsys):
    out = tmp_path / "one.json"
    p = run_script_in_process(SCRIPT, *TINY, "--mode", "fsdp_keep", "--json", str(out), capsys=capsys)
    assert p.returncode == 0, p.stderr
    assert "nothing is all-gathered, reduce-scattered or all-reduced" in p.stdout and "result checked" in p.stdout
    rank0 = json.loads((tmp_path / "one_rank0.json").read_text())
    assert rank0["world_size"] == 1 and rank0["runs"][0]["mode"] == "fsdp_keep"
    assert json.loads(out.read_text())["ranks"][0]["rank"] == 0


def args_for(*argv: str) -> argparse.Namespace:
    a = fsdp.parse_args(["--cpu", *argv])
    fsdp.resolve_sizes(a, gpu=False, total_gpu_bytes=None)
    return a


def test_the_lower_bound_shards_state_but_not_activations():
    import torch

    a = args_for()
    ddp, fsdp4 = fsdp.required_bytes(a, torch, "ddp", 1), fsdp.required_bytes(a, torch, "fsdp_reshard", 4)
    params = fsdp.parameter_count(a)
    assert ddp["parameters"] == 4 * params and ddp["optimizer_state"] == 8 * params
    assert fsdp4["parameters"] == ddp["parameters"] // 4  # the tiny model's dims divide by 4
    assert fsdp4["activations"] == ddp["activations"] > 0 and "gathered_units" not in ddp
    bf16 = fsdp.required_bytes(args_for("--mp", "bf16"), torch, "fsdp_reshard", 4)
    assert bf16["activations"] == ddp["activations"] // 2 and bf16["gathered_units"] == fsdp4["gathered_units"] // 2


def test_ddp_too_big_takes_the_fewest_layers_that_do_not_fit():
    a = args_for("--size", "tiny")
    total = 100 * 2**20
    layers = fsdp.ddp_too_big_layers(a, total)
    assert 16 * fsdp.parameter_count(a, layers) > total >= 16 * fsdp.parameter_count(a, layers - 1)


def test_parsers():
    assert fsdp.unit_spec("layer") == 1 and fsdp.unit_spec("block:3") == 3
    assert fsdp.prefetch_spec("off") == "off" and fsdp.prefetch_spec("2") == 2
    assert fsdp.mode_list("fsdp_keep,ddp") == ["fsdp_keep", "ddp"]
    for bad, parse in (("block:0", fsdp.unit_spec), ("blocks", fsdp.unit_spec), ("0", fsdp.prefetch_spec),
                       ("zero", fsdp.mode_list), ("ddp,ddp", fsdp.mode_list)):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)


def test_the_parameter_arithmetic_is_the_models():
    import torch

    from gpuprof.models import transformer_lm, transformer_lm_parameters

    for group in (1, 3):
        with torch.device("meta"):
            model = transformer_lm(100, 32, 4, 48, 5, 16, group)
        assert sum(p.numel() for p in model.parameters()) == transformer_lm_parameters(100, 32, 48, 5, 16)["total"]
        assert [len(run.layers) for run in model.blocks] == ([1] * 5 if group == 1 else [3, 2])


LEFTOVER = """
import gc, sys
from gpuprof.runner import load_script
fsdp = load_script(sys.argv[1])
args = fsdp.parse_args(["--cpu", "--warmup", "1", "--steps", "2"])
torch, rank, world, device = fsdp.setup(args)
from torch.distributed.fsdp import FSDPModule
gc.disable()  # only what reference counting frees may go: an automatic collection would hide a leftover
fsdp.train(args, torch, rank, world, device, "fsdp_reshard")
print("alive", sum(isinstance(o, FSDPModule) for o in gc.get_objects()))
"""


def test_a_mode_leaves_no_sharded_module_alive_for_the_next():
    # train() collects garbage at its end; if the last step's loss (its graph reaches FSDP2's parameter groups)
    # were still alive then, the sharded model would survive as cyclic garbage and count in the next mode's peak
    p = subprocess.run([__import__("sys").executable, "-c", LEFTOVER, str(SCRIPT)], capture_output=True, text=True,
                       timeout=300, cwd=REPO_ROOT, env={**__import__("os").environ, "OMP_NUM_THREADS": "1",
                                                        "PYTHONPATH": str(REPO_ROOT)})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "alive 0" in p.stdout, p.stdout
