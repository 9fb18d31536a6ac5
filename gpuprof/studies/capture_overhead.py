"""What recording costs: the same program timed without nsys and under each set of nsys options.

Chapters 1 and 2 ask how much a capture slows the program it records (the launch cost
that ``examples/nsys/tiny_kernels.py`` prints, the cost of an NVTX range in
``examples/nsys/nvtx_features.py``) and how large the report grows; :func:`capture_overhead`
measures both, between two runs without the profiler whose difference is the noise.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from ..runner import ProfilerFailed, python_target, run_profiler
from ..tools import require_tool

__all__ = ["capture_overhead", "launch_cost"]


def _median_launch_us(text: str) -> float | None:
    m = re.search(r"median: ([\d.]+) us per launch", text)
    return float(m.group(1)) if m else None


def launch_cost(text: str) -> dict:
    """What tiny_kernels.py reports: its median cost per launch."""
    return {"us_per_launch": _median_launch_us(text)}


def capture_overhead(script: str | Path, script_args: Sequence[str], configs: dict[str, list[str]],
                     parse=launch_cost) -> list[dict]:  # type: ignore[no-untyped-def]
    """Run ``script`` without nsys and under each nsys option set; collect what ``parse`` reads
    from its output (default: tiny_kernels.py's ``median: X us per launch``) and the report size.

    Returns one row per configuration, between two runs without the profiler (first and
    last), whose difference is the run-to-run noise; a configuration this
    machine does not support is reported as such instead of failing the whole table.
    """
    import subprocess
    import tempfile

    nsys, _ = require_tool("nsys", "Cannot measure capture overhead", error=ProfilerFailed)
    rows = []
    def baseline(label: str) -> dict:
        run = subprocess.run(python_target(script, *script_args), capture_output=True, text=True, timeout=300, check=False)
        return {"configuration": label, "options": "", **parse(run.stdout), "report_mib": 0.0, "wall_s": None}

    rows.append(baseline("no profiler"))
    with tempfile.TemporaryDirectory() as tmp:
        for label, opts in configs.items():
            try:
                cap = run_profiler(nsys, ["profile", *opts, "-o", "{output}"], python_target(script, *script_args),
                                   out_dir=Path(tmp), name=label.replace(" ", "_"), overwrite=True)
                text = cap.log.read_text()
                size = sum(f.stat().st_size for f in cap.files) / 2**20
                rows.append({"configuration": label, "options": " ".join(opts), **parse(text),
                             "report_mib": size, "wall_s": cap.seconds})
            except ProfilerFailed as exc:
                rows.append({"configuration": label, "options": " ".join(opts), **{k: None for k in parse("")},
                             "report_mib": None, "wall_s": None, "error": str(exc).split(". ")[0]})
    # The same program again without the profiler: the spread between the two baselines
    # is the run-to-run noise, and differences smaller than it mean nothing.
    rows.append(baseline("no profiler, again"))
    return rows
