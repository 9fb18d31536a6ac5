"""``activity.range_busy`` computes every range's busy time, span and launches at once; it must equal the loop
over pandas groups that it replaced (kept here as the reference), on real captures and on awkward random data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpuprof import activity

ROOT = Path(__file__).resolve().parents[1]


def _reference(work: pd.DataFrame, runtime: pd.DataFrame, ranges: pd.DataFrame, *, rule: str) -> pd.DataFrame:
    """range_busy as it was before 2026-11-27: a merge_intervals call per pandas group."""
    cols = ["text", "start", "end", "cpu_ms", "launches", "gpu_busy_ms", "gpu_span_ms", "busy_share"]
    if ranges.empty:
        return pd.DataFrame(columns=cols)
    ranges = ranges.sort_values("start", kind="stable").reset_index(drop=True)
    hits = activity.attribute_kernels(work, runtime, ranges, rule=rule)
    groups = {k: g for k, g in hits.groupby(["range_start", "range_text"], sort=False)} if len(hits) else {}
    rows = []
    for r in ranges.itertuples():
        mine = groups.get((r.start, r.text))
        busy = span = 0.0
        if mine is not None and len(mine):
            ms, me = activity.merge_intervals(mine["start"].to_numpy(), mine["end"].to_numpy())
            busy = float((me - ms).sum())
            span = float(mine["end"].max() - mine["start"].min())
        rows.append({"text": r.text, "start": r.start, "end": r.end, "cpu_ms": (r.end - r.start) / 1e6,
                     "launches": 0 if mine is None else len(mine), "gpu_busy_ms": busy / 1e6, "gpu_span_ms": span / 1e6,
                     "busy_share": busy / span if span else float("nan")})
    return pd.DataFrame(rows, columns=cols)


def _both(work, runtime, ranges, rule):  # type: ignore[no-untyped-def]
    got = activity.range_busy(work, runtime, ranges, rule=rule)
    pd.testing.assert_frame_equal(got, _reference(work, runtime, ranges, rule=rule))
    return got


@pytest.mark.parametrize("name", ["ch06/rung0.sqlite.gz", "ch02/features.sqlite.gz"])
@pytest.mark.parametrize("rule", ["thread", "window"])
def test_equal_on_nsys_captures(name: str, rule: str) -> None:
    from gpuprof.nsys import recipes
    from gpuprof.nsys import sqlite as ns

    path = ROOT / "artifacts" / name
    got = _both(recipes._work(path), ns.runtime_calls(path), ns.nvtx_ranges(path), rule)
    assert got["launches"].sum() > 0


@pytest.mark.parametrize("name", ["ch05/train_steps.json.gz", "ch05/reconcile_256_steps.json.gz"])
def test_equal_on_kineto_steps(name: str) -> None:
    from gpuprof.report.activity_view import load

    view = load(ROOT / "artifacts" / name, "kineto")
    steps = view.steps.assign(text=view.steps["step"].astype(str) + "#" + view.steps.index.astype(str))
    got = _both(view.work.dropna(subset=["correlationId"]), view.runtime.dropna(subset=["correlationId"]), steps, "window")
    assert len(got) >= 3 and got["launches"].min() > 0


def test_equal_on_random_ranges() -> None:
    """Overlapping work on two streams, unsorted, nested and repeated ranges, ranges with the same start and
    another name, ranges without work, work of no length."""
    rng = np.random.default_rng(7)
    n = 3000
    launch = np.sort(rng.integers(0, 1_000_000, n))
    runtime = pd.DataFrame({"start": launch, "end": launch + rng.integers(1, 50, n), "correlationId": np.arange(n),
                            "globalTid": rng.integers(0, 2, n)})
    ks = launch + rng.integers(0, 20_000, n)
    work = pd.DataFrame({"start": ks, "end": ks + rng.integers(0, 3_000, n), "correlationId": np.arange(n)})
    work = work.sample(frac=1.0, random_state=3).reset_index(drop=True)
    rs = rng.integers(0, 1_000_000, 200)
    ranges = pd.DataFrame({"text": [f"r{i % 5}" for i in range(200)], "start": rs, "end": rs + rng.integers(0, 40_000, 200),
                           "globalTid": rng.integers(0, 2, 200)})
    ranges = pd.concat([ranges, ranges.iloc[:20].assign(text="twin"), ranges.iloc[:5]], ignore_index=True)
    ranges.loc[len(ranges)] = ["empty", 2_000_000, 2_000_100, 0]
    for rule in ("window", "thread"):
        got = _both(work, runtime, ranges, rule)
        assert (got["launches"] == 0).any() and (got["launches"] > 1).any()


def test_group_by_group_path_equals(monkeypatch: pytest.MonkeyPatch) -> None:
    """Times far apart (the offsets would overflow int64): the group-by-group path gives the same result."""
    codes = np.array([0, 0, 1, 1, 1, 2])
    starts = np.array([0, 5, 2**61, 2**61 + 10, 2**61 + 3, 7], dtype=np.int64)
    ends = np.array([10, 8, 2**61 + 20, 2**61 + 30, 2**61 + 4, 7], dtype=np.int64)
    busy, span, count = activity._busy_per_group(codes, 3, starts, ends)
    assert busy.tolist() == [10.0, 30.0, 0.0] and count.tolist() == [2, 3, 1]
    assert span.tolist() == [10.0, 30.0, 0.0]
    small = activity._busy_per_group(codes, 3, starts % 1000, ends % 1000)  # the one-pass path
    assert small[0].tolist() == [10.0, 30.0, 0.0]
