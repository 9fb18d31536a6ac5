"""The matrix-multiply ladder's measurements: the chapter's eight kernels timed beside cuBLAS, then profiled together.

Chapter 11 climbs ``examples/nsight_compute/matmul_ladder.py`` (C = A W^T in BF16, FP32
accumulate) from a naive kernel to Hopper's wgmma fed by TMA. This module holds what the
chapter would otherwise spell out in cells:

* :func:`run_ladder`: the whole ladder and cuBLAS in several fresh processes (each checks
  every rung on three shapes, then times every rung and cuBLAS in one run), into one JSON
  file with provenance; without a GPU, the course's reference results;
* :func:`timing_table`, :func:`targets`, :func:`check_table`: what that file says, with the
  spread across processes;
* :func:`profile_ladder`: every rung once under Nsight Compute, in one report, and
  :func:`counter_table`, :func:`opcode_table`, :func:`roofline_points`, :func:`stall_mix`,
  :func:`figure`: the counters that moved from rung to rung.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from ..artifacts import REPO_ROOT, FoundCapture, find_capture, save_json
from ..backend import describe_machine
from ..checks import Bound, at_least, at_most, between, equals, over, under
from ..errors import GpuprofError
from ..ncu import derived as nd
from ..ncu import report as nr
from ..ncu.plots import PIPES, STALL_REASONS, stall_metric
from ..runner import python_target, shell_line

__all__ = ["SCRIPT", "PROCESSES", "SIZE", "REFERENCE", "run_ladder", "timing_table", "targets", "check_table",
           "PROFILE_OPTIONS", "profile_ladder", "profile_lines", "hot_lines", "LINE_RUNGS", "counter_table", "global_load_table", "opcode_table", "roofline_points", "stall_mix",
           "figure", "OPCODES", "step_claims", "math_instructions", "verdicts", "line_claims"]

SCRIPT = REPO_ROOT / "examples" / "nsight_compute" / "matmul_ladder.py"
PROCESSES = 3
SIZE = 4096
REFERENCE = "cublas_fp32_out"  # cuBLAS computing the same product: BF16 in, FP32 accumulate and out
TORCH = "cublas_bf16_out"
# The rungs the chapter shows. The script has more (issue 39's rungs 9-10, for the large shapes);
# they are passed by name so that a new rung changes no chapter output until the prose reads it.
CHAPTER_RUNGS = "1,2,3,4,5,6,7,8"

# One report for all the chapter's rungs: the sections the chapter reads and the counters its tables
# derive from, no source counters (the report stays small).
PROFILE_SECTIONS = ["SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "Occupancy", "LaunchStats",
                    "SchedulerStats", "WarpStateStats", "InstructionStats"]
TENSOR_OPS = {"HMMA (mma.sync)": "sm__ops_path_tensor_op_hmma_src_bf16_dst_fp32_sparsity_off.sum",
              "HGMMA (wgmma)": "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32_sparsity_off.sum"}
EXTRA_METRICS = ["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum", "lts__t_sector_hit_rate.pct",
                 *TENSOR_OPS.values(), *(f"{m}.peak_sustained" for m in TENSOR_OPS.values())]
PROFILE_OPTIONS = [*(a for s in PROFILE_SECTIONS for a in ("--section", s)),
                   *nd.metrics_option(nd.MEMORY_METRICS, nd.COMPUTE_METRICS, nd.ROOFLINE_METRICS, nd.SCHEDULER_METRICS,
                                      nd.OCCUPANCY_METRICS, EXTRA_METRICS),
                   "-k", "regex:ladder_"]
FMA_PIPE, TENSOR_PIPE = PIPES["FMA"], PIPES["tensor HMMA (mma.sync + wgmma)"]
OPCODES = ["FFMA", "HMMA", "HGMMA", "LDG", "LDS", "LDSM", "STS", "LDGSTS", "UTMALDG", "BAR", "SYNCS"]


def _rungs(data: dict[str, Any]) -> list[int]:
    return sorted({r["extra"]["rung"] for run in data["runs"] for r in run["results"] if "rung" in r.get("extra", {})})


def run_ladder(chapter: str, filename: str = "ladder.json", *, processes: int = PROCESSES, size: int = SIZE,
               timeout_s: float = 300) -> FoundCapture:
    """The ladder in ``processes`` fresh processes (forked from one that imported the script once), into
    ``<chapter>/<filename>``; without a GPU, the course's reference."""
    from ..fork_runs import run_all

    machine = describe_machine()
    if machine.device != "cuda":
        print(f"No GPU on this machine ({machine.summary()}): showing the course's reference results instead.")
        return find_capture(chapter, filename, prefer="reference")
    runs: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        argvs = [["--rung", CHAPTER_RUNGS, "--size", str(size), "--json", f"{tmp}/run{i}.json"] + ([] if i == 0 else ["--no-check"])
                 for i in range(processes)]
        for i, status, secs, log in run_all(SCRIPT, argvs, timeout_s=timeout_s):
            out = Path(f"{tmp}/run{i}.json")
            if status != "0" or not out.exists():
                tail = " | ".join(log.strip().splitlines()[-3:])
                raise GpuprofError(f"matmul_ladder.py {' '.join(argvs[i][:-2])} failed (exit {status}): {tail}")
            runs.append({"process": i, "wall_s": secs, **json.loads(out.read_text())})
            best = max((r for r in runs[-1]["results"] if "rung" in r["extra"]), key=lambda r: r["rate"])
            print(f"  [process {i + 1}/{processes}] {len(runs[-1]['results'])} kernels timed; fastest rung "
                  f"{best['extra']['rung']} at {best['rate']:.0f} TFLOP/s ({secs:.0f} s)", flush=True)
    print(f"all processes: {time.perf_counter() - t0:.0f} s")
    command = shell_line(python_target(SCRIPT, "--rung", CHAPTER_RUNGS, "--size", str(size), "--json", "run.json"))
    save_json(chapter, filename, {"script": "examples/nsight_compute/matmul_ladder.py", "size": size,
                                  "processes": processes, "runs": runs}, overwrite=True,
              command=f"gpuprof.studies.matmul_ladder.run_ladder: {command} in {processes} processes forked from "
                      f"gpuprof.fork_runs (the first also checks every rung on three shapes; the others pass --no-check)")
    return find_capture(chapter, filename)


