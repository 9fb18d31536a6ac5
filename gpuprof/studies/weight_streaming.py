"""The weight-streaming chapter's measurements: the design's target table from a capture, and its report.

The weight-streaming design that chapter 3 builds (see the book's references) judges a
streaming system by five targets: GPU utilisation above 85%, memory-bandwidth
utilisation above 80%, PCIe utilisation between 50% and 70%, copy/compute overlap above
60%, "synchronisation wait" below 10%. :func:`pass_metrics` measures each one that a CUDA
trace can measure over one pass of a capture, and says which cannot be measured from a
trace (device-memory bandwidth needs GPU metrics or Nsight Compute) instead of inventing
a number. The design's report template is then filled from measured values only.

The design's "synchronisation wait" is the share of the pass in which a weight copy runs
and no kernel does: no CPU waits in it, so it is named here for what it measures,
**exposed copy time** (compute waiting for weights). The CPU's own waits are the separate
``CPU in *Synchronize`` row.

The PCIe target is a band (50-70%) because the design keeps headroom for other traffic on
the link; for a step that is transfer-bound (a decoding step here) a saturated link is the
best it can do, so a "miss" above 70% is a fact about the workload, not a fault.

A verdict against a threshold is only as firm as the distance from it: each
:class:`Metric` carries its margin, and :func:`metrics_matrix` can leave verdicts out
where a chapter compares outputs between runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .. import activity as ta
from ..nsys import sqlite as ns
from ..timing import Timing

__all__ = ["Metric", "pass_metrics", "format_metrics", "recommendations", "fill_report", "pass_windows", "label_streams",
           "weight_copy_gbps", "StreamingTimings", "streaming_timings", "metrics_matrix", "TARGETS", "CopyStreamPattern",
           "copy_stream_pattern", "IdleSplit", "idle_split", "cpu_queue", "layer_compute", "weight_copy_readiness", "CompetingCopies",
           "competing_copies", "pass_spread"]

# The design's targets: (low, high) bounds on a fraction; None where a side is open.
TARGETS = {
    "GPU utilisation": (0.85, None),
    "memory bandwidth utilisation": (0.80, None),
    "PCIe utilisation": (0.50, 0.70),
    "overlap efficiency": (0.60, None),
    "exposed copy time": (None, 0.10),
}


@dataclass(frozen=True)
class Metric:
    name: str
    value: float | None  # a fraction (0..1), or None when a trace cannot measure it
    target: str
    met: bool | None
    how: str

    def shown(self) -> str:
        return "not measurable from a trace" if self.value is None else f"{self.value:.1%}"

    @property
    def margin(self) -> float | None:
        """Distance to the nearest target bound, as a fraction: positive inside the target, negative outside."""
        bounds = TARGETS.get(self.name)
        if self.value is None or bounds is None:
            return None
        low, high = bounds
        sides = [self.value - low] if low is not None else []
        sides += [high - self.value] if high is not None else []
        return min(sides)

    def verdict(self) -> str:
        """The value against its target with the distance in points: '5.7% against < 10%: met by 4.3 points'."""
        if self.margin is None:
            return f"{self.shown()} ({self.target})"
        word = "met" if self.margin >= 0 else "missed"
        return f"{self.shown()} against {self.target}: {word} by {abs(self.margin) * 100:.1f} points"


def pass_metrics(path: str | Path, window: tuple[int, int], pinned_peak_gbps: float) -> list[Metric]:
    """The design's five metrics over ``window`` (ns) of the capture at ``path``, plus the CPU's share in
    ``*Synchronize`` calls for information."""
    lo, hi = window
    kernels = ta.inside(ns.kernels(path), window)
    copies = ta.inside(ns.memcpy(path), window)
    runtime = ta.inside(ns.runtime_calls(path), window)
    seconds = (hi - lo) / 1e9
    gpu_util = ta.busy_fraction(kernels, window) if not kernels.empty else 0.0
    h2d = copies[copies["kind"] == "Host-to-Device"] if not copies.empty else copies
    pcie = float(h2d["bytes"].sum()) / seconds / 1e9 / pinned_peak_gbps if seconds > 0 else 0.0
    overlap = ta.copy_compute_overlap(h2d, kernels) if not h2d.empty else 0.0
    wait = ta.exposed_copy_fraction(h2d, kernels, window) if not h2d.empty else 0.0
    cpu_sync = ta.sync_wait_share(runtime, window) if not runtime.empty else 0.0
    return [
        Metric("GPU utilisation", gpu_util, "> 85%", gpu_util > 0.85, "share of the window with a kernel running"),
        Metric("memory bandwidth utilisation", None, "> 80%", None,
               "needs device-memory counters: nsys --gpu-metrics-devices or Nsight Compute"),
        Metric("PCIe utilisation", pcie, "50-70%", 0.5 <= pcie <= 0.7,
               f"H2D bytes per second over the pinned H2D peak ({pinned_peak_gbps:.1f} GB/s)"),
        Metric("overlap efficiency", overlap, "> 60%", overlap > 0.6, "share of H2D copy time with a kernel running"),
        Metric("exposed copy time", wait, "< 10%", wait < 0.1,
               "share of the window with a weight copy running and no kernel: compute waiting for its weights "
               "(the design's 'synchronisation wait')"),
        Metric("CPU in *Synchronize (information)", cpu_sync, "-", None,
               "high is healthy when the CPU runs ahead and waits for the GPU at the end of a step"),
    ]


def format_metrics(metrics: list[Metric]) -> str:
    lines = [f"{'metric':<36}{'measured':>28}  {'target':<8} verdict"]
    for m in metrics:
        verdict = "-" if m.met is None else ("met" if m.met else "MISSED")
        lines.append(f"{m.name:<36}{m.shown():>28}  {m.target:<8} {verdict}")
    return "\n".join(lines)


def recommendations(metrics: list[Metric]) -> list[str]:
    """Rules from the three problems the design diagnoses, applied to measured values only."""
    by = {m.name: m for m in metrics}
    overlap, pcie, gpu = by["overlap efficiency"].value, by["PCIe utilisation"].value, by["GPU utilisation"].value
    wait = by["exposed copy time"].value
    transfer_bound = gpu is not None and pcie is not None and gpu < 0.85 and pcie > 0.7
    out = []
    if transfer_bound:
        out.append("Transfer-bound: the link is busy but the GPU waits; the compute per layer cannot hide its weights. "
                   "Process more tokens per pass (larger batch or prompt), keep some layers resident, or move fewer "
                   "bytes (lower-precision weights). If other copies share the link, move them out of the step.")
    elif overlap is not None and overlap < 0.6:
        out.append("Copies and compute are serialised: give the copy stream at least one spare buffer "
                   "(max_cached_layers >= prefetch_distance + 1), and raise prefetch_distance if the CPU waits for the "
                   "GPU inside the pass (a host read), so that the next layers' copies are queued before it waits.")
    elif wait is not None and wait >= 0.1:
        out.append("Compute still waits for weights although copies overlap: the copies start too late or are too slow; "
                   "prefetch further ahead, or reduce the bytes per layer.")
    if pcie is not None and pcie > 0.7 and not transfer_bound:
        out.append("The link has little headroom: any other host-to-device traffic during the step will delay the weights.")
    if pcie is not None and pcie < 0.5 and overlap is not None and overlap >= 0.6:
        out.append("The link is mostly idle and copies are hidden: the system is compute-bound; streaming costs little.")
    if not out:
        missed = [f"{m.name} ({m.shown()}, target {m.target})" for m in metrics if m.met is False]
        out.append("All measurable targets are met." if not missed else "No rule applies to what is missed: " + "; ".join(missed) + ".")
    return out


def fill_report(model: dict, device: str, streaming: dict, metrics: list[Metric], step_ms: float,
                step_label: str = "mean step latency") -> str:
    """The design's report template, every value taken from the arguments (measured, not typed)."""
    by = {m.name: m for m in metrics}
    lines = [
        "Weight-streaming performance report",
        "=" * 35,
        "",
        "Configuration:",
        "- model: " + ", ".join(f"{k}={v}" for k, v in model.items()),
        f"- device: {device}",
        "- streaming: " + ", ".join(f"{k}={v}" for k, v in streaming.items()),
        "",
        "Key metrics:",
        f"- GPU utilisation: {by['GPU utilisation'].shown()}",
        f"- memory bandwidth utilisation: {by['memory bandwidth utilisation'].shown()}",
        f"- PCIe utilisation: {by['PCIe utilisation'].shown()}",
        f"- overlap efficiency: {by['overlap efficiency'].shown()}",
        f"- exposed copy time (compute waiting for weights): {by['exposed copy time'].shown()}",
        f"- {step_label}: {step_ms:.2f} ms",
        "",
        "Recommendations:",
    ]
    lines += [f"{i}. {r}" for i, r in enumerate(recommendations(metrics), 1)]
    return "\n".join(lines)


