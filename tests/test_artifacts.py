import json
from pathlib import Path

import pytest

from gpuprof import artifacts
from gpuprof.artifacts import (atomic_write_bytes, find_capture, load_provenance, measure_or_reference, record_file,
                               save_json)
from gpuprof.errors import CaptureExists, GpuprofError, ReferenceMissing

REF = artifacts.REPO_ROOT / "artifacts"


def test_save_then_find_this_machines_capture(isolated_dirs):
    out, _ = isolated_dirs
    path = save_json("chX", "fig.json", {"a": 1}, command=["python", "make_fig.py"], tools={"nsys": "2025.3.1.0"})
    assert path == out / "chX" / "fig.json"
    found = find_capture("chX", "fig.json")
    assert found.source == "this machine" and found.json() == {"a": 1}
    assert found.provenance["command"] == ["python", "make_fig.py"]
    assert found.provenance["tools"] == {"nsys": "2025.3.1.0"}
    assert "Using this machine's capture" in found.describe()


def test_falls_back_to_the_reference_and_says_so(isolated_dirs):
    _, ref = isolated_dirs
    (ref / "chX").mkdir()
    (ref / "chX" / "k.csv").write_text("x\n")
    prov = {"chapter": "chX", "files": {"k.csv": {"captured_at": "2026-11-21T10:00:00Z",
            "machine": {"gpu_name": "NVIDIA H200", "driver_version": "580.159.04"}, "command": "ncu ..."}}}
    (ref / "chX" / "provenance.json").write_text(json.dumps(prov))
    found = find_capture("chX", "k.csv")
    assert found.source == "reference"
    text = found.describe()
    assert text.startswith("Using the course's reference capture ") and text.endswith(
        "k.csv, made on NVIDIA H200, driver 580.159.04 on 2026-11-21.")


def test_missing_everywhere_is_one_clear_error(isolated_dirs):
    with pytest.raises(ReferenceMissing, match="No capture named nope.json for chX"):
        find_capture("chX", "nope.json")


def test_a_file_without_provenance_is_not_used_silently(isolated_dirs):
    _, ref = isolated_dirs
    (ref / "chX").mkdir()
    (ref / "chX" / "k.csv").write_text("x\n")
    with pytest.raises(ReferenceMissing, match="provenance.json is missing"):
        find_capture("chX", "k.csv")
    (ref / "chX" / "provenance.json").write_text("{not json")
    with pytest.raises(GpuprofError, match="not valid JSON"):
        load_provenance(ref / "chX")


