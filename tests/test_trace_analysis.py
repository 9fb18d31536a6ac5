"""Derived trace measures, on synthetic intervals with known answers and on the reference capture."""

import numpy as np
import pandas as pd
import pytest

from gpuprof.nsys import sqlite as ns
from gpuprof.nsys import analysis as ta
from gpuprof.nsys import stats as st
from gpuprof.activity import find_steps, step_ranges
from gpuprof.artifacts import REPO_ROOT

SQLITE = REPO_ROOT / "artifacts" / "ch00" / "tiny_kernels.sqlite"


def frame(rows, **extra):
    df = pd.DataFrame(rows, columns=["start", "end"])
    df["duration_ns"] = df["end"] - df["start"]
    for k, v in extra.items():
        df[k] = v
    return df


def test_merge_intervals():
    s, e = ta.merge_intervals(np.array([5, 0, 2, 20]), np.array([8, 3, 4, 25]))
    assert s.tolist() == [0, 5, 20] and e.tolist() == [4, 8, 25]


def test_busy_fraction_counts_overlap_once():
    k = frame([(0, 10), (5, 15), (30, 40)])
    assert ta.busy_fraction(k) == pytest.approx(25 / 40)
    assert ta.busy_fraction(k, window=(0, 100)) == pytest.approx(0.25)


def test_idle_gaps_are_labelled_with_the_cpu_call():
    k = frame([(0, 10), (100, 110), (115, 120)])
    rt = pd.DataFrame({"start": [12, 60], "end": [50, 95], "name": ["cudaStreamSynchronize_v3020", "cudaLaunchKernel_v7000"]})
    gaps = ta.idle_gaps(k, rt, min_gap_ns=20)
    assert gaps[["start", "end", "duration_ns"]].values.tolist() == [[10, 100, 90]]
    assert gaps["cpu_call"][0] == "cudaStreamSynchronize" and gaps["cpu_call_share"][0] == pytest.approx(38 / 90)


def test_a_gap_is_named_by_what_covers_half_of_it():
    # one 100 ns gap (10..110); a 19 ns call, a nested pair and an 8 ns call leave 61 ns outside every call
    k = frame([(0, 10), (110, 120)])
    rt = pd.DataFrame({"start": [12, 40, 42, 80], "end": [31, 50, 48, 88],
                       "name": ["cudaHostAlloc_v3020", "cudaMalloc_v3020", "cuLibraryLoadData", "cudaFree_v3020"]})
    gap = ta.idle_gaps(k, rt, min_gap_ns=20).iloc[0]
    assert gap["cpu_call"] == "cudaHostAlloc" and gap["cpu_call_share"] == pytest.approx(0.19)
    assert gap["covered_share"] == pytest.approx(0.37)  # the nested call counts once
    assert gap["label"] == ta.HOST_CODE
    calls = ta.gap_calls((10, 110), rt).set_index("call")
    assert calls.loc["(outside any CUDA call)", "covered_ns"] == 63
    assert calls.loc["cudaHostAlloc", "share"] == pytest.approx(0.19) and calls.loc["cuLibraryLoadData", "calls"] == 1
    # one call over half the gap names it; calls that together cover most of it, none alone half, do not
    assert ta.idle_gaps(k, rt.assign(end=[70, 50, 48, 88]), min_gap_ns=20)["label"][0] == "cudaHostAlloc"
    spread = pd.DataFrame({"start": [10, 50], "end": [50, 90], "name": ["cudaMalloc_v3020", "cudaFree_v3020"]})
    assert ta.idle_gaps(k, spread, min_gap_ns=20)["label"][0] == "several CUDA calls"
    assert ta.idle_gaps(k, None, min_gap_ns=20)["label"][0] == ta.HOST_CODE


