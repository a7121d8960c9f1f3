"""Write student copies of the chapters: the notebooks without their solutions.

    python -m book.tools student-copies                   # every chapter -> _build/student/
                                                          # (the Chinese ones -> notebooks/zh/)
    python -m book.tools student-copies notebooks/05_distributed_data_parallel.ipynb
    python -m book.tools student-copies --out /tmp/handout

Every solution in the book is a markdown cell of its own that is one {solution} block (the
chapters' source tests hold them to that shape), so a copy drops those cells, and every
output (the committed notebooks have none; a copy must not leak an answer). The exercises
stay, and so do their self-check cells, which hold answers only as salted hashes. The
companion scripts (ddp_scripts/) are copied next to the notebooks, and the notebooks' own
helpers (notebooks/*.py) beside them, so OUT is a self-contained handout.
A copy in which a {solution} is left (a solution sharing its cell with other text) is
refused with a one-line error and exit status 2: a handout never leaks an answer silently.
"""
import argparse
import re
import shutil
import sys
from pathlib import Path

import nbformat

from book.tools.notebooks import read_notebook as read, write_notebook as write

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "_build" / "student"
SOLUTION_CELL = re.compile(r"\A\s*(`{3,}|:{3,})\{solution\}")


class UsageError(Exception):
    """Bad input: one line on stderr, exit status 2."""


def is_solution(cell):
    return cell.cell_type == "markdown" and bool(SOLUTION_CELL.match(cell.source))


def student_copy(notebook):
    """The notebook (nbformat 4) as students get it: no solution cell, no output."""
    notebook.cells = [cell for cell in notebook.cells if not is_solution(cell)]
    for index, cell in enumerate(notebook.cells):
        if "{solution" in cell.source:
            raise UsageError(f"cell {index} holds a {{solution}} with other text: make the "
                             "solution a markdown cell of its own")
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    notebook.metadata.pop("widgets", None)
    return notebook


def target_for(out, path):
    """OUT/notebooks/x.ipynb; a Chinese chapter (notebooks/zh/x.ipynb) keeps its zh/ folder.
    Either way the set-up cell finds ddp_scripts/ in a folder above it."""
    folder = out / "notebooks" / ("zh" if path.parent.name == "zh" else "")
    folder.mkdir(parents=True, exist_ok=True)
    return folder / path.name


def write_copies(notebooks, out, replace_all=False):
    """Write the copies into OUT/notebooks; replace_all: remove copies of other notebooks."""
    out = Path(out)
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    if replace_all:  # a chapter renamed or removed leaves no stale copy behind
        for old in [*(out / "notebooks").glob("*.ipynb"), *(out / "notebooks").glob("zh/*.ipynb")]:
            old.unlink()
    written = []
    for path in map(Path, notebooks):
        if not path.is_file() or path.suffix != ".ipynb":
            raise UsageError(f"{path} is not a notebook file")
        try:
            notebook = read(path)
        except (ValueError, UnicodeDecodeError, nbformat.reader.NotJSONError) as error:
            raise UsageError(f"{path} is not valid notebook JSON ({error})") from None
        try:
            copy = student_copy(notebook)
        except UsageError as error:
            raise UsageError(f"{path.name}: {error}") from None
        target = target_for(out, path)
        write(target, copy)
        written.append(target)
    scripts = out / "ddp_scripts"
    if scripts.exists():
        shutil.rmtree(scripts)
    shutil.copytree(ROOT / "ddp_scripts", scripts, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for helper in sorted((ROOT / "notebooks").glob("*.py")):  # the self-checks, the chapters' helpers
        shutil.copy2(helper, out / "notebooks" / helper.name)
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*",
                        help="default: every notebooks/*.ipynb and notebooks/zh/*.ipynb")
    parser.add_argument("--out", default=str(DEFAULT_OUT),
                        help="folder for the copies (default: _build/student)")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or (sorted((ROOT / "notebooks").glob("*.ipynb"))
                                   + sorted((ROOT / "notebooks" / "zh").glob("*.ipynb")))
    try:
        if not notebooks:
            raise UsageError("no notebooks found in notebooks/")
        written = write_copies(notebooks, args.out, replace_all=not args.notebooks)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
