"""The saved-tensor census (gpuprof.studies.saved_tensors, scripts/saved_tensor_census.py) on the CPU.

The CPU's numbers are not the chapter's (CUDA autocast's op lists and attention kernels differ);
these tests check the mechanics: every saved tensor found and named, storages counted once, roles,
totals, checkpointing, and the refusals. The FP32 count is checked against a count written out
from the model's code (:func:`explicit_fp32_bytes`).
"""

from __future__ import annotations

import inspect
import json

import pytest

from gpuprof.errors import GpuprofError
from gpuprof.runner import load_script
from gpuprof.studies import saved_tensors as st
from helpers import SCRIPTS, run_script, run_script_in_process

torch = pytest.importorskip("torch")

SCRIPT = SCRIPTS / "saved_tensor_census.py"
# Not the benchmark's tiny preset: d_ff is not 4 x d_model, so a count that assumed it would fail.
ARGS = ["--d-model", "48", "--d-ff", "80", "--num-layers", "3", "--num-heads", "3", "--context-length", "12",
        "--batch-size", "3"]


def config(mode: str = "fp32") -> dict:
    bench = load_script(st.BENCHMARK)
    return bench.model_config(bench.parse_args([*ARGS, "--dtype", mode]))


@pytest.fixture(scope="module")
def fp32():
    return st.saved_tensor_census(config(), "cpu", "fp32")


@pytest.fixture(scope="module")
def fp32_checkpointed():
    return st.saved_tensor_census(config(), "cpu", "fp32", checkpoint=True)


def explicit_fp32_bytes(cfg: dict) -> dict[str, int]:
    """What one FP32 forward + loss of ``build_model`` saves, counted from the code, in bytes.

    N = batch x context tokens, d = d_model, f = d_ff, h = heads, L = layers, V = vocabulary; FP32 is 4
    bytes. Per block (``Block.forward``):

    * ``self.ln1(x)``: native_layer_norm saves its input x (4Nd) and its mean and 1/std, each (b, t, 1)
      FP32 (4N + 4N); its weight and bias are parameters;
    * ``self.qkv(...)``: a linear on a 3-D input is a view to (N, d) and an mm, which saves its input,
      LayerNorm's output (4Nd), and the weight's transpose (a view of the parameter);
    * ``.view(...).permute(...)`` and ``q, k, v = ...``: three views of the qkv output, one storage (12Nd);
    * ``F.scaled_dot_product_attention`` (the CPU's flash kernel) saves q, k, v (that storage), its output
      (4Nd) and the logsumexp, (b, h, t) FP32 (4Nh);
    * ``a.transpose(1, 2).reshape(b, t, d)``: the output is laid out (b, t, h, d/h), so its transpose is
      contiguous and the reshape a view: the projection's mm saves a view of the attention output, no new
      storage;
    * the residual adds save nothing; ``self.ln2``: input 4Nd, mean and 1/std 8N; ``self.up``: its input,
      LayerNorm's output (4Nd); ``F.gelu``: its input, the up output (4Nf); ``self.down``: its input, the
      GELU output (4Nf).

    A block: 4N(8d + 2f + h) + 16N (d-sized: the two LayerNorm inputs, their two outputs, the three of
    qkv, the attention output). Once per model: the embedding saves the token ids, ``tokens[:, :-1]``,
    a view of the (b, t + 1) int64 tokens (8b(t + 1)); the final LayerNorm 4Nd + 8N; the head's mm its
    input (4Nd); ``F.cross_entropy`` is log_softmax, which saves its output (4NV), and nll_loss, which
    saves that same tensor, the targets ``y.flatten()`` (a copy of a non-contiguous view: 8N) and the
    total weight (a 0-d FP32 tensor: 4).
    """
    n, d, f, h, layers, v = (cfg["batch_size"] * cfg["context_length"], cfg["d_model"], cfg["d_ff"],
                             cfg["num_heads"], cfg["num_layers"], cfg["vocab"])
    block = 4 * n * (8 * d + 2 * f + h) + 16 * n
    model = 8 * cfg["batch_size"] * (cfg["context_length"] + 1) + (4 * n * d + 8 * n) + 4 * n * d + 4 * n * v + 8 * n + 4
    return {"block": block, "blocks": layers * block, "all": layers * block + model}


