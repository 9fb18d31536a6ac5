"""The mixed-precision case study's measurements: four precisions of one training step, timed, profiled, checked.

Chapter 10 trains ``examples/nsys/mixed_precision.py`` (a BERT-base-sized encoder written
from torch.nn parts) in FP32, TF32, FP16 with a GradScaler and BF16, from the same weights
on the same batch. This module holds what the chapter would otherwise spell out in cells:

* :func:`run_study`: every mode at two batch sizes in fresh processes, in interleaved rounds
  (the noise between processes is larger than within one), the failure case (FP16 without a
  scaler) once, and the largest batch each precision fits in a fixed memory budget, all in
  one run, into one JSON file with provenance; without a GPU, the course's reference results;
* :func:`timing_table`, :func:`speedup_floor`, :func:`fit_table`, :func:`loss_curves`,
  :func:`loss_agreement`, :func:`underflow_table`: what that file says; :func:`clock_table`: the SM
  clock, power and clock-event reasons NVML read during each timed run, and the step in SM cycles;
* :func:`capture_mode`: one mode's measured steps under Nsight Systems, and
  :func:`capture_summary`, :func:`gemm_kernels`, :func:`scaler_work`: what the captures say
  changed (GEMM kernels, autocast's casts, the scaler's kernels and its host sync).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from .. import activity as ta
from ..artifacts import REPO_ROOT, FoundCapture, find_capture, save_json
from ..backend import describe_machine
from ..errors import GpuprofError
from ..device_state import describe_event_reasons
from ..kernel_kinds import kernel_kind, matmul_table, tensor_cores
from ..nvml import window_power_w
from ..nsys import sqlite as ns
from ..runner import portable_command, python_target

__all__ = ["SCRIPT", "MODES", "FAILURE", "SMALL_BATCH", "LARGE_BATCH", "ROUNDS", "BUDGET_GIB", "run_plan", "run_study",
           "timing_table", "clock_table", "clock_processes", "clock_speedups", "CURES", "cures_plan", "cures_table", "cures_loss_agreement", "speedup_floor", "fit_table", "loss_curves", "loss_agreement", "underflow_table",
           "scale_history", "underflow_top", "CPU_CENSUS", "GPU_CENSUS", "census_against_cpu", "census_by_group", "fp16_loss_split", "memory_per_sequence", "capture_mode", "capture_summary", "gemm_kernels",
           "matmul_work", "PHASES", "OPTIMIZER", "phase_work", "scaler_work", "CAST", "SCALER", "figure"]

SCRIPT = REPO_ROOT / "examples" / "nsys" / "mixed_precision.py"
MODES = ("fp32", "tf32", "fp16", "bf16")
FAILURE = "fp16-noscaler"
SMALL_BATCH = 32    # a fine-tuning batch (x 128 tokens)
LARGE_BATCH = 128   # four times the tokens: the GPU's work, not the CPU's launches, sets the step time
ROUNDS = 3
BUDGET_GIB = 8.0
STEPS, WARMUP = 10, 3
# Autocast's dtype conversions: PyTorch's float->half/bfloat16 copy kernels, and copies that convert on load/store.
CAST = r"float16_copy_kernel|bfloat16_copy_kernel|LoadWithCast|StoreWithCast|gpu_kernel_impl<at::native::direct_copy"
SCALER = r"_amp_foreach_non_finite_check_and_unscale|_amp_update_scale"


def run_plan(rounds: int = ROUNDS, batches: Sequence[int] = (SMALL_BATCH, LARGE_BATCH)) -> list[dict[str, Any]]:
    """The runs in order: each round times every mode at every batch (mode order reversed on odd rounds, so a
    drift of the machine spreads over the modes alike); then the failure case once; then the memory probes."""
    runs = []
    for r in range(rounds):
        for b in batches:
            for m in (MODES if r % 2 == 0 else MODES[::-1]):
                runs.append({"kind": "time", "mode": m, "batch": b, "round": r})
    runs.append({"kind": "time", "mode": FAILURE, "batch": batches[0], "round": 0})
    runs += [{"kind": "fit", "mode": m, "batch": None, "round": 0} for m in ("fp32", "fp16", "bf16")]
    return runs


# The cures the chapter names for what its profile shows (review 2, C10-19): AdamW's share of the step
# (``--optimizer fused``: one pass over memory, and no host sync in the GradScaler's step) and the host-bound small
# batch (``--compile``, with the fused optimizer). Flags of ``mixed_precision.py`` by variant name.
CURES: dict[str, tuple[str, ...]] = {"as in the chapter": (), "fused AdamW": ("--optimizer", "fused"),
                                     "compiled, fused AdamW": ("--compile", "--optimizer", "fused")}


def cures_plan(rounds: int = 2, modes: Sequence[str] = ("fp16", "bf16"),
               batches: Sequence[int] = (SMALL_BATCH, LARGE_BATCH)) -> list[dict[str, Any]]:
    """Timed runs of each :data:`CURES` variant beside the chapter's own step, every mode at every batch, the order
    reversed on odd rounds (as :func:`run_plan`); each run's ``cure`` names its variant. Not run by the notebook:
    a record made with :func:`run_study` (``plan=cures_plan()``) on a GPU."""
    runs = []
    for r in range(rounds):
        order = [(b, m, c) for b in batches for m in modes for c in CURES]
        for b, m, c in (order if r % 2 == 0 else order[::-1]):
            runs.append({"kind": "time", "mode": m, "batch": b, "round": r, "cure": c})
    return runs


def _argv(run: dict[str, Any], json_path: str, budget_gib: float) -> list[str]:
    if run["kind"] == "fit":
        return ["--mode", run["mode"], "--largest-batch-in", f"{budget_gib:g}", "--json", json_path]
    return ["--mode", run["mode"], "--batch-size", str(run["batch"]), "--warmup", str(WARMUP), "--steps", str(STEPS),
            *CURES.get(run.get("cure", ""), ()), "--json", json_path]


def run_study(chapter: str, filename: str = "modes.json", *, rounds: int = ROUNDS,
              batches: Sequence[int] = (SMALL_BATCH, LARGE_BATCH), budget_gib: float = BUDGET_GIB,
              timeout_s: float = 240, plan: list[dict[str, Any]] | None = None) -> FoundCapture:
    """Every run of :func:`run_plan`, each a process forked from one that imported PyTorch once
    (:mod:`gpuprof.fork_runs`), into ``<chapter>/<filename>``; without a GPU, the course's reference."""
    import json
    import tempfile

    from ..fork_runs import run_all

    machine = describe_machine()
    if machine.device != "cuda":
        print(f"No GPU on this machine ({machine.summary()}): showing the course's reference results instead.")
        return find_capture(chapter, filename, prefer="reference")
    custom = plan is not None
    if plan is None:
        plan = run_plan(rounds, batches)
        print(f"{len(plan)} processes: {len(MODES)} modes x {len(batches)} batches x {rounds} rounds, {FAILURE} once, "
              f"the largest batch in {budget_gib:g} GiB for 3 modes", flush=True)
    else:  # the record says what the plan holds, not the defaults it did not use
        rounds, batches = 1 + max(r["round"] for r in plan), sorted({r["batch"] for r in plan if r["batch"] is not None})
        print(f"{len(plan)} processes, as planned by the caller", flush=True)
    results: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        argvs = [_argv(r, f"{tmp}/run{i}.json", budget_gib) for i, r in enumerate(plan)]
        for i, status, secs, log in run_all(SCRIPT, argvs, timeout_s=timeout_s):
            run = plan[i]
            out = Path(f"{tmp}/run{i}.json")
            if status != "0" or not out.exists():
                tail = " | ".join(log.strip().splitlines()[-2:])
                raise GpuprofError(f"mixed_precision.py {' '.join(argvs[i][:-2])} failed (exit {status}): {tail}")
            data = json.loads(out.read_text())
            results.append({**run, "wall_s": secs, **{k: v for k, v in data.items() if k != "config"}})
            what = (f"largest batch {data['largest_batch']}" if run["kind"] == "fit"
                    else f"batch {run['batch']}: {data['step_ms_median']:.1f} ms per step"
                    + (f", {data['nvml']['sm_mhz_median']:.0f} MHz" if (data.get("nvml") or {}).get("sm_mhz_median")
                       else f" (no clock: {data.get('nvml_why', 'not recorded')})"))
            cure = f" ({run['cure']})" if run.get("cure") else ""
            print(f"  [{i + 1}/{len(plan)}] {run['mode']:<13}{cure} {what} ({secs:.0f} s)", flush=True)
    print(f"all runs: {time.perf_counter() - t0:.0f} s")
    command = " ".join(portable_command(python_target(SCRIPT, "--mode", "<mode>", "--batch-size", "<batch>", "--warmup",
                                                      str(WARMUP), "--steps", str(STEPS), "--json", "run.json")))
    save_json(chapter, filename, {"script": "examples/nsys/mixed_precision.py", "rounds": rounds, "batches": list(batches),
                                  "budget_gib": budget_gib, "steps": STEPS, "warmup": WARMUP, "runs": results},
              overwrite=True, command=f"gpuprof.studies.mixed_precision.run_study: {command} per mode and batch in "
                                      f"{rounds} interleaved rounds, each in a process forked from gpuprof.fork_runs; "
                                      + ("each run's 'cure' adds its flags (gpuprof.studies.mixed_precision.CURES)"
                                         if custom else f"then --largest-batch-in {budget_gib:g} per mode"))
    return find_capture(chapter, filename)


