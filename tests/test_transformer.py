"""The transformer case study (chapter 7): its two scripts on the CPU, and its readers on the reference run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from gpuprof.studies import speed_of_light as sol
from gpuprof.artifacts import REPO_ROOT
from gpuprof.kernel_kinds import kernel_kind, tensor_cores, time_by_kind
from gpuprof.nsys import sqlite as ns
from gpuprof.nsys.export_edit import keep_callchains
from gpuprof.nsys import stats
from gpuprof.runner import load_script
from gpuprof.studies import transformer as tr
from helpers import forked_json_runs, run_script_in_process

torch = pytest.importorskip("torch")

REF = REPO_ROOT / "artifacts" / "ch07"
TINY = ["--size", "tiny", "--context-length", "16", "--batch-size", "2", "--warmup-steps", "2", "--num-steps", "3"]
LAYER_TINY = ["--layers", "1", "--d-model", "64", "--heads", "4", "--d-ff", "128", "--seq-len", "16", "--batch-size", "2",
              "--warmup", "2", "--iterations", "3", "--repeats", "1", "--dtype", "fp32"]


def run(script, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout)


# ----- transformer_benchmark.py on the CPU -----

# The benchmark's runs to completion that the tests below read, by name; each is made once (see benchmark_runs).
BENCHMARK_RUNS = {
    "training": TINY,
    "design line": ["--context_length", "16", "--d_model", "32", "--num_layers", "1", "--num_heads", "2", "--d_ff", "64",
                    "--warmup_steps", "1", "--num_steps", "2", "--forward_only", "--batch_size", "2"],
    "forward only": [*TINY, "--forward-only", "--dtype", "bf16"],
    "checkpointed": [*TINY, "--checkpoint"],
}


@pytest.fixture(scope="module")
def benchmark_runs(tmp_path_factory) -> dict:
    """BENCHMARK_RUNS, each made once (helpers.forked_json_runs, as the script's own --sweep runs its children):
    name -> (exit status as text, output, the --json result)."""
    return forked_json_runs(tr.BENCHMARK, BENCHMARK_RUNS, tmp_path_factory.mktemp("transformer_runs"), timeout_s=600)


def test_benchmark_help_names_its_ranges(capsys):
    out = run_script_in_process(tr.BENCHMARK, "--help", capsys=capsys)
    assert out.returncode == 0
    for name in ("warmup", "measured_steps", "step_N", "forward_pass", "backward_pass", "optimizer_step", "--sweep"):
        assert name in out.stdout


@pytest.mark.slow
def test_benchmark_training_run_records_every_step(benchmark_runs):
    status, output, r = benchmark_runs["training"]
    assert status == "0", output
    assert r["status"] == "ok" and r["device"] == "cpu"
    assert len(r["warmup_step_ms"]) == 2 and len(r["step_ms_each"]) == 3 and len(r["phase_ms_each"]) == 3
    assert all(len(p) == 3 for p in r["phase_ms_each"])  # forward, backward, optimizer
    assert r["step_ms_each"] == pytest.approx([sum(p) for p in r["phase_ms_each"]])
    bench = load_script(tr.BENCHMARK)
    assert r["flops_per_step"] == bench.flops_per_step(r["config"], forward_only=False)
    assert r["tokens_per_s"] == pytest.approx(2 * 16 / (sum(r["step_ms_each"]) / 3 / 1e3))


# The command lines of the benchmark guide the course grew from, flags as that guide writes them (its script
# path replaced by ours); its batch script runs the same flags for every size and context length.
DESIGN_COMMANDS = [
    "--context_length 512 --d_model 768 --num_layers 12 --num_heads 12 --d_ff 3072 --warmup_steps 5 --num_steps 10",
    "--context_length 512 --d_model 768 --num_layers 12 --num_heads 12 --d_ff 3072 --warmup_steps 5 --num_steps 10 "
    "--forward_only",
]
DESIGN_MODELS = ["small:768:3072:12:12", "medium:1024:4096:24:16", "large:1280:5120:36:20", "xl:1600:6400:48:25",
                 "2.7B:2560:10240:32:32"]


def design_batch_commands() -> list[str]:
    """The batch script's loop, expanded: every size at context 128, 256, 512 and 1024."""
    out = []
    for model in DESIGN_MODELS:
        _, d_model, d_ff, num_layers, num_heads = model.split(":")
        for ctx in (128, 256, 512, 1024):
            out.append(f"--context_length {ctx} --d_model {d_model} --num_layers {num_layers} --num_heads {num_heads} "
                       f"--d_ff {d_ff} --warmup_steps 5 --num_steps 10")
    return out


@pytest.mark.parametrize("line", DESIGN_COMMANDS + design_batch_commands())
def test_the_design_guides_command_lines_parse_as_written(line):
    bench = load_script(tr.BENCHMARK)
    args = bench.parse_args(line.split())
    words = line.split()
    value = lambda flag: int(words[words.index(flag) + 1])  # noqa: E731
    assert (args.context_length, args.d_model, args.num_layers, args.num_heads, args.d_ff) == \
        (value("--context_length"), value("--d_model"), value("--num_layers"), value("--num_heads"), value("--d_ff"))
    assert (args.warmup_steps, args.num_steps, args.forward_only) == (5, 10, "--forward_only" in words)
    hyphens = bench.parse_args([w.replace("_", "-") if w.startswith("--") else w for w in words])
    assert vars(hyphens) == vars(args)


@pytest.mark.slow
def test_a_design_command_line_runs_with_its_underscored_flags(benchmark_runs):
    """One of the guide's lines, run to the end on the CPU at a tiny size (its flags as written)."""
    status, output, r = benchmark_runs["design line"]
    assert status == "0", output
    assert r["status"] == "ok" and r["config"]["d_model"] == 32 and len(r["step_ms_each"]) == 2 and "backward_ms" not in r


@pytest.mark.slow
def test_benchmark_forward_only_times_one_phase(benchmark_runs):
    status, output, r = benchmark_runs["forward only"]
    assert status == "0", output
    assert "forward_ms" in r and "backward_ms" not in r and all(len(p) == 1 for p in r["phase_ms_each"])
    assert r["config"]["dtype"] == "bf16" and "forward_backward_tflops" not in r


@pytest.mark.slow
def test_checkpointing_changes_no_loss_and_counts_the_recomputed_forward_as_hardware_flops(benchmark_runs):
    plain, (status, output, r) = benchmark_runs["training"][2], benchmark_runs["checkpointed"]
    assert status == "0", output
    assert "each block checkpointed" in output and r["config"]["checkpoint"] and not plain["config"]["checkpoint"]
    # the same seed, weights and tokens: recomputing each block's forward in backward changes no gradient
    assert r["last_output"] == pytest.approx(plain["last_output"], rel=1e-5)
    bench = load_script(tr.BENCHMARK)
    assert r["flops_per_step"] == plain["flops_per_step"]  # model FLOPs (MFU) do not count the recomputation
    assert r["hardware_flops_per_step"] == r["flops_per_step"] + bench.recomputed_flops(r["config"]) > r["flops_per_step"]
    assert plain["hardware_flops_per_step"] == plain["flops_per_step"]


def test_recomputed_flops_by_hand():
    bench = load_script(tr.BENCHMARK)
    cfg = {"d_model": 8, "d_ff": 32, "num_layers": 2, "num_heads": 2, "context_length": 4, "batch_size": 3, "vocab": 10}
    assert bench.recomputed_flops(cfg) == 0
    blocks_forward = 2 * 2 * (4 * 8 * 8 + 2 * 8 * 32) * 12 + 4 * 2 * 12 * 4 * 8  # the head (8 x 10) not recomputed
    assert bench.recomputed_flops({**cfg, "checkpoint": True}) == blocks_forward


def test_checkpoint_with_forward_only_is_refused_in_one_sentence(capsys):
    out = run_script_in_process(tr.BENCHMARK, "--checkpoint", "--forward-only", capsys=capsys)
    assert out.returncode == 2 and "no meaning with --forward-only" in out.stderr and "Traceback" not in out.stderr


def test_flops_count_by_hand():
    bench = load_script(tr.BENCHMARK)
    cfg = {"d_model": 8, "d_ff": 32, "num_layers": 2, "num_heads": 2, "context_length": 4, "batch_size": 3, "vocab": 10}
    weights = 2 * (4 * 8 * 8 + 2 * 8 * 32) + 8 * 10
    assert bench.matmul_parameters(cfg) == weights
    forward = 2 * weights * 12 + 4 * 2 * 12 * 4 * 8
    assert bench.flops_per_step(cfg, forward_only=True) == forward
    assert bench.flops_per_step(cfg, forward_only=False) == 3 * forward


def test_benchmark_counts_both_allocators_failures_as_out_of_memory():
    bench = load_script(tr.BENCHMARK)
    with pytest.raises(RuntimeError) as cpu:
        torch.empty(10**14)
    assert bench.is_out_of_memory(cpu.value)
    assert bench.is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert not bench.is_out_of_memory(RuntimeError("shape mismatch"))


@pytest.mark.parametrize("args, message", [
    (["--d-model", "100", "--num-heads", "12"], "not divisible"),
    (["--sweep", "--sizes", "small,enormous"], "neither a size"),
    (["--sweep", "--contexts", "128,0"], "each at least 1"),
    (["--sweep", "--sizes", "odd:10:20:1:3"], "not divisible"),
])
def test_benchmark_bad_input_is_one_sentence(args, message, capsys):
    out = run_script_in_process(tr.BENCHMARK, *args, capsys=capsys)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_sweep_reports_out_of_memory_as_a_row(tmp_path, capsys):
    """A size whose feed-forward weight this machine cannot hold: the child refuses it before allocating (in a child
    of the sweep's own fork server; the sweep's main runs in this process), and the sweep makes it a row."""
    out = run_script_in_process(tr.BENCHMARK, "--sweep", "--sizes", "tiny,huge:64:100000000000:1:1", "--contexts", "8",
                                "--warmup-steps", "1", "--num-steps", "2", "--json", str(tmp_path / "s.json"), capsys=capsys)
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "s.json").read_text())
    assert [(r["name"], r["status"]) for r in data["rows"]] == [("tiny", "ok"), ("huge", "out of memory")]
    assert "1 ran, 1 out of memory, 0 failed" in out.stdout
    table = tr.sweep_table(data, peak_tflops=100.0)
    assert table["status"].tolist() == ["ok", "out of memory"]
    assert table.loc[0, "matmul_rate_frac_fwd_bwd"] > 0 and pd.isna(table.loc[1, "tokens_per_s"])


