"""``python -m gpuprof report`` and ``diff``: any capture to one page, numbers equal to the tools' own.

* :mod:`gpuprof.report.detect`: what a file is, from its content (``capture_kind``)
* :mod:`gpuprof.report.activity_view`: nsys exports and PyTorch profiler traces as one view;
  steps, the headline numbers, idle time by cause
* :mod:`gpuprof.report.timeline_page`, :mod:`gpuprof.report.ncu_page`: the pages
* :mod:`gpuprof.report.diff`: two captures compared
* :mod:`gpuprof.report.render`: terminal text and one self-contained HTML file
* :mod:`gpuprof.report.cli`: the command line

From Python: ``pages = build_pages(["run.sqlite"])``, then ``pages[0].table("Top kernels")``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..errors import GpuprofError
from .activity_view import ActivityView, headline, load
from .detect import capture_kind, captures_in
from .page import Page

__all__ = ["build_pages", "build_diff", "capture_kind", "load", "Page", "ActivityView"]

TIMELINE_KINDS = ("nsys", "nsys-rep", "kineto")


def _expand(paths: Sequence[str | Path]) -> list[tuple[Path, str, Path | None]]:
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out += [(f, k, p) for f, k in captures_in(p)]
        else:
            out.append((p, capture_kind(p), None))
    return out


def build_pages(paths: Sequence[str | Path], *, steps: str | None = None, window: str | None = None,
                top: int = 15) -> list[Page]:
    """One page per capture (a folder's captures each get one, then one page side by side)."""
    from ..memory_probe import give_back_memory
    from .ncu_page import ncu_page
    from .timeline_page import ranks_page, timeline_page

    pages: list[Page] = []
    # Per folder, each rank's headline only: the views themselves are let go once their page is built,
    # so a folder of many ranks costs the memory of one rank's timeline at a time, plus the pages.
    folders: dict[Path, list[tuple[Path, dict[str, float]]]] = {}
    for path, kind, folder in _expand(paths):
        if kind in TIMELINE_KINDS:
            view, page = _lean_page(path, kind, steps, window, top)
            if page is None:
                view = load(path, kind, steps=steps)
                give_back_memory()  # the reading's freed pages, before the page's stages
                page = timeline_page(view, window=window, top=top)
            pages.append(page)
            if folder is not None:
                folders.setdefault(folder, []).append((view.path, headline(view)))
            del view
        else:
            pages.append(ncu_page(path, kind, top=top))
    for views in folders.values():
        if len(views) > 1:
            pages.insert(0, ranks_page(views))
    return pages


def _lean_page(path: Path, kind: str, steps: str | None, window: str | None, top: int):  # type: ignore[no-untyped-def]
    """(view, page) of an nsys export of millions of kernels read in passes (:mod:`gpuprof.report.lean_nsys`),
    where that reader covers it; (None, None): read it whole. What it does not cover may show only on the way
    (calls that share a correlation id): the page is then built again from the whole export."""
    if kind != "nsys":
        return None, None
    from .lean_nsys import Unsupported, lean_view, wants_lean
    from .timeline_page import timeline_page

    if not wants_lean(path):
        return None, None
    try:
        view = lean_view(path, steps)
        return view, timeline_page(view, window=window, top=top)
    except Unsupported:
        return None, None


def build_diff(before: str | Path, after: str | Path, *, steps: str | None = None,
               items_per_step: tuple[float, float] | None = None) -> Page:
    """The diff page of two captures of one family (two timelines, or two Nsight Compute captures);
    ``items_per_step`` (before, after): the work one step of each does, for timelines' throughput."""
    from .diff import diff_ncu, diff_timelines

    kb, ka = capture_kind(before), capture_kind(after)
    if kb in TIMELINE_KINDS and ka in TIMELINE_KINDS:
        return diff_timelines(load(before, kb, steps=steps), load(after, ka, steps=steps), items_per_step=items_per_step)
    if kb in ("ncu", "ncu-csv") and ka in ("ncu", "ncu-csv"):
        return diff_ncu(Path(before), kb, Path(after), ka)
    raise GpuprofError(f"{Path(before).name} ({kb}) and {Path(after).name} ({ka}) cannot be compared.",
                       "Compare two timelines (nsys exports or PyTorch profiler traces) or two Nsight Compute captures.")
