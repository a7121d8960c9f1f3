"""The book's tooling: the build, the set-up cell, the Chinese edition kept in step, the
student copies, recorded GPU runs and `make gpu-check`. One command line runs them all:
python -m book.tools (book/tools/__main__.py)."""
