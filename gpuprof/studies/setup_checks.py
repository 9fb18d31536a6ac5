"""Chapter 0's checks: is this machine ready for the course, and do the profilers really work here?

Each check gives a short result and, when something is missing, the one thing to do
about it. The two smoke captures go further than ``--version``: they profile a tiny
example with nsys and read one hardware counter with ncu, because a profiler that
starts but cannot trace or read counters is the usual first-day surprise.

Without a GPU or a tool, the smoke steps fall back to the course's reference
captures in ``artifacts/ch00`` and say so.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..artifacts import REPO_ROOT, FoundCapture, chapter_output, find_capture, record_file
from ..backend import describe_machine
from ..errors import GpuprofError, ToolNotFound
from ..nsys.capture import nsys_capture
from ..runner import ProfilerFailed, python_target, run_profiler, shell_line
from ..tools import find_tool, live_tool, profiling_restricted, tool_version

__all__ = ["Check", "run_checks", "checks_table", "format_checks", "nsys_smoke", "ncu_smoke", "launch_calls",
           "format_launch_calls", "LAUNCH_API", "TINY_KERNELS", "SAXPY", "NCU_SMOKE_ARGS"]

CHAPTER = "ch00"
TINY_KERNELS = REPO_ROOT / "examples" / "nsys" / "tiny_kernels.py"
SAXPY = REPO_ROOT / "examples" / "nsight_compute" / "saxpy.py"
TINY_STEPS, TINY_KERNELS_PER_STEP = 5, 200
TINY_ARGS = ["--steps", str(TINY_STEPS), "--kernels", str(TINY_KERNELS_PER_STEP)]
SAXPY_N = 1 << 26  # 67M floats: 805 MB moved per launch, far beyond the L2 cache
NCU_SMOKE_ARGS = ["--clock-control", "none", "--section", "SpeedOfLight", "--kernel-name", "regex:saxpy|elementwise",
                  "--launch-count", "1", "-o", "{output}"]


@dataclass(frozen=True)
class Check:
    item: str
    result: str
    ok: bool
    todo: str = ""


def _dist_version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return "installed (version unknown)"


def _tool_check(name: str) -> Check:
    try:
        tool = find_tool(name)
        version = tool_version(tool)
    except (ToolNotFound, GpuprofError) as exc:
        return Check(name, "not usable", False, str(exc))
    return Check(name, f"{version} ({tool.found_via})", True)


def run_checks() -> list[Check]:
    """GPU and driver, nsys, ncu, the driver's counter setting, and the Python packages."""
    m = describe_machine()
    checks: list[Check] = []
    if m.device == "cuda":
        checks.append(Check("GPU", f"{m.gpu_name}, driver {m.driver_version or '?'}, CUDA runtime {m.cuda_runtime}", True))
    else:
        checks.append(Check("GPU", "none visible", False,
                            "Live captures need an NVIDIA GPU with its driver (check `nvidia-smi`) and a CUDA build "
                            "of PyTorch or CuPy; until then each chapter shows the course's reference captures."))
    for name in ("nsys", "ncu"):
        checks.append(_tool_check(name))
    restricted = profiling_restricted()
    if m.device != "cuda":
        checks.append(Check("counter permission", "not applicable (no GPU)", True))
    elif restricted is None:
        checks.append(Check("counter permission", "unknown: the driver does not publish its setting", True,
                            "The ncu smoke test below settles it."))
    elif restricted:
        checks.append(Check("counter permission", "restricted to administrators (RmProfilingAdminOnly=1)", False,
                            "ncu will fail with ERR_NVGPUCTRPERM; see the troubleshooting page."))
    else:
        checks.append(Check("counter permission", "allowed for this user (or running as root)", True))
    for pkg in ("nvtx", "cupy", "torch"):
        try:
            mod = importlib.import_module(pkg)
            version = getattr(mod, "__version__", None) or _dist_version(pkg)
            checks.append(Check(f"python: {pkg}", version, True))
        except Exception:
            hint = {"nvtx": "`pip install nvtx` for coloured ranges and domains (the course falls back to torch.cuda.nvtx).",
                    "cupy": "Optional: the course uses PyTorch first, CuPy second.",
                    "torch": "`pip install torch` (a CUDA build on a GPU machine)."}[pkg]
            checks.append(Check(f"python: {pkg}", "not installed", pkg != "torch", hint))
    return checks


