"""Keep Kineto's progress lines out of a notebook, and nothing else.

Some PyTorch builds (2.13's CPU wheels among them) print lines such as
``USDT:2026-... SyncActivityProfilerHandler.cpp:52] profiler_start`` to the process's
standard error, from C++, every time a profile starts and stops; ``KINETO_LOG_LEVEL``
does not silence them. In a notebook they become stderr output that changes with every
run. :func:`kineto_lines_filtered` catches what C++ writes to file descriptor 2 while
the block runs and writes back every line that is not such a progress line, so a real
error still shows.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from typing import Iterator

__all__ = ["kineto_lines_filtered", "KINETO_PROGRESS"]

KINETO_PROGRESS = re.compile(r"^(USDT|STAGE):\S+ \S+ \d+:\d+ \w+\.cpp:\d+\] ")


@contextlib.contextmanager
def kineto_lines_filtered() -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [line for line in tmp.read().decode(errors="replace").splitlines() if not KINETO_PROGRESS.match(line)]
            if kept:
                print("\n".join(kept), file=sys.stderr)
