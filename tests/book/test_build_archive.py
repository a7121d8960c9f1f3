"""The source archive the build puts on the site (book/tools/build.py): made by git from the
files as they are, or, in a copy without git, from the files themselves."""
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


def test_without_git_the_archive_is_made_from_the_files(tmp_path):
    names = names_in(build.zip_of_the_sources(tmp_path / "source.zip"))
    assert f"{build.ARCHIVE_FOLDER}/ddp_scripts/train_ddp.py" in names
    assert f"{build.ARCHIVE_FOLDER}/Makefile" in names
    assert not [name for name in names if name.split("/")[1] in ("_build", "data", "runs", ".git")
                or name.endswith(".pyc")]
