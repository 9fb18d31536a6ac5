"""gpuprof.studies.sharded_training: the memory arithmetic and the model of collectives, on cases worked by hand."""

from __future__ import annotations

import math

import pytest

from gpuprof.errors import GpuprofError
from gpuprof.studies import sharded_training as st


def test_shards_follow_torch_chunk_on_dim_0():
    torch = pytest.importorskip("torch")
    for shape in [(10, 3), (7,), (3, 5), (1, 4), (16, 16)]:
        for world in (1, 2, 4, 8):
            chunks = torch.empty(shape).chunk(world, dim=0)
            for rank in range(world):
                expect = chunks[rank].numel() if rank < len(chunks) else 0
                assert st.shard_numel(shape, world, rank) == expect, (shape, world, rank)
    with pytest.raises(GpuprofError):
        st.shard_numel((4,), 2, 2)


def test_memory_per_category():
    shapes = [(8, 4), (8,), (6, 2)]  # 32 + 8 + 12 = 52 elements
    ddp = st.memory_arithmetic(shapes, 4, "ddp")
    assert ddp == {"parameters": 208, "gradients": 208, "optimizer_state": 416}
    # on 4 ranks rank 0 holds 2 rows of each: 8 + 2 + 4 = 14 elements; rank 3 holds 8 + 2 + 0 (6 rows in chunks of 2)
    assert st.memory_arithmetic(shapes, 4, "fsdp_reshard", 0)["parameters"] == 14 * 4
    assert st.memory_arithmetic(shapes, 4, "fsdp_keep", 3)["parameters"] == 10 * 4
    assert st.memory_arithmetic(shapes, 4, "ddp", optimizer_states=0)["optimizer_state"] == 0
    assert st.sharded_share(shapes, 4) == pytest.approx(14 / 52)
    # the targets: at most 55% of DDP's on two GPUs, 30% on four, for a model whose dims divide
    model = [(4096, 1024), (1024,), (32000, 1024)]
    assert st.sharded_share(model, 2) == 0.5 and st.sharded_share(model, 4) == 0.25
    with pytest.raises(GpuprofError, match="no mode"):
        st.memory_arithmetic(shapes, 2, "zero3")


def test_collective_costs_follow_nccl_tests_bus_bandwidth():
    link = st.Link(busbw_gbps=100.0, step_latency_us=10.0)
    gb = 1e9
    # bandwidth term: S * factor / busbw; latency: ring steps
    assert st.collective_ms("all_gather", gb, 2, link) == pytest.approx(5.0 + 0.01)
    assert st.collective_ms("reduce_scatter", gb, 4, link) == pytest.approx(7.5 + 0.03)
    assert st.collective_ms("all_reduce", gb, 4, link) == pytest.approx(15.0 + 0.06)
    assert st.collective_ms("all_reduce", gb, 1024, link, "tree") == pytest.approx(2 * 1023 / 1024 * 10 + 20 * 0.01)
    assert st.collective_ms("all_gather", gb, 1, link) == 0.0
    assert st.latency_steps("all_reduce", 1000, "tree") == 2 * math.ceil(math.log2(1000)) == 20
    with pytest.raises(GpuprofError, match="no tree all-gather"):
        st.collective_ms("all_gather", gb, 8, link, "tree")


def test_the_link_fit_recovers_the_link_it_was_made_from():
    link = st.Link(busbw_gbps=250.0, step_latency_us=8.0)
    rows = [{"kind": kind, "n": n, "bytes": b, "ms": st.collective_ms(kind, b, n, link)}
            for kind in ("all_gather", "reduce_scatter") for n in (2, 4) for b in (1e6, 1e8, 4e8)]
    fit = st.fit_link(rows)
    assert fit.busbw_gbps == pytest.approx(250.0) and fit.step_latency_us == pytest.approx(8.0)
    one = st.fit_link(rows[2:3])  # one measurement: read as bandwidth alone, latency 0 (a lower bound on busbw)
    assert one.step_latency_us == 0.0 and one.busbw_gbps < 250.0
    with pytest.raises(GpuprofError):
        st.fit_link([])