def test_fp32_census_equals_the_count_from_the_code(fp32):
    cfg = fp32.config
    want = explicit_fp32_bytes(cfg)
    norm = cfg["batch_size"] * cfg["context_length"] * cfg["num_layers"] * cfg["d_model"]
    assert fp32.summary["block_activation_bytes"] == want["blocks"]
    assert fp32.summary["activation_bytes"] == want["all"]
    assert fp32.summary["block_bytes_per_layer"] == [want["block"]] * cfg["num_layers"]
    assert fp32.summary["blocks_per_token_layer_width"] == pytest.approx(want["blocks"] / norm, rel=1e-12)
    assert fp32.summary["saved_then_freed"] == 0


def test_fp32_roles_per_token_layer_width(fp32):
    d, f, h = fp32.config["d_model"], fp32.config["d_ff"], fp32.config["num_heads"]
    got = fp32.roles["bytes per token-layer-width"]
    want = {"LayerNorm inputs": 8, "LayerNorm statistics": 16 / d, "qkv input": 4, "q, k, v": 12,
            "attention output": 4, "attention extras": 4 * h / d, "projection input": 0, "MLP up input": 4,
            "GELU input": 4 * f / d, "MLP down input": 4 * f / d}
    assert {r: got[r] for r in want} == pytest.approx(want, rel=1e-12)
    assert fp32.roles.loc["projection input", "note"] == "storage counted under attention output"
    assert not [r for r in fp32.roles.index if r.startswith("other")], "every saved tensor has a named role"


def test_a_storage_saved_twice_is_counted_once(fp32):
    """log_softmax's output is saved by LogSoftmaxBackward0 and by NllLossBackward0; q, k and v are three views."""
    logs = [e for e in fp32.entries if e.role == "logits and loss" and e.shape == (36, fp32.config["vocab"])]
    assert sorted((e.node, e.field) for e in logs) == [("LogSoftmaxBackward0", "result"), ("NllLossBackward0", "self")]
    assert logs[0].storage == logs[1].storage
    assert fp32.roles.loc["logits and loss", ["saved tensors", "storages"]].tolist() == [4, 3]
    layers = fp32.config["num_layers"]
    assert fp32.roles.loc["q, k, v", ["saved tensors", "storages"]].tolist() == [3 * layers, layers]


def test_totals_are_the_unique_storages_a_pack_hook_sees(fp32):
    """An independent count: the same forward under a hook of this test's own, every storage once at its size."""
    cfg = fp32.config
    bench = load_script(st.BENCHMARK)
    torch.manual_seed(0)
    model = bench.build_model(cfg, "cpu")
    tokens = torch.randint(0, cfg["vocab"], (cfg["batch_size"], cfg["context_length"] + 1),
                           generator=torch.Generator().manual_seed(0))
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    assert loss.isfinite()
    s = fp32.summary
    assert sum(storages.values()) == s["activation_bytes"] + s["parameter_bytes"] + s["weight_copy_bytes"]
    assert len(storages) == s["storages"]


def test_parameters_are_counted_apart(fp32):
    """FP32: the saved parameters are the matrix products' weights and LayerNorm's weights and biases."""
    cfg = fp32.config
    matmul = load_script(st.BENCHMARK).matmul_parameters(cfg)
    layernorm = (2 * cfg["num_layers"] + 1) * 2 * cfg["d_model"]
    assert fp32.summary["parameter_bytes"] == 4 * (matmul + layernorm)
    assert fp32.summary["weight_copy_bytes"] == 0


def test_bf16_weight_copies_are_the_fits_intercept():
    """Under autocast every matrix product saves a bf16 copy of its weight: 2 bytes per weight (the chapter's
    intercept); LayerNorm runs in FP32 and saves its FP32 input and its FP32 weights."""
    cfg = config("bf16")
    census = st.saved_tensor_census(cfg, "cpu", "bf16")
    bench = load_script(st.BENCHMARK)
    assert census.summary["weight_copy_bytes"] == 2 * bench.matmul_parameters(cfg)
    assert census.summary["parameter_bytes"] == 4 * (2 * cfg["num_layers"] + 1) * 2 * cfg["d_model"]
    assert census.roles.loc["LayerNorm inputs", "bytes per token-layer-width"] == 8
    assert census.roles.loc["autocast weight copies (not activations)", "storages"] == 4 * cfg["num_layers"] + 1


