"""The CNN case study (chapter 6): its data, its script's bookkeeping on the CPU, its readers on the reference run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gpuprof.artifacts import REPO_ROOT
from gpuprof.ncu import derived as nd
from gpuprof.ncu.csv_reader import metric_columns, read_details
from gpuprof.nsys import sqlite as ns
from gpuprof.runner import load_script
from gpuprof import cnn_data
from gpuprof.studies import cnn_training as ct
from helpers import ForkedRun, forked_json_runs, run_script_in_process

torch = pytest.importorskip("torch")

SCRIPT = REPO_ROOT / "examples" / "nsys" / "cnn_training.py"
REF = REPO_ROOT / "artifacts" / "ch06"
TINY = ["--warmup", "5", "--steps", "10", "--repeats", "2", "--dataset-size", "512", "--batch-size", "16"]


# ----- the data -----

def test_images_are_deterministic_and_learnable_shapes():
    a, la = cnn_data.make_images(300, seed=3)
    b, lb = cnn_data.make_images(300, seed=3)
    assert a.shape == (300, 32, 32, 3) and a.dtype == np.uint8 and np.array_equal(a, b) and np.array_equal(la, lb)
    assert set(la) <= set(range(10)) and len(set(la)) == 10
    c, _ = cnn_data.make_images(300, seed=4)
    assert not np.array_equal(a, c)


def test_both_pipelines_augment_alike():
    """The per-image PIL pipeline and the batched tensor one draw from the same distribution."""
    images, labels = cnn_data.make_images(1500, seed=0)
    torch.manual_seed(0)
    ds = cnn_data.AugmentedImages(images, labels)
    one = torch.stack([ds[i][0] for i in range(1500)])
    dev_images, dev_labels = cnn_data.images_to_device(images, labels, "cpu")
    batch = cnn_data.augment_batch(dev_images, torch.arange(1500), torch.Generator().manual_seed(0))
    assert one.shape == batch.shape == (1500, 3, 32, 32) and batch.dtype == torch.float32
    assert torch.allclose(one.mean((0, 2, 3)), batch.mean((0, 2, 3)), atol=0.03)
    assert torch.allclose(one.std((0, 2, 3)), batch.std((0, 2, 3)), atol=0.03)
    # zero padding: some pixels of some crops are the pad value, in both pipelines
    pad = (torch.zeros(3) - torch.tensor(cnn_data.MEAN)) / torch.tensor(cnn_data.STD)
    for x in (one, batch):
        assert torch.isclose(x[:, 0], pad[0], atol=1e-4).any()


def test_each_augmented_image_is_a_padded_crop_flipped_or_not():
    """Every image augment_batch returns is some 32 x 32 window of the zero-padded image, mirrored or not."""
    images, labels = cnn_data.make_images(6, seed=1)
    dev, _ = cnn_data.images_to_device(images, labels, "cpu")
    out = cnn_data.augment_batch(dev, torch.arange(6), torch.Generator().manual_seed(0))
    mean = torch.tensor(cnn_data.MEAN).view(3, 1, 1)
    std = torch.tensor(cnn_data.STD).view(3, 1, 1)
    padded = torch.nn.functional.pad(dev.float() / 255, (4, 4, 4, 4))
    for i in range(6):
        windows = [padded[i, :, dy:dy + 32, dx:dx + 32] for dy in range(9) for dx in range(9)]
        candidates = [(w - mean) / std for w in windows] + [((w - mean) / std).flip(-1) for w in windows]
        assert any(torch.allclose(out[i], c, atol=1e-5) for c in candidates), i


# ----- the script on the CPU -----

LEVERS = [
    [],
    ["--workers", "2"],
    ["--pin-memory", "--non-blocking"],
    ["--data-on-gpu"],
    ["--loss-every", "5"],
    ["--bf16"],
    ["--channels-last"],
    ["--cudnn-benchmark", "--fused-adam"],
    ["--cuda-graphs"],
    ["--data-on-gpu", "--loss-every", "5", "--bf16", "--channels-last", "--cudnn-benchmark", "--fused-adam",
     "--cuda-graphs"],
]
# Every training run this module asserts on, by name: each is made once, and read by the tests that need it.
TRAINER_RUNS = {
    **{f"levers {' '.join(levers)}": [*levers, *TINY] for levers in LEVERS},
    "compile": ["--compile", "default", "--data-on-gpu", *TINY],
    "compile the step": ["--compile", "default", "--compile-scope", "step", "--data-on-gpu", *TINY],
    "minimum window": ["--warmup", "2", "--steps", "2", "--repeats", "1", "--min-window-s", "0.3", "--dataset-size", "512",
                       "--batch-size", "16", "--data-on-gpu"],
}


@pytest.fixture(scope="module")
def trainer_runs(tmp_path_factory) -> dict[str, ForkedRun]:
    """The script run with each of TRAINER_RUNS's arguments (and --cpu), each made once (helpers.forked_json_runs)."""
    runs = {name: [*args, "--cpu"] for name, args in TRAINER_RUNS.items()}
    return forked_json_runs(SCRIPT, runs, tmp_path_factory.mktemp("cnn_training_runs"), timeout_s=900)


