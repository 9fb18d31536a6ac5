"""examples/nsys/llm_decode.py: the rungs compute the same thing (the two caches to the bit, the fixed-shape step within
the float32 tolerance, with and without torch.compile), the cache computes what a full forward pass does, the check
catches a wrong step and the overwritten-output pitfall, the bytes- and FLOPs-per-step arithmetic for Llama-3-8B's
shapes, and the refusals' sentences."""

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
F32_TOL = llm.TOLERANCE["float32"]


def _model():
    return llm.Decoder(llm.PRESETS["tiny"], torch, "cpu", torch.float32, PROMPT + NEW, seed=0)


def _prompt(cfg):
    return torch.randint(0, cfg.vocab, (BATCH, PROMPT), generator=torch.Generator().manual_seed(1))


def _fixed(model, names=("eager_fixed",)):
    with torch.inference_mode():
        return llm.make_fixed_rungs(list(names), model, BATCH, PROMPT + NEW)


@pytest.fixture(scope="module")
def tiny():
    model = _model()
    prompt = _prompt(model.cfg)
    runs = {name: llm.generate(llm.EagerRung(name, model, BATCH, PROMPT + NEW), prompt, NEW)
            for name in ("eager_dynamic", "eager_static")}
    runs["eager_fixed"] = llm.generate(_fixed(model)["eager_fixed"], prompt, NEW)
    return model, prompt, runs


def test_static_and_dynamic_caches_give_the_same_logits_and_tokens(tiny):
    _, _, runs = tiny
    d, s = runs["eager_dynamic"], runs["eager_static"]
    assert d.ids.shape == (BATCH, NEW + 1, llm.TOPK) and d.values.shape == (BATCH, NEW + 1, llm.TOPK)
    assert torch.equal(d.ids, s.ids)
    assert torch.equal(d.values, s.values)  # float32 on the CPU, the same kernels: equal to the bit
    # The check means something only if the model does not repeat one token: random weights still pick many.
    assert len(set(d.tokens.flatten().tolist())) > NEW


