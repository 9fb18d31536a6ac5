"""The readers of chapter 13's captures: each collective's kernel time, the part compute hid and the exposed rest.

Checked three ways: timelines made by hand with a known answer, seeded random timelines against a brute force that
marks every nanosecond (no interval arithmetic of gpuprof's), and the committed references of the 2 x H100 run
against a sweep over their kernels written here, and against HTA's definition.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3

import numpy as np
import pandas as pd
import pytest

from gpuprof.artifacts import REPO_ROOT
from gpuprof.nsys import export_edit, ranks
from gpuprof.nsys import sqlite as ns
from gpuprof.studies import sharded_training as st

REF = REPO_ROOT / "artifacts" / "ch13"
NCCL_STREAM, RS_STREAM, COMPUTE_STREAM = 20, 21, 7


def kernel_rows(rows: list[tuple[str, int, int, int]]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=["name", "streamId", "start", "end"])
    df["duration_ns"] = df["end"] - df["start"]
    df["nccl"] = ranks.is_communication(df["name"])
    return df


def rank_of(kernels: pd.DataFrame, ranges: pd.DataFrame | None = None, runtime: pd.DataFrame | None = None,
            rank: int = 0) -> ranks.RankData:
    return ranks.RankData(rank, rank, kernels, pd.DataFrame() if ranges is None else ranges, "made up", runtime)


# --- by hand --------------------------------------------------------------------------------------------------------

def test_collective_kind_reads_the_collective_from_nccl_kernel_names_old_and_new():
    names = pd.Series(["ncclDevKernel_AllGather_RING_LL", "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL",
                       "ncclKernel_AllReduce_RING_LL_Sum_float", "ncclDevKernel_Broadcast_RING_LL",
                       "ncclDevKernel_SendRecv", "ncclSomethingElse", "sm80_xmma_gemm_f32f32"])
    assert ranks.collective_kind(names).tolist() == ["all_gather", "reduce_scatter", "all_reduce", "broadcast",
                                                     "send_recv", "other", None]


def test_collective_kernels_splits_each_kernel_into_hidden_and_exposed_by_hand():
    k = kernel_rows([
        ("gemm", COMPUTE_STREAM, 0, 10), ("gemm", COMPUTE_STREAM, 20, 30),
        ("ncclDevKernel_AllGather_RING_LL", NCCL_STREAM, 5, 25),           # 5-10 and 20-25 under compute: 10 of 20
        ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", RS_STREAM, 30, 40),  # nothing beside it
        ("copy_in", NCCL_STREAM, 32, 38),                                    # on the all-gather's stream: hides the RS
    ])
    got = ranks.collective_kernels(rank_of(k)).set_index("kind")
    assert got.loc["all_gather", ["duration_ns", "hidden_ns", "exposed_ns"]].tolist() == [20, 10, 10]
    assert got.loc["reduce_scatter", ["duration_ns", "hidden_ns", "exposed_ns"]].tolist() == [10, 6, 4]
    # a compute kernel on the NCCL kernel's own stream does not hide it (it cannot run beside it)
    same = kernel_rows([("ncclDevKernel_AllGather_RING_LL", NCCL_STREAM, 0, 10), ("copy", NCCL_STREAM, 0, 10)])
    assert ranks.collective_kernels(rank_of(same))["hidden_ns"].tolist() == [0]
    # a window clips the kernels to it
    clipped = ranks.collective_kernels(rank_of(k), (8, 22)).set_index("kind")
    assert clipped.loc["all_gather", ["duration_ns", "hidden_ns", "exposed_ns"]].tolist() == [14, 4, 10]
    assert "reduce_scatter" not in clipped.index


def test_synced_windows_run_to_the_end_of_the_threads_next_synchronisation():
    ranges = pd.DataFrame({"text": ["step_0", "step_1"], "start": [0, 100], "end": [50, 150], "globalTid": [1, 1]})
    runtime = pd.DataFrame({"name": ["cudaLaunchKernel_v7000", "cudaDeviceSynchronize_v3020", "cudaStreamSynchronize_v3020",
                                     "cudaDeviceSynchronize_v3020"],
                            "start": [55, 60, 70, 200], "end": [56, 90, 75, 260], "globalTid": [1, 1, 2, 1]})
    w = ranks.synced_windows(ranges, runtime)
    assert w["gpu_end"].tolist() == [90, 260] and w["sync"].tolist() == ["cudaDeviceSynchronize"] * 2
    assert np.isnan(ranks.synced_windows(ranges.assign(end=[50, 300]), runtime)["gpu_end"].iloc[1])


def step_layout() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Two modes of two steps each; the GPU runs past each step's NVTX range until the synchronisation ends."""
    ranges = pd.DataFrame({"text": ["rank_0", "mode_ddp", "step_0", "step_1", "mode_fsdp_reshard", "step_0", "step_1"],
                           "start": [0, 0, 0, 100, 1000, 1000, 1100], "end": [2000, 300, 50, 150, 1300, 1050, 1150],
                           "globalTid": [1] * 7})
    runtime = pd.DataFrame({"name": ["cudaDeviceSynchronize_v3020"] * 4, "start": [51, 151, 1051, 1151],
                            "end": [99, 199, 1099, 1199], "globalTid": [1] * 4})
    k = kernel_rows([("gemm", COMPUTE_STREAM, 0, 90), ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", NCCL_STREAM, 80, 95),
                     ("gemm", COMPUTE_STREAM, 100, 190), ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", NCCL_STREAM, 180, 199),
                     ("ncclDevKernel_AllGather_RING_LL", NCCL_STREAM, 1000, 1010), ("gemm", COMPUTE_STREAM, 1005, 1090),
                     ("ncclDevKernel_AllGather_RING_LL", NCCL_STREAM, 1020, 1030),
                     ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", RS_STREAM, 1025, 1098),
                     ("ncclDevKernel_AllGather_RING_LL", NCCL_STREAM, 1100, 1110), ("gemm", COMPUTE_STREAM, 1110, 1190),
                     ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", RS_STREAM, 1185, 1195)])
    return k, ranges, runtime


def test_collective_table_per_mode_step_and_kind_by_hand():
    k, ranges, runtime = step_layout()
    d = {0: rank_of(k, ranges, runtime)}
    steps = st.mode_steps(d[0])
    assert steps[["mode", "step", "start", "end"]].values.tolist() == [
        ["ddp", 0, 0, 99], ["ddp", 1, 100, 199], ["fsdp_reshard", 0, 1000, 1099], ["fsdp_reshard", 1, 1100, 1199]]
    t = st.collective_table(d).set_index(["mode", "step", "kind"])
    assert t.loc[("ddp", 0, "all_reduce"), ["comm_ms", "hidden_ms", "exposed_ms"]].tolist() == pytest.approx(
        [15e-6, 10e-6, 5e-6])  # the all-reduce ran after the step's NVTX range ended, and is counted
    row = t.loc[("fsdp_reshard", 0)]
    assert row.loc["all_gather", ["kernels", "comm_ms", "hidden_ms", "exposed_ms"]].tolist() == pytest.approx(
        [2, 20e-6, 15e-6, 5e-6])
    assert row.loc["reduce_scatter", ["comm_ms", "hidden_ms", "exposed_ms"]].tolist() == pytest.approx(
        [73e-6, 65e-6, 8e-6])
    # the union: NCCL ran over 1000-1010 and 1020-1098 (88 ns), with no compute over 1000-1005 and 1090-1098
    assert row.loc["any", ["comm_ms", "exposed_ms"]].tolist() == pytest.approx([88e-6, 13e-6])
    summary = st.overlap_summary(st.collective_table(d)).set_index(["mode", "kind"])
    assert summary.loc[("fsdp_reshard", "all_gather"), "hidden_share"] == pytest.approx(15 / 30)
    worst = st.exposed_collectives(d, "fsdp_reshard", top=1)
    # step 1 has one all-gather, exposed 10 ns (the compute starts as it ends); step 0 two, the first exposed 5 ns
    assert worst[["kind", "position", "of", "exposed_ms"]].values.tolist() == [["all_gather", 0, 1, pytest.approx(10e-6)]]
    with pytest.raises(st.GpuprofError, match="runtime=True"):
        st.mode_steps(rank_of(k, ranges))


# --- brute force --------------------------------------------------------------------------------------------------

def brute_force(k: pd.DataFrame, horizon: int) -> tuple[dict[str, tuple[int, int]], int, int]:
    """Per kind (duration, hidden) and the union's (wall time, exposed), by marking every nanosecond."""
    kinds = ranks.collective_kind(k["name"])
    out: dict[str, list[int]] = {}
    union = np.zeros(horizon, dtype=bool)
    any_compute = np.zeros(horizon, dtype=bool)
    for r in k[~k["nccl"]].itertuples():
        any_compute[r.start:r.end] = True
    for r, kind in zip(k[k["nccl"]].itertuples(), kinds[k["nccl"]]):
        beside = np.zeros(horizon, dtype=bool)
        for c in k[~k["nccl"] & (k["streamId"] != r.streamId)].itertuples():
            beside[c.start:c.end] = True
        mine = np.zeros(horizon, dtype=bool)
        mine[r.start:r.end] = True
        union |= mine
        acc = out.setdefault(kind, [0, 0])
        acc[0] += int(mine.sum())
        acc[1] += int((mine & beside).sum())
    return {k: (a, b) for k, (a, b) in out.items()}, int(union.sum()), int((union & ~any_compute).sum())


@pytest.mark.parametrize("seed", range(6))
def test_the_readers_equal_a_brute_force_on_random_timelines(seed):
    rng = np.random.default_rng(seed)
    horizon = 2000
    rows = []
    names = {NCCL_STREAM: "ncclDevKernel_AllGather_RING_LL", RS_STREAM: "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL"}
    for stream in (COMPUTE_STREAM, 8, NCCL_STREAM, RS_STREAM):
        t = 0
        while True:
            t += int(rng.integers(0, 60))
            length = int(rng.integers(1, 80))
            if t + length >= horizon:
                break
            # a few non-NCCL kernels on the NCCL streams too (FSDP2's copy-in and copy-out kernels live there)
            name = names.get(stream, "gemm") if stream in names and rng.random() > 0.2 else "elementwise"
            rows.append((name, stream, t, t + length))
            t += length
    k = kernel_rows(rows)
    per_kind, union, exposed = brute_force(k, horizon)
    got = ranks.collective_kernels(rank_of(k)).groupby("kind")[["duration_ns", "hidden_ns"]].sum()
    assert {kind: (int(r.duration_ns), int(r.hidden_ns)) for kind, r in got.iterrows()} == per_kind
    ranges = pd.DataFrame({"text": ["step_0"], "start": [0], "end": [10], "globalTid": [1]})
    runtime = pd.DataFrame({"name": ["cudaDeviceSynchronize"], "start": [20], "end": [horizon], "globalTid": [1]})
    table = st.collective_table({0: rank_of(k, ranges, runtime)}).set_index("kind")
    assert round(table.loc["any", "comm_ms"] * 1e6) == union
    assert round(table.loc["any", "exposed_ms"] * 1e6) == exposed


# --- the committed references (2 x H100, 2026-11-27) ------------------------------------------------------------

@pytest.fixture(scope="module")
def modes() -> dict[int, ranks.RankData]:
    return ranks.rank_data([REF / "modes_rank0.sqlite.gz", REF / "modes_rank1.sqlite.gz"], runtime=True)


def sweep_hidden(nccl: pd.DataFrame, compute: pd.DataFrame) -> int:
    """Hidden ns of each NCCL kernel under compute on other streams, by walking sorted boundaries (no merging helper)."""
    total = 0
    starts, ends, streams = (compute[c].to_numpy() for c in ("start", "end", "streamId"))
    for r in nccl.itertuples():
        pick = (ends > r.start) & (starts < r.end) & (streams != r.streamId)
        pieces = sorted(zip(np.maximum(starts[pick], r.start), np.minimum(ends[pick], r.end)))
        reach = r.start
        for a, b in pieces:
            a = max(a, reach)
            if b > a:
                total += int(b - a)
                reach = b
    return total


def test_the_reference_tables_agree_with_a_sweep_and_add_up(modes):
    table = st.collective_table(modes)
    assert set(table["mode"]) == {"ddp", "fsdp_reshard", "fsdp_keep"} and (table.groupby(["rank", "mode"]).step.nunique() == 5).all()
    assert np.allclose(table["hidden_ms"] + table["exposed_ms"], table["comm_ms"])
    kernels = table[table["kind"] != "any"].groupby(["rank", "mode", "kind"])["kernels"].median()
    # FSDP2 gathers the root and 16 layer units in forward and the 16 again in backward when it reshards
    assert kernels[(0, "fsdp_reshard", "all_gather")] == 33 and kernels[(0, "fsdp_keep", "all_gather")] == 17
    assert kernels[(0, "fsdp_reshard", "reduce_scatter")] == 17
    d = modes[1]
    s = st.mode_steps(d).query("mode == 'fsdp_reshard' and step == 2").iloc[0]
    nccl = d.nccl[(d.nccl["start"] >= s.start) & (d.nccl["start"] < s.end)]
    compute = d.compute[(d.compute["end"] > s.start) & (d.compute["start"] < s.end)]
    mine = table.query("rank == 1 and mode == 'fsdp_reshard' and step == 2 and kind != 'any'")
    assert round(mine["hidden_ms"].sum() * 1e6) == sweep_hidden(nccl, compute)


def test_the_reference_share_equals_htas_definition(modes):
    beside = st.hta_beside(modes)
    assert len(beside) == 6 and beside["difference"].abs().max() < 1e-12


def test_the_units_order_matches_the_kernels_durations(modes):
    record = json.loads((REF / "modes.json").read_text())["ranks"][0]
    t = st.transfer_times(modes, record)
    med = t.groupby(["mode", "kind", "unit"])["ms"].median()
    for (mode, kind), g in med.groupby(level=[0, 1]):
        # the root (133 M parameters against 50 M a layer) takes over 1.5x the median layer unit, in each mode and kind
        assert g.xs(0, level="unit").iloc[0] > 1.5 * g.drop(0, level="unit").median(), (mode, kind)
    rows = st.link_rows(t)
    assert {r["bytes"] for r in rows} == {133173248 * 4, 50358272 * 4}


def test_prediction_divides_the_optimizer_among_the_shards():
    units = st.unit_costs(4, 8.0, 16.0, 4e6, 4e6)
    p = st.predict_by_scale(units, st.Link(100.0, 1.0), 12.0, scales=(2, 4)).set_index(["gpus", "mode"])
    assert p.loc[(2, "ddp"), "compute_ms"] == pytest.approx(36.0)
    assert p.loc[(4, "fsdp_reshard"), "compute_ms"] == pytest.approx(24 + 3.0)


def test_trim_reference_keeps_given_windows_and_the_named_calls(tmp_path):
    path = tmp_path / "r.sqlite"
    with gzip.open(REF / "pf_2_rank0.sqlite.gz") as fi, open(path, "wb") as fo:
        shutil.copyfileobj(fi, fo)
    before = ns.kernels(path, launch=False)
    lo, hi = int(before["start"].iloc[100]), int(before["start"].iloc[199])
    note = export_edit.trim_reference(path, keep_windows=[(lo, hi)], keep_calls="DeviceSynchronize")
    assert len(ns.kernels(path, launch=False)) == 100 and "100 of" in note and "1 given GPU windows" in note
    calls = ns.runtime_calls(path)
    assert len(calls) and calls["name"].str.contains("DeviceSynchronize").all()
    with pytest.raises(ValueError):
        export_edit.trim_reference(path, keep_windows=[(0, 1)], keep_kernels_in="step_0")
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM NVTX_EVENTS").fetchone()[0] > 0


def test_arrival_skew_on_the_reference_names_the_rank_that_waited(modes):
    skew = st.arrival_skew(modes).set_index(["mode", "kind"])
    assert len(skew) == 5 and (skew["rank"] == 1).all() and (skew["collectives"] > 0).all()
    keep = skew.loc[("fsdp_keep", "reduce_scatter")]
    # in fsdp_keep rank 0 reached its reduce-scatters first nearly every time, by about a millisecond
    assert keep["rank0_first_share"] > 0.9 and keep["rank0_minus_rank_ms"] < -0.5
    assert abs(skew.loc[("fsdp_reshard", "all_gather"), "rank0_minus_rank_ms"]) < 0.1
