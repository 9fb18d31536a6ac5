"""Open the built book in a real headless Chromium: no console errors, every link and image resolves.

Run after `make book` (the Makefile's test target builds first). The pages are served
from localhost; any request that would leave the machine is blocked and reported,
because the book must work offline and must not depend on a CDN.

Each page is also read as a reader sees it, at 1400 px: no TeX source in its rendered
text (a formula MathJax did not typeset prints as `$A$` or `\\times`), and no table or
image sticking out of the content column where no scrollbar shows the rest. Both checks
are run on small pages built to fail (tests/data/browser/), so that they can fail.
Screenshots of three pages are kept under _build/screenshots/ to see how the book looks.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import threading
from urllib.parse import urldefrag, urljoin, urlparse

import pytest

from gpuprof.artifacts import REPO_ROOT

BUILD = REPO_ROOT / "_build" / "html"
SCREENSHOTS = REPO_ROOT / "_build" / "screenshots"
FIXTURES = REPO_ROOT / "tests" / "data" / "browser"
VIEWPORT = {"width": 1400, "height": 900}

# What a reader's eye checks on a page, in the browser (returns a list of problems; empty is good).
# - TeX source in the rendered text, outside code: `$...$`, `\(...\)` or a TeX command such as
#   \times or \top. Text inside MathJax's output, <pre>, <code>, <kbd>, <samp> is not prose.
# - A `.math` element MathJax left untypeset or typeset as an error.
# - A table or image whose right edge (or its cells') lies past the content column, unless the
#   nearest box that clips it scrolls (overflow-x auto/scroll), itself fits in the column, and is
#   no taller than the window (or its sideways scrollbar is off screen while the table is read).
# - A command line (`$ ...` in a <pre>, or a line continued with a backslash) longer than its box
#   shows: book/_ext/command_lines.py splits them; a line cut by the box's edge hides arguments.
READER_CHECK = r"""
(columnSelector) => {
  const problems = [];
  const column = document.querySelector(columnSelector) || document.body;
  const col = column.getBoundingClientRect();
  const skip = 'pre, code, kbd, samp, script, style, mjx-container, textarea';
  const walker = document.createTreeWalker(column, NodeFilter.SHOW_TEXT);
  const texts = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!el || el.closest(skip)) continue;
    const style = getComputedStyle(el);
    if (style.display === 'none' || style.visibility === 'hidden') continue;
    texts.push(n.nodeValue);
  }
  const text = texts.join('');
  const tex = [/\$[^$\s][^$\n]*?[^$\s\\]\$(?!\d)/g, /\$[^$\s\d]\$/g, /\\\(.*?\\\)/g,
               /\\(times|top|cdot|frac|sum|sqrt|left|right|mathrm|mathbf|text|le|ge|ne|approx|alpha|beta|begin|end)(?![a-zA-Z])/g];
  for (const re of tex) for (const m of text.matchAll(re)) problems.push(`TeX source in the text: ${JSON.stringify(m[0].slice(0, 80))}`);
  for (const m of column.querySelectorAll('.math')) {
    if (!m.querySelector('mjx-container')) problems.push(`formula not typeset: ${JSON.stringify(m.textContent.slice(0, 80))}`);
  }
  for (const e of column.querySelectorAll('mjx-merror')) problems.push(`MathJax error: ${JSON.stringify(e.textContent.slice(0, 80))}`);
  // A command line ($ ... in an output, or a line continued with a backslash) wider than its box.
  for (const pre of column.querySelectorAll('pre')) {
    if (!pre.getClientRects().length || pre.closest('.cell_input, .highlight-python, .highlight-ipython3, .highlight-python3')) continue;
    const lines = pre.textContent.split('\n').filter(l => (l.startsWith('$ ') && !l.startsWith('$ #')) || l.endsWith('\\'));
    if (!lines.length) continue;
    const probe = document.createElement('span');
    probe.textContent = 'x'.repeat(100);
    pre.appendChild(probe);
    const charWidth = probe.getBoundingClientRect().width / 100;
    probe.remove();
    const cs = getComputedStyle(pre);
    const room = Math.floor((pre.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight)) / charWidth);
    for (const l of lines) if (l.length > room) problems.push(`command line of ${l.length} characters in a box of ${room}: ${JSON.stringify(l.slice(0, 80))}`);
  }
  const name = (el) => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
    (el.className && typeof el.className === 'string' ? '.' + el.className.trim().split(/\s+/).join('.') : '');
  for (const el of column.querySelectorAll('table, img')) {
    if (!el.getClientRects().length) continue;  // not displayed (a collapsed cell, a hidden tab)
    let right = el.getBoundingClientRect().right;
    for (const c of el.querySelectorAll('th, td')) right = Math.max(right, c.getBoundingClientRect().right);
    if (right <= col.right + 1) continue;
    let clip = null;
    for (let a = el; a && a !== column; a = a.parentElement) {
      const ox = getComputedStyle(a).overflowX;
      if (ox !== 'visible') { clip = [a, ox]; break; }
    }
    const what = `${name(el)} (${Math.round(right - col.right)} px past the column)`;
    const label = el.tagName === 'IMG' ? el.getAttribute('src') : (el.innerText || '').trim().split('\n')[0].slice(0, 60);
    if (!clip) problems.push(`overflows the content column with no scrollbar: ${what} ${JSON.stringify(label)}`);
    else if (clip[1] === 'hidden' || clip[1] === 'clip') problems.push(`cut off with no scrollbar: ${what} ${JSON.stringify(label)}`);
    else if (clip[0].getBoundingClientRect().right > col.right + 1) problems.push(`its scrolling box overflows the column: ${what} ${JSON.stringify(label)}`);
    // A box taller than the window has its sideways scrollbar out of sight while the table is read.
    else if (clip[0].getBoundingClientRect().height > window.innerHeight) problems.push(`its scrollbar is out of sight (scrolling box taller than the window): ${what} ${JSON.stringify(label)}`);
  }
  return problems;
}
"""
MATHJAX_READY = "() => (window.MathJax && MathJax.startup && MathJax.startup.promise) ? MathJax.startup.promise.then(() => true) : true"


def reader_problems(tab, column: str = "article.bd-article") -> list[str]:
    """Wait for MathJax to finish typesetting (if the page loads it), then run READER_CHECK."""
    tab.evaluate(MATHJAX_READY)
    return tab.evaluate(READER_CHECK, column)


CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str:
    for c in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if c and shutil.which(c):
            return shutil.which(c)  # type: ignore[return-value]
    pytest.fail("No Chromium found: install Debian's 'chromium' package (make browser does) or set CHROMIUM.")


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def site():
    if not (BUILD / "index.html").exists():
        pytest.fail("The book is not built: run `make book` first.")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(BUILD)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        yield b
        b.close()


def book_pages() -> list[str]:
    """Every content page of the book (not Sphinx's search and index machinery)."""
    skip = {"search.html", "genindex.html"}
    return sorted(str(p.relative_to(BUILD)) for p in BUILD.rglob("*.html")
                  if "_static" not in p.parts and "_sources" not in p.parts and p.name not in skip)


def test_every_notebook_and_prose_page_is_in_the_toc():
    """only_build_toc_files silently skips a file missing from _toc.yml: catch that here."""
    toc = (REPO_ROOT / "_toc.yml").read_text()
    sources = sorted((REPO_ROOT / "notebooks").glob("*.ipynb")) + sorted((REPO_ROOT / "book").glob("*.md"))
    missing = [str(p.relative_to(REPO_ROOT)) for p in sources if str(p.relative_to(REPO_ROOT).with_suffix("")) not in toc]
    assert not missing, f"not in _toc.yml, so not in the book: {missing}"


def test_the_book_has_the_pages_of_the_toc():
    pages = book_pages()
    for page in ("book/intro.html", "notebooks/00__setting_up.html", "notebooks/01__nsight_systems.html",
                 "book/execution_model.html",
                 "book/troubleshooting.html", "book/glossary.html", "book/provenance.html"):
        assert page in pages


@pytest.mark.parametrize("page", book_pages() or ["(no build)"])
def test_page_loads_cleanly_and_everything_it_links_resolves(site, browser, page):
    ctx = browser.new_context(viewport=VIEWPORT)
    problems: list[str] = []
    external: list[str] = []

    def route(r):
        host = urlparse(r.request.url).hostname
        if host not in ("127.0.0.1", None) and not r.request.url.startswith("data:"):
            external.append(r.request.url)
            return r.abort()
        return r.continue_()

    ctx.route("**/*", route)
    tab = ctx.new_page()
    tab.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    tab.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    tab.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    url = urljoin(site, page)
    tab.goto(url, wait_until="networkidle")
    assert tab.title(), "page has no title"
    broken_images = tab.eval_on_selector_all(
        "img", "els => els.filter(e => !(e.complete && e.naturalWidth > 0)).map(e => e.src)")
    hrefs = tab.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
    as_read = reader_problems(tab)
    ctx.close()
    assert not external, f"requests leaving the machine: {external}"
    assert not problems, problems
    assert not broken_images, f"images that did not load: {broken_images}"
    assert not as_read, f"{page} as a reader sees it: {as_read}"
    for href in hrefs:
        if not href.startswith(site):
            continue
        target, frag = urldefrag(href)
        rel = target[len(site):] or "index.html"
        path = BUILD / rel
        if path.is_dir():
            path = path / "index.html"
        assert path.is_file(), f"{page} links to {rel}, which is not in the build"
        if frag and path.suffix == ".html":
            html = path.read_text(errors="replace")
            assert re.search(rf'id="{re.escape(frag)}"', html), f"{page} links to #{frag} in {rel}, which has no such id"


def test_chapter_download_offers_the_notebook(site, browser):
    tab = browser.new_page()
    tab.goto(urljoin(site, "notebooks/00__setting_up.html"))
    links = tab.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
    tab.close()
    ipynb = [h for h in links if h.endswith(".ipynb")]
    assert ipynb, "the chapter page offers no .ipynb download"
    assert (BUILD / "notebooks" / ipynb[0]).resolve().is_file()


def test_numbers_in_the_prose_come_from_the_notebook():
    html = (BUILD / "book" / "execution_model.html").read_text()
    assert 'class="pasted-text"' in html
    assert "NVIDIA" in html and "??" not in html


def test_a_generated_report_opens_offline_with_its_figures(browser, tmp_path):
    """`python -m gpuprof report -o` writes one file that a browser shows whole with no network:
    every figure is inline, nothing is requested from anywhere."""
    from gpuprof.report import build_pages
    from gpuprof.report.render import write_html

    captures = [REPO_ROOT / "artifacts" / "ch06" / "rung0.sqlite", REPO_ROOT / "artifacts" / "ch04" / "ladder.ncu-rep",
                REPO_ROOT / "artifacts" / "ch05" / "train_steps.json.gz"]
    out = write_html(build_pages(captures), tmp_path / "report.html")
    ctx = browser.new_context(viewport=VIEWPORT)
    requests: list[str] = []
    problems: list[str] = []
    ctx.route("**/*", lambda r: (requests.append(r.request.url), r.continue_()))
    tab = ctx.new_page()
    tab.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda e: problems.append(str(e)))
    tab.goto(out.as_uri(), wait_until="load")
    as_read = reader_problems(tab, "body")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    top = tab.locator("xpath=//section[@id='p0']/h3[.='Top kernels']/following-sibling::table[1]")  # rung0's
    top.evaluate("t => t.previousElementSibling.scrollIntoView({block: 'start'})")  # its heading at the top
    tab.screenshot(path=str(SCREENSHOTS / "report.png"))
    # the tables sort with no network: click "Instances" twice (ascending, then descending)
    header = top.locator("th", has_text="Instances")
    col = header.evaluate("th => th.cellIndex")
    values = "(t, c) => Array.from(t.tBodies[0].rows).map(r => Number(r.cells[c].dataset.v))"
    header.click()
    ascending = top.evaluate(values, col)
    header.click()
    descending = top.evaluate(values, col)
    hover = top.evaluate("t => Array.from(t.querySelectorAll('td[title]')).map(td => [td.textContent, td.title])")
    images = tab.eval_on_selector_all("img", "els => els.map(e => e.complete && e.naturalWidth > 0)")
    tables = tab.eval_on_selector_all("table", "els => els.length")
    sections = tab.eval_on_selector_all("section h2", "els => els.map(e => e.textContent)")
    ctx.close()
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
    assert not problems, problems
    assert not as_read, f"the report as a reader sees it: {as_read}"
    assert ascending == sorted(ascending) and descending == sorted(ascending, reverse=True) and len(set(ascending)) > 3
    assert hover and all(len(short) < len(full) for short, full in hover)
    assert len(images) >= 3 and all(images)  # two steps charts and the nsys timeline
    assert tables >= 15
    assert sections == ["rung0.sqlite", "ladder.ncu-rep", "train_steps.json.gz"]


