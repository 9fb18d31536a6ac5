"""The report on an nsys export read in passes (gpuprof.report.lean_nsys, issue 38 item 6) is the report read
whole: the same terminal text, facts, tables (values and dtypes) and figures, on every committed export it
covers (with their own step rule, and with steps switched off so that it covers more of them) and on small
exports built here to hit its edges: passes of a few rows, rows out of time order, a GPU that lags the CPU by
many launches, calls that share a correlation id; and its packed reading (rows outside the sampled ranges, NULLs,
a local merge of rows out of time order) against SQLite's own answers. Its time and memory are measured as a whole
process on a 20 million-kernel export (artifacts/tools/bench_torch_trace_big.txt), never here."""

import shutil
import sqlite3

import numpy as np
import pandas as pd
import pytest

from gpuprof.artifacts import REPO_ROOT
from gpuprof.nsys import sqlite as ns
from gpuprof.nsys import stats
from gpuprof.report import build_pages, load
from gpuprof.report import lean_nsys as ln
from gpuprof.report.render import terminal_text
from gpuprof.report.timeline_page import timeline_page

EXPORTS = sorted(p for p in (REPO_ROOT / "artifacts").rglob("*.sqlite.gz"))
NO_STEPS = "(?!x)x"  # a --steps pattern no range matches: the page of the whole capture, without steps
TRANSFER = REPO_ROOT / "artifacts" / "ch01" / "transfer.sqlite"  # kernels, 300 copies, NVTX ranges, no steps


def _signature(page) -> list:
    out = [terminal_text([page]), repr(list(page.facts.items()))]
    for b in page.blocks:
        out.append(f"{b.heading}|{b.text}|{b.note}")
        if b.table is not None:
            out.append(b.table.to_csv() + repr(b.table.dtypes.to_dict()))
        if b.png:
            out.append(b.png)
    return out


def _both(path, steps=None):
    """(in-memory page, lean page), or (page, None) where the lean reader does not cover the export."""
    whole = timeline_page(load(path, "nsys", steps=steps))
    try:
        return whole, timeline_page(ln.lean_view(path, steps))
    except ln.Unsupported:
        return whole, None


def _assert_same(a, b):
    sa, sb = _signature(a), _signature(b)
    assert len(sa) == len(sb)
    for x, y in zip(sa, sb):
        assert x == y


@pytest.mark.parametrize("steps", [None, NO_STEPS], ids=["own-steps", "no-steps"])
def test_the_lean_page_is_the_whole_page_on_every_committed_export(steps):
    covered = 0
    for path in EXPORTS:
        whole, lean = _both(path, steps)
        if lean is not None:
            _assert_same(whole, lean)
            covered += 1
    # 9 exports have no steps of their own; with steps off, all but the multi-GPU, NCCL, kernel-less ones and one
    # whose kernels' correlation ids two calls share (ch07/backtraces: the in-memory merge pairs each with both)
    assert covered >= (9 if steps is None else 39)


def _copy(tmp_path, name="x.sqlite"):
    target = tmp_path / name
    shutil.copy(ns.ensure_sqlite(TRANSFER), target)
    return target


def test_passes_of_a_few_rows_and_groups_of_a_few_names_change_nothing(tmp_path, monkeypatch):
    path = _copy(tmp_path)
    whole = timeline_page(load(path, "nsys"))
    monkeypatch.setattr(ln, "CHUNK_ROWS", 97)  # many passes' steps, a union piece and a gap across each boundary
    monkeypatch.setattr(ln, "GROUP_ROWS", 50)  # groups of a few names; the larger names by pandas too, here
    monkeypatch.setattr(ln, "_one_group", lambda code, v: stats.group_stats(np.full(len(v), code), v))
    _assert_same(whole, timeline_page(ln.lean_view(path)))


def test_a_name_with_more_rows_than_a_group_gives_the_same_page(tmp_path, monkeypatch):
    """Names with more than GROUP_ROWS rows are taken alone on arrays (_one_group): every number as pandas gives
    it but the standard deviation, two-pass against pandas' one-pass Welford, within 1e-12 of it; the page's text
    is the same."""
    path = _copy(tmp_path)
    whole = timeline_page(load(path, "nsys"))
    monkeypatch.setattr(ln, "GROUP_ROWS", 50)
    lean = timeline_page(ln.lean_view(path))
    assert terminal_text([whole]) == terminal_text([lean])
    for a, b in zip(whole.blocks, lean.blocks):
        assert a.heading == b.heading
        if a.table is not None:
            pd.testing.assert_frame_equal(a.table, b.table, check_exact=False, rtol=1e-12)
    std = whole.table("CUDA API calls")["StdDev (ns)"].to_numpy()
    assert (std != lean.table("CUDA API calls")["StdDev (ns)"].to_numpy()).any()  # the two ways do differ, slightly


