#!/usr/bin/env python3
"""Stream a transformer's layer weights from pinned host memory to the GPU while earlier layers compute.

A small decoder-only transformer (LLaMA-like: RMSNorm, multi-head attention with a KV
cache, gated MLP; bf16 on the GPU) keeps every layer's weights in pinned host memory
and brings them to the GPU layer by layer, for a prefill pass and then decoding steps.

Modes (--mode), to compare in one run with --mode all:
  resident       all weights on the GPU before timing: the compute-only bound
  transfer_only  copy every layer's weights, compute nothing: the PCIe bound
  sync           copy each layer on the compute stream, then compute it: nothing overlaps
  prefetch       copies on a dedicated stream "weight_h2d", --prefetch-distance layers ahead,
                 into at most --max-cached-layers GPU buffers reused round-robin; CUDA events
                 make each layer's compute wait for its own weights only

NVTX ranges (the names of the seed notes): ensure_layer_X, prefetch_layers_[X,Y],
h2d_transfer_layer_X, layer_X_attention, layer_X_ffn, layer_X_kv_fetch; plus one range
per pass (prefill, decode_N) and per mode.

  nsys profile --trace=cuda,nvtx --cuda-memory-usage=true --sample=none --cpuctxsw=none \\
      -o streaming python examples/nsys/weight_streaming.py --mode all

--sweep measures prefetch_distance x max_cached_layers (step time, GPU memory held;
an out-of-memory configuration becomes a row, and the sweep goes on). Without a GPU the
same code runs on the CPU with a tiny model and plain copies, so it is testable anywhere.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import annotate, exit_on_error  # noqa: E402
from gpuprof.cli import nonnegative_int, positive_int, torch_backend_or_cpu  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

MODES = ("resident", "transfer_only", "sync", "prefetch")


@dataclass(frozen=True)
class ModelConfig:
    layers: int = 16
    d_model: int = 2048
    heads: int = 16
    ffn: int = 5632
    vocab: int = 4096
    batch: int = 4
    prompt: int = 2048
    decode_steps: int = 4

    @property
    def layer_params(self) -> int:
        d, f = self.d_model, self.ffn
        return 4 * d * d + 3 * d * f + 2 * d  # wq wk wv wo, gate up down, two norms

    def shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        d, f = self.d_model, self.ffn
        return [("attn_norm", (d,)), ("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("wo", (d, d)),
                ("ffn_norm", (d,)), ("w_gate", (d, f)), ("w_up", (d, f)), ("w_down", (f, d))]


CPU_CONFIG = ModelConfig(layers=4, d_model=64, heads=4, ffn=128, vocab=97, batch=2, prompt=16, decode_steps=2)


@dataclass
class StreamingConfig:
    prefetch_distance: int = 2
    max_cached_layers: int = 4

    def check(self, layers: int) -> None:
        if self.prefetch_distance < 0:
            raise GpuprofError(f"prefetch_distance must be 0 or more (got {self.prefetch_distance}).")
        need = self.prefetch_distance + 1
        if self.max_cached_layers < need:
            raise GpuprofError(f"max_cached_layers={self.max_cached_layers} cannot hold the layer being computed plus "
                               f"{self.prefetch_distance} prefetched ones.", f"Use max_cached_layers >= {need}.")
        if self.max_cached_layers > layers:
            self.max_cached_layers = layers  # more buffers than layers would never be used


def layer_views(flat, cfg: ModelConfig) -> dict:  # type: ignore[no-untyped-def]
    """Named weight tensors as views into one flat buffer (one copy per layer moves them all)."""
    views, offset = {}, 0
    for name, shape in cfg.shapes():
        n = 1
        for s in shape:
            n *= s
        views[name] = flat[offset:offset + n].view(shape)
        offset += n
    return views


class Model:
    """Weights in pinned host memory (one flat buffer per layer) and the math of one layer."""

    def __init__(self, cfg: ModelConfig, torch, device: str, dtype) -> None:  # type: ignore[no-untyped-def]
        self.cfg, self.torch, self.device, self.dtype = cfg, torch, device, dtype
        gen = torch.Generator().manual_seed(0)
        pin = device == "cuda"
        self.host = []
        for _ in range(cfg.layers):
            flat = (torch.randn(cfg.layer_params, generator=gen) * 0.02).to(dtype)
            views = layer_views(flat, cfg)
            views["attn_norm"].fill_(1.0)
            views["ffn_norm"].fill_(1.0)
            self.host.append(flat.pin_memory() if pin else flat)
        self.embed = (torch.randn(cfg.vocab, cfg.d_model, generator=gen) * 0.02).to(dtype).to(device)
        self.lm_head = (torch.randn(cfg.d_model, cfg.vocab, generator=gen) * 0.02).to(dtype).to(device)

    def rmsnorm(self, x, w):  # type: ignore[no-untyped-def]
        xf = x.float()
        return (xf * self.torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    def layer(self, i: int, x, w, cache, pos: int):  # type: ignore[no-untyped-def]
        """One decoder layer on activations x [batch, tokens, d] at position ``pos``."""
        torch, cfg = self.torch, self.cfg
        b, t, d = x.shape
        h, hd = cfg.heads, d // cfg.heads
        with annotate(f"layer_{i}_attention"):
            a = self.rmsnorm(x, w["attn_norm"])
            q = (a @ w["wq"]).view(b, t, h, hd).transpose(1, 2)
            k = (a @ w["wk"]).view(b, t, h, hd).transpose(1, 2)
            v = (a @ w["wv"]).view(b, t, h, hd).transpose(1, 2)
            with annotate(f"layer_{i}_kv_fetch"):
                kc, vc = cache[i]
                kc[:, :, pos:pos + t] = k
                vc[:, :, pos:pos + t] = v
                keys, values = kc[:, :, :pos + t], vc[:, :, :pos + t]
            att = torch.nn.functional.scaled_dot_product_attention(q, keys, values, is_causal=(t > 1))
            x = x + att.transpose(1, 2).reshape(b, t, d) @ w["wo"]
        with annotate(f"layer_{i}_ffn"):
            f = self.rmsnorm(x, w["ffn_norm"])
            x = x + (torch.nn.functional.silu(f @ w["w_gate"]) * (f @ w["w_up"])) @ w["w_down"]
        return x

    def new_cache(self):  # type: ignore[no-untyped-def]
        cfg = self.cfg
        shape = (cfg.batch, cfg.heads, cfg.prompt + cfg.decode_steps, cfg.d_model // cfg.heads)
        return [(self.torch.zeros(shape, dtype=self.dtype, device=self.device),
                 self.torch.zeros(shape, dtype=self.dtype, device=self.device)) for _ in range(cfg.layers)]


class Streamer:
    """Brings layer weights to the GPU: on demand, or ahead of use on the weight_h2d stream."""

    def __init__(self, model: Model, mode: str, sc: StreamingConfig) -> None:
        self.m, self.mode, self.sc = model, mode, sc
        torch, gpu = model.torch, model.device == "cuda"
        self.gpu = gpu
        n_slots = model.cfg.layers if mode == "resident" else sc.max_cached_layers
        self.slots = [torch.empty(model.cfg.layer_params, dtype=model.dtype, device=model.device) for _ in range(n_slots)]
        self.views = [layer_views(s, model.cfg) for s in self.slots]
        self.slot_of: dict[int, int] = {}       # layer -> slot holding (or receiving) its weights
        self.occupant: dict[int, int] = {}      # slot -> layer
        self.next_slot = 0
        self.copy_stream = torch.cuda.Stream() if gpu and mode == "prefetch" else None
        self.ready: dict[int, object] = {}      # layer -> event: its weights have arrived
        self.free: dict[int, object] = {}       # slot -> event: the compute that used it is done
        if mode == "resident":
            for i in range(model.cfg.layers):
                self._fetch(i, stream=None)
            if gpu:
                torch.cuda.synchronize()

    def _event(self):  # type: ignore[no-untyped-def]
        return self.m.torch.cuda.Event() if self.gpu else None

    def _fetch(self, i: int, stream) -> None:  # type: ignore[no-untyped-def]
        slot = self.next_slot % len(self.slots)
        self.next_slot += 1
        old = self.occupant.get(slot)
        if old is not None:
            del self.slot_of[old]
        self.occupant[slot], self.slot_of[i] = i, slot
        torch = self.m.torch
        with annotate(f"h2d_transfer_layer_{i}"):
            if stream is None:
                self.slots[slot].copy_(self.m.host[i], non_blocking=self.gpu)
                self.ready[i] = None
            else:
                with torch.cuda.stream(stream):
                    if slot in self.free:
                        stream.wait_event(self.free[slot])  # never overwrite weights still being used
                    self.slots[slot].copy_(self.m.host[i], non_blocking=True)
                    ev = self._event()
                    ev.record(stream)
                    self.ready[i] = ev

    def ensure(self, i: int) -> dict:
        """Make layer i's weights usable by the compute stream; returns its views."""
        with annotate(f"ensure_layer_{i}"):
            if i not in self.slot_of:
                self._fetch(i, self.copy_stream)
            ev = self.ready.get(i)
            if ev is not None:
                self.m.torch.cuda.current_stream().wait_event(ev)
        return self.views[self.slot_of[i]]

    def prefetch(self, i: int) -> None:
        d, n = self.sc.prefetch_distance, self.m.cfg.layers
        if self.mode != "prefetch" or d == 0:
            return
        wanted = [(i + k) % n for k in range(1, d + 1)]
        with annotate(f"prefetch_layers_[{wanted[0]},{wanted[-1]}]"):
            for j in wanted:
                if j not in self.slot_of:
                    self._fetch(j, self.copy_stream)

    def done_with(self, i: int) -> None:
        if self.gpu and self.mode == "prefetch":
            ev = self._event()
            ev.record()
            self.free[self.slot_of[i]] = ev