def timing_table(data: dict[str, Any]) -> pd.DataFrame:
    """One row per kernel: median time and rate over the processes (each process's median of its repeats),
    the range across processes, and its share of cuBLAS's same product and speed-up over the rung before,
    each computed within a process (one run) and given as the median and the least favourable process."""
    per: dict[str, list[dict[str, Any]]] = {}
    for run in data["runs"]:
        rates = {r["name"]: r["rate"] for r in run["results"]}
        for r in run["results"]:
            per.setdefault(r["name"], []).append({"label": r["label"], "rung": r["extra"].get("rung"),
                                                  "ms": r["median_ms"], "rate": r["rate"], "rates": rates})
    rows = []
    previous: str | None = None
    for name, obs in per.items():
        shares = [o["rate"] / o["rates"][REFERENCE] for o in obs if REFERENCE in o["rates"]]
        steps = [o["rate"] / o["rates"][previous] for o in obs if previous and previous in o["rates"]]
        rows.append({"kernel": obs[0]["label"], "rung": obs[0]["rung"], "ms": statistics.median(o["ms"] for o in obs),
                     "tflops": statistics.median(o["rate"] for o in obs), "tflops_low": min(o["rate"] for o in obs),
                     "tflops_high": max(o["rate"] for o in obs),
                     "of_cublas": statistics.median(shares) if shares else float("nan"),
                     "of_cublas_low": min(shares) if shares else float("nan"),
                     "vs_previous": statistics.median(steps) if steps else float("nan"),
                     "vs_previous_low": min(steps) if steps else float("nan"), "name": name})
        if obs[0]["rung"] is not None:
            previous = name
    return pd.DataFrame(rows).set_index("name")


