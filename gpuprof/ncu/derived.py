"""Quantities derived from a report's counters: the numbers the Nsight Compute chapter reasons with.

Counters say how much happened (sectors, requests, wavefronts, cycles); a diagnosis
needs ratios of them. Each table here is one row per profiled kernel launch, with the
metric names it uses listed in a constant, so that a capture can ask for exactly those
(``--metrics`` on top of the sections) and a reader can see where every column comes from:

* :func:`memory_table`: sectors per request (coalescing), shared-memory wavefronts per
  instruction (bank conflicts), L2 and DRAM throughput, DRAM bytes;
* :func:`occupancy_table`: theoretical and achieved occupancy, the blocks per SM each
  resource allows and which one limits, eligible warps;
* :func:`divergence_table`: active threads per instruction and uniform branches;
* :func:`compute_table`: pipe utilisation and the FLOP counters;
* :func:`stall_table`: the warp-state stall reasons.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .plots import OCCUPANCY_LIMITS, PIPES, SAMPLED_STALLS, STALL_REASONS, stall_metric
from .report import metric_table

__all__ = ["SCHEDULER_METRICS", "ROOFLINE_METRICS", "scheduler_table", "ncu_roofline", "sampled_lines", "spill_table", "SPILL_METRICS", "SPILL_METRICS_OPTION", "MEMORY_METRICS", "OCCUPANCY_METRICS", "DIVERGENCE_METRICS", "COMPUTE_METRICS", "SOL_METRICS",
           "memory_table", "occupancy_table", "divergence_table", "compute_table", "stall_table", "sol_table",
           "metrics_option"]

DURATION = "gpu__time_duration.sum"
SOL_METRICS = [DURATION, "sm__throughput.avg.pct_of_peak_sustained_elapsed",
               "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
               "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
               "lts__throughput.avg.pct_of_peak_sustained_elapsed",
               "l1tex__throughput.avg.pct_of_peak_sustained_active"]
MEMORY_METRICS = [DURATION,
                  "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
                  "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
                  "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum", "smsp__sass_inst_executed_op_shared_ld.sum",
                  "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
                  "lts__throughput.avg.pct_of_peak_sustained_elapsed",
                  "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                  "dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum"]
OCCUPANCY_METRICS = [DURATION, "launch__block_size", "launch__registers_per_thread",
                     "launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic",
                     "sm__maximum_warps_per_active_cycle_pct", "sm__warps_active.avg.pct_of_peak_sustained_active",
                     "smsp__warps_eligible.avg.per_cycle_active", "smsp__issue_active.avg.pct_of_peak_sustained_active",
                     "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", *OCCUPANCY_LIMITS.values()]
DIVERGENCE_METRICS = [DURATION, "smsp__average_thread_inst_executed_per_inst_executed.ratio",
                      "smsp__sass_average_branch_targets_threads_uniform.pct",
                      "smsp__sass_branch_targets_threads_divergent.sum", "smsp__inst_executed.sum",
                      "sm__throughput.avg.pct_of_peak_sustained_elapsed"]
COMPUTE_METRICS = [DURATION, *PIPES.values(), "sm__throughput.avg.pct_of_peak_sustained_elapsed",
                   "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
                   "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum",
                   "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum",
                   "sm__inst_executed_pipe_tensor_op_hmma.sum", "sm__inst_executed_pipe_tensor_op_gmma.sum",
                   "sm__ops_path_tensor_op_hmma_src_bf16_dst_fp32_sparsity_off.sum",
                   "sm__ops_path_tensor_op_hmma_src_tf32_dst_fp32_sparsity_off.sum",
                   "dram__bytes_read.sum", "dram__bytes_write.sum"]


def metrics_option(*groups: list[str]) -> list[str]:
    """``--metrics a,b,...`` for the union of metric lists (in first-seen order), to add to sections."""
    names = list(dict.fromkeys(n for g in groups for n in g if not n.startswith("launch__")))
    return ["--metrics", ",".join(names)]


Source = "str | Path | pd.DataFrame"


def _wide(source: str | Path | pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """Metric columns from a report, or from a table already read (a row per kernel with a
    ``kernel`` column and metric columns, e.g. :func:`gpuprof.studies.nsight_compute.metric_rows`); NaN where absent."""
    if isinstance(source, pd.DataFrame):
        out = source.copy()
        for n in names:
            if n not in out:
                out[n] = float("nan")
        return out[["kernel", *names]].astype({n: float for n in names})
    return metric_table(source, names, missing="nan")


def _ratio(a: pd.Series, b: pd.Series) -> pd.Series:
    return a / b.where(b > 0)


def sol_table(path: str | Path | pd.DataFrame) -> pd.DataFrame:
    """The Speed Of Light section's first table, per kernel launch (percent of each unit's peak)."""
    return _wide(path, SOL_METRICS)


def memory_table(path: str | Path | pd.DataFrame) -> pd.DataFrame:
    """Per launch: duration, global load and store sectors per request (4 is fully coalesced 4-byte
    access by a warp, 32 is one sector per thread), shared-memory wavefronts per shared load
    instruction (1: no bank conflict; 32: a 32-way conflict), L2 and DRAM throughput and DRAM bytes."""
    t = _wide(path, MEMORY_METRICS)
    out = pd.DataFrame({"kernel": t["kernel"], "duration_us": t[DURATION] / 1e3})
    out["ld_sectors_per_request"] = _ratio(t["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"],
                                           t["l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"])
    out["st_sectors_per_request"] = _ratio(t["l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"],
                                           t["l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"])
    out["shared_ld_wavefronts_per_inst"] = _ratio(t["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"],
                                                  t["smsp__sass_inst_executed_op_shared_ld.sum"])
    out["shared_ld_bank_conflicts"] = t["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"]
    out["l2_pct"] = t["lts__throughput.avg.pct_of_peak_sustained_elapsed"]
    out["dram_pct"] = t["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"]
    out["dram_gb"] = (t["dram__bytes_read.sum"] + t["dram__bytes_write.sum"]) / 1e9
    return out


def occupancy_table(path: str | Path | pd.DataFrame) -> pd.DataFrame:
    """Per launch: block size, theoretical and achieved occupancy (% of the SM's warp slots), the
    blocks per SM that each resource allows and the one that limits, eligible warps per scheduler
    cycle, issue-slot use and the share of cycles with no eligible warp, DRAM throughput."""
    t = _wide(path, OCCUPANCY_METRICS)
    out = pd.DataFrame({"kernel": t["kernel"], "block": t["launch__block_size"], "duration_us": t[DURATION] / 1e3,
                        "theoretical_pct": t["sm__maximum_warps_per_active_cycle_pct"],
                        "achieved_pct": t["sm__warps_active.avg.pct_of_peak_sustained_active"]})
    limits = pd.DataFrame({name: t[metric] for name, metric in OCCUPANCY_LIMITS.items()})
    for name in limits:
        out[f"limit_{name.replace(' ', '_')}"] = limits[name]
    lim = limits.astype(float)
    lowest = lim.min(axis=1)
    out["limiter"] = [" = ".join(c for c in lim.columns if row[c] == low) for (_, row), low in zip(lim.iterrows(), lowest)]
    out["eligible_warps"] = t["smsp__warps_eligible.avg.per_cycle_active"]
    out["issue_active_pct"] = t["smsp__issue_active.avg.pct_of_peak_sustained_active"]
    # The details page's "No Eligible": the share of a scheduler's cycles with no warp ready to
    # issue, the complement of the cycles it issued in. An average of eligible warps near one
    # can hide that most cycles had none (eligibility comes in bursts); this column does not.
    out["no_eligible_pct"] = 100.0 - out["issue_active_pct"]
    out["dram_pct"] = t["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"]
    return out


def divergence_table(path: str | Path | pd.DataFrame) -> pd.DataFrame:
    """Per launch: active threads per executed warp instruction (32 when no lane is idle), the share
    of branches whose threads all went the same way, divergent branch targets, instructions."""
    t = _wide(path, DIVERGENCE_METRICS)
    return pd.DataFrame({"kernel": t["kernel"], "duration_us": t[DURATION] / 1e3,
                         "threads_per_inst": t["smsp__average_thread_inst_executed_per_inst_executed.ratio"],
                         "uniform_branch_pct": t["smsp__sass_average_branch_targets_threads_uniform.pct"],
                         "divergent_targets": t["smsp__sass_branch_targets_threads_divergent.sum"],
                         "warp_instructions": t["smsp__inst_executed.sum"],
                         "sm_pct": t["sm__throughput.avg.pct_of_peak_sustained_elapsed"]})


def compute_table(path: str | Path | pd.DataFrame) -> pd.DataFrame:
    """Per launch: how busy each pipe was, the FP32 operations ncu counted (an FFMA is two), the tensor
    operations and instructions (``mma.sync``, Hopper's ``wgmma``), and DRAM bytes."""
    t = _wide(path, COMPUTE_METRICS)
    out = pd.DataFrame({"kernel": t["kernel"], "duration_us": t[DURATION] / 1e3})
    for label, metric in PIPES.items():
        out[f"{label} pipe %"] = t[metric]
    out["fp32_flop"] = (2 * t["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"]
                        + t["smsp__sass_thread_inst_executed_op_fadd_pred_on.sum"]
                        + t["smsp__sass_thread_inst_executed_op_fmul_pred_on.sum"])
    # Tensor-core operations of mma.sync (HMMA) instructions, BF16 and TF32 inputs: for a
    # product, 2 n^3. Hopper's wgmma instructions are counted apart (their operations are not
    # in these counters), and the tensor pipe's instruction counter includes them.
    out["mma_sync_ops"] = (t["sm__ops_path_tensor_op_hmma_src_bf16_dst_fp32_sparsity_off.sum"].fillna(0)
                           + t["sm__ops_path_tensor_op_hmma_src_tf32_dst_fp32_sparsity_off.sum"].fillna(0))
    out["tensor_pipe_inst"] = t["sm__inst_executed_pipe_tensor_op_hmma.sum"]
    out["wgmma_inst"] = t["sm__inst_executed_pipe_tensor_op_gmma.sum"]
    out["dram_bytes"] = t["dram__bytes_read.sum"] + t["dram__bytes_write.sum"]
    return out


def stall_table(path: str | Path | pd.DataFrame) -> pd.DataFrame:
    """Per launch: cycles stalled per issued instruction, by reason (Warp State Statistics); NaN where
    the report lacks the section."""
    t = _wide(path, [stall_metric(r) for r in STALL_REASONS])
    return t


# Scheduler Statistics and Warp State Statistics: the "latency" branch of NVIDIA's workflow
# (neither the SM nor memory near its peak: are there warps ready to issue, and if not, why?).
SCHEDULER_METRICS = [DURATION, "sm__throughput.avg.pct_of_peak_sustained_elapsed",
                     "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
                     "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                     "l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_elapsed",
                     "smsp__warps_active.avg.per_cycle_active", "smsp__warps_eligible.avg.per_cycle_active",
                     "smsp__issue_active.avg.pct_of_peak_sustained_active",
                     "smsp__average_warp_latency_per_inst_issued.ratio",
                     "sm__maximum_warps_per_active_cycle_pct", "sm__warps_active.avg.pct_of_peak_sustained_active",
                     "launch__registers_per_thread", "launch__block_size"]


def scheduler_table(path: str | Path | pd.DataFrame) -> pd.DataFrame:
    """Per launch: how busy the SM and memory were, the L1 data pipe (shared and global loads go
    through it), warps resident and eligible per scheduler, the share of cycles a scheduler
    issued, the cycles between two instructions of one warp, and the two leading stall reasons
    (cycles per issued instruction)."""
    t = _wide(path, SCHEDULER_METRICS)
    out = pd.DataFrame({"kernel": t["kernel"], "duration_us": t[DURATION] / 1e3,
                        "sm_pct": t["sm__throughput.avg.pct_of_peak_sustained_elapsed"],
                        "memory_pct": t["gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"],
                        "dram_pct": t["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"],
                        "l1_lsu_pct": t["l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_elapsed"],
                        "active_warps": t["smsp__warps_active.avg.per_cycle_active"],
                        "eligible_warps": t["smsp__warps_eligible.avg.per_cycle_active"],
                        "issue_active_pct": t["smsp__issue_active.avg.pct_of_peak_sustained_active"],
                        "cycles_per_issue": t["smsp__average_warp_latency_per_inst_issued.ratio"],
                        "achieved_occupancy_pct": t["sm__warps_active.avg.pct_of_peak_sustained_active"],
                        "theoretical_occupancy_pct": t["sm__maximum_warps_per_active_cycle_pct"],
                        "registers": t["launch__registers_per_thread"], "block": t["launch__block_size"]})
    st = stall_table(path)
    short = {c: c.replace("smsp__average_warps_issue_stalled_", "").replace("_per_issue_active.ratio", "")
             for c in st.columns if c.startswith("smsp__")}
    reasons = st[list(short)].astype(float).rename(columns=short).drop(columns=["selected"], errors="ignore")
    out["top_stalls"] = [", ".join(f"{k} {v:.1f}" for k, v in row.dropna().nlargest(2).items())
                         for _, row in reasons.iterrows()]
    return out


# The metrics of ncu's own roofline chart (section SpeedOfLight_RooflineChart, ncu 2025.3):
# achieved FP32 work is FADD + FMUL + 2 x FFMA thread instructions per cycle times the SM
# clock; the peak is 2 x the FFMA peak per cycle times the same clock; the memory roof is
# DRAM bytes per cycle at peak times the DRAM clock. Tensor-core instructions are not in it.
ROOFLINE_METRICS = [DURATION, "sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained",
                    "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum.per_cycle_elapsed",
                    "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum.per_cycle_elapsed",
                    "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum.per_cycle_elapsed",
                    "sm__cycles_elapsed.avg.per_second", "smsp__cycles_elapsed.avg.per_second",
                    "dram__bytes.sum.peak_sustained", "dram__cycles_elapsed.avg.per_second", "dram__bytes.sum.per_second"]


def ncu_roofline(path: str | Path | pd.DataFrame) -> pd.DataFrame:
    """Per launch, the point and roofs of ncu's single-precision roofline chart, computed as the
    section file defines them: achieved and peak FP32 FLOP/s at the clock the kernel ran at under
    ncu, the DRAM roof, DRAM bytes/s, the intensity (FLOP per DRAM byte) and the ridge point."""
    t = _wide(path, ROOFLINE_METRICS)
    achieved = (t["smsp__sass_thread_inst_executed_op_fadd_pred_on.sum.per_cycle_elapsed"]
                + t["smsp__sass_thread_inst_executed_op_fmul_pred_on.sum.per_cycle_elapsed"]
                + 2 * t["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum.per_cycle_elapsed"]) \
        * t["smsp__cycles_elapsed.avg.per_second"]
    peak = 2 * t["sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained"] * t["sm__cycles_elapsed.avg.per_second"]
    dram_peak = t["dram__bytes.sum.peak_sustained"] * t["dram__cycles_elapsed.avg.per_second"]
    dram = t["dram__bytes.sum.per_second"]
    return pd.DataFrame({"kernel": t["kernel"], "fp32_tflops": achieved / 1e12, "fp32_peak_tflops": peak / 1e12,
                         "sm_ghz": t["sm__cycles_elapsed.avg.per_second"] / 1e9, "dram_tbps": dram / 1e12,
                         "dram_peak_tbps": dram_peak / 1e12, "intensity": _ratio(achieved, dram),
                         "ridge": peak / dram_peak})


def sampled_lines(lines: pd.DataFrame) -> pd.DataFrame:
    """Per-line program-counter samples (rows of :func:`gpuprof.ncu.capture.source_lines` or
    :func:`gpuprof.ncu.report.source_counters` with ``smsp__pcsamp_*`` counters) with each line's
    share of its kernel's samples and the stall state most of its samples were in, lines with
    samples only, most sampled first within each kernel."""
    df = lines[lines["smsp__pcsamp_sample_count"] > 0].copy()
    df["share"] = df["smsp__pcsamp_sample_count"] / df.groupby("kernel")["smsp__pcsamp_sample_count"].transform("sum")
    cols = [c for c in (f"smsp__pcsamp_warps_issue_stalled_{r}" for r in SAMPLED_STALLS) if c in df]
    df["waiting_on"] = df[cols].idxmax(axis=1).str.replace("smsp__pcsamp_warps_issue_stalled_", "", regex=False)
    order = {k: i for i, k in enumerate(dict.fromkeys(df["kernel"]))}
    df["_k"] = df["kernel"].map(order)
    return df.sort_values(["_k", "share"], ascending=[True, False]).drop(columns="_k").reset_index(drop=True)


# Register spills: what a kernel squeezed into fewer registers does to local memory.
SPILL_METRICS = [DURATION, "launch__registers_per_thread", "smsp__sass_inst_executed_op_local_ld.sum",
                 "smsp__sass_inst_executed_op_local_st.sum", "sass__inst_executed_register_spilling",
                 "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_sector_pipe_lsu_mem_local_op_ld_hit_rate.pct",
                 "sm__maximum_warps_per_active_cycle_pct", "dram__bytes_read.sum", "dram__bytes_write.sum"]
# What to name in --metrics: sass__inst_executed_register_spilling comes with the MemoryWorkloadAnalysis
# section (with its "Local Memory Spilling Requests" rows); MemoryWorkloadAnalysis_Tables alone lacks it.
SPILL_METRICS_OPTION = [m for m in SPILL_METRICS if not m.startswith("sass__")]


def spill_table(path: str | Path | pd.DataFrame) -> pd.DataFrame:
    """Per launch: registers per thread, local-memory load and store instructions (warp level),
    the spilling instructions ncu attributes to register spills, local-load sectors and their L1
    hit rate, theoretical occupancy and DRAM bytes."""
    t = _wide(path, SPILL_METRICS)
    return pd.DataFrame({"kernel": t["kernel"], "duration_us": t[DURATION] / 1e3,
                         "registers": t["launch__registers_per_thread"],
                         "local_loads": t["smsp__sass_inst_executed_op_local_ld.sum"],
                         "local_stores": t["smsp__sass_inst_executed_op_local_st.sum"],
                         "spilling_inst": t["sass__inst_executed_register_spilling"],
                         "local_ld_sectors": t["l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum"],
                         "local_ld_l1_hit_pct": t["l1tex__t_sector_pipe_lsu_mem_local_op_ld_hit_rate.pct"],
                         "theoretical_occupancy_pct": t["sm__maximum_warps_per_active_cycle_pct"],
                         "dram_gb": (t["dram__bytes_read.sum"] + t["dram__bytes_write.sum"]) / 1e9})
