"""The matmul ladder's shape sweep (issue 39): the driver's plan, NVML's window summaries, and the study's
table and figure, on a synthetic sweep and on the first H100 run of rungs 9-10 (tests/data/matmul_ladder_run1)."""

from __future__ import annotations

import copy
import gzip
import shutil
import subprocess
import sys

import pytest

from gpuprof.artifacts import REPO_ROOT
from gpuprof.ncu.report import ncu_report_available
from gpuprof.nvml import (Nvml, Sample, Sampler, describe_window, open_sampler, summarise, torch_pci_bus_id,
                          torch_sampler, window_power_w)
from gpuprof.runner import load_script
from gpuprof.studies import matmul_sweep as ms
from helpers import FakeNvml

RUN1 = REPO_ROOT / "tests" / "data" / "matmul_ladder_run1"
SWEEP = REPO_ROOT / "examples" / "nsight_compute" / "matmul_ladder_sweep.py"
LADDER = REPO_ROOT / "examples" / "nsight_compute" / "matmul_ladder.py"


def _result(name, rate, rung=None, clock=None, power=None, reasons="0x0000000000000000"):
    extra = {} if rung is None else {"rung": rung}
    if clock is not None:
        extra["nvml"] = {"sm_mhz_median": clock, "sm_mhz_min": clock - 30, "power_w_energy": power,
                         "power_w_mean": None, "event_reasons": reasons,
                         "event_reasons_words": "software power cap" if reasons.endswith("4") else "none"}
    return {"name": name, "label": name, "rate": rate, "median_ms": 1000 / rate, "extra": extra}


@pytest.fixture
def sweep():
    """Two shapes, three processes each; in process 2 of the first shape rung 10 is slow and power-capped."""
    runs = []
    for shape, size, base in (("4096^3", [4096] * 3, 700.0), ("MLP up", [8192, 11008, 4096], 760.0)):
        for p in range(3):
            slow = shape == "4096^3" and p == 1
            runs.append({"shape": shape, "process": p, "size": size, "results": [
                _result("ladder_9_persistent", base * 0.95, 9, 1980, 600),
                _result("ladder_10_cluster_multicast", base * (0.80 if slow else 0.97), 10, 1755 if slow else 1980, 700,
                        "0x0000000000000004" if slow else "0x0000000000000000"),
                _result(ms.REFERENCE, base, None, 1980, 650),
                _result(ms.TORCH, base * 1.02, None, 1980, 640)]})
    return {"shapes": [{"name": "4096^3", "size": [4096] * 3}, {"name": "MLP up", "size": [8192, 11008, 4096]}],
            "processes": 3, "runs": runs}


def test_the_table_takes_shares_within_a_process_and_keeps_the_least_favourable(sweep):
    t = ms.sweep_table(sweep).set_index(["shape", "name"])
    row = t.loc[("4096^3", "ladder_10_cluster_multicast")]
    assert row["processes"] == 3
    assert row["of_cublas"] == pytest.approx(0.97) and row["of_cublas_low"] == pytest.approx(0.80)
    assert row["of_torch_low"] == pytest.approx(0.80 / 1.02)
    assert row["sm_mhz_low"] == pytest.approx(1755 - 30)
    assert row["event_reasons"] == "software power cap"
    # per cycle: the rate over the clock read during that kernel's own runs (the median process)
    assert row["flop_per_cycle"] == pytest.approx(700 * 0.97 * 1e12 / 1980e6)
    assert row["flop_per_cycle_low"] == pytest.approx(700 * 0.80 * 1e12 / 1755e6)
    assert t.loc[("MLP up", "ladder_9_persistent"), "event_reasons"] == "none"
    assert list(dict.fromkeys(t.reset_index()["shape"])) == ["4096^3", "MLP up"]


def test_the_share_table_and_the_target(sweep):
    t = ms.sweep_table(sweep)
    shares = ms.share_table(t)
    assert list(shares.index) == ["4096^3", "MLP up"]
    assert list(shares.columns) == ["rung 9", "rung 10", "torch.matmul BF16"]
    assert shares.loc["4096^3", "rung 10"] == pytest.approx(0.80)
    best = ms.best_rungs(t)
    assert list(best["rung"]) == [10, 10] and best["meets_target"].tolist() == [False, True]
    worse = copy.deepcopy(sweep)
    for run in worse["runs"]:
        for r in run["results"]:
            if r["name"] == "ladder_10_cluster_multicast" and run["shape"] == "MLP up" and run["process"] == 2:
                r["rate"] *= 0.9
    assert ms.best_rungs(ms.sweep_table(worse))["meets_target"].tolist() == [False, False]


