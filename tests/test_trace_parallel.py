"""The parallel reader of large PyTorch profiler traces gives the serial reader's tables, or hands the file to it.

``trace_stream._read_parallel`` cuts the events' text without parsing it, at ``}``, ``,``, a line
break, ``{`` (Kineto's layout), and two worker processes parse the blocks. Every committed Kineto
trace is read both ways (compressed, and as plain text) with tiny blocks, so that each file is cut
many times. Synthetic files hold the awkward layouts: strings that contain the cut's characters, a
list of objects one a line inside an event (a cut there must fail and send the file to the serial
reader), a file on one line (no cut at all: serial), CRLF line ends, a damaged file.
No timing here: the benchmark is scripts/bench_torch_trace.py with scripts/tree_memory.py.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

import gpuprof.torch_profiler.trace as tt
from gpuprof.errors import GpuprofError
from gpuprof.torch_profiler import trace_stream as ts
from gpuprof.torch_profiler.trace_stream import NotStreamable, read_events

ROOT = Path(__file__).resolve().parents[1]
TRACES = sorted(p for p in [*ROOT.glob("artifacts/ch05/*.json.gz"), *ROOT.glob("artifacts/ch08/*.json.gz"),
                            *ROOT.glob("tests/data/third_party/*.json.gz")] if p.name != "memory_log.json.gz")
SMALL = 1 << 12  # 4 KiB blocks: hundreds of cuts in every committed trace


def _trace(got: ts.Streamed, path: Path) -> tt.Trace:
    return tt.Trace(path=path, meta=got.meta, categories=got.categories, _tables=got.tables,
                    thread_names=got.thread_names, process_names=got.process_names)


def _equal(a: ts.Streamed, b: ts.Streamed) -> None:
    """Every table (columns, values, dtypes, the types of an object column's values) and every field equal."""
    assert list(a.tables) == list(b.tables)
    for kind in a.tables:
        pd.testing.assert_frame_equal(a.tables[kind], b.tables[kind], obj=kind)
        for c in a.tables[kind].columns:
            if a.tables[kind][c].dtype == object:
                assert list(map(type, a.tables[kind][c])) == list(map(type, b.tables[kind][c])), (kind, c)
    assert a.meta == b.meta
    assert list(a.categories.items()) == list(b.categories.items())
    assert list(a.thread_names.items()) == list(b.thread_names.items())
    assert list(a.process_names.items()) == list(b.process_names.items())


def _both(path: Path, block: int = SMALL) -> tuple[ts.Streamed, ts.Streamed]:
    return read_events(path, block=block, workers=1), read_events(path, block=block, workers=2)


def test_traces_found() -> None:
    assert len(TRACES) >= 12


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_parallel_equals_serial_on_committed_traces(path: Path, tmp_path: Path) -> None:
    plain = tmp_path / path.name.removesuffix(".gz")
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    for p in (path, plain):
        serial, parallel = _both(p)
        assert serial.reader == "serial"
        assert parallel.reader == "parallel (2 workers)", p.name  # Kineto's layout: no fallback
        _equal(serial, parallel)
    _equal(serial, read_events(plain, block=1 << 24, workers=2))  # one block and the last


def _write(path: Path, events: list[dict], *, sep: str = ",\n", newline: str = "\n", indent: int | None = None) -> Path:
    """A trace written as Kineto lays it out (one event per line group) or otherwise (``sep``, ``indent``)."""
    body = sep.join(json.dumps(e, indent=indent) for e in events)
    text = '{"schemaVersion": 1, "traceEvents": [\n' + body + '\n], "displayTimeUnit": "ms"}\n'
    path.write_bytes(text.replace("\n", newline).encode())
    return path


def _events(n: int, name=lambda i: f"op{i % 7}") -> list[dict]:
    out = []
    for i in range(n):
        t = 10.0 * i
        out += [{"ph": "X", "cat": "cpu_op", "name": name(i), "pid": 1, "tid": 2, "ts": t, "dur": 5.0,
                 "args": {"External id": i}},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": t + 1,
                 "dur": 2.0, "args": {"External id": i, "correlation": i}},
                {"ph": "X", "cat": "kernel", "name": f"k{i % 3}", "pid": 0, "tid": 7, "ts": t + 4, "dur": 1.0,
                 "args": {"device": 0, "stream": 7, "correlation": i}},
                {"ph": "s", "cat": "ac2g", "id": i, "pid": 1, "tid": 2, "ts": t + 1, "name": "ac2g"},
                {"ph": "f", "cat": "ac2g", "id": i, "pid": 0, "tid": 7, "ts": t + 4, "name": "ac2g", "bp": "e"}]
    out.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "python"}})
    return out


