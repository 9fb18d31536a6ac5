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
    """Run ``code`` (which reads the file ``PATH`` and sets a dict ``RESULT``); add its seconds and peak RSS.

    ``peak_rss_mib`` is the measured process's own high-water mark. Where the code starts worker processes (the
    parallel trace reader does), they are not in it: ``peak_tree_pss_mib`` is the peak of the sum of proportional
    set sizes over the process and its children, sampled every 20 ms (``tree_memory.py``; Linux only, else None).
    """
    import tempfile
    import time

    from tree_memory import _kib, _tree  # noqa: E402  (beside this script)

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-c", RUNNER.format(root=str(ROOT), path=str(path), code=code)],
                                stdout=out, stderr=err, text=True)
        peak = 0
        sampled = Path("/proc/self/smaps_rollup").exists()
        t0 = time.monotonic()
        while proc.poll() is None:
            if time.monotonic() - t0 > 600:
                proc.kill()
                proc.wait()
                raise GpuprofError("benchmark step ran past 600 s")
            if sampled:
                peak = max(peak, sum(pss for _, pss in map(_kib, _tree(proc.pid))))
            time.sleep(0.02)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise GpuprofError(f"benchmark step failed: {stderr.strip().splitlines()[-1] if stderr.strip() else '?'}")
    result = json.loads(stdout.strip().splitlines()[-1])
    result["peak_tree_pss_mib"] = peak / 1024 if sampled else None
    return result