# --- Reading the weight-streaming example's captures and results -------------------------


def pass_windows(path: str | Path) -> dict[str, dict[str, tuple[int, int]]]:
    """{run: {pass: (start, end)}} for every ``mode_<run>`` range of a weight_streaming.py capture,
    with its ``prefill`` and ``decode_N`` ranges (the GPU work of a pass ends inside its range)."""
    ranges = ns.nvtx_ranges(path)
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for r in ranges[ranges["text"].str.startswith("mode_")].sort_values("start").itertuples():
        inner = ranges[(ranges["start"] >= r.start) & (ranges["end"] <= r.end)
                       & ranges["text"].str.match(r"^(prefill|decode_\d+|transfer_pass_\d+)$")]
        out[r.text.removeprefix("mode_")] = {p.text: (int(p.start), int(p.end)) for p in inner.itertuples()}
    return out


def label_streams(path: str | Path, window: tuple[int, int], layer_bytes: int) -> dict[int, str]:
    """Name the CUDA streams seen in ``window`` by what they carried: kernels (compute), copies of
    exactly one layer's weights (weight_h2d), or other host-to-device copies."""
    kernels = ta.inside(ns.kernels(path), window)
    copies = ta.inside(ns.memcpy(path), window)
    h2d = copies[copies["kind"] == "Host-to-Device"] if not copies.empty else copies
    labels = {}
    for s in sorted(set(kernels["streamId"]) | set(h2d["streamId"])):
        has_kernels = bool((kernels["streamId"] == s).any())
        mine = h2d[h2d["streamId"] == s]
        weights = bool((mine["bytes"] == layer_bytes).any())
        if has_kernels:
            labels[int(s)] = "compute + weight copies" if weights else "compute"
        else:
            labels[int(s)] = "weight_h2d (copies)" if weights else "other H2D traffic"
    return labels


