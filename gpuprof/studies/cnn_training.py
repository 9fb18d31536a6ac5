"""The CNN case study's measurements: the configurations it times, the runs, and what its captures say.

Chapter 6 makes a naive training loop (``examples/nsys/cnn_training.py`` with no flags) fast
one measured step at a time. This module holds what the chapter would otherwise spell out
in cells:

* the configurations: :data:`LADDER` (each rung adds the change the previous rung's
  capture suggests), :data:`LEVERS` (each lever alone on the naive loop), :data:`SWEEP`
  (three loops as the batch grows) and :data:`COMPILE` (torch.compile against a CUDA graph
  of the whole step);
* :func:`run_configs`: every configuration in a fresh process (so that DataLoader workers,
  cuDNN's autotuning and compiled code of one cannot help the next), all in one run, into
  one JSON file with provenance; without a GPU, the course's reference results;
* readers of an Nsight Systems capture of the script's profiled steps: :func:`phase_table`
  (per step, the CPU time in each NVTX phase), :func:`gpu_activity` (how busy the GPU was
  over those steps, kernels per step, their median length) and :func:`sync_wait_ms`;
* :func:`ladder_table`, :func:`sweep_table` and the chapter's figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from .. import activity as ta
from ..artifacts import REPO_ROOT, FoundCapture, find_capture, save_json
from ..backend import describe_machine
from ..errors import GpuprofError
from ..nsys import sqlite as ns
from ..runner import portable_command, python_target

__all__ = ["SCRIPT", "Config", "LADDER", "LEVERS", "SWEEP", "SWEEP_BATCHES", "COMPILE", "all_configs", "run_args",
           "run_configs", "results_table", "ladder_table", "sweep_table", "phase_table", "gpu_activity",
           "sync_wait_ms", "PHASES", "capture_config", "evidence", "largest_phase", "ladder_figure", "sweep_figure"]

SCRIPT = REPO_ROOT / "examples" / "nsys" / "cnn_training.py"
NAIVE_BATCH = 32
PHASES = ("data_wait", "h2d", "input_copy", "forward", "backward", "optimizer", "replay", "loss_read")


@dataclass(frozen=True)
class Config:
    """One configuration of the script: a label the chapter uses, its levers, its batch size."""

    label: str
    levers: tuple[str, ...] = ()
    batch: int = NAIVE_BATCH
    change: str = ""  # what this rung changes, for the ladder table

    def args(self) -> list[str]:
        return [*self.levers, "--batch-size", str(self.batch)]


WORKERS = ("--workers", "8")
SYNC = ("--loss-every", "50")
GRAPH = ("--cuda-graphs", "--fused-adam")
GPU_DATA = ("--data-on-gpu",)
FAST_MATH = ("--bf16", "--channels-last", "--cudnn-benchmark")
BEST = (*GPU_DATA, *SYNC, *GRAPH, *FAST_MATH)

COMPILED = (*GPU_DATA, *SYNC, "--fused-adam", *FAST_MATH, "--compile", "reduce-overhead")

LADDER: list[Config] = [
    Config("0 naive loop", (), change="the loop as first written"),
    Config("1 DataLoader workers", WORKERS, change="8 worker processes prepare the images"),
    Config("2 loss read every 50 steps", (*WORKERS, *SYNC), change="one loss read-back per 50 steps, not per step"),
    Config("3 pinned, non-blocking copies", (*WORKERS, "--pin-memory", "--non-blocking", *SYNC),
           change="pinned batches, copied with non_blocking=True"),
    Config("4 CUDA graph of the step", (*WORKERS, "--pin-memory", "--non-blocking", *SYNC, *GRAPH),
           change="forward, backward and fused Adam replayed as one CUDA graph"),
    Config("5 data on the GPU", (*GPU_DATA, *SYNC, *GRAPH), change="the image set on the GPU, augmented there; no DataLoader"),
    Config("6 bf16, channels_last, cuDNN autotuning", BEST, change="autocast to bf16, NHWC, cudnn.benchmark"),
    Config("7 batch 256", BEST, 256, change="8x the images per step"),
    Config("8 batch 1024", BEST, 1024, change="4x the images per step again"),
]

LEVERS: list[Config] = [Config(f"alone: {name}", levers) for name, levers in [
    ("workers 8", WORKERS), ("non_blocking", ("--non-blocking",)), ("data on the GPU", GPU_DATA),
    ("bf16", ("--bf16",)), ("fused Adam", ("--fused-adam",)),
]]

SWEEP_BATCHES = (32, 256, 1024, 4096)
# The loops swept, and the batch sizes each is run at (the slow loops at 32 and 1024 only:
# their trend is plain from two points, and every run costs the chapter's run ten seconds).
SWEEP: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {
    "naive loop": ((), (32, 1024)),
    "workers, loss every 50": ((*WORKERS, *SYNC), (32, 1024)),
    "all levers but compile": (BEST, SWEEP_BATCHES),
}

# torch.compile (reduce-overhead: fused kernels, replayed as CUDA graphs) against the hand-made
# CUDA graph of the whole step, on the same data path, at the naive batch
# size and at the ladder's last. Each compiled run costs the chapter's run half a minute.
COMPILE: list[Config] = [
    Config("compile, batch 32: reduce-overhead", (*GPU_DATA, *SYNC, "--fused-adam", "--compile", "reduce-overhead")),
    Config("compile, batch 32: CUDA graph of the step", (*GPU_DATA, *SYNC, *GRAPH)),
    Config("compile, batch 1024: reduce-overhead", COMPILED, 1024),
    Config("compile, batch 1024: CUDA graph of the step", BEST, 1024),
]


def _sweep_configs() -> list[Config]:
    return [Config(f"sweep: {name}, batch {b}", levers, b) for name, (levers, batches) in SWEEP.items() for b in batches]


def all_configs() -> list[Config]:
    """Every configuration the chapter times, each once: runs with the same levers and batch are shared."""
    return [*LADDER, *LEVERS, *_sweep_configs(), *COMPILE]


def _key(cfg: Config) -> tuple[tuple[str, ...], int]:
    return (tuple(sorted(cfg.levers)), cfg.batch)


def run_args(cfg: Config) -> list[str]:
    """The script's arguments for one timed run: enough warm-up, and three windows of at least 0.4 s each.

    Large batches take fewer steps per window (a naive step at batch 4096 lasts about half a
    second); every window still lasts long enough to average over the DataLoader's hiccups.
    """
    steps = max(3, 3200 // cfg.batch)
    warmup = 10 if cfg.batch <= 256 else 5
    return [*cfg.args(), "--warmup", str(warmup), "--steps", str(steps), "--repeats", "3", "--min-window-s", "0.4",
            "--dataset-size", "10000"]


def _run_one(cfg: Config, env: dict[str, str], timeout_s: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = python_target(SCRIPT, *run_args(cfg), "--json", str(out))
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            return {"status": f"did not finish within {timeout_s} s", "wall_s": timeout_s}
        wall = time.perf_counter() - t0
        if out.exists():
            result = json.loads(out.read_text())
            result.pop("losses", None)  # the check on them is kept; 27 runs of losses would be most of the file
            result["wall_s"] = wall
            return result
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-2:])
        return {"status": f"failed (exit {proc.returncode}): {tail}", "wall_s": wall}


def run_configs(chapter: str, filename: str, configs: Sequence[Config] | None = None, *, timeout_s: int = 240) -> FoundCapture:
    """Time each configuration in a fresh process, one after another, into ``<chapter>/<filename>``.

    Runs with the same levers and batch size are made once and shared by every label that
    names them. torch.compile runs get empty Inductor and Triton caches, so their first step
    shows a cold compilation, as a new program's would. Without a GPU: the reference results.
    """
    machine = describe_machine()
    if machine.device != "cuda":
        print(f"No GPU on this machine ({machine.summary()}): showing the course's reference results instead.")
        return find_capture(chapter, filename, prefer="reference")
    configs = list(configs or all_configs())
    unique: dict[tuple[tuple[str, ...], int], Config] = {}
    for cfg in configs:
        unique.setdefault(_key(cfg), cfg)
    print(f"{len(configs)} configurations, {len(unique)} distinct runs, each in its own process:", flush=True)
    results: dict[tuple[tuple[str, ...], int], dict] = {}
    t_all = time.perf_counter()
    for i, (key, cfg) in enumerate(unique.items(), 1):
        env = dict(os.environ)
        with tempfile.TemporaryDirectory() as cache:
            if "--compile" in cfg.levers:
                env.update(TORCHINDUCTOR_CACHE_DIR=f"{cache}/inductor", TRITON_CACHE_DIR=f"{cache}/triton")
            results[key] = r = _run_one(cfg, env, timeout_s)
        shown = " ".join(cfg.args())
        if r.get("status") == "ok":
            print(f"  [{i}/{len(unique)}] {shown}: {r['images_per_s']:,.0f} images/s, first step "
                  f"{r['warmup_step_s'][0]:.2f} s ({r['wall_s']:.0f} s)", flush=True)
        else:
            print(f"  [{i}/{len(unique)}] {shown}: {r.get('status')}", flush=True)
    print(f"all runs: {time.perf_counter() - t_all:.0f} s")
    runs = {cfg.label: {"levers": list(cfg.levers), "batch": cfg.batch, "args": run_args(cfg), **results[_key(cfg)]}
            for cfg in configs}
    command = " ".join(portable_command(python_target(SCRIPT, "<levers>", "--batch-size", "<batch>", "--json", "run.json")))
    save_json(chapter, filename, {"script": "examples/nsys/cnn_training.py", "runs": runs}, overwrite=True,
              command=f"gpuprof.studies.cnn_training.run_configs: for each configuration, {command}")
    return find_capture(chapter, filename)


def results_table(runs: dict[str, dict]) -> pd.DataFrame:
    """One row per configuration: images/s (median window) and the windows' range, first step, loss fall, memory."""
    rows = []
    for label, r in runs.items():
        ok = r.get("status") == "ok"
        rates = [w["images_per_s"] for w in r.get("windows", [])]
        rows.append({"configuration": label, "batch": r["batch"], "status": r.get("status"),
                     "images_per_s": r["images_per_s"] if ok else np.nan,
                     "low": min(rates) if rates else np.nan, "high": max(rates) if rates else np.nan,
                     "first_step_s": r["warmup_step_s"][0] if ok else np.nan,
                     "loss_fall": r["loss_check"]["fall"] if ok else np.nan,
                     "peak_MiB": (r.get("peak_memory_bytes") or 0) / 2**20 if ok else np.nan})
    return pd.DataFrame(rows).set_index("configuration")


