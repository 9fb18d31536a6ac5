#!/usr/bin/env python3
"""Generate tokens with a decoder-only transformer: a prompt's prefill, then greedy decoding steps, rung by rung.

The model has Llama-3-8B's shapes (``--model 8b``: 32 layers, width 4096, 32 query heads sharing
8 key/value heads (grouped-query attention), head dim 128, SwiGLU MLP 14336, vocabulary 128,256,
RMSNorm, rotary embeddings) and random BF16 weights drawn on the GPU from a seeded generator: no
download, and the same arithmetic and memory traffic as the real model. ``--model tiny`` is the same
code at a size a CPU runs in seconds.

Prefill runs the ``--prompt-len`` prompt of each of the batch's sequences through every layer at
once (large matrix products); each of the ``--new-tokens`` decoding steps then reads every weight
to produce one token per sequence. The same generation is run by each rung of a ladder (``--rung``):

  eager_dynamic  the naive loop: each step grows every layer's keys and values with torch.cat,
                 which copies the whole cache (allocate, copy, free) every step
  eager_static   a KV cache preallocated for prompt + new tokens, written in place (index_copy_)
                 and read as a slice of the filled length; the reference the others are checked against
  eager_fixed    a decoding step whose shapes never change: the token ids and the position live in
                 device buffers, the step attends over the whole preallocated cache under a length
                 mask, and writes its outputs into buffers of its own. Eager, so its cost beside
                 eager_static is the price of the fixed shapes (it reads the whole cache every step)
  compile        that step with its layer under torch.compile (the default mode: TorchInductor fuses
                 the elementwise work; kernels are still launched one by one). One layer compiled and
                 reused by all 32 ("regional compilation", PyTorch's recipe for stacks of equal
                 layers), so compiling takes one layer's time
  graph          the eager fixed-shape step captured once in a torch.cuda.CUDAGraph and replayed:
                 one launch per step (a GPU only)
  compile_graph  the compiled step captured in a CUDA graph: the fusion and one launch per step
                 (a GPU only)
  fused_graph    compile_graph with the weights a decode loop streams faster at batch 1 (a GPU only):
                 the q, k and v projections as ONE matrix product ([width, (q + 2 kv) heads x head_dim])
                 and gate and up as ONE ([width, 2 x mlp]), so a layer runs 4 matrix-vector products, not
                 7; compiled with Inductor's coordinate-descent tuning on (for this rung only: set around
                 its compilation and restored), as gpt-fast's generate.py does. With that switch Inductor
                 turns a matrix product with one row into a multiply-and-sum it generates and tunes itself
                 (torch/_inductor/decomposition.py's mm: "our matrix vector multiplies only achieve peak
                 bandwidth with coordinate descent tuning"), instead of calling cuBLAS. gpt-fast's model.py
                 fuses q/k/v the same way (one wqkv, split after the product) and keeps gate and up apart;
                 fusing those too is this rung's own step
  int8_graph     fused_graph's step with every layer's matrices and the output projection stored as int8, one
                 BF16 scale per output column (symmetric, per channel: gpt-fast's quantize.py,
                 dynamically_quantize_per_channel and WeightOnlyInt8Linear, whose product is
                 (x @ w_int8.to(x.dtype)) * scale, as here), so a step reads about half the bytes (a GPU only).
                 The layer and the output projection are compiled with the same scoped coordinate-descent
                 tuning, and captured in a CUDA graph. The mechanism that should make the bytes count: with
                 one row, Inductor's mm decomposition (the source above) turns the product into a
                 multiply-and-sum it generates, into which the cast and the scale can fuse, so the int8
                 matrix is read once and no BF16 copy is written. That is how the sources read, gpt-fast
                 relying on torch.compile rather than a kernel of its own; whether Inductor does fuse them
                 here is unmeasured (the ncu step of scripts/capture_ch12.py profiles its kernels). The same
                 source decomposes only a product with ONE row (batch 1): at batch 8 and 64 the product goes
                 to a matrix-multiply kernel, and the cast is then expected to be a kernel of its own that
                 writes a BF16 copy of each matrix every step (more bytes than fused_graph's, unmeasured).
                 The int8 copy (8b: 7.5 GB, beside the 16 GB of BF16 weights the other rungs and the check's
                 reference use) is made at this rung's setup and released after each batch; its prefill runs
                 on the int8 weights too, eagerly (the cast then writes a BF16 copy per matrix: prefill is
                 bound by arithmetic, not by these bytes). Quantizing fused wqkv and w_gate_up whole gives the
                 same int8 values and scales as quantizing q, k, v, gate and up apart (each column its own)
  triton_graph   the step as kernels of our own, written in Triton (gpuprof/studies/decode_triton.py; a GPU with Triton only): six per
                 layer, the four matrix-vector products (qkv, o and down split over K where that is faster, their
                 sums added atomically, so the residual add is free), split attention in two, and every norm, rotary embedding,
                 cache write and SiLU inside one of those; tile sizes timed at setup over the model's own matrices.
                 The same BF16 weights and static cache as the other rungs; checked like them

Why a hand-made graph rather than torch.compile(mode="reduce-overhead"): that mode captures CUDA graphs
of its own, so the ladder could not tell the fusion's gain from the launches' (compile and graph
measure each alone, compile_graph both), and a graph needs fixed memory addresses and no host
synchronisation, which the fixed-shape step provides by construction (PyTorch's "CUDAGraph Trees" notes).

A graph's outputs are its buffers: each replay overwrites them. The loop therefore clones a step's
outputs before the next replay; ``--no-clone`` keeps references instead, and every kept step then
shows the last step's tokens (the check below fails and says why). The fixed-shape rungs without a
graph write into the same buffers, so the pitfall shows on a CPU too.

Every rung is checked against eager_static at the same batch (``--no-check`` skips it). The check compares
logits, not tokens. With random weights the logits are nearly flat (the best few of 128,256 lie within a
BF16 rounding step of each other), so two correct BF16 rungs pick different tokens wherever their
rounding differs (the first H100 run, 2026-11-27: picks "not among the other's best 4" at batch 8 and
up), and from there free-running sequences part for good. So eager_static is generated first (untimed,
its warm-up), each other rung's first warm-up is fed eager_static's tokens ("teacher forcing"), and every
step keeps its logits at evenly spaced columns of the vocabulary, at most 4,096 (KEPT_COLUMNS: every
32nd of 8b's 128,256, so 4,008; all of a smaller one). The statistic: per step of each sequence,
the mean |difference| from the reference's kept logits, as a share of their standard deviation; the worst step must stay within the bound (TOLERANCE). A mean
over a step's columns, not the largest single difference: the largest grows with how many values are
compared (a batch of 1,024 compares 10^4 times more than batch 1), the mean does not.

The bound for bfloat16 is measured, not chosen (:func:`rounding_error`, tests/test_llm_decode.py): the
same BF16 weights run in bfloat16 and in float32 on the CPU differ by 0.020 of the logits' deviation at
the worst step with 32 layers (the small configuration deepened to 8b's depth). It grows about as the
square root of the depth (0.004 at 1 layer, 0.011 at 8, 0.026 at 64) and does not change with the width
(widths 256, 1,024 and 4,096 agree at equal depth), so 8b's 32 layers are measured by it. Two correct
BF16 rungs each differ from float32 by about that much, so from each other by at most twice it; the
bound, 0.08, is twice that again, for the GPU's other kernels. What it catches, measured on the CPU in
bfloat16 at 32 layers and short contexts (16-28 tokens): the graph's kept outputs without a clone
(``--no-clone``: 0.8-1.2), the new key and value written one position off (0.19-0.26), each token
hidden from itself (0.21-0.25), rotary embeddings one position off (0.18); correct rungs 0.02. A
mistake at one position of the context is diluted by the context's length (random weights spread the
attention over every position): at 256 tokens those one-position bugs moved the logits by 0.024, no more
than rounding, so BF16 cannot see them there; float32 can (bound 1e-4, the CPU tests). A stale or
overwritten output moves every logit at any context. The timed generations run free; the share of
their tokens equal to the reference's is printed too.

An int8 rung's weights are not the reference's, so its logits differ by more than rounding; its bound
(INT8_TOLERANCE) is measured the same way (:func:`quantization_error`, tests/test_llm_decode.py): the same
BF16 weights and their int8 copy, both run in float32 on the CPU at 32 layers of the small width, differ
by 0.041 of the logits' deviation at the worst step (0.014 at 2 layers, 0.024 at 8; at 8 layers, widths
256, 1,024 and 4,096 give 0.024, 0.024 and 0.023). The int8 rung differs from the float32 result of the
BF16 weights by at most that and its own rounding (0.020), the BF16 reference by its rounding, so the two
by at most 0.041 + 2 x 0.020 = 0.081; the bound, 0.17, is twice that, rounded up (in float32, where only
the weights differ: 0.09, twice 0.041 rounded up). Measured in bfloat16 on the CPU, the int8 copy against
the BF16 reference gives 0.048. What it catches, measured there (int8 weights, the fixed-shape step,
32 layers, 24 + 12 tokens): kept outputs without a clone 0.86, k and v swapped in wqkv 0.68, int8 values
quantized per row but scaled per column 0.70; a correct int8 step 0.044. What it does not: the new key
and value written one position late moved the logits by 0.14 there, under 0.17. The rungs that share the
fixed-shape layer's code with BF16 weights are checked at 0.08, which catches that (0.19-0.26).

Printed per (rung, batch): prefill ms and TFLOP/s, decode ms per step (median, quartiles), tokens per
second, the bytes and FLOPs a decoding step needs (the weights it uses, the KV cache it attends over)
and the rates they imply. Compare those with the GPU's measured copy bandwidth and matrix-product
rate: decode at small batch is bound by memory, and a loop far below it is bound by something else
(the CPU launching kernels).

NVTX ranges: setup (compiling, capturing), warmup, rung_<RUNG>_b<BATCH> around each timed generation,
prefill and decode_step_N inside it. Per batch, the timed generations sit between cudaProfilerStart
and cudaProfilerStop, so nsys records the first batch's (give one --batch per capture):

  nsys profile --trace=cuda,nvtx --capture-range=cudaProfilerApi --capture-range-end=stop \\
      --cuda-graph-trace=node -o decode python examples/nsys/llm_decode.py --model 8b --batch 1 --new-tokens 32

Examples:
  python examples/nsys/llm_decode.py                            # tiny on a CPU, 8b on a GPU
  python examples/nsys/llm_decode.py --model 8b --batch 1,8,64 --json r.json
  python examples/nsys/llm_decode.py --model 8b --rung graph --batch 1 --new-tokens 16 --no-clone

Without a GPU the tiny model runs on the CPU (float32, perf_counter timings that mean nothing for a
GPU; the rungs eager_dynamic, eager_static and eager_fixed by default, compile when asked);
``--model 8b`` there is refused with the memory it would need.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.backend import torch_device  # noqa: E402
from gpuprof.cli import bounded_int, distinct_ints, output_file, positive_int, require_memory  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402
from gpuprof.kernels import write_json  # noqa: E402
from gpuprof.models import rms_norm  # noqa: E402
from gpuprof.ranges import annotate  # noqa: E402
from gpuprof.timing import Clock  # noqa: E402

RUNGS = {
    "eager_dynamic": "eager, torch.cat KV cache",
    "eager_static": "eager, preallocated KV cache (the reference)",
    "eager_fixed": "eager, fixed-shape step (whole cache under a mask)",
    "compile": "fixed-shape step, layer under torch.compile",
    "graph": "fixed-shape step in a CUDA graph",
    "compile_graph": "compiled fixed-shape step in a CUDA graph",
    "fused_graph": "fused q/k/v and gate/up products, compiled with coordinate-descent tuning, in a CUDA graph",
    "int8_graph": "fused_graph with int8 weights (a BF16 scale per output column), the cast compiled in, in a CUDA graph",
    "triton_graph": "six kernels of our own per layer (Triton: norms, residual adds, rotary embedding, SiLU fused in), in a CUDA graph",
}
REFERENCE = "eager_static"
FIXED = ("eager_fixed", "compile", "graph", "compile_graph", "fused_graph", "int8_graph", "triton_graph")  # fixed-shape step
NEEDS_GPU = ("graph", "compile_graph", "fused_graph", "int8_graph", "triton_graph")
OWN_KERNELS = ("triton_graph",)  # the rungs whose step is gpuprof.studies.decode_triton's kernels (it reads positions 0..pos only)
COMPILED = ("compile", "compile_graph", "fused_graph", "int8_graph")  # the rungs whose setup compiles a layer
INT8 = ("int8_graph",)  # the rungs whose matrices are int8 (their bytes, their memory and their check's bound differ)
SCALE_BYTES = 2  # an int8 matrix's per-column scales are bfloat16, whatever the arithmetic's dtype
CPU_DEFAULT = ("eager_dynamic", "eager_static", "eager_fixed")
CACHES = {"dynamic": ("eager_dynamic",), "static": ("eager_static",), "both": ("eager_dynamic", "eager_static")}
TOPK = 4  # the best logits kept per step: the token is the first (the others are printed, not checked)
# The check keeps this many of each step's logits, evenly spaced over the vocabulary (all of them when it is smaller):
# enough that a bug, which moves every logit, cannot hide, and few enough to keep every step of a batch of 1,024.
KEPT_COLUMNS = 4096
# The check's bound on the worst step's mean |difference| between a rung's kept logits and the reference's, as a share
# of the reference's kept logits' standard deviation (the module's text gives the measurement bfloat16's comes from).
TOLERANCE = {"float32": 1e-4, "bfloat16": 0.08}
# The same for the int8 rungs, whose weights differ from the reference's (the module's text gives the measurement).
INT8_TOLERANCE = {"float32": 0.09, "bfloat16": 0.17}
LIMITS = {"batch": 4096, "prompt": 131072, "new": 100000, "layers": 1024}


@dataclass(frozen=True)
class Config:
    """A decoder's shapes. Weights are untied: the embedding table and the output projection are separate."""

    layers: int
    d_model: int
    q_heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5

    @property
    def layer_matmul_params(self) -> int:
        """The weights of one layer that multiply activations: wq, wk, wv, wo, gate, up, down."""
        d, q, kv = self.d_model, self.q_heads * self.head_dim, self.kv_heads * self.head_dim
        return d * q + 2 * d * kv + q * d + 3 * d * self.ffn

    @property
    def layer_params(self) -> int:
        return self.layer_matmul_params + 2 * self.d_model  # + the two norms' weights

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + 2 * self.vocab * self.d_model + self.d_model  # + embed, lm_head, final norm

    @property
    def matmul_params(self) -> int:
        """The weights one token's decoding step multiplies: every layer's matrices and the output projection
        (the embedding table is looked up, not multiplied; the norms scale, they are not matrices)."""
        return self.layers * self.layer_matmul_params + self.d_model * self.vocab

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Keys and values of one token of one sequence, over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


