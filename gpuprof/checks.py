"""A chapter's verdict, printed and asserted from the same numbers.

A verdict cell prints what it measured and then asserts a claim about it. Written by hand,
the threshold appears twice, once in the sentence ("3.3x the rung before (checked: at
least 1.5x)") and once in the ``assert``, and the two can drift apart. :func:`check` takes
the threshold once, as a bound, and both prints it and tests it::

    check("data on the GPU: {} the rung before", gain5, at_least(1.5), fmt=".1f", unit="x")
    # data on the GPU: 3.3x the rung before (checked: at least 1.5x)

A bound describes itself in the value's format and unit, so a share formatted ``.0%`` is
checked "over 40%", and a ratio formatted ``.2f`` with the unit ``x`` "at least 1.25x".
A bound's number is written with as few decimals as it needs (1.5, not 1.50; 90%, not
90.0%), but never fewer than it needs to be exact, up to three more than the value's.

:func:`check` raises :class:`AssertionError` itself rather than using ``assert``, which
``python -O`` removes, and the error's message is the printed sentence. NaN fails every
bound: a measurement that came out as NaN proves nothing.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Bound", "at_least", "over", "under", "at_most", "between", "equals", "within", "check", "record"]

_SPEC = re.compile(r"(?P<head>[^.]*)(?:\.(?P<digits>\d+))?(?P<kind>[f%])")


def number(x: float, fmt: str = "", unit: str = "") -> str:
    """``x`` in the format ``fmt`` (a format spec such as ``.1f``, ``,.0f`` or ``.0%``) followed by ``unit``.

    Used for a bound's numbers, where trailing zeros say nothing: the fewest decimals that write
    ``x`` exactly, trying up to three more than ``fmt`` asks for, else as many as ``fmt`` asks.
    """
    m = _SPEC.fullmatch(fmt)
    if not m:
        return f"{format(x, fmt or 'g')}{unit}"
    head, kind, digits = m["head"], m["kind"], int(m["digits"] or 6)
    scale = 100 if kind == "%" else 1
    for d in range(digits + 4):
        text = format(x, f"{head}.{d}{kind}")
        if math.isclose(float(text.rstrip("%").replace(",", "")) / scale, x, rel_tol=1e-12, abs_tol=1e-15):
            return text + unit
    return format(x, fmt) + unit


@dataclass(frozen=True)
class Bound:
    """A threshold that a measured value must meet: it tests a value and describes itself in words.

    Made by :func:`at_least`, :func:`over`, :func:`under`, :func:`at_most`, :func:`between`,
    :func:`equals` and :func:`within`. ``worst`` picks, from several values, the one nearest to
    failing (or failing the most): the one a sentence about all of them should show.
    """

    meets: Callable[[float], bool]
    words: Callable[[str, str], str]  # (fmt, unit) -> "at least 1.5x"
    nearest_to_failing: Callable[[list[float]], float]

    def test(self, value: float) -> bool:
        """Whether ``value`` meets the bound; NaN never does."""
        return not math.isnan(value) and bool(self.meets(value))

    def describe(self, fmt: str = "", unit: str = "") -> str:
        """The bound in words, its numbers in the value's format and unit (see :func:`number`)."""
        return self.words(fmt, unit)

    def worst(self, values: list[float]) -> float:
        nan = [v for v in values if math.isnan(v)]
        return nan[0] if nan else self.nearest_to_failing(values)


def at_least(x: float) -> Bound:
    return Bound(lambda v: v >= x, lambda f, u: f"at least {number(x, f, u)}", min)


def over(x: float) -> Bound:
    return Bound(lambda v: v > x, lambda f, u: f"over {number(x, f, u)}", min)


def at_most(x: float) -> Bound:
    return Bound(lambda v: v <= x, lambda f, u: f"at most {number(x, f, u)}", max)


def under(x: float) -> Bound:
    return Bound(lambda v: v < x, lambda f, u: f"under {number(x, f, u)}", max)


def between(lo: float, hi: float) -> Bound:
    """Both ends included, as ``lo <= v <= hi`` and pandas' ``Series.between``."""
    return Bound(lambda v: lo <= v <= hi, lambda f, u: f"between {number(lo, f, u)} and {number(hi, f, u)}",
                 lambda vs: max(vs, key=lambda v: abs(v - (lo + hi) / 2)))


