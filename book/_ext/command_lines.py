"""Sphinx extension: split long shell command lines into lines that fit the content column.

Why: the chapters print the exact command behind every capture (a cell output line that
starts with ``$ ``, up to 2,788 characters for an ncu run with its metric list), and a few
prose code blocks hold commands of 100-120 characters. In a 1400 px window the content
column shows about 86 characters of code; the rest was out of sight behind a sideways
scrollbar. This extension rewrites only what the HTML page shows (the notebooks and their
outputs are unchanged): a command line longer than ``LIMIT`` is split at spaces outside
quotes into shell continuation lines (`` \\`` at the end, four spaces of indent), so what a
reader copies is still one command that a shell runs as printed. A single argument too long
for a line (``--metrics a,b,c,...``) is split after its commas with a backslash-newline and
no indent, which a shell removes before it reads the word. A trailing comment (``# ...``) or
the notebook's note after `` -> `` is kept whole at the end.

Where: lines starting with ``$ `` in notebook cell outputs, and every line that is not a
comment in a prose code block marked bash/sh/shell/console/text or with no language.
"""

from __future__ import annotations

from typing import Any

from docutils import nodes

LIMIT = 84  # characters of code the content column shows at 1400 px (measured in Chromium: ~86)
INDENT = "    "
SHELL_LANGUAGES = {"", "none", "default", "bash", "sh", "shell", "console", "text"}


def _tokens(body: str) -> list[str]:
    """Split at runs of spaces outside single or double quotes; quotes stay in their token."""
    out: list[str] = []
    cur, quote = "", ""
    for ch in body:
        if quote:
            cur += ch
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            cur += ch
            quote = ch
        elif ch == " ":
            if cur:
                out.append(cur)
                cur = ""
        else:
            cur += ch
    if cur:
        out.append(cur)
    return out


def _tail_start(line: str) -> int:
    """Index where a trailing comment (`` #``) or the notebook's `` -> `` note starts; len(line) if none."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == " " and (line.startswith(" #", i) or line.startswith(" -> ", i)):
            return i
    return len(line)


def _split_word(word: str, width: int) -> list[str]:
    """A word longer than ``width``, cut after commas outside quotes into pieces of at most ``width``."""
    pieces, cur, quote = [], "", ""
    for ch in word:
        cur += ch
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == ",":
            pieces.append(cur)
            cur = ""
    if cur:
        pieces.append(cur)
    out, line = [], ""
    for p in pieces:
        if line and len(line) + len(p) > width:
            out.append(line)
            line = ""
        line += p
    if line:
        out.append(line)
    return out


def split_command_line(line: str, limit: int = LIMIT) -> str:
    """``line`` as shell continuation lines of at most ``limit`` characters where it can be cut
    (a quoted string or a comma-free word longer than a line stays whole); unchanged if it fits."""
    if len(line) <= limit:
        return line
    lead = line[: len(line) - len(line.lstrip(" "))]
    rest = line[len(lead):]
    prompt = "$ " if rest.startswith("$ ") else ""
    rest = rest[len(prompt):]
    if rest.startswith("#"):  # a comment, not a command
        return line
    cut = _tail_start(rest)
    body, tail = rest[:cut].rstrip(), rest[cut:].strip()
    words = _tokens(body)
    if len(words) < 2 and len(body) <= limit:
        return line
    indent = lead + INDENT
    lines: list[str] = []
    cur = lead + prompt
    after_long = False  # the word after one cut at its commas starts a line of its own
    for w in words:
        first = cur in (lead + prompt,)
        if w == "\\" or first and len(cur) + len(w) <= limit - 2:
            cur += ("" if first else " ") + w
            continue
        if not after_long and len(cur) + 1 + len(w) + 2 <= limit:
            cur += " " + w
            continue
        if len(indent) + len(w) + 2 <= limit:
            lines.append(cur + " \\")
            cur = indent + w
            after_long = False
            continue
        # a word longer than a line: start it on a fresh line, then cut it after its commas
        if not first:
            lines.append(cur + " \\")
            cur = indent
        parts = _split_word(w, max(limit - len(cur) - 1, 20))
        for p in parts[:-1]:
            lines.append(cur + p + "\\")
            cur = ""
        cur += parts[-1]
        after_long = True
    if tail:
        if tail.startswith("#") and len(cur) + 1 + len(tail) > limit:
            lines.append(cur + " \\")
            cur = indent + tail
        else:
            cur += " " + tail
    lines.append(cur)
    return "\n".join(lines)


def split_commands(text: str, only_prompted: bool, limit: int = LIMIT) -> str:
    """Every long command line of a block split; ``only_prompted``: only lines starting with ``$ ``."""
    out = []
    for line in text.split("\n"):
        stripped = line.lstrip(" ")
        if stripped.startswith("#") or (only_prompted and not stripped.startswith("$ ")):
            out.append(line)
        else:
            out.append(split_command_line(line, limit))
    return "\n".join(out)


def _in_cell(node: nodes.Node, cls: str) -> bool:
    parent = node.parent
    while parent is not None:
        if cls in parent.get("classes", []):
            return True
        parent = parent.parent
    return False


def _split_blocks(app: Any, doctree: nodes.document, docname: str) -> None:
    for block in list(doctree.findall(nodes.literal_block)):
        if _in_cell(block, "cell_input"):
            continue
        in_output = _in_cell(block, "cell_output")
        if not in_output and block.get("language", "") not in SHELL_LANGUAGES:
            continue
        text = block.astext()
        if block.rawsource != text:  # a parsed-literal block with markup inside: leave it
            continue
        new = split_commands(text, only_prompted=in_output)
        if new != text:
            block.rawsource = new
            block.children = []
            block += nodes.Text(new)


def setup(app: Any) -> dict[str, Any]:
    app.connect("doctree-resolved", _split_blocks)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
