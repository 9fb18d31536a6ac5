"""One decoding step under Nsight Compute: per kernel, the bytes it read from DRAM, its time, the bandwidth it
achieved and ncu's share of the DRAM peak, and the same grouped by the role of the layer's work.

Chapter 12's ladder measures a whole step (decode GB/s over the device copy's); this module says where the step's
time goes when that share is short of the copy's: which matrix products stream their weights near the peak and
which do not, and how much time the work between them (attention, norms, the step's bookkeeping) takes.
``scripts/capture_ch12.py --only ncu`` makes the reports (``artifacts/ch12/decode_ncu_<rung>.ncu-rep``: one
decoding step at batch 1 of ``compile_graph``, ``fused_graph`` and ``int8_graph``, each kernel of the graph profiled as
its own result, with :data:`NCU_METRICS`; ``int8_graph``'s matrices are read with ``dtype_bytes=1``).

How a kernel gets its role (:func:`step_kernels`). Kernel names do not tell: cuBLAS's matrix-vector kernels are
the same for q and for o, and Inductor names its kernels after the operations it fused
(``triton_red_fused_...``). The bytes do: at batch 1 a matrix product reads its weight matrix, megabytes, and
nothing else in a layer reads a block that large (8b's smallest matrix, k's, is 8.4 MB; a layer's KV cache at
512 positions 2 MB). So a kernel that read at least ``min_share`` of the smallest weight matrix is a matrix
product, and the step's matrix products come in the model's order: per layer q/k/v, o, gate/up, down, then the
output projection (:func:`weight_roles`). They are matched in that order, each role taking kernels until their
bytes reach ``1 - tolerance`` of its matrices' (q, k and v count as one role, fused or not, and so do gate and
up; a product split over two kernels is matched the same way). A small kernel right after a product's that finishes
its reduction (:data:`FINISHER`: Inductor's ``triton_per_*_mm_*``, cuBLAS's ``splitKreduce``) is that product's.
Every other kernel is ``attention`` if it runs
after a layer's q/k/v products and before its o product (rotary embeddings, the cache write, scores, softmax,
the weighted sum), else ``other`` (embedding, norms, residual adds, SiLU x up, the top-k and the step's copies).
A report that does not hold every matrix of one step, or holds more, is refused with a sentence.

Where Inductor fuses a norm or SiLU x up into a matrix product's kernel, that work counts with the product (its
bytes are the weights'); :func:`role_table`'s ``read_over_weights`` shows how each role's bytes compare with its
matrices', so a misread shows. Untested on a real report of a decoding step: the tests build a details page in
ncu's CSV format (the format of ``artifacts/ch00/saxpy_sol.csv``) with the kernels a step of the small
configuration runs; the first GPU run of ``--only ncu`` is this reader's first real input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import GpuprofError

__all__ = ["NCU_METRICS", "ROLES", "WeightBlock", "weight_roles", "step_kernels", "role_table", "read_kernel_metrics",
           "write_kernel_table"]

DURATION, READ, DRAM_PCT = ("gpu__time_duration.sum", "dram__bytes_read.sum",
                            "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed")
NCU_METRICS = [DURATION, READ, DRAM_PCT]
ROLES = ("qkv", "o", "gate/up", "down", "attention", "lm_head", "other")
# The second kernel of a product split over its reduction: Inductor's generated matrix-vector product at batch 1 is a
# split reduction, a ``triton_red_*mm*`` kernel that streams the weights into partial sums, then a ``triton_per_*mm*``
# kernel that adds the partials (it reads kilobytes); cuBLAS's split-K products end in ``splitKreduce_kernel``. Right
# after a product's kernel, such a kernel belongs to that product (a reader found 96 of them filed as attention and
# other in chapter 12's first tables).
FINISHER = re.compile(r"^triton_per_\w*_mm_|splitKreduce")


@dataclass(frozen=True)
class WeightBlock:
    """The matrices of one role in one layer (layer -1: the output projection), and their bytes."""

    role: str
    layer: int
    bytes: int


def weight_roles(cfg: Any, dtype_bytes: int = 2) -> list[WeightBlock]:
    """The weight blocks a decoding step reads, in the order it reads them: per layer q/k/v (one block, whether one
    product or three), o, gate/up (one block), down; then the output projection. ``cfg``: llm_decode.py's Config."""
    d, q, kv, ffn = cfg.d_model, cfg.q_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.ffn
    per_layer = (("qkv", d * (q + 2 * kv)), ("o", q * d), ("gate/up", 2 * d * ffn), ("down", ffn * d))
    blocks = [WeightBlock(role, i, n * dtype_bytes) for i in range(cfg.layers) for role, n in per_layer]
    return blocks + [WeightBlock("lm_head", -1, d * cfg.vocab * dtype_bytes)]


