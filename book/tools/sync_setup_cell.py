"""Make every chapter's first code cell the set-up cell, book/tools/setup_cell.py, word for word.

    python book/tools/sync_setup_cell.py           # rewrite the notebooks that differ
    python book/tools/sync_setup_cell.py --check   # only list them (exit status 1 if any)

Run it after changing setup_cell.py (the repository address, say). Only that one cell is
touched; outputs stay as they were (the committed notebooks have none).
"""
import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
SETUP_CELL = ROOT / "book" / "tools" / "setup_cell.py"


def setup_source():
    return SETUP_CELL.read_text().rstrip("\n")


def first_code_cell(notebook):
    return next((cell for cell in notebook["cells"] if cell["cell_type"] == "code"), None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="list, do not change")
    parser.add_argument("notebooks", nargs="*", help="default: every notebooks/*.ipynb")
    args = parser.parse_args(argv)
    wanted = setup_source()
    differing = []
    for path in map(Path, args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))):
        try:
            notebook = nbformat.read(path, as_version=nbformat.NO_CONVERT)
        except (OSError, ValueError, nbformat.reader.NotJSONError) as error:
            print(f"error: cannot read {path}: {error}", file=sys.stderr)
            return 2
        cell = first_code_cell(notebook)
        if cell is None:
            print(f"error: {path} has no code cell", file=sys.stderr)
            return 2
        if "".join(cell["source"]).rstrip("\n") == wanted:
            continue
        differing.append(path)
        if not args.check:
            cell["source"] = wanted
            nbformat.write(notebook, path)
    for path in differing:
        print(f"{'differs' if args.check else 'updated'}: {path}")
    return 1 if (args.check and differing) else 0


if __name__ == "__main__":
    sys.exit(main())
