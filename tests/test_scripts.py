"""Every script runs on a CPU-only machine, has --help, and answers bad input in one sentence.

Each script runs as a program (a subprocess) at least once here: its run to completion and its first bad input
(for the five in scripts/, the first case of their own tests). Its other bad inputs and its --help are checked in this
process, through its ``main(argv)`` (``helpers.run_script_in_process``: the same exit status, stdout and stderr, and a
check that the script left this process as it found it), which saves a Python start-up and ``import torch`` each.
"""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpuprof.artifacts import REPO_ROOT
from helpers import gpu_events, run_script, run_script_in_process, write

EXAMPLES = sorted((REPO_ROOT / "examples").rglob("*.py"))
SCRIPTS = EXAMPLES + [REPO_ROOT / "scripts" / "capture_all.py", REPO_ROOT / "scripts" / "bench_trace_analysis.py",
                      REPO_ROOT / "scripts" / "bench_torch_trace.py", REPO_ROOT / "scripts" / "gpu_nbval.py",
                      REPO_ROOT / "scripts" / "reexecute_cells.py", REPO_ROOT / "scripts" / "bench_ranks.py",
                      REPO_ROOT / "scripts" / "tree_memory.py", REPO_ROOT / "scripts" / "trim_ch13.py",
                      REPO_ROOT / "scripts" / "check_ch13.py", REPO_ROOT / "scripts" / "capture_ch12.py",
                      REPO_ROOT / "scripts" / "spread_ch07_split.py", REPO_ROOT / "scripts" / "saved_tensor_census.py"]
SMALL_ARGS = {"tiny_kernels.py": ["--steps", "2", "--kernels", "10"], "saxpy.py": ["--n", "10000", "--repeats", "2"],
              "data_transfer.py": ["--size-mib", "2", "--curve-max-mib", "1", "--repeats", "2"],
              "memory_allocation.py": ["--size-mib", "2", "--iterations", "5"],
              "nvtx_features.py": ["--steps", "2", "--cost-calls", "1000"],
              "weight_streaming.py": ["--mode", "all"], "llm_decode.py": ["--json", "{tmp}/llm.json"],
              "kv_capacity.py": ["--context", "64,256", "--memory-limit-gb", "0.02", "--json", "{tmp}/kv.json"],
              "transpose.py": ["--n", "256"], "occupancy.py": ["--mib", "2"], "divergence.py": ["--iters", "64"],
              "matmul.py": ["--n", "128"], "matmul_ladder.py": ["--json", "{tmp}/ladder.json"],
              "matmul_ladder_sweep.py": ["--shapes", "2048^3", "--processes", "1", "--json", "{tmp}/sweep.json"], "spills.py": ["--threads", "1024", "--iters", "8"], "replay_modes.py": [], "torch_conv.py": ["--steps", "2", "--batch", "8"],
              "train_profiled.py": ["--batch", "8", "--repeat", "2", "--active", "2", "--trace", "{tmp}/t.json.gz"],
              "profiler_overhead.py": ["--steps", "3", "--batch", "8", "--json", "{tmp}/overhead.json"],
              "compiled_and_graphed.py": ["--layers", "1", "--hidden", "64", "--batch", "64", "--warmup", "2", "--steps", "2", "--trace", "{tmp}/c.json.gz",
                                          "--json", "{tmp}/compiled.json"],
              "reconcile.py": ["--mode", "profiler", "--steps", "2", "--warmup", "1", "--batch", "8",
                               "--trace", "{tmp}/r.json.gz", "--json", "{tmp}/r.json"],
              "memory_snapshot.py": ["--batch", "8", "--log", "{tmp}/m.json.gz"],
              "cnn_precision.py": ["--batch-size", "8", "--steps", "1", "--rounds", "1", "--arithmetic", "fp32,bf16",
                                   "--layouts", "nchw", "--json", "{tmp}/p.json"],
              "cnn_training.py": ["--warmup", "4", "--steps", "8", "--repeats", "2", "--dataset-size", "512",
                                  "--batch-size", "16", "--json", "{tmp}/cnn.json"],
              "transformer_benchmark.py": ["--size", "tiny", "--context-length", "16", "--warmup-steps", "1",
                                           "--num-steps", "2", "--json", "{tmp}/t.json"],
              "launch_bound_layer.py": ["--variants", "ops,fused", "--layers", "1", "--d-model", "64", "--heads", "4",
                                        "--d-ff", "128", "--seq-len", "16", "--iterations", "3", "--repeats", "1",
                                        "--json", "{tmp}/l.json"],
              "ddp_training.py": ["--cpu", "--width", "32", "--depth", "2", "--batch-size", "4", "--warmup", "1",
                                  "--steps", "2", "--json", "{tmp}/d.json"],
              "ddp_knobs.py": ["--cpu", "--width", "32", "--depth", "2", "--batch-size", "4", "--warmup", "1",
                               "--steps", "2", "--rounds", "1", "--variants", "fp32,fp32+nosync,bf16",
                               "--json", "{tmp}/k.json"],
              "ddp_buckets.py": ["--width", "512", "--depth", "4", "--bucket-mb", "default,25,1", "--json", "{tmp}/b.json"],
              "fsdp_training.py": ["--warmup", "1", "--steps", "2", "--json", "{tmp}/f.json"],
              "allreduce_bandwidth.py": ["--cpu", "--sizes", "4K", "--iterations", "2", "--json", "{tmp}/a.json"],
              "fp8_matmul.py": ["--m", "64", "--k", "64", "--n", "32", "--repeats", "2", "--json", "{tmp}/f.json"],
              "mixed_precision.py": ["--mode", "fp16", "--layers", "1", "--d-model", "64", "--heads", "4", "--d-ff", "128",
                                     "--batch-size", "2", "--seq-len", "16", "--warmup", "1", "--steps", "2",
                                     "--json", "{tmp}/mp.json"]}


run = run_script


def run_here(script, *args, capsys):
    """The script's main(args) in this process (see the module's docstring)."""
    return run_script_in_process(script, *args, capsys=capsys)


def test_there_are_examples_in_both_folders():
    folders = {p.parent.name for p in EXAMPLES}
    assert {"nsys", "nsight_compute"} <= folders


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_help(script, capsys):
    proc = run_here(script, "--help", capsys=capsys)
    assert proc.returncode == 0 and "usage:" in proc.stdout and len(proc.stdout.splitlines()) > 3


