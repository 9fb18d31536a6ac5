"""``python -m gpuprof report`` / ``diff``: captures recognised by content, numbers equal to the tools' own,
clear errors for wrong inputs, one self-contained HTML page."""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpuprof.artifacts import REPO_ROOT
from gpuprof.ncu import csv_reader
from gpuprof.nsys import sqlite as ns
from gpuprof.nsys import stats as st
from gpuprof.report import build_diff, build_pages, capture_kind
from gpuprof.report.activity_view import idle_by_cause, load
from gpuprof.report.detect import NotACapture, captures_in
from gpuprof.report.render import html_page, terminal_text
from gpuprof.torch_profiler import key_averages as tk

ART = REPO_ROOT / "artifacts"
CH01, CH04, CH05, CH06 = ART / "ch01", ART / "ch04", ART / "ch05", ART / "ch06"
THIRD = REPO_ROOT / "tests" / "data" / "third_party"


def run_cli(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuprof", *args], capture_output=True, text=True, cwd=cwd, timeout=300)


# ---- recognised by content --------------------------------------------------------------------------

@pytest.mark.parametrize("source,kind", [
    (CH06 / "rung0.sqlite.gz", "nsys"), (CH04 / "ladder.ncu-rep", "ncu"), (CH04 / "ladder.details.csv", "ncu-csv"),
    (CH05 / "train_steps.json.gz", "kineto"), (THIRD / "hta_minitoy_mi250.json.gz", "kineto"),
])
def test_a_capture_is_recognised_by_its_content_not_its_name(tmp_path, source, kind):
    assert capture_kind(source) == kind
    renamed = tmp_path / "capture.txt"
    shutil.copy(source, renamed)
    assert capture_kind(renamed) == kind


def test_an_nsys_report_is_known_by_its_first_bytes(tmp_path):
    p = tmp_path / "report.data"
    p.write_bytes(b"NVIDIA Tegra Profiler Report 363\x00\x01" + bytes(64))
    assert capture_kind(p) == "nsys-rep"


def test_an_nsys_report_without_nsys_says_how_to_export_it(tmp_path, monkeypatch):
    monkeypatch.setenv("NSYS", str(tmp_path / "no-nsys-here"))
    monkeypatch.setenv("PATH", str(tmp_path))
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"NVIDIA Tegra Profiler Report 363\x00\x01" + bytes(64))
    r = subprocess.run([sys.executable, "-m", "gpuprof", "report", str(rep)], capture_output=True, text=True,
                       cwd=REPO_ROOT, timeout=120, env={**__import__("os").environ})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "nsys export --type sqlite" in r.stderr


def test_a_plain_json_trace_and_the_bare_event_list_are_kineto(tmp_path):
    plain = tmp_path / "t.json"
    plain.write_bytes(gzip.decompress((CH05 / "train_steps.json.gz").read_bytes()))
    assert capture_kind(plain) == "kineto"
    (tmp_path / "list.json").write_text('[{"ph": "X", "name": "a", "ts": 0, "dur": 1, "pid": 1, "tid": 1}]')
    assert capture_kind(tmp_path / "list.json") == "kineto"


@pytest.mark.parametrize("content,said", [
    (b"", "empty"),
    (b'{"backend": "nccl", "iterations": 3}', "JSON but not a PyTorch profiler trace"),
    (b"\x80\x04\x95 pickle", "pickle"),
    (b"PK\x03\x04zip", "zip"),
    (b"<html><body>hi</body></html>", "HTML"),
    (b"a,b,c\n1,2,3\n", "CSV, but not ncu's"),
    (b"==PROF== Connected to process 1\n==PROF== Disconnected\n", "no CSV table"),
    (b"\x00\x01\x02binary", "binary"),
])
def test_a_file_of_another_kind_is_named_in_one_sentence(tmp_path, content, said):
    p = tmp_path / "x.dat"
    p.write_bytes(content)
    with pytest.raises(NotACapture, match=said):
        capture_kind(p)


def test_a_truncated_gzip_trace_is_said_to_be_truncated(tmp_path):
    p = tmp_path / "t.json.gz"
    p.write_bytes((CH05 / "train_steps.json.gz").read_bytes()[:2000])
    with pytest.raises(NotACapture, match="damaged or truncated gzip"):
        capture_kind(p)


def test_a_folder_is_read_for_its_captures_and_refused_when_it_has_none(tmp_path):
    found = dict((p.name, k) for p, k in captures_in(ART / "ch08"))
    assert found == {"buckets_rank0.sqlite.gz": "nsys", "buckets_rank1.sqlite.gz": "nsys",
                     "buckets_bf16_rank0.sqlite.gz": "nsys", "buckets_bf16_rank1.sqlite.gz": "nsys",
                     "ddp_trace_rank0.json.gz": "kineto", "ddp_trace_rank1.json.gz": "kineto",
                     "straggler.sqlite.gz": "nsys"}  # its JSON results are skipped
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(NotACapture, match="holds no capture the report reads: 1 file"):
        captures_in(tmp_path)


# ---- numbers equal to the tools' own ------------------------------------------------------------------

@pytest.fixture(scope="module")
def transfer_page():
    return build_pages([CH01 / "transfer.sqlite"])[0]


@pytest.mark.parametrize("heading,report,key", [
    ("Top kernels", "cuda_gpu_kern_sum", "Name"),
    ("NVTX ranges", "nvtx_sum", "Range"),
    ("Copies and memsets", "cuda_gpu_mem_time_sum", "Operation"),
    ("CUDA API calls", "cuda_api_sum", "Name"),
])
def test_the_nsys_page_equals_what_nsys_stats_wrote(transfer_page, heading, report, key):
    theirs = pd.read_csv(CH01 / f"transfer_{report}.csv")
    assert "nsys stats" in st.compare_summaries(transfer_page.table(heading), theirs, key)


def test_the_nsys_page_fails_when_nsys_stats_says_otherwise(transfer_page):
    theirs = pd.read_csv(CH01 / "transfer_cuda_gpu_kern_sum.csv")
    theirs.loc[0, "Instances"] += 1
    with pytest.raises(AssertionError, match="Instances differs"):
        st.compare_summaries(transfer_page.table("Top kernels"), theirs, "Name")


@pytest.mark.parametrize("name", ["train_steps", "small_steps"])
def test_the_kineto_page_equals_key_averages(name):
    page = build_pages([CH05 / f"{name}.json.gz"])[0]
    records = tk.load_records(CH05 / f"{name}.key_averages.json").set_index("key")
    kern = page.table("Top kernels").set_index("Name")
    both = kern.join(records[["count", "self_device_us"]], how="inner")
    assert len(both) == len(kern) > 10
    assert (both["Instances"] == both["count"]).all()
    assert np.allclose(both["Total Time (ns)"] / 1e3, both["self_device_us"], atol=0.002)
    ops = page.table("Operators (CPU)").set_index("key").join(records[["count"]], how="inner")
    assert len(ops) > 50 and (ops["calls"] == ops["count"]).all()


