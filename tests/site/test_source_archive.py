"""The repository's source as a zip on the built site (book/tools/build.py source_archive), for
readers who can open the site but not the repository: linked from how-to-run in both editions."""
import re
import zipfile

import pytest

from book_files import HTML, ROOT

from book.tools import build

EDITIONS = {"en": HTML, "zh": HTML / "zh"}


@pytest.mark.parametrize("edition", sorted(EDITIONS))
def test_how_to_run_links_the_source_archive_and_it_holds_the_scripts(site, edition):
    page = (EDITIONS[edition] / "book" / "how-to-run.html")
    text = page.read_text(encoding="utf-8")
    links = re.findall(rf'href="([^"]*{re.escape(build.SOURCE_ARCHIVE)})"', text)
    assert links, f"{page.relative_to(ROOT)} does not link {build.SOURCE_ARCHIVE}"
    archive = (page.parent / links[0]).resolve()
    assert archive.is_file(), f"{links[0]} from {page.relative_to(ROOT)}: no such file"
    with zipfile.ZipFile(archive) as opened:
        names = opened.namelist()
        assert f"{build.ARCHIVE_FOLDER}/ddp_scripts/train_ddp.py" in names
        script = opened.read(f"{build.ARCHIVE_FOLDER}/ddp_scripts/train_ddp.py").decode()
    assert "DistributedDataParallel" in script
    assert not [name for name in names if "/_build/" in name or "/.venv" in name]