def weight_copy_gbps(path: str | Path, window: tuple[int, int], layer_bytes: int) -> float:
    """Median GPU-side rate of the weight copies (those of exactly one layer's bytes) in ``window``."""
    copies = ta.inside(ns.memcpy(path), window)
    mine = copies[copies["bytes"] == layer_bytes] if not copies.empty else copies
    return float(mine["gbps"].median()) if not mine.empty else float("nan")


@dataclass(frozen=True)
class StreamingTimings:
    """The unprofiled timings of one weight_streaming.py --mode all run, and what they imply."""

    compute_ms: float     # resident prefill: the compute-only bound
    transfer_ms: float    # median copy-only pass: the PCIe bound
    sync_ms: float        # copies then compute, one stream
    prefetch_ms: float    # copies on weight_h2d ahead of compute
    copy_gbps: float      # weight bytes per copy-only pass time
    peak_gbps: float      # pinned H2D peak, same process

    @property
    def hidden(self) -> float:
        """Share of the transfer time that does not show in the step: 1 - (prefetch - compute) / transfer."""
        return 1 - (self.prefetch_ms - self.compute_ms) / self.transfer_ms

    @property
    def bound_ratio(self) -> float:
        """Prefetch step time over the larger of the two bounds (1.0 is perfect overlap)."""
        return self.prefetch_ms / max(self.compute_ms, self.transfer_ms)

    @property
    def gain(self) -> float:
        return self.sync_ms / self.prefetch_ms


def streaming_timings(results: dict, phase: str = "prefill") -> StreamingTimings:
    """Read ``phase`` ("prefill" or "decode": the median decoding step) from weight_streaming.py's JSON."""
    import statistics

    def step(name: str) -> float:
        r = results[name]
        return float(r["prefill_ms"]) if phase == "prefill" else float(statistics.median(r["decode_ms"]))

    return StreamingTimings(step("resident"), float(statistics.median(results["transfer_only"]["pass_ms"])),
                            step("sync"), step("prefetch"), float(results["transfer_only"]["weight_copy_gbps"]),
                            float(results["pinned_h2d_peak_gbps"]))


def pass_spread(samples: list[float] | float) -> tuple[int, float, float]:
    """(passes, Q1, Q3) of a run's pass times in ms. weight_streaming.py keeps every prefill in
    ``prefill_runs_ms`` (``--repeats``); a JSON from one pass per run gives (1, x, x): one sample,
    no spread to judge a difference by."""
    values = [float(samples)] if isinstance(samples, (int, float)) else [float(v) for v in samples]
    lo, hi = Timing(tuple(values), "perf_counter", 0).iqr
    return len(values), lo, hi


