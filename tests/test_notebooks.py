"""The committed notebooks are GPU-executed, clean and small (a format check, like a linter)."""

import json
import re

import pytest

from gpuprof.artifacts import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))


def cells(nb, kind="code"):
    return [c for c in nb["cells"] if c["cell_type"] == kind]


def text_of(cell):
    out = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            out.append("".join(o["text"]))
        for v in o.get("data", {}).values():
            if isinstance(v, (str, list)):
                out.append("".join(v))
    return "\n".join(out)


@pytest.fixture(params=NOTEBOOKS, ids=lambda p: p.name)
def nb(request):
    return json.loads(request.param.read_text()), request.param


def test_named_by_convention(nb):
    _, path = nb
    number, _, topic = path.stem.partition("__")
    assert number.isdigit() and len(number) == 2 and topic


def test_executed_on_a_gpu_with_provenance_first(nb):
    data, _ = nb
    code = cells(data)
    assert all(c.get("outputs") or "remove-cell" in c.get("metadata", {}).get("tags", []) for c in code)
    first = text_of(code[0])
    # "NVIDIA H100 ..." or, on a machine of several, "2 x NVIDIA H200 ..."
    assert re.match(r"(\d+ x )?NVIDIA ", first) and "driver" in first, "the first output must name the GPU that ran it"


def test_no_errors_or_stderr_in_stored_outputs(nb):
    data, _ = nb
    for c in cells(data):
        for o in c.get("outputs", []):
            assert o["output_type"] != "error", "".join(c["source"])[:80]
            assert not (o["output_type"] == "stream" and o["name"] == "stderr"), "".join(c["source"])[:80]


def tags(cell):
    return cell.get("metadata", {}).get("tags", [])


def test_checked_cells_exist_and_the_book_is_not_asked_to_execute(nb):
    data, _ = nb
    assert any("nbval-check-output" in tags(c) for c in cells(data)), \
        "a chapter needs cells whose output CI compares on the reference captures"
    assert data["metadata"]["kernelspec"]["name"] == "python3"
    assert all("id" in c for c in data["cells"])


def test_test_scaffolding_stays_out_of_the_rendered_code(nb):
    """nbval is driven by cell tags, not by comments a reader would see on the page."""
    data, _ = nb
    for c in cells(data):
        assert "NBVAL_" not in "".join(c["source"]), "".join(c["source"])[:80]
        if "remove-cell" in tags(c):
            assert "nbval-ignore-output" in tags(c), "a glue cell's output is for the book, not a comparison"
        assert not {"nbval-check-output", "nbval-ignore-output"} <= set(tags(c))


def test_measuring_cells_read_as_the_call_that_measures(nb):
    """The capture plumbing (a GPU switch, a try/except around a save, then a find) is written once, in
    gpuprof.artifacts.measure_or_reference, so that a cell shows the call a reader would type."""
    data, _ = nb
    for c in cells(data):
        src = "".join(c["source"])
        assert not re.search(r"^\s*if LIVE\b|^\s*except\b", src, re.M), src[:80]


def test_the_setup_cell_is_folded(nb):
    """A chapter's import block is folded on the page (its output, the machine line, stays shown); chapter 0
    shows it, since setting up is its subject."""
    data, path = nb
    first = cells(data)[0]
    assert path.name.startswith("00__") or "hide-input" in tags(first)


def test_cells_whose_output_depends_on_the_run_say_why(nb):
    """An ignored output must be explained to the reader in the cell itself (a first-line comment)."""
    data, _ = nb
    for c in cells(data):
        if "nbval-ignore-output" in tags(c) and "remove-cell" not in tags(c):
            first = "".join(c["source"]).lstrip().splitlines()[0]
            assert first.startswith("# ("), f"say why this output is not compared: {first[:80]}"


def test_small(nb):
    _, path = nb
    # 450 kB: chapters 4 and 6 passed 400 kB with the prose and checks the expert reviews asked for (their figures
    # are stored as the capture run stores them, RGB PNGs at matplotlib's inline size)
    assert path.stat().st_size < 450_000, "keep notebooks small: fewer or smaller figures"
