"""examples/nsys/mixed_precision.py on the CPU, at a tiny size: every mode runs, records what the chapter reads,
and refuses bad input in one sentence. (Its timings and the four modes' numerics are measured on a GPU.)"""

from __future__ import annotations

import copy
import json

import pytest

from gpuprof.artifacts import REPO_ROOT
from helpers import ForkedRun, forked_json_runs, run_script_in_process

pytest.importorskip("torch")

SCRIPT = REPO_ROOT / "examples" / "nsys" / "mixed_precision.py"
TINY = ["--layers", "2", "--d-model", "64", "--heads", "4", "--d-ff", "128", "--batch-size", "4", "--seq-len", "16",
        "--warmup", "1", "--steps", "2", "--cpu"]
MODES = ["fp32", "tf32", "fp16", "bf16", "fp16-noscaler"]


@pytest.fixture(scope="module")
def mode_runs(tmp_path_factory) -> dict[str, ForkedRun]:
    """One run of the script per mode at the tiny size, each made once (helpers.forked_json_runs); the tests below
    read them."""
    runs = {mode: ["--mode", mode, *TINY] for mode in MODES}
    return forked_json_runs(SCRIPT, runs, tmp_path_factory.mktemp("mixed_precision_runs"), timeout_s=600)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_runs_from_the_same_weights_and_batch(mode, mode_runs):
    out = mode_runs[mode]
    assert out.status == "0", out.output
    r = out.result
    assert r["mode"] == mode and r["device"] == "cpu" and len(r["steps"]) == 3
    assert [s["measured"] for s in r["steps"]] == [False, True, True]
    assert all(s["loss"] > 0 for s in r["steps"])
    assert r["grad_elements"] > 0 and 0 <= r["underflowed_grad_elements"] <= r["grad_elements"]
    assert (r["steps"][0]["scale"] is not None) == (mode == "fp16")  # only the scaled mode has a scale
    # memory is measured on a GPU only: no peak on the CPU, rather than a number that means something else
    assert all(s["peak_bytes"] is None for s in r["steps"]) and "step_peak_memory_bytes" not in r
    # no SM clock or power on the CPU: the key is null, the reason beside it, said once in the output, no failure
    assert r["nvml"] is None and r["nvml_why"].startswith("on the CPU")
    assert out.output.count("clocks: on the CPU") == 1
    # the first step's gradient against the FP32 reference (unscaled for fp16): the same computation in FP32 and
    # in TF32 (no TF32 on the CPU), a small but non-zero difference in half precision
    agree = r["first_step_gradient_vs_fp32"]
    assert set(agree) == {"all", "embeddings", "layernorm", "linear"}
    if mode in ("fp32", "tf32"):
        assert agree["all"]["relative_error"] <= 1e-6
    else:
        assert 0 < agree["all"]["relative_error"] < 0.1 and agree["all"]["cosine"] > 0.99


def test_the_measured_steps_window_goes_into_the_json(monkeypatch, capsys):
    """The GPU path's clock record, wired on the CPU: a stand-in sampler in place of the GPU's, stopped when the
    measured steps end, asked once for their window, its summary and the power limit written and said in one line."""
    import time

    import gpuprof.nvml as nvml
    from gpuprof.runner import load_script

    class Recorder:
        def __init__(self):
            self.opened, self.stopped, self.windows = time.monotonic(), False, []

        def __exit__(self, *exc):
            self.stopped = True

        def summary(self, t0, t1):
            assert self.stopped
            self.windows.append((t0, t1))
            return nvml.summarise([nvml.Sample(t, 1755, 612.5, None, 4, None) for t in (t0, t1)], t0, t1)

    rec = Recorder()

    def stand_in(torch, gpu, enabled=True):
        assert not gpu and enabled  # what the script asks for on the CPU without --no-clocks
        return rec, 700.0, "a stand-in"

    monkeypatch.setattr(nvml, "torch_sampler", stand_in)
    script = load_script(SCRIPT)
    out = script.run(script.parse_args(["--mode", "bf16", *TINY[:-1]]), "cpu")
    after = time.monotonic()
    [(t0, t1)] = rec.windows
    assert rec.opened < t0 < t1 <= after
    nv = out["nvml"]
    assert "nvml_why" not in out and nv["power_limit_w"] == 700.0 and nv["sm_mhz_median"] == 1755
    assert nv["event_reasons_words"] == "software power cap" and nv["power_w_median"] == 612.5 and nv["samples"] == 2
    said = capsys.readouterr().out
    assert "clocks: a stand-in" in said
    assert said.count("during the measured steps: SM clock 1755 MHz (lowest 1755), 612 W of a 700 W limit") == 1


