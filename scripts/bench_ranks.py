#!/usr/bin/env python3
"""Benchmark: ``gpuprof report`` on a folder of many ranks' PyTorch profiler traces, one of them slowed.

Builds ``--ranks`` traces from chapter 8's two real DDP ranks (``artifacts/ch08/ddp_trace_rank{0,1}.json.gz``,
two H200s): rank r is a copy of real rank ``r % 2`` with every timestamp shifted by r ms (each host's
clock starts elsewhere), and rank ``--slow`` is made a straggler: its kernels outside NCCL last
``--slow-factor`` times longer and its NCCL kernels half as long (the last rank to arrive at a
collective waits least). Then, in a fresh process so that time and peak memory are its own, it
builds the report of the folder (every rank's page, the side-by-side page, the HTML), and says
whether the side-by-side page named the slowed rank. Deterministic: no random draws.

It is a benchmark, not a test: the time depends on the machine, which it names. The copies are
synthetic (real kernels, shifted and stretched), so the page's figures describe them, not a job.

  python scripts/bench_ranks.py --ranks 64 --folder /tmp/ranks64
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.cli import bounded_int  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402
from fresh_process import measure  # noqa: E402  (beside this script)

SOURCES = [ROOT / "artifacts" / "ch08" / f"ddp_trace_rank{r}.json.gz" for r in (0, 1)]
STEP = """
from gpuprof.report import build_pages
from gpuprof.report.render import html_page
pages = build_pages([PATH])
html = html_page(pages)
RESULT = {"pages": len(pages), "html_bytes": len(html),
          "balance": next((b.text for b in pages[0].blocks if b.heading == "Balance"), "") or ""}
"""


def build(folder: Path, ranks: int, slow: int, factor: float) -> None:
    """Write ``ranks`` traces into ``folder`` (see the module's text)."""
    folder.mkdir(parents=True, exist_ok=True)
    real = [json.loads(gzip.decompress(p.read_bytes())) for p in SOURCES]
    for r in range(ranks):
        data = json.loads(json.dumps(real[r % 2]))  # a deep copy
        for e in data["traceEvents"]:
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] += 1000.0 * r
            if r == slow and e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel":
                e["dur"] *= 0.5 if str(e.get("name", "")).startswith("nccl") else factor
        data["distributedInfo"] = {**data.get("distributedInfo", {}), "rank": r, "world_size": ranks}
        (folder / f"rank{r:04d}.json.gz").write_bytes(gzip.compress(json.dumps(data).encode(), compresslevel=1))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=bounded_int(4096, "each rank is a trace of about 0.4 MiB on disk", low=2), default=64,
                   help="traces to build, 2 to 4096 (default: 64)")
    p.add_argument("--slow", type=int, default=None, help="the rank to slow (default: ranks // 2 + 1)")
    p.add_argument("--slow-factor", type=float, default=1.3, help="its compute kernels' stretch (default: 1.3)")
    p.add_argument("--folder", type=Path, required=True, help="where the traces go (a new or empty folder)")
    args = p.parse_args(argv)
    args.slow = args.ranks // 2 + 1 if args.slow is None else args.slow
    if not 0 <= args.slow < args.ranks:
        p.error(f"--slow {args.slow} is not a rank of 0..{args.ranks - 1}")
    if args.slow_factor <= 1:
        p.error("--slow-factor must be above 1 (a straggler is slower)")
    return args


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.folder.exists() and any(args.folder.iterdir()):
        raise GpuprofError(f"{args.folder} is not empty.", "Give a new folder: the report reads every capture in it.")
    build(args.folder, args.ranks, args.slow, args.slow_factor)
    size = sum(f.stat().st_size for f in args.folder.iterdir())
    print(f"built {args.ranks} traces from {SOURCES[0].name} and {SOURCES[1].name} in {args.folder} "
          f"({size / 2**20:.1f} MiB gzipped); rank {args.slow} slowed ({args.slow_factor}x compute, 0.5x NCCL)")
    result = measure(STEP, args.folder)
    print(f"machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}")
    print(f"gpuprof report of the folder: {result['seconds']:.2f} s, peak RSS {result['peak_rss_mib']:.0f} MiB, "
          f"{result['pages']} pages, HTML {result['html_bytes'] / 2**20:.1f} MiB")
    print(f"its balance line: {result['balance']}")
    named = f"Likely straggler: rank{args.slow:04d}" in result["balance"]
    print(f"the slowed rank named as the straggler: {named}")
    return 0 if named else 1


if __name__ == "__main__":
    sys.exit(main())