PRESETS = {
    # Llama-3-8B's published configuration (config.json of meta-llama/Meta-Llama-3-8B).
    "8b": Config(layers=32, d_model=4096, q_heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256),
    "tiny": Config(layers=2, d_model=256, q_heads=8, kv_heads=2, head_dim=32, ffn=688, vocab=1024),
}
# Defaults per preset: (batch, prompt, new tokens).
RUN_DEFAULTS = {"8b": (1, 512, 128), "tiny": (2, 32, 16)}


def decode_step_bytes(cfg: Config, batch: int, context: int, dtype_bytes: int, matrix_bytes: int | None = None) -> int:
    """Bytes one decoding step must read from memory, at ``context`` cached tokens (the new one included).

    Every weight matrix once, the whole batch sharing it; of the embedding table only the ``batch``
    rows looked up (the rest is never touched); every cached key and value of every sequence.
    The least a step can move: a naive loop moves more (torch.cat copies the cache; the fixed-shape
    step reads the whole preallocated cache), and writes and activations are left out (they grow
    with the batch; at batch 1 they are vectors beside the weights' matrices).

    ``matrix_bytes``: the element size of the matrices a step multiplies, where it is not ``dtype_bytes``: 1 for
    int8_graph, whose matrices also read one BF16 scale per output column (:func:`quantized_columns`); the norms, the
    embedding's rows and the KV cache stay in ``dtype_bytes``.
    """
    rest = cfg.params - cfg.vocab * cfg.d_model - cfg.matmul_params + batch * cfg.d_model  # norms, embedding rows
    if matrix_bytes is None:
        matrices = cfg.matmul_params * dtype_bytes
    else:
        matrices = cfg.matmul_params * matrix_bytes + quantized_columns(cfg) * SCALE_BYTES
    return matrices + rest * dtype_bytes + batch * context * cfg.kv_bytes_per_token(dtype_bytes)


def decode_step_flops(cfg: Config, batch: int, context: int) -> int:
    """Floating-point operations one decoding step needs at ``context`` cached tokens (the new one included).

    2 per weight multiplied per sequence (a multiply and an add), and attention over the context:
    per layer, per query head, the scores q.K (2 x head_dim per position) and their weighted sum of V
    (the same again). Norms, rotary embeddings and the softmax are left out: a few operations per
    element of vectors, beside the matrices' 2 per weight.
    """
    attention = 4 * cfg.layers * cfg.q_heads * cfg.head_dim * context
    return batch * (2 * cfg.matmul_params + attention)


