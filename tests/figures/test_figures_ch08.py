"""Chapter 8's figures, fed their runs' data: the hang drawn from the JSON lines the ranks of
ddp_scripts/mistakes/rank_dependent_collective.py wrote, and DistributedSampler's padding."""
import json

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from ddp_scripts.launcher import LaunchError, run_command, torchrun_command
from notebooks import timeline_figures

TIMEOUT_S = 2


@pytest.fixture(scope="module")
def hang(tmp_path_factory):
    out = tmp_path_factory.mktemp("ch08-hang")
    with pytest.raises(LaunchError):
        run_command(torchrun_command("mistakes/rank_dependent_collective.py", 2,
                                     ["--timeout-s", str(TIMEOUT_S), "--events", str(out)]),
                    timeout=300, env={"OMP_NUM_THREADS": "1"}, echo=lambda line: None)
    return out



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