def run_pass(model: Model, streamer: Streamer, x, cache, pos: int):  # type: ignore[no-untyped-def]
    for i in range(model.cfg.layers):
        w = streamer.ensure(i)
        streamer.prefetch(i)
        x = model.layer(i, x, w, cache, pos)
        streamer.done_with(i)
    return model.rmsnorm(x, 1.0) @ model.lm_head


def generate(model: Model, mode: str, sc: StreamingConfig, tokens):  # type: ignore[no-untyped-def]
    """Prefill then greedy decoding; returns (all logits, per-pass times in ms)."""
    torch, cfg = model.torch, model.cfg
    streamer = Streamer(model, mode, sc)
    cache = model.new_cache()
    logits, times = [], []
    x, pos = model.embed[tokens], 0
    for p in range(1 + cfg.decode_steps):
        name = "prefill" if p == 0 else f"decode_{p - 1}"
        t0 = time.perf_counter()
        with annotate(name):
            out = run_pass(model, streamer, x, cache, pos)
            if model.device == "cuda":
                torch.cuda.synchronize()  # inside the range: the pass's kernels belong to it
        times.append((time.perf_counter() - t0) * 1e3)
        logits.append(out[:, -1].float())
        pos += x.shape[1]
        x = model.embed[out[:, -1].argmax(-1)].unsqueeze(1)
    return torch.stack(logits), times