def test_benchmark_refuses_a_size_that_cannot_fit_before_allocating(tmp_path, capsys):
    """What the run needs, what the machine has and which options to change, exit status 2, before any allocation
    (the run would otherwise die allocating a trillion sequences' token ids); its --json says so for the sweep."""
    out = run_script_in_process(tr.BENCHMARK, "--batch-size", "1000000000000", "--cpu", "--json", str(tmp_path / "r.json"),
                                capsys=capsys)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    for words in ("batch 1,000,000,000,000", "would take at least", "GiB of host memory", "is available",
                  "--batch-size", "--context-length"):
        assert words in out.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["status"] == "out of memory" and "would take at least" in data["error"]


def test_benchmark_least_bytes_counts_weights_state_tokens_and_logits():
    bench = load_script(tr.BENCHMARK)
    cfg = bench.model_config(bench.parse_args(["--d-model", "8", "--d-ff", "16", "--num-layers", "2", "--num-heads", "2",
                                              "--context-length", "5", "--batch-size", "3"]))
    weights = 2 * (4 * 8 * 8 + 2 * 8 * 16) + 8 * bench.VOCAB
    tokens_and_logits = 3 * 6 * 8 + 3 * 5 * bench.VOCAB * 4
    assert bench.least_bytes(cfg) == 16 * weights + tokens_and_logits
    assert bench.least_bytes({**cfg, "forward_only": True}) == 4 * weights + tokens_and_logits
    assert bench.least_bytes({**cfg, "dtype": "bf16"}) == 16 * weights + 3 * 6 * 8 + 3 * 5 * bench.VOCAB * 2


