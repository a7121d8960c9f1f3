"""Every notebook the tooling reads or writes goes through here, on nbformat.

read_notebook() gives a notebook as nbformat reads it (version 4: a cell's source and a
stream's text as one string); write_notebook() writes it as Jupyter does (nbformat's layout:
one-space indent, sorted keys, text as lists of lines). Every committed notebook is in that
layout (tests/test_book_tools.py), so one that a tool rewrites differs only where the tool
changed it.
"""
import nbformat


def read_notebook(path):
    return nbformat.read(str(path), as_version=4)


def write_notebook(path, notebook):
    nbformat.write(nbformat.from_dict(notebook), str(path))