def test_checkpointing_keeps_the_block_inputs_only(fp32, fp32_checkpointed):
    cfg = fp32.config
    n, d = cfg["batch_size"] * cfg["context_length"], cfg["d_model"]
    c = fp32_checkpointed
    assert c.summary["activation_bytes"] < fp32.summary["activation_bytes"]
    assert c.summary["block_bytes_per_layer"] == [4 * n * d] * cfg["num_layers"]  # each block's FP32 input
    assert c.summary["blocks_per_token_layer_width"] == 4
    blocks = c.roles[(c.roles["scope"] == "block") & (c.roles["bytes"] > 0)]
    assert list(blocks.index) == ["checkpoint inputs"]
    assert c.roles.loc["checkpoint inputs", "storages"] == cfg["num_layers"]
    for role in ("final LayerNorm", "head input", "logits and loss", "token ids"):  # outside the blocks: unchanged
        assert c.roles.loc[role, "bytes"] == fp32.roles.loc[role, "bytes"]
    assert c.summary["held_by_checkpoint"] > 0
    assert {e.node for e in c.entries if e.role == "recomputed in backward"} >= {
        "MmBackward0", "GeluBackward0", "NativeLayerNormBackward0"}


def test_the_walk_tells_checkpoints_placeholders_from_saved_tensors(fp32_checkpointed):
    """Where torch shows a saved field's content unread (SavedTensor.data), the census checked every field."""
    node = torch.ones(1, requires_grad=True).mul(torch.ones(1)).grad_fn
    if not hasattr(node._raw_saved_other, "data"):
        pytest.skip(f"torch {torch.__version__} has no SavedTensor.data")
    c = fp32_checkpointed
    assert c.summary["tensors_checked_unread"] == c.summary["held_by_checkpoint"] + c.summary["saved_tensors"] - \
        sum(e.node.startswith("(no node") for e in c.entries)


def test_a_bad_mode_is_refused_in_one_sentence():
    for mode in ("fp16", "tf32"):
        with pytest.raises(GpuprofError) as err:
            st.saved_tensor_census(config(), "cpu", mode)
        text = str(err.value)
        assert text.endswith(".") and ". " not in text and repr(mode) in text


def test_the_census_runs_the_benchmarks_step():
    """The census's forward and loss repeat the benchmark's step; if the step changes, this fails."""
    run = inspect.getsource(load_script(st.BENCHMARK).run)
    for line in ('autocast = (torch.autocast(device, dtype=torch.bfloat16) if args.dtype == "bf16" else '
                 "contextlib.nullcontext())",
                 "x, y = tokens[:, :-1], tokens[:, 1:]",
                 "loss = F.cross_entropy(forward_model(x).flatten(0, 1), y.flatten())"):
        assert line in run
    assert "F.cross_entropy(model(x).flatten(0, 1), y.flatten())" in inspect.getsource(st._loss)


def test_record_is_json(fp32):
    record = json.loads(json.dumps(fp32.record(), allow_nan=False))  # strict: the reviewer column's gaps are null
    assert {e["layer"] for e in record["entries"]} == {None, 0}
    assert record["summary"]["activation_bytes"] == fp32.summary["activation_bytes"]
    assert len(json.loads(json.dumps(fp32.record("all")))["entries"]) == len(fp32.entries)


# ----- the script -----

def test_script_help(capsys):
    proc = run_script_in_process(SCRIPT, "--help", capsys=capsys)
    assert proc.returncode == 0 and "--device" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_script_refuses_without_a_gpu():
    proc = run_script(SCRIPT, "--sizes", "tiny")
    assert proc.returncode == 2 and "no CUDA GPU here" in proc.stderr and "--device cpu" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("args,message", [(["--sizes", "huge"], "not in the benchmark's table"),
                                          (["--contexts", "a,b"], "not a comma-separated list"),
                                          (["--mode", "fp16"], "invalid choice")])
def test_script_refuses_bad_input(args, message, capsys):
    proc = run_script_in_process(SCRIPT, *args, capsys=capsys)
    assert proc.returncode == 2 and message in proc.stderr


