"""The command line: ``python -m gpuprof report CAPTURE ...`` and ``python -m gpuprof diff BEFORE AFTER``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

from ..errors import GpuprofError, exit_on_error

__all__ = ["main"]

_KINDS_HELP = ("an Nsight Systems report (.nsys-rep; exported with nsys when it is installed) or its sqlite export, "
               "an Nsight Compute report (.ncu-rep) or its --csv output (details or raw page), a PyTorch profiler "
               "trace (.json or .json.gz), or a folder of these (one per rank); recognised by content, not by name")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpuprof",
                                description="Read profiler captures of any program: one page per capture, numbers "
                                            "equal to the tools' own reports (nsys stats, ncu --csv, key_averages).")
    sub = p.add_subparsers(dest="command", required=True, metavar="{report,diff}")
    r = sub.add_parser("report", help="summarise captures in the terminal and in one HTML page",
                       description="Summarise captures: the terminal gets the tables' first rows, the HTML page "
                                   "(-o) all of them with figures, self-contained.")
    r.add_argument("captures", nargs="+", metavar="CAPTURE", help=_KINDS_HELP)
    r.add_argument("-o", "--output", metavar="HTML", help="write the HTML page here (default: none)")
    r.add_argument("--steps", metavar="REGEX", help="ranges whose whole name matches are the steps (a group: the step "
                                                    "number); default ProfilerStep#N, then step_N / iteration N, then a "
                                                    "repeated range named step")
    r.add_argument("--window", metavar="A:B|RANGE", help="the timeline figure's window: A:B in ms from the first GPU "
                                                         "activity, or a range's name (its last occurrence); default the "
                                                         "last step")
    r.add_argument("--top", type=int, default=15, metavar="N", help="rows of the per-kernel tables in the terminal (15)")
    r.add_argument("-q", "--quiet", action="store_true", help="print nothing but where the HTML page went")
    d = sub.add_parser("diff", help="compare two captures of the same program",
                       description="Compare BEFORE with AFTER: step time (and throughput with --items-per-step), GPU "
                                   "busy, kernel time by kind and by precision, kernels per step, the kernels that "
                                   "appeared and disappeared, by demangled name (per step where both have steps).")
    d.add_argument("before", metavar="BEFORE", help=_KINDS_HELP)
    d.add_argument("after", metavar="AFTER")
    d.add_argument("-o", "--output", metavar="HTML", help="write the HTML page here")
    d.add_argument("--steps", metavar="REGEX", help="as for report")
    d.add_argument("--items-per-step", metavar="N[,M]", type=_items,
                   help="the work one step does (a batch size: images, tokens), in BEFORE and in AFTER (one number for "
                        "both): adds the throughput, the only fair comparison of steps of different sizes")
    return p


def _items(text: str) -> tuple[float, float]:
    """``--items-per-step``: ``N`` (both captures) or ``N,M`` (before, after), positive numbers."""
    parts = text.split(",")
    try:
        vals = [float(x) for x in parts]
    except ValueError:
        vals = []
    if len(vals) not in (1, 2) or not all(v > 0 for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: give N or N,M, positive numbers (the work per step before and after)")
    return (vals[0], vals[-1])


def _write(pages, out: str | None, title: str) -> None:  # type: ignore[no-untyped-def]
    from .render import write_html

    if out is None:
        return
    target = Path(out)
    if not target.parent.exists():
        raise GpuprofError(f"cannot write {target}: the folder {target.parent} does not exist.", "Create it first.")
    try:
        write_html(pages, target, title=title)
    except OSError as exc:
        raise GpuprofError(f"cannot write {target}: {exc.strerror}.", "Choose a writable path with -o.") from None
    print(f"wrote {target} ({target.stat().st_size / 1024:,.0f} KiB)")


@exit_on_error
def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from . import build_diff, build_pages
    from .render import terminal_text

    t0 = time.perf_counter()
    if args.command == "report":
        if args.top < 1 or args.top > 10_000:
            raise GpuprofError(f"--top {args.top} is out of range.", "Give 1 to 10000.")
        pages = build_pages(args.captures, steps=args.steps, window=args.window, top=args.top)
        if not args.quiet:
            sys.stdout.write(terminal_text(pages))
        _write(pages, args.output, "gpuprof report: " + ", ".join(Path(c).name for c in args.captures))
    else:
        page = build_diff(args.before, args.after, steps=args.steps, items_per_step=args.items_per_step)
        sys.stdout.write(terminal_text([page]))
        _write([page], args.output, f"gpuprof diff: {page.title}")
    if not getattr(args, "quiet", False):
        print(f"({time.perf_counter() - t0:.2f} s)")
    return 0
