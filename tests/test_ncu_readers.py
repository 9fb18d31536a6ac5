"""The Nsight Compute readers (report and CSV), the parsers of ncu's printed output, and bad input.

The report reader runs NVIDIA's ncu_report (the pinned `ncu-report` package) in a helper
process; these tests read the course's real reports, so they need no GPU and no ncu.
"""

import json
import sys

import pandas as pd
import pytest

from gpuprof import gpu_available
from gpuprof.artifacts import REPO_ROOT
from gpuprof.errors import GpuprofError
from gpuprof.ncu import capture as ncap
from gpuprof.ncu import csv_reader, report as nr
from gpuprof.studies import nsight_compute as runs

SAXPY_REP = REPO_ROOT / "artifacts" / "ch00" / "saxpy_sol.ncu-rep"
SAXPY_CSV = REPO_ROOT / "artifacts" / "ch00" / "saxpy_sol.csv"
LIST_SETS = REPO_ROOT / "artifacts" / "tools" / "ncu-list-sets.txt"


def test_report_and_csv_agree_on_the_kernel_and_its_duration():
    k = nr.kernels(SAXPY_REP)
    assert list(k["name"]) == ["saxpy"]
    d = csv_reader.read_details(SAXPY_CSV)
    row = d[d["Metric Name"] == "Duration"].iloc[0]
    csv_ns = csv_reader.to_seconds(row["value"], row["Metric Unit"]) * 1e9
    assert k["duration_ns"].iloc[0] == pytest.approx(csv_ns, rel=0.005)


def test_launch_configuration_from_the_report():
    k = nr.kernels(SAXPY_REP).iloc[0]
    assert k["block_size"] == 256 and k["grid_size"] * k["block_size"] == 1 << 26
    assert k["registers_per_thread"] > 0


def test_metrics_long_and_wide():
    long = nr.metrics(SAXPY_REP, r"^gpu__time_duration\.")
    assert set(long["unit"]) == {"ns"} and len(long) >= 1
    wide = nr.metric_table(SAXPY_REP, ["gpu__time_duration.sum", "launch__block_size"])
    assert list(wide.columns) == ["kernel", "gpu__time_duration.sum", "launch__block_size"]
    assert wide["launch__block_size"].iloc[0] == 256


def test_a_missing_metric_is_named_with_similar_ones():
    with pytest.raises(GpuprofError, match=r"has no metric 'gpu__time_duration\.summ'.*similar names here: \['gpu__time"):
        nr.metric_table(SAXPY_REP, ["gpu__time_duration.summ"])
    nan = nr.metric_table(SAXPY_REP, ["gpu__time_duration.summ"], missing="nan")
    assert nan["gpu__time_duration.summ"].isna().all()


def test_rules_are_read_with_their_type_and_plain_messages():
    r = nr.rules(SAXPY_REP)
    assert len(r) and set(r["type"]) <= set(nr.RULE_TYPES.values())
    assert not r["message"].str.contains("@section:|@url:", regex=True).any()


def test_rule_link_markup_is_reduced_to_its_text():
    msg = ("Start with @section:MemoryWorkloadAnalysis:Memory Workload Analysis@, see the "
           "@url:CUDA Best Practices Guide:https://docs.nvidia.com/x@ and line @source:k.cu:12:twelve@.")
    assert nr.clean_message(msg) == "Start with Memory Workload Analysis, see the CUDA Best Practices Guide and line twelve."


@pytest.mark.parametrize("name,content,message", [
    ("x.csv", "ID,Kernel Name\n", "is ncu's CSV output, not a report"),
    ("x.sqlite", "SQLite format 3\x00", "is an Nsight Systems file"),
    ("x.ncu-rep", "not a report at all", "holds no profiled kernel"),
])
def test_wrong_files_get_one_sentence(tmp_path, name, content, message):
    f = tmp_path / name
    f.write_text(content)
    with pytest.raises(GpuprofError, match=message):
        nr.kernels(f)


def test_missing_report(tmp_path):
    with pytest.raises(GpuprofError, match="does not exist"):
        nr.rules(tmp_path / "nope.ncu-rep")


