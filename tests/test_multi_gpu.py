"""The multi-GPU chapter's scripts and readers.

The scripts run on the CPU here: one process (DDP with nobody to talk to, which they say)
and two processes over gloo started with torchrun (the gradients really are averaged, the
all-reduce sweep really exchanges). The readers are checked on a hand-built two-rank
export whose overlap and straggler are known by construction, and on the course's
references from two GPUs when they are there.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from gpuprof.artifacts import find_capture, reference_dir
from gpuprof.errors import GpuprofError
from gpuprof.kernel_kinds import is_communication
from gpuprof.nsys import ranks
from gpuprof.nsys import sqlite as ns
from gpuprof.runner import load_script, portable_command, torchrun_target
from gpuprof.studies import multi_gpu as mg
from helpers import forked_json_runs, run_script_in_process

ROOT = Path(__file__).resolve().parents[1]
REF = reference_dir() / "ch08"
ddp = load_script(mg.DDP)
ar = load_script(mg.ALLREDUCE)


def run(cmd: list[str], timeout: int = 240, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


# --- the scripts on the CPU ------------------------------------------------------------------------

# ddp_training.py's one-process runs that the tests below read, by name; each is made once (see one_process_runs).
ONE_PROCESS_RUNS = {
    "two bucket caps": ["--cpu", "--width", "64", "--depth", "3", "--batch-size", "8", "--warmup", "1", "--steps", "2",
                        "--bucket-mb", "0.01,25"],
    "25 MB given": ["--cpu", "--width", "512", "--depth", "4", "--batch-size", "4", "--warmup", "2", "--steps", "3"],
    "default buckets": ["--cpu", "--width", "512", "--depth", "4", "--batch-size", "4", "--warmup", "2", "--steps", "3",
                        "--default-buckets"],
    "free running": ["--cpu", "--width", "64", "--depth", "3", "--batch-size", "8", "--warmup", "1", "--steps", "2",
                     "--free-running"],
}


@pytest.fixture(scope="module")
def one_process_runs(tmp_path_factory) -> dict:
    """ONE_PROCESS_RUNS, each made once (helpers.forked_json_runs): name -> (exit status as text, output, result)."""
    return forked_json_runs(mg.DDP, ONE_PROCESS_RUNS, tmp_path_factory.mktemp("ddp_one_process"), timeout_s=600)


@pytest.mark.slow
def test_ddp_one_process_says_communication_is_not_exercised(one_process_runs):
    status, output, d = one_process_runs["two bucket caps"]
    assert status == "0", output
    assert "communication is not exercised" in output and "result checked" in output
    assert d["world_size"] == 1 and d["backend"] == "gloo"
    configs = d["ranks"][0]["configs"]
    assert [c["bucket_mb"] for c in configs] == [0.01, 25.0]
    assert all(len(c["steps"]) == 2 for c in configs)
    assert d["gradient_bytes"] == 3 * (64 * 64 + 64) * 4
    # a 10 kB bucket splits 50 kB of gradients into several buckets; 25 MB holds them all
    assert configs[0]["buckets"] is None or configs[0]["buckets"] > configs[1]["buckets"]


def test_ddp_bucket_layouts_on_a_model_with_known_answers(capsys):
    """4 layers of 512: each 1 MiB of weight gradient + 2 KiB of bias. DDP's default caps the first bucket at 1 MiB,
    so it holds one layer and the rest share a 25 MiB bucket; 25 given explicitly holds all four; a 1 MiB cap
    gives one bucket per layer (a bucket closes once it holds at least the cap). The first step: one bucket."""
    layer = (512 * 512 + 512) * 4
    layouts = mg.bucket_layouts(["--width", "512", "--depth", "4", "--bucket-mb", "default,25,1"])
    assert "$ python examples/nsys/ddp_buckets.py --width 512" in capsys.readouterr().out
    assert layouts["gradient_bytes"] == 4 * layer
    steps = {row["bucket_cap_mb"]: row["steps"] for row in layouts["layouts"]}
    assert all(by_step[0] == [4 * layer] for by_step in steps.values())
    assert steps[None][1:] == [[layer, 3 * layer]] * 2
    assert steps[25.0][1:] == [[4 * layer]] * 2
    assert steps[1.0][1:] == [[layer] * 4] * 2
    table = mg.layout_table(layouts)
    assert table.index.tolist() == ["not given", "25", "1"]
    assert table["buckets"].tolist() == [2, 1, 4] and (table["first_step_buckets"] == 1).all() and table["stable"].all()
    assert table.loc["not given", "first_bucket_mib"] == pytest.approx(layer / 2**20)


@pytest.mark.slow
def test_ddp_two_processes_average_gradients_and_write_torch_traces(tmp_path):
    out = tmp_path / "d.json"
    p = run(torchrun_target(mg.DDP, "--cpu", "--width", "64", "--depth", "3", "--batch-size", "8", "--warmup", "1",
                            "--steps", "3", "--slow-rank", "1", "--slow-ms", "30", "--torch-trace", str(tmp_path / "tr"),
                            "--json", str(out), nproc=2))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "communication is not exercised" not in p.stdout
    assert "identical on all 2 rank(s)" in p.stdout
    d = json.loads(out.read_text())
    assert d["world_size"] == 2 and sorted(r["rank"] for r in d["ranks"]) == [0, 1]
    # rank 1 sleeps 30 ms before each backward; rank 0 waits for it inside the all-reduce, so both steps are slow
    for r in d["ranks"]:
        assert min(s["step"] for s in r["configs"][0]["steps"]) >= 30
    t = mg.torch_trace_table(sorted(tmp_path.glob("tr_rank*.json.gz")))
    assert t["rank"].tolist() == [0, 1] and set(t["backend"]) == {"gloo"} and set(t["world_size"]) == {2}
    assert all("gloo:all_reduce x3" in c for c in t["collectives"])


def test_ddp_bad_input_is_one_sentence(capsys):
    p = run_script_in_process(mg.DDP, "--cpu", "--slow-rank", "3", capsys=capsys)
    assert p.returncode != 0 and "does not exist: the world has 1 rank" in (p.stdout + p.stderr)
    assert "Traceback" not in p.stderr
    p = run_script_in_process(mg.DDP, "--bucket-mb", "25,x", capsys=capsys)
    assert p.returncode == 2 and "expected MB" in p.stderr
    p = run_script_in_process(mg.DDP, "--bucket-mb", "1,2", "--torch-trace", "t", capsys=capsys)
    assert p.returncode == 2 and "one configuration" in p.stderr


def test_bucket_and_size_parsers():
    assert ddp.bucket_sizes("25") == [25.0] and ddp.bucket_sizes("0.5,100") == [0.5, 100.0]
    assert ar.size_list("4K,1M,1G,100") == [4096, 2**20, 2**30, 100]
    assert ar.bus_factor(2) == 1.0 and ar.bus_factor(8) == pytest.approx(1.75)


@pytest.mark.slow
def test_allreduce_sweep_two_processes_on_gloo(tmp_path):
    out = tmp_path / "ar.json"
    p = run(torchrun_target(mg.ALLREDUCE, "--cpu", "--sizes", "4K,256K", "--iterations", "3", "--warmup", "1",
                            "--json", str(out), nproc=2))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "result checked: 2 sizes all-reduced by 2 rank(s)" in p.stdout and "no GPU copy" in p.stdout
    d = json.loads(out.read_text())
    t = mg.bandwidth_table(d)
    assert t["bytes"].tolist() == [4096, 262144]
    assert (t["busbw_gbps"] == t["algbw_gbps"]).all()  # 2 ranks: factor 1
    assert (t["time_us"] > 0).all() and "of_copy_peak" not in t


def test_allreduce_one_process_says_so():
    p = run([sys.executable, str(mg.ALLREDUCE), "--cpu", "--sizes", "4K", "--iterations", "2"])
    assert p.returncode == 0 and "nobody to exchange with" in p.stdout


def test_torchrun_command_is_shown_as_torchrun():
    shown = portable_command(torchrun_target(mg.DDP, "--steps", "3", nproc=2))
    assert shown[:3] == ["torchrun", "--standalone", "--nproc-per-node=2"]
    assert shown[3] == "examples/nsys/ddp_training.py"


# --- the readers on a hand-built two-rank export ------------------------------------------------------

def _gid(pid: int, tid: int = 0) -> int:
    return (pid << 24) | tid


def build_two_rank_export(path: Path) -> None:
    """Two processes (pids 100 and 200, ranks 0 and 1) in one export, two timed steps of one bucket size.

    Per step of 10 ms on rank 0: compute kernels 0-6 ms, an NCCL kernel 4-8 ms (2 of its 4 ms
    under compute: 50% hidden). Rank 1 sleeps 3 ms ("straggling") and its NCCL kernel is 1 ms.
    """
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1, "gemm"), (2, "ncclDevKernel_AllReduce_Sum_f32_RING_LL")])
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, streamId INT, "
                "correlationId INT, globalPid INT, shortName INT, demangledName INT)")
    con.execute("CREATE TABLE NVTX_EVENTS (start INT, end INT, eventType INT, globalTid INT, text TEXT)")
    ms = 1_000_000
    for rank, pid in ((0, 100), (1, 200)):
        t0 = 1_000 * ms
        nvtx = [(t0 - ms, t0 + 25 * ms, f"rank_{rank}"), (t0, t0 + 20 * ms, "bucket_25MB")]
        for i in range(2):
            s = t0 + i * 10 * ms
            nvtx.append((s, s + 10 * ms, f"step_{i}"))
            nvtx.append((s + 1 * ms, s + 9 * ms, "backward"))
            if rank == 1:
                nvtx.append((s, s + 3 * ms, "straggling"))
            con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,?,?)",
                        (s, s + 6 * ms, rank, 7, i, _gid(pid), 1, 1))
            nccl_start, nccl_len = (s + 4 * ms, 4 * ms) if rank == 0 else (s + 7 * ms, 1 * ms)
            con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,?,?)",
                        (nccl_start, nccl_start + nccl_len, rank, 13, 100 + i, _gid(pid), 2, 2))
        con.executemany("INSERT INTO NVTX_EVENTS VALUES (?,?,59,?,?)", [(a, b, _gid(pid, pid + 1), t) for a, b, t in nvtx])
    con.commit()
    con.close()


@pytest.fixture
def two_ranks(tmp_path):
    path = tmp_path / "two.sqlite"
    build_two_rank_export(path)
    return ranks.rank_data(path)


def test_rank_data_splits_one_report_by_the_rank_ranges(two_ranks):
    assert sorted(two_ranks) == [0, 1]
    assert two_ranks[0].pid == 100 and two_ranks[1].pid == 200
    assert len(two_ranks[0].nccl) == 2 and len(two_ranks[0].compute) == 2
    assert set(two_ranks[1].kernels["deviceId"]) == {1}


def test_overlap_table_measures_the_hidden_share(two_ranks):
    t = mg.overlap_table(two_ranks).set_index("rank")
    assert t.loc[0, "steps"] == 2 and t.loc[0, "bucket_mb"] == 25.0
    assert t.loc[0, "step_ms"] == pytest.approx(10.0) and t.loc[0, "compute_ms"] == pytest.approx(6.0)
    assert t.loc[0, "comm_ms"] == pytest.approx(4.0) and t.loc[0, "hidden"] == pytest.approx(0.5)
    assert t.loc[0, "exposed_ms"] == pytest.approx(2.0)
    assert t.loc[1, "hidden"] == pytest.approx(0.0) and t.loc[1, "nccl_kernels"] == 1


def test_overlap_steps_and_steady_steps(two_ranks):
    """Step by step, with the NVTX backward range; a step is steady only where the ranks' NCCL times agree."""
    st = mg.overlap_steps(two_ranks)
    assert len(st) == 4 and st["step"].tolist() == [0, 1, 0, 1]
    assert st["backward_ms"].tolist() == pytest.approx([8.0] * 4) and st["hidden"].tolist() == pytest.approx([0.5, 0.5, 0, 0])
    # the table's medians are the steps' medians
    assert mg.overlap_table(two_ranks).set_index("rank").loc[0, "exposed_ms"] == pytest.approx(st["exposed_ms"].iloc[0])
    wide = mg.steady_steps(st)
    assert wide["comm_ratio"].tolist() == pytest.approx([4.0, 4.0]) and not wide["steady"].any()  # 4 ms against 1 ms
    assert wide["hidden_mean"].tolist() == pytest.approx([0.25, 0.25])
    assert mg.steady_steps(st, ratio=4.0)["steady"].all()


