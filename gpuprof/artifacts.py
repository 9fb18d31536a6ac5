"""Where captures live, what produced them, and the fallback to the course's reference captures.

Two folders, one per chapter inside each:

* ``artifacts/<chapter>/`` holds the **reference captures** committed with the course:
  small exports made on a named GPU by ``make capture``, each described in that
  folder's ``provenance.json`` (GPU, driver, CUDA, tool versions, exact command, date).
* the **output folder** (``captures/`` by default, or ``GPUPROF_OUTPUT_DIR``) holds what
  the reader's own machine captured. ``make capture`` points it at ``artifacts/`` to
  regenerate the references.

:func:`find_capture` prefers this machine's capture and falls back to the reference,
and its :meth:`FoundCapture.describe` says which one the reader is looking at.
Writes are atomic (temporary file, then rename) and never silently replace an
earlier capture: pass ``overwrite=True`` or set ``GPUPROF_OVERWRITE=1``.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from .backend import describe_machine, gpu_available
from .errors import CaptureExists, GpuprofError, ReferenceMissing

__all__ = [
    "REPO_ROOT", "reference_dir", "output_dir", "chapter_output", "overwrite_allowed", "atomic_write_bytes",
    "save_json", "record_file", "append_to_record", "load_provenance", "find_capture", "FoundCapture", "git_commit",
    "measure_or_reference", "stored_file", "gzip_reference", "gunzipped_copy",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
PROVENANCE_FILE = "provenance.json"
# Exports the course commits gzipped (about a quarter of the size): ``x.sqlite.gz`` stands for ``x.sqlite``, and the
# readers (gpuprof.nsys.sqlite.open_export) open either; ``x.ncu-rep.gz`` likewise for gpuprof.ncu.report's readers
# (an ncu report compresses to a fifth or less).
GZIPPED_KINDS = (".sqlite", ".ncu-rep")


def reference_dir() -> Path:
    """The committed reference captures (``GPUPROF_ARTIFACTS`` overrides, for tests)."""
    return Path(os.environ.get("GPUPROF_ARTIFACTS", REPO_ROOT / "artifacts"))


def output_dir() -> Path:
    """Where this machine's captures go (``GPUPROF_OUTPUT_DIR``, default ``captures/``).

    A relative ``GPUPROF_OUTPUT_DIR`` is taken from the repository's root, not the working
    directory: a notebook's kernel runs in ``notebooks/``, so ``GPUPROF_OUTPUT_DIR=artifacts``
    would otherwise write a stray ``notebooks/artifacts/`` from a notebook and the real
    ``artifacts/`` from a script.
    """
    out = Path(os.environ.get("GPUPROF_OUTPUT_DIR", REPO_ROOT / "captures"))
    return out if out.is_absolute() else REPO_ROOT / out


def chapter_output(chapter: str) -> Path:
    """This machine's capture folder for one chapter, created on demand."""
    path = output_dir() / chapter
    path.mkdir(parents=True, exist_ok=True)
    return path


def overwrite_allowed(overwrite: bool = False) -> bool:
    return overwrite or os.environ.get("GPUPROF_OVERWRITE", "") == "1"


