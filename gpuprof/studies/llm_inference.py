"""LLM inference's measurements: prefill and decode of a Llama-3-8B-shaped decoder against the roofline.

Chapter 12 runs ``examples/nsys/llm_decode.py`` (the ladder of decoding loops, eager to CUDA graphs,
over a list of batch sizes). This module holds what the chapter would otherwise spell out in cells:

* the arithmetic, first: what a decoding step must read (:func:`step_cost`: the weights once, the KV
  cache of every sequence) and compute (2 FLOPs per weight per sequence, plus attention over the
  context), the step time the roofline allows with a copy bandwidth and a matrix-product rate
  (:func:`roofline_ms`, :func:`prediction_table`), the batch where the step turns from memory-bound to
  compute-bound (:func:`crossover_batch`), and how many sequences of a given context fit in memory
  beside the weights (:func:`kv_capacity`, :func:`capacity_table`);
* the ceilings that arithmetic is set against, as the course measured them on each GPU
  (:func:`recorded_ceilings`: chapter 0's device copy and BF16 product, else chapter 4's device copy
  and chapter 11's cuBLAS product), each with its file and GPU, never a typed-in number;
* the script's results as tables (:func:`run_decode`, :func:`rows_table`) and the knee of a batch sweep's step
  times (:func:`knee_fit`: two lines fitted);
* an Nsight Systems capture of the loop read per rung (:func:`capture_decode`, :func:`decode_steps`,
  :func:`capture_summary`): kernels and launch calls per decoding step, the CPU's time per step, the
  GPU's busy share, and which of the two bounds the loop.

Why the crossover can be out of reach. A step reads the weights once whatever the batch (W bytes), and
per sequence its KV cache (context x 128 KiB for 8b in BF16); it computes 2 x 7.5 G FLOPs per sequence.
Memory time W/B + n.kv/B against compute time n.f/R: the step turns compute-bound at
n* = (W/B) / (f/R - kv/B), and only if f/R > kv/B, i.e. if a sequence's matrix products take longer
than reading its cache. With grouped-query attention the cache is small, but at a long enough context
it is not: :func:`crossover_batch` returns None there (the step stays memory-bound at every batch).
"""

from __future__ import annotations

import functools
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

import numpy as np
import pandas as pd

from .. import activity as ta
from ..artifacts import REPO_ROOT, FoundCapture, find_capture
from ..errors import GpuprofError, ReferenceMissing
from ..nsys import sqlite as ns

__all__ = ["SCRIPT", "CHAPTER", "script", "model_config", "StepCost", "step_cost", "Ceiling", "Ceilings",
           "recorded_ceilings", "ceiling_records", "session_ceilings", "roofline_ms", "crossover_batch", "prediction_table", "kv_capacity",
           "max_context", "capacity_table", "kv_capacity_table", "run_decode", "load_results", "rows_table", "KneeFit", "knee_fit", "measured_knee", "ladder_figure",
           "CAPTURE_OPTIONS", "capture_decode", "decode_steps", "capture_summary", "RUNG_RANGE", "STEP_RANGE",
           "trim_decode_capture", "step_kernel_times", "in_situ"]

SCRIPT = REPO_ROOT / "examples" / "nsys" / "llm_decode.py"
CHAPTER = "ch12"


@functools.lru_cache(maxsize=1)
def script() -> ModuleType:
    """The example script as a module: its shapes and its bytes- and FLOPs-per-step arithmetic, used as they ran."""
    from ..runner import load_script

    return load_script(SCRIPT)


def model_config(name: str = "8b", layers: int | None = None) -> Any:
    """A preset's shapes (``8b``: Llama-3-8B's; ``tiny``), with ``layers`` overridden if given."""
    from dataclasses import replace

    cfg = script().PRESETS[name]
    return cfg if layers is None else replace(cfg, layers=layers)


# ----- the arithmetic -----

@dataclass(frozen=True)
class StepCost:
    """What one decoding step of ``batch`` sequences at ``context`` cached tokens must read and compute."""

    batch: int
    context: int
    bytes: int
    flops: int

    @property
    def intensity(self) -> float:
        """FLOPs per byte: against a GPU's ridge (its FLOP rate over its bandwidth), which side of the roofline."""
        return self.flops / self.bytes


def step_cost(cfg: Any, batch: int, context: int, dtype_bytes: int = 2) -> StepCost:
    """Bytes (``decode_step_bytes``: weights once, of the embedding table only the rows looked up, every sequence's
    KV cache) and FLOPs (``decode_step_flops``: 2 per weight multiplied per sequence, plus attention over the
    context) of one decoding step: the script's own functions, so the prediction uses what the run reports."""
    s = script()
    return StepCost(batch, context, s.decode_step_bytes(cfg, batch, context, dtype_bytes), s.decode_step_flops(cfg, batch, context))


@dataclass(frozen=True)
class Ceiling:
    """One measured ceiling and where it comes from."""

    value: float
    unit: str  # GB/s or TFLOP/s
    gpu: str
    source: str  # the file, as artifacts/<chapter>/<name>
    how: str

    def describe(self) -> str:
        return f"{self.value:,.1f} {self.unit} on {self.gpu} ({self.how}; {self.source})"