def test_decoding_with_the_cache_equals_a_full_forward_pass_without_one(tiny):
    """Each step's best logits must be what the whole sequence so far, run at once from position 0, gives at its end:
    a wrong rotary position or a stale cache entry changes them by about their own size."""
    model, prompt, runs = tiny
    gen = runs["eager_static"]
    for step in (0, NEW // 2, NEW):
        seq = torch.cat([prompt, gen.tokens[:, :step]], dim=1)
        with torch.inference_mode():
            full = model.forward(seq, llm.DynamicCache(model.cfg.layers), 0)
        values, ids = full.topk(llm.TOPK, dim=-1)
        assert torch.allclose(values, gen.values[:, step], atol=1e-4, rtol=1e-4), step
        assert torch.equal(ids[:, 0], gen.tokens[:, step])


def test_the_fixed_shape_step_matches_the_reference_within_the_float32_tolerance(tiny):
    """The masked whole-cache attention and the device-side position give the reference's tokens, and its logits
    within the tolerance the script states for float32 (a share of the logits' deviation), free-running and fed."""
    model, prompt, runs = tiny
    ref, fixed = runs["eager_static"], runs["eager_fixed"]
    assert torch.equal(ref.tokens, fixed.tokens)
    assert (ref.values - fixed.values).abs().max() <= F32_TOL * ref.logit_std
    forced = llm.generate(_fixed(model)["eager_fixed"], prompt, NEW, force=ref.tokens)
    check = llm.compare(ref, forced, F32_TOL)
    assert check.status == "within bound" and check.ok and check.worst_step_mean <= F32_TOL
    assert check.picks_differ == 0 and check.steps == BATCH * (NEW + 1)
    assert llm.agreement(ref, fixed) == (1.0, None)


def test_a_step_that_hides_each_token_from_itself_fails_the_check(tiny, monkeypatch):
    """A mask off by one (attend to the positions before ``pos``, not up to it) is caught by the float32 check."""
    model, prompt, runs = tiny
    ref = runs["eager_static"]
    rung = _fixed(model)["eager_fixed"]
    positions = rung.fixed.positions
    good = llm.fixed_layer
    rung.fixed.layer = lambda x, w, k, v, pos, mask, *rest: good(x, w, k, v, pos, mask & (positions < pos), *rest)
    check = llm.compare(ref, llm.generate(rung, prompt, NEW, force=ref.tokens), F32_TOL)
    assert check.status == "failed" and not check.ok and check.worst_step_mean > 100 * F32_TOL
    assert "the worst step's mean |difference|" in check.sentence and check.worst_at[1] >= 1  # the prefill is right


def test_kept_output_buffers_without_a_clone_all_show_the_last_step(tiny):
    """The CUDA graph pitfall, with the fixed-shape step's own buffers (a graph's replay writes them the same way):
    references kept without cloning are all overwritten by the last step."""
    model, prompt, runs = tiny
    ref = runs["eager_static"]
    bad = llm.generate(_fixed(model)["eager_fixed"], prompt, NEW, clone=False)
    steps = bad.ids[:, 1:]
    assert all(torch.equal(steps[:, i], steps[:, -1]) for i in range(NEW))
    assert torch.equal(steps[:, -1], ref.ids[:, -1])  # the last step itself is right: only the kept earlier ones are not
    forced = llm.generate(_fixed(model)["eager_fixed"], prompt, NEW, clone=False, force=ref.tokens)
    assert llm.compare(ref, forced, F32_TOL).status == "failed"


def _generation(kept, picks):
    """A synthetic generation: kept logits [sequences, tokens, columns] and the picked ids [sequences, tokens]."""
    kept = torch.as_tensor(kept, dtype=torch.float32)
    ids = torch.as_tensor(picks).unsqueeze(-1).repeat(1, 1, llm.TOPK)
    return llm.Generation(kept.amax(-1, keepdim=True).repeat(1, 1, llm.TOPK), ids, kept, float(kept.std()))


def test_compare_bounds_the_worst_steps_mean_difference_not_the_picks():
    """Rounding-sized differences pass even where the picks differ (a near tie); one step moved by a share of the
    logits' deviation fails, and the check names that step."""
    g = torch.Generator().manual_seed(3)
    base = torch.randn((2, 5, 64), generator=g)
    ref = _generation(base, base.argmax(-1))
    noise = base + 0.01 * base.std() * torch.randn(base.shape, generator=g)
    swapped = base.argmax(-1).clone()
    swapped[1, 3] += 1  # a different pick at one step
    c = llm.compare(ref, _generation(noise, swapped), bound=0.08)
    assert c.status == "within bound" and c.ok and c.picks_differ == 1 and c.steps == 10
    assert 0.005 < c.worst_step_mean < 0.02 and c.max_diff > c.worst_step_mean
    moved = noise.clone()
    moved[1, 2] = torch.randn(64, generator=g)  # one step's logits from another state: about their deviation away
    c = llm.compare(ref, _generation(moved, base.argmax(-1)), bound=0.08)
    assert c.status == "failed" and not c.ok and c.worst_at == (1, 2) and c.worst_step_mean > 0.5
    assert "at [sequence, token] [1, 2]" in c.sentence
    assert llm.compare(ref, ref, bound=0.0).status == "identical"


BF16_BOUND = llm.TOLERANCE["bfloat16"]


@pytest.fixture(scope="module")
def deep_rounding():
    """BF16 rounding's effect on the logits at 8b's depth (32 layers of the small width): the bounds rest on it."""
    return llm.rounding_error(llm.replace(llm.PRESETS["tiny"], layers=32), torch)


def test_the_bfloat16_bound_rests_on_the_measured_rounding_of_8bs_depth(deep_rounding):
    """The bound is twice the difference two BF16 implementations may have (each within the measured BF16-vs-float32
    difference of float32's result) at 8b's 32 layers; the difference grows with the depth."""
    deep = deep_rounding
    shallow = llm.rounding_error(llm.replace(llm.PRESETS["tiny"], layers=2), torch)
    assert 0 < shallow.worst_step_mean < deep.worst_step_mean
    assert 2 * deep.worst_step_mean <= BF16_BOUND <= 5 * deep.worst_step_mean


@pytest.fixture(scope="module")
def bf16_deep():
    """The small configuration at 8b's depth (32 layers) in bfloat16 on the CPU, its reference generated."""
    cfg = llm.replace(llm.PRESETS["tiny"], layers=32)
    model = llm.Decoder(cfg, torch, "cpu", torch.bfloat16, PROMPT + NEW, seed=0)
    prompt = _prompt(cfg)
    ref = llm.generate(llm.EagerRung("eager_static", model, BATCH, PROMPT + NEW), prompt, NEW)
    return model, prompt, ref


def _bf16_check(bf16_deep, layer=None, clone=True):
    model, prompt, ref = bf16_deep
    rung = _fixed(model)["eager_fixed"]
    if layer is not None:
        rung.fixed.layer = layer(rung.fixed)
    return llm.compare(ref, llm.generate(rung, prompt, NEW, clone=clone, force=ref.tokens), BF16_BOUND)


def test_the_bfloat16_check_passes_a_correct_rung_whose_picks_differ_by_rounding(bf16_deep):
    model, prompt, ref = bf16_deep
    c = _bf16_check(bf16_deep)
    assert c.status == "within bound" and c.worst_step_mean < BF16_BOUND / 2
    dynamic = llm.generate(llm.EagerRung("eager_dynamic", model, BATCH, PROMPT + NEW), prompt, NEW, force=ref.tokens)
    assert llm.compare(ref, dynamic, BF16_BOUND).ok


def _kv_written_one_position_late(step):
    size = step.cache.k[0].shape[2]
    return lambda x, w, k, v, pos, mask, *rest: llm.fixed_layer(x, w, k, v, (pos + 1).clamp(max=size - 1), mask, *rest)


def _rotary_one_position_late(step):
    m, last = step.model, step.model.cos.shape[0] - 1

    def layer(x, w, k, v, pos, mask, cos, sin, *rest):
        at = (pos + 1).clamp(max=last)
        return llm.fixed_layer(x, w, k, v, pos, mask, m.cos.index_select(0, at), m.sin.index_select(0, at), *rest)
    return layer


def _hides_each_token_from_itself(step):
    positions = step.positions
    return lambda x, w, k, v, pos, mask, *rest: llm.fixed_layer(x, w, k, v, pos, mask & (positions < pos), *rest)


@pytest.mark.parametrize("bug", [_kv_written_one_position_late, _rotary_one_position_late,
                                 _hides_each_token_from_itself])
def test_the_bfloat16_check_fails_a_step_at_the_wrong_position(bf16_deep, bug):
    c = _bf16_check(bf16_deep, layer=bug)
    assert c.status == "failed" and c.worst_step_mean > 1.5 * BF16_BOUND, c.sentence


def test_the_bfloat16_check_fails_kept_outputs_without_a_clone(bf16_deep):
    c = _bf16_check(bf16_deep, clone=False)
    assert c.status == "failed" and c.worst_step_mean > 5 * BF16_BOUND


class _GraphLike:
    """A stand-in for torch.cuda.CUDAGraph on the CPU: it runs the captured step, but like a real graph it holds no
    reference to it (a graph replays addresses, not objects), so a step nothing else keeps alive is freed, and the
    replay says so instead of reading memory the allocator gave away (what fused_graph did on an H100)."""

    def __init__(self, step):
        import weakref

        self._step = weakref.ref(step)

    def replay(self):
        step = self._step()
        assert step is not None, "the step this graph was captured from was freed: its buffers' memory is no longer the graph's"
        step()


def _graph_like(torch, step, reset, warmup=3):
    reset()
    step()
    return _GraphLike(step)


@pytest.mark.parametrize("name", ["graph", "compile_graph", "fused_graph", "int8_graph"])
def test_every_graph_rung_keeps_the_step_it_replays_alive(tiny, monkeypatch, name):
    """A CUDA graph replays the addresses of the tensors its step read (the mask's positions, the kept columns) and
    holds no reference to them: the rung must. With the compiled layers replaced by the plain ones (the question is
    lifetime, not compilation), each graph rung generates after make_fixed_rungs has returned and a collection has
    run. Before the fix, compile_graph's and fused_graph's steps were freed there (an H100 run read the freed columns
    as indices: a device-side assert in the gather behind index_select). The stand-in checks the step object, which is
    stricter than its tensors: it guards FixedRung.captured, not only shared_buffers' sharing of positions and columns."""
    import gc

    model, prompt, runs = tiny
    monkeypatch.setattr(llm, "capture_graph", _graph_like)
    monkeypatch.setattr(llm, "compiled_layer", lambda torch: llm.fixed_layer)
    monkeypatch.setattr(llm, "tuned_layer", lambda torch, fn=llm.fused_layer: fn)
    rung = _fixed(model, [name])[name]
    gc.collect()
    out = llm.generate(rung, prompt, NEW, force=runs["eager_static"].tokens)
    assert out.kept.shape[1] == NEW + 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ["compile", "fused_graph", "int8_graph"])