def format_checks(checks: list[Check]) -> str:
    """The checks as text, one line each, what to do on the line below a failed one.

    Plain text rather than a DataFrame: pandas' HTML and text renderings truncate or wrap
    long cells depending on their length (a GPU's name), so the same checks would print
    differently on two GPUs.
    """
    width = max(len(c.item) for c in checks) + 2
    lines = []
    for c in checks:
        lines.append(f"{c.item:<{width}}{'ok' if c.ok else 'NO':<4}{c.result}")
        if c.todo:
            lines.append(f"{'':<{width}}    what to do: {c.todo}")
    return "\n".join(lines)


def checks_table(checks: list[Check]) -> pd.DataFrame:
    return pd.DataFrame([{"check": c.item, "result": c.result, "ok": "yes" if c.ok else "NO",
                          "what to do": c.todo} for c in checks]).set_index("check")


def nsys_smoke(*, overwrite: bool = True) -> FoundCapture:
    """Profile ``tiny_kernels.py`` with nsys and export sqlite; fall back to the reference.

    Prints what it ran (or why it did not) and returns the sqlite capture to analyse.
    """
    return nsys_capture(CHAPTER, "tiny_kernels", TINY_KERNELS, TINY_ARGS, overwrite=overwrite).sqlite


def ncu_smoke(*, overwrite: bool = True) -> FoundCapture:
    """Read the Speed Of Light section of one saxpy launch with ncu; fall back to the reference.

    A denied counter permission is reported in plain words (with what to do) and
    falls back too, so the chapter still shows what the section looks like.
    """
    live = live_tool("ncu")
    if not live:
        print(f"No live ncu capture: {live.reason}.")
        return find_capture(CHAPTER, "saxpy_sol.csv", prefer="reference")
    ncu, version = live
    out = chapter_output(CHAPTER)
    try:
        cap = run_profiler(ncu, NCU_SMOKE_ARGS, python_target(SAXPY, "--n", str(SAXPY_N), "--repeats", "2"),
                           out_dir=out, name="saxpy_sol", overwrite=overwrite)
        rep = cap.file(".ncu-rep")
        run_profiler(ncu, ["--import", str(rep), "--csv", "--page", "details"], out_dir=out, name="saxpy_sol",
                     stdout_file="saxpy_sol.csv", overwrite=True)
    except ProfilerFailed as exc:
        print(f"The ncu capture failed: {exc}")
        print("Falling back to the course's reference capture.")
        return find_capture(CHAPTER, "saxpy_sol.csv", prefer="reference")
    # The export's ``>`` is the shell's redirection, so it stays outside the quoted words.
    export = shell_line([ncu.name, "--import", str(rep), "--csv", "--page", "details"]) + " > " + shell_line([str(out / "saxpy_sol.csv")])
    print(f"$ {shell_line(cap.command)}\n  ({cap.seconds:.1f} s, ncu {version}): counters readable")
    record_file(CHAPTER, "saxpy_sol.csv", f"{shell_line(cap.command)} && {export}", {"ncu": version})
    return find_capture(CHAPTER, "saxpy_sol.csv")


def tiny_kernels_steps(sqlite_path: Path) -> pd.DataFrame:
    """Per measured step of ``tiny_kernels.py``: kernels, their time, and the launch gaps.

    Kernels are attributed to a ``step_N`` range through the runtime call that
    launched them. ``median_interval_us`` is the median time from one kernel's start
    to the next one's: when kernels are far shorter than that, the GPU waits on the
    CPU's launches, and the interval *is* the per-launch cost.
    """
    from ..nsys.sqlite import attribute_to_ranges, nvtx_ranges
    from ..activity import busy_fraction

    ranges = nvtx_ranges(sqlite_path)
    steps = sorted({t for t in ranges["text"] if t.startswith("step_")}, key=lambda t: int(t.split("_")[1]))
    rows = []
    for step in steps:
        k = attribute_to_ranges(sqlite_path, step, rule="thread")
        r = ranges[ranges["text"] == step].iloc[0]
        starts = k["start"].sort_values()
        window = (int(r["start"]), int(r["end"]))
        rows.append({
            "step": step,
            "kernels": len(k),
            "range_us": r["duration_ns"] / 1e3,
            "median_kernel_us": float(k["duration_ns"].median()) / 1e3 if len(k) else float("nan"),
            "median_interval_us": float(starts.diff().median()) / 1e3 if len(k) > 1 else float("nan"),
            "gpu_busy_pct": 100 * busy_fraction(k, window) if r["duration_ns"] else float("nan"),
        })
    return pd.DataFrame(rows)


