"""The weight-streaming seed's metric table, computed from a capture, and its report filled in.

The seed notes (in Chinese) judge a weight-streaming system by five targets: GPU
utilisation above 85%, memory-bandwidth utilisation above 80%, PCIe utilisation between
50% and 70%, copy/compute overlap above 60%, synchronisation wait below 10%. This module
measures each one that a CUDA trace can measure, over a window of a capture, and says
which cannot be measured from a trace (device-memory bandwidth needs GPU metrics or
Nsight Compute), instead of inventing a number. The report template of the seed is then
filled from the measured values only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import nsys_sqlite as ns
from . import trace_analysis as ta

__all__ = ["Metric", "seed_metrics", "format_metrics", "recommendations", "fill_report", "pass_windows", "label_streams",
           "weight_copy_gbps", "StreamingTimings", "streaming_timings", "metrics_matrix"]


@dataclass(frozen=True)
class Metric:
    name: str
    value: float | None  # a fraction (0..1), or None when a trace cannot measure it
    target: str
    met: bool | None
    how: str

    def shown(self) -> str:
        return "not measurable from a trace" if self.value is None else f"{self.value:.1%}"


def seed_metrics(path: str | Path, window: tuple[int, int], pinned_peak_gbps: float) -> list[Metric]:
    """The seed's five metrics over ``window`` (ns) of the capture at ``path``."""
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
    """Rules from the seed's three diagnosed problems, applied to measured values only."""
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
    """The seed's report template, every value taken from the arguments (measured, not typed)."""
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


def metrics_matrix(columns: dict[str, list[Metric]]) -> str:
    """Several runs' seed metrics side by side: one row per metric, one column per run, with the
    verdict against the seed's target after each value (ok / MISS; - where there is none)."""
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
            mark = "" if m.met is None else (" ok" if m.met else " MISS")
            cells.append(f"{f'{m.value:.1%}{mark}':>{width}}")
        lines.append(f"{name[:33]:<34}{metrics[i].target:<8}" + "".join(cells))
    return "\n".join(lines)
