"""Claims the prose makes about the tools, checked against listings captured from the real tools."""

import re

from gpuprof.artifacts import REPO_ROOT

SETS = REPO_ROOT / "artifacts" / "tools" / "ncu-list-sets.txt"
TROUBLESHOOTING = REPO_ROOT / "book" / "troubleshooting.md"


def captured_sets() -> tuple[set[str], set[str]]:
    """(all set identifiers, the enabled ones) from `ncu --list-sets` as captured on the GPU machine."""
    names, enabled = set(), set()
    for line in SETS.read_text().splitlines():
        m = re.match(r"^([a-z]+)\s+\S.*?\s(yes|no)\s+\d+\s*$", line)
        if m:
            names.add(m.group(1))
            if m.group(2) == "yes":
                enabled.add(m.group(1))
    return names, enabled


def test_ncu_sets_named_in_the_troubleshooting_page_are_the_real_ones():
    names, enabled = captured_sets()
    assert "default" not in names
    assert enabled == {"basic"}, "the page says basic is used when no set is named"
    text = TROUBLESHOOTING.read_text()
    section = text[text.index("## `ncu --set default` collects nothing"):]
    section = section[: section.index("\n## ", 5)]
    named = set(re.findall(r"`([a-z]+)`", section)) - {"default"}
    assert named == names, f"page names {sorted(named)}, ncu lists {sorted(names)}"


# ---- "Commands from older write-ups": what nsys 2025.3.1 answered on the GPU machine ----------------------

TOOLS = REPO_ROOT / "artifacts" / "tools"


def older_section() -> str:
    text = TROUBLESHOOTING.read_text()
    section = text[text.index("## Commands from older write-ups"):]
    return section[: section.index("\n## ", 5)]


def test_the_older_commands_table_says_what_nsys_answered():
    import json

    facts = json.loads((TOOLS / "older-commands.json").read_text())
    section = older_section()
    assert "2025.3.1" in facts["nsys"] and "2025.3.1" in section
    bt = facts["cudabacktrace"]
    assert bt["true"]["rc"] == 0 and bt["true"]["with_backtrace"] == bt["all"]["with_backtrace"] > 0
    assert bt["none"]["with_backtrace"] == 0
    assert f"{bt['all']['with_backtrace']} of the {bt['all']['cuda_api_calls']} CUDA API calls" in section
    assert facts["stats_gputrace"]["rc"] == 0 and "Report 'gputrace' could not be found" in facts["stats_gputrace"]["said"][0]
    assert "ERROR: Report 'gputrace' could not be found." in section and "exits with status 0" in section
    older = facts["older_profile_line"]
    assert older["files"] == ["result.nsys-rep"] and older["rc"] == 143 and "exit status 143" in section
    assert facts["nvprof"]["on_path"] is None and not facts["nvprof"]["nvprof_in_cuda_bin"]
    assert not facts["nvprof"]["nvvp_in_cuda_bin"]


def test_the_switches_and_reports_the_table_names_are_in_the_captured_help():
    help_text = (TOOLS / "nsys-profile-help.txt").read_text()
    reports = (TOOLS / "nsys-stats-help-reports.txt").read_text()
    trace_values = help_text[help_text.index("-t, --trace="):help_text.index("Select the API(s) to trace")]
    assert "'nvmedia'" not in trace_values and "--accelerator-trace" not in help_text
    for value in ("'cuda'", "'cudnn'", "'osrt'", "'nvtx'"):
        assert value in trace_values
    bt = help_text[help_text.index("--cudabacktrace="):]
    assert "'all','none','kernel','memory','sync','other'" in bt[:200] and "'true'" not in bt[:200]
    assert "Default is 'sigterm'" in help_text[help_text.index("--kill="):][:400]
    for switch in ("-y, --delay=", "-d, --duration=", "-w, --show-output=", "--cuda-memory-usage=", "-f, --force-overwrite="):
        assert switch in help_text, switch
    for report in ("cuda_gpu_trace", "cuda_gpu_kern_sum"):
        assert f"  {report}[" in reports
    assert "gputrace " not in reports.replace("cuda_gpu_trace", "")