def read_kernel_metrics(source: str | Path | pd.DataFrame) -> pd.DataFrame:
    """One row per profiled kernel in launch order: ``kernel``, ``nvtx`` (the push/pop ranges open at its launch, where
    the source has them: a report does, a details CSV does not) and :data:`NCU_METRICS` in base units (ns, bytes, %).

    ``source``: an ``.ncu-rep`` (or ``.ncu-rep.gz``) report, its ``--page details`` CSV, a kernel table that
    :func:`write_kernel_table` wrote (``*.kernels.csv``), or a table already read."""
    if isinstance(source, pd.DataFrame):
        table = source.copy()
    elif str(source).endswith(".kernels.csv"):
        table = pd.read_csv(source, keep_default_na=False, na_values={m: [""] for m in NCU_METRICS})
    elif str(source).endswith(".csv"):
        from ..ncu.csv_reader import metric_columns, read_details

        table = metric_columns(read_details(source), NCU_METRICS)
    else:
        from ..ncu.report import kernels, metric_table

        table = metric_table(source, NCU_METRICS).reset_index(drop=True)
        table["nvtx"] = kernels(source)["nvtx"].to_numpy()
    missing = [m for m in NCU_METRICS if m not in table]
    if missing:
        raise GpuprofError(f"The ncu data lacks {', '.join(missing)}.",
                           f"Profile with --metrics {','.join(NCU_METRICS)} (scripts/capture_ch12.py --only ncu does).")
    if "nvtx" not in table:
        table["nvtx"] = ""
    return table[["kernel", "nvtx", *NCU_METRICS]].reset_index(drop=True)


def write_kernel_table(source: str | Path | pd.DataFrame, path: str | Path) -> Path:
    """Write :func:`read_kernel_metrics`'s table to ``path`` (a CSV named ``*.kernels.csv``) and return it.

    Why: a report of one decoding step holds every kernel's SpeedOfLight section and launch record, 71 MB for the
    502 kernels of a compiled step (11 MB gzipped), far more than the course keeps; the reader needs five columns.
    The table keeps them for every kernel, in launch order, so a reference made from it reads exactly as the report
    did (tested)."""
    path = Path(path)
    if not path.name.endswith(".kernels.csv"):
        raise GpuprofError(f"{path.name}: a kernel table's name ends in .kernels.csv (that is how it is read back).",
                           "Name it like decode_ncu_fused_graph.kernels.csv.")
    read_kernel_metrics(source).to_csv(path, index=False)
    return path