def test_overlap_of_any_capture_without_the_course_ranges(tmp_path, two_ranks):
    """Another program's capture has no rank_R or step ranges: ranks by process order, overlap over the whole report."""
    path = tmp_path / "plain.sqlite"
    build_two_rank_export(path)
    con = sqlite3.connect(path)
    con.execute("DELETE FROM NVTX_EVENTS")
    con.commit()
    con.close()
    data = ranks.rank_data(path)
    assert sorted(data) == [0, 1] and data[0].pid == 100 and data[1].pid == 200
    t = ranks.overlap_by_rank(data).set_index("rank")
    assert t.loc[0, "nccl_kernels"] == 2 and t.loc[0, "comm_ms"] == pytest.approx(8.0)
    assert t.loc[0, "hidden"] == pytest.approx(0.5) and t.loc[0, "exposed_ms"] == pytest.approx(4.0)
    # the course's step-by-step table agrees with it over the same steps
    assert mg.overlap_table(two_ranks).set_index("rank").loc[0, "hidden"] == pytest.approx(t.loc[0, "hidden"])


def test_straggler_is_the_rank_the_others_wait_for(two_ranks):
    t = mg.straggler_table(two_ranks).set_index("rank")
    assert t.loc[1, "straggling_ms"] == pytest.approx(3.0) and t.loc[0, "straggling_ms"] == 0
    assert t.loc[0, "nccl_ms"] == pytest.approx(4.0) and t.loc[1, "nccl_ms"] == pytest.approx(1.0)
    assert t["waited_for"].tolist() == [False, True]


