"""The triton_graph rung's kernels: a decoding step of six kernels of our own per layer, written in Triton.

Used by ``examples/nsys/llm_decode.py --rung triton_graph`` (a GPU with Triton only). It imports Triton, which
torch's CPU build does not bring: import it only where Triton is installed (llm_decode.py's TritonStep does so when
that rung is asked for, and says so plainly where it is missing).
Why our own: at batch 1 a decoding step reads every weight once, so its time is the weights' bytes over the rate at
which the step streams them. The compiled rungs lose time twice (chapter 12, section 8, measured it for fused_graph
on an H200): the products by the two small matrices (q/k/v's 50.3 MB, o's 33.6 MB) run far below the copy's rate,
and some 280 small kernels between the products (norms, rotary embedding, the cache write, attention, residual
adds) each cost a launch slot and a ramp of the memory pipeline down and up again. Here a layer is six kernels, and
what is not a product or attention rides inside one:

1. :func:`matvec` over ``wqkv``, its input times the attention norm's weight (``NORM`` 2), split over K where the
   tuned tile says so (several programs per column block, their partial sums added atomically into a float32 buffer zeroed once per step);
2. :func:`attend_part`: the norm's 1 / rms applied to q, k and v, rotary embedding of q and k, the new key and value
   written into the cache at ``pos``, and each query head's attention over one chunk of positions;
3. :func:`attend_combine`: the chunks merged (split attention, "flash decoding");
4. :func:`matvec` over ``wo``, added atomically into the residual stream, which lives in float32 for the whole step
   (the residual add costs nothing: it is where the product's sum lands);
5. :func:`matvec` over ``w_gate_up`` with the MLP's RMSNorm computed in its prologue (``NORM`` 1);
6. :func:`matvec` over ``w_down``, SiLU(gate) x up computed as it loads its input (``GATED``), added atomically into
   the residual stream.

The arithmetic follows the reference's (``gpuprof.models.rms_norm``: normalised in float32, cast to bfloat16,
scaled by the norm's weight; products in float32 accumulators over bfloat16 inputs; q, k, v, gate, up and SiLU's
output rounded to bfloat16 as the reference rounds them), with these differences. More precise: the o and down
products' sums are added into the residual stream unrounded, and that stream stays in float32 instead of being
rounded to bfloat16 after every add; attention's scores, softmax and weighted sum run in float32. Different, not more
precise: for q, k and v the norm's 1 / rms multiplies the product's sum instead of its input (the same up to
rounding). The rotary embedding is computed in float32 and rounded once, where the reference's bfloat16
``rotate`` rounds x cos, its partner's sin term and their sum apart. And not deterministic: the split products' partial sums are added atomically, in whatever order the
programs finish, so two runs of the same step can differ in the last bits of float32. The rung is checked against
``eager_static`` like every other. Tested on the CPU with Triton's interpreter where Triton is installed
(``tests/test_decode_triton.py``; TRITON_INTERPRET=1).

Tile sizes (:class:`Tile`) are chosen at setup by timing a few candidates over the model's own matrices
(:func:`tune`), as Inductor's coordinate-descent tuning does for its kernels: the best differs by shape and GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import triton
import triton.language as tl

STORE, ADD = 0, 1  # matvec's MODE: store bfloat16 / add atomically into float32
PLAIN, GATED = 0, 1  # matvec's X_FROM: where its input comes from
NORM_BLOCK = 1024  # the prologue's chunk when it reads a row to normalise it


@triton.jit
def _x_chunk(x_ptr, x_stride, nw_ptr, rows, row_ok, ks, inv, K, NORM: tl.constexpr, X_FROM: tl.constexpr):
    """x[rows, ks] as the product's bfloat16 input [BLOCK_M, BLOCK_K] (see :func:`matvec`)."""
    ok = row_ok[:, None] & (ks[None, :] < K)
    if X_FROM == 1:  # GATED: the row holds gate then up (2K values); SiLU(gate) x up, rounded as the reference does
        g = tl.load(x_ptr + rows[:, None] * x_stride + ks[None, :], mask=ok, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + rows[:, None] * x_stride + K + ks[None, :], mask=ok, other=0.0).to(tl.float32)
        silu = (g / (1.0 + tl.exp(-g))).to(tl.bfloat16).to(tl.float32)
        return (silu * u).to(tl.bfloat16)
    xv = tl.load(x_ptr + rows[:, None] * x_stride + ks[None, :], mask=ok, other=0.0)
    if NORM == 1:  # the whole RMSNorm: x / rms, rounded, times the weight, rounded
        xv = (xv * inv[:, None]).to(tl.bfloat16).to(tl.float32)
        xv = xv * tl.load(nw_ptr + ks).to(tl.float32)[None, :]
    elif NORM == 2:  # the weight only: the consumer multiplies by 1 / rms
        xv = xv * tl.load(nw_ptr + ks).to(tl.float32)[None, :]
    return xv.to(tl.bfloat16)