def test_one_large_group_on_arrays_is_pandas_groupby():
    rng = np.random.default_rng(61)
    for n in (1, 2, 7, 10_000, 10_001):
        v = rng.integers(0, 10**9, n)
        want = stats.group_stats(np.zeros(n, dtype=np.int64), v)
        got = ln._one_group(0, v.copy())
        exact = ["sum", "size", "mean", "median", "min", "max"]
        pd.testing.assert_frame_equal(got[exact], want[exact], check_exact=True, check_index_type=False)
        np.testing.assert_allclose(got["std"].to_numpy(), want["std"].to_numpy(), rtol=1e-13)


def test_rows_out_of_time_order_are_read_in_sqlites_sort(tmp_path, monkeypatch):
    path = _copy(tmp_path)
    rng = np.random.default_rng(38)
    with sqlite3.connect(path) as con:  # the two large tables rewritten in a seeded random rowid order
        for table in (ns.KERNEL_TABLE, ns.RUNTIME_TABLE):
            rows = con.execute(f"SELECT * FROM {table}").fetchall()
            cols = [r[1] for r in con.execute(f"PRAGMA table_info('{table}')")]
            con.execute(f"DELETE FROM {table}")
            con.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                            [rows[i] for i in rng.permutation(len(rows))])
    seen = []
    real = ln._in_order

    def spy(conn, table, columns, ordered, *rest):
        seen.append(ordered)
        return real(conn, table, columns, ordered, *rest)

    monkeypatch.setattr(ln, "_in_order", spy)
    monkeypatch.setattr(ln, "CHUNK_ROWS", 500)
    _assert_same(timeline_page(load(path, "nsys")), timeline_page(ln.lean_view(path)))
    assert True in seen  # the rowid order was found out of order and the pass started again


def test_a_gpu_many_launches_behind_the_cpu(tmp_path, monkeypatch):
    """Every kernel shifted 50 ms later than its launching call: the gaps' causes, the calls that overlap them and
    the 'already launched' rule all meet kernels whose calls are long over."""
    path = _copy(tmp_path)
    with sqlite3.connect(path) as con:
        con.execute(f"UPDATE {ns.KERNEL_TABLE} SET start = start + 50000000, end = end + 50000000")
    monkeypatch.setattr(ln, "CHUNK_ROWS", 300)
    whole, lean = _both(path)
    assert lean is not None
    _assert_same(whole, lean)
    idle = whole.table("GPU idle, by what the CPU was doing")
    assert idle["cause"].str.startswith("already launched").any()


def test_a_kernel_whose_id_two_calls_share_is_read_whole(tmp_path, monkeypatch):
    path = _copy(tmp_path)
    with sqlite3.connect(path) as con:  # a second call with the first kernel's correlation id
        corr = con.execute(f"SELECT correlationId FROM {ns.KERNEL_TABLE} ORDER BY start LIMIT 1").fetchone()[0]
        cols = [r[1] for r in con.execute(f"PRAGMA table_info('{ns.RUNTIME_TABLE}')")]
        con.execute(f"INSERT INTO {ns.RUNTIME_TABLE} ({', '.join(cols)}) SELECT {', '.join(cols)} "
                    f"FROM {ns.RUNTIME_TABLE} WHERE correlationId = ?", (corr,))
    view = ln.lean_view(path)
    with pytest.raises(ln.Unsupported):
        timeline_page(view)
    monkeypatch.setenv("GPUPROF_LEAN", "1")
    _assert_same(build_pages([path])[0], timeline_page(load(path, "nsys")))  # the report falls back


def test_which_exports_are_read_in_passes(monkeypatch, tmp_path):
    path = _copy(tmp_path)
    monkeypatch.delenv("GPUPROF_LEAN", raising=False)
    assert not ln.wants_lean(path)  # 2,307 kernels
    monkeypatch.setattr(ln, "LEAN_MIN_KERNELS", 2_000)
    assert ln.wants_lean(path)
    monkeypatch.setenv("GPUPROF_LEAN", "0")
    assert not ln.wants_lean(path)
    monkeypatch.setenv("GPUPROF_LEAN", "1")
    monkeypatch.setattr(ln, "LEAN_MIN_KERNELS", 10**9)
    assert ln.wants_lean(path)