def test_rank_data_from_one_report_per_rank(tmp_path):
    # the same data split into two files, as nsys inside each rank writes it
    whole = tmp_path / "two.sqlite"
    build_two_rank_export(whole)
    for rank, pid in ((0, 100), (1, 200)):
        part = tmp_path / f"r{rank}.sqlite"
        part.write_bytes(whole.read_bytes())
        con = sqlite3.connect(part)
        con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE globalPid != ?", (_gid(pid),))
        con.execute("DELETE FROM NVTX_EVENTS WHERE globalTid != ?", (_gid(pid, pid + 1),))
        con.commit()
        con.close()
    data = ranks.rank_data([tmp_path / "r0.sqlite", tmp_path / "r1.sqlite"])
    assert sorted(data) == [0, 1]
    pd.testing.assert_frame_equal(mg.overlap_table(data), mg.overlap_table(ranks.rank_data(whole)))
    # each report counts from its own session start: rank 1's session began 2 ms later, so its
    # times are 2 ms smaller in its file, and reading both puts them back on one axis
    for rank, start in ((0, 10_000_000_000), (1, 10_002_000_000)):
        con = sqlite3.connect(tmp_path / f"r{rank}.sqlite")
        con.execute("CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INT, utcTime TEXT, localTime TEXT)")
        con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", (start,))
        if rank == 1:
            con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = start - 2000000, end = end - 2000000")
            con.execute("UPDATE NVTX_EVENTS SET start = start - 2000000, end = end - 2000000")
        con.commit()
        con.close()
    aligned = ranks.rank_data([tmp_path / "r0.sqlite", tmp_path / "r1.sqlite"])
    whole_data = ranks.rank_data(whole)
    for rank in (0, 1):
        pd.testing.assert_series_equal(aligned[rank].kernels["start"], whole_data[rank].kernels["start"])
        pd.testing.assert_series_equal(aligned[rank].ranges["end"], whole_data[rank].ranges["end"])
    with pytest.raises(ValueError, match="appears twice"):
        ranks.rank_data([tmp_path / "r0.sqlite", tmp_path / "r0.sqlite"])


def test_figures_draw(two_ranks):
    import matplotlib

    matplotlib.use("Agg")
    ax = mg.rank_timeline(two_ranks)
    assert len(ax.get_yticklabels()) == 6
    ax = mg.overlap_figure(mg.overlap_table(two_ranks))
    assert ax.get_xlabel().startswith("NCCL kernel time")


def test_not_enough_gpus_is_said(monkeypatch):
    monkeypatch.setattr(mg, "gpus_here", lambda: 1)
    assert mg.enough_gpus(2) == "this machine has 1 GPU(s) and the run needs 2"
    monkeypatch.setattr(mg, "gpus_here", lambda: 0)
    assert mg.enough_gpus(2) == "this machine has no GPU"


