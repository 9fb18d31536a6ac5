"""The weight-streaming seed's metric table and report, on synthetic intervals and the real chapter 1 capture."""

import numpy as np
import pandas as pd
import pytest

from gpuprof import nsys_sqlite as ns
from gpuprof import streaming_metrics as sm
from gpuprof import trace_analysis as ta
from gpuprof.artifacts import REPO_ROOT

TRANSFER = REPO_ROOT / "artifacts" / "ch01" / "transfer.sqlite"


def frame(rows):
    df = pd.DataFrame(rows, columns=["start", "end"])
    df["duration_ns"] = df["end"] - df["start"]
    return df


def test_exposed_copy_fraction_known_case():
    copies = frame([(0, 40), (60, 100)])
    kernels = frame([(20, 70)])
    # copy time 80, of which 20 (20-40) + 10 (60-70) under a kernel: 50 exposed over a window of 100
    assert ta.exposed_copy_fraction(copies, kernels, (0, 100)) == pytest.approx(0.5)
    assert ta.exposed_copy_fraction(copies, frame([]), (0, 100)) == pytest.approx(0.8)


def test_exposed_copy_fraction_matches_brute_force():
    rng = np.random.default_rng(7)
    cs = np.sort(rng.integers(0, 5000, 80))
    ks = np.sort(rng.integers(0, 5000, 120))
    copies = frame(list(zip(cs, cs + rng.integers(1, 150, 80))))
    kernels = frame(list(zip(ks, ks + rng.integers(1, 60, 120))))
    copy_on = np.zeros(6000, bool)
    kern_on = np.zeros(6000, bool)
    for c in copies.itertuples():
        copy_on[c.start:c.end] = True
    for k in kernels.itertuples():
        kern_on[k.start:k.end] = True
    expected = (copy_on & ~kern_on)[1000:4000].sum() / 3000
    assert ta.exposed_copy_fraction(copies, kernels, (1000, 4000)) == pytest.approx(expected)


@pytest.fixture(scope="module")
def windows():
    r = ns.nvtx_ranges(TRANSFER)
    return {name: ta.last_repeat_window(r, name, "chunk_0") for name in ("serial", "overlapped")}


def test_serial_versus_overlapped_on_the_real_capture(windows):
    serial = {m.name: m for m in sm.seed_metrics(TRANSFER, windows["serial"], 55.4)}
    over = {m.name: m for m in sm.seed_metrics(TRANSFER, windows["overlapped"], 55.4)}
    assert serial["overlap efficiency"].value < 0.05 and not serial["overlap efficiency"].met
    assert over["overlap efficiency"].met
    assert over["synchronisation wait"].value < serial["synchronisation wait"].value
    assert over["GPU utilisation"].value > serial["GPU utilisation"].value
    assert serial["memory bandwidth utilisation"].value is None  # a trace cannot measure it: said, not invented


def test_recommendations_follow_the_seeds_diagnoses(windows):
    serial = sm.recommendations(sm.seed_metrics(TRANSFER, windows["serial"], 55.4))
    over = sm.recommendations(sm.seed_metrics(TRANSFER, windows["overlapped"], 55.4))
    assert any("serialised" in r for r in serial)
    assert any("Transfer-bound" in r for r in over)


def test_report_holds_measured_values_only(windows):
    metrics = sm.seed_metrics(TRANSFER, windows["overlapped"], 55.4)
    text = sm.fill_report({"layers": 16}, "NVIDIA H200", {"prefetch_distance": 2}, metrics, 3.25)
    assert "XX" not in text and "[" not in text
    assert f"{metrics[0].value:.1%}" in text and "3.25 ms" in text and "not measurable from a trace" in text
