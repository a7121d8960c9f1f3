"""Every `literalinclude` of the pages still finds its code, as Sphinx reads it (its own
LiteralIncludeReader): the file, copied into the build; the `pyobject`, then the text its
`start-at`, `start-after`, `end-at` and `end-before` name, in it; and a `dedent` that strips
only spaces. The build fails on one that does not (`-W`), but only after executing every
chapter; this finds it in the fast lane, in seconds, when a companion script changes."""
import json
from types import SimpleNamespace

import pytest
from sphinx.directives.code import LiteralIncludeReader

from book.tools.build import SOURCES
from book.tools.sources import directives
from book_files import ROOT

PAGES = sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("notebooks/zh/*.ipynb"),
                *ROOT.glob("book/*.md"), *ROOT.glob("book/zh/*.md")])
NUMBERS = ("dedent", "tab-width")   # the options Sphinx reads as whole numbers


def markdown_of(page):
    if page.suffix == ".md":
        return [page.read_text(encoding="utf-8")]
    cells = json.loads(page.read_text(encoding="utf-8"))["cells"]
    return ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown"]


def includes(page):
    """(included path, {option: value}) of each literalinclude of a page. A Chinese page is
    copied beside the English ones for the build, so its paths are read from there."""
    folder = page.parent.parent if page.parent.name == "zh" else page.parent
    for text in markdown_of(page):
        for argument, body, *_ in directives(text, "literalinclude"):
            options = {}
            for line in body.splitlines():
                if line.strip().startswith(":"):
                    key, value = line.strip()[1:].split(":", 1)
                    options[key] = int(value) if key in NUMBERS else value.strip()
            yield (folder / argument).resolve(), options


def problem(path, options, root=ROOT):
    """What Sphinx would say of including `path` with `options`, or None."""
    if not any(path.is_relative_to(root / name) for name in SOURCES):
        return f"{path}: not in the build's copy of the sources ({', '.join(SOURCES)})"
    dedent = options.get("dedent")
    without_dedent = {key: value for key, value in options.items() if key != "dedent"}
    config = SimpleNamespace(source_encoding="utf-8-sig")   # Sphinx's default
    reader = LiteralIncludeReader(str(path), without_dedent, config)
    try:
        text, _ = reader.read()
    except (OSError, ValueError) as error:
        return f"{path.name}: {error}"
    if dedent and any(line[:dedent].strip() for line in text.splitlines()):
        return f"{path.name}: :dedent: {dedent} would strip code (Sphinx warns, and -W fails)"
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_included_piece_of_code_is_still_there(page, root=ROOT):
    problems = [problem(path, options, root) for path, options in includes(page)]
    assert not any(problems), [found for found in problems if found]


BROKEN = [("def f():\n    return 1\n\n\ndef g():\n    pass\n",  # the text, but outside g
           "start-at pattern not found: return"),
          ("def f():\n    return 2\n", "Object named 'g' not found"),
          ("def g():\n  return 2\n", "would strip code")]


@pytest.mark.parametrize("broken, said", BROKEN)
def test_the_check_finds_what_sphinx_would_not(tmp_path, broken, said):
    page = tmp_path / "notebooks" / "page.md"
    page.parent.mkdir()
    code = tmp_path / "notebooks" / "code.py"
    code.write_text("def f():\n    # why\n    return 1\n\n\ndef g():\n    return 2\n")
    page.write_text("```{literalinclude} code.py\n:pyobject: g\n:start-at: return\n"
                    ":dedent: 4\n```\n")
    assert list(includes(page)) == [(code.resolve(), {"pyobject": "g", "start-at": "return",
                                                      "dedent": 4})]
    test_every_included_piece_of_code_is_still_there(page, root=tmp_path)
    (tmp_path / "notebooks" / "broken.py").write_text(broken)  # Sphinx caches a file's objects
    page.write_text(page.read_text().replace("code.py", "broken.py"))
    with pytest.raises(AssertionError, match=said):
        test_every_included_piece_of_code_is_still_there(page, root=tmp_path)


def test_the_check_finds_a_file_the_build_does_not_copy(tmp_path):
    page = tmp_path / "notebooks" / "page.md"
    page.parent.mkdir()
    page.write_text("```{literalinclude} ../Makefile\n```\n")
    with pytest.raises(AssertionError, match="not in the build's copy"):
        test_every_included_piece_of_code_is_still_there(page, root=tmp_path)
