"""gpuprof.studies.llm_inference: the decode roofline's arithmetic, the recorded ceilings it reads, the KV-cache
capacity, the script's results as tables, and the reader of an Nsight Systems capture of the decoding loop (on a
synthetic export whose answers are known)."""

from __future__ import annotations

import json
import sqlite3
import statistics

import pandas as pd
import pytest

from gpuprof.artifacts import REPO_ROOT
from gpuprof.errors import GpuprofError
from gpuprof.studies import llm_inference as li

ART = REPO_ROOT / "artifacts"
CFG = li.model_config("8b")
GIB = 2**30
WEIGHTS = 8_030_261_248 * 2  # bf16
KV_TOKEN = 131072  # 2 x 32 layers x 8 heads x 128 x 2 bytes


def _json(path):
    return json.loads((ART / path).read_text())


def test_ceilings_are_read_from_the_course_files_with_their_gpu():
    sol = _json("ch00/speed_of_light.json")
    gpu = _json("ch00/provenance.json")["files"]["speed_of_light.json"]["machine"]["gpu_name"]
    figures = {f["key"]: f["value"] for f in sol["figures"]}
    c = li.recorded_ceilings()
    assert c.gpu == c.copy.gpu == c.matmul.gpu == gpu
    assert c.copy_gbps == figures["d2d"] and c.matmul_tflops == figures["matmul_bf16"]
    assert c.copy.source == c.matmul.source == "artifacts/ch00/speed_of_light.json"
    assert c.ridge == pytest.approx(figures["matmul_bf16"] * 1e12 / (figures["d2d"] * 1e9))


def test_an_h200_without_chapter_0_figures_gets_chapter_4s_copy_and_chapter_11s_cublas():
    transpose = _json("ch04_h200/transpose.json")
    ladder = _json("ch11/ladder_h200.json")
    assert transpose["machine"]["gpu_name"] == "NVIDIA H200"
    rates = [r["rate"] for run in ladder["runs"] for r in run["results"] if r["name"] == "cublas_bf16_out"]
    c = li.recorded_ceilings("NVIDIA H200")
    assert c.copy_gbps == transpose["device_copy_gbps"] and c.copy.source == "artifacts/ch04_h200/transpose.json"
    assert c.matmul_tflops == statistics.median(rates) and f"median of {len(rates)} processes" in c.matmul.how
    with pytest.raises(GpuprofError, match=r"no device copy on NVIDIA A100.*it has figures for NVIDIA H100 80GB HBM3, "
                                           r"NVIDIA H200"):
        li.recorded_ceilings("NVIDIA A100")


def test_step_cost_is_the_scripts_arithmetic():
    s = li.script()
    cost = li.step_cost(CFG, 8, 640)
    assert cost.bytes == s.decode_step_bytes(CFG, 8, 640, 2) and cost.flops == s.decode_step_flops(CFG, 8, 640)
    assert cost.intensity == cost.flops / cost.bytes
    # batch 1: about 1 FLOP per byte (2 FLOPs per 2-byte weight), far below any GPU's ridge
    assert 0.9 < li.step_cost(CFG, 1, 1).intensity < 1.1


def _ceilings(gbps, tflops):
    return li.Ceilings(li.Ceiling(gbps, "GB/s", "G", "x", "test"), li.Ceiling(tflops, "TFLOP/s", "G", "x", "test"))


def test_the_crossover_is_where_memory_time_equals_compute_time():
    bw, rate = 3000.0, 800.0
    for context in (1, 64, 144):
        n = li.crossover_batch(CFG, context, bw, rate)
        # written out: weights (less the embedding rows not looked up) over the bandwidth, over the margin each
        # sequence adds: its FLOPs at the rate less its bytes (KV cache and embedding row) at the bandwidth
        fixed = WEIGHTS - 128256 * 4096 * 2
        per_bytes, per_flops = 4096 * 2 + context * KV_TOKEN, 2 * CFG.matmul_params + 4 * 32 * 32 * 128 * context
        assert n == pytest.approx((fixed / (bw * 1e9)) / (per_flops / (rate * 1e12) - per_bytes / (bw * 1e9)))
        table = li.prediction_table(CFG, [int(n), int(n) + 1], context, _ceilings(bw, rate))
        assert list(table["bound"]) == ["memory", "compute"]
        mem, comp = li.roofline_ms(li.step_cost(CFG, 1, context), _ceilings(bw, rate))
        assert mem > comp  # batch 1 is memory-bound
    # More bandwidth, same rate: memory time shrinks, the turn comes at a smaller batch.
    assert li.crossover_batch(CFG, 64, 2 * bw, rate) < li.crossover_batch(CFG, 64, bw, rate)
    # At 576 tokens a sequence's cache (72 MiB) takes longer to read at 3 TB/s than its 15 GFLOP at 800 TFLOP/s:
    # memory-bound at every batch.
    assert li.crossover_batch(CFG, 576, bw, rate) is None


