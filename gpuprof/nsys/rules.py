"""``nsys analyze``: Nsight Systems' own rules for the patterns a timeline is read for, run on a report.

``nsys analyze --rule NAME[:option=value...] REPORT`` runs one of nsys's expert-system
rules over a report's sqlite export and prints what it flags, with a line of advice. The
rules are SQL over the same tables :mod:`gpuprof.nsys.sqlite` reads, so each states a
pattern that can also be found by hand:

* ``cuda_memcpy_async``: ``cudaMemcpy*Async`` calls whose host side is pageable memory, which
  makes the "asynchronous" copy block while the driver stages it;
* ``cuda_memcpy_sync`` / ``cuda_memset_sync``: copies and memsets that block the CPU;
* ``cuda_api_sync``: ``cudaDeviceSynchronize`` and ``cudaStreamSynchronize`` calls;
* ``gpu_gaps``: stretches with no GPU work, of at least ``gap`` milliseconds (500 unless told);
* ``gpu_time_util``: windows where the GPU is in use less than a threshold.

Each rule accepts ``rows=`` (how many rows it prints, 50 unless told), ``start=``/``end=``
(nanoseconds) and ``nvtx=RANGE`` to look at one range only. :func:`analyze` runs a set of
rules and keeps each one's printed text, with machine paths removed, for a chapter to show.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Sequence

from ..errors import GpuprofError
from ..runner import portable_command, portable_text
from ..tools import find_tool, tool_version
from .sqlite import ensure_sqlite

__all__ = ["RULES", "analyze", "excerpt"]

#: The rules about CUDA programs, with options that suit a run of a few seconds: a few rows each,
#: and gaps from 100 ms (the default, 500 ms, is meant for long runs).
RULES = ("cuda_memcpy_async:rows=5", "cuda_memcpy_sync:rows=5", "cuda_memset_sync:rows=5", "cuda_api_sync:rows=5",
         "gpu_gaps:rows=5:gap=100", "gpu_time_util:rows=5")


def analyze(report: str | Path, rules: Sequence[str] = RULES, *, timeout: float = 300) -> dict:
    """Run ``nsys analyze`` once per rule on ``report`` (a ``.nsys-rep`` or its sqlite export, gzipped
    or not); returns ``{"nsys": version, "rules": {rule: {"command", "returncode", "seconds", "text"}}}``.

    One call per rule keeps each rule's output (and failure) apart. A rule that fails is kept with its
    exit status and message rather than raised: the other rules' findings still stand. Raises a
    :class:`GpuprofError` only when nsys itself is not there to run. No GPU is needed: the rules
    read the file.
    """
    nsys = find_tool("nsys")
    version = tool_version(nsys)
    path = ensure_sqlite(report)
    out: dict = {"nsys": version, "report": Path(report).name, "rules": {}}
    for rule in rules:
        cmd = [str(nsys.path), "analyze", "--rule", rule, str(path)]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
            code, text = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired:
            code, text = None, f"did not finish within {timeout:.0f} s"
        shown = [*cmd[:-1], Path(report).name]
        out["rules"][rule] = {"command": " ".join(portable_command(shown)), "returncode": code,
                              "seconds": round(time.perf_counter() - t0, 2),
                              "text": portable_text(text, every_path=True).strip()}
    if not out["rules"]:
        raise GpuprofError("No rule was given to nsys analyze.", f"Pass some of: {', '.join(RULES)}.")
    return out


def excerpt(text: str, lines: int = 8, width: int = 112) -> list[str]:
    """The first ``lines`` non-empty lines of a rule's output, each cut to ``width`` characters: what a
    chapter shows of it (the advice, then the first rows it flags)."""
    kept = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    return [ln if len(ln) <= width else ln[: width - 3] + "..." for ln in kept[:lines]]