def _timed(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in data["runs"] if r["kind"] == "time"]


def _measured(run: dict[str, Any], key: str) -> float:
    return float(np.median([s[key] for s in run["steps"] if s["measured"]]))


def timing_table(data: dict[str, Any]) -> pd.DataFrame:
    """Per batch and mode: the step time (median over processes of each process's median step; low-high: the
    processes' range), its phases, the speed-up over FP32 at that batch with its range (FP32's fastest process
    over this mode's slowest, and the other way round), and, where the data records it, the training step's own
    peak memory (``step_peak_GiB``: the script resets the peak statistics before each step and reports the steps
    after the first). Data from an earlier version of the script, whose ``peak_memory_bytes`` also held the FP32
    reference pass and a clone of its gradients, gets no peak column: that number is not the step's."""
    rows = []
    for (batch, mode), runs in pd.DataFrame(_timed(data)).groupby(["batch", "mode"], sort=False):
        if mode == FAILURE:
            continue
        recs = runs.to_dict("records")
        step = [_measured(r, "step_ms") for r in recs]
        rows.append({"batch": int(batch), "mode": mode, "step_ms": float(np.median(step)), "low_ms": min(step),
                     "high_ms": max(step), "processes": len(step),
                     **{f"{p}_ms": float(np.median([_measured(r, f"{p}_ms") for r in recs]))
                        for p in ("forward", "backward", "optimizer")},
                     **({"step_peak_GiB": max(r["step_peak_memory_bytes"] for r in recs) / 2**30}
                        if all(r.get("step_peak_memory_bytes") for r in recs) else {})})
    out = pd.DataFrame(rows)
    out["mode"] = pd.Categorical(out["mode"], MODES, ordered=True)
    out = out.sort_values(["batch", "mode"], ignore_index=True)
    base = out[out["mode"] == "fp32"].set_index("batch")
    out["speedup"] = out["batch"].map(base["step_ms"]) / out["step_ms"]
    out["speedup_low"] = out["batch"].map(base["low_ms"]) / out["high_ms"]
    out["speedup_high"] = out["batch"].map(base["high_ms"]) / out["low_ms"]
    out["mode"] = out["mode"].astype(str)
    return out