def test_kv_capacity_is_the_largest_batch_that_fits_beside_the_weights():
    free = 80 * GIB
    for context in (512, 2048, 8192):
        n = li.kv_capacity(CFG, free, context)
        assert WEIGHTS + n * context * KV_TOKEN <= free < WEIGHTS + (n + 1) * context * KV_TOKEN
        assert li.max_context(CFG, free, n) >= context
    assert li.kv_capacity(CFG, free, 2048, reserve_bytes=4 * GIB) < li.kv_capacity(CFG, free, 2048)
    assert li.kv_capacity(CFG, 10 * GIB, 512) == 0 and li.max_context(CFG, 10 * GIB, 1) == 0  # the weights alone: 15 GiB
    table = li.capacity_table(CFG, free, [2048])
    assert table.loc[2048, "kv_MiB_per_sequence"] == 256.0 and table.loc[2048, "largest_batch"] == li.kv_capacity(CFG, free, 2048)


def _results():
    row = {"rung": "graph", "batch": 1, "prefill_ms": 10.0, "prefill_tflops": 500.0, "decode_ms_per_step": 6.0,
           "decode_ms_q1": 5.9, "decode_ms_q3": 6.1, "decode_tokens_per_s": 166.0, "bytes_per_step": 15e9,
           "flops_per_step": 15e9, "decode_gbps": 2500.0, "decode_tflops": 2.5, "check": {"status": "identical"},
           "setup_s": 1.0}
    # the rates are the median step's: 15e9 bytes in 10 ms is 1,500 GB/s, 4e12 FLOPs 400 TFLOP/s
    big = {**row, "batch": 512, "decode_ms_per_step": 10.0, "decode_tokens_per_s": 512 / 0.0125, "flops_per_step": 4e12,
           "decode_gbps": 1.0, "decode_tflops": 1.0}
    return {"rows": [row, big]}


def test_rows_table_sets_the_rates_against_the_ceilings():
    t = li.rows_table(_results(), _ceilings(3000.0, 800.0))
    r = t.loc[("graph", 1)]
    assert r["share_of_copy"] == pytest.approx(2500 / 3000) and r["share_of_matmul"] == pytest.approx(2.5 / 800)
    assert r["prefill_share_of_matmul"] == pytest.approx(500 / 800) and r["check"] == "identical"
    big = t.loc[("graph", 512)]  # the JSON's own rates (over the total time) are not used; its mean step is kept
    assert big["GB_per_s"] == pytest.approx(1500) and big["TFLOP_per_s"] == pytest.approx(400)
    assert big["tokens_per_s"] == pytest.approx(51200) and big["mean_ms"] == pytest.approx(12.5)
    # the measured knee: the crossover formula with batch 1's bandwidth and batch 512's FLOP rate
    assert li.measured_knee(t, "graph", CFG, 64) == pytest.approx(li.crossover_batch(CFG, 64, 2500.0, 400.0))
    with pytest.raises(GpuprofError, match="needs two or more"):
        li.measured_knee(t.drop(("graph", 512)), "graph", CFG, 64)


def test_rows_table_reads_a_cpu_run_of_the_script(tmp_path):
    out = tmp_path / "r.json"
    assert li.script().main(["--cpu", "--batch", "1,2", "--prompt-len", "6", "--new-tokens", "3", "--json", str(out)]) == 0
    t = li.rows_table(out)
    assert list(t.index) == [(r, b) for b in (1, 2) for r in ("eager_dynamic", "eager_static", "eager_fixed")]
    assert (t["GB_per_s"] > 0).all() and set(t["check"]) == {"identical", "within bound", "reference"}


# ----- the capture reader, on a synthetic export -----

MS = 1_000_000
TID = (100 << 24) | 101


