"""Where the book's files are, and what its table of contents and configuration say.

Shared by the tests of the sources and tools (tests/book/) and of the built book (tests/site/).
"""
from html.parser import HTMLParser
from pathlib import Path

import yaml

from book.tools import sources

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "_build"
HTML = BUILD / "html"
BUILT_SOURCES = BUILD / "src"          # the executed copy the site was rendered from
SCREENSHOTS = BUILD / "screenshots"
TIMINGS = BUILD / "notebook-timings.xml"
SETUP_CELL = ROOT / "book" / "tools" / "setup_cell.py"
MISSING_SITE = ("the built book is missing ({}): run `make book` first "
                "(`make test` builds it before running the tests)")


def built_run(name):
    """The folder a chapter's run wrote in the build's copy (_build/src/runs/<name>): the tests
    of what a chapter's run produced read it, rather than make the same run again."""
    import pytest
    path = BUILT_SOURCES / "runs" / name
    if not path.is_dir():
        pytest.fail(MISSING_SITE.format(path), pytrace=False)
    return path


def config(path=ROOT / "_config.yml"):
    return yaml.safe_load(Path(path).read_text())


def site_config():
    """The configuration the site was built with (build.py may set the JupyterHub URL)."""
    built = BUILT_SOURCES / "_config.yml"
    return config(built if built.exists() else ROOT / "_config.yml")


def toc_entries():
    """[(file without suffix, chapter number or None)] in reading order, root first."""
    return sources.toc_entries(ROOT)


def chapters():
    """[(notebook path, chapter number)] for the notebooks in the table of contents."""
    return sources.chapters(ROOT)


load_notebook, cell_source = sources.load_notebook, sources.cell_source


def first_code_cell(notebook):
    return next((cell for cell in notebook["cells"] if cell["cell_type"] == "code"), None)


def page_for(entry):
    return HTML / (entry + ".html")


class Page(HTMLParser):
    """The links, image sources, element ids and classes of one HTML page."""

    def __init__(self, path):
        super().__init__(convert_charrefs=True)
        self.path = Path(path)
        self.links, self.images, self.ids, self.elements = [], [], set(), []
        self.feed(self.path.read_text(encoding="utf-8"))

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.elements.append((tag, attrs))
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href") is not None:
            self.links.append(attrs["href"])
        elif tag == "img" and attrs.get("src"):
            self.images.append(attrs["src"])
        elif tag in ("link", "script") and (attrs.get("href") or attrs.get("src")):
            self.links.append(attrs.get("href") or attrs.get("src"))

    def with_class(self, name, tag=None):
        return [attrs for t, attrs in self.elements
                if name in (attrs.get("class") or "").split() and (tag is None or t == tag)]