@dataclass(frozen=True)
class Ceilings:
    """A GPU's measured device-copy bandwidth (bytes read + written per second) and BF16 matrix-product rate."""

    copy: Ceiling
    matmul: Ceiling

    @property
    def gpu(self) -> str:
        return self.copy.gpu

    @property
    def copy_gbps(self) -> float:
        return self.copy.value

    @property
    def matmul_tflops(self) -> float:
        return self.matmul.value

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the two ceilings meet: a step of lower intensity is memory-bound."""
        return self.matmul_tflops * 1e12 / (self.copy_gbps * 1e9)


def _found(chapter: str, name: str, prefer: str) -> FoundCapture | None:
    try:
        return find_capture(chapter, name, prefer=prefer)
    except ReferenceMissing:
        return None


def _gpu_of(found: FoundCapture, data: dict[str, Any]) -> str:
    return str((data.get("machine") or {}).get("gpu_name") or found.machine.get("gpu_name") or "an unnamed GPU")


def _speed_of_light(prefer: str) -> list[Ceiling]:
    """Chapter 0's device copy (1 GiB, read + write counted) and BF16 product (8192^3)."""
    found = _found("ch00", "speed_of_light.json", prefer)
    if found is None:
        return []
    data = found.json()
    gpu, source = _gpu_of(found, data), f"artifacts/ch00/{found.path.name}"
    out = []
    for f in data.get("figures", []):
        if f["key"] in ("d2d", "matmul_bf16"):
            out.append(Ceiling(float(f["value"]), f["unit"], gpu, source, f"chapter 0, {f['label']}, {f['how']}"))
    return out


def _transpose_copy(folder: str, prefer: str) -> list[Ceiling]:
    """Chapter 4's device copy, measured beside its transposes with chapter 0's method."""
    found = _found(folder, "transpose.json", prefer)
    if found is None:
        return []
    data = found.json()
    if not data.get("device_copy_gbps"):
        return []
    return [Ceiling(float(data["device_copy_gbps"]), "GB/s", _gpu_of(found, data), f"artifacts/{folder}/{found.path.name}",
                    f"chapter 4, device-to-device copy (read + write), {data.get('device_copy_how')}")]


def _ladder_cublas(name: str, prefer: str) -> list[Ceiling]:
    """Chapter 11's cuBLAS BF16 product (4096^3, BF16 out): the median over its processes."""
    found = _found("ch11", name, prefer)
    if found is None:
        return []
    runs = found.json().get("runs", [])
    rates = [r["rate"] for run in runs for r in run.get("results", []) if r.get("name") == "cublas_bf16_out"]
    if not rates:
        return []
    gpu = _gpu_of(found, runs[0])
    return [Ceiling(float(statistics.median(rates)), "TFLOP/s", gpu, f"artifacts/ch11/{found.path.name}",
                    f"chapter 11, cuBLAS BF16 product {found.json().get('size')}^3 with BF16 out, median of "
                    f"{len(rates)} processes ({min(rates):,.1f} to {max(rates):,.1f})")]


def ceiling_records(prefer: str = "reference") -> list[Ceiling]:
    """Every device-copy and BF16-product ceiling the course recorded, in the order :func:`recorded_ceilings` prefers
    them: chapter 0's (measured for this purpose) before chapter 4's copy and chapter 11's cuBLAS product."""
    return [*_speed_of_light(prefer), *_transpose_copy("ch04", prefer), *_transpose_copy("ch04_h200", prefer),
            *_ladder_cublas("ladder.json", prefer), *_ladder_cublas("ladder_h200.json", prefer)]


def recorded_ceilings(gpu: str | None = None, prefer: str = "reference") -> Ceilings:
    """The course's measured copy bandwidth and BF16 rate for ``gpu`` (its name as the driver reports it; default:
    the GPU of chapter 0's figures). ``prefer="this machine"`` lets a reader's own captures come first."""
    records = ceiling_records(prefer)
    if gpu is None:
        first = next((c for c in records if c.source.startswith("artifacts/ch00/")), records[0] if records else None)
        if first is None:
            raise GpuprofError("The course recorded no device copy or BF16 product.",
                               "Restore artifacts/ with git, or run chapter 0 on a GPU.")
        gpu = first.gpu
    copy = next((c for c in records if c.gpu == gpu and c.unit == "GB/s"), None)
    matmul = next((c for c in records if c.gpu == gpu and c.unit == "TFLOP/s"), None)
    if copy is None or matmul is None:
        have = sorted({c.gpu for c in records})
        raise GpuprofError(f"The course recorded no {'device copy' if copy is None else 'BF16 product'} on {gpu}; "
                           f"it has figures for {', '.join(have) or 'no GPU'}.",
                           "Run chapter 0 on this GPU, or pass one of those names.")
    return Ceilings(copy, matmul)


def session_ceilings(source: FoundCapture) -> Ceilings:
    """The ceilings a run measured beside its decode runs (``ceilings.json``: chapter 0's device copy and BF16
    product, measured by :mod:`gpuprof.studies.speed_of_light` in the same session on the same GPU), which the
    chapter's shares are taken of: a share of another day's figure would mix two machines' states."""
    data = source.json()
    gpu = str(data.get("gpu") or source.machine.get("gpu_name") or "an unnamed GPU")
    where = f"artifacts/{CHAPTER}/{source.path.name}"
    return Ceilings(Ceiling(float(data["d2d_gbps"]), "GB/s", gpu, where,
                            f"device-to-device copy (read + write), {data.get('d2d_how')}, same session"),
                    Ceiling(float(data["matmul_bf16_tflops"]), "TFLOP/s", gpu, where,
                            f"BF16 matrix product, {data.get('matmul_how')}, same session"))


