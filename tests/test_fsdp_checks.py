"""Chapter 13's second set of readers and the issue's checks at more GPUs.

The compute stream's idle time, the hidden share counted on it alone, the kernels by stream, a collective's place
in the step, the clock check and the step spread: by hand on made-up timelines, and on the committed 2 x H100
references against sums written here. The four-GPU checks (state share, the prediction beside the measurement,
the hidden share per collective) on synthetic records whose answers are known, and ``scripts/check_ch13.py`` on
the references and on a made-up run that must fail. ``scripts/capture_ch13.sh``: every flag it gives
``fsdp_training.py`` is one of its parser's, and a short run on the CPU with a stand-in for nsys packs the tarball.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pandas as pd
import pytest

from gpuprof.artifacts import REPO_ROOT
from gpuprof.nsys import ranks
from gpuprof.studies import sharded_training as st

REF = REPO_ROOT / "artifacts" / "ch13"
SCRIPT = REPO_ROOT / "scripts" / "capture_ch13.sh"
CHECK = REPO_ROOT / "scripts" / "check_ch13.py"
COMPUTE, SIDE, AG, RS = 7, 18, 22, 26
AG_NAME, RS_NAME = "ncclDevKernel_AllGather_RING_LL", "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL"


def kernels(rows: list[tuple[str, int, int, int]]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=["name", "streamId", "start", "end"])
    df["duration_ns"] = df["end"] - df["start"]
    df["nccl"] = ranks.is_communication(df["name"])
    return df


def two_steps(rank: int = 0, shift: int = 0) -> ranks.RankData:
    """One FSDP2 mode, two steps: step 0's window 1000-1099, step 1's 1100-1199 (the synchronisations' ends)."""
    ranges = pd.DataFrame({"text": [f"rank_{rank}", "mode_fsdp_reshard", "step_0", "step_1"],
                           "start": [0, 1000, 1000, 1100], "end": [2000, 1300, 1050, 1150], "globalTid": [1] * 4})
    runtime = pd.DataFrame({"name": ["cudaDeviceSynchronize_v3020"] * 2, "start": [1051, 1151], "end": [1099, 1199],
                            "globalTid": [1, 1]})
    k = kernels([("gemm", COMPUTE, 1005, 1090), (AG_NAME, AG, 1000 + shift, 1010), (AG_NAME, AG, 1020, 1030),
                 (RS_NAME, RS, 1025, 1098), ("copy_in", SIDE, 1092, 1096),
                 (AG_NAME, AG, 1100 + shift, 1110), ("gemm", COMPUTE, 1110, 1190), (RS_NAME, RS, 1185, 1195)])
    return ranks.RankData(rank, rank, k, ranges, "made up", runtime)


def test_idle_table_by_hand():
    t = st.idle_table({0: two_steps()}).set_index("step")
    # step 0: the compute stream ran 1005-1090 of 1000-1099 (idle 14); NCCL ran 1000-1010 and 1020-1098 (88);
    # nothing at all beside NCCL over 1000-1005, 1090-1092, 1096-1098 (9); the compute stream not over 13 of them
    assert t.loc[0, ["gpu_ms", "busy_ms", "idle_ms", "comm_ms", "exposed_any_ms", "exposed_stream_ms",
                     "other_idle_ms"]].tolist() == pytest.approx([99e-6, 85e-6, 14e-6, 88e-6, 9e-6, 13e-6, 1e-6])
    # step 1: compute 1110-1190 (idle 19), NCCL 1100-1110 and 1185-1195 (20), exposed 10 + 5
    assert t.loc[1, ["idle_ms", "comm_ms", "exposed_any_ms", "exposed_stream_ms", "other_idle_ms"]].tolist() == \
        pytest.approx([19e-6, 20e-6, 15e-6, 15e-6, 4e-6])
    s = st.idle_summary(st.idle_table({0: two_steps()})).iloc[0]
    assert s["hidden_any"] == pytest.approx(1 - 24 / 108) and s["hidden_stream"] == pytest.approx(1 - 28 / 108)
    assert st.compute_stream(two_steps()) == COMPUTE


def test_idle_split_by_hand():
    d = two_steps()
    d.kernels = pd.concat([d.kernels, kernels([("copy_out", SIDE, 1196, 1198)])], ignore_index=True)
    t = st.idle_table({0: d}).set_index("step")
    # step 0: the side kernel 1092-1096 ran under the reduce-scatter (1025-1098): no side-only time; nothing ran
    # 1098-1099. Step 1: nothing ran 1195-1199 but the copy 1196-1198: 2 side-only, 2 with no kernel at all
    assert t[["side_only_ms", "no_kernel_ms", "other_idle_ms"]].to_numpy().ravel().tolist() == \
        pytest.approx([0, 1e-6, 1e-6, 2e-6, 2e-6, 4e-6])
    assert (t["side_only_ms"] + t["no_kernel_ms"] + t["exposed_stream_ms"]).tolist() == pytest.approx(t["idle_ms"].tolist())


def test_keep_in_windows_cuts_tables_and_spares_the_synchronisations(tmp_path):
    import sqlite3

    from gpuprof.nsys.export_edit import keep_in_windows

    db = tmp_path / "x.sqlite"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
        c.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1, "cudaLaunchKernel_v7000"), (2, "cudaDeviceSynchronize_v3020")])
        c.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, nameId INTEGER)")
        c.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?)",
                      [(5, 6, 1), (15, 16, 1), (25, 26, 2), (35, 36, 1)])
        c.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER, end INTEGER)")
        c.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (?, ?)", [(12, 13), (22, 23), (31, 32)])
    note = keep_in_windows(db, ["CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMSET", "ABSENT"],
                           [(10, 20), (30, 40)], keep_calls="Synchronize")
    with sqlite3.connect(db) as c:
        assert [r[0] for r in c.execute("SELECT start FROM CUPTI_ACTIVITY_KIND_RUNTIME ORDER BY start")] == [15, 25, 35]
        assert [r[0] for r in c.execute("SELECT start FROM CUPTI_ACTIVITY_KIND_MEMSET ORDER BY start")] == [12, 31]
    assert "CUPTI_ACTIVITY_KIND_RUNTIME 3 of 4" in note and "CUPTI_ACTIVITY_KIND_MEMSET 2 of 3" in note
    assert "ABSENT" not in note


