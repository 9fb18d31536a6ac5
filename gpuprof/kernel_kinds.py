"""Kernels grouped by what they do, from their names: convolution, matrix product, elementwise...

A profile of a framework program holds dozens of kernel names (``sm90_xmma_fprop_implicit_gemm_...``,
``vectorized_elementwise_kernel``, ``multi_tensor_apply_kernel``); a diagnosis asks a coarser
question: how much of the GPU's time went to convolutions, to elementwise work, to the
optimizer. :func:`kernel_kind` answers from the name alone, by the first rule that matches
(order matters: cuDNN's convolutions are implicit GEMMs, so convolution is tested before
matrix product). A name no rule knows is ``other``, never a guess: the tables print it.
The rules cover what PyTorch 2.x launches through cuDNN, cuBLAS, its own ATen kernels and
Triton (torch.compile's fused kernels are named ``triton_...``).
"""

from __future__ import annotations

import re
from typing import overload

import numpy as np
import pandas as pd

__all__ = ["COMMUNICATION_RULE", "is_communication", "KIND_RULES", "kernel_kind", "time_by_kind", "kinds_of_pairs", "PRECISION_RULES", "precision", "time_by_precision",
           "FAST_F32_ATTENTION", "tensor_cores", "matmul_table"]

# Communication: a kernel whose name starts with "nccl", case-insensitive. NCCL names every kernel it
# launches so (ncclDevKernel_AllReduce_Sum_f32_RING_LL, ncclDevKernel_AllGather_RING_LL,
# ncclDevKernel_Broadcast_RING_LL in the course's chapter 8 captures; ncclKernel_... before NCCL 2.19),
# and so does RCCL on AMD GPUs; HTA's rule is the same prefix (is_nccl_kernel: name.startswith("nccl")).
# A prefix, not a substring: a kernel of another library that merely mentions NCCL in its name or
# template arguments is not NCCL's. (gpuprof.torch_profiler.hta_compat keeps HTA's older ^nccl.*Kernel on
# purpose: it reproduces that version's numbers.) The rule is not in KIND_RULES: kernel_kind still files
# NCCL's kernels by their other words (all-reduce under "reduction", all-gather under "indexing / random"),
# and putting it first there would change the report's "Kernels by kind" tables of multi-GPU captures.
COMMUNICATION_RULE: tuple[str, str] = ("communication", r"^nccl")
_COMMUNICATION = re.compile(COMMUNICATION_RULE[1], re.IGNORECASE)


@overload
def is_communication(name: str) -> bool: ...
@overload
def is_communication(name: pd.Series) -> pd.Series: ...
def is_communication(name: str | pd.Series) -> bool | pd.Series:
    """Whether a kernel is communication (NCCL's), by :data:`COMMUNICATION_RULE`; for a Series of
    names, a boolean Series on its index. The one rule for every "is this NCCL?" in gpuprof."""
    if isinstance(name, pd.Series):  # each distinct name matched once: a long capture repeats a few hundred
        from .activity import name_codes

        codes, uniq = name_codes(name)
        hit = np.array([_COMMUNICATION.match(str(u)) is not None for u in uniq], dtype=bool)
        return pd.Series(hit[codes] if len(uniq) else np.zeros(0, dtype=bool), index=name.index)
    return _COMMUNICATION.match(name) is not None


# (kind, pattern searched in the kernel's name, case-insensitive), first match wins.
KIND_RULES: list[tuple[str, str]] = [
    # Communication first: NCCL's all-reduce would otherwise count as a reduction, its all-gather as indexing.
    COMMUNICATION_RULE,
    # Attention first: cuDNN's fused attention kernels are named ..._sdpa_..._flash_fprop_...
    ("attention", r"sdpa|fmha|flash|attention|dot_do_o|convert_dq"),
    ("convolution", r"conv|fprop|dgrad|wgrad|winograd|implicit_gemm|precomputed_convolve|im2col"),
    ("matrix product", r"gemm|cublas|cutlass|matmul|\bmm_|wmma|gemv|splitk|nvjet"),
    ("optimizer", r"multi_tensor_apply|adam|sgd|fused_optim"),
    ("normalisation", r"norm|gammabeta"),
    ("softmax / loss", r"softmax|nll_loss|cross_entropy|log_softmax"),
    ("pooling", r"pool"),
    ("layout change", r"nchwtonhwc|nhwctonchw|transpose|permute|copy_kernel|convert|catarray"),
    ("reduction", r"reduce|sum_kernel|mean_kernel"),
    ("indexing / random", r"index|gather|scatter|randperm|random|distribution|philox|pad|sort|cat_|embedding"),
    ("fused (torch.compile)", r"^triton_"),
    ("elementwise", r"elementwise|unrolled|vectorized|fill"),
]


