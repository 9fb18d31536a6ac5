"""Small pieces every example script's command line shares: argparse types that answer a bad
value in one sentence, ``--sections``, a size check that refuses what will not fit, and how a
script prints a path it wrote."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Callable

from .errors import GpuprofError
from .memory_probe import available_memory, total_memory

__all__ = ["positive_int", "nonnegative_int", "positive_float", "add_sections_argument", "resolve_sections",
           "output_file", "require_memory", "bounded_int", "distinct_ints", "shown_path"]


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


def bounded_int(limit: int, why: str, low: int = 1) -> Callable[[str], int]:
    """argparse type: a whole number from ``low`` to ``limit``; above it, one sentence saying ``why``.

    A count a reader mistypes by a few zeros (``--kernels 100000000000``) would otherwise
    start a run that never ends; the limit is stated in the message (and should be in the
    option's help), so that a reader who really wants more knows what to change.
    """

    def parse(text: str) -> int:
        value = positive_int(text) if low >= 1 else nonnegative_int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be at least {low}")
        if value > limit:
            raise argparse.ArgumentTypeError(f"{value:,} is above this script's limit of {limit:,} ({why})")
        return value

    parse.__name__ = "count"  # what argparse calls the type in its messages
    return parse


def distinct_ints(one: Callable[[str], int], item: str, example: str) -> Callable[[str], list[int]]:
    """argparse type: whole numbers separated by commas, each parsed by ``one`` (e.g. :func:`bounded_int`), none
    twice; ``item`` names one in the messages ("batch size"), ``example`` shows a good value ("1,8,64")."""

    def parse(text: str) -> list[int]:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise argparse.ArgumentTypeError(f"{text!r}: give {item}s separated by commas, e.g. {example}")
        values = [one(p) for p in parts]
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"{text!r} names a {item} twice")
        return values

    parse.__name__ = "list"
    return parse


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


def output_file(text: str) -> Path:
    """argparse type: a file to write results to, checked before any work is done.

    Its folder must exist and be writable now: finding out after a ten-minute run that
    ``--json /no/such/dir/x.json`` cannot be written loses the run.
    """
    path = Path(text).expanduser()
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file name")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: the folder {folder} is not writable")
    return path


def require_memory(nbytes: int, device: str, what: str, option: str, *, lower_bound: bool = False) -> None:
    """Refuse up front, in one sentence, a size this machine cannot hold (rather than a
    traceback from the allocator half-way through a run). ``lower_bound``: ``nbytes`` is
    the least the run needs, and the sentence says so."""
    free = available_memory(device)
    if free is not None and nbytes > free:
        where = "host memory" if device == "cpu" else "GPU memory"
        total = total_memory(device)
        has = f"{free / 2**30:,.1f} GiB is available" + (f" (of {total / 2**30:,.1f} GiB)" if total else "")
        raise GpuprofError(f"{what} would take {'at least ' if lower_bound else ''}{nbytes / 2**30:,.1f} GiB of {where}, "
                           f"but only {has}.", f"Choose a smaller {option}.")


def shown_path(path: str | Path) -> str:
    """A path as a script prints it: relative to the repository, a temporary file by its name, else as given.

    A notebook runs the scripts with absolute paths into ``artifacts/`` and with results files
    in temporary folders; printed as they are, the transcripts would show where the capture
    machine keeps its checkout and a ``/tmp/tmpab12cd`` folder, which say nothing to a reader
    and differ on every machine and every run.
    """
    import tempfile

    from .artifacts import REPO_ROOT  # here, not at the top: a script's start-up should not pay for it

    p = Path(path)
    resolved = p.resolve()
    try:
        return str(resolved.relative_to(REPO_ROOT))
    except ValueError:
        pass
    try:
        resolved.relative_to(Path(tempfile.gettempdir()).resolve())
        return f"{p.name} (in a temporary folder)"
    except ValueError:
        return str(path)