def transfer_only(model: Model, repeats: int) -> list[float]:
    """Copy every layer's weights to one GPU buffer, nothing else: the PCIe-bound time per pass."""
    torch = model.torch
    buf = torch.empty(model.cfg.layer_params, dtype=model.dtype, device=model.device)
    times = []
    for r in range(repeats):
        t0 = time.perf_counter()
        with annotate(f"transfer_pass_{r}"):
            for i in range(model.cfg.layers):
                with annotate(f"h2d_transfer_layer_{i}"):
                    buf.copy_(model.host[i], non_blocking=model.device == "cuda")
            if model.device == "cuda":
                torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=[*MODES, "all"], default="all", help="what to run (default: all, in one process)")
    p.add_argument("--prefetch-distance", type=nonnegative_int, default=None, help="layers fetched ahead (default: 2)")
    p.add_argument("--max-cached-layers", type=positive_int, default=None, help="GPU layer buffers (default: 4)")
    p.add_argument("--config", type=Path, default=None,
                   help='JSON file like {"prefetch_distance": 3, "max_cached_layers": 6, "model": {"layers": 8}}')
    for field, default in asdict(ModelConfig()).items():
        p.add_argument(f"--{field.replace('_', '-')}", type=positive_int, default=None,
                       help=f"model size (default on a GPU: {default})")
    p.add_argument("--sweep", action="store_true", help="sweep prefetch_distance x max_cached_layers (prefetch mode)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--backend", choices=["torch", "cpu"], default=None, help="force a backend (default: torch CUDA, else CPU)")
    return p.parse_args(argv)