def test_atomic_write_never_overwrites_silently(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUPROF_OVERWRITE", raising=False)
    target = tmp_path / "a.json"
    atomic_write_bytes(target, b"one")
    with pytest.raises(CaptureExists):
        atomic_write_bytes(target, b"two")
    assert target.read_bytes() == b"one"
    atomic_write_bytes(target, b"two", overwrite=True)
    assert target.read_bytes() == b"two"
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"], "no temporary files left behind"


def test_record_keeps_entries_for_other_files(isolated_dirs):
    out, _ = isolated_dirs
    (out / "chY").mkdir()
    (out / "chY" / "a.sqlite").write_bytes(b"x" * 10)
    record_file("chY", "a.sqlite", "nsys profile ...")
    record_file("chY", "b.csv", "ncu ...")
    prov = load_provenance(out / "chY")
    assert set(prov["files"]) == {"a.sqlite", "b.csv"}
    assert prov["files"]["a.sqlite"]["bytes"] == 10


def _reference(ref, chapter="chM", filename="m.json", data=None):
    (ref / chapter).mkdir()
    (ref / chapter / filename).write_text(json.dumps(data or {"from": "reference"}))
    prov = {"chapter": chapter, "files": {filename: {"captured_at": "2026-11-21T10:00:00Z",
            "machine": {"gpu_name": "NVIDIA H100 80GB HBM3"}, "command": "the reference run"}}}
    (ref / chapter / "provenance.json").write_text(json.dumps(prov))


def test_measure_or_reference_without_a_gpu_runs_nothing(isolated_dirs):
    _, ref = isolated_dirs
    _reference(ref)
    ran = []
    found = measure_or_reference("chM", "m.json", lambda: ran.append(1), command="x", live=False)
    assert ran == [] and found.source == "reference"
    assert found.json() == {"from": "reference"}


def test_measure_or_reference_saves_what_it_measured(isolated_dirs):
    out, ref = isolated_dirs
    _reference(ref)
    (out / "chM").mkdir()
    (out / "chM" / "m.json").write_text("{}")  # an earlier capture on this machine is replaced
    (out / "chM" / "provenance.json").write_text(json.dumps({"chapter": "chM", "files": {"m.json": {}}}))
    found = measure_or_reference("chM", "m.json", lambda: {"rows": [1, 2]}, command="python measure.py", live=True)
    assert found.source == "this machine" and found.path == out / "chM" / "m.json"
    assert found.json() == {"rows": [1, 2]}
    assert found.provenance["command"] == "python measure.py"


def test_measure_or_reference_reports_a_tool_error_and_shows_the_reference(isolated_dirs, capsys, monkeypatch):
    out, ref = isolated_dirs
    monkeypatch.delenv("GPUPROF_STRICT", raising=False)
    _reference(ref)

    def fails():
        raise GpuprofError("ncu is not on PATH.", "Install Nsight Compute.")

    found = measure_or_reference("chM", "m.json", fails, command="x", live=True)
    assert found.source == "reference"
    printed = capsys.readouterr().out
    assert printed.startswith("Could not measure here: ncu is not on PATH.") and "Traceback" not in printed
    assert not (out / "chM" / "m.json").exists()


def test_measure_or_reference_in_the_courses_own_gpu_runs_raises(isolated_dirs, monkeypatch):
    _, ref = isolated_dirs
    _reference(ref)
    monkeypatch.setenv("GPUPROF_STRICT", "1")

    def fails():
        raise GpuprofError("ncu is not on PATH.")

    with pytest.raises(GpuprofError, match="ncu is not on PATH"):
        measure_or_reference("chM", "m.json", fails, command="x", live=True)


def test_measure_or_reference_lets_a_bug_raise(isolated_dirs):
    _, ref = isolated_dirs
    _reference(ref)
    with pytest.raises(ZeroDivisionError):
        measure_or_reference("chM", "m.json", lambda: 1 / 0, command="x", live=True)


# --- the committed reference captures -------------------------------------------------

def reference_files():
    nested = [p for p in REF.glob("ch*/*/*") if (p.parent / "provenance.json").is_file()]  # e.g. ch13/gpu4, not ch10/cpu
    return sorted(p for p in [*REF.glob("ch*/*"), *nested] if p.is_file() and p.name != "provenance.json"
                  and p.suffix not in (".log", ".nsys-rep"))


def test_every_reference_capture_has_gpu_provenance():
    files = reference_files()
    assert files, "artifacts/ holds no reference captures"
    for path in files:
        if path.suffix == ".ncu-rep":  # the raw report behind saxpy_sol.csv
            continue
        entry = load_provenance(path.parent)["files"].get(path.name)
        assert entry, f"{path} has no provenance entry"
        assert entry["machine"]["device"] == "cuda" and entry["machine"]["gpu_name"].startswith("NVIDIA")
        assert entry["machine"]["driver_version"] and entry["command"] and entry["captured_at"]


def test_reference_captures_stay_small():
    for path in reference_files():
        assert path.stat().st_size < 2 * 2**20, f"{path} is over 2 MB: filter or export less"


def test_the_tree_still_fits_the_gpu_machines_carry_limit():
    """The course's device tool copies the working tree to the GPU machine with at most 64 MiB in all, wheels
    for nbval's kernel included (about 10 MiB): past 54 MiB of tracked files no strict GPU check can run."""
    import subprocess

    listed = subprocess.run(["git", "ls-files", "-z"], cwd=artifacts.REPO_ROOT, capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    paths = [artifacts.REPO_ROOT / p for p in listed.stdout.decode().split("\0") if p]
    total = sum(p.stat().st_size for p in paths if p.is_file())
    assert total < 54 * 2**20, f"tracked files take {total / 2**20:.1f} MiB: shrink or gzip captures under artifacts/"


def test_a_gzipped_reference_is_found_under_its_plain_name_and_read(isolated_dirs, monkeypatch, tmp_path):
    """The course commits its sqlite exports gzipped: gzip_reference packs one and moves its provenance entry,
    find_capture answers for the plain name with the .gz (the page names the file that is there), and the
    nsys readers open either name."""
    import gzip
    import sqlite3
    from contextlib import closing

    from gpuprof.artifacts import gzip_reference, stored_file
    from gpuprof.nsys import sqlite as ns

    monkeypatch.setenv("GPUPROF_CACHE_DIR", str(tmp_path / "cache"))
    out, _ = isolated_dirs
    export = out / "chX" / "run.sqlite"
    export.parent.mkdir()
    with sqlite3.connect(export) as con:
        con.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
        con.execute("INSERT INTO StringIds VALUES (1, 'step_0')")
    con.close()
    raw = export.read_bytes()
    record_file("chX", "run.sqlite", "nsys export --type sqlite -o run.sqlite run.nsys-rep")
    packed = gzip_reference(export)
    assert packed.name == "run.sqlite.gz" and not export.exists() and gzip.decompress(packed.read_bytes()) == raw
    entry = load_provenance(out / "chX")["files"]
    assert "run.sqlite" not in entry and entry["run.sqlite.gz"]["stored"].startswith("gzip -9 run.sqlite (")
    assert stored_file(export) == packed and stored_file(out / "chX" / "other.sqlite") is None
    found = find_capture("chX", "run.sqlite")
    assert found.path == packed and "run.sqlite.gz" in found.describe()
    with closing(ns.open_export(export)) as con:  # the plain name, which no longer exists
        assert con.execute("SELECT value FROM StringIds").fetchall() == [("step_0",)]
    with pytest.raises(GpuprofError, match="has no entry"):
        (out / "chX" / "loose.sqlite").write_bytes(raw)
        gzip_reference(out / "chX" / "loose.sqlite")


def test_a_relative_output_folder_is_taken_from_the_repository_root(monkeypatch, tmp_path):
    """GPUPROF_OUTPUT_DIR=artifacts means the repository's artifacts/ from a notebook's kernel (cwd notebooks/) too."""
    from gpuprof.artifacts import REPO_ROOT, output_dir

    monkeypatch.chdir(REPO_ROOT / "notebooks")
    monkeypatch.setenv("GPUPROF_OUTPUT_DIR", "artifacts")
    assert output_dir() == REPO_ROOT / "artifacts"
    monkeypatch.setenv("GPUPROF_OUTPUT_DIR", str(tmp_path))
    assert output_dir() == tmp_path


def test_a_found_captures_json_is_read_plain_or_gzipped(tmp_path):
    import gzip

    plain, packed = tmp_path / "r.json", tmp_path / "trace.json.gz"
    plain.write_text(json.dumps({"rows": [1, 2]}))
    packed.write_bytes(gzip.compress(json.dumps({"traceEvents": []}).encode()))
    assert artifacts.FoundCapture(plain, "reference", {}).json() == {"rows": [1, 2]}
    assert artifacts.FoundCapture(packed, "reference", {}).json() == {"traceEvents": []}


def test_shown_path_hides_the_machines_folders():
    """Transcripts name files relative to the repository, temporary files by name: no machine path in the book."""
    import tempfile

    from gpuprof.artifacts import REPO_ROOT
    from gpuprof.cli import shown_path

    assert shown_path(REPO_ROOT / "artifacts" / "ch05" / "x.json.gz") == "artifacts/ch05/x.json.gz"
    tmp_file = Path(tempfile.gettempdir()) / "tmpab12cd" / "train_run.json"
    assert shown_path(tmp_file) == "train_run.json (in a temporary folder)"
    assert shown_path("/opt/elsewhere/y.json") == "/opt/elsewhere/y.json"
