"""The source archive the build puts on the site (book/tools/build.py): made by git from the
files as they are; in a reader's copy unpacked from that archive (no git), from its files."""
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



def test_a_copy_without_git_makes_its_archive_from_its_files(tmp_path, monkeypatch):
    copy = tmp_path / "unpacked"
    for path in ("Makefile", "ddp_scripts/train_ddp.py", "_build/html/index.html", "runs/a/metrics.jsonl",
                 "ddp_scripts/__pycache__/x.pyc"):
        (copy / path).parent.mkdir(parents=True, exist_ok=True)
        (copy / path).write_text("x")
    monkeypatch.setattr(build, "ROOT", copy)
    names = names_in(build.source_archive(tmp_path / "source.zip"))
    assert names == {f"{build.ARCHIVE_FOLDER}/Makefile", f"{build.ARCHIVE_FOLDER}/ddp_scripts/train_ddp.py"}