def test_a_step_worked_by_hand():
    """4 units, forward 1 ms and backward 2 ms each; on 2 ranks at 100 GB/s and no latency, an all-gather of a unit
    (1e8 B) takes 0.5 ms and a reduce-scatter of its gradients (2e8 B) 1 ms. With one unit of prefetch, the first
    all-gather of forward and the first of backward are exposed (0.5 ms each), and the last reduce-scatter (1 ms)."""
    link = st.Link(100.0, 0.0)
    units = st.unit_costs(4, 4.0, 8.0, 4e8, 8e8)
    p = st.simulate_step(units, "fsdp_reshard", 2, link, prefetch=1)
    assert p.compute_ms == 12.0 and p.comm_ms == pytest.approx(8.0)
    assert p.exposed_by_collective == pytest.approx({"all_gather": 1.0, "reduce_scatter": 1.0})
    assert p.step_ms == pytest.approx(14.0) and p.hidden_share == pytest.approx(0.75)
    # which ones, by their position among their kind's collectives in issue order: forward's all-gathers are 0-3,
    # backward's 4-7 (unit 3's first); the reduce-scatters 0-3 (unit 0's last)
    assert [(kind, pos) for kind, pos, _ in p.exposed_at] == [("all_gather", 0), ("all_gather", 4), ("reduce_scatter", 3)]
    assert [ms for _, _, ms in p.exposed_at] == pytest.approx([0.5, 0.5, 1.0])
    # without prefetch every all-gather waits: 4 in forward, and in backward each queues behind the last reduce-scatter
    off = st.simulate_step(units, "fsdp_reshard", 2, link, prefetch=0)
    assert off.exposed_by_collective["all_gather"] == pytest.approx(2.0 + 0.5 + 3 * 1.5)
    # keeping the parameters: no all-gather in backward
    keep = st.simulate_step(units, "fsdp_keep", 2, link, prefetch=1)
    assert keep.comm_ms == pytest.approx(6.0) and keep.exposed_by_collective["all_gather"] == pytest.approx(0.5)
    # DDP: one all-reduce of 2e8 B per unit (2 ms at n=2 ... factor 1): the last one exposed, the others hidden
    ddp = st.simulate_step(units, "ddp", 2, link)
    assert ddp.exposed_by_collective == pytest.approx({"all_reduce": 2.0})
    # one rank: nothing to communicate
    assert st.simulate_step(units, "fsdp_reshard", 1, link).exposed_ms == 0.0
    with pytest.raises(GpuprofError):
        st.simulate_step(units, "fsdp_reshard", 2, link, prefetch=-1)


def test_scaling_table_grows_the_exposed_time_with_the_ring():
    units = st.unit_costs(8, 8.0, 16.0, 8e8, 16e8)
    links = {n: st.Link(200.0, 5.0) for n in (2, 4, 8)} | {64: st.Link(40.0, 20.0), 1024: st.Link(40.0, 20.0)}
    t = st.predict_scaling(units, links, prefetch=1)
    assert sorted(set(t["gpus"])) == [2, 4, 8, 64, 1024]
    fsdp = t[t["mode"] == "fsdp_reshard"].set_index("gpus")
    assert fsdp["exposed_ms"].is_monotonic_increasing and (fsdp["compute_ms"] == 24.0).all()
    ddp = t[t["mode"] == "ddp"].set_index(["gpus", "algorithm"])["comm_ms"]
    assert ddp[(1024, "tree")] < ddp[(1024, "ring")]  # the same bandwidth term, a logarithmic latency
    assert len(st.predict_scaling(units, {2: links[2]}, scales=(2, 4))) == 4  # no link for 4: no row


def test_units_from_a_one_process_record_put_the_root_first_and_keep_it():
    record = {"unit_parameters": [200, 100, 100],
              "runs": [{"mode": "ddp", "steps": [{"forward": f, "backward": 2 * f} for f in (4.0, 4.0, 40.0)]}]}
    units = st.units_from_record(record, gather_element=2)
    assert [u.forward_ms for u in units] == [2.0, 1.0, 1.0] and [u.backward_ms for u in units] == [4.0, 2.0, 2.0]
    assert [u.gather_bytes for u in units] == [400, 200, 200] and [u.reduce_bytes for u in units] == [800, 400, 400]
    assert [u.kept for u in units] == [True, False, False]
    link = st.Link(100.0, 0.0)
    p = st.simulate_step(units, "fsdp_reshard", 2, link, prefetch=1)
    # all-gathers: 3 in forward, 2 in backward (the root stays gathered); reduce-scatters: 3
    per_byte_ms = 0.5 / 100e9 * 1e3
    assert p.comm_ms == pytest.approx((800 + 400 + 1600) * per_byte_ms)
    with pytest.raises(GpuprofError, match="no fsdp_keep run"):
        st.units_from_record(record, "fsdp_keep")
