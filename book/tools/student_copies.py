"""Write student copies of the chapters: the notebooks without their solutions.

    python book/tools/student_copies.py                   # every chapter -> _build/student/
                                                          # (the Chinese ones -> notebooks/zh/)
    python book/tools/student_copies.py notebooks/05_distributed_data_parallel.ipynb
    python book/tools/student_copies.py --out /tmp/handout

What is removed:
- from markdown cells, every ```{solution} ...``` block (backtick or colon fence, any length;
  also the gated form, from {solution-start} to {solution-end});
- every code cell tagged `solution`;
- any output (the committed notebooks have none; a copy must not leak an answer).
The exercises stay, and so do their self-check cells, which hold answers only as salted
hashes. The companion scripts (ddp_scripts/) are copied next to the notebooks, and the
notebooks' own helpers (notebooks/*.py: the self-checks) beside them, so OUT is a
self-contained handout: zip it, or hand it out as a folder.
The tool refuses to write a copy in which a solution marker is left (one-line error,
exit status 2): a handout never leaks an answer silently.
"""
import argparse
import re
import shutil
import sys
from pathlib import Path

import nbformat
from markdown_it import MarkdownIt
from mdit_py_plugins.colon_fence import colon_fence_plugin

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "_build" / "student"
SOLUTION_TAG = "solution"
LEFT_OVER = re.compile(r"\{solution(-start|-end)?\}")
# The same block parser MyST uses for fences and colon fences.
PARSER = MarkdownIt("commonmark").use(colon_fence_plugin)


class UsageError(Exception):
    """Bad input: one line on stderr, exit status 2."""


def directive_name(token):
    """'solution' for a ```{solution} ch05-ex``` fence, None for anything else."""
    if token.type not in ("fence", "colon_fence") or token.map is None:
        return None
    match = re.match(r"\s*\{([\w-]+)\}", token.info or "")
    return match.group(1) if match else None


def fence_problems(markdown):
    """Directive fences closed early by a fence inside them, as messages (empty: none).

    ```{solution} ... ```python ... ``` ... ``` ends at the inner closing fence: the rest of
    the answer falls outside the solution, visible. The fence around must be longer
    (````{solution}) or use colons (:::{solution}, with myst's colon_fence).
    """
    problems = []
    for token in PARSER.parse(markdown):
        name = directive_name(token)
        if not name:
            continue
        char, length = token.markup[0], len(token.markup)
        for offset, line in enumerate(token.content.splitlines(), start=1):
            inner = re.match(r" {0,3}(`{3,}|~{3,}|:{3,})", line)
            if inner and inner.group(1)[0] == char and len(inner.group(1)) >= length:
                problems.append(f"the {{{name}}} block at line {token.map[0] + 1} is closed "
                                f"early by the fence at line {token.map[0] + 1 + offset}: "
                                f"open it with a longer fence ({char * (length + 1)}{{{name}}})")
                break
    return problems


def strip_solutions(markdown):
    """The markdown without its solution blocks (line ranges found by the MyST fence rule)."""
    problems = fence_problems(markdown)
    if problems:
        raise UsageError(problems[0])
    lines = markdown.splitlines(keepends=True)
    drop, gate_start = set(), None
    for token in PARSER.parse(markdown):
        name = directive_name(token)
        start, end = token.map if name else (None, None)
        if name == "solution":
            drop.update(range(start, end))
        elif name == "solution-start":
            gate_start = start
        elif name == "solution-end" and gate_start is not None:
            drop.update(range(gate_start, end))
            gate_start = None
    kept = [line for number, line in enumerate(lines) if number not in drop]
    return re.sub(r"\n{3,}", "\n\n", "".join(kept)).strip("\n")


def student_copy(notebook):
    """The notebook (a dict, nbformat 4) as students get it."""
    cells = []
    for cell in notebook["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] == "code" and SOLUTION_TAG in tags:
            continue
        cell = dict(cell)
        if cell["cell_type"] == "markdown":
            text = strip_solutions("".join(cell["source"]))
            if not text.strip():
                continue
            cell["source"] = text
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
        cells.append(cell)
    metadata = {k: v for k, v in notebook.get("metadata", {}).items() if k != "widgets"}
    return {**notebook, "metadata": metadata, "cells": cells}


def leftover_solutions(notebook):
    """Descriptions of any solution left in a copy (empty when the copy is clean)."""
    found = []
    for index, cell in enumerate(notebook["cells"]):
        source = "".join(cell["source"])
        if SOLUTION_TAG in cell.get("metadata", {}).get("tags", []):
            found.append(f"cell {index} is tagged {SOLUTION_TAG!r}")
        elif LEFT_OVER.search(source):
            found.append(f"cell {index} still holds a {LEFT_OVER.search(source).group(0)} "
                         "block (is a fence inside it as long as the fence around it?)")
    return found


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
        for old in [*(out / "notebooks").glob("*.ipynb"),
                    *(out / "notebooks").glob("zh/*.ipynb")]:
            old.unlink()
    written = []
    for path in notebooks:
        path = Path(path)
        if not path.is_file() or path.suffix != ".ipynb":
            raise UsageError(f"{path} is not a notebook file")
        try:
            notebook = nbformat.read(path, as_version=4)
        except (ValueError, UnicodeDecodeError, nbformat.reader.NotJSONError) as error:
            raise UsageError(f"{path} is not valid notebook JSON ({error})") from None
        try:
            copy = student_copy(notebook)
        except UsageError as error:
            raise UsageError(f"{path.name}: {error}") from None
        problems = leftover_solutions(copy)
        if problems:
            raise UsageError(f"{path.name}: " + "; ".join(problems))
        target = target_for(out, path)
        nbformat.write(nbformat.from_dict(copy), target)
        written.append(target)
    scripts = out / "ddp_scripts"
    if scripts.exists():
        shutil.rmtree(scripts)
    shutil.copytree(ROOT / "ddp_scripts", scripts,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for helper in sorted((ROOT / "notebooks").glob("*.py")):  # notebooks.selfcheck
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
