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
from ..runner import portable_text, python_target, run_profiler, shell_line
from ..tools import live_tool

__all__ = ["SessionTranscript", "interactive_capture"]


@dataclass
class SessionTranscript:
    steps: list[tuple[str, str]] = field(default_factory=list)  # (command, its output)
    capture: FoundCapture | None = None
    ready_line: str | None = None  # the program's line that let recording start (None: not waited for, or not seen)
    ready_after_s: float | None = None  # seconds from the launch to that line

    def show(self) -> str:
        return "\n".join(f"$ {cmd}\n{out.rstrip()}" if out.strip() else f"$ {cmd}" for cmd, out in self.steps)


def _run(cmd: list[str], transcript: SessionTranscript, shown: list[str] | None = None, timeout: float = 120,
         moved: tuple[Path, Path] | None = None) -> str:
    """Run one nsys command and add it to the transcript as a reader would see it: ``shown`` instead of
    ``cmd``, paths in ``moved[0]`` (a scratch folder) as if in ``moved[1]``, no machine paths, no progress bars."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    out = (proc.stdout + proc.stderr).strip()
    # nsys draws progress bars ("[1/1] [===  45%  ] x.nsys-rep") line by line: keep the words, not the bars
    kept = "\n".join(line for line in out.splitlines() if not line.lstrip().startswith("[1/1]"))
    if moved:
        kept = kept.replace(str(moved[0]), str(moved[1]))
    transcript.steps.append((shell_line(shown or cmd), portable_text(kept)))
    return out


def _wait_for_line(app: subprocess.Popen, prefix: str, timeout: float) -> tuple[list[str], threading.Thread, str | None]:
    """Collect ``app``'s output lines on a thread; wait until one *starts with* ``prefix`` (or ``timeout``).

    Returns the list the thread keeps filling, the thread, and the line that matched (None if
    none did within ``timeout``; ``""`` for an empty ``prefix``, which waits for nothing).
    Waiting for the program to say it is running, rather than for a fixed time, is what makes
    the recorded window hold work on a machine that starts the program slowly. The line must
    start with ``prefix``, not merely contain it: a program's start-up text (its arguments, a
    warning quoting them) can contain the same words before the work has begun.
    """
    lines: list[str] = []
    seen = threading.Event()
    matched: list[str] = []
    if not prefix:
        seen.set()

    def pump() -> None:
        assert app.stdout is not None
        for line in app.stdout:
            lines.append(line)
            if prefix and not seen.is_set() and line.lstrip().startswith(prefix):
                matched.append(line.strip())
                seen.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    seen.wait(timeout)
    return lines, reader, (matched[0] if matched else "" if not prefix else None)


def interactive_capture(chapter: str, name: str, script: str | Path, script_args: Sequence[str], *,
                        ready: str = "", wait_s: float = 1.0, record_s: float = 1.0, ready_timeout_s: float = 120,
                        trace: str = "cuda,nvtx") -> SessionTranscript:
    """Launch ``script`` under nsys without recording, record ``record_s`` seconds, export.

    Recording starts ``wait_s`` seconds after the program printed a line that starts with
    ``ready`` (at once if ``ready`` is empty): a fixed wait alone is a race with the program's
    start-up (importing PyTorch took over four seconds on one course machine, and a one-second
    window then held no kernel). The transcript shows the line that let recording start and
    when it came (``ready_line``, ``ready_after_s``), so a reader can check the window.
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
    launched = time.monotonic()
    app = subprocess.Popen(launch, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        lines, reader, line = _wait_for_line(app, ready, ready_timeout_s)
        if ready and line is None:
            print(f"The program printed no line starting with {ready!r} within {ready_timeout_s:.0f} s; recording anyway.")
        elif ready:
            transcript.ready_line, transcript.ready_after_s = line, time.monotonic() - launched
            transcript.steps.append((f"# the program printed {line!r} {transcript.ready_after_s:.1f} s after the launch; "
                                     f"recording starts {wait_s:g} s later", ""))
        time.sleep(wait_s)
        _run([str(nsys.path), "sessions", "list"], transcript)
        start = [str(nsys.path), "start", f"--session={session}", *QUIET, "-o"]
        _run(start + [str(tmp / name)], transcript, shown=start + [str(out / name)], moved=(tmp, out))
        time.sleep(record_s / 2)
        _run([str(nsys.path), "status", f"--session={session}"], transcript)
        time.sleep(record_s / 2)
        stop = [str(nsys.path), "stop", f"--session={session}"]
        _run(stop, transcript, moved=(tmp, out))
        app.wait(timeout=300)
        reader.join(timeout=10)
        app_out = "".join(lines)
    finally:
        if app.poll() is None:
            app.kill()
    last_lines = portable_text("\n".join(app_out.strip().splitlines()[-3:]))
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