@pytest.mark.parametrize("name", ["ladder", "occupancy", "divergence", "gemm_stalls", "spills"])
def test_the_ncu_page_of_a_report_equals_ncus_own_csv(name):
    """The .ncu-rep's page and the page of `ncu --import R --csv --page details` (exported from the same
    report) agree to the CSV's printed precision: the report holds the values, the CSV prints them rounded."""
    rep = build_pages([CH04 / f"{name}.ncu-rep"])[0].table("Speed of light (% of peak)")
    csv = build_pages([CH04 / f"{name}.details.csv"])[0].table("Speed of light (% of peak)")
    assert list(rep["kernel"]) == list(csv["kernel"]) and len(rep) >= 2
    for col in ("sm_pct", "memory_pct", "dram_pct", "l1_pct", "l2_pct"):
        assert np.allclose(rep[col], csv[col], atol=0.006, equal_nan=True), col
    assert np.allclose(rep["duration_us"], csv["duration_us"], rtol=0.005)  # "1.32 ms": three digits, half a unit
    # and the CSV page's numbers are the CSV's own
    details = csv_reader.read_details(CH04 / f"{name}.details.csv")
    sm = details[(details["Metric Name"] == "Compute (SM) Throughput")
                 & (details["Section Name"] == "GPU Speed Of Light Throughput")]["value"].to_numpy()
    assert np.allclose(csv["sm_pct"], sm)


def test_the_ncu_findings_are_ncus_rules_global_estimates_first_then_local():
    """NvRules' global and local speedups are shares of different totals: ranked apart, global first
    (ladder.ncu-rep has local 99.2% and 96.5% estimates that a single ranking put above a global 93.7%)."""
    page = build_pages([CH04 / "ladder.ncu-rep"])[0]
    f = page.table("Rule findings")
    assert set(f["type"]) <= {"OPT", "WRN"} and len(f) > 5
    order = f["speedup_type"].map({"global": 0, "local": 1}).fillna(2).to_numpy()
    assert (np.diff(order) >= 0).all() and {"global", "local"} <= set(f["speedup_type"])
    for _, g in f.groupby("speedup_type"):
        assert (np.diff(g["speedup_pct"].dropna().to_numpy()) <= 0).all()
    assert page.table("Bottleneck (ncu's SOLBottleneck rule)")["bottleneck"].str.contains("Start by analyzing").all()


# ---- steps, idle time, third-party traces ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["ch06/rung0.sqlite", "ch06/rung8.sqlite", "ch00/tiny_kernels.sqlite",
                                  "ch08/straggler.sqlite", "ch05/train_steps.json.gz"])
def test_idle_time_by_cause_adds_up_to_the_idle_time(name):
    """The rows sum to the headline's idle time: the gaps under 10 us have a row of their own."""
    from gpuprof import activity
    from gpuprof.report.activity_view import CAUSES, headline

    view = load(ART / name, capture_kind(ART / name))
    by = idle_by_cause(view)
    assert by["idle_ms"].sum() == pytest.approx(headline(view)["idle_ms"], abs=1e-9)
    assert by["share"].sum() == pytest.approx(1.0)
    assert set(by["cause"]) <= set(CAUSES.values())
    long_gaps = sum(activity.idle_gaps(view.work, view.runtime, window=seg)["duration_ns"].sum() for seg in view.segments)
    assert by.loc[by["cause"] != CAUSES["short"], "idle_ms"].sum() == pytest.approx(long_gaps / 1e6)


def test_a_loop_that_only_launches_is_launch_bound_and_a_loop_that_loads_data_is_host_code():
    """Chapter 0's tiny_kernels does nothing but launch 1,000 small kernels: most of its idle time is
    launch-bound. Its H100 capture of 2026-11-26 starts them 9.12 us apart, so at the default 10 us
    threshold most gaps are too short to get a cause; from 5 us up they are launch-bound. Chapter 6's
    naive loop decodes images on the main thread between steps: host code."""
    from gpuprof.report.activity_view import CAUSES

    view = load(ART / "ch00" / "tiny_kernels.sqlite", "nsys")
    assert idle_by_cause(view).set_index("cause")["share"].idxmax() == CAUSES["short"]
    tiny = idle_by_cause(view, min_gap_ns=5_000).set_index("cause")
    assert tiny["share"].idxmax() == CAUSES["paced"] and tiny.loc[CAUSES["paced"], "share"] > 0.8
    naive = idle_by_cause(load(CH06 / "rung0.sqlite", "nsys")).set_index("cause")
    assert naive["share"].idxmax() == CAUSES["host"] and naive.loc[CAUSES["host"], "share"] > 0.7


def _view(kernels, calls, steps=None):
    from gpuprof.report.activity_view import ActivityView

    k = pd.DataFrame(kernels, columns=["start", "end", "correlationId"]).assign(name="k", demangled="k", streamId=7,
                                                                                 deviceId=0)
    k["duration_ns"] = k["end"] - k["start"]
    rt = pd.DataFrame(calls, columns=["start", "end", "name", "correlationId"]).assign(globalTid=1)
    empty = k.iloc[0:0]
    v = ActivityView(path=Path("synthetic"), tool="nsys", kernels=k, copies=empty.assign(bytes=0.0), memsets=empty,
                     runtime=rt, ranges=pd.DataFrame(columns=["text", "start", "end", "globalTid"]))
    if steps is not None:
        v.steps = steps
    return v


def test_each_idle_cause_on_a_timeline_built_by_hand():
    """Launches every 10 us (the CPU's usual pace), kernels of 2 us, so 8 us gaps (short); then a 100 us gap
    whose kernel was launched 10 us after the launch before (launch-bound), a 201 us gap the CPU spent outside
    CUDA calls before launching (host code, and 1 us of launch call), a 50 us gap whose kernel had been
    launched before it began (already launched), and a 30 us gap mostly inside a synchronize call."""
    from gpuprof.report.activity_view import CAUSES

    us = 1_000
    kernels, calls = [], []
    for i in range(20):  # the steady part: launch at 10i us, kernel at 10i+1 .. 10i+3
        calls.append((10 * i * us, (10 * i + 1) * us, "cudaLaunchKernel", i))
        kernels.append(((10 * i + 1) * us, (10 * i + 3) * us, i))
    calls.append((200 * us, 292 * us, "cudaLaunchKernel", 20))    # issued at the usual pace, a long call
    kernels.append((293 * us, 295 * us, 20))                      # gap 193 .. 293: launch-bound
    calls.append((495 * us, 496 * us, "cudaLaunchKernel", 21))    # 295 us after the launch before
    kernels.append((496 * us, 498 * us, 21))                      # gap 295 .. 496: 200 host code + 1 launch call
    calls.append((496_200, 497 * us, "cudaLaunchKernel", 22))     # returned before the GPU went idle at 498
    kernels.append((548 * us, 550 * us, 22))                      # gap 498 .. 548: already launched
    calls.append((551 * us, 579 * us, "cudaStreamSynchronize", -1))
    calls.append((579 * us, 579_500, "cudaLaunchKernel", 23))     # 82.8 us after the launch before
    kernels.append((580 * us, 582 * us, 23))                      # gap 550 .. 580: 28 synchronize + 2 host code
    by = idle_by_cause(_view(kernels, calls)).set_index("cause")["idle_ms"] * 1e3  # in us
    expected = {CAUSES["short"]: 19 * 8, CAUSES["paced"]: 100, CAUSES["host"]: 202, CAUSES["launch"]: 1,
                CAUSES["queued"]: 50, CAUSES["sync"]: 28}
    assert by.to_dict() == pytest.approx(expected)
    assert by.sum() == pytest.approx(581 - 24 * 2)  # the window minus the kernels' 2 us each


