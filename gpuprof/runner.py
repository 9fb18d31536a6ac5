"""Run a profiler over a script: argument lists only, atomic outputs, nothing overwritten silently.

A profiler run is a subprocess whose command is a list (never a shell string, so a
path with a space or a ``;`` cannot change what runs). It writes into a private
temporary folder beside the destination; only when it succeeds are its files moved
into place, so a crash, a timeout or a permission error never leaves a half-written
report where the last good one was. Existing captures are refused up front, before
minutes of profiling are spent, unless overwriting was asked for.

Use ``{output}`` in the profiler arguments where the tool expects its output path
prefix (``nsys profile -o {output}``, ``ncu -o {output}``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from .artifacts import REPO_ROOT, overwrite_allowed
from .errors import CaptureExists, GpuprofError
from .tools import COUNTER_PERMISSION_HINT, Tool

__all__ = ["Capture", "ProfilerFailed", "run_profiler", "python_target", "torchrun_target", "portable_command", "portable_text", "shell_line", "run_with_limit", "run_streaming", "child_env",
           "load_script", "TORCHRUN"]

OUTPUT = "{output}"


class ProfilerFailed(GpuprofError):
    """The profiler (or the program under it) exited with an error."""


@dataclass
class Capture:
    """What a profiler run produced."""

    command: list[str]
    files: list[Path]
    seconds: float
    log: Path
    returncode: int = 0
    extra: dict[str, str] = field(default_factory=dict)

    def file(self, suffix: str) -> Path:
        """The produced file ending in ``suffix`` (e.g. ``.nsys-rep``)."""
        for f in self.files:
            if f.name.endswith(suffix):
                return f
        raise GpuprofError(f"The profiler produced no {suffix} file (it wrote: {', '.join(f.name for f in self.files) or 'nothing'}).",
                           f"See its log in {self.log}.")


def python_target(script: str | Path, *args: str) -> list[str]:
    """The argument list that runs ``script`` with this interpreter (not whatever 'python' is on PATH)."""
    return [sys.executable, str(script), *map(str, args)]


TORCHRUN = ["-m", "torch.distributed.run"]


def torchrun_target(script: str | Path, *args: str, nproc: int = 2) -> list[str]:
    """The argument list that starts ``script`` as ``nproc`` processes on this machine with torchrun.

    ``--standalone`` makes torchrun pick a free port for the processes to meet on, so two
    runs back to back (or a reader's other job) do not collide on a fixed one.
    """
    return [sys.executable, *TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", str(script), *map(str, args)]


def child_env(cmd: Sequence[str], env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process: this one's, updated by ``env``.

    A torchrun launch (directly or under nsys) gets ``OMP_NUM_THREADS=1`` unless it is set:
    the value torchrun itself gives its workers when it is unset, so nothing changes but the
    five-line banner torchrun prints to say so, which otherwise heads every transcript.
    """
    out = {**os.environ, **(env or {})}
    if TORCHRUN[1] in [str(c) for c in cmd]:
        out.setdefault("OMP_NUM_THREADS", "1")
    return out


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc), children first found breadth-first."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def run_with_limit(cmd: Sequence[str], timeout_s: float, env: dict[str, str] | None = None) -> tuple[int | None, str, float]:
    """Run ``cmd`` with its output in a file; past ``timeout_s`` kill it *and every process below it*.

    Returns (exit status, or None when it was killed; its output; seconds). Launchers such
    as torchrun start their workers in sessions of their own, so killing the launcher's
    process group leaves hung workers holding the output pipe; a reader of that pipe would
    wait for ever. Hence a file, and a kill that walks the process tree.
    """
    import signal

    t0 = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                env=child_env(cmd, env))
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            tree = [proc.pid, *_descendants(proc.pid)]
            for pid in tree:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            proc.wait()
            # A killed process holding a GPU exits only once the driver has torn its context
            # down; wait for that, so that the next measurement does not share the GPU with it.
            deadline = time.perf_counter() + 60
            while time.perf_counter() < deadline and any(_alive(pid) for pid in tree[1:]):
                time.sleep(0.2)
            code = None
        out.seek(0)
        return code, out.read(), time.perf_counter() - t0