@pytest.mark.slow
def test_sweep_reports_a_failed_child_and_fails(tmp_path, capsys):
    # a million steps cannot finish in one second on any machine
    out = run_script_in_process(tr.BENCHMARK, "--sweep", "--sizes", "tiny", "--contexts", "8", "--child-timeout", "1",
                                "--num-steps", "1000000", "--json", str(tmp_path / "s.json"), capsys=capsys)
    data = json.loads((tmp_path / "s.json").read_text())
    assert out.returncode == 1 and data["rows"][0]["status"] == "failed"
    assert "did not finish within 1 s" in data["rows"][0]["error"]


# ----- launch_bound_layer.py on the CPU -----

def test_layer_variants_compute_the_same_function():
    layer = load_script(tr.LAYER)
    args = layer.parse_args(LAYER_TINY)
    weights = layer.make_weights(args, "cpu")
    x = torch.randn(2, 16, 64)
    a = layer.stack(layer.layer_ops, weights, x, 4)
    b = layer.stack(layer.layer_fused, weights, x, 4)
    assert a.shape == b.shape == x.shape and torch.allclose(a, b, atol=1e-4)
    ln = layer.layer_norm_ops(x, weights[0]["ln1_g"], weights[0]["ln1_b"])
    assert torch.allclose(ln, torch.nn.functional.layer_norm(x, (64,), weights[0]["ln1_g"], weights[0]["ln1_b"], 1e-12),
                          atol=1e-5)


@pytest.mark.slow
def test_layer_script_runs_on_the_cpu_and_skips_the_graph(tmp_path):
    out = run(tr.LAYER, *LAYER_TINY, "--variants", "ops,fused,graph", "--profile-iterations", "2",
              "--json", str(tmp_path / "l.json"))
    assert out.returncode == 0, out.stderr
    assert "graph skipped" in out.stdout
    r = json.loads((tmp_path / "l.json").read_text())
    assert r["variants"] == ["ops", "fused"] and r["skipped"] == ["graph"]
    assert r["results"]["ops"]["max_abs_diff"] == 0 and r["results"]["fused"]["ms_per_forward"] > 0


