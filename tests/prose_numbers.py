"""Tie every quantity in a notebook's prose to a figure its outputs print.

The commonest error in the chapters is a sentence quoting a figure that the outputs no longer print
(a re-run moved it, an edit rounded it differently). This module finds those sentences. It is test
tooling (``tests/test_prose_numbers.py`` runs it over every notebook), not course API, and it has a
command line for chapter authors::

    .venv/bin/python tests/prose_numbers.py notebooks/06__cnn_training.ipynb   # unmatched quantities
    .venv/bin/python tests/prose_numbers.py --words notebooks/*.ipynb          # and quantities in words
    .venv/bin/python tests/prose_numbers.py --explain notebooks/06__cnn_training.ipynb  # what matched what

Design, and why:

* **What is a quantity.** In markdown cells: a number with a unit (``3.3 us``, ``30 MB``, ``3 TB/s``,
  ``349,269 images/s``), a percentage, a ratio (``2.3x``, ``2.3×``, ``2.3 times``), a bare decimal
  (``a loss of 2.31``), and a count: an integer of three digits or more, or one written with thousands
  separators (``241 kernels``, ``1,201 calls``). Small bare integers (``two blocks``, ``rung 8``,
  ``batch 32``) are left out: they are mostly names and parameters, and counting them would bury the
  figures under false alarms.
* **What is not.** Fenced and inline code, math, link targets and URLs, roles (``{glue:text}`...```,
  ``{doc}`...```), HTML, heading and list numbering, dates and years, version numbers (``2025.3.1``,
  ``torch 2.11``, ``CUDA 13.0``), identifiers (``H100``, ``sm_90``, ``bf16``) and dimensions written
  ``32x32``. They are blanked (replaced by spaces, so offsets and sentences stay intact) before numbers
  are read.
* **Printed near the sentence.** Every number the notebook's outputs print (stream text, text/plain
  where no HTML says the same, HTML tables cell by cell, text/markdown, glue values) is read with its unit:
  the one printed beside it, the one printed once after its range or list ("1.76 to 2.10 ms"), or the one
  its table column's header names (``time_ms``, ``SM %``, ``x previous``; ``*_share`` is a fraction; a
  ``*_lo``/``*_hi`` column takes its neighbour's). In the cells of the sentence's own section (heading to
  heading), where prose reads a result, a quantity matches a number of its dimension (a time in any of
  ns/us/ms/s) that rounds to it at the prose's precision ("3.3x" matches 3.27 but not 3.4), and within
  10% of it ("1 GiB" is not 512 MiB). A number whose unit nothing names matches only a figure of three
  significant digits or more (times 1 or 10^±3 for a unit), or a percentage of two read from a fraction
  (0.81 as 81%): a two-digit figure would otherwise match some table cell by chance.
* **Printed elsewhere, as written.** Anywhere else in the notebook, the figure must be the one printed,
  to the same digits and unit ("0.984x", "331 GB/s", or the same value in another unit: 4 KiB, 4096 B); a
  rounding far from its output could as well be the rounding of another number.
* **Set by the code.** A whole count, or a whole quantity with a unit, of two significant digits or more
  may be a parameter: numbers in the code cells' sources (literals and strings, not comments), and in the
  example scripts the markdown cell names (``transformer_benchmark.py``). Ratios, percentages, decimals
  and one-digit figures are results or too common: the code cannot vouch for them.
* **Read from a record or another chapter.** A sentence that names a committed record
  (``artifacts/capture_run.md``) is checked against that file's numbers; one that names another chapter
  ("chapter 4's device copy", ``{doc}`00__setting_up```) against that chapter's outputs, as written or
  rounded to three significant digits or more.
* **Cited.** A sentence that names its source (a datasheet, documentation, a guide, a specification, a
  paper, a tool's help, a link) vouches for its figures; the checker cannot read those.
* **Exemptions** are the last resort: :class:`Exemption` (notebook, cell id, the figures, where they come
  from: arithmetic in the sentence, a docstring's measurement), kept in the test file, each still needed.
* **Tight enough to fail on one digit.** Matching at the prose's precision, by dimension, near the
  sentence, is what makes a changed digit an unmatched quantity; ``tests/test_prose_numbers.py`` changes
  digits of real quoted figures and checks that they are flagged. It is not proof against chance: over
  the twelve chapters, about a quarter of last-digit changes of tied figures still land on another number
  printed near them (a table's low and high beside its median), most of them two-digit figures.
* **Quantities in words** ("twice", "four times faster", "most of them", "barely") are not failures (a
  rule that flags them all would flag their legitimate uses), but the CLI reports them with ``--words``
  so that an author can replace a measured one by the figure the output prints.
"""

from __future__ import annotations

import argparse
import bisect
import functools
import html
import io
import json
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"

# ---- units ------------------------------------------------------------------------------------------------

_SI = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BIN = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}


