"""The multi-GPU chapter's measurements: data-parallel training and all-reduce bandwidth on several GPUs.

Chapter 8 runs ``examples/nsys/ddp_training.py`` (DistributedDataParallel over NCCL) and
``examples/nsys/allreduce_bandwidth.py`` with torchrun, one process per GPU. This module
holds what the chapter would otherwise spell out in cells:

* captures: :func:`capture_ranks` (one nsys report per rank), :func:`capture_launcher` (one
  report for torchrun and all its processes), :func:`run_json` (a script's own timings);
  each falls back to the course's reference when this machine has fewer GPUs than ranks;
* the chapter's reading of captures split by rank (:mod:`gpuprof.nsys.ranks` splits them:
  one report per rank or one for all, the rank read from the ``rank_R`` NVTX range each
  process opens), per bucket size (:func:`step_windows`);
* :func:`overlap_table`: per bucket size and rank, how much of the all-reduce time ran
  under compute kernels, the same measure as the copy/compute overlap of the Nsight
  Systems chapter (:func:`gpuprof.activity.copy_compute_overlap`);
* :func:`knob_table`: DDP's knobs timed side by side (``ddp_knobs.py``), over several jobs;
* :func:`bucket_layouts`: which gradients share a bucket, per ``bucket_cap_mb``, as DDP
  itself all-reduces them (``ddp_buckets.py``; on the CPU, since a layout depends on the
  parameters' sizes alone), and :func:`layout_table`;
* :func:`straggler_table`, :func:`bandwidth_table`, :func:`torch_trace_table`, :func:`trace_arrivals`
  (which rank reached each collective first, from the per-rank torch.profiler traces),
  :func:`trace_idle_breakdown` (HTA's idle-time breakdown of the same traces, per stream), and the figures.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from .. import activity as ta
from ..artifacts import REPO_ROOT, FoundCapture, atomic_write_bytes, chapter_output, find_capture, record_file, save_json
from ..backend import describe_machine
from ..errors import GpuprofError
from ..kernel_kinds import is_communication
from ..nsys.capture import QUIET, nsys_capture, nsys_capture_ranks, reference_capture
from ..nsys.ranks import RankData, comm_overlap
from ..runner import python_target, run_streaming, run_with_limit, shell_line, torchrun_target
from ..script_results import run_for_json
from ..tools import LiveTool, live_tool
from ..torch_profiler import hta_compat
from ..torch_profiler.trace import read_trace

__all__ = ["DDP", "KNOBS", "ALLREDUCE", "knob_table", "NPROC", "gpus_here", "enough_gpus", "capture_ranks", "capture_launcher",
           "run_json", "knob_jobs", "channel_jobs", "channel_table", "untraced_steps", "by_bucket", "latency_bandwidth_fit", "bucket_model", "bucket_bandwidth", "step_windows", "overlap_steps", "overlap_table", "steady_steps", "STEADY_COMM_RATIO", "straggler_table", "longest_wait_per_step", "kernels_beside_wait",
           "bandwidth_table", "bandwidth_figure", "overlap_figure", "rank_timeline", "torch_trace_table", "trace_arrivals", "trace_idle_breakdown", "host_wait_beyond_syncs",
           "run_script", "ncu_on_collective", "BUCKET_LAYOUT", "bucket_layouts", "layout_table", "parse_nccl_choices", "nccl_choices", "nccl_choice_table"]

DDP = REPO_ROOT / "examples" / "nsys" / "ddp_training.py"
KNOBS = REPO_ROOT / "examples" / "nsys" / "ddp_knobs.py"
BUCKET_LAYOUT = REPO_ROOT / "examples" / "nsys" / "ddp_buckets.py"
ALLREDUCE = REPO_ROOT / "examples" / "nsys" / "allreduce_bandwidth.py"
NPROC = 2
BUCKET_RANGE = re.compile(r"bucket_([\d.]+)MB")


def gpus_here() -> int:
    """CUDA GPUs this process sees (0 without a GPU or without a CUDA build of PyTorch)."""
    return describe_machine().gpus


def enough_gpus(n: int = NPROC) -> str | None:
    """None when this machine can run ``n`` ranks on ``n`` GPUs, else the reason it cannot."""
    have = gpus_here()
    if have >= n:
        return None
    return "this machine has no GPU" if have == 0 else f"this machine has {have} GPU(s) and the run needs {n}"


def capture_ranks(chapter: str, name: str, args: Sequence[str], options: Sequence[str] | None = None) -> list[Any]:
    """ddp_training.py under nsys, one report per rank (``<name>_rank<R>.sqlite``), or the references."""
    return nsys_capture_ranks(chapter, name, DDP, args, nproc=NPROC, options=list(options or QUIET))


def capture_launcher(chapter: str, name: str, args: Sequence[str], options: Sequence[str] | None = None) -> Any:
    """nsys around torchrun: one report holding the launcher and every rank's process, or the reference."""
    reason = enough_gpus()
    if reason:
        return reference_capture(chapter, name, [], reason)
    return nsys_capture(chapter, name, target=torchrun_target(DDP, *args, nproc=NPROC), options=list(options or QUIET))


def run_json(chapter: str, filename: str, script: Path, args: Sequence[str], **kw: Any) -> FoundCapture:
    """A script's own results (``--json``) from NPROC ranks through torchrun, or the reference with the reason."""
    return run_for_json(chapter, filename, script, args, nproc=NPROC, **kw)


