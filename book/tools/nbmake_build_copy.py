"""pytest plugin, copied by build.py to _build/src/conftest.py: nbmake for the build copy.

nbmake leaves alone any notebook under a folder named `_build` (Sphinx's output is no
place for sources). The book's build copy lives in _build/src on purpose, so this collects
its notebooks with nbmake's own collector, and nbmake does the rest as usual.
"""
from nbmake.pytest_items import NotebookFile


def pytest_collect_file(file_path, parent):
    if (parent.config.option.nbmake and file_path.suffix == ".ipynb"
            and "_build" in file_path.parts):
        return NotebookFile.from_parent(parent, path=file_path)