@pytest.mark.slow
@pytest.mark.parametrize("levers", LEVERS)
def test_every_lever_trains_on_the_cpu(levers, trainer_runs):
    run = trainer_runs[f"levers {' '.join(levers)}"]
    assert run.status == "0", run.output
    r = run.result
    assert r["status"] == "ok" and r["device"] == "cpu" and r["loss_check"]["fall"] > 0
    assert len(r["windows"]) == 2 and all(w["steps"] >= 10 for w in r["windows"])
    assert len(r["losses"]) == 5 + 20  # every step's loss kept, read back every --loss-every steps
    assert "result checked: mean loss fell" in run.output
    if "--cuda-graphs" in levers:
        assert "cuda_graphs" in r["idle_levers"] and "nothing to act on" in run.output
    # nothing is compiled without --compile
    assert r["compiled_graphs"] is None and r["compile_counters"] is None


@pytest.mark.slow
def test_compile_runs_on_the_cpu(trainer_runs):
    run = trainer_runs["compile"]
    assert run.status == "0", run.output
    r = run.result
    assert r["config"]["compile"] == "default" and r["loss_check"]["fall"] > 0
    # the first step holds the compilation: TorchDynamo's graph count (not the step's time, which depends on the
    # machine and on Inductor's cache) is above zero after the first warm-up step and does not grow after it
    graphs = r["compiled_graphs_by_warmup_step"]
    assert len(graphs) == 5 and graphs[0] >= 1
    assert graphs == [graphs[0]] * 5 and r["compiled_graphs"] == graphs[0]


@pytest.mark.slow
def test_compiling_the_step_compiles_the_loss_and_the_optimizer_too(trainer_runs):
    """--compile-scope step compiles what the hand-made CUDA graph holds: the model with its loss, and Adam's step.
    TorchDynamo then compiles at least two graphs (the model's alone compiles one region: the run above)."""
    run = trainer_runs["compile the step"]
    assert run.status == "0", run.output
    r = run.result
    assert r["config"]["compile_scope"] == "step" and r["loss_check"]["fall"] > 0
    model_only = trainer_runs["compile"].result["compiled_graphs"]
    assert r["compiled_graphs"] >= 2 and r["compiled_graphs"] > model_only


def test_precision_is_read_through_whichever_api_answers():
    """Once a program mixes the legacy TF32 flags with the fp32_precision API, PyTorch raises on reading the legacy
    ones; the script's record then says what the new API holds instead of crashing the run."""
    script = load_script(SCRIPT)

    class Raises:
        def __get__(self, obj, owner):
            raise RuntimeError("you have used a mix of the legacy and new APIs to set the TF32 flags")

    class Matmul:
        allow_tf32 = Raises()
        fp32_precision = "tf32"

    class Cudnn:
        allow_tf32 = Raises()
        conv = type("Conv", (), {"fp32_precision": "ieee"})

    class FakeTorch:
        backends = type("Backends", (), {"cudnn": Cudnn(), "cuda": type("Cuda", (), {"matmul": Matmul()})})

        @staticmethod
        def get_float32_matmul_precision() -> str:
            raise RuntimeError("you have used a mix of the legacy and new APIs")

    record = script.precision(FakeTorch)
    assert record == {"cudnn_allow_tf32": "fp32_precision=ieee", "matmul_allow_tf32": "fp32_precision=tf32",
                      "float32_matmul_precision": "fp32_precision=tf32"}
    import torch

    assert script.precision(torch)["cudnn_allow_tf32"] in (True, False)  # PyTorch's own flags: the legacy API answers


