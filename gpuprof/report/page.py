"""A report as data: sections of tables, sentences and figures, rendered for a terminal or as one HTML file.

Builders (:mod:`gpuprof.report.timeline_page`, :mod:`gpuprof.report.ncu_page`) fill a
:class:`Page`; :mod:`gpuprof.report.render` prints it or writes it. Keeping the numbers
in DataFrames until the last step is what lets the tests compare a report's tables
with the tools' own (``nsys stats`` CSVs, ``ncu --csv``, ``key_averages``) cell by cell.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd

__all__ = ["Block", "Page", "heading_matches"]


def heading_matches(heading: str, wanted: str | Sequence[str]) -> bool:
    """Whether a block's ``heading`` is one a reader asked for: it starts with ``wanted`` (or one of them).

    A prefix, because some headings carry counts (``Kernels that appeared (12)``) that a caller
    cannot know in advance; :meth:`Page.table` and ``terminal_text(only=...)`` both match this way.
    """
    return any(heading.startswith(w) for w in ([wanted] if isinstance(wanted, str) else wanted))


@dataclass
class Block:
    """One part of a page: a table (``table``), a few sentences (``text``) or a figure (``png`` bytes).

    ``terminal_rows`` is how many table rows the terminal shows (the HTML shows ``html_rows``), and
    ``width`` how many characters of a long name it keeps; ``note`` says where the numbers come from
    or how to read them. ``short_names`` names a column of demangled kernel names that the HTML page
    shows shortened (:func:`gpuprof.report.kernel_names.short_kernel_name`), the full name on hover
    and in the table's CSV link.
    """

    heading: str
    table: pd.DataFrame | None = None
    text: str = ""
    png: bytes | None = None
    note: str = ""
    terminal_rows: int = 10
    html_rows: int = 50
    terminal: bool = True
    width: int = 60
    short_names: str = ""


@dataclass
class Page:
    """The report on one capture (or one folder of per-rank captures)."""

    title: str
    path: Path
    kind: str
    blocks: list[Block] = field(default_factory=list)
    facts: dict[str, float] = field(default_factory=dict)  # the headline numbers, for diff and tests

    def add(self, heading: str, **kw) -> Block:  # type: ignore[no-untyped-def]
        b = Block(heading, **kw)
        self.blocks.append(b)
        return b

    def table(self, heading: str) -> pd.DataFrame:
        """The table under ``heading`` (for tests and notebooks), matched by :func:`heading_matches`:
        the block whose heading is exactly ``heading``, else the one whose heading starts with it
        (``page.table("Kernels that appeared")`` finds ``Kernels that appeared (12)``). Several
        headings that start with it and none equal to it is an error, not a guess."""
        tables = [b for b in self.blocks if b.table is not None]
        exact = [b for b in tables if b.heading == heading]
        found = exact or [b for b in tables if heading_matches(b.heading, heading)]
        if len(found) == 1 or exact:
            return found[0].table  # type: ignore[return-value]
        if found:
            raise KeyError(f"{heading!r} starts several tables' headings: {[b.heading for b in found]}")
        raise KeyError(f"no table {heading!r}; tables: {[b.heading for b in tables]}")
