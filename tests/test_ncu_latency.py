"""Readers for the latency branch and its neighbours: instruction mix, per-line samples, scheduler
statistics, ncu's own roofline, spills, ptxas's report and the replay-mode table.

They read the course's real reports (no GPU, no ncu); the formulas are also checked on
small tables whose answer is known.
"""

import pandas as pd
import pytest

from gpuprof import kernels as gk
from gpuprof.artifacts import REPO_ROOT
from gpuprof.errors import GpuprofError
from gpuprof.ncu import capture as ncap, derived, plots as nplots, report as nr
from gpuprof.studies import replay_modes as replay

LADDER = REPO_ROOT / "artifacts" / "ch04" / "ladder.ncu-rep"
OCCUPANCY = REPO_ROOT / "artifacts" / "ch04" / "occupancy.ncu-rep"
EX = REPO_ROOT / "examples" / "nsight_compute"


def test_instruction_mix_adds_up_to_the_warp_instructions_executed():
    total = nr.metric_table(LADDER, ["smsp__inst_executed.sum"]).set_index("kernel")["smsp__inst_executed.sum"]
    for kernel in ("transpose_naive", "transpose_tiled"):
        mix = nr.instances(LADDER, kernel, "sass__inst_executed_per_opcode")
        assert mix.sum() == total[kernel]
        assert list(mix) == sorted(mix, reverse=True)
    naive = nr.instances(LADDER, "transpose_naive", "sass__inst_executed_per_opcode")
    assert naive["LDG"] == naive["STG"] and "LDS" not in naive  # one load, one store per element; no shared memory
    tiled = nr.instances(LADDER, "transpose_tiled", "sass__inst_executed_per_opcode")
    assert tiled["LDS"] == tiled["STS"] == tiled["LDG"]  # through the shared tile


def test_instances_of_a_metric_the_report_lacks_say_which_section():
    with pytest.raises(GpuprofError, match="InstructionStats"):
        nr.instances(OCCUPANCY, "reverse_chunks", "sass__inst_executed_per_opcode")


def test_per_line_samples_give_shares_and_a_stall_state():
    counters = ["smsp__pcsamp_sample_count", *(f"smsp__pcsamp_warps_issue_stalled_{r}" for r in nplots.SAMPLED_STALLS)]
    lines = pd.concat([nr.source_counters(LADDER, k, counters, search=[EX]) for k in ("transpose_tiled", "transpose_naive")])
    hot = derived.sampled_lines(lines)
    assert list(hot["kernel"].unique()) == ["transpose_tiled", "transpose_naive"]
    for _, part in hot.groupby("kernel"):
        assert part["share"].sum() == pytest.approx(1.0)
        assert list(part["share"]) == sorted(part["share"], reverse=True)
    assert set(hot["waiting_on"]) <= set(nplots.SAMPLED_STALLS)
    # the tiled kernel's read of the transposed tile (32-way bank conflicts) is among its most sampled lines
    tiled = hot[hot["kernel"] == "transpose_tiled"].head(2)
    assert tiled["source"].str.contains(r"tile\[threadIdx.x\]\[threadIdx.y \+ j\]", regex=True).any()


def test_sass_counters_agree_with_the_line_table_and_show_the_instructions():
    counters = ["inst_executed", "smsp__pcsamp_sample_count"]
    sass = nr.sass_counters(LADDER, "transpose_naive", counters)
    lines = nr.source_counters(LADDER, "transpose_naive", counters, search=[EX])
    for c in counters:
        assert sass[c].sum() == lines[c].sum()  # the same instructions, summed another way
    assert sass["offset"].iloc[0] == 0 and (sass["offset"].diff().dropna() > 0).all()
    stores = sass[sass["sass"].str.startswith("STG")]
    assert len(stores) == 4 and (stores["line"] == 29).all()  # the four stores of the naive kernel's one line
    with pytest.raises(GpuprofError, match="SourceCounters"):
        nr.sass_counters(OCCUPANCY, "reverse_chunks", counters)


def test_no_eligible_is_the_details_page_share_of_cycles_without_an_eligible_warp():
    occ = derived.occupancy_table(OCCUPANCY)
    page = nr.sections(OCCUPANCY)
    shown = page[page["Metric Name"] == "No Eligible"]["value"].to_numpy()
    assert len(shown) == len(occ)
    assert occ["no_eligible_pct"].to_numpy() == pytest.approx(shown, abs=0.01)


def test_scheduler_table_agrees_with_the_occupancy_table():
    sched = derived.scheduler_table(OCCUPANCY)
    occ = derived.occupancy_table(OCCUPANCY)
    assert list(sched["eligible_warps"]) == list(occ["eligible_warps"])
    assert sched["top_stalls"].str.count(",").eq(1).all()  # two reasons each, named with their cycles
    assert not sched["top_stalls"].str.contains("selected").any()


def test_ncu_roofline_follows_the_section_definition():
    row = {"kernel": "k", "gpu__time_duration.sum": 1000.0,
           "sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained": 100.0,
           "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum.per_cycle_elapsed": 40.0,
           "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum.per_cycle_elapsed": 10.0,
           "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum.per_cycle_elapsed": 5.0,
           "sm__cycles_elapsed.avg.per_second": 2e9, "smsp__cycles_elapsed.avg.per_second": 2e9,
           "dram__bytes.sum.peak_sustained": 1000.0, "dram__cycles_elapsed.avg.per_second": 3e9,
           "dram__bytes.sum.per_second": 1e12}
    r = derived.ncu_roofline(pd.DataFrame([row])).iloc[0]
    assert r.fp32_tflops == pytest.approx((10 + 5 + 2 * 40) * 2e9 / 1e12)
    assert r.fp32_peak_tflops == pytest.approx(2 * 100 * 2e9 / 1e12)
    assert r.dram_peak_tbps == pytest.approx(3.0) and r.intensity == pytest.approx(0.19)
    assert r.ridge == pytest.approx(400e9 / 3e12)


def test_spill_table_on_a_report_without_spills():
    sp = derived.spill_table(LADDER)
    assert (sp["local_loads"] == 0).all() and (sp["spilling_inst"] == 0).all() and (sp["registers"] > 0).all()


PTXAS = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'accumulate_spilled' for 'sm_90'
ptxas info    : Function properties for accumulate_spilled
    272 bytes stack frame, 1280 bytes spill stores, 912 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 272 bytes cumulative stack size
ptxas info    : Compile time = 66.844 ms
ptxas info    : Compiling entry function 'accumulate_in_registers' for 'sm_90'
ptxas info    : Function properties for accumulate_in_registers
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 80 registers, used 0 barriers
"""


def test_ptxas_report_parsed_per_kernel():
    got = gk.parse_ptxas_verbose(PTXAS)
    assert got == {"accumulate_spilled": {"stack_bytes": 272, "spill_store_bytes": 1280, "spill_load_bytes": 912,
                                          "registers": 32},
                   "accumulate_in_registers": {"stack_bytes": 0, "spill_store_bytes": 0, "spill_load_bytes": 0,
                                               "registers": 80}}


def test_ncu_warnings_and_errors_are_kept_without_their_prefix():
    log = "==PROF== Connected\n==WARNING== Range replay saw no kernel\nprogram output\n==ERROR== Failed to profile\n"
    assert ncap.ncu_said(log) == ["Range replay saw no kernel", "Failed to profile"]


def test_replay_table_without_ncu_is_one_sentence(clean_tool_env):
    with pytest.raises(GpuprofError, match="ncu cannot run here"):
        replay.replay_mode_table(EX / "replay_modes.py")
