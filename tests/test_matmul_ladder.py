"""The matrix-multiply ladder's readers (chapter 11), on the committed reference runs."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from gpuprof.artifacts import REPO_ROOT
from gpuprof.ncu.report import ncu_report_available
from gpuprof.studies import matmul_ladder as ml

REF = REPO_ROOT / "artifacts" / "ch11"


@pytest.fixture(scope="module")
def data():
    return json.loads((REF / "ladder.json").read_text())


def test_timing_table_ratios_are_taken_within_each_process(data):
    table = ml.timing_table(data)
    assert list(table[table["rung"].notna()]["rung"]) == list(range(1, 9))
    assert table.loc[ml.REFERENCE, "of_cublas"] == pytest.approx(1.0)
    # a rung's share of cuBLAS is the median of per-process ratios, not a ratio of medians
    run_ratios = sorted(ml.run_rate(r, "ladder_7_wgmma_tma") / ml.run_rate(r, ml.REFERENCE) for r in data["runs"])
    assert table.loc["ladder_7_wgmma_tma", "of_cublas"] == pytest.approx(run_ratios[1])
    assert table.loc["ladder_7_wgmma_tma", "of_cublas_low"] == pytest.approx(run_ratios[0])


def test_targets_and_step_claims_hold_on_the_reference_and_fail_when_a_rung_regresses(data):
    goal = ml.targets(data)
    assert goal["best_rung"] in (7, 8) and goal["best_of_cublas_low"] >= 0.7 and goal["naive_to_best_low"] >= 50
    assert all(c["ok"] for c in ml.step_claims(ml.timing_table(data)).values())
    slow = copy.deepcopy(data)
    for run in slow["runs"]:
        for r in run["results"]:
            if r["name"] == "ladder_6_pipelined":
                r["rate"] /= 2  # rung 6 now slower than rung 5
    claims = ml.step_claims(ml.timing_table(slow))
    assert not claims[6]["ok"] and claims[5]["ok"]
    # each claim is written with the bound it is tested against
    assert claims[6]["claim"].endswith("(checked: at least 1.2x)") and claims[4]["claim"].endswith("(checked: at least 0.85x)")


def test_every_rung_was_checked_on_three_shapes(data):
    checks = ml.check_table(data)
    assert list(checks.index) == list(range(1, 9)) and checks.shape[1] == 3
    assert (checks <= data["runs"][0]["tolerance"]).all().all()


@pytest.mark.skipif(not ncu_report_available(), reason="NVIDIA's ncu_report module is not installed here")
def test_counter_readers_on_the_reference_report():
    rep = REF / "rungs.ncu-rep"
    counters, ops, stalls = ml.counter_table(rep), ml.opcode_table(rep), ml.stall_mix(rep)
    assert list(counters.index) == list(range(1, 9))
    assert ml.math_instructions(ops) == {1: "FFMA", 2: "FFMA", 3: "FFMA", 4: "FFMA", 5: "HMMA", 6: "HMMA", 7: "HGMMA",
                                         8: "HGMMA"}
    assert stalls.sum(axis=1).round(6).eq(1).all()
    v = ml.verdicts(counters, ops, stalls)
    assert set(v) == {"1->2", "2->3", "3->4", "4->5", "5->6", "6->7", "7->8"} and all(x["ok"] for x in v.values())
    # the reading must be able to fail: give rung 4 rung 3's conflicts back
    worse = counters.copy()
    worse.loc[4, "bank_conflicts_M"] = worse.loc[3, "bank_conflicts_M"]
    assert not ml.verdicts(worse, ops, stalls)["3->4"]["ok"]
    loads = ml.global_load_table(rep)
    # rung 4's conflict-free loads touch twice the sectors per request (16 -> 32) and the L1 catches the second touch
    assert loads.loc[3, "sectors_per_request"] == 16 and loads.loc[4, "sectors_per_request"] == 32
    assert loads.loc[4, "l1_hit_pct"] > 45 > 15 > loads.loc[3, "l1_hit_pct"]
    # ... and its C stores touch half the sectors (step 64 instead of 4), which is most of the L2 bytes it saves:
    # less the stores' sectors, the L2's bytes hardly move (the L1 caught the loads' second touch)
    assert round(loads.loc[3, "store_sectors_per_request"]) == 32 and round(loads.loc[4, "store_sectors_per_request"]) == 16
    assert abs(loads.loc[4, "l2_bytes_less_stores"] / loads.loc[3, "l2_bytes_less_stores"] - 1) < 0.05
    assert loads.loc[4, "l2_bytes"] / loads.loc[3, "l2_bytes"] < 0.9
    points = ml.roofline_points(rep, 2 * 4096 ** 3)
    # the tensor counters count FLOPs (2 per multiply-add): rungs 5-8 did exactly 2 M N K of them
    assert points.loc[5:, "tensor_ops_over_flops"].round(6).eq(1).all()
    assert (points["hmma_roof"] / points["hgmma_roof"]).round(2).eq(0.67).all()
    # a rung's FLOP per cycle is over ncu's counted Elapsed Cycles, not duration x a clock counter (which gave
    # rung 8 437,359, 80.9% of wgmma's peak, where its 319,035 counted cycles give 430,796, 79.7%)
    assert round(points.loc[8, "flop_per_cycle"]) == 430_796 and points.loc[8, "elapsed_cycles"] == 319_035
    assert (points["flop_per_cycle"] * points["elapsed_cycles"]).round().eq(2 * 4096 ** 3).all()
    assert round(points.loc[6, "counted_ghz"], 3) == 1.435 and round(points.loc[1, "counted_ghz"], 2) == 1.59


def test_line_claims_on_the_reference_lines():
    rows = json.loads((REF / "lines.json").read_text())
    claims = ml.line_claims(rows)
    assert claims["5"]["ok"] and claims["7->8"]["ok"]
    no_overlap = [dict(r, smsp__pcsamp_sample_count=r["smsp__pcsamp_sample_count"] * (0.01 if "wait_group" in r["source"]
                                                                                     and r["kernel"].startswith("ladder_7") else 1))
                  for r in rows]
    assert not ml.line_claims(no_overlap)["7->8"]["ok"]
    assert "(checked: at least 40%)" in claims["7->8"]["text"] and claims["5"]["text"].endswith("(checked: at least 25%)")
    hot = ml.hot_lines(rows)
    assert set(hot["rung"]) == set(ml.LINE_RUNGS)


# ---- issue 39's rungs 9 and 10: what the CPU can hold of them (the GPU check is the lead's) ----

LADDER = REPO_ROOT / "examples" / "nsight_compute" / "matmul_ladder.py"
CU = LADDER.with_name("matmul_ladder.cu")
NVCC = __import__("shutil").which("nvcc")


@pytest.fixture(scope="module")
def script():
    from gpuprof.runner import load_script

    return load_script(LADDER)


@pytest.mark.parametrize("tiles_m, tiles_n, group_m", [(5, 3, 2), (64, 32, 16), (64, 43, 16), (7, 3, 16), (1, 9, 4),
                                                       (13, 1, 4), (32, 16, 1)])
def test_the_grouped_tile_order_takes_every_tile_once_group_by_group(script, tiles_m, tiles_n, group_m):
    order = script.tile_order(tiles_m, tiles_n, group_m)
    assert sorted(order) == [(m, n) for m in range(tiles_m) for n in range(tiles_n)]
    # tile t's group is t // (group_m * tiles_n); inside it the rows run fastest, then the columns
    for t, (m, n) in enumerate(order):
        group, in_group = divmod(t, group_m * tiles_n)
        rows = min(tiles_m - group * group_m, group_m)
        assert (m - group * group_m, n) == (in_group % rows, in_group // rows)
    if group_m == 1:  # a group of one row is the row-by-row order of rungs 7-8's blockIdx
        assert order == [(m, n) for m in range(tiles_m) for n in range(tiles_n)]


def test_the_grouped_order_by_hand():
    from gpuprof.runner import load_script

    order = load_script(LADDER).tile_order(5, 3, 2)
    assert order == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (2, 0), (3, 0), (2, 1), (3, 1), (2, 2), (3, 2),
                     (4, 0), (4, 1), (4, 2)]
    with pytest.raises(ValueError):
        load_script(LADDER).tile_order(5, 3, 0)


def test_the_grouped_order_keeps_a_wave_of_132_tiles_on_fewer_rows_of_a_and_w(script):
    """At 8192^3 (64 x 32 tiles of 128 x 256) the first 132 tiles, one per SM of an H100, need these
    rows of A and W in L2: the .cu's comment on rung 9 quotes them."""
    def footprint(order):
        wave = order[:132]
        return len({m for m, _ in wave}) * 128, len({n for _, n in wave}) * 256

    assert footprint(script.tile_order(64, 32, 1)) == (640, 8192)  # blockIdx order: 5 rows, all 32 columns
    assert footprint(script.tile_order(64, 32, script.GROUP_M)) == (2048, 2304)  # 16 rows, 9 columns
    text = CU.read_text()
    assert "2,048 rows of A and 2,304 of W" in text and "640 rows of A and all 8,192 of W" in text