def test_the_figure_draws_every_rung_and_the_clocks(sweep):
    import matplotlib

    matplotlib.use("Agg")
    fig = ms.figure(ms.sweep_table(sweep), "H100 (test)")
    ax, bx = fig.axes[:2]
    assert len(ax.patches) == 2 * 2  # two rungs x two shapes
    assert "cuBLAS" in ax.get_ylabel() and "MHz" in bx.get_ylabel()


@pytest.fixture(scope="module")
def run1():
    return ms.from_ladder_runs(sorted(RUN1.glob("l_*.json")))


def test_the_first_h100_run_reads_as_a_sweep(run1):
    assert [s["name"] for s in run1["shapes"]] == ["4096^3", "8192^3", "16384^3", "MLP up"]
    t = ms.sweep_table(run1).set_index(["shape", "name"])
    # rung 9 against cuBLAS's same product, as that run printed it: 747.6 / 732.1 TFLOP/s at 8192^3
    assert t.loc[("8192^3", "ladder_9_persistent"), "of_cublas_low"] == pytest.approx(747.5846554 / 732.0707088)
    # rung 10 as first run: slower than rung 8 at every shape (the defect this fixture documents)
    for shape in ("4096^3", "8192^3", "16384^3", "MLP up"):
        assert t.loc[(shape, "ladder_10_cluster_multicast"), "tflops"] < t.loc[(shape, "ladder_8_wgmma_overlap"), "tflops"]
    best = ms.best_rungs(ms.sweep_table(run1))
    assert set(best["rung"]) == {9} and best.loc["MLP up", "of_cublas_low"] == pytest.approx(0.9287, abs=1e-4)
    assert ms.sweep_table(run1)["sm_mhz"].isna().all()  # that run read no clocks per kernel


def test_cluster_arrives_at_8192():
    # 64 x 32 tiles, 128 slices of K, 2 consumer warpgroups, 2 barriers each (own block's and partner's)
    assert ms.cluster_arrives(8192, 8192, 8192) == 2048 * 128 * 2 * 2 == 1_048_576
    assert ms.cluster_arrives(8192, 8192, 8192, cluster=1) == 1_048_576 // 2  # rung 9: only its own barrier


@pytest.mark.skipif(not ncu_report_available(), reason="ncu_report is not available here")
def test_rung_10s_extra_l2_requests_per_arrive_in_the_first_report(tmp_path):
    report = tmp_path / "r8910_8192.ncu-rep"
    with gzip.open(RUN1 / "r8910_8192.ncu-rep.gz") as f, report.open("wb") as g:
        shutil.copyfileobj(f, g)
    s = ms.l2_request_sources(report)
    r9, r10 = s.loc["ladder_9_persistent"], s.loc["ladder_10_cluster_multicast"]
    arrives = ms.cluster_arrives(8192, 8192, 8192)
    # about 80 more one-sector requests per arrive (the H100 has 80 L2 slices), from each of two sources
    assert 70 < (r10["other_requests_M"] - r9["other_requests_M"]) * 1e6 / arrives < 90
    assert 70 < (r10["fabric_requests_M"] - r9["fabric_requests_M"]) * 1e6 / arrives < 95
    assert r10["other_sectors_M"] / r10["other_requests_M"] < 1.1
    assert r9["other_requests_M"] < 1 and r10["tensor_pipe_pct"] < 50 < 90 < r9["tensor_pipe_pct"]
    assert r10["ms"] > 2 * r9["ms"]
    assert (ms.l2_instances(report) == 80).all()


@pytest.mark.skipif(not ncu_report_available(), reason="ncu_report is not available here")
def test_l2_instances_are_the_counters_slices_not_the_device_attribute():
    # the second H100's report says 96 L2 slices (12 FBPs x 8), but its lts__ counters add up over 80
    from gpuprof.ncu import report as nr
    report = REPO_ROOT / "artifacts" / "ch11" / "rung10_first_8192.ncu-rep.gz"
    assert nr.metric_table(report, ["device__attribute_l2s_count"])["device__attribute_l2s_count"].iloc[0] == 96
    assert ms.l2_instances(report).to_dict() == {"ladder_10_release_cluster": 80.0}