def test_a_report_given_to_the_csv_reader_says_which_reader_to_use():
    with pytest.raises(GpuprofError, match="is an Nsight Compute report, not its CSV export.*gpuprof.ncu.report"):
        csv_reader.read_details(SAXPY_REP)


def test_section_tables_without_ncu_say_how_to_export_them(tmp_path, clean_tool_env, monkeypatch):
    monkeypatch.setattr("gpuprof.tools._INSTALL_GLOBS", {"nsys": [], "ncu": []})
    rep = tmp_path / "copy.ncu-rep"
    rep.write_bytes(SAXPY_REP.read_bytes())
    with pytest.raises(GpuprofError, match=r"rendered by ncu, which is not installed here.*--page details"):
        nr.sections(rep)
    (tmp_path / "copy.details.csv").write_bytes(SAXPY_CSV.read_bytes())
    assert "GPU Speed Of Light Throughput" in set(nr.sections(rep)["Section Name"])


def test_section_value_reads_one_row_where_the_page_repeats_a_name():
    """The ladder's page names 'Memory Throughput' in two sections (and rule rows have no name): a value is
    found by section, a repeated name without one is an error that lists the sections, not a one-row Series."""
    page = nr.sections(REPO_ROOT / "artifacts" / "ch04" / "ladder.ncu-rep")
    comp = nr.section_value(page, "copy_tile", "L2 Compression Input Sectors")
    assert comp == float(page[(page["Kernel Name"] == "copy_tile")
                              & (page["Metric Name"] == "L2 Compression Input Sectors")]["value"].iloc[0]) > 0
    sol = nr.section_value(page, "copy_tile", "Memory Throughput", "GPU Speed Of Light Throughput")
    assert 0 < sol <= 100  # the percentage, not the rate of the other section
    with pytest.raises(GpuprofError, match=r"2 rows named 'Memory Throughput'.*GPU Speed Of Light Throughput.*Name the section"):
        nr.section_value(page, "copy_tile", "Memory Throughput")
    with pytest.raises(GpuprofError, match="0 rows"):
        nr.section_value(page, "no_such_kernel", "Duration")


