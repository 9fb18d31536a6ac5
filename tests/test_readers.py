"""The nsys sqlite and ncu CSV readers, on the course's real reference captures and on bad input."""

import shutil
import sqlite3

import pytest

from gpuprof.nsys import export_edit
from gpuprof.nsys import sqlite as ns
from gpuprof.artifacts import REPO_ROOT
from gpuprof.errors import GpuprofError
from gpuprof.ncu.csv_reader import metric, read_details, to_seconds

SQLITE = REPO_ROOT / "artifacts" / "ch00" / "tiny_kernels.sqlite"  # committed as tiny_kernels.sqlite.gz; read either way
NCU_CSV = REPO_ROOT / "artifacts" / "ch00" / "saxpy_sol.csv"


def test_kernels_from_the_reference_capture():
    k = ns.kernels(SQLITE)
    assert len(k) >= 6 * 200  # warm-up plus five steps of 200 launches
    assert (k["duration_ns"] > 0).all() and k["start"].is_monotonic_increasing
    assert k["name"].str.contains("elementwise|add", regex=True).any()


def test_nvtx_ranges_have_text_and_depth():
    r = ns.nvtx_ranges(SQLITE)
    assert ["warmup", "step_0", "step_1", "step_2", "step_3", "step_4"] == list(r["text"])
    assert (r["depth"] == 0).all() and (r["duration_ns"] > 0).all()


def test_kernels_are_attributed_through_their_launch_call():
    for step in ("warmup", "step_0", "step_4"):
        assert len(ns.attribute_to_ranges(SQLITE, step, rule="thread")) == 200
    assert ns.attribute_to_ranges(SQLITE, "no_such_range", rule="thread").empty


def test_no_committed_capture_carries_the_environment():
    """Every committed export: the environment text blanked, and no variable left in the per-process rows."""
    exports = sorted([*SQLITE.parents[1].glob("**/*.sqlite"), *SQLITE.parents[1].glob("**/*.sqlite.gz")])
    assert len(exports) > 30
    for path in exports:
        con = ns.open_export(path)
        (value,) = con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name='DeviceEnvironment'").fetchone()
        assert value == export_edit.ENV_REMOVED, path
        left = con.execute("SELECT value FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT_VARIABLE'").fetchall()
        assert left == [(export_edit.ENV_REMOVED,)], (path, left[:3])


def test_scrub_environment(tmp_path):
    db = tmp_path / "x.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE TARGET_INFO_SYSTEM_ENV (name TEXT, value TEXT)")
    con.execute("INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES ('DeviceEnvironment', 'TOKEN=secret'), ('Hostname', 'vm')")
    con.execute("CREATE TABLE META_DATA_CAPTURE (name TEXT, value TEXT)")
    con.execute("INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_0:COMMAND', 'python'), "
                "('PROCESS_0:ENVIRONMENT_VARIABLE', 'TOKEN=\"secret\"'), ('PROCESS_0:ENVIRONMENT_VARIABLE', 'HOME=\"/root\"')")
    con.commit()
    con.close()
    assert export_edit.scrub_environment(db) == 3
    con = sqlite3.connect(db)
    values = dict(con.execute("SELECT name, value FROM TARGET_INFO_SYSTEM_ENV").fetchall())
    assert values == {"DeviceEnvironment": export_edit.ENV_REMOVED, "Hostname": "vm"}
    assert con.execute("SELECT name, value FROM META_DATA_CAPTURE").fetchall() == [
        ("PROCESS_0:COMMAND", "python"), ("PROCESS_0:ENVIRONMENT_VARIABLE", export_edit.ENV_REMOVED)]
    con.close()
    assert export_edit.scrub_environment(db) == 0  # a scrubbed file is left as it is


def test_missing_file(tmp_path):
    with pytest.raises(GpuprofError, match="does not exist"):
        ns.kernels(tmp_path / "nope.sqlite")


def test_report_given_instead_of_export_without_nsys(tmp_path, clean_tool_env, monkeypatch):
    monkeypatch.setattr("gpuprof.tools._INSTALL_GLOBS", {"nsys": [], "ncu": []})
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"\x00QDSTRM binary report")
    with pytest.raises(GpuprofError, match=r"is an Nsight Systems report.*nsys is not installed.*nsys export --type sqlite"):
        ns.kernels(rep)


def test_report_given_instead_of_export_is_exported_with_nsys(tmp_path, clean_tool_env):
    """With nsys on PATH the report is exported next to itself, then read."""
    from conftest import write_exe

    # a stand-in nsys: "export --type sqlite -o OUT REPORT" copies the reference export to OUT
    write_exe(clean_tool_env / "nsys", f'out=""; while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done; cp "{ns.ensure_sqlite(SQLITE)}" "$out"')
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"\x00QDSTRM binary report")
    assert len(ns.kernels(rep)) == len(ns.kernels(SQLITE))
    assert (tmp_path / "run.sqlite").exists()


def test_not_sqlite_at_all(tmp_path):
    f = tmp_path / "notes.sqlite"
    f.write_text("hello")
    with pytest.raises(GpuprofError, match="is not an SQLite file"):
        ns.nvtx_ranges(f)