def clock_table(data: dict[str, Any]) -> pd.DataFrame:
    """Per batch and mode: the step time (as :func:`timing_table`: median over processes of each process's median
    step), what NVML read during the measured steps (the script's ``nvml``: median over processes of each one's median
    SM clock, ``sm_mhz_low`` the lowest reading of any, the power with the enforced limit, and the clock-event reasons
    of all the processes together, in words) and the step in SM cycles: each process's median step times its own
    median clock, ``mcycles`` the median over processes, in millions. ``cycle_speedup`` is FP32's cycles over the
    mode's at the same batch: the speed-up at equal clocks as a model that scales all of the step with the SM
    clock (memory-bound kernels do not, and a dip between readings is not seen), which a mode that ran at a lower clock (a power cap,
    reason ``0x4``) does not lose to its clock. It counts SM cycles of the step's wall time, so it describes the
    GPU's work only where the GPU sets the step's time (batch 128); at batch 32 the host does (section 3), and
    the cycles include the GPU's idle ones.

    Data from before the script recorded clocks (no ``nvml`` key, or null: the CPU, ``--no-clocks``, no NVML)
    loads: its clock, power and cycle columns are NaN, ``reasons`` "not recorded", and ``clocked`` (the
    processes with a clock) 0. ``attrs['clocks']`` says whether any process recorded one."""
    rows = []
    for (batch, mode), runs in pd.DataFrame(_timed(data)).groupby(["batch", "mode"], sort=False):
        if mode == FAILURE:
            continue
        per = [_clock_reading(r) for r in runs.to_dict("records")]

        def med(key: str) -> float:
            got = [x[key] for x in per if x[key] is not None]
            return float(np.median(got)) if got else float("nan")

        masks = [int(x["reasons"], 16) for x in per if x["reasons"]]
        rows.append({"batch": int(batch), "mode": mode, "step_ms": med("step"), "processes": len(per),
                     "clocked": sum(x["clock"] is not None for x in per), "sm_mhz": med("clock"),
                     "sm_mhz_low": min((x["low"] for x in per if x["low"] is not None), default=float("nan")),
                     "power_w": med("power"), "power_limit_w": med("limit"),
                     "reasons": describe_event_reasons(f"0x{np.bitwise_or.reduce(masks):016x}") if masks else "not recorded",
                     "mcycles": med("mcycles")})
    out = pd.DataFrame(rows)
    out["mode"] = pd.Categorical(out["mode"], MODES, ordered=True)
    out = out.sort_values(["batch", "mode"], ignore_index=True)
    out["mode"] = out["mode"].astype(str)
    base = out[out["mode"] == "fp32"].set_index("batch")["mcycles"]
    out["cycle_speedup"] = out["batch"].map(base) / out["mcycles"]
    out.attrs["clocks"] = bool(out["clocked"].sum())
    return out


def _clock_reading(r: dict[str, Any]) -> dict[str, Any]:
    """One timed process's step and what NVML read during its measured steps (None where it read nothing)."""
    nv = r.get("nvml") if isinstance(r.get("nvml"), dict) else {}
    clock, step = nv.get("sm_mhz_median"), _measured(r, "step_ms")
    return {"step": step, "clock": clock, "low": nv.get("sm_mhz_min"), "power": window_power_w(nv),
            "readings_w": nv.get("power_w_mean"), "samples": nv.get("samples"), "seconds": nv.get("seconds"),
            "limit": nv.get("power_limit_w"), "reasons": nv.get("event_reasons"),
            "mcycles": step * clock / 1e3 if clock else None}


def clock_processes(data: dict[str, Any], batch: int = LARGE_BATCH) -> pd.DataFrame:
    """Process by process at ``batch``: the median step, NVML's median and lowest SM clock, the power two ways (from
    the energy counter over the window, ``power_w``, which the tables use, and the mean of the power readings,
    ``readings_w``, each an average over about the last second, so it lags a window shorter than that), the
    readings' count and span, the clock-event reasons in words, and the energy of one step (``power_w`` times the
    step). The energy counter advances in steps (every 20-100 ms on recent GPUs), so a window under a second gives
    its power only roughly: read the spread between a mode's processes before any one value."""
    rows = []
    for r in _timed(data):
        if r["mode"] == FAILURE or r["batch"] != batch:
            continue
        x = _clock_reading(r)
        rows.append({"mode": r["mode"], "step_ms": x["step"], "sm_mhz": x["clock"], "sm_mhz_low": x["low"],
                     "power_w": x["power"], "readings_w": x["readings_w"], "samples": x["samples"],
                     "seconds": x["seconds"], "reasons": describe_event_reasons(x["reasons"]) if x["reasons"] else "not recorded",
                     "joules_per_step": x["power"] * x["step"] / 1e3 if x["power"] else None})
    out = pd.DataFrame(rows)
    out["mode"] = pd.Categorical(out["mode"], MODES, ordered=True)
    return out.sort_values("mode", kind="stable", ignore_index=True).assign(mode=lambda d: d["mode"].astype(str))


def clock_speedups(data: dict[str, Any], batch: int = LARGE_BATCH) -> pd.DataFrame:
    """Per mode at ``batch``: the speed-up over FP32 in time (:func:`timing_table`'s) beside the speed-up in SM
    cycles (:func:`clock_table`'s: at equal clocks, as a model), with the clock, the power against its limit and the
    clock-event reasons NVML read. Where the two speed-ups differ, the modes ran at different clocks: a mode
    held to a lower clock by the power limit looks slower in time than its work is. At the large batch the
    GPU's work sets the step (section 3), so the cycles are the GPU's own; at the small one, not."""
    keys = ["batch", "mode"]
    both = timing_table(data)[keys + ["step_ms", "speedup"]].merge(
        clock_table(data)[keys + ["sm_mhz", "sm_mhz_low", "power_w", "power_limit_w", "reasons", "mcycles",
                                  "cycle_speedup", "clocked", "processes"]], on=keys)
    out = both[both["batch"] == batch].drop(columns="batch").set_index("mode")
    out.attrs["clocks"] = bool(out["clocked"].sum())
    return out


