"""The book's tooling; its one command line is python -m book.tools (__main__.py)."""
import functools
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]   # the repository


class ToolError(Exception):
    """Bad input to a tool: said in one line, exit status 2 (__main__.py)."""


@functools.cache
def words(edition):
    """What the tools write on an edition's pages, in its language (book/words.yml, book/zh/...)."""
    folder = ROOT / "book" if edition == "en" else ROOT / "book" / edition
    return yaml.safe_load((folder / "words.yml").read_text(encoding="utf-8"))