@pytest.mark.parametrize("rung", [9, 10])
@pytest.mark.parametrize("m, n", [(512, 512), (1000, 1000), (777, 520), (8192, 8192), (8192, 11008), (16384, 16384)])
def test_every_block_of_a_persistent_rung_stores_each_tile_once(script, rung, m, n):
    spec = script.RUNGS[rung]
    tiles_m, tiles_n = -(-m // spec.tile[0]), -(-n // spec.tile[1])
    rows, cols = script.unit_grid(rung, m, n)
    for clusters in (min(rows * cols, 132 // spec.cluster), script.SMALL_GRID):
        blocks = script.block_tiles(rung, m, n, clusters)
        assert len(blocks) == clusters * spec.cluster
        stored = [tile for block in blocks for tile in block]
        assert sorted(stored) == [(i, j) for i in range(tiles_m) for j in range(tiles_n)]
        if spec.cluster == 2:  # the two blocks of a cluster: rows 2p and 2p + 1 of one column (the second
            for first, second in zip(blocks[0::2], blocks[1::2]):  # stores nothing past M's edge)
                assert all(m0 % 2 == 0 for m0, _ in first)
                assert [(m1 - 1, n1) for m1, n1 in second] == [(m0, n0) for m0, n0 in first if m0 + 1 < tiles_m]


def test_the_new_rungs_in_the_help_and_their_shape_rules(script):
    assert {9, 10} <= set(script.RUNGS) and script.RUNGS[10].cluster == 2 and script.RUNGS[9].persistent
    out = subprocess.run([sys.executable, str(LADDER), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    for r in (9, 10):
        assert f" {r}  {script.RUNGS[r].kernel} " in out.stdout.replace("\n", " ")
    assert "--group-m" in out.stdout
    # a persistent rung has no gridDim.y limit: M of 65,535 x 128 + 1 rows is a shape it takes
    assert script.fits(9, 65535 * 128 + 1, 256, 64) is None and "65,535" in script.fits(7, 65535 * 128 + 1, 256, 64)
    assert "multiples of 8" in script.fits(10, 64, 64, 60)


@pytest.mark.skipif(not NVCC, reason="nvcc is not installed here")
def test_the_cuda_tile_order_is_the_python_model(script, tmp_path):
    """grouped_tile in matmul_ladder.cu, compiled for the CPU (no GPU needed), gives tile_order's answer."""
    main = tmp_path / "order.cu"
    main.write_text(f'#include "{CU}"\n#include <cstdio>\n#include <cstdlib>\n'
                    "int main(int argc, char** argv) {\n"
                    "  const int tm = atoi(argv[1]), tn = atoi(argv[2]), g = atoi(argv[3]);\n"
                    "  for (int t = 0; t < tm * tn; ++t) { int a, b; grouped_tile(t, tm, tn, g, &a, &b); "
                    'printf("%d %d\\n", a, b); }\n  return 0;\n}\n')
    exe = tmp_path / "order"
    build = subprocess.run([NVCC, "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-o", str(exe), str(main)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    for shape in [(5, 3, 2), (64, 43, 16), (7, 3, 16), (43, 7, 8), (4, 5, 1)]:
        out = subprocess.run([str(exe), *map(str, shape)], capture_output=True, text=True, timeout=60, check=True)
        got = [tuple(map(int, line.split())) for line in out.stdout.splitlines()]
        assert got == script.tile_order(*shape), shape


def test_the_check_table_keeps_the_worse_of_a_persistent_rungs_two_grids():
    checks = [{"rung": 9, "shape": [512, 512, 512], "relative_error": 1e-7, "ok": True, "grid_blocks": 8},
              {"rung": 9, "shape": [512, 512, 512], "relative_error": 2e-3, "ok": False, "grid_blocks": 3},
              {"rung": 8, "shape": [512, 512, 512], "relative_error": 0.0, "ok": True}]
    table = ml.check_table({"runs": [{"checks": checks}]})
    assert table.loc[9, "512 x 512 x 512"] == 2e-3 and table.loc[8, "512 x 512 x 512"] == 0.0
