"""Chapter 6's CNN step under PyTorch's FP32 switches: the run, and what its kernels say.

``examples/nsys/cnn_precision.py`` captures the step (forward, backward, fused Adam) of the
chapter's model as a CUDA graph under each arithmetic variant (TF32 nowhere, PyTorch's
defaults, TF32 everywhere, bf16 autocast) in both layouts, times the graphs in turn, and
records one replay's kernels with the ATen operator that launches each. This module runs
it (:func:`run_study`) and turns its JSON into the chapter's table (:func:`variant_table`).

Why the operator and not the kernel's name: with TF32 off, cuDNN runs some convolutions as
FFTs and Winograd transforms around plain GEMM kernels (``..._cf32cf32_...``, a complex
GEMM; ``cutlass_80_simt_sgemm_...``), which :func:`gpuprof.kernel_kinds.kernel_kind` can only
call "matrix product" by their names. The operator that launched them (``aten::cudnn_convolution``,
``aten::convolution_backward``) says they are the convolutions' work; the Linear layer's
products come from ``aten::addmm`` and ``aten::mm``.
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from ..artifacts import REPO_ROOT, FoundCapture
from ..kernel_kinds import kernel_kind, precision

__all__ = ["SCRIPT", "run_study", "layer_of", "kernel_table", "variant_table"]

SCRIPT = REPO_ROOT / "examples" / "nsys" / "cnn_precision.py"
LAYER_RULES = (("convolution", r"conv"), ("linear", r"^aten::(addmm|mm|linear|matmul)$"))


def run_study(chapter: str, filename: str = "precision.json") -> FoundCapture:
    """Run the script on this machine's GPU into ``<chapter>/<filename>``, or give the course's reference."""
    from ..script_results import run_for_json

    return run_for_json(chapter, filename, SCRIPT, [], timeout_s=300)


def layer_of(op: str | None) -> str:
    """The model's part an ATen operator belongs to: convolution, linear, other, or unattributed (no operator)."""
    if op is None or (isinstance(op, float) and op != op):
        return "unattributed"
    for layer, pattern in LAYER_RULES:
        if re.search(pattern, op):
            return layer
    return "other"


def kernel_table(variant: dict[str, Any]) -> pd.DataFrame:
    """One replay's kernels of one variant: name, launches, total_us, op, layer, precision.

    ``precision`` is what the name says (:func:`gpuprof.kernel_kinds.precision`), except for the
    layout changes cuDNN adds inside a convolution (``nchwToNhwcKernel``...): they copy, they do
    not multiply, so their precision is "layout change".
    """
    k = pd.DataFrame(variant["kernels"], columns=["name", "launches", "total_us", "op"])
    prec = ["layout change" if kernel_kind(str(n)) == "layout change" else precision(str(n)) for n in k["name"]]
    return k.assign(layer=[layer_of(o) for o in k["op"]], precision=prec)


def variant_table(data: dict[str, Any]) -> pd.DataFrame:
    """Per variant (arithmetic, layout): the timed step and what one replay's kernels did.

    ``ms_per_step`` is the median of the rounds, ``low``/``high`` their range; ``vs_default``
    the step's time over PyTorch's defaults' in the same layout (above 1: slower).
    ``conv_ms`` and ``linear_ms`` are the replay's kernel time in the convolutions and in the
    Linear layer; ``conv_tf32``, ``conv_fp32``, ``conv_bf16`` the shares of the convolutions' time
    in kernels whose names say that arithmetic (the rest: cuDNN's layout changes and workspace set-up);
    ``linear_precision`` the arithmetic the Linear layer's kernels name, by time.
    """
    rows = []
    for v in data["variants"]:
        k = kernel_table(v)
        conv = k[k["layer"] == "convolution"]
        lin = k[k["layer"] == "linear"]
        conv_us = float(conv["total_us"].sum())
        by_prec = conv.groupby("precision")["total_us"].sum()
        lin_prec = lin.groupby("precision")["total_us"].sum().sort_values(ascending=False)
        rows.append({"arithmetic": v["arithmetic"], "layout": v["layout"], "ms_per_step": v["ms_per_step"],
                     "low": min(v["round_ms"]), "high": max(v["round_ms"]),
                     "kernel_ms": float(k["total_us"].sum()) / 1e3, "conv_ms": conv_us / 1e3,
                     **{f"conv_{p}": float(by_prec.get(p, 0.0)) / conv_us if conv_us else 0.0
                        for p in ("tf32", "fp32", "bf16")},
                     "linear_ms": float(lin["total_us"].sum()) / 1e3,
                     "linear_precision": "+".join(p for p in lin_prec.index if p != "unknown") or "none",
                     "unattributed_ms": float(k.loc[k["layer"] == "unattributed", "total_us"].sum()) / 1e3})
    out = pd.DataFrame(rows).set_index(["arithmetic", "layout"])
    default = out.xs("default", level="arithmetic")["ms_per_step"] if "default" in out.index.get_level_values(0) else None
    if default is not None:
        out["vs_default"] = [ms / default[lay] for (_, lay), ms in out["ms_per_step"].items()]
    return out