def _export(path):
    """Two rungs of three decoding steps each, on one thread.

    eager_static: each step's NVTX range lasts 10 ms, with four cudaLaunchKernel calls of 0.5 ms; each kernel runs
    1 ms, 0.1 ms after its launch: 4 ms of work per 10 ms step (the GPU waits for the CPU).
    graph: each step's range lasts 0.1 ms with one cudaGraphLaunch (0.05 ms) whose four kernels run back to back
    for 1 ms each: the GPU busy all along, the CPU far ahead.
    """
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    con.executemany("INSERT INTO StringIds VALUES (?, ?)",
                    [(1, "gemm"), (2, "cudaLaunchKernel_v7000"), (3, "cudaGraphLaunch_v10000")])
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, streamId INT, "
                "correlationId INT, globalPid INT, shortName INT, demangledName INT)")
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, nameId INT, correlationId INT, globalTid INT)")
    con.execute("CREATE TABLE NVTX_EVENTS (start INT, end INT, eventType INT, globalTid INT, text TEXT)")
    nvtx = [(0, 40 * MS, "rung_eager_static_b1"), (0, 1 * MS, "prefill")]
    corr = 0
    for i in range(3):
        s = 1 * MS + i * 10 * MS
        nvtx.append((s, s + 10 * MS, f"decode_step_{i}"))
        for j in range(4):
            corr += 1
            launch = s + (1 + 2 * j) * MS
            con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?)", (launch, launch + MS // 2, 2, corr, TID))
            k = launch + MS // 10
            con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,?,?)", (k, k + MS, 0, 7, corr, 100 << 24, 1, 1))
    nvtx.append((50 * MS, 70 * MS, "rung_graph_b1"))
    for i in range(3):
        s = 51 * MS + i * MS // 10
        nvtx.append((s, s + MS // 10, f"decode_step_{i}"))
        corr += 1
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?)", (s + MS // 100, s + 6 * MS // 100, 3, corr, TID))
        for j in range(4):
            k = 52 * MS + (4 * i + j) * MS
            con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,?,?)", (k, k + MS, 0, 7, corr, 100 << 24, 1, 1))
    con.executemany("INSERT INTO NVTX_EVENTS VALUES (?,?,59,?,?)", [(a, b, TID, t) for a, b, t in nvtx])
    con.commit()
    con.close()


def test_the_capture_reader_names_the_launch_bound_loop_and_the_graph(tmp_path):
    path = tmp_path / "decode.sqlite"
    _export(path)
    steps = li.decode_steps(path)
    assert len(steps) == 6 and list(steps["step"]) == [0, 1, 2, 0, 1, 2]
    assert (steps["kernels"] == 4).all()
    s = li.capture_summary(path)
    eager, graph = s.loc[("eager_static", 1)], s.loc[("graph", 1)]
    assert eager["launch_calls_per_step"] == 4 and eager["graph_launches_per_step"] == 0
    assert graph["launch_calls_per_step"] == 0 and graph["graph_launches_per_step"] == 1
    assert eager["cpu_ms_per_step"] == pytest.approx(10.0) and eager["api_ms_per_step"] == pytest.approx(2.0)
    # eager: 12 ms of kernels from 2.1 ms to 29.1 ms; graph: 12 ms from 52 to 64 ms
    assert eager["gpu_period_ms"] == pytest.approx(27.0 / 3) and eager["busy_share"] == pytest.approx(12 / 27)
    assert graph["busy_share"] == pytest.approx(1.0) and graph["gpu_busy_ms_per_step"] == pytest.approx(4.0)
    assert eager["bound"] == "CPU" and graph["bound"] == "GPU"
    assert graph["cpu_ms_per_step"] == pytest.approx(0.1)


def test_a_trimmed_capture_keeps_whole_late_steps_and_the_graphs_late_kernels(tmp_path):
    """The reference trim: the eager rung's last two steps (ranges, launch calls and kernels), the graph rung whole,
    its kernels kept with their launch though they run long after its steps' ranges end; the summary of what is
    kept is the same per step."""
    path = tmp_path / "decode.sqlite"
    _export(path)
    before = li.capture_summary(path)
    note = li.trim_decode_capture(path, {"eager_static": 2})
    assert "eager_static 2 of 3" in note and "graph 3 of 3" in note
    steps = li.decode_steps(path)
    assert list(steps["step"]) == [1, 2, 0, 1, 2] and (steps["kernels"] == 4).all()
    after = li.capture_summary(path)
    assert after.loc[("eager_static", 1), "steps"] == 2
    for col in ("kernels_per_step", "launch_calls_per_step", "cpu_ms_per_step", "gpu_busy_ms_per_step"):
        assert after.loc[("eager_static", 1), col] == pytest.approx(before.loc[("eager_static", 1), col]), col
    assert after.loc[("graph", 1)].equals(before.loc[("graph", 1)])
    con = sqlite3.connect(path)
    assert con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0] == 8 + 12
    con.close()


