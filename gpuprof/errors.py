"""Errors that a reader can act on, and a wrapper that turns them into one sentence.

A course script that dies with a 40-line traceback because ``nsys`` is not installed
teaches nothing. Every expected failure (no GPU, no profiler, no counter permission,
a missing reference capture, a bad argument) is raised as :class:`GpuprofError`,
whose text says what is wrong and what to do. Scripts wrap ``main`` in
:func:`exit_on_error`, which prints that text and exits with status 2; anything
else is a real bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable, TypeVar

__all__ = ["GpuprofError", "ToolNotFound", "CaptureExists", "ReferenceMissing", "exit_on_error"]

F = TypeVar("F", bound=Callable[..., object])


class GpuprofError(Exception):
    """An expected failure with a message written for the reader, not for a debugger."""

    def __init__(self, message: str, hint: str = "") -> None:
        self.message = message
        self.hint = hint
        super().__init__(f"{message} {hint}".strip())


class ToolNotFound(GpuprofError):
    """A profiler (nsys, ncu) could not be found on this machine."""


class CaptureExists(GpuprofError):
    """A capture would overwrite an earlier one; we never do that silently."""


class ReferenceMissing(GpuprofError):
    """A reference capture that a chapter falls back to is not in ``artifacts/``."""


def exit_on_error(main: F) -> F:
    """Run ``main``; on :class:`GpuprofError` print its sentence to stderr and exit 2."""

    @functools.wraps(main)
    def wrapper(*args: object, **kwargs: object) -> object:
        try:
            return main(*args, **kwargs)
        except GpuprofError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise SystemExit(130) from None

    return wrapper  # type: ignore[return-value]