@pytest.mark.slow
def test_the_modes_start_from_the_same_loss(mode_runs):
    first = {}
    for mode in ("fp32", "bf16"):
        assert mode_runs[mode].status == "0", mode_runs[mode].output
        first[mode] = mode_runs[mode].result["steps"][0]["loss"]
    assert first["bf16"] == pytest.approx(first["fp32"], rel=0.05)  # bf16 keeps ~3 significant digits


@pytest.mark.parametrize("args,said", [
    (["--d-model", "100", "--heads", "12"], "not a multiple of --heads"),
    (["--seq-len", "1000"], "limit of 512"),
    (["--lr", "-1"], "--lr must be a positive number"),
    (["--mode", "fp8"], "invalid choice"),
])
def test_bad_input_is_one_sentence(args, said, capsys):
    out = run_script_in_process(SCRIPT, *args, "--cpu", capsys=capsys)
    assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr


def test_help_names_the_modes_and_ranges(capsys):
    out = run_script_in_process(SCRIPT, "--help", capsys=capsys)
    assert out.returncode == 0
    for word in ("fp32", "tf32", "fp16-noscaler", "GradScaler", "step_N", "optimizer_step"):
        assert word in out.stdout


def test_the_memory_probe_needs_a_gpu_and_says_so(capsys):
    out = run_script_in_process(SCRIPT, "--largest-batch-in", "8", "--cpu", capsys=capsys)
    assert out.returncode == 2 and "there is no GPU here" in out.stderr and "Traceback" not in out.stderr
    bad = run_script_in_process(SCRIPT, "--largest-batch-in", "-1", "--cpu", capsys=capsys)
    assert bad.returncode == 2 and "positive number of GiB" in bad.stderr


# --- --census: the FP32 reference gradient against FP16's range, per parameter group -------------------------

CENSUS_TINY = ["--layers", "2", "--d-model", "64", "--heads", "4", "--d-ff", "128", "--batch-size", "4", "--seq-len", "16",
               "--cpu"]
CENSUS_FIELDS = ("nonzero", "below_fp16_subnormal", "fp16_subnormal")