def test_calls_with_work_separates_the_cpu_side_of_a_copy():
    rt = pd.DataFrame({"correlationId": [1, 2], "start": [0, 100], "end": [30, 104],
                       "name": ["cudaMemcpyAsync_v3020", "cudaMemcpyAsync_v3020"]})
    work = frame([(28, 36), (110, 118)], correlationId=[1, 2])
    m = ta.calls_with_work(rt, work).set_index("correlationId")
    assert m.loc[1, ["api_ns", "lead_ns", "end_to_end_ns"]].tolist() == [30, 28, 36]  # staged, then a short DMA
    assert m.loc[2, ["api_ns", "lead_ns", "end_to_end_ns"]].tolist() == [4, 10, 18]   # queued and returned at once
    assert (m["api"] == "cudaMemcpyAsync").all()


def test_outside_drops_rows_that_start_in_a_range():
    df = frame([(0, 5), (10, 12), (20, 30), (40, 41)])
    warm = frame([(9, 15), (18, 25)])
    assert ta.outside(df, warm)["start"].tolist() == [0, 40]
    assert ta.outside(df, warm.iloc[0:0])["start"].tolist() == [0, 10, 20, 40]


def test_copy_compute_overlap_known_cases():
    kernels = frame([(0, 100)], streamId=1)
    hidden = frame([(10, 30), (90, 110)], streamId=2)   # 20 + 10 of 40 under the kernel
    same_stream = frame([(10, 30)], streamId=1)            # same stream: serialised by definition
    assert ta.copy_compute_overlap(hidden, kernels) == pytest.approx(30 / 40)
    assert ta.copy_compute_overlap(same_stream, kernels) == 0.0


def test_overlap_matches_brute_force_on_random_intervals():
    rng = np.random.default_rng(1)
    ks = np.sort(rng.integers(0, 10_000, 300))
    kernels = frame(list(zip(ks, ks + rng.integers(1, 80, 300))), streamId=rng.integers(1, 3, 300))
    cs = np.sort(rng.integers(0, 10_000, 200))
    copies = frame(list(zip(cs, cs + rng.integers(1, 200, 200))), streamId=rng.integers(1, 4, 200))
    hidden = 0
    for c in copies.itertuples():
        covered = np.zeros(c.end - c.start, dtype=bool)
        for k in kernels[kernels["streamId"] != c.streamId].itertuples():
            lo, hi = max(k.start, c.start), min(k.end, c.end)
            if hi > lo:
                covered[lo - c.start:hi - c.start] = True
        hidden += covered.sum()
    assert ta.copy_compute_overlap(copies, kernels) == pytest.approx(hidden / copies["duration_ns"].sum())


def test_sync_wait_share():
    rt = pd.DataFrame({"start": [0, 50, 60], "end": [10, 70, 65],
                       "name": ["cudaDeviceSynchronize_v3020", "cudaStreamSynchronize_v3020", "cudaLaunchKernel_v7000"]})
    assert ta.sync_wait_share(rt, (0, 100)) == pytest.approx(0.3)


def test_kernel_summary_statistics():
    k = frame([(0, 10), (20, 40), (50, 80), (90, 91)])
    k["name"] = ["a", "a", "a", "b"]
    s = st.kernel_summary(k, by="name").set_index("Name")
    assert s.loc["a", "Instances"] == 3 and s.loc["a", "Total Time (ns)"] == 60
    assert s.loc["a", "Med (ns)"] == 20 and s.loc["a", "StdDev (ns)"] == pytest.approx(10.0)
    assert s["Time (%)"].sum() == pytest.approx(100)
    assert list(s.columns) == ["Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Med (ns)", "Min (ns)",
                               "Max (ns)", "StdDev (ns)"]


