"""MAINTAINING.md's table "Verdicts and their planted flaws" names the tests that hold each
verdict the chapters print: every name it gives is a test function in tests/, so that a test
renamed or removed cannot leave the table behind."""
import re

from book_files import ROOT

SECTION = "## Verdicts and their planted flaws"
NAMED = re.compile(r"\btest_(?:planted|right_case)_\w+")
DEFINED = re.compile(r"^\s*def (test_\w+)\(", re.MULTILINE)


def table_names(text):
    """The planted-flaw and right-case tests the section names."""
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return set(NAMED.findall(section))


def defined_tests(folder):
    """Every test function defined under `folder`."""
    return {name for path in folder.rglob("*.py") for name in DEFINED.findall(path.read_text())}


def missing(text, defined):
    """The names the table gives that no test defines, sorted."""
    return sorted(table_names(text) - defined)


def test_planted_a_name_no_test_defines_is_reported():
    defined = defined_tests(ROOT / "tests")
    table = (f"{SECTION}\n\n| 1 (ch01-04) | `x: True` | another index | "
             "`test_planted_no_such_test` | `test_right_case_two_spellings_of_one_device_are_equal` |"
             "\n\n## Next section\n\n`test_planted_outside_the_table`\n")
    assert missing(table, defined) == ["test_planted_no_such_test"]


def test_right_case_every_test_the_table_names_exists():
    text = (ROOT / "MAINTAINING.md").read_text()
    assert SECTION in text
    names = table_names(text)
    assert sum(name.startswith("test_planted_") for name in names) >= 40
    assert missing(text, defined_tests(ROOT / "tests")) == []