def kernel_kind(name: str, demangled: str | None = None) -> str:
    """The kind of a kernel named ``name`` (short or demangled), or ``other``.

    Some short names say nothing (CUTLASS's ``Kernel2``, cuBLASLt's ``globalKernel``); where
    the short name matches no rule, the ``demangled`` name (``cutlass::Kernel2<cutlass_80_simt_sgemm_...>``)
    is tried with the same rules.
    """
    for text in (name, demangled):
        if not text:
            continue
        for kind, pattern in KIND_RULES:
            if re.search(pattern, text, flags=re.IGNORECASE):
                return kind
    return "other"


def time_by_kind(kernels: pd.DataFrame, name_column: str = "name", demangled_column: str = "demangled") -> pd.DataFrame:
    """Kernel time per kind: kind, kernels (launches), time_ms, share (of all kernel time), names (distinct).

    The demangled name (``demangled_column``, when the table has it) decides for short names no rule knows.
    """
    if kernels.empty:
        return pd.DataFrame(columns=["kind", "kernels", "time_ms", "share", "names"])
    if pd.api.types.is_integer_dtype(kernels["duration_ns"]):
        # Integer durations: summed per distinct (name, demangled) pair first, each pair classified once, then per
        # kind; integer sums do not depend on their order, so the totals are those of one sum over the rows. A long
        # trace repeats a few hundred names millions of times, and the rules are regular expressions.
        keys = [name_column] + ([demangled_column] if demangled_column in kernels else [])
        g = kernels.groupby(keys, sort=False, dropna=False)["duration_ns"]
        return kinds_of_pairs(pd.DataFrame({"n": g.size(), "t": g.sum()}).reset_index(), name_column, demangled_column)
    else:  # float durations: one sum over the rows, in their order, as always
        names = kernels[name_column].tolist()
        demangled = kernels[demangled_column].tolist() if demangled_column in kernels else [None] * len(names)
        seen: dict[tuple, str] = {}
        kinds = [seen[p] if p in seen else seen.setdefault(p, kernel_kind(*p)) for p in zip(names, demangled)]
        out = (kernels.assign(kind=kinds).groupby("kind").agg(kernels=("duration_ns", "size"), time_ms=("duration_ns", "sum"),
                                                              names=(name_column, "nunique")).reset_index())
    return _kind_table(out)


def kinds_of_pairs(pairs: pd.DataFrame, name_column: str = "name", demangled_column: str = "demangled") -> pd.DataFrame:
    """:func:`time_by_kind` from one row per distinct (name, demangled) pair with its kernel count ``n`` and
    integer total time ``t`` (ns): what an SQL ``GROUP BY`` of an export gives without reading its rows."""
    dem = pairs[demangled_column] if demangled_column in pairs else [None] * len(pairs)
    pairs = pairs.assign(kind=[kernel_kind(n, d) for n, d in zip(pairs[name_column], dem)])
    return _kind_table(pairs.groupby("kind").agg(kernels=("n", "sum"), time_ms=("t", "sum"),
                                                 names=(name_column, "nunique")).reset_index())


def _kind_table(out: pd.DataFrame) -> pd.DataFrame:
    out["time_ms"] = out["time_ms"] / 1e6
    out["share"] = out["time_ms"] / out["time_ms"].sum()
    return out.sort_values("time_ms", ascending=False, ignore_index=True)[["kind", "kernels", "time_ms", "share", "names"]]


# The arithmetic a GEMM or convolution kernel does, as cuDNN, cuBLAS and CUTLASS spell it in the name
# (first match wins; searched in the demangled name, case-insensitive). A name that says nothing is
# "unknown", never a guess: cuBLAS's helper kernels (split-K reductions, epilogues) do little arithmetic.
PRECISION_RULES: list[tuple[str, str]] = [
    ("fp8", r"e4m3|e5m2|fp8"),
    ("bf16", r"bf16|bfloat16"),
    ("tf32", r"tf32"),
    ("fp16", r"f16|fp16|half|h884|h1688|h16816"),
    ("fp32", r"f32f32_f32f32|sgemm|ffma|_simt_|<float[,>]"),
]


def precision(name: str) -> str:
    """The arithmetic a kernel's name says it does: fp8, bf16, tf32, fp16, fp32 or unknown.

    ``sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_...`` takes FP32 tensors and multiplies on
    TF32 tensor cores; ``..._f32f32_f32f32_..._ffma_...`` and ``sgemm_*`` multiply in FP32 on
    the CUDA cores. What PyTorch *allows* (``torch.backends.cudnn.allow_tf32``,
    ``torch.backends.cuda.matmul.allow_tf32``) is not what the library *chose*: the name is.
    """
    for label, pattern in PRECISION_RULES:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return label
    return "unknown"


