"""Kernel names short enough for a table cell: the function's name and its first template argument.

Why: a demangled name of a PyTorch or cuDNN kernel runs to several hundred characters (seven
lines in the report's top-kernels table), most of it namespaces, functor types and parameter
lists; what a reader recognises is the function and what it was instantiated for
(``vectorized_elementwise_kernel<…, FillFunctor<float>, …>``, ``Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>``).
The HTML page shows this short name and keeps the full one in the cell's ``title`` (on hover)
and in the table's CSV; the tables' DataFrames, the terminal and every comparison keep full names.
Two kernels may share a short name: it is for reading only.
"""

from __future__ import annotations

import re

from .activity_view import compact_name

__all__ = ["short_kernel_name"]

_OPEN, _CLOSE = "<([{", ">)]}"
_LITERAL = re.compile(r"-?\d+(?:\.\d+)?[a-zA-Z]*|true|false")


def _top_level_split(text: str) -> list[str]:
    """``text`` cut at the commas outside any bracket pair."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth = max(depth - 1, 0)
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _first_top_level(text: str, chars: str) -> int:
    """Index of the first of ``chars`` outside brackets (``len(text)`` if none)."""
    depth = 0
    for i, ch in enumerate(text):
        if ch in chars and depth == 0:
            return i
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth = max(depth - 1, 0)
    return len(text)


def _short(text: str, depth: int) -> str:
    s = re.sub(r"^(?:void|const)\s+", "", text.strip())
    s = s[: _first_top_level(s, "(")].strip()  # a parameter list, a lambda's suffix: not the name
    lt = _first_top_level(s, "<")
    name = s[:lt].strip()
    if lt == len(s):
        return name
    gt = s.rfind(">")
    args = _top_level_split(s[lt + 1: gt if gt > lt else len(s)])
    first = next((i for i, a in enumerate(args) if not _LITERAL.fullmatch(a)), None)
    if first is None:  # only numbers: the first of them says most
        shown, first = args[0], 0
    elif depth >= 3:
        shown = "…"
    else:
        shown = _short(args[first], depth + 1)
    inner = ("…, " if first > 0 else "") + shown + (", …" if first < len(args) - 1 else "")
    return f"{name}<{inner}>"


def short_kernel_name(demangled: str) -> str:
    """The function's name (no return type, namespaces or parameters) and its first template argument
    that is not a number, itself shortened the same way; ``…`` marks the arguments left out.

    >>> short_kernel_name("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
    ...                   "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)")
    'vectorized_elementwise_kernel<…, FillFunctor<float>, …>'
    >>> short_kernel_name("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>(T1::Params)")
    'Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>'
    """
    text = str(demangled)
    if not text.strip():
        return text
    return _short(compact_name(text), 0) or text