def targets(data: dict[str, Any]) -> dict[str, float]:
    """The case study's targets, each from the least favourable process: the best rung's share of cuBLAS
    (same product), naive -> best, and the smallest rung-to-rung step."""
    table = timing_table(data)
    rungs = table[table["rung"].notna()].sort_values("rung")
    best = rungs["tflops"].idxmax()
    worst_naive_to_best = min(
        run_rate(run, best) / run_rate(run, rungs.index[0]) for run in data["runs"])
    return {"best_rung": int(rungs.loc[best, "rung"]), "best_of_cublas_low": float(rungs.loc[best, "of_cublas_low"]),
            "naive_to_best_low": float(worst_naive_to_best),
            "smallest_step_low": float(rungs["vs_previous_low"].iloc[1:].min())}


def run_rate(run: dict[str, Any], name: str) -> float:
    return next(r["rate"] for r in run["results"] if r["name"] == name)


def check_table(data: dict[str, Any]) -> pd.DataFrame:
    """Each rung's largest difference from cuBLAS's FP32 product (over that product's largest value), per
    check shape, from the process that checked (the worst of a persistent rung's two grids)."""
    checks = next(run["checks"] for run in data["runs"] if run.get("checks"))
    t = pd.DataFrame([{"rung": c["rung"], "shape": " x ".join(map(str, c["shape"])),
                       "error": c.get("relative_error", float("nan"))} for c in checks])
    return t.pivot_table(index="rung", columns="shape", values="error", aggfunc="max", dropna=False)


def profile_ladder(chapter: str, name: str = "rungs", *, size: int = SIZE):  # type: ignore[no-untyped-def]
    """Every rung once under ncu (no check, no cuBLAS: only the ladder's kernels), one report."""
    from ..ncu.capture import ncu_capture

    cap = ncu_capture(chapter, name, SCRIPT, ["--rung", CHAPTER_RUNGS, "--size", str(size), "--no-check", "--no-cublas",
                                              "--warmup", "0", "--repeats", "1"], options=PROFILE_OPTIONS, echo=False)
    if cap.report.source == "this machine":  # the full command (60-odd metric names) is in the provenance entry
        print(f"$ ncu {' '.join(f'--section {s}' for s in PROFILE_SECTIONS)} --metrics <{len(EXTRA_METRICS)} + the "
              f"tables' metrics> -k regex:ladder_ -o {name} python {SCRIPT.relative_to(REPO_ROOT)} --rung {CHAPTER_RUNGS} "
              f"--size {size} --no-check --no-cublas --warmup 0 --repeats 1\n  ({len(cap.passes)} kernel launches "
              f"profiled, report {cap.path.stat().st_size / 2**20:.2f} MiB)")
    return cap


LINE_RUNGS = (5, 7, 8)  # the rungs whose next step the source page shows


def profile_lines(chapter: str, filename: str = "lines.json", *, rungs: Sequence[int] = LINE_RUNGS,
                  size: int = SIZE) -> FoundCapture:
    """Per source line of ``rungs``: warp samples and the stall reason of each (ncu's Source page, from
    SourceCounters with the .cu file imported), as JSON; without ncu, the course's reference."""
    from ..ncu.plots import SAMPLED_STALLS
    from ..ncu.capture import source_lines
    from ..tools import live_tool

    live = live_tool("ncu")
    if not live:
        print(f"No live ncu capture: {live.reason}; showing the course's reference lines instead.")
        return find_capture(chapter, filename, prefer="reference")
    names = [f"ladder_{r}_" for r in rungs]
    kernels = _kernel_names(rungs)
    args = ["--rung", ",".join(map(str, rungs)), "--size", str(size), "--no-check", "--no-cublas", "--warmup", "0",
            "--repeats", "1"]
    options = ["--section", "SourceCounters", "--section", "WarpStateStats", "--import-source", "yes",
               "-k", "regex:" + "|".join(names)]
    counters = ["smsp__pcsamp_sample_count", *(f"smsp__pcsamp_warps_issue_stalled_{r}" for r in SAMPLED_STALLS)]
    rows = source_lines(SCRIPT, args, options, kernels, counters, search=[SCRIPT.parent])
    command = shell_line(["ncu", *options, *python_target(SCRIPT, *args)])
    save_json(chapter, filename, rows, overwrite=True,
              command=f"{command} (per-line samples: gpuprof.ncu.capture.source_lines; the report is not kept)")
    return find_capture(chapter, filename)