def time_by_precision(kernels: pd.DataFrame, kinds: tuple[str, ...] = ("convolution", "matrix product")) -> pd.DataFrame:
    """Kernel time of the given kinds split by :func:`precision`: kind, precision, kernels, time_ms,
    share (of that kind's time)."""
    cols = ["kind", "precision", "kernels", "time_ms", "share"]
    if kernels.empty:
        return pd.DataFrame(columns=cols)
    full = kernels["demangled"] if "demangled" in kernels else kernels["name"]
    k = kernels.assign(kind=[kernel_kind(n, d) for n, d in zip(kernels["name"], full)],
                       precision=[precision(str(d)) for d in full])
    k = k[k["kind"].isin(kinds)]
    out = k.groupby(["kind", "precision"]).agg(kernels=("duration_ns", "size"), time_ms=("duration_ns", "sum")).reset_index()
    out["time_ms"] = out["time_ms"] / 1e6
    out["share"] = out["time_ms"] / out.groupby("kind")["time_ms"].transform("sum")
    return out.sort_values(["kind", "time_ms"], ascending=[True, False], ignore_index=True)[cols]


# PyTorch's memory-efficient attention on FP32 inputs, built for sm80 and later (it runs on Hopper too:
# ``fmha_cutlassF_f32_aligned_64x64_rf_sm80``, ``fmha_cutlassB_f32_..._sm80``). Its name says f32, yet in
# pytorch/pytorch aten/src/ATen/native/transformers/cuda/mem_eff_attention/gemm_kernel_utils.h,
# ``DefaultGemmType<ArchTag, float>`` for ``ArchTag::kMinComputeCapability >= 80`` is ``OpClassTensorOp``
# with ``InstructionShape 16x8x8`` and ``Operator OpMultiplyAddFastF32``, which CUTLASS's cutlass/arch/mma.h
# defines as "the input is converted to 2 (big and small) TF32 components / Perform 3xTF32 or 4xTF32 for
# every F32 output element": tensor cores, near-FP32 accuracy, and untouched by the TF32 switches.
# (Before sm80 the same file falls back to OpClassSimt, FMA on the CUDA cores: those names end in sm50/70/75.)
FAST_F32_ATTENTION = r"fmha_cutlass[fb]_f32_\w*_sm(8\d|9\d|1\d\d)\b"


def tensor_cores(name: str, demangled: str = "") -> str:
    """Whether a matrix-product kernel's name says it runs on tensor cores, and with what inputs.

    From the names cuBLAS, CUTLASS and cuDNN give their kernels: ``ffma``/``simt``/``sgemm``
    are FP32 fused multiply-adds on the CUDA cores; ``nvjet``/``wgmma``/``tensorop``/``s1688``...
    are tensor-core kernels; ``bf16``/``f16``/``tf32`` name the input type where the name has it.
    PyTorch's FP32 memory-efficient attention for sm80+ (``fmha_cutlass*_f32_*_sm80``) is ``yes (3xTF32)``:
    see :data:`FAST_F32_ATTENTION` for the source that says so.
    """
    text = f"{name} {demangled}".lower()
    if re.search(FAST_F32_ATTENTION, text):
        return "yes (3xTF32)"
    if re.search(r"ffma|simt|sgemm", text):
        return "no: FP32 on CUDA cores"
    kind = next((t for t in ("bf16", "tf32", "f16") if t in text), None)
    if re.search(r"nvjet|wgmma|gmma|tensorop|hmma|\d{5}gemm|s1688|s16816|h16816|xmma", text):
        return f"yes ({kind})" if kind else "yes"
    return "unknown from the name"


def matmul_table(kernels: pd.DataFrame, steps: int) -> pd.DataFrame:
    """The matrix-product and attention kernels among ``kernels`` (name, demangled, duration_ns), recorded over
    ``steps`` steps: per step count and time, and whether each runs on tensor cores (:func:`tensor_cores`)."""
    if kernels.empty:
        return pd.DataFrame(columns=["kernel", "kind", "per_step", "ms_per_step", "tensor_cores"])
    hits = kernels.assign(kind=[kernel_kind(a, b) for a, b in zip(kernels["name"], kernels["demangled"])])
    mm = hits[hits["kind"].isin(["matrix product", "attention"])]
    g = mm.groupby(["name", "kind"]).agg(per_step=("duration_ns", "size"), ms=("duration_ns", "sum"),
                                         demangled=("demangled", "first")).reset_index()
    g["per_step"] /= max(steps, 1)
    g["ms_per_step"] = g.pop("ms") / 1e6 / max(steps, 1)
    g["tensor_cores"] = [tensor_cores(a, b) for a, b in zip(g["name"], g["demangled"])]
    g = g.rename(columns={"name": "kernel"}).drop(columns="demangled")
    return g.sort_values("ms_per_step", ascending=False, ignore_index=True)
