"""Chapter 6's precision study: kernels split by the operator that launched them, on a made-up run with known
answers, and on the stored GPU reference."""

import json

import pytest

from gpuprof.artifacts import REPO_ROOT
from gpuprof.runner import load_script
from gpuprof.studies import cnn_precision as cp

REF = REPO_ROOT / "artifacts" / "ch06" / "precision.json"


def variant(arithmetic, layout, ms, kernels):
    return {"arithmetic": arithmetic, "layout": layout, "round_ms": [ms * 0.99, ms, ms * 1.01], "ms_per_step": ms,
            "kernels": [{"name": n, "launches": 1, "total_us": us, "op": op} for n, us, op in kernels]}


MADE_UP = {"variants": [
    # TF32 off: an FFT convolution's complex GEMM, named like a matrix product, launched by a convolution
    variant("fp32", "nchw", 6.0, [("sm80_xmma_gemm_cf32cf32_f32f32_cf32_tn_n_ffma", 300.0, "aten::cudnn_convolution"),
                                  ("void fft2d_r2c_32x32<float>", 100.0, "aten::convolution_backward"),
                                  ("sm80_xmma_gemm_f32f32_f32f32_f32_nt_n_ffma", 50.0, "aten::mm"),
                                  ("max_pool_backward_nchw<float>", 400.0, "aten::max_pool2d_with_indices_backward")]),
    variant("default", "nchw", 4.0, [("sm90_xmma_dgrad_implicit_gemm_f32f32_tf32f32_f32", 150.0, "aten::convolution_backward"),
                                     ("void cudnn::engines_precompiled::nchwToNhwcKernel<float>", 50.0, "aten::cudnn_convolution"),
                                     ("sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nchwkcrs", 100.0, "aten::cudnn_convolution"),
                                     ("sm80_xmma_gemm_f32f32_f32f32_f32_nt_n_ffma", 50.0, "aten::mm"),
                                     ("memset32", 1.0, None)]),
]}


def test_layers_come_from_the_launching_operator_not_the_kernel_name():
    assert cp.layer_of("aten::cudnn_convolution") == cp.layer_of("aten::convolution_backward") == "convolution"
    assert cp.layer_of("aten::addmm") == cp.layer_of("aten::mm") == "linear"
    assert cp.layer_of("aten::max_pool2d_with_indices_backward") == "other"
    assert cp.layer_of(None) == cp.layer_of(float("nan")) == "unattributed"
    k = cp.kernel_table(MADE_UP["variants"][0]).set_index("name")
    assert k.loc["sm80_xmma_gemm_cf32cf32_f32f32_cf32_tn_n_ffma", "layer"] == "convolution"


def test_variant_table_on_known_numbers():
    t = cp.variant_table(MADE_UP)
    fp32, default = t.loc[("fp32", "nchw")], t.loc[("default", "nchw")]
    assert fp32["vs_default"] == pytest.approx(1.5) and default["vs_default"] == 1.0
    assert fp32["conv_ms"] == pytest.approx(0.4) and fp32["conv_fp32"] == 1.0 and fp32["linear_ms"] == pytest.approx(0.05)
    # the layout change copies, it does not multiply: it is in conv_ms but in none of the arithmetic shares
    assert default["conv_ms"] == pytest.approx(0.3)
    assert default["conv_tf32"] == pytest.approx(0.5) and default["conv_fp32"] == pytest.approx(1 / 3)
    assert default["linear_precision"] == "fp32" and default["unattributed_ms"] == pytest.approx(0.001)
    assert (fp32["low"], fp32["high"]) == (pytest.approx(5.94), pytest.approx(6.06))


def test_stored_reference_every_kernel_attributed_and_the_switches_do_what_they_say():
    data = json.loads(REF.read_text())
    t = cp.variant_table(data)
    script = load_script(cp.SCRIPT)
    assert set(t.index) == {(a, lay) for a in script.ARITHMETIC for lay in script.LAYOUTS}
    assert (t["unattributed_ms"] < 0.01 * t["kernel_ms"]).all()  # the eager step ran the graph's kernels
    assert (t.loc["fp32", "conv_tf32"] == 0).all() and (t.loc["default", "conv_tf32"] > 0).all()
    assert "tf32" in set(t.loc["tf32", "linear_precision"].str.split("+").sum())
    assert not (t.loc["default", "linear_precision"].str.contains("tf32")).any()
    # the profiled replay's kernel time agrees with the timed step's (the graph holds all the step's work)
    assert ((t["kernel_ms"] / t["ms_per_step"]).between(0.9, 1.1)).all()