# A launcher in miniature: like torchrun, it starts its workers in sessions of their own (so killing the launcher's
# process group misses them), and the workers hang. Plain Python, no PyTorch: each starts in a fraction of a second,
# far inside the limit below however busy the machine is.
FAKE_LAUNCHER = """
import subprocess, sys, time
# One write per line (a pipe keeps a write under 4 KiB whole): print() with several arguments, unbuffered, writes
# word by word, and the two workers' words interleaved ("workerworker  01 ...") on a busy CI machine.
worker = "import os, sys, time; os.write(1, ('worker %s started\\\\n' % sys.argv[1]).encode()); time.sleep(600)"
for rank in range(2):
    subprocess.Popen([sys.executable, "-c", worker, str(rank), "hung-worker-{tag}"], start_new_session=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_run_with_limit_kills_hung_workers_of_a_launcher():
    """Workers in sessions of their own must still end with the launcher when the time limit passes."""
    import os
    import uuid

    from gpuprof.runner import run_with_limit

    tag = uuid.uuid4().hex
    code, out, seconds = run_with_limit([sys.executable, "-c", FAKE_LAUNCHER.format(tag=tag)], 10)
    assert code is None and seconds >= 10
    assert "worker 0 started" in out and "worker 1 started" in out
    left = [p for p in os.listdir("/proc") if p.isdigit() and f"hung-worker-{tag}" in _cmdline(p)]
    assert left == []


def _cmdline(pid: str) -> str:
    try:
        return open(f"/proc/{pid}/cmdline").read()
    except OSError:
        return ""


# --- the course's references from two H200s ----------------------------------------------------------

def test_reference_per_rank_reports_share_one_axis_after_alignment():
    """Every all-reduce needs both ranks: once aligned, each of rank 0's all-reduce kernels overlaps rank 1's of the same order.

    Only all-reduces: a broadcast's root (DDP's start-up and buffer broadcasts) may finish
    before its peer's kernel starts, since it only sends (13 of the 2026-11-26 capture's
    1,079 NCCL kernels, all broadcasts, did not overlap their peer's).
    """
    data = ranks.rank_data([REF / "buckets_rank0.sqlite", REF / "buckets_rank1.sqlite"])
    a, b = (d.nccl[d.nccl["name"].str.contains("AllReduce")].reset_index(drop=True) for d in (data[0], data[1]))
    assert len(a) == len(b) > 100
    assert (a["name"] == b["name"]).all()
    overlaps = (a["start"] < b["end"]) & (b["start"] < a["end"])
    assert overlaps.mean() > 0.99
    # without the alignment the two files' clocks disagree by the sessions' offset
    starts = {r: ns.session_start(REF / f"buckets_rank{r}.sqlite") for r in (0, 1)}
    assert starts[0] != starts[1]
    for rank, aligned in ((0, a), (1, b)):
        raw = ns.kernels(REF / f"buckets_rank{rank}.sqlite")
        raw_nccl = raw[is_communication(raw["name"]) & raw["name"].str.contains("AllReduce")].reset_index(drop=True)
        assert (aligned["start"] - raw_nccl["start"]).eq(starts[rank] - min(starts.values())).all()


def test_reference_capture_agrees_with_the_scripts_own_bucket_count():
    """DDP's own count of buckets (the script's JSON) equals the NCCL kernels per step nsys recorded."""
    data = ranks.rank_data([REF / "buckets_rank0.sqlite", REF / "buckets_rank1.sqlite"])
    table = mg.overlap_table(data)
    d = json.loads((REF / "buckets.json").read_text())
    for r in d["ranks"]:
        for c in r["configs"]:
            row = table[(table["rank"] == r["rank"]) & (table["bucket_mb"] == c["bucket_mb"])].iloc[0]
            assert row["nccl_kernels"] == c["buckets"], (r["rank"], c["bucket_mb"])
    one = table[table["bucket_mb"] == 1000.0]
    assert (one["hidden"] < 0.05).all() and (one["nccl_kernels"] == 1).all()
    # the committed run's tuned size: the profiler held rank 0 up in steps 3-9 (its backward launch ~10 ms against
    # ~6 ms), and only steps 1 and 2 are steady; they hid what the earlier, undisturbed runs hid
    steps = mg.steady_steps(mg.overlap_steps(data))
    tuned = steps[steps["bucket_mb"] == 100.0].set_index("step")
    assert tuned.index[tuned["steady"]].tolist() == [1, 2] and (tuned.loc[1:2, "hidden_mean"] > 0.8).all()
    assert (tuned.loc[3:, "backward_ms_0"] > 9.5).all() and (tuned.loc[:2, "backward_ms_0"] < 7).all()
    assert steps.loc[steps["bucket_mb"] == 1000.0, "steady"].all()


def test_reference_straggler_and_traces():
    s = mg.straggler_table(ranks.rank_data(REF / "straggler.sqlite")).set_index("rank")
    assert s["waited_for"].tolist() == [False, True]
    assert s.loc[1, "straggling_ms"] == pytest.approx(20, abs=2)
    # the compute stream's host wait beyond the loop's own cudaDeviceSynchronize gaps (chapter 8, c8hta004)
    beyond = mg.host_wait_beyond_syncs([REF / f"ddp_trace_rank{r}.json.gz" for r in (0, 1)])
    assert beyond["sync_gaps"].tolist() == [9, 9] and (beyond["beyond_over_sync"] > 7).all()
    assert (beyond["sync_ms"] + beyond["beyond_ms"]).round(6).tolist() == beyond["host_wait_ms"].round(6).tolist()
    # no sync call named: every host-wait gap is "beyond"
    none = mg.host_wait_beyond_syncs([REF / "ddp_trace_rank0.json.gz"], sync="noSuchCall")
    assert none.loc[0, "sync_gaps"] == 0 and none.loc[0, "beyond_ms"] == pytest.approx(none.loc[0, "host_wait_ms"])
    t = mg.torch_trace_table([REF / f"ddp_trace_rank{r}.json.gz" for r in (0, 1)])
    assert t["backend"].tolist() == ["nccl", "nccl"] and t["world_size"].tolist() == [2, 2]
    assert (t["nccl_kernels"] > 0).all()
    ar = json.loads((REF / "allreduce.json").read_text())
    bw = mg.bandwidth_table(ar)
    assert bw["bytes"].is_monotonic_increasing and bw["busbw_gbps"].iloc[-1] > bw["busbw_gbps"].iloc[0]


def test_nccl_choices_are_read_from_its_tuning_log():
    log = ("h:11:12 [0] NCCL INFO NCCL version 2.28.3+cuda13.0\n"
           "h:11:12 [0] NCCL INFO AllReduce: 1048576 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}\n"
           "h:11:12 [0] NCCL INFO AllReduce: 1048576 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}\n"
           "h:13:14 [1] NCCL INFO AllReduce: 536870912 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..31}\n"
           "h:11:12 [0] NCCL INFO comm 0x1 rank 0 nranks 2 - Init COMPLETE\n")
    t = mg.parse_nccl_choices(log)
    assert t.to_dict(orient="records") == [
        {"device": 0, "collective": "AllReduce", "bytes": 1048576, "algorithm": "RING", "protocol": "LL", "channels": 2,
         "calls": 2},
        {"device": 1, "collective": "AllReduce", "bytes": 536870912, "algorithm": "RING", "protocol": "SIMPLE",
         "channels": 32, "calls": 1}]
    assert mg.parse_nccl_choices("no tuning lines here").empty


def _rank(rank: int, starts: list[int], ends: list[int], names: list[str]) -> ranks.RankData:
    k = pd.DataFrame({"start": starts, "end": ends, "name": names})
    k["nccl"] = is_communication(k["name"])
    return ranks.RankData(rank, rank, k, pd.DataFrame(), "made up")


def test_collective_end_skew_matches_by_order_and_keeps_only_the_named_collective():
    ar = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    bc = "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    r0 = _rank(0, [100, 200, 500], [400, 300, 900], [bc, ar, ar])
    # rank 1 arrives late at the first all-reduce and early at the second; both end within 5 ns of rank 0's
    r1 = _rank(1, [150, 290, 350, 700], [401, 295, 905, 800], [bc, ar, ar, "volta_sgemm_128x64_nn"])
    skew = ranks.collective_end_skew({0: r0, 1: r1})
    assert skew["end_skew_ns"].tolist() == [-5, 5] and skew["start_skew_ns"].tolist() == [90, -150]
    with pytest.raises(Exception, match="cannot be matched by order"):
        ranks.collective_end_skew({0: r0, 1: _rank(1, [290], [295], [ar])})


def test_stored_reports_share_one_axis_after_the_shift():
    paths = [REF / "buckets_rank0.sqlite", REF / "buckets_rank1.sqlite"]
    skew = ranks.collective_end_skew(ranks.rank_data(paths))
    offset = ns.session_start(paths[1]) - ns.session_start(paths[0])
    median = skew["end_skew_ns"].median()
    assert len(skew) > 100 and abs(median) < 50_000
    assert abs(median - offset) > 4 * abs(median)  # without the shift the pairs sit the sessions' offset apart


def test_bucket_model_on_known_numbers():
    # a made-up sweep: 20 us per call plus 1 us per kB (1 GB/s); buckets of 1 MB of gradients, backward 1 ms
    sweep = {"rows": [{"bytes": b, "time_us": 20 + b / 1e3} for b in (4_000, 500_000, 1_000_000)]}
    assert mg.latency_bandwidth_fit(sweep) == pytest.approx((0.02, 1.0))
    m = mg.bucket_model(sweep, {1.0: [1_000_000], 0.5: [500_000, 500_000], 0.3: [750_000, 250_000]},
                        backward_ms=1.0).set_index("bucket_mb")
    assert m.loc[1.0, "exposed_ms"] == pytest.approx(1.02)  # one bucket: all of it after backward
    # two buckets: the first (ready at 0.5 ms) ends at 1.02, the second starts then and ends at 1.54
    assert m.loc[0.5, "exposed_ms"] == pytest.approx(0.54) and m.loc[0.5, "comm_ms"] == pytest.approx(1.04)
    # unequal buckets: the first (ready at 0.75 ms) ends at 1.52; the last, small one follows: 1.79
    assert m.loc[0.3, "exposed_ms"] == pytest.approx(0.79) and m.loc[0.3, "last_bucket_mib"] == pytest.approx(250_000 / 2**20)


@pytest.mark.slow
def test_ddp_knobs_run_on_two_cpu_processes(tmp_path):
    out = tmp_path / "k.json"
    p = run(torchrun_target(mg.DDP, "--cpu", "--width", "64", "--depth", "3", "--batch-size", "8", "--warmup", "1",
                            "--steps", "2", "--grad-as-bucket-view", "--static-graph", "--comm-hook", "fp16",
                            "--json", str(out), nproc=2))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "DDP: gradient_as_bucket_view, static_graph, fp16_compress_hook" in p.stdout
    assert "identical on all 2 rank(s)" in p.stdout  # a compressed all-reduce still gives every rank the same average
    config = json.loads(out.read_text())["config"]
    assert config["grad_as_bucket_view"] and config["static_graph"] and config["comm_hook"] == "fp16"


@pytest.mark.slow
def test_ddp_default_buckets_leaves_the_cap_to_ddp(one_process_runs):
    """--default-buckets passes no bucket_cap_mb. On 4 layers of 512 (1 MiB + 2 KiB of gradients each) DDP's own
    default caps the first bucket at 1 MiB, so it holds one layer and the other three share a second bucket; 25 MB
    given explicitly holds all four in one. The count is DDP's own (its logging data), read by the script."""
    counts = {}
    for name, flag in (("25 MB given", False), ("default buckets", True)):
        status, output, d = one_process_runs[name]
        assert status == "0", output
        assert d["config"]["default_buckets"] == flag
        counts[flag] = d["ranks"][0]["configs"][0]["buckets"]
    assert counts == {False: 1, True: 2}
    assert "bucket_cap_mb unset (small first bucket)" in output


