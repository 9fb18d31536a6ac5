"""The paths that keep ``python -m gpuprof report`` within memory on exports of millions of kernels
(issue 38, item 6) give what the plain computations give: each is checked against the plain one, on
the course's captures and on synthetic tables built to hit its edges (step boundaries, missing ids,
names repeated across steps). Their time and memory are measured by a benchmark, never here."""

import numpy as np
import pandas as pd
import pytest

from gpuprof import activity
from gpuprof.artifacts import REPO_ROOT
from gpuprof.nsys import sqlite as ns
from gpuprof.nsys import stats
from gpuprof.report import activity_view as av

SQLITE = REPO_ROOT / "artifacts" / "ch00" / "tiny_kernels.sqlite"
RUNG0 = REPO_ROOT / "artifacts" / "ch06" / "rung0.sqlite"  # kernels inside NVTX ranges and outside them, two threads


def test_reading_in_steps_gives_the_rows_of_one_read(monkeypatch):
    whole_k, whole_r = ns.kernels(SQLITE, launch=False), ns.runtime_calls(SQLITE)
    monkeypatch.setattr(ns, "READ_CHUNK_ROWS", 7)  # many steps, the last one short
    pd.testing.assert_frame_equal(ns.kernels(SQLITE, launch=False), whole_k)
    pd.testing.assert_frame_equal(ns.runtime_calls(SQLITE), whole_r)
    with ns.open_export(SQLITE) as conn:  # and both are the file's rows, read by pandas on its own
        plain = pd.read_sql_query("SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start", conn)
    assert (whole_k["start"].to_numpy() == plain["start"].to_numpy()).all()
    assert (whole_k["end"].to_numpy() == plain["end"].to_numpy()).all()


def test_a_window_reads_the_rows_that_overlap_it():
    k, r = ns.kernels(SQLITE, launch=False), ns.runtime_calls(SQLITE)
    lo = int(k["start"].iloc[300]) + 1  # inside a kernel: that kernel overlaps the window, so it is read
    hi = int(k["end"].iloc[420])
    for whole, part in ((k, ns.kernels(SQLITE, launch=False, window=(lo, hi))),
                        (r, ns.runtime_calls(SQLITE, window=(lo, hi)))):
        want = whole[(whole["end"] > lo) & (whole["start"] < hi)].reset_index(drop=True)
        assert 0 < len(want) < len(whole)
        pd.testing.assert_frame_equal(part, want)


def test_name_codes_are_pandas_factorize_across_steps(monkeypatch):
    monkeypatch.setattr(activity, "FACTORIZE_CHUNK_ROWS", 3)
    values = pd.Series(["b", "a", None, "b", np.nan, "c", "a", "a", None, "d", "b"], dtype=object)
    codes, uniques = activity.name_codes(values)
    want_codes, want_uniques = pd.factorize(values, use_na_sentinel=False)
    assert codes.tolist() == want_codes.tolist()
    assert [None if pd.isna(u) else u for u in uniques] == [None if pd.isna(u) else u for u in want_uniques]


def _kernels_and_calls():
    # ids 1..6; id 3 is a graph launch (two kernels), id 9 has no call, call 5 launched nothing
    kernels = pd.DataFrame({"start": [10, 20, 30, 31, 40, 50, 60], "correlationId": [2, 1, 3, 3, 9, 4, 6],
                            "name": list("abcdefg")})
    calls = pd.DataFrame({"start": [1, 2, 3, 4, 5, 6], "end": [2, 3, 4, 5, 6, 7], "correlationId": [6, 5, 4, 3, 2, 1],
                          "globalTid": [11, 11, 12, 11, 12, 11]})
    return kernels, calls


def test_launches_on_arrays_are_the_merge():
    kernels, calls = _kernels_and_calls()
    merged = kernels.merge(calls[["correlationId", "start", "globalTid"]]
                           .rename(columns={"start": "launch_start", "globalTid": "launch_tid"}),
                           on="correlationId", how="inner")
    got = activity.launches_of(kernels, calls)
    pd.testing.assert_frame_equal(got, merged)
    assert len(got) == 6 and 9 not in got["correlationId"].tolist()
    doubled = pd.concat([calls, calls.iloc[[0]]], ignore_index=True)  # an id twice: the merge's own rows
    pd.testing.assert_frame_equal(activity.launches_of(kernels, doubled),
                                  kernels.merge(doubled[["correlationId", "start", "globalTid"]]
                                                .rename(columns={"start": "launch_start", "globalTid": "launch_tid"}),
                                                on="correlationId", how="inner"))


