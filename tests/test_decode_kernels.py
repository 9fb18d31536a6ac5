"""gpuprof.studies.decode_kernels: the kernels of one decoding step under ncu, by role.

No ncu report of a decoding step exists yet (scripts/capture_ch12.py --only ncu makes the first on a GPU), so the
fixture is built here: a ``--page details`` CSV in the format ncu writes (the columns and scaled units of
artifacts/ch00/saxpy_sol.csv: ``Mbyte``, ``Kbyte``, ``us``, ``%``, thousands separators) holding the kernels one step
of llm_decode.py's small configuration in bfloat16 would run, with the bytes its matrices have and made-up times.
The numbers are synthetic: the tests check the reading and the grouping, not a GPU's behaviour."""

from __future__ import annotations

import pytest

from gpuprof.errors import GpuprofError
from gpuprof.studies import decode_kernels as dk
from gpuprof.studies.llm_inference import model_config

CFG = model_config("tiny")  # 2 layers, width 256, q 256, k/v 64 each, mlp 688, vocabulary 1,024
E = 2  # bfloat16
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value","Rule Name","Rule Type",'
          '"Rule Description","Estimated Speedup Type","Estimated Speedup"')
SMALL = 3_000  # bytes a kernel that is not a matrix product reads here (norms, rotary, attention over 36 positions)


