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