def git_commit() -> str | None:
    """The commit the capture was made from (``GPUPROF_GIT_COMMIT`` wins: the GPU
    machine receives a copy of the tree without ``.git``)."""
    if os.environ.get("GPUPROF_GIT_COMMIT"):
        return os.environ["GPUPROF_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def atomic_write_bytes(path: Path, data: bytes, *, overwrite: bool = False) -> Path:
    """Write ``data`` to ``path`` through a temporary file and a rename.

    A crash or a full disk leaves the earlier file intact; an existing file is kept
    unless overwriting was asked for.
    """
    if path.exists() and not overwrite_allowed(overwrite):
        raise CaptureExists(f"{path} already exists and would be overwritten.",
                            "Pass overwrite=True (or set GPUPROF_OVERWRITE=1), or move the earlier capture away.")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; captures are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def record_file(chapter: str, filename: str, command: Sequence[str] | str,
                tools: dict[str, str] | None = None, note: str | None = None) -> dict[str, Any]:
    """Add (or refresh) one file's entry in the chapter's ``provenance.json``.

    The machine description and tool versions are written with every entry, so a
    folder whose files came from two runs says so instead of mixing them silently.
    ``note``: what the command alone does not say (a file derived from another, say).
    """
    folder = chapter_output(chapter)
    prov_path, prov = _read_provenance(chapter)
    entry: dict[str, Any] = {
        "captured_at": _now(),
        "command": list(command) if not isinstance(command, str) else command,
        "machine": describe_machine().as_dict(),
        "tools": dict(tools or {}),
        "git_commit": git_commit(),
    }
    if note:
        entry["note"] = note
    target = folder / filename
    if target.exists():
        entry["bytes"] = target.stat().st_size
    prov["files"][filename] = entry
    _write_provenance(prov_path, prov)
    return entry


def append_to_record(chapter: str, filename: str, command: Sequence[str] | str) -> dict[str, Any]:
    """A file that a later command appended to (a log written in parts): its entry keeps the first command, machine
    and commit, and gains a line in its note naming the later command, this machine and commit; the byte count is
    refreshed. Without an entry yet, the file is recorded as :func:`record_file` records it. Why not replace the
    entry: the file is a concatenation, and an entry for its last part alone would misdescribe the rest."""
    folder = chapter_output(chapter)
    prov_path, prov = _read_provenance(chapter)
    entry = prov["files"].get(filename)
    if entry is None:
        return record_file(chapter, filename, command)
    shown = command if isinstance(command, str) else " ".join(command)
    part = f"then {shown} appended on {describe_machine().summary()}, commit {git_commit()}, {_now()}"
    entry["note"] = f"{entry['note']}; {part}" if entry.get("note") else part
    if (folder / filename).exists():
        entry["bytes"] = (folder / filename).stat().st_size
    _write_provenance(prov_path, prov)
    return entry


def _read_provenance(chapter: str) -> tuple[Path, dict[str, Any]]:
    """This machine's provenance file for the chapter and its contents (an empty one where none exists yet)."""
    path = chapter_output(chapter) / PROVENANCE_FILE
    return path, json.loads(path.read_text()) if path.exists() else {"chapter": chapter, "files": {}}


def _write_provenance(path: Path, prov: dict[str, Any]) -> None:
    atomic_write_bytes(path, (json.dumps(prov, indent=2, sort_keys=True) + "\n").encode(), overwrite=True)


def save_json(chapter: str, filename: str, data: Any, *, command: Sequence[str] | str,
              tools: dict[str, str] | None = None, overwrite: bool = False) -> Path:
    """Save a result as JSON in this machine's chapter folder, with its provenance."""
    path = chapter_output(chapter) / filename
    atomic_write_bytes(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(), overwrite=overwrite)
    record_file(chapter, filename, command, tools)
    return path


def load_provenance(folder: Path) -> dict[str, Any]:
    """Read a chapter folder's ``provenance.json``; a broken one is an error, not an empty dict."""
    path = folder / PROVENANCE_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ReferenceMissing(f"{path} is missing, so the captures beside it have no provenance.",
                               "Regenerate the folder with `make capture` on a GPU machine.") from None
    except json.JSONDecodeError as exc:
        raise GpuprofError(f"{path} is not valid JSON ({exc}).", "Restore it with `git checkout -- artifacts/`.") from None


@dataclass(frozen=True)
class FoundCapture:
    """A capture file plus where it came from."""

    path: Path
    source: str  # "this machine" or "reference"
    provenance: dict[str, Any]

    @property
    def machine(self) -> dict[str, Any]:
        return self.provenance.get("machine", {})

    def json(self) -> Any:
        """The file's JSON (a script's results, a trace), the one way every reader opens a found capture;
        a ``.gz`` file (the course commits its Kineto traces as ``.json.gz``) is gunzipped first."""
        raw = self.path.read_bytes()
        return json.loads(gzip.decompress(raw) if self.path.suffix == ".gz" else raw)

    def describe(self) -> str:
        """A sentence for the reader: whose numbers these are."""
        m = self.machine
        where = m.get("gpu_name") or "a CPU-only machine"
        if m.get("driver_version"):
            where += f", driver {m['driver_version']}"
        date = str(self.provenance.get("captured_at", "?"))[:10]
        rel = _relative(self.path)
        if self.source == "reference":
            return f"Using the course's reference capture {rel}, made on {where} on {date}."
        return f"Using this machine's capture {rel}, made on {where} on {date}."


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def stored_file(path: Path) -> Path | None:
    """``path`` if it exists, else its gzipped copy (``x.sqlite.gz`` for ``x.sqlite``), else None."""
    if path.exists():
        return path
    gz = path.with_name(path.name + ".gz")
    if path.suffix in GZIPPED_KINDS and gz.exists():
        return gz
    return None


def gunzipped_copy(path: Path) -> Path:
    """A gzipped capture (``x.sqlite.gz``, ``x.ncu-rep.gz``) decompressed once into a cache folder, keyed by the
    file's path, size and time, because SQLite and ncu_report open only plain files. The copy keeps the inner
    suffix (``x-<key>.sqlite``); ``GPUPROF_CACHE_DIR`` overrides the folder (default: the temp dir's
    ``gpuprof-exports``)."""
    import hashlib

    if not path.exists():
        raise GpuprofError(f"{path} does not exist.", "Check the path.")
    if path.suffix != ".gz":
        raise GpuprofError(f"{path} is not a .gz file.", "Give the gzipped capture, or open the plain file directly.")
    inner = Path(path.name[:-len(".gz")])
    st = path.stat()
    key = hashlib.sha1(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    cache = Path(os.environ.get("GPUPROF_CACHE_DIR") or Path(tempfile.gettempdir()) / "gpuprof-exports")
    target = cache / f"{inner.stem}-{key}{inner.suffix}"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.partial")
    try:
        with gzip.open(path, "rb") as src, tmp.open("wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
    except (OSError, EOFError) as exc:
        tmp.unlink(missing_ok=True)
        raise GpuprofError(f"{path} is not a readable gzip file ({exc}).", "Re-export and gzip it again.") from None
    os.replace(tmp, target)
    return target


def gzip_reference(path: Path) -> Path:
    """Replace a reference export by its gzipped copy and move its provenance entry to the new name.

    ``make capture`` writes plain exports into ``artifacts/``; the course commits the sqlite ones
    gzipped, which keeps the tree small enough to travel to a GPU machine (see tests/test_artifacts.py).
    """
    import gzip
    import shutil

    folder = path.parent
    prov = load_provenance(folder)
    entry = prov.get("files", {}).pop(path.name, None)
    if entry is None:
        raise GpuprofError(f"{path} has no entry in {folder / PROVENANCE_FILE}.", "Record it before gzipping it.")
    target = path.with_name(path.name + ".gz")
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        with path.open("rb") as src, gzip.GzipFile(tmp, "wb", compresslevel=9, mtime=0) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    entry["stored"] = f"gzip -9 {path.name} ({entry.get('bytes', path.stat().st_size):,} bytes before)"
    entry["bytes"] = target.stat().st_size
    prov["files"][target.name] = entry
    atomic_write_bytes(folder / PROVENANCE_FILE, (json.dumps(prov, indent=2, sort_keys=True) + "\n").encode(),
                       overwrite=True)
    path.unlink()
    return target


def find_capture(chapter: str, filename: str, *, prefer: str = "this machine") -> FoundCapture:
    """Find ``filename`` for ``chapter``: this machine's capture first, else the reference.

    ``prefer="reference"`` skips this machine's captures (used where the book must
    show the committed numbers whatever the reader has captured).
    """
    candidates: list[tuple[str, Path]] = [("reference", reference_dir() / chapter)]
    live = output_dir() / chapter
    if prefer == "this machine" and live.resolve() != candidates[0][1].resolve():
        candidates.insert(0, ("this machine", live))
    elif prefer == "this machine":
        candidates = [("this machine", live)]
    for source, folder in candidates:
        path = stored_file(folder / filename)
        if path is not None:
            entry = load_provenance(folder).get("files", {}).get(path.name)
            if entry is None:
                raise GpuprofError(f"{path} exists but {folder / PROVENANCE_FILE} does not describe it.",
                                   "Regenerate it with `make capture`, which records every file it writes.")
            return FoundCapture(path, source, entry)
    raise ReferenceMissing(f"No capture named {filename} for {chapter}: neither this machine's "
                           f"({live}) nor the course's reference ({reference_dir() / chapter}).",
                           "Restore the reference with `git checkout -- artifacts/`, or capture it on a GPU machine.")


def measure_or_reference(chapter: str, filename: str, measure: Callable[[], Any], *,
                         command: Sequence[str] | str, live: bool | None = None) -> FoundCapture:
    """Measure on this machine's GPU and keep the result; in any case return the capture to show.

    Many cells of the course measure something with a GPU, save it as JSON with its
    provenance, and then read whichever capture exists: this machine's, else the course's
    reference. Written out, that is a ``LIVE`` switch, a ``try``/``except``, a save and a
    find in every such cell, which buries the one line a reader came for (the call that
    measures). Here it is once:

    * ``live`` (default: whether a GPU is usable here) false: nothing runs; the
      reference is returned, as on a CPU-only machine.
    * otherwise ``measure()`` runs and its JSON-serialisable result is saved as
      ``<chapter>/<filename>`` in this machine's output folder with ``command`` as its
      provenance, replacing this machine's earlier capture of the same name.
    * a :class:`GpuprofError` from ``measure`` (a missing tool, counters not permitted, a
      script that failed) is reported in one line, and the latest capture found is
      returned instead, so the chapter reads on. Any other exception is a bug and raises.
    * ``GPUPROF_STRICT=1`` (set by the course's own GPU runs, ``scripts/capture_all.py`` and
      ``scripts/gpu_nbval.py``) makes that error raise too: a capture run must not pass
      with a measurement that silently fell back to the old reference.
    """
    if gpu_available() if live is None else live:
        try:
            save_json(chapter, filename, measure(), command=command, overwrite=True)
        except GpuprofError as exc:
            if os.environ.get("GPUPROF_STRICT", "") == "1":
                raise
            print(f"Could not measure here: {exc}")
    return find_capture(chapter, filename)
