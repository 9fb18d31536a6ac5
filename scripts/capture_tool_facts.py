#!/usr/bin/env python3
"""On a GPU machine: record what this machine's nsys says to commands from older write-ups, into artifacts/tools/.

The book's table of older commands (book/troubleshooting.md, "Commands from older write-ups")
is checked by tests/test_book_facts.py against these files, so that a claim about what nsys
2025.3 accepts is the tool's own answer, not a memory:

* ``nsys-profile-help.txt``, ``nsys-stats-help-reports.txt``: the listings themselves;
* ``older-commands.json``: for a small PyTorch program, what ``--cudabacktrace=true`` records
  next to ``all`` and ``none`` (exit status; CUDA API calls with a backtrace), what
  ``nsys stats --report gputrace`` answers, whether a 2019-style command line
  (``-y -d -w -t ... --cuda-memory-usage=true --force-overwrite true``) runs, the report's
  suffix, and whether ``nvprof`` is installed with this CUDA toolkit.

* with ``--ncu-metrics`` instead: ``ncu-query-metrics-gh100.txt.gz`` (every base metric name
  ncu knows for the H100/H200 chip, ``ncu --query-metrics --chip gh100``) and
  ``ncu-metric-suffixes.txt.gz`` (the full names, with every suffix, of the metrics that the
  nvprof -> ncu table in ``nvprof-ncu-metrics.csv`` uses), so that the table's names are the
  tool's own (tests/test_book_facts.py checks every one). Needs ncu, not a GPU.

* with ``--nvtx-trigger`` instead: ``nvtx-capture-trigger.json``, whether ``--capture-range=nvtx``
  starts on a range opened by the ``nvtx`` package (which registers its messages) and by
  ``torch.cuda.nvtx`` (plain strings), each with and without
  ``NSYS_NVTX_PROFILER_REGISTER_ONLY=0`` (the User Guide says nsys compares only registered
  strings by default): four captures of a small PyTorch program, each with its exit status,
  whether a report was written and how many kernels it holds. Needs nsys and a GPU.

Usage: ``python scripts/capture_tool_facts.py`` (about a minute; needs nsys and a GPU),
``python scripts/capture_tool_facts.py --ncu-metrics`` (seconds), or
``python scripts/capture_tool_facts.py --nvtx-trigger`` (under a minute; needs nsys and a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuprof import describe_machine, exit_on_error  # noqa: E402
from gpuprof.tools import find_tool  # noqa: E402

PROGRAM = ("import torch; x = torch.ones(4096, device='cuda'); [x.mul_(1.0001) for _ in range(200)]; "
           "torch.cuda.synchronize(); y = x.cpu()")


def sh(*cmd: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, cwd=cwd, timeout=300, env=env)


def backtraces(nsys: str, value: str, tmp: Path) -> dict:
    name = "bt_" + value.replace(":", "_")
    r = sh(nsys, "profile", "--trace=cuda,nvtx", f"--cudabacktrace={value}", "-o", name, "-f", "true",
           sys.executable, "-c", PROGRAM, cwd=tmp)
    sh(nsys, "export", "--type", "sqlite", "-o", f"{name}.sqlite", "-f", "true", f"{name}.nsys-rep", cwd=tmp)
    con = sqlite3.connect(tmp / f"{name}.sqlite")
    calls, with_bt = con.execute("SELECT count(*), sum(callchainId IS NOT NULL) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()
    return {"rc": r.returncode, "cuda_api_calls": calls, "with_backtrace": int(with_bt or 0),
            "said": [ln for ln in (r.stdout + r.stderr).splitlines() if "backtrace" in ln.lower()][:3]}


TRIGGER_RANGE = "trigger_range"
REGISTER_ONLY = "NSYS_NVTX_PROFILER_REGISTER_ONLY"
# 50 kernels inside the range; the tensor is made (and its fill kernel run) before it opens.
_TRIGGER_BODY = ("x = torch.ones(4096, device='cuda'); torch.cuda.synchronize()\n"
                 "{open}\n"
                 "for _ in range(50):\n    x.mul_(1.0001)\n"
                 "torch.cuda.synchronize()\n"
                 "{close}\n")
TRIGGER_PROGRAMS = {
    "nvtx": "import nvtx, torch\n" + _TRIGGER_BODY.format(
        open=f"nvtx.push_range({TRIGGER_RANGE!r})", close="nvtx.pop_range()"),
    "torch.cuda.nvtx": "import torch\n" + _TRIGGER_BODY.format(
        open=f"torch.cuda.nvtx.range_push({TRIGGER_RANGE!r})", close="torch.cuda.nvtx.range_pop()"),
}


def trigger_command(nsys: str, api: str, full_match: bool) -> list[str]:
    """``nsys profile`` over the program of ``api`` that records only inside ``trigger_range``."""
    name = f"trigger_{api.replace('.', '_')}_{'full_match' if full_match else 'default'}"
    env = [f"--env-var={REGISTER_ONLY}=0"] if full_match else []
    return [nsys, "profile", "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none", "--capture-range=nvtx",
            f"--nvtx-capture={TRIGGER_RANGE}", "--capture-range-end=stop", *env, "-o", name, "-f", "true",
            sys.executable, "-c", TRIGGER_PROGRAMS[api]]


def nvtx_trigger(nsys: str, api: str, full_match: bool, tmp: Path) -> dict:
    """One capture: did the range start it, and how many kernels did the report get (50 expected)?

    The variable is removed from the environment nsys inherits, so that "default" means
    nsys's own default, whatever the calling shell set.
    """
    cmd = trigger_command(nsys, api, full_match)
    name = cmd[cmd.index("-o") + 1]
    env = {k: v for k, v in os.environ.items() if k != REGISTER_ONLY}
    r = sh(*cmd, cwd=tmp, env=env)
    report = tmp / f"{name}.nsys-rep"
    kernels = None
    if report.exists():
        sh(nsys, "export", "--type", "sqlite", "-o", f"{name}.sqlite", "-f", "true", report.name, cwd=tmp)
        con = sqlite3.connect(tmp / f"{name}.sqlite")
        tables = {t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        kernels = (con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
                   if "CUPTI_ACTIVITY_KIND_KERNEL" in tables else 0)
        con.close()
    shown = ["nsys", *cmd[1:cmd.index(sys.executable)], "python", "-c", "..."]
    return {"api": api, "env": f"{REGISTER_ONLY}=0" if full_match else "unset", "command": " ".join(shown),
            "rc": r.returncode, "report_written": report.exists(), "kernels": kernels,
            "said": [ln for ln in (r.stdout + r.stderr).splitlines()
                     if any(w in ln.lower() for w in ("capture", "no reports", "error", "warning"))][:4]}


def record_nvtx_trigger(out: Path) -> int:
    from importlib.metadata import version

    nsys = str(find_tool("nsys").path)
    facts: dict = {"machine": describe_machine().summary(), "nsys": sh(nsys, "--version", cwd=out).stdout.strip(),
                   "nvtx": version("nvtx"), "range": TRIGGER_RANGE, "kernels_inside_the_range": 50, "runs": []}
    with tempfile.TemporaryDirectory() as t:
        for api in TRIGGER_PROGRAMS:
            for full_match in (False, True):
                run = nvtx_trigger(nsys, api, full_match, Path(t))
                print(f"{api:<16} {run['env']:<36} rc {run['rc']}, report {run['report_written']}, "
                      f"kernels {run['kernels']}")
                facts["runs"].append(run)
    (out / "nvtx-capture-trigger.json").write_text(json.dumps(facts, indent=1) + "\n")
    print(f"wrote {out / 'nvtx-capture-trigger.json'}")
    return 0


def table_bases(csv_path: Path) -> list[str]:
    """The base metric names (before the first dot) in the nvprof table's ncu column."""
    import csv
    import re

    bases = set()
    for row in csv.DictReader(csv_path.open()):
        bases.update(t.split(".")[0] for t in re.findall(r"[a-z0-9_]+__[a-z0-9_.]+", row["ncu metric (or expression)"]))
    return sorted(bases)


