"""triton_graph's kernels (examples/nsys/decode_triton.py) against the fixed-shape step they replace.

The kernels run on the CPU under Triton's interpreter (TRITON_INTERPRET=1) where Triton is installed; the course's CI
installs torch's CPU build without Triton, so there these tests skip and the GPU runs' logit check (llm_decode.py,
bound 0.08) is what checks the rung. Batch 1 only: the interpreter computes bfloat16 tl.dot wrongly (numpy has no
bfloat16; seen with Triton 3.6), so the tensor-core path of several rows is checked on the GPU only. Triton 3.6.0's
interpreter also fails under numpy 2.4 (``int()`` of a one-element array in its ``__index__``); the passing run of
2026-11-27 used a copy patched to ``.item()``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpuprof.artifacts import REPO_ROOT  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402
from gpuprof.runner import load_script  # noqa: E402

llm = load_script(REPO_ROOT / "examples" / "nsys" / "llm_decode.py")


def test_the_rung_refuses_float32_before_needing_triton():
    cfg = llm.PRESETS["tiny"]
    model = llm.Decoder(cfg, torch, "cpu", torch.float32, 16)
    cache = llm.StaticCache(cfg, torch, 1, 16, "cpu", torch.float32)
    with pytest.raises(GpuprofError, match="written for bfloat16 weights"):
        llm.TritonStep(model, cache, 1)


@pytest.mark.parametrize("chunk", [64, 32, 4])
def test_the_kernels_match_the_fixed_step_under_the_interpreter(monkeypatch, chunk):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    import sys
    sys.path.insert(0, str(REPO_ROOT / "examples" / "nsys"))
    try:
        import decode_triton as dt
    finally:
        sys.path.pop(0)
    cfg = llm.PRESETS["tiny"]
    model = llm.Decoder(cfg, torch, "cpu", torch.bfloat16, 256)
    cache = llm.StaticCache(cfg, torch, 1, 200, "cpu", torch.bfloat16)
    step = llm.FixedStep(model, cache, 1)
    monkeypatch.setattr(dt.TritonLayers, "CHUNK", chunk)  # 4, 7 or 50 chunks: attend_combine merges 50 in two blocks of 32
    kernels = dt.TritonLayers(model, cache, 1)
    split, whole = dt.Tile(32, 32, 2, 4, 3), dt.Tile(16, 16, 1, 4, 3)
    kernels.tiles = {"qkv": split, "o": split, "gate_up": whole, "down": whole, "head": dt.Tile(32, 32, 1, 4, 3)}
    prompt = torch.randint(0, cfg.vocab, (1, 150), generator=torch.Generator().manual_seed(0))
    model.forward(prompt, cache, 0)
    step.tokens.copy_(prompt[:, -1:])
    step.pos.fill_(150)
    saved = [(k.clone(), v.clone()) for k, v in zip(cache.k, cache.v)]
    ref = step.logits().float()
    ref_k = [k[:, :, 150].float().clone() for k in cache.k]
    for (k, v), kc, vc in zip(saved, cache.k, cache.v):
        kc.copy_(k)
        vc.copy_(v)
    got = kernels.forward(step.tokens, step.pos).float()
    share = ((got - ref).abs().mean() / ref.std()).item()
    # measured 0.011 (2026-11-27, Triton 3.6 interpreter): rounding only; a wrong mask or chunk moves it past 0.5
    assert share < 0.03, share
    # the new key was written at pos in every layer, as the reference step writes it (rounding apart)
    for k, want in zip(cache.k, ref_k):
        assert ((k[:, :, 150].float() - want).abs().mean() / want.std()).item() < 0.03
