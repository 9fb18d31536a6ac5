#!/usr/bin/env python3
"""Benchmark: read and summarise a 100 MB PyTorch profiler trace, against a plain baseline.

Builds the trace from a real one (``--source``; by default the course's GPU reference
trace of chapter 5 where it exists, else a CPU profile of a small training loop recorded
on the spot): its events are replicated with shifted times and fresh correlation,
``External id`` and flow ids until the JSON file reaches ``--mb`` megabytes. Then, each
in a fresh process so that peak memory is its own:

* **toolkit**: ``gpuprof.torch_profiler.trace.read_trace``, then the kernel summary, the
  operator summary (self CPU time, as ``key_averages``), the per-step summary and launch
  latency;
* **report**: ``python -m gpuprof report FILE``, the whole report a reader asks for (every table and the step
  figure; its terminal text, no HTML page), run as ``python -m`` runs it;
* **baseline**: ``json.load`` and a pandas ``groupby`` of the kernel events by name, nothing else;
* **HTA** (Holistic Trace Analysis 0.5, where installed): ``TraceAnalysis`` over the trace, then
  ``get_temporal_breakdown`` (idle time) and ``get_gpu_kernel_breakdown`` (per kernel), beside
  the toolkit answering the same two questions with HTA's rounding
  (:mod:`gpuprof.torch_profiler.hta_compat`), so the numbers are compared exactly. Target: at
  most half HTA's time and memory.

Prints wall time and peak resident memory of each, side by side. It is a benchmark, not a
test: numbers depend on the machine, which it names. The course's target: under 10 s and
2 GB for 100 MB on a 2-core machine.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.cli import output_file, positive_float  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402
from fresh_process import measure  # noqa: E402  (beside this script)

REFERENCE = ROOT / "artifacts" / "ch05" / "train_steps.json.gz"
HTA_SOURCE = ROOT / "artifacts" / "ch08" / "ddp_trace_rank0.json.gz"
ID_ARGS = ("correlation", "External id")


def record_cpu_trace(path: Path) -> Path:
    """A real trace when no reference exists: ten steps of a small CNN on the CPU, five recorded."""
    import warnings

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(16 * 30 * 30, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 3, 32, 32), torch.zeros(8, dtype=torch.long)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=2, warmup=1, active=5, repeat=1),
                     record_shapes=True) as prof:
            for _ in range(10):
                with record_function("train_step"):
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                    opt.step()
                    opt.zero_grad()
                prof.step()
    prof.export_chrome_trace(str(path))
    return path


def _load(path: Path) -> dict:
    raw = path.read_bytes()
    data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return data if isinstance(data, dict) else {"traceEvents": data}


def build(source: Path, target: Path, megabytes: float) -> tuple[int, int]:
    """Write ``source``'s events again and again, each copy later in time and with fresh ids, until the
    file holds ``megabytes`` MB. Returns (events, copies)."""
    data = _load(source)
    events = [e for e in data.pop("traceEvents") if isinstance(e, dict)]
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    if not timed:
        raise GpuprofError(f"{source} has no timed events to replicate.")
    lo = min(e["ts"] for e in timed)
    span = max(e["ts"] + (e.get("dur") or 0) for e in timed) - lo + 1000.0
    top = 1 + max([int(e.get("args", {}).get(k, 0) or 0) for e in events for k in ID_ARGS if
                   isinstance(e.get("args", {}).get(k), int)] + [int(e["id"]) for e in events if isinstance(e.get("id"), int)]
                  + [0])
    one = len(json.dumps(events)) + 2
    copies = max(1, -(-int(megabytes * 1e6) // one))  # at least the size asked for
    written = 0
    with target.open("w") as fh:
        fh.write(json.dumps(data)[:-1] + (', ' if data else '') + '"traceEvents": [')
        first = True
        for i in range(copies):
            for e in events:
                e2 = dict(e)
                if isinstance(e2.get("ts"), (int, float)) and e2.get("ph") != "M":
                    e2["ts"] = e2["ts"] + i * span
                if isinstance(e2.get("id"), int):
                    e2["id"] = e2["id"] + i * top
                if e2.get("args"):
                    a = dict(e2["args"])
                    for k in ID_ARGS:
                        if isinstance(a.get(k), int):
                            a[k] += i * top
                    if isinstance(e2.get("name"), str) and e2["name"].startswith("ProfilerStep#"):
                        e2["name"] = f"ProfilerStep#{int(e2['name'].split('#')[1]) + i * 1000}"
                    e2["args"] = a
                fh.write(("" if first else ",\n") + json.dumps(e2))
                first = False
                written += 1
        fh.write("]}\n")
    return written, copies


TOOLKIT = """
from gpuprof.torch_profiler import trace as tt, summary as ts
t = tt.read_trace(PATH)
k = ts.kernel_summary(t)
ops = ts.op_summary(t)
steps = ts.step_summary(t, rule="window")
lat = ts.launch_latency(t)
RESULT = {"kernels": len(t.kernels()), "kernel_names": len(k), "operators": len(ops), "steps": len(steps),
          "median_latency_us": float(lat.median()) / 1e3 if len(lat) else None}
