"""examples/nsys/kv_capacity.py on the CPU: the search finds the largest batch that fits, each try's bookkeeping, the
prediction for the same memory, an out-of-memory error caught as a refusal (the GPU's path, injected), and the
refusals' sentences. The GPU's allocator figures (peak allocated and reserved, free memory) are not exercised here:
the CPU keeps none."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")

from gpuprof.artifacts import REPO_ROOT  # noqa: E402
from gpuprof.runner import load_script  # noqa: E402
from gpuprof.studies import llm_inference as li  # noqa: E402

kv = load_script(REPO_ROOT / "examples" / "nsys" / "kv_capacity.py")
CFG = kv.ld.PRESETS["tiny"]
PER_TOKEN = CFG.kv_bytes_per_token(4)  # float32 on the CPU


@pytest.mark.parametrize("threshold", [0, 1, 2, 3, 7, 64, 100, 1000])
@pytest.mark.parametrize("start", [0, 1, 5, 64, 5000])
def test_the_search_finds_the_largest_batch_that_fits_in_few_tries(threshold, start):
    tried: list[int] = []

    def fits(n: int) -> bool:
        tried.append(n)
        return n <= threshold

    cap = 1000
    assert kv.largest_fitting(fits, start, cap) == threshold
    assert len(tried) == len(set(tried))  # no batch tried twice
    assert len(tried) <= 2 * math.ceil(math.log2(cap)) + 2
    assert threshold == 0 or threshold in tried  # the answer was itself tried, not inferred
    assert threshold == cap or threshold + 1 in tried  # and so was the next batch, below the cap


def _run(tmp_path, *args):
    out = tmp_path / "kv.json"
    code = kv.main(["--cpu", "--model", "tiny", *args, "--json", str(out)])
    return code, json.loads(out.read_text())


def test_a_cpu_run_measures_what_the_limit_allows_beside_the_model(tmp_path):
    limit_gb = 0.05
    code, res = _run(tmp_path, "--context", "256,2048", "--memory-limit-gb", str(limit_gb))
    assert code == 0 and res["free_bytes"] == res["memory_limit_bytes"] == int(limit_gb * 1e9)
    assert res["kv_bytes_per_token"] == PER_TOKEN == 1024 and not res["allocator_figures"]
    # the model's tensors: the weights and the rotary tables (cos and sin, 2,048 positions x head dim, float32)
    assert res["resident_bytes"] == res["weight_bytes"] + 2 * 2048 * CFG.head_dim * 4
    for row in res["contexts"]:
        per_seq = row["context"] * PER_TOKEN
        room = res["free_bytes"] - res["resident_bytes"]
        assert row["measured_batch"] == room // per_seq  # the largest batch the limit holds beside the model
        assert row["predicted_batch"] == li.kv_capacity(CFG, res["free_bytes"], row["context"], 4)
        assert 0 < row["measured_batch"] <= row["predicted_batch"]  # the rotary tables are not in the arithmetic
        assert row["at_measured"]["cache_bytes"] == row["measured_batch"] * per_seq  # counted from the tensors
        assert row["first_refused"]["batch"] == row["measured_batch"] + 1
        assert row["first_refused"]["why"].startswith("over the limit")
        assert "MATH" in row["attention_backends"]  # the math backend takes any shape
        for t in row["trials"]:
            assert t["fits"] == (t["batch"] <= row["measured_batch"])
            assert t["peak_allocated"] is None  # no allocator statistics on the CPU
    # 2,048 tokens of 1 KiB: 2 MiB per sequence; the rotary tables cost context 256 two sequences of its 0.25 MiB
    by = {r["context"]: r for r in res["contexts"]}
    assert by[256]["predicted_batch"] - by[256]["measured_batch"] == 2


def test_an_out_of_memory_error_is_a_refused_try_and_other_errors_are_not(monkeypatch):
    model = kv.ld.Decoder(CFG, torch, "cpu", torch.float32, 64, seed=0)
    real = kv.Probe._step

    def step(self, batch):
        if batch > 7:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has ...")
        return real(self, batch)

    monkeypatch.setattr(kv.Probe, "_step", step)
    row = kv.measure(model, 64, 10**9, kv.model_bytes(model), None, 4)
    assert row["measured_batch"] == 7 and row["first_refused"]["why"] == "out of memory: CUDA out of memory. Tried to " \
                                                                         "allocate 2.00 GiB. GPU 0 has ..."
    assert row["first_refused"]["cache_bytes"] == 8 * 64 * PER_TOKEN  # the cache it would have held

    # cuBLAS that cannot set up a handle for want of memory says "not initialised": a refused try too
    assert kv._refused(RuntimeError("CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`"))
    assert kv._refused(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasLtMatmul(...)`"))

    def broken(self, batch):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(kv.Probe, "_step", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        kv.measure(model, 64, 10**9, kv.model_bytes(model), None, 4)


def test_a_try_over_the_limit_at_its_peak_is_refused(monkeypatch):
    """On a GPU the limit also applies to the try's peak (the step's working memory): injected here."""
    model = kv.ld.Decoder(CFG, torch, "cpu", torch.float32, 64, seed=0)
    resident = kv.model_bytes(model)

    def step(self, batch):
        cache = batch * 64 * PER_TOKEN
        return {"cache_bytes": cache, "peak_allocated": resident + cache + 10**6, "peak_reserved": 0, "free_at_peak": 0}

    monkeypatch.setattr(kv.Probe, "_step", step)
    limit = resident + 20 * 64 * PER_TOKEN  # 20 caches fit; with 1 MB of working memory, 13 (64 KiB each: 15.26)
    row = kv.measure(model, 64, limit, resident, limit, 4)
    assert row["predicted_batch"] == 20 and row["measured_batch"] == (20 * 64 * PER_TOKEN - 10**6) // (64 * PER_TOKEN)
    assert row["first_refused"]["why"].startswith("over the limit: the try's peak")


def test_not_even_batch_1_is_said_in_a_sentence_after_the_json(tmp_path, capsys):
    """The limit holds the weights and one sequence (the check before any work passes) but not the rotary tables too:
    the search tries batch 1, which does not fit."""
    context = 2048
    weights, one = CFG.params * 4, context * PER_TOKEN
    limit_gb = (weights + one + 1000) / 1e9  # rotary tables: 2 x 2,048 x 32 x 4 bytes, far more than 1,000
    out = tmp_path / "kv.json"
    with pytest.raises(SystemExit) as exc:
        kv.main(["--cpu", "--context", str(context), "--memory-limit-gb", repr(limit_gb), "--json", str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Not even batch 1 fits at context 2,048: over the limit" in err and "Traceback" not in err
    assert json.loads(out.read_text())["contexts"][0]["measured_batch"] == 0


def test_a_cache_that_disagrees_with_the_arithmetic_is_an_error(tmp_path, monkeypatch, capsys):
    """The check behind 'result checked': each cache that fitted is counted from its tensors against batch x context x
    the bytes per token; a cache one position longer than asked (a wrong shape) is caught."""
    real = kv.ld.StaticCache

    class Longer(real):
        def __init__(self, cfg, torch_, batch, positions, device, dtype):
            super().__init__(cfg, torch_, batch, positions + 1, device, dtype)

    monkeypatch.setattr(kv.ld, "StaticCache", Longer)
    with pytest.raises(SystemExit) as exc:
        kv.main(["--cpu", "--context", "64", "--memory-limit-gb", "0.02"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "The KV cache of batch" in err and "not the arithmetic's" in err


def test_chapter_12s_capture_runs_this_script_with_arguments_it_accepts():
    """scripts/capture_ch12.py's step kv: a typo in its command would otherwise surface only on the GPU machine."""
    import sys

    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import capture_ch12

    assert "kv" in capture_ch12.STEPS and (REPO_ROOT / capture_ch12.KV_SCRIPT).samefile(kv.__file__)
    parsed = kv.parse_args([*capture_ch12.KV_ARGS, "--json", "/tmp/x.json"])
    assert parsed.model == "8b" and 4096 in parsed.context and 32768 in parsed.context
