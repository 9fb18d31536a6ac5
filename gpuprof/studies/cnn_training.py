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
import sys
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

__all__ = ["SCRIPT", "Config", "LADDER", "LEVERS", "NCHW_CHECK", "ROUNDS", "run_plan", "preload", "SWEEP", "SWEEP_BATCHES", "COMPILE", "COMPILE_STEP", "all_configs", "run_args",
           "run_configs", "results_table", "distinct_runs_table", "ladder_table", "spread_table", "sweep_table", "phase_table", "gpu_activity",
           "sync_wait_ms", "PHASES", "capture_config", "evidence", "graph_launches_per_step",
           "largest_phase", "ladder_figure", "sweep_figure"]

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
           change="two together: forward, backward and Adam replayed as one CUDA graph (which needs Adam capturable, "
                  "as the foreach and the fused Adam both can be), and Adam fused, bundled by choice"),
    Config("5 data on the GPU", (*GPU_DATA, *SYNC, *GRAPH),
           change="the image set on the GPU, augmented there; the DataLoader, pinning and non_blocking go"),
    Config("6 bf16, channels_last, cuDNN autotuning", BEST,
           change="three together: autocast to bf16, NHWC, cudnn.benchmark (each alone: section 6)"),
    Config("7 batch 256", BEST, 256, change="8x the images per step"),
    Config("8 batch 1024", BEST, 1024, change="4x the images per step again"),
]

LEVERS: list[Config] = [Config(f"alone: {name}", levers) for name, levers in [
    ("workers 8", WORKERS), ("non_blocking", ("--non-blocking",)), ("data on the GPU", GPU_DATA),
    ("bf16", ("--bf16",)), ("channels_last", ("--channels-last",)), ("fused Adam", ("--fused-adam",)),
]]

# Rung 8 without its NHWC layout: did channels_last, a lever of the ladder, make the slow NHWC pooling backward that
# section 4 finds at the top of the step?
NCHW_CHECK: list[Config] = [Config("8 without channels_last", tuple(l for l in BEST if l != "--channels-last"), 1024,
                                   change="rung 8 in the default NCHW layout")]

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


# torch.compile of the step the hand-made graph holds (the model with its loss, and Adam's step: the script's
# --compile-scope step), beside the eager loop on the same data path, at both batch sizes: the comparison above sets a
# graph of the whole step against a compile of the model alone, with no eager row (review 2, item 9).
COMPILED_STEP = (*GPU_DATA, *SYNC, "--compile", "reduce-overhead", "--compile-scope", "step")
COMPILE_STEP: list[Config] = [
    Config("compile the step, batch 32: eager", (*GPU_DATA, *SYNC, "--fused-adam")),
    Config("compile the step, batch 32: reduce-overhead", COMPILED_STEP),
    Config("compile the step, batch 1024: eager", (*GPU_DATA, *SYNC, "--fused-adam", *FAST_MATH), 1024),
    Config("compile the step, batch 1024: reduce-overhead", (*COMPILED_STEP, *FAST_MATH), 1024),
]


def _sweep_configs() -> list[Config]:
    return [Config(f"sweep: {name}, batch {b}", levers, b) for name, (levers, batches) in SWEEP.items() for b in batches]


def all_configs() -> list[Config]:
    """Every configuration the chapter times, each once: runs with the same levers and batch are shared."""
    return [*LADDER, *LEVERS, *NCHW_CHECK, *_sweep_configs(), *COMPILE, *COMPILE_STEP]


def _key(cfg: Config) -> tuple[tuple[str, ...], int]:
    return (tuple(sorted(cfg.levers)), cfg.batch)


DATASET_SIZE = 10_000  # images every timed run trains on (drawn once per run of the chapter: preload)
ROUNDS = 3  # processes each repeated configuration is timed in