def ladder_table(runs: dict[str, dict], ladder: Sequence[Config] = tuple(LADDER)) -> pd.DataFrame:
    """The ladder: each rung's images/s, its gain over the rung before and over the naive loop."""
    t = results_table({c.label: runs[c.label] for c in ladder})
    out = pd.DataFrame({"change": [c.change for c in ladder], "batch": t["batch"].to_numpy(),
                        "images_per_s": t["images_per_s"].to_numpy()}, index=t.index)
    out["x previous"] = out["images_per_s"] / out["images_per_s"].shift(1)
    out["x naive"] = out["images_per_s"] / out["images_per_s"].iloc[0]
    return out


def sweep_table(runs: dict[str, dict]) -> pd.DataFrame:
    """Images/s of each swept loop (columns) at each batch size (rows)."""
    def rate(name: str, batch: int) -> float:
        r = runs.get(f"sweep: {name}, batch {batch}", {})
        return r["images_per_s"] if r.get("status") == "ok" else np.nan

    data = {name: [rate(name, b) for b in SWEEP_BATCHES] for name in SWEEP}
    return pd.DataFrame(data, index=pd.Index(SWEEP_BATCHES, name="batch"))


# ----- readers of an nsys capture of the script's profiled steps -----

def _steps(ranges: pd.DataFrame) -> pd.DataFrame:
    steps = ranges[ranges["text"].str.fullmatch(r"step_\d+")].sort_values("start")
    if steps.empty:
        raise GpuprofError("the capture holds no NVTX range named step_N.",
                           "Capture the script with --profile-steps and nsys's --trace=cuda,nvtx.")
    return steps