class _Reads(dict):
    """A dict that records which keys were read."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def test_ops_input_bytes_are_the_tensors_the_op_by_op_stack_reads():
    layer = load_script(tr.LAYER)
    args = layer.parse_args(LAYER_TINY)
    weights = [_Reads(w) for w in layer.make_weights(args, "cpu")]
    x = torch.randn(args.batch_size, args.seq_len, args.d_model)
    layer.stack(layer.layer_ops, weights, x, args.heads)
    assert weights[0].read == set(layer.OPS_WEIGHTS)
    read = sum(w[k].numel() * w[k].element_size() for w in weights for k in layer.OPS_WEIGHTS)
    assert layer.ops_input_bytes(vars(args)) == read + x.numel() * x.element_size()


@pytest.mark.slow
def test_static_weights_are_parameters_torch_compile_marks_static():
    """reduce-overhead-static computes what ops computes, its weights share the plain tensors' memory, and
    torch.compile marks them static (what tells CUDA-graph trees not to copy them), not the plain tensors. On the
    CPU, mode="reduce-overhead" compiles without graphs: the copies themselves need a GPU to be seen."""
    layer = load_script(tr.LAYER)
    args = layer.parse_args(LAYER_TINY)
    weights = layer.make_weights(args, "cpu")
    x = torch.randn(args.batch_size, args.seq_len, args.d_model)
    with torch.inference_mode():
        expected = layer.stack(layer.layer_ops, weights, x, args.heads)
        got = layer.make_forward("reduce-overhead-static", weights, x, args.heads)()
        held = layer.static_weights(weights)
        torch.compile(lambda: layer.stack(layer.layer_ops, held, x, args.heads), mode="reduce-overhead")()
    assert torch.allclose(got, expected, atol=1e-4)
    assert all(isinstance(p, torch.nn.Parameter) and not p.requires_grad for w in held for p in w.values())
    assert all(held[i][k].data_ptr() == weights[i][k].data_ptr() for i in range(len(weights)) for k in weights[i])
    assert {getattr(held[0][k], "_dynamo_static_input_type", None) for k in layer.OPS_WEIGHTS} == {"unguarded"}
    assert all(getattr(t, "_dynamo_static_input_type", None) is None for w in weights for t in w.values())


def test_layer_script_rejects_unknown_variants(capsys):
    out = run_script_in_process(tr.LAYER, "--variants", "ops,xla", capsys=capsys)
    assert out.returncode == 2 and "unknown variant(s) xla" in out.stderr and "Traceback" not in out.stderr


# ----- kernel kinds and names -----

@pytest.mark.parametrize("name, demangled, kind", [
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7", None, "attention"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80", None, "attention"),
    ("nvjet_sm90_tst_96x128_64x6_2x1_v_bz_NNN", None, "matrix product"),
    ("Kernel2", "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nt_align1>(T1::Params)", "matrix product"),
    ("Kernel2", None, "other"),
    ("GammaBetaBackwardCUDAKernelTemplate", None, "normalisation"),
    ("CatArrayBatchedCopy", None, "layout change"),
    ("embedding_backward_feature_kernel", None, "indexing / random"),
])
def test_kernel_kinds_of_a_transformer(name, demangled, kind):
    assert kernel_kind(name, demangled) == kind


def test_time_by_kind_uses_the_demangled_name_only_where_the_short_one_says_nothing():
    k = pd.DataFrame({"name": ["Kernel2", "vectorized_elementwise_kernel"], "duration_ns": [300, 100],
                      "demangled": ["void cutlass::Kernel2<cutlass_80_simt_sgemm>", "void at::native::gemm_like_name"]})
    t = time_by_kind(k).set_index("kind")
    assert t.loc["matrix product", "kernels"] == 1 and t.loc["elementwise", "kernels"] == 1


@pytest.mark.parametrize("name, answer", [
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4", "no: FP32 on CUDA cores"),
    ("nvjet_sm90_tst_96x128_64x6_2x1_v_bz_NNN", "yes"),
    ("cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align2", "yes (bf16)"),
    ("splitKreduce_kernel", "unknown from the name"),
    # PyTorch's FP32 memory-efficient attention: 3xTF32 on tensor cores from sm80 on, SIMT before
    ("fmha_cutlassB_f32_aligned_64x64_k64_sm80", "yes (3xTF32)"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80", "yes (3xTF32)"),
    ("fmha_cutlassF_f32_aligned_32x128_gmem_sm90", "yes (3xTF32)"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm75", "unknown from the name"),
])
def test_tensor_cores_from_the_name(name, answer):
    assert tensor_cores(name) == answer


def test_matmul_rate_needs_a_gpu():
    assert sol.matmul_bf16() is None or torch.cuda.is_available()


# ----- the readers on the reference run -----

def test_step_table_separates_warmup_by_name():
    steps = tr.step_table(REF / "all_steps.sqlite")
    assert steps["warmup"].sum() == 5 and len(tr.measured(steps)) == 10
    assert steps.loc[steps["warmup"], "step"].tolist() == [f"warmup_step_{i}" for i in range(5)]
    phases = steps[["forward_ms", "backward_ms", "optimizer_ms"]].sum(axis=1)
    assert (phases > 0).all() and (phases <= steps["cpu_ms"] + 1e-6).all()
    assert (steps["launches"] > 0).all() and (steps["gpu_busy_ms"] <= steps["gpu_span_ms"] + 1e-9).all()
    # the allocator grows its pools in the first two steps of this capture and never after
    assert steps["mallocs"].tolist()[:3] == [79, 18, 0] and (tr.measured(steps)["mallocs"] == 0).all()
    runtime = ns.runtime_calls(REF / "all_steps.sqlite")
    assert steps["mallocs"].sum() <= runtime["name"].str.startswith("cudaMalloc").sum()


def test_nsys_stats_nvtx_sum_agrees_with_the_reader():
    """The tool's own nvtx_sum (CSV) and the course's summary of the same export, range by range."""
    theirs = pd.read_csv(REF / "all_steps_nvtx_sum.csv")
    mine = stats.nvtx_summary(ns.nvtx_ranges(REF / "all_steps.sqlite"))
    merged = theirs.merge(mine, on="Range", suffixes=("_nsys", "_ours"))
    assert len(merged) == len(theirs) == len(mine)
    assert (merged["Instances_nsys"] == merged["Instances_ours"]).all()
    assert (merged["Total Time (ns)_nsys"] - merged["Total Time (ns)_ours"]).abs().max() <= 1
    assert merged.set_index("Range").loc[":forward_pass", "Instances_nsys"] == 15


def test_measured_range_capture_holds_only_the_measured_steps():
    steps = tr.step_table(REF / "measured_fp32.sqlite")
    assert len(steps) == 10 and not steps["warmup"].any()
    assert "warmup" not in set(ns.nvtx_ranges(REF / "measured_fp32.sqlite")["text"])


def test_events_and_nvtx_agree_on_the_reference():
    result = json.loads((REF / "measured_fp32.json").read_text())
    agree = tr.events_vs_nvtx(result, tr.step_table(REF / "measured_fp32.sqlite"))
    assert abs(agree["nvtx_over_events"] - 1) < 0.05 and abs(agree["span_over_events"] - 1) < 0.05


def test_phase_summary_sets_the_hosts_queueing_beside_the_gpus_phases():
    """The FP32 step is GPU-bound: the NVTX phase ranges (the host queueing) cover two thirds of the step, the rest is
    mostly the host waiting in the step's synchronisation; the CUDA events give each phase's time in the stream, and
    backward over forward by them (1.89x) is not the ranges' (1.94x)."""
    result = json.loads((REF / "measured_fp32.json").read_text())
    steps = tr.step_table(REF / "measured_fp32.sqlite")
    ph = tr.phase_summary(steps, result)
    assert list(ph.index) == ["forward", "backward", "optimizer", "rest of step"]
    assert ph["host_ms"].sum() == pytest.approx(steps["cpu_ms"].mean())  # the rows add up to the step's range
    assert 0.6 < ph["host_share"].iloc[:3].sum() < 0.7
    end = ph.loc["rest of step"]
    assert 0.8 * end["host_ms"] < end["sync_ms"] <= end["host_ms"]  # the wait is inside the rest, and most of it
    assert ph.loc["backward", "gpu_ms"] / ph.loc["forward", "gpu_ms"] == pytest.approx(1.895, abs=0.005)
    assert ph.loc["backward", "host_ms"] / ph.loc["forward", "host_ms"] == pytest.approx(1.942, abs=0.005)
    # without the JSON, the host's columns only
    assert "gpu_ms" not in tr.phase_summary(steps).columns


@pytest.mark.parametrize("capture, answer", [("measured_fp32", "no:"), ("measured_bf16", "yes")])
def test_kinds_and_matmul_kernels_of_the_references(capture, answer):
    kinds = tr.kinds_per_step(REF / f"{capture}.sqlite").set_index("kind")
    assert kinds["share"].sum() == pytest.approx(1.0)
    assert kinds["share"].get("other", 0.0) < 0.05  # the rules know this model's kernels
    mm = tr.matmul_kernels(REF / f"{capture}.sqlite")
    known = mm.loc[(mm["kind"] == "matrix product") & ~mm["tensor_cores"].str.startswith("unknown"), "tensor_cores"]
    assert len(known) and set(known.str.split(" ").str[0]) == {answer}