def _fixture_problems(browser, name: str) -> list[str]:
    tab = browser.new_page(viewport=VIEWPORT)
    tab.goto((FIXTURES / name).as_uri(), wait_until="load")
    problems = reader_problems(tab)
    tab.close()
    return problems


def test_the_reader_check_fails_on_tex_source(browser):
    """A page built to fail: formulas printed as TeX source. Code and dollar prices are not formulas."""
    problems = _fixture_problems(browser, "raw_tex.html")
    text = "\n".join(problems)
    for source in ("$C = A W^\\\\top$", "$A$", "$M \\\\times K$", "\\\\times", "\\\\top", "\\\\(N \\\\times K\\\\)"):
        assert source in text, (source, problems)
    assert "formula not typeset" in text
    assert "RANK" not in text and "HOME" not in text and "$5" not in text, problems


def test_the_reader_check_fails_on_a_table_or_image_past_the_column(browser):
    """A page built to fail: tables and an image wider than the column, with no scrollbar, cut
    off, or in a scrolling box taller than the window; a short scrolling box and a table that fits pass."""
    problems = _fixture_problems(browser, "overflow.html")
    flagged = {m for p in problems for m in re.findall(r"#(\w+)", p)}
    assert flagged == {"bare", "hidden", "tallbox", "wideimg"}, problems
    text = "\n".join(problems)
    assert "table#bare" in text and "no scrollbar" in text
    assert "cut off" in text and "out of sight" in text