def test_a_capture_without_the_scripts_ranges_is_refused(tmp_path):
    path = tmp_path / "plain.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, streamId INT, "
                "correlationId INT, globalPid INT, shortName INT, demangledName INT)")
    con.execute("CREATE TABLE NVTX_EVENTS (start INT, end INT, eventType INT, globalTid INT, text TEXT)")
    con.execute("INSERT INTO NVTX_EVENTS VALUES (0, 10, 59, 1, 'step_0')")
    con.commit()
    con.close()
    with pytest.raises(GpuprofError, match=r"no rung_<RUNG>_b<BATCH> range"):
        li.decode_steps(path)


# ----- chapter 12's committed records -----

def _ch12(name):
    from gpuprof.artifacts import find_capture

    return find_capture("ch12", name, prefer="reference")


def test_the_runs_ceilings_are_read_from_its_own_file():
    raw = _json("ch12/ceilings.json")
    c = li.session_ceilings(_ch12("ceilings.json"))
    assert c.copy_gbps == raw["d2d_gbps"] and c.matmul_tflops == raw["matmul_bf16_tflops"] and c.gpu == raw["gpu"]
    assert c.copy.source == c.matmul.source == "artifacts/ch12/ceilings.json" and "same session" in c.copy.how


def test_the_chapters_shares_are_the_records_rates_over_the_same_sessions_ceilings():
    """The ladder's share of the copy is the row's GB/s over ceilings.json's, and GB/s is the step's bytes over its
    median step, the statistic of the ms column: recomputed here from each row's own steps, independently of
    rows_table; the script's own rate (over the total time) is the mean step's."""
    raw, ceil = _json("ch12/ladder.json"), _json("ch12/ceilings.json")
    t = li.rows_table(_ch12("ladder.json"), li.session_ceilings(_ch12("ceilings.json")))
    for r in raw["rows"]:
        row, median = t.loc[(r["rung"], r["batch"])], statistics.median(r["decode_step_ms"])
        gbps = r["bytes_per_step"] / (median / 1e3) / 1e9
        assert row["ms_per_step"] == median and row["tokens_per_s"] == pytest.approx(r["batch"] / (median / 1e3), rel=1e-9)
        assert row["share_of_copy"] == pytest.approx(gbps / ceil["d2d_gbps"], rel=1e-9)
        assert r["bytes_per_step"] / (row["mean_ms"] / 1e3) / 1e9 == pytest.approx(r["decode_gbps"], rel=1e-9)
        assert row["mean_ms"] == pytest.approx(statistics.mean(r["decode_step_ms"]), rel=1e-6)


def test_the_sweeps_knee_and_prediction_come_from_its_context_and_rates():
    sweep, ceil = _json("ch12/sweep.json"), li.session_ceilings(_ch12("ceilings.json"))
    context = sweep["prompt_len"] + sweep["new_tokens"] // 2
    t = li.rows_table(sweep, ceil)
    first, last = sweep["rows"][0], sweep["rows"][-1]
    assert li.measured_knee(t, "graph", CFG, context) == pytest.approx(li.crossover_batch(
        CFG, context, first["bytes_per_step"] / first["decode_ms_per_step"] / 1e6,
        last["flops_per_step"] / last["decode_ms_per_step"] / 1e9), rel=1e-9)
    fit = li.knee_fit(t, "graph")
    lo, hi = fit.split
    assert lo <= fit.batch <= hi and fit.right[1] > fit.left[1] > 0  # the upper line is the steeper
    # the H200 record of 2026-11-27: the lines of the split 128 | 256 cross at 200.0, between them (the fit keeps
    # only splits whose lines cross between them, tested above on a known knee)
    assert fit.split == (128, 256) and fit.batch == pytest.approx(200.0, abs=0.05)
    predicted = li.crossover_batch(CFG, context, ceil.copy_gbps, ceil.matmul_tflops)
    mem, comp = li.roofline_ms(li.step_cost(CFG, round(predicted), context), ceil)
    assert mem == pytest.approx(comp, rel=0.01)  # the crossover is where the two times meet


