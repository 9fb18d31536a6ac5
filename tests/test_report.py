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


def test_the_ncu_findings_are_ncus_rules_largest_speedup_first():
    page = build_pages([CH04 / "ladder.ncu-rep"])[0]
    f = page.table("Rule findings (OPT and WRN), largest estimated speedup first")
    assert set(f["type"]) <= {"OPT", "WRN"} and len(f) > 5
    s = f["speedup_pct"].dropna().to_numpy()
    assert (np.diff(s) <= 0).all()
    assert page.table("Bottleneck (ncu's SOLBottleneck rule)")["bottleneck"].str.contains("Start by analyzing").all()


# ---- steps, idle time, third-party traces ---------------------------------------------------------------

def test_idle_time_by_cause_adds_up_to_the_idle_gaps():
    from gpuprof import activity

    view = load(CH06 / "rung0.sqlite", "nsys")
    by = idle_by_cause(view)
    gaps = activity.idle_gaps(view.work, view.runtime, window=view.window)
    assert by["idle_ms"].sum() == pytest.approx(gaps["duration_ns"].sum() / 1e6)
    assert by["share"].sum() == pytest.approx(1.0)
    assert set(by["cause"]) <= {"synchronize", "copy", "launch", "other CUDA call", "host code"}


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

def test_diff_lists_exactly_the_kernels_that_came_and_went():
    page = build_diff(CH06 / "rung0.sqlite", CH06 / "rung8.sqlite")
    before, after = (set(load(CH06 / f, "nsys").kernels["name"]) for f in ("rung0.sqlite", "rung8.sqlite"))
    new, gone = page.table("Kernels that appeared"), page.table("Kernels that disappeared")
    assert set(new["name"]) == after - before and set(gone["name"]) == before - after
    f = page.facts
    assert f["step_period_ms_before"] / f["step_period_ms_after"] > 1  # the ladder's last rung is faster per step
    summary = page.table("Summary").set_index("measure")
    assert summary.loc["steps (ranges)", "before"] == 50 == summary.loc["steps (ranges)", "after"]


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


@pytest.mark.parametrize("args,said", [
    (["report", "{tmp}/empty.sqlite"], "is empty"),
    (["report", "{tmp}/notes.json"], "JSON but not a PyTorch profiler trace"),
    (["report", "{tmp}/nothing"], "holds no capture"),
    (["report", "{tmp}/missing.sqlite"], "does not exist"),
    (["report", "{tmp}/cut.sqlite"], "damaged"),
    (["report", "{ch06}/rung0.sqlite", "--window", "no_such_range"], "no range of that name"),
    (["report", "{ch06}/rung0.sqlite", "--window", "5:2"], "must come after"),
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


def test_the_step_time_skips_the_gaps_between_runs_of_a_sweep():
    """Chapter 8's bucket sweep restarts at step_0 for each bucket size: the gaps between runs are no step's."""
    f = build_pages([ART / "ch08" / "buckets_rank0.sqlite"])[0].facts
    assert f["step_period_ms"] < 0.5 * f["window_ms"] / f["steps"]
    assert f["step_period_ms"] == pytest.approx(f["step_ms"], rel=0.25)  # a synchronous DDP step: CPU range ~ period


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