# Runs that took over 5 s on a busy 2-core machine: started first. Every run is marked slow (they still run by
# default): the first test to ask waits for the runs the fixture started ahead of its own.
SLOW_RUNS = {"profiler_overhead.py", "compiled_and_graphed.py", "reconcile.py", "train_profiled.py",
             "transformer_benchmark.py", "launch_bound_layer.py", "cnn_training.py", "mixed_precision.py"}
RUN_NAME = "test_runs_to_completion_on_the_cpu_and_checks_its_result"


@pytest.fixture(scope="module")
def completed_runs(request, tmp_path_factory):
    """The selected examples' runs to completion, each a program of its own, two at a time (most of a run is Python
    and PyTorch starting up, which leaves the second core idle): all are started at the first test that needs one, the
    slow ones first, and each test waits for its own. Each run writes into a folder of its own."""
    wanted = [item.callspec.params["script"] for item in request.session.items
              if getattr(item, "originalname", None) == RUN_NAME]
    wanted.sort(key=lambda p: p.name not in SLOW_RUNS)  # the longest first: the two workers finish together
    pool = ThreadPoolExecutor(max_workers=2)
    runs = {}
    for script in wanted:
        tmp = tmp_path_factory.mktemp(script.stem)
        runs[script.name] = pool.submit(run, script, *(a.replace("{tmp}", str(tmp)) for a in SMALL_ARGS[script.name]),
                                        timeout=300)
    yield runs
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.slow
@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_runs_to_completion_on_the_cpu_and_checks_its_result(script, completed_runs):
    proc = completed_runs[script.name].result()
    assert proc.returncode == STATUS_ON_CPU.get(script.name, 0), proc.stderr
    assert NO_RESULT_ON_CPU.get(script.name, "result checked") in proc.stdout


# Scripts with nothing to compute without a GPU say so instead (the chapter reads reference results).
NO_RESULT_ON_CPU = {"replay_modes.py": "no GPU here, so there is nothing to launch",
                    "matmul_ladder.py": "no CUDA GPU here (or --cpu): the rungs are CUDA kernels",
                    "matmul_ladder_sweep.py": "matmul_ladder_sweep: nothing ran: matmul_ladder: no CUDA GPU here"}
# and a script that ran nothing says so in its exit status where its --help promises one
STATUS_ON_CPU = {"matmul_ladder.py": 3, "matmul_ladder_sweep.py": 3}