def test_nvml_windows_summarise_only_their_own_readings():
    samples = [Sample(t=i * 0.1, sm_mhz=1980 if i < 5 else 1500, power_w=300.0, energy_j=100.0 + 50 * i * 0.1,
                      reasons=0 if i < 5 else 4, temp_c=60 + i) for i in range(10)]
    first = summarise(samples, 0.0, 0.45)
    assert first["samples"] == 5 and first["sm_mhz_median"] == 1980 and first["event_reasons_words"] == "none"
    assert first["power_w_energy"] == pytest.approx(50.0) and first["power_w_median"] == 300.0
    late = summarise(samples, 0.5, 1.0)
    assert late["sm_mhz_min"] == 1500 and late["event_reasons"] == "0x0000000000000004"
    assert late["event_reasons_words"] == "software power cap" and late["temp_c_max"] == 69
    assert summarise(samples, 5, 6)["sm_mhz_median"] is None


def test_nvml_reads_through_the_c_calls_and_says_why_when_it_cannot():
    nvml, why = Nvml.open(pci_bus_id="0000:05:00.0", lib=FakeNvml())
    assert nvml is not None and why == "NVML, GPU 0000:05:00.0"
    s = nvml.read()
    assert (s.sm_mhz, s.power_w, s.reasons, s.temp_c) == (1755, 612.5, 4, None) and s.energy_j == pytest.approx(1.007)
    assert nvml.mem_mhz() == 2619  # the memory clock, asked as its own clock type (2), not the SM's (1)
    missing, why = Nvml.open(pci_bus_id="0000:99:00.0", lib=FakeNvml())
    assert missing is None and "no GPU 0000:99:00.0" in why
    with Sampler(nvml, period_s=0.001) as sampler:
        while len(sampler.samples) < 3:
            pass
    assert sampler.summary(0, float("inf"))["sm_mhz_median"] == 1755
    assert nvml.power_limit_w() == 700.0


def test_open_sampler_reads_the_limit_and_a_window_reads_as_one_line():
    sampler, limit, how = open_sampler("0000:05:00.0", period_s=0.001, lib=FakeNvml())
    try:
        while len(sampler.samples) < 3:
            pass
    finally:
        sampler.__exit__(None, None, None)
    assert limit == 700.0 and how.startswith("NVML, GPU 0000:05:00.0") and "every 1 ms" in how
    nv = {**sampler.summary(0, float("inf")), "power_limit_w": limit}
    assert nv["power_w_median"] == 612.5 and window_power_w(nv) == nv["power_w_energy"]
    line = describe_window(nv)
    assert line.startswith("SM clock 1755 MHz (lowest 1755), ") and "W of a 700 W limit" in line
    assert "clock-event reasons: software power cap" in line
    assert window_power_w({"power_w_energy": None, "power_w_median": 500.0}) == 500.0
    assert describe_window({"sm_mhz_median": None, "samples": 0}).startswith("no SM clock")
    missing, limit, why = open_sampler("0000:99:00.0", lib=FakeNvml())
    assert missing is None and limit is None and "no GPU 0000:99:00.0" in why


def test_the_pci_bus_id_is_written_as_cuda_writes_it():
    from types import SimpleNamespace

    props = SimpleNamespace(pci_bus_id=0x3B, pci_device_id=0, pci_domain_id=0)
    fake = SimpleNamespace(cuda=SimpleNamespace(get_device_properties=lambda i: props))
    assert torch_pci_bus_id(fake) == "0000:3b:00.0"
    older = SimpleNamespace(cuda=SimpleNamespace(get_device_properties=lambda i: SimpleNamespace()))
    assert torch_pci_bus_id(older) is None
    assert torch_sampler(fake, gpu=False) == (None, None, "on the CPU: no SM clock or power to read")
    assert torch_sampler(fake, gpu=True, enabled=False) == (None, None, "--no-clocks")


def test_the_sweep_plan_goes_round_the_shapes_and_fits_one_device_call():
    sw = load_script(SWEEP)
    runs = sw.plan(sw.SHAPES, sw.RUNGS, 3, sw.MIN_TIME_S)
    assert len(runs) == 3 * len(sw.SHAPES) == 24
    assert [r["process"] for r in runs[:8]] == [0] * 8 and runs[8]["shape"] == runs[0]["shape"]
    assert [r["check"] for r in runs].count(True) == 1 and runs[0]["check"]
    total = sum(r["estimate_s"] for r in runs)
    assert 240 < total < 480  # under the 9 minutes of one device call, with room
    # the LLM shapes are Llama 2 7B's, as C = A W^T: (tokens, out features, in features)
    sizes = {name: size for name, size, _ in sw.SHAPES}
    assert sizes["MLP up"] == (8192, 11008, 4096) and sizes["MLP down"] == (8192, 4096, 11008)
    assert sizes["attention out"] == (8192, 4096, 4096)


