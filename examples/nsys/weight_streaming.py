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

NVTX ranges (the names the weight-streaming design uses): ensure_layer_X, prefetch_layers_[X,Y],
h2d_transfer_layer_X, layer_X_attention, layer_X_ffn, layer_X_kv_fetch; plus one range
per pass (prefill, decode_N) and per mode.

  nsys profile --trace=cuda,nvtx --cuda-memory-usage=true --sample=none --cpuctxsw=none \\
      -o streaming python examples/nsys/weight_streaming.py --mode all

Every mode is warmed up first; the timed runs then sit between cudaProfilerStart and
cudaProfilerStop, so nsys --capture-range=cudaProfilerApi records them and nothing else.
Decoding feeds fixed next tokens (teacher forcing): every mode does the same work, and a
bf16 rounding difference cannot send two modes down different token paths.

--compare D:C ... times more prefetch configurations in the same run; --host-sync-per-layer
reads one value back to the CPU after every layer (as a router or an early-exit test
would), so the CPU cannot run ahead of the GPU; --competing-h2d-mib adds other
host-to-device traffic on its own stream. --sweep measures prefetch_distance x
max_cached_layers (step time, GPU memory held; an out-of-memory configuration becomes a
row, and the sweep goes on). --repeats N times every run (and every sweep setting) N times,
in rounds over the runs so that a slow spell of the machine falls on all of them: the
JSON keeps every pass, and its prefill_ms is their median (one pass is one sample: a
single slow pass looks like a finding). Without a GPU the same code runs on the CPU
with a tiny model and plain copies, so it is testable anywhere.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import annotate, exit_on_error  # noqa: E402
from gpuprof.backend import torch_backend_or_cpu  # noqa: E402
from gpuprof.cli import nonnegative_int, output_file, positive_int, require_memory  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402
from gpuprof.models import rms_norm  # noqa: E402
from gpuprof.timing import Timing  # noqa: E402

MODES = ("resident", "transfer_only", "sync", "prefetch")
MAX_LAYERS = 1024


@dataclass(frozen=True)
class ModelConfig:
    layers: int = 24
    d_model: int = 2048
    heads: int = 16
    ffn: int = 5632
    vocab: int = 4096
    batch: int = 4
    prompt: int = 3072
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
        # Random weights are drawn on the device (seconds on a CPU become milliseconds on a
        # GPU), then each layer goes to pinned host memory, where streaming starts from.
        gen = torch.Generator(device=device).manual_seed(0)
        pin = device == "cuda"
        self.host = []
        for _ in range(cfg.layers):
            flat = (torch.randn(cfg.layer_params, generator=gen, device=device) * 0.02).to(dtype)
            views = layer_views(flat, cfg)
            views["attn_norm"].fill_(1.0)
            views["ffn_norm"].fill_(1.0)
            self.host.append(flat.cpu().pin_memory() if pin else flat)
        self.embed = (torch.randn(cfg.vocab, cfg.d_model, generator=gen, device=device) * 0.02).to(dtype)
        self.lm_head = (torch.randn(cfg.d_model, cfg.vocab, generator=gen, device=device) * 0.02).to(dtype)

    def rmsnorm(self, x, w):  # type: ignore[no-untyped-def]
        return rms_norm(x, w, 1e-6)

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

    def __init__(self, model: Model, mode: str, sc: StreamingConfig, competing_mib: int = 0) -> None:
        self.m, self.mode, self.sc = model, mode, sc
        torch, gpu = model.torch, model.device == "cuda"
        self.gpu = gpu
        # Other host-to-device traffic sharing the link (an input pipeline, KV-cache offload):
        # one copy of competing_mib MiB per layer on its own stream, to show bandwidth contention.
        self.competing = None
        if competing_mib > 0 and mode != "resident":
            n = competing_mib * 2**20 // 4
            src = torch.zeros(n, dtype=torch.float32)
            self.competing = (src.pin_memory() if gpu else src, torch.empty(n, dtype=torch.float32, device=model.device),
                              torch.cuda.Stream() if gpu else None)
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
        if self.competing is not None:
            src, dst, stream = self.competing
            with annotate(f"competing_h2d_{i}"):
                if stream is None:
                    dst.copy_(src)
                else:
                    with self.m.torch.cuda.stream(stream):
                        dst.copy_(src, non_blocking=True)
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