def roofline_ms(cost: StepCost, ceilings: Ceilings) -> tuple[float, float]:
    """(memory time, compute time) of a step in ms at the ceilings: its bytes at the copy bandwidth, its FLOPs at
    the BF16 rate. The roofline's step takes the larger; a real one at least that."""
    return cost.bytes / (ceilings.copy_gbps * 1e9) * 1e3, cost.flops / (ceilings.matmul_tflops * 1e12) * 1e3


def crossover_batch(cfg: Any, context: int, copy_gbps: float, matmul_tflops: float, dtype_bytes: int = 2) -> float | None:
    """The batch at which a decoding step at ``context`` turns compute-bound: memory time = compute time.

    Both are linear in the batch n: bytes = W + n.b1 (W: the weights; b1: a sequence's KV cache and embedding
    row), FLOPs = n.f1. So n* = (W / B) / (f1 / R - b1 / B), computed from :func:`step_cost` at two batches (the
    script's own arithmetic). None when f1 / R <= b1 / B: each added sequence costs more time to read than to
    compute, and the step stays memory-bound at every batch.
    """
    one, two = step_cost(cfg, 1, context, dtype_bytes), step_cost(cfg, 2, context, dtype_bytes)
    per_seq_bytes, per_seq_flops = two.bytes - one.bytes, two.flops - one.flops
    fixed_bytes = one.bytes - per_seq_bytes
    bw, rate = copy_gbps * 1e9, matmul_tflops * 1e12
    margin = per_seq_flops / rate - per_seq_bytes / bw
    if margin <= 0:
        return None
    return (fixed_bytes / bw) / margin


def prediction_table(cfg: Any, batches: Sequence[int], context: int, ceilings: Ceilings, dtype_bytes: int = 2) -> pd.DataFrame:
    """Per batch, the roofline's step: bytes, FLOPs, intensity, memory and compute ms, the step (the larger), which
    bounds it, tokens per second, and the ms per step per sequence (a token's share of the step)."""
    rows = []
    for b in batches:
        cost = step_cost(cfg, b, context, dtype_bytes)
        mem, comp = roofline_ms(cost, ceilings)
        step = max(mem, comp)
        rows.append({"batch": b, "GB_per_step": cost.bytes / 1e9, "GFLOP_per_step": cost.flops / 1e9,
                     "FLOP_per_byte": cost.intensity, "memory_ms": mem, "compute_ms": comp, "step_ms": step,
                     "bound": "memory" if mem >= comp else "compute", "tokens_per_s": b / (step / 1e3),
                     "ms_per_token": step / b})
    return pd.DataFrame(rows).set_index("batch")