def _kernel_names(rungs: Sequence[int]) -> list[str]:
    from ..runner import load_script

    return [load_script(SCRIPT).RUNGS[r].kernel for r in rungs]


def hot_lines(rows: list[dict], top: int = 4) -> pd.DataFrame:
    """Each profiled rung's most sampled source lines: share of the kernel's samples and what they waited on."""
    lines = nd.sampled_lines(pd.DataFrame(rows))
    lines["rung"] = [int(str(k).split("_")[1]) for k in lines["kernel"]]
    return (lines.groupby("rung", sort=True).head(top)[["rung", "line", "share", "waiting_on", "source"]]
            .reset_index(drop=True))


GLOBAL_LOAD = {"sectors": "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
               "requests": "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
               "store_sectors": "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
               "store_requests": "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
               "l1_hit_pct": "l1tex__t_sector_hit_rate.pct", "l2_bytes": "lts__t_bytes.sum"}


def global_load_table(report: str | Path) -> pd.DataFrame:
    """Per rung: global-load and global-store requests and the 32-byte sectors they touched (and per
    request), the L1/TEX hit rate over all its sectors (loads and stores alike: ncu's "L1/TEX Hit Rate"),
    the bytes the L2 served, and those bytes less the stores' sectors (``l2_bytes_less_stores``: mostly the
    loads that missed the L1).

    Why it matters for rungs 3 -> 4: rung 4's loads give each warp one half (16 bytes) of 32 rows'
    32-byte slices, where rung 3's gave it both halves of 16 rows, so each request touches twice the
    sectors; the other half of each sector is the paired warp's (warps 2i and 2i + 1 copy the same
    32 rows), and the L1 serves it. A bank-conflict fix that doubles the sectors is a cost the
    conflict count alone does not show. Rung 4 also writes C with a column step of 64 instead of 4
    (``store_tile_fp32``), which halves the store sectors per request: that, not the loads, is most of
    the L2 bytes it saves."""
    t = nr.metric_table(report, list(GLOBAL_LOAD.values()), missing="nan")
    out = t.rename(columns={v: k for k, v in GLOBAL_LOAD.items()})
    out.index = [int(str(k).split("_")[1]) for k in t["kernel"]]
    out["sectors_per_request"] = out["sectors"] / out["requests"]
    out["store_sectors_per_request"] = out["store_sectors"] / out["store_requests"]
    out["l2_bytes_less_stores"] = out["l2_bytes"] - 32 * out["store_sectors"]
    return out.drop(columns="kernel").sort_index().rename_axis("rung")


def counter_table(report: str | Path) -> pd.DataFrame:
    """One row per rung: the counters the chapter reasons with, from one report."""
    t = nr.metric_table(report, [nd.DURATION, "sm__throughput.avg.pct_of_peak_sustained_elapsed",
                                 "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
                                 FMA_PIPE, TENSOR_PIPE, "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
                                 "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
                                 "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
                                 "lts__t_bytes.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
                                 "sm__warps_active.avg.pct_of_peak_sustained_active",
                                 "smsp__warps_eligible.avg.per_cycle_active",
                                 "smsp__issue_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread"],
                        missing="nan")
    sched = nd.scheduler_table(report)
    occ = nd.occupancy_table(report)
    out = pd.DataFrame({
        "rung": [int(k.split("_")[1]) for k in t["kernel"]], "kernel": t["kernel"],
        "ncu_us": t[nd.DURATION] / 1e3,
        "sm_pct": t["sm__throughput.avg.pct_of_peak_sustained_elapsed"],
        "memory_pct": t["gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"],
        "fma_pipe_pct": t[FMA_PIPE], "tensor_pipe_pct": t[TENSOR_PIPE],
        "lsu_pct": t["sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active"],
        "bank_conflicts_M": (t["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"]
                             + t["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"]) / 1e6,
        "l2_GB": t["lts__t_bytes.sum"] / 1e9,
        "dram_GB": (t["dram__bytes_read.sum"] + t["dram__bytes_write.sum"]) / 1e9,
        "occupancy_pct": t["sm__warps_active.avg.pct_of_peak_sustained_active"],
        "limited_by": occ["limiter"].values,
        "eligible_warps": t["smsp__warps_eligible.avg.per_cycle_active"],
        "issue_pct": t["smsp__issue_active.avg.pct_of_peak_sustained_active"],
        "registers": t["launch__registers_per_thread"],
        "top_stalls": sched["top_stalls"].values})
    return out.set_index("rung").sort_index()