def run_args(cfg: Config) -> list[str]:
    """The script's arguments for one timed run: enough warm-up, and two windows of at least 0.3 s each.

    Large batches take fewer steps per window (a naive step at batch 4096 lasts about half a
    second); every window still lasts long enough to average over the DataLoader's hiccups.
    Each process times two windows (:data:`ROUNDS` processes per configuration), to keep the chapter's run
    within its time budget. That is not because the spread within a process is small: for the CPU-bound
    loops it can be as large as the spread between processes (chapter 6's ``spread_table`` prints both, per
    configuration), so verdicts on those loops are weak.
    """
    warmup = 10 if cfg.batch <= 256 else 5
    # at least 8 steps a window: with the warm-up, 21 steps or more, enough for the script to judge the loss
    # (it judges 20 or more; the 2026-11-26 run's naive loop at batch 1024 took 3 a window, 11 in all, unjudged)
    steps = max(8, 3200 // cfg.batch)
    return [*cfg.args(), "--warmup", str(warmup), "--steps", str(steps), "--repeats", "2", "--min-window-s", "0.3",
            "--dataset-size", str(DATASET_SIZE)]


def preload() -> None:
    """Called once in the fork server (:mod:`gpuprof.fork_runs`): what every run would otherwise redo, done once.

    The image set every run uses, drawn once; and the imports of the script's memory check.
    That check (``require_fit``, :func:`gpuprof.models.training_bytes`) runs the model on
    PyTorch's meta device, whose first use imports about 800 modules (SymPy, ``torch._dynamo``):
    3.7 s on the course's H100 host, in every forked run, before its first step. With them
    imported here, a chapter-6 run's process took 1.6-2.4 s instead of 6.1-8.5 s (three
    configurations, same machine, one probe run, 2026-11-26); its timed windows are unaffected,
    since the check runs before the warm-up.
    """
    from .. import cnn_data
    from ..models import small_cnn, training_bytes

    cnn_data.preload(DATASET_SIZE, seed=0)
    training_bytes(small_cnn, (3, cnn_data.SIZE, cnn_data.SIZE), 32)  # no CUDA: the meta device only


def run_plan(configs: Sequence[Config], repeated: Sequence[Config], rounds: int) -> list[Config]:
    """The order of the runs: the repeated configurations ``rounds`` times, interleaved (A B C, C B A, A B C, ...),
    so that a drift of the machine over the run spreads over every configuration alike; then the others once.
    Configurations with the same levers and batch are one run."""
    unique = {_key(c): c for c in reversed(list(configs))}  # the first label of each run names it
    keys = [k for k in dict.fromkeys(_key(c) for c in repeated) if k in unique]
    order = [unique[k] for r in range(rounds) for k in (keys if r % 2 == 0 else keys[::-1])]
    return order + [c for k, c in reversed(list(unique.items())) if k not in keys]


def _summarise(processes: list[dict]) -> dict:
    """One configuration's result from its processes: the median over processes of each process's median window
    (of the two windows :func:`run_args` asks for, their mean rate, not images over their total time), the
    processes' range, the smallest loss fall, the largest peak memory."""
    ok = [p for p in processes if p.get("status") == "ok"]
    if len(ok) < len(processes):
        bad = next(p for p in processes if p.get("status") != "ok")
        return {"status": bad.get("status"), "processes": processes}
    rates = [p["images_per_s"] for p in ok]
    first = ok[0]
    return {**{k: first[k] for k in ("config", "device", "gpu", "torch") if k in first}, "status": "ok",
            "images_per_s": float(np.median(rates)), "process_low": min(rates), "process_high": max(rates),
            "warmup_step_s": first["warmup_step_s"], "first_step_s_each": [p["warmup_step_s"][0] for p in ok],
            "loss_check": min((p["loss_check"] for p in ok), key=lambda c: c["fall"]),
            "peak_memory_bytes": max((p.get("peak_memory_bytes") or 0) for p in ok) or None,
            "processes": processes}


def run_configs(chapter: str, filename: str, configs: Sequence[Config] | None = None, *,
                repeated: Sequence[Config] | None = None, rounds: int = ROUNDS, timeout_s: int = 240) -> FoundCapture:
    """Time each configuration in fresh processes, into ``<chapter>/<filename>``; without a GPU, the references.

    The ``repeated`` configurations (default: the ladder and each lever alone) are timed in
    ``rounds`` processes each, in interleaved rounds (:func:`run_plan`): a process's speed
    drifts from one process to the next (``spread_table`` prints by how much), and a single
    process of the baseline would make every ratio to it as noisy as that process. The others
    run once. Each run
    is a process forked from a server that imported PyTorch once (:mod:`gpuprof.fork_runs`);
    runs with the same levers and batch are made once per round and shared by every label
    that names them. torch.compile runs get empty Inductor and Triton caches, so their
    first step shows a cold compilation, as a new program's would.
    """
    machine = describe_machine()
    if machine.device != "cuda":
        print(f"No GPU on this machine ({machine.summary()}): showing the course's reference results instead.")
        return find_capture(chapter, filename, prefer="reference")
    configs = list(configs or all_configs())
    repeated = list(repeated if repeated is not None else [*LADDER, *LEVERS, *NCHW_CHECK])
    plan = run_plan(configs, repeated, rounds)
    distinct = {_key(c) for c in configs}
    n_once = len(distinct - {_key(c) for c in repeated})
    n_rep = len(plan) - n_once
    per_round = n_rep // rounds
    print(f"{len(configs)} configurations, {len(distinct)} distinct runs; {per_round} of them timed in {rounds} processes "
          f"each (interleaved rounds), {n_once} once: {len(plan)} processes", flush=True)
    per_key: dict[tuple[tuple[str, ...], int], list[dict]] = {}
    done = 0
    with tempfile.TemporaryDirectory() as tmp:
        runs = []
        for i, cfg in enumerate(plan):
            env = {}
            if "--compile" in cfg.levers:
                env = {"TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor{i}", "TRITON_CACHE_DIR": f"{tmp}/triton{i}"}
            runs.append({"argv": [*run_args(cfg), "--json", f"{tmp}/run{i}.json"], "env": env, "log": f"{tmp}/run{i}.log"})
        plan_file = Path(tmp) / "plan.json"
        plan_file.write_text(json.dumps({"script": str(SCRIPT), "preload": "gpuprof.studies.cnn_training:preload",
                                         "timeout_s": timeout_s, "runs": runs}))
        t_all = t_block = time.perf_counter()
        path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
        proc = subprocess.Popen([sys.executable, "-m", "gpuprof.fork_runs", str(plan_file)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": path})
        assert proc.stdout is not None
        for line in proc.stdout:
            parts = line.split()
            if len(parts) != 4 or parts[0] != "RUN":
                print("  " + line.rstrip(), flush=True)  # the server's own message (an import error, say)
                continue
            i, status, wall = int(parts[1]), parts[2], float(parts[3])
            out = Path(tmp) / f"run{i}.json"
            result = json.loads(out.read_text()) if out.exists() else {}
            if status != "0" or result.get("status") != "ok":
                log = (Path(tmp) / f"run{i}.log").read_text(errors="replace").strip().splitlines()
                result = {"status": f"failed (exit {status}): {' | '.join(log[-2:])}"}
                print(f"  {' '.join(plan[i].args())}: {result['status']}", flush=True)
            result.pop("losses", None)  # the check on them is kept; every run's losses would be most of the file
            result["wall_s"] = wall
            per_key.setdefault(_key(plan[i]), []).append(result)
            done += 1
            if done <= n_rep and done % per_round == 0:
                print(f"  round {done // per_round}/{rounds}: {per_round} runs in {time.perf_counter() - t_block:.0f} s",
                      flush=True)
                t_block = time.perf_counter()
            elif done > n_rep and result.get("status") == "ok":
                print(f"  once: {' '.join(plan[i].args())}: {result['images_per_s']:,.0f} images/s, first step "
                      f"{result['warmup_step_s'][0]:.2f} s", flush=True)
        proc.wait()
    print(f"all runs: {time.perf_counter() - t_all:.0f} s")
    if proc.returncode != 0 or done < len(plan):
        raise GpuprofError(f"the run server stopped early (exit {proc.returncode}) after {done} of {len(plan)} runs.")
    results = {k: _summarise(v) for k, v in per_key.items()}
    out_runs = {cfg.label: {"levers": list(cfg.levers), "batch": cfg.batch, "args": run_args(cfg), **results[_key(cfg)]}
                for cfg in configs}
    command = " ".join(portable_command(python_target(SCRIPT, "<levers>", "--batch-size", "<batch>", "--json", "run.json")))
    save_json(chapter, filename, {"script": "examples/nsys/cnn_training.py", "rounds": rounds, "runs": out_runs},
              overwrite=True, command=f"gpuprof.studies.cnn_training.run_configs: for each configuration, {command}, in "
                                      f"a process forked from gpuprof.fork_runs; the ladder and the levers alone in "
                                      f"{rounds} interleaved rounds")
    return find_capture(chapter, filename)


def results_table(runs: dict[str, dict]) -> pd.DataFrame:
    """One row per configuration: images/s (the median over processes of each one's median window), low-high (the
    processes' range; for a configuration timed in one process, its windows' range), processes, first step, loss
    fall, memory."""
    rows = []
    for label, r in runs.items():
        ok = r.get("status") == "ok"
        procs = r.get("processes") or [r]  # a run recorded before the processes were kept: one process
        if ok and len(procs) > 1:
            low, high = r["process_low"], r["process_high"]
        else:
            rates = [w["images_per_s"] for w in procs[0].get("windows", [])] if ok else []
            low, high = (min(rates), max(rates)) if rates else (np.nan, np.nan)
        rows.append({"configuration": label, "batch": r["batch"], "status": r.get("status"),
                     "images_per_s": r["images_per_s"] if ok else np.nan, "low": low, "high": high,
                     "processes": len(procs), "first_step_s": r["warmup_step_s"][0] if ok else np.nan,
                     "loss_fall": r["loss_check"]["fall"] if ok else np.nan,
                     "peak_MiB": (r.get("peak_memory_bytes") or 0) / 2**20 if ok else np.nan})
    return pd.DataFrame(rows).set_index("configuration")


def distinct_runs_table(runs: dict[str, dict], configs: Sequence[Config]) -> pd.DataFrame:
    """:func:`results_table` with one row per distinct run (named by its first label; ``also``: the other labels the
    chapter gives the same run), and its range split by meaning: ``process low``/``high`` for a run timed in
    several processes, ``window low``/``high`` (one process's two windows) for a run timed once."""
    table = results_table({c.label: runs[c.label] for c in configs if c.label in runs})
    first: dict[tuple[tuple[str, ...], int], str] = {}
    also: dict[str, list[str]] = {}
    for cfg in configs:
        if cfg.label not in table.index:
            continue
        name = first.setdefault(_key(cfg), cfg.label)
        also.setdefault(name, [])
        if name != cfg.label:
            also[name].append(cfg.label)
    out = table.loc[list(also)].copy()
    several = out["processes"] > 1
    out["process low"], out["process high"] = out["low"].where(several), out["high"].where(several)
    out["window low"], out["window high"] = out["low"].where(~several), out["high"].where(~several)
    out["also"] = ["; ".join(also[name]) for name in out.index]
    return out.drop(columns=["low", "high"])


def ladder_table(runs: dict[str, dict], ladder: Sequence[Config] = tuple(LADDER)) -> pd.DataFrame:
    """The ladder: each rung's images/s, its gain over the rung before and over the naive loop, each gain with the
    range the processes allow (``x previous low``: this rung's slowest process over the previous rung's fastest;
    ``high``: the other way round)."""
    t = results_table({c.label: runs[c.label] for c in ladder})
    out = pd.DataFrame({"change": [c.change for c in ladder], "batch": t["batch"].to_numpy(),
                        "images_per_s": t["images_per_s"].to_numpy(), "low": t["low"].to_numpy(),
                        "high": t["high"].to_numpy()}, index=t.index)
    out["x previous"] = out["images_per_s"] / out["images_per_s"].shift(1)
    out["x previous low"] = out["low"] / out["high"].shift(1)
    out["x previous high"] = out["high"] / out["low"].shift(1)
    out["x naive"] = out["images_per_s"] / out["images_per_s"].iloc[0]
    out["x naive low"] = out["low"] / out["high"].iloc[0]
    out["x naive high"] = out["high"] / out["low"].iloc[0]
    return out


def spread_table(runs: dict[str, dict], configs: Sequence[Config]) -> pd.DataFrame:
    """For each configuration timed in several processes: its processes' rates, how far they spread, and how far
    the windows of one process did (a configuration sharing its run with an earlier one is left out).

    ``between``: the fastest process over the slowest, minus one (each process's rate is its
    median window). ``within``: over the processes, the largest ratio of one process's fastest
    window to its slowest, minus one. The chapter once said that processes vary more than the
    windows of one process; this table is the check, and it holds for some loops, not all.
    """
    rows, seen = [], set()
    for cfg in configs:
        if _key(cfg) in seen or cfg.label not in runs:
            continue
        seen.add(_key(cfg))
        procs = [p for p in runs[cfg.label].get("processes", []) if p.get("status") == "ok"]
        if len(procs) < 2:
            continue
        rates = sorted(p["images_per_s"] for p in procs)
        within = [max(w["images_per_s"] for w in p["windows"]) / min(w["images_per_s"] for w in p["windows"]) - 1
                  for p in procs if p.get("windows")]
        rows.append({"configuration": cfg.label, "slowest": rates[0], "middle": float(np.median(rates)),
                     "fastest": rates[-1], "between": rates[-1] / rates[0] - 1,
                     "within": max(within) if within else np.nan})
    return pd.DataFrame(rows).set_index("configuration")


def sweep_table(runs: dict[str, dict]) -> pd.DataFrame:
    """Images/s of each swept loop (columns) at each batch size (rows)."""
    def rate(name: str, batch: int) -> float:
        r = runs.get(f"sweep: {name}, batch {batch}", {})
        return r["images_per_s"] if r.get("status") == "ok" else np.nan

    data = {name: [rate(name, b) for b in SWEEP_BATCHES] for name in SWEEP}
    return pd.DataFrame(data, index=pd.Index(SWEEP_BATCHES, name="batch"))


# ----- readers of an nsys capture of the script's profiled steps -----

def _steps(ranges: pd.DataFrame) -> pd.DataFrame:
    steps = ta.step_ranges(ranges, keep=["duration_ns"])
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
    busy = ta.range_busy(work, runtime, window, rule="window").iloc[0]
    mine = ta.attribute_kernels(kernels, runtime, window, rule="window")
    n = len(steps)
    return {"steps": n, "busy_share": float(busy["busy_share"]), "gpu_span_ms_per_step": float(busy["gpu_span_ms"]) / n,
            "gpu_busy_ms_per_step": float(busy["gpu_busy_ms"]) / n, "cpu_ms_per_step": float(busy["cpu_ms"]) / n,
            "kernels_per_step": len(mine) / n, "median_kernel_us": float(mine["duration_ns"].median() / 1e3)}


def sync_wait_ms(path: str | Path) -> np.ndarray:
    """Per profiled step, the time (ms) the CPU spent in calls that wait for the GPU: ``*Synchronize``, and copies
    from the device into pageable host memory (``loss.item()``, ``.tolist()``), which return only when the copy,
    and so all the work queued before it, is done.

    Per step, not one summary: a loop that reads the loss every 50 steps waits long in one
    step and not at all in the others, so a median would say it never waits.
    """
    ranges = ns.nvtx_ranges(path)
    steps = _steps(ranges)
    runtime = ns.runtime_calls(path)
    copies = ns.memcpy(path)
    to_pageable = copies.loc[(copies["kind"] == "Device-to-Host") & (copies["dst_memory"] == "Pageable"), "correlationId"]
    waits = runtime[runtime["name"].str.contains(ta.SYNC_API, regex=True)
                    | (runtime["name"].str.startswith("cudaMemcpy") & runtime["correlationId"].isin(to_pageable))]
    per_step = []
    for s in steps.itertuples():
        calls = ta.inside(waits, (int(s.start), int(s.end)))
        per_step.append(float((calls["end"] - calls["start"]).sum()))
    return np.asarray(per_step) / 1e6


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
    ``sync_wait_ms`` the mean time per step in calls that wait for the GPU (:func:`sync_wait_ms`)
    and ``sync_wait_max_ms`` the longest (a read every 50 steps waits in one step of 50).
    """
    phases = phase_table(path)
    total = phases.sum()
    out = {"step_ms": total["step_ms"] / len(phases)}
    for p in PHASES:
        if p in total:
            out[f"{p}_share"] = total[p] / total["step_ms"]
    act = gpu_activity(path)
    waits = sync_wait_ms(path)
    out.update(busy_share=act["busy_share"], gpu_busy_ms_per_step=act["gpu_busy_ms_per_step"],
               kernels_per_step=act["kernels_per_step"], median_kernel_us=act["median_kernel_us"],
               sync_wait_ms=float(waits.mean()), sync_wait_max_ms=float(waits.max()))
    return pd.Series(out)


def graph_launches_per_step(path: str | Path) -> float:
    """Per profiled step, the ``cudaGraphLaunch`` calls made inside the steps' NVTX ranges: 1 for the hand-made graph
    of the whole step; for torch.compile's reduce-overhead, one per region it replayed as a graph (a region it could
    not graph launches its kernels one by one instead, and adds none)."""
    ranges = ns.nvtx_ranges(path)
    steps = _steps(ranges)
    runtime = ns.runtime_calls(path)
    launches = runtime[runtime["name"].str.startswith("cudaGraphLaunch")]
    total = sum(len(ta.inside(launches, (int(s.start), int(s.end)))) for s in steps.itertuples())
    return total / len(steps)


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
    ax.errorbar(table["images_per_s"], y, xerr=[table["images_per_s"] - table["low"], table["high"] - table["images_per_s"]],
                fmt="none", ecolor="k", capsize=2, lw=0.8)
    for yi, (_, r) in zip(y, table.iterrows()):
        gain = "" if np.isnan(r["x previous"]) else \
            f"  {r['x previous']:.2f}x ({r['x previous low']:.2f}-{r['x previous high']:.2f})"
        ax.text(r["high"], yi, f" {r['images_per_s']:,.0f}{gain}", va="center", fontsize=8)
    ax.set_yticks(y, [f"{label} (batch {b})" for label, b in zip(table.index, table["batch"])], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(table["images_per_s"].min() / 2, table["images_per_s"].max() * 6)
    ax.set_xlabel("training images per second (log scale)")
    ax.set_title(f"The ladder: each rung adds the change(s) it names ({gpu})\n"
                 "bars: median of the processes; whiskers and brackets: their range", fontsize=10)
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