def test_script_on_the_cpu_writes_its_record(tmp_path):
    out = tmp_path / "census.json"
    proc = run_script(SCRIPT, "--device", "cpu", "--sizes", "tiny", "--contexts", "8,16", "--mode", "fp32",
                      "--json", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert [(r["context"], r["checkpoint"]) for r in data["runs"]] == [(8, False), (8, True), (16, False), (16, True)]
    cfg = data["runs"][0]["config"]
    per_token = {}
    for t in (8, 16):
        per_token[t] = explicit_fp32_bytes({**cfg, "context_length": t})["all"]
    want = (per_token[16] - per_token[8]) / (cfg["batch_size"] * 8 * cfg["num_layers"] * cfg["d_model"])
    plain = next(s for s in data["slopes"] if not s["checkpoint"])
    assert plain["census_slope"] == pytest.approx(want, rel=1e-12)
    assert "cuda_memory" not in data["runs"][0]["summary"] and "allocated_slope" not in plain
    assert data["command"].startswith("python scripts/saved_tensor_census.py --device cpu")
    assert data["complete"] is True and "NaN" not in out.read_text()
    # the chapter's reading: the fit's slope beside the census's, per size (a size the fit lacks reads NaN)
    import pandas as pd
    fit = pd.DataFrame({"bytes per token-layer-width": [38.6]}, index=pd.Index(["tiny"], name="size"))
    side = st.census_beside_fit(data, fit)
    assert side.loc["tiny", "fit"] == 38.6 and side.loc["tiny", "census, plain"] == pytest.approx(want, rel=1e-12)
    assert side.loc["tiny", "census, checkpointed"] < side.loc["tiny", "census, plain"]
    assert "allocated, plain" not in side.columns  # the CPU has no allocated bytes to compare
    assert pd.isna(st.census_beside_fit(data, fit.rename(index={"tiny": "small"})).loc["tiny", "fit"])


def _entry(role: str, storage: tuple | None, nbytes: int, counted_as: str | None = None) -> st.SavedEntry:
    return st.SavedEntry(node="N", field="f", role=role, layer=0, shape=(1,), dtype="bf16", view_bytes=nbytes,
                         storage=storage, storage_bytes=nbytes, counted_as=counted_as or role)


def test_the_memory_check_counts_what_forward_allocated_on_the_gpu_once():
    """Against torch.cuda.memory_allocated after forward less before: new CUDA storages only, each once. The token
    ids existed before forward, the weights too, a CPU tensor is not GPU memory, a checkpoint placeholder holds none."""
    entries = [_entry("token ids", ("cuda:0", 1), 100), _entry("parameters", ("cuda:0", 2), 1000),
               _entry("autocast weight copies", ("cuda:0", 3), 500), _entry("q, k, v", ("cuda:0", 4), 60),
               _entry("attention output", ("cuda:0", 4), 60, "q, k, v"), _entry("attention extras", ("cpu", 5), 8),
               _entry("recomputed in backward", None, 0), _entry("GELU input", ("cuda:0", 6), 40)]
    check = st._memory_check(entries, {("cuda:0", 1)}, allocated=700)
    assert check == {"allocated_by_forward": 700, "census_new_cuda_storages": 600, "difference": 100}


def test_a_shared_storage_goes_to_the_earliest_role_whatever_the_walks_order():
    def entry(role):
        return st.SavedEntry("N", "f", role, 0, (4,), "float32", 16, ("cpu", 1), 16)

    for order in (["projection input", "attention output"], ["attention output", "projection input"]):
        entries = [entry(r) for r in order]
        st._assign_storages(entries)
        assert {e.counted_as for e in entries} == {"attention output"}
        table = st.role_table(entries, tokens=1, layers=1, width=1)
        assert table.loc["attention output", "bytes"] == 16 and table.loc["projection input", "bytes"] == 0
        assert table.loc["activations, blocks", "bytes"] == 16


def test_the_published_count_is_34_less_the_masks_plus_fp32_layernorm_inputs_with_the_shared_storage_once():
    assert sum(st.PUBLISHED_36.values()) == 34 - 2 + 4
    # the same roles as the first count, the one storage the projection reads counted once
    assert set(st.PUBLISHED_36) == set(st.REVIEWER_38)
    diff = {r: st.REVIEWER_38[r] - st.PUBLISHED_36[r] for r in st.REVIEWER_38 if st.REVIEWER_38[r] != st.PUBLISHED_36[r]}
    assert diff == {"projection input": 2}