BAD_INPUT = {
    "tiny_kernels.py": [(["--steps", "0"], "must be at least 1"), (["--kernels", "many"], "is not a whole number"),
                        (["--backend", "cupy"], "CuPy with a usable CUDA GPU was asked for, but not found")],
    "saxpy.py": [(["--n", "-5"], "must be at least 1"), (["--block", "4096"], "at most 1024"),
                 (["--backend", "torch"], "PyTorch with a usable CUDA GPU was asked for, but not found")],
    "data_transfer.py": [(["--size-mib", "0"], "must be at least 1"), (["--sections", "warp"], "unknown section(s) warp"),
                         (["--sections", "curve", "--profiler-range", "overlap"], "is not one of the sections"),
                         (["--backend", "torch"], "PyTorch with a usable CUDA GPU was asked for, but not found")],
    "memory_allocation.py": [(["--iterations", "-1"], "must be at least 1"), (["--sections", "leak"], "unknown section"),
                             (["--size-mib", "x"], "is not a whole number"),
                             (["--allocator", "jemalloc"], "invalid choice: 'jemalloc'")],
    "nvtx_features.py": [(["--sections", "colours"], "unknown section"), (["--steps", "0"], "must be at least 1"),
                         (["--backend", "torch"], "PyTorch with a usable CUDA GPU was asked for, but not found")],
    "weight_streaming.py": [(["--prefetch-distance", "-1"], "must not be negative"),
                            (["--prefetch-distance", "3", "--max-cached-layers", "2"], "Use max_cached_layers >= 4"),
                            (["--heads", "5"], "is not divisible by heads=5"),
                            (["--config", "/no/such.json"], "Cannot read --config"),
                            (["--compare", "2:2"], "Use max_cached_layers >= 3"),
                            (["--compare", "two"], "is not D:C"),
                            (["--competing-h2d-mib", "-4"], "must not be negative"),
                            (["--backend", "torch"], "PyTorch with a usable CUDA GPU was asked for, but not found")],
    "llm_decode.py": [(["--new-tokens", "0"], "must be at least 1"),
                      (["--model", "8b", "--cpu"], "--model 8b needs a GPU: in bfloat16 its weights (15.0 GiB)"),
                      (["--cache", "paged"], "invalid choice"), (["--batch", "x"], "is not a whole number"),
                      (["--json", "/no/such/dir/l.json"], "does not exist"),
                      (["--rung", "graph", "--cpu"], "--rung graph needs a GPU: a torch.cuda.CUDAGraph records CUDA kernels"),
                      (["--rung", "paged"], "unknown rung(s) paged; the rungs are eager_dynamic, eager_static"),
                      (["--batch", "1,0"], "must be at least 1"), (["--batch", "8,8"], "names a batch size twice"),
                      (["--rung", "eager_static", "--cache", "static"], "give --rung or --cache, not both")],
    "kv_capacity.py": [(["--model", "8b", "--cpu"], "--model 8b needs a GPU: in bfloat16 its weights take 15.0 GiB"),
                       (["--cpu"], "On the CPU the search needs --memory-limit-gb"),
                       (["--context", "200000"], "above this script's limit of 131,072 (llm_decode.py builds its rotary"),
                       (["--context", "64,64"], "names a context length twice"), (["--memory-limit-gb", "-1"], "must be"),
                       (["--context", "100000", "--memory-limit-gb", "0.05"], "Not even batch 1 fits at context 100,000"),
                       (["--json", "/no/such/dir/k.json"], "does not exist")],
    "transpose.py": [(["--n", "100"], "must be a multiple of 64"), (["--kernels", "transpose_fast"], "unknown kernel(s) transpose_fast"),
                     (["--json", "/no/such/dir/t.json"], "the folder /no/such/dir does not exist")],
    "occupancy.py": [(["--blocks", "48"], "multiple of 32"), (["--blocks", "x"], "whole numbers separated by commas"),
                     (["--mib", "0"], "must be at least 1")],
    "divergence.py": [(["--block", "96"], "multiple of 64"), (["--threads", "1000"], "must be a multiple of --block"),
                      (["--iters", "0"], "must be at least 1")],
    "matmul.py": [(["--n", "100"], "must be a multiple of 64"), (["--kernels", "cublas_fp8"], "unknown kernel(s) cublas_fp8")],
    "matmul_ladder.py": [(["--rung", "11"], "no rung 11; the rungs are [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"),
                         (["--group-m", "0"], "must be at least 1"),
                         (["--rung", "x"], "--rung takes 'all' or numbers"), (["--size", "4096,0"], "expected three positive sizes"),
                         (["--size", "big"], "expected M,N,K or one number"),
                         (["--size", "1000000000000"], "must be under 2,147,483,648 (the kernels take them as 32-bit ints)"),
                         (["--min-time-s", "-1"], "--min-time-s takes 0 to 60 seconds"),
                         (["--arrive-scope", "gpu"], "invalid choice: 'gpu'")],
    "matmul_ladder_sweep.py": [(["--shapes", "9999^3", "--plan"], "no shape '9999^3'; the shapes are 2048^3"),
                               (["--min-time-s", "nan", "--plan"], "--min-time-s takes 0 to 60 seconds"),
                               (["--processes", "0", "--plan"], "must be at least 1"),
                               (["--shapes", "2048^3"], "say where the results go with --json FILE"),
                               (["--json", "/no/such/dir/s.json"], "does not exist")],
    "compiled_and_graphed.py": [(["--modes", "jit"], "no mode jit; the modes are eager, compiled, graphed"),
                                (["--steps", "0"], "must be at least 1"),
                                (["--trace", "t.json"], "give a name ending in .json.gz")],
    "spills.py": [(["--threads", "100"], "must be a multiple of 256"), (["--iters", "0"], "must be at least 1"),
                  (["--json", "/no/such/dir/s.json"], "does not exist")],
    "replay_modes.py": [(["--spin-us", "0"], "must be"), (["--demo", "overlap"], "invalid choice"),
                        (["--run-log", "/no/such/dir/r.log"], "does not exist")],
    "torch_conv.py": [(["--steps", "1"], "must be at least 2"), (["--batch", "-3"], "must be at least 1")],
    "train_profiled.py": [(["--active", "0"], "must be at least 1"), (["--wait", "-1"], "must not be negative"),
                          (["--trace", "/no/such/dir/t.json"], "does not exist")],
    "profiler_overhead.py": [(["--rounds", "0"], "must be at least 1"), (["--json", "/no/such/dir/o.json"], "does not exist"),
                             (["--also", "with_stack+stacks"], "'stacks' is not an option; the options are record_shapes")],
    "reconcile.py": [(["--mode", "ncu"], "invalid choice"), (["--steps", "0"], "must be at least 1")],
    "memory_snapshot.py": [(["--batch", "0"], "must be at least 1"), (["--log", "/no/such/dir/m.json.gz"], "does not exist")],
    "cnn_precision.py": [(["--layouts", "nhwx"], "no layout nhwx; the choices are nchw, nhwc"),
                         (["--arithmetic", "fp8"], "no arithmetic fp8"), (["--rounds", "0"], "must be at least 1"),
                         (["--json", "/no/such/dir/p.json"], "does not exist")],
    "cnn_training.py": [(["--loss-every", "0"], "must be at least 1"), (["--json", "/no/such/dir/c.json"], "does not exist"),
                        (["--min-window-s", "-1"], "must not be negative")],
    "transformer_benchmark.py": [(["--num-steps", "0"], "must be at least 1"), (["--json", "/no/such/dir/t.json"], "does not exist"),
                                 (["--dtype", "fp8"], "invalid choice")],
    "launch_bound_layer.py": [(["--layers", "0"], "must be at least 1"), (["--json", "/no/such/dir/l.json"], "does not exist"),
                              (["--d-model", "100", "--heads", "12"], "not divisible")],
    "ddp_training.py": [(["--comm-hook", "powersgd"], "invalid choice"), (["--steps", "0"], "must be at least 1"), (["--json", "/no/such/dir/d.json"], "does not exist"),
                        (["--bucket-mb", "0"], "must be positive"), (["--default-buckets", "--bucket-mb", "100"], "give no other --bucket-mb")],
    "ddp_knobs.py": [(["--variants", "fp64"], "starts with its precision"), (["--variants", "bf16+warp"], "unknown knob"),
                     (["--variants", "fp32,fp32"], "named twice"), (["--variants", "fp32+bf16-hook+fp16-hook"], "two hooks"),
                     (["--rounds", "0"], "must be at least 1"), (["--json", "/no/such/dir/k.json"], "does not exist"),
                     (["--variants", "fp32,fp32+default-buckets", "--bucket-mb", "100"], "give --bucket-mb 25, not 100"),
                     (["--cpu", "--variants", "fp32+bf16-hook", "--width", "32", "--depth", "2"], "need NCCL on CUDA GPUs")],
    "ddp_buckets.py": [(["--bucket-mb", "0"], "must be greater than 0"), (["--bucket-mb", "big"], "a number of MiB or 'default'"),
                       (["--bucket-mb", "default,default"], "named twice"), (["--json", "/no/such/dir/b.json"], "does not exist")],
    "fsdp_training.py": [(["--mode", "zero3"], "no mode zero3; the modes are ddp, fsdp_reshard, fsdp_keep"),
                         (["--unit", "block:0"], "expected layer or block:N"),
                         (["--prefetch", "0"], "expected default, off or a number of units"),
                         (["--heads", "5"], "--d-model 64 is not divisible by --heads 5"),
                         (["--size", "ddp-too-big", "--layers", "4"], "give one or the other"),
                         (["--size", "ddp-too-big"], "is sized from a GPU's memory, and this run has no GPU"),
                         (["--json", "/no/such/dir/f.json"], "does not exist")],
    "allreduce_bandwidth.py": [(["--sizes", "1T"], "expected sizes"), (["--iterations", "0"], "must be at least 1"),
                               (["--json", "/no/such/dir/a.json"], "does not exist")],
    "mixed_precision.py": [(["--steps", "0"], "must be at least 1"), (["--json", "/no/such/dir/m.json"], "does not exist"),
                           (["--mode", "fp8"], "invalid choice")],
    "fp8_matmul.py": [(["--m", "100"], "is not a multiple of 16"), (["--repeats", "0"], "must be at least 1"),
                      (["--json", "/no/such/dir/f.json"], "does not exist")],
}
# Sizes no machine the course runs on can hold (each well above an H200's 141 GB and the GPU hosts' 128 GB): one
# sentence saying what the run needs and what there is, before anything is allocated.
TOO_BIG = "GiB is available"
TOO_BIG_INPUT = {
    "occupancy.py": [["--mib", "100000"]], "saxpy.py": [["--n", "100000000000"]], "transpose.py": [["--n", "1000000"]],
    "torch_conv.py": [["--batch", "100000"]], "memory_allocation.py": [["--size-mib", "100000"]],
    "cnn_training.py": [["--batch-size", "1000000"], ["--dataset-size", "100000000"]],
    "cnn_precision.py": [["--batch-size", "1000000"]],
    "ddp_training.py": [["--width", "100000"], ["--batch-size", "100000000"]],
    "ddp_knobs.py": [["--width", "100000"]], "fsdp_training.py": [["--d-model", "100000", "--heads", "1"], ["--batch-size", "100000000"]],
    "ddp_buckets.py": [["--width", "200000"]],
    "launch_bound_layer.py": [["--batch-size", "100000"], ["--d-model", "100000", "--heads", "1"]],
    "weight_streaming.py": [["--d-model", "100000"]], "llm_decode.py": [["--model", "tiny", "--batch", "4000", "--prompt-len", "100000"]],
    "allreduce_bandwidth.py": [["--sizes", "1000G"]],
    "train_profiled.py": [["--batch", "100000"]], "reconcile.py": [["--batch", "100000"]],
    "profiler_overhead.py": [["--batch", "100000"]], "spills.py": [["--n", "100000000000"]],
    "mixed_precision.py": [["--batch-size", "100000000"], ["--d-model", "1000000", "--heads", "1"]],
    "fp8_matmul.py": [["--m", "1600000000"]],
}
# Counts that would run for days are refused with the limit stated.
TOO_MANY = {
    "memory_allocation.py": [(["--iterations", "100000000"], "above this script's limit of 100,000")],
    "nvtx_features.py": [(["--cost-calls", "100000000000"], "above this script's limit of 10,000,000")],
    "tiny_kernels.py": [(["--kernels", "100000000000"], "above this script's limit of 1,000,000")],
    "weight_streaming.py": [(["--layers", "100000"], "above this script's limit of 1,024")],
    "llm_decode.py": [(["--new-tokens", "1000000"], "above this script's limit of 100,000"),
                      (["--batch", "1,5000"], "above this script's limit of 4,096")],
    "spills.py": [(["--iters", "1000000000"], "above this script's limit of 100,000")],
    "replay_modes.py": [(["--spin-us", "1000000000"], "above this script's limit of 1,000,000")],
}
for name, cases in TOO_BIG_INPUT.items():
    BAD_INPUT[name] += [(args, TOO_BIG) for args in cases]
