"""Open the built book in a real headless Chromium: no console errors, every link and image resolves.

Run after `make book` (the Makefile's test target builds first). The pages are served
from localhost; any request that would leave the machine is blocked and reported,
because the book must work offline and must not depend on a CDN.
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
    ctx = browser.new_context()
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
    ctx.close()
    assert not external, f"requests leaving the machine: {external}"
    assert not problems, problems
    assert not broken_images, f"images that did not load: {broken_images}"
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
    ctx = browser.new_context()
    requests: list[str] = []
    problems: list[str] = []
    ctx.route("**/*", lambda r: (requests.append(r.request.url), r.continue_()))
    tab = ctx.new_page()
    tab.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda e: problems.append(str(e)))
    tab.goto(out.as_uri(), wait_until="load")
    images = tab.eval_on_selector_all("img", "els => els.map(e => e.complete && e.naturalWidth > 0)")
    tables = tab.eval_on_selector_all("table", "els => els.length")
    sections = tab.eval_on_selector_all("section h2", "els => els.map(e => e.textContent)")
    ctx.close()
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
    assert not problems, problems
    assert len(images) >= 3 and all(images)  # two steps charts and the nsys timeline
    assert tables >= 15
    assert sections == ["rung0.sqlite", "ladder.ncu-rep", "train_steps.json.gz"]