def opcode_table(report: str | Path, opcodes: Sequence[str] = OPCODES) -> pd.DataFrame:
    """Warp-level instructions executed per rung, for the opcodes that tell the rungs apart (Instruction
    Statistics' ``sass__inst_executed_per_opcode``), in millions."""
    kernels = nr.kernels(report)
    rows = {}
    for i, k in enumerate(kernels["name"]):
        mix = nr.instances(report, i, "sass__inst_executed_per_opcode")
        rows[int(str(k).split("_")[1])] = {op: float(mix.get(op, 0.0)) / 1e6 for op in opcodes}
    return pd.DataFrame.from_dict(rows, orient="index").sort_index().rename_axis("rung")


# ncu's "Elapsed Cycles" (SpeedOfLight section): the cycles the kernel took, counted, whatever the clock.
ELAPSED_CYCLES = "gpc__cycles_elapsed.max"


def roofline_points(report: str | Path, flops: float) -> pd.DataFrame:
    """Per rung, under ncu: achieved TFLOP/s (``flops`` over the kernel's time), FLOP per DRAM byte, and the
    roofs at the clock each kernel ran at: FP32 FFMA (ncu's roofline), BF16 tensor ops per cycle at peak
    (HMMA and HGMMA counters' ``peak_sustained``) and DRAM bytes per second at peak.

    The same per cycle of the SM clock (``*_per_cycle``, whole GPU): the rungs ran at different clocks
    under ncu (the tensor-core rungs below the base clock ncu asks for), and per cycle the compute
    ceilings are one number for every rung, so a rung's distance to its ceiling no longer depends on
    the clock it happened to get (review item C11-1).

    A rung's own ``flop_per_cycle`` is ``flops`` over ncu's *Elapsed Cycles* (``gpc__cycles_elapsed.max``),
    the cycles ncu counted for the kernel, not its duration times a clock: the clock counters of one report
    disagree by 1-3% (rung 6 of the chapter's report: 1.40 GHz from ``sm__cycles_elapsed.avg.per_second``,
    1.435 GHz from Elapsed Cycles over Duration), so a rate divided by a clock is only as exact as that
    clock, while a count of cycles needs none. The ceilings' per-cycle values are the counters' own
    per-cycle peaks and do not depend on the clock either."""
    roof = nd.ncu_roofline(report)
    t = nr.metric_table(report, [nd.DURATION, ELAPSED_CYCLES, "dram__bytes_read.sum", "dram__bytes_write.sum",
                                 *TENSOR_OPS.values(), *(f"{m}.peak_sustained" for m in TENSOR_OPS.values())],
                        missing="nan")
    seconds = t[nd.DURATION] / 1e9
    dram = t["dram__bytes_read.sum"] + t["dram__bytes_write.sum"]
    clock = roof["sm_ghz"] * 1e9
    tensor_ops = sum(t[m] for m in TENSOR_OPS.values())
    out = pd.DataFrame({
        "rung": [int(k.split("_")[1]) for k in t["kernel"]], "tflops": flops / seconds / 1e12,
        "intensity": flops / dram, "tensor_ops_over_flops": tensor_ops / flops,
        "fp32_roof": roof["fp32_peak_tflops"], "hmma_roof": t[f"{TENSOR_OPS['HMMA (mma.sync)']}.peak_sustained"] * clock / 1e12,
        "hgmma_roof": t[f"{TENSOR_OPS['HGMMA (wgmma)']}.peak_sustained"] * clock / 1e12,
        "dram_roof_tbps": roof["dram_peak_tbps"], "sm_ghz": roof["sm_ghz"]}).set_index("rung").sort_index()
    per_cycle = 1e3 / out["sm_ghz"]  # TFLOP/s (or TB/s) over GHz, in FLOP (or bytes) per cycle
    for col, new in (("tflops", "flop_per_cycle"), ("fp32_roof", "fp32_per_cycle"), ("hmma_roof", "hmma_per_cycle"),
                     ("hgmma_roof", "hgmma_per_cycle"), ("dram_roof_tbps", "dram_bytes_per_cycle")):
        out[new] = out[col] * per_cycle
    out["elapsed_cycles"] = t[ELAPSED_CYCLES].to_numpy()
    out["counted_ghz"] = out["elapsed_cycles"] / t[nd.DURATION].to_numpy()  # the clock behind flop_per_cycle
    out["flop_per_cycle"] = flops / out["elapsed_cycles"]
    return out


