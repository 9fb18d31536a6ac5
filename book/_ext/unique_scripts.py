"""Sphinx extension: drop duplicate <script> entries before each page is written.

Why: with jupyter-book 1.0.4 and sphinx-thebe 0.3.1, sphinx-thebe's configuration
script (``const THEBE_JS_URL = ...``) is registered twice, so every page declares the
same ``const`` twice and the browser reports a SyntaxError on every page. The book's
browser test (tests/test_built_book.py) fails on any console error, which is how this
was found. Removing exact duplicates changes nothing else.
"""

from __future__ import annotations

from typing import Any


def _unique(app: Any, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen: set[tuple[str, str]] = set()
    unique = []
    for js in scripts:
        # filename is None for one registration and "" for the other: both mean "inline body"
        key = (str(getattr(js, "filename", js) or ""), repr(sorted(getattr(js, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(js)
    context["script_files"] = unique


def setup(app: Any) -> dict[str, Any]:
    app.connect("html-page-context", _unique, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