def test_without_cuda_api_calls_the_cause_is_unknown_not_host_code():
    """Chapter 8's sweep was captured with -t nvtx only: no CUDA API calls, so nothing can say why the GPU waited."""
    from gpuprof.report.activity_view import CAUSES

    by = idle_by_cause(load(ART / "ch08" / "buckets_bf16_rank0.sqlite", "nsys"))
    assert set(by["cause"]) == {CAUSES["untraced"], CAUSES["short"]}


@pytest.mark.parametrize("name", sorted(p.name for p in THIRD.glob("*.json.gz")))
def test_the_report_reads_third_party_traces(name):
    page = build_pages([THIRD / name])[0]
    text = terminal_text([page])
    assert "Summary" in text
    if name == "hta_cpu_only.json.gz":
        assert "no GPU work" in text
    else:
        assert page.facts["kernels"] > 0


def test_the_mi250_trace_has_its_profiler_steps():
    page = build_pages([THIRD / "hta_minitoy_mi250.json.gz"])[0]
    assert page.facts["steps"] == 2 and len(page.table("Steps")) == 2


# ---- diff --------------------------------------------------------------------------------------------------

def test_diff_lists_exactly_the_kernels_that_came_and_went_by_demangled_name():
    from gpuprof.report.diff import kernel_changes

    views = [load(CH06 / f, "nsys") for f in ("rung0.sqlite", "rung8.sqlite")]
    before, after = (set(v.in_steps(v.kernels)["demangled"]) for v in views)
    changes, per_step = kernel_changes(*views)
    assert per_step and set(changes["demangled"]) == before | after and changes["name"].is_unique
    page = build_diff(CH06 / "rung0.sqlite", CH06 / "rung8.sqlite")
    new, gone = page.table("Kernels that appeared"), page.table("Kernels that disappeared")
    label = dict(zip(changes["demangled"], changes["name"]))
    assert set(new["name"]) == {label[d] for d in after - before} and set(gone["name"]) == {label[d] for d in before - after}
    summary = page.table("Summary").set_index("measure")
    assert summary.loc["steps (ranges)", "before"] == 50 == summary.loc["steps (ranges)", "after"]


def test_diff_shows_a_change_of_algorithm_behind_one_generic_short_name():
    """CUTLASS's Kernel2 is an FP32 SIMT GEMM in rung 0 and bf16 tensor-core GEMMs in rung 8: by short name
    it was in neither list. cuDNN's Kernel is three kernels in rung 8 (a convolution and a split-K reduction
    among them), one row each."""
    page = build_diff(CH06 / "rung0.sqlite", CH06 / "rung8.sqlite")
    new, gone = page.table("Kernels that appeared"), page.table("Kernels that disappeared")
    assert "Kernel2<cutlass_80_simt_sgemm_64x64_8x5_nn_align1>" in set(gone["name"])
    assert sum(n.startswith("Kernel2<cutlass_80_wmma_tensorop_bf16") for n in new["name"]) == 2
    assert sum(n.startswith("Kernel<") for n in new["name"]) == 3
    assert any(n.startswith("Kernel<ReduceSplitK") for n in new["name"])
    assert "max_pool_forward_nchw" in set(gone["name"])  # a short name that stands for one kernel stays short
    prec = page.table("Convolution and matrix-product time by precision").set_index(["kind", "precision"])
    assert prec.loc[("convolution", "bf16"), "share_after"] > 0.9 and prec.loc[("convolution", "bf16"), "share_before"] == 0
    assert prec.loc[("convolution", "tf32"), "share_before"] > 0.5  # rung 0 convolves mostly on TF32 tensor cores


def test_compact_names_and_labels():
    from gpuprof.report.activity_view import compact_name, kernel_labels

    assert compact_name("void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_nn_align1>(T1::Params)") == \
        "Kernel2<cutlass_80_simt_sgemm_64x64_8x5_nn_align1>"
    assert compact_name("void at::native::<unnamed>::max_pool_forward_nchw<float, int>(T2, const T1 *, long)") == \
        "max_pool_forward_nchw<float, int>"
    assert compact_name("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, (bool)0, (bool)1, "
                        "(cudnnKernelDataType_t)2>(cudnn::nchw2nhwc_params_t<T3>, const T1 *, T2 *)") == \
        "nchwToNhwcKernel<float, float, float, 0, 1, 2>"
    assert compact_name("sm90_xmma_fprop_implicit_gemm_bf16") == "sm90_xmma_fprop_implicit_gemm_bf16"
    pairs = pd.DataFrame({"name": ["Kernel2", "Kernel2", "solo", "twin", "twin"],
                          "demangled": ["void cutlass::Kernel2<a>(P)", "void cutlass::Kernel2<b>(P)", "void solo<x>(int)",
                                        "void ns1::twin<x>(int)", "void ns2::twin<x>(int)"]})
    labels = kernel_labels(pairs)
    assert labels["void cutlass::Kernel2<a>(P)"] == "Kernel2<a>" and labels["void solo<x>(int)"] == "solo"
    # two namespaces' twin<x> compact to one label: the whole demangled names keep them apart
    assert labels["void ns1::twin<x>(int)"] == "void ns1::twin<x>(int)"


def test_diff_per_step_work_and_throughput():
    """Steps of batch 32 and 1024 compare per image: --items-per-step turns each step pace into a throughput.
    Rung 8's CPU runs ahead of its GPU (it reads the loss every 50 steps), so its CPU start to start (2.35 ms in
    the H200 capture) is not its pace; the GPU's first op to first op (2.92 ms) is, and chapter 6's timed run of
    the same rung agrees within 10% (350,953 images/s in the capture against 370,968 timed)."""
    import json

    page = build_diff(CH06 / "rung0.sqlite", CH06 / "rung8.sqlite", items_per_step=(32, 1024))
    f = page.facts
    assert f["step_pace_ms_after"] == f["gpu_step_ms_after"] > 1.1 * f["step_period_ms_after"]
    assert f["items_per_s_after"] == pytest.approx(1024 / f["step_pace_ms_after"] * 1e3)
    assert f["items_per_s_before"] == pytest.approx(32 / f["step_pace_ms_before"] * 1e3)
    timed = json.loads((CH06 / "timings.json").read_text())["runs"]["8 batch 1024"]
    assert f["items_per_s_after"] == pytest.approx(timed["images_per_s"], rel=0.1)
    assert "Throughput" in page.blocks[0].text
    # kernels per step count what the steps launched: rung 8 launches 82 or more kernels in every step
    steps = build_pages([CH06 / "rung8.sqlite"])[0].table("Steps")
    assert f["kernels_per_step_after"] == pytest.approx(steps["kernels"].mean()) and steps["kernels"].min() >= 82
    kinds = page.table("Kernel time by kind")
    assert kinds["total_ms_after"].sum() == pytest.approx(f["kernel_ms_after"] / 50)