def test_on_the_reference_capture():
    k, rt = ns.kernels(SQLITE), ns.runtime_calls(SQLITE)
    steps = ns.nvtx_ranges(SQLITE)
    step0 = steps[steps["text"] == "step_0"].iloc[0]
    window = (int(step0["start"]), int(step0["end"]))
    busy = ta.busy_fraction(k, window)
    assert 0 < busy < 0.5, "tiny kernels leave the GPU mostly idle"
    lat = ta.launch_latency(k, rt)
    assert len(lat) == len(k) and (lat > 0).all()
    gaps = ta.idle_gaps(k, rt, min_gap_ns=2_000, window=window)
    assert len(gaps) > 100 and gaps["cpu_call"].str.startswith("cuda").any()
    summary = st.nvtx_summary(steps)
    assert set(summary["Range"]) == {":warmup", ":step_0", ":step_1", ":step_2", ":step_3", ":step_4"}


def test_covered_lengths_count_overlapping_intervals_once():
    from gpuprof.activity import covered_lengths

    starts, ends = np.array([0, 10, 12]), np.array([5, 15, 20])  # [10, 15) and [12, 20) merge into [10, 20)
    got = covered_lengths(starts, ends, np.array([2, 6, 0, 21, 14]), np.array([4, 11, 100, 30, 16]))
    assert got.tolist() == [2, 1, 15, 0, 2]
    assert covered_lengths(np.array([]), np.array([]), np.array([0]), np.array([9])).tolist() == [0]


def test_launch_delays_split_the_call_from_the_queue():
    from gpuprof.activity import launch_delays

    kernels = pd.DataFrame({"correlationId": [1, 2], "start": [130, 500]})
    runtime = pd.DataFrame({"correlationId": [1, 2, 3], "start": [100, 480, 600], "end": [125, 510, 610]})
    d = launch_delays(kernels, runtime)
    assert d["call_ns"].tolist() == [25, 30]
    assert d["from_call_start_ns"].tolist() == [30, 20] == ta.launch_latency(kernels, runtime).tolist()
    assert d["from_call_end_ns"].tolist() == [5, -10]  # the second kernel started before its call returned


# ---- steps ----

def _ranges(names: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"text": names, "start": np.arange(len(names)) * 10, "end": np.arange(len(names)) * 10 + 5,
                         "globalTid": 1})


@pytest.mark.parametrize("names,pattern,steps,rule", [
    (["ProfilerStep#3", "ProfilerStep#4", "step_9"], None, [3, 4], "ProfilerStep"),
    (["warmup", "step_7", "step_8", "forward"], None, [7, 8], "with a number"),
    (["iter 1", "iteration#2"], None, [1, 2], "with a number"),
    (["train_step", "forward", "train_step"], None, [0, 1], "repeated range 'train_step'"),
    (["batch_5", "batch_6", "step_1"], r"batch_(\d+)", [5, 6], "matching"),
    (["forward", "backward"], None, [], "give --steps"),
    (["stepping", "steps"], None, [], "give --steps"),
])
def test_steps_are_found_by_a_stated_rule(names, pattern, steps, rule):
    found, said = find_steps(_ranges(names), pattern)
    assert found["step"].tolist() == steps
    assert rule in said


def test_without_step_names_the_most_repeated_range_is_offered_as_steps():
    found, said = find_steps(_ranges(["forward", "backward", "forward", "optimizer.step (Adam)", "backward", "forward"]))
    assert found.empty and "'forward' (3 times): --steps forward would use it" in said
    again, rule = find_steps(_ranges(["forward", "backward", "forward", "forward"]), "forward")
    assert len(again) == 3 and "matching 'forward'" in rule
    said = find_steps(_ranges(["Optimizer.step#Adam.step", "x", "Optimizer.step#Adam.step"]))[1]
    assert r"--steps 'Optimizer\.step\#Adam\.step' would use it" in said  # quoted as typed in a shell
    assert find_steps(_ranges(["a", "b"]))[1] == "no range looks like a step (give --steps REGEX)"


def test_a_bad_steps_pattern_is_one_sentence():
    from gpuprof.errors import GpuprofError

    with pytest.raises(GpuprofError, match=r"--steps '\(' is not a regular expression .*Escape"):
        find_steps(_ranges(["step_1"]), "(")