def load_settings(args: argparse.Namespace, gpu: bool) -> tuple[ModelConfig, StreamingConfig]:
    """Defaults, then the --config file, then flags: the seed's streaming_config, as a file or as flags."""
    base = asdict(ModelConfig() if gpu else CPU_CONFIG)
    streaming = asdict(StreamingConfig())
    if args.config is not None:
        try:
            data = json.loads(args.config.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise GpuprofError(f"Cannot read --config {args.config}: {exc}.") from None
        unknown = set(data) - {"model", *streaming}
        if unknown or not isinstance(data.get("model", {}), dict) or set(data.get("model", {})) - set(base):
            raise GpuprofError(f"--config {args.config} has unknown keys: {sorted(unknown) or sorted(set(data['model']) - set(base))}.",
                               f"Known: {sorted(streaming)} and model.{{{', '.join(base)}}}.")
        base.update(data.get("model", {}))
        streaming.update({k: v for k, v in data.items() if k in streaming})
    for field in base:
        value = getattr(args, field)
        if value is not None:
            base[field] = value
    if args.prefetch_distance is not None:
        streaming["prefetch_distance"] = args.prefetch_distance
    if args.max_cached_layers is not None:
        streaming["max_cached_layers"] = args.max_cached_layers
    cfg, sc = ModelConfig(**base), StreamingConfig(**streaming)
    if cfg.d_model % cfg.heads:
        raise GpuprofError(f"d_model={cfg.d_model} is not divisible by heads={cfg.heads}.")
    sc.check(cfg.layers)
    return cfg, sc


def check_fits(cfg: ModelConfig, torch, dtype_bytes: int) -> None:  # type: ignore[no-untyped-def]
    """Refuse a model of which not even one layer (plus the KV cache) fits in free GPU memory."""
    free, _ = torch.cuda.mem_get_info()
    layer = cfg.layer_params * dtype_bytes
    kv = 2 * cfg.layers * cfg.batch * (cfg.prompt + cfg.decode_steps) * cfg.d_model * dtype_bytes
    if layer + kv > free:
        raise GpuprofError(f"One layer ({layer / 2**30:.1f} GiB) plus the KV cache ({kv / 2**30:.1f} GiB) does not fit in "
                           f"the GPU's free memory ({free / 2**30:.1f} GiB).", "Use a smaller --d-model, --ffn, --batch or --prompt.")


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    backend = torch_backend_or_cpu(args.backend, "weight_streaming.py needs PyTorch for streams, events and pinned memory")
    if backend.name != "torch":
        raise GpuprofError("weight_streaming.py needs PyTorch.", "Install torch (its CPU build is enough off a GPU).")
    torch, gpu = backend.xp, backend.is_gpu
    cfg, sc = load_settings(args, gpu)
    dtype = torch.bfloat16 if gpu else torch.float32
    if gpu:
        check_fits(cfg, torch, 2)
    print(f"weight_streaming: {backend}; {cfg.layers} layers of {cfg.layer_params * (2 if gpu else 4) / 2**20:.0f} MiB; "
          f"batch {cfg.batch} x prompt {cfg.prompt}, {cfg.decode_steps} decode steps; "
          f"prefetch_distance={sc.prefetch_distance}, max_cached_layers={sc.max_cached_layers}")
    if not gpu:
        print("no GPU: a tiny model on the CPU, plain copies, no streams (the timings mean nothing here)")
    model = Model(cfg, torch, backend.device, dtype)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.prompt), generator=torch.Generator().manual_seed(1)).to(backend.device)
    results: dict[str, object] = {"config": asdict(cfg), "streaming": asdict(sc), "device": backend.device}
    modes = MODES if args.mode == "all" else (args.mode,)
    reference = None
    for mode in modes:
        with annotate(f"mode_{mode}"):
            if mode == "transfer_only":
                times = transfer_only(model, 1 + cfg.decode_steps)
                results[mode] = {"pass_ms": times}
                print(f"  {mode:<14} per pass {sum(times) / len(times):8.2f} ms (copies only)")
                continue
            generate(model, mode, sc, tokens)  # warm-up run: allocator, cuBLAS, kernel loading
            logits, times = generate(model, mode, sc, tokens)
        results[mode] = {"prefill_ms": times[0], "decode_ms": times[1:]}
        decode = sum(times[1:]) / max(1, len(times) - 1)
        print(f"  {mode:<14} prefill {times[0]:8.2f} ms, decode {decode:8.2f} ms per step")
        if reference is None:
            reference = logits
        else:
            err = float((logits - reference).abs().max())
            if err > 1e-3 * max(1.0, float(reference.abs().max())):
                raise GpuprofError(f"mode {mode} produced different logits (max difference {err:.3g}).", "This is a bug.")
    if args.sweep:
        results["sweep"] = sweep(model, tokens, cfg)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"results written to {args.json}")
    checked = [m for m in modes if m not in ("transfer_only",)]
    print(f"result checked: {', '.join(checked)} produced the same logits" if len(checked) > 1
          else "result checked: ran (one mode, nothing to compare)")
    return 0