def test_chapter_11_shows_its_formulas_as_mathematics(site, browser):
    """Chapter 11's 25 inline formulas are typeset by the MathJax the book serves itself."""
    ctx = browser.new_context(viewport=VIEWPORT)
    outside: list[str] = []
    ctx.route("**/*", lambda r: (outside.append(r.request.url), r.abort()) if urlparse(r.request.url).hostname
              not in ("127.0.0.1", None) else r.continue_())
    tab = ctx.new_page()
    tab.goto(urljoin(site, "notebooks/11__matmul_ladder.html"), wait_until="networkidle")
    tab.evaluate(MATHJAX_READY)
    scripts = tab.eval_on_selector_all("script[src*=mathjax]", "els => els.map(e => e.src)")
    typeset = tab.eval_on_selector_all("span.math mjx-container", "els => els.length")
    formulas = tab.eval_on_selector_all("span.math", "els => els.length")
    ctx.close()
    assert not outside
    assert scripts and all(s.startswith(site) for s in scripts), scripts
    assert formulas == 25 and typeset == formulas, (formulas, typeset)


def test_screenshots_are_kept_as_build_artefacts(site, browser):
    """The landing page and a chapter with formulas, as Chromium draws them at 1400 px, kept under
    _build/screenshots/ (not committed) so that a change in how the book looks can be seen; the
    report page's screenshot is taken by test_a_generated_report_opens_offline_with_its_figures."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    tab = browser.new_page(viewport=VIEWPORT)
    tab.goto(site, wait_until="networkidle")
    tab.screenshot(path=str(SCREENSHOTS / "landing.png"))
    tab.goto(urljoin(site, "notebooks/11__matmul_ladder.html"), wait_until="networkidle")
    tab.evaluate(MATHJAX_READY)
    tab.locator("span.math").first.scroll_into_view_if_needed()
    tab.screenshot(path=str(SCREENSHOTS / "chapter11_formulas.png"))
    tab.close()
    for name in ("landing.png", "chapter11_formulas.png"):
        assert (SCREENSHOTS / name).stat().st_size > 10_000


def test_the_reader_check_fails_on_a_command_line_past_its_box(browser):
    """A page built to fail: one command line runs past its box; a split one and a comment pass."""
    problems = _fixture_problems(browser, "long_command.html")
    assert len(problems) == 1 and "command line of 130 characters" in problems[0], problems
