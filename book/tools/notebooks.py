"""Every notebook the tooling reads or writes goes through here: nbformat 4, written in Jupyter's
layout, as every notebook is committed, so a tool's rewrite differs only where it changed it."""
import nbformat


def read_notebook(path):
    return nbformat.read(str(path), as_version=4)


def write_notebook(path, notebook):
    nbformat.write(nbformat.from_dict(notebook), str(path))