def test_the_ladder_figure_draws_every_rung_and_the_sweep():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ceil = li.session_ceilings(_ch12("ceilings.json"))
    lad, sw = li.rows_table(_ch12("ladder.json"), ceil), li.rows_table(_ch12("sweep.json"), ceil)
    roof = li.prediction_table(CFG, sorted(set(sw.index.get_level_values("batch"))), 48, ceil)
    fig = li.ladder_figure(lad, ceil, sw, {"predicted crossover": 290.0}, roofline=roof, fit=li.knee_fit(sw, "graph"))
    bars, curve = fig.axes
    assert len(bars.patches) == len(lad)  # one bar per (rung, batch)
    rungs = list(dict.fromkeys(lad.index.get_level_values(0)))
    assert [tick.get_text() for tick in bars.get_xticklabels()] == [
        f"{r}\n(its own bytes)" if r == "int8_graph" else r for r in rungs]  # int8's share is of its own bytes
    hatched = {round(p.get_x() + p.get_width() / 2) for p in bars.patches if p.get_hatch()}
    assert hatched == {rungs.index("int8_graph")}  # its bars, and only its, are hatched
    labels = [t.get_text() for t in curve.get_legend().get_texts()]
    assert "predicted crossover (290)" in labels and "two lines fitted" in labels
    assert not any("share" in label for label in labels)  # step times, not the two shares that cross by construction
    plt.close(fig)


def test_the_two_line_fit_finds_a_known_knee():
    """Step times on two known lines, 5 + 0.001 n up to 256 and 0.03 n - 2.424 beyond (they cross at 256): the fit
    returns both lines and the crossing; a single straight line is refused."""
    import pandas as pd

    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 768, 1024]
    ms = [5 + 0.001 * n if n <= 256 else 0.03 * n - 2.424 for n in batches]
    t = pd.DataFrame({"rung": "graph", "batch": batches, "ms_per_step": ms}).set_index(["rung", "batch"])
    fit = li.knee_fit(t, "graph")
    assert fit.batch == pytest.approx(256, rel=1e-6) and fit.right[1] == pytest.approx(0.03)
    assert fit.left == pytest.approx((5.0, 0.001)) and fit.sse == pytest.approx(0, abs=1e-12)
    line = t.assign(ms_per_step=[5 + 0.001 * n for n in batches])
    with pytest.raises(GpuprofError, match="no knee"):
        li.knee_fit(line, "graph")


# ----- kv_capacity.py's record -----

KV_FIXTURE = REPO_ROOT / "tests" / "data" / "kv_capacity_cpu" / "kv_capacity.json"


def test_the_kv_capacity_table_reads_a_cpu_run_of_the_script():
    """The fixture: the tiny model on the CPU under a 0.05 GB limit (its README says how it was made)."""
    res = json.loads(KV_FIXTURE.read_text())
    t = li.kv_capacity_table(KV_FIXTURE)
    assert list(t.index) == [256, 2048]
    tiny = li.model_config("tiny")
    for r in res["contexts"]:
        row = t.loc[r["context"]]
        assert row["predicted_batch"] == li.kv_capacity(tiny, res["free_bytes"], r["context"], 4) == r["predicted_batch"]
        assert row["measured_batch"] == r["measured_batch"] and row["ratio"] == r["measured_batch"] / r["predicted_batch"]
        assert row["kv_bytes_per_token"] == 1024 and row["kv_MiB_per_sequence"] == r["context"] / 1024
        assert row["cache_GiB"] * 2**30 == r["measured_batch"] * r["context"] * 1024
        assert row["unused_prediction_GiB"] * 2**30 == (r["predicted_batch"] - r["measured_batch"]) * r["context"] * 1024
        assert pd.isna(row["non_cache_GiB"]) and pd.isna(row["reserved_beyond_GiB"]) and pd.isna(row["kept_after_GiB"])  # no CPU allocator figures
    assert 0 < t["ratio"].min() and t["ratio"].max() <= 1 and t["attention_backends"].str.contains("MATH").all()