def run_pass(model: Model, streamer: Streamer, x, cache, pos: int, host_sync: bool = False):  # type: ignore[no-untyped-def]
    for i in range(model.cfg.layers):
        w = streamer.ensure(i)
        streamer.prefetch(i)
        x = model.layer(i, x, w, cache, pos)
        streamer.done_with(i)
        if host_sync:
            with annotate(f"layer_{i}_host_read"):
                float(x[0, -1, 0])  # a value the CPU needs before it may go on: it waits for the GPU
    return model.rmsnorm(x, 1.0) @ model.lm_head


def generate(model: Model, mode: str, sc: StreamingConfig, tokens, competing_mib: int = 0,  # type: ignore[no-untyped-def]
             host_sync: bool = False):
    """Prefill, then decoding steps fed the fixed next tokens; returns (last-position logits, per-pass ms).

    ``tokens`` is [batch, prompt + decode_steps]: the prompt, then the token each decoding step reads.
    """
    torch, cfg = model.torch, model.cfg
    streamer = Streamer(model, mode, sc, competing_mib)
    cache = model.new_cache()
    logits, times = [], []
    pos = 0
    for p in range(1 + cfg.decode_steps):
        name = "prefill" if p == 0 else f"decode_{p - 1}"
        x = model.embed[tokens[:, :cfg.prompt]] if p == 0 else model.embed[tokens[:, cfg.prompt + p - 1]].unsqueeze(1)
        t0 = time.perf_counter()
        with annotate(name):
            out = run_pass(model, streamer, x, cache, pos, host_sync)
            if model.device == "cuda":
                torch.cuda.synchronize()  # inside the range: the pass's kernels belong to it
        times.append((time.perf_counter() - t0) * 1e3)
        logits.append(out[:, -1].float())
        pos += x.shape[1]
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


def pinned_h2d_peak_gbps(torch, nbytes: int = 512 * 2**20) -> float:  # type: ignore[no-untyped-def]
    """This machine's pinned host-to-device rate, in the same process as the streaming it is compared with."""
    from gpuprof.timing import time_call

    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    t = time_call(lambda: dst.copy_(src, non_blocking=True), warmup=5, repeats=10)
    return nbytes / t.median / 1e9


def compare_spec(text: str) -> StreamingConfig:
    """argparse type for --compare: ``D:C`` = prefetch_distance:max_cached_layers."""
    try:
        d, c = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not D:C (prefetch_distance:max_cached_layers), e.g. 2:4") from None
    if d < 0 or c < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the distance must be 0 or more and the buffers 1 or more")
    return StreamingConfig(d, c)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=[*MODES, "all"], default="all", help="what to run (default: all, in one process)")
    p.add_argument("--prefetch-distance", type=nonnegative_int, default=None, help="layers fetched ahead (default: 2)")
    p.add_argument("--max-cached-layers", type=positive_int, default=None, help="GPU layer buffers (default: 4)")
    p.add_argument("--compare", type=compare_spec, nargs="+", default=[], metavar="D:C",
                   help="more prefetch configurations to time in the same run, e.g. 0:1 1:2")
    p.add_argument("--config", type=Path, default=None,
                   help='JSON file like {"prefetch_distance": 3, "max_cached_layers": 6, "model": {"layers": 8}}')
    what = {"layers": "decoder layers", "d_model": "model width", "heads": "attention heads",
            "ffn": "feed-forward width", "vocab": "vocabulary size", "batch": "sequences per pass",
            "prompt": "prompt tokens per sequence (the prefill pass)", "decode_steps": "decoding steps after the prefill"}
    for field, default in asdict(ModelConfig()).items():
        p.add_argument(f"--{field.replace('_', '-')}", type=positive_int, default=None,
                       help=f"{what.get(field, field)} (default on a GPU: {default})")
    p.add_argument("--host-sync-per-layer", action="store_true",
                   help="read a value back to the CPU after every layer (the CPU can no longer run ahead)")
    p.add_argument("--competing-h2d-mib", type=nonnegative_int, default=0,
                   help="other host-to-device traffic: MiB copied per layer on another stream (default: 0)")
    p.add_argument("--sweep", action="store_true", help="sweep prefetch_distance x max_cached_layers (prefetch mode)")
    p.add_argument("--repeats", type=positive_int, default=1,
                   help="time every run and sweep setting this many times; the JSON keeps each pass (default: 1)")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="also write the results to FILE")
    p.add_argument("--backend", choices=["torch", "cpu"], default=None, help="force a backend (default: torch CUDA, else CPU)")
    return p.parse_args(argv)


