#!/usr/bin/env python3
"""Run a command and report the memory of its whole process tree: the peak of the SUM over its processes.

Why: ``/usr/bin/time -v`` reports the largest single process's resident high-water mark, so a
command that parses in worker processes would look smaller than it is. This samples every
process of the command's tree (``/proc``, Linux only) every ``--every`` seconds and prints:

* the peak of the sum of resident memory (RSS: pages a forked worker still shares with its parent
  are counted in both, so this over-counts);
* the peak of the sum of proportional set size (PSS, from ``/proc/PID/smaps_rollup``: a shared page
  is split between the processes that map it, so the sum is the memory the tree holds);
* the most processes seen at once, wall seconds, and CPU seconds (user + system of the command
  and every child it waited for, the operating system's accounting).

A sampled peak can miss a spike shorter than the interval; the figures are a benchmark's, not a test's.
Example: ``scripts/tree_memory.py -- python -m gpuprof report big.json``.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass
    return out


def _tree(root: int) -> list[int]:
    seen, todo = [], [root]
    while todo:
        p = todo.pop()
        seen.append(p)
        todo += _children(p)
    return seen


def _kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in KiB; (0, 0) once it has gone."""
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return rss, pss


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--every", type=float, default=0.02, help="seconds between samples (default: 0.02)")
    p.add_argument("--out", default=None, help="write the command's standard output here (default: discard it)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    a = p.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        p.error("give the command after --")
    if not Path("/proc/self/smaps_rollup").exists():
        p.error("this needs Linux's /proc/PID/smaps_rollup")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    sink = open(a.out, "wb") if a.out else subprocess.DEVNULL  # noqa: SIM115
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=sink)
    peak_rss = peak_pss = most = 0
    while proc.poll() is None:
        pids = _tree(proc.pid)
        sizes = [_kib(q) for q in pids]
        peak_rss = max(peak_rss, sum(r for r, _ in sizes))
        peak_pss = max(peak_pss, sum(s for _, s in sizes))
        most = max(most, sum(1 for r, _ in sizes if r))
        time.sleep(a.every)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if a.out:
        sink.close()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"exit {proc.returncode}  wall {wall:.1f} s  cpu {cpu:.1f} s  peak sum RSS {peak_rss / 1024:,.0f} MiB  "
          f"peak sum PSS {peak_pss / 1024:,.0f} MiB  processes at once {most}  "
          f"(largest single process {after.ru_maxrss / 1024:,.0f} MiB, OS accounting)  load {os.getloadavg()[0]:.2f}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