@pytest.mark.slow
def test_ddp_knobs_times_the_default_layout_against_25_given(tmp_path):
    out = tmp_path / "k.json"
    p = run(torchrun_target(mg.KNOBS, "--cpu", "--width", "512", "--depth", "4", "--batch-size", "4", "--warmup", "2",
                            "--steps", "3", "--rounds", "1", "--variants", "fp32,fp32+default-buckets",
                            "--json", str(out), nproc=2))
    assert p.returncode == 0, p.stderr[-2000:]
    runs = {r["variant"]: r for r in json.loads(out.read_text())["ranks"][0]["runs"]}
    assert runs["fp32"]["buckets"] == 1 and runs["fp32+default-buckets"]["buckets"] == 2
    assert runs["fp32+default-buckets"]["weights_identical_across_ranks"]


def test_ddp_bf16_hook_on_the_cpu_is_refused_in_one_sentence(capsys):
    p = run_script_in_process(mg.DDP, "--cpu", "--comm-hook", "bf16", "--width", "32", "--depth", "2", capsys=capsys)
    assert p.returncode != 0 and "--comm-hook bf16 needs NCCL on CUDA GPUs" in p.stdout + p.stderr
    assert "Traceback" not in p.stdout + p.stderr


@pytest.mark.slow
def test_ddp_knobs_interleaves_the_variants_on_two_cpu_processes(tmp_path):
    out = tmp_path / "k.json"
    p = run(torchrun_target(mg.KNOBS, "--cpu", "--width", "64", "--depth", "3", "--batch-size", "8", "--warmup", "1",
                            "--steps", "2", "--rounds", "2", "--variants", "fp32,fp32+nosync,fp32+fp16-hook+bucket-view",
                            "--json", str(out), nproc=2))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "identical on all 2 rank(s)" in p.stdout
    result = json.loads(out.read_text())
    runs = result["ranks"][0]["runs"]
    # round 2 starts one variant later: each variant twice, in rotated order
    assert [r["variant"] for r in runs] == ["fp32", "fp32+nosync", "fp32+fp16-hook+bucket-view",
                                            "fp32+nosync", "fp32+fp16-hook+bucket-view", "fp32"]
    assert all(len(r["steps"]) == 2 for r in runs)
    # without sync the two ranks trained on their own data, so their weights differ; with it they agree
    assert [r["weights_identical_across_ranks"] for r in runs if r["variant"] == "fp32+nosync"] == [False, False]
    table = mg.knob_table([result])
    assert list(table.index) == ["fp32", "fp32+nosync", "fp32+fp16-hook+bucket-view"]
    assert table.loc["fp32", "vs_fp32"] == 1.0 and table.loc["fp32+nosync", "sync_cost_ms"] == 0.0