def test_step_ranges_are_the_scripts_step_n_sorted_by_start_with_kept_columns():
    ranges = _ranges(["step_2", "warmup", "step_10", "step_x", "my_step_3"]).iloc[[2, 0, 1, 3, 4]]
    ranges["duration_ns"] = ranges["end"] - ranges["start"]
    steps = step_ranges(ranges, keep=["duration_ns"])
    assert steps.columns.tolist() == ["step", "text", "start", "end", "globalTid", "duration_ns"]
    assert steps["text"].tolist() == ["step_2", "step_10"] and steps["step"].tolist() == [2, 10]
    assert steps["start"].is_monotonic_increasing and steps.index.tolist() == [0, 1]
    assert step_ranges(ranges.iloc[0:0]).empty and step_ranges(_ranges(["warmup"])).empty


# --- Service order: the order work ran in against the order it was issued ------------------


def queued(rows):
    """rows: (issued, start, end, stream); one copy each, paired with its CPU call by correlationId."""
    work = pd.DataFrame([(s, e, st, i) for i, (_, s, e, st) in enumerate(rows)],
                        columns=["start", "end", "streamId", "correlationId"])
    calls = pd.DataFrame([(iss, iss + 1, i) for i, (iss, *_) in enumerate(rows)], columns=["start", "end", "correlationId"])
    return work, calls


def test_issue_order_and_runs_known_case():
    # issued a0 b0 a1 b1 a2; ran a0 a1 a2 b0 b1: b0 and b1 each overtaken by the a's issued after them
    work, calls = queued([(0, 10, 20, 1), (1, 50, 60, 2), (2, 20, 30, 1), (3, 60, 70, 2), (4, 30, 40, 1)])
    order = ta.issue_order(work, calls)
    assert order["run_rank"].tolist() == [0, 1, 2, 3, 4]
    assert order["issued"].tolist() == [0, 2, 4, 1, 3] and order["issue_rank"].tolist() == [0, 2, 4, 1, 3]
    served = ta.service_order(order)
    assert (served.items, served.pairs, served.inverted) == (5, 10, 3)  # (b0,a1) (b0,a2) (b1,a2)
    assert served.runs[["streamId", "items", "start", "end"]].values.tolist() == [[1, 3, 10, 40], [2, 2, 50, 70]]
    # stream 1 had nothing left when the GPU moved on; stream 2 is the last run
    assert np.isnan(served.runs["next_issued"]).tolist() == [True, True]
    assert served.longest["items"] == 3


def test_next_issued_says_whether_a_stream_was_drained():
    # a0 runs, then b0; a1 was issued before b0 started (a was not drained), a2 after b1 ended
    work, calls = queued([(0, 10, 20, 1), (1, 20, 30, 2), (5, 30, 40, 1), (6, 40, 50, 2), (60, 70, 80, 1)])
    runs = ta.service_order(ta.issue_order(work, calls)).runs
    assert runs["streamId"].tolist() == [1, 2, 1, 2, 1]
    assert runs["next_issued"].tolist()[:3] == [5, 6, 60]
    assert ta.service_order(ta.issue_order(work.iloc[0:0], calls)).items == 0


def test_inversions_match_brute_force():
    rng = np.random.default_rng(11)
    n = 60
    issued = rng.permutation(n) * 10
    rows = [(int(issued[k]), k * 100, k * 100 + 50, int(rng.integers(0, 3))) for k in range(n)]
    work, calls = queued(rows)
    served = ta.service_order(ta.issue_order(work, calls))
    brute = sum(1 for i in range(n) for j in range(i + 1, n) if issued[i] > issued[j])  # ran i before j, issued after
    assert served.inverted == brute and served.pairs == n * (n - 1) // 2


def test_overlap_ns_known_case():
    gaps = frame([(0, 10), (5, 20), (40, 50)])   # merged: 0-20 and 40-50
    cover = frame([(15, 45), (48, 100)])
    assert ta.overlap_ns(gaps, cover) == 5 + 5 + 2
    assert ta.overlap_ns(gaps, frame([])) == 0