def metrics_matrix(columns: dict[str, list[Metric]], *, verdicts: bool = True) -> str:
    """Several runs' metrics side by side: one row per metric, one column per run.

    With ``verdicts`` each value is followed by its verdict against the design's target
    (ok / MISS; nothing where there is no target). A verdict on a value within run-to-run
    noise of its threshold flips between runs; pass ``verdicts=False`` where the output
    must not depend on the run, and state margins with :meth:`Metric.verdict` instead.
    """
    names = [m.name for m in next(iter(columns.values()))]
    width = max(14, *(len(c) + 1 for c in columns))
    lines = [f"{'metric':<34}{'target':<8}" + "".join(f"{c:>{width}}" for c in columns)]
    for i, name in enumerate(names):
        cells = []
        for metrics in columns.values():
            m = metrics[i]
            if m.value is None:
                cells.append(f"{'n/a':>{width}}")
                continue
            mark = "" if (m.met is None or not verdicts) else (" ok" if m.met else " MISS")
            cells.append(f"{f'{m.value:.1%}{mark}':>{width}}")
        lines.append(f"{name[:33]:<34}{metrics[i].target:<8}" + "".join(cells))
    return "\n".join(lines)


# --- Where a pass's time goes: the copy stream, the GPU's idle time, competing copies -------------


@dataclass(frozen=True)
class CopyStreamPattern:
    """What the weight stream did over a pass: how busy it was and at what rhythm."""

    copies: int
    busy_ns: int          # union of the weight copies' intervals inside the window
    window_ns: int
    burst: int            # copies at the start that ran back to back (the buffers were free)
    burst_end_ns: int     # from the window's start
    period_ns: float      # median start-to-start after the burst: the rhythm the compute sets
    last_end_ns: int      # from the window's start

    @property
    def busy(self) -> float:
        return self.busy_ns / self.window_ns if self.window_ns else 0.0


def copy_stream_pattern(path: str | Path, window: tuple[int, int], layer_bytes: int,
                        back_to_back_ns: int = 100_000) -> CopyStreamPattern:
    """The weight copies (exactly one layer's bytes) in ``window``: busy share, the first burst, then the period.

    Once the compute has a few layers' buffers queued, a copy can only start when the compute
    frees a buffer, so after the first burst the copies run at the compute's pace: a copy
    stream that is busy all the time would mean the copies, not the compute, set the pace.
    Copies less than ``back_to_back_ns`` apart count as back to back.
    """
    lo, hi = window
    copies = ta.inside(ns.memcpy(path), window)
    mine = copies[copies["bytes"] == layer_bytes].sort_values("start") if not copies.empty else copies
    if mine.empty:
        return CopyStreamPattern(0, 0, hi - lo, 0, 0, float("nan"), 0)
    starts, ends = mine["start"].to_numpy(), mine["end"].to_numpy()
    busy = round(ta.busy_fraction(mine, window) * (hi - lo))
    apart = starts[1:] - ends[:-1] > back_to_back_ns
    burst = int(np.argmax(apart)) + 1 if apart.any() else len(mine)
    after = starts[burst - 1:]
    period = float(np.median(np.diff(after))) if len(after) > 1 else float("nan")
    return CopyStreamPattern(len(mine), busy, hi - lo, burst, int(ends[burst - 1] - lo), period, int(ends.max() - lo))


@dataclass(frozen=True)
class IdleSplit:
    """Where the GPU ran no kernel during a pass (ns): before the first kernel, in the gaps between
    kernels, after the last one. The parts add up to the pass minus its kernels' busy time."""

    window_ns: int
    kernels_ns: int         # union of the kernels' intervals
    before_first_ns: int    # the first layer's copy, which nothing can run under, and the first launch
    first_copy_ns: int      # the first weight copy's own duration
    gaps: int               # gaps between kernels
    gaps_ns: int
    longest_gap_ns: int
    gaps_under_copy_ns: int  # the part of those gaps during which a weight copy was running
    long_gaps: int          # gaps longer than ``long_gap_ns``: the GPU had run out of queued work
    long_gaps_ns: int
    after_last_ns: int      # until the pass's range ends (the CPU returning from its wait)