def test_window_rule_runs_on_until_the_minimum_length():
    """--min-window-s's rule on a clock that the test moves, so the machine's speed cannot change the answer."""
    script = load_script(SCRIPT)

    def run_window(steps: int, min_seconds: float, seconds_per_step: float) -> int:
        now = [0.0]

        def step() -> None:
            now[0] += seconds_per_step

        return script.window_steps(step, steps, min_seconds, lambda: now[0])

    assert run_window(2, 0.5, 0.1) == 5  # two steps take 0.2 s: three more reach 0.5 s
    assert run_window(2, 0.5, 0.4) == 2  # two slow steps already pass 0.5 s
    assert run_window(7, 0.0, 0.1) == 7  # no minimum: exactly --steps
    assert run_window(1, 1.0, 0.3) == 4


@pytest.mark.slow
def test_minimum_window_length_is_honoured_by_the_script(trainer_runs):
    run = trainer_runs["minimum window"]
    assert run.status == "0", run.output
    r = run.result
    w = r["windows"][0]
    assert w["seconds"] >= 0.3 and w["steps"] >= 2 and len(r["losses"]) == 2 + w["steps"]
    # how many steps fit in 0.3 s depends on the machine: a short run says it was not judged, a long one is judged
    assert r["loss_check"]["judged"] == (len(r["losses"]) >= 20)
    assert ("loss not checked" in run.output) != ("result checked" in run.output)


def test_too_few_steps_are_not_judged():
    script = load_script(SCRIPT)
    rising = [2.0 + 0.01 * i for i in range(19)]
    assert script.loss_check(rising)["judged"] is False and script.loss_check(rising)["fall"] < 0
    assert script.loss_check(rising + [1.0])["judged"] is True


@pytest.mark.parametrize("args, message", [
    (["--cuda-graphs", "--compile", "default"], "do not combine"),
    (["--data-on-gpu", "--workers", "2"], "replaces the DataLoader"),
    (["--batch-size", "0"], "must be at least 1"),
    (["--lr", "-1"], "--lr must be greater than 0"),
    (["--cuda-graphs", "--warmup", "2"], "--warmup 3 or more"),
    (["--compile", "fast"], "invalid choice"),
    (["--compile-scope", "step"], "--compile-scope needs --compile"),
])
def test_bad_input_is_one_sentence(args, message, capsys):
    proc = run_script_in_process(SCRIPT, *args, capsys=capsys)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_help_names_every_lever(capsys):
    proc = run_script_in_process(SCRIPT, "--help", capsys=capsys)
    assert proc.returncode == 0
    for flag in ("--workers", "--pin-memory", "--non-blocking", "--data-on-gpu", "--loss-every", "--bf16",
                 "--channels-last", "--cudnn-benchmark", "--fused-adam", "--compile", "--compile-scope", "--cuda-graphs",
                 "--profile-steps"):
        assert flag in proc.stdout


# ----- the study's configurations and readers, on the reference run -----

def test_configurations_are_shared_and_each_lever_is_off_in_the_naive_loop():
    configs = ct.all_configs()
    labels = [c.label for c in configs]
    assert len(labels) == len(set(labels))
    assert ct.LADDER[0].levers == () and ct.LADDER[0].batch == 32
    # each rung of the ladder differs from the one before
    assert all(ct._key(a) != ct._key(b) for a, b in zip(ct.LADDER, ct.LADDER[1:]))
    # the script accepts every configuration's arguments
    script = load_script(SCRIPT)
    for cfg in configs:
        script.parse_args(ct.run_args(cfg))