def test_statistics_taken_a_group_of_names_at_a_time_are_those_of_one_groupby(monkeypatch):
    rng = np.random.default_rng(6)
    codes = rng.integers(-1, 40, 5_000)  # -1: a missing name, left out as groupby leaves NaN keys out
    codes[:3] = [7, 7, 7]
    values = rng.integers(0, 10**9, 5_000)
    monkeypatch.setattr(ln, "GROUP_ROWS", 300)
    got = ln.batched_group_stats(codes, values)
    keep = codes >= 0
    want = stats.group_stats(codes[keep], values[keep])
    pd.testing.assert_frame_equal(got, want, check_index_type=False, check_exact=True)


def test_the_median_taken_in_place_is_numpys():
    from gpuprof.report.activity_view import _median_in_place

    rng = np.random.default_rng(38)
    for n in (1, 2, 3, 10, 11, 1_000, 1_001):
        for _ in range(20):
            d = rng.integers(-10**12, 10**12, n)
            assert _median_in_place(d.copy()) == float(np.median(d))


@pytest.mark.parametrize("tail", [600, 100], ids=["kept-by-the-pass", "sqlite"])
def test_the_timeline_of_a_capture_without_steps_is_cut_as_before(tmp_path, monkeypatch, tail):
    from gpuprof.report import timeline_page as tp

    path = _copy(tmp_path)
    monkeypatch.setattr(tp, "TIMELINE_MAX_OPS", 500)  # the figure of the last 500 GPU operations: cut here
    monkeypatch.setattr(ln, "TAIL_STARTS", tail)  # kept by the pass over the kernels, or (fewer) asked of SQLite
    monkeypatch.setattr(ln, "CHUNK_ROWS", 211)
    whole, lean = _both(path)
    assert "Without steps, the capture's last 500 GPU operations" in next(b.note for b in whole.blocks
                                                                          if b.heading == "Timeline")
    _assert_same(whole, lean)


@pytest.mark.parametrize("step", [7, 50, 100_000])
def test_gap_calls_fed_in_steps_equal_idle_gaps(step):
    """Every column of idle_gaps (the call overlapping each gap most, its share, the share any call covers, the
    label) from calls fed a step at a time, on host_sync's kernels and calls (gaps of 10 us or more)."""
    from gpuprof import activity

    path = REPO_ROOT / "artifacts" / "ch03" / "host_sync.sqlite"
    k, rt = ns.kernels(path, launch=False), ns.runtime_calls(path)
    want = activity.idle_gaps(k, rt, min_gap_ns=10_000)
    s, e = activity.merge_intervals(k["start"].to_numpy(), k["end"].to_numpy())
    gs, ge = e[:-1], s[1:]
    keep = ge - gs >= 10_000
    gs, ge = gs[keep], ge[keep]
    meet = ln._GapCalls(gs, ge)
    names = rt["name"].to_numpy()
    codes = {n: i for i, n in enumerate(dict.fromkeys(names))}
    ids = np.array([codes[n] for n in names], dtype=np.int64)
    for a in range(0, len(rt), step):
        meet.add(rt["start"].to_numpy()[a:a + step], rt["end"].to_numpy()[a:a + step], ids[a:a + step])
    text = {i: n for n, i in codes.items()}
    got = activity.gap_table(gs, ge, meet.answers(lambda i: stats.api_name(text[i])))
    assert len(got) > 100 and (got["covered_share"] > got["cpu_call_share"]).any()
    pd.testing.assert_frame_equal(got, want, check_exact=True)