"""

# The questions HTA's first two analyses answer, asked of the same file: with HTA's rounding, so the numbers
# can be compared exactly (gpuprof.torch_profiler.hta_compat says why they differ from the file's nanoseconds).
TOOLKIT_HTA_QUESTIONS = """
from gpuprof.torch_profiler import hta_compat as hc
ev = hc.gpu_events(PATH)  # the GPU events only, read from the file one event at a time
tb = hc.temporal_breakdown(ev, rounding="hta", include_sync=True)
kb = hc.kernel_breakdown(ev, rounding="hta", include_sync=True)
RESULT = {"idle_us": tb["idle_us"], "span_us": tb["span_us"], "kernel_rows": len(kb),
          "kernel_sum_us": float(kb["sum_us"].sum()), "idle_us_exact_ns": hc.temporal_breakdown(ev)["idle_us"]}
"""

HTA = """
import logging, os, warnings
logging.disable(logging.WARNING)
warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=os.path.dirname(PATH))
tb = ta.get_temporal_breakdown(visualize=False).iloc[0]
_, km = ta.get_gpu_kernel_breakdown(visualize=False, num_kernels=1_000_000, duration_ratio=1.0, include_memory_kernels=True)
RESULT = {"idle_us": float(tb["idle_time(us)"]), "span_us": float(tb["kernel_time(us)"]), "kernel_rows": len(km),
          "kernel_sum_us": float(km["sum (us)"].sum())}
