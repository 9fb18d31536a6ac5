"""Run a benchmark step in a fresh Python process, so that its wall time and peak memory are its own.

Shared by ``bench_trace_analysis.py`` and ``bench_torch_trace.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuprof.errors import GpuprofError  # noqa: E402

RUNNER = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
PATH = {path!r}
t0 = time.perf_counter()
exec({code!r})
RESULT["seconds"] = time.perf_counter() - t0
RESULT["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(RESULT))
"""


def measure(code: str, path: Path) -> dict:
    """Run ``code`` (which reads the file ``PATH`` and sets a dict ``RESULT``); add its seconds and peak RSS."""
    proc = subprocess.run([sys.executable, "-c", RUNNER.format(root=str(ROOT), path=str(path), code=code)],
                          capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise GpuprofError(f"benchmark step failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr else '?'}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