def _unit_table() -> dict[str, tuple[str, float]]:
    """Unit spelling -> (dimension, factor to the dimension's base unit)."""
    t: dict[str, tuple[str, float]] = {}
    for name, f in {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0,
                    "nanoseconds": 1e-9, "nanosecond": 1e-9, "microseconds": 1e-6, "microsecond": 1e-6,
                    "milliseconds": 1e-3, "millisecond": 1e-3, "seconds": 1.0, "second": 1.0,
                    "min": 60.0, "minutes": 60.0, "minute": 60.0, "hours": 3600.0, "hour": 3600.0,
                    "h": 3600.0}.items():
        t[name] = ("time", f)
    for p, f in {**{k: v for k, v in _SI.items() if k != "K"}, **_BIN}.items():
        t[p + "B"] = ("bytes", f)
        t[p + "B/s"] = ("bytes/s", f)
    t["KB"] = ("bytes", 1e3)
    t["KB/s"] = ("bytes/s", 1e3)
    for name in ("bytes", "byte"):
        t[name] = ("bytes", 1.0)
    t["B/ns"] = ("bytes/s", 1e9)
    t["B/us"] = ("bytes/s", 1e6)
    for name in ("B/cycle", "bytes/cycle", "B/clk"):
        t[name] = ("bytes/cycle", 1.0)
    for p in ("", "K", "M", "G", "T", "P"):
        f = _SI[p]
        for spelling in ("FLOP/s", "FLOPS", "FLOP/S", "flop/s"):
            t[p + spelling] = ("flop/s", f)
        t[p + "FLOP"] = ("flop", f)
        t[p + "FLOPs"] = ("flop", f)
        t[p + "OPS"] = ("flop/s", f)
    for name in ("FLOP/B", "FLOP/byte", "FLOPs/byte", "flop/byte", "FLOP/Byte"):
        t[name] = ("flop/byte", 1.0)
    for p in ("", "k", "M", "G"):
        t[p + "Hz"] = ("frequency", _SI[p])
    t["W"] = ("power", 1.0)
    t["kW"] = ("power", 1e3)
    t["watts"] = ("power", 1.0)
    for name in ("cycles", "cycle", "clocks", "clock cycles"):
        t[name] = ("cycles", 1.0)
    for thing in ("images", "tokens", "samples", "steps", "iterations", "it", "batches", "launches", "calls",
                  "kernels", "sequences"):
        for per in ("/s", " per second", "/step", " per step"):
            t[thing + per] = (thing + per.replace(" per ", "/").replace("second", "s"), 1.0)
    return t


UNITS = _unit_table()
_UNIT_ALT = "|".join(re.escape(u) for u in sorted(UNITS, key=len, reverse=True))
PERCENT_RE = r"%|\s?percent\b"
# "32 times the images" is a ratio; "rank 0 times a copy" is not: "times" must be followed by a comparison.
RATIO_RE = (r"[x×](?![\w×])|\s?×|\s(?:times)(?=\s+(?:the|as|faster|slower|more|less|longer|shorter|larger|"
            r"smaller|higher|lower|fewer|bigger|that|those|its|their|what|over|per)\b)")
MULTIPLIERS = {"thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12}

# A number: 1,234,567.8 or 1234.5 or .5 (no sign: "-3%" and "3% slower" are the same figure).
_NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+"
# Prose: not part of an identifier (H100, sm_90, bf16), a version (2.11.0), a path, or a power (2**20).
PROSE_NUMBER = re.compile(
    rf"(?<![\w.,/*^#$@])(?P<num>{_NUM})"
    rf"(?:(?P<ratio>{RATIO_RE})|(?P<pct>{PERCENT_RE})|\s(?P<mult>{'|'.join(MULTIPLIERS)})\b|"
    rf"[ \t\u00a0\u2009\u202f]?\n?[ \t]*(?P<unit>{_UNIT_ALT})(?![\w/]))?"
)
# Outputs: the same, and scientific notation (pandas prints 1.2e+06).
OUTPUT_NUMBER = re.compile(
    rf"(?<![\w.])(?P<num>(?:{_NUM})(?:[eE][+-]?\d+)?)"
    rf"(?:(?P<ratio>[x×](?![\w×]))|(?P<pct>%)|[ \t]?(?P<unit>{_UNIT_ALT})(?![\w/])|"
    rf"[ \t]?(?P<mult>[kMG]|thousand|million|billion)(?=[ \t]+[a-z]))?"  # "2.57 G parameters"
)
_OUTPUT_MULTIPLIERS = {"k": 1e3, "M": 1e6, "G": 1e9, **MULTIPLIERS}

# ---- masking: what is not prose -------------------------------------------------------------------------

_TOOL_WORDS = (r"CUDA|torch|PyTorch|Python|nsys|ncu|Nsight(?: Systems| Compute)?|driver|cuDNN|cuBLAS|NCCL|Triton|"
               r"NumPy|numpy|pandas|CuPy|cupy|nvtx|Ubuntu|Debian|gcc|GCC|clang|version|versions|release|v|"
               r"Jupyter Book|jupyter-book|compute capability|PCIe|PCIe gen|Hopper|Ampere|Volta|Turing|sm|SM|"
               r"gen|Gen|CUTLASS|cuda|JAX|TensorFlow|HTA|Holistic Trace Analysis|Kineto|glibc|kernel|Linux|"
               r"ISO|IEEE|PEP|RFC|port|issue|PR|figure|Figure|table|Table|section|Section|chapter|Chapter|"
               r"chapters|Chapters|part|Part|exercise|Exercise|step|rung|Rung|rungs|Rungs|level|Level|line|lines|"
               r"rank|ranks|Rank|GPU|GPUs|device|layer|layers|process|node|stream|thread|job|run|round|bucket|"
               r"problem|Problem|class|classes|cell|column|row|stage|phase|window|epoch|iteration|lane|warp|slot")
_MASKS: list[re.Pattern[str]] = [
    re.compile(r"^[ \t]*(```+|~~~+).*?^[ \t]*\1[ \t]*$", re.M | re.S),  # fenced code and directives
    re.compile(r"<!--.*?-->", re.S),
    re.compile(r"\$\$.*?\$\$", re.S),
    re.compile(r"(?<![\\\w])\$[^$\n]+?\$"),  # inline math
    re.compile(r"\{[\w:.-]+\}`[^`]*`"),  # roles: {glue:text}`key`, {doc}`page`
    re.compile(r"(`+)(?:(?!\1).)+?\1", re.S),  # inline code
    re.compile(r"\]\([^)\s]*\)"),  # link targets
    re.compile(r"^\s*\[[^\]]+\]:\s*\S+.*$", re.M),  # reference-style link definitions
    re.compile(r"https?://\S+|www\.\S+"),
    re.compile(r"<[^>\n]+>"),  # HTML tags
    re.compile(r"^[ \t]*:[\w-]+:.*$", re.M),  # directive options (:name: ..., :width: 80%)
    re.compile(r"^#{1,6}[ \t]+\d+(?:\.\d+)*\.?", re.M),  # heading numbers
    re.compile(r"^[ \t]*\d+[.)](?=[ \t])", re.M),  # list numbering
    re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?)?\b"),  # dates
    re.compile(r"\b\d+:\d{2}(?::\d{2})?\b"),  # clock times
    re.compile(r"(?<![\w.])\d+(?:\.\d+){2,}\b"),  # versions 2025.3.1, 580.159.04
    re.compile(r"\b\d+[x×]\d+\b|\b\d+(?:[ \t]?[x×][ \t]?\d+)+(?![\w.])"),  # dimensions 32x32, 32 x 32 x 3
    re.compile(r"(?<![\w.,])\d[\d,]*-(?!odd\b)(?=[a-z])"),  # sizes as adjectives: a 128-byte swizzle, 3,072-wide
    re.compile(rf"\b(?:{_TOOL_WORDS})[ \t\n]?(?=\d)\d+(?:\.\d+)*(?![\w%×]|\.\d|[ \t]?(?:{_UNIT_ALT})\b)"),  # torch 2.11
    re.compile(r"(?<![\w,.])(?:19\d{2}|20[0-3]\d)(?![\w%×]|[.,]\d)(?![ \t]?(?:" + _UNIT_ALT + r")\b)"),  # years
    re.compile(r"(?<![\w.])\d+(?:\.\d+)?[BM](?![\w/])"),  # model sizes: the 2.7B model, GPT-2's 124M
]


