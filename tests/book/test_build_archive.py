"""The source archive the build puts on the site (book/tools/build.py): made by git from the
files as they are (a build needs a git checkout)."""
import zipfile

from book.tools import build


def names_in(path):
    with zipfile.ZipFile(path) as opened:
        return set(opened.namelist())


def test_the_archive_holds_the_committed_files_as_they_are_now(tmp_path):
    names = names_in(build.source_archive(tmp_path / "source.zip"))
    for path in ("ddp_scripts/train_ddp.py", "Makefile", "notebooks/05_distributed_data_parallel.ipynb"):
        assert f"{build.ARCHIVE_FOLDER}/{path}" in names
    assert not [name for name in names if name.split("/")[1] in ("_build", "data", "runs")]

