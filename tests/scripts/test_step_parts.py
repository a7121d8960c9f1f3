"""ddp_scripts/step_parts.py: the parts of a step add up to the measured step, the remainder is
what the timed phases leave of it, the part that grew is the one the numbers say, and bad
options are one line and exit status 2."""
import json

import pytest

from ddp_scripts.launcher import run_command, torchrun_command
from ddp_scripts.step_parts import PARTS, PHASES, REMAINDER, breakdown, part_that_grew
from helpers import assert_one_line_error, run_in_process

QUICK = ["--steps", "4", "--warmup", "1", "--probe-steps", "2", "--cases", "batch 8,slow loader"]


def check_adds_up(case, ddp):
    steps, probes = case["steps"], case["probes"]
    parts = case["parts"]
    assert list(parts) == [*PARTS, REMAINDER]
    assert sum(parts.values()) == pytest.approx(case["step"], rel=1e-12, abs=1e-12)
    for row in steps:  # each step runs from its start to the next: the phases fit inside it
        assert row["step"] >= sum(row[phase] for phase in PHASES)
    # The remainder is exactly the mean of what the phases leave of each step.
    left = sum(row["step"] - sum(row[phase] for phase in PHASES) for row in steps) / len(steps)
    assert parts[REMAINDER] == pytest.approx(left, rel=1e-9, abs=1e-12)
    backward = sum(row["backward"] for row in steps) / len(steps)
    assert parts["backward compute"] + parts["communication not hidden"] == pytest.approx(backward)
    assert parts["communication not hidden"] >= 0
    assert bool(probes) == ddp  # only DDP splits backward, with its no_sync steps


def test_one_process_parts_add_up_to_the_step(tmp_path):
    result = run_in_process("step_parts.py", *QUICK, "--out", tmp_path / "one.json")
    assert result.returncode == 0, result.stderr
    run = json.loads((tmp_path / "one.json").read_text())
    assert run["processes"] == 1 and list(run["cases"]) == ["batch 8", "slow loader"]
    for case in run["cases"].values():
        check_adds_up(case, ddp=False)
        assert case["parts"]["communication not hidden"] == 0
    slow = run["cases"]["slow loader"]
    assert slow["settings"]["decode_us"] == 150 and slow["settings"]["threads_per_process"] == 1


def test_two_processes_parts_add_up_and_every_rank_reports(tmp_path):
    out = tmp_path / "two.json"
    run_command(torchrun_command("step_parts.py", 2, [*QUICK, "--out", str(out)]),
                timeout=300, progress=False, echo=lambda line: None)
    run = json.loads(out.read_text())
    assert run["processes"] == 2
    for case in run["cases"].values():
        check_adds_up(case, ddp=True)
        assert case["settings"]["batch_per_process"] * 2 == case["settings"]["batch_size"]
        assert len(case["ranks"]) == 2
        assert case["ranks"][0] == breakdown(case["steps"], case["probes"])


def test_the_part_that_grew_is_named_from_the_numbers():
    def made(**parts):
        full = {part: parts.get(part.split()[0], 0.001) for part in [*PARTS, REMAINDER]}
        return {"parts": full, "step": sum(full.values())}
    one = made(forward=0.002)
    assert part_that_grew(one, made(forward=0.002, communication=0.004)) == \
        ("communication not hidden", pytest.approx(0.003))
    assert part_that_grew(one, made(forward=0.005))[0] == "forward"
    assert part_that_grew(one, made(data=0.009))[0] == "data wait"


@pytest.mark.parametrize("args, fragment", [
    (["--steps", "0"], "--steps must be at least 1"),
    (["--cases", "batch 9"], "unknown case 'batch 9'"),
    (["--warmup", "-1"], "--warmup must be 0 or more"),
    ([], "--out"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path, args, fragment):
    if args:
        args = [*args, "--out", tmp_path / "x.json"]
    result = run_in_process("step_parts.py", *args)
    assert_one_line_error(result, fragment)
    assert not (tmp_path / "x.json").exists()
