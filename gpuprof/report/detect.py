"""What kind of capture a file is, from its first bytes: the name of a file is only a hint.

A capture mailed by a colleague may be called ``trace.txt``, ``profile`` or ``rank0.gz``;
a reader that trusts the suffix reads it wrongly or fails with a parser's message. Each
kind the report reads has a signature of its own:

* an Nsight Systems sqlite export starts with ``SQLite format 3\\0`` (and holds nsys's tables);
* an Nsight Compute report (``.ncu-rep``) starts with ``NVR\\0``;
* an Nsight Systems report (``.nsys-rep``, older ``.qdrep``) starts with ``NVIDIA Tegra
  Profiler Report`` (the name of the tool nsys grew from); it is read through its sqlite
  export, which needs nsys;
* a PyTorch profiler (Kineto) trace is JSON, possibly gzipped, with a ``traceEvents`` list;
* Nsight Compute's CSV (``ncu --csv``, the details or the raw page) starts with the quoted
  header ``"ID","Process ID",...``, possibly after ``==PROF==`` lines.

:func:`capture_kind` returns one of :data:`KINDS` or raises :class:`~gpuprof.errors.GpuprofError`
with one sentence that says what the file is instead (empty, truncated, another format).
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from ..artifacts import stored_file
from ..errors import GpuprofError

__all__ = ["KINDS", "capture_kind", "captures_in", "NotACapture"]

KINDS = ("nsys", "nsys-rep", "ncu", "ncu-csv", "kineto")
_SQLITE = b"SQLite format 3\x00"
_NCU = b"NVR\x00"
_NSYS_REP = b"NVIDIA Tegra Profiler Report"  # the first bytes of every .nsys-rep (seen with nsys 2025.3.1)
_HINT = ("Give an Nsight Systems report (.nsys-rep) or its sqlite export, an Nsight Compute report (.ncu-rep) "
         "or its --csv output, or a PyTorch profiler trace (.json / .json.gz).")


class NotACapture(GpuprofError):
    """A file that is none of the captures the report reads."""


def _head(path: Path, n: int = 4096) -> bytes:
    with path.open("rb") as fh:
        raw = fh.read(n)
    if raw[:2] == b"\x1f\x8b":  # gzip: look at what it holds
        try:
            with gzip.open(path, "rb") as fh:
                return fh.read(n)
        except (OSError, EOFError, zlib.error) as exc:
            raise NotACapture(f"{path} is a damaged or truncated gzip file ({exc}).",
                              "Was it copied before the program finished writing it?") from None
    return raw


def capture_kind(path: str | Path) -> str:
    """``"nsys"`` (sqlite export), ``"nsys-rep"``, ``"ncu"`` (.ncu-rep), ``"ncu-csv"`` or ``"kineto"``."""
    path = stored_file(Path(path)) or Path(path)  # x.sqlite may be committed as x.sqlite.gz
    if not path.exists():
        raise NotACapture(f"{path} does not exist.", "Check the path.")
    if path.is_dir():
        raise NotACapture(f"{path} is a folder.", "Use captures_in() for a folder of captures.")
    if path.stat().st_size == 0:
        raise NotACapture(f"{path} is empty (0 bytes).", "Was the capture interrupted? Capture or export it again.")
    head = _head(path)
    if head.startswith(_SQLITE):
        return "nsys"
    if head.startswith(_NCU):
        return "ncu"
    if head.startswith(_NSYS_REP) or path.suffix in (".nsys-rep", ".qdrep"):
        return "nsys-rep"
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text[:1] == b"[":  # the bare Chrome-trace form: a list of events
        return "kineto"
    if text[:1] == b"{":
        # Kineto writes schemaVersion, deviceProperties and distributedInfo (a few kB) before
        # traceEvents; a JSON file without that key near its start is some other JSON.
        if b'"traceEvents"' in _head(path, 1 << 20):
            return "kineto"
        raise NotACapture(f"{path} is JSON but not a PyTorch profiler trace (no traceEvents list).", _HINT)
    lines = [ln for ln in text.decode("utf-8", errors="replace").splitlines() if ln.strip()]
    body = [ln for ln in lines if not ln.startswith("==")]
    if body and body[0].startswith('"ID","Process ID"'):
        return "ncu-csv"
    if lines and lines[0].startswith("==PROF==") and not body:
        raise NotACapture(f"{path} holds ncu's progress lines but no CSV table.",
                          "Run ncu with --csv (and --page details or --page raw), or give the .ncu-rep.")
    raise NotACapture(f"{path} is not a capture the report reads: it is {_describe(head, lines)}.", _HINT)


def _describe(head: bytes, lines: list[str]) -> str:
    if head[:1] == b"\x80":
        return "a Python pickle (a CUDA memory snapshot? open it in pytorch.org/memory_viz)"
    if head.startswith(b"PK"):
        return "a zip archive"
    if head.lstrip()[:1] == b"<":
        return "HTML or XML"
    if b"\x00" in head[:512]:
        return "binary data of a kind it does not know"
    first = lines[0][:40] if lines else ""
    return f"text starting {first!r}" + (" (CSV, but not ncu's)" if first.count(",") >= 2 else "")


def captures_in(folder: str | Path) -> list[tuple[Path, str]]:
    """Every capture directly in ``folder`` with its kind, by name; files of other kinds are skipped.
    Raises when there is none, saying what the folder holds."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NotACapture(f"{folder} is not a folder.", "Check the path.")
    found, skipped = [], []
    for p in sorted(folder.iterdir()):
        if not p.is_file():
            continue
        if p.suffix in (".nsys-rep", ".qdrep") and p.with_suffix(".sqlite").exists():
            continue  # its export is read instead
        try:
            found.append((p, capture_kind(p)))
        except NotACapture:
            skipped.append(p.name)
    if not found:
        what = f"{len(skipped)} file(s) of other kinds ({', '.join(skipped[:4])}{', ...' if len(skipped) > 4 else ''})" \
            if skipped else "no files"
        raise NotACapture(f"{folder} holds no capture the report reads: {what}.", _HINT)
    return found
