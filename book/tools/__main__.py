"""The book's tooling, one command line, run from the repository root:

    python -m book.tools build            # execute every notebook once, render the site (make book)
    python -m book.tools check            # every check of the sources: each problem on one line (exit 1)
    python -m book.tools sync             # copy both in: the set-up cell, the code into the Chinese pages
    python -m book.tools student-copies   # the notebooks without their solutions (make student-copies)
    python -m book.tools gpu-check        # validate and record the book on a GPU (make gpu-check)

and each part on its own: sources (the editorial checks), translations, setup-cell, assets
(COMMAND --help says more).
"""
import importlib
import sys

from book.tools import ToolError

MODULES = {"build": "build", "student-copies": "student_copies", "gpu-check": "gpu_check",
           "translations": "translations", "setup-cell": "sync_setup_cell",
           "assets": "offline_assets", "sources": "sources"}
# Commands made of tools: `check` (what the pre-commit hook runs) and `sync` (how to fix the first two).
BOTH = {"check": [["setup-cell", "--check"], ["translations", "check"], ["sources"]],
        "sync": [["setup-cell"], ["translations", "sync"]]}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    try:
        if argv[0] not in {**MODULES, **BOTH}:
            raise ToolError(f"no command {argv[0]!r}; one of: {', '.join([*BOTH, *MODULES])}")
        statuses = []
        for command, *given in BOTH.get(argv[0], [[argv[0]]]):
            sys.argv[0] = f"python -m book.tools {command}"   # what argparse's usage lines name
            module = importlib.import_module(f"book.tools.{MODULES[command]}")
            statuses.append(module.main([*given, *argv[1:]]) or 0)
        return max(statuses)
    except ToolError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