def test_the_compiled_step_matches_the_reference_on_the_cpu(tiny, monkeypatch, name):
    """torch.compile of the fixed-shape layer (Inductor's C++ backend on the CPU; tens of seconds to compile here).
    fused_graph's step runs without its graph (a CUDA graph cannot be captured on the CPU: capture_graph is replaced
    by the step itself), built by make_fixed_rungs as on a GPU: the fused layer compiled under coordinate-descent
    tuning, a switch restored after every call (the compile rungs beside it keep the default). int8_graph's the same
    over its int8 copy (its output projection compiled too), within the int8 bound (its weights differ)."""
    from torch._inductor import config as inductor_config

    model, prompt, runs = tiny
    ref = runs["eager_static"]
    monkeypatch.setattr(llm, "capture_graph", _graph_like)
    before = inductor_config.coordinate_descent_tuning
    try:
        rung = _fixed(model, [name])[name]
        assert rung.setup_s > 0 and rung.fixed is not None and inductor_config.coordinate_descent_tuning == before
        forced = llm.generate(rung, prompt, NEW, force=ref.tokens)
        free = llm.generate(rung, prompt, NEW)
    finally:
        torch._dynamo.reset()
    c = llm.compare(ref, forced, llm.check_bound(name, "float32", F32_TOL))
    assert c.ok, c.sentence
    if name in llm.INT8:
        assert rung.fixed.model.layers[0]["wqkv"].dtype == torch.int8 and rung.fixed.model.lm_head.dtype == torch.int8
        assert c.worst_step_mean > F32_TOL  # it did run on the int8 weights
    else:
        assert torch.equal(free.tokens, ref.tokens)
    assert inductor_config.coordinate_descent_tuning == before


