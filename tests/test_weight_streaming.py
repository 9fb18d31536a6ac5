"""The weight streamer's bookkeeping, on the CPU: every configuration must compute the resident model's logits."""

import importlib.util
import json
import sys

import pytest
import torch

from gpuprof.artifacts import REPO_ROOT
from gpuprof.errors import GpuprofError
from helpers import run_script_in_process

SCRIPT = REPO_ROOT / "examples" / "nsys" / "weight_streaming.py"
spec = importlib.util.spec_from_file_location("weight_streaming", SCRIPT)
ws = importlib.util.module_from_spec(spec)
sys.modules["weight_streaming"] = ws  # dataclasses look their module up while it executes
spec.loader.exec_module(ws)

CFG = ws.ModelConfig(layers=5, d_model=32, heads=4, ffn=48, vocab=31, batch=2, prompt=6, decode_steps=3)


@pytest.fixture(scope="module")
def model_and_tokens():
    model = ws.Model(CFG, torch, "cpu", torch.float32)
    tokens = torch.randint(0, CFG.vocab, (CFG.batch, CFG.prompt + CFG.decode_steps), generator=torch.Generator().manual_seed(3))
    reference, _ = ws.generate(model, "resident", ws.StreamingConfig(0, CFG.layers), tokens)
    return model, tokens, reference


@pytest.mark.parametrize("mode", ["sync", "prefetch"])
@pytest.mark.parametrize("distance,cached", [(0, 1), (0, 3), (1, 2), (1, 5), (2, 3), (3, 4), (4, 5)])
def test_every_configuration_computes_the_resident_logits(model_and_tokens, mode, distance, cached):
    model, tokens, reference = model_and_tokens
    sc = ws.StreamingConfig(distance, cached)
    sc.check(CFG.layers)
    logits, times = ws.generate(model, mode, sc, tokens)
    assert len(times) == 1 + CFG.decode_steps
    assert torch.equal(logits, reference)


def test_too_few_buffers_for_the_prefetch_distance():
    with pytest.raises(GpuprofError, match="cannot hold the layer being computed plus 2 prefetched ones"):
        ws.StreamingConfig(2, 2).check(8)


def test_more_buffers_than_layers_are_capped():
    sc = ws.StreamingConfig(1, 99)
    sc.check(6)
    assert sc.max_cached_layers == 6


def test_a_model_that_does_not_fit_is_refused(monkeypatch):
    import gpuprof.cli

    free = {"cpu": 64 * 2**30, "cuda": 2**30}
    monkeypatch.setattr(gpuprof.cli, "available_memory", lambda device: free[device])
    with pytest.raises(GpuprofError, match="of GPU memory, but only 1.0 GiB is available"):
        ws.check_fits(ws.ModelConfig(), ws.StreamingConfig(), ("prefetch",), True, 2)  # the KV cache alone exceeds 1 GiB
    free["cpu"] = 2**30  # 24 layers of 98 MiB each do not fit in 1 GiB of host memory either
    with pytest.raises(GpuprofError, match="24 layers of 98.0 MiB would take 2.3 GiB of host memory"):
        ws.check_fits(ws.ModelConfig(), ws.StreamingConfig(), ("prefetch",), True, 2)


def test_absurd_layer_counts_are_refused(capsys):
    proc = run_script_in_process(SCRIPT, "--layers", "100000", capsys=capsys)
    assert proc.returncode == 2 and "above this script's limit of 1,024" in proc.stderr and "Traceback" not in proc.stderr