def _job(times: dict[str, list[list[float]]]) -> dict:
    """A ddp_knobs.py result with two ranks: per variant, one list of step times per round (rank 1 0.1 ms slower)."""
    runs = {0: [], 1: []}
    for rnd in range(2):
        for variant, per_round in times.items():
            for rank in (0, 1):
                runs[rank].append({"variant": variant, "round": rnd, "weights_identical_across_ranks": True,
                                   "steps": [{"step": t + 0.1 * rank} for t in per_round[rnd]]})
    return {"ranks": [{"rank": r, "runs": runs[r]} for r in (0, 1)]}


def test_knob_table_takes_the_slower_rank_and_ratios_within_each_job():
    a = _job({"fp32": [[10, 10, 10], [10, 10, 12]], "fp32+nosync": [[8, 8, 8], [8, 8, 8]], "bf16": [[4, 4, 4], [5, 5, 5]]})
    b = _job({"fp32": [[12, 12, 12], [12, 12, 12]], "fp32+nosync": [[9, 9, 9], [9, 9, 9]], "bf16": [[6, 6, 6], [6, 6, 6]]})
    t = mg.knob_table([a, b])
    assert t.loc["fp32", "step_lo"] == pytest.approx(10.1) and t.loc["fp32", "step_hi"] == pytest.approx(12.1)
    assert t.loc["fp32", "step_ms"] == pytest.approx(11.1)  # the median of the two jobs
    assert t.loc["fp32+nosync", "sync_cost_ms"] == 0 and t.loc["fp32", "sync_cost_lo"] == pytest.approx(2.0)
    assert t.loc["fp32", "sync_cost_hi"] == pytest.approx(3.0)
    assert t.loc["bf16", "vs_fp32_lo"] == pytest.approx(4.6 / 10.1)  # job a: bf16's 6 steps' median 4.6 (4.1 and 5.1)
    assert t.loc["bf16", "vs_fp32_hi"] == pytest.approx(6.1 / 12.1)
    assert t.loc["bf16", "round_spread"] == pytest.approx(1.0 / 4.6)  # job a: rounds 4.1 and 5.1
    assert pd.isna(t.loc["bf16", "sync_cost_ms"]) and (t["jobs"] == 2).all()