def test_diff_items_per_step_on_the_command_line():
    r = run_cli("diff", str(CH06 / "rung0.sqlite"), str(CH06 / "rung8.sqlite"), "--items-per-step", "32,1024")
    assert r.returncode == 0, r.stderr
    assert "Throughput: 32 -> 1,024 items per step" in r.stdout and "items per second" in r.stdout
    bad = run_cli("diff", str(CH06 / "rung0.sqlite"), str(CH06 / "rung8.sqlite"), "--items-per-step", "32,x")
    assert bad.returncode == 2 and "give N or N,M" in bad.stderr


def test_diff_of_a_capture_with_itself_changes_nothing():
    page = build_diff(CH05 / "train_steps.json.gz", CH05 / "train_steps.json.gz")
    s = page.table("Summary")
    assert np.allclose(s["after / before"].dropna(), 1.0)
    assert (page.table("Largest changes")["change_ms"] == 0).all()


def test_diff_of_two_ncu_reports_matches_kernels_by_name():
    page = build_diff(CH04 / "ladder.ncu-rep", CH04 / "ladder.details.csv")
    t = page.table("Per kernel (first launch of each name)")
    assert len(t) == 5 and np.allclose(t["speedup"], 1.0, atol=0.002)


# ---- the command line and the HTML page ------------------------------------------------------------------

def test_help_of_both_commands():
    for cmd, word in (("report", "CAPTURE"), ("diff", "BEFORE")):
        r = run_cli(cmd, "--help")
        assert r.returncode == 0 and word in r.stdout