for name, cases in TOO_MANY.items():
    BAD_INPUT[name] += cases
BAD_INPUT["launch_bound_layer.py"].append((["--variants", "graph", "--cpu"], "needs a GPU (CUDA graphs)"))
BAD_INPUT["launch_bound_layer.py"].append((["--variants", "compiled,reduce-overhead", "--warmup", "1"], "at least 2"))
BAD_CASES = [(script, args, message) for script in EXAMPLES for args, message in BAD_INPUT[script.name]]
# Each script's first bad input runs as a program: exit_on_error's status 2 seen from outside, from a fresh process.
AS_A_PROGRAM = {(name, tuple(cases[0][0])) for name, cases in BAD_INPUT.items()}


@pytest.mark.parametrize("script,args,message", BAD_CASES, ids=lambda v: v.name if hasattr(v, "name") else None)
def test_bad_input_gets_one_sentence_not_a_traceback(script, args, message, capsys):
    if (script.name, tuple(args)) in AS_A_PROGRAM:
        proc = run(script, *args)
    else:
        proc = run_here(script, *args, capsys=capsys)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args,message,as_a_program", [
    (["/no/such.ipynb", "--cells", "x"], "is not a notebook file", True),
    (["notebooks/00__setting_up.ipynb", "--cells", "nosuchcell"], "no cell with id nosuchcell", False),
], ids=["args0-is not a notebook file", "args1-no cell with id nosuchcell"])
def test_reexecute_cells_refuses_bad_input_in_one_sentence(args, message, as_a_program, capsys):
    script = REPO_ROOT / "scripts" / "reexecute_cells.py"
    proc = run(script, *args) if as_a_program else run_here(script, *args, capsys=capsys)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_strict_nbval_refuses_without_a_gpu():
    proc = run(REPO_ROOT / "scripts" / "gpu_nbval.py", "--part", "1")
    assert proc.returncode == 2
    assert "there is no GPU here" in proc.stderr and "lax mode" in proc.stderr and "Traceback" not in proc.stderr


def test_strict_nbval_parts_cover_every_notebook_once():
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    from gpu_nbval import PARTS

    named = [n for part in PARTS.values() for n in part]
    assert sorted(named) == sorted(p.name for p in (REPO_ROOT / "notebooks").glob("*.ipynb"))


def test_chapter_12s_capture_refuses_without_a_gpu_and_its_runs_parse(capsys):
    """scripts/capture_ch12.py: one sentence on a CPU, a bad step named; every command it will run is one that
    llm_decode.py's parser accepts (a typo would otherwise surface only on the GPU machine)."""
    script = REPO_ROOT / "scripts" / "capture_ch12.py"
    proc = run(script)
    assert proc.returncode == 2 and "needs a GPU" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_here(script, "--only", "ladder,nope", capsys=capsys)
    assert proc.returncode == 2 and "unknown step(s) nope" in proc.stderr
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import capture_ch12

    from gpuprof.runner import load_script

    decode = load_script(REPO_ROOT / "examples" / "nsys" / "llm_decode.py")
    for args, expected in [*capture_ch12.RUNS.values(), (capture_ch12.NSYS_ARGS, 0), (capture_ch12.OWN_NSYS_ARGS, 0)]:
        parsed = decode.parse_args([*args, "--json", "/tmp/x.json"])
        assert parsed.model == "8b" and parsed.no_clone == (expected == 2)
    assert decode.parse_args(capture_ch12.NSYS_ARGS).batch == [1]  # nsys records the first batch only
    assert "fused_graph" in decode.parse_args(capture_ch12.NSYS_ARGS).rung
    own = decode.parse_args(capture_ch12.OWN_NSYS_ARGS)
    assert own.batch == [1] and own.rung == ["fused_graph", "triton_graph"]
    assert decode.parse_args(capture_ch12.RUNS["own_kernels.json"][0]).rung == [
        "eager_static", "compile_graph", "fused_graph", "triton_graph"]  # the reference and the rungs it is measured against
    ladder = decode.parse_args(capture_ch12.RUNS["ladder.json"][0])
    assert ladder.rung is None and "int8_graph" in decode.resolve_rungs(ladder, gpu=True)  # every rung, int8 included