def equals(x: float) -> Bound:
    return Bound(lambda v: v == x, lambda f, u: f"exactly {number(x, f, u)}", lambda vs: max(vs, key=lambda v: abs(v - x)))


def within(target: float, share: float) -> Bound:
    """Within ``share`` of ``target``, relatively: ``abs(v - target) < share * abs(target)``, the edge excluded.

    Written "within 5% of 1": the share as a percentage, the target in the value's format and unit.
    """
    return Bound(lambda v: abs(v - target) < share * abs(target),
                 lambda f, u: f"within {number(share, '.0%')} of {number(target, f, u)}",
                 lambda vs: max(vs, key=lambda v: abs(v - target)))


def _several(value: Any) -> list[Any] | None:
    """Several values (a Series, an array, a list or a tuple) as Python numbers; None for one value."""
    items = value.tolist() if hasattr(value, "tolist") else value  # a numpy or pandas scalar gives one number
    if not isinstance(items, (list, tuple)):
        return None
    if not items:
        raise ValueError("check() was given no values: the sequence is empty")
    return list(items)


def check(claim: str, value: Any, bound: Bound, fmt: str = "", unit: str = "") -> None:
    """Print ``claim`` with ``value`` in it and the bound beside it, then fail unless ``value`` meets the bound.

    ``claim`` holds one ``{}`` where the value goes, written as ``format(value, fmt)`` followed by
    ``unit``, and the sentence ends "(checked: <the bound in the same format and unit>)". In an
    f-string, write the place as ``{{}}``. ``value`` is a number (Python, numpy or pandas) or
    several (a Series, an array, a list or a tuple), each of which must meet the bound; the sentence
    then shows the one nearest to failing, e.g. a Series' largest value for :func:`under`:
    ``check("at most {} of the time hidden on a rank", shares, under(0.25), fmt=".0%")``.

    Returns None, not the value, so that a check on a cell's last line adds no ``Out[]``.
    Raises AssertionError, whose message is the sentence, when a value does not meet the bound.
    """
    if claim.count("{}") != 1:
        raise ValueError(f"the claim needs exactly one {{}} for the value: {claim!r}")
    many = _several(value)
    values = many if many is not None else [value]
    shown = bound.worst([float(v) for v in values]) if many is not None else value
    sentence = f"{claim.replace('{}', format(shown, fmt) + unit)} (checked: {bound.describe(fmt, unit)})"
    print(sentence)
    ok = all(bound.test(float(v)) for v in values)
    _log_check(sentence if many is None else f"{sentence}\tvalues: " + ", ".join(format(v, fmt) + unit for v in values), ok)
    if not ok:
        raise AssertionError(f"failed: {sentence}")


# Where check() also appends every verdict, when set: strict nbval masks every number of a compared
# output, so a passing run would otherwise keep none of the values its checks measured, and a bound
# could only be set from the runs that failed (scripts/gpu_nbval.py sets it, one file per notebook).
CHECK_LOG_ENV = "GPUPROF_CHECK_LOG"


def record(text: str) -> None:
    """Print ``text`` and append it to the check log as a note (not a verdict).

    For the facts that explain a verdict but are not one (how many steps a profiler disturbed, the
    times a share is made of): a cell whose output is not compared prints them, and strict nbval would
    keep nothing of them, so a later bound could only be guessed from the verdicts."""
    print(text)
    _log_line("".join(f"note\t{line}\n" for line in text.splitlines()).rstrip("\n"), "record()", 3)


def _log_check(sentence: str, ok: bool) -> None:
    """Append one verdict to the log; a log that cannot be written is a warning, never the check's failure."""
    _log_line(f"{'ok' if ok else 'FAILED'}\t{sentence}", "check()", 4)


def _log_line(line: str, caller: str, stacklevel: int) -> None:
    """Append ``line`` (one or more lines) to the log; ``caller`` names the public function in the warning, and
    ``stacklevel`` points the warning at that function's caller."""
    path = os.environ.get(CHECK_LOG_ENV)
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{line}\n")
    except OSError as exc:
        warnings.warn(f"{caller} could not log to {path} ({exc}); the check itself is unaffected", stacklevel=stacklevel)