def test_kernel_streams_and_pattern_time_by_hand():
    d = {0: two_steps()}
    ks = st.kernel_streams(d, "fsdp_reshard", "gemm|copy_in").set_index("name")
    assert ks.loc["gemm", ["stream", "compute_stream", "kernels", "ms"]].tolist() == [COMPUTE, True, 1, pytest.approx(82.5e-6)]
    assert ks.loc["copy_in", ["stream", "compute_stream"]].tolist() == [SIDE, False]
    assert st.pattern_time(d, "^gemm$")[["kernels", "ms"]].values.tolist() == [[1, pytest.approx(82.5e-6)]]
    with pytest.raises(st.GpuprofError, match="no kernel matching"):
        st.kernel_streams(d, "fsdp_reshard", "nothing_like_this")


def test_collective_timeline_by_hand():
    # only step 0 has a second all-gather, so position 1, asked of step 1 too, is refused
    with pytest.raises(st.GpuprofError, match="no position 1"):
        st.collective_timeline({0: two_steps()}, "fsdp_reshard", "all_gather", [0, 1])
    one = st.collective_timeline({0: two_steps()}, "fsdp_reshard", "all_gather", [0]).iloc[0]
    assert one[["start_ms", "ms"]].tolist() == pytest.approx([0.0, 10e-6])