def test_the_nvprof_metric_table_uses_names_this_ncu_lists():
    """Every ncu metric in the nvprof table exists, with that exact suffix, in ncu 2025.3.1's own listing for GH100."""
    import csv
    import gzip
    import re

    suffixes = gzip.decompress((TOOLS / "ncu-metric-suffixes.txt.gz").read_bytes()).decode()
    bases = gzip.decompress((TOOLS / "ncu-query-metrics-gh100.txt.gz").read_bytes()).decode()
    assert "--chip gh100" in suffixes.splitlines()[0] and "2025.3.1" in suffixes.splitlines()[1]
    full = {line.split()[0] for line in suffixes.splitlines() if "__" in line.split(" ")[0]}
    types = {parts[0]: parts[1] for parts in (line.split() for line in bases.splitlines()) if len(parts) > 1 and "__" in parts[0]}
    rows = list(csv.DictReader((TOOLS / "nvprof-ncu-metrics.csv").open()))
    assert len(rows) >= 20 and len({r["nvprof metric"] for r in rows}) == len(rows)
    for row in rows:
        terms = re.findall(r"[a-z0-9_]+__[a-z0-9_.]+", row["ncu metric (or expression)"])
        assert terms or row["ncu metric (or expression)"] == "n/a", row
        for term in terms:
            assert term in full, f"{row['nvprof metric']}: {term} is not in ncu's listing"
        for named in re.findall(r"use ([a-z0-9_]+__[a-z0-9_]+)", row["what it measures"]):
            assert types.get(named) == "Ratio", named
    # a deprecation the table reports is ncu's own word
    assert "[DEPRECATED: use smsp__average_thread_inst_executed_per_inst_executed instead]" in " ".join(bases.split())
    section = TROUBLESHOOTING.read_text()
    assert ":file: ../artifacts/tools/nvprof-ncu-metrics.csv" in section
    assert "https://docs.nvidia.com/nsight-compute/2020.1/pdf/NsightComputeCli.pdf" in section


def _toc_notebooks() -> list[str]:
    toc = (REPO_ROOT / "_toc.yml").read_text()
    return re.findall(r"file: notebooks/(\d\d__\w+)", toc)


def test_the_sidebar_lists_every_chapter_in_the_order_of_its_number():
    listed = _toc_notebooks()
    on_disk = sorted(p.stem for p in (REPO_ROOT / "notebooks").glob("[0-9][0-9]__*.ipynb"))
    assert listed == on_disk, "_toc.yml should list every notebook, chapter 0 first, in the order of their numbers"


def test_the_landing_page_status_names_every_chapter():
    intro = (REPO_ROOT / "book" / "intro.md").read_text()
    status = intro[intro.index("{admonition} Status of the course"):]
    status = status[: status.index("```")]
    missing = [nb for nb in _toc_notebooks() if f"notebooks/{nb}" not in status]
    assert missing == [], f"the landing page's status does not mention {missing}"


def test_the_readme_and_the_makefile_name_the_parts_gpu_nbval_has():
    import sys

    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    from gpu_nbval import PARTS

    n = len(PARTS)
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert f"PART=1 to {n} " in makefile
    readme = (REPO_ROOT / "README.md").read_text()
    said = dict(re.findall(r"part (\d) (chapters? \d+(?:-\d+|(?:, \d+)*(?: and \d+)?))", readme))
    assert sorted(map(int, said)) == sorted(PARTS), "the README should describe each part of scripts/gpu_nbval.py"
    for part, text in said.items():
        chapters = {int(c) for c in re.findall(r"\d+", text)}
        if "-" in text:
            lo, hi = map(int, re.findall(r"\d+", text)[:2])
            chapters = set(range(lo, hi + 1))
        assert chapters == {int(nb[:2]) for nb in PARTS[int(part)]}, f"part {part}: {text}"


def _pins(name: str) -> dict[str, str]:
    pins = {}
    for line in (REPO_ROOT / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            package, version = line.split("==")
            pins[package.lower().replace("_", "-")] = version
    return pins


def test_the_book_requirements_are_the_test_requirements_pins():
    """`make book` installs requirements-book.txt alone, `make test` requirements.txt too, into one .venv:
    every book pin must be in requirements.txt at the same version, or the second install would change the first."""
    book, full = _pins("requirements-book.txt"), _pins("requirements.txt")
    assert "jupyter-book" in book and "playwright" not in book and "pandas" not in book
    assert {p: v for p, v in book.items() if full.get(p) != v} == {}