def kv_capacity(cfg: Any, free_bytes: int, context: int, dtype_bytes: int = 2, reserve_bytes: int = 0) -> int:
    """The largest batch whose KV caches of ``context`` tokens each fit in ``free_bytes`` beside the weights and
    ``reserve_bytes`` (activations, the allocator's slack); 0 if not even one does."""
    room = free_bytes - cfg.params * dtype_bytes - reserve_bytes
    per_seq = context * cfg.kv_bytes_per_token(dtype_bytes)
    return max(0, room // per_seq)


def max_context(cfg: Any, free_bytes: int, batch: int, dtype_bytes: int = 2, reserve_bytes: int = 0) -> int:
    """The longest context each of ``batch`` sequences can cache in ``free_bytes`` beside the weights; 0 if none."""
    room = free_bytes - cfg.params * dtype_bytes - reserve_bytes
    return max(0, room // (batch * cfg.kv_bytes_per_token(dtype_bytes)))


def capacity_table(cfg: Any, free_bytes: int, contexts: Sequence[int], dtype_bytes: int = 2,
                   reserve_bytes: int = 0) -> pd.DataFrame:
    """Per context length: a sequence's KV cache in MiB, the largest batch that fits, and the tokens cached then."""
    per_token = cfg.kv_bytes_per_token(dtype_bytes)
    rows = []
    for c in contexts:
        n = kv_capacity(cfg, free_bytes, c, dtype_bytes, reserve_bytes)
        rows.append({"context": c, "kv_MiB_per_sequence": c * per_token / 2**20, "largest_batch": n,
                     "cached_tokens": n * c, "kv_GiB": n * c * per_token / 2**30})
    return pd.DataFrame(rows).set_index("context")


def kv_capacity_table(source: FoundCapture | str | Path | dict[str, Any]) -> pd.DataFrame:
    """``examples/nsys/kv_capacity.py``'s record as the chapter prints it: per context, the batch the arithmetic
    predicted for the run's free memory (:func:`kv_capacity`) and the batch that fitted, their ratio, the KV cache's
    bytes per token and per sequence, and where the rest went at the measured batch: the cache itself, the memory
    beside the weights and the cache at the try's peak (the step's activations and logits, cuBLAS's workspace:
    ``max_memory_allocated`` less the resident model and the cache), what the allocator reserved beyond it, the
    driver's free memory at the peak, what stayed allocated beyond the model once the try was released (cuBLAS's
    workspace, kept for the next step), and the memory the prediction counted on that the measurement could not use
    ((predicted - measured) sequences' caches), and the attention backends that accept the step (the math one
    repeats the cache's heads, the flash one does not: ``kv_capacity.attention_backends``). The allocator's columns are NaN for a run on the CPU, which keeps no
    allocator statistics.

    The record's prediction is checked against :func:`kv_capacity` now, for its configuration and free memory: a
    record made under other arithmetic is refused rather than printed beside this one."""
    from dataclasses import fields

    res = load_results(source)
    Config = script().Config
    cfg = Config(**{f.name: res["config"][f.name] for f in fields(Config) if f.name in res["config"]})
    dtype_bytes, resident = int(res["dtype_bytes"]), int(res["resident_bytes"])
    rows = []
    for r in res["contexts"]:
        context, measured, predicted = r["context"], r["measured_batch"], r["predicted_batch"]
        now = kv_capacity(cfg, res["free_bytes"], context, dtype_bytes)
        if now != predicted:
            raise GpuprofError(f"The record predicts batch {predicted:,} at context {context:,}; the arithmetic now gives "
                               f"{now:,} for the same {res['free_bytes']:,} free bytes.",
                               "Run kv_capacity.py again, or read the record with the code it was made with.")
        per_seq = context * cfg.kv_bytes_per_token(dtype_bytes)
        at = r.get("at_measured") or {}
        peak, reserved = at.get("peak_allocated"), at.get("peak_reserved")
        cache = at.get("cache_bytes", 0)
        nan = float("nan")
        rows.append({"context": context, "predicted_batch": predicted, "measured_batch": measured,
                     "ratio": measured / predicted if predicted else nan, "capped": r["capped"],
                     "kv_bytes_per_token": cfg.kv_bytes_per_token(dtype_bytes), "kv_MiB_per_sequence": per_seq / 2**20,
                     "cache_GiB": cache / 2**30,
                     "non_cache_GiB": (peak - resident - cache) / 2**30 if peak is not None else nan,
                     "reserved_beyond_GiB": (reserved - peak) / 2**30 if peak is not None and reserved is not None else nan,
                     "free_at_peak_GiB": at["free_at_peak"] / 2**30 if at.get("free_at_peak") is not None else nan,
                     "kept_after_GiB": (at["allocated_after"] - resident) / 2**30 if at.get("allocated_after") is not None
                     else nan,
                     "unused_prediction_GiB": (predicted - measured) * per_seq / 2**30, "tries": len(r["trials"]),
                     "attention_backends": ", ".join(r.get("attention_backends", [])),
                     "monotone": r["monotone"]})
    return pd.DataFrame(rows).set_index("context")


# ----- the script's results -----

def run_decode(filename: str, args: Sequence[str], timeout_s: int = 600) -> FoundCapture:
    """Run the script with ``args`` on this machine's GPU into ``ch12/<filename>``, or give the course's reference."""
    from ..script_results import run_for_json

    return run_for_json(CHAPTER, filename, SCRIPT, list(args), timeout_s=timeout_s)


def load_results(source: FoundCapture | str | Path | dict[str, Any]) -> dict[str, Any]:
    if isinstance(source, dict):
        return source
    if isinstance(source, FoundCapture):
        return source.json()
    return json.loads(Path(source).read_text())


def rows_table(source: FoundCapture | str | Path | dict[str, Any], ceilings: Ceilings | None = None) -> pd.DataFrame:
    """One row per (rung, batch): prefill ms and TFLOP/s, decode ms per step (median, quartiles, and the mean), and
    the rates of the median step: tokens/s (batch / median), GB/s and TFLOP/s (the bytes and FLOPs a step needs at
    the generation's mean context, over the median step); with ``ceilings``, their shares of the copy bandwidth and
    of the BF16 rate (prefill's too).

    Why the median, not the script's own rates: the JSON's ``decode_tokens_per_s`` and ``decode_gbps`` are totals
    over the summed step times (the mean step), which a few slow steps move (the eager rungs' steps on a busy host
    spread by up to 2x). A table whose ms column is the median and whose rates came from the mean does not let a
    reader get one from the other; here every figure of a row comes from the same median step. ``mean_ms`` keeps
    the other statistic (the script's rates are batch / mean_ms) for rows where the two differ."""
    res = load_results(source)
    rows = []
    for r in res["rows"]:
        median_s = r["decode_ms_per_step"] / 1e3
        row = {"rung": r["rung"], "batch": r["batch"], "prefill_ms": r["prefill_ms"], "prefill_tflops": r["prefill_tflops"],
               "ms_per_step": r["decode_ms_per_step"], "q1_ms": r["decode_ms_q1"], "q3_ms": r["decode_ms_q3"],
               "mean_ms": r["batch"] / r["decode_tokens_per_s"] * 1e3,
               "tokens_per_s": r["batch"] / median_s, "GB_per_step": r["bytes_per_step"] / 1e9,
               "GFLOP_per_step": r["flops_per_step"] / 1e9, "GB_per_s": r["bytes_per_step"] / median_s / 1e9,
               "TFLOP_per_s": r["flops_per_step"] / median_s / 1e12, "check": r["check"]["status"], "setup_s": r["setup_s"],
               "matrix_bytes": r.get("matrix_bytes", 2)}  # the element size bytes_per_step counts (int8: 1)
        if ceilings is not None:
            row["share_of_copy"] = row["GB_per_s"] / ceilings.copy_gbps
            row["share_of_matmul"] = row["TFLOP_per_s"] / ceilings.matmul_tflops
            row["prefill_share_of_matmul"] = r["prefill_tflops"] / ceilings.matmul_tflops
        rows.append(row)
    return pd.DataFrame(rows).set_index(["rung", "batch"])


def processes_table(runs: dict[str, tuple[FoundCapture | str | Path | dict[str, Any], Ceilings]], rung: str = "triton_graph",
                    rivals: Sequence[str] = ("compile_graph", "fused_graph"), batch: int = 1) -> pd.DataFrame:
    """One row per process that ran ``rung`` (``runs``: a label -> its results and the copy measured in its own
    session): its copy, its median step at ``batch``, the GB/s and share of that copy the step streams, and each
    rival's step over ``rung``'s in the same process.

    Why a table of processes: one process's share is a ratio of two measurements, each of which moves between
    processes by its own amount. Put side by side, the rows show which of the two moves, and so what a target's margin
    must be measured against."""
    rows = []
    for label, (source, ceilings) in runs.items():
        t = rows_table(source, ceilings)
        if (rung, batch) not in t.index:
            raise GpuprofError(f"{label}: no {rung} row at batch {batch} in its results "
                               f"(it has {', '.join(f'{r} at {b}' for r, b in t.index)}).")
        row = {"process": label, "copy_gbps": ceilings.copy_gbps, "ms_per_step": t.loc[(rung, batch), "ms_per_step"],
               "GB_per_s": t.loc[(rung, batch), "GB_per_s"], "share_of_copy": t.loc[(rung, batch), "share_of_copy"]}
        for rival in rivals:
            if (rival, batch) in t.index:
                row[f"{rival}_x"] = t.loc[(rival, batch), "ms_per_step"] / row["ms_per_step"]
        rows.append(row)
    if not rows:
        raise ValueError("processes_table needs at least one process's results")
    return pd.DataFrame(rows).set_index("process")


def copy_series_table(source: FoundCapture | str | Path | dict[str, Any]) -> pd.DataFrame:
    """``copy_repeats.json`` (``scripts/capture_ch12.py --only copy_repeats``) as a table: one row per measurement of
    the device copy, with its process (1, 2, ...), its place in that process's series (0 first), the seconds since the
    series began, the GB/s, the measurement's own relative spread, and the NVML readings the series kept after it
    (SM clock, temperature and power; memory clock and clock-event reasons in series made from commit 06fb914 on;
    None where the driver gave none)."""
    data = load_results(source)
    rows = [{"process": i + 1, "order": j, **r} for i, series in enumerate(data["processes"]) for j, r in enumerate(series)]
    if not rows:
        raise GpuprofError("copy_repeats.json holds no measurement.")
    return pd.DataFrame(rows).set_index(["process", "order"])


@dataclass(frozen=True)
class KneeFit:
    """Two straight lines fitted to a sweep's step times against the batch (least squares, each side of a split),
    and where they cross: the measured knee. ``left``/``right``: (intercept ms, slope ms per sequence)."""

    batch: float  # where the two lines cross
    split: tuple[int, int]  # the last batch of the left line, the first of the right one
    left: tuple[float, float]
    right: tuple[float, float]
    sse: float  # the summed squared residuals, ms^2

    def line_ms(self, batch: float) -> float:
        """The fitted step: the left line below the knee, the right one above it."""
        a, b = self.left if batch <= self.batch else self.right
        return a + b * batch


def knee_fit(table: pd.DataFrame, rung: str, column: str = "ms_per_step", min_points: int = 2) -> KneeFit:
    """The measured knee of one rung's sweep: of every split of its batches into a lower and an upper run (each of at
    least ``min_points``), the one whose two least-squares lines of step time against batch leave the smallest summed
    squared residuals, among the splits whose two lines cross between the lower run's last batch and the upper
    run's first (a crossing outside its own split would put a batch on the wrong line); the knee is where those two
    lines cross. It reads the step times only, so it can disagree
    with the roofline's prediction (which :func:`crossover_batch` computes from the arithmetic and two ceilings)."""
    t = table.xs(rung, level="rung").sort_index()
    x, y = t.index.to_numpy(dtype=float), t[column].to_numpy(dtype=float)
    if len(x) < 2 * min_points:
        raise GpuprofError(f"{rung} was measured at {len(x)} batch size(s); a two-line fit needs {2 * min_points} or more.",
                           "Run the script with --batch 1,2,4,... past the expected knee.")
    best: KneeFit | None = None
    for k in range(min_points, len(x) - min_points + 1):
        lines, sse = [], 0.0
        for xs, ys in ((x[:k], y[:k]), (x[k:], y[k:])):
            slope, intercept = np.polyfit(xs, ys, 1)
            lines.append((float(intercept), float(slope)))
            sse += float(((intercept + slope * xs - ys) ** 2).sum())
        (a1, b1), (a2, b2) = lines
        if np.isclose(b1, b2, rtol=1e-6, atol=0.0):  # parallel: no crossing
            continue
        cross = (a1 - a2) / (b2 - b1)
        if not x[k - 1] <= cross <= x[k]:  # the lines must cross between the two runs they were fitted to
            continue
        if best is None or sse < best.sse:
            best = KneeFit(cross, (int(x[k - 1]), int(x[k])), lines[0], lines[1], sse)
    if best is None:
        raise GpuprofError(f"{rung}'s step times give no two lines that cross between the batches they split: no knee.",
                           "Extend the sweep past the turn, or add batches around it.")
    return best


def measured_knee(table: pd.DataFrame, rung: str, cfg: Any, context: int, dtype_bytes: int = 2) -> float | None:
    """The prediction's formula (:func:`crossover_batch`) with the rates one rung achieved: the bandwidth at its
    smallest batch and the FLOP rate at its largest. Not a measurement of where the step turns: the formula depends
    only on the ratio of the two rates (a ridge), so this says how far the achieved ridge is from the ceilings'.
    The knee of the step times themselves is :func:`knee_fit`'s. ``table``: :func:`rows_table`."""
    t = table.xs(rung, level="rung").sort_index()
    if len(t) < 2:
        raise GpuprofError(f"{rung} was measured at {len(t)} batch size(s); the knee needs two or more.",
                           "Run the script with --batch 1,2,4,... .")
    return crossover_batch(cfg, context, float(t["GB_per_s"].iloc[0]), float(t["TFLOP_per_s"].iloc[-1]), dtype_bytes)


def ladder_figure(table: pd.DataFrame, ceilings: Ceilings, sweep: pd.DataFrame | None = None,  # type: ignore[no-untyped-def]
                  marks: dict[str, float] | None = None, roofline: pd.DataFrame | None = None, fit: KneeFit | None = None):
    """Each rung's decode bandwidth as a share of the measured device copy, per batch (bars; hatched, and so labelled,
    for a rung whose matrices are not BF16: its share is of its own bytes, not the BF16 rungs'), and, with ``sweep``
    (:func:`rows_table` of a one-rung batch sweep), that rung's measured step time (median, quartiles as error bars)
    against the batch, with the roofline's step (``roofline``: :func:`prediction_table`'s ``step_ms``) and the two
    lines of ``fit`` (:func:`knee_fit`) over it. ``marks``: batches drawn as vertical lines, by label.

    Why step times and not the two shares (of the copy, of the BF16 rate): their ratio is bytes/FLOPs x ridge, so
    the two share curves cross where the arithmetic's intensity equals the ridge whatever the GPU measured; a
    crossing drawn from them would look like a measurement and be the prediction."""
    import matplotlib.pyplot as plt
    import numpy as np

    panels = 2 if sweep is not None else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.2), squeeze=False)
    ax = axes[0][0]
    rungs = list(dict.fromkeys(table.index.get_level_values("rung")))
    batches = sorted(set(table.index.get_level_values("batch")))
    width = 0.8 / len(batches)
    # a rung whose matrices are not BF16 (int8_graph) is a share of ITS bytes (half as many): hatched and labelled,
    # so that its bar is not read against the BF16 rungs' as the same quantity
    own_bytes = {r: int(table.xs(r, level="rung")["matrix_bytes"].iloc[0]) != 2 if "matrix_bytes" in table else False
                 for r in rungs}
    for j, b in enumerate(batches):
        shares = [float(table.loc[(r, b), "share_of_copy"]) for r in rungs]
        bars = ax.bar(np.arange(len(rungs)) + (j - (len(batches) - 1) / 2) * width, shares, width, label=f"batch {b}")
        for bar, r in zip(bars, rungs):
            if own_bytes[r]:
                bar.set_hatch("//")
    ax.axhline(1.0, color="k", lw=1)
    ax.axhline(0.85, color="grey", ls="--", lw=1, label="issue 40's target (85%)")
    ax.set_xticks(np.arange(len(rungs)), [f"{r}\n(its own bytes)" if own_bytes[r] else r for r in rungs], rotation=20)
    ax.set_ylabel(f"decode GB/s (median step) / device copy ({ceilings.copy_gbps:,.0f} GB/s)")
    ax.set_title(f"the decode ladder on {ceilings.gpu}")
    ax.legend(fontsize=8)
    if sweep is not None:
        bx = axes[0][1]
        rung = sweep.index.get_level_values("rung")[0]
        t = sweep.xs(rung, level="rung").sort_index()
        x = t.index.to_numpy(dtype=float)
        bx.errorbar(x, t["ms_per_step"], yerr=[t["ms_per_step"] - t["q1_ms"], t["q3_ms"] - t["ms_per_step"]],
                    fmt="o", label="measured step (median, quartiles)")
        if roofline is not None:
            bx.plot(roofline.index, roofline["step_ms"], "k-", lw=1, label="the roofline's step (ceilings)")
        if fit is not None:
            xs = np.geomspace(x.min(), x.max(), 200)
            bx.plot(xs, [fit.line_ms(v) for v in xs], color="tab:orange", lw=1, label="two lines fitted")
        for (label, v), style in zip((marks or {}).items(), ("--", ":", "-.")):
            bx.axvline(v, color="grey", ls=style, lw=1, label=f"{label} ({v:.0f})")
        bx.set_xscale("log", base=2)
        bx.set_xlabel("batch (sequences decoded together)")
        bx.set_ylabel("ms per decoding step")
        bx.set_ylim(0, None)
        bx.set_title(f"{rung}: the batch sweep")
        bx.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ----- an Nsight Systems capture of the loop -----

