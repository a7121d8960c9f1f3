"""What every test shares: under pytest-xdist, each worker runs on its own cores; and, for the
tests of the built book (tests/site/), the built site, a local web server and a browser.

The site tests read _build/html, which `make book` writes; `make test` builds it first. When it
is missing they fail (never skip), saying to run `make book`.
"""
import functools
import http.server
import os
import re
import threading

import pytest

from book_files import HTML, MISSING_SITE, SCREENSHOTS
from chromium import find_chromium


def pytest_configure(config):
    """Under pytest-xdist, each worker gets its own share of the cores, as a Slurm job gives
    each of its tasks: the runs a test starts (in the worker, or as its child processes, which
    inherit the share) then size their thread pools to it (devices.set_cpu_threads). Without
    it, two workers each run torch with a thread per core, and on a small machine their
    threads spin waiting for each other: a 4-second test took 36 seconds."""
    worker, workers = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not (worker and workers and hasattr(os, "sched_setaffinity")):
        return
    cores, index, count = sorted(os.sched_getaffinity(0)), int(worker.removeprefix("gw")), int(workers)
    if len(cores) >= count > 1:
        share = set(cores[index % count::count])
        os.sched_setaffinity(0, share)
        import torch
        torch.set_num_threads(len(share))


# sphinx-thebe 0.3.1 (which jupyter-book 1.x always loads) puts its settings script on every
# page twice; the second `const` fails. Thebe is not used (launch_buttons.thebe is off), so
# nothing a reader sees depends on it. Any other script error fails the tests.
KNOWN_HARMLESS_ERRORS = ("Identifier 'THEBE_JS_URL' has already been declared",)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="session")
def site():
    """_build/html, which must have been built."""
    if not (HTML / "index.html").exists():
        pytest.fail(MISSING_SITE.format(HTML / "index.html"), pytrace=False)
    return HTML


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="session")
def server(site):
    """The built site, served on 127.0.0.1 at a free port; stopped after the tests."""
    handler = functools.partial(QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=10)


@pytest.fixture(scope="session")
def browser():
    """Chromium, wherever the system or playwright put it (tests/chromium.py), headless,
    driven by Playwright."""
    found = find_chromium()
    if found is None:
        pytest.fail("no Chromium found: run `make browser` (apt-get install chromium) or "
                    "`playwright install chromium`", pytrace=False)
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(found), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def new_tab(context):
    """A tab that refuses requests that leave the local server (a CDN's MathJax, say), and
    lists them in tab.blocked: the tests check the site as built, offline and the same every
    time. It also collects local requests that failed, a missing font say (tab.failed), and
    JavaScript errors (tab.errors)."""
    tab = context.new_page()
    tab.blocked, tab.failed, tab.errors = [], [], []

    def refuse(route):
        tab.blocked.append(route.request.url)
        route.abort()
    tab.route(re.compile(r"^(?!http://127\.0\.0\.1[:/]).*"), refuse)
    tab.on("response", lambda response: response.status >= 400
           and tab.failed.append(f"{response.status} {response.url}"))
    tab.on("pageerror", lambda error: str(error) in KNOWN_HARMLESS_ERRORS
           or tab.errors.append(str(error)))
    tab.set_default_timeout(15_000)
    return tab


@pytest.fixture
def page(browser):
    """A fresh tab in a browser context of its own, for a test that clicks, types or moves
    to another page."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    yield new_tab(context)
    context.close()


@pytest.fixture(scope="session")
def opened(browser, server):
    """opened(path, width): the site's page at `path` in a window `width` pixels wide, loaded
    once for every test that only reads it (what it shows, where its boxes are): a page load
    took 2-4 s on two busy cores."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tabs = {}

    def open_once(path, width=1280):
        if (path, width) not in tabs:
            tab = new_tab(context)
            tab.set_viewport_size({"width": width, "height": 900})
            tab.goto(f"{server}/{path}", wait_until="load")
            tab.wait_for_selector("article.bd-article")
            tabs[path, width] = tab
        return tabs[path, width]
    yield open_once
    context.close()


@pytest.fixture(scope="session")
def screenshots():
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
