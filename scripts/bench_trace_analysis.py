#!/usr/bin/env python3
"""Benchmark: analyse an nsys sqlite export with a million kernel rows, against a plain baseline.

Builds the export from a real capture (``artifacts/ch01/transfer.sqlite`` by default):
its kernel rows, and the runtime calls that launched them, are replicated with shifted
times and fresh correlation ids until the file holds ``--rows`` kernels. Then, each in a
fresh process so that peak memory is its own:

* **toolkit**: ``gpuprof.nsys.sqlite.kernels(only=("name", "correlationId"))`` + ``runtime_calls``,
  then the kernel summary, GPU busy fraction, idle gaps (labelled with CPU calls) and launch
  latency;
* **toolkit, summary only**: ``kernels(only=("name",))`` (the columns the baseline reads) and the
  kernel summary, nothing else;
* **baseline**: plain ``sqlite3`` + pandas: one query joining kernel names, then the
  same per-name summary with ``groupby``.

Prints wall time and peak resident memory of each, side by side. It is a benchmark,
not a test: numbers depend on the machine, which it names.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_ROWS = 50_000_000
sys.path.insert(0, str(ROOT))

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.cli import bounded_int, output_file  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402
from gpuprof.nsys.sqlite import ensure_sqlite  # noqa: E402
from fresh_process import measure  # noqa: E402  (beside this script)


def build(source: Path, target: Path, rows: int) -> int:
    """Copy ``source`` and replicate its kernels (and their launch calls) to ``rows`` kernels."""
    shutil.copy(source, target)
    con = sqlite3.connect(target)
    k = "CUPTI_ACTIVITY_KIND_KERNEL"
    rt = "CUPTI_ACTIVITY_KIND_RUNTIME"
    base = con.execute(f"SELECT count(*) FROM {k}").fetchone()[0]
    if base == 0:
        raise GpuprofError(f"{source} has no kernel rows to replicate.")
    span = con.execute(f"SELECT max(end) - min(start) + 1000 FROM {k}").fetchone()[0]
    max_corr = con.execute(f"SELECT max(correlationId) FROM {rt}").fetchone()[0] + 1
    kcols = [r[1] for r in con.execute(f"PRAGMA table_info('{k}')")]
    rcols = [r[1] for r in con.execute(f"PRAGMA table_info('{rt}')")]

    def shifted(cols: list[str], i: int) -> str:
        out = []
        for c in cols:
            if c in ("start", "end"):
                out.append(f"{c} + {i * span}")
            elif c == "correlationId":
                out.append(f"{c} + {i * max_corr}")
            else:
                out.append(c)
        return ", ".join(out)

    copies = -(-rows // base) - 1
    con.execute(f"CREATE TEMP TABLE k0 AS SELECT * FROM {k}")
    con.execute(f"CREATE TEMP TABLE r0 AS SELECT * FROM {rt} WHERE correlationId IN (SELECT correlationId FROM {k})")
    for i in range(1, copies + 1):
        con.execute(f"INSERT INTO {k} ({', '.join(kcols)}) SELECT {shifted(kcols, i)} FROM k0")
        con.execute(f"INSERT INTO {rt} ({', '.join(rcols)}) SELECT {shifted(rcols, i)} FROM r0")
    con.execute(f"DELETE FROM {k} WHERE rowid NOT IN (SELECT rowid FROM {k} ORDER BY start LIMIT {rows})")
    con.commit()
    n = con.execute(f"SELECT count(*) FROM {k}").fetchone()[0]
    con.close()
    return n


TOOLKIT = """
from gpuprof.nsys import analysis as ta, sqlite as ns, stats as st
k = ns.kernels(PATH, only=("name", "correlationId")); rt = ns.runtime_calls(PATH)  # what these measures use, no more
s = st.kernel_summary(k, by="name")
busy = ta.busy_fraction(k)
gaps = ta.idle_gaps(k, rt, min_gap_ns=100_000)
lat = ta.launch_latency(k, rt)
RESULT = {"kernels": len(k), "names": len(s), "busy": busy, "gaps": len(gaps), "median_latency_us": float(lat.median()) / 1e3}
"""

TOOLKIT_SUMMARY = """
from gpuprof.nsys import analysis as ta, sqlite as ns, stats as st
k = ns.kernels(PATH, only=("name",))  # the columns the baseline reads: times and short names
s = st.kernel_summary(k, by="name")
RESULT = {"kernels": len(k), "names": len(s)}
"""

BASELINE = """
import sqlite3, pandas as pd
con = sqlite3.connect(PATH)
k = pd.read_sql_query("SELECT k.start, k.end, s.value AS name FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON k.shortName = s.id", con)
k["d"] = k["end"] - k["start"]
s = k.groupby("name")["d"].agg(["sum", "count", "mean", "median", "min", "max", "std"])
RESULT = {"kernels": len(k), "names": len(s)}
"""

@exit_on_error
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=bounded_int(MAX_ROWS, "the export and the readers' tables grow with it: fifty "
                                                      "million rows already need gigabytes"),
                   default=1_000_000, help=f"kernel rows in the built export (default: 1,000,000; at most {MAX_ROWS:,})")
    p.add_argument("--source", type=Path, default=ROOT / "artifacts" / "ch01" / "transfer.sqlite", help="capture to replicate")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="also write the results here")
    p.add_argument("--build-only", type=output_file, default=None, metavar="FILE",
                   help="only build the export, here, and keep it: for timing `python -m gpuprof report FILE` (or any "
                        "step) with an outside timer such as /usr/bin/time -v")
    args = p.parse_args(argv)
    source = ensure_sqlite(args.source)  # the course's references are committed gzipped
    if not source.exists():
        raise GpuprofError(f"{args.source} does not exist.", "Pass --source with an nsys sqlite export.")
    if args.build_only is not None:
        if args.build_only.exists():
            raise GpuprofError(f"{args.build_only} exists.", "Give a new file name: the export is built from a copy.")
        t0 = time.perf_counter()
        n = build(source, args.build_only, args.rows)
        print(f"built {args.build_only}: {n:,} kernel rows, {args.build_only.stat().st_size / 2**20:.0f} MiB, "
              f"in {time.perf_counter() - t0:.1f} s")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "million.sqlite"
        t0 = time.perf_counter()
        n = build(source, path, args.rows)
        print(f"built {path.name}: {n:,} kernel rows, {path.stat().st_size / 2**20:.0f} MiB, in {time.perf_counter() - t0:.1f} s")
        toolkit = measure(TOOLKIT, path)
        summary = measure(TOOLKIT_SUMMARY, path)
        baseline = measure(BASELINE, path)
    cpu = platform.processor() or platform.machine()
    print(f"machine: {os.cpu_count()} cores, {cpu}, Python {platform.python_version()}")
    print(f"{'':<44}{'seconds':>9}{'peak RSS':>12}")
    print(f"{'toolkit (read + summary, busy, gaps, latency)':<44}{toolkit['seconds']:>9.2f}{toolkit['peak_rss_mib']:>9.0f} MiB")
    print(f"{'toolkit (read + summary only)':<44}{summary['seconds']:>9.2f}{summary['peak_rss_mib']:>9.0f} MiB")
    print(f"{'baseline (sqlite3 + pandas, summary only)':<44}{baseline['seconds']:>9.2f}{baseline['peak_rss_mib']:>9.0f} MiB")
    print(f"toolkit found {toolkit['names']} kernel names, GPU busy {toolkit['busy']:.1%}, {toolkit['gaps']:,} gaps over 100 us, "
          f"median launch latency {toolkit['median_latency_us']:.1f} us")
    if args.json:
        args.json.write_text(json.dumps({"rows": n, "toolkit": toolkit, "toolkit_summary_only": summary,
                                         "baseline": baseline}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