def phase_table(path: str | Path) -> pd.DataFrame:
    """Per profiled step: its CPU time (ms) and the time spent in each NVTX phase inside it, on its thread."""
    ranges = ns.nvtx_ranges(path)
    steps = _steps(ranges)
    rows = []
    for s in steps.itertuples():
        inner = ranges[(ranges["globalTid"] == s.globalTid) & (ranges["start"] >= s.start) & (ranges["end"] <= s.end)
                       & ranges["text"].isin(PHASES)]
        row = {"step": s.text, "step_ms": s.duration_ns / 1e6}
        row.update({p: inner.loc[inner["text"] == p, "duration_ns"].sum() / 1e6 for p in PHASES})
        rows.append(row)
    table = pd.DataFrame(rows).set_index("step")
    return table.loc[:, (table != 0).any(axis=0)]


def gpu_activity(path: str | Path) -> dict[str, float]:
    """Over the profiled steps: GPU busy share, kernels per step and their median length, step time.

    The window runs from the first step's start to the last step's end on the CPU; the GPU
    work is every kernel, copy and memset launched in it (on any thread). ``busy_share`` is
    the union of that work's intervals over its span (first start to last end), so idle
    gaps between steps count against it, as they cost the loop.
    """
    ranges = ns.nvtx_ranges(path)
    steps = _steps(ranges)
    window = pd.DataFrame({"text": ["profiled steps"], "start": [int(steps["start"].min())],
                           "end": [int(steps["end"].max())], "globalTid": [int(steps["globalTid"].iloc[0])]})
    kernels = ns.kernels(path)
    work = pd.concat([kernels[["start", "end", "correlationId"]], ns.memcpy(path)[["start", "end", "correlationId"]],
                      ns.memset(path)[["start", "end", "correlationId"]]], ignore_index=True)
    runtime = ns.runtime_calls(path)
    busy = ta.range_busy(work, runtime, window).iloc[0]
    mine = ta.attribute_kernels(kernels, runtime, window, rule="window")
    n = len(steps)
    return {"steps": n, "busy_share": float(busy["busy_share"]), "gpu_span_ms_per_step": float(busy["gpu_span_ms"]) / n,
            "gpu_busy_ms_per_step": float(busy["gpu_busy_ms"]) / n, "cpu_ms_per_step": float(busy["cpu_ms"]) / n,
            "kernels_per_step": len(mine) / n, "median_kernel_us": float(mine["duration_ns"].median() / 1e3)}