def prefill_flops(cfg: Config, batch: int, prompt: int) -> int:
    """Floating-point operations of a prompt's prefill: every token through every layer's matrices, causal
    attention (token i attends over i + 1 positions), and the output projection for the last token only."""
    layers = 2 * prompt * cfg.layers * cfg.layer_matmul_params
    attention = 4 * cfg.layers * cfg.q_heads * cfg.head_dim * (prompt * (prompt + 1) // 2)
    return batch * (layers + attention + 2 * cfg.d_model * cfg.vocab)


def memory_needed(cfg: Config, batch: int, prompt: int, new: int, dtype_bytes: int,
                  caches: int = 1, int8_copy: bool = False) -> tuple[int, int, int]:
    """(weights, KV caches, prefill's largest activations) in bytes: the least the run allocates. ``caches``:
    how many full KV caches live at once (the fixed-shape rungs share one; an eager rung holds its own).
    ``int8_copy``: int8_graph is asked for, so the weights include its int8 copy (:func:`int8_weight_bytes`), which
    lives beside the model's own while that rung is set up and run (released after each batch)."""
    weights = cfg.params * dtype_bytes + (int8_weight_bytes(cfg) if int8_copy else 0)
    kv = caches * batch * (prompt + new) * cfg.kv_bytes_per_token(dtype_bytes)
    # Prefill's widest moment: the MLP's gate, up and their product, beside the residual stream and the attention's q, k, v.
    acts = batch * prompt * (3 * cfg.ffn + 4 * cfg.d_model) * dtype_bytes
    return weights, kv, acts


def check_fits(cfg: Config, model: str, batch: int, prompt: int, new: int, device: str, dtype_bytes: int,
               caches: int = 1, int8_copy: bool = False) -> None:
    """Refuse before allocating anything: 8b on a CPU, or weights + KV cache + prefill beyond the free memory."""
    if device == "cpu" and model == "8b":
        weights, kv, acts = memory_needed(cfg, batch, prompt, new, 2)  # what it takes in bfloat16, as on a GPU
        raise GpuprofError(f"--model 8b needs a GPU: in bfloat16 its weights ({weights / 2**30:,.1f} GiB), a KV cache of "
                           f"{kv / 2**30:,.2f} GiB for batch {batch} x {prompt + new} tokens and prefill's activations "
                           f"take at least {(weights + kv + acts) / 2**30:,.1f} GiB, and a CPU would spend seconds per token.",
                           "Run --model tiny here.")
    weights, kv, acts = memory_needed(cfg, batch, prompt, new, dtype_bytes, caches, int8_copy)
    int8_words = f", of which int8_graph's int8 copy {int8_weight_bytes(cfg) / 2**30:,.1f} GiB" if int8_copy else ""
    cache_words = f"KV cache {kv / 2**30:,.2f} GiB" if caches == 1 else f"{caches} KV caches {kv / 2**30:,.2f} GiB"
    require_memory(weights + kv + acts, device,
                   f"--model {model} at batch {batch:,} x ({prompt:,} + {new:,}) tokens (weights {weights / 2**30:,.1f} GiB{int8_words}, "
                   f"{cache_words}, prefill activations {acts / 2**30:,.2f} GiB)",
                   "--batch, --prompt-len or --new-tokens", lower_bound=True)


def rotate(x: Any, cos: Any, sin: Any) -> Any:
    """Rotary embedding of [batch, heads, tokens, head_dim] by the given cos and sin (the rotate-half form
    Llama's code uses); cos and sin are [tokens, head_dim]."""
    import torch

    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def project(a: Any, w: Any, scale: Any | None = None) -> Any:
    """``a @ w``; for an int8 ``w`` (``scale`` given, one per output column), ``(a @ w.to(a.dtype)) * scale``: the form
    of gpt-fast's ``WeightOnlyInt8Linear.forward`` (quantize.py: ``F.linear(input, self.weight.to(dtype=input.dtype))
    * self.scales``). Eager, the cast writes a copy of the matrix in ``a``'s dtype before the product reads it; under
    torch.compile with coordinate-descent tuning and one row, Inductor may fuse it (see the int8_graph rung)."""
    return a @ w if scale is None else (a @ w.to(a.dtype)) * scale


def linear(a: Any, w: dict[str, Any], name: str) -> Any:
    """``a`` times the layer's matrix ``name``, scaled by ``name + "_scale"`` where the layer has one (int8)."""
    return project(a, w[name], w.get(f"{name}_scale"))


# A layer's tensors as allocated: q, k and v live in one matrix, gate and up in another (the fused_graph rung multiplies
# by those at once); wq, wk, wv, w_gate and w_up are views into them (:func:`with_views`), so every rung reads the
# same bytes and the weights take the memory of one copy.
STORED = ("attn_norm", "wqkv", "wo", "mlp_norm", "w_gate_up", "w_down")
MATRICES = ("wqkv", "wo", "w_gate_up", "w_down")  # the stored tensors a layer multiplies by (int8_graph quantizes them)


def with_views(w: dict[str, Any], cfg: Config) -> dict[str, Any]:
    """A layer's stored tensors (:data:`STORED`) with the separate projections added as column views of the fused
    ones: wq, wk, wv of wqkv [width, (q + 2 kv) heads x head_dim]; w_gate, w_up of w_gate_up [width, 2 x mlp].

    Views, not copies: the rungs that multiply by wq, wk and wv one at a time read the same memory as fused_graph
    reads at once (each row of wqkv holds q's, k's and v's columns side by side; a view's row stride is wqkv's, a
    matrix product reads it in place), and 8b's weights stay 16 GB, not 16 + the 4.8 GB of q/k/v/gate/up again."""
    q, kv = cfg.q_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    out = {k: w[k] for k in (*STORED, *(f"{m}_scale" for m in MATRICES)) if k in w}
    out["wq"], out["wk"], out["wv"] = out["wqkv"].split([q, kv, kv], dim=1)
    out["w_gate"], out["w_up"] = out["w_gate_up"].split([cfg.ffn, cfg.ffn], dim=1)
    if "wqkv_scale" in out:  # an int8 layer (:func:`quantized`): each view's columns keep their own scales
        out["wq_scale"], out["wk_scale"], out["wv_scale"] = out["wqkv_scale"].split([q, kv, kv])
        out["w_gate_scale"], out["w_up_scale"] = out["w_gate_up_scale"].split([cfg.ffn, cfg.ffn])
    return out


INT8_QMIN, INT8_QMAX = -128, 127


def quantize_int8(w: Any, block: int = 16384) -> tuple[Any, Any]:
    """(int8 matrix, BF16 scale per output column) of ``w`` [in, out]: symmetric, per channel, as gpt-fast's
    quantize.py does it (``dynamically_quantize_per_channel(mod.weight.float(), -128, 127, torch.int8)``, its scales
    then ``.to(mod.weight.dtype)``): per column, the scale is max |w| / 127.5 ((127 - -128) / 2) in float32 (at least
    float32's eps), the int8 value round(w / scale) clamped to [-128, 127], and the scale is stored in bfloat16. Its
    weight is [out, in] (nn.Linear's) and reduces over dim 1; ours is [in, out], so over dim 0: one scale per column.

    ``block`` columns at a time in float32, so the transient copy stays small (4,096 x 16,384 x 4 B = 256 MiB for 8b's
    output projection, whose float32 copy would take 2 GB)."""
    import torch

    q = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    scale = torch.empty(w.shape[1], dtype=torch.bfloat16, device=w.device)
    for j in range(0, w.shape[1], block):
        part = w[:, j:j + block].float()
        s = (part.abs().amax(dim=0) / ((INT8_QMAX - INT8_QMIN) / 2)).clamp(min=torch.finfo(torch.float32).eps)
        q[:, j:j + block] = (part / s).round().clamp(INT8_QMIN, INT8_QMAX).to(torch.int8)
        scale[j:j + block] = s.to(torch.bfloat16)
    return q, scale


def quantized_columns(cfg: "Config") -> int:
    """Output columns of every quantized matrix (one BF16 scale each): per layer q + 2 kv, width (o), 2 x mlp, width
    (down); and the output projection's vocabulary."""
    q, kv = cfg.q_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    return cfg.layers * (q + 2 * kv + 2 * cfg.d_model + 2 * cfg.ffn) + cfg.vocab


def int8_weight_bytes(cfg: "Config") -> int:
    """The int8 copy int8_graph makes at setup: every matrix a decoding step multiplies, one byte a weight, and a BF16
    scale per output column (8b: 7.5 GB, beside the 16 GB of BF16 weights, which the other rungs and the prefill's
    reference keep using)."""
    return cfg.matmul_params * 1 + quantized_columns(cfg) * SCALE_BYTES


class Decoder:
    """The model's weights and its forward pass; the KV cache is passed in (see :class:`DynamicCache`, :class:`StaticCache`)."""

    def __init__(self, cfg: Config, torch: Any, device: str, dtype: Any, max_positions: int, seed: int = 0) -> None:
        self.cfg, self.torch, self.F, self.device, self.dtype = cfg, torch, torch.nn.functional, device, dtype
        gen = torch.Generator(device=device).manual_seed(seed)

        def rnd(*shape: int) -> Any:
            # Drawn where it will live, in its own dtype: 16 GB of weights never pass through the host.
            return torch.randn(shape, generator=gen, device=device, dtype=dtype) * (1 / math.sqrt(shape[0]))

        d, q, kv = cfg.d_model, cfg.q_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        # Drawn one matrix at a time in the order q, k, v, o, gate, up, down (the values do not depend on the
        # layout), then kept fused: see :func:`with_views`.
        self.layers = [with_views({"attn_norm": torch.ones(d, device=device, dtype=dtype),
                                   "wqkv": torch.cat([rnd(d, q), rnd(d, kv), rnd(d, kv)], dim=1), "wo": rnd(q, d),
                                   "mlp_norm": torch.ones(d, device=device, dtype=dtype),
                                   "w_gate_up": torch.cat([rnd(d, cfg.ffn), rnd(d, cfg.ffn)], dim=1),
                                   "w_down": rnd(cfg.ffn, d)}, cfg)
                       for _ in range(cfg.layers)]
        self.embed = torch.randn((cfg.vocab, d), generator=gen, device=device, dtype=dtype)
        self.final_norm = torch.ones(d, device=device, dtype=dtype)
        self.lm_head = rnd(d, cfg.vocab)
        self.lm_head_scale = None  # the output projection's per-column scales once quantized (:func:`quantized`)
        # Rotary embeddings: cos and sin of every position up to the cache's length, in float32, then the model's dtype.
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, device=device, dtype=torch.float32) / cfg.head_dim)
        angles = torch.outer(torch.arange(max_positions, device=device, dtype=torch.float32), inv)
        angles = torch.cat([angles, angles], dim=-1)
        self.cos, self.sin = angles.cos().to(dtype), angles.sin().to(dtype)

    def cast(self, dtype: Any) -> "Decoder":
        """The same model with every weight (and the rotary tables) converted to ``dtype``: in float32, a BF16
        model's weights exactly, so that only the arithmetic differs."""
        other = object.__new__(Decoder)
        other.__dict__.update(self.__dict__)
        other.dtype = dtype
        other.layers = [with_views({k: v.to(dtype) for k, v in w.items() if k in STORED}, self.cfg) for w in self.layers]
        other.embed, other.final_norm, other.lm_head, other.cos, other.sin = (
            t.to(dtype) for t in (self.embed, self.final_norm, self.lm_head, self.cos, self.sin))
        return other

    def quantized(self) -> "Decoder":
        """The same model with every layer's matrices and the output projection stored as int8 with a BF16 scale per
        output column (:func:`quantize_int8`); the norms, the embedding table (looked up, not multiplied) and the
        rotary tables are shared with this one, and the arithmetic stays in this model's dtype. wqkv and w_gate_up are
        quantized whole: per-column scales do not depend on which columns sit beside them, so wq, wk, wv, w_gate and
        w_up (views, :func:`with_views`) are quantized exactly as they would be alone."""
        other = object.__new__(Decoder)
        other.__dict__.update(self.__dict__)
        layers = []
        for w in self.layers:
            stored = {k: w[k] for k in STORED}
            for name in MATRICES:
                stored[name], stored[f"{name}_scale"] = quantize_int8(w[name])
            layers.append(with_views(stored, self.cfg))
        other.layers = layers
        other.lm_head, other.lm_head_scale = quantize_int8(self.lm_head)
        return other

    def rmsnorm(self, x: Any, w: Any) -> Any:
        return rms_norm(x, w, self.cfg.norm_eps)

    def rope(self, x: Any, pos: int) -> Any:
        """Rotate [batch, heads, tokens, head_dim] by positions pos.. ."""
        t = x.shape[2]
        return rotate(x, self.cos[pos:pos + t], self.sin[pos:pos + t])

    def forward(self, tokens: Any, cache: Any, pos: int) -> Any:
        """Logits of the last position, for tokens [batch, t] starting at position ``pos``; updates ``cache``."""
        cfg, F = self.cfg, self.F
        x = self.embed[tokens]
        b, t, _ = x.shape
        for i, w in enumerate(self.layers):
            a = self.rmsnorm(x, w["attn_norm"])
            q = self.rope(linear(a, w, "wq").view(b, t, cfg.q_heads, cfg.head_dim).transpose(1, 2), pos)
            k = self.rope(linear(a, w, "wk").view(b, t, cfg.kv_heads, cfg.head_dim).transpose(1, 2), pos)
            v = linear(a, w, "wv").view(b, t, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
            keys, values = cache.update(i, k, v, pos)
            # Prefill attends causally within the prompt; a decoding step's one query sees every cached position.
            att = F.scaled_dot_product_attention(q, keys, values, is_causal=t > 1, enable_gqa=True)
            x = x + linear(att.transpose(1, 2).reshape(b, t, -1), w, "wo")
            m = self.rmsnorm(x, w["mlp_norm"])
            x = x + linear(F.silu(linear(m, w, "w_gate")) * linear(m, w, "w_up"), w, "w_down")
        return self.head(x[:, -1])  # only the last position picks a token

    def head(self, x: Any) -> Any:
        """The logits of the last position's x [batch, width]: the final norm, then the output projection."""
        return project(self.rmsnorm(x, self.final_norm), self.lm_head, self.lm_head_scale)


class DynamicCache:
    """The naive cache: every step concatenates the new keys and values onto each layer's, a copy of the whole cache."""

    def __init__(self, layers: int) -> None:
        self.k: list[Any] = [None] * layers
        self.v: list[Any] = [None] * layers

    def update(self, i: int, k: Any, v: Any, pos: int) -> tuple[Any, Any]:
        import torch

        if self.k[i] is None:
            self.k[i], self.v[i] = k, v
        else:
            self.k[i] = torch.cat([self.k[i], k], dim=2)
            self.v[i] = torch.cat([self.v[i], v], dim=2)
        return self.k[i], self.v[i]


class StaticCache:
    """Preallocated for every position the generation will reach; each step writes its slot in place and reads a slice."""

    def __init__(self, cfg: Config, torch: Any, batch: int, positions: int, device: str, dtype: Any) -> None:
        shape = (batch, cfg.kv_heads, positions, cfg.head_dim)
        self.torch = torch
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.index = torch.arange(positions, device=device)

    def update(self, i: int, k: Any, v: Any, pos: int) -> tuple[Any, Any]:
        end = pos + k.shape[2]
        where = self.index[pos:end]
        self.k[i].index_copy_(2, where, k)
        self.v[i].index_copy_(2, where, v)
        return self.k[i][:, :, :end], self.v[i][:, :, :end]


def new_cache(kind: str, model: Decoder, batch: int, positions: int, device: str, dtype: Any) -> Any:
    return DynamicCache(model.cfg.layers) if kind == "dynamic" else StaticCache(model.cfg, model.torch, batch, positions,
                                                                                device, dtype)


def kept_columns(torch: Any, vocab: int, device: str) -> Any:
    """The vocabulary columns whose logits the check keeps: every ``ceil(vocab / KEPT_COLUMNS)``-th, from 0 (no draw:
    the same columns on every run; with random weights any columns are as good as others)."""
    return torch.arange(0, vocab, -(-vocab // KEPT_COLUMNS), device=device)


def fixed_layer(x: Any, w: dict[str, Any], k_cache: Any, v_cache: Any, pos: Any, mask: Any, cos: Any, sin: Any,
                q_heads: int, kv_heads: int, head_dim: int, eps: float, fused: bool = False) -> Any:
    """One layer of a decoding step whose shapes never change, for x [batch, 1, width] at position ``pos``.

    ``pos`` is a one-element tensor on the device, not a Python int, so the same kernels with the same
    arguments serve every step (what a CUDA graph replays, and what torch.compile need not recompile for).
    The new key and value are written at ``pos``; the query attends over the whole preallocated cache, the
    positions after ``pos`` masked out (``mask``). Grouped-query attention without copying the cache: the
    query heads that share a key/value head are laid side by side ([batch, kv_heads, group, head_dim])
    and multiplied by that head's keys at once.

    ``fused``: q, k and v from one product by ``wqkv``, split after it, and gate and up from one by ``w_gate_up``
    (the fused_graph rung); otherwise one product per matrix, by the views into those (:func:`with_views`).
    """
    import torch

    b = x.shape[0]
    a = rms_norm(x, w["attn_norm"], eps)
    if fused:
        q, k, v = linear(a, w, "wqkv").split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    else:
        q, k, v = linear(a, w, "wq"), linear(a, w, "wk"), linear(a, w, "wv")
    q = rotate(q.view(b, 1, q_heads, head_dim).transpose(1, 2), cos, sin)
    k = rotate(k.view(b, 1, kv_heads, head_dim).transpose(1, 2), cos, sin)
    v = v.view(b, 1, kv_heads, head_dim).transpose(1, 2)
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos, v)
    qg = q.reshape(b, kv_heads, q_heads // kv_heads, head_dim)  # query head h uses key/value head h // group
    scores = (qg @ k_cache.transpose(-1, -2)).float() * (1.0 / math.sqrt(head_dim))
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1).to(x.dtype)
    att = (probs @ v_cache).reshape(b, 1, q_heads * head_dim)
    x = x + linear(att, w, "wo")
    m = rms_norm(x, w["mlp_norm"], eps)
    if fused:
        gate, up = linear(m, w, "w_gate_up").chunk(2, dim=-1)
    else:
        gate, up = linear(m, w, "w_gate"), linear(m, w, "w_up")
    return x + linear(torch.nn.functional.silu(gate) * up, w, "w_down")


def fused_layer(x: Any, w: dict[str, Any], k_cache: Any, v_cache: Any, pos: Any, mask: Any, cos: Any, sin: Any,
                q_heads: int, kv_heads: int, head_dim: int, eps: float) -> Any:
    """:func:`fixed_layer` with the fused products: 4 matrix-vector products per layer (qkv, o, gate/up, down), not 7."""
    return fixed_layer(x, w, k_cache, v_cache, pos, mask, cos, sin, q_heads, kv_heads, head_dim, eps, fused=True)


class FixedStep:
    """The fixed-shape decoding step: reads the token ids and the position from device buffers, writes the best
    logits and their ids into buffers of its own, the next input ids into ``tokens``, and advances ``pos``.

    Nothing in it waits for the CPU or changes shape, so it can be captured in a CUDA graph as it is; its
    outputs are buffers that the next call overwrites (see ``--no-clone``).
    """

    def __init__(self, model: Decoder, cache: StaticCache, batch: int, layer: Callable[..., Any] = fixed_layer,
                 head: Callable[[Any], Any] | None = None) -> None:
        torch = model.torch
        self.model, self.cache, self.layer = model, cache, layer
        self.head = head or model.head  # the final norm and the output projection (compiled for fused_graph, int8_graph)
        dev = model.device
        self.positions = torch.arange(cache.k[0].shape[2], device=dev)
        self.tokens = torch.zeros((batch, 1), dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.top_values = torch.zeros((batch, TOPK), dtype=model.dtype, device=dev)
        self.top_ids = torch.zeros((batch, TOPK), dtype=torch.long, device=dev)
        self.columns = kept_columns(torch, model.cfg.vocab, dev)
        self.kept = torch.zeros((batch, len(self.columns)), dtype=model.dtype, device=dev)

    def logits(self) -> Any:
        """The step's logits [batch, vocab] for the ids in ``tokens`` at position ``pos``; writes the new key and value."""
        m, cfg = self.model, self.model.cfg
        x = m.F.embedding(self.tokens, m.embed)
        mask = self.positions <= self.pos
        cos, sin = m.cos.index_select(0, self.pos), m.sin.index_select(0, self.pos)
        for i, w in enumerate(m.layers):
            x = self.layer(x, w, self.cache.k[i], self.cache.v[i], self.pos, mask, cos, sin,
                           cfg.q_heads, cfg.kv_heads, cfg.head_dim, cfg.norm_eps)
        return self.head(x[:, -1])

    def __call__(self) -> None:
        torch = self.model.torch
        logits = self.logits()
        values, ids = logits.topk(TOPK, dim=-1)
        self.top_values.copy_(values)
        self.top_ids.copy_(ids)
        torch.index_select(logits, 1, self.columns, out=self.kept)
        self.tokens.copy_(ids[:, :1])
        self.pos.add_(1)


class TritonStep(FixedStep):
    """The triton_graph rung's step: :class:`FixedStep`'s buffers and outputs, its logits from ``gpuprof.studies.decode_triton``'s
    kernels (six per layer) over the same BF16 weights and static cache, with tiles tuned at setup (:meth:`tune`)."""

    def __init__(self, model: Decoder, cache: StaticCache, batch: int) -> None:
        if model.dtype != model.torch.bfloat16:
            raise GpuprofError(f"triton_graph's kernels are written for bfloat16 weights, not {model.dtype}.",
                               "Run it on a GPU with bfloat16 (the default there).")
        super().__init__(model, cache, batch)
        try:
            from gpuprof.studies import decode_triton
        except ImportError as e:
            raise GpuprofError(f"triton_graph needs Triton ({e}).", "Install the triton package that matches torch, "
                               "or leave triton_graph out of --rung.") from e
        self.kernels = decode_triton.TritonLayers(model, cache, batch)

    def tune(self) -> dict[str, Any]:
        """Each role's tile, timed over the model's own matrices (decode_triton.tune); printed by the caller."""
        return self.kernels.tune_all()

    def logits(self) -> Any:
        return self.kernels.forward(self.tokens, self.pos)


class EagerRung:
    """eager_dynamic or eager_static: a fresh cache per generation, the step's shapes growing with the context."""

    static_outputs = False  # each step returns new tensors

    def __init__(self, name: str, model: Decoder, batch: int, positions: int) -> None:
        self.name, self.model, self.batch, self.positions = name, model, batch, positions
        self.kind = name.removeprefix("eager_")
        self.setup_s = 0.0
        self.columns = kept_columns(model.torch, model.cfg.vocab, model.device)

    def prefill(self, prompt: Any) -> Any:
        m = self.model
        self.cache = new_cache(self.kind, m, self.batch, self.positions, m.device, m.dtype)
        self.pos = prompt.shape[1]
        return m.forward(prompt, self.cache, 0)

    def start(self, ids: Any) -> None:
        pass

    def step(self, ids: Any, forced: bool = False) -> tuple[Any, Any, Any]:
        logits = self.model.forward(ids[:, :1], self.cache, self.pos)
        self.pos += 1
        values, top = logits.topk(TOPK, dim=-1)
        return values, top, logits.index_select(1, self.columns)  # the same kernels as the fixed step's

    def release(self) -> None:
        self.cache = None


class FixedRung:
    """A rung of :data:`FIXED`: the fixed-shape step over one static cache, which the prefill fills (the same code as
    eager_static's) and the step continues."""

    static_outputs = True  # each step returns the step's own output buffers

    def __init__(self, name: str, step: FixedStep, run: Callable[[], Any], setup_s: float,
                 captured: FixedStep | None = None) -> None:
        self.name, self.fixed, self.run, self.setup_s = name, step, run, setup_s
        # the step a CUDA graph was captured from: the graph replays its tensors' addresses but holds no reference to
        # them, so the rung must, as long as it may replay (else the caching allocator hands that memory to others)
        self.captured = captured

    def prefill(self, prompt: Any) -> Any:
        self.prompt_len = prompt.shape[1]
        return self.fixed.model.forward(prompt, self.fixed.cache, 0)

    def start(self, ids: Any) -> None:
        self.fixed.tokens.copy_(ids[:, :1])
        self.fixed.pos.fill_(self.prompt_len)

    def step(self, ids: Any, forced: bool = False) -> tuple[Any, Any, Any]:
        if forced:  # the step reads its input from its buffer, where the previous step wrote its own pick
            self.fixed.tokens.copy_(ids[:, :1])
        self.run()
        return self.fixed.top_values, self.fixed.top_ids, self.fixed.kept

    def release(self) -> None:
        self.run = None  # type: ignore[assignment]
        self.captured = None


def compiled_layer(torch: Any) -> Callable[..., Any]:
    """:func:`fixed_layer` under torch.compile: compiled at its first call, reused by every layer (the same shapes)."""
    return torch.compile(fixed_layer, dynamic=False, fullgraph=True)


def tuned_layer(torch: Any, fn: Callable[..., Any] = fused_layer) -> Callable[..., Any]:
    """``fn`` (default :func:`fused_layer`) under torch.compile with Inductor's ``coordinate_descent_tuning`` on for its
    compilation (gpt-fast's generate.py sets it globally). Scoped: every call runs under ``torch._inductor.config.patch``,
    which sets the switch and restores it on leaving, so the compile rungs, compiled beside it, keep the default, and a
    recompilation (a guard that fails) is tuned too. In a CUDA graph only the capture calls it; its replays run no
    Python. On the CPU the switch changes nothing (Inductor's matrix-vector decomposition skips the CPU)."""
    from torch._inductor import config as inductor_config

    compiled = torch.compile(fn, dynamic=False, fullgraph=True)

    def run(*args: Any) -> Any:
        with inductor_config.patch(coordinate_descent_tuning=True):
            return compiled(*args)
    return run


def capture_graph(torch: Any, step: Callable[[], Any], reset: Callable[[], Any], warmup: int = 3) -> Any:
    """A CUDA graph of ``step``: a few calls on a side stream first (as PyTorch's CUDA graph notes ask: they
    set up cuBLAS's workspaces and, for a compiled step, compile it), each after ``reset`` (which keeps the
    position inside the cache), then one call captured, not run."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            reset()
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def shared_buffers(step: FixedStep, like: FixedStep) -> FixedStep:
    """``step`` reading and writing ``like``'s buffers (input ids, position, outputs): one set for all the rungs."""
    step.tokens, step.pos, step.top_values, step.top_ids, step.kept = (
        like.tokens, like.pos, like.top_values, like.top_ids, like.kept)
    step.positions, step.columns = like.positions, like.columns  # read by the step (mask, kept logits): one copy too
    return step


def make_fixed_rungs(names: list[str], model: Decoder, batch: int, positions: int) -> dict[str, FixedRung]:
    """The fixed-shape rungs asked for, sharing one static cache and one set of buffers (they run one after another)."""
    torch = model.torch
    if not any(n in FIXED for n in names):
        return {}
    if any(n in COMPILED for n in names):
        torch._dynamo.reset()  # an earlier batch's compiled layer has other shapes: start afresh, under no recompile limit
    cache = StaticCache(model.cfg, torch, batch, positions, model.device, model.dtype)
    eager_step = FixedStep(model, cache, batch)
    compiled_steps: dict[str, FixedStep] = {}  # by layer kind: "compiled" (compile, compile_graph), "tuned" or "int8"
    rungs: dict[str, FixedRung] = {}
    for name in names:
        if name not in FIXED:
            continue
        t0 = time.perf_counter()
        with annotate(f"setup_{name}_b{batch}"):
            if name in OWN_KERNELS:
                step = shared_buffers(TritonStep(model, cache, batch), eager_step)
                tiles = step.tune()
                print(f"  {name} batch {batch}: tiles " + "; ".join(
                    f"{role} {t.block_n}x{t.block_k} split {t.split}, {t.warps} warps, {t.stages} stages"
                    for role, t in tiles.items()), flush=True)
            elif name in COMPILED:
                kind = {"fused_graph": "tuned", "int8_graph": "int8"}.get(name, "compiled")
                if kind not in compiled_steps:
                    compiled_steps[kind] = shared_buffers(compiled_step(kind, model, cache, batch), eager_step)
                    eager_step.pos.zero_()
                    compiled_steps[kind]()  # compiles the layer here, not inside the first timed generation
                step = compiled_steps[kind]
            else:
                step = eager_step
            run: Callable[[], Any] = step
            if name in NEEDS_GPU:
                run = capture_graph(torch, step, eager_step.pos.zero_).replay
            if model.device == "cuda":
                torch.cuda.synchronize()
        # int8_graph's rung holds its own step (the int8 model: its prefill runs on those weights too, and they live as
        # long as the rung, which the graph's replays read); the others hold the eager step (the BF16 model's prefill)
        owner = compiled_steps["int8"] if name in INT8 else eager_step
        rungs[name] = FixedRung(name, owner, run, time.perf_counter() - t0, captured=step if name in NEEDS_GPU else None)
        if name in OWN_KERNELS:  # each process tunes its own tiles: the record keeps them, as two runs may differ
            rungs[name].tiles = {role: asdict(t) for role, t in tiles.items()}
    return rungs


def compiled_step(kind: str, model: Decoder, cache: StaticCache, batch: int) -> FixedStep:
    """The fixed-shape step of a compiled rung: ``compiled`` (compile, compile_graph: :func:`fixed_layer` under
    torch.compile), ``tuned`` (fused_graph) or ``int8`` (int8_graph, over an int8 copy of the weights made here,
    :meth:`Decoder.quantized`): the fused layer and the final norm and output projection each compiled with the
    scoped tuning (:func:`tuned_layer`), in both, so that the two rungs differ in the weights' format only, and every
    product by an int8 matrix is compiled (an eager one would write a BF16 copy of the matrix every step, the output
    projection's 1 GB for 8b)."""
    torch = model.torch
    if kind == "compiled":
        return FixedStep(model, cache, batch, compiled_layer(torch))
    weights = model.quantized() if kind == "int8" else model
    return FixedStep(weights, cache, batch, tuned_layer(torch), head=tuned_layer(torch, weights.head))


@dataclass
class Generation:
    """One generation's kept outputs: the best TOPK logits and their ids per step ([batch, new + 1, TOPK]), the logits
    of the :func:`kept_columns` per step ([batch, new + 1, columns]), and those logits' standard deviation (the
    check's scale)."""

    values: Any
    ids: Any
    kept: Any
    logit_std: float

    @property
    def tokens(self) -> Any:
        return self.ids[:, :, 0]


def generate(rung: Any, prompt: Any, new_tokens: int, clock: Clock | None = None, clone: bool = True,
             force: Any | None = None) -> Generation:
    """Greedy generation: prefill, then ``new_tokens`` steps. The next token stays on the device: no step waits for
    the CPU. A rung whose step returns its own buffers (the fixed-shape rungs) has them cloned before the next step
    overwrites them, unless ``clone`` is False (the pitfall ``--no-clone`` shows).

    ``force`` (token ids [batch, new_tokens + 1], another generation's): feed those tokens instead of this rung's own
    picks ("teacher forcing"), so that every step's logits can be compared with that generation's even where a near
    tie made the two pick differently."""
    torch = rung.fixed.model.torch if isinstance(rung, FixedRung) else rung.model.torch
    mark = clock.mark if clock is not None else (lambda: None)
    values, ids, kept = [], [], []
    columns = rung.fixed.columns if isinstance(rung, FixedRung) else rung.columns
    with torch.inference_mode():
        mark()
        with annotate("prefill"):
            logits = rung.prefill(prompt)
            v, i = logits.topk(TOPK, dim=-1)
            k = logits.index_select(1, columns)
            rung.start(i if force is None else force[:, :1])
        mark()
        values.append(v)
        ids.append(i)
        kept.append(k)
        for step in range(new_tokens):
            with annotate(f"decode_step_{step}"):
                v, i, k = rung.step(i if force is None else force[:, step:step + 1], force is not None)
                if rung.static_outputs and clone:
                    v, i, k = v.clone(), i.clone(), k.clone()
            mark()
            values.append(v)
            ids.append(i)
            kept.append(k)
        kept_all = torch.stack(kept, dim=1)
        logit_std = float(kept_all.float().std())
    return Generation(torch.stack(values, dim=1), torch.stack(ids, dim=1), kept_all, logit_std)


@dataclass(frozen=True)
class Check:
    """A rung's logits against the reference's, both fed the reference's tokens (see the module's text for the rule)."""

    status: str  # "reference", "identical", "within bound", "failed" or "not checked"
    bound: float | None  # the most the worst step's mean |difference| may be, as a share of the logits' deviation
    worst_step_mean: float | None = None  # the worst step's mean |difference| of its kept logits, same share
    worst_at: tuple[int, int] | None = None  # that step's [sequence, token]
    max_diff: float | None = None  # the largest |difference| of any kept logit, same share (printed, not tested)
    picks_differ: int | None = None  # steps whose best token differs from the reference's (printed, not tested)
    steps: int | None = None  # steps compared (sequences x tokens)
    sentence: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("reference", "identical", "within bound", "not checked")


def compare(ref: Generation, forced: Generation, bound: float) -> Check:
    """A rung's generation fed the reference's tokens (``generate(..., force=ref.tokens)``) against the reference's.

    Per step of each sequence, the mean |difference| of the kept logits, as a share of the reference's kept logits'
    standard deviation; the worst step must not pass ``bound``. Which token each picks is not the test (random
    weights give nearly flat logits, and two correct BF16 rungs pick differently wherever rounding breaks a near
    tie): how many picks differ is reported, and so is the largest single difference."""
    rk, xk = ref.kept.detach().float().cpu(), forced.kept.detach().float().cpu()
    if rk.shape != xk.shape:
        return Check("failed", bound, sentence=f"different shapes {tuple(rk.shape)} and {tuple(xk.shape)}")
    scale = ref.logit_std if ref.logit_std > 0 else 1.0
    diff = (rk - xk).abs() / scale
    per_step = diff.mean(dim=-1)  # [sequence, token]
    worst = float(per_step.max())
    s, t = divmod(int(per_step.argmax()), per_step.shape[1])
    picks = int((ref.tokens.cpu() != forced.tokens.cpu()).sum())
    fields = dict(bound=bound, worst_step_mean=worst, worst_at=(s, t), max_diff=float(diff.max()), picks_differ=picks,
                  steps=per_step.numel())
    said = (f"the worst step's mean |difference| in logits {worst:.3g} of their standard deviation (bound {bound:.3g}; "
            f"at [sequence, token] [{s}, {t}]), the largest single one {fields['max_diff']:.3g}; the best token differs "
            f"at {picks} of {per_step.numel()} steps")
    if worst > bound:
        return Check("failed", sentence=f"fed the reference's tokens: {said}", **fields)  # type: ignore[arg-type]
    return Check("identical" if fields["max_diff"] == 0 else "within bound",  # type: ignore[arg-type]
                 sentence=f"fed the reference's tokens: {said}", **fields)


def check_bound(rung: str, dtype_name: str, tolerance_share: float) -> float:
    """The check's bound for ``rung``: int8 rungs' (:data:`INT8_TOLERANCE`) or the dtype's (``tolerance_share``)."""
    return INT8_TOLERANCE[dtype_name] if rung in INT8 else tolerance_share


def rounding_error(cfg: Config, torch: Any, batch: int = 4, prompt_len: int = 16, new: int = 12, seed: int = 0) -> Check:
    """What BF16 arithmetic alone does to this model's logits: the same BF16 weights run in bfloat16 and in float32
    on the CPU, the float32 run fed the bfloat16 run's tokens, compared by :func:`compare`'s statistic (bound 0).

    The check's bound for bfloat16 rests on this (see the module's text): two correct BF16 rungs each differ from
    the float32 result by about this much, so from each other by at most twice it."""
    positions = prompt_len + new
    low = Decoder(cfg, torch, "cpu", torch.bfloat16, positions, seed)
    high = low.cast(torch.float32)
    prompt = torch.randint(0, cfg.vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(seed + batch))
    ref = generate(EagerRung(REFERENCE, low, batch, positions), prompt, new)
    exact = generate(EagerRung(REFERENCE, high, batch, positions), prompt, new, force=ref.tokens)
    return compare(ref, exact, 0.0)


def quantization_error(cfg: Config, torch: Any, dtype: Any = None, batch: int = 4, prompt_len: int = 16, new: int = 12,
                       seed: int = 0) -> Check:
    """What int8 weights alone do to this model's logits (the int8_graph rung's bound rests on it): the same BF16
    weights, kept as they are and quantized (:meth:`Decoder.quantized`), both run in ``dtype`` (default float32, so
    that only the weights differ) on the CPU by eager_static's code, the int8 run fed the other's tokens, compared by
    :func:`compare`'s statistic (bound 0). In bfloat16 it is what the GPU's check compares: an int8 rung against the
    BF16 reference, both rounding."""
    positions = prompt_len + new
    bf16 = Decoder(cfg, torch, "cpu", torch.bfloat16, positions, seed)
    model = bf16.cast(dtype or torch.float32)
    prompt = torch.randint(0, cfg.vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(seed + batch))
    ref = generate(EagerRung(REFERENCE, model, batch, positions), prompt, new)
    int8 = generate(EagerRung(REFERENCE, model.quantized(), batch, positions), prompt, new, force=ref.tokens)
    return compare(ref, int8, 0.0)


def agreement(ref: Generation, run: Generation) -> tuple[float, int | None]:
    """Free-running generations: the share of token ids equal to the reference's, and the first step where any
    sequence differs (None if none does). Informative only: after a near tie the sequences part for good."""
    a, b = ref.tokens.cpu(), run.tokens.cpu()
    same = a == b
    cols = (~same).any(0).nonzero()
    return float(same.float().mean()), (int(cols[0]) if len(cols) else None)


def _quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def summarise(cfg: Config, times_ms: list[float], batch: int, prompt: int, new: int, dtype_bytes: int,
              matrix_bytes: int | None = None) -> dict[str, Any]:
    """One timed generation as the JSON keeps it: prefill, every step, and the rates they imply. Bytes and FLOPs are
    what a step needs (:func:`decode_step_bytes`, :func:`decode_step_flops`) at each step's context, whatever the rung
    reads or computes beyond them (``matrix_bytes``: the matrices' element size where it is not ``dtype_bytes``, 1 for
    int8); the rates are their totals over the total decoding time."""
    prefill, steps = times_ms[0], times_ms[1:]
    contexts = [prompt + s + 1 for s in range(new)]
    total_bytes = sum(decode_step_bytes(cfg, batch, c, dtype_bytes, matrix_bytes) for c in contexts)
    total_flops = sum(decode_step_flops(cfg, batch, c) for c in contexts)
    decode_s = sum(steps) / 1e3
    q1, q3 = _quartiles(steps)
    p_flops = prefill_flops(cfg, batch, prompt)
    return {"prefill_ms": prefill, "prefill_tokens_per_s": batch * prompt / (prefill / 1e3),
            "prefill_flops": p_flops, "prefill_tflops": p_flops / (prefill / 1e3) / 1e12,
            "decode_step_ms": steps, "decode_ms_per_step": statistics.median(steps), "decode_ms_q1": q1,
            "decode_ms_q3": q3, "decode_ms_min": min(steps), "decode_ms_max": max(steps),
            "decode_tokens_per_s": batch * new / decode_s,
            "bytes_per_step": total_bytes / new, "decode_gbps": total_bytes / decode_s / 1e9,
            "flops_per_step": total_flops / new, "decode_tflops": total_flops / decode_s / 1e12,
            "bytes_basis": bytes_basis(batch, matrix_bytes)}


def bytes_basis(batch: int, matrix_bytes: int | None) -> str:
    """What ``bytes_per_step`` counts: the bytes a step needs. For int8 matrices that is one byte a weight, which a
    step reads only where the cast is fused into the product: Inductor decomposes a product into a multiply-and-sum
    of its own only for one row (``torch/_inductor/decomposition.py``, ``mm``), so from batch 2 each matrix's cast is
    a kernel of its own, writing and reading a BF16 copy that the count leaves out (its GB/s then reads low)."""
    if matrix_bytes != 1:
        return "what a step needs"
    if batch == 1:
        return "what a step needs: int8 matrices read once, where the cast is fused into the product"
    return ("what a step needs, int8 matrices read once; at this batch each matrix's cast is likely a kernel of its own "
            "(BF16 copies written and read, not counted), so the GB/s reads low")


# argparse type: batch sizes separated by commas (1,8,64), each from 1 to the limit.
batch_list = distinct_ints(bounded_int(LIMITS["batch"], "each sequence adds its own KV cache"), "batch size", "1,8,64")


def parse_rungs(text: str) -> list[str]:
    """--rung: names separated by commas, or all; in the ladder's order, whatever the order given."""
    if text.strip() == "all":
        return list(RUNGS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in RUNGS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown rung(s) {', '.join(unknown) or repr(text)}; the rungs are "
                                         f"{', '.join(RUNGS)} (or all)")
    return [n for n in RUNGS if n in names]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(PRESETS), default=None,
                   help="shapes: 8b (Llama-3-8B's) or tiny (default: 8b on a GPU, tiny on a CPU)")
    p.add_argument("--layers", type=bounded_int(LIMITS["layers"], "the largest published decoders have under 200"),
                   default=None, help="override the preset's number of layers (e.g. fewer, to fit a smaller GPU)")
    p.add_argument("--batch", type=batch_list, default=None,
                   help="sequences generated together; several, separated by commas (1,8,64), are run one after "
                        "another with the same weights (default: 1 for 8b, 2 for tiny; at most 4,096 each)")
    p.add_argument("--prompt-len", type=bounded_int(LIMITS["prompt"], "Llama 3.1's longest context"), default=None,
                   help="prompt tokens per sequence (default: 512 for 8b, 32 for tiny)")
    p.add_argument("--new-tokens", type=bounded_int(LIMITS["new"], "each is one decoding step"), default=None,
                   help="decoding steps after prefill (default: 128 for 8b, 16 for tiny)")
    p.add_argument("--rung", type=parse_rungs, default=None, metavar="RUNGS",
                   help=f"the rungs to time, separated by commas, or all: {', '.join(RUNGS)} (default: all on a GPU; "
                        f"{', '.join(CPU_DEFAULT)} on the CPU)")
    p.add_argument("--cache", choices=sorted(CACHES), default=None,
                   help="the first block's option, kept: dynamic = --rung eager_dynamic, static = --rung eager_static, "
                        "both = the two")
    p.add_argument("--no-check", action="store_true",
                   help="do not check the rungs against eager_static (the check costs time: eager_static is "
                        "generated untimed first, and each other rung's first warm-up is fed its tokens)")
    p.add_argument("--no-clone", action="store_true",
                   help="keep the fixed-shape rungs' output buffers without cloning them: the pitfall of a CUDA graph's "
                        "outputs, overwritten by the next replay (the check then fails)")
    p.add_argument("--warmup", type=positive_int, default=1,
                   help="untimed generations per rung and batch before the timed one (default: 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the prompts (default: 0)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even when there is a GPU")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="also write the results to FILE")
    args = p.parse_args(argv)
    if args.cache is not None and args.rung is not None:
        p.error("give --rung or --cache, not both (--cache static is --rung eager_static)")
    return args


def resolve_rungs(args: argparse.Namespace, gpu: bool) -> list[str]:
    """The rungs to time: --rung, else --cache, else the device's default; a GPU-only rung on the CPU is refused."""
    rungs = args.rung or (list(CACHES[args.cache]) if args.cache else list(RUNGS if gpu else CPU_DEFAULT))
    if not gpu:
        gpu_only = [r for r in rungs if r in NEEDS_GPU]
        if gpu_only:
            raise GpuprofError(f"--rung {','.join(gpu_only)} needs a GPU: a torch.cuda.CUDAGraph records CUDA kernels, and "
                               "there are none on the CPU.",
                               f"On the CPU run {', '.join(r for r in RUNGS if r not in NEEDS_GPU)}.")
    return rungs


def run_batch(model: Decoder, rungs: list[str], batch: int, prompt_len: int, new: int, args: argparse.Namespace,
              tolerance_share: float, dtype_bytes: int) -> list[dict[str, Any]]:
    """Every rung at one batch: set up (compile, capture); the reference generated untimed (its warm-up); each other
    rung's first warm-up fed the reference's tokens (the check's data); then the timed generations, free-running."""
    torch, gpu, cfg = model.torch, model.device == "cuda", model.cfg
    positions = prompt_len + new
    gen = torch.Generator().manual_seed(args.seed + batch)
    prompt = torch.randint(0, cfg.vocab, (batch, prompt_len), generator=gen).to(model.device)
    check, clone = not args.no_check, not args.no_clone
    with torch.inference_mode():
        fixed = make_fixed_rungs(rungs, model, batch, positions)
    built = {name: fixed[name] if name in fixed else EagerRung(name, model, batch, positions)
             for name in [*rungs, *([REFERENCE] if check and REFERENCE not in rungs else [])]}
    forced: dict[str, Generation] = {}
    with annotate("warmup"):
        ref = generate(built[REFERENCE], prompt, new) if check else None
        for name in rungs:
            for w in range(args.warmup - (name == REFERENCE and check)):
                if w == 0 and ref is not None and name != REFERENCE:
                    forced[name] = generate(built[name], prompt, new, clone=clone, force=ref.tokens)
                else:
                    generate(built[name], prompt, new, clone=clone)
    timed: dict[str, Generation] = {}
    rows = []
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.profiler.start()  # nsys --capture-range=cudaProfilerApi records from here ...
    for name in rungs:
        clock = Clock(torch, gpu)
        with annotate(f"rung_{name}_b{batch}"):
            timed[name] = generate(built[name], prompt, new, clock, clone=clone)
        if gpu:
            torch.cuda.synchronize()
        int8 = 1 if name in INT8 else None  # the matrices' element size, where it is not dtype_bytes
        rows.append({"rung": name, "batch": batch, "setup_s": built[name].setup_s,
                     "kv_positions_read": positions if name in FIXED and name not in OWN_KERNELS else "context",
                     "matrix_bytes": int8 or dtype_bytes,  # the element size bytes_per_step counts
                     **({"tiles": built[name].tiles} if getattr(built[name], "tiles", None) else {}),
                     **summarise(cfg, clock.intervals_ms(), batch, prompt_len, new, dtype_bytes, int8)})
    if gpu:
        torch.cuda.profiler.stop()  # ... to here
    for row in rows:
        name = row["rung"]
        if ref is None:
            c = Check("not checked", None, sentence="not checked (--no-check)")
        elif name == REFERENCE:
            c = Check("reference", None, sentence="the reference")
        else:
            c = compare(ref, forced[name], check_bound(name, str(model.dtype).replace("torch.", ""), tolerance_share))
        row["check"] = {**asdict(c), "ok": c.ok}
        if ref is not None:
            share, first = agreement(ref, timed[name])
            row["free_running_tokens_equal"], row["free_running_first_difference"] = share, first
        if name in FIXED:
            row["outputs_cloned"] = clone
    for r in built.values():
        r.release()
    del built, fixed, forced, timed
    if gpu:
        torch.cuda.empty_cache()
    return rows


def format_row(r: dict[str, Any], new: int) -> str:
    return (f"  {r['rung']:<13} batch {r['batch']:>4}: prefill {r['prefill_ms']:9.2f} ms ({r['prefill_tflops']:.1f} TFLOP/s); "
            f"decode {r['decode_ms_per_step']:8.3f} ms/step (median of {new}, quartiles {r['decode_ms_q1']:.3f}-"
            f"{r['decode_ms_q3']:.3f}); over all {new} steps (the mean step) {r['decode_tokens_per_s']:,.1f} tokens/s; "
            f"{r['bytes_per_step'] / 1e9:.3f} GB and "
            f"{r['flops_per_step'] / 1e9:,.1f} GFLOP per step: {r['decode_gbps']:,.1f} GB/s, {r['decode_tflops']:.2f} TFLOP/s"
            + (f"; set up in {r['setup_s']:.1f} s" if r["setup_s"] else "")
            + (f"\n      bytes: {r['bytes_basis']}" if r.get("bytes_basis", "what a step needs") != "what a step needs" else "")
            + f"\n      check: {r['check']['sentence']}"
            + (f"; free-running, {r['free_running_tokens_equal']:.0%} of the tokens equal the reference's"
               if "free_running_tokens_equal" in r and r["check"]["status"] != "reference" else ""))


@dataclass(frozen=True)
class Precision:
    """The model and number format a run uses: 8b in bfloat16 on a GPU, tiny in float32 on a CPU, unless asked."""

    model: str
    dtype: Any
    bytes: int

    @property
    def name(self) -> str:
        return str(self.dtype).replace("torch.", "")


def choose_precision(torch: Any, gpu: bool, model: str | None) -> Precision:
    """The run's :class:`Precision` (shared by this script and ``kv_capacity.py``)."""
    return Precision(model or ("8b" if gpu else "tiny"), torch.bfloat16 if gpu else torch.float32, 2 if gpu else 4)


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch, device, where = torch_device("llm_decode.py", args.cpu)
    gpu = device == "cuda"
    chosen = choose_precision(torch, gpu, args.model)
    model_name, dtype, dtype_name, dtype_bytes = chosen.model, chosen.dtype, chosen.name, chosen.bytes
    cfg = PRESETS[model_name] if args.layers is None else replace(PRESETS[model_name], layers=args.layers)
    d_batch, d_prompt, d_new = RUN_DEFAULTS[model_name]
    batches, prompt_len, new = args.batch or [d_batch], args.prompt_len or d_prompt, args.new_tokens or d_new
    rungs = resolve_rungs(args, gpu)
    # every eager rung keeps its own cache until its batch ends (the reference's included), the fixed rungs share one
    caches = len({REFERENCE, *(r for r in rungs if r not in FIXED)}) + any(r in FIXED for r in rungs)
    int8_copy = any(r in INT8 for r in rungs)
    check_fits(cfg, model_name, max(batches), prompt_len, new, device, dtype_bytes, caches, int8_copy)
    print(f"llm_decode: --model {model_name} ({cfg.layers} layers, width {cfg.d_model}, {cfg.q_heads} query / "
          f"{cfg.kv_heads} KV heads, {cfg.params:,} parameters, {dtype_name}) on {where}; batch "
          f"{', '.join(map(str, batches))} x {prompt_len} prompt tokens, {new} new tokens; rungs {', '.join(rungs)}",
          flush=True)
    if not gpu:
        print("no GPU (or --cpu): float32 on the CPU, timed with perf_counter (the timings say nothing about a GPU)")

    model = Decoder(cfg, torch, device, dtype, prompt_len + new, args.seed)
    tolerance_share = TOLERANCE[dtype_name]
    rows: list[dict[str, Any]] = []
    for batch in batches:
        batch_rows = run_batch(model, rungs, batch, prompt_len, new, args, tolerance_share, dtype_bytes)
        for r in batch_rows:
            print(format_row(r, new), flush=True)
        rows += batch_rows
    failed = [r for r in rows if not r["check"]["ok"]]
    results: dict[str, Any] = {
        "model": model_name, "config": asdict(cfg), "params": cfg.params, "matmul_params": cfg.matmul_params,
        "device": where, "dtype": dtype_name, "batches": batches, "prompt_len": prompt_len, "new_tokens": new,
        "rungs": rungs, "reference": REFERENCE, "timing": "cuda-events" if gpu else "perf_counter",
        "weight_bytes": cfg.params * dtype_bytes, "kv_bytes_per_token": cfg.kv_bytes_per_token(dtype_bytes),
        **({"int8_weight_bytes": int8_weight_bytes(cfg), "int8_tolerance_share_of_logit_std": INT8_TOLERANCE[dtype_name]}
           if int8_copy else {}),
        "topk": TOPK, "tolerance_share_of_logit_std": tolerance_share, "outputs_cloned": not args.no_clone,
        "checked": not args.no_check, "checks_passed": not failed, "rows": rows}
    write_json(args.json, results)
    if failed:
        first = failed[0]
        hint = (" --no-clone kept the fixed-shape step's output buffers, which every later step overwrites: each kept "
                "step shows the last step's tokens. Clone a graph's outputs before its next replay."
                if args.no_clone else " A correct rung's logits differ from the reference's by BF16 rounding only.")
        raise GpuprofError(f"result check failed: {len(failed)} of {len(rows)} (rung, batch) rows differ from {REFERENCE}; "
                           f"first {first['rung']} at batch {first['batch']}: {first['check']['sentence']}.", hint.strip())
    if args.no_check:
        print("result not checked: --no-check")
    else:
        print(f"result checked: every rung's logits against {REFERENCE}'s at each batch "
              f"({sum(r['check']['status'] == 'identical' for r in rows)} identical, "
              f"{sum(r['check']['status'] == 'within bound' for r in rows)} within the bound, of "
              f"{sum(r['check']['status'] != 'reference' for r in rows)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