def idle_split(path: str | Path, window: tuple[int, int], layer_bytes: int, long_gap_ns: int = 50_000) -> IdleSplit:
    """Split the GPU's idle time in ``window`` into before the first kernel, between kernels, after the last.

    A gap between kernels during which a weight copy runs counts as exposed copy time in
    :func:`pass_metrics`, but a launch gap of a few microseconds that happens to fall during a
    copy is not the compute waiting for weights: a wait for a copy of a whole layer lasts
    until the copy ends. The longest gap says which of the two a pass had. Gaps longer than
    ``long_gap_ns`` are counted apart: a kernel's launch takes microseconds, so a longer gap
    means the GPU had nothing queued (the CPU was behind, or the stream waited for an event).
    """
    lo, hi = window
    kernels = ta.inside(ns.kernels(path, launch=False, only=("streamId",)), window)
    copies = ta.inside(ns.memcpy(path), window)
    weights = copies[copies["bytes"] == layer_bytes].sort_values("start") if not copies.empty else copies
    first_copy = int(weights["duration_ns"].iloc[0]) if not weights.empty else 0
    if kernels.empty:
        return IdleSplit(hi - lo, 0, hi - lo, first_copy, 0, 0, 0, 0, 0, 0, 0)
    ks, ke = ta.merge_intervals(kernels["start"].to_numpy(), kernels["end"].to_numpy())
    gs, ge = ke[:-1], ks[1:]
    under = ta.overlap_ns(pd.DataFrame({"start": gs, "end": ge}), weights)
    gap = ge - gs
    long = gap > long_gap_ns
    return IdleSplit(hi - lo, int((ke - ks).sum()), int(ks[0] - lo), first_copy, len(gs), int(gap.sum()),
                     int(gap.max()) if len(gs) else 0, int(under), int(long.sum()), int(gap[long].sum()), int(hi - ke[-1]))


def cpu_queue(path: str | Path, window: tuple[int, int]) -> tuple[int, float]:
    """How long the CPU took to queue a pass (ns from the window's start to the end of its last
    ``layer_<i>_ffn`` range) and the median duration of its ``cudaLaunchKernel`` calls (ns).

    Under a tracer each CUDA call costs more; where the GPU is faster than the CPU's loop (a
    decoding step, or a pass the tracer slows more), that cost becomes the step's time.
    """
    lo, hi = window
    ranges = ns.nvtx_ranges(path)
    layers = ranges[(ranges["start"] >= lo) & (ranges["end"] <= hi) & ranges["text"].str.match(r"^layer_\d+_ffn$")]
    calls = ta.inside(ns.runtime_calls(path), window)
    launches = calls[calls["name"].map(ta.api_name) == "cudaLaunchKernel"]
    queued = int(layers["end"].max() - lo) if not layers.empty else 0
    return queued, float((launches["end"] - launches["start"]).median()) if not launches.empty else float("nan")


def layer_compute(path: str | Path, window: tuple[int, int]) -> pd.DataFrame:
    """Per layer: the first kernel's start and the last kernel's end of the kernels launched inside its
    ``layer_<i>_attention`` and ``layer_<i>_ffn`` ranges in ``window`` (the CPU call that launched each
    lies inside the range; the kernel runs later)."""
    ranges = ns.nvtx_ranges(path)
    lo, hi = window
    ranges = ranges[(ranges["start"] >= lo) & (ranges["end"] <= hi) & ranges["text"].str.match(r"^layer_\d+_(attention|ffn)$")]
    work = ta.attribute_kernels(ns.kernels(path, launch=False, only=("streamId", "correlationId")),
                                ns.runtime_calls(path), ranges, rule="thread")
    if work.empty:
        return pd.DataFrame(columns=["first_start", "last_end"])
    work["layer"] = work["range_text"].str.extract(r"^layer_(\d+)_", expand=False).astype(int)
    return work.groupby("layer").agg(first_start=("start", "min"), last_end=("end", "max"))