def load_settings(args: argparse.Namespace, gpu: bool) -> tuple[ModelConfig, StreamingConfig]:
    """Defaults, then the --config file, then flags: the design's streaming_config, as a file or as flags."""
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
    if cfg.layers > MAX_LAYERS:
        raise GpuprofError(f"{cfg.layers:,} layers is above this script's limit of {MAX_LAYERS:,} (the largest published "
                           "decoders have under 200; every pass streams every layer).", "Choose fewer --layers.")
    if cfg.d_model % cfg.heads:
        raise GpuprofError(f"d_model={cfg.d_model} is not divisible by heads={cfg.heads}.")
    sc.check(cfg.layers)
    for extra in args.compare:
        extra.check(cfg.layers)
    return cfg, sc


def check_fits(cfg: ModelConfig, sc: StreamingConfig, modes: tuple[str, ...], gpu: bool, dtype_bytes: int) -> None:
    """Refuse, before drawing any weight, a model this machine cannot hold: every layer lives in host memory
    (pinned on a GPU machine); on the GPU, the resident mode holds every layer and the others
    --max-cached-layers of them, beside the KV cache."""
    layer = cfg.layer_params * dtype_bytes
    sizes = "--layers, --d-model or --ffn"
    require_memory(cfg.layers * layer, "cpu", f"{cfg.layers:,} layers of {layer / 2**20:,.1f} MiB", sizes)
    if gpu:
        kv = 2 * cfg.layers * cfg.batch * (cfg.prompt + cfg.decode_steps) * cfg.d_model * dtype_bytes
        held = cfg.layers if "resident" in modes else sc.max_cached_layers
        require_memory(held * layer + kv, "cuda", f"{held:,} layers of {layer / 2**20:,.1f} MiB on the GPU "
                       f"(the {'resident mode' if 'resident' in modes else 'layer buffers'}) and a KV cache of "
                       f"{kv / 2**30:,.1f} GiB", sizes + ", --batch or --prompt" + (", or a --mode other than resident"
                                                                                     if "resident" in modes else ""))