def cures_table(data: dict[str, Any]) -> pd.DataFrame:
    """Per batch, mode and :data:`CURES` variant of a :func:`cures_plan` record: the step (median over processes of
    each one's median, with the processes' range), forward + backward and AdamW's phase (``fwd_bwd_ms``,
    ``optimizer_ms``: CUDA events, medians), the speed-up over the chapter's own step for the same mode and batch (its
    median over the variant's; ``low``: the chapter's fastest process over the variant's slowest, the least favourable
    pairing), and, where the record has them, the step's own peak memory (``step_peak_GiB``, the largest of the
    processes') and the SM clock (``sm_mhz``: the lowest of the processes' median clocks, ``sm_mhz_low`` the lowest
    reading of any, ``reasons``: NVML's
    clock-event reasons other than none), so that a capped run reads as one."""
    rows = []
    for (batch, mode, cure), runs in pd.DataFrame(_timed(data)).groupby(["batch", "mode", "cure"], sort=False):
        recs = runs.to_dict("records")
        steps = [_measured(r, "step_ms") for r in recs]
        fwd_bwd = [float(np.median([s["forward_ms"] + s["backward_ms"] for s in r["steps"] if s["measured"]])) for r in recs]
        peaks = [r["step_peak_memory_bytes"] for r in recs if r.get("step_peak_memory_bytes")]
        nvml = [r["nvml"] for r in recs if isinstance(r.get("nvml"), dict) and r["nvml"].get("sm_mhz_median")]
        words = sorted({w for n in nvml for w in str(n.get("event_reasons_words", "")).split(", ") if w and w != "none"})
        rows.append({"batch": int(batch), "mode": mode, "cure": cure, "step_ms": float(np.median(steps)),
                     "step_low": min(steps), "step_high": max(steps), "processes": len(steps),
                     "fwd_bwd_ms": float(np.median(fwd_bwd)),
                     "optimizer_ms": float(np.median([_measured(r, "optimizer_ms") for r in recs])),
                     "step_peak_GiB": max(peaks) / 2**30 if peaks else float("nan"),
                     "sm_mhz": min(n["sm_mhz_median"] for n in nvml) if nvml else float("nan"),
                     "sm_mhz_low": min(n.get("sm_mhz_min", n["sm_mhz_median"]) for n in nvml) if nvml else float("nan"),
                     "reasons": ", ".join(words) if nvml else "not recorded"})
    out = pd.DataFrame(rows)
    base = out[out["cure"] == next(iter(CURES))].set_index(["batch", "mode"])
    key = list(zip(out["batch"], out["mode"]))
    out["speedup"] = [base.loc[k, "step_ms"] for k in key] / out["step_ms"]
    out["speedup_low"] = [base.loc[k, "step_low"] for k in key] / out["step_high"]
    out["cure"] = pd.Categorical(out["cure"], list(CURES), ordered=True)
    return out.sort_values(["batch", "mode", "cure"], ignore_index=True).assign(cure=lambda d: d["cure"].astype(str))


def cures_loss_agreement(data: dict[str, Any]) -> pd.DataFrame:
    """Per batch, mode and :data:`CURES` variant of a :func:`cures_plan` record: the last step's loss, and the largest
    relative difference of any step's loss (warm-up included: each is one update) from the chapter's own step's at the
    same step of the same round. Every run of the plan uses the script's default seed, so each starts from the same
    weights and batches: what differs is the cure's arithmetic (a fused update, Inductor's kernels). Pairing by round
    keeps that true should a plan ever vary the seed by round."""
    rows = []
    timed = _timed(data)
    base = {(r["batch"], r["mode"], r["round"]): [s["loss"] for s in r["steps"]] for r in timed
            if r["cure"] == next(iter(CURES))}
    for r in timed:
        ref = base[(r["batch"], r["mode"], r["round"])]
        losses = [s["loss"] for s in r["steps"]]
        rows.append({"batch": r["batch"], "mode": r["mode"], "cure": r["cure"], "loss": float(losses[-1]),
                     "rel_diff": max(abs(a / b - 1) for a, b in zip(losses, ref))})
    runs = pd.DataFrame(rows)
    out = runs.groupby(["batch", "mode", "cure"], sort=False).agg(last_loss=("loss", "median"),
                                                                  rel_diff_max=("rel_diff", "max"))
    return out.reset_index()


def speedup_floor(table: pd.DataFrame, batch: int, mode: str) -> float:
    """The least speed-up over FP32 any pairing of processes gives: FP32's fastest process over ``mode``'s slowest."""
    return float(table[(table["batch"] == batch) & (table["mode"] == mode)]["speedup_low"].iloc[0])


def fit_table(data: dict[str, Any]) -> pd.DataFrame:
    """Per mode probed: the memory budget, the largest batch whose whole step fitted, its peak, the first that did not."""
    rows = [{"mode": r["mode"], "budget_GiB": r["budget_gib"], "largest_batch": r["largest_batch"],
             "peak_GiB": r["peak_bytes_at_largest"] / 2**30, "first_out_of_memory": r["first_batch_out_of_memory"],
             "probes": len(r["probes"])} for r in data["runs"] if r["kind"] == "fit"]
    out = pd.DataFrame(rows)
    out["vs_fp32"] = out["largest_batch"] / out.loc[out["mode"] == "fp32", "largest_batch"].iloc[0]
    return out


def loss_curves(data: dict[str, Any], batch: int = SMALL_BATCH) -> pd.DataFrame:
    """Each mode's loss by the number of optimizer updates applied before the step (first process of each mode).

    A step the GradScaler skipped applies no update, so the next step sees the same weights: counted by
    updates, FP16's curve lines up with the others instead of lagging one step behind each skip.
    Columns: one per mode; the failure case included.
    """
    curves = {}
    for r in _timed(data):
        if r["batch"] != batch or r["mode"] in curves:
            continue
        updates, series = 0, {}
        for s in r["steps"]:
            series.setdefault(updates, s["loss"])
            updates += 0 if s["skipped"] else 1
        curves[r["mode"]] = pd.Series(series)
    out = pd.DataFrame(curves)
    out.index.name = "updates_applied"
    return out[[m for m in (*MODES, FAILURE) if m in out]].dropna()


def loss_agreement(curves: pd.DataFrame) -> pd.Series:
    """Per mode: the largest relative difference from FP32's loss over the updates both have."""
    ref = curves["fp32"]
    return pd.Series({m: float(((curves[m] - ref).abs() / ref.abs()).max()) for m in curves if m != "fp32"},
                     name="max_relative_difference")


def underflow_table(data: dict[str, Any], batch: int = SMALL_BATCH) -> pd.DataFrame:
    """Per mode, the first step's gradient elements that are zero in that mode but not in the FP32 reference
    (``zero_not_in_fp32``), their share, and the parameter that lost most; and the FP32 reference's own census of
    where its gradient elements would fall in FP16's range (``attrs['census']``).

    The column is named for what it counts, not "underflow": TF32 keeps FP32's exponent range, so its few
    zeros come from different rounding (a sum that cancels), not from a range it cannot hold; only in FP16
    without a scaler is the count dominated by underflow. The census counts every parameter, including
    those whose gradient autocast leaves in FP32 (LayerNorm, embeddings), so it is not a prediction of
    the count."""
    rows, census = [], None
    for r in _timed(data):
        if r["batch"] != batch or any(x["mode"] == r["mode"] for x in rows):
            continue
        top = max(r["underflow_by_parameter"].items(), key=lambda kv: kv[1], default=("-", 0))
        rows.append({"mode": r["mode"], "zero_not_in_fp32": r["underflowed_grad_elements"],
                     "share": r["underflowed_grad_elements"] / r["grad_elements"], "most_in": top[0],
                     "there": top[1], "skipped_steps": sum(s["skipped"] for s in r["steps"])})
        census = census or r.get("reference_fp16_census")
    out = pd.DataFrame(rows).set_index("mode")
    out = out.loc[[m for m in (*MODES, FAILURE) if m in out.index]]
    out.attrs["census"] = census
    return out


