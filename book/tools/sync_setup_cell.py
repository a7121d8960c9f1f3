"""Make every chapter's first code cell the set-up cell, book/tools/setup_cell.py, word for word.

It is tagged `hide-input`: collapsed on the pages, the same plumbing at the top of every chapter.

    python -m book.tools setup-cell [--check] [NOTEBOOK ...]   # --check: list them, exit 1
"""
import argparse
from pathlib import Path

from book.tools import ROOT, ToolError
from book.tools.notebooks import read_notebook, write_notebook

SETUP_TAG = "hide-input"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="list, do not change")
    parser.add_argument("notebooks", nargs="*",
                        help="default: every notebooks/*.ipynb and notebooks/zh/*.ipynb")
    args = parser.parse_args(argv)
    wanted = (ROOT / "book" / "tools" / "setup_cell.py").read_text().rstrip("\n")
    every = [*sorted((ROOT / "notebooks").glob("*.ipynb")), *sorted((ROOT / "notebooks/zh").glob("*.ipynb"))]
    differing = []
    for path in map(Path, args.notebooks or every):
        try:
            notebook = read_notebook(path)
            cell = next(cell for cell in notebook["cells"] if cell["cell_type"] == "code")
        except (OSError, ValueError, StopIteration):
            raise ToolError(f"{path} is not a notebook with a code cell") from None
        tags = cell.setdefault("metadata", {}).get("tags", [])
        if cell["source"].rstrip("\n") != wanted or SETUP_TAG not in tags:
            differing.append(path)
            cell["source"], cell["metadata"]["tags"] = wanted, tags if SETUP_TAG in tags else [*tags, SETUP_TAG]
            if not args.check:
                write_notebook(path, notebook)
    for path in differing:
        print(f"{'differs' if args.check else 'updated'}: {path}")
    return 1 if args.check and differing else 0
