"""Kernels grouped by what their names say they do (gpuprof.kernel_kinds), on names from real captures and on
chapter 6's reference capture."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpuprof.artifacts import REPO_ROOT
from gpuprof.kernel_kinds import kernel_kind, time_by_kind
from gpuprof.nsys import sqlite as ns

REF = REPO_ROOT / "artifacts" / "ch06"


@pytest.mark.parametrize("name, kind", [
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", "convolution"),
    ("sm80_xmma_dgrad_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc", "convolution"),
    ("wgrad_alg0_engine", "convolution"),
    ("ampere_sgemm_128x64_tn", "matrix product"),
    ("multi_tensor_apply_kernel", "optimizer"),
    ("max_pool_backward_nhwc", "pooling"),
    ("vectorized_elementwise_kernel", "elementwise"),
    ("reduce_kernel", "reduction"),
    ("nchwToNhwcKernel", "layout change"),
    ("triton_poi_fused_relu_0", "fused (torch.compile)"),
    ("something_new", "other"),
    # NCCL's kernels, as chapter 8's captures name them: communication, not a reduction or indexing
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "communication"),
    ("ncclDevKernel_AllGather_RING_LL", "communication"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float", "communication"),
])
def test_kernel_kind(name, kind):
    assert kernel_kind(name) == kind


def test_time_by_kind_shares_sum_to_one():
    t = time_by_kind(ns.kernels(REF / "rung8.sqlite"))
    assert np.isclose(t["share"].sum(), 1) and t["time_ms"].is_monotonic_decreasing
    assert time_by_kind(pd.DataFrame(columns=["name", "duration_ns"])).empty


def test_the_kernels_of_a_two_rank_capture_are_counted_as_communication():
    """Chapter 8's reference rank 0 export: every NCCL kernel is communication, and nothing else is."""
    k = ns.kernels(REPO_ROOT / "artifacts" / "ch08" / "buckets_rank0.sqlite")
    t = time_by_kind(k).set_index("kind")
    nccl = k["name"].str.startswith("nccl")
    assert nccl.any() and t.loc["communication", "kernels"] == nccl.sum()
