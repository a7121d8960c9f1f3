"""Every notebook the tooling reads or writes goes through here: nbformat 4, written in Jupyter's
layout, as every notebook is committed, so a tool's rewrite differs only where it changed it;
and a cell's source and tags, read alike from nbformat and from plain JSON."""
import nbformat


def read_notebook(path):
    return nbformat.read(str(path), as_version=4)


def write_notebook(path, notebook):
    nbformat.write(nbformat.from_dict(notebook), str(path))


def joined(text):
    """Text that a notebook file may keep as a list of lines, as one string."""
    return "".join(text) if isinstance(text, list) else text


def source_of(cell):
    return joined(cell.get("source", ""))


def tags_of(cell):
    return cell.get("metadata", {}).get("tags", [])