def test_chapter_12s_ncu_step_names_one_timed_step_and_refuses_without_ncu_or_counters(monkeypatch):
    """The ncu step's runs parse, its NVTX filter names the ranges llm_decode.py opens (the timed generation's, then
    the step's) and the step that exists; without ncu, or with the counters kept to administrators, one sentence."""
    import gpuprof.tools
    from gpuprof.errors import GpuprofError
    from gpuprof.runner import load_script
    from gpuprof.studies.llm_inference import RUNG_RANGE, STEP_RANGE

    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import capture_ch12

    decode = load_script(REPO_ROOT / "examples" / "nsys" / "llm_decode.py")
    assert capture_ch12.NCU_RUNGS == ("compile_graph", "fused_graph", "int8_graph")
    assert set(capture_ch12.MATRIX_BYTES) <= set(decode.INT8) and capture_ch12.MATRIX_BYTES["int8_graph"] == 1
    assert capture_ch12.NCU_CHOICES == (*capture_ch12.NCU_RUNGS, "triton_graph")
    for rung in capture_ch12.NCU_CHOICES:
        options, args = capture_ch12.ncu_args(rung)
        parsed = decode.parse_args(args)
        assert parsed.rung == [rung] and parsed.batch == [1] and parsed.new_tokens > capture_ch12.NCU_STEP
        outer, inner = capture_ch12.ncu_range(rung).split("/")
        assert RUNG_RANGE.match(outer)["rung"] == rung and RUNG_RANGE.match(outer)["batch"] == "1"
        assert int(STEP_RANGE.match(inner)["step"]) == capture_ch12.NCU_STEP
        assert options[options.index("--nvtx-include") + 1] == f"{outer}/{inner}/"
        assert options[options.index("--graph-profiling") + 1] == "node" and "-c" in options
        # the fallback filter names the step alone, the range the reader's step_range still picks out
        fallback = capture_ch12.ncu_filters(rung)[-1]
        assert fallback == f"{inner}/" and capture_ch12.ncu_args(rung, fallback)[0].count(fallback) == 1
    with pytest.raises(GpuprofError, match=r"^the ncu step needs Nsight Compute \(ncu\): "):
        capture_ch12.ncu_capture_step()
    monkeypatch.setattr(gpuprof.tools, "require_tool", lambda name, doing="": (None, "2025.3"))
    monkeypatch.setattr(gpuprof.tools, "profiling_restricted", lambda: True)
    with pytest.raises(GpuprofError, match="cannot read GPU performance counters here: the driver keeps them to "
                                           "administrators"):
        capture_ch12.ncu_capture_step()
    # the steps parse --ncu-rungs; clocks are left as the ladder ran them
    assert capture_ch12.parse_args(["--only", "ncu", "--ncu-rungs", "int8_graph"]).ncu_rungs == ["int8_graph"]
    assert capture_ch12.parse_args(["--only", "ncu", "--ncu-rungs", "triton_graph"]).ncu_rungs == ["triton_graph"]
    with pytest.raises(SystemExit):
        capture_ch12.parse_args(["--ncu-rungs", "graph"])
    options = capture_ch12.ncu_args("fused_graph")[0]
    assert options[options.index("--clock-control") + 1] == "none"
    # a filter that captures nothing (no reference to fall back on: ncu_capture raises) moves on to the next filter
    monkeypatch.setattr(gpuprof.tools, "profiling_restricted", lambda: False)
    tried = []

    def capture(chapter, name, script, args, options, details):
        tried.append(options[options.index("--nvtx-include") + 1])
        raise GpuprofError("no reference report of that name")

    monkeypatch.setattr(gpuprof.ncu.capture, "ncu_capture", capture)
    with pytest.raises(GpuprofError, match="The ncu capture of fused_graph was not made here"):
        capture_ch12.ncu_capture_step(["fused_graph"])
    assert tried == capture_ch12.ncu_filters("fused_graph")


def test_memory_the_machine_lacks_is_refused_before_any_work(capsys):
    proc = run_here(REPO_ROOT / "examples" / "nsys" / "data_transfer.py", "--size-mib", "10000000", capsys=capsys)
    assert proc.returncode == 2 and "would take" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_emit_nvtx_without_a_gpu_runs_without_pytorchs_ranges():
    proc = run(REPO_ROOT / "examples" / "nsys" / "nvtx_features.py", "--sections", "training", "--emit-nvtx", "--steps", "2")
    assert proc.returncode == 0 and "needs a CUDA build of PyTorch" in proc.stdout, proc.stderr


def test_nvtx_profile_cost_is_reported_with_its_noise():
    proc = run(REPO_ROOT / "examples" / "nsys" / "nvtx_features.py", "--sections", "auto")
    import re

    m = re.search(r"auto: (-?[\d.]+) ns added per call \(noise ([\d.]+) ns\)", proc.stdout)
    assert proc.returncode == 0 and m, proc.stdout
    within = abs(float(m.group(1))) <= float(m.group(2))
    assert ("within noise" in proc.stdout) == within, proc.stdout


def test_capture_refuses_without_a_gpu():
    proc = run(REPO_ROOT / "scripts" / "capture_all.py", "--skip-nbval")
    assert proc.returncode == 2
    assert "needs a CUDA GPU" in proc.stderr and "Traceback" not in proc.stderr


def test_provenance_table_has_a_row_per_reference_file():
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    from capture_all import provenance_markdown

    table = provenance_markdown(REPO_ROOT / "artifacts")
    for name in ("ch00/speed_of_light.json", "ch00/tiny_kernels.sqlite.gz", "ch00/saxpy_sol.csv"):
        assert f"`{name}`" in table
    assert (REPO_ROOT / "artifacts" / "provenance.md").read_text() == table, \
        "artifacts/provenance.md is stale: it must be regenerated by make capture"


def test_a_partial_capture_run_keeps_the_record_of_the_others():
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    from capture_all import merge_runs

    first = "* run A\n| `00__setting_up.ipynb` | 30 s |\n| `01__nsight_systems.ipynb` | 90 s |\n"
    second = merge_runs("* run B\n| `03__weight_streaming.ipynb` | 85 s |\n", first, {"03__weight_streaming.ipynb"})
    assert second.index("run B") < second.index("run A")
    third = merge_runs("* run C\n| `03__weight_streaming.ipynb` | 80 s |\n", second, {"03__weight_streaming.ipynb"})
    assert "run C" in third and "run A" in third and "run B" not in third
    full = merge_runs("* run D\n", third, {"00__setting_up.ipynb", "01__nsight_systems.ipynb", "03__weight_streaming.ipynb"})
    assert full.strip() == "* run D"
    assert merge_runs("* only\n", None, set()) == "* only\n"
    # a run superseded piecemeal by later partial runs goes too
    e = merge_runs("* run E\n| `01__nsight_systems.ipynb` | 91 s |\n", first, {"01__nsight_systems.ipynb"})
    f = merge_runs("* run F\n| `00__setting_up.ipynb` | 31 s |\n", e, {"00__setting_up.ipynb"})
    assert "run E" in f and "run F" in f and "run A" not in f