def test_reference_run_holds_every_configuration():
    runs = json.loads((REF / "timings.json").read_text())["runs"]
    table = ct.results_table(runs)
    missing = set(c.label for c in ct.all_configs()) - set(table.index)
    assert not missing, missing
    assert (table["status"] == "ok").all() and (table["low"] <= table["images_per_s"]).all()
    assert (table["images_per_s"] <= table["high"]).all()
    lt = ct.ladder_table(runs)
    assert lt["x naive"].iloc[0] == 1 and np.isclose(lt["x previous"].iloc[1:].prod(), lt["x naive"].iloc[-1])
    sweep = ct.sweep_table(runs)
    assert list(sweep.index) == list(ct.SWEEP_BATCHES) and sweep["all levers but compile"].notna().all()


def test_spread_table_on_the_reference_run():
    """The processes' spread and the windows' spread, one row per distinct run, recomputed here from the processes
    (shared runs appear once)."""
    runs = json.loads((REF / "timings.json").read_text())["runs"]
    t = ct.spread_table(runs, [*ct.LADDER, *ct.NCHW_CHECK, *ct.LEVERS])
    assert "alone: workers 8" not in t.index and ct.LADDER[1].label in t.index  # the same run as rung 1
    assert len(t) == len(ct.LADDER) + len(ct.NCHW_CHECK) + len(ct.LEVERS) - 1
    assert (t["slowest"] <= t["middle"]).all() and (t["middle"] <= t["fastest"]).all()
    naive, run = t.loc[ct.LADDER[0].label], runs[ct.LADDER[0].label]
    assert np.isclose(naive["between"], run["process_high"] / run["process_low"] - 1)
    windows = [[w["images_per_s"] for w in p["windows"]] for p in run["processes"]]
    assert np.isclose(naive["within"], max(max(w) / min(w) - 1 for w in windows))


def test_distinct_runs_table_names_each_run_once_and_splits_its_range_by_meaning():
    runs = json.loads((REF / "timings.json").read_text())["runs"]
    configs = ct.all_configs()
    t = ct.distinct_runs_table(runs, configs)
    assert len(t) == len({ct._key(c) for c in configs if c.label in runs})
    assert "alone: workers 8" in t.loc[ct.LADDER[1].label, "also"] and "alone: workers 8" not in t.index
    several = t["processes"] > 1
    assert t.loc[several, ["window low", "window high"]].isna().all().all()
    assert t.loc[~several, ["process low", "process high"]].isna().all().all()
    assert t.loc[~several, "window low"].notna().all() and t.loc[several, "process low"].notna().all()


def test_graph_launches_per_step_on_the_reference_captures():
    """The hand-made graph launches once per step; the eager loop never."""
    counts = {name: ct.graph_launches_per_step(REF / f"{name}.sqlite") for name in ("rung0", "rung4", "rung8")}
    assert counts == {"rung0": 0.0, "rung4": 1.0, "rung8": 1.0}


def test_phase_table_and_evidence_on_the_reference_captures():
    for name in ("rung0", "rung1", "rung4", "rung8", "rung8_nchw"):
        path = REF / f"{name}.sqlite"
        phases = ct.phase_table(path)
        assert len(phases) == 50
        # the phases lie inside their step
        assert (phases.drop(columns="step_ms").sum(axis=1) <= phases["step_ms"] + 1e-6).all()
        ev = ct.evidence(path)
        assert 0 < ev["busy_share"] <= 1 and ev["kernels_per_step"] > 10
    assert ct.largest_phase(ct.evidence(REF / "rung0.sqlite")) == "data_wait"


def test_gpu_activity_counts_the_kernels_launched_in_the_steps():
    """kernels_per_step x steps equals the kernels whose launch call lies inside the profiled steps' window."""
    path = REF / "rung8.sqlite"
    act = ct.gpu_activity(path)
    ranges = ns.nvtx_ranges(path)
    steps = ranges[ranges["text"].str.fullmatch(r"step_\d+")]
    lo, hi = steps["start"].min(), steps["end"].max()
    runtime = ns.runtime_calls(path)
    k = ns.kernels(path).merge(runtime[["correlationId", "start"]].rename(columns={"start": "launch"}), on="correlationId")
    inside = k[(k["launch"] >= lo) & (k["launch"] <= hi)]
    assert round(act["kernels_per_step"] * act["steps"]) == len(inside)
    assert 0.9 <= act["busy_share"] <= 1