def check_same_logits(name: str, logits, reference, gpu: bool) -> float:  # type: ignore[no-untyped-def]
    """Every streamed run must compute the resident model's logits; returns the largest difference.

    On the CPU (float32, same kernels) they are identical. In bf16 on a GPU, kernels may
    round differently from run to run (a cuBLAS algorithm choice, for one), so a few units
    in the last place of the largest logit are allowed; wrong or stale weights would
    change the logits by about their own size.
    """
    err = float((logits - reference).abs().max())
    scale = max(1.0, float(reference.abs().max()))
    tolerance = 4 * 2**-7 * scale if gpu else 0.0
    if err > tolerance:
        raise GpuprofError(f"{name} produced different logits (max difference {err:.3g}, allowed {tolerance:.3g}).",
                           "This is a bug in the streamer.")
    return err


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    backend = torch_backend_or_cpu(args.backend, "weight_streaming.py needs PyTorch for streams, events and pinned memory")
    if backend.name != "torch":
        raise GpuprofError("weight_streaming.py needs PyTorch.", "Install torch (its CPU build is enough off a GPU).")
    torch, gpu = backend.xp, backend.is_gpu
    cfg, sc = load_settings(args, gpu)
    dtype = torch.bfloat16 if gpu else torch.float32
    check_fits(cfg, sc, MODES if args.mode == "all" else (args.mode,), gpu, 2 if gpu else 4)
    layer_bytes = cfg.layer_params * (2 if gpu else 4)
    size = f"{layer_bytes / 2**20:.0f} MiB" if layer_bytes >= 2**20 else f"{layer_bytes / 2**10:.0f} KiB"
    print(f"weight_streaming: {backend}; {cfg.layers} layers of {size}; "
          f"batch {cfg.batch} x prompt {cfg.prompt}, {cfg.decode_steps} decode steps; "
          f"prefetch_distance={sc.prefetch_distance}, max_cached_layers={sc.max_cached_layers}"
          + (f"; compare {' '.join(f'{c.prefetch_distance}:{c.max_cached_layers}' for c in args.compare)}" if args.compare else "")
          + ("; host read after every layer" if args.host_sync_per_layer else "")
          + (f"; {args.competing_h2d_mib} MiB of competing H2D traffic per layer" if args.competing_h2d_mib else ""))
    if not gpu:
        print("no GPU: a tiny model on the CPU, plain copies, no streams (the timings mean nothing here)")
    model = Model(cfg, torch, backend.device, dtype)
    n_tokens = cfg.prompt + cfg.decode_steps
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, n_tokens), generator=torch.Generator().manual_seed(1)).to(backend.device)
    modes = MODES if args.mode == "all" else (args.mode,)
    # Every timed run, in order: (range and result name, mode, streaming configuration).
    runs = [(m, m, sc) for m in modes]
    if "prefetch" in modes:
        runs += [(f"prefetch_d{c.prefetch_distance}_c{c.max_cached_layers}", "prefetch", c) for c in args.compare]
    results: dict[str, object] = {"config": asdict(cfg), "streaming": asdict(sc), "device": backend.device,
                                  "layer_bytes": layer_bytes, "host_sync_per_layer": args.host_sync_per_layer,
                                  "competing_h2d_mib": args.competing_h2d_mib}
    print("warming up (allocator, cuBLAS, kernel loading) ...")
    for _, mode, streaming in runs:
        if mode == "transfer_only":
            transfer_only(model, 1)
        else:
            generate(model, mode, streaming, tokens, args.competing_h2d_mib, args.host_sync_per_layer)
    if gpu and "transfer_only" in modes:
        # Measured after the warm-up, not at the process's start: a run of 2026-11-26 (H100) that measured first
        # read 29.9 GB/s, about half of what its own weight copies reached later in the same process (54.8 GB/s).
        # Why the first copies were slow was not established; after the warm-up the link has carried gigabytes.
        results["pinned_h2d_peak_gbps"] = pinned_h2d_peak_gbps(torch)
        print(f"  pinned H2D peak (512 MiB copy, median of 10, this process, after the warm-up): "
              f"{results['pinned_h2d_peak_gbps']:.1f} GB/s")
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.profiler.start()  # nsys --capture-range=cudaProfilerApi records from here ...
    reference = None
    worst = 0.0
    passes: dict[str, list[list[float]]] = {name: [] for name, _, _ in runs}  # per run: each repeat's pass times
    for _ in range(args.repeats):  # rounds over the runs: a slow spell of the machine falls on all of them
        for name, mode, streaming in runs:
            with annotate(f"mode_{name}"):
                if mode == "transfer_only":
                    passes[name].append(transfer_only(model, 1 + cfg.decode_steps))
                    continue
                logits, times = generate(model, mode, streaming, tokens, args.competing_h2d_mib, args.host_sync_per_layer)
            passes[name].append(times)
            if reference is None:
                reference = logits
            else:
                worst = max(worst, check_same_logits(f"{name}", logits, reference, gpu))
    for name, mode, streaming in runs:
        if mode == "transfer_only":
            results[name] = {"pass_ms": [t for rep in passes[name] for t in rep]}
        else:
            results[name] = {**summarise_passes(passes[name]), **asdict(streaming)}
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()  # ... to here
    for name, r in results.items():
        if isinstance(r, dict) and "pass_ms" in r:
            med = statistics.median(r["pass_ms"])
            line = f"  {name:<16} per pass {med:8.2f} ms (copies only, median of {len(r['pass_ms'])})"
            if gpu:
                r["weight_copy_gbps"] = cfg.layers * layer_bytes / med / 1e6
                line += f": {r['weight_copy_gbps']:.1f} GB/s"
            print(line)
        elif isinstance(r, dict) and "prefill_ms" in r:
            print(f"  {name:<16} prefill {r['prefill_ms']:8.2f} ms{spread(r['prefill_runs_ms'])}, "
                  f"decode {statistics.median(r['decode_ms']):8.2f} ms per step (median)")
    if args.sweep:
        results["sweep"] = sweep(model, tokens, cfg, args.competing_h2d_mib, args.host_sync_per_layer, args.repeats)
    results["repeats"] = args.repeats
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"results written to {args.json}")
    checked = [name for name, mode, _ in runs if mode != "transfer_only"]
    if len(checked) > 1:
        print(f"result checked: {', '.join(checked)} computed the same logits (largest difference {worst:.3g})")
    else:
        print("result checked: ran (one configuration, nothing to compare)")
    return 0