def test_the_sweep_script_plans_refuses_bad_input_and_says_when_nothing_ran(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, str(SWEEP), *args], capture_output=True, text=True, timeout=120)

    plan = run("--plan", "--shapes", "8192^3,MLP up", "--processes", "2")
    assert plan.returncode == 0 and plan.stdout.count("process ") == 4 and "estimated" in plan.stdout
    assert run("--shapes", "9999^3", "--plan").returncode == 2
    assert run("--plan", "--min-time-s", "-1").returncode == 2
    assert run("--shapes", "2048^3").returncode == 2  # no --json
    out = tmp_path / "sweep.json"
    cpu = subprocess.run([sys.executable, str(SWEEP), "--shapes", "2048^3", "--processes", "1", "--json", str(out)],
                         capture_output=True, text=True, timeout=120, env={**__import__("os").environ,
                                                                           "GPUPROF_BACKEND": "cpu"})
    assert cpu.returncode == 3 and "nothing ran" in cpu.stdout and not out.exists()


def test_the_ladders_new_options():
    ml = load_script(LADDER)
    assert ml.repeats_for(0.002, 0.5, 10) == 250 and ml.repeats_for(0.2, 0.5, 10) == 10
    assert ml.repeats_for(1e-9, 60, 10) == ml.MAX_REPEATS and ml.repeats_for(0.002, 0, 7) == 7
    args = ml.parse_args(["--rung", "9,10", "--arrive-scope", "cluster", "--clocks", "--min-time-s", "0.5"])
    assert args.arrive_scope == "cluster" and args.clocks and args.min_time_s == 0.5
    assert ml.RUNG10_RELEASE_CLUSTER.kernel == "ladder_10_release_cluster"
    assert ml.RUNG10_RELEASE_CLUSTER.cluster == ml.RUNGS[10].cluster == 2
    for bad in (["--min-time-s", "-1"], ["--min-time-s", "nan"], ["--arrive-scope", "gpu"]):
        with pytest.raises(SystemExit):
            ml.parse_args(bad)