def sync_wait_ms(path: str | Path) -> float:
    """Median time per profiled step the CPU spent in ``*Synchronize`` calls (waiting for the GPU)."""
    ranges = ns.nvtx_ranges(path)
    steps = _steps(ranges)
    runtime = ns.runtime_calls(path)
    sync = runtime[runtime["name"].str.contains(ta.SYNC_API, regex=True)]
    per_step = []
    for s in steps.itertuples():
        calls = ta.inside(sync, (int(s.start), int(s.end)))
        per_step.append(float((calls["end"] - calls["start"]).sum()))
    return float(np.median(per_step)) / 1e6


def capture_config(chapter: str, name: str, cfg: Config, profile_steps: int = 20):  # type: ignore[no-untyped-def]
    """nsys over ``profile_steps`` steps of one configuration, after its warm-up and one short timed window.

    ``--capture-range=cudaProfilerApi`` keeps the capture to the profiled steps (the script
    calls cudaProfilerStart/Stop around them), and ``--cuda-graph-trace=node`` records each
    kernel of a replayed CUDA graph rather than one block for the whole graph.
    """
    from ..nsys.capture import QUIET, nsys_capture

    args = [*cfg.args(), "--warmup", "10", "--steps", "20", "--repeats", "1", "--profile-steps", str(profile_steps),
            "--dataset-size", "10000"]
    return nsys_capture(chapter, name, SCRIPT, args, options=[*QUIET, "--capture-range=cudaProfilerApi",
                                                            "--capture-range-end=stop", "--cuda-graph-trace=node"])