def stall_mix(report: str | Path, top: int = 6) -> pd.DataFrame:
    """Per rung, each stall reason's share of all stalled warp-cycles per issued instruction; the ``top``
    reasons across the ladder, the rest summed as ``other``."""
    st = nd.stall_table(report)
    names = {stall_metric(r): r for r in STALL_REASONS if r != "selected"}
    s = st[[c for c in names if c in st.columns]].astype(float).rename(columns=names)
    s.index = [int(str(k).split("_")[1]) for k in st["kernel"]]
    share = s.div(s.sum(axis=1), axis=0)
    keep = share.max().nlargest(top).index
    out = share[keep].copy()
    out["other"] = share.drop(columns=keep).sum(axis=1)
    return out.sort_index().rename_axis("rung")


def figure(points: pd.DataFrame, stalls: pd.DataFrame, gpu: str):  # type: ignore[no-untyped-def]
    """A roofline per cycle of the SM clock, with every rung's point and its ceilings (the same for every
    rung per cycle; the DRAM slope, which does not scale with the SM clock, at the rungs' median clock),
    beside each rung's stall mix."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [1.2, 1]})
    x = np.logspace(0, 4, 200)
    dram = float(points["dram_bytes_per_cycle"].median())
    for roof, label, style in ((points["fp32_per_cycle"].median(), "FP32 FFMA peak", ":"),
                               (points["hmma_per_cycle"].median(), "BF16 mma.sync peak", "--"),
                               (points["hgmma_per_cycle"].median(), "BF16 wgmma peak", "-")):
        ax.plot(x, np.minimum(roof, dram * x), style, color="0.4", lw=1)
        ax.text(x[-1], roof, f" {label} {roof:,.0f}", va="center", ha="left", fontsize=8)
    for rung, p in points.iterrows():
        ax.plot(p["intensity"], p["flop_per_cycle"], "o", ms=8)
        # rungs 3 and 4 (and 7 and 8) land on almost the same spot: odd rungs labelled left, even right
        ax.annotate(str(rung), (p["intensity"], p["flop_per_cycle"]), xytext=(7 if rung % 2 == 0 else -14, -4),
                    textcoords="offset points")
    ax.set(xscale="log", yscale="log", xlabel="FLOP per DRAM byte", ylabel="FLOP per SM-clock cycle, whole GPU",
           title=f"Every rung on the roofline ({gpu}, under ncu, per cycle)")
    ax.set_xlim(x[0], x[-1] * 30)
    stalls.plot.bar(stacked=True, ax=bx, width=0.75, colormap="tab10", rot=0)
    bx.set(xlabel="rung", ylabel="share of stalled warp-cycles", title="Why warps waited, per rung")
    bx.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


# Claims the chapter asserts. Each threshold sits well outside what the course's runs measured
# (H100 and H200, three processes each): the large steps were 1.48x and more, the two small
# ones within 4% of the rung before.
BIG_STEP = at_least(1.2)     # a rung that changes the plan is at least this much faster than the one before
SMALL_STEP = at_least(0.85)  # rungs 4 and 8 are not slower than the one before by more than 15%
SMALL_STEP_RUNGS = (4, 8)


class _Checked:
    """One sentence of several checked values: :meth:`value` writes a value beside its bound, as
    :func:`gpuprof.checks.check` does, and tests it with the same bound; :meth:`holds` does the same for a plain
    condition (a comparison, a name). ``ok``: whether everything written so far holds."""

    def __init__(self) -> None:
        self.ok = True

    def value(self, value: float, bound: Bound, fmt: str, unit: str = "") -> str:
        self.ok = bound.test(float(value)) and self.ok
        return f"{format(value, fmt)}{unit} (checked: {bound.describe(fmt, unit)})"

    def holds(self, condition: bool, words: str) -> str:
        self.ok = bool(condition) and self.ok
        return f"(checked: {words})"


def _sentence(write: Callable[[_Checked], str]) -> dict[str, Any]:
    """``write``'s sentence (``text``), written through a :class:`_Checked`, and whether all of it holds (``ok``)."""
    checked = _Checked()
    text = write(checked)
    return {"ok": checked.ok, "text": text}


