"""The nsys-stats summaries, attribution to NVTX ranges, kernel launch configuration and the timeline,
checked against what nsys itself wrote for the course's real captures."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from gpuprof.artifacts import REPO_ROOT  # noqa: E402
from gpuprof.nsys import analysis as ta  # noqa: E402
from gpuprof.nsys import sqlite as ns  # noqa: E402
from gpuprof.nsys import stats as st  # noqa: E402
from gpuprof.nsys.timeline import draw_timeline, fit_label, resolve_window  # noqa: E402

CH01 = REPO_ROOT / "artifacts" / "ch01"
TRANSFER = CH01 / "transfer.sqlite"
FEATURES = REPO_ROOT / "artifacts" / "ch02" / "features.sqlite"
EMIT = REPO_ROOT / "artifacts" / "ch02" / "emit_nvtx.sqlite"
TINY = REPO_ROOT / "artifacts" / "ch00" / "tiny_kernels.sqlite"


def nsys_csv(report: str) -> pd.DataFrame:
    return pd.read_csv(CH01 / f"transfer_{report}.csv")


@pytest.mark.parametrize("report,summary,key", [
    ("cuda_gpu_kern_sum", lambda: st.kernel_summary(ns.kernels(TRANSFER)), "Name"),
    ("nvtx_sum", lambda: st.nvtx_summary(ns.nvtx_ranges(TRANSFER)), "Range"),
    ("cuda_gpu_mem_time_sum", lambda: st.memop_time_summary(ns.memcpy(TRANSFER), ns.memset(TRANSFER)), "Operation"),
    ("cuda_gpu_mem_size_sum", lambda: st.memop_size_summary(ns.memcpy(TRANSFER), ns.memset(TRANSFER)), "Operation"),
    ("cuda_api_sum", lambda: st.api_summary(ns.runtime_calls(TRANSFER)), "Name"),
])
def test_summaries_equal_what_nsys_stats_wrote(report, summary, key):
    verdict = st.compare_summaries(summary(), nsys_csv(report), key)
    assert "nsys stats" in verdict


def test_the_comparison_fails_on_a_changed_value():
    mine = st.api_summary(ns.runtime_calls(TRANSFER))
    theirs = nsys_csv("cuda_api_sum")
    theirs.loc[0, "Num Calls"] += 1
    with pytest.raises(AssertionError, match="Num Calls differs"):
        st.compare_summaries(mine, theirs, "Name")


@pytest.mark.parametrize("raw,shown", [
    ("cudaLaunchKernel_v7000", "cudaLaunchKernel"),          # four-digit version: dropped
    ("cudaMemcpyAsync_v3020", "cudaMemcpyAsync"),
    ("cudaStreamIsCapturing_v10000", "cudaStreamIsCapturing_v10000"),  # five digits: kept, as nsys does
    ("cudaEventRecordWithFlags_v11010", "cudaEventRecordWithFlags_v11010"),
    ("cuGetProcAddress_v2", "cuGetProcAddress_v2"),          # a different function: kept
    ("cuLibraryLoadData", "cuLibraryLoadData"),
    ("_v1234", "_v1234"),                                     # nothing left once stripped: kept
])
def test_api_names_follow_nsys_rule(raw, shown):
    assert st.api_name(raw) == shown


def test_every_api_name_in_the_export_maps_to_a_row_of_nsys_stats():
    names = {st.api_name(n) for n in ns.runtime_calls(TRANSFER)["name"]}
    assert names == set(nsys_csv("cuda_api_sum")["Name"])


def test_kernels_carry_their_launch_configuration():
    k = ns.kernels(TINY)
    for col in ns.LAUNCH_COLUMNS:
        assert col in k
    assert (k["threads"] == k["gridX"] * k["gridY"] * k["gridZ"] * k["blockX"] * k["blockY"] * k["blockZ"]).all()
    assert (k["blockX"] > 0).all() and (k["registersPerThread"] > 0).all()


def steps(path):
    r = ns.nvtx_ranges(path)
    return sorted({t for t in r["text"] if t.startswith("step_")})


def test_nsys_rule_keeps_kernels_of_the_ranges_thread_and_window_rule_adds_autograds():
    names = steps(FEATURES)
    thread = ns.attribute_to_ranges(FEATURES, names, rule="thread")
    window = ns.attribute_to_ranges(FEATURES, names, rule="window")
    ranges = ns.nvtx_ranges(FEATURES)
    owner = set(ranges.loc[ranges["text"].isin(names), "globalTid"])
    assert set(thread["launch_tid"]) <= owner
    assert len(window) > len(thread) and set(window["launch_tid"]) - owner, "backward kernels come from another thread"
    # every kernel of the thread rule is also in the window rule's answer
    assert set(thread["correlationId"]) <= set(window["correlationId"])
    # and every attributed launch lies inside its range
    for df in (thread, window):
        assert ((df["launch_start"] >= df["range_start"]) & (df["launch_start"] <= df["range_end"])).all()


def test_attribution_of_many_ranges_reads_the_file_once(monkeypatch):
    opened = []
    real = ns.open_export

    def counting(path):
        opened.append(path)
        return real(path)

    monkeypatch.setattr(ns, "open_export", counting)
    ns.attribute_to_ranges(FEATURES, steps(FEATURES)[:1], rule="thread")
    one = len(opened)
    opened.clear()
    ns.attribute_to_ranges(FEATURES, steps(FEATURES), rule="thread")
    assert len(opened) == one, "more ranges must not mean more reads of the file"


def test_attribution_by_name_matches_the_one_range_answer():
    for step in ("warmup", "step_0", "step_4"):
        assert len(ns.attribute_to_ranges(TINY, step, rule="thread")) == 200
    both = ns.attribute_to_ranges(TINY, ["step_0", "step_4"], rule="thread")
    assert both.groupby("range_text").size().to_dict() == {"step_0": 200, "step_4": 200}
    assert ns.attribute_to_ranges(TINY, "no_such_range", rule="thread").empty


def test_attribution_rule_is_checked():
    with pytest.raises(ValueError, match="rule must be one of"):
        ta.attribute_kernels(ns.kernels(TINY), ns.runtime_calls(TINY), ns.nvtx_ranges(TINY), rule="closest")


def test_timeline_rows_per_thread_and_a_window_given_by_range_names():
    fig, ax = plt.subplots(figsize=(10, 4))
    draw_timeline(EMIT, window=("step_2", "step_2"), ax=ax, max_depth=0)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    plt.close(fig)
    nvtx_rows = [lab for lab in labels if lab.startswith("NVTX")]
    assert len(nvtx_rows) >= 2, f"the step's thread and autograd's should have rows of their own: {labels}"
    lo, hi = resolve_window(ns.nvtx_ranges(EMIT), ("step_2", "step_2"))
    r = ns.nvtx_ranges(EMIT)
    step = r[r["text"] == "step_2"].iloc[0]
    assert (lo, hi) == (int(step["start"]), int(step["end"]))


def test_window_with_an_unknown_range_name():
    with pytest.raises(KeyError, match="no NVTX range named 'step_99'"):
        resolve_window(ns.nvtx_ranges(TINY), ("step_99", "step_0"))


@pytest.mark.parametrize("text,width,shown", [("forward_pass", 1000, "forward_pass"), ("forward_pass", 40, "forwa\u2026"),
                                              ("forward_pass", 10, "")])
def test_labels_are_cut_to_fit_their_bar(text, width, shown):
    assert fit_label(text, width, fontsize=7, dpi=100) == shown


def test_nvtx_summary_splits_push_pop_from_start_end_ranges():
    """features.sqlite holds both kinds: the start/end range handed to a worker thread is its own style."""
    table = st.nvtx_summary(ns.nvtx_ranges(FEATURES))
    assert list(table.columns[:2]) == ["Style", "Range"]
    summary = table.set_index("Range")
    assert summary.loc[":handed_to_worker", "Style"] == "StartEnd"
    assert (summary.drop(index=":handed_to_worker")["Style"] == "PushPop").all()


def test_the_comparison_fails_on_a_changed_style():
    mine = st.nvtx_summary(ns.nvtx_ranges(TRANSFER))
    theirs = nsys_csv("nvtx_sum")
    theirs.loc[0, "Style"] = "StartEnd"
    with pytest.raises(AssertionError, match="Style differs"):
        st.compare_summaries(mine, theirs, "Range")


def test_attribution_rule_has_no_default():
    """Every attribution reader asks for its rule: the two rules disagree on PyTorch programs,
    and the readers once defaulted to different ones."""
    import inspect

    from gpuprof import activity
    from gpuprof.torch_profiler import summary

    for fn in (ns.attribute_to_ranges, activity.attribute_kernels, activity.range_busy, summary.step_summary):
        assert inspect.signature(fn).parameters["rule"].default is inspect.Parameter.empty, fn.__name__
    with pytest.raises(TypeError, match="rule"):
        ns.attribute_to_ranges(TINY, "step_0")