RUNG_RANGE = re.compile(r"^rung_(?P<rung>\w+?)_b(?P<batch>\d+)$")
STEP_RANGE = re.compile(r"^decode_step_(?P<step>\d+)$")
# Kernel launches by the CPU (PyTorch's own kernels, cuBLAS's, Triton's) and graph launches, by name with or without
# the export's entry-point version (cudaLaunchKernel_v7000, cudaGraphLaunch_v10000).
LAUNCH_CALLS = re.compile(r"^(?:cudaLaunchKernel|cudaLaunchKernelExC|cuLaunchKernel|cuLaunchKernelEx)(?:_v\d+)?$")
GRAPH_LAUNCH = re.compile(r"^cudaGraphLaunch(?:_v\d+)?$")
# nsys over the timed generations of one batch (the script calls cudaProfilerStart/Stop around them); each kernel of a
# replayed graph recorded as its own row, so kernels per step count the same way with and without a graph.
CAPTURE_OPTIONS = ["--sample=none", "--cpuctxsw=none", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
                   "--cuda-graph-trace=node"]


def capture_decode(name: str, args: Sequence[str]) -> Any:
    """nsys over the script with ``args`` (give one ``--batch``: the capture holds the first batch's timed
    generations) into ``ch12/<name>.sqlite``; without a GPU or nsys, the course's reference capture."""
    from ..nsys.capture import nsys_capture

    return nsys_capture(CHAPTER, name, SCRIPT, list(args), options=CAPTURE_OPTIONS)