def step_claims(table: pd.DataFrame) -> dict[int, dict[str, Any]]:
    """For each rung after the first: the claim about its speed-up over the rung before (least favourable
    process), with its bound, and whether it holds."""
    rungs = table[table["rung"].notna()].sort_values("rung")
    out = {}
    for _, row in rungs.iloc[1:].iterrows():
        rung = int(row["rung"])
        low = float(row["vs_previous_low"])
        bound = SMALL_STEP if rung in SMALL_STEP_RUNGS else BIG_STEP
        said = _sentence(lambda v: f"over rung {rung - 1}, least favourable process: {v.value(low, bound, '.2f', 'x')}")
        out[rung] = {"claim": said["text"], "ok": said["ok"], "vs_previous_low": low}
    return out


def math_instructions(ops: pd.DataFrame) -> dict[int, str]:
    """Which instruction does each rung's multiply-adds: the most executed of FFMA, HMMA and HGMMA."""
    math = ops[["FFMA", "HMMA", "HGMMA"]]
    return {int(r): str(math.loc[r].idxmax()) for r in math.index}


def _top_stall(counters: pd.DataFrame, rung: int) -> str:
    return str(counters.loc[rung, "top_stalls"]).split()[0]


def verdicts(counters: pd.DataFrame, ops: pd.DataFrame, stalls: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """For each step, the counters that pointed to it and moved with it, as one printed sentence and whether
    the chapter's reading of them holds (thresholds far from the measured values; each written beside its value)."""
    c, o = counters, ops
    t = c["ncu_us"]
    per_ffma = lambda op, r: o.loc[r, op] / o.loc[r, "FFMA"]  # noqa: E731
    fma, tensor, conflicts = c["fma_pipe_pct"], c["tensor_pipe_pct"], c["bank_conflicts_M"]
    ls5, ls6 = stalls.loc[5, "long_scoreboard"], stalls.loc[6, "long_scoreboard"]
    busy = at_least(75)  # the tensor pipe of rungs 7 and 8
    return {
        "1->2": _sentence(lambda v: (
            f"rung 1: global loads (LDG) per FFMA {v.value(per_ffma('LDG', 1), at_least(1.5), '.2f')}, leading stall "
            f"{_top_stall(c, 1)} {v.holds(_top_stall(c, 1) == 'lg_throttle', 'the expected one')}; rung 2: LDG per FFMA "
            f"{v.value(per_ffma('LDG', 2), at_most(0.1), '.3f')}")),
        "2->3": _sentence(lambda v: (
            f"rung 2: shared loads (LDS) per FFMA {v.value(per_ffma('LDS', 2), at_least(1), '.2f')}, load/store unit "
            f"{c.loc[2, 'lsu_pct']:.0f}% against FMA pipe {fma[2]:.1f}% "
            f"{v.holds(c.loc[2, 'lsu_pct'] > fma[2], 'LSU busier')}, "
            f"leading stall {_top_stall(c, 2)} {v.holds(_top_stall(c, 2) == 'mio_throttle', 'the expected one')}; rung 3: "
            f"LDS per FFMA {v.value(per_ffma('LDS', 3), at_most(0.1), '.3f')}, FMA pipe {fma[3]:.1f}%, rung 2's times "
            f"{v.value(fma[3] / fma[2], at_least(2), '.1f')}")),
        "3->4": _sentence(lambda v: (
            f"bank conflicts {conflicts[3]:.1f} M -> {conflicts[4]:.2f} M, fewer by "
            f"{v.value(conflicts[3] / max(conflicts[4], 1e-6), at_least(50), '.0f', 'x')}; time under ncu "
            f"{v.value(t[3] / t[4], between(0.85, 1.2), '.2f', 'x')}; rung 3's FMA pipe already busy "
            f"{v.value(fma[3], at_least(40), '.0f', '%')}, issuing {c.loc[3, 'issue_pct']:.0f}% of cycles")),
        "4->5": _sentence(lambda v: (
            f"rung 5: HMMA {v.value(o.loc[5, 'HMMA'], over(0), '.1f', ' M')}, "
            f"FFMA {v.value(o.loc[5, 'FFMA'], equals(0), '.0f')}; "
            f"speed-up on rung 4 under ncu {v.value(t[4] / t[5], at_least(2), '.1f', 'x')}; but the tensor pipe busy "
            f"{v.value(tensor[5], under(50), '.0f', '%')}, with eligible warps per scheduler "
            f"{v.value(c.loc[5, 'eligible_warps'], under(1), '.2f')}")),
        "5->6": _sentence(lambda v: (
            f"rung 6: LDGSTS {v.value(o.loc[6, 'LDGSTS'], over(0), '.1f', ' M')}, "
            f"LDG {v.value(o.loc[6, 'LDG'], equals(0), '.0f')}; tensor pipe {tensor[5]:.0f}% -> {tensor[6]:.0f}%, "
            f"up {v.value(tensor[6] - tensor[5], at_least(10), '.0f', ' points')}; "
            f"long_scoreboard's share of stalls {ls5:.0%} -> {ls6:.0%} {v.holds(ls6 < ls5, 'lower')}")),
        "6->7": _sentence(lambda v: (
            f"rung 7: HGMMA {v.value(o.loc[7, 'HGMMA'], over(0), '.2f', ' M')}, TMA loads (UTMALDG) "
            f"{v.value(o.loc[7, 'UTMALDG'], over(0), '.3f', ' M')}, "
            f"ldmatrix {v.value(o.loc[7, 'LDSM'], equals(0), '.0f')}; "
            f"tensor pipe {v.value(tensor[7], busy, '.0f', '%')}; speed-up on rung 6 under ncu "
            f"{v.value(t[6] / t[7], at_least(1.5), '.1f', 'x')}")),
        "7->8": _sentence(lambda v: (
            f"time under ncu {v.value(t[7] / t[8], between(0.9, 1.1), '.3f', 'x')}; tensor pipe, rung 7 "
            f"{v.value(tensor[7], busy, '.0f', '%')}, rung 8 {v.value(tensor[8], busy, '.0f', '%')}")),
    }


WAIT_GROUP = "wgmma.wait_group"


def line_claims(rows: list[dict]) -> dict[str, dict[str, Any]]:
    """What the Source page says about rungs 5, 7 and 8: the share of rung 5's samples on its global -> shared
    copies waiting on global loads, and the share of rung 7's and 8's on the ``wgmma.wait_group`` line."""
    lines = nd.sampled_lines(pd.DataFrame(rows))
    lines["rung"] = [int(str(k).split("_")[1]) for k in lines["kernel"]]
    copy5 = lines[(lines["rung"] == 5) & lines["source"].str.contains("load16") & (lines["waiting_on"] == "long_scoreboard")]
    share5 = float(copy5["share"].sum())
    wait = {r: float(lines[(lines["rung"] == r) & lines["source"].str.contains(WAIT_GROUP)]["share"].sum()) for r in (7, 8)}
    return {"5": _sentence(lambda v: (
                f"rung 5: warp samples on the lines that copy global -> shared memory, waiting on long_scoreboard: "
                f"{v.value(share5, at_least(0.25), '.0%')}")),
            "7->8": _sentence(lambda v: (
                f"samples on {WAIT_GROUP}: rung 7 {v.value(wait[7], at_least(0.4), '.1%')}, rung 8 {wait[8]:.1%}, fewer by "
                f"{v.value(100 * (wait[7] - wait[8]), at_least(8), '.1f', ' points')}"))}