def record_ncu_metrics(out: Path) -> int:
    import gzip

    ncu = str(find_tool("ncu").path)
    listing = sh(ncu, "--query-metrics", "--chip", "gh100", cwd=out)
    suffixes = sh(ncu, "--query-metrics-mode", "suffix", "--chip", "gh100", "--metrics",
                  ",".join(table_bases(out / "nvprof-ncu-metrics.csv")), cwd=out)
    for name, proc in (("ncu-query-metrics-gh100.txt.gz", listing), ("ncu-metric-suffixes.txt.gz", suffixes)):
        if proc.returncode != 0:
            raise SystemExit(f"ncu failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
        header = f"# {' '.join(proc.args[1:])}\n# {sh(ncu, '--version', cwd=out).stdout.strip().splitlines()[-1]}\n"
        (out / name).write_bytes(gzip.compress((header + proc.stdout).encode(), mtime=0))
        print(f"wrote {out / name}: {len(proc.stdout.splitlines())} lines")
    return 0


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = p.add_mutually_exclusive_group()
    what.add_argument("--ncu-metrics", action="store_true", help="record ncu's metric names for the nvprof table instead")
    what.add_argument("--nvtx-trigger", action="store_true",
                      help="record whether --capture-range=nvtx starts on the nvtx package's and torch.cuda.nvtx's "
                           f"ranges, with and without {REGISTER_ONLY}=0, instead")
    args = p.parse_args(argv)
    out = ROOT / "artifacts" / "tools"
    out.mkdir(parents=True, exist_ok=True)
    if args.ncu_metrics:
        return record_ncu_metrics(out)
    if args.nvtx_trigger:
        return record_nvtx_trigger(out)
    nsys = str(find_tool("nsys").path)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        (out / "nsys-profile-help.txt").write_text(sh(nsys, "profile", "--help", cwd=tmp).stdout)
        (out / "nsys-stats-help-reports.txt").write_text(sh(nsys, "stats", "--help-reports", cwd=tmp).stdout)
        facts: dict = {"machine": describe_machine().summary(), "nsys": sh(nsys, "--version", cwd=tmp).stdout.strip()}
        facts["cudabacktrace"] = {v: backtraces(nsys, v, tmp) for v in ("true", "all", "none")}
        print("cudabacktrace:", {k: v["with_backtrace"] for k, v in facts["cudabacktrace"].items()})
        r = sh(nsys, "profile", "-y", "1", "-d", "3", "-w", "true", "-t", "cuda,cudnn,osrt,nvtx", "--cuda-memory-usage=true",
               "--force-overwrite", "true", "-o", "result", sys.executable, "-c", PROGRAM + "; import time; time.sleep(2)",
               cwd=tmp)
        facts["older_profile_line"] = {"command": "nsys profile -y 1 -d 3 -w true -t cuda,cudnn,osrt,nvtx "
                                                  "--cuda-memory-usage=true --force-overwrite true -o result python ...",
                                       "rc": r.returncode, "files": sorted(p.name for p in tmp.glob("result*"))}
        g = sh(nsys, "stats", "--report", "gputrace", "result.nsys-rep", cwd=tmp)
        facts["stats_gputrace"] = {"rc": g.returncode,
                                   "said": [ln for ln in (g.stdout + g.stderr).splitlines() if "ERROR" in ln][:2]}
        cuda_bin = Path("/usr/local/cuda/bin")
        facts["nvprof"] = {"on_path": shutil.which("nvprof"), "nvprof_in_cuda_bin": (cuda_bin / "nvprof").exists(),
                           "nvvp_in_cuda_bin": (cuda_bin / "nvvp").exists(),
                           "note": f"{cuda_bin} searched for nv*prof*: " + ", ".join(sorted(p.name for p in cuda_bin.glob("nv*prof*")))}
        print(json.dumps({k: v for k, v in facts.items() if k != "cudabacktrace"}, indent=1))
    (out / "older-commands.json").write_text(json.dumps(facts, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