def test_the_separate_projections_are_views_of_the_fused_weights():
    """fused_graph's matrices replace the separate ones, not double them: wq, wk, wv are column views of wqkv and gate,
    up of w_gate_up (the same bytes, read by every rung), and the weights' distinct storage is the model's parameter
    count, which decode_step_bytes counts once; a cast keeps the views."""
    for model in (_model(), _model().cast(torch.bfloat16)):
        cfg = model.cfg
        q, kv = cfg.q_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        for w in model.layers:
            assert w["wqkv"].shape == (cfg.d_model, q + 2 * kv) and w["w_gate_up"].shape == (cfg.d_model, 2 * cfg.ffn)
            for name, whole in (("wq", "wqkv"), ("wk", "wqkv"), ("wv", "wqkv"), ("w_gate", "w_gate_up"), ("w_up", "w_gate_up")):
                assert w[name].untyped_storage().data_ptr() == w[whole].untyped_storage().data_ptr(), name
            assert torch.equal(w["wk"], w["wqkv"][:, q:q + kv]) and torch.equal(w["w_up"], w["w_gate_up"][:, cfg.ffn:])
        tensors = [t for w in model.layers for t in w.values()] + [model.embed, model.final_norm, model.lm_head]
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        assert sum(storages.values()) == cfg.params * model.embed.element_size()


def _swap_kv(w, cfg):
    return {**w, "wqkv": torch.cat([w["wq"], w["wv"], w["wk"]], dim=1)}


def _swap_gate_up(w, cfg):
    return {**w, "w_gate_up": torch.cat([w["w_up"], w["w_gate"]], dim=1)}


def _fused_rung(model, mutate=None):
    """eager_fixed's rung running the fused layer (eager: the fusion alone, without compiling), its weights changed by
    ``mutate`` (a wrongly fused matrix) when given."""
    rung = _fixed(model)["eager_fixed"]
    if mutate is not None:
        bad = {id(w): mutate(w, model.cfg) for w in model.layers}
        rung.fixed.layer = lambda x, w, *rest: llm.fused_layer(x, bad[id(w)], *rest)
    else:
        rung.fixed.layer = llm.fused_layer
    return rung


