"""The allocator-log reader (gpuprof.torch_profiler.memory) and the bottleneck checks, on hand-built inputs
with known answers; the chapter applies both to real GPU captures (artifacts/ch05)."""

from __future__ import annotations

import gzip
import json
import pickle

import pandas as pd
import pytest

from gpuprof.errors import GpuprofError
from gpuprof.torch_profiler import diagnose
from gpuprof.torch_profiler import memory as tm
from gpuprof.torch_profiler import trace as tt

from helpers import gpu_events, write  # noqa: E402  (tests/ is on sys.path under pytest)

PHASES = ["0:forward", "0:backward", "0:optimizer_step"]


def _snapshot() -> dict:
    """One step: forward allocates an activation (A, 2048 B) and a temporary (T, 512 B, freed in forward);
    backward frees A and allocates a gradient (G, 1024 B); the optimizer allocates state (S, 1024 B, kept)
    and frees G. Each phase ends with its marker (alloc + free of a marker-sized block)."""
    ev = []

    def alloc(addr, size, name="train.py"):
        ev.append({"action": "alloc", "addr": addr, "size": size, "stream": 0,
                   "frames": [{"filename": "/x/torch/nn/modules/conv.py", "line": 1, "name": "forward"},
                              {"filename": f"/home/me/{name}", "line": 7, "name": "step"}]})

    def free(addr, size):
        ev.append({"action": "free_requested", "addr": addr, "size": size, "stream": 0, "frames": []})
        ev.append({"action": "free_completed", "addr": addr, "size": size, "stream": 0, "frames": []})

    def marker(i):
        alloc(900 + i, tm.marker_bytes(i))
        free(900 + i, tm.marker_bytes(i))

    alloc(1, 2048); alloc(2, 512); free(2, 512); marker(0)          # noqa: E702
    alloc(3, 1024); free(1, 2048); marker(1)                        # noqa: E702
    alloc(4, 1024); free(3, 1024); marker(2)                        # noqa: E702
    return {"segments": [], "device_traces": [ev]}


def test_the_log_becomes_lifetimes_categories_and_a_curve():
    entries = tm.trace_entries(_snapshot())
    assert entries["frame"].iloc[0] == "train.py:7 step"  # the program's own line, not PyTorch's
    clean, ends = tm.split_markers(entries, PHASES)
    assert len(clean) == len(entries) - 9 and ends == [4, 7, 10]
    life = tm.categorise(tm.lifetimes(clean), ends, PHASES)
    by = dict(zip(life["bytes"], life["category"]))
    assert by == {2048: "activations kept for backward", 512: "forward temporaries", 1024: by[1024]}
    assert sorted(life["category"]) == sorted(["activations kept for backward", "forward temporaries", "gradients",
                                                "optimizer state"])
    total = tm.curve(life, len(clean), baseline=100).sum(axis=1)
    assert total.iloc[-1] == 100 + 1024 and total.max() == 100 + 2048 + 1024  # A still held when G is allocated


def test_blocks_are_requests_rounded_up_to_512_bytes():
    assert tm.block_bytes(4) == 512 and tm.block_bytes(512) == 512 and tm.block_bytes(6912) == 7168
    ev = [{"action": "alloc", "addr": 1, "size": 4, "stream": 0}, {"action": "alloc", "addr": 2, "size": 1025, "stream": 0}]
    life = tm.lifetimes(tm.trace_entries({"device_traces": [ev]}))
    assert life["requested"].tolist() == [4, 1025] and life["bytes"].tolist() == [512, 1536]


def test_the_compact_log_round_trips_and_bad_files_get_a_sentence(tmp_path):
    log = tm.compact(_snapshot(), phases=PHASES, baseline_bytes=0)
    path = tmp_path / "log.json.gz"
    path.write_bytes(gzip.compress(json.dumps(log).encode()))
    again = tm.trace_entries(tm.read_snapshot(path))
    assert len(again) == len(log["entries"]) and "frames" not in again
    pick = tmp_path / "s.pickle"
    pick.write_bytes(pickle.dumps(_snapshot()))
    assert len(tm.trace_entries(tm.read_snapshot(pick))) == len(tm.trace_entries(_snapshot()))
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(GpuprofError, match="not a memory log"):
        tm.read_snapshot(tmp_path / "t.json")
    with pytest.raises(GpuprofError, match="without an allocation history"):
        tm.trace_entries({"segments": []})
    with pytest.raises(GpuprofError, match="markers for phase 0"):
        tm.split_markers(tm.trace_entries({"device_traces": [[{"action": "alloc", "addr": 1, "size": 512}]]}),
                         PHASES)


def test_checks_measure_the_hand_built_steps(tmp_path):
    t = tt.read_trace(write(tmp_path, gpu_events()))
    c = diagnose.checks(t).set_index("check")
    # step 4: 100 us long, GPU busy 14 us; step 5: 100 us, busy 30 us -> idle 86% and 70%, median 78%
    assert c.loc["gpu_idle", "value"] == pytest.approx(0.78) and c.loc["gpu_idle", "flagged"]
    # kernels 10, 20, 10 us (median 10) against launches of 5 us: not tiny
    assert c.loc["tiny_kernels", "value"] == pytest.approx(2.0) and not c.loc["tiny_kernels", "flagged"]
    # the pinned copy: 4 us of 44 us busy
    assert c.loc["copies", "value"] == pytest.approx(4 / 44) and not c.loc["pageable_copies", "flagged"]
    text = diagnose.report(t)
    assert "FLAG gpu_idle" in text and "top kernels (2 distinct" in text


def test_checks_on_a_cpu_only_trace_say_none_apply(tmp_path):
    events = [e for e in gpu_events() if e.get("cat") in ("user_annotation", "cpu_op")]
    t = tt.read_trace(write(tmp_path, events))
    assert diagnose.checks(t).empty and "checks: none apply" in diagnose.report(t)


def test_a_log_is_checked_against_the_allocator_s_counters():
    clean, ends = tm.split_markers(tm.trace_entries(_snapshot()), PHASES)
    life = tm.lifetimes(clean)
    assert "within the log's blocks" in tm.check_against_allocator(life, len(clean), 100, 1124, 3172)
    with pytest.raises(GpuprofError, match="log is incomplete"):
        tm.check_against_allocator(life, len(clean), 100, 1124 + 512, 3172)
    with pytest.raises(GpuprofError, match="does not match max_memory_allocated"):
        tm.check_against_allocator(life, len(clean), 100, 1124, 3172 + 512)
    # a block over 1 MiB may be handed out whole: up to 1 MiB more is the allocator's, not a gap in the log
    big = pd.DataFrame({"alloc_event": [0], "free_event": pd.array([pd.NA], dtype="Int64"), "bytes": [3 << 20],
                        "requested": [3 << 20], "frame": [""]})
    assert tm.allocator_slack(big, 2).tolist() == [1 << 20, 1 << 20]
    tm.check_against_allocator(big, 2, 0, (3 << 20) + 4096, (3 << 20) + 4096)