def knob_jobs(chapter: str, args: Sequence[str], jobs: int = 3, stem: str = "knobs",
              env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """``ddp_knobs.py args`` through torchrun ``jobs`` times, each in processes started afresh (``<stem>_<i>.json``).

    Between-process noise is larger than the noise within one, so a knob's effect is read
    over several jobs (:func:`knob_table`). ``env`` is added to the jobs' environment (NCCL
    reads its settings from there). Where this machine has fewer GPUs than ranks, the
    course's reference jobs, with the reason said once.
    """
    reason = enough_gpus()
    if reason:
        print(f"No live run: {reason}; showing the course's reference results ({jobs} jobs).")
        return [find_capture(chapter, f"{stem}_{i}.json", prefer="reference").json() for i in range(1, jobs + 1)]
    print(f"$ {_knobs_command(args, env)} --json {stem}_<i>.json   # {jobs} times", flush=True)
    return [_knob_job(chapter, f"{stem}_{i}.json", args, env, f"job {i}/{jobs}") for i in range(1, jobs + 1)]


def _knobs_command(args: Sequence[str], env: dict[str, str] | None) -> str:
    """``ddp_knobs.py args`` under torchrun as a reader would type it, NCCL's variables first."""
    return shell_line(torchrun_target(KNOBS, *args, nproc=NPROC), env)


def _knob_job(chapter: str, filename: str, args: Sequence[str], env: dict[str, str] | None, label: str) -> dict[str, Any]:
    """One ``ddp_knobs.py`` job on this machine's GPUs, kept as ``<chapter>/<filename>``; says how long it took."""
    t0 = time.perf_counter()
    result = run_json(chapter, filename, KNOBS, args, echo=False, env=env).json()
    print(f"  {label} done in {time.perf_counter() - t0:.0f} s", flush=True)
    return result


def channel_jobs(chapter: str, channels: int = 4, args: Sequence[str] = ("--bucket-mb", "100"),
                 jobs: int = 3) -> dict[str, list[dict[str, Any]]]:
    """FP32 DDP with and without sync (``ddp_knobs.py``), once with NCCL's own channel count and once capped.

    NCCL reads ``NCCL_MAX_NCHANNELS`` once per process, so the two settings cannot share a
    job: they alternate, ``jobs`` jobs each (``channels_default_<i>.json`` and
    ``channels_max<N>_<i>.json``), the order swapped every pair so that neither always runs
    first. The ``+nosync`` variant, which all-reduces nothing, is the yardstick within each job.
    Returns ``{"default": [...], "max<N>": [...]}``; the references where two GPUs are missing.
    """
    settings: dict[str, dict[str, str] | None] = {"default": None, f"max{channels}": {"NCCL_MAX_NCHANNELS": str(channels)}}
    common = [*args, "--variants", "fp32,fp32+nosync", "--rounds", "3"]
    reason = enough_gpus()
    if reason:
        print(f"No live run: {reason}; showing the course's reference results ({jobs} jobs of each setting).")
        return {name: [find_capture(chapter, f"channels_{name}_{i}.json", prefer="reference").json()
                       for i in range(1, jobs + 1)] for name in settings}
    for name, env in settings.items():
        print(f"$ {_knobs_command(common, env)} --json channels_{name}_<i>.json   # {jobs} times", flush=True)
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in settings}
    for i in range(1, jobs + 1):
        for name in (list(settings) if i % 2 else list(settings)[::-1]):
            out[name].append(_knob_job(chapter, f"channels_{name}_{i}.json", common, settings[name],
                                       f"job {i}/{jobs}, channels {name}"))
    return out


def channel_table(runs: dict[str, list[dict[str, Any]]]) -> pd.DataFrame:
    """Per channel setting (rows): the FP32 step, the step without sync and what syncing costs, median and range over jobs.

    Read from :func:`knob_table` of each setting's jobs; ``nosync`` rows all-reduce nothing,
    so they differ between settings by the noise between jobs alone.
    """
    rows = {}
    for name, jobs in runs.items():
        t = knob_table(jobs)
        fp, ns = t.loc["fp32"], t.loc["fp32+nosync"]
        rows[name] = {"step_ms": fp["step_ms"], "step_lo": fp["step_lo"], "step_hi": fp["step_hi"],
                      "nosync_ms": ns["step_ms"], "nosync_lo": ns["step_lo"], "nosync_hi": ns["step_hi"],
                      "sync_cost_ms": fp["sync_cost_ms"], "sync_cost_lo": fp["sync_cost_lo"],
                      "sync_cost_hi": fp["sync_cost_hi"], "jobs": int(fp["jobs"]),
                      "NCCL_MAX_NCHANNELS": jobs[0].get("nccl_environment", {}).get("NCCL_MAX_NCHANNELS", "unset")}
    return pd.DataFrame.from_dict(rows, orient="index")


def run_script(script: Path, args: Sequence[str] = (), timeout_s: int = 300, shown: Sequence[str] | None = None) -> str:
    """Run a course script as one process on this machine, its output shown as it comes; returns the output.

    ``shown``: the arguments to print instead of ``args`` (a temporary file's path named by its file name).
    """
    cmd = python_target(script, *args)
    print("$ " + shell_line(python_target(script, *(args if shown is None else shown))), flush=True)
    code, lines = run_streaming(cmd, timeout_s, name=Path(script).name)
    if code != 0:
        raise GpuprofError(f"{Path(script).name} failed (exit {code}): {' | '.join(lines[-3:])}")
    return "\n".join(lines)