def test_report_writes_one_self_contained_html_page(tmp_path):
    out = tmp_path / "r.html"
    r = run_cli("report", str(CH06 / "rung0.sqlite"), str(CH04 / "ladder.ncu-rep"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "Top kernels" in r.stdout and "Speed of light" in r.stdout and f"wrote {out}" in r.stdout
    page = out.read_text()
    assert page.count("data:image/png;base64,") >= 2  # the steps chart and the timeline
    assert not re.search(r"""(src|href)=["'](https?:)?//""", page)  # nothing fetched
    assert "<table>" in page and "rung0.sqlite" in page and "ladder.ncu-rep" in page


def _drawn_steps(n: int) -> tuple[pd.DataFrame, "object"]:
    """A steps table of ``n`` steps whose lengths all differ, drawn by the report's step figure on an Axes."""
    import matplotlib.pyplot as plt

    from gpuprof.report.timeline_page import _draw_steps

    cpu = 5.0 + (np.arange(n) * 7919 % 1009) / 100.0  # a fixed, irregular pattern: no draw, no seed
    steps = pd.DataFrame({"step": np.arange(n) + 10, "cpu_ms": cpu, "gpu_busy_ms": cpu * 0.6})
    fig, ax = plt.subplots()
    _draw_steps(ax, steps)
    plt.close(fig)
    return steps, ax


@pytest.mark.parametrize("n", [1, 7, 200])
def test_the_step_figure_draws_one_bar_pair_a_step_up_to_step_bars(n):
    from gpuprof.report.timeline_page import STEP_BARS

    assert n <= STEP_BARS
    steps, ax = _drawn_steps(n)
    heights = np.array([r.get_height() for r in ax.patches])
    assert len(ax.patches) == 2 * n and not ax.lines  # no bins, no longest-step dashes
    np.testing.assert_array_equal(heights[:n], steps["cpu_ms"])
    np.testing.assert_array_equal(heights[n:], steps["gpu_busy_ms"])
    assert ax.get_xlabel() == "step"


@pytest.mark.parametrize("n", [201, 10_000, 10_001])
def test_many_steps_are_drawn_in_at_most_step_bins_bins_of_consecutive_steps(n):
    """Past STEP_BARS steps, at most STEP_BINS bar pairs whatever the count: each bin's mean per step (the last bin
    holding what remains) and a dash at its longest step, as the axis label says."""
    from gpuprof.report.timeline_page import STEP_BINS

    steps, ax = _drawn_steps(n)
    width = -(-n // STEP_BINS)
    starts = np.arange(0, n, width)
    cpu = steps["cpu_ms"].to_numpy()
    mean = np.add.reduceat(cpu, starts) / np.diff(np.append(starts, n))
    assert len(ax.patches) == 2 * len(starts) <= 2 * STEP_BINS
    heights = np.array([r.get_height() for r in ax.patches])
    np.testing.assert_allclose(heights[:len(starts)], mean)
    np.testing.assert_allclose(heights[len(starts):], mean * 0.6)
    (dashes,) = ax.lines
    np.testing.assert_array_equal(dashes.get_ydata(), np.maximum.reduceat(cpu, starts))
    assert f"in {len(starts)} bins of {width} consecutive steps (the last holds {n - width * (len(starts) - 1)})" in ax.get_xlabel()
    assert [t.get_text() for t in ax.get_xticklabels()][0] == "10"  # the first bin's first step


@pytest.mark.parametrize("args,said", [
    (["report", "{tmp}/empty.sqlite"], "is empty"),
    (["report", "{tmp}/notes.json"], "JSON but not a PyTorch profiler trace"),
    (["report", "{tmp}/nothing"], "holds no capture"),
    (["report", "{tmp}/missing.sqlite"], "does not exist"),
    (["report", "{tmp}/cut.sqlite"], "damaged"),
    (["report", "{ch06}/rung0.sqlite", "--window", "no_such_range"], "no range of that name"),
    (["report", "{ch06}/rung0.sqlite", "--window", "5:2"], "must come after the start. Give --window"),
    (["report", "{ch06}/rung0.sqlite", "--steps", "("], "is not a regular expression"),
    (["report", "{ch06}/rung0.sqlite", "--top", "0"], "out of range"),
    (["report", "{ch06}/rung0.sqlite", "-o", "{tmp}/no/such/dir/r.html"], "does not exist"),
    (["diff", "{ch06}/rung0.sqlite", "{ch04}/ladder.ncu-rep"], "cannot be compared"),
    (["report", "{tmp}/capture.bin"], "without the .nsys-rep suffix"),
])
def test_wrong_input_is_one_sentence_not_a_traceback(tmp_path, args, said):
    (tmp_path / "empty.sqlite").write_bytes(b"")
    (tmp_path / "notes.json").write_text('{"a": 1}')
    (tmp_path / "cut.sqlite").write_bytes(ns.ensure_sqlite(CH06 / "rung0.sqlite").read_bytes()[:8192])
    (tmp_path / "capture.bin").write_bytes(b"NVIDIA Tegra Profiler Report 363\x00\x01" + bytes(64))  # a .nsys-rep's head
    (tmp_path / "nothing").mkdir()
    (tmp_path / "nothing" / "notes.txt").write_text("hello")
    r = run_cli(*[a.format(tmp=tmp_path, ch06=CH06, ch04=CH04) for a in args])
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and said in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_html_page_escapes_names():
    page = build_pages([CH05 / "small_steps.json.gz"])[0]
    text = html_page([page])
    assert "<unnamed>" not in text  # kernel names with template brackets are escaped


# ---- nsys's own answers: nvtx_kern_sum and the recipes, on the same reports (artifacts/report, H100) -------

REPORT = ART / "report"


@pytest.mark.parametrize("name", ["naive", "fast"])
def test_nvtx_kern_summary_equals_nsys_stats_cell_by_cell(name):
    """The fast capture replays CUDA graphs (one correlation id for many kernels): still equal."""
    p = REPORT / f"{name}.sqlite"
    mine = st.nvtx_kern_summary(ns.kernels(p, launch=False), ns.runtime_calls(p), ns.nvtx_ranges(p))
    theirs = pd.read_csv(REPORT / f"{name}_nvtx_kern_sum.csv").fillna({"NVTX Range": "", "Style": ""})
    assert list(mine.columns) == list(theirs.columns) and len(mine) == len(theirs) > 400
    key = ["NVTX Range", "Style", "PID", "TID", "Kernel Name"]
    assert (mine[key].astype(str).to_numpy() == theirs[key].astype(str).to_numpy()).all()  # same rows, same order
    for c in ["NVTX Inst", "Kern Inst", "Total Time (ns)", "Min (ns)", "Max (ns)"]:
        assert (mine[c].to_numpy() == theirs[c].to_numpy()).all(), c
    for c in ["Avg (ns)", "Med (ns)", "StdDev (ns)"]:  # nsys prints one decimal
        assert np.allclose(mine[c], theirs[c], atol=0.051), c
    assert (theirs.loc[theirs["NVTX Range"] == "", "NVTX Inst"] == 0).all()  # autograd's kernels: no range


def test_nvtx_kern_summary_fails_on_a_changed_cell():
    p = REPORT / "naive.sqlite"
    mine = st.nvtx_kern_summary(ns.kernels(p, launch=False), ns.runtime_calls(p), ns.nvtx_ranges(p))
    theirs = pd.read_csv(REPORT / "naive_nvtx_kern_sum.csv")
    theirs.loc[5, "Kern Inst"] += 1
    assert not (mine["Kern Inst"].to_numpy() == theirs["Kern Inst"].to_numpy()).all()


@pytest.mark.parametrize("name", ["naive", "fast"])
def test_the_recipes_equal_gpuprofs_measures(name):
    from gpuprof.nsys import recipes as rc

    p = REPORT / f"{name}.sqlite"
    kern = rc.kern_sum_check(pd.read_csv(REPORT / f"recipe_cuda_gpu_kern_sum_{name}.csv"), p)
    util = rc.time_util_check(pd.read_csv(REPORT / f"recipe_gpu_time_util_{name}.csv"), p)
    proj = rc.nvtx_proj_check(pd.read_csv(REPORT / f"recipe_nvtx_gpu_proj_sum_{name}.csv"), p)
    assert kern["equal"].all() and len(kern) > 20
    assert util["equal"].all() and len(util) >= 1
    assert proj["equal"].all() and len(proj) > 20


def test_the_diff_recipe_is_first_minus_second_over_the_first_names():
    from gpuprof.nsys import recipes as rc

    first, second = (pd.read_csv(REPORT / f"recipe_cuda_gpu_kern_sum_{n}.csv") for n in ("naive", "fast"))
    d = rc.diff_check(pd.read_csv(REPORT / "recipe_diff.csv"), first, second)
    assert d["equal"].all() and set(d["Name"]) == set(first["Name"])
    assert (d["only_in"] == "first").sum() == len(set(first["Name"]) - set(second["Name"])) > 0


def test_one_report_of_a_two_process_job_is_read_per_gpu_and_per_process():
    """Chapter 8's straggler: nsys around torchrun, both ranks in one report; rank 1 sleeps before each
    backward, so rank 0's GPU waits in NCCL (busy but communicating) and rank 1's is idle."""
    page = build_pages([ART / "ch08" / "straggler.sqlite"])[0]
    per = page.table("Per GPU").set_index("device")
    assert list(per.index) == [0, 1]
    assert per.loc[0, "nccl_ms"] > 5 * per.loc[1, "nccl_ms"] and per.loc[0, "busy"] > 2 * per.loc[1, "busy"]
    f = page.facts
    assert f["processes"] == 2 and f["steps"] == 10
    assert f["step_period_ms"] == pytest.approx(f["window_ms"] / 5, rel=0.05)  # 4 start-to-start gaps per process
    assert "2 x NVIDIA H200" in page.blocks[0].text
    steps = page.table("Steps")
    assert "pid" in steps and steps["pid"].nunique() == 2


def test_the_step_time_and_the_window_skip_the_gaps_between_runs_of_a_sweep():
    """Chapter 8's bucket sweep restarts at step_0 for each bucket size: the gaps between runs (model
    building, NCCL set-up) are no step's, and neither the step time nor the window counts them."""
    view = load(ART / "ch08" / "buckets_bf16_rank0.sqlite", "nsys")
    f = build_pages([ART / "ch08" / "buckets_bf16_rank0.sqlite"])[0].facts
    assert f["runs"] == 5 == len(view.segments) and f["steps"] == 50
    first_to_last = (view.steps["end"].max() - view.steps["start"].min()) / 1e6
    assert f["window_ms"] < 0.2 * first_to_last
    assert f["window_ms"] == pytest.approx(f["step_period_ms"] * f["steps"], rel=0.05)
    assert f["step_period_ms"] == pytest.approx(f["step_ms"], rel=0.25)  # a synchronous DDP step: CPU range ~ period
    assert f["gpu_busy"] > 0.2  # over the steps (0.30 in the 2026-11-26 capture); over first-to-last, the set-up made it 0.06
    ranks = build_pages([ART / "ch08"])[0].table("Per capture").set_index("capture")
    assert ranks.loc["buckets_bf16_rank0.sqlite.gz", "runs"] == 5
    assert ranks.loc["buckets_bf16_rank0.sqlite.gz", "window_ms"] == pytest.approx(f["window_ms"])


def test_runs_restart_where_the_step_number_does_not_go_up():
    from gpuprof.report.activity_view import _runs

    steps = pd.DataFrame({"step": [0, 1, 2, 0, 1, 5, 5, 0, 1], "start": np.arange(9) * 10, "pid": [1] * 9})
    assert _runs(steps).tolist() == [0, 0, 0, 1, 1, 1, 2, 3, 3]
    two = pd.DataFrame({"step": [0, 0, 1, 1], "start": [0, 1, 10, 11], "pid": [1, 2, 1, 2]})
    r = _runs(two)
    assert r[0] == r[2] and r[1] == r[3] and r[0] != r[1]  # one run per process, not a restart


def test_the_window_reaches_the_end_of_the_work_the_steps_launched():
    """A CPU that runs ahead closes its last step range while the GPU still has work of the steps to do:
    rung 8's GPU ends the last step's work well after that range closed."""
    view = load(CH06 / "rung8.sqlite", "nsys")
    lo, hi = view.window
    assert lo == view.steps["start"].min() and hi == view.steps["gpu_last"].max() > view.steps["end"].max()


def test_exposed_nccl_time_equals_what_hta_compat_overlap_leaves_exposed():
    """On a DDP rank's trace: NCCL time with no compute kernel running = (1 - HTA's comm/comp overlap) x the
    NCCL kernels' union (hta_compat.comm_comp_overlap, which the third-party tests hold equal to HTA's)."""
    from gpuprof import activity
    from gpuprof.report.activity_view import headline
    from gpuprof.torch_profiler import hta_compat as hc

    path = ART / "ch08" / "ddp_trace_rank0.json.gz"
    view = load(path, "kineto")
    f = headline(view)
    nccl = view.kernels[view.kernels["name"].str.startswith("nccl")]
    s, e = activity.merge_intervals(nccl["start"].to_numpy(), nccl["end"].to_numpy())
    union_ms = float((e - s).sum()) / 1e6
    assert f["nccl_exposed_ms"] == pytest.approx((1 - hc.comm_comp_overlap(path)) * union_ms, abs=1e-6)
    assert f["nccl_overlap"] == pytest.approx(hc.comm_comp_overlap(path), abs=1e-9)  # the page's column is HTA's
    assert 0 < f["nccl_exposed_ms"] < f["nccl_ms"]
    per = build_pages([ART / "ch08" / "straggler.sqlite"])[0].table("Per GPU").set_index("device")
    assert (per["nccl_exposed_ms"] <= per["nccl_ms"]).all() and per.loc[0, "nccl_exposed_ms"] > per.loc[1, "nccl_exposed_ms"]


def test_the_raw_page_is_read_in_its_own_units(tmp_path):
    """ncu --page raw prints a units row under the header: microseconds here must become the page's us."""
    raw = tmp_path / "raw.csv"
    raw.write_text('==PROF== Connected to process 1\n'
                   '"ID","Process ID","Kernel Name","gpu__time_duration.sum",'
                   '"sm__throughput.avg.pct_of_peak_sustained_elapsed","launch__block_size"\n'
                   '"","","","msecond","%",""\n"0","11","saxpy","0.23264","17.3","256"\n')
    assert capture_kind(raw) == "ncu-csv"
    t = build_pages([raw])[0].table("Speed of light (% of peak)")
    assert t["duration_us"].tolist() == pytest.approx([232.64]) and t["sm_pct"].tolist() == [17.3]
    assert t["memory_pct"].isna().all()  # not in this page: missing, not 0


def test_a_table_is_found_by_its_heading_or_a_prefix_of_it_as_terminal_text_only_finds_it():
    from gpuprof.report.page import Page

    page = Page("t", Path("t"), "nsys")
    for heading in ("Steps", "Steps by rank", "Kernels that appeared (3)", "Kernels that disappeared (0)"):
        page.add(heading, table=pd.DataFrame({"h": [heading]}))
    assert page.table("Steps")["h"][0] == "Steps"  # an exact heading wins over longer ones
    assert page.table("Kernels that appeared")["h"][0] == "Kernels that appeared (3)"
    assert "Kernels that appeared (3)" in terminal_text([page], only=["Kernels that appeared"])
    with pytest.raises(KeyError, match="several"):
        page.table("Kernels that")
    with pytest.raises(KeyError, match="no table"):
        page.table("Idle")


def test_cross_tool_key_gives_nsys_and_the_pytorch_profiler_spellings_one_key():
    from gpuprof.report.activity_view import cross_tool_key

    pairs = [
        ("void at::native::<unnamed>::max_pool_backward_nchw<float, float, int>(const T1 *, const long *, T3, int)",
         "void at::native::(anonymous namespace)::max_pool_backward_nchw<float, float, int>(float const*, long const*, int, int)"),
        ("void <unnamed>::softmax_warp_forward<float, float, float, (int)4, (bool)1, (bool)0>(T2 *, const T1 *, int)",
         "void (anonymous namespace)::softmax_warp_forward<float, float, float, 4, true, false>(float*, float const*, int)"),
        ("void at::native::elementwise_kernel<128, 2, void at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add"
         "<float>>(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)",
         "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add"
         "<float>>(at::TensorIteratorBase&, at::native::CUDAFunctor_add<float> const&)::{lambda(int)#1}>(int, "
         "at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add<float>>)"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char *, 1>>(int, T2, T3)",
         "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul>>(int, "
         "at::native::FillFunctor<float>, std::array<char*, 1ul>)"),
    ]
    for nsys_name, kineto_name in pairs:
        assert cross_tool_key(nsys_name) == cross_tool_key(kineto_name)
    assert cross_tool_key(pairs[0][0]) != cross_tool_key(pairs[1][0])
    # template arguments still tell instances apart
    assert cross_tool_key("k<float, (int)4>(int)") != cross_tool_key("k<float, 8>(int)")


def test_diff_of_an_nsys_export_and_a_trace_of_the_same_program_matches_every_kernel():
    """Chapter 5's batch-256 step, captured by nsys in one process and by the PyTorch profiler in another: the same
    kernels, so nothing appeared or disappeared, and the per-step counts agree."""
    from gpuprof.report.activity_view import load
    from gpuprof.report.diff import kernel_changes

    ch05 = REPO_ROOT / "artifacts" / "ch05"
    changes, per_step = kernel_changes(load(ch05 / "reconcile_256_nsys.sqlite.gz", "nsys"),
                                       load(ch05 / "reconcile_256_steps.json.gz", "kineto"))
    assert per_step and len(changes) == 32
    assert (changes["count_before"] > 0).all() and (changes["count_after"] > 0).all()
    assert (changes["count_before"] == changes["count_after"]).all()


# ---- a loop whose GPU lags its CPU by many steps (issue 38, item 1) --------------------------------------

LAG_STEPS, LAUNCHES, STEPS = 10, 3, 20  # the GPU runs each step's kernels 10 steps after the CPU launched them
US = 1_000  # ns


def _lagging_loop():
    """(step, launch call start, kernel start) per kernel, in us: the CPU opens a 100 us step every 100 us
    and launches 3 kernels in it, at 10, 40 and 70 us; the GPU runs them 1,000 us later, 25 us each. So
    a step's kernels run inside the CPU range of the step 10 later, and the last 10 steps' kernels run
    after every step range has closed: an execution-time rule would count 0 kernels in the first 10
    steps and 3 in the others, and miss 30 of the 60."""
    return [(i, 100 * i + 10 + 30 * j, 1000 + 100 * i + 30 * j, i * LAUNCHES + j + 1)
            for i in range(STEPS) for j in range(LAUNCHES)]


def _check_lagging(view):
    from gpuprof.report.activity_view import headline, step_table

    f = headline(view)
    assert f["steps"] == STEPS and f["kernels"] == STEPS * LAUNCHES and f["kernels_per_step"] == LAUNCHES
    per = step_table(view)
    assert per["launches"].tolist() == [LAUNCHES] * STEPS and per["kernels"].tolist() == [LAUNCHES] * STEPS
    # each step's GPU work, from its first kernel's start to its last's end: 60 + 25 us
    assert per["gpu_span_ms"].to_numpy() == pytest.approx(0.085)
    assert f["gpu_step_ms"] == pytest.approx(0.1) and f["step_period_ms"] == pytest.approx(0.1)
    last_kernel_end = (1000 + 100 * (STEPS - 1) + 30 * (LAUNCHES - 1) + 25) * US
    assert view.window == (0, last_kernel_end)  # to the end of the last step's work, not the last range's end
    assert f["kernel_ms"] == pytest.approx(STEPS * LAUNCHES * 0.025)


def test_a_gpu_many_steps_behind_the_cpu_on_nsys_input():
    from gpuprof.report.activity_view import ActivityView, find_view_steps

    tid = (100 << 24) + 1  # an nsys globalTid: process 100, thread 1
    rows = _lagging_loop()
    k = pd.DataFrame({"start": [g * US for _, _, g, _ in rows], "end": [(g + 25) * US for _, _, g, _ in rows],
                      "correlationId": [c for *_, c in rows]}).assign(name="k", demangled="k", streamId=7, deviceId=0)
    k["duration_ns"] = k["end"] - k["start"]
    rt = pd.DataFrame({"start": [c * US for _, c, _, _ in rows], "end": [(c + 5) * US for _, c, _, _ in rows],
                       "name": "cudaLaunchKernel", "correlationId": [c for *_, c in rows]}).assign(globalTid=tid)
    ranges = pd.DataFrame({"text": [f"step_{i}" for i in range(STEPS)], "start": [100 * i * US for i in range(STEPS)],
                           "end": [(100 * i + 100) * US for i in range(STEPS)]}).assign(globalTid=tid)
    empty = k.iloc[0:0]
    view = find_view_steps(ActivityView(path=Path("synthetic"), tool="nsys", kernels=k, copies=empty.assign(bytes=0.0),
                                        memsets=empty, runtime=rt, ranges=ranges))
    _check_lagging(view)


def test_a_gpu_many_steps_behind_the_cpu_on_a_pytorch_profiler_trace(tmp_path):
    """The same loop as a Kineto trace file, read end to end: launches joined to kernels by `correlation`."""
    from helpers import _x, write

    events = [_x("user_annotation", f"ProfilerStep#{i}", 100.0 * i, 100.0, 100, 1) for i in range(STEPS)]
    for _, cpu, gpu, corr in _lagging_loop():
        events.append(_x("cuda_runtime", "cudaLaunchKernel", float(cpu), 5.0, 100, 1, correlation=corr))
        events.append(_x("kernel", "k", float(gpu), 25.0, 0, 7, device=0, stream=7, correlation=corr))
    view = load(write(tmp_path, events), "kineto")
    assert view.step_rule.startswith("PyTorch's ProfilerStep")
    _check_lagging(view)


# ---- a folder of ranks: the straggler (issue 38, item 7) ----------------------------------------------------

def _ranks(compute, nccl, kernels=None):
    return pd.DataFrame({"capture": [f"rank{i}" for i in range(len(compute))], "compute_ms": compute, "nccl_ms": nccl,
                         "nccl_kernels": kernels or [48] * len(compute)})


def test_the_straggler_is_the_rank_the_others_wait_for_in_nccl():
    from gpuprof.report.timeline_page import straggler

    said = straggler(_ranks([10.0, 10.2, 13.0, 9.9], [5.0, 4.8, 2.0, 5.1]))
    assert said.startswith("Likely straggler: rank2, the least time in NCCL kernels (2.000 ms, 0.41x the median 4.900")
    assert "Its compute (kernel time outside NCCL) is 1.29x the median's" in said
    late_host = straggler(_ranks([10.0, 10.2, 8.0, 9.9], [5.0, 4.8, 2.0, 5.1]))  # a host-side straggler computes less
    assert late_host.startswith("Likely straggler: rank2") and "0.80x the median's" in late_host
    assert straggler(_ranks([10.0, 10.2, 13.0, 9.9], [5.0, 4.8, 4.7, 5.1])) == ""  # 4% below the median: balanced
    assert straggler(_ranks([10.0, 13.0], [0.0, 0.0])) == ""  # no NCCL: not a collective job
    other_jobs = straggler(_ranks([10.0, 10.2, 13.0], [5.0, 4.8, 2.0], kernels=[48, 48, 960]))
    assert other_jobs.startswith("No straggler named: the captures ran different numbers of NCCL kernels (48 to 960)")


def test_chapter_8s_straggler_run_names_the_gpu_whose_host_slept():
    """straggler.sqlite: one report around torchrun, GPU 1's process sleeps before its steps, GPU 0's NCCL kernels
    wait for it (143.3 against 11.80 ms of NCCL time in the 2026-11-26 capture); GPU 1 also computes less, so compute could not tell."""
    page = build_pages([ART / "ch08" / "straggler.sqlite"])[0]
    block = next(b for b in page.blocks if b.heading == "Per GPU")
    per = block.table.set_index("device")
    assert per.loc[1, "nccl_ms"] < 0.25 * per.loc[0, "nccl_ms"] and per.loc[1, "compute_ms"] < per.loc[0, "compute_ms"]
    assert per.loc[0, "nccl_kernels"] == per.loc[1, "nccl_kernels"]
    assert block.text.startswith("Likely straggler: GPU 1,")


def test_a_folder_of_the_two_real_ranks_names_the_late_one_and_shows_their_overlap(tmp_path):
    """Chapter 8's two DDP traces (2026-11-26): rank 1 reached 38 of the 48 all-reduces last, so rank 0's NCCL
    kernels waited (25.14 against 7.93 ms of NCCL time): the page names rank 1, as the kernels' start times
    say independently (``mg.trace_arrivals``); each rank's overlap column is HTA's comm/comp overlap of its
    own trace."""
    from gpuprof.studies import multi_gpu as mg
    from gpuprof.torch_profiler import hta_compat as hc

    for r in (0, 1):
        shutil.copy(ART / "ch08" / f"ddp_trace_rank{r}.json.gz", tmp_path)
    side = build_pages([tmp_path])[0]
    table = side.table("Per capture").set_index("capture")
    for r in (0, 1):
        name = f"ddp_trace_rank{r}.json.gz"
        assert table.loc[name, "nccl_overlap"] == pytest.approx(hc.comm_comp_overlap(tmp_path / name), abs=1e-9)
    balance = [b.text for b in side.blocks if b.heading == "Balance" and "straggler:" in (b.text or "")]
    assert len(balance) == 1 and balance[0].startswith("Likely straggler: ddp_trace_rank1.json.gz")
    lead = mg.trace_arrivals([tmp_path / f"ddp_trace_rank{r}.json.gz" for r in (0, 1)])["start_skew_ns"]
    assert (lead > 0).sum() > 2 * (lead < 0).sum()  # rank 0 first (waiting) at most all-reduces


def test_step_intervals_skip_restarts_and_keep_the_one_long_wait():
    """Two runs of a loop (steps 0-3 twice, as a sweep restarts): 1 ms steps, but step 2 of the first run
    holds a 10 ms wait (a loss read). The intervals leave out the 100 ms between the runs; their mean
    carries the wait, their median does not, and the mean is what step_period_ns reports."""
    from gpuprof.report.activity_view import step_intervals_ns, step_period_ns

    ms = 1_000_000
    starts = [0, 1, 2, 12, 113, 114, 115, 116]
    steps = pd.DataFrame({"step": [0, 1, 2, 3] * 2, "start": [t * ms for t in starts]})
    d = step_intervals_ns(steps)
    assert sorted(d.tolist()) == [ms] * 5 + [10 * ms]  # 6 pairs n, n+1; not the 101 ms between runs
    assert step_period_ns(steps, fallback=0) == pytest.approx(d.mean()) == pytest.approx(15 / 6 * ms)
    assert np.median(d) == ms
    assert step_period_ns(steps.iloc[:1], fallback=7.0) == 7.0  # no pair: the fallback


# ---- the HTML page as a reader sees it: short kernel names, full ones on hover and in the CSV ----------------

@pytest.mark.parametrize("demangled, short", [
    ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<float>, std::array<char *, "
     "(unsigned long)1>>(int, T2, T3)", "vectorized_elementwise_kernel<…, FillFunctor<float>, …>"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >"
     "(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)", "vectorized_elementwise_kernel<…, FillFunctor<float>, …>"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>(T1::Params)",
     "Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>"),
    ("void wgrad_alg0_engine<float, (int)128, (int)5, (int)5, (int)3, (int)3, (int)3, (bool)0, (int)512>(int, int)",
     "wgrad_alg0_engine<float, …>"),
    ("void at::native::(anonymous namespace)::max_pool_forward_nchw<float, int>(int, float const*, long)",
     "max_pool_forward_nchw<float, …>"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, cutlass::arch::Sm80, "
     "(bool)1, (int)64>::Params)", "fmha_cutlassF_f32_aligned_64x64_rf_sm80"),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize64x128x32_warpgroupsize1x1x1_execute_segment_k_on_kernel__5x_cublas",
     "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize64x128x32_warpgroupsize1x1x1_execute_segment_k_on_kernel__5x_cublas"),
    ("void sgemm_largek_lds64<(bool)1, (bool)0, (int)5>(float *)", "sgemm_largek_lds64<1, …>"),
])
def test_short_kernel_names(demangled, short):
    from gpuprof.report.kernel_names import short_kernel_name

    assert short_kernel_name(demangled) == short


def test_html_top_kernels_show_short_names_with_the_full_name_on_hover_and_in_the_csv():
    import io
    from html import unescape
    from urllib.parse import unquote

    from gpuprof.report.kernel_names import short_kernel_name

    page = build_pages([CH06 / "rung0.sqlite"])[0]
    full = page.table("Top kernels")["Name"]
    text = html_page([page])
    section = text[text.index("<h3>Top kernels</h3>"):text.index("<h3>Kernels by kind</h3>")]
    cells = re.findall(r'<td class="text"(?: title="([^"]*)")?>([^<]*)</td>', section)
    assert [unescape(c[1]) for c in cells] == [short_kernel_name(n) for n in full.head(len(cells))]
    assert [unescape(c[0] or c[1]) for c in cells] == list(full.head(len(cells)))  # hover: the full name
    assert sum(bool(c[0]) for c in cells) >= 10 and max(len(unescape(c[1])) for c in cells) < 150
    csv = unquote(re.search(r'href="data:text/csv;charset=utf-8,([^"]*)"', section).group(1))
    assert pd.read_csv(io.StringIO(csv))["Name"].tolist() == list(full)  # every row, full names
    assert 'th class="sortable"' in section and "<script>" in text  # sorting: inline, tested in Chromium


def test_timeline_without_steps_draws_at_most_the_last_operations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without steps the timeline figure shows the whole capture, or its last TIMELINE_MAX_OPS GPU operations where it
    holds more (a million rectangles cost matplotlib seconds and a gigabyte); the note says so only then."""
    from gpuprof.report import timeline_page as tp

    view = load(ART / "ch01" / "transfer.sqlite", "nsys", steps="no step has this name")
    assert view.steps.empty
    starts = np.sort(view.work["start"].to_numpy(dtype=np.int64))
    assert len(starts) > 100
    whole, cut = tp._recent_window(view, view.window)
    assert not cut and whole == view.window
    monkeypatch.setattr(tp, "TIMELINE_MAX_OPS", 100)
    (lo, hi), cut = tp._recent_window(view, view.window)
    assert cut and hi == view.window[1] and lo == starts[-100]
    assert ((starts >= lo) & (starts < hi)).sum() >= 100  # the last 100 (and any that start with the 100th)
    note = [b.note for b in tp.timeline_page(view).blocks if b.heading == "Timeline"][0]
    assert "last 100 GPU operations" in note


def test_the_kineto_view_keeps_its_trace_without_the_flows():
    """The view lets the flow table go once the reading has filled the correlation ids from it (the 2 GB trace's
    report held it through every later stage); the kept trace says so when its flows are asked for."""
    from gpuprof.errors import GpuprofError
    from gpuprof.torch_profiler import read_trace

    path = CH05 / "train_steps.json.gz"
    view = load(path, "kineto")
    assert "flow" not in view.extra["trace"]._tables
    with pytest.raises(GpuprofError, match="without its flow events"):
        view.extra["trace"].flows()
    full = read_trace(path)
    assert len(full.flows()) > 0  # a trace read on its own keeps them
    assert view.kernels["correlationId"].notna().all()


def test_step_pace_change_is_worded_with_a_factor_over_one():
    """A slower step once read "1.492 -> 2.918 ms, 0.51x longer": the factor is the larger over the smaller."""
    from gpuprof.report.diff import _pace_change

    assert _pace_change(1.492, 2.918) == "1.96x longer"
    assert _pace_change(7.827, 2.918) == "2.68x shorter"  # chapter 9's diff of rungs 0 and 8
    assert _pace_change(2.0, 2.0) == "the same"
