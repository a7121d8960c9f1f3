"""Where the Chromium is that the browser tests drive (tests/conftest.py) and `make browser`
looks for: the first of NAMES on PATH (Debian's chromium, Ubuntu's chromium-browser or snap,
Google Chrome), else the newest build playwright installed (`playwright install chromium`).

    python3 tests/chromium.py   # prints its path; exit status 1 when there is none
"""
import os
import re
import shutil
import sys
from pathlib import Path

NAMES = ("chromium", "chromium-browser", "google-chrome")


def playwright_cache():
    """Where playwright puts its browsers: $PLAYWRIGHT_BROWSERS_PATH, or ~/.cache/ms-playwright."""
    return Path(os.environ.get("PLAYWRIGHT_BROWSERS_PATH") or Path.home() / ".cache" / "ms-playwright")


def find_chromium(path=None, cache=None):
    """The Chromium to drive, as a Path, or None. `path`: the folders to search, as PATH is
    written (default: $PATH); `cache`: playwright's folder (default: playwright_cache())."""
    for name in NAMES:
        found = shutil.which(name, path=path)
        if found:
            return Path(found)
    builds = Path(cache or playwright_cache()).glob("chromium-*/chrome-linux*/chrome")
    revision = {build: int(re.sub(r"\D", "", build.parts[-3]) or 0) for build in builds}
    return max(revision, key=revision.get, default=None)


if __name__ == "__main__":
    chromium = find_chromium()
    print(chromium or "no Chromium: neither " + ", ".join(NAMES) + f" on PATH nor one in {playwright_cache()}")
    sys.exit(0 if chromium else 1)