def test_sync_wait_counts_the_calls_that_wait_for_the_gpu():
    """The naive loop reads the loss every step (a wait per step); rung 8 reads it every 50 steps: one long wait in
    its 50 profiled steps, inside the copy of the losses to pageable memory, not in a *Synchronize call."""
    assert (ct.sync_wait_ms(REF / "rung0.sqlite") > 0).all()
    rung8 = ct.sync_wait_ms(REF / "rung8.sqlite")
    assert len(rung8) == 50 and (rung8 < 0.1).sum() == 49 and rung8.max() > 10
    # each step's wait equals a direct sum of the *Synchronize calls and the device-to-pageable copies in its range
    for name in ("rung0", "rung8"):
        ranges = ns.nvtx_ranges(REF / f"{name}.sqlite")
        steps = ranges[ranges["text"].str.fullmatch(r"step_\d+")].sort_values("start")
        rt = ns.runtime_calls(REF / f"{name}.sqlite")
        cp = ns.memcpy(REF / f"{name}.sqlite")
        d2h = set(cp.loc[(cp["copyKind"] == 2) & (cp["dst_memory"] == "Pageable"), "correlationId"])
        wait = rt[rt["name"].str.contains("Synchronize") | rt["correlationId"].isin(d2h)]
        direct = [(wait["end"] - wait["start"])[(wait["start"] >= s.start) & (wait["end"] <= s.end)].sum()
                  for s in steps.itertuples()]
        assert np.allclose(ct.sync_wait_ms(REF / f"{name}.sqlite"), np.asarray(direct) / 1e6)


# ----- ncu's details page read as a report -----

def test_metric_columns_from_the_details_page_equal_the_report():
    """The same metrics, read from ch04's report and from its details-page CSV, agree (units scaled back)."""
    names = [n for n in nd.SOL_METRICS]
    from_csv = nd.sol_table(metric_columns(read_details(REPO_ROOT / "artifacts" / "ch04" / "ladder.details.csv"), names))
    from_rep = nd.sol_table(REPO_ROOT / "artifacts" / "ch04" / "ladder.ncu-rep")
    assert len(from_csv) == len(from_rep)
    for name in names:
        a, b = from_csv[name].to_numpy(float), from_rep[name].to_numpy(float)
        assert np.allclose(a, b, rtol=0.01, equal_nan=True), name


def test_chapter6_reference_keeps_the_details_page_only():
    assert (REF / "top_kernels.details.csv").exists() and not (REF / "top_kernels.ncu-rep").exists()
    sol = nd.sol_table(metric_columns(read_details(REF / "top_kernels.details.csv"), nd.SOL_METRICS))
    assert len(sol) == 8 and sol["kernel"].str.contains("max_pool_backward").any()


# ----- timing in several processes -----

def test_every_timed_run_takes_enough_steps_for_its_loss_to_be_judged():
    script = load_script(SCRIPT)
    for cfg in ct.all_configs():
        args = script.parse_args(ct.run_args(cfg))
        assert args.warmup + args.repeats * args.steps >= script.MIN_STEPS_JUDGED, cfg.label


