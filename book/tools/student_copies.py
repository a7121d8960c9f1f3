"""Write student copies of the chapters: the notebooks without their solutions.

Both editions, no solution cell, no output, the companion scripts beside them: DIR (default
_build/student) is a handout.

    python -m book.tools student-copies [NOTEBOOK ...] [--out DIR]
"""
import argparse
import re
import shutil
from pathlib import Path

from book.tools import ROOT, ToolError
from book.tools.notebooks import read_notebook, write_notebook

SOLUTION_CELL = re.compile(r"\A\s*(`{3,}|:{3,})\{solution\}")


def student_copy(notebook):
    """The notebook as students get it: no solution cell (each is one markdown cell, one
    {solution} block), no output; a {solution} left in it is refused."""
    notebook.cells = [cell for cell in notebook.cells
                      if not (cell.cell_type == "markdown" and SOLUTION_CELL.match(cell.source))]
    for index, cell in enumerate(notebook.cells):
        if "{solution" in cell.source:
            raise ToolError(f"cell {index} holds a {{solution}} with other text: make the "
                            "solution a markdown cell of its own")
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    notebook.metadata.pop("widgets", None)
    return notebook


def write_copies(notebooks, out, replace_all=False):
    """The copies, written into OUT/notebooks (a Chinese chapter into OUT/notebooks/zh), with
    the companion scripts and what installs them; replace_all: no copy of another notebook is left there."""
    out = Path(out)
    if replace_all:   # a chapter renamed or removed leaves no stale copy behind
        shutil.rmtree(out / "notebooks", ignore_errors=True)
    written = []
    for path in map(Path, notebooks):
        try:
            copy = student_copy(read_notebook(path))
        except (OSError, ValueError, ToolError) as error:   # nbformat's errors are ValueErrors
            raise ToolError(f"{path}: {error}") from None
        target = out / "notebooks" / ("zh" if path.parent.name == "zh" else "") / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        write_notebook(target, copy)
        written.append(target)
    shutil.rmtree(out / "ddp_scripts", ignore_errors=True)
    shutil.copytree(ROOT / "ddp_scripts", out / "ddp_scripts",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # the self-checks and their Chinese hints, the chapters' helpers
    for helper in [*(ROOT / "notebooks").glob("*.py"), *(ROOT / "notebooks").glob("*.json")]:
        shutil.copy2(helper, out / "notebooks" / helper.name)
    # what `pip install -e` reads: the set-up cell installs the copy where the book is not
    for name in ("pyproject.toml", "requirements.txt"):
        shutil.copy2(ROOT / name, out / name)
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*",
                        help="default: every notebooks/*.ipynb and notebooks/zh/*.ipynb")
    parser.add_argument("--out", default=str(ROOT / "_build" / "student"),
                        help="folder for the copies (default: _build/student)")
    args = parser.parse_args(argv)
    every = [*sorted((ROOT / "notebooks").glob("*.ipynb")), *sorted((ROOT / "notebooks/zh").glob("*.ipynb"))]
    for path in write_copies(args.notebooks or every, args.out, replace_all=not args.notebooks):
        print(f"wrote {path}")