def format_steps(df: pd.DataFrame) -> str:
    """The step table as fixed-width text (stable across pandas versions)."""
    lines = [f"{'step':<8}{'kernels':>8}{'range':>12}{'kernel':>12}{'launch gap':>13}{'GPU busy':>10}"]
    for r in df.itertuples():
        lines.append(f"{r.step:<8}{r.kernels:>8d}{r.range_us:>9.0f} us{r.median_kernel_us:>9.2f} us"
                     f"{r.median_interval_us:>10.2f} us{r.gpu_busy_pct:>9.1f}%")
    return "\n".join(lines)


LAUNCH_API = "cudaLaunchKernel"


def launch_calls(sqlite_path: Path) -> pd.DataFrame:
    """Per measured step of ``tiny_kernels.py``: the CPU side of its launches, as nsys recorded them.

    ``call_us`` is the median time spent inside the runtime's launch call (:data:`LAUNCH_API`),
    ``interval_us`` the median time from one call's start to the next one's, and ``outside_us``
    the median from one call's end to the next one's start (Python and PyTorch's dispatcher,
    under the profiler too). All are CPU times under nsys: they say where a launch's time goes
    while it is profiled, not what it costs without the profiler.
    """
    from ..activity import api_name
    from ..nsys.sqlite import nvtx_ranges, runtime_calls

    ranges = nvtx_ranges(sqlite_path)
    calls = runtime_calls(sqlite_path)
    calls = calls[calls["name"].astype(str).map(api_name) == LAUNCH_API]
    rows = []
    for r in ranges[ranges["text"].str.startswith("step_")].itertuples():
        c = calls[(calls["start"] >= r.start) & (calls["start"] < r.end)].sort_values("start")
        rows.append({
            "step": r.text,
            "calls": len(c),
            "call_us": float((c["end"] - c["start"]).median()) / 1e3 if len(c) else float("nan"),
            "interval_us": float(c["start"].diff().median()) / 1e3 if len(c) > 1 else float("nan"),
            "outside_us": float((c["start"].shift(-1) - c["end"]).median()) / 1e3 if len(c) > 1 else float("nan"),
        })
    return pd.DataFrame(rows).sort_values("step", key=lambda s: s.str.split("_").str[1].astype(int), ignore_index=True)


def format_launch_calls(df: pd.DataFrame) -> str:
    """:func:`launch_calls` as fixed-width text."""
    lines = [f"{'step':<8}{'calls':>7}{'in ' + LAUNCH_API:>23}{'call to call':>15}{'between calls':>16}"]
    for r in df.itertuples():
        lines.append(f"{r.step:<8}{r.calls:>7d}{r.call_us:>20.2f} us{r.interval_us:>12.2f} us{r.outside_us:>13.2f} us")
    return "\n".join(lines)


SOL_METRICS = ["Duration", "Memory Throughput", "DRAM Throughput", "Compute (SM) Throughput",
               "L1/TEX Cache Throughput", "L2 Cache Throughput", "Elapsed Cycles", "SM Frequency", "DRAM Frequency"]


def saxpy_sol(csv_path: Path) -> pd.DataFrame:
    """The Speed Of Light rows of the profiled saxpy launch: metric, unit, value."""
    from ..ncu.csv_reader import read_details

    df = read_details(csv_path)
    sol = df[df["Section Name"] == "GPU Speed Of Light Throughput"]
    if sol.empty:
        raise GpuprofError(f"{csv_path} has no 'GPU Speed Of Light Throughput' section.",
                           "Profile with `--section SpeedOfLight`.")
    first = sol[sol["ID"] == sol["ID"].iloc[0]]
    rows = first[first["Metric Name"].isin(SOL_METRICS)][["Kernel Name", "Metric Name", "Metric Unit", "value"]]
    return rows.reset_index(drop=True)


def format_sol(rows: pd.DataFrame) -> str:
    kernel = rows["Kernel Name"].iloc[0] if len(rows) else "?"
    lines = [f"kernel: {kernel}"]
    for r in rows.itertuples():
        lines.append(f"  {r._2:<26}{r.value:>12,.2f} {r._3}")
    return "\n".join(lines)