def test_preload_leaves_the_meta_pass_imports_and_the_image_set_to_forked_runs():
    """The fork server's preload does, once, what each run's memory check would import (seconds per process)."""
    import subprocess
    import sys

    code = ("import sys, torch\n"
            "from gpuprof import cnn_data\n"
            "from gpuprof.studies import cnn_training as ct\n"
            "assert 'sympy' not in sys.modules\n"
            "ct.preload()\n"
            "print('sympy' in sys.modules, (ct.DATASET_SIZE, 0) in cnn_data._PRELOADED, torch.cuda.is_initialized())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "False"]  # imports made, set drawn, CUDA untouched (the children's)


def test_run_plan_interleaves_the_repeated_configurations_and_runs_the_rest_once():
    a, b, c = ct.LADDER[0], ct.LADDER[1], ct.LADDER[2]
    extra = ct.Config("sweep: naive loop, batch 1024", (), 1024)
    same_as_b = ct.Config("alone: workers 8", b.levers)  # the same run as b under another label
    plan = ct.run_plan([a, b, same_as_b, c, extra], [a, b, c], 3)
    assert [p.label for p in plan] == [a.label, b.label, c.label, c.label, b.label, a.label, a.label, b.label, c.label,
                                       extra.label]


def test_a_configuration_timed_in_several_processes_is_their_median_and_range():
    procs = [{"status": "ok", "images_per_s": r, "warmup_step_s": [0.5 + i], "loss_check": {"fall": f},
              "peak_memory_bytes": 10 * i, "gpu": "G"} for i, (r, f) in enumerate([(100.0, 0.9), (140.0, 0.7), (120.0, 0.8)])]
    s = ct._summarise(procs)
    assert s["status"] == "ok" and s["images_per_s"] == 120.0 and (s["process_low"], s["process_high"]) == (100.0, 140.0)
    assert s["loss_check"]["fall"] == 0.7 and s["peak_memory_bytes"] == 20 and s["first_step_s_each"] == [0.5, 1.5, 2.5]
    failed = ct._summarise([*procs[:2], {"status": "failed (exit 1): boom"}])
    assert failed["status"] == "failed (exit 1): boom" and len(failed["processes"]) == 3
    runs = {"x": {"batch": 32, **s}}
    t = ct.results_table(runs)
    assert t.loc["x", ["images_per_s", "low", "high", "processes"]].tolist() == [120.0, 100.0, 140.0, 3]


def test_ladder_gains_carry_the_range_the_processes_allow():
    runs = {c.label: {"batch": c.batch, "status": "ok", "images_per_s": m, "process_low": lo, "process_high": hi,
                      "processes": [{}, {}, {}], "warmup_step_s": [1.0], "loss_check": {"fall": 0.9}}
            for c, (m, lo, hi) in zip(ct.LADDER[:2], [(100, 90, 110), (200, 180, 230)])}
    lt = ct.ladder_table(runs, ct.LADDER[:2])
    row = lt.iloc[1]
    assert row["x previous"] == 2 and row["x previous low"] == pytest.approx(180 / 110)
    assert row["x previous high"] == pytest.approx(230 / 90) and row["x naive"] == 2


@pytest.mark.slow
def test_run_configs_times_the_repeated_configurations_in_separate_processes(tmp_path, monkeypatch):
    """The whole path on the CPU: a fork server, two configurations timed in two interleaved rounds, one run once."""
    from gpuprof.backend import MachineInfo

    monkeypatch.setenv("GPUPROF_OUTPUT_DIR", str(tmp_path))
    monkeypatch.setattr(ct, "describe_machine", lambda: MachineInfo(backend="torch", device="cuda", gpu_name="test"))
    monkeypatch.setattr(ct, "DATASET_SIZE", 512)
    tiny = ["--warmup", "1", "--steps", "2", "--repeats", "1", "--dataset-size", "512"]  # what is timed does not matter
    monkeypatch.setattr(ct, "run_args", lambda cfg: [*cfg.args(), *tiny])
    a, b = ct.Config("a", ("--data-on-gpu",), 16), ct.Config("b", ("--data-on-gpu", "--loss-every", "5"), 16)
    once = ct.Config("c", ("--data-on-gpu", "--bf16"), 16)
    found = ct.run_configs("chx", "t.json", [a, b, once], repeated=[a, b], rounds=2)
    runs = found.json()["runs"]
    assert [len(runs[k]["processes"]) for k in "abc"] == [2, 2, 1] and all(r["status"] == "ok" for r in runs.values())
    t = ct.results_table(runs)
    assert t.loc["a", "processes"] == 2 and t.loc["a", "low"] <= t.loc["a", "images_per_s"] <= t.loc["a", "high"]