def step_kernels(source: str | Path | pd.DataFrame, cfg: Any, dtype_bytes: int = 2, step_range: str | None = None,
                 min_share: float = 0.5, tolerance: float = 0.05) -> pd.DataFrame:
    """The kernels of one decoding step, in launch order, each with its role and layer (the module's text gives the
    rule), time (us), bytes read (MB), the read bandwidth it achieved (GB/s: bytes read over its duration) and ncu's
    DRAM throughput as a share of the peak (reads and writes; ``dram_pct``).

    ``step_range``: keep only kernels inside every range it names (``rung_fused_graph_b1/decode_step_4``: a
    report's ``nvtx`` joins the open push/pop ranges with ``/``, compared here in any order); a source without NVTX
    (a CSV) is taken whole."""
    table = read_kernel_metrics(source)
    if step_range:
        if table["nvtx"].astype(bool).any():
            # every named range open around the kernel, in any order: ncu's API calls its push/pop list "sorted",
            # which may not be the stack's order
            wanted = set(step_range.split("/"))
            table = table[table["nvtx"].map(lambda path: wanted <= set(str(path).split("/")))].reset_index(drop=True)
        if table.empty:
            raise GpuprofError(f"No profiled kernel ran inside the NVTX range {step_range!r}.",
                               "Profile with --nvtx and an --nvtx-include filter on that range.")
    blocks = weight_roles(cfg, dtype_bytes)
    smallest = min(cfg.kv_heads * cfg.head_dim, cfg.q_heads * cfg.head_dim) * cfg.d_model * dtype_bytes
    roles, layers = [], []
    at, got, last = 0, 0.0, "other"
    product = None  # the role of the kernel just before, when it was a product (or its finisher)
    for name, bytes_read in zip(table["kernel"].astype(str), table[READ].to_numpy(dtype=float)):
        if bytes_read < min_share * smallest and product is not None and FINISHER.search(name):
            roles.append(product)
            layers.append(layers[-1])
            continue
        product = None
        if bytes_read >= min_share * smallest:
            if at == len(blocks):
                raise GpuprofError(f"The step read more weight-sized blocks than the model has matrices ({len(blocks)} "
                                   f"blocks for {cfg.layers} layers): the report holds more than one step, or another model.",
                                   "Filter one step (--nvtx-include ...decode_step_N/) and pass the run's configuration.")
            block = blocks[at]
            roles.append(block.role)
            layers.append(block.layer)
            last, got, product = block.role, got + bytes_read, block.role
            if got >= (1 - tolerance) * block.bytes:
                at, got = at + 1, 0.0
        else:
            roles.append("attention" if last == "qkv" else "other")
            layers.append(layers[-1] if layers else 0)
    if at < len(blocks):
        raise GpuprofError(f"The profiled kernels read {at} of the {len(blocks)} weight blocks one decoding step reads "
                           f"(next: {blocks[at].role} of layer {blocks[at].layer}): not one whole step.",
                           "Raise ncu's -c limit, or check the NVTX filter and the model's configuration.")
    time_ns, read = table[DURATION].to_numpy(dtype=float), table[READ].to_numpy(dtype=float)
    return pd.DataFrame({"kernel": table["kernel"], "role": roles, "layer": layers, "time_us": time_ns / 1e3,
                         "read_MB": read / 1e6, "read_GBps": np.where(time_ns > 0, read / np.maximum(time_ns, 1e-9), np.nan),
                         "dram_pct": table[DRAM_PCT].to_numpy(dtype=float)})


def role_table(kernels: pd.DataFrame, cfg: Any, dtype_bytes: int = 2, copy_gbps: float | None = None) -> pd.DataFrame:
    """Per role (:data:`ROLES`, those present): kernels, time (us) and its share of the step's kernel time, bytes
    read (MB) and their ratio to the role's weight matrices (``read_over_weights``; attention and other have none),
    the read bandwidth (GB/s: bytes over time), ncu's DRAM share of peak weighted by time (the share the role's
    kernels kept the DRAM busy, reads and writes), and with ``copy_gbps`` the bandwidth as a share of that measured
    copy. A last row ``step`` sums the step. ``kernels``: :func:`step_kernels`."""
    weights: dict[str, int] = {}
    for b in weight_roles(cfg, dtype_bytes):
        weights[b.role] = weights.get(b.role, 0) + b.bytes
    total_us = float(kernels["time_us"].sum())
    rows = []
    groups = [(r, kernels[kernels["role"] == r]) for r in ROLES if (kernels["role"] == r).any()] + [("step", kernels)]
    for role, g in groups:
        us, mb = float(g["time_us"].sum()), float(g["read_MB"].sum())
        expected = sum(weights.values()) if role == "step" else weights.get(role)
        row = {"role": role, "kernels": len(g), "time_us": us, "share_of_time": us / total_us if total_us else np.nan,
               "read_MB": mb, "read_over_weights": mb * 1e6 / expected if expected else np.nan,
               "read_GBps": mb * 1e6 / (us * 1e3) if us else np.nan,
               "dram_pct_of_peak": float((g["dram_pct"] * g["time_us"]).sum() / us) if us else np.nan}
        if copy_gbps:
            row["share_of_copy"] = row["read_GBps"] / copy_gbps
        rows.append(row)
    return pd.DataFrame(rows).set_index("role")