@pytest.mark.skipif(not shutil.which("nvcc"), reason="nvcc is not installed here")
def test_rung_10_arrives_at_cta_scope_and_its_first_version_at_cluster_scope(tmp_path):
    """The fix, in the PTX: ladder_10_cluster_multicast sends its cross-block arrivals with mbarrier.arrive's
    default (release at CTA scope), ladder_10_release_cluster (rung 10 as first run) with release.cluster."""
    ptx = tmp_path / "ladder.ptx"
    proc = subprocess.run(["nvcc", "-ptx", "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "-o", str(ptx),
                           str(REPO_ROOT / "examples" / "nsight_compute" / "matmul_ladder.cu")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    entries = {}
    for chunk in ptx.read_text().split(".entry ")[1:]:
        entries[chunk.split("(", 1)[0].strip()] = chunk
    fixed, first = entries["ladder_10_cluster_multicast"], entries["ladder_10_release_cluster"]
    assert "mbarrier.arrive.shared::cluster.b64" in fixed and "arrive.release.cluster" not in fixed
    assert "mbarrier.arrive.release.cluster.shared::cluster.b64" in first
    assert "mbarrier.arrive.shared::cluster.b64" not in first
    assert "mbarrier.arrive" in entries["ladder_9_persistent"]
    assert "mbarrier.arrive.shared::cluster" not in entries["ladder_9_persistent"]


def test_min_time_raises_the_repeats_of_one_kernel_only_as_far_as_its_probe_allows():
    import argparse
    import time

    import numpy as np

    from gpuprof import kernels as gk
    from gpuprof.backend import Backend

    ml = load_script(LADDER)
    slow = gk.Variant("slow", "slow", lambda: time.sleep(0.002), 1.0, unit="TFLOP/s")
    args = argparse.Namespace(repeats=3, warmup=0, min_time_s=0.05, clocks=False)
    [r] = ml.time_variants([slow], Backend("numpy", "cpu", np), args, None)
    # the probe took at least 2 ms, so at most 25 launches fill 50 ms; never fewer than --repeats
    assert 3 <= r.extra["repeats"] <= 25 and "nvml" not in r.extra
    args.min_time_s = 0
    [r] = ml.time_variants([slow], Backend("numpy", "cpu", np), args, None)
    assert r.extra["repeats"] == 3


def test_l2_instances_refuses_a_report_without_a_sum_and_avg_pair(monkeypatch):
    import pandas as pd

    def table(report, names, missing="raise"):  # every L2 counter's .avg absent, as in a report without them
        return pd.DataFrame({"kernel": ["k"], **{n: [float("nan") if n.endswith(".avg") else 1.0] for n in names}})

    monkeypatch.setattr(ms.nr, "metric_table", table)
    with pytest.raises(ValueError, match="no L2 counter with both .sum and .avg"):
        ms.l2_instances("r.ncu-rep")

    def counted(report, names, missing="raise"):
        return pd.DataFrame({"kernel": ["k"], names[0]: [800.0], names[1]: [10.0]})

    monkeypatch.setattr(ms.nr, "metric_table", counted)
    assert ms.l2_instances("r.ncu-rep").to_dict() == {"k": 80.0}


def test_tiles_from_names_and_the_work_a_tile_does_past_the_edge():
    ladder = load_script(LADDER)
    assert all(ladder.RUNGS[r].tile == ms.LADDER_TILE for r in (7, 8, 9, 10))
    assert ms.tile_of("ladder_9_persistent") == (128, 256) and ms.tile_of("ladder_3_regtile") is None
    assert ms.tile_of("nvjet_sm90_tss_192x192_64x4_2x1_v_bz_coopB_TNN") == (192, 192)
    assert ms.tile_of("sm90_xmma_gemm_bf16f32_128x256x64_warpgroup") == (128, 256)
    assert ms.tile_of("elementwise_kernel") is None
    assert ms.padded_work(16384, 16384, (128, 256)) == 1.0
    assert ms.padded_work(16384, 16384, (192, 192)) == (16512 / 16384) ** 2  # 86 tiles of 192 cover 16,512
    assert ms.padded_work(100, 10, (64, 10)) == 1.28


@pytest.mark.skipif(not ncu_report_available(), reason="ncu_report is not available here")
def test_against_cublas_at_16384_counts_cublas_tiles_past_the_edge():
    report = REPO_ROOT / "artifacts" / "ch11" / "rungs9_10_cublas_16384.ncu-rep.gz"
    t = ms.against_cublas(report, 16384, 16384, 16384)
    assert list(t["kernel"].str[:11]) == ["nvjet_sm90_", "ladder_9_pe", "ladder_10_c", "nvjet_sm90_", "nvjet_sm90_"]
    # the counted tensor work is what the tiles predict: exactly the product for 128 x 256, 1.57% more for 192 x 192
    assert (abs(t["tensor_over_product"] - t["padded"]) < 1e-6).all()
    assert t.loc[1, "tensor_over_product"] == 1.0 and t.loc[3, "tensor_over_product"] > 1.015
    assert t.loc[1, "cycles_M"] < t.loc[3, "cycles_M"] and (t["tensor_pipe_pct"] > 97).all()
    assert 0.94 < t["product_per_cycle"].min() and t["product_per_cycle"].max() < 0.96
    assert (t["grid"] == 132).all() and list(t["cluster"]) == [2, 1, 2, 2, 2]


@pytest.mark.skipif(not ncu_report_available(), reason="ncu_report is not available here")
def test_against_cublas_split_is_an_identity_and_the_clock_moved_under_ncu():
    report = REPO_ROOT / "artifacts" / "ch11" / "rungs9_10_cublas_16384.ncu-rep.gz"
    t = ms.against_cublas(report, 16384, 16384, 16384)
    split = t["active"] * t["tensor_pipe_pct"] / 100
    assert (abs(split - t["product_per_cycle"] * t["tensor_over_product"]) < 1e-6).all()
    # every launch below the H100's 1.59 GHz base, and cuBLAS's two launches 3% apart in time at equal cycles
    assert (t["ghz"] < 1.55).all() and t.loc[0, "ms"] / t.loc[3, "ms"] > 1.03


@pytest.mark.skipif(not ncu_report_available(), reason="ncu_report is not available here")
def test_against_cublas_sm_count_matches_ncus_elapsed_busy_share():
    from gpuprof.ncu import report as nr
    report = REPO_ROOT / "artifacts" / "ch11" / "rungs9_10_cublas_16384.ncu-rep.gz"
    t = ms.against_cublas(report, 16384, 16384, 16384)
    elapsed = nr.metric_table(report, ["sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed"]).iloc[:, 1]
    assert (abs(t["active_sm"] * t["tensor_pipe_pct"] - elapsed.to_numpy()) < 1e-3).all()
    assert abs(1 - t.loc[1, "sm_cycles_M"] / t.loc[1, "cycles_M"]) > 0.005  # rung 9's two counts disagree
