"""The book's command-line splitter (book/_ext/command_lines.py): what it prints fits the column
and is, to a shell, the very command the notebook printed."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from gpuprof.artifacts import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "book" / "_ext"))
from command_lines import LIMIT, split_command_line, split_commands  # noqa: E402


def printed_commands() -> list[str]:
    """Every line starting with `$ ` in a stored cell output, and every line of a prose shell block."""
    lines = []
    for nb_path in sorted((REPO_ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(nb_path.read_text())["cells"]:
            for out in cell.get("outputs", []):
                text = "".join(out.get("text", [])) + "".join(out.get("data", {}).get("text/plain", []))
                lines += [ln for ln in text.split("\n") if ln.startswith("$ ")]
            if cell["cell_type"] == "markdown":
                for m in re.finditer(r"(?ms)^\s*```(|bash|sh|shell|console|text)\n(.*?)^\s*```", "".join(cell["source"])):
                    lines += [ln for ln in m.group(2).split("\n") if not ln.lstrip().startswith("#")]
    return lines


def continued(text: str) -> str:
    """What a shell reads: a backslash-newline pair is removed from the input (bash manual, 'Escape Character')."""
    return text.replace("\\\n", "")


def test_there_are_long_commands_to_split():
    assert sum(len(ln) > LIMIT for ln in printed_commands()) > 50


@pytest.mark.parametrize("line", [ln for ln in printed_commands() if len(ln) > LIMIT and not ln.startswith("$ #")])
def test_a_split_command_is_the_same_command_and_fits(line):
    split = split_command_line(line)
    assert "\n" in split
    # a line that already ends in a continuation keeps it at its end
    assert shlex.split(continued(split).removesuffix("\\")) == shlex.split(line.removesuffix("\\"))
    too_long = [ln for ln in split.split("\n") if len(ln) > LIMIT]
    # only a word that cannot be cut (quoted, or with no comma) may stay longer than a line
    for ln in too_long:
        assert any(len(w) > LIMIT // 2 and "," not in w.strip("\\") for w in ln.split()) or "->" in ln, (ln, split)


def test_a_real_shell_reads_the_split_command_as_the_original():
    if not shutil.which("bash"):
        pytest.skip("no bash")
    line = next(ln for ln in printed_commands() if ln.startswith("$ ncu") and "--metrics" in ln and len(ln) > 500)
    split = split_command_line(line)
    argv = [subprocess.run(["bash", "-c", 'f() { printf "%s\\n" "$@"; }; f ' + cmd[2:]], capture_output=True,
                           text=True, check=True).stdout for cmd in (line, split)]
    assert argv[0] == argv[1] and argv[0].count("\n") > 10
    assert max(len(ln) for ln in split.split("\n")) <= LIMIT


def test_what_is_left_alone():
    short = "$ nsys stats --report nvtx_sum x.sqlite"
    assert split_command_line(short) == short
    comment = "$ # " + "a comment that is long " * 6
    assert split_command_line(comment) == comment
    output = "kernel " * 20
    assert split_commands(output, only_prompted=True) == output
    note = "$ nsys recipe gpu_gaps --input naive.nsys-rep --output recipe_gpu_gaps_naive --mode none -> ok, but: no data"
    assert split_command_line(note).endswith("-> ok, but: no data")


def test_a_trailing_comment_stays_a_comment():
    line = "$ nsys launch --session-new=course-interactive --trace=cuda,nvtx python examples/x.py --seconds 12   # in the background"
    split = split_command_line(line)
    assert split.split("\n")[-1].strip() == "# in the background" or split.endswith("# in the background")
    assert shlex.split(continued(split), comments=True) == shlex.split(line, comments=True)