def _census(path, *extra: str) -> dict:
    """The script's --census in a process of its own (it sets the TF32 switches, which a test process must keep)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(SCRIPT), *CENSUS_TINY, *extra, "--census", str(path)],
                         capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(path.read_text())


def _check_census(census: dict, layers: int, d_model: int) -> None:
    """What any census must hold: the groups add up to the totals, every LayerNorm and matrix-product element is
    non-zero, and the key third of each in_proj_bias holds rounding noise only (its true gradient is zero)."""
    groups = census["by_group"]
    assert sorted(groups) == sorted(["embeddings", "layernorm", "attention_key_bias", "matrix_weights", "other_biases"])
    for field in CENSUS_FIELDS:
        assert census[field] == sum(g[field] for g in groups.values()), field
    for g in groups.values():
        assert 0 <= g["below_fp16_subnormal"] + g["fp16_subnormal"] <= g["nonzero"] <= g["elements"]
    key = groups["attention_key_bias"]
    assert key["elements"] == layers * d_model
    assert key["max_abs"] < 2.0 ** -25 and key["below_fp16_subnormal"] == key["nonzero"]
    assert key["max_abs"] < 1e-4 * groups["other_biases"]["max_abs"]  # noise, not a gradient
    assert groups["layernorm"]["nonzero"] == groups["layernorm"]["elements"]
    assert groups["matrix_weights"]["nonzero"] == groups["matrix_weights"]["elements"]


@pytest.mark.slow
def test_the_census_is_seeded_split_by_group_and_carries_its_provenance(tmp_path):
    first = _census(tmp_path / "a.json")
    _check_census(first["census"], layers=2, d_model=64)
    assert first["census"]["by_group"]["attention_key_bias"]["nonzero"] > 0  # the noise is there to be counted
    prov = first["provenance"]
    assert prov["device"] == "cpu" and prov["torch"] and prov["date"].endswith("Z") and prov["cpu_threads"] >= 1
    assert "--census" in prov["command"] and "--layers 2" in prov["command"]
    assert first["machine"]["device"] == "cpu" and first["config"]["seed"] == 0
    again = _census(tmp_path / "b.json")
    assert again["census"] == first["census"] and again["reference_loss"] == first["reference_loss"]
    split = first["fp16_noscaler_lost"]  # one unscaled FP16 backward: what it zeroed, by group and FP32 range
    assert split["lost"] == sum(g["lost"] for g in split["by_group"].values())
    for g in split["by_group"].values():
        assert g["lost"] == g["below_fp16_subnormal"] + g["fp16_subnormal"] + g["fp16_normal"]
    assert again["fp16_noscaler_lost"] == split
    other = _census(tmp_path / "c.json", "--seed", "1")
    assert other["reference_loss"] != first["reference_loss"]  # the seed reaches the weights and the batch


@pytest.mark.parametrize("args,said", [
    (["--largest-batch-in", "8"], "give one of them"),
    (["--json", "x.json"], "leave out --json"),
    (["--census", "/no/such/folder/c.json"], "does not exist"),
])
def test_the_census_refuses_what_it_cannot_do_in_one_sentence(args, said, capsys, tmp_path):
    census = [] if "--census" in args else ["--census", str(tmp_path / "c.json")]
    out = run_script_in_process(SCRIPT, *census, *args, "--cpu", capsys=capsys)
    assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr


def test_the_committed_cpu_census_is_the_chapters_model_and_batch():
    """artifacts/ch10/cpu/fp16_census.json, which chapter 10 cites: the script's own record of a CPU run at the
    chapter's model, seed and batch, starting from the same loss as the GPU's FP32 reference in modes.json."""
    record = json.loads((REPO_ROOT / "artifacts" / "ch10" / "cpu" / "fp16_census.json").read_text())
    assert record["config"] == {"batch_size": 32, "cpu": True, "d_ff": 3072, "d_model": 768, "heads": 12, "layers": 12,
                                "seed": 0, "seq_len": 128}
    assert record["provenance"]["device"] == "cpu" and record["machine"]["device"] == "cpu"
    assert record["provenance"]["command"].startswith("python examples/nsys/mixed_precision.py")
    _check_census(record["census"], layers=12, d_model=768)
    gpu = next(r for r in json.loads((REPO_ROOT / "artifacts" / "ch10" / "modes.json").read_text())["runs"]
               if r["kind"] == "time" and r["batch"] == 32)
    assert record["reference_loss"] == pytest.approx(gpu["reference_loss"], rel=1e-6)


# --- the study's readers, on the reference run (artifacts/ch10) -------------------------------------------

from gpuprof.studies import mixed_precision as mp  # noqa: E402

REF = REPO_ROOT / "artifacts" / "ch10"


@pytest.fixture(scope="module")
def data():
    return json.loads((REF / "modes.json").read_text())


def test_the_plan_interleaves_rounds_and_runs_each_mode_at_each_batch():
    plan = mp.run_plan(rounds=3, batches=(32, 128))
    timed = [r for r in plan if r["kind"] == "time" and r["mode"] != mp.FAILURE]
    assert len(timed) == 3 * 2 * len(mp.MODES)
    first = [r["mode"] for r in timed if r["round"] == 0 and r["batch"] == 32]
    second = [r["mode"] for r in timed if r["round"] == 1 and r["batch"] == 32]
    assert first == list(mp.MODES) and second == list(mp.MODES)[::-1]
    assert [r["mode"] for r in plan if r["kind"] == "fit"] == ["fp32", "fp16", "bf16"]


def test_timing_table_medians_and_ranges_come_from_the_processes(data):
    t = mp.timing_table(data)
    assert set(t["mode"]) == set(mp.MODES) and sorted(t["batch"].unique()) == data["batches"]
    for (batch, mode), row in t.set_index(["batch", "mode"]).iterrows():
        runs = [r for r in data["runs"] if r["kind"] == "time" and r["batch"] == batch and r["mode"] == mode]
        medians = sorted(mp._measured(r, "step_ms") for r in runs)
        assert row["processes"] == len(runs) == data["rounds"]
        assert row["low_ms"] == medians[0] and row["high_ms"] == medians[-1] and row["step_ms"] == medians[len(medians) // 2]
        assert row["speedup_low"] <= row["speedup"] <= row["speedup_high"]
    assert (t[t["mode"] == "fp32"]["speedup"] == 1).all()


def test_the_step_peak_column_appears_only_for_data_that_records_the_steps_own_peak(data):
    # the committed runs (2026-11-26) record each step's own peak, after the FP32 reference pass: it is the peak
    # the memory probes measure for the same batch, one step alone under a cap (3.78 against 3.77 GiB in FP32)
    t32 = mp.timing_table(data).query("batch == 32").set_index("mode")["step_peak_GiB"]
    probes = mp.probe_peaks(data)["batch_32_GiB"]
    for mode in probes.index:
        assert t32[mode] == pytest.approx(probes[mode], rel=0.02)
    older = {"runs": [{k: v for k, v in r.items() if k != "step_peak_memory_bytes"} for r in data["runs"]]}
    assert not any(c.endswith("GiB") for c in mp.timing_table(older).columns)  # data without it: no column
    ref = [{"loss": 1.0, "step_ms": 10.0, "forward_ms": 1.0, "backward_ms": 2.0, "optimizer_ms": 3.0,
            "skipped": False, "measured": True}]
    fake = {"runs": [{"kind": "time", "mode": m, "batch": 32, "steps": ref, "step_peak_memory_bytes": gib * 2**30}
                     for m, gib in (("fp32", 4), ("tf32", 4), ("fp16", 3), ("bf16", 3))]}
    t = mp.timing_table(fake).set_index("mode")
    assert t.loc["fp32", "step_peak_GiB"] == 4 and t.loc["bf16", "step_peak_GiB"] == 3


def _with_clocks(data, slow=("bf16", 128, 1)):
    """The reference runs with NVML windows as the script now writes them: every process at 1980 MHz, 600 W of a
    700 W limit, no reason, except ``slow`` (mode, batch, round): 1500 MHz (lowest 1410), software power cap."""
    out = copy.deepcopy(data)
    for r in out["runs"]:
        if r["kind"] != "time":
            continue
        capped = (r["mode"], r["batch"], r["round"]) == slow
        clock = 1500.0 if capped else 1980.0
        r["nvml"] = {"seconds": 1.0, "samples": 50, "sm_mhz_median": clock, "sm_mhz_min": clock - 90, "sm_mhz_max": clock,
                     "power_w_energy": 699.0 if capped else 600.0, "power_w_mean": 610.0, "power_w_median": 605.0,
                     "event_reasons": "0x0000000000000004" if capped else "0x0000000000000000",
                     "event_reasons_words": "software power cap" if capped else "none", "temp_c_max": 60,
                     "power_limit_w": 700.0}
    return out


def test_clock_table_reads_each_processs_window_and_counts_cycles_at_its_own_clock(data):
    clocked = _with_clocks(data)
    t = mp.clock_table(clocked).set_index(["batch", "mode"])
    assert t.attrs["clocks"] and (t["clocked"] == t["processes"]).all()
    # the step time is timing_table's, unchanged by the clocks
    assert t["step_ms"].tolist() == mp.timing_table(data).set_index(["batch", "mode"])["step_ms"].tolist()
    runs = [r for r in clocked["runs"] if r["kind"] == "time" and r["batch"] == 128 and r["mode"] == "bf16"]
    row = t.loc[(128, "bf16")]
    assert row["sm_mhz"] == 1980 and row["sm_mhz_low"] == 1410 and row["reasons"] == "software power cap"
    assert row["power_w"] == 600 and row["power_limit_w"] == 700
    # cycles: each process's own median step at its own clock, then the median over processes
    cycles = sorted(mp._measured(r, "step_ms") * r["nvml"]["sm_mhz_median"] / 1e3 for r in runs)
    assert row["mcycles"] == pytest.approx(cycles[1])
    assert t.loc[(32, "fp32"), "mcycles"] == pytest.approx(t.loc[(32, "fp32"), "step_ms"] * 1.98)
    assert t.loc[(128, "fp32"), "reasons"] == "none" and t.loc[(128, "fp32"), "cycle_speedup"] == 1
    assert t.loc[(128, "bf16"), "cycle_speedup"] == pytest.approx(t.loc[(128, "fp32"), "mcycles"] / row["mcycles"])
    # a process capped alone changes the cycles against the time: at one clock the two ratios would be equal
    at_one_clock = mp.clock_table(_with_clocks(data, slow=None)).set_index(["batch", "mode"])
    speedup = mp.timing_table(data).set_index(["batch", "mode"])["speedup"]
    assert at_one_clock["cycle_speedup"].to_numpy() == pytest.approx(speedup.to_numpy())
    assert at_one_clock.loc[(128, "bf16"), "reasons"] == "none"


def test_clock_speedups_set_the_time_beside_the_cycles_at_one_batch(data):
    clocked = _with_clocks(data)
    for r in clocked["runs"]:  # every bf16 process at the large batch held to 1500 MHz, everyone else at 1980
        if r["kind"] == "time" and r["mode"] == "bf16" and r["batch"] == mp.LARGE_BATCH:
            r["nvml"] = {**r["nvml"], "sm_mhz_median": 1500.0, "event_reasons": "0x0000000000000004"}
    t = mp.clock_speedups(clocked)
    assert t.attrs["clocks"] and list(t.index) == list(mp.MODES)
    timing = mp.timing_table(data).set_index(["batch", "mode"])
    assert t.loc["bf16", "speedup"] == timing.loc[(mp.LARGE_BATCH, "bf16"), "speedup"]
    assert t.loc["bf16", "reasons"] == "software power cap" and t.loc["fp16", "reasons"] == "none"
    # at one clock the two speed-ups agree; bf16's work, done at 1500 MHz, is 1980/1500 faster in cycles than in time
    assert t.loc["fp16", "cycle_speedup"] == pytest.approx(t.loc["fp16", "speedup"])
    assert t.loc["bf16", "cycle_speedup"] == pytest.approx(t.loc["bf16", "speedup"] * 1980 / 1500)
    assert not mp.clock_speedups(data).attrs["clocks"]  # the committed reference has no clocks


def test_clock_table_loads_data_without_clocks(data):
    old = mp.clock_table(data)  # the committed reference predates the clocks
    assert not old.attrs["clocks"] and (old["clocked"] == 0).all() and (old["reasons"] == "not recorded").all()
    assert old[["sm_mhz", "sm_mhz_low", "power_w", "power_limit_w", "mcycles", "cycle_speedup"]].isna().all().all()
    # null where the script read nothing (--no-clocks, no NVML), in some processes only: the others still count
    mixed = _with_clocks(data, slow=None)
    for r in mixed["runs"]:
        if r["kind"] == "time" and r.get("round") == 0:
            r["nvml"], r["nvml_why"] = None, "--no-clocks"
    t = mp.clock_table(mixed).set_index(["batch", "mode"])
    assert (t["clocked"] == t["processes"] - 1).all() and (t["sm_mhz"] == 1980).all()


def test_probe_peaks_are_the_probes_own_numbers(data):
    p = mp.probe_peaks(data)
    fit = {r["mode"]: r for r in data["runs"] if r["kind"] == "fit"}
    for mode, row in p.iterrows():
        got = {q["batch"]: q["peak_bytes"] for q in fit[mode]["probes"] if q["fits"]}
        assert row["batch_32_GiB"] == got[32] / 2**30
    assert p.loc["bf16", "batch_32_GiB"] < p.loc["fp32", "batch_32_GiB"]
    assert p["batch_128_GiB"].isna().tolist() == [m == "fp32" for m in p.index]  # FP32 at 128 did not fit in 8 GiB


def test_loss_curves_count_updates_so_a_skipped_step_does_not_shift_fp16():
    steps = [{"loss": 1.0, "skipped": False, "measured": False}, {"loss": 2.0, "skipped": True, "measured": True},
             {"loss": 2.0, "skipped": False, "measured": True}, {"loss": 3.0, "skipped": False, "measured": True}]
    ref = [{"loss": v, "skipped": False, "measured": True} for v in (1.0, 2.0, 3.0, 4.0)]
    fake = {"runs": [{"kind": "time", "mode": "fp32", "batch": 32, "steps": ref},
                     {"kind": "time", "mode": "fp16", "batch": 32, "steps": steps}]}
    curves = mp.loss_curves(fake)
    assert curves["fp16"].tolist() == [1.0, 2.0, 3.0] and curves["fp32"].tolist() == [1.0, 2.0, 3.0]
    assert mp.loss_agreement(curves)["fp16"] == 0


def test_the_reference_run_meets_the_chapters_claims(data):
    t = mp.timing_table(data)
    assert mp.speedup_floor(t, mp.LARGE_BATCH, "bf16") >= 2.0
    assert mp.fit_table(data).set_index("mode").loc["bf16", "vs_fp32"] >= 1.4
    under = mp.underflow_table(data)
    assert under.loc["fp16-noscaler", "zero_not_in_fp32"] > 100 * (under.loc["fp16", "zero_not_in_fp32"] + 1)
    assert (mp.loss_agreement(mp.loss_curves(data)) <= 0.01).all()
    # the scaler's first skip is the second step (after the first update), in every FP16 process
    h = mp.scale_history(data)
    assert h.loc[h["skipped"], "step"].unique().tolist() == [1] and (h.loc[h["step"] == 0, "scale_after"] == 65536).all()
    per_seq = mp.memory_per_sequence(data)
    assert 0.5 < per_seq.loc["bf16", "slope_vs_fp32"] < 0.6  # activations per sequence well above half of FP32's
    assert abs(per_seq.loc["bf16", "predicted_largest"] / per_seq.loc["fp32", "predicted_largest"] - 1.8) < 0.1
    top = mp.underflow_top(data)
    assert top.attrs["total"] == under.loc["fp16-noscaler", "zero_not_in_fp32"] and 0 < top.attrs["kept"] < top.attrs["total"]


def test_the_batch_is_drawn_apart_from_the_weights():
    """training_ids is what first_batch trains on, and a reader can draw it again without building the model."""
    from gpuprof.runner import load_script
    import torch

    script = load_script(SCRIPT)
    args = script.parse_args(TINY)
    _, ids, labels = script.first_batch(torch, args, "cpu")
    assert torch.equal(script.training_ids(torch, args), ids) and torch.equal(labels, ids[:, 1] % 2)
    other = script.parse_args([*TINY, "--seed", "1"])
    assert not torch.equal(script.training_ids(torch, other), ids)


def test_census_against_cpu_reads_both_records_and_bounds_where_they_differ(data, tmp_path):
    c = mp.census_against_cpu(data)
    record = json.loads(mp.CPU_CENSUS.read_text())
    gpu = next(r for r in data["runs"] if r["kind"] == "time" and r["batch"] == 32)["reference_fp16_census"]
    for field in mp.CENSUS_FIELDS:
        assert c.loc[field, "cpu"] == record["census"][field] and c.loc[field, "gpu"] == gpu[field]
    assert c["gpu_minus_cpu"].tolist() == (c["gpu"] - c["cpu"]).tolist()
    assert c.loc[["below_fp16_subnormal", "fp16_subnormal", "fp16_normal"], "cpu"].sum() == c.loc["nonzero", "cpu"]
    a = c.attrs
    # every CPU zero in the embeddings lies in a row the batch does not index (the chapter's premise)
    assert a["cpu_embedding_zeros"] == a["unused_elements"] == a["unused_rows"] * 768
    assert a["cpu_zeros_elsewhere"] == {"attention_key_bias": 127, "layernorm": 0, "matrix_weights": 0, "other_biases": 0}
    assert a["gpu_zeros_elsewhere"] == 18 and a["newly_nonzero_at_least"] == c.loc["nonzero", "gpu_minus_cpu"] == 109
    assert a["torch"] == {"cpu": record["provenance"]["torch"], "gpu": "2.11.0+cu130"}
    # one more CPU zero among the weights: one more element the GPU must hold non-zero
    record["census"]["by_group"]["matrix_weights"]["nonzero"] -= 1
    record["census"]["nonzero"] -= 1
    (tmp_path / "one_more.json").write_text(json.dumps(record))
    more = mp.census_against_cpu(data, tmp_path / "one_more.json").attrs
    assert more["cpu_zeros_elsewhere"]["matrix_weights"] == 1 and more["newly_nonzero_at_least"] == 110
    record["census"]["by_group"]["layernorm"]["elements"] += 1  # another model: refused, not compared
    (tmp_path / "other.json").write_text(json.dumps(record))
    from gpuprof.errors import GpuprofError

    with pytest.raises(GpuprofError, match="not the same model"):
        mp.census_against_cpu(data, tmp_path / "other.json")


def test_capture_readers_on_the_reference_captures():
    paths = {m: REF / f"mode_{m}.sqlite" for m in mp.MODES}
    s = mp.capture_summary(paths)
    assert (s["steps"] == 3).all()
    from gpuprof.nsys import sqlite as ns

    for path in paths.values():  # --capture-range=nvtx on measured_steps: no warm-up, no FP32 reference backward
        texts = set(ns.nvtx_ranges(path)["text"])
        assert "measured_steps" in texts and not any(t.startswith("warmup") for t in texts)
    shares = s[["tensor_core_share", "other_matmul_share", "cast_share", "rest_share"]].sum(axis=1)
    assert shares.round(9).eq(1).all()  # the four shares split all kernel time
    assert s.loc["fp32", "casts_per_step"] == 0
    # FP32's matrix products run on the CUDA cores; its attention (PyTorch's memory-efficient kernel, sm80 build)
    # is 3xTF32 on tensor cores, in fp32 and tf32 modes alike
    work = mp.matmul_work(paths)
    assert work.loc["fp32", "matmul_tensor_core_ms"] == 0 and work.loc["fp32", "matmul_ms"] > 0
    assert (work.loc[["fp32", "tf32"], "attention_tensor_core_ms"] == work.loc[["fp32", "tf32"], "attention_ms"]).all()
    assert 0 < s.loc["fp32", "tensor_core_share"] < 0.1
    assert work.loc["fp32", "matmul_ms"] / work.loc["bf16", "matmul_ms"] > 2 * work.loc["fp32", "gpu_ms"] / work.loc["bf16", "gpu_ms"]
    ph = mp.phase_work(paths)
    assert (ph.groupby(level="mode")["kernels"].sum() - s["kernels_per_step"]).abs().max() <= 1
    assert ph.loc[("bf16", "forward"), "cpu_ms"] > 2 * ph.loc[("bf16", "forward"), "gpu_ms"]  # host-bound at batch 32
    assert ph.loc[("fp32", "forward"), "casts"] == 0 and ph.loc[("bf16", "forward"), "casts"] > 0
    assert s.loc["bf16", "casts_per_step"] > 0 and s.loc["bf16", "gpu_ms_per_step"] < 0.5 * s.loc["fp32", "gpu_ms_per_step"]
    casts = mp.cast_kernels(paths)  # the cast pattern's kernels, by family: together exactly the phase table's casts
    assert (casts.drop(columns="not_in_CAST").sum(axis=1) - ph.loc[casts.index, "casts"]).abs().max() == 0
    assert ph.loc[ph["casts"] > 0].index.isin(casts.index).all()
    assert casts.loc[("bf16", "backward"), "LoadWithCast"] == 0 < casts.loc[("bf16", "forward"), "LoadWithCast"]
    # each post-LN layer's two mixed-type residual additions: the feed-forward one is LoadWithCast (counted), the
    # attention one (a transposed operand) runs on the general path, which the pattern misses; FP32 and TF32 have
    # no conversion of either kind, and the forward's one direct_copy is autocast's cast for nll_loss
    for m in ("fp16", "bf16"):
        fwd = casts.loc[(m, "forward")]
        assert fwd["not_in_CAST"] == fwd["LoadWithCast"] == 12 and fwd["direct_copy"] == 1
        assert casts.loc[(m, "backward"), "not_in_CAST"] == 0
    assert not casts.index.get_level_values("mode").isin(["fp32", "tf32"]).any()
    w = mp.scaler_work(paths)
    assert w["scaler_kernels_per_step"].gt(0).tolist() == [m == "fp16" for m in w.index]
    assert "cudaStreamSynchronize" in w.loc["fp16", "calls"]
    # one device-to-host copy and one stream sync wait; the scaler's two 4-byte device-to-device copies do not
    assert w.loc["fp16", "waiting_calls_per_step"] == 2
    g = mp.gemm_kernels(paths)
    assert set(g["mode"]) == set(mp.MODES) and (g.groupby("mode").size() <= 3).all()


def test_host_description_reads_a_machine_record():
    from gpuprof.backend import host_description

    assert host_description({"cpu_model": "X", "cpu_count": 8, "cpu_mhz": 2100.0, "virtual_machine": True}) == \
        "X, 8 logical cores at 2.10 GHz, a virtual machine"
    assert "clock not recorded" in host_description({"cpu_model": "X", "cpu_count": 8})


def test_census_by_group_splits_where_the_devices_differ(tmp_path):
    """artifacts/ch10/gpu_census.json against the CPU's record: per group, and the groups add up to each record's
    totals; a census of another model is refused, not compared."""
    import json

    from gpuprof.errors import GpuprofError

    t = mp.census_by_group()
    for device, path in (("gpu", mp.GPU_CENSUS), ("cpu", mp.CPU_CENSUS)):
        total = json.loads(path.read_text())["census"]
        assert t[f"below_{device}"].sum() == total["below_fp16_subnormal"]
        assert t[f"nonzero_{device}"].sum() == total["nonzero"]
    assert (t["below_diff"] == t["below_gpu"] - t["below_cpu"]).all()
    other = json.loads(mp.GPU_CENSUS.read_text())
    other["config"]["layers"] += 1
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(GpuprofError, match="different models"):
        mp.census_by_group(tmp_path / "other.json")


def test_the_gpu_fp16_loss_split_is_the_training_runs_first_step():
    """artifacts/ch10/gpu_census.json's unscaled FP16 backward zeroed exactly what the training run's first
    fp16-noscaler step zeroed (artifacts/ch10/modes.json), and its ranges add up to it per group."""
    split = mp.fp16_loss_split()
    runs = json.loads((REPO_ROOT / "artifacts" / "ch10" / "modes.json").read_text())["runs"]
    lost = {r["underflowed_grad_elements"] for r in runs if r.get("mode") == "fp16-noscaler" and r.get("batch") == 32
            and r["kind"] == "time"}
    assert lost == {int(split.loc["total", "lost"])}
    assert (split["lost"] == split[["below_fp16_subnormal", "fp16_subnormal", "fp16_normal"]].sum(axis=1)).all()


def test_clock_processes_lists_every_timed_process_at_one_batch_with_both_powers_and_its_energy(data):
    clocked = _with_clocks(data)  # bf16, batch 128, round 1: 1500 MHz, 699 W from the counter, software power cap
    t = mp.clock_processes(clocked)
    timed = [r for r in data["runs"] if r["kind"] == "time" and r["batch"] == mp.LARGE_BATCH and r["mode"] in mp.MODES]
    assert len(t) == len(timed) and list(dict.fromkeys(t["mode"])) == list(mp.MODES)
    capped = t[t["sm_mhz"] == 1500]
    assert len(capped) == 1 and capped["mode"].iloc[0] == "bf16" and capped["reasons"].iloc[0] == "software power cap"
    # the power the tables use is the energy counter's; the readings' mean is kept beside it, not mixed in
    assert capped["power_w"].iloc[0] == 699 and capped["readings_w"].iloc[0] == 610
    assert capped["joules_per_step"].iloc[0] == pytest.approx(699 * capped["step_ms"].iloc[0] / 1e3)
    # the same process's step as timing_table's input: each process's median measured step
    run = next(r for r in clocked["runs"] if r["kind"] == "time" and (r["mode"], r["batch"], r["round"]) == ("bf16", 128, 1))
    assert capped["step_ms"].iloc[0] == mp._measured(run, "step_ms")
    # without clocks: the rows are there, their readings empty and said to be so
    old = mp.clock_processes(data)
    assert len(old) == len(timed) and (old["reasons"] == "not recorded").all() and old["joules_per_step"].isna().all()


def test_cures_plan_interleaves_every_variant_and_the_script_takes_their_flags():
    plan = mp.cures_plan(rounds=2)
    assert len(plan) == 2 * 2 * 2 * len(mp.CURES)  # rounds x modes x batches x variants
    first = [(r["batch"], r["mode"], r["cure"]) for r in plan if r["round"] == 0]
    second = [(r["batch"], r["mode"], r["cure"]) for r in plan if r["round"] == 1]
    assert second == first[::-1]
    from gpuprof.runner import load_script

    script = load_script(mp.SCRIPT)
    for run in plan:  # every variant's command line parses as the script's own
        argv = mp._argv(run, "run.json", mp.BUDGET_GIB)
        args = script.parse_args(argv)
        assert (args.optimizer == "fused") == ("fused" in run["cure"]) and args.compile == run["cure"].startswith("compiled")


def test_cures_table_sets_each_variant_beside_the_chapters_step(data):
    fake = copy.deepcopy(data)
    timed = [r for r in fake["runs"] if r["kind"] == "time" and r["mode"] in ("fp16", "bf16")]
    runs = []
    for cure, factor in zip(mp.CURES, (1.0, 0.8, 0.5)):  # each variant's steps a fixed share of the chapter's
        for r in timed:
            steps = [{**s, "step_ms": s["step_ms"] * factor} for s in r["steps"]]
            runs.append({**r, "cure": cure, "steps": steps})
    t = mp.cures_table({"runs": runs}).set_index(["batch", "mode", "cure"])
    assert list(dict.fromkeys(t.index.get_level_values("cure"))) == list(mp.CURES)
    for (batch, mode, cure), row in t.iterrows():
        factor = {c: f for c, f in zip(mp.CURES, (1.0, 0.8, 0.5))}[cure]
        assert row["speedup"] == pytest.approx(1 / factor)
        assert row["speedup_low"] <= row["speedup"] + 1e-12 and row["processes"] == 3


@pytest.mark.slow
def test_the_cures_change_no_loss_on_the_cpu(mode_runs, tmp_path):
    """The fused optimizer and the compiled model train the same weights from the same batch: on the CPU, each
    step's loss as the chapter's own step gives it (bf16 autocast; the compiled run also tests that Module.compile
    after the FP32 reference pass leaves the reference and the first step alone)."""
    runs = {cure: ["--mode", "bf16", *TINY, *flags] for cure, flags in mp.CURES.items() if flags}
    out = forked_json_runs(SCRIPT, runs, tmp_path, timeout_s=600)
    plain = [s["loss"] for s in mode_runs["bf16"].result["steps"]]
    for cure, run in out.items():
        assert run.status == "0", run.output
        assert run.result["config"]["optimizer"] == "fused"
        assert [s["loss"] for s in run.result["steps"]] == pytest.approx(plain, rel=1e-3), cure


def test_the_cures_record_from_an_h100():
    """artifacts/ch10/cures.json (an H100, two interleaved rounds): every variant ran in both rounds; fused AdamW shortens
    AdamW's own phase in every mode and batch (one pass over the parameters, no host sync in the scaler's step), and
    compiling the model with it makes the whole step faster than the chapter's even in the least favourable pairing."""
    data = json.loads((REPO_ROOT / "artifacts" / "ch10" / "cures.json").read_text())
    t = mp.cures_table(data).set_index(["batch", "mode", "cure"])
    assert (t["processes"] == 2).all() and len(t) == 12
    chapter, fused, both = list(mp.CURES)
    for batch, mode in {(b, m) for b, m, _ in t.index}:
        assert t.loc[(batch, mode, fused), "optimizer_ms"] < 0.7 * t.loc[(batch, mode, chapter), "optimizer_ms"]
        assert t.loc[(batch, mode, both), "speedup_low"] > 1.3


def test_cures_loss_agreement_pairs_runs_of_one_round():
    """Each cure's loss, step by step, against the chapter's step of the same round: on the H100 record every cure stays
    within the chapter's 1% tolerance at every step; a run whose last loss is moved 5% is caught."""
    data = json.loads((REPO_ROOT / "artifacts" / "ch10" / "cures.json").read_text())
    agree = mp.cures_loss_agreement(data)
    assert len(agree) == 12 and (agree["rel_diff_max"] < 0.01).all()
    assert (agree.loc[agree["cure"] == next(iter(mp.CURES)), "rel_diff_max"] == 0).all()
    moved = copy.deepcopy(data)
    run = next(r for r in moved["runs"] if r["kind"] == "time" and r["cure"] == "fused AdamW" and r["round"] == 1)
    run["steps"][-1]["loss"] *= 1.05
    worst = mp.cures_loss_agreement(moved).set_index(["batch", "mode", "cure"]).loc[(run["batch"], run["mode"], "fused AdamW")]
    assert 0.049 < worst["rel_diff_max"] < 0.051
