"""Errors that a reader can act on, and a wrapper that turns them into one sentence.

A course script that dies with a 40-line traceback because ``nsys`` is not installed
teaches nothing. Every expected failure (no GPU, no profiler, no counter permission,
a missing reference capture, a bad argument) is raised as :class:`GpuprofError`,
whose text says what is wrong and what to do. Scripts wrap ``main`` in
:func:`exit_on_error`, which prints that text and exits with status 2. Running out of
memory, on the host or on the GPU, is expected too (a reader asks for a size to see
what happens): whichever library ran out (NumPy, PyTorch's CPU or CUDA allocator,
CuPy), :func:`exit_on_error` turns it into one sentence with the size asked for and
the memory there is, here and only here, so that no script needs its own handler.
Anything else is a real bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import re
import sys
from typing import Callable, TypeVar

from .memory_probe import available_memory, total_memory

__all__ = ["GpuprofError", "ToolNotFound", "CaptureExists", "ReferenceMissing", "exit_on_error",
           "is_out_of_memory", "out_of_memory_sentence"]

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


# What each library says when an allocation fails (the exception types differ: NumPy raises
# MemoryError, PyTorch's CPU allocator a plain RuntimeError, its CUDA allocator
# torch.OutOfMemoryError, CuPy cupy.cuda.memory.OutOfMemoryError, a kernel launch
# "CUDA error: out of memory").
_OOM_TEXT = re.compile(r"can't allocate memory|out of memory|Unable to allocate", re.IGNORECASE)
_ASKED = (
    (re.compile(r"Unable to allocate ([\d.]+) (\w?i?B)"), None),        # NumPy: "Unable to allocate 97.7 GiB ..."
    (re.compile(r"Tried to allocate ([\d.]+) (\w?i?B)"), None),         # PyTorch CUDA: "Tried to allocate 20.00 GiB."
    (re.compile(r"tried to allocate (\d+) bytes"), "B"),                 # PyTorch CPU: "you tried to allocate 26214400000 bytes"
    (re.compile(r"Out of memory allocating ([\d,]+) bytes"), "B"),       # CuPy
)
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def is_out_of_memory(exc: BaseException) -> bool:
    """True for an allocation that failed for want of memory, host or GPU, from any library the course uses."""
    if isinstance(exc, MemoryError):
        return True
    if type(exc).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError, cupy.cuda.memory.OutOfMemoryError
        return True
    return isinstance(exc, RuntimeError) and bool(_OOM_TEXT.search(str(exc)))


def _asked_bytes(text: str) -> float | None:
    for pattern, unit in _ASKED:
        m = pattern.search(text)
        if m:
            return float(m.group(1).replace(",", "")) * _UNITS.get(unit or m.group(2), 1)
    return None


def _on_gpu(exc: BaseException) -> bool:
    text = str(exc)
    return "CUDA" in text or "GPU" in text or type(exc).__module__.startswith("cupy")


def _address_space_limit() -> int | None:
    """The process's address-space limit (``ulimit -v``) in bytes, or None when there is none."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


def out_of_memory_sentence(exc: BaseException) -> str:
    """One sentence for a failed allocation: where, how much was asked for, how much there is, and what to do."""
    gpu = _on_gpu(exc)
    where = "GPU" if gpu else "host"
    device = "cuda" if gpu else "cpu"
    asked = _asked_bytes(str(exc))
    free, total = available_memory(device), total_memory(device)
    parts = [f"out of {where} memory"]
    if asked is not None:
        parts.append(f"one allocation asked for {asked / 2**30:,.2f} GiB")
    if free is not None:
        parts.append(f"{free / 2**30:,.1f} GiB is available" + (f" of {total / 2**30:,.1f} GiB" if total else ""))
    limit = None if gpu else _address_space_limit()
    if limit is not None:
        parts.append(f"and this process may use only {limit / 2**30:,.1f} GiB of address space (ulimit -v)")
    return "; ".join(parts) + ". Choose smaller sizes (--help lists the options that set them)."


def exit_on_error(main: F) -> F:
    """Run ``main``; on :class:`GpuprofError` or an out-of-memory error print one sentence to stderr and exit 2."""

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
        except (MemoryError, RuntimeError) as exc:
            if not is_out_of_memory(exc):
                raise
            print(f"error: {out_of_memory_sentence(exc)}", file=sys.stderr)
            raise SystemExit(2) from None

    return wrapper  # type: ignore[return-value]
