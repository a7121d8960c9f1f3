"""Chapter 9's figures, fed what hooks recorded on two gloo ranks (ddp_scripts/practice/hooks.py,
run as the chapter runs it, through everyday.py): what they draw is what the run recorded, and
the run shows what the chapter says about it."""
import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from ddp_scripts.launcher import run_command, torchrun_command
from notebooks.practice_figures import draw_no_sync, draw_overlap, overlap_line, overlap_rows


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("ch09-hooks")
    run_command(torchrun_command("practice/everyday.py", 2,
                                 ["--out", str(out), "overlap", "no_sync_steps"]),
                timeout=300, echo=lambda line: None)
    return {name: json.loads((out / f"{name}.json").read_text())
            for name in ("overlap", "no_sync_steps")}


def test_the_overlap_figure_draws_every_ready_time_and_every_buckets_all_reduce(recorded):
    runs = recorded["overlap"]["steps_per_rank"]
    fig, drawn = draw_overlap(recorded["overlap"])
    plt.close(fig)
    assert list(drawn) == ["step 1: 1 bucket", f"step {len(runs[0])}: 2 buckets"]
    for (title, rows), step in zip(drawn.items(), (0, -1)):
        origin = min(steps[step]["backward_start"] for steps in runs)
        for rank, steps in enumerate(runs):
            events = steps[step]
            ready = [bar for bar in rows[f"rank {rank} backward"] if bar[2] == "gradient ready"]
            assert [start + origin for start, _, _ in ready] == pytest.approx(
                [t for _, t in events["ready"]])
            for bucket in events["buckets"]:
                start, width, kind = rows[f"rank {rank} bucket {bucket['index']}"][0]
                assert kind == "all-reduce"
                assert start + origin == pytest.approx(bucket["launched"])
                assert start + width + origin == pytest.approx(bucket["finished"])
    assert overlap_rows(runs, 0)["rank 0 bucket 1"] == []   # no second bucket in step 1


def test_the_overlap_figures_top_panel_numbers_its_time_axis(recorded):
    fig, _ = draw_overlap(recorded["overlap"])
    fig.canvas.draw()
    top, bottom = ([label.get_text() for label in ax.get_xticklabels()] for ax in fig.axes)
    plt.close(fig)
    assert top == bottom and len(top) > 1


def test_the_first_step_sends_one_bucket_after_backward_and_later_steps_overlap(recorded):
    for steps in recorded["overlap"]["steps_per_rank"]:
        first, last = steps[0], steps[-1]
        names = {name for name, _ in first["ready"]}
        assert len(first["buckets"]) == 1 and set(first["buckets"][0]["parameters"]) == names
        assert first["buckets"][0]["launched"] >= max(t for _, t in first["ready"])
        assert len(last["buckets"]) == 2
        # the first bucket of a rebuilt step leaves while backward still computes gradients
        assert last["buckets"][0]["launched"] < max(t for _, t in last["ready"])
        for step in (first, last):  # backward returns only once every all-reduce has finished
            for bucket in step["buckets"]:
                assert step["backward_start"] < bucket["launched"] < bucket["finished"] \
                    <= step["backward_end"]


def test_the_no_sync_figure_draws_each_micro_batchs_gradient_and_all_reduces(recorded):
    no_sync = recorded["no_sync_steps"]
    fig, drawn = draw_no_sync(no_sync)
    plt.close(fig)
    every = no_sync["micro_batches_per_step"]
    for run, per_rank in no_sync["per_rank"].items():
        for rank, micro in enumerate(per_rank):
            assert drawn["grad"][f"rank {rank}, {run}"] == [m["grad"] for m in micro]
        assert drawn["all_reduces"][run] == [m["all_reduces"] for m in per_rank[0]]
    assert drawn["all_reduces"]["without no_sync()"] == [1] * 2 * every
    assert drawn["all_reduces"]["with no_sync()"] == ([0] * (every - 1) + [1]) * 2
    with_no_sync = no_sync["per_rank"]["with no_sync()"]
    assert with_no_sync[0][0]["grad"] != with_no_sync[1][0]["grad"]   # each rank its own sum
    assert with_no_sync[0][every - 1]["grad"] == with_no_sync[1][every - 1]["grad"]  # averaged
    without = no_sync["per_rank"]["without no_sync()"][0]   # the value it reached, to rounding
    assert with_no_sync[0][every - 1]["grad"] == pytest.approx(without[every - 1]["grad"],
                                                               abs=1e-12)


# The chapter's verdict on overlap, fed the two steps the run recorded: the first, where DDP
# sends its one bucket after backward (the flaw the line exists to catch), and the last.

def test_planted_a_bucket_sent_after_backward_is_named_with_its_ranks(recorded):
    line = overlap_line(recorded["overlap"]["steps_per_rank"], step=0)
    assert line == ("step 1: on rank(s) [0, 1], bucket 0's all-reduce started only after "
                    "backward ended")


def test_right_case_bucket_0_leaves_while_backward_still_runs(recorded):
    runs = recorded["overlap"]["steps_per_rank"]
    assert overlap_line(runs) == (f"step {len(runs[0])}: bucket 0's all-reduce started while "
                                  "backward still ran, on every rank")