def scale_history(data: dict[str, Any], mode: str = "fp16", batch: int = SMALL_BATCH, steps: int = 4) -> pd.DataFrame:
    """The first ``steps`` steps of every ``mode`` process at ``batch``: loss, the scaler's scale after the step,
    and whether the step was skipped (the script marks a step skipped when the scale fell over it). Which step
    overflowed is read here, not assumed: the processes are rows, so a reader sees whether they agree."""
    rows = []
    for r in _timed(data):
        if r["mode"] != mode or r["batch"] != batch:
            continue
        for s in r["steps"][:steps]:
            rows.append({"round": r["round"], "step": s["step"], "loss": s["loss"], "scale_after": s["scale"],
                         "skipped": s["skipped"]})
    return pd.DataFrame(rows)


def underflow_top(data: dict[str, Any], mode: str = FAILURE, batch: int = SMALL_BATCH) -> pd.DataFrame:
    """The parameters that lost most gradient elements to zero in ``mode`` (the script keeps its top five), each
    with its share of the mode's whole count; ``attrs['total']`` is that count, ``attrs['kept']`` their sum."""
    run = next(r for r in _timed(data) if r["mode"] == mode and r["batch"] == batch)
    total = run["underflowed_grad_elements"]
    out = pd.DataFrame([{"parameter": k, "zeroed": v, "share": v / total}
                        for k, v in sorted(run["underflow_by_parameter"].items(), key=lambda kv: -kv[1])])
    out.attrs.update(total=total, kept=int(out["zeroed"].sum()) if len(out) else 0)
    return out


#: The script's ``--census`` of the FP32 reference gradient on the CPU, by parameter group (the training run's JSON keeps totals).
CPU_CENSUS = REPO_ROOT / "artifacts" / "ch10" / "cpu" / "fp16_census.json"
#: The same ``--census`` run by hand on a GPU (the training run's JSON keeps only its totals): the GPU's own split.
GPU_CENSUS = REPO_ROOT / "artifacts" / "ch10" / "gpu_census.json"
CENSUS_FIELDS = ("nonzero", "below_fp16_subnormal", "fp16_subnormal")


def census_by_group(gpu_path: str | Path = GPU_CENSUS, cpu_path: str | Path = CPU_CENSUS) -> pd.DataFrame:
    """The two ``--census`` records side by side, per parameter group: elements, non-zero and below 2^-25 on each
    device, and GPU - CPU. It answers where the devices' totals differ, which the totals alone cannot: the training
    run records totals only. Refuses two records of different models (their configurations, the device aside, must
    be equal). ``attrs`` holds each record's torch version and GPU name (``None`` on the CPU)."""
    import json

    gpu, cpu = (json.loads(Path(p).read_text()) for p in (gpu_path, cpu_path))
    same = {k: v for k, v in gpu["config"].items() if k != "cpu"} == {k: v for k, v in cpu["config"].items() if k != "cpu"}
    if not same or set(gpu["census"]["by_group"]) != set(cpu["census"]["by_group"]):
        raise GpuprofError(f"{gpu_path} and {cpu_path} are censuses of different models: compare like with like")
    rows = []
    for group, g in gpu["census"]["by_group"].items():
        c = cpu["census"]["by_group"][group]
        if g["elements"] != c["elements"]:
            raise GpuprofError(f"{group}: {g['elements']:,} elements on the GPU, {c['elements']:,} on the CPU")
        rows.append({"group": group, "elements": g["elements"], "nonzero_cpu": c["nonzero"], "nonzero_gpu": g["nonzero"],
                     "below_cpu": c["below_fp16_subnormal"], "below_gpu": g["below_fp16_subnormal"],
                     "max_abs_gpu": g["max_abs"]})
    out = pd.DataFrame(rows).set_index("group")
    out["nonzero_diff"] = out["nonzero_gpu"] - out["nonzero_cpu"]
    out["below_diff"] = out["below_gpu"] - out["below_cpu"]
    out.attrs.update(torch={"gpu": gpu["provenance"]["torch"], "cpu": cpu["provenance"]["torch"]},
                     gpu_name=gpu["machine"].get("gpu_name"))
    return out


def fp16_loss_split(path: str | Path = GPU_CENSUS) -> pd.DataFrame:
    """What one unscaled FP16 backward of the first step zeroed (the ``--census`` record's ``fp16_noscaler_lost``),
    per parameter group and by the range the FP32 reference puts each zeroed element in: ``below_fp16_subnormal``
    (|g| < 2^-25), ``fp16_subnormal``, ``fp16_normal``; with a ``total`` row. It answers what the census of FP32
    magnitudes cannot: which elements FP16 actually loses."""
    import json

    split = json.loads(Path(path).read_text())["fp16_noscaler_lost"]
    cols = ["lost", "below_fp16_subnormal", "fp16_subnormal", "fp16_normal"]
    out = pd.DataFrame.from_dict(split["by_group"], orient="index")[cols].rename_axis("group")
    out.loc["total"] = out.sum()
    if int(out.loc["total", "lost"]) != split["lost"]:
        raise GpuprofError(f"{path}: the groups' lost elements do not add up to its total {split['lost']:,}")
    return out