"""

# `python -m gpuprof report PATH`, as `python -m` runs it (runpy), in the measured process: its terminal text is kept
# to say what it printed (hashed without the closing "(N s)" line, the report's own timing, which RESULT keeps apart).
REPORT = """
import contextlib, hashlib, io, re, runpy, sys
sys.argv = ["gpuprof", "report", PATH]
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        runpy.run_module("gpuprof", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code:
            raise
text, own = re.fullmatch(r"(.*)\\(([\\d.]+) s\\)\\n", out.getvalue(), re.S).groups()
RESULT = {"report_lines": text.count("\\n"), "report_sha256": hashlib.sha256(text.encode()).hexdigest(),
          "report_own_seconds": float(own)}
"""

BASELINE = """
import json, pandas as pd
with open(PATH) as fh:
    ev = json.load(fh)["traceEvents"]
k = pd.DataFrame([(e["name"], e["dur"]) for e in ev if e.get("cat") == "kernel"], columns=["name", "dur"])
s = k.groupby("name")["dur"].agg(["sum", "count", "mean", "min", "max"])
RESULT = {"kernels": len(k), "kernel_names": len(s)}
"""

STEPS = {"toolkit": TOOLKIT, "report": REPORT, "baseline": BASELINE, "toolkit-hta": TOOLKIT_HTA_QUESTIONS, "hta": HTA}


def run_step(step: str, trace: Path | None) -> int:
    """One step of the benchmark in this process: the code ``measure`` runs in a child, here timed from outside."""
    if trace is None or not trace.is_file():
        raise GpuprofError(f"--step {step} needs --trace with a trace file" + (f"; {trace} is not one" if trace else "") + ".",
                           "Build one first: `python scripts/bench_torch_trace.py --build-only DIR`.")
    if step == "hta" and len([f for f in trace.parent.iterdir() if f.suffix in (".json", ".gz")]) != 1:
        raise GpuprofError(f"HTA reads every trace in {trace.parent}, which holds more than {trace.name}.",
                           "Give it a folder of its own (--build-only puts HTA's trace in DIR/hta/).")
    scope: dict = {"PATH": str(trace)}
    exec(STEPS[step], scope)  # noqa: S102 - the module's own step code, as measure() runs it
    print(json.dumps(scope["RESULT"]))
    return 0


def build_only(source: Path, hta_source: Path, megabytes: float, folder: Path) -> int:
    """Build both traces into ``folder`` and keep them, for a step-by-step timing with an outside timer."""
    for f in (source, hta_source):
        if not f.exists():
            raise GpuprofError(f"{f} does not exist.", "Pass --source / --hta-source with a PyTorch profiler trace.")
    (folder / "hta").mkdir(parents=True, exist_ok=True)
    for src, target in ((source, folder / "big.json"), (hta_source, folder / "hta" / "big.json")):
        n, copies = build(src, target, megabytes)
        print(f"{target}: {n:,} events ({copies} copies of {src.name}), {target.stat().st_size / 1e6:.0f} MB", flush=True)
    return 0


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=positive_float, default=100.0, help="size of the built trace in MB (default: 100)")
    p.add_argument("--source", type=Path, default=None,
                   help=f"trace to replicate (default: {REFERENCE.relative_to(ROOT)} if present, else a CPU profile "
                        "recorded now)")
    p.add_argument("--no-hta", action="store_true", help="skip the comparison with Holistic Trace Analysis")
    p.add_argument("--hta-source", type=Path, default=HTA_SOURCE,
                   help=f"trace replicated for the comparison with HTA (default: {HTA_SOURCE.relative_to(ROOT)}, a DDP "
                        "step on an H200, on which HTA 0.5 runs to the end)")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="also write the results here")
    p.add_argument("--build-only", type=Path, default=None, metavar="DIR",
                   help="only build the two traces, DIR/big.json (from --source) and DIR/hta/big.json (from "
                        "--hta-source), and keep them: for timing one step at a time with an outside timer")
    p.add_argument("--step", choices=sorted(STEPS), default=None,
                   help="run one step in this process on --trace and print its result as JSON (what an outside "
                        "timer such as `/usr/bin/time -v` should time: the process, its imports included)")
    p.add_argument("--trace", type=Path, default=None, help="the trace --step reads (a file --build-only wrote)")
    args = p.parse_args(argv)
    if args.step is not None:
        return run_step(args.step, args.trace)
    if args.source is not None and not args.source.exists():
        raise GpuprofError(f"{args.source} does not exist.", "Pass --source with a PyTorch profiler trace (.json or .json.gz).")
    if args.build_only is not None:
        return build_only(args.source or REFERENCE, args.hta_source, args.mb, args.build_only)
    with tempfile.TemporaryDirectory() as tmp:
        source = args.source or (REFERENCE if REFERENCE.exists() else None)
        if source is None:
            print(f"no {REFERENCE.relative_to(ROOT)} here: recording a CPU profile of a small training loop to replicate "
                  "(it has no GPU events)", flush=True)
            source = record_cpu_trace(Path(tmp) / "source.json")
        path = Path(tmp) / "big.json"
        t0 = time.perf_counter()
        n, copies = build(source, path, args.mb)
        size_mb = path.stat().st_size / 1e6
        print(f"built from {source.name}: {n:,} events ({copies} copies), {size_mb:.0f} MB, in {time.perf_counter() - t0:.1f} s",
              flush=True)
        toolkit = measure(TOOLKIT, path)
        report = measure(REPORT, path)
        baseline = measure(BASELINE, path)
        hta = same = None
        if importlib.util.find_spec("hta") is not None and not args.no_hta:
            try:
                measure(HTA, path)
                print(f"HTA on {path.name}: ran")
            except GpuprofError as exc:  # HTA 0.5 asserts non_compute_time >= 0, which its own rounding can break
                print(f"HTA on the trace built from {source.name}: {exc.message} (HTA's own assertion; see "
                      "gpuprof.torch_profiler.hta_compat)")
            hta_dir = Path(tmp) / "hta"
            hta_dir.mkdir()
            hta_path = hta_dir / "big.json"
            n2, _ = build(args.hta_source, hta_path, args.mb)
            print(f"comparison with HTA on a trace built from {args.hta_source.name}: {n2:,} events, "
                  f"{hta_path.stat().st_size / 1e6:.0f} MB", flush=True)
            same = measure(TOOLKIT_HTA_QUESTIONS, hta_path)
            hta = measure(HTA, hta_path)
    cpu = platform.processor() or platform.machine()
    print(f"machine: {os.cpu_count()} cores, {cpu}, Python {platform.python_version()}")
    print(f"{'':<58}{'seconds':>9}{'peak RSS':>12}")
    print(f"{'toolkit (read; kernel, operator and step summaries; latency)':<58}{toolkit['seconds']:>9.2f}"
          f"{toolkit['peak_rss_mib']:>9.0f} MiB")
    print(f"{'report (python -m gpuprof report FILE, terminal text)':<58}{report['seconds']:>9.2f}"
          f"{report['peak_rss_mib']:>9.0f} MiB")
    if report.get("peak_tree_pss_mib") is not None:  # the parallel reader's workers are not in the process's own peak
        print(f"{'  the same, with its worker processes (peak of summed PSS)':<58}{'':>9}"
              f"{report['peak_tree_pss_mib']:>9.0f} MiB")
    print(f"{'baseline (json.load + pandas kernel summary only)':<58}{baseline['seconds']:>9.2f}"
          f"{baseline['peak_rss_mib']:>9.0f} MiB")
    if hta is not None:
        print(f"{'toolkit (GPU events; HTA temporal + kernel breakdown)':<58}{same['seconds']:>9.2f}{same['peak_rss_mib']:>9.0f} MiB")
        print(f"{'HTA 0.5 (TraceAnalysis; temporal + kernel breakdown)':<58}{hta['seconds']:>9.2f}{hta['peak_rss_mib']:>9.0f} MiB")
        agree = all(abs(same[k] - hta[k]) <= 1e-6 * max(1.0, abs(hta[k])) for k in ("idle_us", "span_us", "kernel_sum_us")) \
            and same["kernel_rows"] == hta["kernel_rows"]
        print(f"toolkit / HTA: {same['seconds'] / hta['seconds']:.2f}x the time, {same['peak_rss_mib'] / hta['peak_rss_mib']:.2f}x "
              f"the memory (target: at most 0.5x each); idle {same['idle_us']:,.0f} us vs HTA {hta['idle_us']:,.0f} us, "
              f"{same['kernel_rows']} vs {hta['kernel_rows']} kernel rows: {'equal' if agree else 'DIFFERENT'} "
              f"(the file's own nanoseconds give {same['idle_us_exact_ns']:,.0f} us idle)")
    else:
        print("HTA not installed (pip install --no-deps -r requirements-hta.txt): its comparison was skipped")
    print(f"toolkit found {toolkit['kernels']:,} kernels ({toolkit['kernel_names']} names), {toolkit['operators']} operator "
          f"keys, {toolkit['steps']} steps")
    if args.json:
        args.json.write_text(json.dumps({"mb": size_mb, "events": n, "source": source.name, "toolkit": toolkit,
                                         "report": report, "baseline": baseline, "toolkit_hta_questions": same, "hta": hta}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
