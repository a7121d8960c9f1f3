"""Chapter 8's figures, fed their runs' data: the hang drawn from the JSON lines the ranks of
ddp_scripts/mistakes/rank_dependent_collective.py wrote, and DistributedSampler's padding."""
import json
import os

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from ddp_scripts.launcher import LaunchError, run_command, torchrun_command
from notebooks import chapter_tools, timeline_figures

TIMEOUT_S = 2


@pytest.fixture(scope="module")
def hang_run(tmp_path_factory):
    """The hang's events folder, and every line the run printed."""
    out, lines = tmp_path_factory.mktemp("ch08-hang"), []
    with pytest.raises(LaunchError):
        run_command(torchrun_command("mistakes/rank_dependent_collective.py", 2,
                                     ["--timeout-s", str(TIMEOUT_S), "--events", str(out)]),
                    timeout=300, env={"OMP_NUM_THREADS": "1"}, echo=lines.append)
    return out, lines


@pytest.fixture(scope="module")
def hang(hang_run):
    return hang_run[0]



def test_each_rank_recorded_its_arrival_and_the_timeout_that_ended_its_wait(hang):
    events = timeline_figures.hang_events(hang)
    assert list(events) == [0, 1]
    for rank, records in events.items():
        assert records[0]["event"] == "joined" and records[0]["timeout_s"] == TIMEOUT_S
        arrived = records[1]
        assert (arrived["event"], arrived["collective"]) == \
            ("reached", "all_reduce" if rank == 0 else "barrier")
    # Rank 0 (never answered) fails with gloo's timeout; rank 1 either times out too or sees
    # rank 0's connection close first, or torchrun stops it before it writes again.
    failed = events[0][2]
    assert failed["event"] == "failed" and "Timed out" in failed["error"], failed
    assert failed["time_s"] - events[0][1]["time_s"] >= TIMEOUT_S
    assert all(r["event"] != "left" for records in events.values() for r in records)


def test_the_hang_timeline_draws_each_wait_from_arrival_to_its_end(hang, axes):
    events = timeline_figures.hang_events(hang)
    drawn = timeline_figures.draw_hang(axes, hang)
    origin = min(r["time_s"] for records in events.values() for r in records)
    start, width, kind = drawn["bars"]["rank 0"][0]
    assert kind == "waits in all_reduce"
    assert start == pytest.approx(events[0][1]["time_s"] - origin)
    assert start + width == pytest.approx(events[0][2]["time_s"] - origin)
    assert drawn["ends"]["rank 0"][1] == "failed"
    assert drawn["bars"]["rank 1"][0][2] == "waits in barrier"
    assert drawn["timeout_s"] == TIMEOUT_S
    assert [t.get_text() for t in axes.get_yticklabels()] == ["rank 0", "rank 1"]


def test_a_rank_with_no_record_after_its_arrival_waits_until_the_last_record(tmp_path, axes):
    (tmp_path / "rank0.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"rank": 0, "event": "joined", "time_s": 10.0, "timeout_s": 5},
        {"rank": 0, "collective": "all_reduce", "event": "reached", "time_s": 10.5}]))
    (tmp_path / "rank1.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"rank": 1, "event": "joined", "time_s": 10.0, "timeout_s": 5},
        {"rank": 1, "collective": "barrier", "event": "reached", "time_s": 11.0},
        {"rank": 1, "collective": "barrier", "event": "failed", "time_s": 16.0, "error": "x"}]))
    rows, ends, timeout_s = timeline_figures.hang_rows(timeline_figures.hang_events(tmp_path))
    assert rows == {"rank 0": [(0.5, 6.0, "waits in all_reduce")],
                    "rank 1": [(1.0, 6.0, "waits in barrier")]}
    assert ends == {"rank 0": (6.0, "no record"), "rank 1": (6.0, "failed")}
    assert timeout_s == 5


@pytest.mark.parametrize("samples, world", [(10, 8), (1001, 8), (12, 4)])
def test_the_padding_grid_writes_what_the_sampler_gives_each_rank(samples, world, axes):
    from torch.utils.data.distributed import DistributedSampler
    correct = torch.arange(samples) % 3 == 0
    drawn = timeline_figures.draw_padding(axes, samples, world, correct)
    shares = [list(DistributedSampler(range(samples), num_replicas=world, rank=r, shuffle=False))
              for r in range(world)]
    assert drawn["texts"] == [[str(i) for i in share] for share in shares]
    outlined = sum(1 for patch in axes.patches if patch.get_linewidth() == 3)
    assert outlined == sum(len(s) for s in shares) - samples
    scored = torch.tensor([i for share in shares for i in share])
    assert drawn["accuracy"] == pytest.approx((correct[scored].float().mean().item(),
                                               correct.float().mean().item()))