def census_against_cpu(data: dict[str, Any], path: str | Path = CPU_CENSUS, batch: int = SMALL_BATCH) -> pd.DataFrame:
    """The GPU's census of its FP32 reference gradient (the study's JSON keeps totals only) against the CPU's
    (``--census``, by group) of the same model, weights and batch: per range (``nonzero``; ``below_fp16_subnormal``,
    0 < |g| < 2^-25; ``fp16_subnormal``, 2^-25 to 2^-14; ``fp16_normal``, the rest), the two counts and GPU - CPU.

    Where the two can differ is bounded by what must be zero on any device. An embedding row that no token and no
    position of the batch indexes gets no gradient at all; the batch is drawn again here (the script's
    ``training_ids``, on the CPU, as both runs drew it) to count those rows. ``attrs`` holds: ``unused_rows`` and
    ``unused_elements`` (those rows), ``cpu_embedding_zeros`` (the CPU's zeros in the embeddings: equal to
    ``unused_elements`` when every one of them lies in such a row), ``cpu_zeros_elsewhere`` (the CPU's exact zeros
    outside those rows, per group), ``gpu_zeros_elsewhere`` (the GPU's, from its totals: the GPU does not say
    where), ``newly_nonzero_at_least`` (how many of the CPU's zeros elsewhere are non-zero on the GPU, at least:
    the GPU has only ``gpu_zeros_elsewhere`` zeros to put among them), ``key_bias_max_abs`` and
    ``cpu_below_by_group`` (the CPU's; the GPU's own split is census_by_group's), and the torch version
    of each run (they differ: the comparison is of two builds as well as two devices)."""
    import json

    from ..backend import require_torch
    from ..runner import load_script

    record = json.loads(Path(path).read_text())
    cpu, groups, config = record["census"], record["census"]["by_group"], record["config"]
    run = next(r for r in _timed(data) if r["batch"] == batch and r.get("reference_fp16_census"))
    gpu = run["reference_fp16_census"]
    elements = sum(g["elements"] for g in groups.values())
    if elements != run["grad_elements"]:
        raise GpuprofError(f"{path} counts {elements:,} gradient elements, the GPU run {run['grad_elements']:,}: "
                           "not the same model")
    rows = {f: {"cpu": cpu[f], "gpu": gpu[f]} for f in CENSUS_FIELDS}
    rows["fp16_normal"] = {k: rows["nonzero"][k] - rows["below_fp16_subnormal"][k] - rows["fp16_subnormal"][k]
                           for k in ("cpu", "gpu")}
    out = pd.DataFrame.from_dict(rows, orient="index").rename_axis("range")
    out["gpu_minus_cpu"] = out["gpu"] - out["cpu"]

    script = load_script(SCRIPT)
    torch = require_torch("mixed_precision.py")
    args = script.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in config.items() if k != "cpu"])
    ids = script.training_ids(torch, args)
    emb = groups["embeddings"]
    used_rows = int(ids.unique().numel()) + args.seq_len  # tokens, and positions 0 .. seq_len - 1
    unused_rows = emb["elements"] // args.d_model - used_rows
    unused = unused_rows * args.d_model
    elsewhere = {g: r["elements"] - r["nonzero"] for g, r in groups.items() if g != "embeddings"}
    gpu_elsewhere = elements - unused - gpu["nonzero"]
    out.attrs.update(unused_rows=unused_rows, unused_elements=unused,
                     cpu_embedding_zeros=emb["elements"] - emb["nonzero"], cpu_zeros_elsewhere=elsewhere,
                     gpu_zeros_elsewhere=gpu_elsewhere,
                     newly_nonzero_at_least=max(0, sum(elsewhere.values()) - gpu_elsewhere),
                     key_bias_max_abs=groups["attention_key_bias"]["max_abs"],
                     cpu_below_by_group={g: r["below_fp16_subnormal"] for g, r in groups.items()},
                     torch={"cpu": record["provenance"]["torch"], "gpu": run.get("torch")})
    return out


def probe_peaks(data: dict[str, Any], batches: Sequence[int] = (SMALL_BATCH, LARGE_BATCH)) -> pd.DataFrame:
    """Per mode probed for the largest batch: the peak of one whole training step (the probe resets the peak
    statistics before it), in GiB, at each of ``batches``; NaN where that batch did not fit or was not probed.
    These are the step's own peaks; the timed runs of old data recorded none (see :func:`timing_table`)."""
    rows = {}
    for r in data["runs"]:
        if r["kind"] != "fit":
            continue
        got = {p["batch"]: p["peak_bytes"] / 2**30 for p in r["probes"] if p["fits"]}
        rows[r["mode"]] = {f"batch_{b}_GiB": got.get(b, float("nan")) for b in batches}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("mode")


def memory_per_sequence(data: dict[str, Any], from_batch: int = SMALL_BATCH) -> pd.DataFrame:
    """Per mode probed for the largest batch: a straight line through the probes' peaks (least squares over the
    probes that fitted, from ``from_batch`` up; smaller batches sit on the allocator's floor), as GiB per
    sequence (``slope_GiB``: activations and what else grows with the batch) and GiB at batch 0
    (``intercept_GiB``: what does not grow with the batch at the step's peak; the peak is likely early in backward,
    where the saved activations are largest and, with ``zero_grad(set_to_none=True)``, not every gradient exists
    yet, so the intercept can be below weights, gradients and optimizer state together (not measured per
    tensor); in FP16 and BF16 it also holds autocast's weight copies), with each slope as a
    share of FP32's and the largest batch the line predicts in the budget. The ratio of two modes' largest
    batches is set by their slopes and intercepts; a fixed part common to both modes cannot change it."""
    rows = []
    for r in data["runs"]:
        if r["kind"] != "fit":
            continue
        pts = [(p["batch"], p["peak_bytes"] / 2**30) for p in r["probes"] if p["fits"] and p["batch"] >= from_batch]
        b, m = np.array(pts, dtype=float).T
        slope, intercept = np.polyfit(b, m, 1)
        rows.append({"mode": r["mode"], "probes_fitted": len(pts), "slope_GiB": slope, "intercept_GiB": intercept,
                     "predicted_largest": (r["budget_gib"] - intercept) / slope, "largest_batch": r["largest_batch"]})
    out = pd.DataFrame(rows).set_index("mode")
    out["slope_vs_fp32"] = out["slope_GiB"] / out.loc["fp32", "slope_GiB"]
    return out


# --- the captures ---------------------------------------------------------------------------------------

def capture_mode(chapter: str, mode: str, batch: int = SMALL_BATCH, steps: int = 3):  # type: ignore[no-untyped-def]
    """nsys over ``steps`` measured steps of one mode (``--capture-range=nvtx`` on the script's ``measured_steps``
    range: warm-up and the FP32 reference backward are not recorded)."""
    from ..nsys.capture import QUIET, nsys_capture, nvtx_range_capture

    args = ["--mode", mode, "--batch-size", str(batch), "--warmup", "3", "--steps", str(steps)]
    return nsys_capture(chapter, f"mode_{mode}", SCRIPT, args, options=[*QUIET, *nvtx_range_capture("measured_steps")])