def weight_copy_readiness(path: str | Path, window: tuple[int, int], layer_bytes: int, cached_layers: int) -> pd.DataFrame:
    """The weight copies issued in ``window``, in issue order, with the time each could first run.

    A weight copy may run once (1) the CPU has issued it (``issued``), (2) the copy before it on
    its stream has ended (``after_previous``: one stream runs in order), and (3) the compute that
    last used its GPU buffer has ended (``buffer_free``: the event the copy stream waits for).
    The streamer fills its ``cached_layers`` buffers round robin in issue order
    (``Streamer._fetch``), so copy *k* of a pass reuses the buffer of copy *k - cached_layers*;
    the first ``cached_layers`` copies of a pass find their buffers free. Valid for the first
    pass of a run (the prefill), whose streamer is new. ``ready`` is the latest of the three.
    """
    lo, hi = window
    runtime = ns.runtime_calls(path)
    copies = ns.memcpy(path)
    weights = ta.issue_order(copies[copies["bytes"] == layer_bytes], runtime)
    weights = weights[(weights["issued"] >= lo) & (weights["issued"] < hi)].sort_values("issued", ignore_index=True)
    ranges = ns.nvtx_ranges(path)
    fetch = ranges[(ranges["start"] >= lo) & (ranges["end"] <= hi) & ranges["text"].str.match(r"^h2d_transfer_layer_\d+$")]
    fetch = fetch.sort_values("start", ignore_index=True)
    at = np.searchsorted(fetch["start"].to_numpy(), weights["issued"].to_numpy(), side="right") - 1
    weights["layer"] = fetch["text"].str.extract(r"(\d+)$", expand=False).astype(int).to_numpy()[at]
    ends = layer_compute(path, window)["last_end"]
    reused = weights["layer"].shift(cached_layers)
    weights["buffer_free"] = [float(ends.get(int(layer), np.nan)) if not np.isnan(layer) else np.nan for layer in reused]
    weights["after_previous"] = weights["end"].shift(1)
    weights["ready"] = weights[["issued", "after_previous", "buffer_free"]].max(axis=1)
    return weights[["layer", "streamId", "issued", "after_previous", "buffer_free", "ready", "start", "end"]]


@dataclass(frozen=True)
class CompetingCopies:
    """Weight copies and other host-to-device copies in one pass: the order the copy engine served them in."""

    order: ta.ServiceOrder      # every H2D copy of the pass, in runs by stream
    weights: pd.DataFrame       # weight_copy_readiness
    weight_stream: int
    switches: pd.DataFrame      # at, left, to, left_next_ready: when the stream left could next have run a copy
    other_starts: np.ndarray    # start of every copy on the other streams

    @property
    def switches_left_idle(self) -> int:
        """Switches at which the stream left had no copy it could run (nothing queued, or waiting for a buffer)."""
        ready, at = self.switches["left_next_ready"], self.switches["at"]
        return int((ready.isna() | (ready > at)).sum())

    def longest_wait(self) -> pd.Series:
        """The weight copy that waited longest from when it could run to when it ran, with ``wait`` (ns) and
        ``others_meanwhile``: how many copies of the other streams started in that time."""
        w = self.weights.assign(wait=self.weights["start"] - self.weights["ready"])
        row = w.loc[w["wait"].idxmax()].copy()
        row["others_meanwhile"] = int(((self.other_starts >= row["ready"]) & (self.other_starts < row["start"])).sum())
        return row


def competing_copies(path: str | Path, window: tuple[int, int], layer_bytes: int, cached_layers: int) -> CompetingCopies:
    """Read one pass of a run with ``--competing-h2d-mib``: every H2D copy's issue and run times, the
    runs by stream, and at each switch between streams when the stream left could have gone on."""
    copies = ta.inside(ns.memcpy(path), window)
    h2d = copies[copies["kind"] == "Host-to-Device"] if not copies.empty else copies
    order = ta.issue_order(h2d, ns.runtime_calls(path))
    served = ta.service_order(order)
    weights = weight_copy_readiness(path, window, layer_bytes, cached_layers)
    weight_stream = int(weights["streamId"].mode().iloc[0])
    runs = served.runs
    rows = []
    for k in range(len(runs) - 1):
        run, nxt = runs.iloc[k], runs.iloc[k + 1]
        if int(run["streamId"]) == weight_stream:
            later = weights[weights["start"] > run["end"]]
            ready = float(later["ready"].iloc[0]) if not later.empty else np.nan
        else:  # no event waits on these copies: a queued one could run at once
            ready = np.nan if np.isnan(run["next_issued"]) else float(max(run["next_issued"], run["end"]))
        rows.append({"at": int(run["end"]), "left": int(run["streamId"]), "to": int(nxt["streamId"]), "left_next_ready": ready})
    return CompetingCopies(served, weights, weight_stream, pd.DataFrame(rows, columns=["at", "left", "to", "left_next_ready"]),
                           order.loc[order["streamId"] != weight_stream, "start"].to_numpy())