def bucket_layouts(args: Sequence[str] = ()) -> dict[str, Any]:
    """``ddp_buckets.py args`` run here as one process, its transcript shown; returns its JSON.

    It runs on the CPU on any machine: which gradients share a bucket depends on the
    parameters' sizes and the order backward produces them, not on the device.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ddp_buckets.json"
        run_script(BUCKET_LAYOUT, [*args, "--json", str(out)], shown=[*args, "--json", out.name])
        return json.loads(out.read_text())


def layout_table(layouts: dict[str, Any]) -> pd.DataFrame:
    """One row per ``bucket_cap_mb`` (``"not given"``: DDP's default): buckets in the first step and from the
    second on, whether the later steps all kept one layout, and the first (the first all-reduced) and largest
    bucket in MiB."""
    rows = []
    for row in layouts["layouts"]:
        first, later = row["steps"][0], row["steps"][1:]
        cap = "not given" if row["bucket_cap_mb"] is None else f"{row['bucket_cap_mb']:g}"
        rows.append({"bucket_cap_mb": cap, "first_step_buckets": len(first),
                     "buckets": len(later[0]), "stable": all(step == later[0] for step in later),
                     "first_bucket_mib": later[0][0] / 2**20, "largest_mib": max(later[0]) / 2**20,
                     "total_mib": sum(later[0]) / 2**20})
    return pd.DataFrame(rows).set_index("bucket_cap_mb")


def ncu_on_collective(chapter: str, name: str = "ncu_nccl", timeout_s: int = 45) -> tuple[str, FoundCapture]:
    """Nsight Compute asked to profile the first NCCL kernel of a two-rank all-reduce, with a time limit.

    ncu serialises the kernels of all the processes it profiles; an NCCL kernel waits for
    its peers, whose kernels wait for it. Returns ("timed out" | "finished" | "failed",
    the transcript), or the reference transcript where this machine cannot try.
    """
    filename = f"{name}.txt"
    reason = enough_gpus()
    live = live_tool("ncu") if reason is None else LiveTool(None, reason=reason)
    if not live:
        print(f"No live ncu run: {live.reason}; showing the course's reference transcript.")
        found = find_capture(chapter, filename, prefer="reference")
        return found.path.read_text().splitlines()[0].removeprefix("# outcome: "), found
    ncu, version = live
    program = torchrun_target(ALLREDUCE, "--sizes", "1M", "--iterations", "1", "--warmup", "0", "--copy-mb", "0")
    cmd = [str(ncu.path), "--target-processes", "all", "-k", "regex:nccl", "-c", "1", *program]
    shown = shell_line(cmd)
    print(f"$ {shown}\n  (limit {timeout_s} s)", flush=True)
    code, out, seconds = run_with_limit(cmd, timeout_s)  # on time-out: ncu, torchrun and both ranks killed, and gone
    outcome = "timed out" if code is None else "finished" if code == 0 else "failed"
    text = (f"# outcome: {outcome}\n# after {seconds:.0f} s (limit {timeout_s} s), ncu {version}, exit {code}\n"
            f"$ {shown}\n{out}")
    atomic_write_bytes(chapter_output(chapter) / filename, text.encode(), overwrite=True)
    record_file(chapter, filename, shown, {"ncu": version})
    return outcome, find_capture(chapter, filename)


# What NCCL logs for every collective with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING (2.28:
# "AllReduce: 1048576 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}"); the GPU's index is in [brackets] before it.
NCCL_CHOICE = re.compile(r"\[(\d+)\] NCCL INFO (\w+): (\d+) Bytes -> Algo (\w+) proto (\w+)"
                         r"(?: channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\})?")


def parse_nccl_choices(log: str) -> pd.DataFrame:
    """NCCL's own record of the algorithm, protocol and channels it chose, one row per (GPU, collective, size, choice)
    with the number of calls; empty if the log has no TUNING lines."""
    rows = [{"device": int(m[1]), "collective": m[2], "bytes": int(m[3]), "algorithm": m[4], "protocol": m[5],
             "channels": int(m[7]) - int(m[6]) + 1 if m[6] is not None else np.nan} for m in NCCL_CHOICE.finditer(log)]
    cols = ["device", "collective", "bytes", "algorithm", "protocol", "channels"]
    if not rows:
        return pd.DataFrame(columns=[*cols, "calls"])
    t = pd.DataFrame(rows)
    return t.groupby(cols, dropna=False).size().rename("calls").reset_index()


def nccl_choices(chapter: str, filename: str = "nccl_tuning.json", sizes: str = "64K,1M,16M,64M,256M,512M",
                 timeout_s: int = 180, env: dict[str, str] | None = None) -> FoundCapture:
    """The algorithm and protocol NCCL chose for all-reduces of each size, from its own log, or the reference.

    Kernel names do not say (NCCL 2.28 compiles one all-reduce kernel per data type and
    ring/tree, always named ``..._LL``, and passes the real choice in each work item); NCCL
    logs it per collective with ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING``. This runs
    ``allreduce_bandwidth.py`` for ``sizes`` on NPROC ranks with that logging and keeps the
    parsed table (and the command, NCCL's version line) as ``<chapter>/<filename>``. ``env``:
    NCCL settings to run under (``{"NCCL_MAX_NCHANNELS": "4"}``), logged the same way.
    """
    reason = enough_gpus()
    if reason:
        print(f"No live run: {reason}; showing the course's reference log instead.")
        return find_capture(chapter, filename, prefer="reference")
    cmd = torchrun_target(ALLREDUCE, "--sizes", sizes, "--iterations", "2", "--warmup", "1", "--repeats", "1",
                          "--copy-mb", "0")
    env = {**(env or {}), "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,TUNING"}
    shown = shell_line(cmd, env)
    print(f"$ {shown}", flush=True)
    code, out, seconds = run_with_limit(cmd, timeout_s, env=env)
    if code != 0:
        raise GpuprofError(f"the all-reduce run failed (exit {code}) after {seconds:.0f} s: {' | '.join(out.splitlines()[-3:])}")
    table = parse_nccl_choices(out)
    version = next((line.split("NCCL INFO ", 1)[1] for line in out.splitlines() if "NCCL version" in line), "unknown")
    save_json(chapter, filename, {"command": shown, "nccl": version, "choices": table.to_dict(orient="records")},
              overwrite=True, command=shown)
    print(f"  ({seconds:.0f} s; {int(table['calls'].sum()) if len(table) else 0} collectives logged; {version})")
    return find_capture(chapter, filename)


def nccl_choice_table(found: FoundCapture) -> pd.DataFrame:
    """All-reduce choices by message size, as NCCL logged them on GPU 0 (every rank makes the same choice)."""
    t = pd.DataFrame(found.json()["choices"])
    t = t[(t["collective"] == "AllReduce") & (t["device"] == 0)]
    return t.drop(columns=["device", "collective"]).sort_values("bytes").reset_index(drop=True)


def step_windows(ranges: pd.DataFrame) -> pd.DataFrame:
    """The timed steps of each bucket size: bucket_mb, step (name), start, end (the warm-up left out by name)."""
    buckets = ranges[ranges["text"].str.fullmatch(BUCKET_RANGE.pattern)]
    steps = ta.step_ranges(ranges)
    rows = []
    for b in buckets.itertuples():
        inner = steps[(steps["start"] >= b.start) & (steps["end"] <= b.end)]
        for s in inner.itertuples():
            rows.append({"bucket_mb": float(BUCKET_RANGE.fullmatch(b.text).group(1)), "step": s.text,
                         "start": int(s.start), "end": int(s.end)})
    return pd.DataFrame(rows, columns=["bucket_mb", "step", "start", "end"])


def _phase_ms(ranges: pd.DataFrame, text: str, lo: int, hi: int) -> float:
    r = ranges[(ranges["text"] == text) & (ranges["start"] >= lo) & (ranges["end"] <= hi)]
    return float(r["duration_ns"].sum()) / 1e6


def overlap_steps(data: dict[int, RankData]) -> pd.DataFrame:
    """Per bucket size, rank and timed step: how much all-reduce time compute kernels hid in that step.

    Columns: bucket_mb, rank, step (0 for the first timed step), step_ms (the NVTX step),
    backward_ms (the NVTX ``backward`` range: the CPU launching backward, which a stalled process
    stretches), compute_ms (the other kernels' time), comm_ms (NCCL kernel time), hidden (share of
    comm_ms during which a compute kernel ran on another stream:
    :func:`gpuprof.activity.copy_compute_overlap`), exposed_ms (comm_ms that nothing hid), nccl_kernels.
    """
    rows = []
    for rank, d in data.items():
        for bucket, steps in step_windows(d.ranges).groupby("bucket_mb", sort=False):
            for i, s in enumerate(steps.itertuples()):
                nccl = ta.inside(d.nccl, (s.start, s.end))
                compute = ta.inside(d.compute, (s.start, s.end))
                rows.append({"bucket_mb": bucket, "rank": rank, "step": i, "step_ms": (s.end - s.start) / 1e6,
                             "backward_ms": _phase_ms(d.ranges, "backward", s.start, s.end),
                             "compute_ms": float(compute["duration_ns"].sum()) / 1e6,
                             **comm_overlap(nccl, compute), "nccl_kernels": len(nccl)})
    return pd.DataFrame(rows)


def overlap_table(data: dict[int, RankData]) -> pd.DataFrame:
    """Per bucket size and rank, over the timed steps: how much all-reduce time compute kernels hid.

    Columns: bucket_mb, rank, steps, step_ms (the NVTX step), compute_ms (the other kernels' time),
    comm_ms (NCCL kernel time), hidden (share of comm_ms during which a compute kernel ran on
    another stream: :func:`gpuprof.activity.copy_compute_overlap`), exposed_ms (comm_ms that
    nothing hid), nccl_kernels; all per step.

    Each figure is the median over the timed steps (:func:`overlap_steps`), each step measured on
    its own: a step that the profiler itself disturbed (a buffer flush stalls one process, and its
    peer then waits inside NCCL) does not decide the row unless most steps were disturbed, which
    :func:`steady_steps` tells.
    """
    steps = overlap_steps(data).drop(columns=["step", "backward_ms"])
    per = steps.groupby(["bucket_mb", "rank"], sort=False)
    out = per.median().reset_index()
    out.insert(2, "steps", per.size().to_numpy())
    return out


# Two ranks whose NCCL kernels took more than this ratio of each other's time in one step: one of them
# waited inside its all-reduces for the other, which the profiler had held up.
STEADY_COMM_RATIO = 1.5


def steady_steps(steps: pd.DataFrame, ratio: float = STEADY_COMM_RATIO) -> pd.DataFrame:
    """:func:`overlap_steps` with the ranks side by side, per bucket size and step, and whether the step was steady.

    An NCCL kernel's time includes its wait for the peer, so in a step where one process was
    held up (under nsys: a buffer flush, a slow host), its peer's NCCL time grows and the held-up
    rank's compute stream starves. A step is ``steady`` when the ranks' NCCL times agree within
    ``ratio`` (the largest over the smallest). ``hidden_mean`` averages the ranks' hidden shares;
    ``comm_ratio`` is the largest NCCL time over the smallest.
    """
    per_rank = steps.pivot_table(index=["bucket_mb", "step"], columns="rank",
                                 values=["hidden", "comm_ms", "exposed_ms", "backward_ms"], sort=False)
    comm, hidden = per_rank["comm_ms"], per_rank["hidden"]
    wide = per_rank.set_axis([f"{name}_{rank}" for name, rank in per_rank.columns], axis=1)
    wide["comm_ratio"] = comm.max(axis=1) / comm.min(axis=1)
    wide["hidden_mean"] = hidden.mean(axis=1)
    wide["steady"] = wide["comm_ratio"] <= ratio
    return wide.reset_index()


def untraced_steps(result: dict[str, Any]) -> pd.DataFrame:
    """``ddp_training.py --json``'s results as bucket_mb, rank, untraced_step_ms (the median over its timed steps)."""
    return pd.DataFrame([{"bucket_mb": c["bucket_mb"], "rank": r["rank"],
                          "untraced_step_ms": float(np.median([s["step"] for s in c["steps"]]))}
                         for r in result["ranks"] for c in r["configs"]])


def by_bucket(overlap: pd.DataFrame) -> pd.DataFrame:
    """:func:`overlap_table` (merged with :func:`untraced_steps`) summed up per bucket size over the ranks.

    The untraced step is the slower rank's; ``hidden`` is given averaged over the ranks, on the
    worse and on the better rank, and the exposed time on the worse and the better rank: a
    rank whose peer arrives late waits inside NCCL, so one rank's figures alone mislead.
    """
    per = overlap.groupby("bucket_mb", sort=False)
    return pd.DataFrame({"untraced_step_ms": per["untraced_step_ms"].max(), "compute_ms": per["compute_ms"].mean(),
                         "comm_ms": per["comm_ms"].mean(), "hidden_mean": per["hidden"].mean(),
                         "hidden_worst": per["hidden"].min(), "hidden_best": per["hidden"].max(),
                         "exposed_worst": per["exposed_ms"].max(), "exposed_least": per["exposed_ms"].min()})


def latency_bandwidth_fit(sweep: dict[str, Any]) -> tuple[float, float]:
    """A per-call latency (ms) and a bandwidth (GB/s) fitted to an all-reduce sweep: time = a + size / B.

    Least squares on the times themselves, so the large sizes, whose times are long, decide the
    bandwidth and the small ones the latency. Interpolating between the sweep's points instead
    overstates the sizes between two far-apart large points (time is not linear in log size
    there), which is why the bucket model uses this fit.
    """
    size = np.array([r["bytes"] for r in sweep["rows"]], dtype=float)
    ms = np.array([r["time_us"] for r in sweep["rows"]], dtype=float) / 1e3
    a, per_byte = np.linalg.lstsq(np.vstack([np.ones_like(size), size]).T, ms, rcond=None)[0]
    return float(a), float(1 / per_byte / 1e6)


def bucket_model(sweep: dict[str, Any], layouts: dict[float, Sequence[int]], backward_ms: float) -> pd.DataFrame:
    """The exposed all-reduce time per step that the all-reduce sweep alone predicts for each bucket layout.

    A model of bucketed overlap of the kind Stanford CS336's second assignment asks for (a latency per
    call plus size over bandwidth, both fitted to the sweep by :func:`latency_bandwidth_fit`),
    simulated: ``layouts`` maps each bucket size (MB) to the bytes of the buckets DDP made, in the
    order it all-reduces them (``ddp_buckets.py``'s record of a step after the first); backward
    produces the gradients at an even rate, so a bucket is ready when backward has produced its bytes
    and all before it; NCCL runs the buckets one after another; whatever is still running when
    backward (``backward_ms``) ends is exposed. It leaves out what overlap costs the computation
    (NCCL's kernels take SMs and memory bandwidth from backward's) and DDP's own per-bucket work.
    Returns bucket_mb, buckets, last_bucket_mib, comm_ms (all the calls, one after another) and
    exposed_ms.
    """
    latency_ms, gbps = latency_bandwidth_fit(sweep)
    rows = []
    for mb, sizes in sorted(layouts.items(), reverse=True):
        total, done, finish, comm = float(sum(sizes)), 0.0, 0.0, 0.0
        for size in sizes:
            done += size
            call = latency_ms + size / (gbps * 1e6)
            finish = max(finish, backward_ms * done / total) + call
            comm += call
        rows.append({"bucket_mb": mb, "buckets": len(sizes), "last_bucket_mib": sizes[-1] / 2**20, "comm_ms": comm,
                     "exposed_ms": finish - backward_ms})
    return pd.DataFrame(rows)


def bucket_bandwidth(data: dict[int, RankData], layout: Sequence[int], bucket_mb: float,
                     sweep: dict[str, Any]) -> pd.DataFrame:
    """Each of DDP's all-reduces of one bucket size, as the per-rank captures timed it, beside the sweep.

    ``layout`` is the bytes of the buckets in the order DDP all-reduces them (``ddp_buckets.py``),
    so the n-th all-reduce kernel of a timed step carries the n-th bucket. A kernel's time includes
    any wait for the peer, so per bucket the rank that waited less (the smaller median over the
    timed steps) is the one that measures the transfer. Returns one row per bucket: position,
    bytes, each rank's median ms (``rank_R_ms``) and median share of the kernel's span during which
    compute kernels ran beside it (``rank_R_beside``: 0 for an all-reduce that ran after backward's
    last kernel), least_ms, beside (the share on the rank that gave least_ms), busbw_gbps (two
    ranks: the bus factor is 1) and sweep_ms (the time :func:`latency_bandwidth_fit` gives that
    size). Refuses a step whose all-reduce count is not the layout's.
    """
    latency_ms, gbps = latency_bandwidth_fit(sweep)
    out = pd.DataFrame({"position": np.arange(len(layout)), "bytes": list(layout)})
    ranks = sorted(data)
    for rank in ranks:
        d = data[rank]
        times, beside = [], []
        for _, s in step_windows(d.ranges).query("bucket_mb == @bucket_mb").iterrows():
            window = (int(s["start"]), int(s["end"]))
            k = ta.inside(d.nccl, window)
            k = k[k["name"].astype(str).str.contains("AllReduce")].sort_values("start", kind="stable")
            if len(k) != len(layout):
                raise GpuprofError(f"rank {rank}, {s['step']} at {bucket_mb:g} MB: {len(k)} all-reduce kernels for "
                                   f"{len(layout)} buckets.", "Give the layout recorded for the same bucket_cap_mb.")
            times.append(k["duration_ns"].to_numpy() / 1e6)
            compute = ta.inside(d.compute, window)
            beside.append([_share_beside(compute, int(a), int(b)) for a, b in zip(k["start"], k["end"])])
        out[f"rank_{rank}_ms"] = np.median(np.vstack(times), axis=0)
        out[f"rank_{rank}_beside"] = np.median(np.vstack(beside), axis=0)
    ms = out[[f"rank_{r}_ms" for r in ranks]].to_numpy()
    least = ms.argmin(axis=1)
    out["least_ms"] = ms.min(axis=1)
    out["beside"] = out[[f"rank_{r}_beside" for r in ranks]].to_numpy()[np.arange(len(out)), least]
    out["busbw_gbps"] = out["bytes"] / out["least_ms"] / 1e6
    out["sweep_ms"] = latency_ms + out["bytes"] / (gbps * 1e6)
    return out

def _share_beside(compute: pd.DataFrame, start: int, end: int) -> float:
    """The share of [start, end) during which some compute kernel ran (overlapping kernels counted once)."""
    if end <= start or compute.empty:
        return 0.0
    iv = sorted((max(int(a), start), min(int(b), end)) for a, b in zip(compute["start"], compute["end"]) if a < end and b > start)
    covered, reach = 0, start
    for a, b in iv:
        if b > reach:
            covered += b - max(a, reach)
            reach = b
    return covered / (end - start)


def knob_table(jobs: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Per variant of ``ddp_knobs.py``: its step time over the jobs given, against fp32's and against its no-sync step.

    Within a job (one torchrun launch: the variants interleaved in the same processes) a step
    takes as long as the slower rank's, and a variant's time is the median over all its rounds'
    steps; ``round_spread`` is the range of its rounds' medians over their median (the worst
    job's): the noise within a process. Over jobs (processes started afresh, whose noise is
    larger) the table gives the median and the range (``step_lo``, ``step_hi``). Ratios are taken
    within each job first, where the variants ran side by side: ``vs_fp32`` is the step over
    the fp32 variant's, ``sync_cost_ms`` the step minus its precision's ``+nosync`` step (what
    all-reducing the gradients costs, waits included). A job without the partner variant gives NaN.
    """
    rows = []
    order: list[str] = []
    for job, result in enumerate(jobs):
        by_rank = {res["rank"]: res["runs"] for res in result["ranks"]}
        steps: dict[str, list[float]] = {}
        rounds: dict[str, list[float]] = {}
        for i, run in enumerate(by_rank[min(by_rank)]):
            slowest = np.max([[s["step"] for s in by_rank[r][i]["steps"]] for r in by_rank], axis=0)
            steps.setdefault(run["variant"], []).extend(slowest.tolist())
            rounds.setdefault(run["variant"], []).append(float(np.median(slowest)))
        order += [v for v in steps if v not in order]
        times = {v: float(np.median(s)) for v, s in steps.items()}
        for v, t in times.items():
            nosync = times.get(f"{v.split('+')[0]}+nosync")
            rows.append({"job": job, "variant": v, "step_ms": t,
                         "round_spread": (max(rounds[v]) - min(rounds[v])) / float(np.median(rounds[v])),
                         "vs_fp32": t / times["fp32"] if "fp32" in times else np.nan,
                         "sync_cost_ms": t - nosync if nosync is not None else np.nan})
    per = pd.DataFrame(rows).groupby("variant", sort=False)
    table = pd.DataFrame({"step_ms": per["step_ms"].median(), "step_lo": per["step_ms"].min(),
                          "step_hi": per["step_ms"].max(), "round_spread": per["round_spread"].max(),
                          "vs_fp32": per["vs_fp32"].median(), "vs_fp32_lo": per["vs_fp32"].min(),
                          "vs_fp32_hi": per["vs_fp32"].max(), "sync_cost_ms": per["sync_cost_ms"].median(),
                          "sync_cost_lo": per["sync_cost_ms"].min(), "sync_cost_hi": per["sync_cost_ms"].max(),
                          "jobs": per.size()})
    return table.loc[order]


def straggler_table(data: dict[int, RankData]) -> pd.DataFrame:
    """Per rank, per timed step (mean ms): the step, the time in the ``straggling`` range, compute kernel
    time, NCCL kernel time. (An NVTX range around ``loss.backward()`` times only the CPU's
    launching of backward, not its kernels, so the kernels' own time is the measure here.) An NCCL kernel runs until every rank has joined, so the rank that
    others wait for is the one whose NCCL kernels are the *shortest*: ``waited_for`` marks it."""
    rows = []
    for rank, d in data.items():
        steps = step_windows(d.ranges)
        if steps.empty:
            continue
        lo, hi = int(steps["start"].min()), int(steps["end"].max())
        n = len(steps)
        rows.append({"rank": rank, "step_ms": float((steps["end"] - steps["start"]).mean()) / 1e6,
                     "straggling_ms": _phase_ms(d.ranges, "straggling", lo, hi) / n,
                     "compute_ms": float(ta.inside(d.compute, (lo, hi))["duration_ns"].sum()) / 1e6 / n,
                     "nccl_ms": float(ta.inside(d.nccl, (lo, hi))["duration_ns"].sum()) / 1e6 / n})
    out = pd.DataFrame(rows)
    if len(out):
        out["waited_for"] = out["nccl_ms"] == out["nccl_ms"].min()
    return out


def _longest_waits(d: RankData):  # type: ignore[no-untyped-def]
    """Per timed step of one rank that ran an NCCL kernel: (the step's row, its compute kernels, its longest NCCL
    kernel). The two readers below measure what ran beside that kernel."""
    for _, s in step_windows(d.ranges).iterrows():
        window = (int(s["start"]), int(s["end"]))
        nccl, compute = ta.inside(d.nccl, window), ta.inside(d.compute, window)
        if not nccl.empty:
            yield s, compute, nccl.loc[nccl["duration_ns"].idxmax()]


def longest_wait_per_step(d: RankData) -> pd.DataFrame:
    """Per timed step of one rank: its longest NCCL kernel (ms) and the compute kernels' time that ran
    beside it (ms, the part of each compute kernel inside the NCCL kernel's span).

    On the rank that waits for a straggler, one all-reduce per step spans the wait, spinning on
    NCCL's channels (SMs) the whole time; whatever of backward runs meanwhile shares the GPU
    with it. This is the measurement behind "a straggler costs the waiting ranks SMs".
    """
    rows = []
    for s, compute, k in _longest_waits(d):
        overlap = (np.minimum(compute["end"], k["end"]) - np.maximum(compute["start"], k["start"])).clip(lower=0)
        rows.append({"step": s["step"], "longest_nccl_ms": float(k["duration_ns"]) / 1e6,
                     "compute_beside_ms": float(overlap.sum()) / 1e6,
                     "compute_ms": float(compute["duration_ns"].sum()) / 1e6})
    return pd.DataFrame(rows)


def kernels_beside_wait(waiting: RankData, other: RankData) -> pd.DataFrame:
    """The same compute kernels inside and outside the waiting rank's longest NCCL kernel, and on the other rank.

    Per timed step of ``waiting``, a compute kernel that starts inside the span of that step's
    longest NCCL kernel (the all-reduce spinning while its peer is late) is *inside*; the step's
    other compute kernels are *outside*. For each kernel name (``name``, the short one), the median
    duration (us) inside, outside, and over the timed steps of ``other``, with the counts: the same
    kernel on the same GPU with and without the spinning all-reduce beside it, which is what says
    whether that all-reduce slows backward. Sorted by the time spent inside, largest first.
    """
    inside, outside = [], []
    for _, compute, k in _longest_waits(waiting):
        beside = (compute["start"] >= k["start"]) & (compute["start"] < k["end"])
        inside.append(compute[beside])
        outside.append(compute[~beside])
    theirs = pd.concat([ta.inside(other.compute, (int(s["start"]), int(s["end"])))
                        for _, s in step_windows(other.ranges).iterrows()])
    def per_name(df: pd.DataFrame, tag: str) -> pd.DataFrame:
        g = df.groupby(df["name"].astype(str))["duration_ns"]
        return pd.DataFrame({f"{tag}_n": g.size(), f"{tag}_us": g.median() / 1e3, f"{tag}_total_ms": g.sum() / 1e6})
    out = per_name(pd.concat(inside), "inside").join(per_name(pd.concat(outside), "outside"), how="left")
    out = out.join(per_name(theirs, "other_rank"), how="left")
    return out.sort_values("inside_total_ms", ascending=False).drop(columns=["outside_total_ms", "other_rank_total_ms"])


# --- bandwidth -------------------------------------------------------------------------------------

def bandwidth_table(result: dict[str, Any]) -> pd.DataFrame:
    """allreduce_bandwidth.py's rows, with each size's bus bandwidth as a share of the copy peak (if measured)."""
    t = pd.DataFrame(result["rows"])
    t.insert(0, "MiB", t["bytes"] / 2**20)
    peak = max((c["gbps"] for c in result.get("copies", [])), default=None)
    if peak:
        t["of_copy_peak"] = t["busbw_gbps"] / peak
    return t


def bandwidth_figure(result: dict[str, Any], ax: Any = None) -> Any:
    """Bus and algorithm bandwidth against message size (log scale), the copy peak as a line."""
    import matplotlib.pyplot as plt

    t = bandwidth_table(result)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot(t["bytes"], t["busbw_gbps"], "o-", label="all-reduce bus bandwidth")
    ax.plot(t["bytes"], t["algbw_gbps"], "s--", alpha=0.6, label="all-reduce algorithm bandwidth")
    for c in result.get("copies", []):
        ax.axhline(c["gbps"], color="grey", lw=1, ls=":")
        ax.text(t["bytes"].min(), c["gbps"], f" copy {c['direction']}: {c['gbps']:.0f} GB/s", va="bottom", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("GB/s")
    ax.set_title(f"All-reduce over {result['world_size']} ranks ({result['backend']})")
    ax.legend(loc="center right", fontsize=8)
    return ax


def overlap_figure(table: pd.DataFrame, ax: Any = None) -> Any:
    """Per bucket size (rank 0): the all-reduce time hidden under compute and the part left exposed, per step."""
    import matplotlib.pyplot as plt

    t = table[table["rank"] == table["rank"].min()].sort_values("bucket_mb")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.2))
    labels = [f"{b:g} MB" for b in t["bucket_mb"]]
    hidden = t["comm_ms"] - t["exposed_ms"]
    ax.barh(labels, hidden, color="#4c72b0", label="all-reduce under compute")
    ax.barh(labels, t["exposed_ms"], left=hidden, color="#dd8452", label="all-reduce exposed")
    for y, (h, c) in enumerate(zip(t["hidden"], t["comm_ms"])):
        ax.text(c, y, f"  {h:.0%} hidden", va="center", fontsize=8)
    ax.set_xlabel("NCCL kernel time per step (ms), rank 0")
    ax.set_ylabel("bucket size")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_xlim(0, float(t["comm_ms"].max()) * 1.35)
    return ax


def rank_timeline(data: dict[int, RankData], window: tuple[int, int] | None = None, ax: Any = None,
                  phases: Sequence[str] = ("forward", "backward", "optimizer", "straggling")) -> Any:
    """Three rows per rank (NVTX phases, compute kernels, NCCL kernels) over ``window`` (default: rank 0's last step)."""
    import matplotlib.pyplot as plt

    if window is None:
        first = data[min(data)]
        steps = step_windows(first.ranges)
        window = (int(steps["start"].iloc[-1]), int(steps["end"].iloc[-1]))
    lo, hi = window
    colors = {"forward": "#55a868", "backward": "#c44e52", "optimizer": "#8172b2", "straggling": "#937860"}
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.9 + 0.75 * 3 * len(data)))
    labels, y = [], 0.0

    def bars(df: pd.DataFrame, color: Any) -> None:
        d = df[(df["end"] > lo) & (df["start"] < hi)]
        if len(d):
            s = np.maximum(d["start"].to_numpy(), lo)
            e = np.minimum(d["end"].to_numpy(), hi)
            ax.broken_barh(list(zip((s - lo) / 1e6, (e - s) / 1e6)), (y - 0.35, 0.7),
                           facecolors=color if isinstance(color, str) else list(color))

    for rank, d in sorted(data.items(), reverse=True):
        bars(d.nccl, "#dd8452")
        labels.append(f"rank {rank}: NCCL kernels")
        y += 1
        bars(d.compute, "#4c72b0")
        labels.append(f"rank {rank}: compute kernels")
        y += 1
        r = d.ranges[d.ranges["text"].isin(phases)]
        bars(r, [colors.get(t, "grey") for t in r[(r["end"] > lo) & (r["start"] < hi)]["text"]])
        labels.append(f"rank {rank}: NVTX phase")
        y += 1
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlim(0, (hi - lo) / 1e6)
    ax.set_xlabel("ms from the start of the window")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=c, label=p) for p, c in colors.items() if p in phases],
              loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=4, fontsize=8)
    return ax


# --- torch.profiler traces per rank ------------------------------------------------------------------

def torch_trace_table(paths: Sequence[str | Path]) -> pd.DataFrame:
    """Per trace: what its ``distributedInfo`` says (backend, rank, world size), the collectives its
    ``<backend>:<collective>`` annotations record, and its NCCL kernels (count, total ms)."""
    rows = []
    for p in paths:
        t = read_trace(p)
        info = t.meta.get("distributedInfo") or {}
        ann = t.annotations()
        coll = ann[ann["name"].astype(str).str.match(r"^(nccl|gloo|ucc|mpi):")] if len(ann) else ann
        k = t.kernels()
        nccl = k[is_communication(k["name"])] if len(k) else k
        rows.append({"trace": Path(p).name, "backend": info.get("backend"), "rank": info.get("rank"),
                     "world_size": info.get("world_size"),
                     "collectives": ", ".join(f"{n} x{c}" for n, c in coll["name"].value_counts().sort_index().items()),
                     "nccl_kernels": len(nccl), "nccl_ms": float(nccl["duration_ns"].sum()) / 1e6 if len(nccl) else 0.0})
    return pd.DataFrame(rows)


def trace_arrivals(paths: Sequence[str | Path]) -> pd.DataFrame:
    """Which rank reached each collective first, read from per-rank torch.profiler traces of one job.

    An NCCL kernel starts when its rank launches it and then waits inside for its peers, so a
    rank's NCCL time includes the waits: comparing two ranks' totals says that one waited more,
    not whether it always arrived first. The kernels' start times say that. Every rank runs the
    same collectives in the same order, so the n-th NCCL kernel of each trace is the same
    collective; the traces of one host share its clock (Kineto writes host-clock timestamps), which
    the ends check: a collective ends almost together on every rank. Returns one row per
    collective and rank other than the first: index, rank, start_skew_ns (its start minus the
    first rank's: negative when it arrived first) and end_skew_ns. Refuses traces with different
    numbers of NCCL kernels (they cannot be matched by order).
    """
    kernels = []
    for p in paths:
        k = read_trace(p).kernels()
        kernels.append(k[is_communication(k["name"])].sort_values("start", kind="stable") if len(k) else k)
    ref = kernels[0]
    rows = []
    for rank, k in enumerate(kernels[1:], start=1):
        if len(k) != len(ref):
            raise GpuprofError(f"trace {Path(paths[rank]).name} holds {len(k)} NCCL kernels and {Path(paths[0]).name} "
                               f"{len(ref)}: they cannot be matched by order.", "Trace the ranks over the same steps.")
        rows.append(pd.DataFrame({"index": np.arange(len(k)), "rank": rank,
                                  "start_skew_ns": k["start"].to_numpy() - ref["start"].to_numpy(),
                                  "end_skew_ns": k["end"].to_numpy() - ref["end"].to_numpy()}))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["index", "rank", "start_skew_ns", "end_skew_ns"])


