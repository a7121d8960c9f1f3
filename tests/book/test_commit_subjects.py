"""A commit's subject is at most 72 characters (MAINTAINING.md), checked over the history made
since the rule was first checked; the commits before it stay as they were written."""
import subprocess

import pytest

from book_files import ROOT

SUBJECT_AT_MOST = 72
CHECKED_SINCE = "2736289191eac17e3b9c3ef5a8445320fa925765"


def long_subjects(log):
    """The lines of `git log --format=%h %s` output whose subject runs over SUBJECT_AT_MOST."""
    return [line for line in log.splitlines() if len(line.split(" ", 1)[-1]) > SUBJECT_AT_MOST]


def test_planted_a_subject_of_73_characters_is_found():
    assert long_subjects(f"abc1234 {'x' * 73}\ndef5678 short") == [f"abc1234 {'x' * 73}"]


def test_right_case_a_subject_of_72_characters_passes():
    assert long_subjects(f"abc1234 {'x' * 72}") == []


def test_every_commit_since_the_rule_was_checked_has_a_short_subject():
    log = subprocess.run(["git", "-C", str(ROOT), "log", "--format=%h %s", f"{CHECKED_SINCE}..HEAD"],
                         capture_output=True, text=True)
    if log.returncode != 0:   # no history here (the site's book-source.zip) or a shallow clone
        pytest.skip(f"no git history with {CHECKED_SINCE[:7]}: {log.stderr.strip()[:120]}")
    assert long_subjects(log.stdout) == []
