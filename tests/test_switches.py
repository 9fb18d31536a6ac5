"""gpuprof.studies.nsys_switches on the committed switch study (chapter 1, section 10) and on small fakes."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest

from gpuprof.artifacts import REPO_ROOT
from gpuprof.errors import GpuprofError
from gpuprof.nsys import session
from gpuprof.nsys import sqlite as ns
from gpuprof.studies import nsys_switches as sw
from conftest import write_exe

CH01 = REPO_ROOT / "artifacts" / "ch01"
STUDY = json.loads((CH01 / "switches.json").read_text())
RUNS = STUDY["runs"]
KEPT = CH01 / "switches.sqlite.gz"


def run(label: str) -> dict:
    return next(r for r in RUNS if r["label"] == label)


def test_every_run_finished_and_the_profiled_ones_were_exported():
    assert [r["label"] for r in RUNS][0] == "no profiler" and RUNS[-1]["label"] == "no profiler, again"
    for r in RUNS:
        assert r["returncode"] == 0 and r["error"] is None, r["label"]
        assert (r["report_bytes"] is None) == (not r["switches"]) == (not r["tables"]), r["label"]


def test_each_switch_adds_its_own_tables_and_domains():
    added = sw.tables_added(RUNS, "baseline: -t cuda,nvtx")
    new = {k: {t for t in v if not t.startswith("ENUM_")} for k, v in added.items()}
    assert new["+ osrt"] == {"OSRT_API", "OSRT_CALLCHAINS"}
    assert new["+ --cuda-memory-usage=true"] == {"CUDA_GPU_MEMORY_USAGE_EVENTS"}
    assert new["+ cudnn"] == new["+ cublas"] == new["-w false"] == set()
    domains = sw.domains_added(RUNS, "baseline: -t cuda,nvtx")
    assert domains["+ cublas"] == {"cuBLAS": 2} and domains["+ cublas-verbose"]["cuBLAS"] > 100
    assert {"SAMPLING_CALLCHAINS", "SCHED_EVENTS"} <= new["the guide's line"]


def test_cudnn_diagnostic_and_show_output():
    texts = [d["text"] for d in run("+ cudnn")["diagnostics"]]
    assert any("cuDNN library version 91.9 is currently not supported" in t for t in texts)
    assert run("baseline: -t cuda,nvtx")["program_lines_on_console"] == 1
    assert run("-w false")["program_lines_on_console"] == 0
    assert run("-w false")["tables"]["ProcessStreams"] == run("baseline: -t cuda,nvtx")["tables"]["ProcessStreams"] > 0


def test_kept_export_is_gzipped_scrubbed_and_readable(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPROF_CACHE_DIR", str(tmp_path))
    tables = sw.export_tables(KEPT)
    measured = run("all together")["tables"]
    # the environment's rows were dropped before committing (all but one, which says so)
    assert tables.pop("META_DATA_CAPTURE") < measured.pop("META_DATA_CAPTURE") and tables == measured
    osrt = sw.api_calls(KEPT, "OSRT_API")
    assert len(osrt) == tables["OSRT_API"] and {"start", "end", "duration_ns", "name", "thread"} <= set(osrt)
    summary = sw.call_summary(osrt)
    assert summary["calls"].sum() == len(osrt) and summary["total_ns"].is_monotonic_decreasing
    blas = ns.nvtx_ranges(KEPT).query("domain == 'cuBLAS'")
    assert blas["text"].str.contains("cublasSgemm").any()
    mem = sw.memory_in_use(ns.memory_usage(KEPT))
    assert len(mem) == tables["CUDA_GPU_MEMORY_USAGE_EVENTS"]
    assert (mem.groupby("memory")["in_use_bytes"].last() > 0).all()
    streams = sw.process_streams(KEPT)
    assert len(streams) == 2 and streams["text"].str.contains("cnn_training:").any()


def test_gzipped_export_errors_and_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPROF_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "bad.sqlite.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(GpuprofError, match="not a readable gzip"):
        ns.open_export(bad)
    with pytest.raises(GpuprofError, match="does not exist"):
        ns.open_export(tmp_path / "none.sqlite.gz")
    first = ns.ensure_sqlite(KEPT)
    assert first == ns.ensure_sqlite(KEPT) and first.parent == tmp_path / "cache"


def test_api_calls_names_missing_columns(tmp_path):
    db = tmp_path / "x.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE OSRT_API (start INTEGER, finish INTEGER)")
    con.commit()
    con.close()
    with pytest.raises(GpuprofError, match="no end, nameId column"):
        sw.api_calls(db, "OSRT_API")
    assert sw.api_calls(db, "CUDNN_EVENTS").empty


def test_console_summary_counts_the_programs_line_and_keeps_nsys_warnings():
    text = "WARNING: CPU IP/backtrace sampling not supported\nprog: started\nprog: step\nGenerating '/tmp/x'\n"
    said, n = sw.console_summary(text, "prog:")
    assert said == ["WARNING: CPU IP/backtrace sampling not supported"] and n == 2


def test_run_switch_study_without_nsys_runs_and_records_the_program(tmp_path):
    """A fake 'nsys' that runs the program and writes no report: each profiled run says so."""
    fake = tmp_path / "nsys"
    fake.write_text("#!/bin/sh\nshift\nwhile [ \"$1\" != \"-o\" ]; do shift; done\nshift 2\nexec \"$@\"\n")
    fake.chmod(0o755)
    prog = [sys.executable, "-c", "import json, sys; print('prog: hi'); json.dump({'x': 1}, open(sys.argv[1], 'w'))", "RESULT"]
    rows = sw.run_switch_study(fake, prog, {"a": ["--trace=cuda"]}, program_marker="prog:", result_file="RESULT",
                               progress=lambda *a, **k: None)
    assert [r["label"] for r in rows] == ["no profiler", "a", "no profiler, again"]
    assert all(r["program_result"] == {"x": 1} and r["program_lines_on_console"] == 1 for r in rows)
    assert rows[1]["error"] == "no report was written" and rows[0]["error"] is None


def test_wait_for_line_returns_when_the_program_is_ready():
    # the start-up line quotes the ready word; only a line that starts with it is the program at work
    app = subprocess.Popen([sys.executable, "-u", "-c", "import time; print('booting, will print step_0 soon'); "
                            "time.sleep(0.5); print('step_0: 1.0 ms'); time.sleep(0.5); print('done')"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, reader, matched = session._wait_for_line(app, "step_0", timeout=60)
    assert matched == "step_0: 1.0 ms" and lines[-1].startswith("step_0")
    app.wait(timeout=60)
    reader.join(timeout=10)
    assert [line.strip() for line in lines] == ["booting, will print step_0 soon", "step_0: 1.0 ms", "done"]


def test_wait_for_line_gives_up_after_its_timeout():
    app = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        _, _, matched = session._wait_for_line(app, "never", timeout=0.2)
        assert matched is None
    finally:
        app.kill()
        app.wait()


def test_nsys_analyze_runs_each_rule_and_keeps_its_text_without_machine_paths(clean_tool_env, tmp_path):
    """gpuprof.nsys.rules.analyze on a stand-in nsys: one call per rule, each rule's output kept (a failing
    rule too, with its status), the report named without its folder, and temporary paths cut."""
    from gpuprof.nsys import rules

    write_exe(clean_tool_env / "nsys", 'if [ "$1" = "--version" ]; then echo "NVIDIA Nsight Systems version 2025.3.1.0"; exit 0; fi\n'
              'case "$3" in gpu_gaps*) echo "no such option" >&2; exit 3;; esac\n'
              'echo "Processing [$4] with [/tmp/nsys/reports/$3.py]..."; echo "advice for $3"')
    report = tmp_path / "run.sqlite"
    report.write_bytes(b"SQLite format 3\x00")
    out = rules.analyze(report, ["cuda_api_sync:rows=5", "gpu_gaps:gap=100"])
    assert out["nsys"] == "2025.3.1.0" and list(out["rules"]) == ["cuda_api_sync:rows=5", "gpu_gaps:gap=100"]
    ok, failed = out["rules"]["cuda_api_sync:rows=5"], out["rules"]["gpu_gaps:gap=100"]
    assert ok["returncode"] == 0 and ok["command"] == "nsys analyze --rule cuda_api_sync:rows=5 run.sqlite"
    assert "advice for cuda_api_sync:rows=5" in ok["text"] and "/tmp/" not in ok["text"]
    assert failed["returncode"] == 3 and failed["text"] == "no such option"
    assert rules.excerpt("a\n\n" + "x" * 200 + "\nb\nc", lines=2, width=10) == ["a", "xxxxxxx..."]


def test_interactive_capture_waits_for_the_ready_line_and_shows_no_machine_paths(isolated_dirs, tmp_path, monkeypatch):
    """The interactive session on a stand-in nsys: recording starts after the program's line that *starts with*
    the ready text (not one quoting it), the transcript names that line, and no output shows a scratch folder,
    /tmp or the repository's absolute path."""
    from gpuprof.tools import LiveTool, Tool

    state = tmp_path / "state"
    fake = write_exe(tmp_path / "bin" / "nsys", f'''
case "$1" in
  launch) shift 3; exec "$@";;
  sessions) echo "ID  TIME  STATE  NAME"; echo "1  00:05  Launched  course-win";;
  start) for a in "$@"; do last="$a"; done; echo "$last" > {state}; date +%s%N >> {state}; echo "Collecting data...";;
  status) echo "collecting data";;
  stop) out=$(head -1 {state}); : > "$out.nsys-rep"; echo "Generating '/tmp/nsys-report-1a2b.qdstrm'"; echo "Generated:"; echo "	$out.nsys-rep";;
  export) "{sys.executable}" -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute('create table t (x)')" "$5";;
esac''')
    monkeypatch.setattr(session, "live_tool", lambda name: LiveTool(Tool("nsys", fake, "test"), "2025.3.1.0"))
    prog = tmp_path / "prog.py"
    prog.write_text("import time\nprint('will print step_0 when ready', flush=True)\ntime.sleep(0.5)\n"
                    "print(f'step_0: at {time.time_ns()}', flush=True)\ntime.sleep(1.5)\nprint('done')\n")
    t = session.interactive_capture("chtest", "win", prog, [], ready="step_0", wait_s=0.2, record_s=0.2)
    assert t.ready_line.startswith("step_0: at ") and t.ready_after_s > 0.4
    started = int(state.read_text().split()[1])
    assert started > int(t.ready_line.split()[-1])  # recording began after the program's step_0, not at its first line
    shown = t.show()
    assert "# the program printed 'step_0: at" in shown and "Generating 'nsys-report-1a2b.qdstrm'" in shown
    printed = "\n".join(out for _, out in t.steps)  # what the tools printed (the commands name this test's tmp folders)
    assert "/tmp/" not in printed and ".partial" not in shown and str(REPO_ROOT) not in shown
    assert "\twin.nsys-rep" in printed  # the report's folder here is under /tmp: its name is what is left
    assert t.capture is not None and t.capture.path.name == "win.sqlite"

