"""Small pieces every example script's command line shares."""

from __future__ import annotations

import argparse

__all__ = ["positive_int", "nonnegative_int", "positive_float", "add_sections_argument", "resolve_sections",
           "torch_backend_or_cpu"]


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1, with a one-line message otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def nonnegative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must not be negative")
    return value


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} must be greater than 0")
    return value


def add_sections_argument(parser: argparse.ArgumentParser, sections: tuple[str, ...]) -> None:
    """``--sections a,b`` choosing among a script's named sections (default: all of them)."""
    parser.add_argument("--sections", default="all", help=f"comma-separated subset of {', '.join(sections)} (default: all)")


def resolve_sections(parser: argparse.ArgumentParser, value: str, sections: tuple[str, ...]) -> tuple[str, ...]:
    """The sections ``--sections`` named, in the order given; a parser error for unknown names."""
    chosen = sections if value == "all" else tuple(s.strip() for s in value.split(",") if s.strip())
    unknown = [s for s in chosen if s not in sections]
    if unknown or not chosen:
        parser.error(f"unknown section(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(sections)}")
    return chosen


def torch_backend_or_cpu(choice: str | None, why: str):  # type: ignore[no-untyped-def]
    """The backend for a script that needs PyTorch on a GPU (streams, pinned tensors, its allocator).

    Falls back to the CPU as usual; a GPU reachable only through CuPy is an error that
    says ``why`` PyTorch is needed, rather than a silent CPU run on a GPU machine.
    """
    from .backend import choose_backend
    from .errors import GpuprofError

    backend = choose_backend(choice)
    if backend.is_gpu and backend.name != "torch":
        raise GpuprofError(f"{why}; CuPy alone is not enough.", "Install a CUDA build of PyTorch, or pass --backend cpu.")
    return backend