def _rung_steps(ranges: pd.DataFrame, source: str) -> pd.DataFrame:
    """The decoding steps' NVTX ranges of a :func:`capture_decode` export, each with the rung and batch whose
    ``rung_<RUNG>_b<BATCH>`` range holds it (on the same thread) and its step number, in time order; steps outside
    every rung range are left out. One place for the containment rule the readers below share."""
    text = ranges["text"].astype(str)
    rungs, steps = ranges[text.str.match(RUNG_RANGE)], ranges[text.str.match(STEP_RANGE)]
    if rungs.empty or steps.empty:
        raise GpuprofError(f"{source} holds no rung_<RUNG>_b<BATCH> range with decode_step_N ranges inside.",
                           "Capture llm_decode.py with --capture-range=cudaProfilerApi (its timed generations).")
    parts = []
    for r in rungs.sort_values("start").itertuples():
        m = RUNG_RANGE.match(r.text)
        inner = steps[(steps["start"] >= r.start) & (steps["end"] <= r.end) & (steps["globalTid"] == r.globalTid)]
        parts.append(inner.sort_values("start").assign(rung=m["rung"], batch=int(m["batch"]),
                                                       step=inner["text"].str.extract(STEP_RANGE)["step"].astype(int)))
    return pd.concat(parts)


