"""A commit's subject is at most 72 characters (MAINTAINING.md), checked over the history made
since the rule was first checked; the commits before it stay as they were written. A shallow
clone that lacks that history (a CI checkout with --depth 1) still has HEAD's subject checked."""
import subprocess

import pytest

from book_files import ROOT

SUBJECT_AT_MOST = 72
CHECKED_SINCE = "2736289191eac17e3b9c3ef5a8445320fa925765"


def long_subjects(log):
    """The lines of `git log --format=%h %s` output whose subject runs over SUBJECT_AT_MOST."""
    return [line for line in log.splitlines() if len(line.split(" ", 1)[-1]) > SUBJECT_AT_MOST]


def git(repository, *arguments):
    return subprocess.run(["git", "-C", str(repository), *arguments], capture_output=True,
                          text=True)


def long_subjects_in(repository):
    """The commits of `repository` since CHECKED_SINCE whose subject is too long; where that
    commit is missing (a shallow clone, another repository), HEAD's alone. None where there is
    no git history at all (the site's book-source.zip)."""
    log = git(repository, "log", "--format=%h %s", f"{CHECKED_SINCE}..HEAD")
    if log.returncode != 0:
        log = git(repository, "log", "-1", "--format=%h %s", "HEAD")
    return long_subjects(log.stdout) if log.returncode == 0 else None


def test_planted_a_subject_of_73_characters_is_found():
    assert long_subjects(f"abc1234 {'x' * 73}\ndef5678 short") == [f"abc1234 {'x' * 73}"]


def test_right_case_a_subject_of_72_characters_passes():
    assert long_subjects(f"abc1234 {'x' * 72}") == []


def commit(repository, subject):
    identity = ["-c", "user.name=Reader", "-c", "user.email=reader@example.com"]
    subprocess.run(["git", "-C", str(repository), *identity, "commit", "-q", "--allow-empty",
                    "-m", subject], check=True, capture_output=True)


def made_up_repository(folder, *subjects):
    subprocess.run(["git", "init", "-q", str(folder)], check=True, capture_output=True)
    for subject in subjects:
        commit(folder, subject)
    return folder


def test_planted_a_repository_whose_one_commit_has_73_characters_fails(tmp_path):
    repository = made_up_repository(tmp_path / "repo", "x" * 73)
    assert [line.split(" ", 1)[1] for line in long_subjects_in(repository)] == ["x" * 73]


def test_right_case_a_repository_whose_one_commit_has_72_characters_passes(tmp_path):
    assert long_subjects_in(made_up_repository(tmp_path / "repo", "x" * 72)) == []


def test_planted_a_shallow_clone_with_a_long_head_subject_fails(tmp_path):
    source = made_up_repository(tmp_path / "source", "short", "fine too", "y" * 80)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{source}", str(clone)],
                   check=True, capture_output=True)
    assert git(clone, "rev-parse", "--is-shallow-repository").stdout.strip() == "true"
    assert [line.split(" ", 1)[1] for line in long_subjects_in(clone)] == ["y" * 80]


def test_every_commit_since_the_rule_was_checked_has_a_short_subject():
    found = long_subjects_in(ROOT)
    if found is None:   # no git history here: the site's book-source.zip
        pytest.skip("not a git repository")
    assert found == []
