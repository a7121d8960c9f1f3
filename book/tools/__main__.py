"""The book's tooling, one command line, run from the repository root:

    python -m book.tools build            # execute every notebook once, render the site (make book)
    python -m book.tools check            # every chapter has the set-up cell; the Chinese pages
                                          # are in step with the English ones (exit 1 if not)
    python -m book.tools sync             # copy both in: the set-up cell, the code into the Chinese pages
    python -m book.tools student-copies   # the notebooks without their solutions (make student-copies)
    python -m book.tools gpu-check        # validate and record the book on a GPU (make gpu-check)

and each part on its own: translations (check, sync, accept, export, import), setup-cell,
recordings (record, status, conditions), assets (the site's pinned JavaScript).
`python -m book.tools COMMAND --help` says more about each.
"""
import importlib
import sys

MODULES = {"build": "build", "student-copies": "student_copies", "gpu-check": "gpu_check",
           "translations": "translations", "setup-cell": "sync_setup_cell",
           "recordings": "gpu_recordings", "assets": "offline_assets"}
# The two that run two tools each: what the pre-commit hooks check, and how to fix it.
BOTH = {"check": [("setup-cell", ["--check"]), ("translations", ["check"])],
        "sync": [("setup-cell", []), ("translations", ["sync"])]}


def run(command, argv):
    sys.argv[0] = f"python -m book.tools {command}"   # what argparse's usage lines name
    return importlib.import_module(f"book.tools.{MODULES[command]}").main(argv) or 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    command, rest = argv[0], argv[1:]
    if command in BOTH:
        return max([run(part, given + rest) for part, given in BOTH[command]])
    if command not in MODULES:
        print(f"error: no command {command!r}; one of: {', '.join([*BOTH, *MODULES])}",
              file=sys.stderr)
        return 2
    return run(command, rest)


if __name__ == "__main__":
    sys.exit(main())
