"""The book's tooling; its one command line is python -m book.tools (__main__.py)."""


class ToolError(Exception):
    """Bad input to a tool: said in one line, exit status 2 (__main__.py)."""
