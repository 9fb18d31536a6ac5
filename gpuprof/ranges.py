"""NVTX ranges that work everywhere: with the ``nvtx`` package, with only PyTorch, or with neither.

NVTX ranges name the phases of a program on the Nsight Systems timeline. The course's
examples annotate every phase, and must still run on a machine with no GPU and no
``nvtx`` package. The order of preference:

1. the ``nvtx`` package (colours, domains, categories, payloads; a cheap no-op when no
   profiler is attached, even without a GPU);
2. ``torch.cuda.nvtx`` (names only), which needs a CUDA build of PyTorch;
3. nothing: every call is a no-op, and :func:`nvtx_backend` says so.

The API mirrors the ``nvtx`` package's names (``annotate``, ``push_range``,
``pop_range``, ``mark``) so that a reader can later drop the shim and import
``nvtx`` directly. ``NVTX_DISABLE=1`` is honoured by the ``nvtx`` package itself.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, Callable, TypeVar

__all__ = ["annotate", "push_range", "pop_range", "mark", "nvtx_backend", "start_range", "end_range", "process_range"]

F = TypeVar("F", bound=Callable[..., Any])


def _load() -> tuple[str, Any]:
    try:
        return "nvtx", importlib.import_module("nvtx")
    except Exception:
        pass
    try:
        torch = importlib.import_module("torch")
        if torch.cuda.is_available():
            return "torch.cuda.nvtx", torch.cuda.nvtx
    except Exception:
        pass
    return "none", None


_KIND, _MOD = _load()


def nvtx_backend() -> str:
    """Which implementation is active: ``nvtx``, ``torch.cuda.nvtx`` or ``none``."""
    return _KIND


def push_range(message: str, color: str | None = None, domain: str | None = None) -> None:
    """Open a range on this thread; close it with :func:`pop_range` (same domain)."""
    if _KIND == "nvtx":
        _MOD.push_range(message=message, color=color, domain=domain)
    elif _KIND == "torch.cuda.nvtx":
        _MOD.range_push(message)


def pop_range(domain: str | None = None) -> None:
    """Close the innermost range opened by :func:`push_range` on this thread."""
    if _KIND == "nvtx":
        _MOD.pop_range(domain=domain)
    elif _KIND == "torch.cuda.nvtx":
        _MOD.range_pop()


def mark(message: str, color: str | None = None, domain: str | None = None) -> None:
    """An instantaneous event on the timeline (e.g. 'checkpoint saved')."""
    if _KIND == "nvtx":
        _MOD.mark(message=message, color=color, domain=domain)
    elif _KIND == "torch.cuda.nvtx":
        _MOD.mark(message)


def start_range(message: str, color: str | None = None, domain: str | None = None) -> Any:
    """Open a start/end range and return its handle for :func:`end_range`.

    Unlike a push/pop range, a start/end range belongs to no thread: it can end on
    another one, and profilers treat it as process-wide (``ncu --nvtx-include NAME``
    without the ``/`` of a push/pop range). Without the ``nvtx`` package, PyTorch's binding
    opens it (``torch.cuda.nvtx.range_start``, in the default domain: it takes no colour
    or domain).
    """
    if _KIND == "nvtx":
        return _MOD.start_range(message=message, color=color, domain=domain)
    if _KIND == "torch.cuda.nvtx":
        return _MOD.range_start(message)
    return None


def end_range(handle: Any) -> None:
    """Close a range opened by :func:`start_range`."""
    if handle is None:
        return
    if _KIND == "nvtx":
        _MOD.end_range(handle)
    elif _KIND == "torch.cuda.nvtx":
        _MOD.range_end(handle)


@contextlib.contextmanager
def process_range(message: str, color: str | None = None, domain: str | None = None):  # type: ignore[no-untyped-def]
    """``with process_range("timed"):`` a start/end range around a block (see :func:`start_range`)."""
    handle = start_range(message, color, domain)
    try:
        yield handle
    finally:
        end_range(handle)


class annotate(contextlib.ContextDecorator):  # noqa: N801 - mirrors nvtx.annotate
    """Context manager and decorator for a range: ``with annotate("step_3"):``.

    Used as a bare decorator without a message, the function's qualified name is used.
    """

    def __init__(self, message: str | None = None, color: str | None = None, domain: str | None = None) -> None:
        self.message = message
        self.color = color
        self.domain = domain

    def __call__(self, func: F) -> F:  # type: ignore[override]
        if self.message is None:
            self.message = func.__qualname__
        return super().__call__(func)  # type: ignore[return-value]

    def __enter__(self) -> "annotate":
        push_range(self.message or "range", self.color, self.domain)
        return self

    def __exit__(self, *exc: object) -> bool:
        pop_range(self.domain)
        return False