def test_channel_table_reads_each_setting_from_its_own_jobs():
    """Two settings, two jobs each: the table takes knob_table's fp32 and no-sync rows per setting, and names the cap
    the jobs ran under (from the NCCL variables each job recorded)."""
    base = {"fp32": [[10, 10, 10], [10, 10, 10]], "fp32+nosync": [[8, 8, 8], [8, 8, 8]]}
    slower = {"fp32": [[11, 11, 11], [11, 11, 11]], "fp32+nosync": [[8, 8, 8], [8, 8, 8]]}
    capped = [_job(slower) | {"nccl_environment": {"NCCL_MAX_NCHANNELS": "4"}} for _ in range(2)]
    t = mg.channel_table({"default": [_job(base), _job(base)], "max4": capped})
    assert t.loc["default", "sync_cost_ms"] == pytest.approx(2.0) and t.loc["max4", "sync_cost_ms"] == pytest.approx(3.0)
    assert t.loc["max4", "nosync_ms"] == pytest.approx(8.1) and (t["jobs"] == 2).all()
    assert t["NCCL_MAX_NCHANNELS"].tolist() == ["unset", "4"]


def test_reference_channel_and_first_bucket_jobs(capsys, monkeypatch):
    """The committed jobs load without two GPUs, say so, and hold what chapter 8 reads from them."""
    monkeypatch.setattr(mg, "enough_gpus", lambda n=2: "this test reads the references")
    runs = mg.channel_jobs("ch08", channels=4)
    assert "No live run" in capsys.readouterr().out
    t = mg.channel_table(runs)
    assert t["NCCL_MAX_NCHANNELS"].tolist() == ["unset", "4"] and (t["jobs"] == 3).all()
    assert t.loc["max4", "sync_cost_lo"] > t.loc["default", "sync_cost_hi"]
    first = mg.knob_table(mg.knob_jobs("ch08", [], stem="first_bucket"))
    assert list(first.index) == ["fp32", "fp32+default-buckets", "fp32+nosync"]
    assert first.loc["fp32+default-buckets", "vs_fp32_lo"] > 0.97
    capped = mg.nccl_choice_table(find_capture("ch08", "nccl_tuning_max4.json", prefer="reference"))
    assert capped.loc[capped["bytes"] >= 2**20, "channels"].max() == 4


@pytest.mark.slow
def test_ddp_knobs_keeps_the_nccl_variables_it_ran_under(tmp_path):
    out = tmp_path / "k.json"
    p = run(torchrun_target(mg.KNOBS, "--cpu", "--width", "32", "--depth", "2", "--batch-size", "4", "--warmup", "1",
                            "--steps", "1", "--rounds", "1", "--variants", "fp32", "--json", str(out), nproc=2),
            env={**os.environ, "NCCL_MAX_NCHANNELS": "4"})
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(out.read_text())["nccl_environment"]["NCCL_MAX_NCHANNELS"] == "4"


@pytest.mark.parametrize("name,comm", [
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", True),   # NCCL >= 2.19, as in chapter 8's captures
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", True),  # a Kineto trace's name
    ("ncclKernel_AllReduce_RING_LL_Sum_float", True),    # NCCL before 2.19
    ("NCCLKernel_x", True),
    ("void at::native::reduce_kernel<512, 1>", False),
    ("my_kernel_not_nccl", False),                       # a prefix rule: a mention is not NCCL's kernel
])
def test_is_communication_is_one_prefix_rule_for_a_name_and_a_series(name, comm):
    assert is_communication(name) is comm
    flags = is_communication(pd.Series([name, "gemm"], index=[7, 8]))
    assert flags.tolist() == [comm, False] and flags.index.tolist() == [7, 8]


def test_every_nccl_kernel_of_the_chapter_8_captures_is_communication():
    k = pd.concat([ns.kernels(reference_dir() / "ch08" / f) for f in ("straggler.sqlite", "buckets_rank0.sqlite")])
    mentions = k["name"].astype(str).str.contains("nccl", case=False)
    assert mentions.any() and (is_communication(k["name"]) == mentions).all()


def test_trace_arrivals_on_the_reference_traces_share_a_clock_and_account_for_the_nccl_times():
    paths = [REF / f"ddp_trace_rank{r}.json.gz" for r in (0, 1)]
    arr = mg.trace_arrivals(paths)
    t = mg.torch_trace_table(paths)
    assert len(arr) == t.loc[0, "nccl_kernels"] and arr["rank"].eq(1).all()
    assert abs(arr["end_skew_ns"].median()) < 50_000  # one host's clock: matched collectives end together
    # a kernel's duration is end minus start, so the totals differ by the summed skews
    diff_ms = (arr["end_skew_ns"] - arr["start_skew_ns"]).sum() / 1e6
    assert diff_ms == pytest.approx(t.loc[1, "nccl_ms"] - t.loc[0, "nccl_ms"], abs=1e-6)


def test_trace_arrivals_refuses_traces_it_cannot_match(tmp_path, monkeypatch):
    def fake(p):
        n = 3 if "a" in Path(p).name else 2
        k = pd.DataFrame({"name": ["ncclDevKernel_AllReduce"] * n, "start": range(n), "end": range(1, n + 1)})
        return type("T", (), {"kernels": lambda self: k})()
    monkeypatch.setattr(mg, "read_trace", fake)
    with pytest.raises(GpuprofError, match="cannot be matched by order"):
        mg.trace_arrivals(["a.json", "b.json"])


def test_longest_wait_per_step_on_the_reference_straggler():
    data = ranks.rank_data(REF / "straggler.sqlite")
    waiting, late = mg.longest_wait_per_step(data[0]), mg.longest_wait_per_step(data[1])
    assert len(waiting) == len(late) > 0
    # rank 0 waits for rank 1's 20 ms sleep inside one all-reduce a step; rank 1's longest is short
    assert (waiting["longest_nccl_ms"] > 15).all() and (late["longest_nccl_ms"] < 5).all()
    assert (waiting["compute_beside_ms"] <= waiting["compute_ms"]).all() and (waiting["compute_beside_ms"] > 0).all()


