"""Student copies (make student-copies): no solution left in them, and they still run."""
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import nbformat
import pytest

from book_files import ROOT, TIMINGS, cell_source, chapters, load_notebook

import student_copies

TOOL = ROOT / "book" / "tools" / "student_copies.py"
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
    result = subprocess.run([sys.executable, str(TOOL), "--out", str(out)],
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


def test_handout_carries_the_companion_scripts(handout):
    assert (handout / "ddp_scripts" / "common.py").exists()
    assert (handout / "ddp_scripts" / "launcher.py").exists()


def fastest_chapters(count):
    """The chapters that executed fastest in the last build (chapter 1 if none recorded)."""
    if not TIMINGS.exists():
        return [ROOT / "notebooks" / "01_devices.ipynb"]
    times = {case.get("file", "").split("/")[-1]: float(case.get("time", "inf"))
             for case in ET.parse(TIMINGS).getroot().iter("testcase")}
    ranked = sorted((p for p in CHAPTERS if p.name in times), key=lambda p: times[p.name])
    return ranked[:count] or [ROOT / "notebooks" / "01_devices.ipynb"]


def test_student_copy_still_runs(handout):
    """Executed with nbmake: nothing after a removed solution depended on it. The Chinese
    copy runs the same code: its code cells are the English copy's, cell for cell."""
    chapter = fastest_chapters(1)[0]
    english, chinese = (handout / "notebooks" / folder / chapter.name for folder in ("", "zh"))
    code = [[cell.source for cell in nbformat.read(path, as_version=4).cells
             if cell.cell_type == "code"] for path in (english, chinese)]
    assert code[0] and code[0] == code[1]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbmake", "--nbmake-timeout=300", "-q",
         "-p", "no:cacheprovider", "--rootdir", str(handout), str(english)],
        cwd=handout, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert re.search(r"\b1 passed\b", result.stdout), result.stdout[-2000:]


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
    with pytest.raises(student_copies.UsageError, match="cell 0 holds a {solution}"):
        student_copies.write_copies([path], tmp_path / "out")
    assert not (tmp_path / "out" / "notebooks" / "shared.ipynb").exists()


def test_bad_input_is_one_line_and_exit_status_2(tmp_path):
    not_a_notebook = tmp_path / "notes.ipynb"
    not_a_notebook.write_text("this is not JSON")
    result = subprocess.run([sys.executable, str(TOOL), "--out", str(tmp_path / "out"),
                             str(not_a_notebook), str(tmp_path / "missing.ipynb")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