def test_backtraces_in_the_reference(tmp_path):
    path = REF / "backtraces.sqlite"
    cov = tr.backtrace_coverage(path).set_index("api")
    assert cov.loc["cudaLaunchKernel", "with_backtrace"] > 0
    kernels = ns.kernels(path).sort_values("duration_ns", ascending=False)
    stacks = [ns.launch_backtrace(path, c) for c in kernels["correlationId"].head(50)]
    stack = next(s for s in stacks if len(s))
    assert stack["depth"].tolist() == sorted(stack["depth"]) and "cudaLaunchKernel" in set(stack["symbol"])
    assert ns.launch_backtrace(REF / "measured_bf16.sqlite", int(kernels["correlationId"].iloc[0])).empty
    copy = tmp_path / "bt.sqlite"
    shutil.copy(ns.ensure_sqlite(path), copy)
    assert keep_callchains(copy, kernels["correlationId"].head(3)) <= 3
    assert sum(len(ns.launch_backtrace(copy, c)) > 0 for c in kernels["correlationId"].head(50)) <= 3


def test_layer_table_of_the_reference():
    result = json.loads((REF / "layer.json").read_text())
    lt = tr.layer_table(result, REF / "layer.sqlite")
    assert list(lt.index) == ["ops", "compiled", "reduce-overhead", "fused", "graph"]
    assert lt.loc["ops", "kernels_per_layer"] >= 3 * lt.loc["fused", "kernels_per_layer"]
    assert lt.loc["graph", "launch_calls_per_layer"] < 1 <= lt.loc["fused", "launch_calls_per_layer"]
    assert lt.loc["reduce-overhead", "launch_calls_per_layer"] < 1 <= lt.loc["compiled", "launch_calls_per_layer"]
    assert ((lt["busy_capture"] > 0) & (lt["busy_capture"] <= 1)).all()
    assert ((lt["busy_untraced"] > 0) & (lt["busy_untraced"] <= 1.05)).all()
    assert lt.loc["ops", "x_first"] == 1



def test_split_ratios_of_the_reference_are_the_chapters_verdicts():
    """The five ratios c7split2 checks, from the committed capture: the figures its stored output prints."""
    result = json.loads((REF / "layer.json").read_text())
    r = tr.split_ratios(tr.layer_table(result, REF / "layer.sqlite"))
    assert {k: round(v, 2) for k, v in r.items()} == {"fusion_gpu": 2.55, "graph_gain": 2.82, "graph_same_gpu": 0.98,
                                                      "ro_launch_calls_per_layer": 0.75, "ro_over_compiled": 2.34}


def test_with_option_replaces_the_value_once():
    """c7warm01's command lines: the varied option appears once, with the new value (it once appeared twice)."""
    args = tr.with_option(tr.CAPTURE_ARGS, "--warmup-steps", "0")
    assert args.count("--warmup-steps") == 1 and args[args.index("--warmup-steps") + 1] == "0"
    assert tr.CAPTURE_ARGS[tr.CAPTURE_ARGS.index("--warmup-steps") + 1] == "5", "the shared list is left as it was"
    assert tr.with_option(["--size", "small"], "--warmup-steps", "2") == ["--size", "small", "--warmup-steps", "2"]
    assert load_script(tr.BENCHMARK).parse_args(args).warmup_steps == 0


def test_window_table_of_the_reference():
    """c7split1's windows: their median is layer_table's time per forward, and the launch-bound fused stack's
    windows spread far more than the graph's (the reason c7split2's graph_gain bound is loose)."""
    result = json.loads((REF / "layer.json").read_text())
    win = tr.window_table(result)
    lt = tr.layer_table(result, REF / "layer.sqlite")
    assert list(win.index) == list(lt.index) and win.filter(like="window_").shape[1] == result["config"]["repeats"]
    assert (win["median"] - lt["us_per_forward"]).abs().max() < 1e-9
    assert round(win.loc["fused", "window_3"], 2) == 646.86 and round(win.loc["fused", "spread"], 2) == 1.49
    assert win.loc["graph", "spread"] < 1.02 < win.loc["fused", "spread"]
    assert tr.window_table({"variants": ["ops"], "results": {"ops": {"ms_per_forward": 1.0}}}).empty


def test_spread_summary_counts_the_runs_that_fail_each_bound():
    import sys
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import spread_ch07_split as sp

    good = {"fusion_gpu": 2.5, "graph_gain": 2.8, "graph_same_gpu": 0.98, "ro_launch_calls_per_layer": 0.75,
            "ro_over_compiled": 2.3}
    rows = {r["ratio"]: r for r in sp.summary([good, {**good, "graph_gain": 1.2}, {**good, "graph_same_gpu": 1.12}])}
    assert rows["graph_gain"]["failed"] == 1 and rows["graph_gain"]["low"] == 1.2 and rows["graph_gain"]["median"] == 2.8
    assert rows["graph_same_gpu"]["failed"] == 1 and rows["fusion_gpu"]["failed"] == 0
    assert set(rows) == set(good)
    # the default and the documented five runs parse (the limit once came out as 1), fifty-one does not
    assert sp.parse_args([]).runs == 5 and sp.parse_args(["--runs", "5"]).runs == 5
    with pytest.raises(SystemExit):
        sp.parse_args(["--runs", "51"])


def test_spread_run_keeps_the_windows_beside_the_ratios():
    """What spread_ch07_split.py records per process, on the committed capture: c7split2's ratios and c7split1's windows."""
    import sys
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import spread_ch07_split as sp

    result = json.loads((REF / "layer.json").read_text())
    ratios, windows, gpu_us = sp.one_run(result, REF / "layer.sqlite")
    table = tr.layer_table(result, REF / "layer.sqlite")
    assert ratios == tr.split_ratios(table)
    assert set(windows) == set(result["variants"]) and [round(w, 2) for w in windows["fused"]] == [962.9, 945.23, 646.86]
    # c7split1's GPU times per forward: library kernels 333 us, their graph 325 us
    assert set(gpu_us) == set(result["variants"]) and round(gpu_us["fused"]) == 333 and round(gpu_us["graph"]) == 325


def test_spread_record_names_the_host_the_tree_and_the_time():
    import sys
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import spread_ch07_split as sp
    from gpuprof.backend import describe_machine

    record = sp.provenance(describe_machine())
    assert "cpu_model" in record["machine_info"] and "cpu_count" in record["machine_info"]
    assert record["finished_utc"].endswith("+00:00") and "cuda_visible_devices" in record