@pytest.mark.parametrize("step", [5, 64, 10_000])
def test_gap_calls_fed_in_steps_equal_idle_gaps_with_overlapping_calls(step):
    """Calls on several threads that overlap each other, some long enough to span many gaps (a synchronize), some
    starting at one time: the union each gap keeps must carry its reach across calls and across steps."""
    from gpuprof import activity

    rng = np.random.default_rng(38)
    ks = np.sort(rng.integers(0, 10_000_000, 400))
    kernels = pd.DataFrame({"start": ks, "end": ks + rng.integers(1_000, 30_000, len(ks))})
    cs = np.sort(np.concatenate([rng.integers(0, 10_000_000, 600), np.repeat(rng.integers(0, 10_000_000, 40), 3)]))
    ce = cs + np.where(rng.random(len(cs)) < 0.02, rng.integers(100_000, 2_000_000, len(cs)),
                       rng.integers(500, 15_000, len(cs)))
    names = rng.choice(["cudaLaunchKernel", "cudaStreamSynchronize", "cudaMemcpyAsync"], len(cs))
    rt = pd.DataFrame({"start": cs, "end": ce, "name": names})
    want = activity.idle_gaps(kernels, rt, min_gap_ns=10_000)
    s, e = activity.merge_intervals(ks, kernels["end"].to_numpy())
    gs, ge = e[:-1], s[1:]
    keep = ge - gs >= 10_000
    gs, ge = gs[keep], ge[keep]
    meet = ln._GapCalls(gs, ge)
    codes = {n: i for i, n in enumerate(dict.fromkeys(names))}
    ids = np.array([codes[n] for n in names], dtype=np.int64)
    for a in range(0, len(cs), step):
        meet.add(cs[a:a + step], ce[a:a + step], ids[a:a + step])
    text = {i: n for n, i in codes.items()}
    got = activity.gap_table(gs, ge, meet.answers(lambda i: stats.api_name(text[i])))
    assert (got["covered_share"] < 1).any() and (got["covered_share"] == 1).any()
    pd.testing.assert_frame_equal(got, want, check_exact=True)


def _table(tmp_path, rows, cols=("start", "end", "correlationId", "deviceId", "nameId")):
    """A table T of the given integer rows (rowid order = the list's), in a fresh SQLite file."""
    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as con:
        con.execute(f"CREATE TABLE T ({', '.join(cols)})")
        con.executemany(f"INSERT INTO T VALUES ({', '.join('?' * len(cols))})", rows)
    return sqlite3.connect(path)


def _plain(con, cols, order="rowid"):
    return np.array(con.execute(f"SELECT {', '.join(cols)} FROM T ORDER BY {order}").fetchall(), dtype=np.int64)


def test_packed_reading_is_the_cursors_reading_inside_and_outside_the_sampled_ranges(tmp_path, monkeypatch):
    """The packing's ranges come from the table's two ends: rows in between that leave them (a long call, a late
    name id, a negative id, a column wider than a word) make their step read unpacked; every value is the
    cursor's either way."""
    rng = np.random.default_rng(7)
    n = 3000
    start = np.cumsum(rng.integers(0, 5000, n))
    rows = np.stack([start, start + rng.integers(0, 900, n), np.arange(n) + 10, np.zeros(n, dtype=np.int64),
                     rng.integers(100, 120, n)], axis=1)
    rows[1500, 1] += 10**12  # a duration far past the ends'
    rows[2100, 4] = 10**6    # a name id no end has
    rows[2500, 2] = -10**6   # a negative id, below the widened range
    con = _table(tmp_path, rows.tolist())
    cols = ["end", "correlationId", "deviceId", "nameId"]
    monkeypatch.setattr(ln, "SAMPLE_ROWS", 200)
    monkeypatch.setattr(ln, "CHUNK_ROWS", 256)
    plain_steps = []
    real = ln._chunks
    monkeypatch.setattr(ln, "_chunks", lambda *a: plain_steps.append(a[3]) or real(*a))
    ranges = ln.column_ranges(con, "T", cols)
    got = np.concatenate(list(ln._packed_chunks(con, "T", cols, ranges)))
    np.testing.assert_array_equal(got, _plain(con, ["start", *cols]))
    assert sorted(a for a, _ in plain_steps) == [1281, 2049, 2305]  # only the three steps with a row outside
    # a column wider than a word travels as itself
    wide = rows.copy()
    wide[:, 4] = np.where(np.arange(n) % 2, 2**62, -(2**62))
    (tmp_path / "w").mkdir()
    con = _table(tmp_path / "w", wide.tolist())
    ranges = ln.column_ranges(con, "T", cols)
    assert any(f[0][2] == 64 for f in ln._layout(cols, ranges))
    np.testing.assert_array_equal(np.concatenate(list(ln._packed_chunks(con, "T", cols, ranges))),
                                  _plain(con, ["start", *cols]))


def test_a_null_between_the_ends_is_unsupported(tmp_path, monkeypatch):
    rows = [[i * 10, i * 10 + 5, i, 0, 100] for i in range(1000)]
    rows[500][2] = None
    con = _table(tmp_path, rows)
    cols = ["end", "correlationId", "deviceId", "nameId"]
    monkeypatch.setattr(ln, "SAMPLE_ROWS", 100)
    monkeypatch.setattr(ln, "CHUNK_ROWS", 128)
    with pytest.raises(ln.Unsupported):
        list(ln._packed_chunks(con, "T", cols, ln.column_ranges(con, "T", cols)))


