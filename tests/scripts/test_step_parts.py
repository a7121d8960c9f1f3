"""ddp_scripts/recorders/step_parts.py: the parts of a step add up to the measured step, the remainder is
what the timed phases leave of it, the all-reduce is timed inside backward and split into its
hidden and exposed shares (on gloo; under NCCL it is left untimed), no all-reduce ends before
every rank has launched it, a case's spread is the benchmark's, the benchmark's ratio is put
together from the parts, the part that grew is the one the numbers say, and bad options are
one line and exit status 2."""
import json

import pytest
import torch

from ddp_scripts.launcher import run_command, torchrun_command
from ddp_scripts.measure.benchmark import RELIABLE_SPREAD
from ddp_scripts.recorders.step_parts import (PARTS, PHASES, REMAINDER, breakdown, communication,
                                             part_that_grew, ratio_from_parts, spread)
from helpers import assert_one_line_error, run_in_process

QUICK = ["--steps", "4", "--warmup", "1", "--cases", "batch 8,all cores each"]


def check_adds_up(case):
    steps, parts = case["steps"], case["parts"]
    assert list(parts) == [*PARTS, REMAINDER]
    assert sum(parts.values()) == pytest.approx(case["step"], rel=1e-12, abs=1e-12)
    for row in steps:  # each step runs from its start to the next: the phases fit inside it
        assert row["step"] >= sum(row[phase] for phase in PHASES)
        assert set(row["cpu"]) == set(PHASES) and all(t >= 0 for t in row["cpu"].values())
    # The remainder is exactly the mean of what the phases leave of each step.
    left = sum(row["step"] - sum(row[phase] for phase in PHASES) for row in steps) / len(steps)
    assert parts[REMAINDER] == pytest.approx(left, rel=1e-9, abs=1e-12)
    assert case["spread"] == spread(steps) >= 1
    assert case["reliable"] == (case["spread"] <= RELIABLE_SPREAD)
    backward = sum(row["backward"] for row in steps) / len(steps)
    assert parts["backward compute"] + parts["communication not hidden"] == pytest.approx(backward)


def test_one_process_parts_add_up_to_the_step(tmp_path):
    result = run_in_process("recorders/step_parts.py", *QUICK, "--threads", "1", "--out",
                            tmp_path / "one.json")
    assert result.returncode == 0, result.stderr
    run = json.loads((tmp_path / "one.json").read_text())
    assert run["processes"] == 1 and list(run["cases"]) == ["batch 8", "all cores each"]
    for case in run["cases"].values():
        check_adds_up(case)
        assert case["parts"]["communication not hidden"] == 0
        assert case["communication"]["total"] == 0 and "all-reduces" not in case["steps"][0]
    assert run["cases"]["batch 8"]["settings"]["threads_per_process"] == 1
    assert run["cases"]["all cores each"]["settings"]["threads_per_process"] == run["usable_cores"]


def early_ends(every_rank):
    """(rank, step, bucket) of each all-reduce whose end came before some rank's launch of
    the same bucket: an all-reduce cannot have finished before every rank contributed."""
    found = []
    for rank, steps in enumerate(every_rank):
        for index, buckets in enumerate(steps):
            for bucket, (_, end) in enumerate(buckets):
                last = max(other[index][bucket][0] for other in every_rank)
                if end < last:
                    found.append((rank, index, bucket))
    return found


