"""book/tools and book/extensions stay small: code lines (not blank, not a comment, not a
docstring) at most LIMIT, so that what a library or a hook does is not written again by hand
(MAINTAINING.md says what is kept by hand and why). And the test lanes of the Makefile: the
fast lane, `make check`, before the build, and every test folder in exactly one lane."""
import ast
import io
import re
import tokenize

from book_files import ROOT

# Room above the 1,690 lines counted on 2026-12-07 (that day the reference pages' numbers read
# from results/, book/extensions/recorded.py, took 206, and gpu-check's plan within a budget
# and its one archive 127): a check a finding needs fits; more than that, and a library or a
# hook should do the job.
LIMIT = 1850
SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
           tokenize.ENDMARKER}


def code_lines(source):
    """How many lines of source hold code: docstrings, comments and blank lines left out."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and node.body and isinstance(node.body[0], ast.Expr)
                and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str)):
            docstrings.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in SKIPPED:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def test_code_lines_leave_out_docstrings_comments_and_blank_lines():
    assert code_lines('"""Doc."""\n# a comment\n\ndef f():\n    """Doc,\n    two lines."""\n'
                      '    return (1,\n            2)  # why\n') == 3


def test_book_tools_and_extensions_stay_under_the_limit():
    counts = {str(path.relative_to(ROOT)): code_lines(path.read_text(encoding="utf-8"))
              for folder in ("book/tools", "book/extensions") for path in sorted((ROOT / folder).rglob("*.py"))}
    total = sum(counts.values())
    print(f"book/tools + book/extensions: {total} code lines (limit {LIMIT}):",
          ", ".join(f"{name} {count}" for name, count in counts.items()))
    assert total <= LIMIT, f"{total} code lines, over {LIMIT}: let a library or a hook do it"


def recipe(target):
    """A Makefile rule's prerequisites and its command lines."""
    rule = re.search(rf"^{target}:(.*)\n((?:\t.*\n)*)", (ROOT / "Makefile").read_text(), re.M)
    return rule.group(1).split(), [line.strip() for line in rule.group(2).splitlines()]


def pytest_folders(lines):
    return [word for line in lines if "$(PYTEST)" in line for word in line.split() if word.startswith("tests")]


def test_the_fast_lane_runs_first_and_every_test_runs_in_exactly_one_lane():
    check_needs, check = recipe("check")
    test_needs, test = recipe("test")
    assert test_needs[:2] == ["check", "book"], "make check, then the build"
    assert [line.split()[0] for line in check[:3]] == ["$(BIN)/ruff", "$(BIN)/nbstripout", "$(BIN)/python"]
    assert "--verify" in check[1] and check[2].endswith("-m book.tools check")
    lanes = pytest_folders(check) + pytest_folders(test)
    folders = sorted({path.parent.relative_to(ROOT).as_posix() for path in (ROOT / "tests").rglob("test_*.py")})
    assert sorted(lanes) == folders, "each test folder in one lane, and only one"
