"""The report on a timeline capture (an Nsight Systems export or a PyTorch profiler trace).

What a reader asks of a capture first, in that order: how long a step takes and how busy
the GPU was in it; when it was idle, what the CPU was doing (synchronising, copying,
launching, or its own code); which kernels took the time, and of what kind; then the
ranges, copies and API calls. Every table that ``nsys stats`` or ``key_averages`` also
prints is computed by the function that the course's tests hold equal to it
(:mod:`gpuprof.nsys.stats`, :mod:`gpuprof.torch_profiler.summary`), over the whole capture
as they do; the step and idle numbers are over the steps' window (each run of steps, from
its first step's start to its last step's end or the end of the GPU work it launched:
:attr:`gpuprof.report.activity_view.ActivityView.segments`), so warm-up, start-up and the
set-up between the runs of a sweep do not dilute them.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .. import activity  # noqa: E402
from ..memory_probe import give_back_memory  # noqa: E402
from ..kernel_kinds import is_communication, time_by_kind  # noqa: E402
from ..nsys import stats  # noqa: E402
from .activity_view import LAUNCH_PACE_FACTOR, ActivityView, headline, idle_by_cause, step_table  # noqa: E402
from .page import Page  # noqa: E402

__all__ = ["timeline_page", "ranks_page", "parse_window", "HEADLINE_LABELS"]

HEADLINE_LABELS = {
    "window_ms": "window (ms)", "runs": "runs (the step count restarts)", "processes": "processes with steps",
    "steps": "steps (ranges)",
    "step_period_ms": "step, start to start on the CPU (ms)",
    "gpu_step_ms": "step on the GPU, first op to first op (ms)",
    "step_ms": "step on the CPU, median (ms)", "kernels": "kernels launched in steps",
    "kernels_per_step": "kernels per step", "kernel_ms": "kernel time (ms)", "gpu_busy": "GPU busy (share of window)",
    "kernel_busy": "kernels alone (share of window)", "idle_ms": "GPU idle (ms)", "copies": "copies",
    "copy_ms": "copy time (ms)", "copy_exposed_ms": "copy time with no kernel running (ms)",
    "nccl_ms": "NCCL kernel time (ms)", "nccl_exposed_ms": "NCCL time with no other kernel running (ms)",
    "copy_bytes": "bytes copied", "api_calls": "CUDA API calls",
}


def _png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def parse_window(text: str, view: ActivityView) -> tuple[int, int]:
    """``--window``: ``A:B`` in milliseconds from the capture's first GPU activity, or a range name
    (its last occurrence), or ``step`` (the last step)."""
    m = re.fullmatch(r"\s*([\d.]+)\s*:\s*([\d.]+)\s*", text)
    if m:
        t0 = view.work_span[0] if view.has_work else int(view.work["start"].min())
        lo, hi = t0 + int(float(m.group(1)) * 1e6), t0 + int(float(m.group(2)) * 1e6)
        if hi <= lo:
            raise ValueError(f"--window {text}: the end must come after the start.")
        return lo, hi
    if text == "step" and not view.steps.empty:
        last = view.steps.iloc[-1]
        return int(last["start"]), int(last["end"])
    rows = view.ranges[view.ranges["text"].astype(str) == text] if not view.ranges.empty else view.ranges
    if rows.empty:
        raise ValueError(f"--window {text!r}: no range of that name, and not A:B in milliseconds.")
    last = rows.sort_values("start").iloc[-1]
    return int(last["start"]), int(last["end"])


def _headline_table(facts: dict[str, float]) -> pd.DataFrame:
    rows = [(HEADLINE_LABELS[k], float(facts[k])) for k in HEADLINE_LABELS if k in facts]
    return pd.DataFrame(rows, columns=["measure", "value"])


def _per_gpu(view: ActivityView) -> pd.DataFrame:
    segs = view.segments
    span = sum(b - a for a, b in segs)
    rows = []
    for dev, k in view.kernels.groupby("deviceId"):
        comm = is_communication(k["name"]).to_numpy()
        mine = view.in_steps(k)
        rows.append({"device": int(dev), "kernels": len(mine), "kernel_ms": float(mine["duration_ns"].sum()) / 1e6,
                     "busy": sum(activity.busy_fraction(k, seg) * (seg[1] - seg[0]) for seg in segs) / span if span else 0.0,
                     "nccl_ms": float(view.in_steps(k[comm])["duration_ns"].sum()) / 1e6,
                     "nccl_kernels": len(view.in_steps(k[comm])),
                     "nccl_exposed_ms": sum(activity.exposed_ns(k[comm], k[~comm], seg) for seg in segs) / 1e6})
        rows[-1]["compute_ms"] = rows[-1]["kernel_ms"] - rows[-1]["nccl_ms"]
    return pd.DataFrame(rows)


STEP_BARS = 200
"""The most steps the step figure draws one bar pair each. Its axes are about 680 pixels wide (8 inches at 110 dpi,
matplotlib's 0.775 of the width), so 200 steps leave 3.4 pixels a step, two bars of about 1.4 pixels: past that the
bars cannot be told apart, and matplotlib's cost grows with every bar (seconds for thousands of steps). The chapters'
captures have at most 50 steps in the report (208 in chapter 1's interactive capture, which no page shows)."""

STEP_BINS = 100
"""Above STEP_BARS steps, consecutive steps are drawn in at most this many bins: about 7 pixels a bin, so each bin's
two bars and its longest-step dash stay apart, whatever the step count; the figure's cost no longer grows with it."""


def _step_bins(steps: pd.DataFrame) -> tuple[int, pd.DataFrame]:
    """Consecutive steps in bins of ``width`` = ceil(steps / STEP_BINS) (the last bin holds what remains), so there
    are at most STEP_BINS bins: each bin's first step, its mean cpu_ms and gpu_busy_ms per step, its longest cpu_ms."""
    width = -(-len(steps) // STEP_BINS)
    groups = steps[["cpu_ms", "gpu_busy_ms"]].astype(float).groupby(np.arange(len(steps)) // width)
    bins = groups.mean().assign(max_cpu_ms=groups["cpu_ms"].max().to_numpy())
    bins.insert(0, "first_step", steps["step"].to_numpy()[::width])
    return width, bins.reset_index(drop=True)


def _draw_steps(ax: plt.Axes, steps: pd.DataFrame) -> None:
    """One bar pair a step up to STEP_BARS steps (the figure as it always was); above, one a bin of consecutive
    steps (:func:`_step_bins`)."""
    if len(steps) <= STEP_BARS:
        x = np.arange(len(steps))
        ax.bar(x - 0.2, steps["cpu_ms"], width=0.4, label="step (CPU range)", color="#ccb974")
        ax.bar(x + 0.2, steps["gpu_busy_ms"], width=0.4, label="GPU busy on its work", color="#4c72b0")
        every = max(1, int(np.ceil(len(steps) / 20)))  # at most 20 labels, so they never overlap
        ax.set_xticks(x[::every], [str(s) for s in steps["step"].to_numpy()[::every]], fontsize=7)
        ax.set_xlabel("step")
        ax.set_ylabel("ms")
        ax.legend(fontsize=8, frameon=False)
        ax.set_title("Each step: its length, and the GPU time its work kept the GPU busy", fontsize=9)
        return
    width, bins = _step_bins(steps)
    x = np.arange(len(bins))
    ax.bar(x - 0.2, bins["cpu_ms"], width=0.4, label="step (CPU range), mean", color="#ccb974")
    ax.bar(x + 0.2, bins["gpu_busy_ms"], width=0.4, label="GPU busy on its work, mean", color="#4c72b0")
    ax.plot(x - 0.2, bins["max_cpu_ms"], linestyle="none", marker="_", markersize=4, color="#8c6d1f",
            label="its longest step")
    every = max(1, int(np.ceil(len(bins) / 20)))
    ax.set_xticks(x[::every], [str(s) for s in bins["first_step"].to_numpy()[::every]], fontsize=7)
    ax.set_xlabel(f"{len(steps):,} steps in {len(bins)} bins of {width} consecutive steps (the last holds "
                  f"{len(steps) - width * (len(bins) - 1)}); label: the bin's first step")
    ax.set_ylabel("ms per step")
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(f"Each bin of {width} steps: the mean per step of its length and of the GPU time its work kept the "
                 "GPU busy", fontsize=9)


def _steps_figure(steps: pd.DataFrame) -> bytes:
    fig, ax = plt.subplots(figsize=(8, 2.8))
    _draw_steps(ax, steps)
    return _png(fig)


def _timeline_figure(view: ActivityView, window: tuple[int, int]) -> bytes | None:
    if view.tool != "nsys":
        return None
    from ..nsys.timeline import draw_timeline

    fig, ax = plt.subplots(figsize=(11, 4))
    draw_timeline(view.path, window=window, ax=ax, max_depth=3,
                  title=f"{view.path.name}: {(window[1] - window[0]) / 1e6:.2f} ms")
    return _png(fig)


def _operators(page: Page, view: ActivityView, top: int) -> None:
    if view.tool != "kineto":
        return
    from ..torch_profiler.summary import op_summary

    give_back_memory()  # its one table of operators and ranges is the report's last large one
    page.add("Operators (CPU)", table=op_summary(view.extra["trace"]), terminal_rows=top,
             note="As key_averages(): self CPU time is the operator's own, its children's taken out.")


def timeline_page(view: ActivityView, *, window: str | None = None, top: int = 15) -> Page:
    """The page for one nsys or Kineto capture (see the module's text)."""
    kind = "Nsight Systems export" if view.tool == "nsys" else "PyTorch profiler trace"
    page = Page(title=view.path.name, path=view.path, kind=kind)
    facts = headline(view)
    give_back_memory()  # each stage from what is held, not from the pages the one before freed (see its text)
    page.facts = facts
    counts = pd.Series(view.devices).value_counts() if view.devices else pd.Series(dtype=int)
    gpus = ", ".join(f"{n} x {name}" if n > 1 else str(name) for name, n in counts.items()) or "not recorded"
    w = view.window
    lines = [f"GPU: {gpus}.", f"Steps: {view.step_rule}."]
    if w is not None and view.has_work:
        if not len(view.steps):
            where = "the span of the GPU's work (no steps)"
        elif facts.get("runs", 1) > 1:
            where = (f"{int(facts['runs'])} runs of steps, each from its first step's start to its last step's end "
                     "or the end of the GPU work its steps launched; the set-up between runs is left out")
        else:
            where = "first step's start to the last step's end, or to the end of the GPU work the steps launched"
        lines.append(f"Window: {facts['window_ms']:,.2f} ms ({where}); the GPU ran something in "
                     f"{facts['gpu_busy']:.1%} of it, kernels alone {facts['kernel_busy']:.1%}.")
    else:
        lines.append("The capture holds no GPU work: no kernel, copy or memset.")
    lean = getattr(view, "lean", False)  # an export read in passes (gpuprof.report.lean_nsys): it answers itself
    if lean:
        devices = view.kernel_devices
    else:
        devices = view.kernels["deviceId"].dropna().unique() if "deviceId" in view.kernels else []
    if len(devices) > 1:
        lines.append(f"The capture holds {len(devices)} GPUs: busy and idle above are over their union (some GPU "
                     "ran something); the per-GPU table below says which one waited.")
    if facts.get("processes", 1) > 1:
        lines.append(f"Steps come from {int(facts['processes'])} processes: step times are per process.")
    page.add("Summary", text="\n".join(lines), table=_headline_table(facts), terminal_rows=20)
    if len(devices) > 1 and w is not None:
        per_gpu = _per_gpu(view)
        suspect = straggler(per_gpu.assign(capture="GPU " + per_gpu["device"].astype(str)))
        page.add("Per GPU", table=per_gpu, text=suspect or None,
                 note="Each GPU over the same window; nccl_ms: kernels whose name starts with 'nccl' (NCCL's own), "
                      "a kernel that waits for a late peer included; nccl_exposed_ms: the part of the window in which "
                      "an NCCL kernel ran on that GPU and no other kernel did (communication overlap did not hide); "
                      "compute_ms: kernel_ms - nccl_ms, summed durations.")
    if w is None or not view.has_work:
        _operators(page, view, top)
        return page

    steps = step_table(view)
    give_back_memory()
    if len(steps):
        page.add("Steps", table=steps, terminal_rows=8, html_rows=200, png=_steps_figure(steps),
                 note="launches: kernels, copies and memsets whose launching call fell inside the step, on any thread; "
                      "gpu_busy_ms: the union of their intervals; busy_share: busy over their span.")
    idle = view.idle_by_cause() if lean else idle_by_cause(view)
    give_back_memory()
    page.add("GPU idle, by what the CPU was doing", table=idle,
             note=f"All {facts['idle_ms']:,.2f} idle ms of the window. A gap of 10 us or more is 'already launched' when "
                  "the work that ended it had been launched before it began (the GPU waited on itself); "
                  f"'launch-bound' when the CPU issued that work within {LAUNCH_PACE_FACTOR:g}x its median spacing "
                  "between two launches after the launch before (the CPU worked at its usual pace per operation, "
                  "Python and the framework included, and the GPU was faster); otherwise the CUDA call that overlaps "
                  "it most takes the part it covers (synchronize = the GPU ran out of work while the CPU waited for it) "
                  "and host code the rest (no CUDA call: Python, the framework, data loading). "
                  "The host code row cannot tell these apart: a CPU-side profile (nsys -s cpu, py-spy) can.")

    if (view.kernel_count if lean else len(view.kernels)):
        by = "demangled" if view.tool == "nsys" else "name"
        top_k = view.kernel_summary() if lean else stats.kernel_summary(view.kernels, by=by)
        page.add("Top kernels", table=top_k, terminal_rows=top, html_rows=max(top, 40), short_names="Name",
                 note="Whole capture, as nsys stats' cuda_gpu_kern_sum (same columns; names demangled)."
                 if view.tool == "nsys" else "Whole capture; Total Time equals key_averages' self device time.")
        page.add("Kernels by kind", table=view.time_by_kind() if lean else time_by_kind(view.kernels), terminal_rows=14,
                 note="Kinds from kernel names (gpuprof.kernel_kinds); 'other' is never a guess.")
    if view.tool == "nsys" and len(view.ranges):
        page.add("NVTX ranges", table=stats.nvtx_summary(view.ranges), terminal_rows=top,
                 note="As nsys stats' nvtx_sum.")
        page.add("Kernels by NVTX range", table=view.nvtx_kern_summary() if lean
                 else stats.nvtx_kern_summary(view.kernels, view.runtime, view.ranges),
                 terminal=False, html_rows=100, short_names="Kernel Name",
                 note="As nsys stats' nvtx_kern_sum: a kernel counts in every range open on its launching thread; "
                      "the first rows (no range) are kernels launched outside every range, e.g. by autograd's thread.")
    _operators(page, view, top)
    if len(view.copies) or len(view.memsets):
        page.add("Copies and memsets", table=stats.memop_time_summary(view.copies, view.memsets),
                 note="As nsys stats' cuda_gpu_mem_time_sum.")
        if len(view.copies):
            page.add("Copy bandwidth", table=activity.copy_summary(view.copies),
                     note="gbps: bytes over the copies' own busy time (GB/s).")
    if (view.runtime_count if lean else len(view.runtime)):
        page.add("CUDA API calls", table=view.api_summary() if lean else stats.api_summary(view.runtime), terminal_rows=8,
                 note="As nsys stats' cuda_api_sum.")
    if view.tool == "kineto":
        mem = view.extra["trace"].memory_events()
        if len(mem) and "total_allocated" in mem:
            peak = pd.to_numeric(mem["total_allocated"], errors="coerce").max()
            page.add("Memory", text=f"Peak allocated while profiling: {peak / 2**20:,.1f} MiB "
                                    f"({len(mem):,} allocation events; profile_memory=True).")
    cut = False
    try:
        if window:
            tw = parse_window(window, view)
        elif len(view.steps):
            tw = (int(view.steps.iloc[-1]["start"]), int(view.steps.iloc[-1]["end"]))
        else:
            tw, cut = view.recent_window(w, TIMELINE_MAX_OPS) if lean else _recent_window(view, w)
    except ValueError as exc:
        from ..errors import GpuprofError

        raise GpuprofError(str(exc), "Give --window A:B (ms from the first GPU activity) or a range's name.") from None
    png = _timeline_figure(view, tw)
    if png is not None:
        page.add("Timeline", png=png, terminal=False,
                 note="The last step (or --window): NVTX ranges, synchronising calls, then one row per stream."
                 + (f" Without steps, the capture's last {TIMELINE_MAX_OPS:,} GPU operations (it holds more)." if cut
                    else ""))
    return page


TIMELINE_MAX_OPS = 50_000
"""The most GPU operations the timeline figure draws by default, for a capture without steps (with steps it draws
the last one). Each is a rectangle for matplotlib: a million took 20 s and 1 GiB of memory to draw (an export of
1,000,000 kernels, artifacts/tools/bench_torch_trace_big.txt), and at 11 inches wide so many cannot be told apart.
The course's captures hold at most 20,790 operations, so their figures are unchanged."""


def _recent_window(view: ActivityView, w: tuple[int, int]) -> tuple[tuple[int, int], bool]:
    """The window ``w``, or its end from the start of the TIMELINE_MAX_OPS-th last GPU operation where it holds
    more; and whether it was cut."""
    starts = np.concatenate([d["start"].to_numpy(dtype=np.int64) for d in (view.kernels, view.copies, view.memsets)])
    if len(starts) <= TIMELINE_MAX_OPS:
        return w, False
    k = len(starts) - TIMELINE_MAX_OPS
    return (max(int(np.partition(starts, k)[k]), w[0]), w[1]), True


def ranks_page(ranks: Sequence[tuple[Path, dict[str, float]]]) -> Page:
    """One row per capture of a multi-rank folder: the headline numbers side by side, and the
    time in NCCL kernels (communication), so a straggler or an unbalanced rank stands out.

    Takes (path, :func:`headline`) pairs, not the views: a folder of many ranks keeps only each
    rank's headline, not its whole timeline, so memory does not grow with every rank's events.
    """
    rows = []
    for path, f in ranks:
        rows.append({"capture": path.name, "steps": int(f.get("steps", 0)), "runs": int(f.get("runs", 1 if f.get("steps") else 0)),
                     "step_ms": f.get("step_period_ms", float("nan")), "window_ms": f.get("window_ms", float("nan")),
                     "gpu_busy": f.get("gpu_busy", float("nan")), "kernel_ms": f.get("kernel_ms", 0.0),
                     "nccl_ms": f.get("nccl_ms", 0.0), "nccl_kernels": int(f.get("nccl_kernels", 0)),
                     "nccl_exposed_ms": f.get("nccl_exposed_ms", 0.0),
                     "nccl_overlap": f.get("nccl_overlap", float("nan")),
                     "compute_ms": f.get("kernel_ms", 0.0) - f.get("nccl_ms", 0.0),
                     "idle_ms": f.get("idle_ms", float("nan"))})
    folder = ranks[0][0].parent
    page = Page(title=f"{folder.name}: {len(ranks)} captures side by side", path=folder, kind="folder")
    table = pd.DataFrame(rows)
    page.add("Per capture", table=table, terminal_rows=64,
             note="Each capture over its own steps' window (runs: the times the step count restarts, a sweep's; the "
                  "set-up between runs is left out); step_ms: mean CPU start-to-start of consecutive steps. "
                  "kernel_ms and nccl_ms: the kernels the steps launched (all of them without steps); nccl_ms: kernels "
                  "whose name starts with 'nccl' (NCCL's own), a kernel that waits for a late peer included; "
                  "nccl_exposed_ms: time an NCCL kernel ran with no other kernel on its GPU (not hidden by overlap); "
                  "nccl_overlap: the share of NCCL's time that other kernels ran too (HTA's communication/computation "
                  "overlap, on each GPU; NCCL time includes waiting for a late peer, so a rank that waits longer can "
                  "show more overlap); compute_ms: kernel_ms - nccl_ms, summed durations; nccl_kernels: their count.")
    lines = []
    if len(table) > 1 and table["step_ms"].notna().all():
        spread = table["step_ms"].max() / table["step_ms"].min()
        lines.append(f"Slowest step / fastest: {spread:.3f}x ({table.loc[table['step_ms'].idxmax(), 'capture']} slowest).")
    suspect = straggler(table)
    if suspect:
        lines.append(suspect)
    if lines:
        page.add("Balance", text=" ".join(lines))
    return page


def straggler(table: pd.DataFrame, *, margin: float = 0.25) -> str:
    """One sentence naming the rank (or GPU) the others wait for, or "" where none stands out.

    ``table``: one row per rank, with ``capture`` (its name), ``nccl_ms``, ``compute_ms`` and
    ``nccl_kernels`` (ranks of one job over the same steps run as many; where they differ, the rows
    are not one job's, and nothing is named). In a
    collective every rank's NCCL kernel runs, spinning, until the last rank arrives: the rank that
    arrives last waits least, so the straggler is the one with the least NCCL time. It is named
    when that time is under ``1 - margin`` times the median rank's. The 25% margin is chosen, not
    derived: in chapter 8's captures of 2026-11-24 the ranks of its DDP traces and bf16 bucket sweep
    sat 5% and 11% below their pair's median, its deliberate straggler run 86% below (one GPU); in
    those of 2026-11-26 the same two jobs came out 52% and 41% below, one rank reaching most
    all-reduces last under the profiler (38 of 48 in the traces), and are named. Compute (kernel
    time outside NCCL) is given as a hint to the cause, not used to decide: the straggler of chapter
    8 is late because its host sleeps, and computes less than the rank that waits for it (whose
    NCCL kernels spin beside its backward pass). HTA's own rule (``get_potential_stragglers``) picks
    the rank whose communication kernel starts last in each profiler step; this one needs no steps.
    """
    t = table.dropna(subset=["nccl_ms"])
    t = t[t["nccl_ms"] > 0]
    if len(t) < 2:
        return ""
    if "nccl_kernels" in t and t["nccl_kernels"].nunique() > 1:  # every rank of a job joins every collective
        return ("No straggler named: the captures ran different numbers of NCCL kernels "
                f"({int(t['nccl_kernels'].min())} to {int(t['nccl_kernels'].max())}), so they are not one job's ranks "
                "over the same steps.")
    least = t["nccl_ms"].idxmin()
    median = float(t["nccl_ms"].median())
    share = float(t.loc[least, "nccl_ms"]) / median
    if share >= 1 - margin:
        return ""
    hint = ""
    if "compute_ms" in t and float(t["compute_ms"].median()) > 0:
        hint = (f" Its compute (kernel time outside NCCL) is {t.loc[least, 'compute_ms'] / t['compute_ms'].median():.2f}x "
                "the median's: above 1, its GPU work is slower; at or below 1, look at its host (data loading, "
                "Python, a sleep) or its link.")
    return (f"Likely straggler: {t.loc[least, 'capture']}, the least time in NCCL kernels ({t.loc[least, 'nccl_ms']:.3f} "
            f"ms, {share:.2f}x the median {median:.3f} ms): the others' NCCL kernels wait for it.{hint}")