def test_the_kv_capacity_table_says_where_a_gpus_memory_went():
    """The fixture with allocator figures written in by hand (not a measurement): the non-cache memory is the try's
    peak less the resident model and the cache, and the allocator's reserve is what it kept beyond the peak."""
    res = json.loads(KV_FIXTURE.read_text())
    at = res["contexts"][0]["at_measured"]
    at.update(peak_allocated=res["resident_bytes"] + at["cache_bytes"] + 3 * 2**20, peak_reserved=
              res["resident_bytes"] + at["cache_bytes"] + 5 * 2**20, free_at_peak=2**30,
              allocated_after=res["resident_bytes"] + 2**20)
    row = li.kv_capacity_table(res).iloc[0]
    assert row["non_cache_GiB"] * 2**30 == 3 * 2**20 and row["reserved_beyond_GiB"] * 2**30 == 2 * 2**20
    assert row["free_at_peak_GiB"] == 1.0 and row["kept_after_GiB"] * 2**30 == 2**20


def test_a_kv_capacity_record_made_under_other_arithmetic_is_refused():
    res = json.loads(KV_FIXTURE.read_text())
    res["contexts"][1]["predicted_batch"] += 1
    with pytest.raises(GpuprofError, match="the arithmetic now gives 20"):
        li.kv_capacity_table(res)


def test_the_committed_capture_names_the_naive_loop_cpu_bound_and_the_graphs_gpu_bound():
    """decode_b1.sqlite.gz (H200, 2026-11-27, trimmed): the naive loop launches each kernel itself and leaves the GPU
    idle most of a step; the two graph rungs launch one graph a step and keep it busy; the fused step has fewer
    kernels than the compiled one."""
    s = li.capture_summary(_ch12("decode_b1.sqlite").path)
    eager, graph, fused = (s.loc[(r, 1)] for r in ("eager_dynamic", "compile_graph", "fused_graph"))
    assert eager["bound"] == "CPU" and graph["bound"] == "GPU" and fused["bound"] == "GPU"
    assert eager["launch_calls_per_step"] == eager["kernels_per_step"] > 1000
    assert graph["graph_launches_per_step"] == fused["graph_launches_per_step"] == 1
    assert fused["kernels_per_step"] < graph["kernels_per_step"]


def test_the_profiled_step_matches_the_traced_one_kernel_for_kernel():
    """fused_graph's step 4 under ncu (the kernel table) and in the nsys capture: the same 502 kernels in the same
    order, so the traced times can replace ncu's (in_situ); a step of another rung is refused."""
    from gpuprof.studies import decode_kernels as dk

    cfg = li.model_config("8b")
    k = dk.step_kernels(_ch12("decode_ncu_fused_graph.kernels.csv").path, cfg, 2,
                        step_range="rung_fused_graph_b1/decode_step_4")
    t = li.step_kernel_times(_ch12("decode_b1.sqlite").path, "fused_graph", 4)
    both = li.in_situ(k, t)
    assert len(both) == 502 and (both["read_MB"] == k["read_MB"]).all()
    assert both["time_us"].sum() < k["time_us"].sum()  # ncu's replays stretch the step
    with pytest.raises(GpuprofError, match="differ"):
        li.in_situ(k, li.step_kernel_times(_ch12("decode_b1.sqlite").path, "compile_graph", 4))


def test_processes_table_puts_each_process_beside_its_own_copy():
    fast = {"rows": [{**_results()["rows"][0], "rung": "triton_graph"},
                     {**_results()["rows"][0], "rung": "fused_graph", "decode_ms_per_step": 7.5}]}
    slow = {"rows": [{**r, "decode_ms_per_step": r["decode_ms_per_step"] * 2} for r in fast["rows"]]}
    t = li.processes_table({"a": (fast, _ceilings(3000.0, 800.0)), "b": (slow, _ceilings(2000.0, 800.0))})
    assert list(t.index) == ["a", "b"] and list(t["copy_gbps"]) == [3000.0, 2000.0]
    # 15e9 bytes in 6 ms: 2,500 GB/s; in 12 ms: 1,250 GB/s
    assert t.loc["a", "share_of_copy"] == pytest.approx(2500 / 3000) and t.loc["b", "share_of_copy"] == pytest.approx(1250 / 2000)
    assert t.loc["a", "fused_graph_x"] == pytest.approx(1.25) and t.loc["b", "fused_graph_x"] == pytest.approx(1.25)
    assert "compile_graph_x" not in t.columns  # a rival the process did not run is left out, not invented
    with pytest.raises(ValueError, match="at least one"):
        li.processes_table({})
    with pytest.raises(GpuprofError, match="b: no compile_graph row at batch 1"):
        li.processes_table({"b": (slow, _ceilings(2000.0, 800.0))}, rung="compile_graph")