def test_the_fused_products_match_the_reference_and_a_wrong_fusion_fails(tiny):
    """One product by wqkv split into q, k, v (and one by w_gate_up into gate, up) computes what the separate ones do,
    within float32's bound; a fused matrix whose k and v slices are swapped, or whose gate and up are, fails."""
    model, prompt, runs = tiny
    ref = runs["eager_static"]
    good = llm.compare(ref, llm.generate(_fused_rung(model), prompt, NEW, force=ref.tokens), F32_TOL)
    assert good.ok and good.worst_step_mean <= F32_TOL, good.sentence
    for mutate in (_swap_kv, _swap_gate_up):
        bad = llm.compare(ref, llm.generate(_fused_rung(model, mutate), prompt, NEW, force=ref.tokens), F32_TOL)
        assert bad.status == "failed" and bad.worst_step_mean > 100 * F32_TOL, (mutate.__name__, bad.sentence)


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


def test_llama3_8b_flops_per_decode_step_and_per_prefill():
    cfg = llm.PRESETS["8b"]
    # The matrices a token meets: per layer q, k, v, o, gate, up, down; then the output projection (not the
    # embedding table, which is looked up, nor the norms).
    matrices = 32 * (4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 14336) + 4096 * 128256
    assert cfg.matmul_params == matrices == 8_030_261_248 - 128256 * 4096 - (2 * 32 + 1) * 4096
    for batch, context in ((1, 513), (64, 640)):
        attention = 32 * 32 * 128 * context * 4  # per layer and query head: q.K and p.V, 2 FLOPs per multiply-add
        assert llm.decode_step_flops(cfg, batch, context) == batch * (2 * matrices + attention)
    # Prefill of 512 tokens: all of them through the layers, causal attention over 1 + 2 + ... + 512 positions,
    # the output projection for the last one only.
    layers = matrices - 4096 * 128256
    expected = 3 * (2 * 512 * layers + 4 * 32 * 32 * 128 * (512 * 513 // 2) + 2 * 4096 * 128256)
    assert llm.prefill_flops(cfg, 3, 512) == expected


def test_summary_rates_follow_from_the_times():
    cfg = llm.PRESETS["tiny"]
    times = [10.0, 2.0, 4.0, 2.0]  # prefill, then three steps
    r = llm.summarise(cfg, times, batch=2, prompt=5, new=3, dtype_bytes=4)
    total = sum(llm.decode_step_bytes(cfg, 2, c, 4) for c in (6, 7, 8))
    flops = sum(llm.decode_step_flops(cfg, 2, c) for c in (6, 7, 8))
    assert r["decode_ms_per_step"] == 2.0 and r["prefill_tokens_per_s"] == pytest.approx(1000.0)
    assert r["decode_ms_q1"] == 2.0 and r["decode_ms_q3"] == 3.0 and (r["decode_ms_min"], r["decode_ms_max"]) == (2.0, 4.0)
    assert r["decode_tokens_per_s"] == pytest.approx(6 / 0.008)
    assert r["bytes_per_step"] == pytest.approx(total / 3) and r["decode_gbps"] == pytest.approx(total / 0.008 / 1e9)
    assert r["flops_per_step"] == pytest.approx(flops / 3) and r["decode_tflops"] == pytest.approx(flops / 0.008 / 1e12)
    assert r["prefill_tflops"] == pytest.approx(llm.prefill_flops(cfg, 2, 5) / 0.010 / 1e12)


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
    # batch 256 with the fixed rungs' cache beside an eager one: 2 x 256 x 640 x 128 KiB = 40 GiB of caches, beside
    # 15.0 GiB of weights and 14.5 GiB of prefill: more than 60 GiB
    monkeypatch.setattr(gpuprof.cli, "available_memory", lambda device: 60 * 2**30)
    with pytest.raises(GpuprofError, match=r"2 KV caches 40\.00 GiB"):
        llm.check_fits(cfg, "8b", 256, 512, 128, "cuda", 2, caches=2)


def test_8b_on_the_cpu_is_refused_with_the_memory_it_would_need():
    with pytest.raises(GpuprofError, match=r"--model 8b needs a GPU: in bfloat16 its weights \(15\.0 GiB\), a KV cache "
                                           r"of 0\.08 GiB for batch 1 x 640 tokens"):
        llm.check_fits(llm.PRESETS["8b"], "8b", 1, 512, 128, "cpu", 4)


def test_the_command_line_lists():
    args = llm.parse_args(["--batch", "1, 8,64", "--rung", "graph,eager_static"])
    assert args.batch == [1, 8, 64] and args.rung == ["eager_static", "graph"]  # the ladder's order
    assert llm.parse_args(["--rung", "all"]).rung == list(llm.RUNGS)
    assert llm.resolve_rungs(llm.parse_args(["--cache", "both"]), gpu=False) == ["eager_dynamic", "eager_static"]
    assert llm.resolve_rungs(llm.parse_args([]), gpu=False) == list(llm.CPU_DEFAULT)
    assert llm.resolve_rungs(llm.parse_args([]), gpu=True) == list(llm.RUNGS)
    with pytest.raises(GpuprofError, match=r"--rung graph,compile_graph,fused_graph,int8_graph,triton_graph needs a GPU"):
        llm.resolve_rungs(llm.parse_args(["--rung", "all"]), gpu=False)
    for bad in ("1,1", "0", ","):
        with pytest.raises(SystemExit):
            llm.parse_args(["--batch", bad])


def test_a_run_writes_a_row_per_rung_and_batch(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert llm.main(["--cpu", "--batch", "1,3", "--prompt-len", "8", "--new-tokens", "4", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "result checked: every rung's logits against eager_static's at each batch (2 identical, 2 within the bound, " \
        "of 4)" in printed
    r = json.loads(out.read_text())
    assert r["checks_passed"] is True and r["timing"] == "perf_counter" and r["params"] == llm.PRESETS["tiny"].params
    assert [(row["rung"], row["batch"]) for row in r["rows"]] == [(n, b) for b in (1, 3) for n in llm.CPU_DEFAULT]
    for row in r["rows"]:
        assert len(row["decode_step_ms"]) == 4 and row["decode_gbps"] > 0 and row["decode_tflops"] > 0
        assert row["check"]["status"] == {"eager_static": "reference", "eager_dynamic": "identical",
                                          "eager_fixed": "within bound"}[row["rung"]]
        assert row["free_running_tokens_equal"] == 1.0
    assert r["machine"]["device"] == "cpu"


def test_a_run_without_clones_fails_its_check_and_says_why(tmp_path, capsys):
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as exit_:
        llm.main(["--cpu", "--rung", "eager_fixed", "--prompt-len", "8", "--new-tokens", "6", "--no-clone",
                  "--json", str(out)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "result check failed: 1 of 1 (rung, batch) rows differ from eager_static" in err
    assert "Clone a graph's outputs before its next replay" in err
    r = json.loads(out.read_text())  # the numbers are kept even so
    assert r["checks_passed"] is False and r["rows"][0]["outputs_cloned"] is False


# int8_graph: int8 weights with a BF16 scale per output column.

INT8_BOUND = llm.INT8_TOLERANCE


def test_quantize_int8_is_symmetric_per_output_column():
    """One scale per column (max |w| / 127.5, stored in bfloat16), every value within half a step of the weight, the
    column's largest at the edge of int8's range; computed by blocks of columns, the same as all at once."""
    w = torch.randn((64, 40), generator=torch.Generator().manual_seed(5)) * torch.linspace(0.1, 3.0, 40)
    q, scale = llm.quantize_int8(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.bfloat16 and scale.shape == (40,)
    exact = w.abs().amax(dim=0) / 127.5
    assert torch.allclose(scale.float(), exact, rtol=2**-8)
    assert ((q.float() * exact - w).abs() <= exact / 2 + 1e-6).all()
    assert (q.float().abs().amax(dim=0) >= 127).all()  # float: the int8 |-128| overflows
    q3, scale3 = llm.quantize_int8(w, block=3)
    assert torch.equal(q3, q) and torch.equal(scale3, scale)


def test_the_int8_bound_rests_on_the_measured_quantization_error_of_8bs_depth(deep_rounding):
    """The int8 bound (the module's text): twice what an int8 rung and the BF16 reference may differ by (the
    quantization's measured effect, float32 arithmetic, plus each one's BF16 rounding), at 8b's 32 layers; in float32
    twice the quantization's alone. Deeper models are moved more."""
    cfg = llm.replace(llm.PRESETS["tiny"], layers=32)
    deep = llm.quantization_error(cfg, torch).worst_step_mean
    shallow = llm.quantization_error(llm.replace(cfg, layers=2), torch).worst_step_mean
    assert 0 < shallow < deep and deep > deep_rounding.worst_step_mean  # int8 moves the logits more than BF16 rounding
    assert 2 * deep <= INT8_BOUND["float32"] <= 2.5 * deep
    both = deep + 2 * deep_rounding.worst_step_mean
    assert 2 * both <= INT8_BOUND["bfloat16"] <= 2.5 * both
    # What the GPU's check compares, measured on the CPU: the int8 copy in bfloat16 against the BF16 model.
    assert llm.quantization_error(cfg, torch, torch.bfloat16).worst_step_mean < INT8_BOUND["bfloat16"] / 2


def _int8_rung(model, layer=llm.fused_layer):
    """eager_fixed's rung over ``model`` (an int8 copy), running ``layer`` eagerly: int8_graph's step without compiling."""
    rung = _fixed(model)["eager_fixed"]
    rung.fixed.layer = layer
    return rung


def _int8_check(bf16_deep, int8=None, layer=llm.fused_layer, clone=True):
    model, prompt, ref = bf16_deep
    rung = _int8_rung(int8 or model.quantized(), layer)
    return llm.compare(ref, llm.generate(rung, prompt, NEW, clone=clone, force=ref.tokens), INT8_BOUND["bfloat16"])


def test_the_int8_check_passes_a_correct_int8_step(bf16_deep):
    c = _int8_check(bf16_deep)
    assert c.status == "within bound" and c.worst_step_mean < INT8_BOUND["bfloat16"] / 2, c.sentence
    assert c.worst_step_mean > 0.01  # int8's weights move the logits: the check compares different weights


def _kv_swapped(model):
    """k and v's columns (and their scales) swapped in every layer's fused int8 wqkv."""
    int8 = model.quantized()
    for w in int8.layers:
        w["wqkv"] = torch.cat([w["wq"], w["wv"], w["wk"]], dim=1)
        w["wqkv_scale"] = torch.cat([w["wq_scale"], w["wv_scale"], w["wk_scale"]])
    return int8


def _scaled_on_the_wrong_axis(model, monkeypatch):
    """Each int8 value quantized by its row's scale (max |w| of the row: per input channel), the product then scaled
    by the columns' scales: the scale applied on the other axis than the one the values were divided by."""
    right = llm.quantize_int8

    def per_row(w, block=16384):
        s = w.float().abs().amax(dim=1, keepdim=True) / 127.5
        return (w.float() / s).round().clamp(-128, 127).to(torch.int8), right(w, block)[1]
    monkeypatch.setattr(llm, "quantize_int8", per_row)
    return model.quantized()


@pytest.mark.parametrize("bug", ["no clone", "k and v swapped", "scale on the wrong axis"])
def test_the_int8_check_fails_the_bugs_the_bfloat16_check_catches(bf16_deep, monkeypatch, bug):
    model = bf16_deep[0]
    if bug == "no clone":
        c = _int8_check(bf16_deep, clone=False)
    elif bug == "k and v swapped":
        c = _int8_check(bf16_deep, _kv_swapped(model))
    else:
        c = _int8_check(bf16_deep, _scaled_on_the_wrong_axis(model, monkeypatch))
    assert c.status == "failed" and c.worst_step_mean > 3 * INT8_BOUND["bfloat16"], c.sentence


def test_an_int8_copy_holds_every_matrix_as_int8_with_a_scale_per_column():
    """Every layer's stored matrices and the output projection int8, a BF16 scale per output column, the separate
    projections views of the fused int8 matrices with their columns' scales; the rest shared with the model; in bytes
    what int8_weight_bytes counts."""
    model = _model()
    int8, cfg = model.quantized(), model.cfg
    for w, w0 in zip(int8.layers, model.layers):
        for name in llm.MATRICES:
            assert w[name].dtype == torch.int8 and w[f"{name}_scale"].shape == (w[name].shape[1],)
        assert w["wk"].untyped_storage().data_ptr() == w["wqkv"].untyped_storage().data_ptr()
        assert torch.equal(w["w_up_scale"], w["w_gate_up_scale"][cfg.ffn:]) and w["attn_norm"] is w0["attn_norm"]
    assert int8.lm_head.dtype == torch.int8 and int8.lm_head_scale.shape == (cfg.vocab,) and int8.embed is model.embed
    matrices = [t for w in int8.layers for n, t in w.items() if n in llm.MATRICES or n.endswith("_scale")
                and n.removesuffix("_scale") in llm.MATRICES] + [int8.lm_head, int8.lm_head_scale]
    assert sum(t.untyped_storage().nbytes() for t in matrices) == llm.int8_weight_bytes(cfg)
    assert model.lm_head_scale is None and model.layers[0]["wqkv"].dtype == torch.float32  # the model is untouched


def test_llama3_8b_bytes_per_decode_step_with_int8_matrices():
    """int8_graph's step reads each matrix's weights as one byte, plus a BF16 scale per output column; the norms, the
    embedding rows and the KV cache as before: about half of the BF16 step's bytes at batch 1."""
    cfg = llm.PRESETS["8b"]
    matrices = 32 * (4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 14336) + 4096 * 128256
    columns = 32 * ((4096 + 2 * 1024) + 4096 + 2 * 14336 + 4096) + 128256  # qkv, o, gate/up, down; the output's
    norms = (2 * 32 + 1) * 4096
    assert llm.quantized_columns(cfg) == columns == 1_504_512
    assert llm.int8_weight_bytes(cfg) == matrices + 2 * columns
    for batch, context in ((1, 513), (8, 640), (64, 2048)):
        kv = batch * context * 131072
        expected = matrices * 1 + columns * 2 + (norms + batch * 4096) * 2 + kv
        assert llm.decode_step_bytes(cfg, batch, context, 2, matrix_bytes=1) == expected
        assert llm.decode_step_bytes(cfg, batch, context, 2, matrix_bytes=2) == \
            llm.decode_step_bytes(cfg, batch, context, 2) + 2 * columns  # scales counted whenever an element size is given
    bf16, int8 = llm.decode_step_bytes(cfg, 1, 513, 2), llm.decode_step_bytes(cfg, 1, 513, 2, 1)
    assert 0.5 < int8 / bf16 < 0.51
    r = llm.summarise(llm.PRESETS["tiny"], [10.0, 2.0, 2.0], batch=2, prompt=5, new=2, dtype_bytes=4, matrix_bytes=1)
    tiny = llm.PRESETS["tiny"]
    assert r["bytes_per_step"] == pytest.approx(sum(llm.decode_step_bytes(tiny, 2, c, 4, 1) for c in (6, 7)) / 2)


def test_the_memory_check_counts_the_int8_copy_when_int8_graph_is_asked_for(monkeypatch):
    monkeypatch.setattr(gpuprof.cli, "available_memory", lambda device: 20 * 2**30)
    monkeypatch.setattr(gpuprof.cli, "total_memory", lambda device: 80 * 2**30)
    cfg = llm.PRESETS["8b"]
    llm.check_fits(cfg, "8b", 1, 512, 128, "cuda", 2)  # 15.1 GiB without the copy: fits in 20
    with pytest.raises(GpuprofError, match=r"of which int8_graph's int8 copy 7\.0 GiB"):
        llm.check_fits(cfg, "8b", 1, 512, 128, "cuda", 2, int8_copy=True)
    weights, _, _ = llm.memory_needed(cfg, 1, 512, 128, 2, int8_copy=True)
    assert weights == cfg.params * 2 + llm.int8_weight_bytes(cfg)
    assert llm.check_bound("int8_graph", "bfloat16", 0.08) == INT8_BOUND["bfloat16"]
    assert llm.check_bound("fused_graph", "bfloat16", 0.08) == 0.08


def test_an_int8_rows_bytes_say_where_they_hold():
    """int8 matrices are read once a step only where the cast is fused into the product (one row): a row says so, and
    from batch 2 it says its GB/s reads low; BF16 rows count what a step needs, with nothing to add."""
    assert llm.bytes_basis(8, None) == llm.bytes_basis(1, 2) == "what a step needs"
    assert "fused into the product" in llm.bytes_basis(1, 1)
    assert "reads low" in llm.bytes_basis(8, 1) and "reads low" not in llm.bytes_basis(1, 1)