def sweep(model: Model, tokens, cfg: ModelConfig) -> list[dict]:  # type: ignore[no-untyped-def]
    """prefetch_distance x max_cached_layers: prefill and decode times, GPU memory held; OOM is a row."""
    torch, gpu = model.torch, model.device == "cuda"
    rows = []
    for d in range(0, min(4, cfg.layers - 1) + 1):
        for c in sorted({d + 1, d + 2, 2 * d + 2, cfg.layers}):
            if c > cfg.layers:
                continue
            sc = StreamingConfig(d, c)
            row: dict[str, object] = {"prefetch_distance": d, "max_cached_layers": c}
            try:
                if gpu:
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                with annotate(f"sweep_d{d}_c{c}"):
                    _, times = generate(model, "prefetch", sc, tokens)
                row.update(prefill_ms=times[0], decode_ms=sum(times[1:]) / max(1, len(times) - 1),
                           peak_gib=torch.cuda.max_memory_allocated() / 2**30 if gpu else None)
            except torch.cuda.OutOfMemoryError:
                row["error"] = "out of memory"
            rows.append(row)
            print(f"  sweep d={d} c={c}: " + (row.get("error") or f"prefill {row['prefill_ms']:.2f} ms, decode {row['decode_ms']:.2f} ms"))
    return rows


if __name__ == "__main__":
    sys.exit(main())
