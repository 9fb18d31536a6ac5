"""The streamed reader of large PyTorch profiler traces gives the whole-file reader's tables, and the same report.

Every committed Kineto trace is read both ways; the streamed tables hold a subset of the
columns (the report's), and each of those must equal the whole-file reader's, dtype
included. Read with tiny blocks too, so that every file is cut at many event boundaries.
No timing here: the benchmark is scripts/bench_torch_trace.py (artifacts/tools/).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import gpuprof.torch_profiler.trace as tt
import gpuprof.torch_profiler.trace_stream as ts
from gpuprof.torch_profiler.trace_stream import NotStreamable, read_events

ROOT = Path(__file__).resolve().parents[1]
TRACES = sorted(p for p in [*ROOT.glob("artifacts/ch05/*.json.gz"), *ROOT.glob("artifacts/ch08/*.json.gz"),
                            *ROOT.glob("tests/data/third_party/*.json.gz")] if p.name != "memory_log.json.gz")


def read_trace_stream(path: Path, block: int = 1 << 23) -> tt.Trace:
    got = read_events(path, block=block)
    return tt.Trace(path=path, meta=got.meta, categories=got.categories, _tables=got.tables,
                    thread_names=got.thread_names, process_names=got.process_names)


def _same(full: tt.Trace, streamed: tt.Trace) -> None:
    assert set(streamed._tables) == set(full._tables)
    for kind, t in streamed._tables.items():
        assert set(t.columns) <= set(full._tables[kind].columns), kind
        pd.testing.assert_frame_equal(full._tables[kind][list(t.columns)], t, obj=kind)
    assert streamed.meta == full.meta
    assert streamed.categories == full.categories
    assert streamed.thread_names == full.thread_names
    assert streamed.process_names == full.process_names


def test_traces_found() -> None:
    assert len(TRACES) >= 12


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
@pytest.mark.parametrize("block", [1 << 12, 1 << 24])
def test_streamed_tables_equal_whole_file(path: Path, block: int) -> None:
    _same(tt.read_trace(path, stream=False), read_trace_stream(path, block=block))


def test_streamed_keeps_the_report_columns() -> None:
    t = read_trace_stream(ROOT / "artifacts/ch05/train_steps.json.gz")
    assert {"correlationId", "streamId", "deviceId", "globalTid"} <= set(t.kernels().columns)
    assert "bytes" in t.copies().columns and "text" in t.annotations().columns
    assert "Input Dims" not in t.cpu_ops().columns  # the arguments the report does not read are left out
    assert len(t.kernels()) == len(tt.read_trace(ROOT / "artifacts/ch05/train_steps.json.gz").kernels())


def test_threshold_chooses_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    path = ROOT / "artifacts/ch05/train_steps.json.gz"
    monkeypatch.setattr(tt, "STREAM_ABOVE_BYTES", 0)
    assert "Input Dims" not in tt.read_trace(path).cpu_ops().columns
    monkeypatch.setattr(tt, "STREAM_ABOVE_BYTES", 1 << 40)
    assert "Input Dims" in tt.read_trace(path).cpu_ops().columns


@pytest.mark.parametrize("name", ["train_steps.json.gz", "compiled_64_steps.graphed.json.gz"])
def test_report_identical(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuprof.report import build_pages
    from gpuprof.report.render import html_page, terminal_text

    path = str(ROOT / "artifacts/ch05" / name)
    out = []
    for threshold in (1 << 40, 0):
        monkeypatch.setattr(tt, "STREAM_ABOVE_BYTES", threshold)
        pages = build_pages([path], steps=None, window=None, top=15)
        out.append((terminal_text(pages), html_page(pages, title="t")))
    assert out[0][0] == out[1][0]
    assert out[0][1] == out[1][1]


def test_damaged_files_get_the_whole_file_readers_errors(tmp_path: Path) -> None:
    raw = gzip.decompress((ROOT / "artifacts/ch05/train_steps.json.gz").read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(NotStreamable):
        read_trace_stream(cut, block=1 << 14)
    with pytest.raises(tt.GpuprofError, match="not complete JSON"):
        tt.read_trace(cut, stream=True)
    other = tmp_path / "other.json"
    other.write_text('{"entries": []}')
    with pytest.raises(tt.GpuprofError, match="no 'traceEvents' list"):
        tt.read_trace(other, stream=True)
    gz = tmp_path / "cut.json.gz"
    gz.write_bytes((ROOT / "artifacts/ch05/train_steps.json.gz").read_bytes()[:5000])
    with pytest.raises(tt.GpuprofError, match="damaged or truncated gzip"):
        tt.read_trace(gz, stream=True)


def _flow_trace(path: Path, ids: list) -> Path:
    """A small trace whose launch/kernel pairs are tied by flows with the given ids, one pair per id, in order."""
    import json

    events = []
    for i, fid in enumerate(ids):
        t = 100.0 * i
        events += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": t, "dur": 2.0,
                    "args": {"External id": i}},
                   {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": t + 3, "dur": 1.0,
                    "args": {"device": 0, "stream": 7}},
                   {"ph": "s", "cat": "ac2g", "id": fid, "pid": 1, "tid": 2, "ts": t, "name": "ac2g"},
                   {"ph": "f", "cat": "ac2g", "id": fid, "pid": 0, "tid": 7, "ts": t + 3, "name": "ac2g", "bp": "e"}]
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


@pytest.mark.parametrize("ids", [
    [i for i in range(300)],                                    # integers: one int64 array a block
    [float(i) for i in range(300)],                             # floats (whole: a fractional id breaks both readers)
    [i for i in range(150)] + [float(i) for i in range(150, 300)],  # integer blocks, then float blocks
    [i for i in range(150)] + [f"f{i}" for i in range(150)],    # integer blocks, then strings: the values as written
    [None] + [i for i in range(299)],                           # a missing id
], ids=["int", "float", "int-then-float", "int-then-str", "none"])
def test_flow_ids_of_every_type(ids: list, tmp_path: Path) -> None:
    """Flow ids are kept without a Python object each where a block's are all integers or all floats; the column
    still equals the whole-file reader's, whatever mix of types the blocks hold (4 KiB blocks: many of them)."""
    path = _flow_trace(tmp_path / "flows.json", ids)
    full, streamed = tt.read_trace(path, stream=False), read_trace_stream(path, block=1 << 12)
    _same(full, streamed)
    assert len(streamed.flows()) == 2 * len(ids)
    assert list(map(type, streamed.flows()["id"])) == list(map(type, full.flows()["id"]))  # 5 stays 5, not 5.0