# The hang's count: each rank once, from its own record ------------------------------------
def records(rank, collective, error=None):
    ended = ([{"rank": rank, "collective": collective, "event": "failed", "time_s": 14.0,
               "error": error}] if error else [])
    return [{"rank": rank, "event": "joined", "time_s": 10.0, "timeout_s": 3},
            {"rank": rank, "collective": collective, "event": "reached", "time_s": 11.0}, *ended]


TIMED_OUT = ("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
             "3000ms for recv operation to complete")
CLOSED = "[../third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:9115"


def test_planted_one_timeout_printed_twice_counts_one_rank():
    """The build's run: rank 1 timed out (its traceback and torchrun's copy: two lines of the
    output), rank 0 saw its connection close."""
    events = {0: records(0, "all_reduce", CLOSED), 1: records(1, "barrier", TIMED_OUT)}
    assert timeline_figures.hang_outcome(events) == (
        "1 of 2 ranks timed out (rank 1 in barrier); rank 0 saw its peer's connection close in "
        "all_reduce")


def test_right_case_both_ranks_timed_out():
    events = {0: records(0, "all_reduce", TIMED_OUT), 1: records(1, "barrier", TIMED_OUT)}
    assert timeline_figures.hang_outcome(events) == (
        "2 of 2 ranks timed out (rank 0 in all_reduce, rank 1 in barrier)")
    events[1] = records(1, "barrier")   # torchrun ended it before it wrote again
    assert timeline_figures.hang_outcome(events).endswith(
        "rank 1 was still waiting when torchrun ended it in barrier")


def test_the_hang_run_counts_the_ranks_whose_own_traceback_says_timed_out(hang_run):
    out, lines = hang_run
    tracebacks = {line.split("]")[0] for line in lines
                  if line.startswith("[rank") and "RuntimeError: " in line and "Timed out" in line}
    copies = [line for line in lines if "Timed out" in line]
    assert len(copies) > len(tracebacks)   # the output repeats each: lines are not ranks
    counted = int(timeline_figures.hang_outcome(timeline_figures.hang_events(out)).split()[0])
    assert counted == len(tracebacks) >= 1


def test_torchruns_summary_keeps_each_ranks_last_line_and_its_root_cause(hang_run):
    _, lines = hang_run
    own, box = chapter_tools.torchrun_summary(lines)
    assert own > 5 and box[0].startswith("=====") and box[-1].startswith("=====")
    assert box[1].endswith("rank_dependent_collective.py FAILED")
    assert "Failures:" in box and "Root Cause (first observed failure):" in box
    # every rank's block: its error's last line kept, the frames between counted
    errors = [line for line in box if line.startswith("  RuntimeError: ")]
    left_out = [line for line in box if "lines of the rank's traceback left out" in line]
    assert len(errors) == len(left_out) == len([line for line in box
                                                if "traceback : Traceback" in line])
    assert chapter_tools.torchrun_summary(["[rank 0] done"]) == (0, [])


# What the survivor of a killed rank reported: its error file, read from torchrun's --log-dir --
def an_attempt(log_dir, attempt, files):
    """torchrun's folders for one attempt of two ranks, with the error files `files` {rank:
    error} written by the scripts' own writer."""
    from ddp_scripts.runfiles import write_error_file
    for rank in (0, 1):
        folder = log_dir / "run_x" / f"attempt_{attempt}" / str(rank)
        folder.mkdir(parents=True)
        if rank in files:
            os.environ["TORCHELASTIC_ERROR_FILE"] = str(folder / "error.json")
            try:
                write_error_file(files[rank], exit_code=1, rank=rank, with_stack=False,
                                 lost_peer=True)
            finally:
                del os.environ["TORCHELASTIC_ERROR_FILE"]


def test_planted_a_survivor_that_said_why_in_one_line_is_quoted(tmp_path):
    """The build's case: rank 0 wrote one line, no traceback, and the page said 'nothing'."""
    from ddp_scripts.mishaps import peer_lost
    an_attempt(tmp_path, 0, {0: peer_lost(RuntimeError(CLOSED))})
    an_attempt(tmp_path, 1, {})
    said = chapter_tools.what_a_rank_reported(tmp_path, rank=0, attempt=0)
    assert said.startswith("rank 0's error file in attempt 0 (it lost its peer): another rank "
                           "ended first (RuntimeError: [../third_party/gloo"), said


def test_right_case_a_survivor_without_an_error_file_is_said_to_have_none(tmp_path):
    an_attempt(tmp_path, 0, {})
    said = chapter_tools.what_a_rank_reported(tmp_path, rank=0, attempt=0)
    assert said.startswith("rank 0 wrote no error file in attempt 0"), said