def test_spread_script_refuses_in_one_sentence():
    import subprocess
    import sys

    script = str(REPO_ROOT / "scripts" / "spread_ch07_split.py")
    bad = subprocess.run([sys.executable, script, "--runs", "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "must be at least 1" in bad.stderr and "Traceback" not in bad.stderr
    from gpuprof.tools import live_tool

    if not live_tool("nsys"):  # a CPU machine: one sentence, exit 2, nothing captured
        proc = subprocess.run([sys.executable, script, "--runs", "1"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "cannot run here" in proc.stderr and "Traceback" not in proc.stderr


def test_graph_input_copies_of_the_reference():
    """The reference capture's reduce-overhead variant copies its inputs before each replay (2 multi-tensor Copy
    kernels per forward), no other variant does, and without those copies its GPU time is plain torch.compile's."""
    result = json.loads((REF / "layer.json").read_text())
    copies = tr.graph_input_copies(result, REF / "layer.sqlite")
    assert copies["copy_kernels_per_forward"].to_dict() == {"ops": 0, "compiled": 0, "reduce-overhead": 2, "fused": 0,
                                                            "graph": 0}
    ro = copies.loc["reduce-overhead"]
    assert 50 < ro["copy_us_per_forward"] < 150
    assert abs(ro["without_copies_us"] / copies.loc["compiled", "kernel_us_per_forward"] - 1) < 0.05
    assert (copies.drop(index="reduce-overhead")["copy_us_per_forward"] == 0).all()


def test_sweep_table_of_the_reference():
    data = json.loads((REF / "sweep.json").read_text())
    peak = json.loads((REF / "matmul_peak.json").read_text())["tflops"]
    table = tr.sweep_table(data, peak)
    assert len(table) == len(tr.SIZES) * 4 and set(table["size"]) == set(tr.SIZES)
    ok = table[table["status"] == "ok"]
    frac_fwd_bwd, frac_step = ok["matmul_rate_frac_fwd_bwd"], ok["matmul_rate_frac_step"]
    assert ((frac_fwd_bwd > 0) & (frac_fwd_bwd < 1)).all() and (frac_step < frac_fwd_bwd).all()


def test_library_kernels_launch_through_the_driver_api_without_backtraces():
    """The chapter's claim: cuBLAS's and cuDNN's kernels come from cuLaunchKernelEx, which got no backtrace."""
    path = REF / "backtraces.sqlite"
    k, r = ns.kernels(path), ns.runtime_calls(path)
    launched = k.merge(r[["correlationId", "name"]].rename(columns={"name": "api"}), on="correlationId")
    kinds = {kernel_kind(a, b) for a, b in zip(launched.loc[launched["api"] == "cuLaunchKernelEx", "name"],
                                               launched.loc[launched["api"] == "cuLaunchKernelEx", "demangled"])}
    assert kinds == {"matrix product", "attention"}
    cov = tr.backtrace_coverage(path).set_index("api")
    assert cov.loc["cuLaunchKernelEx", "with_backtrace"] == 0 < cov.loc["cuLaunchKernelEx", "calls"]


def test_datasheet_peak_by_name_and_sweep_columns_over_it():
    from gpuprof.studies import speed_of_light as sol

    assert sol.datasheet_bf16_tflops("NVIDIA H100 80GB HBM3") == sol.datasheet_bf16_tflops("NVIDIA H200") == 989.4
    assert sol.datasheet_bf16_tflops("NVIDIA H100 PCIe") is None and sol.datasheet_bf16_tflops(None) is None
    data = {"rows": [{"name": "x", "context_length": 8, "status": "ok", "parameters": 1e6, "forward_ms": {"mean": 1.0},
                      "backward_ms": {"mean": 2.0}, "step_ms": {"mean": 4.0, "std": 0.1}, "optimizer_ms": {"mean": 1.0},
                      "tokens_per_s": 1.0, "forward_backward_tflops": 500.0, "achieved_tflops": 400.0,
                      "peak_memory_bytes": 2**30}]}
    t = tr.sweep_table(data, 800.0, 1000.0).iloc[0]
    assert (t.matmul_rate_frac_fwd_bwd, t.matmul_rate_frac_step, t.datasheet_fwd_bwd, t.datasheet_step) == (0.625, 0.5, 0.5, 0.4)


def test_memory_by_category_counts_what_the_step_held():
    gib, n = 2**30, 2**28  # a billion-byte-ish model, round numbers in GiB
    result = {"peak_memory_bytes": 20 * gib, "memory": {
        "parameter_bytes": 4 * n, "optimizer_state_bytes": 8 * n, "step_start": 12 * n, "forward_end": 12 * n + 3 * gib,
        "backward_end": 16 * n, "optimizer_peak": 16 * n + 2 * gib}}
    m = tr.memory_by_category(result)
    assert m["parameters"] == m["gradients"] == 1.0 and m["optimizer state"] == 2.0
    assert m["saved by forward (activations, bf16 weight copies)"] == 3.0
    assert m["optimizer temporaries (peak)"] == 2.0 and m["peak"] == 20.0


def test_optimizer_table_takes_medians_and_ranges_over_rounds():
    def row(impl, opt):
        return {"optimizer": impl, "optimizer_ms": {"mean": opt}, "step_ms": {"mean": 100 + opt}, "forward_ms": {"mean": 30},
                "backward_ms": {"mean": 70}, "achieved_tflops": 1.0, "peak_memory_bytes": 2**30}
    t = tr.optimizer_table([row("foreach", 70), row("fused", 20), row("foreach", 80), row("fused", 22)])
    assert list(t.index) == ["foreach", "fused"]
    assert t.loc["foreach", "optimizer_ms"] == 75 and t.loc["fused", "optimizer_ms_max"] == 22 and t.loc["fused", "rounds"] == 2


def test_manual_attention_computes_what_sdpa_computes():
    torch = pytest.importorskip("torch")
    bench = load_script(tr.BENCHMARK)
    base = {"d_model": 64, "d_ff": 128, "num_layers": 2, "num_heads": 4, "context_length": 16, "vocab": 50}
    torch.manual_seed(0)
    fused = bench.build_model({**base, "attention": "sdpa"}, "cpu")
    torch.manual_seed(0)
    manual = bench.build_model({**base, "attention": "manual"}, "cpu")
    tokens = torch.randint(0, 50, (2, 16))
    with torch.no_grad():
        assert torch.allclose(fused(tokens), manual(tokens), atol=1e-5)


def test_softmax_bytes_count_each_score_read_and_written_once():
    cfg = {"batch_size": 4, "context_length": 512, "num_heads": 12, "num_layers": 12, "dtype": "fp32"}
    assert tr.softmax_bytes_per_step(cfg) == 4 * 12 * 512 * 512 * 12 * 4 * 2
    assert tr.softmax_bytes_per_step({**cfg, "dtype": "bf16"}) == tr.softmax_bytes_per_step(cfg) // 2


def test_attention_split_of_the_reference():
    result = json.loads((REF / "attention_manual.json").read_text())
    split = tr.attention_split(REF / "attention_manual.sqlite", result["config"])
    cfg = result["config"]
    assert list(split.index) == ["scores", "softmax", "values"]
    assert split.loc["scores", "gflop_per_step"] == pytest.approx(
        2 * cfg["batch_size"] * cfg["context_length"] ** 2 * cfg["d_model"] * cfg["num_layers"] / 1e9)
    # one product per layer in each product's range; the softmax launches no matrix product
    steps = result["config"]["num_steps"]
    assert split.loc["softmax", "matmul_ms_per_step"] == 0 and (split["kernels_per_step"] > 0).all()
    assert split.loc["values", "matmul_ms_per_step"] <= split.loc["values", "gpu_ms_per_step"]
    assert steps == 10


def test_matmul_share_and_warmup_table_of_the_references():
    share = tr.matmul_share(REF / "measured_fp32.sqlite", REF / "forward_fp32.sqlite")
    assert list(share.index) == ["training step", "forward only"]
    assert (share[["matrix product", "attention"]].sum(axis=1) <= 1).all()
    runs = json.loads((REF / "warmup.json").read_text())
    warm = tr.warmup_table(runs)
    assert list(warm.index) == list(tr.WARMUPS) and (warm["measured"] == 10).all()
    assert (warm["first_ms"] <= warm["max_ms"]).all()


@pytest.mark.slow
def test_run_benchmarks_forks_each_run_and_reports_a_failure(tmp_path):
    pytest.importorskip("torch")
    from gpuprof.errors import GpuprofError

    tiny = ["--size", "tiny", "--context-length", "16", "--warmup-steps", "1", "--num-steps", "2", "--cpu"]
    runs = tr.run_benchmarks([[*tiny, "--attention", "manual"], [*tiny, "--forward-only"]])
    assert [r["config"]["attention"] for r in runs] == ["manual", "sdpa"] and runs[1]["config"]["forward_only"]
    with pytest.raises(GpuprofError, match="failed"):
        tr.run_benchmarks([["--d-model", "100", "--num-heads", "12", "--cpu"]])


def _sweep_row(size: str, context: int, *, weights: int, per_token: float, layers: int = 2, width: int = 8,
               status: str = "ok") -> dict:
    """A sweep row whose forward leaves 2 bytes per weight plus ``per_token`` bytes per token (batch 4)."""
    start = 16 * weights
    saved = 2 * weights + per_token * 4 * context
    return {"name": size, "context_length": context, "status": status, "peak_memory_bytes": start + saved + 100,
            "config": {"batch_size": 4, "num_layers": layers, "d_model": width},
            "memory": {"parameter_bytes": 4 * weights, "optimizer_state_bytes": 8 * weights, "step_start": start,
                       "forward_end": start + saved, "forward_peak": start + saved + 10, "backward_end": start + 4 * weights,
                       "backward_peak": start + saved + 20, "optimizer_peak": start + 8 * weights,
                       "optimizer_end": start}}


def test_activation_fit_recovers_a_known_line_and_leaves_out_short_sizes():
    data = {"rows": [_sweep_row("a", c, weights=1000, per_token=320.0) for c in (128, 256, 512)]
            + [_sweep_row("b", 128, weights=10, per_token=1.0), _sweep_row("b", 256, weights=10, per_token=1.0),
               _sweep_row("b", 512, weights=10, per_token=1.0, status="out of memory")]}
    fit = tr.activation_fit(data)
    assert list(fit.index) == ["a"]  # b has two contexts that ran
    assert fit.loc["a", "intercept / bf16 copies"] == pytest.approx(1.0)
    assert fit.loc["a", "bytes per token-layer-width"] == pytest.approx(320.0 / (2 * 8))
    assert fit.loc["a", "worst residual"] < 1e-9
    mem = tr.memory_by_context(data, "a")
    assert list(mem.index) == [128, 256, 512] and list(mem["tokens"]) == [512, 1024, 2048]
    assert (mem["forward peak"].diff().dropna() > 0).all()


def test_the_stored_sweep_s_activations_are_linear_in_tokens():
    """The chapter's reading of its own sweep: the intercept is autocast's bf16 weight copies, and the
    activations per token, layer and unit of width are the same at every size from medium up."""
    sweep = json.loads((REPO_ROOT / "artifacts" / "ch07" / "sweep.json").read_text())
    fit = tr.activation_fit(sweep).drop(index="small")
    assert fit["intercept / bf16 copies"].between(0.95, 1.05).all()
    assert fit["bytes per token-layer-width"].between(30, 45).all() and (fit["worst residual"] < 0.02).all()


def test_the_weights_as_parameters_leave_only_the_inputs_copy():
    """The static-weights capture: one copy left per forward, of the 1.57 MB input (4 x 128 x 768 FP32), in a few
    thread blocks (one per 65,536-element chunk: 393,216 elements give 6), against the plain tensors' hundreds."""
    result = json.loads((REF / "layer_static.json").read_text())
    copies = tr.graph_input_copies(result, REF / "layer_static.sqlite", blocks=True)
    static, plain = copies.loc["reduce-overhead-static"], copies.loc["reduce-overhead"]
    assert static["copy_kernels_per_forward"] == 1 and plain["copy_kernels_per_forward"] == 2
    cfg = result["config"]
    assert static["copy_blocks_per_forward"] == -(-cfg["batch_size"] * cfg["seq_len"] * cfg["d_model"] // 65_536) == 6
    assert plain["copy_blocks_per_forward"] > 50 * static["copy_blocks_per_forward"]
    assert "copy_blocks_per_forward" not in tr.graph_input_copies(result, REF / "layer_static.sqlite")
    assert result["results"]["reduce-overhead-static"]["non_static_inputs"] == 1


def test_graph_input_copy_kernels_by_grid_on_the_static_capture():
    """c7static3's table: the plain tensors' two copies (320 and 158 blocks) and the input's one (6 blocks), one each
    per forward, the same kernels graph_input_copies counts; the small grid is the shortest copy, not in proportion."""
    result = json.loads((REF / "layer_static.json").read_text())
    by_grid = tr.graph_input_copy_kernels(result, REF / "layer_static.sqlite")
    assert list(by_grid.index) == [("reduce-overhead", 158), ("reduce-overhead", 320), ("reduce-overhead-static", 6)]
    totals = tr.graph_input_copies(result, REF / "layer_static.sqlite")["copy_kernels_per_forward"]
    assert by_grid["per_forward"].groupby(level="variant").sum().to_dict() == totals[totals > 0].to_dict()
    median = by_grid["median_us"]
    assert median[("reduce-overhead-static", 6)] < median[("reduce-overhead", 158)] < median[("reduce-overhead", 320)]
    assert median[("reduce-overhead", 320)] / median[("reduce-overhead-static", 6)] < 320 / 6 / 10


def test_checkpoint_table_on_the_h100_records():
    """The 2.7B at context 1024 with and without per-block checkpointing (artifacts/ch07/checkpoint_*.json, an H100):
    the table's figures are the records' own, the recomputation is the checkpointed run's extra FLOPs (one more forward
    of every block: 1.33x the model's FLOPs), forward keeps less and its peak falls, and the step's peak, set by
    AdamW's temporaries in both, stays within 0.1% (what max_memory_allocated alone would show)."""
    plain = json.loads((REF / "checkpoint_plain.json").read_text())
    each = json.loads((REF / "checkpoint_each_block.json").read_text())
    t = tr.checkpoint_table(plain, each)
    p, c = t.loc["plain"], t.loc["each block checkpointed"]
    assert p["step_ms"] == np.median(plain["step_ms_each"]) and p["step_min_ms"] == plain["step_ms"]["min"]
    assert c["backward_ms"] == np.median([s[1] for s in each["phase_ms_each"]])
    assert c["model_tflops"] == each["flops_per_step"] / (c["step_ms"] / 1e3) / 1e12
    assert p["hardware_over_model_flops"] == 1.0
    assert c["hardware_over_model_flops"] == each["hardware_flops_per_step"] / each["flops_per_step"]
    assert 1.3 < c["hardware_over_model_flops"] < 1.34
    assert c["saved_by_forward_GiB"] < p["saved_by_forward_GiB"] / 5 and c["forward_peak_GiB"] < p["forward_peak_GiB"]
    for run in (p, c):  # the run's peak was set before the last step, within 0.1% of that step's optimizer peak
        assert run["run_peak_GiB"] == max(run[k] for k in ("earlier_peak_GiB", "forward_peak_GiB", "backward_peak_GiB",
                                                           "optimizer_peak_GiB"))
        assert abs(run["run_peak_GiB"] / run["optimizer_peak_GiB"] - 1) < 1e-3
        assert run["earlier_peak_GiB"] >= run["optimizer_peak_GiB"]  # set before the last step, as the cell says
        assert run["optimizer_peak_GiB"] > max(run["forward_peak_GiB"], run["backward_peak_GiB"])
    assert abs(c["run_peak_GiB"] / p["run_peak_GiB"] - 1) < 1e-3
    assert c["backward_ms"] > p["backward_ms"]


def test_checkpoint_table_refuses_runs_that_cannot_be_compared():
    plain = json.loads((REF / "checkpoint_plain.json").read_text())
    each = json.loads((REF / "checkpoint_each_block.json").read_text())
    with pytest.raises(tr.GpuprofError, match="plain run first"):
        tr.checkpoint_table(each, plain)
    other = {**each, "config": {**each["config"], "context_length": 512}}
    with pytest.raises(tr.GpuprofError, match="differ in context_length"):
        tr.checkpoint_table(plain, other)


def test_the_graph_variant_keeps_its_input_alive(monkeypatch):
    """A CUDA graph replays the addresses its capture read and holds no reference to those tensors, so the graph
    variant's forward must keep its static input alive (chapter 12's decode script lost one this way, and its replays
    read freed memory). On the CPU, with stand-ins for the CUDA stream and graph calls (they record nothing), the
    input the capture read must survive make_forward's return and a collection."""
    import contextlib
    import gc
    import weakref

    layer = load_script(tr.LAYER)
    args = layer.parse_args(LAYER_TINY)
    weights = layer.make_weights(args, "cpu")
    x = torch.randn(args.batch_size, args.seq_len, args.d_model)

    class Stand:
        def __init__(self, *a, **k):
            pass

        def wait_stream(self, other):
            pass

        def replay(self):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", Stand)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Stand)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: Stand())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
    read = []
    real_stack = layer.stack
    monkeypatch.setattr(layer, "stack", lambda fn, w, inp, heads: read.append(weakref.ref(inp)) or real_stack(fn, w, inp, heads))
    with torch.inference_mode():
        forward = layer.make_forward("graph", weights, x, args.heads)
    gc.collect()
    assert read and all(r() is not None for r in read), "the graph's input was freed after make_forward returned"
    assert forward() is not None