def _step_work(path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, int]:
    """(kernels launched in the measured steps, the step ranges, the runtime calls, the number of steps).
    Rule "window": autograd launches the backward pass's kernels from a thread of its own."""
    ranges = ns.nvtx_ranges(path)
    steps = ta.step_ranges(ranges)
    runtime = ns.runtime_calls(path)
    hits = ta.attribute_kernels(ns.kernels(path), runtime, steps, rule="window")
    return hits, ranges, runtime, len(steps)


def capture_summary(paths: dict[str, str | Path]) -> pd.DataFrame:
    """Per mode, per measured step: kernels, GPU kernel time, the step's length (start to start of consecutive
    steps, so the end-of-step sync is inside), how busy the GPU was over it, and the shares of kernel time in
    tensor-core kernels, other matrix products and attention, autocast's casts and the rest."""
    rows = []
    for mode, path in paths.items():
        hits, ranges, _, n = _step_work(path)
        steps = ta.step_ranges(ranges)
        span = float(np.median(np.diff(steps["start"].to_numpy()))) if n > 1 else float("nan")
        busy = [ta.busy_fraction(hits.loc[hits["range_text"] == t, ["start", "end"]], (int(s), int(s + span)))
                for t, s in zip(steps["text"], steps["start"])]
        full = hits["demangled"].fillna(hits["name"])
        kind = [kernel_kind(a, b) for a, b in zip(hits["name"], full)]
        tc = np.array([k in ("matrix product", "attention") and tensor_cores(a, b).startswith("yes")
                       for k, a, b in zip(kind, hits["name"], full)])
        mm = np.array([k in ("matrix product", "attention") for k in kind]) & ~tc
        cast = full.str.contains(CAST, regex=True).to_numpy()
        t = hits["duration_ns"].to_numpy()
        total = t.sum()
        rows.append({"mode": mode, "steps": n, "kernels_per_step": len(hits) / n, "gpu_ms_per_step": total / 1e6 / n,
                     "step_ms": span / 1e6, "gpu_busy": float(np.median(busy)),
                     "tensor_core_share": t[tc].sum() / total, "other_matmul_share": t[mm].sum() / total,
                     "cast_share": t[cast].sum() / total, "casts_per_step": cast.sum() / n,
                     "rest_share": t[~tc & ~mm & ~cast].sum() / total})
    return pd.DataFrame(rows).set_index("mode")


def gemm_kernels(paths: dict[str, str | Path], top: int = 3) -> pd.DataFrame:
    """Per mode, its ``top`` matrix-product and attention kernels by time per step: which kernels replaced which."""
    parts = []
    for mode, path in paths.items():
        hits, _, _, n = _step_work(path)
        k = matmul_table(hits, n).head(top)
        parts.append(k.assign(mode=mode))
    out = pd.concat(parts, ignore_index=True)
    out["kernel"] = out["kernel"].str.slice(0, 60)
    return out[["mode", "kernel", "kind", "per_step", "ms_per_step", "tensor_cores"]]


def matmul_work(paths: dict[str, str | Path]) -> pd.DataFrame:
    """Per mode, per step: GPU time of the matrix products, of attention, and of all kernels, with the part of
    each that runs on tensor cores (:func:`gpuprof.kernel_kinds.tensor_cores`). The matrix products' own
    speed-up is the ratio of ``matmul_ms``; ``gpu_ms`` is the whole GPU work, of which they are one part."""
    rows = []
    for mode, path in paths.items():
        hits, _, _, n = _step_work(path)
        full = hits["demangled"].fillna(hits["name"])
        kind = np.array([kernel_kind(a, b) for a, b in zip(hits["name"], full)])
        tc = np.array([tensor_cores(a, b).startswith("yes") for a, b in zip(hits["name"], full)])
        t = hits["duration_ns"].to_numpy() / 1e6 / n
        mm, att = kind == "matrix product", kind == "attention"
        rows.append({"mode": mode, "matmul_ms": t[mm].sum(), "matmul_tensor_core_ms": t[mm & tc].sum(),
                     "attention_ms": t[att].sum(), "attention_tensor_core_ms": t[att & tc].sum(), "gpu_ms": t.sum()})
    return pd.DataFrame(rows).set_index("mode")


PHASES = ("forward", "backward", "optimizer_step")
OPTIMIZER = r"multi_tensor_apply"


