"""The browser tests' Chromium (tests/chromium.py) is found on PATH under any of its usual
names, or in playwright's cache; the same lookup `make browser` runs."""
import os
import subprocess
import sys

from book_files import ROOT
from chromium import find_chromium


def program(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_a_chromium_on_path_is_found_under_each_name(tmp_path):
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = program(tmp_path / name / name)
        assert find_chromium(path=str(found.parent), cache=tmp_path / "none") == found


def test_the_newest_of_playwright_s_builds_is_found_when_path_has_none(tmp_path):
    cache = tmp_path / "ms-playwright"
    program(cache / "chromium-999" / "chrome-linux" / "chrome")
    newest = program(cache / "chromium-1181" / "chrome-linux64" / "chrome")
    assert find_chromium(path=str(tmp_path / "empty"), cache=cache) == newest


def test_planted_no_chromium_anywhere_is_none(tmp_path):
    assert find_chromium(path=str(tmp_path / "empty"), cache=tmp_path / "none") is None


def test_make_browser_s_lookup_says_where_it_is_or_fails(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path), "PLAYWRIGHT_BROWSERS_PATH": str(tmp_path / "none")}
    missing = subprocess.run([sys.executable, str(ROOT / "tests" / "chromium.py")], env=env,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and missing.stdout.startswith("no Chromium")
    found = program(tmp_path / "chromium-browser")
    there = subprocess.run([sys.executable, str(ROOT / "tests" / "chromium.py")], env=env,
                           capture_output=True, text=True, timeout=60)
    assert there.returncode == 0 and there.stdout.strip() == str(found)