def test_reader_survives_torch_and_matplotlib_loaded_first():
    """ncu_report crashes a process that loaded PyTorch or matplotlib before it; ours never loads it."""
    import subprocess

    code = ("import torch, matplotlib.pyplot; from gpuprof.ncu import report as nr; "
            f"print(nr.kernels({str(SAXPY_REP)!r})['name'].iloc[0])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "saxpy", proc.stderr[-500:]


def test_ncu_report_is_found():
    assert nr.ncu_report_available()


def test_raw_page_with_its_units_row():
    text = ('==PROF== Connected to process 1\n"ID","Kernel Name","gpu__time_duration.sum","launch__block_size"\n'
            '"","","ns",""\n"0","saxpy","232,640","256"\n"1","saxpy","231,000","256"\nprogram output\n')
    df, units = csv_reader.parse_raw(text)
    assert list(df["gpu__time_duration.sum"]) == [232640, 231000] and units == {"gpu__time_duration.sum": "ns"}
    assert list(df["Kernel Name"]) == ["saxpy", "saxpy"]


def test_details_page_from_printed_output():
    text = "program says hi\n" + SAXPY_CSV.read_text() + "==PROF== Disconnected\n"
    df = csv_reader.parse_details(text)
    assert df["value"].notna().any() and set(df["Kernel Name"]) == {"saxpy"}


def test_list_sets_parsed_with_wrapped_section_lists():
    rows = {r["set"]: r for r in runs.parse_list_sets(LIST_SETS.read_text())}
    assert set(rows) == {"basic", "detailed", "full", "nvlink", "pmsampling", "roofline"}
    assert rows["basic"]["enabled"] and not rows["full"]["enabled"]
    assert "MemoryWorkloadAnalysis_Chart" in rows["detailed"]["sections"]  # wrapped over two lines in the listing
    assert rows["full"]["estimated_metrics"] > rows["detailed"]["estimated_metrics"] > rows["basic"]["estimated_metrics"]


def test_list_sets_rejects_other_text():
    with pytest.raises(GpuprofError, match="not `ncu --list-sets` output"):
        runs.parse_list_sets("hello")


def test_passes_and_profiled_kernels_from_ncu_output():
    text = ('==PROF== Connected to process 7\n==PROF== Profiling "copy_tile": 0%....50%....100% - 20 passes\n'
            '==PROF== Profiling "transpose_naive": 0%....50%....100% - 1 pass\n==PROF== Disconnected\n')
    assert ncap.parse_passes(text) == [("copy_tile", 20), ("transpose_naive", 1)]
    assert ncap.parse_profiled(text) == ["copy_tile", "transpose_naive"]


QUERY = """Device NVIDIA H100 80GB HBM3 (GH100)
---------------------------------------- --------------- --------------- ----------------------------------------
Metric Name                              Metric Type     Metric Unit     Metric Description
---------------------------------------- --------------- --------------- ----------------------------------------
dram__bytes.sum.per_second               Counter         byte/s          # of bytes accessed in DRAM (This counter
                                                                         metric represents the sum)
sm__warps_active.avg.pct_of_peak_sustained_active Counter %               cumulative # of warps in flight
smsp__thread_inst_executed_per_inst_executed.ratio Ratio                  [DEPRECATED: use smsp__average_thread_inst_executed_per_inst_executed.ratio] x
"""


def test_metric_names_checked_against_the_query_listing():
    rows = {r["metric"]: r for r in runs.check_metric_names(
        ["dram__bytes.sum.per_second", "sm__warps_active.avg.pct", "smsp__thread_inst_executed_per_inst_executed.ratio",
         "Occupancy"], QUERY)}
    assert rows["dram__bytes.sum.per_second"]["exists"] and not rows["dram__bytes.sum.per_second"]["deprecated"]
    assert not rows["sm__warps_active.avg.pct"]["exists"]
    assert rows["sm__warps_active.avg.pct"]["use_instead"] == "sm__warps_active.avg.pct_of_peak_sustained_active"
    dep = rows["smsp__thread_inst_executed_per_inst_executed.ratio"]
    assert dep["exists"] and dep["deprecated"] and dep["use_instead"].startswith("smsp__average_thread_inst")
    assert rows["Occupancy"]["use_instead"] == "(no metric of this base name)"


NO_GPU = pytest.mark.skipif(gpu_available(), reason="checks the CPU-only fallback")


@NO_GPU
def test_capture_without_a_gpu_falls_back_to_the_reference(isolated_dirs, capsys):
    _, ref = isolated_dirs
    folder = ref / "ch04"
    folder.mkdir()
    (folder / "demo.ncu-rep").write_bytes(SAXPY_REP.read_bytes())
    (folder / "demo.details.csv").write_bytes(SAXPY_CSV.read_bytes())
    prov = {"chapter": "ch04", "files": {"demo.ncu-rep": {"captured_at": "2026-11-22T00:00:00Z", "command": "ncu -o demo",
                                                           "machine": {"gpu_name": "NVIDIA H100"}, "passes": [["saxpy", 8]]}}}
    (folder / "provenance.json").write_text(json.dumps(prov))
    cap = ncap.ncu_capture("ch04", "demo", "script.py")
    assert "No live ncu capture" in capsys.readouterr().out
    assert cap.report.source == "reference" and cap.details == folder / "demo.details.csv"
    assert cap.passes == [("saxpy", 8)]
    with pytest.raises(GpuprofError, match="No capture named missing.ncu-rep"):
        ncap.ncu_capture("ch04", "missing", "script.py")


@NO_GPU
def test_listing_without_a_gpu_is_one_sentence():
    with pytest.raises(GpuprofError, match="ncu cannot run here"):
        ncap.ncu_listing(["--list-sets"])


def test_a_truncated_csv_page_is_one_sentence(tmp_path):
    text = SAXPY_CSV.read_text()
    cut = tmp_path / "cut.csv"
    cut.write_text(text[: len(text) // 2] + '"unterminated')
    with pytest.raises(GpuprofError, match="not a complete ncu CSV table"):
        csv_reader.read_details(cut)


def test_a_details_page_given_to_the_raw_reader_says_so():
    with pytest.raises(GpuprofError, match="details page .* not the raw page"):
        csv_reader.read_raw(SAXPY_CSV)


def test_an_empty_raw_value_reads_as_missing_not_zero():
    text = ('"ID","Kernel Name","gpu__time_duration.sum","sm__ops_path_tensor_op_hmma.sum"\n'
            '"","","ns",""\n"0","k1","1,024","12"\n"1","k2","2,048",""\n')
    df, units = csv_reader.parse_raw(text)
    assert units["gpu__time_duration.sum"] == "ns"
    assert df["gpu__time_duration.sum"].tolist() == [1024.0, 2048.0]
    assert df["sm__ops_path_tensor_op_hmma.sum"].iloc[0] == 12 and pd.isna(df["sm__ops_path_tensor_op_hmma.sum"].iloc[1])


def _details_line(launch: int, kernel: str, metric: str, unit: str, value: str) -> str:
    return (f'"{launch}","1","python3.12","127.0.0.1","{kernel}","1","7","(32, 8, 1)","(512, 512, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}",')


def test_clock_cache_durations_records_sm_l2_and_dram_clocks(monkeypatch):
    """The L2 clock is read beside the SM and DRAM clocks, each a median over the launches, in GHz
    whatever unit ncu printed (a kernel paced by the L2 tells nothing without it)."""
    header = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
              '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value","Rule Name","Rule Type",'
              '"Rule Description","Estimated Speedup Type","Estimated Speedup"')
    per_launch = [("usecond", "4.54"), ("usecond", "4.50"), ("usecond", "4.60")]
    lines = [header]
    for i, (unit, dur) in enumerate(per_launch):
        lines += [_details_line(i, "transpose_naive", "gpu__time_duration.sum", unit, dur),
                  _details_line(i, "transpose_naive", "sm__cycles_elapsed.avg.per_second", "Ghz", "1.59"),
                  _details_line(i, "transpose_naive", "lts__cycles_elapsed.avg.per_second", "Mhz", f"{1709 + i}"),
                  _details_line(i, "transpose_naive", "dram__cycles_elapsed.avg.per_second", "Ghz", "2.62")]
    asked = []

    def fake_listing(args, target=(), **_):
        asked.append(list(args))
        return ncap.Listing(command="ncu", returncode=0, seconds=1.0, output="\n".join(lines) + "\n", profiled=[],
                            passes=[])

    monkeypatch.setattr(runs, "ncu_listing", fake_listing)
    rows = runs.clock_cache_durations("transpose.py", [], "transpose", configs=[("base", "all")])
    assert "lts__cycles_elapsed.avg.per_second" in asked[0][asked[0].index("--metrics") + 1].split(",")
    (row,) = rows
    assert row["launches"] == 3 and row["median_us"] == pytest.approx(4.54)
    assert row["sm_ghz"] == pytest.approx(1.59) and row["dram_ghz"] == pytest.approx(2.62)
    assert row["l2_ghz"] == pytest.approx(1.710)


def test_a_metric_without_a_value_reads_as_empty_not_zero():
    """``ncu --csv --page raw`` leaves a metric empty where the report holds no value (the PM-sampling
    ``*.TriageCompute.*`` metrics of ``--set full``: instances, no value of their own). ``ncu_report``'s ``value()``
    gives 0.0 for them; the dump must give None, as the CLI does."""
    from gpuprof.ncu.report_dump import _value

    class Metric:
        def __init__(self, has: bool, value: object) -> None:
            self._has, self._value = has, value

        def has_value(self) -> bool:
            return self._has

        def value(self) -> object:
            return self._value

    assert _value(Metric(False, 0.0)) is None
    assert _value(Metric(True, 0.0)) == 0.0
    assert _value(Metric(True, 3)) == 3.0
    assert _value(Metric(True, "nvjet")) == "nvjet"


_PREFIX = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TIME_NS = {"us": 1e3, "ms": 1e6, "s": 1e9}


def _scale(csv_unit: str, rep_unit: str) -> float | None:
    """How many of the report's units one of the CLI's display units holds (Gbyte -> byte: 1e9); None where the
    two are not a prefix apart on the numerator (per-Kbyte ratios, unknown pairs: not compared)."""
    if csv_unit == rep_unit:
        return 1.0
    if rep_unit == "ns" and csv_unit in _TIME_NS:
        return _TIME_NS[csv_unit]
    if csv_unit[:1] in _PREFIX and csv_unit[1:].lower() == rep_unit.lower() and "/K" not in csv_unit:
        return _PREFIX[csv_unit[:1]]
    return None


def test_the_report_reads_as_the_cli_prints_it(tmp_path):
    """Issue 38 item 4, on kernels the course did not write (cuBLAS nvjet, cuDNN xmma, PyTorch elementwise and
    softmax; tests/data/ncu/README.md): every metric of the .ncu-rep against ``ncu --import R --csv --page raw`` of
    the same report. An empty CSV cell is NaN on both sides (never 0.0); a number agrees to the CLI's printed digits
    once the display unit is undone."""
    import gzip
    import lzma
    import math

    from gpuprof.ncu.csv_reader import read_raw

    data = REPO_ROOT / "tests" / "data" / "ncu"
    rep = tmp_path / "foreign.ncu-rep"
    rep.write_bytes(lzma.decompress((data / "foreign_kernels.ncu-rep.xz").read_bytes()))
    csv = tmp_path / "raw.csv"
    csv.write_bytes(gzip.decompress((data / "foreign_kernels_raw.csv.gz").read_bytes()))
    cli, units = read_raw(csv)
    printed = pd.read_csv(csv, dtype=str, keep_default_na=False).iloc[1:].reset_index(drop=True)  # the digits shown
    got = nr.metrics(rep)
    values = got.pivot_table(index="id", columns="metric", values="value", aggfunc="first", dropna=False)
    rep_units = got.groupby("metric")["unit"].first()
    assert len(cli) == len(values) == 4
    empty = compared = skipped = 0
    for name in cli.columns.intersection(values.columns):
        for i in range(len(cli)):
            shown, read = cli[name].iloc[i], values[name].iloc[i]
            if isinstance(shown, str):
                continue  # text metrics (names, device attributes)
            if math.isnan(shown):
                empty += 1
                assert math.isnan(read), f"{name}: the CLI prints it empty, the report reads {read!r}"
                continue
            scale = _scale(units.get(name, ""), rep_units.get(name) or "")
            if scale is None:
                skipped += 1
                continue
            compared += 1
            text = printed[name].iloc[i].replace(",", "")
            half_digit = 0.5 * 10.0 ** -(len(text.split(".")[1]) if "." in text else 0)
            assert abs(shown * scale - read) <= (half_digit + 1e-9) * scale + 1e-9 * abs(read), (name, i, text, read)
    assert empty >= 4 * 11, "the PmSampling metrics without a value (11 per kernel) are the point of this test"
    assert compared >= 0.9 * (compared + skipped) and compared > 2500


def test_a_gzipped_report_reads_as_its_plain_copy(tmp_path, monkeypatch):
    """Chapter 11's newer references are committed as ``x.ncu-rep.gz``: the readers take the .gz, or the plain
    name that only exists gzipped, and read the same values as from the decompressed report."""
    import gzip
    import shutil

    monkeypatch.setenv("GPUPROF_CACHE_DIR", str(tmp_path / "cache"))
    packed = REPO_ROOT / "artifacts" / "ch11" / "rungs9_10_8192.ncu-rep.gz"
    plain = tmp_path / "plain.ncu-rep"
    with gzip.open(packed) as f, plain.open("wb") as g:
        shutil.copyfileobj(f, g)
    names = ["gpu__time_duration.sum", "lts__t_requests.sum", "launch__grid_size"]
    want = nr.metric_table(plain, names)
    for path in (packed, packed.with_name("rungs9_10_8192.ncu-rep")):
        got = nr.metric_table(path, names)
        pd.testing.assert_frame_equal(got, want)
    assert list(want["kernel"]) == ["ladder_9_persistent", "ladder_10_cluster_multicast"]
    assert len(list((tmp_path / "cache").glob("rungs9_10_8192-*.ncu-rep"))) == 1
    broken = tmp_path / "broken.ncu-rep.gz"
    broken.write_bytes(b"not gzip")
    with pytest.raises(GpuprofError, match="not a readable gzip"):
        nr.kernels(broken)
