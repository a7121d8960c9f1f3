"""Student copies (make student-copies): no solution left in them, and they run what the build ran."""
import re
import subprocess
import sys

import nbformat
import pytest

from book_files import ROOT, cell_source, chapters, load_notebook

from book.tools import ToolError, student_copies

TOOL = [sys.executable, "-m", "book.tools", "student-copies"]
CHAPTERS = [path for path, _ in chapters()]
BOTH_EDITIONS = CHAPTERS + [path.parent / "zh" / path.name for path in CHAPTERS]


SOLUTION_BLOCK = re.compile(r"^(`{3,}|:{3,})\{solution\}.*\n((?:.*\n)*?)\1\s*$", re.M)


def solution_texts(notebook):
    """Lines found only in solutions (not in the exercises or the rest of the chapter):
    none of them may survive in a student copy."""
    in_solutions, elsewhere = [], []
    for cell in notebook["cells"]:
        source = cell_source(cell) + "\n"
        if "solution" in cell.get("metadata", {}).get("tags", []):
            in_solutions += source.splitlines()
        elif cell["cell_type"] == "markdown":
            in_solutions += [line for block in SOLUTION_BLOCK.finditer(source)
                             for line in block.group(2).splitlines()]
            elsewhere += SOLUTION_BLOCK.sub("", source).splitlines()
        else:
            elsewhere += source.splitlines()
    shared = {line.strip() for line in elsewhere}
    return [line for line in in_solutions if len(line.strip()) > 12
            and line.strip() not in shared and not line.startswith((":", "```"))]


@pytest.fixture(scope="module")
def handout(tmp_path_factory):
    missing = [p.name for p in CHAPTERS if not p.exists()]
    if missing:
        pytest.fail(f"chapters listed in _toc.yml are missing: {missing}", pytrace=False)
    out = tmp_path_factory.mktemp("student")
    result = subprocess.run([*TOOL, "--out", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.parametrize("path", BOTH_EDITIONS,
                         ids=[str(p.relative_to(ROOT / "notebooks")) for p in BOTH_EDITIONS])
def test_student_copy_has_no_solution_and_keeps_the_exercises(handout, path):
    original = load_notebook(path)
    copy = load_notebook(handout / path.relative_to(ROOT))
    text = "\n".join(cell_source(cell) for cell in copy["cells"])
    assert "{solution" not in text
    lines = {line.strip() for line in text.splitlines()}
    leaked = [line for line in solution_texts(original) if line.strip() in lines]
    assert not leaked, f"{path.name}: solution text left in the student copy: {leaked[:3]}"
    exercises = "\n".join(cell_source(c) for c in original["cells"]).count("{exercise}")
    assert text.count("{exercise}") == exercises


def test_student_copy_runs_what_the_build_ran(handout):
    """A copy drops solution cells, which are prose, and outputs: it keeps every code cell of
    its chapter, in order, and carries the companion scripts, the chapters' helpers and what
    installs them (pyproject.toml, requirements.txt) as they are. So it runs what the build
    executed (every chapter, both editions), in the same layout, and it is not executed a
    second time here."""
    for path in BOTH_EDITIONS:
        code = [[cell.source for cell in nbformat.read(notebook, as_version=4).cells
                 if cell.cell_type == "code"] for notebook in (path, handout / path.relative_to(ROOT))]
        assert code[0] and code[1] == code[0], path.name
    carried = [*(p for p in (ROOT / "ddp_scripts").rglob("*") if p.is_file()
                 and "__pycache__" not in p.parts), *(ROOT / "notebooks").glob("*.py"),
               *(ROOT / "notebooks").glob("*.json"), ROOT / "pyproject.toml", ROOT / "requirements.txt"]
    for path in carried:
        copy = handout / path.relative_to(ROOT)
        assert copy.exists() and copy.read_bytes() == path.read_bytes(), path.relative_to(ROOT)


def notebook_of(*markdown):
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(m) for m in markdown])


def test_a_solution_cell_is_dropped_whatever_its_fence():
    copy = student_copies.student_copy(notebook_of(
        "```{exercise} One\n:label: ch09-a\nDo it.\n```",
        "````{solution} ch09-a\n:class: dropdown\nSecret A.\n```python\ncode_a()\n```\n````",
        ":::{solution} ch09-b\n:class: dropdown\nSecret B.\n:::", "After."))
    assert [cell.source.splitlines()[-1] for cell in copy.cells] == ["```", "After."]


def test_a_solution_sharing_its_cell_is_refused(tmp_path):
    path = tmp_path / "shared.ipynb"
    nbformat.write(notebook_of("Text first.\n\n```{solution} ch09-a\n:class: dropdown\nLeak.\n```"), path)
    with pytest.raises(ToolError, match="cell 0 holds a {solution}"):
        student_copies.write_copies([path], tmp_path / "out")
    assert not (tmp_path / "out" / "notebooks" / "shared.ipynb").exists()


def test_bad_input_is_one_line_and_exit_status_2(tmp_path):
    not_a_notebook = tmp_path / "notes.ipynb"
    not_a_notebook.write_text("this is not JSON")
    result = subprocess.run([*TOOL, "--out", str(tmp_path / "out"),
                             str(not_a_notebook), str(tmp_path / "missing.ipynb")],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
