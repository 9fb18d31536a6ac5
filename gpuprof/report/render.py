"""A :class:`~gpuprof.report.page.Page` printed for a terminal, or written as one self-contained HTML file.

The HTML page has its style, its script and its figures inline (PNG data URIs): it opens from
a mail attachment or a CI artefact with no network and no other file. Its tables sort by a
column when its header is clicked (a few lines of inline JavaScript: the rows shown, by the
cell's exact value); a column of kernel names shows short names, the full name on hover and
in the table's CSV link (a data URI).
"""

from __future__ import annotations

import base64
import html
import math
from urllib.parse import quote
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import pandas as pd

from .kernel_names import short_kernel_name
from .page import Block, Page, heading_matches

__all__ = ["terminal_text", "html_page", "write_html", "format_table"]

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;color:#222}
h1{font-size:1.5rem;border-bottom:2px solid #4c72b0;padding-bottom:.3rem}
h2{font-size:1.2rem;margin-top:2rem;color:#333}
h3{font-size:1rem;margin:1.4rem 0 .4rem}
table{border-collapse:collapse;font-size:.85rem;margin:.4rem 0}
th,td{border:1px solid #ccc;padding:.2rem .5rem;text-align:right;max-width:36rem;overflow-wrap:anywhere}
th{background:#f0f3f8;overflow-wrap:normal}
td.text,th.text{text-align:left}
td:not(.text){white-space:nowrap}
p.note{color:#555;font-size:.85rem;margin:.2rem 0 .8rem}
img{max-width:100%;border:1px solid #eee}
nav a{margin-right:1rem}
th.sortable{cursor:pointer;user-select:none}
th[aria-sort=ascending]::after{content:" \\25B2";font-size:.7em}
th[aria-sort=descending]::after{content:" \\25BC";font-size:.7em}
a.csv{font-size:.8rem}
"""

# Click a column's header to sort the table's rows by it (again: the other way). Numbers sort by the
# cell's data-v (the exact value, not the formatted text); an empty cell sorts last.
_SORT_JS = """
document.querySelectorAll("th.sortable").forEach((th) => th.addEventListener("click", () => {
  const table = th.closest("table"), body = table.tBodies[0], col = th.cellIndex;
  const down = th.getAttribute("aria-sort") === "ascending";
  table.querySelectorAll("th[aria-sort]").forEach((h) => h.removeAttribute("aria-sort"));
  th.setAttribute("aria-sort", down ? "descending" : "ascending");
  const key = (tr) => { const td = tr.cells[col]; return td.dataset.v !== undefined ? td.dataset.v : td.textContent; };
  const rows = Array.from(body.rows);
  rows.sort((a, b) => {
    const x = key(a), y = key(b);
    if (x === "" || y === "") return (x === "") - (y === "");
    const c = th.classList.contains("text") ? x.localeCompare(y) : Number(x) - Number(y);
    return down ? -c : c;
  });
  rows.forEach((r) => body.appendChild(r));
}));
"""


def _fmt(v: object) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        a = abs(v)
        if v.is_integer() and a < 1e15:
            return f"{int(v):,}"
        if a >= 1e6:
            return f"{v:,.0f}"
        if a != 0 and a < 1e-3:
            return f"{v:.3g}"
        return f"{v:,.3f}".rstrip("0").rstrip(".") if a < 100 else f"{v:,.1f}"
    if isinstance(v, (int,)) and not isinstance(v, bool):
        return f"{v:,}"
    return "" if v is None else str(v)


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def format_table(df: pd.DataFrame, rows: int, *, width: int = 60) -> str:
    """A table as aligned text: numbers formatted for reading, long names cut to ``width``."""
    shown = df.head(rows)
    cells = [[_short(_fmt(v), width) for v in row] for row in shown.itertuples(index=False)]
    head = [str(c) for c in df.columns]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(head)]
    numeric = [pd.api.types.is_numeric_dtype(df[c]) for c in df.columns]
    line = lambda r: "  ".join(x.rjust(w) if n else x.ljust(w) for x, w, n in zip(r, widths, numeric))  # noqa: E731
    out = [line(head), "  ".join("-" * w for w in widths), *map(line, cells)]
    if len(df) > rows:
        out.append(f"... {len(df) - rows:,} more rows (all of them in the HTML page)")
    return "\n".join(x.rstrip() for x in out)


def terminal_text(pages: Sequence[Page], only: Sequence[str] | None = None, rows: int | None = None) -> str:
    """Every page's blocks that are meant for a terminal, tables cut to their ``terminal_rows``
    (or to ``rows``); ``only`` keeps the blocks whose heading starts with one of its strings."""
    out: list[str] = []
    for p in pages:
        out += ["", f"== {p.title} ==", f"   {p.path} ({p.kind})"]
        for b in p.blocks:
            if not b.terminal or (b.table is None and not b.text):
                continue
            if only is not None and not heading_matches(b.heading, only):
                continue
            out += ["", f"-- {b.heading}"]
            if b.text:
                out.append(b.text)
            if b.table is not None:
                out.append(format_table(b.table, rows or b.terminal_rows, width=b.width) if len(b.table) else "(none)")
    return "\n".join(out).lstrip("\n") + "\n"


def _csv_link(block: Block) -> str:
    """The whole table (every row, full names) as a CSV file inside the page: a data URI."""
    assert block.table is not None
    name = "".join(c if c.isalnum() else "_" for c in block.heading.lower()).strip("_")[:60] or "table"
    data = quote(block.table.to_csv(index=False), safe="")
    return f'<a class="csv" download="{name}.csv" href="data:text/csv;charset=utf-8,{data}">CSV (all rows, full names)</a>'


def _html_table(df: pd.DataFrame, rows: int, short_names: str = "") -> str:
    numeric = [pd.api.types.is_numeric_dtype(df[c]) for c in df.columns]
    cls = lambda n: "" if n else "text"  # noqa: E731
    head = "".join(f'<th class="{(cls(n) + " sortable").strip()}" title="click to sort the rows shown">'
                   f"{html.escape(str(c))}</th>" for c, n in zip(df.columns, numeric))

    def cell(v: object, n: bool, col: str) -> str:
        if n:
            num = "" if pd.isna(v) else repr(float(v))  # type: ignore[arg-type]
            return f'<td data-v="{num}">{html.escape(_fmt(v))}</td>'
        text = _fmt(v)
        if col == short_names and text:
            short = short_kernel_name(text)
            if short != text:
                return f'<td class="text" title="{html.escape(text)}">{html.escape(short)}</td>'
        return f'<td class="text">{html.escape(text)}</td>'

    body = "".join("<tr>" + "".join(cell(v, n, c) for v, n, c in zip(r, numeric, df.columns)) + "</tr>"
                   for r in df.head(rows).itertuples(index=False))
    more = f'<p class="note">{len(df) - rows:,} more rows not shown.</p>' if len(df) > rows else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def html_page(pages: Sequence[Page], *, title: str = "gpuprof report") -> str:
    """One HTML document for all pages: inline style, figures as data URIs, nothing fetched."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>",
             f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>",
             f'<p class="note">Written by <code>python -m gpuprof report</code> on {stamp}.</p>']
    if len(pages) > 1:
        parts.append("<nav>" + "".join(f'<a href="#p{i}">{html.escape(p.title)}</a>' for i, p in enumerate(pages)) + "</nav>")
    for i, p in enumerate(pages):
        parts.append(f'<section id="p{i}"><h2>{html.escape(p.title)}</h2>'
                     f'<p class="note">{html.escape(str(p.path))} ({html.escape(p.kind)})</p>')
        for b in p.blocks:
            parts.append(f"<h3>{html.escape(b.heading)}</h3>")
            if b.text:
                parts.append("".join(f"<p>{html.escape(t)}</p>" for t in b.text.split("\n") if t.strip()))
            if b.png is not None:  # the picture first, the table it summarises after it
                data = base64.b64encode(b.png).decode("ascii")
                parts.append(f'<img alt="{html.escape(b.heading)}" src="data:image/png;base64,{data}">')
            if b.table is not None:
                parts.append(_html_table(b.table, b.html_rows, b.short_names) if len(b.table) else "<p>(none)</p>")
                if len(b.table) and b.short_names:
                    parts.append(f'<p class="note">Kernel names shortened to the function and its first template '
                                 f'argument: the full name on hover, and in the {_csv_link(b)}.</p>')
            if b.note:
                parts.append(f'<p class="note">{html.escape(b.note)}</p>')
        parts.append("</section>")
    parts.append(f"<script>{_SORT_JS}</script></body></html>")
    return "\n".join(parts)


def write_html(pages: Sequence[Page], out: str | Path, *, title: str = "gpuprof report") -> Path:
    """Write :func:`html_page` to ``out`` (through a temporary file, so a failed write leaves nothing half-written)."""
    out = Path(out)
    tmp = out.with_name(out.name + ".part")
    tmp.write_text(html_page(pages, title=title), encoding="utf-8")
    tmp.replace(out)
    return out