def _step(fused: bool, e: int = E) -> list[tuple[str, int]]:
    """(kernel name, bytes read) of one step, in launch order, as llm_decode.py's fixed-shape layer issues them; ``e``:
    the matrices' element size (1: int8_graph's, each product also reading its BF16 scales, within the 512 extra)."""
    d, q, kv, ffn = CFG.d_model, CFG.q_heads * CFG.head_dim, CFG.kv_heads * CFG.head_dim, CFG.ffn
    out = [("embedding", SMALL)]
    for _ in range(CFG.layers):
        out.append(("rms_norm", SMALL))
        if fused:
            out.append(("gemv_qkv", d * (q + 2 * kv) * e + 512))
        else:
            out += [("gemv", d * q * e + 512), ("gemv", d * kv * e + 512), ("gemv", d * kv * e + 512)]
        out += [("rotary", SMALL), ("rotary", SMALL), ("index_copy", SMALL), ("index_copy", SMALL), ("scores", SMALL),
                ("softmax", SMALL), ("weighted_sum", SMALL), ("gemv", q * d * e + 512), ("add_rms_norm", SMALL)]
        if fused:
            out.append(("gemv_gate_up", 2 * d * ffn * e + 512))
        else:
            out += [("gemv", d * ffn * e + 512), ("gemv", d * ffn * e + 512)]
        out += [("silu_mul", SMALL), ("gemv_splitk", ffn * d * e // 2), ("splitk_reduce", SMALL // 2),
                ("gemv_splitk", ffn * d * e // 2), ("add", SMALL)]
    return out + [("rms_norm", SMALL), ("gemv", d * CFG.vocab * e + 512), ("topk", SMALL), ("copy", SMALL)]


def _csv(kernels: list[tuple[str, int]]) -> str:
    """A details page: per kernel the three metrics, with ncu's scaled units (the time is 1 ns per 2 bytes read + 2 us,
    the DRAM share made up)."""
    lines = [HEADER]
    for i, (name, nbytes) in enumerate(kernels):
        ns = nbytes / 2 + 2000
        size = (f"{nbytes / 1e6:,.6f}", "Mbyte") if nbytes >= 1e6 else (f"{nbytes / 1e3:,.3f}", "Kbyte")
        pct = f"{min(95.0, nbytes / 1e4):.2f}"
        for metric, unit, value in ((dk.DURATION, "us", f"{ns / 1e3:,.3f}"), (dk.READ, size[1], size[0]),
                                    (dk.DRAM_PCT, "%", pct)):
            lines.append(f'"{i}","1","python3","127.0.0.1","{name}","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0",'
                         f'"Command line profiler metrics","{metric}","{unit}","{value}",')
    return "\n".join(lines) + "\n"


@pytest.fixture(params=[False, True], ids=["separate", "fused"])
def step_csv(tmp_path, request):
    path = tmp_path / f"decode_{'fused' if request.param else 'separate'}.details.csv"
    path.write_text("==PROF== Connected to process 1\n" + _csv(_step(request.param)))
    return path, request.param


def test_every_kernel_gets_its_layer_role_from_the_bytes_it_read(step_csv):
    path, fused = step_csv
    k = dk.step_kernels(path, CFG, E)
    names = [n for n, _ in _step(fused)]
    assert list(k["kernel"]) == names
    per_layer = {"qkv": 1 if fused else 3, "o": 1, "gate/up": 1 if fused else 2, "down": 2}
    for role, n in per_layer.items():
        assert (k["role"] == role).sum() == n * CFG.layers, role
    assert list(k.loc[k["kernel"] == "gemv", "role"])[-1] == "lm_head"
    # between a layer's q/k/v products and its o product: attention; the rest is other
    att = k[k["role"] == "attention"]
    assert set(att["kernel"]) == {"rotary", "index_copy", "scores", "softmax", "weighted_sum"}
    assert len(att) == 7 * CFG.layers
    assert set(k.loc[k["role"] == "other", "kernel"]) == {"embedding", "rms_norm", "add_rms_norm", "silu_mul",
                                                         "splitk_reduce", "add", "topk", "copy"}
    assert list(k.loc[k["role"] == "o", "layer"]) == list(range(CFG.layers))
    # the CSV's scaled units are read back to the bytes and times written
    nbytes = [b for _, b in _step(fused)]
    assert k["read_MB"].to_numpy() * 1e6 == pytest.approx(nbytes, rel=1e-5)
    assert k["time_us"].to_numpy() == pytest.approx([(b / 2 + 2000) / 1e3 for b in nbytes], rel=1e-4)


def test_the_role_table_sums_the_step_and_compares_bytes_with_the_weights(step_csv):
    path, fused = step_csv
    k = dk.step_kernels(path, CFG, E)
    t = dk.role_table(k, CFG, E, copy_gbps=3.0)
    assert list(t.index) == ["qkv", "o", "gate/up", "down", "attention", "lm_head", "other", "step"]
    assert t.loc["step", "kernels"] == len(k) and t.loc["step", "time_us"] == pytest.approx(k["time_us"].sum())
    assert t.drop("step")["share_of_time"].sum() == pytest.approx(1.0)
    d, q, kv = CFG.d_model, CFG.q_heads * CFG.head_dim, CFG.kv_heads * CFG.head_dim
    qkv_weights = CFG.layers * d * (q + 2 * kv) * E
    extra = CFG.layers * (1 if fused else 3) * 512
    assert t.loc["qkv", "read_over_weights"] == pytest.approx((qkv_weights + extra) / qkv_weights)
    assert t.loc["down", "read_over_weights"] == pytest.approx(1.0)
    g = k[k["role"] == "o"]
    assert t.loc["o", "read_GBps"] == pytest.approx(g["read_MB"].sum() * 1e6 / (g["time_us"].sum() * 1e3))
    assert t.loc["o", "share_of_copy"] == pytest.approx(t.loc["o", "read_GBps"] / 3.0)
    # ncu's share of peak, weighted by time: a kernel twice as long counts twice
    expect = (g["dram_pct"] * g["time_us"]).sum() / g["time_us"].sum()
    assert t.loc["o", "dram_pct_of_peak"] == pytest.approx(expect)


def test_a_report_without_one_whole_step_is_refused(tmp_path):
    cut = tmp_path / "cut.details.csv"
    cut.write_text(_csv(_step(True)[:-4]))  # the output projection missing
    with pytest.raises(GpuprofError, match=r"read 8 of the 9 weight blocks one decoding step reads \(next: lm_head"):
        dk.step_kernels(cut, CFG, E)
    two = tmp_path / "two.details.csv"
    two.write_text(_csv(_step(True) + _step(True)))
    with pytest.raises(GpuprofError, match="more weight-sized blocks than the model has matrices"):
        dk.step_kernels(two, CFG, E)


def test_a_swapped_order_is_not_read_as_the_model(tmp_path):
    """gate/up before o: the o matrix (256 x 256) is smaller than gate/up's, so the bytes do not fit the roles in
    order and the step is refused rather than grouped wrongly."""
    steps = _step(True)
    o = next(i for i, (n, _) in enumerate(steps) if n == "gemv")
    gu = next(i for i, (n, _) in enumerate(steps) if n == "gemv_gate_up")
    steps[o], steps[gu] = steps[gu], steps[o]
    bad = tmp_path / "bad.details.csv"
    bad.write_text(_csv(steps))
    k = None
    with pytest.raises(GpuprofError):
        k = dk.step_kernels(bad, CFG, E)
    assert k is None


def test_the_nvtx_filter_keeps_one_steps_kernels_and_a_missing_metric_is_named():
    import pandas as pd

    rows = [(n, b) for n, b in _step(True)]
    table = pd.DataFrame({"kernel": [n for n, _ in rows] * 2,
                          "nvtx": ["warmup/decode_step_4"] * len(rows) + ["rung_fused_graph_b1/decode_step_4"] * len(rows),
                          dk.DURATION: [1000.0] * 2 * len(rows), dk.READ: [float(b) for _, b in rows] * 2,
                          dk.DRAM_PCT: [50.0] * 2 * len(rows)})
    with pytest.raises(GpuprofError, match="more weight-sized blocks"):
        dk.step_kernels(table, CFG, E)
    k = dk.step_kernels(table, CFG, E, step_range="rung_fused_graph_b1/decode_step_4")
    assert len(k) == len(rows)
    # ncu's API may list the open ranges in another order than the stack's: the match does not depend on it
    swapped = table.assign(nvtx=table["nvtx"].map(lambda p: "/".join(reversed(p.split("/")))))
    assert len(dk.step_kernels(swapped, CFG, E, step_range="rung_fused_graph_b1/decode_step_4")) == len(rows)
    with pytest.raises(GpuprofError, match="No profiled kernel ran inside the NVTX range 'rung_x'"):
        dk.step_kernels(table, CFG, E, step_range="rung_x")
    with pytest.raises(GpuprofError, match=r"lacks dram__bytes_read\.sum"):
        dk.step_kernels(table.drop(columns=[dk.READ]), CFG, E)


def test_an_int8_step_is_read_with_one_byte_a_weight(tmp_path):
    """int8_graph's step (fused products, each reading one byte a weight, the cast and scale fused into it) read with
    the element size 1 gets the same roles; read as BF16 (2), its blocks do not fill: refused with a sentence."""
    path = tmp_path / "decode_int8.details.csv"
    path.write_text(_csv(_step(True, 1)))
    k = dk.step_kernels(path, CFG, 1)
    for role, n in {"qkv": 1, "o": 1, "gate/up": 1, "down": 2}.items():
        assert (k["role"] == role).sum() == n * CFG.layers, role
    assert list(k.loc[k["kernel"] == "gemv", "role"])[-1] == "lm_head"
    with pytest.raises(GpuprofError, match=r"read 3 of the 9 weight blocks one decoding step reads"):
        dk.step_kernels(path, CFG, 2)


def test_a_kernel_table_reads_back_as_its_source_did(step_csv, tmp_path):
    path, _ = step_csv
    table = dk.write_kernel_table(path, tmp_path / "step.kernels.csv")
    a, b = dk.step_kernels(path, CFG, E), dk.step_kernels(table, CFG, E)
    import pandas as pd

    pd.testing.assert_frame_equal(a, b)
    with pytest.raises(GpuprofError, match="kernels.csv"):
        dk.write_kernel_table(path, tmp_path / "step.csv")


REFERENCE = {"fused_graph": 2, "int8_graph": 1}  # artifacts/ch12's kernel tables (H200, 2026-11-27) and element sizes


@pytest.mark.parametrize("rung", sorted(REFERENCE))
def test_the_committed_step_tables_hold_one_whole_step_of_8b(rung):
    """The real references: one step of 502 kernels, every weight matrix matched once, its bytes those of the weights
    (within 4%: a split reduction's finishing kernel reads its partial sums, 0.79 MB a layer for qkv), the output
    projection one kernel (the reader's rule would fail loudly on a partial or doubled step)."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "artifacts" / "ch12" / f"decode_ncu_{rung}.kernels.csv"
    cfg = model_config("8b")
    k = dk.step_kernels(path, cfg, REFERENCE[rung], step_range=f"rung_{rung}_b1/decode_step_4")
    t = dk.role_table(k, cfg, REFERENCE[rung])
    assert len(k) == 502 and t.loc["lm_head", "kernels"] == 1
    for role in ("qkv", "o", "gate/up", "down", "lm_head"):
        assert t.loc[role, "read_over_weights"] == pytest.approx(1.0, abs=0.04), role
    assert (k["role"] == "o").sum() == 2 * cfg.layers  # the product and its finishing kernel, per layer


def test_a_split_reductions_finishing_kernel_counts_with_its_product(tmp_path):
    """Inductor's matrix-vector product at batch 1 is two kernels (``triton_red_*mm*`` streams the weights into partial
    sums, ``triton_per_*mm*`` adds them), cuBLAS's split-K one ends in ``splitKreduce_kernel``: right after a
    product, such a kernel is the product's; elsewhere (a softmax, a kernel after attention) it is not."""
    kernels = []
    for name, nbytes in _step(True):
        kernels.append((name, nbytes))
        if name == "gemv_qkv":
            kernels.append(("triton_per_fused__to_copy_add_mean_mm_mul_pow_rsqrt_view_2", SMALL))
        elif name == "gemv" and len(kernels) > 2 and kernels[-2][0] == "weighted_sum":
            kernels.append(("splitKreduce_kernel", SMALL))
    kernels.insert(1, ("triton_per_fused_mm_view_8", SMALL))  # after the embedding: not a product's
    path = tmp_path / "finish.details.csv"
    path.write_text(_csv(kernels))
    k = dk.step_kernels(path, CFG, E)
    fin = k[k["kernel"].str.startswith("triton_per_fused__to")]
    assert list(fin["role"]) == ["qkv"] * CFG.layers and list(fin["layer"]) == list(range(CFG.layers))
    assert list(k.loc[k["kernel"] == "splitKreduce_kernel", "role"]) == ["o"] * CFG.layers
    assert k.loc[k["kernel"] == "triton_per_fused_mm_view_8", "role"].tolist() == ["other"]


def test_the_committed_tables_file_every_finishing_kernel_with_its_product():
    """fused_graph's step: 96 finishing kernels (qkv, o and down, 32 layers each) go with their products; what is left
    outside the products is 277 kernels."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "artifacts" / "ch12" / "decode_ncu_fused_graph.kernels.csv"
    k = dk.step_kernels(path, model_config("8b"), 2, step_range="rung_fused_graph_b1/decode_step_4")
    fin = k[k["kernel"].str.match(dk.FINISHER)]
    assert len(fin) == 96 and set(fin["role"]) == {"qkv", "o", "down"}
    assert k["role"].isin(["attention", "other"]).sum() == 277