def test_bucket_bandwidth_reads_each_bucket_of_the_reference_capture():
    data = ranks.rank_data([REF / "buckets_rank0.sqlite", REF / "buckets_rank1.sqlite"])
    sweep = json.loads((REF / "allreduce.json").read_text())
    layout = [117_497_856] * 4 + [67_141_632]  # DDP's 100 MB layout of the chapter's model (ddp_buckets.py)
    b = mg.bucket_bandwidth(data, layout, 100.0, sweep)
    assert len(b) == 5 and (b["least_ms"] <= b[["rank_0_ms", "rank_1_ms"]].max(axis=1)).all()
    assert b.loc[4, "least_ms"] < b.loc[0, "least_ms"]  # the last, smaller bucket takes less time
    assert b["busbw_gbps"].between(50, 500).all()
    # the first four all-reduces run beside backward's kernels; the last runs after backward, alone
    assert (b.loc[:3, "beside"] > 0.5).all() and b.loc[4, "beside"] == 0 and b["beside"].between(0, 1).all()
    with pytest.raises(GpuprofError, match="all-reduce kernels for"):
        mg.bucket_bandwidth(data, layout[:4], 100.0, sweep)


def test_ddp_free_running_keeps_no_phase_times(one_process_runs):
    status, out, result = one_process_runs["free running"]
    assert status == "0", out[-2000:]
    assert "free-running: no phase times" in out and "result checked" in out
    steps = result["ranks"][0]["configs"][0]["steps"]
    # no per-phase waits and no loss read: the step time alone, per step
    assert len(steps) == 2 and all(set(s) == {"step"} and s["step"] > 0 for s in steps)
    _, timed, _ = one_process_runs["two bucket caps"]
    assert "free-running" not in timed


@pytest.mark.parametrize("flag", [["--max-ctas", "4"], ["--high-priority"]])
def test_ddp_nccl_communicator_options_on_the_cpu_are_refused_in_one_sentence(capsys, flag):
    p = run_script_in_process(mg.DDP, "--cpu", *flag, "--width", "32", "--depth", "2", capsys=capsys)
    assert p.returncode != 0 and "set NCCL's communicator; this run uses gloo" in p.stdout + p.stderr
    assert "Traceback" not in p.stdout + p.stderr


def test_join_group_builds_nccl_options_only_when_asked(monkeypatch):
    from gpuprof import distributed

    seen = {}

    class Config:
        max_ctas = -1

    class Options:
        def __init__(self, is_high_priority_stream=False):
            self.is_high_priority_stream, self.config = is_high_priority_stream, Config()

    import torch.distributed as dist
    monkeypatch.setattr(dist, "ProcessGroupNCCL", type("PG", (), {"Options": Options}), raising=False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: seen.update(backend=backend, **kw))
    torch = type("T", (), {"device": staticmethod(lambda d: d)})
    distributed.join_group(torch, 0, 2, "cuda:0", max_ctas=4, high_priority=True)
    assert seen["backend"] == "nccl" and seen["pg_options"].config.max_ctas == 4 and seen["pg_options"].is_high_priority_stream
    distributed.join_group(torch, 0, 2, "cuda:0")
    assert seen["pg_options"] is None


def test_share_beside_counts_overlapping_kernels_once():
    compute = pd.DataFrame({"start": [0, 50, 60, 200], "end": [40, 80, 90, 300]})
    # [10, 110): covered by [10, 40) and [50, 90) = 30 + 40 of 100
    assert mg._share_beside(compute, 10, 110) == pytest.approx(0.7)
    assert mg._share_beside(compute, 100, 150) == 0.0
    assert mg._share_beside(compute.iloc[:0], 0, 10) == 0.0


def test_kernels_beside_wait_on_the_reference_straggler():
    data = ranks.rank_data(REF / "straggler.sqlite")
    t = mg.kernels_beside_wait(data[0], data[1])
    gemm = t.iloc[0]  # the kernel with the most time inside the wait: backward's matrix product
    assert gemm["inside_n"] > 100 and gemm["outside_n"] > 0
    # beside the spinning all-reduce it runs longer than outside it and than on the rank that did not wait
    assert gemm["inside_us"] > 1.5 * gemm["outside_us"] and gemm["inside_us"] > 1.5 * gemm["other_rank_us"]


def test_trace_idle_breakdown_splits_htas_categories_by_where_the_gap_lies():
    """The committed chapter 8 traces (3 steps of 16 all-reduces each): on NCCL's stream the two gaps that span the
    next step's forward are host wait, and the table's sums per stream and category are hta_compat's (held equal to
    HTA 0.5's in tests/test_third_party_traces.py)."""
    from gpuprof.torch_profiler import hta_compat as hc

    paths = [REF / f"ddp_trace_rank{r}.json.gz" for r in (0, 1)]
    t = mg.trace_idle_breakdown(paths)
    for p in paths:
        mine = t[t["trace"] == p.name]
        nccl = mine[mine["stream"] == "NCCL"]
        between = nccl[nccl["where"] == "between steps"]
        assert set(between["category"]) == {"host_wait"} and between["gaps"].sum() == 2
        assert nccl["gaps"].sum() == 48 - 1
        hta = hc.idle_time_breakdown(p, rounding="hta").set_index(["streamId", "category"])
        sums = mine.groupby(["streamId", "category"])[["gaps", "idle_ms"]].sum().add_prefix("split_")
        joined = hta.join(sums, how="left").fillna(0)
        assert (joined["split_gaps"] == joined["gaps"]).all()
        assert ((joined["split_idle_ms"] * 1e3).round(6) == joined["idle_us"].round(6)).all()