def sweep_configs(layers: int) -> list[StreamingConfig]:
    """The sweep's grid: distances 0..4; for each, the fewest buffers it needs, one more, twice that, and all layers."""
    out = []
    for d in range(0, min(4, layers - 1) + 1):
        out += [StreamingConfig(d, c) for c in sorted({d + 1, d + 2, 2 * d + 2, layers}) if c <= layers]
    return out


def summarise_passes(passes: list[list[float]]) -> dict[str, object]:
    """One run's repeats (each [prefill, decode_0, ...] in ms) as the JSON keeps them: every prefill
    (``prefill_runs_ms``) and their median (``prefill_ms``), and every decoding step of every repeat
    (``decode_ms``, whose median is the median step)."""
    prefills = [p[0] for p in passes]
    return {"prefill_ms": statistics.median(prefills), "prefill_runs_ms": prefills,
            "decode_ms": [t for p in passes for t in p[1:]]}


def spread(samples: list[float]) -> str:
    """' (median of 5, IQR 79.4-80.2)' for several samples, '' for one."""
    if len(samples) < 2:
        return ""
    lo, hi = Timing(tuple(samples), "perf_counter", 1).iqr
    return f" (median of {len(samples)}, IQR {lo:.2f}-{hi:.2f})"


def sweep(model: Model, tokens, cfg: ModelConfig, competing_mib: int = 0, host_sync: bool = False,  # type: ignore[no-untyped-def]
          repeats: int = 1) -> list[dict]:
    """prefetch_distance x max_cached_layers: prefill and decode times, GPU memory held; OOM is a row."""
    torch, gpu = model.torch, model.device == "cuda"
    rows = []
    grid = sweep_configs(cfg.layers)
    for k, sc in enumerate(grid, 1):
        d, c = sc.prefetch_distance, sc.max_cached_layers
        row: dict[str, object] = {"prefetch_distance": d, "max_cached_layers": c}
        try:
            if gpu:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            passes = []
            for _ in range(repeats):
                with annotate(f"sweep_d{d}_c{c}"):
                    passes.append(generate(model, "prefetch", sc, tokens, competing_mib, host_sync)[1])
            summary = summarise_passes(passes)
            decode = summary["decode_ms"]
            row.update(prefill_ms=summary["prefill_ms"], prefill_runs_ms=summary["prefill_runs_ms"],
                       decode_ms=statistics.median(decode) if decode else None,
                       peak_gib=torch.cuda.max_memory_allocated() / 2**30 if gpu else None)
        except torch.cuda.OutOfMemoryError:
            row["error"] = "out of memory"
            if gpu:
                torch.cuda.empty_cache()
        rows.append(row)
        shown = row.get("error") or f"prefill {row['prefill_ms']:.2f} ms{spread(row['prefill_runs_ms'])}" + (
            f", decode {row['decode_ms']:.2f} ms" if row.get("decode_ms") is not None else "")
        print(f"  sweep {k}/{len(grid)} d={d} c={c}: {shown}")
    return rows


if __name__ == "__main__":
    sys.exit(main())
