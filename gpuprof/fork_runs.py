"""Run a course script many times, each run in a fresh process, without paying for ``import torch`` each time.

A study that times many configurations wants each one in a process of its own: its own
CUDA context, caching allocator, cuDNN autotuning cache, DataLoader workers and compiled
code, so that no run helps or hinders the next. On the course's GPU machines a new Python
process spends about 6.5 s importing PyTorch before it does anything (measured on an H100
host: ``python -c "import torch"`` 6.5 s, with CUDA initialised 7.4 s), more than most runs
take. So this server imports PyTorch and the script once, *without touching CUDA*, and
forks one child per run: each child initialises CUDA itself, runs the script's ``main``
with that run's arguments and environment, and exits. Children are separate processes in
every sense the measurements care about; what they share is the parent's imported code.

Run it as ``python -m gpuprof.fork_runs PLAN.json``. The plan is a JSON object:
``{"script": path, "preload": "module:function" or null, "timeout_s": 240,
"runs": [{"argv": [...], "env": {...}, "log": path}, ...]}``. ``preload`` names a
function called once in the parent before any fork (to build data every run uses). Each
finished run prints one line ``RUN <index> <exit status> <seconds>`` (the caller streams
them), and the child's own output goes to its ``log`` file. A run past ``timeout_s`` is
killed with its children and reported with status ``timeout``.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Iterator, Sequence

__all__ = ["serve", "run_all"]


def _child(module: Any, run: dict[str, Any]) -> None:
    """In the forked child: the run's environment and log, then the script's main; never returns."""
    code = 1
    try:
        os.setsid()  # its own process group, so that a time-out kills its DataLoader workers too
        os.environ.update(run.get("env", {}))
        log = os.open(run["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        try:
            result = module.main(list(run["argv"]))
            code = int(result or 0)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - the child reports any failure in its log and its status
            import traceback

            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)  # no parent atexit handlers, no second flush of inherited buffers


def _wait(pid: int, timeout_s: float) -> str:
    """The child's exit status as text ("0", "2", ..., "timeout", "signal 9")."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return str(os.waitstatus_to_exitcode(status)) if os.WIFEXITED(status) else f"signal {os.WTERMSIG(status)}"
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            os.waitpid(pid, 0)
            return "timeout"
        time.sleep(0.05)


def serve(plan: dict[str, Any]) -> int:
    """Import the script once, call the preload, then fork one child per run, in order; returns 0."""
    from .runner import load_script

    import torch  # noqa: F401 - imported once here, inherited by every child; CUDA stays untouched until a child uses it

    module = load_script(plan["script"])
    if plan.get("preload"):
        mod, func = plan["preload"].split(":")
        getattr(importlib.import_module(mod), func)()
    timeout_s = float(plan.get("timeout_s", 240))
    for i, run in enumerate(plan["runs"]):
        sys.stdout.flush()
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            # Python 3.12 warns on any fork of a process with more than one OS thread; importing PyTorch starts one
            # (idle, holding no lock the child needs). Fifty children per chapter run have run this way.
            warnings.filterwarnings("ignore", message=r".*multi-threaded, use of fork\(\) may lead to deadlocks",
                                    category=DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            _child(module, run)
        status = _wait(pid, timeout_s)
        print(f"RUN {i} {status} {time.perf_counter() - t0:.1f}", flush=True)
    return 0


def run_all(script: str | Path, argvs: Sequence[Sequence[str]], *, envs: Sequence[dict[str, str]] | None = None,
            preload: str | None = None, timeout_s: float = 240) -> Iterator[tuple[int, str, float, str]]:
    """The client side: run ``script`` once per argument list, each in a forked process, in order.

    Yields ``(index, exit status, seconds, the run's output)`` as each run ends, so that a caller
    can print progress. Raises ``GpuprofError`` if the server itself stops before the last run.
    """
    import subprocess
    import tempfile

    from .artifacts import REPO_ROOT
    from .errors import GpuprofError

    envs = list(envs) if envs is not None else [{} for _ in argvs]
    with tempfile.TemporaryDirectory() as tmp:
        runs = [{"argv": list(a), "env": e, "log": f"{tmp}/run{i}.log"} for i, (a, e) in enumerate(zip(argvs, envs))]
        plan_file = Path(tmp) / "plan.json"
        plan_file.write_text(json.dumps({"script": str(script), "preload": preload, "timeout_s": timeout_s, "runs": runs}))
        path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
        proc = subprocess.Popen([sys.executable, "-m", "gpuprof.fork_runs", str(plan_file)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": path})
        assert proc.stdout is not None
        done, said = 0, []
        for line in proc.stdout:
            parts = line.split()
            if len(parts) != 4 or parts[0] != "RUN":
                said.append(line.rstrip())  # the server's own message (an import error, say)
                continue
            i = int(parts[1])
            done += 1
            yield i, parts[2], float(parts[3]), Path(runs[i]["log"]).read_text(errors="replace")
        proc.wait()
    if proc.returncode != 0 or done < len(runs):
        raise GpuprofError(f"the run server stopped early (exit {proc.returncode}) after {done} of {len(runs)} runs: "
                           + " | ".join(said[-3:]))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_file():
        print("usage: python -m gpuprof.fork_runs PLAN.json", file=sys.stderr)
        return 2
    return serve(json.loads(Path(args[0]).read_text()))


if __name__ == "__main__":
    sys.exit(main())