def test_strings_holding_the_cut_characters(tmp_path: Path) -> None:
    """Names holding '},' then a line break (escaped: a JSON string cannot hold a raw one) and '}, {' are not cuts."""
    names = ['x"},\n{"ph": "X"', "}, {", '},\r\n  {', "}\n,\n{"]
    path = _write(tmp_path / "strings.json", _events(400, name=lambda i: names[i % 4]))
    assert b"},\n{" in path.read_bytes() and b'},\\n{' in path.read_bytes()
    serial, parallel = _both(path)
    assert parallel.reader == "parallel (2 workers)"
    _equal(serial, parallel)
    assert set(parallel.tables["cpu_op"]["name"]) == set(names)
    tt_full = tt.read_trace(path, stream=False)
    assert list(tt_full.cpu_ops()["name"]) == list(parallel.tables["cpu_op"]["name"])


def test_crlf_line_ends(tmp_path: Path) -> None:
    path = _write(tmp_path / "crlf.json", _events(400), newline="\r\n")
    assert b"},\r\n{" in path.read_bytes()
    serial, parallel = _both(path)
    assert parallel.reader == "parallel (2 workers)"
    _equal(serial, parallel)


def test_one_line_file_goes_to_the_serial_reader(tmp_path: Path) -> None:
    path = _write(tmp_path / "one_line.json", _events(400), sep=", ", newline="")
    assert b"\n" not in path.read_bytes() and len(path.read_bytes()) > 8 * SMALL
    serial, parallel = _both(path)
    assert parallel.reader == "serial (no cut in four blocks)"
    _equal(serial, parallel)


def test_cut_inside_an_event_goes_to_the_serial_reader(tmp_path: Path) -> None:
    """An event whose arguments hold a list of objects one a line, longer than two blocks: a block that ends in that
    stretch ends at a cut inside the event, the block before it does not parse, and the file is read
    by the serial reader instead, with the same tables as the whole-file reader."""
    events = _events(300)
    # 40 objects of about 300 bytes, one a line: three blocks' worth, and fewer than the 64 candidates the serial
    # reader tries before it gives up on a block
    events[500]["args"]["pieces"] = [{"i": i, "pad": "p" * 300} for i in range(40)]
    path = _write(tmp_path / "nested.json", events, indent=1)
    assert b"},\n   {" in path.read_bytes()
    serial, parallel = _both(path)
    assert parallel.reader == "serial (a block does not parse)"
    _equal(serial, parallel)
    full = tt.read_trace(path, stream=False)
    pd.testing.assert_frame_equal(full.kernels()[list(parallel.tables["kernel"].columns)], parallel.tables["kernel"])


def test_damaged_file_gets_the_whole_file_readers_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = gzip.decompress((ROOT / "artifacts/ch05/train_steps.json.gz").read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(NotStreamable):
        read_events(cut, block=SMALL, workers=2)
    monkeypatch.setenv("GPUPROF_READ_WORKERS", "2")
    with pytest.raises(GpuprofError, match="not complete JSON"):
        tt.read_trace(cut, stream=True)


def test_default_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "t.json", _events(10))
    monkeypatch.delenv("GPUPROF_READ_WORKERS", raising=False)
    assert ts.default_workers(path) == 1  # small: not worth starting workers
    monkeypatch.setattr(ts, "PARALLEL_ABOVE_BYTES", 0)
    monkeypatch.setattr(ts.os, "cpu_count", lambda: 2)
    assert ts.default_workers(path) == 2
    monkeypatch.setattr(ts.os, "cpu_count", lambda: 1)
    assert ts.default_workers(path) == 1
    monkeypatch.setenv("GPUPROF_READ_WORKERS", "3")
    assert ts.default_workers(path) == 3
    monkeypatch.setenv("GPUPROF_READ_WORKERS", "two")
    with pytest.raises(GpuprofError, match="not a number"):
        ts.default_workers(path)


def test_report_identical_with_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuprof.report import build_pages
    from gpuprof.report.render import terminal_text

    path = str(ROOT / "artifacts/ch05/train_steps.json.gz")
    monkeypatch.setattr(tt, "STREAM_ABOVE_BYTES", 0)
    out = []
    for workers in ("1", "2"):
        monkeypatch.setenv("GPUPROF_READ_WORKERS", workers)
        out.append(terminal_text(build_pages([path], steps=None, window=None, top=15)))
    assert out[0] == out[1]