def test_config_file_and_flags(tmp_path, capsys):
    cfg = tmp_path / "streaming.json"
    cfg.write_text(json.dumps({"prefetch_distance": 1, "max_cached_layers": 2, "model": {"layers": 3, "d_model": 16,
                                                                                          "heads": 2, "ffn": 24}}))
    out = tmp_path / "r.json"
    proc = run_script_in_process(SCRIPT, "--config", str(cfg), "--mode", "prefetch", "--decode-steps", "1", "--json", str(out),
                                 capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    assert r["streaming"] == {"prefetch_distance": 1, "max_cached_layers": 2}
    assert r["config"]["layers"] == 3 and r["config"]["decode_steps"] == 1


def test_config_file_with_unknown_keys(tmp_path, capsys):
    cfg = tmp_path / "bad.json"
    cfg.write_text(json.dumps({"prefetch_distanse": 1}))
    proc = run_script_in_process(SCRIPT, "--config", str(cfg), capsys=capsys)
    assert proc.returncode == 2 and "unknown keys" in proc.stderr and "Traceback" not in proc.stderr


def test_compare_spec():
    assert ws.compare_spec("3:5") == ws.StreamingConfig(3, 5)
    for bad in ("3", "a:b", "-1:2", "2:0", "1:2:3"):
        with pytest.raises(Exception):
            ws.compare_spec(bad)


def test_logits_check_is_exact_on_the_cpu_and_bf16_aware_on_a_gpu():
    ref = torch.tensor([[4.0, -2.0]])
    assert ws.check_same_logits("x", ref.clone(), ref, gpu=False) == 0.0
    with pytest.raises(GpuprofError, match="different logits"):
        ws.check_same_logits("x", ref + 1e-6, ref, gpu=False)
    assert ws.check_same_logits("x", ref + 0.05, ref, gpu=True) == pytest.approx(0.05, rel=1e-4)  # a few bf16 steps at 4.0
    with pytest.raises(GpuprofError, match="bug in the streamer"):
        ws.check_same_logits("x", ref + 1.0, ref, gpu=True)  # stale weights change logits by their own size


@pytest.mark.parametrize("host_sync,competing", [(True, 0), (False, 1), (True, 1)])
def test_host_reads_and_competing_traffic_do_not_change_the_result(model_and_tokens, host_sync, competing):
    model, tokens, reference = model_and_tokens
    logits, _ = ws.generate(model, "prefetch", ws.StreamingConfig(1, 2), tokens, competing, host_sync)
    assert torch.equal(logits, reference)


def test_sweep_grid_and_an_out_of_memory_row(model_and_tokens, monkeypatch, capsys):
    model, tokens, _ = model_and_tokens
    grid = ws.sweep_configs(CFG.layers)
    assert all(c.max_cached_layers >= c.prefetch_distance + 1 for c in grid)
    assert {c.prefetch_distance for c in grid} == {0, 1, 2, 3, 4}
    real = ws.generate

    def oom_at_d1_c2(model, mode, sc, *args):
        if (sc.prefetch_distance, sc.max_cached_layers) == (1, 2):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, mode, sc, *args)

    monkeypatch.setattr(ws, "generate", oom_at_d1_c2)
    rows = ws.sweep(model, tokens, CFG)
    assert len(rows) == len(grid)
    failed = [r for r in rows if "error" in r]
    assert failed == [{"prefetch_distance": 1, "max_cached_layers": 2, "error": "out of memory"}]
    assert all("prefill_ms" in r for r in rows if "error" not in r)  # the sweep went on
    assert "d=1 c=2: out of memory" in capsys.readouterr().out


def test_json_results_hold_every_timed_run(tmp_path, capsys):
    out = tmp_path / "r.json"
    proc = run_script_in_process(SCRIPT, "--mode", "all", "--compare", "0:1", "1:2", "--json", str(out), capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    assert {"resident", "transfer_only", "sync", "prefetch", "prefetch_d0_c1", "prefetch_d1_c2"} <= set(r)
    assert r["prefetch_d0_c1"]["max_cached_layers"] == 1 and len(r["transfer_only"]["pass_ms"]) == 1 + r["config"]["decode_steps"]
    assert "computed the same logits" in proc.stdout


def test_repeats_keep_every_pass_and_report_the_median(tmp_path, capsys):
    out = tmp_path / "r.json"
    proc = run_script_in_process(SCRIPT, "--mode", "all", "--repeats", "3", "--sweep", "--json", str(out), capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    steps = r["config"]["decode_steps"]
    assert r["repeats"] == 3
    for name in ("resident", "sync", "prefetch"):
        assert len(r[name]["prefill_runs_ms"]) == 3 and len(r[name]["decode_ms"]) == 3 * steps
        assert r[name]["prefill_ms"] == sorted(r[name]["prefill_runs_ms"])[1]
    assert len(r["transfer_only"]["pass_ms"]) == 3 * (1 + steps)
    assert all(len(row["prefill_runs_ms"]) == 3 for row in r["sweep"])
    assert "(median of 3, IQR " in proc.stdout


def test_summarise_passes_and_spread():
    s = ws.summarise_passes([[10.0, 1.0, 2.0], [30.0, 3.0, 4.0], [20.0, 5.0, 6.0]])
    assert s == {"prefill_ms": 20.0, "prefill_runs_ms": [10.0, 30.0, 20.0], "decode_ms": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]}
    assert ws.spread([5.0]) == ""
    assert ws.spread([1.0, 2.0, 3.0, 4.0, 5.0]) == " (median of 5, IQR 2.00-4.00)"
