"""pytest plugin, build.py's conftest.py in the build copy: nbmake leaves alone the notebooks under
a `_build` folder, where the copy is, so this collects them with nbmake's own collector."""
from nbmake.pytest_items import NotebookFile


def pytest_collect_file(file_path, parent):
    if parent.config.option.nbmake and file_path.suffix == ".ipynb" and "_build" in file_path.parts:
        return NotebookFile.from_parent(parent, path=file_path)