@functools.lru_cache(maxsize=4096)
def mask_markdown(text: str) -> str:
    """Markdown with everything that is not prose blanked out (see the module docstring)."""
    for pattern in _MASKS:
        text = pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    return text


# ---- quantities -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Quantity:
    """One figure in the prose, as written (``text``) and as read (value at its precision, unit)."""

    text: str
    value: float
    decimals: int  # digits after the point as written: the precision the prose claims
    kind: str  # "unit", "percent", "ratio", "count" or "number"
    dimension: str | None = None  # for kind "unit"
    scale: float = 1.0  # the unit's factor to its dimension's base
    start: int = 0
    end: int = 0
    shared: str = ""  # the unit written once after a range or list ("1.8 to 2.1 ms": "ms" for 1.8)

    @property
    def shown(self) -> str:
        return f"{self.text} [{self.shared}]" if self.shared else self.text

    @property
    def significant(self) -> int:
        """How many significant digits the prose wrote (12,000 -> 5; 0.30 -> 2; 6.5 -> 2)."""
        digits = re.sub(r"\D", "", re.match(r"[\d,.]*", self.text).group(0))
        return len(digits.lstrip("0")) or 1

    @property
    def precise(self) -> int:
        """Significant digits that cannot be a round figure's zeros: "100 us" has one, "100.0 us" four."""
        written = re.match(r"[\d,.]*", self.text).group(0)
        digits = re.sub(r"\D", "", written).lstrip("0")
        return len(digits if "." in written else digits.rstrip("0")) or 1


def _read(num: str) -> tuple[float, int]:
    plain = num.replace(",", "")
    decimals = len(plain.split(".")[1]) if "." in plain else 0
    return float(plain), decimals


