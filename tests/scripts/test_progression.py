"""The scripts are a tree: train_single.py -> train_dp.py, and train_single.py -> train_ddp.py ->
train_fast.py / train_fsdp.py. The diff between a script and its parent is the lesson, so it stays
short and marked."""
import difflib
import re

import pytest

from helpers import SCRIPTS

# (parent, child, mark): every pair a chapter prints, and the mark on each changed line.
PAIRS = [("train_single.py", "train_dp.py", "DP"),    # chapter 4
         ("train_single.py", "train_ddp.py", "DDP"),  # chapter 5
         ("train_ddp.py", "train_fast.py", "FAST"),   # chapter 10
         ("train_ddp.py", "train_fsdp.py", "FSDP")]   # chapter 11
MOST_CHANGED = 40  # code lines added + removed, for every pair
LEVER_FREE = ["train_single.py", "train_dp.py", "train_ddp.py"]


def code_lines(path):
    """The script's lines without its comment lines and blank lines: its docstrings count (the
    chapters print them in the diff), and so does a trailing comment (it carries the mark)."""
    text = path.read_text()
    return [line for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def hunks(before, after):
    """(removed lines, added lines) for each place where the two scripts differ."""
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    return [(before[i1:i2], after[j1:j2])
            for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]


@pytest.mark.parametrize("parent, child, mark", PAIRS)
def test_the_diff_is_short_and_every_change_is_marked(parent, child, mark):
    changes = hunks(code_lines(SCRIPTS / parent), code_lines(SCRIPTS / child))
    changed = sum(len(old) + len(new) for old, new in changes)
    assert 0 < changed <= MOST_CHANGED, f"{parent} -> {child}: {changed} code lines changed"
    for removed, added in changes:
        if removed[:1] and removed[0].startswith('"""'):
            continue  # the docstring's first line: what the script is (it names its topic)
        # a line of the parent is only ever replaced, by a line that says why it changed
        assert added, f"{child} drops lines of {parent} without a marked replacement: {removed}"
        assert any(re.search(rf"#.*\b{mark}\b", line) for line in added), (
            f"a change in {child} is not marked {mark}:\n" + "\n".join(removed + ["---"] + added))


def test_the_marker_is_only_on_changed_lines():
    """A `# DDP` on a line that train_single.py also has would point at nothing."""
    for parent, child, mark in PAIRS:
        parent_lines = set(code_lines(SCRIPTS / parent))
        for line in code_lines(SCRIPTS / child):
            if re.search(rf"#.*\b{mark}\b", line):
                assert line not in parent_lines, f"{child}: {line.strip()}"


@pytest.mark.parametrize("script", LEVER_FREE)
def test_the_lever_free_scripts_show_the_canonical_step(script):
    text = (SCRIPTS / script).read_text()
    for step in (".to(device)", "optimizer.zero_grad()", "model(images)", "F.cross_entropy(",
                 "loss.backward()", "optimizer.step()", "for epoch in range("):
        assert step in text, f"{script} does not show {step}"
    assert "speed" not in re.findall(r"^(?:from|import) (\S+)", text, re.M) and \
        "ddp_scripts.speed" not in text, f"{script} imports chapter 10's options"
    assert "scaler" not in text and "autocast" not in text and "levers" not in text


@pytest.mark.parametrize("script", ["train_fast.py", "train_fsdp.py"])
def test_the_children_keep_the_parents_step(script):
    text = (SCRIPTS / script).read_text()
    for step in ("model(images)", "F.cross_entropy(", "backward()", "step(optimizer)"
                 if script == "train_fast.py" else "optimizer.step()", "for epoch in range("):
        assert step in text, f"{script} does not show {step}"