def trim_decode_capture(path: str | Path, keep_last: dict[str, int] | None = None) -> str:
    """Cut an uncompressed export of :func:`capture_decode` down to a course reference: per rung, its last
    ``keep_last[rung]`` decoding steps (every step of a rung not named; their NVTX ranges, the CUDA calls made inside
    them and the GPU work those launched), the earlier steps' ranges and the prefill's and warm-up's work deleted, the
    tables no reader here uses dropped, the environment scrubbed. Why: the naive loop's 32 steps alone are 48,000
    kernels and as many launch calls, most of a 3.4 MB export; :func:`capture_summary` reads per step, so fewer of its
    steps say the same, while a graph rung's steps cost few rows and all of them show when the CPU, run ahead, starts
    waiting for the GPU. Default: ``{"eager_dynamic": 8}``. Returns the sentence for the provenance."""
    import sqlite3
    from contextlib import closing

    from ..nsys import export_edit as ee

    keep_last = {"eager_dynamic": 8} if keep_last is None else keep_last
    path = Path(path)
    ranges = ns.nvtx_ranges(path)
    steps = ranges[ranges["text"].astype(str).str.match(STEP_RANGE)]
    said, keep = [], []
    for rung, g in _rung_steps(ranges, path.name).groupby("rung", sort=False):
        n = keep_last.get(rung, len(g))
        keep.append(g.sort_values("step").tail(n))
        said.append(f"{rung} {min(n, len(g))} of {len(g)}")
    kept = pd.concat(keep)
    drop = steps.drop(index=kept.index)
    notes = [ee.trim_reference(path, drop_tables=("CUPTI_ACTIVITY_KIND_CUDA_EVENT", "PROFILER_OVERHEAD",
                                                 "DIAGNOSTIC_EVENT", "CUDA_GRAPH_NODE_EVENTS")),
             ee.keep_launched_in(path, list(zip(kept["start"], kept["end"])))]
    with closing(sqlite3.connect(path)) as conn:
        conn.executemany("DELETE FROM NVTX_EVENTS WHERE start = ? AND globalTid = ?",
                         [(int(a), int(t)) for a, t in zip(drop["start"], drop["globalTid"])])
        conn.commit()
        conn.execute("VACUUM")
    ee.scrub_environment(path)
    return ("the last decoding steps of each rung kept (" + ", ".join(said) + "; the earlier steps' ranges "
            "deleted); " + "; ".join(n for n in notes if n))


def decode_steps(path: str | Path) -> pd.DataFrame:
    """One row per decoding step of each rung in the capture: rung, batch, step, cpu_ms (the step's NVTX range: the
    CPU's time to issue it), api_ms (CUDA API calls inside it), launch_calls (kernel launches by the CPU),
    graph_launches, kernels (launched inside it, graph nodes included), gpu_ms (their busy time), and the range's
    and the kernels' first start and last end (ns)."""
    ranges = ns.nvtx_ranges(path)
    runtime = ns.runtime_calls(path)
    kernels = ns.kernels(path, launch=False)
    if ranges.empty:
        raise GpuprofError(f"{Path(path).name} holds no NVTX ranges.", "Capture with --trace=cuda,nvtx.")
    in_rungs = _rung_steps(ranges, Path(path).name)
    steps = ranges[ranges["text"].str.match(STEP_RANGE)]
    runtime = runtime.assign(launch=runtime["name"].str.match(LAUNCH_CALLS),
                             graph=runtime["name"].str.match(GRAPH_LAUNCH))
    hits = ta.attribute_kernels(kernels, runtime, steps, rule="thread")
    by_step = {k: g for k, g in hits.groupby("range_start", sort=False)}
    rows = []
    for s in in_rungs.itertuples():
        calls = ta.inside(runtime[runtime["globalTid"] == s.globalTid], (int(s.start), int(s.end)))
        mine = by_step.get(s.start)
        busy, k_start, k_end = 0.0, np.nan, np.nan
        if mine is not None and len(mine):
            a, b = ta.merge_intervals(mine["start"].to_numpy(), mine["end"].to_numpy())
            busy, k_start, k_end = float((b - a).sum()), float(mine["start"].min()), float(mine["end"].max())
        rows.append({"rung": s.rung, "batch": s.batch, "step": s.step,
                     "cpu_ms": (s.end - s.start) / 1e6, "api_ms": float((calls["end"] - calls["start"]).sum()) / 1e6,
                     "launch_calls": int(calls["launch"].sum()), "graph_launches": int(calls["graph"].sum()),
                     "kernels": 0 if mine is None else len(mine), "gpu_ms": busy / 1e6,
                     "range_start": int(s.start), "range_end": int(s.end), "kernel_start": k_start, "kernel_end": k_end})
    return pd.DataFrame(rows)