def run_streaming(cmd: Sequence[str], timeout_s: float, *, name: str, echo: bool = True,
                  env: dict[str, str] | None = None, shown: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """Run ``cmd``, showing its output as it comes (long runs should not look hung); returns (exit status, lines).

    ``name`` is what a time-out message calls the program; ``env`` is added to this process's
    environment for it (NCCL's variables, say). ``shown`` maps text to what the echo shows in
    its place (a temporary file's path by the name it is filed under: a transcript should not
    print a path that exists only while the run lasts); the lines returned are unchanged.
    """
    lines: list[str] = []
    with subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=child_env(cmd, env)) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            if echo:  # shown as a reader may see it: no scratch folders ("results written to /tmp/tmpab12/x.json")
                text = portable_text(line.rstrip())
                for old, new in (shown or {}).items():
                    text = text.replace(old, new)
                print("  " + text, flush=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise GpuprofError(f"{name} did not finish within {timeout_s:.0f} s.") from None
    return code, lines


def load_script(script: str | Path):  # type: ignore[no-untyped-def]
    """A course script imported as a module (its ``main`` is not run), so that a chapter can show
    or test its functions: the code printed is the code that ran, not a copy of it."""
    import importlib.util

    path = Path(script)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: a dataclass in a module with postponed annotations looks its
    # module up in sys.modules while the class is being made.
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def portable_command(cmd: Sequence[str]) -> list[str]:
    """A recorded command a reader can retype: tools by name, this Python as ``python``,
    paths inside the repository made relative."""
    out: list[str] = []
    cmd = list(cmd)
    for i, part in enumerate(cmd):
        if part == "-m" and cmd[i + 1:i + 2] == TORCHRUN[1:] and out and out[-1] == "python":
            out[-1] = "torchrun"  # python -m torch.distributed.run is the torchrun command
            continue
        if part == TORCHRUN[1] and out and out[-1] == "torchrun":
            continue
        if (i == 0 or os.path.isabs(part)) and Path(part).name in ("nsys", "ncu"):
            out.append(Path(part).name)
        elif part == sys.executable:
            out.append("python")
        elif part.startswith(str(REPO_ROOT) + os.sep):
            out.append(os.path.relpath(part, REPO_ROOT))
        else:
            out.append(part)
    return out


def portable_text(text: str, *, every_path: bool = False) -> str:
    """A tool's printed output as a reader may see it: paths inside the repository made relative, and
    paths in the temporary folder (``/tmp/nsys-report-1a2b.qdstrm``) cut to their file names, so that
    no output shows the machine's folders. ``every_path`` cuts every other absolute path to its file
    name too (a tool's install folder, the interpreter's packages: ``.../site-packages/nvidia/cudnn/lib/
    libcudnn_graph.so.9`` becomes ``libcudnn_graph.so.9``), for messages read for what they say."""
    import re
    import tempfile

    text = text.replace(str(REPO_ROOT) + os.sep, "")
    for tmp in {tempfile.gettempdir(), "/tmp"}:
        text = re.sub(re.escape(tmp.rstrip(os.sep) + os.sep) + r"(?:[^\s'\"]*/)?", "", text)
    if every_path:
        text = re.sub(r"(?<![\w.~-])/(?:[^\s'\"\[\]()/]+/)+(?=[^\s'\"\[\]()/])", "", text)
    return text


def shell_line(cmd: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """:func:`portable_command` as one line a reader can paste into a POSIX shell, ``env``'s variables first.

    The runner passes argument lists, never a shell string, so a word such as ``regex:saxpy|elementwise``
    reaches the tool intact however it is written. A transcript's ``$`` line is different: a reader
    pastes it, and unquoted, the shell reads that ``|`` as a pipe. ``shlex.join`` quotes every word the
    shell would otherwise change and leaves the rest as they are; a variable's value is quoted on its
    own, so ``K=v`` stays an assignment.
    """
    words = [f"{k}={shlex.quote(str(v))}" for k, v in (env or {}).items()]
    return " ".join(words + [shlex.quote(w) for w in portable_command(cmd)])


def _append(log: Path, text: str) -> None:
    """Logs accumulate every step of a capture (profile, export, stats) for later reading."""
    with log.open("a") as fh:
        fh.write(text)


def _explain_failure(text: str) -> str:
    if "ERR_NVGPUCTRPERM" in text:
        return "The GPU's performance counters are restricted to administrators (ERR_NVGPUCTRPERM). " + COUNTER_PERMISSION_HINT
    if "No kernels were profiled" in text:
        return "No kernel matched the filter, or the program launched none (check --kernel-name and that it ran on the GPU)."
    if "Permission denied" in text and "/tmp" in text:
        return "The profiler could not write to /tmp; set TMPDIR to a writable folder."
    return "See the log for the profiler's own message."


def run_profiler(
    tool: Tool,
    args: Sequence[str],
    target: Sequence[str] = (),
    *,
    out_dir: Path,
    name: str,
    stdout_file: str | None = None,
    overwrite: bool = False,
    timeout: float = 540,
    env: dict[str, str] | None = None,
) -> Capture:
    """Run ``tool args target`` and move what it wrote into ``out_dir``.

    ``target`` is the program to profile as an argument list (see :func:`python_target`);
    it is empty for subcommands that read a report (``nsys export``, ``ncu --import``).

    ``args`` may contain ``{output}``, replaced by a path prefix inside the temporary
    folder (the tool adds its own suffix). ``stdout_file`` saves the tool's standard
    output under that name (for ``--csv`` reports). The combined log is kept as
    ``<name>.log`` whatever happens.
    """
    if not name or "/" in name or name.startswith("."):
        raise GpuprofError(f"Invalid capture name {name!r}.", "Use a plain file name such as 'smoke'.")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    clobber = overwrite_allowed(overwrite)
    existing = sorted(p.name for p in out_dir.glob(f"{name}.*") if not p.name.endswith(".log"))
    if existing and not clobber:
        raise CaptureExists(f"{out_dir} already holds a capture named {name!r} ({', '.join(existing)}).",
                            "Choose another name, pass overwrite=True (GPUPROF_OVERWRITE=1), or move it away.")
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=out_dir))
    command = [str(tool.path)] + [a.replace(OUTPUT, str(tmp / name)) for a in args] + [str(t) for t in target]
    shown = [str(tool.path)] + [a.replace(OUTPUT, str(out_dir / name)) for a in args] + [str(t) for t in target]
    log_path = out_dir / f"{name}.log"
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False,
                              env=child_env(command, env))
    except subprocess.TimeoutExpired as exc:
        _append(log_path, f"$ {shlex.join(shown)}\n{exc.stdout or ''}{exc.stderr or ''}\n(timed out after {timeout:.0f} s)\n")
        shutil.rmtree(tmp, ignore_errors=True)
        raise ProfilerFailed(f"{tool.name} did not finish within {timeout:.0f} s; nothing was kept.",
                             f"See {log_path}; profile a shorter run (--duration, a capture range) or raise the timeout.") from None
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ProfilerFailed(f"Could not start {tool.path}: {exc}.", "Check the tool's installation.") from None
    seconds = time.perf_counter() - t0
    text = proc.stdout + proc.stderr
    _append(log_path, f"$ {shlex.join(shown)}\n# exit status {proc.returncode}, {seconds:.1f} s\n{text}\n")
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ProfilerFailed(f"{tool.name} exited with status {proc.returncode}; earlier captures are untouched. "
                             + _explain_failure(text), f"Full output: {log_path}.")
    if stdout_file:
        (tmp / stdout_file).write_text(proc.stdout)
    produced = sorted(p for p in tmp.iterdir() if p.is_file())
    moved: list[Path] = []
    for p in produced:
        dest = out_dir / p.name
        if dest.exists() and not clobber:  # appeared while we ran
            shutil.rmtree(tmp, ignore_errors=True)
            raise CaptureExists(f"{dest} appeared while the profiler ran; it was kept, the new capture was not.")
        os.replace(p, dest)
        moved.append(dest)
    shutil.rmtree(tmp, ignore_errors=True)
    return Capture(command=shown, files=moved, seconds=seconds, log=log_path, returncode=proc.returncode)