def _trace_gaps(path: str | Path) -> tuple[Any, pd.DataFrame, pd.DataFrame, set[int]]:
    """A torch.profiler trace, its idle gaps by HTA 0.5's rule and rounding, its kernels and the streams that run
    communication kernels: what both idle readers below start from."""
    t = read_trace(path)
    k = t.kernels()
    return t, hta_compat.idle_gaps(t, rounding="hta"), k, set(k.loc[is_communication(k["name"]), "streamId"].dropna().astype(int))


def host_wait_beyond_syncs(paths: Sequence[str | Path], sync: str = "cudaDeviceSynchronize") -> pd.DataFrame:
    """Per trace, the compute streams' host-wait gaps (HTA 0.5's rule and rounding) split by whether the CPU was
    in one of the program's own ``sync`` calls when the gap closed (the call's end inside the gap).

    Why: a loop that waits for the GPU after each phase makes one host-wait gap per wait by construction; only
    the host wait beyond those gaps says that the CPU fell behind *inside* a phase. Columns: trace, gaps,
    host_wait_ms (all), sync_gaps, sync_ms (the gaps that end a ``sync`` call), beyond_ms (the rest) and
    beyond_over_sync (beyond_ms / sync_ms).
    """
    rows = []
    for p in paths:
        t, gaps, k, nccl_streams = _trace_gaps(p)
        wait = gaps[(gaps["category"] == "host_wait") & ~gaps["streamId"].isin(nccl_streams)]
        calls = t.runtime_calls()
        ends = np.sort(calls.loc[calls["name"] == sync, "end"].to_numpy(dtype=np.int64) / 1000)  # us, as the gaps
        lo = np.searchsorted(ends, wait["gap_start"].to_numpy(dtype=float), side="left")
        hi = np.searchsorted(ends, wait["gap_end"].to_numpy(dtype=float), side="right")
        at_sync = hi > lo
        total, in_sync = float(wait["idle_us"].sum()) / 1e3, float(wait.loc[at_sync, "idle_us"].sum()) / 1e3
        rows.append({"trace": Path(p).name, "gaps": len(wait), "host_wait_ms": total, "sync_gaps": int(at_sync.sum()),
                     "sync_ms": in_sync, "beyond_ms": total - in_sync,
                     "beyond_over_sync": (total - in_sync) / in_sync if in_sync else float("inf")})
    return pd.DataFrame(rows)