@triton.jit
def matvec(x_ptr, x_stride, nw_ptr, w_ptr, y_ptr, y_stride, M, K, N, k_per, eps,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr,
           MODE: tl.constexpr, X_FROM: tl.constexpr, NORM_CHUNK: tl.constexpr):
    """y[M, N] (or its float32 sum) from x[M, K] @ w[K, N], w row-major with N contiguous (the model's layout).

    Grid: (N / BLOCK_N, K / k_per, ceil(M / BLOCK_M)). The input x, by ``X_FROM``: 0, x itself (bfloat16; or, with
    ``NORM``, the float32 residual stream: 1, the whole RMSNorm computed here (normalised, cast to bfloat16, times the
    norm's weight ``nw``, cast again: the reference's order); 2, times the weight only, the consumer applying
    1 / rms); 1, GATED: x [M, 2K] holds the gate and up products, and the input is SiLU(gate) x up (the MLP's
    elementwise step rides in the down product's load: no kernel of its own). ``MODE`` STORE writes
    bfloat16; ADD adds the float32 partial sum atomically into y (a split over K, or a residual add). One row
    (batch 1): elementwise products summed in a [BLOCK_K, BLOCK_N] float32 accumulator; more rows: tensor-core dots
    of BLOCK_M rows, padded with zeros."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    inv = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    if NORM == 1:
        ss = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k in range(0, K, NORM_CHUNK):
            ks = k + tl.arange(0, NORM_CHUNK)
            xv = tl.load(x_ptr + rows[:, None] * x_stride + ks[None, :], mask=row_ok[:, None] & (ks[None, :] < K),
                         other=0.0)
            ss += tl.sum(xv * xv, axis=1)
        inv = 1.0 / tl.sqrt(ss / K + eps)
    k0 = pid_k * k_per
    if BLOCK_M == 1:
        acc = tl.zeros([BLOCK_K, BLOCK_N], dtype=tl.float32)
        for k in range(k0, k0 + k_per, BLOCK_K):
            ks = k + tl.arange(0, BLOCK_K)
            xv = _x_chunk(x_ptr, x_stride, nw_ptr, rows, row_ok, ks, inv, K, NORM, X_FROM)
            wv = tl.load(w_ptr + ks[:, None] * N + cols[None, :])
            acc += tl.reshape(xv.to(tl.float32), [BLOCK_K])[:, None] * wv.to(tl.float32)
        y = tl.sum(acc, axis=0)[None, :]
    else:
        y = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in range(k0, k0 + k_per, BLOCK_K):
            ks = k + tl.arange(0, BLOCK_K)
            xv = _x_chunk(x_ptr, x_stride, nw_ptr, rows, row_ok, ks, inv, K, NORM, X_FROM)
            wv = tl.load(w_ptr + ks[:, None] * N + cols[None, :])
            y += tl.dot(xv, wv)
    out = y_ptr + rows[:, None] * y_stride + cols[None, :]
    ok = row_ok[:, None] & (cols[None, :] < N)  # full-shaped: tl.atomic_add does not broadcast a [rows, 1] mask
    if MODE == 1:
        tl.atomic_add(out, y, mask=ok, sem="relaxed")
    else:
        tl.store(out, y.to(tl.bfloat16), mask=ok)


@triton.jit
def attend_part(qkv_ptr, qkv_stride, x_ptr, x_stride, k_cache, v_cache, cache_b, cache_h, cos_ptr, sin_ptr, pos_ptr,
                part_ml, part_acc, splits, scale, eps, D_MODEL: tl.constexpr, Q_HEADS: tl.constexpr,
                KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr):
    """Attention of one key/value head's query heads over one chunk of CHUNK positions (grid: (kv_heads, splits,
    batch)), the first half of split attention ("flash decoding"): many programs share the cache's reading.

    q, k and v come from the qkv product as float32 sums of the normalised input times the norm's weight: this kernel
    applies the RMSNorm's 1 / rms (read from the residual stream x: the qkv kernel need not wait for it), rounds them
    to bfloat16 as the reference's product does, and rotates q and k (rotary embedding). The chunk holding ``pos``
    writes the new k and v into the cache and uses them directly (another chunk's programs never read that row).
    Writes, per query head, the chunk's largest score, its sum of exponentials and its weighted sum of values; a
    chunk past ``pos`` writes an empty part (-inf, 0, 0); :func:`attend_combine` merges them.

    Every load comes before the first store: likely, the compiler does not move a load above a store to memory it
    cannot prove apart, so such a load would be issued late and its latency not overlap the others', in a kernel whose
    time is such latencies, not bytes (not checked in the generated code). The gain was measured only with the whole
    bundle of that change (q loaded once for the group as one tile, one-pass merging with blocks of up to 32 chunks,
    chunks of 32 positions with 2 warps; artifacts/capture_run.md), not alone.

    Merging the parts here instead (one launch a layer: the last program of each head group, counted by an atomic add,
    merges the group's parts) was tried and lost: on an H200 (2026-11-28, one process, the same kernels otherwise) the
    step at 576 positions took 4.330 ms against 4.204 with the two launches, attention alone 1.21x at 576 positions
    and 1.65x at 131,072 (8 merging programs of 2 warps against attend_combine's 32 of 4; artifacts/capture_run.md)."""
    g = tl.program_id(0)
    c = tl.program_id(1)
    b = tl.program_id(2)
    GROUP: tl.constexpr = Q_HEADS // KV_HEADS
    half: tl.constexpr = HEAD_DIM // 2
    d = tl.arange(0, HEAD_DIM)
    jj = tl.arange(0, GROUP)
    partner = (d + half) % HEAD_DIM
    sign = tl.where(d < half, -1.0, 1.0)
    row = qkv_ptr + b * qkv_stride
    k_off = Q_HEADS * HEAD_DIM + g * HEAD_DIM
    v_off = (Q_HEADS + KV_HEADS) * HEAD_DIM + g * HEAD_DIM
    q_rows = (g * GROUP + jj)[:, None] * HEAD_DIM
    base = b * cache_b + g * cache_h
    # loads: the step's inputs, then (their addresses need pos) the rotary tables and the chunk of the cache
    xv = tl.load(x_ptr + b * x_stride + tl.arange(0, D_MODEL))
    qa = tl.load(row + q_rows + d[None, :])
    qb = tl.load(row + q_rows + partner[None, :])
    ka = tl.load(row + k_off + d)
    kb = tl.load(row + k_off + partner)
    va = tl.load(row + v_off + d)
    pos = tl.load(pos_ptr)
    cos = tl.load(cos_ptr + pos * HEAD_DIM + d).to(tl.float32)
    sin = tl.load(sin_ptr + pos * HEAD_DIM + d).to(tl.float32)
    p = c * CHUNK + tl.arange(0, CHUNK)
    old = (p < pos)[:, None] & (d[None, :] < HEAD_DIM)
    kt = tl.load(k_cache + base + p[:, None] * HEAD_DIM + d[None, :], mask=old, other=0.0).to(tl.float32)
    vt = tl.load(v_cache + base + p[:, None] * HEAD_DIM + d[None, :], mask=old, other=0.0).to(tl.float32)
    # the norm's 1 / rms, the products' rounding, the rotation
    inv = 1.0 / tl.sqrt(tl.sum(xv * xv, axis=0) / D_MODEL + eps)
    q2 = (qa * inv).to(tl.bfloat16).to(tl.float32) * cos[None, :] + \
        sign[None, :] * (qb * inv).to(tl.bfloat16).to(tl.float32) * sin[None, :]
    q2 = q2.to(tl.bfloat16).to(tl.float32)
    k_new = ((ka * inv).to(tl.bfloat16).to(tl.float32) * cos
             + sign * (kb * inv).to(tl.bfloat16).to(tl.float32) * sin).to(tl.bfloat16)
    v_new = (va * inv).to(tl.bfloat16)
    is_new = (p == pos)[:, None] & (d[None, :] < HEAD_DIM)
    kt = tl.where(is_new, k_new.to(tl.float32)[None, :], kt)
    vt = tl.where(is_new, v_new.to(tl.float32)[None, :], vt)
    live = p <= pos
    for j in tl.static_range(GROUP):
        q = tl.sum(tl.where(jj[:, None] == j, q2, 0.0), axis=0)  # query head g * GROUP + j
        sc = tl.where(live, tl.sum(kt * q[None, :], axis=1) * scale, -float("inf"))
        m = tl.max(sc, axis=0)
        e = tl.exp(sc - tl.where(m == -float("inf"), 0.0, m))
        at = (b * Q_HEADS + g * GROUP + j) * splits + c
        tl.store(part_ml + 2 * at, m)
        tl.store(part_ml + 2 * at + 1, tl.sum(e, axis=0))
        tl.store(part_acc + at * HEAD_DIM + d, tl.sum(e[:, None] * vt, axis=0))
    if c == pos // CHUNK:
        tl.store(k_cache + base + pos * HEAD_DIM + d, k_new)
        tl.store(v_cache + base + pos * HEAD_DIM + d, v_new)


@triton.jit
def attend_combine(part_ml, part_acc, splits, att_ptr, att_stride, Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_S: tl.constexpr):
    """The second half of split attention (grid: (q_heads, batch)): one query head's chunks merged, BLOCK_S at a time
    (a running maximum rescales what came before, as online softmax does; one pass, so one trip to memory when the
    chunks fit in one block), divided, stored as bfloat16 into att [batch, q_heads x head_dim]."""
    h = tl.program_id(0)
    b = tl.program_id(1)
    d = tl.arange(0, HEAD_DIM)
    first = (b * Q_HEADS + h) * splits
    m_run = tl.max(tl.full([BLOCK_S], -float("inf"), tl.float32), axis=0)
    num = tl.zeros([HEAD_DIM], dtype=tl.float32)
    den = tl.sum(tl.zeros([BLOCK_S], dtype=tl.float32), axis=0)
    for s0 in range(0, splits, BLOCK_S):
        sp = s0 + tl.arange(0, BLOCK_S)
        ok = sp < splits
        mv = tl.load(part_ml + 2 * (first + sp), mask=ok, other=-float("inf"))
        lv = tl.load(part_ml + 2 * (first + sp) + 1, mask=ok, other=0.0)
        acc = tl.load(part_acc + (first + sp)[:, None] * HEAD_DIM + d[None, :], mask=ok[:, None] & (d[None, :] < HEAD_DIM),
                      other=0.0)
        m_new = tl.maximum(m_run, tl.max(mv, axis=0))  # finite: the first block holds chunk 0, never empty
        old_w = tl.exp(m_run - m_new)
        w = tl.exp(mv - m_new)
        den = den * old_w + tl.sum(w * lv, axis=0)
        num = num * old_w + tl.sum(w[:, None] * acc, axis=0)
        m_run = m_new
    tl.store(att_ptr + b * att_stride + h * HEAD_DIM + d, (num / den).to(tl.bfloat16))


@dataclass(frozen=True)
class Tile:
    """One matvec launch's shape: columns and K-rows per tile, K split over this many programs, warps, stages."""

    block_n: int
    block_k: int
    split: int
    warps: int
    stages: int


# Candidates timed at setup (batch 1), picked from a development sweep of 336 tiles per shape on an H200 (2026-11-27;
# unrecorded: artifacts/capture_run.md describes it): each shape's best there is among them. At more rows (MANY_ROWS)
# one tile shape at four splits is timed, the fastest that fits kept; the store-mode products (gate/up, the output
# projection) cannot split, so they have that one candidate. Nothing of the many-rows path came from a sweep.
CANDIDATES = [Tile(64, 128, s, w, st) for s in (1, 4, 8) for w in (4, 8) for st in (3, 5)] + [
    Tile(32, 128, 1, 4, 3), Tile(32, 128, 1, 8, 3), Tile(32, 256, 1, 8, 3), Tile(16, 256, 1, 4, 3), Tile(128, 32, 1, 4, 5)]
MANY_ROWS = [Tile(64, 64, s, 4, 3) for s in (1, 2, 4, 8)]


def block_m(rows: int) -> int:
    """Rows per program: 1 for one sequence (elementwise), else a power of two from 16 (tl.dot's least) to 64."""
    return 1 if rows == 1 else min(64, max(16, triton.next_power_of_2(rows)))


def fits(tile: Tile, k: int, n: int, mode: int = ADD) -> bool:
    """Whether ``tile`` divides a [k x n] matrix; a split over K needs ADD (the partial sums meet in the target)."""
    return n % tile.block_n == 0 and k % (tile.split * tile.block_k) == 0 and (tile.split == 1 or mode == ADD)


def launch(x: Any, w: Any, y: Any, tile: Tile, mode: int, norm_w: Any | None = None, eps: float = 1e-5,
           norm: int | None = None, x_from: int = PLAIN) -> None:
    """One matvec (:func:`matvec`): x [M, K] (float32 if ``norm_w`` is given, else bfloat16; [M, 2K] if GATED) times
    w [K, N] into y.
    ``norm``: matvec's NORM (default: 1, the whole RMSNorm, where ``norm_w`` is given and x is PLAIN)."""
    rows = x.shape[0]
    k, n = w.shape
    if not fits(tile, k, n, mode):
        raise ValueError(f"tile {tile} does not divide [{k} x {n}]")
    if norm is None:
        norm = 1 if norm_w is not None and x_from == PLAIN else 0
    bm = block_m(rows)
    grid = (n // tile.block_n, tile.split, triton.cdiv(rows, bm))
    matvec[grid](x, x.stride(0), norm_w if norm_w is not None else x, w, y, y.stride(0), rows, k, n, k // tile.split,
                 eps, BLOCK_M=bm, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, NORM=norm, MODE=mode,
                 X_FROM=x_from, NORM_CHUNK=min(NORM_BLOCK, k),
                 num_warps=tile.warps, num_stages=tile.stages)


def tune(role: str, weights: list[Any], x: Any, y: Any, mode: int, norm_w: Any | None, eps: float,
         norm: int | None = None, x_from: int = PLAIN, repeats: int = 5) -> tuple[Tile, list[tuple[Tile, float]]]:
    """The fastest candidate for one role (qkv, o, gate_up, down, head) at this batch: each candidate launched once over
    every layer's matrix (a graph of them, so the time is the kernels' and not Python's), median of ``repeats``;
    ADD's target accumulates meaningless sums (its contents do not matter here). Returns the best and every timing."""
    k, n = weights[0].shape
    cands = CANDIDATES if x.shape[0] == 1 else MANY_ROWS
    timings: list[tuple[Tile, float]] = []
    for tile in cands:
        if not fits(tile, k, n, mode):
            continue

        def run(tile: Tile = tile) -> None:
            for w in weights:
                launch(x, w, y, tile, mode, norm_w, eps, norm, x_from)
        try:
            ms = _graph_ms(run, repeats)
        except Exception:  # a tile the compiler or the GPU refuses (shared memory): not a candidate here
            continue
        timings.append((tile, ms))
    if not timings:
        raise RuntimeError(f"no matvec tile fits {role}'s [{k} x {n}] at {x.shape[0]} rows")
    return min(timings, key=lambda t: t[1])[0], timings


def _graph_ms(fn: Callable[[], None], repeats: int) -> float:
    """Median ms of ``fn`` replayed as one CUDA graph (its kernels' time, not Python's), over ``repeats`` replays. On a
    CPU (Triton's interpreter: tests only) the wall time of plain calls, which measures the interpreter, nothing else."""
    if not torch.cuda.is_available():
        import time

        walls = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            walls.append((time.perf_counter() - t0) * 1e3)
        return sorted(walls)[len(walls) // 2]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


class TritonLayers:
    """Every layer of a decoding step as six kernels (the module's text), over the model's BF16
    weights as stored (``wqkv``, ``wo``, ``w_gate_up``, ``w_down``: no copy) and the shared static cache, for
    ``batch`` sequences. ``tiles`` holds the tuned tile per role (:meth:`tune_all`, at setup)."""

    ROLES = ("qkv", "o", "gate_up", "down", "head")
    CHUNK = 32  # positions per program of split attention (32 with 2 warps: the fastest of five pairs of 16-64
    # positions and 2-8 warps timed on an H200 in development, unrecorded: artifacts/capture_run.md)
    ATTENTION_WARPS = 2

    def __init__(self, model: Any, cache: Any, batch: int) -> None:
        cfg = model.cfg
        self.model, self.cache, self.cfg, self.batch = model, cache, cfg, batch
        dev = model.device
        qkv = (cfg.q_heads + 2 * cfg.kv_heads) * cfg.head_dim
        self.splits = triton.cdiv(cache.k[0].shape[2], self.CHUNK)
        self.x = torch.zeros((batch, cfg.d_model), dtype=torch.float32, device=dev)  # the residual stream
        self.qkv = torch.zeros((cfg.layers, batch, qkv), dtype=torch.float32, device=dev)  # per layer: zeroed per step
        self.part_ml = torch.zeros((batch, cfg.q_heads, self.splits, 2), dtype=torch.float32, device=dev)
        self.part_acc = torch.zeros((batch, cfg.q_heads, self.splits, cfg.head_dim), dtype=torch.float32, device=dev)
        self.att = torch.zeros((batch, cfg.q_heads * cfg.head_dim), dtype=model.dtype, device=dev)
        self.h = torch.zeros((batch, 2 * cfg.ffn), dtype=model.dtype, device=dev)  # gate, then up
        self.logits = torch.zeros((batch, cfg.vocab), dtype=model.dtype, device=dev)
        self.tiles: dict[str, Tile] = {}
        self.timings: dict[str, list[tuple[Tile, float]]] = {}

    def _role(self, role: str, layer: int = 0) -> dict[str, Any]:
        """One role's matrices (every layer's; the output projection's one) and :func:`launch`'s other arguments for
        layer ``layer``, as the step launches it (tuning uses layer 0's: the targets' contents do not matter there)."""
        m, w = self.model, self.model.layers[layer]
        L = m.layers
        if role == "qkv":  # the norm's weight here, its 1 / rms in attend_part
            return dict(weights=[u["wqkv"] for u in L], x=self.x, y=self.qkv[layer], mode=ADD, norm_w=w["attn_norm"],
                        norm=2)
        if role == "o":
            return dict(weights=[u["wo"] for u in L], x=self.att, y=self.x, mode=ADD, norm_w=None)
        if role == "gate_up":
            return dict(weights=[u["w_gate_up"] for u in L], x=self.x, y=self.h, mode=STORE, norm_w=w["mlp_norm"])
        if role == "down":
            return dict(weights=[u["w_down"] for u in L], x=self.h, y=self.x, mode=ADD, norm_w=None, x_from=GATED)
        return dict(weights=[m.lm_head], x=self.x, y=self.logits, mode=STORE, norm_w=m.final_norm)

    def tune_all(self) -> dict[str, Tile]:
        for role in self.ROLES:
            self.tiles[role], self.timings[role] = tune(role, eps=self.cfg.norm_eps, **self._role(role))
        self.x.zero_()
        return self.tiles

    def matvec(self, role: str, layer: int) -> None:
        """Layer ``layer``'s product of ``role`` (the output projection: ``head``, any layer)."""
        args = self._role(role, 0 if role == "head" else layer)
        w = args.pop("weights")[0 if role == "head" else layer]
        launch(args.pop("x"), w, args.pop("y"), self.tiles[role], args.pop("mode"), eps=self.cfg.norm_eps, **args)

    def attention(self, i: int, pos: Any) -> None:
        """Layer ``i``'s attention: :func:`attend_part` over chunks of the cache, then :func:`attend_combine`."""
        cfg, kc, vc = self.cfg, self.cache.k[i], self.cache.v[i]
        attend_part[(cfg.kv_heads, self.splits, self.batch)](
            self.qkv[i], self.qkv.stride(1), self.x, self.x.stride(0), kc, vc, kc.stride(0), kc.stride(1),
            self.model.cos, self.model.sin, pos, self.part_ml, self.part_acc, self.splits, 1.0 / math.sqrt(cfg.head_dim),
            cfg.norm_eps, D_MODEL=cfg.d_model, Q_HEADS=cfg.q_heads, KV_HEADS=cfg.kv_heads, HEAD_DIM=cfg.head_dim,
            CHUNK=self.CHUNK, num_warps=self.ATTENTION_WARPS)
        attend_combine[(cfg.q_heads, self.batch)](
            self.part_ml, self.part_acc, self.splits, self.att, self.att.stride(0), Q_HEADS=cfg.q_heads,
            HEAD_DIM=cfg.head_dim, BLOCK_S=min(32, triton.next_power_of_2(self.splits)), num_warps=4)

    def breakdown(self, tokens: Any, pos: Any, repeats: int = 9) -> list[dict[str, Any]]:
        """Each part of the step timed alone, over every layer, as a graph of its kernels (:func:`_graph_ms`): the whole
        forward, attention (two kernels a layer), each product's role, with the bytes of its matrices and the rate
        they imply. Parts timed alone start with idle memory and caches as the step does not leave them, so their sum
        need not equal the forward; it says which part is furthest from the copy's rate, not the step's exact split.
        The products' inputs are whatever the buffers hold (their values do not change the time)."""
        layers = range(len(self.model.layers))
        parts: list[tuple[str, Callable[[], Any], int]] = [
            ("forward", lambda: self.forward(tokens, pos), 0),
            ("attention", lambda: [self.attention(i, pos) for i in layers], 0)]
        for role in self.ROLES:
            weights = self._role(role)["weights"]
            run = (lambda role=role: self.matvec(role, 0)) if role == "head" else (
                lambda role=role: [self.matvec(role, i) for i in layers])
            parts.append((role, run, sum(w.numel() * w.element_size() for w in weights)))
        rows = []
        for name, run, nbytes in parts:
            ms = _graph_ms(run, repeats)
            rows.append({"part": name, "ms": ms, "us_per_layer": ms * 1e3 / (1 if name in ("forward", "head") else
                                                                                 len(layers)),
                         "bytes": nbytes, "GB_per_s": nbytes / ms / 1e6 if nbytes else None})
        return rows

    def forward(self, tokens: Any, pos: Any) -> Any:
        """The step's logits [batch, vocab] (bfloat16) for ``tokens`` [batch, 1] at position ``pos`` (a device
        tensor): every layer's kernels, then the final norm and the output projection as one matvec."""
        m = self.model
        self.x.copy_(m.embed.index_select(0, tokens.view(-1)))
        self.qkv.zero_()
        for i in range(len(m.layers)):
            self.matvec("qkv", i)
            self.attention(i, pos)
            self.matvec("o", i)
            self.matvec("gate_up", i)
            self.matvec("down", i)
        self.matvec("head", 0)
        return self.logits