def test_two_processes_time_the_all_reduce_inside_backward(tmp_path):
    out = tmp_path / "two.json"
    run_command(torchrun_command("recorders/step_parts.py", 2, [*QUICK, "--out", str(out)]),
                timeout=300, progress=False, echo=lambda line: None)
    run = json.loads(out.read_text())
    assert run["processes"] == 2
    for case in run["cases"].values():
        check_adds_up(case)
        assert case["communication timed"] and "communication untimed" not in case
        every_rank = case["all-reduces of every rank"]
        assert every_rank[0] == [row["all-reduces"] for row in case["steps"]]
        assert len(every_rank) == 2 and not early_ends(every_rank)
        # A timer that stamped the end at launch (as a future completed at enqueue would)
        # fails it: one of the two ranks launched each bucket first.
        stamped_at_launch = [[[[start, start] for start, _ in buckets] for buckets in steps]
                             for steps in every_rank]
        buckets = sum(len(row["all-reduces"]) for row in case["steps"])
        assert len(early_ends(stamped_at_launch)) == buckets
        assert case["settings"]["batch_per_process"] * 2 == case["settings"]["batch_size"]
        assert len(case["ranks"]) == 2
        assert case["ranks"][0] == breakdown(case["steps"])
        for row in case["steps"]:
            assert row["all-reduces"], "every DDP step all-reduces"
            for start, end in row["all-reduces"]:  # launched in backward, waited for by it
                assert row["backward start"] <= start <= end <= row["backward end"]
            assert row["backward start"] <= row["last gradient"] <= row["backward end"]
            comm = communication(row)
            assert comm["hidden"] + comm["exposed"] == pytest.approx(comm["total"])
            assert 0 <= row["waiting for other ranks"] <= comm["total"] + 1e-12
        exposed = sum(communication(row)["exposed"] for row in case["steps"]) / len(case["steps"])
        assert case["parts"]["communication not hidden"] == pytest.approx(exposed)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs: nccl, one rank each")
def test_two_processes_on_two_gpus(tmp_path):
    # Each rank on its own GPU: init_process_group sets the device before the group's first
    # collective, which stages its bytes on the current device.
    out = tmp_path / "two.json"
    run_command(torchrun_command("recorders/step_parts.py", 2, [*QUICK, "--device", "cuda", "--out",
                                                      str(out)]),
                timeout=300, progress=False, echo=lambda line: None)
    run = json.loads(out.read_text())
    assert run["device"] == "cuda:0"
    for case in run["cases"].values():
        check_adds_up(case)
        # Under NCCL the all-reduce's future completes once it is queued: no split is made.
        assert not case["communication timed"] and "NCCL" in case["communication untimed"]
        assert case["parts"]["communication not hidden"] == 0
        assert not any("all-reduces" in row for row in case["steps"])


def test_hidden_and_exposed_split_at_the_last_gradient():
    # Two buckets: one from 1 to 3 (before the last gradient at 2.5: 1.5 hidden, 0.5 exposed),
    # one from 2.8 to 4 overlapping the first; the union is 1 to 4.
    row = {"all-reduces": [[2.8, 4.0], [1.0, 3.0]], "last gradient": 2.5}
    comm = communication(row)
    assert comm["total"] == pytest.approx(3.0)
    assert comm["hidden"] == pytest.approx(1.5) and comm["exposed"] == pytest.approx(1.5)
    assert comm["buckets"] == 2
    assert communication({"all-reduces": [[3.0, 4.0]], "last gradient": 3.0})["hidden"] == 0


def test_a_cases_spread_is_its_slowest_group_of_steps_over_its_fastest():
    steps = [{"step": t} for t in [1, 1, 2, 2, 1, 3, 4, 4]]  # groups of 2: 1, 2, 2, 4
    assert spread(steps) == pytest.approx(4.0)
    assert spread(steps[:3]) == pytest.approx(2.0)  # fewer steps than groups: one per group
    assert spread([{"step": 0.5}] * 8) == 1.0


def test_the_benchmarks_ratio_is_put_together_from_the_parts():
    def run(processes, step_s, batch=64):
        return {"processes": processes,
                "cases": {"batch 64": {"settings": {"batch_size": batch}, "step": step_s}}}
    one_thread, one_all, many = run(1, 0.008), run(1, 0.004), run(2, 0.006)
    got = ratio_from_parts(many, one_thread, one_all)
    assert got["processes gain"] == pytest.approx(8 / 6)
    assert got["threads gain"] == pytest.approx(2.0)
    # The gains' ratio is the two processes' speed over one process with all the cores.
    assert got["ratio"] == pytest.approx(0.004 / 0.006)


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
    (["--threads", "0"], "--threads must be at least 1"),
    ([], "--out"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path, args, fragment):
    if args:
        args = [*args, "--out", tmp_path / "x.json"]
    result = run_in_process("recorders/step_parts.py", *args)
    assert_one_line_error(result, fragment)
    assert not (tmp_path / "x.json").exists()