def step_kernel_times(path: str | Path, rung: str, step: int, batch: int = 1) -> pd.DataFrame:
    """The kernels of one decoding step of ``rung`` as they ran, from a :func:`capture_decode` export (a graph's kernels
    traced one by one, ``--cuda-graph-trace=node``): ``kernel`` (its name), ``start``, ``end`` (ns) and ``time_us``, in
    the order they started. They are the kernels launched by the CUDA calls inside the step's NVTX range, on its
    thread, wherever they ran (a graph's run long after its launch). Why: Nsight Compute times each kernel alone
    (replayed, caches flushed), which stretches small kernels more than large ones; these are the same kernels at the
    pace they kept in the loop, for the time shares (:func:`in_situ`)."""
    steps = _rung_steps(ns.nvtx_ranges(path), Path(path).name)
    inner = steps[(steps["rung"] == rung) & (steps["batch"] == batch) & (steps["step"] == step)]
    if inner.empty:
        raise GpuprofError(f"{Path(path).name} holds no decode_step_{step} inside rung_{rung}_b{batch} (a trimmed "
                           "reference keeps only some steps, and only the rungs captured).",
                           "Pick a rung and step the capture kept (decode_steps lists them).")
    s = inner.iloc[0]
    runtime = ns.runtime_calls(path)
    calls = runtime[(runtime["globalTid"] == s.globalTid) & (runtime["start"] >= s.start) & (runtime["start"] <= s.end)]
    k = ns.kernels(path, launch=False)
    k = k[k["correlationId"].isin(calls["correlationId"])].sort_values("start")
    return pd.DataFrame({"kernel": k["name"].to_numpy(), "start": k["start"].to_numpy(), "end": k["end"].to_numpy(),
                         "time_us": (k["end"] - k["start"]).to_numpy() / 1e3})


def in_situ(kernels: pd.DataFrame, times: pd.DataFrame) -> pd.DataFrame:
    """``kernels`` (:func:`decode_kernels.step_kernels`, from Nsight Compute) with each kernel's time replaced by its
    time as it ran (:func:`step_kernel_times`) and its read bandwidth recomputed; the bytes stay ncu's (nsys counts
    none). The two must be the same kernels in the same order (the same code, the same step's work): refused with a
    sentence otherwise."""
    if len(kernels) != len(times) or list(kernels["kernel"]) != list(times["kernel"]):
        first = next((i for i, (a, b) in enumerate(zip(kernels["kernel"], times["kernel"])) if a != b),
                     min(len(kernels), len(times)))
        raise GpuprofError(f"The two steps differ: {len(kernels)} kernels profiled, {len(times)} traced, first different "
                           f"at position {first}.", "Compare one rung's step with the same rung's step.")
    out = kernels.copy()
    out["time_us"] = times["time_us"].to_numpy()
    out["read_GBps"] = out["read_MB"] * 1e6 / (out["time_us"] * 1e3)
    return out


def capture_summary(path: str | Path, busy_threshold: float = 0.9) -> pd.DataFrame:
    """Per (rung, batch) of a capture: decoding steps, kernels and CPU launch calls per step, the CPU's ms per step
    (median of the steps' NVTX ranges) and its CUDA API ms per step, the step's period on the GPU (first decode
    kernel's start to the last one's end, over the steps), the GPU's busy ms per step and busy share over that
    span, and the bound the capture names:

    * ``GPU``: busy for at least ``busy_threshold`` of the span (the kernels themselves set the pace);
    * ``CPU``: idle for more than that, while the CPU's time to issue a step is at least ``busy_threshold`` of the
      step's period (the GPU waits for launches);
    * ``neither``: idle, with the CPU not the reason (a synchronisation, a copy: look at the timeline).
    """
    steps = decode_steps(path)
    rows = []
    for (rung, batch), g in steps.groupby(["rung", "batch"], sort=False):
        span = float(g["kernel_end"].max() - g["kernel_start"].min()) / 1e6
        n = len(g)
        period = span / n if n else float("nan")
        busy = float(g["gpu_ms"].sum())
        cpu = float(g["cpu_ms"].median())
        share = busy / span if span > 0 else float("nan")
        bound = "GPU" if share >= busy_threshold else ("CPU" if cpu >= busy_threshold * period else "neither")
        rows.append({"rung": rung, "batch": batch, "steps": n, "kernels_per_step": g["kernels"].mean(),
                     "launch_calls_per_step": g["launch_calls"].mean(), "graph_launches_per_step": g["graph_launches"].mean(),
                     "cpu_ms_per_step": cpu, "api_ms_per_step": float(g["api_ms"].median()), "gpu_period_ms": period,
                     "gpu_busy_ms_per_step": busy / n, "busy_share": share, "bound": bound})
    return pd.DataFrame(rows).set_index(["rung", "batch"])
