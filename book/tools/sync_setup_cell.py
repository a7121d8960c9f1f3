"""Make every chapter's first code cell the set-up cell, book/tools/setup_cell.py, word for word.

    python -m book.tools setup-cell           # rewrite the notebooks that differ
    python -m book.tools setup-cell --check   # only list them (exit status 1 if any)

Run it after changing setup_cell.py (the repository address, say). Only that one cell is
touched; outputs stay as they were (the committed notebooks have none). The cell carries the
tag `hide-input`: on the book's pages it is collapsed, its code one click away, since it is
the same plumbing at the top of every chapter. The notebook is written in nbformat's layout,
as every committed notebook is (book/tools/notebooks.py), so a diff shows only the change.
"""
import argparse
import sys
from pathlib import Path

from book.tools.notebooks import read_notebook, write_notebook

ROOT = Path(__file__).resolve().parents[2]
SETUP_CELL = ROOT / "book" / "tools" / "setup_cell.py"
SETUP_TAG = "hide-input"


def setup_source():
    return SETUP_CELL.read_text().rstrip("\n")


def first_code_cell(notebook):
    return next((cell for cell in notebook["cells"] if cell["cell_type"] == "code"), None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="list, do not change")
    parser.add_argument("notebooks", nargs="*",
                        help="default: every notebooks/*.ipynb and notebooks/zh/*.ipynb")
    args = parser.parse_args(argv)
    wanted = setup_source()
    differing = []
    every = (sorted((ROOT / "notebooks").glob("*.ipynb"))
             + sorted((ROOT / "notebooks" / "zh").glob("*.ipynb")))   # both editions
    for path in map(Path, args.notebooks or every):
        try:
            notebook = read_notebook(path)
        except (OSError, ValueError) as error:
            print(f"error: cannot read {path}: {error}", file=sys.stderr)
            return 2
        cell = first_code_cell(notebook)
        if cell is None:
            print(f"error: {path} has no code cell", file=sys.stderr)
            return 2
        source = cell["source"]
        tags = cell.setdefault("metadata", {}).get("tags", [])
        if source.rstrip("\n") == wanted and SETUP_TAG in tags:
            continue
        differing.append(path)
        if not args.check:
            if source.rstrip("\n") != wanted:
                cell["source"] = wanted.splitlines(keepends=True)
            if SETUP_TAG not in tags:
                cell["metadata"]["tags"] = [*tags, SETUP_TAG]
            write_notebook(path, notebook)
    for path in differing:
        print(f"{'differs' if args.check else 'updated'}: {path}")
    return 1 if (args.check and differing) else 0


if __name__ == "__main__":
    sys.exit(main())