@pytest.mark.parametrize("args,message,as_a_program", [
    (["--rows", "1000000000000"], "above this script's limit of 50,000,000", True),
    (["--rows", "1000", "--json", "/nonexistent/dir/x.json"], "the folder /nonexistent/dir does not exist", False),
], ids=["args0-above this script's limit of 50,000,000", "args1-the folder /nonexistent/dir does not exist"])
def test_benchmark_refuses_bad_input_before_the_work(args, message, as_a_program, capsys):
    script = REPO_ROOT / "scripts" / "bench_trace_analysis.py"
    proc = run(script, *args) if as_a_program else run_here(script, *args, capsys=capsys)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_running_out_of_memory_past_the_checks_is_one_sentence():
    """A size the up-front check lets through (it is a lower bound) can still run out: under an address-space limit
    of 3 GiB, a batch of 4096 does (PyTorch's CPU allocator fails); the scripts' one handler says so in one sentence."""
    pytest.importorskip("torch")
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))

    proc = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "nsight_compute" / "torch_conv.py"), "--batch", "4096"],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, preexec_fn=limit)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "error: out of host memory; one allocation asked for" in proc.stderr
    assert "may use only 3.0 GiB of address space (ulimit -v)" in proc.stderr


def test_benchmark_runs_on_a_small_export(tmp_path):
    out = tmp_path / "bench.json"
    proc = run(REPO_ROOT / "scripts" / "bench_trace_analysis.py", "--rows", "20000", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    import json

    result = json.loads(out.read_text())
    assert result["rows"] == 20000 == result["toolkit"]["kernels"] == result["baseline"]["kernels"]
    assert result["toolkit"]["names"] == result["baseline"]["names"]


@pytest.mark.slow
def test_torch_trace_benchmark_agrees_with_its_baseline(tmp_path, capsys):
    pytest.importorskip("torch")
    source = write(tmp_path, gpu_events(), gz=True)
    out = tmp_path / "bench.json"
    proc = run(REPO_ROOT / "scripts" / "bench_torch_trace.py", "--mb", "1", "--source", str(source), "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    import json

    result = json.loads(out.read_text())
    assert result["mb"] >= 1 and result["toolkit"]["kernels"] == result["baseline"]["kernels"] > 1000
    assert result["toolkit"]["kernel_names"] == result["baseline"]["kernel_names"] == 2
    assert result["toolkit"]["steps"] == 2 * result["toolkit"]["kernels"] // 3  # two steps and three kernels per copy
    assert result["report"]["report_lines"] > 20 and result["report"]["peak_rss_mib"] > 0  # the whole report, measured
    bad = run_here(REPO_ROOT / "scripts" / "bench_torch_trace.py", "--source", str(tmp_path / "missing.json"), capsys=capsys)
    assert bad.returncode == 2 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr


def test_bench_torch_trace_builds_once_and_runs_one_step_per_process(tmp_path, capsys):
    """--build-only keeps the two traces; --step runs one step on one of them (what an outside timer times), printing
    the same result the in-process measurement gives; HTA's step refuses a folder holding another trace."""
    pytest.importorskip("torch")
    import json

    source = write(tmp_path, gpu_events(), gz=True)
    script = REPO_ROOT / "scripts" / "bench_torch_trace.py"
    built = run(script, "--mb", "1", "--source", str(source), "--hta-source", str(source), "--build-only", str(tmp_path / "b"))
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "b" / "big.json").stat().st_size >= 1e6 and (tmp_path / "b" / "hta" / "big.json").is_file()
    step = run(script, "--step", "toolkit", "--trace", str(tmp_path / "b" / "big.json"))
    assert step.returncode == 0, step.stderr
    result = json.loads(step.stdout.strip().splitlines()[-1])
    assert result["kernel_names"] == 2 and result["steps"] == 2 * result["kernels"] // 3
    (tmp_path / "b" / "other.json").write_text("{}")
    crowded = run_here(script, "--step", "hta", "--trace", str(tmp_path / "b" / "big.json"), capsys=capsys)
    assert crowded.returncode == 2 and "HTA reads every trace" in crowded.stderr and "Traceback" not in crowded.stderr
    missing = run_here(script, "--step", "toolkit", capsys=capsys)
    assert missing.returncode == 2 and "--build-only" in missing.stderr


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux's /proc")
def test_tree_memory_counts_the_children(tmp_path):
    """Two children holding 150 MiB each while the parent holds none: the summed peak counts both, the largest
    single process one (a worker's memory is what a process's own high-water mark leaves out)."""
    code = ("import subprocess, sys; c = 'b = bytearray(150 * 2**20); import time; time.sleep(1.5)'; "
            "ps = [subprocess.Popen([sys.executable, '-c', c]) for _ in range(2)]; [p.wait() for p in ps]")
    proc = run(REPO_ROOT / "scripts" / "tree_memory.py", "--every", "0.05", "--", sys.executable, "-c", code)
    assert proc.returncode == 0, proc.stderr
    import re

    got = re.search(r"peak sum RSS ([\d,]+) MiB  peak sum PSS ([\d,]+) MiB  processes at once (\d+)", proc.stdout)
    single = re.search(r"largest single process ([\d,]+) MiB", proc.stdout)
    rss, pss, most = (int(g.replace(",", "")) for g in got.groups())
    assert most == 3 and pss >= 300 and rss >= 300
    assert 150 <= int(single.group(1).replace(",", "")) < 300


def test_bench_torch_trace_report_step_is_python_m_gpuprof_report(tmp_path, capsys):
    """The report step runs `python -m gpuprof report FILE` on a committed trace: in its own process (--step, for an
    outside timer) and measured in a fresh one, it prints the very text the command prints, its own timing line
    apart; a file the report refuses fails the step with the report's own message."""
    import hashlib
    import json

    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    from bench_torch_trace import REPORT
    from fresh_process import measure

    from gpuprof.errors import GpuprofError

    trace = REPO_ROOT / "artifacts" / "ch05" / "train_steps.json.gz"
    cli = subprocess.run([sys.executable, "-m", "gpuprof", "report", str(trace)], capture_output=True, text=True,
                         timeout=300, cwd=REPO_ROOT)
    assert cli.returncode == 0, cli.stderr
    text = cli.stdout[:cli.stdout.rstrip("\n").rindex("\n") + 1]  # without the closing "(N s)" line
    assert "-- Steps" in text and cli.stdout[len(text):].endswith(" s)\n")
    step = run(REPO_ROOT / "scripts" / "bench_torch_trace.py", "--step", "report", "--trace", str(trace))
    assert step.returncode == 0, step.stderr
    result = json.loads(step.stdout.strip().splitlines()[-1])
    assert result["report_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert result["report_lines"] == text.count("\n")
    fresh = measure(REPORT, trace)
    assert fresh["report_sha256"] == result["report_sha256"] and fresh["seconds"] >= fresh["report_own_seconds"] > 0
    assert fresh["peak_rss_mib"] > 50  # pandas and matplotlib alone take more
    assert fresh["peak_tree_pss_mib"] > 50
    with pytest.raises(GpuprofError, match="not a PyTorch profiler trace"):
        measure(REPORT, REPO_ROOT / "artifacts" / "ch05" / "memory_log.json.gz")


@pytest.mark.skipif(not __import__("shutil").which("nvcc"), reason="nvcc is not installed here")
def test_the_c_api_example_compiles_without_an_nvtx_library(tmp_path):
    """NVTX v3 is header-only: the example must build with no -lnvToolsExt."""
    proc = subprocess.run(["nvcc", "-arch=sm_90", "-o", str(tmp_path / "nvtx_c_api"),
                           str(REPO_ROOT / "examples" / "nsys" / "nvtx_c_api.cu")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "nvtx_c_api").is_file()


@pytest.mark.skipif(not __import__("shutil").which("nvcc"), reason="nvcc is not installed here")
@pytest.mark.parametrize("target", [["-gencode=arch=compute_90a,code=sm_90a"], ["-arch=sm_80"]])
def test_the_matmul_ladder_compiles_without_spills(tmp_path, target):
    """Every rung builds with line info for Hopper's sm_90a (wgmma, setmaxnreg) and for an older
    GPU (sm_80, where rung 7 compiles to an empty body), and none spills registers (ptxas says so)."""
    proc = subprocess.run(["nvcc", "-cubin", *target, "-lineinfo", "-std=c++17", "-Xptxas", "-v", "-o",
                           str(tmp_path / "ladder.cubin"), str(REPO_ROOT / "examples" / "nsight_compute" / "matmul_ladder.cu")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "C7508" not in proc.stderr, proc.stderr  # ptxas ignoring setmaxnreg
    from gpuprof.kernels import parse_ptxas_verbose

    usage = parse_ptxas_verbose(proc.stderr)
    sys.path.insert(0, str(REPO_ROOT / "examples" / "nsight_compute"))
    import matmul_ladder as ml

    assert set(usage) == {r.kernel for r in ml.RUNGS.values()} | {ml.RUNG10_RELEASE_CLUSTER.kernel}
    assert all(u.get("spill_store_bytes", 0) == 0 == u.get("spill_load_bytes", 0) for u in usage.values()), usage


def test_the_ladders_shape_rules():
    sys.path.insert(0, str(REPO_ROOT / "examples" / "nsight_compute"))
    import matmul_ladder as ml

    assert ml.shape("4096") == (4096, 4096, 4096) and ml.shape("777,520,264") == (777, 520, 264)
    assert ml.grid_for(3, 777, 520) == (5, 7) and ml.grid_for(1, 17, 16) == (1, 2) and ml.grid_for(7, 777, 520) == (3, 7)
    assert ml.runnable([1, 5, 7], 90) == ([1, 5, 7], [])
    ok, why = ml.runnable([1, 5, 7], 75)
    assert ok == [1] and "rung 5 needs compute capability 8.0" in why[0] and "rung 7" in why[1]
    assert ml.runnable([6, 7], 89)[0] == [6]  # wgmma is sm_90a only: not on Ada (8.9), nor Blackwell
    assert ml.fits(3, 777, 520, 264) is None and "multiples of 8" in ml.fits(3, 64, 64, 60)
    assert all(ml.fits(1, m, n, k) is None for m, n, k in ml.CHECK_SHAPES)
    # gridDim.y counts M's tiles: rung 1's 16-row tiles reach CUDA's 65,535 at M = 1,048,560
    assert ml.fits(1, 65535 * 16, 64, 64) is None and "65,535" in ml.fits(1, 65535 * 16 + 1, 64, 64)
    assert ml.product_bytes(8192, 8192, 8192) == 2**30
    # at least one check shape is a multiple of no rung's tile
    assert any(all(m % r.tile[0] or n % r.tile[1] for r in ml.RUNGS.values()) for m, n, _ in ml.CHECK_SHAPES)


def test_reexecute_cells_leaves_other_cells_byte_for_byte(tmp_path):
    """Only the named cells change: another cell's stored figure keeps its bytes, even one the capture run would shrink."""
    import base64
    import io

    import nbformat
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGBA", (64, 32), (10, 20, 30, 255)).save(buf, format="PNG")  # opaque RGBA: shrink_figures would recode it
    png = base64.b64encode(buf.getvalue()).decode()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print(6 * 7)", id="wanted"),
                nbformat.v4.new_code_cell("x = 1", id="other",
                                          outputs=[nbformat.v4.new_output("display_data", data={"image/png": png})])]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    proc = run(REPO_ROOT / "scripts" / "reexecute_cells.py", str(path), "--cells", "wanted")
    assert proc.returncode == 0, proc.stderr
    after = nbformat.read(path, as_version=4)
    assert after.cells[0].outputs[0]["text"] == "42\n"
    assert after.cells[1].outputs[0]["data"]["image/png"] == png


def test_the_nvtx_trigger_facts_differ_only_in_the_register_only_variable():
    """capture_tool_facts.py --nvtx-trigger (run on a GPU): one range name, one program per binding, the same
    nsys line with and without NSYS_NVTX_PROFILER_REGISTER_ONLY=0."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("capture_tool_facts", REPO_ROOT / "scripts" / "capture_tool_facts.py")
    facts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(facts)
    assert set(facts.TRIGGER_PROGRAMS) == {"nvtx", "torch.cuda.nvtx"}
    for api, program in facts.TRIGGER_PROGRAMS.items():
        compile(program, api, "exec")
        assert program.count(repr(facts.TRIGGER_RANGE)) == 1  # the range is opened once: only the first one triggers
        default, full = facts.trigger_command("nsys", api, False), facts.trigger_command("nsys", api, True)
        assert [a for a in full if "REGISTER_ONLY" not in a and "trigger_" not in a] == \
               [a for a in default if "trigger_" not in a]
        assert "--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0" in full and "--nvtx-capture=trigger_range" in default
    assert "nvtx.push_range" in facts.TRIGGER_PROGRAMS["nvtx"]
    assert "torch.cuda.nvtx.range_push" in facts.TRIGGER_PROGRAMS["torch.cuda.nvtx"]


def test_memory_allocation_refuses_an_allocator_the_environment_contradicts(monkeypatch, capsys):
    """PYTORCH_CUDA_ALLOC_CONF is read once, when CUDA starts: a backend named there that --allocator contradicts
    would make the run measure the other allocator, so the script says so before anything starts."""
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:native")
    proc = run_here(REPO_ROOT / "examples" / "nsys" / "memory_allocation.py", "--allocator", "cudaMallocAsync", capsys=capsys)
    assert proc.returncode == 2 and "already names another backend" in proc.stderr


def test_the_capture_archive_holds_only_what_the_run_wrote(tmp_path):
    """A lent GPU machine returns files of limited size: the archive must not carry every chapter's references."""
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    from capture_all import artifacts_written_since

    old, new, raw, log = (tmp_path / "ch01" / "old.json", tmp_path / "ch08" / "ddp.sqlite.gz",
                          tmp_path / "ch08" / "ddp.nsys-rep", tmp_path / "ch08" / "ddp.log")
    for f in (old, new, raw, log):
        f.parent.mkdir(exist_ok=True)
        f.write_text("x")
    started = 1_000_000.0
    os.utime(old, (started - 60, started - 60))
    for f in (new, raw, log):
        os.utime(f, (started + 5, started + 5))
    assert artifacts_written_since(tmp_path, started) == [new]


def test_benchmark_builds_an_export_for_the_report(tmp_path):
    """--build-only keeps the built export, with the rows asked for, and the report reads it; a second build to the
    same file is refused (the export is built from a copy of the source, not on top of a file)."""
    import sqlite3

    out = tmp_path / "k.sqlite"
    proc = run(REPO_ROOT / "scripts" / "bench_trace_analysis.py", "--rows", "5000", "--build-only", str(out))
    assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(out) as con:
        assert con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0] == 5000
    report = subprocess.run([sys.executable, "-m", "gpuprof", "report", str(out)], capture_output=True, text=True,
                            timeout=300, cwd=REPO_ROOT)
    assert report.returncode == 0 and "Top kernels" in report.stdout, report.stderr
    again = run(REPO_ROOT / "scripts" / "bench_trace_analysis.py", "--rows", "5000", "--build-only", str(out))
    assert again.returncode == 2 and "exists" in again.stderr and "Traceback" not in again.stderr


# Issue 39, a new user's findings: the kernel scripts share --cpu through gpuprof.kernels.add_bench_arguments.
BENCH_SCRIPTS = sorted(p for p in EXAMPLES if "add_bench_arguments(" in p.read_text())


def test_the_kernel_scripts_are_found():
    assert {p.name for p in BENCH_SCRIPTS} == {"divergence.py", "matmul.py", "matmul_ladder.py", "occupancy.py",
                                               "spills.py", "transpose.py"}


def _cpu_help(script, capsys) -> str:
    text = run_here(script, "--help", capsys=capsys).stdout
    block = text[text.index("  --cpu "):].split("\n  -")[0]
    return " ".join(block.split())


@pytest.mark.parametrize("script", BENCH_SCRIPTS, ids=lambda p: p.name)
def test_cpu_does_what_its_help_says(script, capsys, tmp_path):
    """--help promises a NumPy stand-in only where --cpu runs one (exit 0, its result checked); a script without one
    says so, and --cpu then exits non-zero, saying that nothing ran."""
    helped = _cpu_help(script, capsys)
    args = [a.replace("{tmp}", str(tmp_path)) for a in SMALL_ARGS[script.name]]
    proc = run_here(script, *args, "--cpu", capsys=capsys)
    if "NumPy stand-in" in helped:
        assert proc.returncode == 0 and "NumPy" in proc.stdout and "result checked" in proc.stdout, proc.stderr
    else:
        assert "no CPU stand-in" in helped, helped
        assert proc.returncode != 0 and "nothing to run" in proc.stdout, (proc.returncode, proc.stdout)


@pytest.mark.parametrize("script,args", [
    ("matmul.py", ["--n", "1000000"]), ("transpose.py", ["--n", "1000000"]), ("occupancy.py", ["--mib", "100000000"]),
    ("spills.py", ["--n", "100000000000"])], ids=["matmul", "transpose", "occupancy", "spills"])
def test_a_size_over_memory_is_refused_before_any_work_on_the_cpu(script, args, capsys):
    proc = run_here(REPO_ROOT / "examples" / "nsight_compute" / script, *args, "--cpu", capsys=capsys)
    assert proc.returncode == 2 and "would take" in proc.stderr and "of host memory" in proc.stderr, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr  # nothing started before the refusal


def test_the_ladder_without_a_gpu_says_what_the_size_needs_and_refuses_sizes_past_its_kernels(capsys):
    ladder = REPO_ROOT / "examples" / "nsight_compute" / "matmul_ladder.py"
    proc = run_here(ladder, "--size", "100000", capsys=capsys)
    assert proc.returncode == 3 and "would need 149.01 GiB of GPU memory" in proc.stdout, proc.stdout
    proc = run_here(ladder, "--size", "1000000000000", capsys=capsys)
    assert proc.returncode == 2 and "must be under 2,147,483,648" in proc.stderr, proc.stderr


def test_review_records_script_helps_and_refuses_without_a_gpu(tmp_path):
    """scripts/capture_review_records.sh: --help prints its header; without a GPU it says so and exits 2, writing nothing."""
    import shutil
    import subprocess

    script = str(REPO_ROOT / "scripts" / "capture_review_records.sh")
    help_ = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, timeout=30)
    assert help_.returncode == 0 and "saved_tensor_census.py" in help_.stdout and "clocks.json" in help_.stdout
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi")
    proc = subprocess.run(["bash", script, str(tmp_path / "out")], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "no NVIDIA GPU visible" in proc.stderr and not (tmp_path / "out").exists()