def test_collective_timeline_gap_after_the_previous():
    d = two_steps()
    d.kernels = d.kernels[~((d.kernels["start"] >= 1100) & (d.kernels["nccl"]))]
    d.kernels = pd.concat([d.kernels, kernels([(AG_NAME, AG, 1100, 1104), (AG_NAME, AG, 1106, 1110)])], ignore_index=True)
    t = st.collective_timeline({0: d}, "fsdp_reshard", "all_gather", [1]).iloc[0]
    # step 0: the second starts 10 after the first ended (1020 - 1010); step 1: 2 (1106 - 1104); the median is 6
    assert t[["start_ms", "ms", "after_previous_ms"]].tolist() == pytest.approx([13e-6, 7e-6, 6e-6])


def test_clock_check_finds_an_offset_between_the_reports():
    same = st.clock_check({0: two_steps(0), 1: two_steps(1, shift=3)}, patterns=("AllGather",)).iloc[0]
    assert same["kernels"] == 3 and same["end_skew_median_us"] == 0.0  # a later start, the same ends
    moved = two_steps(1)
    moved.kernels = moved.kernels.assign(end=moved.kernels["end"] + 2000)
    off = st.clock_check({0: two_steps(0), 1: moved}, patterns=("AllGather", "ReduceScatter")).set_index("collective")
    assert off["end_skew_median_us"].tolist() == [2.0, 2.0]


def test_step_spread_and_slower_rank():
    recs = [{"rank": r, "world_size": 2, "runs": [{"mode": "ddp", "steps": [
        {"step": s, "forward": 1.0, "backward": 2.0, "optimizer": 0.5, "loss": 1.0} for s in steps]}]}
        for r, steps in ((0, [10.0, 12.0, 11.0]), (1, [13.0, 9.0, 12.5]))]
    sp = st.step_spread(recs)
    assert sp[["rank", "steps", "min_ms", "median_ms", "max_ms"]].values.tolist() == [[0, 3, 10, 11, 12], [1, 3, 9, 12.5, 13]]
    slow = st.slower_rank_steps(recs).iloc[0]
    assert (slow["rank"], slow["gpus"], slow["step_ms"]) == (1, 2, 12.5)


# --- the four-GPU checks on records whose answers are known ---------------------------------------------------------

def memory_record(rank: int, world: int, mib: dict[str, float]) -> dict:
    def cats(x: float) -> dict:
        return {"parameters": x * 2**20, "gradients": x * 2**20, "optimizer_state": 2 * x * 2**20}
    return {"rank": rank, "world_size": world, "runs": [
        {"mode": m, "memory": {"measured": cats(v), "arithmetic": cats(v)},
         "steps": [{"step": 100.0, "forward": 1.0, "backward": 1.0, "optimizer": 1.0, "loss": 1.0}]}
        for m, v in mib.items()]}


def test_state_shares_on_four_and_the_references():
    recs = [memory_record(r, 4, {"ddp": 100.0, "fsdp_reshard": 25.0 + r, "fsdp_keep": 25.0}) for r in range(4)]
    s = st.state_shares(recs).set_index("mode")
    assert s.loc["fsdp_reshard", ["gpus", "share_of_ddp"]].tolist() == [4, pytest.approx(28 / 100)]  # the larger rank
    assert s.loc["fsdp_keep", "share_of_ddp"] == pytest.approx(0.25)
    with pytest.raises(st.GpuprofError, match="no ddp run"):
        st.state_shares([memory_record(0, 4, {"fsdp_reshard": 1.0})])
    ref = st.state_shares(json.loads((REF / "modes.json").read_text())["ranks"]).set_index("mode")
    assert ref.loc["fsdp_reshard", "share_of_ddp"] == pytest.approx(0.5)


