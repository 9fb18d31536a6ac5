"""The weight-streaming chapter's measurements: the design's target table from a capture, and its report.

The weight-streaming design that chapter 3 builds (see the book's references) judges a
streaming system by five targets: GPU utilisation above 85%, memory-bandwidth
utilisation above 80%, PCIe utilisation between 50% and 70%, copy/compute overlap above
60%, synchronisation wait below 10%. :func:`pass_metrics` measures each one that a CUDA
trace can measure over one pass of a capture, and says which cannot be measured from a
trace (device-memory bandwidth needs GPU metrics or Nsight Compute) instead of inventing
a number. The design's report template is then filled from measured values only.

A verdict against a threshold is only as firm as the distance from it: each
:class:`Metric` carries its margin, and :func:`metrics_matrix` can leave verdicts out
where a chapter compares outputs between runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import activity as ta
from ..nsys import sqlite as ns

__all__ = ["Metric", "pass_metrics", "format_metrics", "recommendations", "fill_report", "pass_windows", "label_streams",
           "weight_copy_gbps", "StreamingTimings", "streaming_timings", "metrics_matrix", "TARGETS"]

# The design's targets: (low, high) bounds on a fraction; None where a side is open.
TARGETS = {
    "GPU utilisation": (0.85, None),
    "memory bandwidth utilisation": (0.80, None),
    "PCIe utilisation": (0.50, 0.70),
    "overlap efficiency": (0.60, None),
    "synchronisation wait": (None, 0.10),
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
        Metric("synchronisation wait", wait, "< 10%", wait < 0.1,
               "share of the window with a weight copy running and no kernel: compute waiting for its weights"),
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
    wait = by["synchronisation wait"].value
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
        f"- synchronisation wait: {by['synchronisation wait'].shown()}",
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