def _kind(m: re.Match[str], num: str) -> tuple[str, str | None, float] | None:
    """(kind, dimension, scale) of a number as written; None for a small bare integer (not a quantity)."""
    if m.group("pct"):
        return "percent", None, 1.0
    if m.group("ratio"):
        return "ratio", None, 1.0
    if m.group("mult"):
        return "count", None, MULTIPLIERS[m.group("mult")]
    if m.group("unit"):
        unit = m.group("unit")
        dimension, scale = UNITS[unit]
        return "unit", dimension, scale
    if "," in num and re.fullmatch(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?", num):
        return "count", None, 1.0
    if "." in num:
        return "number", None, 1.0
    if len(num) >= 3:
        return "count", None, 1.0
    return None


# Between the figures of a range or list whose unit is written once: "1.8 to 2.1 ms", "13 to 15%", "3, 6
# and 12 KiB".
_SHARED_UNIT = re.compile(r"[ \t\n]*(?:to|-|–|—|and|or|,|, and|, or|against|vs\.?)[ \t\n]*(?:about[ \t\n]+)?")


def extract(markdown: str) -> list[Quantity]:
    """The quantities of one markdown cell, in order."""
    masked = mask_markdown(markdown)
    matches = list(PROSE_NUMBER.finditer(masked))
    kinds = [_kind(m, m.group("num")) for m in matches]
    shared = [""] * len(matches)
    # a figure followed by a range or list partner with a unit takes that unit (right to left, for lists)
    for i in range(len(matches) - 2, -1, -1):
        if kinds[i + 1] and kinds[i + 1][0] in ("unit", "percent", "ratio") and \
                not (matches[i].group("pct") or matches[i].group("ratio") or matches[i].group("unit")) and \
                _SHARED_UNIT.fullmatch(masked[matches[i].end():matches[i + 1].start()]):
            kinds[i] = kinds[i + 1]
            nxt = matches[i + 1]
            shared[i] = shared[i + 1] or one_line(masked[nxt.end("num"):nxt.end()])
    found = []
    for m, kind, unit in zip(matches, kinds, shared):
        if kind is None:
            continue
        value, decimals = _read(m.group("num"))
        found.append(Quantity(text=one_line(markdown[m.start():m.end()]), value=value, decimals=decimals,
                              kind=kind[0], dimension=kind[1], scale=kind[2], start=m.start(), end=m.end(),
                              shared=unit))
    return found


# ---- sentences ------------------------------------------------------------------------------------------

# Sentence ends (a period, then a capital, a bracket, emphasis or code; not a period inside code or math),
# and block boundaries (blank lines, list items, table rows, headings).
_SENTENCE_END = re.compile(r"(?<=[.!?])[ \t]+(?=[A-Z(\[*_\"'`])|(?<=[.!?])\n(?=[ \t]*[A-Z(\[*_\"'`])")
_BLOCK = re.compile(r"\n[ \t]*\n|\n(?=[ \t]*(?:[-*+]|\d+[.)])[ \t])|\n(?=[ \t]*\|)|\n(?=#)|\|")
_ABBREVIATIONS = re.compile(r"\b(?:e\.g|i\.e|vs|etc|cf|Fig|approx|no)\.$", re.I)


def sentence_bounds(text: str, masked: str, pos: int) -> tuple[int, int]:
    """[start, end) of the sentence of ``text`` (``masked``: the same, blanked) that holds offset ``pos``."""
    starts = {0}
    for m in _SENTENCE_END.finditer(text):
        # a period inside code or math ends no sentence; "e.g." and "vs." end none either
        if masked[m.start() - 1] == text[m.start() - 1] and not _ABBREVIATIONS.search(text[:m.start()].rstrip()[-8:]):
            starts.add(m.end())
    starts |= {m.end() for m in _BLOCK.finditer(text)}
    ordered = sorted(starts)
    i = bisect.bisect_right(ordered, pos) - 1
    end = ordered[i + 1] if i + 1 < len(ordered) else len(text)
    return ordered[i], end


def one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


# ---- what the notebook prints, and what its code sets ------------------------------------------------------


@dataclass(frozen=True)
class Printed:
    """One number an output prints: its value (in its dimension's base unit), where, and as printed."""

    value: float
    dimension: str | None  # None: printed bare; "%", "x", or a unit's dimension (from its unit or its header)
    cell: str
    text: str  # as printed, with its unit or its table header
    raw: float = 0.0  # the number as printed (12 for "12 ms")
    decimals: int = 0  # digits after the point as printed
    scale: float = 1.0  # the printed unit's factor to the dimension's base (1e-3 for ms)
    context: str = ""  # for a number in code: its line, where a unit may be named (size_mib = 64)


def _printed(num: str, dimension: str | None, scale: float, cell: str, text: str) -> Printed:
    raw = abs(float(num.replace(",", "")))
    mantissa = num.replace(",", "").lower().split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return Printed(raw * scale, dimension, cell, text, raw, decimals, scale)


class Index:
    """Printed numbers sorted by value, one list per dimension, for range look-ups."""

    def __init__(self, items: Iterable[Printed]) -> None:
        groups: dict[str | None, list[Printed]] = {}
        for item in items:
            groups.setdefault(item.dimension, []).append(item)
        self._by: dict[str | None, tuple[list[float], list[Printed]]] = {}
        for dimension, group in groups.items():
            group.sort(key=lambda p: p.value)
            self._by[dimension] = ([p.value for p in group], group)

    def find(self, dimension: str | None, low: float, high: float) -> Iterator[Printed]:
        """The numbers of ``dimension`` with a value in [low, high]."""
        values, items = self._by.get(dimension, ([], []))
        i = bisect.bisect_left(values, low)
        while i < len(values) and values[i] <= high:
            yield items[i]
            i += 1

    def find_raw(self, low: float, high: float) -> Iterator[Printed]:
        """Any number whose value as printed is in [low, high], whatever its unit."""
        for dimension in self._by:
            for p in self._by[dimension][1]:
                if low <= p.raw <= high:
                    yield p


# In an output, a list of labelled figures whose unit is printed once: "FP32 FFMA 51, BF16 mma.sync 545, BF16
# wgmma 818 TFLOP/s".
_LABELLED_LIST = re.compile(r",[ \t]+[A-Za-z][\w.+\- ]{0,30}[ \t]")


def read_numbers(text: str, cell: str = "") -> Iterator[Printed]:
    """Every number of an output's text, with the unit printed beside it (bare if none); a unit printed once
    after a range or list ("0.90 and 2.24 ms", "1.76 to 2.10 ms", "FFMA 51, wgmma 818 TFLOP/s") belongs to each
    of its numbers."""
    matches = list(OUTPUT_NUMBER.finditer(text))
    kinds: list[tuple[str, re.Match[str]] | None] = [None] * len(matches)
    for i in range(len(matches) - 1, -1, -1):
        m = matches[i]
        for group in ("pct", "ratio", "unit"):
            if m.group(group):
                kinds[i] = (group, m)
        if kinds[i] is None and not m.group("mult") and i + 1 < len(matches) and kinds[i + 1] and \
                (_SHARED_UNIT.fullmatch(text[m.end():matches[i + 1].start()])
                 or _LABELLED_LIST.fullmatch(text[m.end():matches[i + 1].start()])):
            kinds[i] = kinds[i + 1]
    for m, kind in zip(matches, kinds):
        num, shown = m.group("num"), m.group(0)
        if kind and kind[0] == "pct":
            yield _printed(num, "%", 1.0, cell, shown)
        elif kind and kind[0] == "ratio":
            yield _printed(num, "x", 1.0, cell, shown)
        elif kind:
            dimension, scale = UNITS[kind[1].group("unit")]
            yield _printed(num, dimension, scale, cell, shown if m is kind[1] else f"{shown} [{kind[1].group('unit')}]")
        elif m.group("mult"):
            p = _printed(num, None, 1.0, cell, shown)
            f = _OUTPUT_MULTIPLIERS[m.group("mult")]
            yield Printed(p.raw * f, None, cell, shown, p.raw * f, 0, 1.0)
        else:
            yield _printed(num, None, 1.0, cell, shown)
        if "," in num:  # "1,234" may be two numbers of a list: keep both readings, bare
            for piece in num.split(","):
                if piece and "." not in piece:
                    yield _printed(piece, None, 1.0, cell, piece)


_TABLE = re.compile(r"<table\b.*?</table>", re.S | re.I)
_ROW = re.compile(r"<tr\b.*?</tr>", re.S | re.I)
_CELL = re.compile(r"<(th|td)\b[^>]*>(.*?)</\1>", re.S | re.I)
# Units a column or row header may name ("time_ms", "median_kernel_us", "peak_MiB", "GB/s"): one-letter
# units other than "s" are left out ("B" and "W" name other things in headers), and so is "min": in a header
# it is the statistic ("min", "min_us"), not minutes.
_HEADER_UNITS = sorted((u for u in UNITS if (len(u) > 1 or u == "s") and u != "min"), key=len, reverse=True)
_HEADER_UNIT = re.compile(r"(?<![A-Za-z])(" + "|".join(re.escape(u) for u in _HEADER_UNITS) + r")(?![A-Za-z])")
_HEADER_RATE = re.compile(r"\b(images|tokens|samples|steps|iterations)[ _]?(?:/|per[ _]?)(?:s|sec|second)\b", re.I)


def header_dimension(name: str) -> tuple[str, float] | None:
    """The dimension and scale a table header gives its numbers, if it names a unit; fractions ("share")
    become percentages (scale 100)."""
    m = _HEADER_RATE.search(name)
    if m:
        return f"{m.group(1).lower()}/s", 1.0
    if re.search(r"%|\bpct\b|percent", name, re.I):
        return "%", 1.0
    if re.search(r"share|frac", name, re.I):
        return "%", 100.0
    if re.search(r"(?:^|[\s_])x(?:$|[\s_])|speed-?up|ratio|\bvs\b|^vs_", name, re.I):
        return "x", 1.0
    m = _HEADER_UNIT.search(name)
    if m:
        return UNITS[m.group(1)]
    return None


def _plain(fragment: str) -> str:
    return one_line(html.unescape(re.sub(r"<[^>]+>", " ", fragment)))


def read_table(table: str, cell: str) -> Iterator[Printed]:
    """The numbers of an HTML table (a pandas DataFrame), each typed by its column's or row's header."""
    header: list[list[str]] = []
    for row in _ROW.finditer(table):
        cells = [(kind.lower(), _plain(body)) for kind, body in _CELL.findall(row.group(0))]
        if all(kind == "th" for kind, _ in cells):
            header.append([text for _, text in cells])
            continue
        values = [text for kind, text in cells if kind == "td"]
        row_name = " ".join(text for kind, text in cells if kind == "th")
        yield from read_numbers(row_name, cell)
        columns = [" ".join(h[len(h) - len(values) + k] for h in header if len(h) - len(values) + k >= 0).strip()
                   for k in range(len(values))]
        types = [header_dimension(c) for c in columns]
        for k in range(1, len(types)):  # step_ms, step_lo, step_hi: a range's columns share the unit
            if types[k] is None and types[k - 1] and re.search(r"(?:^|[_ ])(?:lo|hi|low|high|min|max)$", columns[k]):
                types[k] = types[k - 1]
        for k, value in enumerate(values):
            column = columns[k]
            typed = types[k] or header_dimension(row_name)
            for p in read_numbers(value, cell):
                if typed and p.dimension is None:
                    label = f"{p.text} ({column or row_name})"
                    if typed[0] == "%" and typed[1] == 100.0:  # a share: 0.395 is 39.5%
                        yield Printed(p.raw * 100, "%", cell, label, p.raw * 100, max(p.decimals - 2, 0), 1.0)
                    else:
                        yield Printed(p.raw * typed[1], typed[0], cell, label, p.raw, p.decimals, typed[1])
                else:
                    yield p


def _output_texts(cell: dict) -> Iterator[str | tuple[str, str]]:
    """The text of each output (an HTML table as ("table", html)); text/plain only where no HTML says it."""
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            yield "".join(o.get("text", ""))
        data = o.get("data", {})
        has_html = any(m.endswith("html") for m in data)
        for mime, v in data.items():
            if not isinstance(v, (str, list)):
                continue
            text = "".join(v)
            if mime.endswith("html"):
                for table in _TABLE.findall(text):
                    yield ("table", table)
                text = re.sub(r"<style\b.*?</style>", " ", _TABLE.sub(" ", text), flags=re.S | re.I)
                yield html.unescape(re.sub(r"<[^>]+>", " ", text))
            elif mime.endswith(("text/markdown", "text/latex")) or (mime.endswith("text/plain") and not has_html):
                yield text


class Outputs:
    """What a notebook (or a record) prints: its numbers, cell by cell, with indexes over all and over a range."""

    def __init__(self, per_cell: list[list[Printed]]) -> None:
        self.per_cell = per_cell
        self.everything = Index(p for cell in per_cell for p in cell)
        self._near: dict[tuple[int, int], Index] = {}

    def near(self, lo: int, hi: int) -> Index:
        if (lo, hi) not in self._near:
            self._near[(lo, hi)] = Index(p for cell in self.per_cell[lo:hi] for p in cell)
        return self._near[(lo, hi)]


def read_outputs(nb: dict) -> Outputs:
    per_cell: list[list[Printed]] = []
    for cell in nb["cells"]:
        here: list[Printed] = []
        if cell["cell_type"] == "code":
            for text in _output_texts(cell):
                if isinstance(text, tuple):
                    here.extend(read_table(text[1], cell.get("id", "")))
                else:
                    here.extend(read_numbers(text, cell.get("id", "")))
        per_cell.append(here)
    return Outputs(per_cell)


def code_numbers(nb: dict) -> Index:
    """Numbers in the code cells' sources: literals, and numbers inside strings; comments are left out."""
    found: list[Printed] = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "\n".join(line for line in "".join(cell["source"]).splitlines()
                           if not line.lstrip().startswith(("%", "!")))  # IPython magics and shell lines
        try:
            tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
        except (tokenize.TokenError, IndentationError, SyntaxError):
            continue
        for tok in tokens:
            if tok.type == tokenize.NUMBER:
                literal = tok.string.replace("_", "").rstrip("jJ")
                try:
                    value = float(int(literal, 0)) if re.fullmatch(r"0[xob]\w+", literal, re.I) else float(literal)
                except ValueError:
                    continue
                found.append(Printed(abs(value), "code", cell["id"], tok.string, abs(value), context=tok.line))
            elif tok.type == tokenize.STRING or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
                for m in re.finditer(rf"(?<![\w.])({_NUM})", tok.string):
                    value = float(m.group(1).replace(",", ""))
                    found.append(Printed(value, "code", cell["id"], m.group(1), value, context=tok.line))
    return Index(found)


# ---- matching -------------------------------------------------------------------------------------------

# A bare number near the sentence (a table cell whose header names no unit) may be in another unit of the
# same dimension (ms in a column, us in the prose), or a fraction the prose gives as a percentage. Because
# it could be anything, it counts only for a figure of three significant digits or more; a fraction read as
# a percentage (0.81 as 81%) from two.
BARE_FACTORS = {"unit": ((1.0, 3), (1e3, 3), (1e-3, 3)), "percent": ((1.0, 3), (100.0, 2)), "ratio": ((1.0, 3),)}
# "1 GiB" may round 0.5 GiB to the prose's precision, but no reader would call 512 MiB "1 GiB": a printed figure
# within the prose's rounding must also be within 10% of it (this binds only for one-digit figures 1 to 4).
RELATIVE = 0.10
_EPS = 1e-9


def _window(q: Quantity) -> tuple[float, float]:
    """The values that round to the prose's figure at the prose's precision (and lie within 10% of it)."""
    half = 0.5 * 10.0 ** -q.decimals
    if q.value:
        half = min(half, RELATIVE * q.value)
    slack = _EPS * max(1.0, q.value)
    return q.value - half - slack, q.value + half + slack


def _dimension(q: Quantity) -> str | None:
    return {"unit": q.dimension, "percent": "%", "ratio": "x"}.get(q.kind)


def printed_near(q: Quantity, near: Index) -> Printed | None:
    """A number printed near the sentence that, rounded to the prose's precision and in its unit, is ``q``.

    Near means in the cells of the sentence's section, where prose reads a result: a number printed with
    its unit (or under a header naming one) matches in any unit of the same dimension; a bare one (a table
    cell under a header that names none) as :data:`BARE_FACTORS` allows; counts and bare decimals match any
    number as printed."""
    low, high = _window(q)
    if q.kind in ("count", "number"):
        return next(near.find_raw(low * q.scale, high * q.scale), None)
    hit = next(near.find(_dimension(q), low * q.scale, high * q.scale), None)
    for f, digits in BARE_FACTORS[q.kind]:
        if hit is None and q.precise >= digits:
            hit = next(near.find(None, low / f, high / f), None)
    return hit


def printed_as_written(q: Quantity, everything: Index) -> Printed | None:
    """A number printed anywhere in the notebook as the prose writes it: the same figure, to the same
    digits, in the same unit ("331 GB/s" for "331 GB/s"; "0.984x" for "0.984x"; 10000 for "10,000").

    Far from its output, a figure must be the one printed, not a rounding of it: a rounded figure could as
    well be the rounding of a different number printed elsewhere."""
    low, high = _window(q)
    if q.kind in ("count", "number"):
        pool = everything.find_raw(low * q.scale, high * q.scale)
        # a count printed as a float (867.0) is the same count
        return next((p for p in pool if p.decimals == q.decimals or q.scale != 1.0
                     or (q.decimals == 0 and p.raw == q.value)), None)
    for p in everything.find(_dimension(q), low * q.scale, high * q.scale):
        if p.decimals == q.decimals and abs(p.scale - (1.0 if q.kind != "unit" else q.scale)) <= _EPS * p.scale:
            return p
        if abs(p.value - q.value * q.scale) <= _EPS * p.value:  # the same value in another unit: 4 KiB, 4096 B
            return p
    return None


def printed_in_chapter(q: Quantity, everything: Index) -> Printed | None:
    """A number another chapter prints that is ``q``: as written, or, for a figure of three significant
    digits or more, rounded to it (2.76 TB/s for 2763.6 GB/s); a shorter figure could be the rounding of
    anything that chapter prints."""
    hit = printed_as_written(q, everything)
    if hit or q.precise < 3:
        return hit
    low, high = _window(q)
    if q.kind in ("count", "number"):
        return next(everything.find_raw(low * q.scale, high * q.scale), None)
    return next(everything.find(_dimension(q), low * q.scale, high * q.scale), None)


_SCRIPT_REF = re.compile(r"\b(examples/[\w/.-]+\.(?:py|cu))\b|`(\w+\.(?:py|cu))`")
_SCRIPTS: dict[Path, list[Printed]] = {}


def script_numbers(markdown: str, root: Path) -> Index:
    """Numbers in the source of the example scripts a markdown cell names (``examples/nsys/x.py`` or
    `` `x.py` ``): a parameter the script sets is its own source, for the cell that says which script."""
    found: list[Printed] = []
    for full, short in _SCRIPT_REF.findall(markdown):
        for path in [root / full] if full else sorted((root / "examples").glob(f"*/{short}")):
            if path not in _SCRIPTS:
                text = path.read_text(errors="replace") if path.is_file() else ""
                text = re.sub(r"//.*|#.*", "", text)  # comments (C++ and Python) are not parameters
                _SCRIPTS[path] = [Printed(float(m.group(1).replace("_", "")), "code", path.name, m.group(1),
                                          float(m.group(1).replace("_", "")),
                                          context=text[text.rfind("\n", 0, m.start()) + 1:text.find("\n", m.end())])
                                  for m in re.finditer(r"(?<![\w.])(\d[\d_]*)(?![\w.])", text)]
            found.extend(_SCRIPTS[path])
    return Index(found)


def _unit_words(dimension: str) -> re.Pattern[str]:
    """The spellings of a dimension's units (two letters or more), as a code line may name them: ``size_mib``,
    ``"12 ms"``, ``bytes_moved``."""
    words = {u.lower() for u, (d, _) in UNITS.items() if d == dimension and len(u) > 1} | {dimension.lower()}
    return re.compile(r"(?<![a-z])(?:" + "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
                      + r")(?![a-z])")


_UNIT_WORDS = {d: _unit_words(d) for d in {d for d, _ in UNITS.values()}}


def set_by_code(q: Quantity, code: Index) -> Printed | None:
    """A parameter the code sets: a whole count, or a whole quantity with a unit, of two significant digits or
    more (a decimal in code is a threshold or a figure size, not a parameter the prose would quote). For a
    quantity with a unit, the code's line must name a unit of its dimension (``--competing-h2d-mib 64``,
    ``title=f"... 12 ms"``): a bare 12 in code is as likely a count of steps as a size in bytes."""
    if q.kind not in ("unit", "count") or q.significant < 2 or q.decimals:
        return None
    low, high = _window(q)
    f = q.scale if q.kind == "count" else 1.0  # "67 million" is 67e6 in the code; "64 MiB" is 64 there
    for p in code.find("code", low * f, high * f):
        if q.kind == "count" or _UNIT_WORDS[q.dimension].search(p.context.lower()):
            return p
    return None


# ``--help`` starts with a non-word character, so it sits outside the ``\b`` that the words need ("`nsys profile
# --help`" has no word boundary before its dashes).
SOURCE_WORDS = re.compile(
    r"(?:\b(?:data ?sheets?|documentation|documented|docs|(?:user|programming|tuning|best practices|reference) guide|"
    r"guide|manual|specifications?|spec sheet|white ?paper|paper|release notes|according to|datasheet|"
    r"help text|'s help|'s source|source code)|--help)(?!\w)", re.I)
_CHAPTER_REF = re.compile(r"\b[Cc]hapters?\s+(\d{1,2}(?:(?:,\s*|\s+and\s+|\s+or\s+|\s*,\s*and\s+)\d{1,2})*)")
_DOC_REF = re.compile(r"\{doc\}`[^`]*?(\d{2})__\w+")


def cited_chapters(sentence: str) -> set[str]:
    """Two-digit chapter numbers a sentence names ("chapter 4", "chapters 1 and 5", {doc}`00__setting_up`)."""
    found = set()
    for m in _CHAPTER_REF.finditer(sentence):
        found |= {f"{int(n):02d}" for n in re.findall(r"\d+", m.group(1))}
    found |= set(_DOC_REF.findall(sentence))
    return found


_ARTIFACT_REF = re.compile(r"\bartifacts/[\w./-]*\w")
_FILES: dict[Path, Outputs | None] = {}


def cited_records(sentence: str, root: Path) -> list[Outputs]:
    """The numbers of each committed record the sentence names (``artifacts/capture_run.md``,
    ``artifacts/ch04_h200/transpose.json``): a figure read from one must be in it."""
    found = []
    for ref in _ARTIFACT_REF.findall(sentence):
        path = root / ref
        if path not in _FILES:
            _FILES[path] = None
            if path.is_file() and path.suffix in (".md", ".json", ".txt", ".csv", ".log") and \
                    path.stat().st_size < 5_000_000:
                _FILES[path] = Outputs([list(read_numbers(path.read_text(errors="replace"), ref))])
        if _FILES[path] is not None:
            found.append(_FILES[path])
    return found


def cites_source(sentence: str) -> bool:
    return bool(SOURCE_WORDS.search(sentence)) or "](" in sentence or "http" in sentence


# ---- a notebook's report -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Exemption:
    """A quantity no output prints and no sentence cites, with where it comes from (kept short)."""

    notebook: str  # the notebook's stem, e.g. "06__cnn_training"
    cell: str  # cell id
    quantity: str  # as written, e.g. "6.5 s"; several figures of one sentence separated by "; "
    source: str  # where the figures come from

    @property
    def figures(self) -> list[str]:
        return [one_line(f) for f in self.quantity.split(";") if f.strip()]


@dataclass(frozen=True)
class Finding:
    notebook: str
    cell: str
    quantity: Quantity
    sentence: str
    how: str  # "near", "output", "code", "script", "record", "chapter NN", "source", "exempt", or "" (unmatched)
    detail: str = ""  # the printed number or code literal that matched: [cell] 'text'

    def line(self) -> str:
        return f"{self.notebook}\t{self.cell}\t{self.quantity.shown}\t{self.sentence}"


_CHAPTERS: dict[Path, Outputs] = {}


def chapter_outputs(number: str, notebooks_dir: Path) -> Outputs | None:
    """The outputs of chapter ``number`` ("04"), read once per run."""
    paths = sorted(notebooks_dir.glob(f"{number}__*.ipynb"))
    if not paths:
        return None
    if paths[0] not in _CHAPTERS:
        _CHAPTERS[paths[0]] = read_outputs(json.loads(paths[0].read_text()))
    return _CHAPTERS[paths[0]]


_HEADING = re.compile(r"^#{1,6}[ \t]", re.M)


def sections(nb: dict) -> list[tuple[int, int]]:
    """For each cell, the cells [lo, hi) around it up to the headings before and after it: where its prose
    reads results (a markdown cell with a heading inside it reaches back to the section before)."""
    opens = [i for i, c in enumerate(nb["cells"])
             if c["cell_type"] == "markdown" and _HEADING.search(mask_markdown("".join(c["source"])))]
    out = []
    for i in range(len(nb["cells"])):
        lo = max([j for j in opens if j < i], default=0)
        hi = min([j for j in opens if j > i], default=len(nb["cells"]))
        out.append((lo, hi))
    return out


def tie(q: Quantity, sentence: str, outputs: Outputs, near: Index, code: Index,
        notebooks_dir: Path, scripts: Index | None = None) -> tuple[str, Printed | None]:
    """How the quantity is tied to a source: ("near" | "output" | "code" | "script" | "record" | "chapter NN"
    | "source", what matched), or ("", None)."""
    for how, find in (("near", lambda: printed_near(q, near)),
                      ("output", lambda: printed_as_written(q, outputs.everything)),
                      ("code", lambda: set_by_code(q, code)),
                      ("script", lambda: scripts and set_by_code(q, scripts))):
        hit = find()
        if hit:
            return how, hit
    for record in cited_records(sentence, notebooks_dir.parent):
        hit = printed_near(q, record.everything)
        if hit:
            return "record", hit
    for number in sorted(cited_chapters(sentence)):
        other = chapter_outputs(number, notebooks_dir)
        hit = other and printed_in_chapter(q, other.everything)
        if hit:
            return f"chapter {number}", hit
    if cites_source(sentence):
        return "source", None
    return "", None


_READ: dict[str, tuple[Outputs, Index]] = {}


def _read_cached(nb: dict) -> tuple[Outputs, Index]:
    """read_outputs and code_numbers, once per distinct set of code cells (the tests check a notebook many
    times with one markdown cell changed)."""
    key = json.dumps([(c.get("id"), c.get("source"), c.get("outputs")) for c in nb["cells"]
                      if c["cell_type"] == "code"] + [c.get("id") for c in nb["cells"]])
    if key not in _READ:
        _READ.clear()  # one notebook at a time is enough, and keeps memory flat
        _READ[key] = (read_outputs(nb), code_numbers(nb))
    return _READ[key]


def check(nb: dict, name: str, exemptions: Iterable[Exemption] = (),
          notebooks_dir: Path = NOTEBOOKS_DIR) -> list[Finding]:
    """Every quantity of the notebook's markdown cells, and how (if at all) it is tied to a source."""
    outputs, code = _read_cached(nb)
    exempt = {(e.cell, figure) for e in exemptions if e.notebook == name for figure in e.figures}
    findings = []
    for cell, (lo, hi) in zip(nb["cells"], sections(nb)):
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        masked = mask_markdown(text)
        scripts = script_numbers(text, notebooks_dir.parent)
        for q in extract(text):
            s, e = sentence_bounds(text, masked, q.start)
            sentence = one_line(text[s:e])
            how, hit = tie(q, sentence, outputs, outputs.near(lo, hi), code, notebooks_dir, scripts)
            if not how and (cell["id"], q.text) in exempt:
                how = "exempt"
            detail = f"[{hit.cell}] {hit.text!r}" if hit else ""
            findings.append(Finding(name, cell["id"], q, sentence, how, detail))
    return findings


def unmatched(nb: dict, name: str, exemptions: Iterable[Exemption] = (),
              notebooks_dir: Path = NOTEBOOKS_DIR) -> list[Finding]:
    return [f for f in check(nb, name, exemptions, notebooks_dir) if not f.how]


def check_path(path: Path, exemptions: Iterable[Exemption] = ()) -> list[Finding]:
    return check(json.loads(path.read_text()), path.stem, exemptions, path.parent)


# ---- quantities in words (reported, not failed) -------------------------------------------------------------

WORD_QUANTITIES = re.compile(
    r"\b(?:twice|thrice|half(?:ed|s)?|halves|double[sd]?|triple[sd]?|quadruple[sd]?|"
    r"(?:two|three|four|five|six|seven|eight|nine|ten|a hundred|a thousand|several|many) times|"
    r"(?:an|two|three) orders? of magnitude|orders of magnitude|most of (?:them|it|the)|"
    r"a few (?:nano|micro|milli)?seconds|a few (?:ns|us|µs|ms)|barely|a fraction of|"
    r"(?:a|one|two) (?:third|quarter|fifth|tenth)s?|three quarters|"
    r"(?:much|far|a lot|slightly|a little) (?:faster|slower|longer|shorter|more|less|larger|smaller))\b", re.I)


def word_quantities(nb: dict, name: str) -> list[tuple[str, str, str]]:
    """(cell id, phrase, sentence) for each quantity in words of the notebook's markdown cells."""
    out = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        masked = mask_markdown(text)
        for m in WORD_QUANTITIES.finditer(masked):
            s, e = sentence_bounds(text, masked, m.start())
            out.append((cell["id"], m.group(0), one_line(text[s:e])))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Print each quantity in a notebook's prose that no output of the notebook prints, no code "
                    "sets, no sentence cites and no exemption names (exemptions: tests/test_prose_numbers.py).")
    parser.add_argument("notebooks", nargs="+", type=Path, help="notebooks/NN__name.ipynb ...")
    parser.add_argument("--words", action="store_true", help="also list quantities in words (twice, most of...)")
    parser.add_argument("--explain", action="store_true", help="list every quantity and what matched it")
    parser.add_argument("--no-exemptions", action="store_true", help="ignore the test's exemption list")
    parser.add_argument("--tsv", action="store_true",
                        help="print only the unmatched quantities, one a line: notebook, cell id, quantity, sentence")
    args = parser.parse_args(argv)
    exemptions: tuple[Exemption, ...] = ()
    if not args.no_exemptions:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from test_prose_numbers import EXEMPTIONS  # the one list, kept beside the test

        exemptions = EXEMPTIONS
    total = 0
    for path in args.notebooks:
        if not path.is_file():
            parser.error(f"{path}: no such notebook")
        nb = json.loads(path.read_text())
        findings = check(nb, path.stem, exemptions, path.parent)
        missing = [f for f in findings if not f.how]
        total += len(missing)
        if args.tsv:
            print("\n".join(f.line() for f in missing) if missing else "", end="\n" if missing else "")
            continue
        print(f"== {path.name}: {len(findings)} quantities, {len(missing)} unmatched")
        for f in findings if args.explain else missing:
            tag = f"{f.how} {f.detail}".strip() if f.how else "UNMATCHED"
            print(f"  [{f.cell}] {f.quantity.shown!r} ({tag}): {f.sentence}")
        if args.words:
            words = word_quantities(nb, path.stem)
            print(f"  quantities in words: {len(words)}")
            for cell, phrase, sentence in words:
                print(f"  [{cell}] words {phrase!r}: {sentence}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
