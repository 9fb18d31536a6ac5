"""examples/nsys/llm_decode.py: the two KV caches compute the same thing, the cache computes what a full forward pass
does, the bytes-per-step arithmetic for Llama-3-8B's shapes, and the memory refusal's sentence."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

import gpuprof.cli  # noqa: E402
from gpuprof.artifacts import REPO_ROOT  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402
from gpuprof.runner import load_script  # noqa: E402

llm = load_script(REPO_ROOT / "examples" / "nsys" / "llm_decode.py")

BATCH, PROMPT, NEW = 2, 24, 12


@pytest.fixture(scope="module")
def tiny():
    cfg = llm.PRESETS["tiny"]
    model = llm.Decoder(cfg, torch, "cpu", torch.float32, PROMPT + NEW, seed=0)
    prompt = torch.randint(0, cfg.vocab, (BATCH, PROMPT), generator=torch.Generator().manual_seed(1))
    runs = {kind: llm.generate(model, prompt, NEW, llm.new_cache(kind, model, BATCH, PROMPT + NEW, "cpu", torch.float32))
            for kind in llm.CACHES}
    return model, prompt, runs


def test_static_and_dynamic_caches_give_the_same_logits_and_tokens(tiny):
    _, _, runs = tiny
    (tok_d, logit_d), (tok_s, logit_s) = runs["dynamic"], runs["static"]
    assert tok_d.shape == (BATCH, NEW + 1) and logit_d.shape == (NEW + 1, BATCH, llm.PRESETS["tiny"].vocab)
    assert torch.equal(tok_d, tok_s)
    assert torch.equal(logit_d, logit_s)  # float32 on the CPU, the same kernels: equal to the bit
    # The check means something only if the model does not repeat one token: random weights still pick many.
    assert len(set(tok_d.flatten().tolist())) > NEW


def test_decoding_with_the_cache_equals_a_full_forward_pass_without_one(tiny):
    """Each step's logits must be what the whole sequence so far, run at once from position 0, gives at its end:
    a wrong rotary position or a stale cache entry changes them by about their own size."""
    model, prompt, runs = tiny
    tokens, logits = runs["static"]
    for step in (0, NEW // 2, NEW):
        seq = torch.cat([prompt, tokens[:, :step]], dim=1)
        with torch.inference_mode():
            full = model.forward(seq, llm.DynamicCache(model.cfg.layers), 0)
        assert torch.allclose(full, logits[step], atol=1e-4, rtol=1e-4), step
    assert torch.equal(logits.argmax(-1).T, tokens)


def test_the_cache_check_fails_when_the_tokens_differ():
    a = torch.tensor([[1, 2, 3], [4, 5, 6]])
    b = a.clone()
    b[1, 2] = 7
    with pytest.raises(GpuprofError, match=r"different tokens \(first difference at \[sequence, token\] \[1, 2\]\)"):
        llm.tokens_agree("dynamic", a, "static", b)
    llm.tokens_agree("dynamic", a, "static", a.clone())


def test_llama3_8b_parameters_and_bytes_per_decode_step():
    cfg = llm.PRESETS["8b"]
    # Written out from Llama-3-8B's config.json: 32 layers of q (4096x4096), k and v (4096x1024 each: 8 KV heads of
    # 128), o (4096x4096), gate, up and down (4096x14336 each) and two norms; an untied 128,256-token embedding and
    # output projection; a final norm. 8,030,261,248 is the count Hugging Face shows for the checkpoint.
    layer = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096
    params = 32 * layer + 2 * 128256 * 4096 + 4096
    assert cfg.params == params == 8_030_261_248
    # Keys and values: 2 x 32 layers x 8 heads x 128 x 2 bytes = 128 KiB per token in bf16.
    assert cfg.kv_bytes_per_token(2) == 131072
    for batch, context in ((1, 513), (8, 640), (64, 2048)):
        kv = batch * context * 131072
        # Every parameter once in bf16, less the embedding table's rows that are not looked up (all but `batch`).
        expected = params * 2 - (128256 - batch) * 4096 * 2 + kv
        assert llm.decode_step_bytes(cfg, batch, context, 2) == expected


def test_summary_rates_follow_from_the_times():
    cfg = llm.PRESETS["tiny"]
    times = [10.0, 2.0, 4.0, 2.0]  # prefill, then three steps
    r = llm.summarise(cfg, times, batch=2, prompt=5, new=3, dtype_bytes=4)
    total = sum(llm.decode_step_bytes(cfg, 2, c, 4) for c in (6, 7, 8))
    assert r["decode_ms_per_step"] == 2.0 and r["prefill_tokens_per_s"] == pytest.approx(1000.0)
    assert r["decode_tokens_per_s"] == pytest.approx(6 / 0.008)
    assert r["bytes_per_step"] == pytest.approx(total / 3) and r["decode_gbps"] == pytest.approx(total / 0.008 / 1e9)


def test_memory_refusal_says_what_the_run_needs_and_what_the_gpu_has(monkeypatch):
    monkeypatch.setattr(gpuprof.cli, "available_memory", lambda device: 8 * 2**30)
    monkeypatch.setattr(gpuprof.cli, "total_memory", lambda device: 16 * 2**30)
    cfg = llm.PRESETS["8b"]
    with pytest.raises(GpuprofError) as err:
        llm.check_fits(cfg, "8b", 1, 512, 128, "cuda", 2)
    # weights 16,060,522,496 B + KV 640 x 131,072 B + prefill 512 x (3 x 14,336 + 4 x 4,096) x 2 B = 15.1 GiB
    need = (8_030_261_248 * 2 + 640 * 131072 + 512 * (3 * 14336 + 4 * 4096) * 2) / 2**30
    text = str(err.value)
    assert f"would take at least {need:,.1f} GiB of GPU memory" in text and "15.1 GiB" in text
    assert "only 8.0 GiB is available (of 16.0 GiB)" in text and "--batch, --prompt-len or --new-tokens" in text
    monkeypatch.setattr(gpuprof.cli, "available_memory", lambda device: 80 * 2**30)
    llm.check_fits(cfg, "8b", 1, 512, 128, "cuda", 2)  # fits: no error


def test_8b_on_the_cpu_is_refused_with_the_memory_it_would_need():
    with pytest.raises(GpuprofError, match=r"--model 8b needs a GPU: in bfloat16 its weights \(15\.0 GiB\), a KV cache "
                                           r"of 0\.08 GiB for batch 1 x 640 tokens"):
        llm.check_fits(llm.PRESETS["8b"], "8b", 1, 512, 128, "cpu", 4)


def test_a_run_writes_its_results(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert llm.main(["--cpu", "--batch", "1", "--prompt-len", "8", "--new-tokens", "4", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "result checked: the dynamic and static caches generated the same 1 x 5 token ids" in printed
    r = json.loads(out.read_text())
    assert r["tokens_identical"] is True and r["timing"] == "perf_counter" and r["params"] == llm.PRESETS["tiny"].params
    for kind in llm.CACHES:
        assert len(r[kind]["decode_step_ms"]) == 4 and r[kind]["decode_gbps"] > 0
