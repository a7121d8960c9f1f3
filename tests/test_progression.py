"""train_single.py -> train_dp.py -> train_ddp.py -> train_fsdp.py read as one progression: the
diff is the lesson."""
import difflib
import re

import pytest

from helpers import SCRIPTS


def code_lines(path):
    """The script's lines without its docstrings, comments and blank lines, as the chapter
    counts them; a trailing comment is kept (it carries the DP/DDP mark)."""
    text = re.sub(r'"""(?:.|\n)*?"""', "", path.read_text())
    return [line for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def hunks(before, after):
    """(removed lines, added lines) for each place where the two scripts differ."""
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    return [(before[i1:i2], after[j1:j2])
            for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]


@pytest.mark.parametrize("script, mark, most_added", [("train_dp.py", "DP", 8),
                                                      ("train_ddp.py", "DDP", 40)])
def test_every_change_is_marked_and_the_diff_stays_short(script, mark, most_added):
    single, other = code_lines(SCRIPTS / "train_single.py"), code_lines(SCRIPTS / script)
    changes = hunks(single, other)
    added = sum(len(new) for _, new in changes)
    assert 0 < added <= most_added, f"{script} adds or changes {added} lines"
    for removed, new in changes:
        assert any(re.search(rf"#.*\b{mark}\b", line) for line in new), (
            f"a change in {script} is not marked {mark}:\n" + "\n".join(removed + ["---"] + new))


def test_fsdp_changes_ddp_in_marked_lines_only():
    """train_ddp.py -> train_fsdp.py. At most 60 lines (57 now): 13 of options (the wide MLP,
    the global batch, one per memory setting), 11 of imports, 4 in setup (the per-rank batch),
    2 comments on the training step, 19 for sharding, the optimizer after it, the sharded
    checkpoints, the whole-model export and evaluation in step; and the lines where
    train_ddp.py uses chapter 10's levers (ddp_scripts/speed.py), which train_fsdp.py leaves
    out: its mixed precision is FSDP's own (MixedPrecisionPolicy), and the levers have not
    been tried with sharded models."""
    ddp, fsdp = code_lines(SCRIPTS / "train_ddp.py"), code_lines(SCRIPTS / "train_fsdp.py")
    changes = hunks(ddp, fsdp)
    added = sum(len(new) for _, new in changes)
    assert 0 < added <= 60, f"train_fsdp.py adds or changes {added} lines of train_ddp.py"
    for removed, new in changes:
        if not new:  # a line only taken out: only the levers may be
            assert all(re.search(r"\blevers\b|\bspeed\b", line) for line in removed), removed
            continue
        assert any(re.search(r"#.*\bFSDP\b", line) for line in new), (
            "a change in train_fsdp.py is not marked FSDP:\n" + "\n".join(removed + ["---"] + new))


@pytest.mark.parametrize("script", ["train_single.py", "train_dp.py", "train_ddp.py",
                                    "train_fsdp.py"])
def test_the_training_loop_is_in_each_script(script):
    text = (SCRIPTS / script).read_text()
    # backward and step may go through --amp's gradient scaler (a pass-through when it is off)
    for spellings in (("model(images)",), ("F.cross_entropy(",),
                      ("loss.backward()", "scaler.scale(loss).backward()"),
                      ("optimizer.step()", "scaler.step(optimizer)"), ("optimizer.zero_grad(",),
                      ("for epoch in range(",)):
        assert any(step in text for step in spellings), f"{script} does not show {spellings[0]}"
