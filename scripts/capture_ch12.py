#!/usr/bin/env python3
"""Regenerate chapter 12's references on one GPU, then execute its notebook: one command for the course's GPU run.

Chapter 12 (``notebooks/12__llm_inference.ipynb``) reads its references only: the decode runs take minutes
and load 16 GB of weights per process, more than a notebook cell should hide. This script makes them, in
``artifacts/ch12/`` with their provenance (``gpuprof.artifacts.record_file``), each from a command the
provenance records as run:

1. ``ceilings.json``: the device copy and the BF16 product (chapter 0's measurements), in this session;
2. ``ladder.json``: every rung at batch 1, 8 and 64 (prompt 512, 64 steps), with the logit check (``int8_graph``
   included: llm_decode.py runs every rung by default on a GPU; its int8 copy, 7.5 GB, is made once per batch);
3. ``sweep.json``: the ``graph`` rung at batch 1 to 1,024 (prompt 32, 32 steps), with the check;
4. ``decode_b1.sqlite.gz``: Nsight Systems over ``eager_dynamic``, ``compile_graph`` and ``fused_graph`` at
   batch 1 (the naive loop and the two best rungs; ``--cuda-graph-trace=node``), exported and gzipped;
5. ``prefill2048.json``: prefill of 2,048 tokens at batch 1 and 8;
6. ``noclone.json``: the ``--no-clone`` pitfall (its check must fail: exit status 2 is the expected one);
7. ``kv_capacity.json``: ``examples/nsys/kv_capacity.py`` (step ``kv``), the largest batch whose KV cache and one
   decoding step fit beside the weights at contexts of 1,024 to 131,072 tokens, found by real allocations, beside
   the arithmetic's prediction for the same free memory. Its time is unmeasured (no GPU has run it yet); estimated
   at under a minute beyond loading the weights: some 40 tries, each writing its cache once and reading it and the
   weights once, at most the GPU's memory each way;
8. ``decode_ncu_compile_graph.kernels.csv``, ``decode_ncu_fused_graph.kernels.csv`` and
   ``decode_ncu_int8_graph.kernels.csv``: Nsight Compute over ONE decoding step of each rung at batch 1 (for
   int8_graph: whether Inductor fused the int8 matrices' cast and scale into the products, or each matrix's cast is a
   kernel of its own that writes a BF16 copy, which the reader then shows as bytes beyond the weights or cannot match
   to the layer's roles) (step :data:`NCU_STEP` of the timed generation, selected by its NVTX ranges;
   ``--graph-profiling node``, so each kernel of the graph is its own result; the SpeedOfLight section and the
   metrics ``gpuprof.studies.decode_kernels`` reads: duration, DRAM bytes read, DRAM throughput's share of peak), each
   then read per kernel and by the layer's role (printed). The reference is the kernel table
   (``decode_kernels.write_kernel_table``: a row per kernel, 64 KB); the report itself (``decode_ncu_<rung>.ncu-rep``,
   71 MB for a step of 502 kernels on an H200, 2026-11-27) stays where it was made, ignored by git. It fails with one
   sentence where ncu is missing or the driver keeps the counters to administrators;

9. ``own_ceilings.json`` and ``own_kernels.json`` (step ``own``): the device copy and the BF16 product measured
   again, then ``triton_graph`` (our own Triton kernels, ``gpuprof/studies/decode_triton.py``) beside
   ``compile_graph`` and ``fused_graph`` at batch 1 and 8 (prompt 512, 64 steps), with the check, in one process;
   about 2 minutes on an H200 (2026-11-27), most of it loading the weights and compiling;
   ``own_ceilings_repN.json`` and ``own_kernels_repN.json`` (step ``own_repeats``): step ``own`` again in
   :data:`OWN_REPEATS` more processes, each with its own copy, so that the share's spread between processes is
   measured, not assumed (87 s for the first process on a fresh H200, 43 and 38 s for the next two, run as three
   ``--only own`` commands, 2026-11-28; this step runs the same decode command, but measures all its copies in one
   parent process, each before its repeat's decode child: the first on an idle GPU, as each of those records' copies
   was, the later ones seconds after the previous child; the H100's are renamed ``*_h100.json``, as its other records);
   ``copy_repeats.json`` (step ``copy_repeats``): the device copy alone, measured :data:`COPY_SERIES` times in each of
   several processes in turn, with seconds of back-to-back copies between measurements and the SM clock, temperature
   and power beside each (``speed_of_light.copy_series``; its target, ``--only copy_series_target``, is one process):
   whether the ceiling the shares divide by is noise or drifts as the GPU stays busy;

10. ``decode_own_b1.sqlite.gz`` (step ``own_nsys``): Nsight Systems over ``fused_graph`` and ``triton_graph`` at
    batch 1, as step 4 (``--ncu-rungs triton_graph`` profiles our kernels' step with Nsight Compute the same way):
    42 s and 147 s on an H100 (2026-11-28);

11. ``own_breakdown.json`` (step ``own_breakdown``): ``triton_graph``'s step at batch 1 taken apart
    (``decode_triton.TritonLayers.breakdown``: the whole forward, attention, each product's role, each timed alone as a
    graph over every layer, with its matrices' bytes and rate) at position 575 of a 576-position cache (the ladder's
    last step), beside a device copy measured in the same process: 3 s on a warm H100, 18 s on a fresh one (2026-11-28);

12. ``own_attention.json`` (step ``own_attention``): attention alone at contexts of 576 to 131,072 positions, our two
    kernels beside PyTorch's ``scaled_dot_product_attention`` over the same caches, per layer, with a device copy;
    ``attention_ncu.ncu-rep`` (step ``ncu_attention``): Nsight Compute over layer 0's calls of both at each context
    (``--only attention_target`` is its target: the calls alone, nothing written);

then ``scripts/capture_all.py --notebooks notebooks/12__llm_inference.ipynb`` (executes the notebook in
place and runs strict nbval over it). Each run's printed output goes to ``artifacts/ch12/run_output.txt``.

A run whose check fails (exit 2) is kept (its JSON is written before the exit) and reported at the end;
the script exits 2 then, after everything else has run. ``--only`` runs some steps (e.g. ``--only nsys,notebook``).
Time on an H100: the first run of the same commands took 124 s for the ladder (before ``fused_graph`` joined it)
and 188 s for the sweep (with one more batch); the rest is unmeasured: the other steps, ``fused_graph``'s
compilation (Inductor's coordinate-descent tuning benchmarks each kernel's variants; once per batch of the ladder,
so three times), ``int8_graph``'s (the same tuning over other kernels, its output projection's too, and its int8
copy made, three times in the ladder) and the ``ncu`` step (three processes, each loading 16 GB of weights and
compiling its rung before ncu profiles the few hundred kernels of one step). The earlier estimate, about 8 minutes
for the whole script, predates ``fused_graph``, ``int8_graph`` and the ``ncu`` step; what they add is not measured
yet. Each step's outputs stay in ``artifacts/ch12`` on the GPU machine: a command the device tool kills at ten
minutes brings none back, so copy them out after every command. To stay inside 10-minute commands, split it:
first a probe of the new rungs' setup time (``llm_decode.py --model 8b --rung eager_static,fused_graph,int8_graph
--batch 1 --prompt-len 512 --new-tokens 8``, which also fills Inductor's on-disk cache of tuned kernels), then
``--only ceilings,ladder``, ``--only sweep``, ``--only nsys,prefill,noclone,kv,notebook``, and ``--only ncu
--ncu-rungs R`` once per rung (each later part adds to the first's log; ``kv`` is unmeasured too).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuprof import describe_machine, exit_on_error  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

SCRIPT = "examples/nsys/llm_decode.py"
DECODE = ["--model", "8b"]
RUNS = {  # name: (arguments, the exit status expected)
    "ladder.json": ([*DECODE, "--batch", "1,8,64", "--prompt-len", "512", "--new-tokens", "64"], 0),
    "sweep.json": ([*DECODE, "--rung", "graph", "--batch", "1,2,4,8,16,32,64,128,256,384,512,1024",
                    "--prompt-len", "32", "--new-tokens", "32"], 0),
    "prefill2048.json": ([*DECODE, "--rung", "eager_static", "--batch", "1,8", "--prompt-len", "2048",
                          "--new-tokens", "2", "--no-check"], 0),
    "noclone.json": ([*DECODE, "--rung", "graph", "--batch", "1", "--prompt-len", "512", "--new-tokens", "16",
                      "--no-clone"], 2),
    # our own kernels (triton_graph) beside the compiled rungs they are measured against, in one process
    "own_kernels.json": ([*DECODE, "--rung", "eager_static,compile_graph,fused_graph,triton_graph", "--batch", "1,8",
                          "--prompt-len", "512", "--new-tokens", "64"], 0),
}
NSYS_ARGS = [*DECODE, "--rung", "eager_dynamic,compile_graph,fused_graph", "--batch", "1", "--prompt-len", "512",
             "--new-tokens", "32", "--no-check"]
# nsys over our own kernels beside the rung they replace (step own_nsys)
# 64 new tokens, as the ncu step's and own_breakdown's runs: the same cache size (576 positions), so attention's grid
# (8 x 18 chunks) is the same in all three
OWN_NSYS_ARGS = [*DECODE, "--rung", "fused_graph,triton_graph", "--batch", "1", "--prompt-len", "512",
                 "--new-tokens", "64", "--no-check"]
NCU_RUNGS = ("compile_graph", "fused_graph", "int8_graph")  # the ncu step's default
NCU_CHOICES = (*NCU_RUNGS, "triton_graph")  # what --ncu-rungs accepts
# The element size of each rung's matrices, as the per-kernel reader assigns roles by bytes read (int8: one byte).
MATRIX_BYTES = {"int8_graph": 1}
NCU_STEP = 4  # the decoding step ncu profiles: one of the timed generation's (not the warm-up's, not the first)
# the ladder's prompt and steps, so the fixed-shape step attends over the same 576 positions and Inductor's tuned
# kernels (cached on disk by their source) are the ladder's
NCU_NEW_TOKENS = 64
# -c: the most kernels ncu profiles; the NVTX filter keeps one step, which launches fewer (a few hundred for a compiled
# step of 32 layers: unmeasured here, the nsys step's summary counts them), so the limit only guards against a filter
# that matches more than intended.
NCU_LIMIT = 2000
KV_SCRIPT = "examples/nsys/kv_capacity.py"
KV_ARGS = ["--model", "8b", "--context", "1024,4096,32768,131072"]
STEPS = ("ceilings", "ladder", "sweep", "nsys", "prefill", "noclone", "kv", "ncu", "own", "own_repeats", "copy_repeats",
         "own_nsys", "own_breakdown", "own_attention", "ncu_attention", "notebook")
OWN_REPEATS = 3  # step own_repeats: processes after own's, each one more share of its own session's copy
# step copy_repeats: processes in turn, measurements in each, seconds of back-to-back copies between two measurements
COPY_PROCESSES, COPY_SERIES, COPY_BUSY_S = 3, 6, 4.0
# own_attention: attention alone at these contexts (the ladder's 576 first), the cache sized to each; ncu_attention
# profiles one call of each kernel at each context (its target, --only attention_target: the calls only, nothing written)
ATTENTION_CONTEXTS = (576, 2048, 8192, 32768, 131072)
ATTENTION_SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "SchedulerStats", "WarpStateStats",
                      "MemoryWorkloadAnalysis")
BREAKDOWN_POSITIONS = 576  # the ladder's prompt (512) and steps (64): the breakdown's step is the last one, at 575
NOTEBOOK = "notebooks/12__llm_inference.ipynb"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(STEPS),
                   help=f"the steps to run, separated by commas (default: all, in this order: {', '.join(STEPS)})")
    p.add_argument("--ncu-rungs", default=",".join(NCU_RUNGS),
                   help=f"the rungs the ncu step profiles, separated by commas (default: {', '.join(NCU_RUNGS)}; each "
                        "loads the weights and compiles its rung under ncu: one per command keeps a command short)")
    args = p.parse_args(argv)
    args.ncu_rungs = [r.strip() for r in args.ncu_rungs.split(",") if r.strip()]
    if not args.ncu_rungs or any(r not in NCU_CHOICES for r in args.ncu_rungs):
        p.error(f"--ncu-rungs {args.ncu_rungs!r}: choose among {', '.join(NCU_CHOICES)}")
    steps = [s.strip() for s in args.only.split(",") if s.strip()]
    # attention_target: ncu_attention's own; copy_series_target: one process of copy_repeats
    unknown = [s for s in steps if s not in (*STEPS, "attention_target", "copy_series_target")]
    if unknown or not steps:
        p.error(f"unknown step(s) {', '.join(unknown) or repr(args.only)}; the steps are {', '.join(STEPS)}")
    args.steps = steps
    return args


def run_decode(name: str, args: list[str], expected: int, log, script: str = SCRIPT) -> int:  # type: ignore[no-untyped-def]
    """``script`` (the decoder's, unless another is named) with ``args --json artifacts/ch12/<name>``, its output to
    the terminal and the log; the JSON recorded with the command as shown. Returns the exit status."""
    from gpuprof.artifacts import chapter_output, record_file

    out = chapter_output("ch12") / name
    shown = " ".join(["python3", script, *args, "--json", name])
    print(f"$ {shown}", flush=True)
    log.write(f"$ {shown}\n")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(ROOT / script), *args, "--json", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        log.write(line)
    code = proc.wait()
    note = f"exit {code} ({'expected' if code == expected else f'expected {expected}'}), {time.perf_counter() - t0:.0f} s"
    print(f"== {name}: {note}", flush=True)
    log.write(f"== {name}: {note}\n")
    if out.exists():
        record_file("ch12", name, shown + (f" (exit {code}, as expected: its check fails)" if expected else ""))
    return code


def ceilings(name: str = "ceilings.json", step: str = "") -> None:
    """The device copy and the BF16 product, measured now: the shares of the chapter are of these (``name``: the
    record; the own step keeps its own, so that its shares are of a copy measured minutes before its run)."""
    from gpuprof.artifacts import save_json
    from gpuprof.backend import choose_backend
    from gpuprof.studies import speed_of_light as s

    copy, matmul = s.device_copy(choose_backend()), s.matmul_bf16()
    if matmul is None:
        raise GpuprofError("No BF16 product could be measured here (it needs PyTorch on a GPU).")
    data = {"gpu": describe_machine().gpu_name, "d2d_gbps": copy.value, "d2d_how": copy.how,
            "matmul_bf16_tflops": matmul.value, "matmul_how": matmul.how}
    print(f"ceilings: device copy {copy.value:,.1f} GB/s, BF16 product {matmul.value:,.1f} TFLOP/s", flush=True)
    step = step or ("own" if name != "ceilings.json" else "ceilings")
    save_json("ch12", name, data, overwrite=True,
              command=f"python3 scripts/capture_ch12.py --only {step} (gpuprof.studies.speed_of_light.device_copy "
                      "and matmul_bf16)")


def own_breakdown(name: str = "own_breakdown.json", preset: str = "8b", device: str = "cuda") -> None:
    """``triton_graph``'s step at batch 1 taken apart (:meth:`decode_triton.TritonLayers.breakdown`), with a device copy
    measured in the same process, so each part's rate reads against it. The cache is filled by a prefill of a random
    prompt first (attention's time does not depend on the values; the prefill only makes them a model's)."""
    import dataclasses

    import torch

    from gpuprof.artifacts import save_json
    from gpuprof.backend import choose_backend
    from gpuprof.runner import load_script
    from gpuprof.studies import decode_triton as dt
    from gpuprof.studies import speed_of_light as s

    llm = load_script(ROOT / SCRIPT)
    cfg = llm.PRESETS[preset]
    model = llm.Decoder(cfg, torch, device, torch.bfloat16, BREAKDOWN_POSITIONS)
    cache = llm.StaticCache(cfg, torch, 1, BREAKDOWN_POSITIONS, device, torch.bfloat16)
    prompt = torch.randint(0, cfg.vocab, (1, BREAKDOWN_POSITIONS - 1), device=device,
                           generator=torch.Generator(device=device).manual_seed(0))
    with torch.no_grad():
        model.forward(prompt, cache, 0)
        kernels = dt.TritonLayers(model, cache, 1)
        t0 = time.perf_counter()
        tiles = kernels.tune_all()
        if device == "cuda":
            torch.cuda.synchronize()
        tune_s = time.perf_counter() - t0
        pos = torch.tensor([BREAKDOWN_POSITIONS - 1], device=device)
        rows = kernels.breakdown(prompt[:, -1:].contiguous(), pos)
    copy = s.device_copy(choose_backend())
    for r in rows:
        r["share_of_copy"] = r["GB_per_s"] / copy.value if r["GB_per_s"] else None
    data = {"gpu": describe_machine().gpu_name, "d2d_gbps": copy.value, "d2d_how": copy.how, "batch": 1,
            "pos": BREAKDOWN_POSITIONS - 1, "tiles": {k: dataclasses.asdict(v) for k, v in tiles.items()},
            "tune_s": tune_s, "parts": rows}
    for r in rows:
        rate = f"{r['GB_per_s']:,.1f} GB/s ({r['share_of_copy']:.1%} of the copy)" if r["GB_per_s"] else ""
        print(f"own_breakdown: {r['part']:<9} {r['ms']:8.4f} ms  {r['us_per_layer']:8.2f} us/layer  {rate}", flush=True)
    print(f"own_breakdown: device copy {copy.value:,.1f} GB/s; tiles tuned in {tune_s:.1f} s", flush=True)
    save_json("ch12", name, data, overwrite=True,
              command="python3 scripts/capture_ch12.py --only own_breakdown (gpuprof.studies.decode_triton."
                      "TritonLayers.breakdown, then speed_of_light.device_copy)")


def _attention_setup(preset: str, device: str) -> tuple[Any, Any, Any]:
    """(torch, the decoder script, the model) for :func:`own_attention`: the 8b model whole, so that each context's
    cache has 32 layers, as in a step (a smaller cache would sit in L2 between a graph's replays)."""
    import torch

    from gpuprof.runner import load_script

    llm = load_script(ROOT / SCRIPT)
    model = llm.Decoder(llm.PRESETS[preset], torch, device, torch.bfloat16, max(ATTENTION_CONTEXTS))
    return torch, llm, model


def _attention_calls(torch: Any, llm: Any, model: Any, context: int, device: str) -> tuple[Any, Any]:
    """For one context: (triton_graph's attention, PyTorch's scaled_dot_product_attention over the same caches), each a
    function of the layers to run (default: every layer). The caches, the new token's q, k and v and the residual stream are
    drawn (attention's time does not depend on the values); the query attends to every position, 0 to context - 1."""
    import torch.nn.functional as F

    from gpuprof.studies import decode_triton as dt

    cfg = model.cfg
    cache = llm.StaticCache(cfg, torch, 1, context, device, torch.bfloat16)
    gen = torch.Generator(device=device).manual_seed(context)
    for t in [*cache.k, *cache.v]:
        t.normal_(generator=gen)
    kernels = dt.TritonLayers(model, cache, 1)
    kernels.qkv.normal_(generator=gen)
    kernels.x.normal_(generator=gen)
    pos = torch.tensor([context - 1], device=device)
    q = torch.randn((1, cfg.q_heads, 1, cfg.head_dim), generator=gen, device=device, dtype=torch.bfloat16)
    every = range(cfg.layers)

    def ours(layers: range = every) -> None:
        for i in layers:
            kernels.attention(i, pos)

    def sdpa(layers: range = every) -> None:
        for i in layers:
            F.scaled_dot_product_attention(q, cache.k[i], cache.v[i], enable_gqa=True)

    return ours, sdpa


def own_attention(name: str = "own_attention.json", preset: str = "8b", device: str = "cuda") -> None:
    """Attention alone at each of :data:`ATTENTION_CONTEXTS`: ``triton_graph``'s two kernels (``attend_part`` over
    chunks of 32 positions, ``attend_combine``) and PyTorch's ``scaled_dot_product_attention`` (its default choice of
    backend) over the same 32 layers' caches, each timed as a CUDA graph of all 32 layers
    (``decode_triton._graph_ms``), per layer, with the KV bytes a layer reads and their rate; then a device copy in the
    same process. Why: at 576 positions attention reads 2.4 MB a layer in ~10 us (section 10: latency); how it
    scales with the context says when it turns into a stream of bytes, and where the kernels' design stops keeping
    up (``ncu_attention`` profiles the same calls)."""
    from gpuprof.artifacts import save_json
    from gpuprof.backend import choose_backend
    from gpuprof.studies import decode_triton as dt
    from gpuprof.studies import speed_of_light as s

    torch, llm, model = _attention_setup(preset, device)
    cfg = model.cfg
    rows = []
    with torch.no_grad():
        for context in ATTENTION_CONTEXTS:
            ours, sdpa = _attention_calls(torch, llm, model, context, device)
            kv_bytes = 2 * cfg.kv_heads * context * cfg.head_dim * 2  # one layer's keys and values, bfloat16
            row = {"context": context, "kv_bytes_per_layer": kv_bytes,
                   "splits": -(-context // dt.TritonLayers.CHUNK)}
            for label, fn in (("triton", ours), ("sdpa", sdpa)):
                ms = dt._graph_ms(fn, 9)
                row[f"{label}_us_per_layer"] = ms * 1e3 / cfg.layers
                row[f"{label}_GB_per_s"] = kv_bytes * cfg.layers / ms / 1e6
            rows.append(row)
            print(f"own_attention: context {context:>7,}: KV {kv_bytes / 1e6:8.2f} MB a layer; triton "
                  f"{row['triton_us_per_layer']:8.2f} us ({row['triton_GB_per_s']:8,.1f} GB/s), sdpa "
                  f"{row['sdpa_us_per_layer']:8.2f} us ({row['sdpa_GB_per_s']:8,.1f} GB/s)", flush=True)
            del ours, sdpa
            if device == "cuda":
                torch.cuda.empty_cache()
    copy = s.device_copy(choose_backend())
    for r in rows:
        for label in ("triton", "sdpa"):
            r[f"{label}_share_of_copy"] = r[f"{label}_GB_per_s"] / copy.value
    print(f"own_attention: device copy {copy.value:,.1f} GB/s", flush=True)
    save_json("ch12", name, {"gpu": describe_machine().gpu_name, "d2d_gbps": copy.value, "d2d_how": copy.how,
                             "layers": cfg.layers, "chunk": dt.TritonLayers.CHUNK, "rows": rows}, overwrite=True,
              command="python3 scripts/capture_ch12.py --only own_attention (triton_graph's attention and PyTorch's "
                      "scaled_dot_product_attention alone, CUDA graphs of 32 layers, then speed_of_light.device_copy)")


def copy_series_target() -> None:
    """One process of step ``copy_repeats``: :func:`speed_of_light.copy_series` with NVML's readings, printed as one
    JSON line after ``COPY_SERIES`` (what :func:`copy_repeats` reads); nothing written."""
    import json

    import torch

    from gpuprof.backend import choose_backend
    from gpuprof.nvml import Nvml, torch_pci_bus_id
    from gpuprof.studies import speed_of_light as s

    if not torch.cuda.is_available():
        raise GpuprofError(f"copy_series_target measures a GPU's copy: this machine is {describe_machine().summary()}.")
    nvml, why = Nvml.open(torch_pci_bus_id(torch))
    if nvml is None:
        print(f"copy_series_target: no clock, temperature or power readings ({why})", flush=True)
    def sample() -> dict[str, Any]:  # NVML's readings right after a measurement
        assert nvml is not None
        r = nvml.read()
        return {"sm_mhz": r.sm_mhz, "mem_mhz": nvml.mem_mhz(), "temp_c": r.temp_c, "power_w": r.power_w,
                "reasons": None if r.reasons is None else f"{r.reasons:#x}"}

    rows = s.copy_series(choose_backend(), COPY_SERIES, COPY_BUSY_S, sample if nvml is not None else None)
    print("COPY_SERIES " + json.dumps(rows), flush=True)


def copy_repeats(log) -> None:  # type: ignore[no-untyped-def]
    """Step ``copy_repeats``: :data:`COPY_PROCESSES` processes of :func:`copy_series_target` in turn, each's rows
    printed and kept in ``copy_repeats.json``."""
    import json

    from gpuprof.artifacts import save_json

    processes = []
    for i in range(COPY_PROCESSES):
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "capture_ch12.py"), "--only", "copy_series_target"],
                              cwd=ROOT, capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("COPY_SERIES ")]
        if proc.returncode != 0 or not lines:
            raise GpuprofError(f"copy_series_target (process {i + 1}) exited {proc.returncode} without its series.",
                               (proc.stdout + proc.stderr)[-2000:])
        rows = json.loads(lines[-1].split(" ", 1)[1])
        processes.append(rows)
        for r in rows:
            line = (f"copy process {i + 1}, t {r['t_s']:6.1f} s: {r['gbps']:,.1f} GB/s (spread {r['relative_spread']:.2%}); "
                    f"SM {r.get('sm_mhz')} MHz, memory {r.get('mem_mhz')} MHz, {r.get('temp_c')} C, {r.get('power_w')} W, "
                    f"reasons {r.get('reasons')}")
            print(line, flush=True)
            log.write(line + "\n")
    save_json("ch12", "copy_repeats.json", {"processes": processes, "series": COPY_SERIES, "busy_s": COPY_BUSY_S,
                                            "gpu": describe_machine().gpu_name},
              overwrite=True, command="python3 scripts/capture_ch12.py --only copy_repeats (gpuprof.studies."
                                      "speed_of_light.copy_series in each process, NVML's readings beside)")


def attention_target(device: str = "cuda") -> None:
    """What ``ncu_attention`` profiles: layer 0's attention, ours and PyTorch's, once per context (the caches of every
    layer allocated, as in :func:`own_attention`), inside NVTX ranges ``ncu_attention/context_<C>/<triton|sdpa>``;
    nothing is timed or written."""
    torch, llm, model = _attention_setup("8b", device)
    nvtx = torch.cuda.nvtx
    with torch.no_grad():
        for context in ATTENTION_CONTEXTS:
            ours, sdpa = _attention_calls(torch, llm, model, context, device)
            first = range(1)
            ours(first)  # once outside the ranges: Triton compiles here, not under the profiler's range
            sdpa(first)
            torch.cuda.synchronize()
            # the filter's range around the profiled calls only (the caches' allocation and drawing launch kernels too)
            nvtx.range_push("ncu_attention")
            nvtx.range_push(f"context_{context}")
            for label, fn in (("triton", ours), ("sdpa", sdpa)):
                nvtx.range_push(label)
                fn(first)
                nvtx.range_pop()
            nvtx.range_pop()
            nvtx.range_pop()
            torch.cuda.synchronize()
            del ours, sdpa
            torch.cuda.empty_cache()


def ncu_attention_step() -> None:
    """Nsight Compute over :func:`attention_target`'s calls (layer 0's kernels of each attention at each context), with
    the sections a latency question needs (:data:`ATTENTION_SECTIONS`); the report kept gzipped where it is large."""
    from gpuprof.artifacts import gzip_reference
    from gpuprof.ncu.capture import MAX_REPORT_BYTES, ncu_capture
    from gpuprof.tools import COUNTER_PERMISSION_HINT, profiling_restricted, require_tool

    require_tool("ncu", "the ncu_attention step needs Nsight Compute (ncu)")
    if profiling_restricted():
        raise GpuprofError("The ncu_attention step cannot read GPU performance counters here (RmProfilingAdminOnly: 1).",
                           COUNTER_PERMISSION_HINT)
    options = ["--nvtx", "--nvtx-include", "ncu_attention/", "--clock-control", "none"]
    for section in ATTENTION_SECTIONS:
        options += ["--section", section]
    options += ["-c", str(len(ATTENTION_CONTEXTS) * 8)]  # a guard: 2 kernels of ours and a few of SDPA's per context
    cap = ncu_capture("ch12", "attention_ncu", "scripts/capture_ch12.py", ["--only", "attention_target"],
                      options=options, details=True)
    if cap.report.source != "this machine":
        raise GpuprofError("The ncu_attention capture was not made here (ncu's message is above).",
                           COUNTER_PERMISSION_HINT)
    if cap.path.stat().st_size > MAX_REPORT_BYTES:
        gzip_reference(cap.path)


def nsys_capture(name: str = "decode_b1", args: list[str] | None = None) -> None:
    """nsys over the naive loop and the best rungs at batch 1 (``args``, default :data:`NSYS_ARGS`; the own_nsys
    step: :data:`OWN_NSYS_ARGS` as ``decode_own_b1``); the export cut (``llm_inference.trim_decode_capture``: the
    naive loop's last 8 steps, every step of the graph rungs) and gzipped, as the course commits it."""
    import json

    from gpuprof.artifacts import chapter_output, gzip_reference, record_file
    from gpuprof.studies import llm_inference as li

    cap = li.capture_decode(name, NSYS_ARGS if args is None else args)
    if cap.sqlite.source != "this machine":
        raise GpuprofError("The nsys capture was not made here (its message is above).")
    folder = chapter_output("ch12")
    note = li.trim_decode_capture(folder / f"{name}.sqlite")
    gzip_reference(folder / f"{name}.sqlite")
    entry = json.loads((folder / "provenance.json").read_text())["files"][f"{name}.sqlite.gz"]
    record_file("ch12", f"{name}.sqlite.gz", entry["command"], entry.get("tools"), note=note)
    (folder / f"{name}.nsys-rep").unlink(missing_ok=True)  # raw reports stay out of the course (.gitignore)
    print(li.capture_summary(folder / f"{name}.sqlite.gz").round(3).to_string(), flush=True)


def ncu_filters(rung: str) -> list[str]:
    """The NVTX filters to try, in order: the timed generation's range and the step inside it (push/pop ranges,
    outermost first, each closed by ``/``), so the warm-up's step of the same number is left out; then the step's
    range alone (the form the course's other captures use), whose extra warm-up kernels the reader drops by the
    report's NVTX column. The nested form was checked on ncu 2025.3.1 on an H100 (2026-11-27, artifacts/capture_run.md):
    in a toy with one kernel inside ranges ``a`` > ``b`` and one inside ``a`` only, ``a/b/`` profiled the first
    kernel only, ``a/`` both, and ``b/`` the first too (a range need not be the outermost to match, so the fallback
    also catches the warm-up's step of the same number, as said)."""
    return [f"{ncu_range(rung)}/", f"decode_step_{NCU_STEP}/"]


def ncu_args(rung: str, nvtx_filter: str | None = None) -> tuple[list[str], list[str]]:
    """(ncu's options, the script's arguments) for one decoding step of ``rung`` at batch 1 under ``nvtx_filter``
    (default: the first of :func:`ncu_filters`)."""
    from gpuprof.studies.decode_kernels import NCU_METRICS

    nvtx_filter = nvtx_filter or ncu_filters(rung)[0]
    # --clock-control none: the step at the clocks the ladder ran at (ncu's default locks them to base, which slows
    # short kernels more than long ones and would skew the roles' shares and the comparison with the device copy)
    options = ["--nvtx", "--nvtx-include", nvtx_filter, "--graph-profiling", "node", "--clock-control", "none",
               "--section", "SpeedOfLight", "--metrics", ",".join(NCU_METRICS), "-c", str(NCU_LIMIT)]
    script_args = [*DECODE, "--rung", rung, "--batch", "1", "--prompt-len", "512",
                   "--new-tokens", str(NCU_NEW_TOKENS), "--no-check"]
    return options, script_args


def ncu_range(rung: str) -> str:
    """The NVTX path of the profiled step: the timed generation's range, then the step's (as a report names it)."""
    return f"rung_{rung}_b1/decode_step_{NCU_STEP}"


def ncu_capture_step(rungs: tuple[str, ...] | list[str] = NCU_RUNGS) -> list[str]:
    """Nsight Compute over one decoding step of each of :data:`NCU_RUNGS` at batch 1, each report read by role
    (with this session's device copy, when the ceilings step measured it). Returns the reports the reader could not
    read (they are kept: the reader's sentence is printed)."""
    import json

    from gpuprof.artifacts import chapter_output, gzip_reference, record_file
    from gpuprof.ncu.capture import MAX_REPORT_BYTES, ncu_capture
    from gpuprof.studies import decode_kernels as dk
    from gpuprof.studies.llm_inference import model_config
    from gpuprof.tools import COUNTER_PERMISSION_HINT, profiling_restricted, require_tool

    require_tool("ncu", "the ncu step needs Nsight Compute (ncu)")
    if profiling_restricted():
        raise GpuprofError("The ncu step cannot read GPU performance counters here: the driver keeps them to "
                           "administrators (RmProfilingAdminOnly: 1).", COUNTER_PERMISSION_HINT)
    ceilings = chapter_output("ch12") / "ceilings.json"
    copy_gbps = None
    if ceilings.exists():  # the shares only against a copy measured on this GPU's model (the committed one may not be)
        measured = json.loads(ceilings.read_text())
        if measured.get("gpu") == describe_machine().gpu_name:
            copy_gbps = measured["d2d_gbps"]
    unread = []
    for rung in rungs:
        cap = None
        for nvtx_filter in ncu_filters(rung):
            options, script_args = ncu_args(rung, nvtx_filter)
            try:  # a capture that fails falls back to a reference, and raises where there is none yet
                cap = ncu_capture("ch12", f"decode_ncu_{rung}", SCRIPT, script_args, options=options, details=False)
            except GpuprofError as exc:
                print(f"ncu, {rung}: nothing captured under --nvtx-include {nvtx_filter!r} ({exc})", flush=True)
                cap = None
                continue
            if cap.report.source == "this machine":
                break
            print(f"ncu, {rung}: nothing captured under --nvtx-include {nvtx_filter!r}", flush=True)
        if cap is None or cap.report.source != "this machine":
            raise GpuprofError(f"The ncu capture of {rung} was not made here (ncu's message is above; "
                               "ERR_NVGPUCTRPERM there means the counters are not permitted).", COUNTER_PERMISSION_HINT)
        report = cap.path
        if report.stat().st_size > MAX_REPORT_BYTES:
            report = gzip_reference(report)
        try:
            table = dk.step_kernels(report, model_config("8b"), MATRIX_BYTES.get(rung, 2), step_range=ncu_range(rung))
        except GpuprofError as exc:
            print(f"ncu, {rung}: {report.name} is kept, but gpuprof.studies.decode_kernels could not read it: {exc}",
                  flush=True)
            unread.append(report.name)
            continue
        kernel_table = dk.write_kernel_table(report, report.parent / f"decode_ncu_{rung}.kernels.csv")
        record_file("ch12", kernel_table.name, cap.command,
                    note=f"{report.name} ({report.stat().st_size:,} bytes, not kept: git ignores it) read by "
                         "gpuprof.studies.decode_kernels.write_kernel_table: a row per profiled kernel")
        print(f"ncu, {rung}: {len(table)} kernels in one step ({report.name}; the reference: {kernel_table.name})",
              flush=True)
        print(dk.role_table(table, model_config("8b"), MATRIX_BYTES.get(rung, 2), copy_gbps).round(3).to_string(),
              flush=True)
    return unread


def record_log(steps: list[str]) -> None:
    """``run_output.txt``'s provenance. A run that starts with the ceilings starts the log, and its entry; a later part
    appends to the log, so its entry keeps the first part's (``artifacts.append_to_record``)."""
    from gpuprof.artifacts import append_to_record, record_file

    command = "python3 scripts/capture_ch12.py --only " + ",".join(steps) + " (the decode runs' printed output)"
    (record_file if steps[0] == "ceilings" else append_to_record)("ch12", "run_output.txt", command)


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.steps == ["attention_target"]:  # ncu_attention's target: no log, no record
        attention_target()
        return 0
    if args.steps == ["copy_series_target"]:  # one process of copy_repeats: no log, no record
        copy_series_target()
        return 0
    machine = describe_machine()
    if machine.device != "cuda":
        raise GpuprofError(f"capture_ch12.py needs a GPU: this machine is {machine.summary()}.",
                           "References from a CPU would be worthless; the notebook reads the committed ones here.")
    os.environ.update({"GPUPROF_OUTPUT_DIR": "artifacts", "GPUPROF_OVERWRITE": "1", "GPUPROF_STRICT": "1"})
    from gpuprof.artifacts import chapter_output, record_file

    print(f"capture_ch12: {machine.summary()}; steps {', '.join(args.steps)}", flush=True)
    failed: list[str] = []
    log_path = chapter_output("ch12") / "run_output.txt"
    # a run that starts with the ceilings starts the log afresh; a later part (--only nsys,...) adds to it
    with open(log_path, "w" if args.steps[0] == "ceilings" else "a") as log:
        log.write(f"== capture_ch12 {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, steps "
                  f"{', '.join(args.steps)}, on {machine.summary()}\n")
        for step in args.steps:
            t0 = time.perf_counter()
            if step == "ceilings":
                ceilings()
            elif step == "nsys":
                nsys_capture()
            elif step == "own_breakdown":
                own_breakdown()
            elif step == "own_attention":
                own_attention()
            elif step == "ncu_attention":
                ncu_attention_step()
            elif step == "copy_repeats":
                copy_repeats(log)
            elif step == "own_nsys":
                nsys_capture("decode_own_b1", OWN_NSYS_ARGS)
            elif step == "ncu":
                failed += ncu_capture_step(args.ncu_rungs)
            elif step in ("own", "own_repeats"):
                run_args, expected = RUNS["own_kernels.json"]
                for suffix in ([""] if step == "own" else [f"_rep{i}" for i in range(1, OWN_REPEATS + 1)]):
                    ceilings(f"own_ceilings{suffix}.json", step)
                    if run_decode(f"own_kernels{suffix}.json", run_args, expected, log) != expected:
                        failed.append(f"own_kernels{suffix}.json")
            elif step == "notebook":
                continue  # after the log is closed and recorded
            elif step == "kv":
                if run_decode("kv_capacity.json", KV_ARGS, 0, log, KV_SCRIPT) != 0:
                    failed.append("kv_capacity.json")
            else:
                name = {"ladder": "ladder.json", "sweep": "sweep.json", "prefill": "prefill2048.json",
                        "noclone": "noclone.json"}[step]
                run_args, expected = RUNS[name]
                if run_decode(name, run_args, expected, log) != expected:
                    failed.append(name)
            print(f"== step {step}: {time.perf_counter() - t0:.0f} s", flush=True)
    record_log(args.steps)
    if "notebook" in args.steps:
        code = subprocess.call([sys.executable, str(ROOT / "scripts" / "capture_all.py"), "--notebooks", NOTEBOOK],
                               cwd=ROOT)
        if code != 0:
            failed.append(f"{NOTEBOOK} (capture_all exit {code})")
    if failed:
        raise GpuprofError(f"finished, but not as expected: {', '.join(failed)}.",
                           "Read their output above (and in artifacts/ch12/run_output.txt); the JSON is kept.")
    print("capture_ch12: done; commit artifacts/ch12 and the notebook after reading the checks above", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