def evidence(path: str | Path) -> pd.Series:
    """What one capture says about its loop, over all its profiled steps.

    ``step_ms`` is the mean step on the CPU; ``<phase>_share`` the share of the steps' CPU
    time spent in each NVTX phase (totals, not medians: a DataLoader that stalls one step in
    ten costs the loop that stall, and a median would hide it); ``busy_share`` the GPU's busy
    share over the steps (:func:`gpu_activity`); kernels per step and their median length;
    ``sync_wait_ms`` the median time per step in ``*Synchronize`` calls.
    """
    phases = phase_table(path)
    total = phases.sum()
    out = {"step_ms": total["step_ms"] / len(phases)}
    for p in PHASES:
        if p in total:
            out[f"{p}_share"] = total[p] / total["step_ms"]
    act = gpu_activity(path)
    out.update(busy_share=act["busy_share"], gpu_busy_ms_per_step=act["gpu_busy_ms_per_step"],
               kernels_per_step=act["kernels_per_step"], median_kernel_us=act["median_kernel_us"],
               sync_wait_ms=sync_wait_ms(path))
    return pd.Series(out)


def largest_phase(ev: pd.Series) -> str:
    """The NVTX phase with the largest share of the steps' CPU time, in an :func:`evidence` series."""
    return str(ev.filter(like="_share").drop(labels=["busy_share"], errors="ignore").idxmax()).removesuffix("_share")


# ----- figures -----

def ladder_figure(table: pd.DataFrame, gpu: str):  # type: ignore[no-untyped-def]
    """Images/s per rung (log scale), each bar labelled with its gain over the rung before."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.2))
    y = np.arange(len(table))[::-1]
    ax.barh(y, table["images_per_s"], color=["#bbbbbb"] + ["#4c72b0"] * (len(table) - 1))
    for yi, (_, r) in zip(y, table.iterrows()):
        gain = "" if np.isnan(r["x previous"]) else f"  {r['x previous']:.2f}x"
        ax.text(r["images_per_s"], yi, f" {r['images_per_s']:,.0f}{gain}", va="center", fontsize=8)
    ax.set_yticks(y, [f"{label} (batch {b})" for label, b in zip(table.index, table["batch"])], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(table["images_per_s"].min() / 2, table["images_per_s"].max() * 6)
    ax.set_xlabel("training images per second (log scale)")
    ax.set_title(f"The ladder: each rung adds one change to the rung above ({gpu})", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def sweep_figure(table: pd.DataFrame, gpu: str):  # type: ignore[no-untyped-def]
    """Images/s against batch size, one line per loop (log-log)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, marker in zip(table.columns, "osD^"):
        ax.plot(table.index, table[name], marker=marker, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(table.index, [str(b) for b in table.index])
    ax.set_xlabel("batch size")
    ax.set_ylabel("training images per second")
    ax.set_title(f"Three loops as the batch grows ({gpu})", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