def test_predicted_against_measured_pairs_only_what_both_have():
    pred = pd.DataFrame({"gpus": [4, 4, 8], "mode": ["ddp", "fsdp_reshard", "ddp"], "step_ms": [100.0, 90.0, 50.0],
                         "exposed_ms": [1.0, 2.0, 3.0]})
    measured = pd.DataFrame({"gpus": [4, 4], "mode": ["ddp", "fsdp_reshard"], "step_ms": [80.0, 100.0]})
    t = st.predicted_against_measured(pred, measured).set_index("mode")
    assert list(t.index) == ["ddp", "fsdp_reshard"]
    assert t["error"].tolist() == pytest.approx([0.25, -0.10]) and t["within"].tolist() == [False, True]
    with pytest.raises(st.GpuprofError, match="both predicted and measured"):
        st.predicted_against_measured(pred[pred["gpus"] == 8], measured)


def test_hidden_by_kind_takes_the_worse_rank():
    summary = pd.DataFrame({"mode": ["m"] * 4, "kind": ["any", "any", "all_gather", "all_gather"], "rank": [0, 1, 0, 1],
                            "comm_ms": [10.0, 12.0, 5.0, 6.0], "exposed_ms": [1.0, 2.0, 0.5, 0.1],
                            "hidden_share": [0.9, 0.83, 0.9, 0.98]})
    t = st.hidden_by_kind(summary).set_index("kind")
    assert t.loc["any", ["ranks", "comm_ms", "exposed_ms", "hidden_share"]].tolist() == [2, 12.0, 2.0, 0.83]


# --- the references (2 x H100) against sums written here -------------------------------------------------------------

@pytest.fixture(scope="module")
def modes() -> dict[int, ranks.RankData]:
    return ranks.rank_data([REF / "modes_rank0.sqlite.gz", REF / "modes_rank1.sqlite.gz"], runtime=True)


def test_idle_on_the_references_equals_a_plain_sum(modes):
    t = st.idle_table(modes)
    d = modes[0]
    mode, step, lo, hi, gpu_ms = st.mode_steps(d).iloc[0][["mode", "step", "start", "end", "gpu_ms"]]
    k = d.kernels[(d.kernels["streamId"] == 7) & (d.kernels["start"] < hi) & (d.kernels["end"] > lo)]
    k = k.assign(start=k["start"].clip(lo, hi), end=k["end"].clip(lo, hi)).sort_values("start")
    busy, reach = 0, lo  # one stream's kernels do not overlap, but merge anyway
    for a, b in zip(k["start"], k["end"]):
        busy += max(0, b - max(a, reach))
        reach = max(reach, b)
    row = t[(t["rank"] == 0) & (t["mode"] == mode) & (t["step"] == step)].iloc[0]
    assert row["busy_ms"] == pytest.approx(busy / 1e6) and row["idle_ms"] == pytest.approx(gpu_ms - busy / 1e6)
    assert (t["exposed_stream_ms"] >= t["exposed_any_ms"] - 1e-9).all() and (t["other_idle_ms"] >= -1e-9).all()
    # DDP's all-reduces have no copies of FSDP2's beside them: both ways of counting agree there
    summary = st.idle_summary(t).set_index(["mode", "rank"])
    assert summary.loc[("ddp", 0), "hidden_any"] == pytest.approx(summary.loc[("ddp", 0), "hidden_stream"])


def test_the_reference_clocks_agree_to_microseconds(modes):
    c = st.clock_check(modes).set_index("collective")
    assert list(c.index) == ["AllGather", "ReduceScatter", "AllReduce"]
    assert (c["end_skew_median_us"].abs() < 50).all() and (c["p95_us"].abs() < 50).all()


# --- the scripts --------------------------------------------------------------------------------------------------

def run_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), *args], capture_output=True, text=True, timeout=300,
                          cwd=REPO_ROOT)


def test_check_script_on_the_references_passes_and_prints_the_fit():
    r = run_check("--fit", str(REF), "--run", str(REF))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "289.5 GB/s" in r.stdout and "503.508" in r.stdout and "all checks passed" in r.stdout
    assert "within 50%: ok" in r.stdout and "no_comm_error" in r.stdout


