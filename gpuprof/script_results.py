"""Run a course script that writes its results as JSON, and keep them with provenance.

Some measurements are best taken without a profiler (a profiler changes timings), by
a script in its own process (so that its GPU memory and pinned buffers go when it
ends). ``run_for_json`` runs such a script with ``--json FILE``, shows its progress
as it goes, and files the JSON in the chapter's folder with the command and machine
that produced it. Without a GPU it says so and returns the course's reference
results instead, like every capture in the course.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

from .artifacts import FoundCapture, atomic_write_bytes, chapter_output, find_capture, record_file
from .backend import describe_machine
from .errors import GpuprofError
from .runner import python_target, run_streaming, shell_line, torchrun_target

__all__ = ["run_for_json"]


def run_for_json(chapter: str, filename: str, script: str | Path, args: Sequence[str] = (), *,
                 files: dict[str, str] | None = None, timeout_s: int = 600, echo: bool = True,
                 nproc: int = 1, env: dict[str, str] | None = None) -> FoundCapture:
    """Run ``script args --json <chapter>/<filename>`` on this machine's GPU, or fall back to the reference.

    ``files`` maps an option of the script to a file name (``{"--trace": "steps.json.gz"}``):
    the script is given ``--trace <chapter folder>/steps.json.gz``, and each such file is
    recorded in the chapter's provenance with the command, like the JSON. Files the
    script writes beside them (a trace's ``.key_averages.json``) are recorded too when
    their names start with the file's stem.

    ``nproc`` > 1 starts the script with torchrun as that many processes, one per GPU; a
    machine with fewer GPUs gets the reference results, with the reason. ``env``: variables
    added to the script's environment (``NCCL_MAX_NCHANNELS``, say), shown before the command
    and recorded with it, since they change what was measured.
    """
    machine = describe_machine()
    if machine.device != "cuda":
        print(f"No GPU on this machine ({machine.summary()}): showing the course's reference results instead.")
        return find_capture(chapter, filename, prefer="reference")
    if nproc > 1 and machine.gpus < nproc:
        print(f"This machine has {machine.gpus} GPU(s) and the run needs {nproc}: "
              "showing the course's reference results instead.")
        return find_capture(chapter, filename, prefer="reference")
    start = (lambda *a: torchrun_target(script, *a, nproc=nproc)) if nproc > 1 else (lambda *a: python_target(script, *a))
    folder = chapter_output(chapter)
    folder.mkdir(parents=True, exist_ok=True)
    extra: list[str] = []
    extra_shown: list[str] = []
    for flag, name in (files or {}).items():
        extra += [flag, str(folder / name)]
        extra_shown += [flag, name]
    before = {p: p.stat().st_mtime_ns for p in folder.iterdir()}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / filename
        cmd = start(*args, *extra, "--json", str(out))
        shown = shell_line([*start(*args), *extra_shown, "--json", filename], env)
        if echo:
            print("$ " + shown, flush=True)
        code, lines = run_streaming(cmd, timeout_s, name=Path(script).name, echo=echo, env=env,
                                    shown={str(out): filename})
        if code != 0 or not out.exists():
            tail = " | ".join(lines[-3:]) or "no output"
            raise GpuprofError(f"{Path(script).name} failed (exit {code}): {tail}")
        atomic_write_bytes(chapter_output(chapter) / filename, out.read_bytes(), overwrite=True)
    record_file(chapter, filename, shown)
    stems = tuple(name.split(".")[0] for name in (files or {}).values())
    for p in sorted(folder.iterdir()):
        changed = p not in before or before[p] != p.stat().st_mtime_ns
        if changed and p.name.startswith(stems) and p.name != filename and stems:
            record_file(chapter, p.name, shown)
    return find_capture(chapter, filename)