@pytest.mark.parametrize("parts", [
    [np.arange(3), np.arange(3, 5), np.arange(5, 9)],                      # int64 chunks
    [np.array(["a", "b"], dtype=object), np.array(["c"], dtype=object)],   # interned strings
    [np.arange(2), np.array([2.5, 3.0])],                                  # int64 then float64: promoted
    [np.arange(4)],                                                         # one chunk
], ids=["int", "object", "int-float", "one"])
def test_concat_fills_in_order_and_lets_the_chunks_go(parts: list) -> None:
    """The chunks are copied into place in file order (= np.concatenate, dtype included) and taken out of the list
    one by one, so the caller's list no longer holds them: a column is never held twice whole."""
    want = np.concatenate(parts)
    got = ts._concat(parts)
    assert got.dtype == want.dtype
    assert got.tolist() == want.tolist()
    assert parts == []


def test_concat_as_dtype() -> None:
    got = ts._concat([np.arange(2), np.arange(2, 4)], float)
    assert got.dtype == np.float64 and got.tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("values", [
    ["a", "b", "a"],            # every value a str: wrapped in place
    ["a", None, "b"],           # a missing value: converted as before
    ["a", 5, "b"],              # a number among the names: made a str as pandas' astype makes it
], ids=["str", "none", "int"])
def test_strings_same_as_astype(values: list) -> None:
    """:func:`_strings` wraps an all-str object array without a copy; the Series equals pandas' conversion either way."""
    arr = np.array(values, dtype=object)
    want = pd.Series(arr.copy(), dtype=object).astype(pd.StringDtype("python", na_value=np.nan))
    got = ts._strings(arr)
    pd.testing.assert_series_equal(got, want)
    assert np.shares_memory(got.array._ndarray, arr) == all(isinstance(v, str) for v in values)