def test_exposed_against_measured_fails_a_model_without_communication():
    summary = pd.DataFrame({"mode": ["fsdp_reshard"] * 4, "kind": ["all_gather", "reduce_scatter"] * 2,
                            "rank": [0, 0, 1, 1], "exposed_ms": [1.0, 2.0, 1.5, 1.0]})
    pred = pd.DataFrame({"gpus": [4], "mode": ["fsdp_reshard"], "exposed_all_gather_ms": [1.2],
                         "exposed_reduce_scatter_ms": [0.0]})
    t = st.exposed_against_measured(pred, summary).set_index("kind")
    assert t.loc["all_gather", "measured_ms"] == 1.0 and t.loc["reduce_scatter", "measured_ms"] == 1.0  # the lesser
    assert t.loc["all_gather", "within"] and not t.loc["reduce_scatter", "within"]
    assert t.loc["reduce_scatter", "error"] == pytest.approx(-1.0)


def test_check_script_fails_a_run_the_model_misses(tmp_path):
    run = json.loads((REF / "modes.json").read_text())
    four = copy.deepcopy(run)
    four["world_size"] = 4
    for r in four["ranks"]:
        r["world_size"] = 4
        for m in r["runs"]:
            for s in m["steps"]:
                s["step"] *= 1.5  # far slower than any prediction
    (tmp_path / "modes.json").write_text(json.dumps(four))
    r = run_check("--fit", str(REF), "--run", str(tmp_path))
    assert r.returncode == 1 and "prediction" in r.stdout.split("failed:")[-1], r.stdout + r.stderr
    # the same state at 4 GPUs as at 2 is 0.5 of DDP's: more than the 0.30 target
    assert "fsdp_reshard state share" in r.stdout
    r = run_check("--fit", str(tmp_path), "--run", str(tmp_path))
    assert r.returncode == 2 and "pf_off" in r.stderr + r.stdout


FLAG = re.compile(r"(--[a-z][a-z-]+)")


def test_every_flag_the_capture_script_gives_the_training_script_is_one_of_its_options():
    sys.path.insert(0, str(REPO_ROOT / "examples" / "nsys"))
    try:
        import fsdp_training
    finally:
        sys.path.pop(0)
    parser_flags = set(re.findall(r"--[a-z][a-z-]+", subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "nsys" / "fsdp_training.py"), "--help"],
        capture_output=True, text=True, timeout=120).stdout))
    text = SCRIPT.read_text()
    lines = [l for l in text.splitlines() if ('"$S"' in l or "traced " in l or l.strip().startswith(("SIZE=", "WARM=",
             "BIG=", "FIT="))) and not l.lstrip().startswith("#")]
    used = {f for l in lines for f in FLAG.findall(l.split("#")[0])} - {"--no-python", "--nproc-per-node", "--standalone"}
    assert {"--json", "--mode", "--prefetch", "--unit", "--mp", "--warmup", "--steps", "--size", "--cpu"} <= used
    assert used <= parser_flags, used - parser_flags
    # and the values parse: the presets and levers the script uses
    for argv in (["--mode", "ddp,fsdp_reshard,fsdp_keep"], ["--mode", "fsdp_reshard", "--prefetch", "off"],
                 ["--mode", "fsdp_reshard", "--unit", "block:4"], ["--mp", "bf16", "--warmup", "5", "--steps", "20"],
                 ["--size", "ddp-too-big", "--mode", "ddp", "--warmup", "1", "--steps", "2"]):
        fsdp_training.parse_args(argv)