def test_truncated_export(tmp_path):
    f = tmp_path / "cut.sqlite"
    f.write_bytes(ns.ensure_sqlite(SQLITE).read_bytes()[:20000])
    with pytest.raises(GpuprofError, match="damaged|malformed|not an SQLite"):
        ns.kernels(f)


def test_capture_without_kernels_says_why(tmp_path):
    f = tmp_path / "cpu_only.sqlite"
    con = sqlite3.connect(f)
    con.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    con.commit()
    con.close()
    with pytest.raises(ns.NoKernelRows, match="holds no kernel table.*ran on the CPU"):
        ns.kernels(f)
    assert ns.nvtx_ranges(f).empty and ns.runtime_calls(f).empty


def test_gpu_metrics_are_read_by_the_names_the_export_gives(tmp_path):
    """The two tables of an export made with --gpu-metrics-devices (their documented columns); the names
    are the export's own, whatever they are (two GPUs may name the same counter differently)."""
    f = tmp_path / "metrics.sqlite"
    con = sqlite3.connect(f)
    con.execute("CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER, sourceId INTEGER, typeName TEXT, "
                "metricId INTEGER, metricName TEXT)")
    con.execute("CREATE TABLE GPU_METRICS (typeId INTEGER, timestamp INTEGER, metricId INTEGER, value INTEGER)")
    con.executemany("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?, ?, ?, ?, ?)",
                    [(1, 0, "GH100", 0, "DRAM Read Bandwidth [Throughput %]"), (1, 0, "GH100", 1, "PCIe RX Throughput [%]"),
                     (2, 0, "GH100", 0, "another GPU's counter 0")])
    con.executemany("INSERT INTO GPU_METRICS VALUES (?, ?, ?, ?)",
                    [(1, 100, 0, 10), (1, 100, 1, 50), (1, 200, 0, 30), (1, 200, 1, 70), (1, 300, 0, 90), (2, 150, 0, 5)])
    con.commit()
    con.close()
    samples = ns.gpu_metrics(f)
    assert len(samples) == 6 and samples["timestamp"].is_monotonic_increasing
    assert set(samples[samples["typeId"] == 2]["metric"]) == {"another GPU's counter 0"}  # joined on the GPU too
    means = ns.gpu_metric_means(f, (100, 300)).set_index("metric")
    assert means.loc["DRAM Read Bandwidth [Throughput %]"].tolist() == [2, 20.0, 30]  # the sample at 300 is outside
    assert means.loc["PCIe RX Throughput [%]", "mean"] == 60.0
    assert ns.gpu_metric_means(f, (400, 500)).empty
    assert ns.gpu_metrics(SQLITE).empty  # a capture made without the option


def test_export_is_opened_read_only(tmp_path):
    copy = tmp_path / "ro.sqlite"
    shutil.copy(ns.ensure_sqlite(SQLITE), copy)
    con = ns.open_export(copy)
    with pytest.raises(sqlite3.OperationalError):
        con.execute("DELETE FROM StringIds")
    con.close()


def test_ncu_details_from_the_reference_capture():
    df = read_details(NCU_CSV)
    sol = df[df["Section Name"] == "GPU Speed Of Light Throughput"]
    assert {"Duration", "Memory Throughput", "Compute (SM) Throughput"} <= set(sol["Metric Name"])
    assert sol["value"].notna().all()
    assert metric(df, "Duration")["Kernel Name"].iloc[0] == "saxpy"


def test_ncu_unknown_metric_lists_known_ones():
    with pytest.raises(GpuprofError, match="No metric named 'bogus'.*Duration"):
        metric(read_details(NCU_CSV), "bogus")


def test_ncu_csv_without_a_table(tmp_path):
    f = tmp_path / "empty.csv"
    f.write_text("==PROF== Connected\n==WARNING== No kernels were profiled.\n")
    with pytest.raises(GpuprofError, match="holds no ncu CSV table"):
        read_details(f)


@pytest.mark.parametrize("unit,factor", [("ns", 1e-9), ("us", 1e-6), ("usecond", 1e-6), ("msecond", 1e-3), ("s", 1)])
def test_time_units(unit, factor):
    assert to_seconds(2.0, unit) == pytest.approx(2 * factor)


def test_unknown_time_unit():
    with pytest.raises(GpuprofError, match="Unknown time unit"):
        to_seconds(1.0, "fortnight")


def test_trim_reference_keeps_the_kernels_of_the_named_ranges_and_says_what_went(tmp_path):
    import shutil

    src = ns.ensure_sqlite(REPO_ROOT / "artifacts" / "ch06" / "rung0.sqlite")
    path = tmp_path / "r.sqlite"
    shutil.copy(src, path)
    ranges = ns.nvtx_ranges(path)
    steps = ranges[ranges["text"].str.fullmatch(r"step_\d+")].sort_values("start").head(5)  # keep five steps' kernels
    before = ns.kernels(path)
    inside = before["start"].map(lambda t: bool(((steps["start"] <= t) & (t <= steps["end"])).any()))
    names = "|".join(steps["text"])
    note = export_edit.trim_reference(path, drop_tables=["CUPTI_ACTIVITY_KIND_MEMSET", "NO_SUCH_TABLE"], keep_kernels_in=names)
    after = ns.kernels(path)
    assert len(after) == int(inside.sum()) and 0 < len(after) < len(before)
    assert "CUPTI_ACTIVITY_KIND_MEMSET" in note and "NO_SUCH_TABLE" not in note
    assert f"{len(after)} of {len(before)}" in note and "MiB)" in note
    assert ns.memset(path).empty