def _phase_hits(path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """(kernels attributed to the phase ranges, the phase ranges, the number of steps). Rule "window": autograd
    launches the backward pass's kernels from a thread of its own."""
    ranges = ns.nvtx_ranges(path)
    n = len(ta.step_ranges(ranges))
    phases = ranges[ranges["text"].isin(PHASES)]
    return ta.attribute_kernels(ns.kernels(path), ns.runtime_calls(path), phases, rule="window"), phases, n


#: What the kernels the cast pattern (:data:`CAST`) matches are, by name: float-to-half copies (autocast's, in forward),
#: ``direct_copy`` (a dtype conversion by ``copy_``/``.to``, e.g. a half-precision gradient into an FP32 one), and
#: elementwise kernels whose operands differ in type and convert as they load or store.
CAST_FAMILIES = {"to_half": r"float16_copy_kernel|bfloat16_copy_kernel", "direct_copy": r"direct_copy",
                 "LoadWithCast": r"LoadWithCast", "StoreWithCast": r"StoreWithCast"}
#: Conversions :data:`CAST` does not see: PyTorch's elementwise kernels whose operands differ in type and are not all
#: contiguous run on its general path, ``gpu_kernel_impl<...>``, which converts each element as it loads and stores
#: but whose name does not say so (``gpu_kernel_impl_nocast`` is the path where the functor's argument types match
#: the tensors', which needs no conversion per element: one FP32-to-half copy a step runs there too, named, and
#: :data:`CAST` counts it). In chapter 10's model these are
#: each layer's attention residual addition: FP32 stream plus ``nn.MultiheadAttention``'s half-precision output,
#: which ``batch_first=True`` returns transposed.
UNNAMED_CAST = r"gpu_kernel_impl<"


def cast_kernels(paths: dict[str, str | Path]) -> pd.DataFrame:
    """Per mode and phase, per step: the kernels :data:`CAST` matches, split by :data:`CAST_FAMILIES` (a kernel
    counts in the first family its name matches), and in a last column, ``not_in_CAST``, the conversions on
    PyTorch's general elementwise path that :data:`CAST` misses (:data:`UNNAMED_CAST`). The pattern counts more than
    autocast's casts, and not every conversion; this says what."""
    rows = []
    for mode, path in paths.items():
        hits, _, n = _phase_hits(path)
        full = hits["demangled"].fillna(hits["name"])
        cast = full.str.contains(CAST, regex=True)
        left = cast.copy()
        for family, pattern in CAST_FAMILIES.items():
            hit = left & full.str.contains(pattern, regex=True)
            left &= ~hit
            for phase, count in hits.loc[hit, "range_text"].value_counts().items():
                rows.append({"mode": mode, "phase": phase, "family": family, "per_step": count / n})
        missed = ~cast & full.str.contains(UNNAMED_CAST, regex=False)
        for phase, count in hits.loc[missed, "range_text"].value_counts().items():
            rows.append({"mode": mode, "phase": phase, "family": "not_in_CAST", "per_step": count / n})
    out = pd.DataFrame(rows, columns=["mode", "phase", "family", "per_step"])
    return out.pivot_table(index=["mode", "phase"], columns="family", values="per_step", fill_value=0,
                           aggfunc="sum").reindex(columns=[*CAST_FAMILIES, "not_in_CAST"], fill_value=0)


def phase_work(paths: dict[str, str | Path]) -> pd.DataFrame:
    """Per mode and phase (the script's ``forward``, ``backward`` and ``optimizer_step`` ranges), per step: how
    long the range lasted on the CPU (``cpu_ms``), and the kernels launched while it was open (rule "window":
    autograd launches backward from a thread of its own), their count, their GPU time, and how many of them
    are casts (:data:`CAST`) and optimizer kernels (:data:`OPTIMIZER`). A phase whose ``cpu_ms`` is several
    times its ``gpu_ms`` is bound by the host: the GPU ran its kernels faster than the CPU issued them."""
    rows = []
    for mode, path in paths.items():
        hits, phases, n = _phase_hits(path)
        full = hits["demangled"].fillna(hits["name"])
        for phase in PHASES:
            r = phases[phases["text"] == phase]
            h = hits["range_text"] == phase
            rows.append({"mode": mode, "phase": phase, "cpu_ms": float((r["end"] - r["start"]).sum()) / 1e6 / n,
                         "kernels": int(h.sum()) / n, "gpu_ms": float(hits.loc[h, "duration_ns"].sum()) / 1e6 / n,
                         "casts": int((h & full.str.contains(CAST, regex=True)).sum()) / n,
                         "optimizer_kernels": int((h & full.str.contains(OPTIMIZER, regex=True)).sum()) / n,
                         "optimizer_gpu_ms": float(hits.loc[h & full.str.contains(OPTIMIZER, regex=True),
                                                            "duration_ns"].sum()) / 1e6 / n})
    return pd.DataFrame(rows).set_index(["mode", "phase"])


def scaler_work(paths: dict[str, str | Path]) -> pd.DataFrame:
    """Per mode, per step: the GradScaler's kernels (unscale + inf check, scale update) and the CUDA calls in the
    optimizer_step range that wait for the GPU (synchronisations and device-to-host copies), with their time.
    A ``cudaMemcpy*`` call counts only if its copy went device to host (joined on ``correlationId`` with the
    capture's memcpy records): the scaler also makes 4-byte device-to-device copies, which do not wait."""
    rows = []
    for mode, path in paths.items():
        hits, ranges, runtime, n = _step_work(path)
        full = hits["demangled"].fillna(hits["name"])
        amp = hits[full.str.contains(SCALER, regex=True)]
        copies = ns.memcpy(path)
        to_host = set(copies.loc[copies["kind"] == "Device-to-Host", "correlationId"]) if len(copies) else set()
        memcpy_call = runtime["name"].astype(str).str.contains("Memcpy")
        waiting = runtime[~memcpy_call | runtime["correlationId"].isin(to_host)]
        waits = ta.calls_by_range(waiting, ranges, r"Synchronize|Memcpy", ["optimizer_step"])
        rows.append({"mode": mode, "scaler_kernels_per_step": len(amp) / n,
                     "scaler_us_per_step": amp["duration_ns"].sum() / 1e3 / n,
                     "waiting_calls_per_step": waits["count"].sum() / n if len(waits) else 0.0,
                     "waiting_us_per_step": waits["total_us"].sum() / n if len(waits) else 0.0,
                     "calls": ", ".join(sorted(set(waits["call"]))) if len(waits) else "-"})
    return pd.DataFrame(rows).set_index("mode")


def figure(table: pd.DataFrame, curves: pd.DataFrame, gpu: str):  # type: ignore[no-untyped-def]
    """Step time per mode at both batches (bars: median process; whiskers: the processes' range), and each mode's
    loss against FP32's by updates applied (the curves themselves lie on top of one another)."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    batches = sorted(table["batch"].unique())
    width = 0.8 / len(batches)
    x = np.arange(len(MODES))
    for j, batch in enumerate(batches):
        t = table[table["batch"] == batch].set_index("mode").loc[list(MODES)]
        rel = t["step_ms"] / t.loc["fp32", "step_ms"]
        err = np.vstack([(t["step_ms"] - t["low_ms"]), (t["high_ms"] - t["step_ms"])]) / t.loc["fp32", "step_ms"]
        bars = a.bar(x + (j - (len(batches) - 1) / 2) * width, rel, width, yerr=err, capsize=3, label=f"batch {batch}")
        for bar, ms in zip(bars, t["step_ms"]):
            a.annotate(f"{ms:.0f} ms", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                       va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
    a.set_xticks(x, MODES)
    a.set_ylabel("step time / FP32's at the same batch")
    a.set_title("Step time (median of 3 processes; whiskers: range)", fontsize=9)
    a.legend(fontsize=8)
    for m in curves:
        if m != "fp32":
            rel = (curves[m] - curves["fp32"]) / curves["fp32"] * 100
            b.plot(curves.index, rel, marker="o", ms=3, lw=1, label=m, ls="--" if m == FAILURE else "-")
    b.axhline(0, color="grey", lw=0.8)
    b.set_xlabel("optimizer updates applied")
    b.set_ylabel("loss - FP32's loss (% of FP32's)")
    b.set_title("Loss against FP32's, same weights and batch", fontsize=9)
    b.legend(fontsize=8)
    fig.suptitle(f"BERT-base-sized encoder, 128 tokens per sequence ({gpu})", fontsize=10)
    fig.tight_layout()
    return fig