def trace_idle_breakdown(paths: Sequence[str | Path], forward: str = "DistributedDataParallel.forward") -> pd.DataFrame:
    """HTA's idle-time breakdown of per-rank torch.profiler traces (:func:`gpuprof.torch_profiler.hta_compat.idle_gaps`,
    HTA's rounding and its default threshold, so the sums are HTA 0.5's), split by where each gap lies.

    One row per trace, stream, where and category: stream ("NCCL" where the stream runs communication kernels,
    else "compute"), where ("between steps" for a gap during which a ``forward`` range began on the GPU, else
    "in a step"), gaps, idle_ms and after_other_us (the median time from the last end of a kernel on another
    stream to the gap's end: a few us where the stream waited for that stream's work). The split matters on NCCL's stream: a gap that spans the next step's forward
    is one no bucket size can shorten (nothing is all-reduced in a forward), and it is host wait by construction
    (the next all-reduce is launched in the next backward).
    """
    rows = []
    for p in paths:
        t, gaps, k, nccl_streams = _trace_gaps(p)
        ann = t.annotations(gpu=True)
        starts = np.sort(-(-ann.loc[ann["name"] == forward, "start"].to_numpy(dtype=np.int64) // 1000))  # whole us, as the gaps
        before = np.searchsorted(starts, gaps["gap_start"].to_numpy(dtype=float), side="left")
        upto = np.searchsorted(starts, gaps["gap_end"].to_numpy(dtype=float), side="right")
        gaps = gaps.assign(stream=np.where(gaps["streamId"].isin(nccl_streams), "NCCL", "compute"),
                           where=np.where(upto > before, "between steps", "in a step"))
        after = np.full(len(gaps), np.nan)
        for sid in gaps["streamId"].unique():  # HTA's rounded times: whole us, the gaps' own
            ends = np.sort(k.loc[k["streamId"] != sid, "end"].to_numpy(dtype=np.int64) // 1000)
            mine = (gaps["streamId"] == sid).to_numpy()
            at = gaps.loc[mine, "gap_end"].to_numpy(dtype=np.int64)
            i = np.searchsorted(ends, at, side="right") - 1
            after[mine] = np.where(i >= 0, at - ends[np.maximum(i, 0)], np.nan)
        gaps = gaps.assign(after_other_us=after)
        g = gaps.groupby(["streamId", "stream", "where", "category"])
        part = pd.DataFrame({"gaps": g.size(), "idle_ms": g["idle_us"].sum() / 1e3,
                             "after_other_us": g["after_other_us"].median()}).reset_index()
        rows.append(part.assign(trace=Path(p).name))
    cols = ["trace", "streamId", "stream", "where", "category", "gaps", "idle_ms", "after_other_us"]
    return pd.concat(rows, ignore_index=True)[cols] if rows else pd.DataFrame(columns=cols)