def test_merging_sorted_and_shuffled_intervals_agree():
    rng = np.random.default_rng(7)
    s = np.sort(rng.integers(0, 10_000, 500))
    e = s + rng.integers(0, 60, 500)
    order = rng.permutation(500)
    a, b = activity.merge_intervals(s, e), activity.merge_intervals(s[order], e[order])
    assert (a[0] == b[0]).all() and (a[1] == b[1]).all()
    assert (a[0][1:] > a[1][:-1]).all()  # disjoint, touching intervals joined


def test_busy_time_equals_the_clipped_union():
    rng = np.random.default_rng(11)
    s = rng.integers(0, 100_000, 2_000)
    df = pd.DataFrame({"start": s, "end": s + rng.integers(1, 300, 2_000)})
    segs = [(0, 5), (1_000, 20_000), (20_000, 20_137), (50_050, 99_990), (120_000, 130_000)]
    ms, me = activity.merge_intervals(df["start"].to_numpy(), df["end"].to_numpy())
    want = sum(int((np.clip(me, lo, hi) - np.clip(ms, lo, hi)).sum()) for lo, hi in segs)
    assert av._busy_ns(df, segs) == want == av._busy_ns((ms, me), segs)


def test_the_short_gaps_row_counts_every_gap_under_the_threshold():
    view = av.load(SQLITE, "nsys")
    idle = av.idle_by_cause(view)
    gaps = pd.concat([activity.idle_gaps(view.work, None, min_gap_ns=1, window=seg) for seg in view.segments])
    short = gaps[gaps["duration_ns"] < av.IDLE_MIN_GAP_NS]
    row = idle[idle["cause"] == av.CAUSES["short"]]
    assert len(short) > 100 and int(row["gaps"].iloc[0]) == len(short)
    assert row["idle_ms"].iloc[0] == pytest.approx(short["duration_ns"].sum() / 1e6, rel=1e-12)
    assert idle["idle_ms"].sum() == pytest.approx(av.headline(view)["idle_ms"], rel=1e-9)


def test_kernels_outside_every_range_grouped_by_one_key_as_by_three(monkeypatch):
    k, r, g = ns.kernels(RUNG0, launch=False), ns.runtime_calls(RUNG0), ns.nvtx_ranges(RUNG0)
    fast = stats.nvtx_kern_summary(k, r, g)
    assert (fast["NVTX Range"] == "").sum() > 5 and fast["TID"].nunique() == 2
    monkeypatch.setattr(stats, "_outside_groups", lambda launches, away: None)  # the three-key grouping
    pd.testing.assert_frame_equal(fast, stats.nvtx_kern_summary(k, r, g))


def test_gaps_answered_together_equal_gaps_answered_one_by_one():
    rng = np.random.default_rng(5)
    ks = np.sort(rng.integers(0, 2_000_000, 3_000))
    kernels = pd.DataFrame({"start": ks, "end": ks + rng.integers(1, 400, 3_000)})
    cs = np.sort(rng.integers(0, 2_000_000, 6_000))
    dur = np.where(rng.random(6_000) < 0.01, rng.integers(20_000, 300_000, 6_000), rng.integers(0, 900, 6_000))
    dur[::97] = 0  # calls of no length
    runtime = pd.DataFrame({"start": cs, "end": cs + dur, "name": rng.choice(["cudaLaunchKernel", "cudaMemcpyAsync_v3020",
                                                                              "cudaStreamSynchronize"], 6_000)})
    long = runtime[dur > 10_000]  # a twin of each long call, another name: overlaps that tie, the first kept
    runtime = pd.concat([runtime, long.assign(name="cudaDeviceSynchronize")]).sort_values("start", kind="stable",
                                                                                         ignore_index=True)
    cs, dur = runtime["start"].to_numpy(), (runtime["end"] - runtime["start"]).to_numpy()
    together = activity.idle_gaps(kernels, runtime, min_gap_ns=1_000)
    # float times take the call-by-call path, the one every gap took before
    one_by_one = activity.idle_gaps(kernels, runtime.assign(start=cs.astype(float), end=(cs + dur).astype(float)),
                                    min_gap_ns=1_000)
    pd.testing.assert_frame_equal(together, one_by_one)
    assert (together["cpu_call"] != "").sum() > 200 and (together["covered_share"] > together["cpu_call_share"]).any()
    assert (together["cpu_call"] == "cudaDeviceSynchronize").sum() == 0  # a twin never wins its tie
