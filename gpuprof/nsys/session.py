"""Nsight Systems' interactive mode, driven for real: launch now, capture later, from outside.

``nsys profile`` decides what to record before the program starts. The interactive
commands let you start a program under nsys *without* recording, look at it, and
record a window of your choosing, as you would with a long training job:

    nsys launch --session-new=NAME --trace=cuda,nvtx python train.py   # runs, records nothing
    nsys sessions list                                                 # what is running under nsys
    nsys start --session=NAME -o window                                # begin recording
    nsys status --session=NAME
    nsys stop --session=NAME                                           # write window.nsys-rep

:func:`interactive_capture` performs exactly that sequence on a course script running
in the background and returns a transcript of every command with its output.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..artifacts import FoundCapture, chapter_output, find_capture, record_file
from .capture import QUIET
from .export_edit import scrub_environment
from ..runner import python_target, run_profiler, shell_line
from ..tools import live_tool

__all__ = ["SessionTranscript", "interactive_capture"]


@dataclass
class SessionTranscript:
    steps: list[tuple[str, str]] = field(default_factory=list)  # (command, its output)
    capture: FoundCapture | None = None

    def show(self) -> str:
        return "\n".join(f"$ {cmd}\n{out.rstrip()}" if out.strip() else f"$ {cmd}" for cmd, out in self.steps)


def _run(cmd: list[str], transcript: SessionTranscript, shown: list[str] | None = None, timeout: float = 120) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    out = (proc.stdout + proc.stderr).strip()
    # nsys draws progress bars ("[1/1] [===  45%  ] x.nsys-rep") line by line: keep the words, not the bars
    kept = "\n".join(line for line in out.splitlines() if not line.lstrip().startswith("[1/1]"))
    transcript.steps.append((shell_line(shown or cmd), kept))
    return out


def _wait_for_line(app: subprocess.Popen, pattern: str, timeout: float) -> tuple[list[str], threading.Thread, bool]:
    """Collect ``app``'s output lines on a thread; wait until one contains ``pattern`` (or ``timeout``).

    Returns the list the thread keeps filling, the thread, and whether the pattern was seen.
    Waiting for the program to say it is running, rather than for a fixed time, is what makes
    the recorded window hold work on a machine that starts the program slowly.
    """
    lines: list[str] = []
    seen = threading.Event()
    if not pattern:
        seen.set()

    def pump() -> None:
        assert app.stdout is not None
        for line in app.stdout:
            lines.append(line)
            if pattern in line:
                seen.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    seen.wait(timeout)
    return lines, reader, seen.is_set()


def interactive_capture(chapter: str, name: str, script: str | Path, script_args: Sequence[str], *,
                        ready: str = "", wait_s: float = 1.0, record_s: float = 1.0, ready_timeout_s: float = 120,
                        trace: str = "cuda,nvtx") -> SessionTranscript:
    """Launch ``script`` under nsys without recording, record ``record_s`` seconds, export.

    Recording starts ``wait_s`` seconds after the program printed a line containing ``ready``
    (at once if ``ready`` is empty): a fixed wait alone is a race with the program's start-up
    (importing PyTorch took over four seconds on one course machine, and a one-second window
    then held no kernel).
    """
    transcript = SessionTranscript()
    live = live_tool("nsys")
    if not live:
        print(f"No live interactive session: {live.reason}.")
        transcript.capture = find_capture(chapter, f"{name}.sqlite", prefer="reference")
        return transcript
    nsys, version = live
    out = chapter_output(chapter)
    session = f"course-{name}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=out))
    launch = [str(nsys.path), "launch", f"--session-new={session}", f"--trace={trace}",
              *python_target(script, *script_args)]
    transcript.steps.append((shell_line(launch) + "   # in the background", ""))
    app = subprocess.Popen(launch, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        lines, reader, seen = _wait_for_line(app, ready, ready_timeout_s)
        if ready and not seen:
            print(f"The program printed no line with {ready!r} within {ready_timeout_s:.0f} s; recording anyway.")
        time.sleep(wait_s)
        _run([str(nsys.path), "sessions", "list"], transcript)
        start = [str(nsys.path), "start", f"--session={session}", *QUIET, "-o"]
        _run(start + [str(tmp / name)], transcript, shown=start + [str(out / name)])
        time.sleep(record_s / 2)
        _run([str(nsys.path), "status", f"--session={session}"], transcript)
        time.sleep(record_s / 2)
        stop = [str(nsys.path), "stop", f"--session={session}"]
        _run(stop, transcript)
        transcript.steps[-1] = (transcript.steps[-1][0], transcript.steps[-1][1].replace(str(tmp), str(out)))
        app.wait(timeout=300)
        reader.join(timeout=10)
        app_out = "".join(lines)
    finally:
        if app.poll() is None:
            app.kill()
    last_lines = "\n".join(app_out.strip().splitlines()[-3:])
    transcript.steps.append(("# the program's own output ends with:", last_lines))
    rep = tmp / f"{name}.nsys-rep"
    if not rep.exists():
        shutil.rmtree(tmp, ignore_errors=True)
        print("The interactive session wrote no report; showing the course's reference capture.")
        transcript.capture = find_capture(chapter, f"{name}.sqlite", prefer="reference")
        return transcript
    final = out / rep.name
    rep.replace(final)
    shutil.rmtree(tmp, ignore_errors=True)
    export = run_profiler(nsys, ["export", "--type", "sqlite", "-o", "{output}.sqlite", str(final)],
                          out_dir=out, name=name, overwrite=True)
    scrub_environment(export.file(".sqlite"))
    commands = [c for c, _ in transcript.steps if c.startswith("nsys")]
    commands.append(shell_line(export.command))
    record_file(chapter, f"{name}.sqlite", " && ".join(commands), {"nsys": version})
    transcript.capture = find_capture(chapter, f"{name}.sqlite")
    return transcript