def test_kernels_reads_only_the_columns_asked_for():
    from gpuprof.nsys import sqlite as nsq

    full = nsq.kernels(SQLITE, launch=False)
    slim = nsq.kernels(SQLITE, only=("name",))
    assert list(slim.columns) == ["start", "end", "name", "duration_ns"]
    assert (slim["name"].to_numpy() == full["name"].to_numpy()).all()
    assert (slim["duration_ns"].to_numpy() == full["duration_ns"].to_numpy()).all()
    assert list(nsq.kernels(SQLITE, only=("demangled",)).columns) == ["start", "end", "demangled", "duration_ns"]
    with pytest.raises(ValueError, match="registersPerThread"):
        nsq.kernels(SQLITE, only=("registersPerThread",))


def test_pid_and_tid_unpack_an_nsys_global_id_for_one_id_an_array_and_a_series():
    import numpy as np
    import pandas as pd

    gid = (1 << 56) | (4321 << 24) | 4325  # hardware id above bit 48, then the process, then the thread
    assert ns.pid_of(gid) == 4321 and ns.tid_of(gid) == 4325
    assert ns.pid_of(np.array([gid, 7 << 24])).tolist() == [4321, 7]
    series = pd.Series([gid, 7 << 24], index=[5, 9])
    pids, tids = ns.pid_of(series), ns.tid_of(series)
    assert isinstance(pids, pd.Series) and pids.index.tolist() == [5, 9] and pids.tolist() == [4321, 7]
    assert tids.tolist() == [4325, 0]


def test_nvtx_strings_tell_registered_messages_from_plain_ones(tmp_path):
    """A registered message is a textId (its text NULL); a plain one is the text column; events without a
    message (a pop) are left out. Built by hand, so that each row's kind is known."""
    f = tmp_path / "nvtx.sqlite"
    con = sqlite3.connect(f)
    con.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    con.execute("INSERT INTO StringIds VALUES (7, 'step_0')")
    con.execute("CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER, name TEXT)")
    con.execute("INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (59, 'NvtxPushPopRange'), (34, 'NvtxMark')")
    con.execute("CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, eventType INTEGER, text TEXT, textId INTEGER, "
                "globalTid INTEGER, domainId INTEGER, category INTEGER)")
    con.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?, ?, 1, NULL, NULL)",
                    [(0, 10, 59, None, 7), (20, 30, 59, None, 7), (40, 50, 59, "optimizer_step", None),
                     (60, None, 34, "saved", None), (70, None, 76, None, None)])
    con.commit()
    con.close()
    s = ns.nvtx_strings(f).set_index("text")
    assert list(s.index) == ["saved", "optimizer_step", "step_0"]
    assert s.loc["step_0", "registered"] and s.loc["step_0", "events"] == 2
    assert not s.loc["optimizer_step", "registered"] and not s.loc["saved", "registered"]
    assert s.loc["saved", "event"] == "NvtxMark" and (s["domain"] == "default").all()


def test_nvtx_strings_of_the_chapter_2_capture_the_nvtx_package_registers_torch_does_not():
    """nvtx 0.2.17 registers every message; torch.cuda.nvtx (nvtxRangePushA) sends plain text."""
    s = ns.nvtx_strings(REPO_ROOT / "artifacts" / "ch02" / "features.sqlite")
    ranges = s[s["event"] == "NvtxPushPopRange"].set_index("text")
    assert ranges.loc["step_0", "registered"] and ranges.loc["library_call_0", "domain"] == "course"
    assert not ranges.loc["optimizer_step", "registered"]


def test_launch_calls_of_the_reference_capture():
    """Chapter 0's launches seen from the CPU under nsys: every step's 200 calls, the call inside the gap,
    and call-to-call the same as the kernels' start gap on the GPU."""
    from gpuprof.studies import setup_checks

    calls = setup_checks.launch_calls(SQLITE)
    steps = setup_checks.tiny_kernels_steps(SQLITE)
    assert list(calls["step"]) == list(steps["step"]) == [f"step_{i}" for i in range(5)]
    assert (calls["calls"] == setup_checks.TINY_KERNELS_PER_STEP).all()
    assert (calls["call_us"] < calls["interval_us"]).all() and (calls["outside_us"] > 0).all()
    assert ((calls["call_us"] + calls["outside_us"]) / calls["interval_us"] - 1).abs().max() < 0.1
    assert calls["interval_us"].median() == pytest.approx(steps["median_interval_us"].median(), rel=0.05)
    text = setup_checks.format_launch_calls(calls)
    assert text.splitlines()[0].split()[:3] == ["step", "calls", "in"] and len(text.splitlines()) == 6
