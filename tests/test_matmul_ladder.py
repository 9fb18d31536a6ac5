"""The matrix-multiply ladder's readers (chapter 11), on the committed reference runs."""

from __future__ import annotations

import copy
import json

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
    points = ml.roofline_points(rep, 2 * 4096 ** 3)
    # the tensor counters count FLOPs (2 per multiply-add): rungs 5-8 did exactly 2 M N K of them
    assert points.loc[5:, "tensor_ops_over_flops"].round(6).eq(1).all()
    assert (points["hmma_roof"] / points["hgmma_roof"]).round(2).eq(0.67).all()


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
