"""Every `literalinclude` of the pages still finds its code: the file, the `pyobject`, and the
text its `start-at`, `start-after`, `end-at` and `end-before` name, in that order. The build
fails on one that does not (`-W`), but only after executing every chapter; this finds it in
the fast lane, in seconds, when a comment or a function of a companion script changes."""
import ast
import json

import pytest

from book.tools.sources import directives
from book_files import ROOT

PAGES = sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("notebooks/zh/*.ipynb"),
                *ROOT.glob("book/*.md"), *ROOT.glob("book/zh/*.md")])


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
            options = dict(line.strip()[1:].split(":", 1) for line in body.splitlines()
                           if line.strip().startswith(":"))
            yield (folder / argument).resolve(), {key: value.strip() for key, value in options.items()}


def defines(source, dotted):
    """Whether `source` defines `dotted`, a function or class, or Class.method, as Sphinx's
    pyobject option names it."""
    body = ast.parse(source).body
    for name in dotted.split("."):
        found = [node for node in body if isinstance(node, (ast.FunctionDef, ast.ClassDef))
                 and node.name == name]
        if not found:
            return False
        body = found[0].body
    return True


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_included_piece_of_code_is_still_there(page):
    problems = []
    for path, options in includes(page):
        if not path.is_file():
            problems.append(f"{path.relative_to(ROOT)}: no such file")
            continue
        source = path.read_text(encoding="utf-8")
        if "pyobject" in options and not defines(source, options["pyobject"]):
            problems.append(f"{path.name}: no {options['pyobject']}")
        start = 0
        for key in ("start-at", "start-after", "end-at", "end-before"):
            if key in options:
                found = source.find(options[key], start)
                if found < 0:
                    problems.append(f"{path.name}: {key} {options[key]!r} not found"
                                    + (" after the start" if start else ""))
                    break
                start = found
    assert not problems, problems


def test_the_check_finds_a_moved_comment(tmp_path):
    page = tmp_path / "notebooks" / "page.md"
    page.parent.mkdir()
    (tmp_path / "code.py").write_text("def f():\n    # why\n    return 1\n")
    page.write_text("```{literalinclude} ../code.py\n:start-at: # why\n:end-at: return 1\n```\n")
    assert list(includes(page)) == [((tmp_path / "code.py").resolve(),
                                      {"start-at": "# why", "end-at": "return 1"})]
    (tmp_path / "code.py").write_text("def f():\n    return 1\n")
    with pytest.raises(AssertionError, match="start-at '# why' not found"):
        test_every_included_piece_of_code_is_still_there(page)
