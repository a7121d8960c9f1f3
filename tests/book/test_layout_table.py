"""MAINTAINING.md's layout table names every file a maintainer looks for: each module of the
package and of the book's tooling, each helper of the notebooks and of the tests, and each
test folder. A file added and left out of the table fails here, by name."""
import fnmatch
import re

from helpers import ROOT

# What the table must name: the training scripts' plumbing and its folders, the notebooks'
# helpers, the book's tooling and theme, the tests' shared helpers, probes and folders.
# Chapter 9's programs (ddp_scripts/practice/) are named by their chapter, not here.
LOOKED_FOR = ["ddp_scripts/*.py", "ddp_scripts/*.sbatch", "ddp_scripts/*/", "ddp_scripts/recorders/*.py",
              "ddp_scripts/measure/*.py", "ddp_scripts/fit/*.py", "ddp_scripts/mistakes/*.py",
              "notebooks/*.py", "book/tools/*.py", "book/extensions/*", "book/theme/*", "tests/*.py",
              "tests/*/", "tests/*/*_probe.py"]
NOT_LOOKED_FOR = {"__init__.py", "__main__.py", "__pycache__"}


def layout_section(text):
    """The text of MAINTAINING.md's `## Layout` section."""
    found = re.search(r"^## Layout\n(.*?)(?=^## )", text, re.S | re.M)
    assert found, "MAINTAINING.md has no '## Layout' section"
    return found[1]


def unnamed(section, paths):
    """The paths (relative, folders ending in /) that `section` names in no backticked word:
    neither by path nor by file name, nor by a pattern such as `notebooks/*_figures.py`."""
    words = {word.rstrip("/") for word in re.findall(r"`([^`\s]+)`", section)}
    patterns = [word for word in words if "*" in word]

    def named(path):
        bare = path.rstrip("/")
        name = bare.rsplit("/", 1)[-1]
        return (bare in words or name in words
                or any(fnmatch.fnmatch(bare, pattern) for pattern in patterns))
    return [path for path in paths if not named(path)]


def looked_for():
    paths = []
    for pattern in LOOKED_FOR:
        for path in sorted(ROOT.glob(pattern)):
            if path.name in NOT_LOOKED_FOR or path.name.startswith("."):
                continue
            if pattern.endswith("/") != path.is_dir():
                continue
            paths.append(path.relative_to(ROOT).as_posix() + ("/" if path.is_dir() else ""))
    return paths


def test_planted_a_file_the_table_leaves_out_is_named():
    section = "| `ddp_scripts/` | `cli.py`, `notebooks/*_figures.py`, `tests/site/` |"
    paths = ["ddp_scripts/cli.py", "ddp_scripts/stray.py", "notebooks/ch07_figures.py", "tests/site/",
             "tests/other/"]
    assert unnamed(section, paths) == ["ddp_scripts/stray.py", "tests/other/"]


def test_the_layout_table_names_every_file_a_maintainer_looks_for():
    paths = looked_for()
    assert "ddp_scripts/launcher.py" in paths and "tests/scripts/" in paths and len(paths) > 60
    section = layout_section((ROOT / "MAINTAINING.md").read_text())
    assert unnamed(section, paths) == []