def test_the_local_merge_is_sqlites_sort(tmp_path, monkeypatch):
    """Rows out of time order only locally (runs of rows moved back across a step's edge, starts repeated) come out
    as ``ORDER BY start, rowid``; a row far out of place holds too much back and the merge gives up."""
    rng = np.random.default_rng(11)
    n = 4000
    start = np.cumsum(rng.integers(0, 3, n))  # many equal starts
    for at in rng.integers(1, n - 50, 40):  # a run of rows started earlier than the rows before it
        start[at:at + 30] -= rng.integers(0, 40)
    rows = np.stack([start, start + 7, np.arange(n), np.zeros(n, dtype=np.int64), rng.integers(1, 9, n)], axis=1)
    con = _table(tmp_path, rows.tolist())
    cols = ["end", "correlationId", "deviceId", "nameId"]
    monkeypatch.setattr(ln, "CHUNK_ROWS", 300)
    monkeypatch.setattr(ln, "SAMPLE_ROWS", 100)
    ranges = ln.column_ranges(con, "T", cols)
    with pytest.raises(ln._Unsorted):  # the rowid order is checked
        list(ln._in_order(con, "T", cols, False, ranges))
    got = np.concatenate(list(ln._merged(con, "T", cols, ranges)))
    np.testing.assert_array_equal(got, _plain(con, ["start", *cols], order="start, rowid"))
    far = rows.copy()
    far[n - 1, 0:2] = [-100, -93]  # the last row belongs first: every step is held back for it
    (tmp_path / "f").mkdir()
    con = _table(tmp_path / "f", far.tolist())
    monkeypatch.setattr(ln, "CARRY_MAX_CHUNKS", 2)
    with pytest.raises(ln._Unsorted):
        list(ln._merged(con, "T", cols, ln.column_ranges(con, "T", cols)))


@pytest.mark.parametrize("wide", [False, True], ids=["bincount", "sort"])
def test_pairs_counted_and_summed_as_sqlites_group_by(tmp_path, wide):
    rng = np.random.default_rng(5)
    n = 5000
    a = rng.integers(0, 6, n) * (10**9 if wide else 1)  # ids far apart: the sort; near: bincount
    b = rng.integers(0, 9, n)
    d = rng.integers(0, 10**6, n)
    con = _table(tmp_path, np.stack([a, b, d], axis=1).tolist(), cols=("a", "b", "d"))
    sums: dict = {}
    for lo in range(0, n, 999):  # in steps, as a pass feeds it
        ln._add_pairs(sums, a[lo:lo + 999], b[lo:lo + 999], d[lo:lo + 999])
    want = con.execute("SELECT a, b, count(*), sum(d) FROM T GROUP BY 1, 2").fetchall()
    assert [(x, y, *sums[(x, y)]) for x, y in sorted(sums)] == [tuple(r) for r in want]


def test_spacings_taken_in_place_are_numpys_diff():
    from gpuprof.report.activity_view import _diff_in_place
    rng = np.random.default_rng(13)
    for n in (0, 1, 2, 3, 7, 8, 9, 1000):
        a = np.sort(rng.integers(0, 10**12, n))
        np.testing.assert_array_equal(_diff_in_place(a.copy(), step=4), np.diff(a))


def test_gap_causes_from_each_distinct_call_name_are_the_rule_row_by_row():
    """_call_cause applies the rule once per distinct name (an object array, not numpy text a million rows long):
    the same cause per row as the rule applied to every row, NaN and empty names included."""
    from gpuprof.report.activity_view import CAUSES, _call_cause
    rng = np.random.default_rng(17)
    names = pd.Series(rng.choice(["", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaMemsetAsync",
                                  "cudaLaunchKernel", "cudaFree", None, np.nan], 5000), dtype=object)
    for s in (names, names.astype("str"), names.fillna(""), pd.Series([], dtype=object)):
        call = s.astype(str)
        want = np.select([call.str.contains("Synchronize"), call.str.contains("Memcpy|Memset"),
                          call.str.contains("Launch"), call != ""],
                         [CAUSES["sync"], CAUSES["copy"], CAUSES["launch"], CAUSES["other"]], CAUSES["host"])
        assert list(_call_cause(s)) == list(want)