def test_copy_series_table_reads_each_measurement_in_its_process_and_order():
    data = {"processes": [[{"t_s": 0.0, "gbps": 4000.0, "relative_spread": 0.01, "sm_mhz": 1980},
                           {"t_s": 4.1, "gbps": 4100.0, "relative_spread": 0.02, "sm_mhz": 1980}],
                          [{"t_s": 0.0, "gbps": 4050.0, "relative_spread": 0.01, "sm_mhz": None}]]}
    t = li.copy_series_table(data)
    assert list(t.index) == [(1, 0), (1, 1), (2, 0)] and list(t["gbps"]) == [4000.0, 4100.0, 4050.0]
    assert t.loc[(1, 1), "t_s"] == 4.1
    raw = _json("ch12/copy_repeats.json")  # the committed record: every measurement, none dropped
    assert len(li.copy_series_table(_ch12("copy_repeats.json"))) == sum(len(s) for s in raw["processes"])
    with pytest.raises(GpuprofError, match="no measurement"):
        li.copy_series_table({"processes": [[]]})


def test_the_repeated_processes_shares_are_their_steps_over_their_own_copies():
    """Chapter 12's repeats: every process's triton_graph share is its bytes over its median step, over the copy its
    own session measured (recomputed from the raw JSON), and each copy file is that process's GPU's."""
    for suffixes, gpu in ((["", "_rep1", "_rep2", "_rep3"], "NVIDIA H200"), (["_h100", "_rep1_h100", "_rep2_h100"], "H100")):
        runs = {s: (_ch12(f"own_kernels{s}.json"), li.session_ceilings(_ch12(f"own_ceilings{s}.json"))) for s in suffixes}
        t = li.processes_table(runs)
        for s in suffixes:
            raw, ceil = _json(f"ch12/own_kernels{s}.json"), _json(f"ch12/own_ceilings{s}.json")
            assert gpu in ceil["gpu"] and gpu in raw["machine"]["gpu_name"]
            r = next(r for r in raw["rows"] if r["rung"] == "triton_graph" and r["batch"] == 1)
            median = statistics.median(r["decode_step_ms"])
            assert t.loc[s, "share_of_copy"] == pytest.approx(r["bytes_per_step"] / (median / 1e3) / 1e9 / ceil["d2d_gbps"], rel=1e-9)


def test_a_later_part_of_capture_ch12_adds_to_the_logs_provenance_instead_of_replacing_it(tmp_path, monkeypatch):
    """run_output.txt is a concatenation of parts: a part that appends must keep the first part's command and machine
    and add a line naming itself; a run that starts with the ceilings starts the entry afresh."""
    import sys

    monkeypatch.syspath_prepend(str(REPO_ROOT / "scripts"))
    monkeypatch.setenv("GPUPROF_OUTPUT_DIR", str(tmp_path))
    monkeypatch.setenv("GPUPROF_GIT_COMMIT", "abc1234")
    sys.modules.pop("capture_ch12", None)
    import capture_ch12

    folder = tmp_path / "ch12"
    folder.mkdir()
    (folder / "run_output.txt").write_text("first part\nsecond part\n")
    first = {"command": "python3 scripts/capture_ch12.py --only own", "git_commit": "0000000", "machine": {"gpu_name": "X"}}
    (folder / "provenance.json").write_text(json.dumps({"chapter": "ch12", "files": {"run_output.txt": first}}))
    capture_ch12.record_log(["copy_repeats"])
    entry = json.loads((folder / "provenance.json").read_text())["files"]["run_output.txt"]
    assert entry["command"] == first["command"] and entry["machine"] == first["machine"] and entry["git_commit"] == "0000000"
    assert "then python3 scripts/capture_ch12.py --only copy_repeats" in entry["note"] and "abc1234" in entry["note"]
    assert entry["bytes"] == len("first part\nsecond part\n")
    capture_ch12.record_log(["ceilings", "ladder"])  # a new log: a new entry
    entry = json.loads((folder / "provenance.json").read_text())["files"]["run_output.txt"]
    assert "--only ceilings,ladder" in entry["command"] and "note" not in entry