def test_capture_script_help_and_refusal():
    r = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "CH13_STEPS" in r.stdout and "nccl_gpu_overlap_trace" in r.stdout
    r = subprocess.run(["bash", str(SCRIPT), "four"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "number of ranks" in r.stderr


FAKE_NSYS = """#!/bin/bash
# a stand-in for nsys: runs the command, leaves a report and a committed export per rank, fakes the recipes
if [ "$1" = profile ]; then
  shift; out=""
  while [ $# -gt 0 ]; do case "$1" in -o) out=$2; shift 2;; --*) shift;; *) break;; esac; done
  o=${out//%q\\{RANK\\}/$RANK}
  "$@"; rc=$?
  echo report > "$o.nsys-rep"; gunzip -c "$REF_EXPORTS/pf_2_rank$((RANK % 2)).sqlite.gz" > "$o.sqlite"
  exit $rc
elif [ "$1" = recipe ]; then
  shift; out=""
  while [ $# -gt 0 ]; do case "$1" in --output) out=$2; shift 2;; *) shift;; esac; done
  mkdir -p "$out"; echo PAR1 > "$out/all_stats.parquet"
else
  echo "stand-in nsys"
fi
"""


def test_capture_script_runs_on_the_cpu_and_packs_the_tarball(tmp_path):
    fake = tmp_path / "nsys"
    fake.write_text(FAKE_NSYS)
    fake.chmod(0o755)
    env = {**os.environ, "CH13_CPU": "1", "CH13_STEPS": "env,nsys,recipes", "NSYS": str(fake), "REF_EXPORTS": str(REF),
           "PYTHON": sys.executable, "CH13_BUDGET": "500"}
    r = subprocess.run(["bash", str(SCRIPT), "2", str(tmp_path / "out")], capture_output=True, text=True, timeout=580,
                       env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with tarfile.open(tmp_path / "out" / "ch13_2gpu.tar.gz") as t:
        names = {n.split("/", 1)[-1] for n in t.getnames()}
        steps = t.extractfile("ch13_2gpu/steps.tsv").read().decode()
    assert {"env.txt", "topo.txt", "modes_nsys.json", "modes_rank0.sqlite.gz", "modes_rank1.sqlite.gz",
            "trim_notes.json", "recipe_nccl_sum_all_stats.parquet", "steps.tsv"} <= names, names
    assert not any(n.endswith((".nsys-rep", ".sqlite")) for n in names)
    assert "modes_nsys\t" in steps and "\t0\t" in steps.split("modes_nsys\t", 1)[1].splitlines()[0]
    assert (tmp_path / "out" / "ch13_2gpu_raw_modes.tar.gz").is_file()
    # trimmed again, the stand-in's copy of a committed export reads the same as the committed one
    with tarfile.open(tmp_path / "out" / "ch13_2gpu.tar.gz") as t:
        (tmp_path / "again.sqlite").write_bytes(gzip.decompress(t.extractfile("ch13_2gpu/modes_rank0.sqlite.gz").read()))
    again = st.collective_table(ranks.rank_data(tmp_path / "again.sqlite", runtime=True))
    pd.testing.assert_frame_equal(again, st.collective_table(ranks.rank_data(REF / "pf_2_rank0.sqlite.gz", runtime=True)))
    shutil.rmtree(tmp_path / "out")


# --- the memory probe of fsdp_training.py (GPU only: a stand-in for torch.cuda's allocator counters) -----------------

class FakeCuda:
    """The caching allocator's counters: allocated bytes and a high-water mark that reset_peak_memory_stats lowers."""

    def __init__(self, allocated: int) -> None:
        self.allocated, self.high = allocated, allocated

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.high = max(self.high, self.allocated)

    def memory_allocated(self) -> int:
        return self.allocated

    def max_memory_allocated(self) -> int:
        return self.high

    def reset_peak_memory_stats(self) -> None:
        self.high = self.allocated


def test_memory_probe_finds_each_phases_peak_and_what_was_resident():
    sys.path.insert(0, str(REPO_ROOT / "examples" / "nsys"))
    try:
        import fsdp_training
    finally:
        sys.path.pop(0)
    cuda = FakeCuda(allocated=7)  # left over from an earlier mode
    probe = fsdp_training.MemoryProbe(type("T", (), {"cuda": cuda})(), gpu=True)
    cuda.alloc(100)  # the model and its state
    cuda.alloc(500)  # a warm-up step's leftovers do not count: the mark starts at the timed steps
    cuda.alloc(-500)
    probe.start()
    for activations in (40, 60):  # two steps: activations up in forward, a gradient spike in backward
        cuda.alloc(activations)
        probe.phase_done("forward")
        cuda.alloc(30)
        cuda.alloc(-30 - activations)
        probe.phase_done("backward")
        cuda.alloc(5)
        cuda.alloc(-5)
        probe.phase_done("optimizer")
    rec = probe.record()
    assert rec["resident_before"] == 7 and rec["after_forward"] == 167
    assert rec["phase_peaks"] == {"forward": 167, "backward": 197, "optimizer": 112} and rec["peak"] == 197
    off = fsdp_training.MemoryProbe(None, gpu=False)
    off.start()
    off.phase_done("forward")
    assert off.record() == {}
    rows = st.memory_table([{"rank": 0, "runs": [{"mode": "ddp", "memory": {
        "measured": {"parameters": 2**20, "gradients": 2**20, "optimizer_state": 2**21},
        "arithmetic": {"parameters": 2**20, "gradients": 2**20, "optimizer_state": 2**21},
        **rec, "activations": rec["peak"] - 2**22}}]}]).iloc[0]
    assert rows["backward_peak_mib"] == 197 / 2**20 and rows["resident_before_mib"] == 7 / 2**20


GPU4 = REF / "gpu4"


def test_the_overlap_trace_recipe_equals_the_course_per_kernel_on_four_ranks():
    """nsys recipe nccl_gpu_overlap_trace's "Compute Overlap" of every NCCL kernel in the four-GPU run's timed steps
    equals the course's hidden share of it, to the recipe's one decimal, after undoing rank_data's clock shift."""
    from gpuprof.nsys import recipes as rc

    trace = rc.read_recipe_csv(GPU4 / "recipe_nccl_gpu_overlap_trace_nccl.csv.gz")
    data = ranks.rank_data(sorted(GPU4.glob("modes_rank*.sqlite.gz")))
    both = rc.overlap_trace_check(trace, data)
    assert len(both) == 4 * 670 and both["recipe_pct"].notna().all()
    assert both["difference"].abs().max() <= 0.05 + 1e-9
    # without the shift back, only the earliest report's kernels would match: the check is not vacuous
    shifted = trace.assign(Start=trace["Start"] + 1)
    assert rc.overlap_trace_check(shifted, data)["recipe_pct"].isna().all()


def test_nccl_sum_counts_one_api_call_per_kernel_on_four_ranks():
    from gpuprof.nsys import recipes as rc

    trace = rc.read_recipe_csv(GPU4 / "recipe_nccl_gpu_overlap_trace_nccl.csv.gz")
    counts = rc.nccl_sum_counts(rc.read_recipe_csv(GPU4 / "recipe_nccl_sum_rank_stats.csv"), trace)
    assert len(counts) == 16 and (counts["calls"] == counts["kernels"]).all()
    assert set(counts["kind"]) == {"all_gather", "all_reduce", "broadcast", "reduce_scatter"}
    fewer = rc.nccl_sum_counts(rc.read_recipe_csv(GPU4 / "recipe_nccl_sum_rank_stats.csv"), trace.iloc[1:])
    assert (fewer["calls"] != fewer["kernels"]).sum() == 1


def test_the_lean_trim_keeps_what_the_four_gpu_check_reads(tmp_path):
    """scripts/trim_ch13.py --lean (export_edit.keep_only_sync_calls): only the Synchronize calls stay in the API
    table, CUPTI's synchronization records go, and the steps' GPU windows (closed by those calls) are still found."""
    import sqlite3

    from gpuprof.nsys import export_edit

    export = tmp_path / "x.sqlite"
    with gzip.open(REF / "pf_off_rank0.sqlite.gz") as f, export.open("wb") as g:
        shutil.copyfileobj(f, g)
    before = st.mode_steps(ranks.rank_data(export, runtime=True)[0])
    said = export_edit.keep_only_sync_calls(export)
    con = sqlite3.connect(export)
    names = {r[0] for r in con.execute("SELECT s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME c JOIN StringIds s ON s.id = c.nameId")}
    con.close()
    assert said.startswith("lean:") and names and all("Synchronize" in n for n in names)
    after = st.mode_steps(ranks.rank_data(export, runtime=True)[0])
    pd.testing.assert_frame_equal(before.reset_index(drop=True), after.reset_index(drop=True))


def test_the_overlap_recipes_grouped_table_is_duration_weighted():
    from gpuprof.nsys import recipes as rc

    trace = rc.read_recipe_csv(GPU4 / "recipe_nccl_gpu_overlap_trace_nccl.csv.gz")
    grouped = rc.read_recipe_csv(GPU4 / "recipe_nccl_gpu_overlap_trace_grouped_trace.csv")
    g = rc.grouped_overlap_check(trace, grouped).set_index("name")
    assert len(g) == 5 and (g["count"] == grouped.set_index("Name").loc[g.index, "Count"]).all()
    assert g["difference"].abs().max() <= 0.05 + 1e-9
    ag = g.loc["ncclDevKernel_AllGather_RING_LL"]
    assert ag["recipe_pct"] < 50 < 90 < ag["mean_pct"] and ag["longest_ms"] > 100  # the set-up all-gathers weigh it down


def test_nccl_ring_latency_follows_tuning_cc_and_the_scale_out_model_fails_where_latency_passes_compute():
    # tuning.cc (v2.28.9): base 8.4 us, NVLink ring step 3.4 us, network step 14 us; 8 ranks a node
    assert st.nccl_ring_latency_us("all_gather", 4) == pytest.approx(8.4 + 3 * 3.4)
    assert st.nccl_ring_latency_us("all_gather", 64) == pytest.approx(8.4 + 56 * 3.4 + 7 * 14)
    assert st.nccl_ring_latency_us("all_reduce", 64) == pytest.approx(8.4 + (126 - 14) * 3.4 + 14 * 14)
    link = st.scale_out_link(1024, 400.0)
    assert st.collective_ms("all_gather", 0, 1024, link) == pytest.approx(st.nccl_ring_latency_us("all_gather", 1024) / 1e3)
    unit = st.UnitCost(forward_ms=8.0, backward_ms=16.0, gather_bytes=200e6, reduce_bytes=200e6)
    t = st.predict_scale_out([unit] * 8, 30.0, 400.0, scales=(64, 4096)).set_index("gpus")
    assert t.loc[64, "hidden_share"] > 0.85 > t.loc[4096, "hidden_share"]
    extra = st.predict_scale_out([unit] * 8, 30.0, 400.0, scales=(1024,), extra_us=50.0)
    assert extra["ring_latency_ms"].iloc[0] == pytest.approx((st.nccl_ring_latency_us("all_gather", 1024) + 50) / 1e3)
    slow_net = dict(st.NCCL_RING_SIMPLE_US, net_step=28.0)
    assert st.nccl_ring_latency_us("all_gather", 1024, constants=slow_net) == pytest.approx(8.4 + 896 * 3.4 + 127 * 28)


def test_group_units_keeps_the_root_and_sums_layers():
    root = st.UnitCost(1.0, 2.0, 10.0, 10.0, kept=True)
    layer = st.UnitCost(3.0, 6.0, 100.0, 100.0)
    g = st.group_units([root] + [layer] * 5, 2)
    assert g[0] == root and len(g) == 4
    assert g[1] == st.UnitCost(6.0, 12.0, 200.0, 200.0) and g[3] == st.UnitCost(3.0, 6.0, 100.0, 100.0)
    assert st.NCCL_RING_LL128_US == {"base": 14.0, "nvlink_step": 1.9, "net_step": 4.0} and st.LL128_BANDWIDTH == 0.92
