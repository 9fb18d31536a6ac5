"""Every quantity in a notebook's prose is one its outputs print, or carries its source (issue 37).

The checker is ``tests/prose_numbers.py`` (its docstring says what a quantity is and what ties one to a
source); this file holds the one list of exemptions, runs the checker over every notebook, and checks the
checker: its extractor on small strings, and that changing one digit of a real quoted figure in a real
notebook makes the figure unmatched.

A notebook whose prose still quotes figures no output prints is listed in ``NOT_YET_CLEAN``: its test is an
expected failure, strictly, so the day a chapter's prose is fixed its test passes unexpectedly and fails,
and the chapter must leave the list. ``python tests/prose_numbers.py notebooks/NN__x.ipynb`` lists what is
left to fix, with cell ids and sentences.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from prose_numbers import (Exemption, check, check_path, extract, header_dimension, mask_markdown, unmatched,
                          word_quantities)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# Figures no output prints and no sentence can cite, each with where it comes from. Keep it short: a
# measured figure belongs in an output, a documented one cites its document in its sentence.
EXEMPTIONS: tuple[Exemption, ...] = (
    Exemption("05__pytorch_profiler", "141c4cc5", "76,938",
              "the CNN's parameter count, in gpuprof.models.small_cnn's docstring (the sum of its parameters' numel)"),
    Exemption("06__cnn_training", "7cd4e40d", "76,938",
              "the CNN's parameter count, in gpuprof.models.small_cnn's docstring (the sum of its parameters' numel)"),
    Exemption("06__cnn_training", "06e58b54", "6.5 s",
              "python -c 'import torch' timed on the course's H100 host, recorded in gpuprof/fork_runs.py's docstring"),
    Exemption("06__cnn_training", "7d21c9ed", "30 MB", "arithmetic: 10,000 uint8 images of 3 x 32 x 32 bytes, 30.7 MB"),
    Exemption("06__cnn_training", "0e1b9fca", "34 MB; 134 MB",
              "arithmetic in the sentence: 1024 x 64 x 16 x 16 x 2 bytes; the same x 8 (int64); 1024 x 64 x 32 x 32 x 2; "
              "their sum, 302 MB, and the kernel's own 201 MB are what c6pool02 prints"),
    Exemption("11__matmul_ladder", "c11s2c", "600 FLOP",
              "arithmetic: 2 x 4096³ = 137 GFLOP over the 0.23 to 0.25 GB of DRAM traffic c11counters prints for the "
              "tiled rungs (dram_GB)"),
    Exemption("11__matmul_ladder", "c11end", "3.9", "arithmetic in the sentence: 512 tiles over 132 SMs"),
    Exemption("04__nsight_compute", "7c3bc00a", "85%",
              "artifacts/ch04_h200/transpose.json, named in the sentence: padded rate over its device "
              "copy, 84.7%"),
    Exemption("04__nsight_compute", "730d5f7f", "60%",
              "the threshold in ncu 2025.3's SOLBottleneck rule (sections/SOLBottleneck.py), named in the sentence"),
    Exemption("04__nsight_compute", "65cbf436", "233 KB; 135 KB; 102 KB",
              "artifacts/ch04/occupancy.details.csv, 'Shared Memory Configuration Size': 233.47, 135.17, 102.40 Kbyte"),
    Exemption("04__nsight_compute", "147c8cdf", "2 ms", "examples/nsight_compute/replay_modes.py's --spin-us default, 2000.0"),
    Exemption("04__nsight_compute", "f7b7b041", "2 ms", "examples/nsight_compute/replay_modes.py's --spin-us default, 2000.0"),
)

# Chapters whose prose still quotes figures that no output prints: strict expected failures (none left; a new
# chapter still being written may be listed here while its prose catches up with its outputs).
NOT_YET_CLEAN: set[str] = set()


def _param(path: Path):
    marks = [pytest.mark.xfail(strict=True, reason="prose fixes pending, issue 37")] if path.stem in NOT_YET_CLEAN else []
    return pytest.param(path, marks=marks, id=path.stem)


@pytest.mark.parametrize("path", [_param(p) for p in NOTEBOOKS])
def test_every_quantity_in_the_prose_is_printed_or_sourced(path):
    missing = unmatched(json.loads(path.read_text()), path.stem, EXEMPTIONS, path.parent)
    assert not missing, (
        f"{len(missing)} quantities in {path.name}'s prose that no output prints, no code sets and no sentence "
        "cites (state the figure the output prints, or name the source in the sentence):\n"
        + "\n".join(f"  [{f.cell}] {f.quantity.shown!r}: {f.sentence[:200]}" for f in missing))


def test_the_lists_name_real_notebooks_and_every_exemption_is_needed():
    stems = {p.stem for p in NOTEBOOKS}
    assert NOT_YET_CLEAN <= stems, sorted(NOT_YET_CLEAN - stems)
    for e in EXEMPTIONS:
        assert e.notebook in stems and e.source.strip(), e
        findings = check_path(ROOT / "notebooks" / f"{e.notebook}.ipynb")
        for figure in e.figures:
            these = [f for f in findings if f.cell == e.cell and f.quantity.text == figure]
            assert these, f"exemption for a quantity the prose no longer has: {figure!r} in {e}"
            assert any(not f.how for f in these), f"exemption no longer needed (the checker ties it): {figure!r} in {e}"


# ---- the extractor ----------------------------------------------------------------------------------------


def texts(markdown: str) -> list[str]:
    return [q.shown for q in extract(markdown)]


@pytest.mark.parametrize("markdown, expected", [
    ("took 3.3 us per launch", ["3.3 us"]),
    ("a 2.3x gain, then 2.3× again, and 32 times the images", ["2.3x", "2.3×", "32 times"]),
    ("busy 95.4% of the time, 12 percent idle", ["95.4%", "12 percent"]),
    ("copied at 2,763.6 GB/s (3 TB/s), 64 MiB at a time", ["2,763.6 GB/s", "3 TB/s", "64 MiB"]),
    ("241 kernels and 1,201 calls", ["241", "1,201"]),
    ("from 1.8 to 2.1 ms, 13 to 15% of the step", ["1.8 [ms]", "2.1 ms", "13 [%]", "15%"]),
    ("3, 6 and 12 KiB", ["3 [KiB]", "6 [KiB]", "12 KiB"]),
    ("a loss of 2.31 after 67 million floats", ["2.31", "67 million"]),
    ("the step took 12\nms on the GPU", ["12 ms"]),
    ("It ran 989 TFLOP/s and 1.98 GHz at 700 W", ["989 TFLOP/s", "1.98 GHz", "700 W"]),
])
def test_the_extractor_reads_quantities(markdown, expected):
    assert texts(markdown) == expected


@pytest.mark.parametrize("markdown", [
    "run `--batch-size 1024 --steps 200` and read `0.95`",  # inline code
    "```python\nx = 1024 * 3.3\n```",  # fenced code
    "the cost is $2n^3 = 1.5$ flops",  # math
    "see [the guide](https://docs.nvidia.com/cuda/1234/index.html#5.2)",  # a link target
    "prefetching hid {glue:text}`ch03_hidden` of it",  # a glue role
    "## 3. The captures",  # heading numbering
    "1. Run it.\n2. Compare.",  # list numbering
    "captured on 2026-11-24 in 2025 with nsys 2025.3.1, torch 2.11, CUDA 13.0, Nsight Compute\n2025.3",  # versions
    "on an H100 (sm_90) in bf16 with int64 indices",  # identifiers
    "32 x 32 images, 1024x768 and 4 x 4 tiles",  # dimensions
    "the 2.7B model, rank 0 times a copy, chapter 11",  # a model's name, a verb, a chapter
    "two blocks, rung 8, batch 32, 5 steps",  # small bare integers
])
def test_the_extractor_skips_what_is_not_a_quantity(markdown):
    assert texts(markdown) == []


def test_masking_keeps_offsets():
    text = "A `code 12` cell, $x = 3$ and [a link](http://x/1) then 4.5 ms."
    masked = mask_markdown(text)
    assert len(masked) == len(text) and masked.index("4.5 ms") == text.index("4.5 ms")


def test_the_command_line_lists_what_is_unmatched(tmp_path, capsys):
    from prose_numbers import main

    path = tmp_path / "99__x.ipynb"
    path.write_text(json.dumps(notebook("It took 3.3 us, then 14.5x.", "3.27 us")))
    assert main([str(path), "--no-exemptions"]) == 1
    out = capsys.readouterr().out
    assert "1 unmatched" in out and "[prose] '14.5x' (UNMATCHED): It took 3.3 us, then 14.5x." in out
    path.write_text(json.dumps(notebook("It took 3.3 us.", "3.27 us")))
    assert main([str(path), "--explain"]) == 0
    assert "'3.3 us' (near [run] '3.27 us')" in capsys.readouterr().out


def test_words_are_reported_not_failed():
    nb = {"cells": [{"cell_type": "markdown", "id": "w", "source": ["It took twice as long, most of them idle."]}]}
    assert [phrase for _, phrase, _ in word_quantities(nb, "x")] == ["twice", "most of them"]
    assert check(nb, "x") == []


# ---- the checker on small notebooks -----------------------------------------------------------------------


def notebook(prose: str, printed: str, code: str = "print(x)") -> dict:
    return {"cells": [
        {"cell_type": "markdown", "id": "intro", "source": ["# A chapter\n"]},
        {"cell_type": "code", "id": "run", "source": [code],
         "outputs": [{"output_type": "stream", "name": "stdout", "text": [printed]}]},
        {"cell_type": "markdown", "id": "prose", "source": [prose]},
    ]}


@pytest.mark.parametrize("prose, printed, tied", [
    ("The kernel took 3.3 us.", "median kernel 3.27 us", True),  # rounding the prose uses
    ("The kernel took 3.3 us.", "median kernel 3.37 us", False),
    ("The kernel took 3.3 us.", "median kernel 0.0033 ms", True),  # another unit of the same dimension
    ("The kernel took 3.3 us.", "median kernel 3.3x", False),  # another dimension
    ("It was busy 95% of the time.", "busy_share 0.954", True),  # a fraction, read as a percentage
    ("It gained 14.5x.", "gain: 14.5x the naive loop", True),
    ("It gained 14.5x.", "gain: 14.6x the naive loop", False),
    ("It copied 1 GiB.", "copied 512 MiB", False),  # rounds to 1 GiB, but is not 1 GiB: within 10%
    ("It ran 349,269 images/s.", "349269.4 images/s", True),
    ("Per the datasheet, 989 TFLOP/s.", "nothing", True),  # a sentence that cites its source
    ("The default if the driver is 11.7 or higher, says `nsys profile --help`.", "nothing", True),  # a tool's help
    ("The default if the driver is 11.7 or higher, says `nsys profile`.", "nothing", False),
    ("It ran 1024 steps.", "nothing", False),
])
def test_a_quantity_is_tied_to_what_is_printed(prose, printed, tied):
    assert (unmatched(notebook(prose, printed), "x") == []) is tied


def test_a_header_named_min_is_the_statistic_not_minutes():
    assert header_dimension("min") is None and header_dimension("max") is None
    assert header_dimension("min_us") == header_dimension("median_us") == ("time", 1e-6)
    assert header_dimension("time_ms") == ("time", 1e-3)


def test_a_parameter_the_code_sets_is_its_own_source():
    assert unmatched(notebook("Each run copies 64 MiB.", "done", "run(size_mib=64)"), "x") == []
    assert unmatched(notebook("Each run copies 64 MiB.", "done", "run(size_mib=65)  # not 64"), "x") != []
    # a 64 in code that names no size is not the source of a size
    assert unmatched(notebook("Each run copies 64 MiB.", "done", "run(steps=64)"), "x") != []
    assert unmatched(notebook("It ran 1024 steps.", "done", "run(steps=1024)"), "x") == []  # a count needs no unit


def test_a_figure_far_from_its_output_must_be_the_printed_one():
    nb = notebook("The step took 14.6 ms.", "the step took 14.55 ms")
    assert unmatched(nb, "x") == []  # near its output, a rounding is fine
    nb["cells"] += [{"cell_type": "markdown", "id": "next", "source": ["## Later\n"]},
                    {"cell_type": "markdown", "id": "later", "source": ["The step took 14.6 ms.\n"]}]
    assert [(f.cell, f.quantity.text) for f in unmatched(nb, "x")] == [("later", "14.6 ms")]  # far away, it is not
    nb["cells"][-1]["source"] = ["The step took 14.55 ms.\n"]
    assert unmatched(nb, "x") == []


# ---- one changed digit of a real quoted figure is caught --------------------------------------------------

# (notebook, cell id, the figure as the prose writes it): real quotes of several kinds, each tied today.
QUOTED = [
    ("06__cnn_training", "c6nchw2", "0.601 ms"),  # a time per step, read from a table
    ("06__cnn_training", "7d21c9ed", "10,000"),  # a count with a thousands separator
    ("07__transformer", "c7warm03", "37.34 ms"),  # a time with its unit
    ("07__transformer", "db8439a1", "1.039x"),  # a ratio read from an output (0.998x: 0.997 is printed by the census; 0.98x reads 0.97x beside it)
    ("07__transformer", "c7opt000", "28 bytes"),  # a size
    ("08__multi_gpu", "c8bf16m1", "77%"),  # a percentage
    # a time read from a table (18.06 ms was the pick until chapter 7's step table printed an 18.07 in its sync_ms
    # column: the sentence names chapter 7, so 18.07 tied by chance)
    ("08__multi_gpu", "c8bf16m1", "19.35 ms"),
    ("08__multi_gpu", "ce4e13b1", "327 GB/s"),  # a bandwidth, quoted a section away from its output
    ("08__multi_gpu", "c8fbm1", "1.008x"),
    ("11__matmul_ladder", "c11s1c", "0.85x"),
]


def one_digit_changes(figure: str) -> list[str]:
    """The figure with its last digit one up and one down (a re-run's drift), and its first digit one up."""
    digits = [i for i, ch in enumerate(figure) if ch.isdigit()]
    out = []
    for i, delta in ((digits[-1], 1), (digits[-1], -1), (digits[0], 1)):
        new = str((int(figure[i]) + delta) % 10)
        if i == digits[0] and new == "0":
            continue
        out.append(figure[:i] + new + figure[i + 1:])
    return out


def ties(nb: dict, name: str, cell: str, figure: str) -> list[bool]:
    return [bool(f.how) for f in check(nb, name) if f.cell == cell and f.quantity.text == figure]


@pytest.mark.parametrize("name, cell, figure", QUOTED, ids=[f"{n[:2]}-{c}-{f}" for n, c, f in QUOTED])
def test_changing_one_digit_of_a_quoted_figure_is_caught(name, cell, figure):
    nb = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
    found = ties(nb, name, cell, figure)
    assert found and all(found), f"{name} [{cell}] no longer quotes {figure!r} as a tied figure: pick another"
    index = next(i for i, c in enumerate(nb["cells"]) if c["id"] == cell)
    source = "".join(nb["cells"][index]["source"])
    for changed in one_digit_changes(figure):
        altered = copy.deepcopy(nb)
        altered["cells"][index]["source"] = [re.sub(rf"(?<![\w.,]){re.escape(figure)}(?![\w])", changed, source)]
        assert ties(altered, name, cell, changed) == [False] * len(found), f"{figure!r} -> {changed!r} still tied"
