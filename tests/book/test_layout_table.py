"""MAINTAINING.md's layout table names every file a maintainer looks for: each module of the
package (chapter 9's programs are named by their chapter), of the book's tooling, extensions
and theme, each helper of the notebooks and of the tests, each probe the tests run, and each
folder of the package and of the tests. A tracked file left out of the table fails here, by
name.

A row names a file by its path, or by a path relative to the row's own folder, the folder of
the first path in its first cell: in the row of `ddp_scripts/fit/`, `trace.py` is
ddp_scripts/fit/trace.py, and `fit` in the row of `ddp_scripts/recorders/` names
ddp_scripts/recorders/fit, not ddp_scripts/fit/. A pattern (`notebooks/*_figures.py`) names
what it matches only in a first cell, where the row says what it holds, not in its prose."""
import fnmatch
import re
import subprocess

from helpers import ROOT

# What the table must name, as patterns of tracked paths, one folder per `*`.
LOOKED_FOR = ["ddp_scripts/*.py", "ddp_scripts/*.sbatch", "ddp_scripts/*/",
              "ddp_scripts/recorders/*.py", "ddp_scripts/measure/*.py", "ddp_scripts/fit/*.py",
              "ddp_scripts/mistakes/*.py", "notebooks/*.py", "book/tools/*.py", "book/extensions/*",
              "book/extensions/*/", "book/theme/*", "tests/*.py", "tests/*/", "tests/*/*_probe.py"]
NOT_LOOKED_FOR = {"__init__.py", "__main__.py"}


def matches(path, pattern):
    """Whether `path` matches `pattern` folder by folder (a `*` stays inside one folder)."""
    parts, pattern_parts = path.rstrip("/").split("/"), pattern.rstrip("/").split("/")
    return len(parts) == len(pattern_parts) and all(map(fnmatch.fnmatchcase, parts, pattern_parts))


def looked_for(tracked):
    """The files and folders (ending in /) among the tracked paths `tracked` that the table
    must name."""
    found = set()
    for path in tracked:
        parts = path.split("/")
        folders = ["/".join(parts[:depth]) + "/" for depth in range(1, len(parts))]
        for candidate in [path, *folders]:
            kind_matches = any(matches(candidate, pattern)
                               and candidate.endswith("/") == pattern.endswith("/")
                               for pattern in LOOKED_FOR)
            if kind_matches and candidate.rstrip("/").split("/")[-1] not in NOT_LOOKED_FOR:
                found.add(candidate)
    return sorted(found)


def layout_section(text):
    """The text of MAINTAINING.md's `## Layout` section."""
    found = re.search(r"^## Layout\n(.*?)(?=^## )", text, re.S | re.M)
    assert found, "MAINTAINING.md has no '## Layout' section"
    return found[1]


def named_in(section):
    """(names, patterns): every path a row of the table names, each backticked word as it
    is and as a path inside the row's folder; and the patterns of the rows' first cells."""
    names, patterns = set(), set()
    for row in re.findall(r"^\|(.*)\|\s*$", section, re.M):
        first = re.findall(r"`([^`\s]+)`", row.split("|")[0])
        folder = ""
        if first:
            folder = first[0] if first[0].endswith("/") else first[0].rpartition("/")[0] + "/"
            folder = folder.lstrip("/")
        patterns.update(word for word in first if "*" in word)
        for word in re.findall(r"`([^`\s]+)`", row):
            names.update({word.rstrip("/"), (folder + word).rstrip("/")})
    return names, patterns


def unnamed(section, paths):
    """The paths of `paths` that no row of `section` names, by path or by a first cell's
    pattern."""
    names, patterns = named_in(section)
    return [path for path in paths if path.rstrip("/") not in names
            and not any(matches(path, pattern) for pattern in patterns)]


def test_planted_a_file_the_table_leaves_out_is_named():
    section = ("| Path | What |\n| --- | --- |\n"
               "| `ddp_scripts/cli.py`, `options.py` | the start and the options |\n"
               "| `ddp_scripts/recorders/` | `hooks.py`; `fit`'s tracer; any `*.py` |  \n"
               "| `notebooks/*_figures.py` | the figures |\n"
               "| `book/` | the front matter; `tests/site/` |\n")
    tracked = ["ddp_scripts/cli.py", "ddp_scripts/options.py", "ddp_scripts/fit/trace.py",
               "ddp_scripts/practice/hooks.py", "ddp_scripts/stray.py",
               "ddp_scripts/fit/__init__.py", "notebooks/ch07_figures.py",
               "book/tools/x_figures.py", "tests/site/test_pages.py", "tests/book/test_sources.py",
               "README.md"]
    assert looked_for(tracked) == [
        "book/tools/x_figures.py", "ddp_scripts/cli.py", "ddp_scripts/fit/",
        "ddp_scripts/fit/trace.py", "ddp_scripts/options.py", "ddp_scripts/practice/",
        "ddp_scripts/stray.py", "notebooks/ch07_figures.py", "tests/book/", "tests/site/"]
    assert unnamed(section, looked_for(tracked)) == [
        "book/tools/x_figures.py", "ddp_scripts/fit/", "ddp_scripts/fit/trace.py",
        "ddp_scripts/practice/", "ddp_scripts/stray.py", "tests/book/"]


def test_the_layout_table_names_every_file_a_maintainer_looks_for():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.splitlines()
    paths = looked_for(tracked)
    assert "ddp_scripts/launcher.py" in paths and "tests/scripts/" in paths and len(paths) > 60
    section = layout_section((ROOT / "MAINTAINING.md").read_text())
    assert unnamed(section, paths) == []
