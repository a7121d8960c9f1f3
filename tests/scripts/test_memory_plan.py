"""memory_plan.py, the calculator of chapter 11, held to what ranks hold: memory_run.py takes
one step on 3 gloo ranks (width 64: every first dimension but the head's 10 splits unevenly
over 3, so FSDP pads and ZeRO-1's shares differ), and every rank's parameters, gradients,
optimizer state and activations equal the prediction, byte for byte. Then two steps under
torch's own memory trackers: every rank's peak is peak_plan's, within its tolerance, and a
rule left out of peak_plan makes the check fail."""
import json

import pytest
import torch
from helpers import assert_one_line_error, run_one_rank

from ddp_scripts.launcher import run_command, torchrun_command
from ddp_scripts.recorders.memory_plan import PARTS, chunk_rows, peak_agrees, peak_plan, plan
from ddp_scripts.sharding import WideMLP

RANKS, WIDTH, DEPTH, BATCH = 3, 64, 2, 6


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("memory")
    run_command(torchrun_command("recorders/memory_run.py", RANKS, [
        "--out", str(out), "--width", str(WIDTH), "--depth", str(DEPTH),
        "--global-batch-size", str(BATCH), "--dtype", "float64"]),
        timeout=300, echo=lambda line: None)
    return out


@pytest.fixture(scope="module")
def measured(run):
    return [json.loads(line) for line in (run / "memory.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def tracked(run):
    return [json.loads(line) for line in (run / "peaks.jsonl").read_text().splitlines()]


def peaks_agree(tracked, **rules):
    """Which (strategy, rank) rows peak_plan, with these rules, gets within its tolerance."""
    model = WideMLP(WIDTH, DEPTH)
    planned = peak_plan(model, BATCH, RANKS, torch.float64, units=model.blocks, rules=rules)
    return {(r["strategy"], r["rank"]): peak_agrees(planned[r["strategy"]][r["rank"]]["peak"],
                                                    r["tracked_peak"]) for r in tracked}


def forward_points_agree(tracked, **rules):
    """Which (rank, block) forward points peak_plan, with these rules, gets within its
    tolerance of FSDPMemTracker's peak in that block's forward (its all-gather included)."""
    model = WideMLP(WIDTH, DEPTH)
    points = [row["points"] for row in peak_plan(model, BATCH, RANKS, torch.float64,
                                                 units=model.blocks, rules=rules)["FSDP"]]
    return {(r["rank"], block): peak_agrees(points[r["rank"]][f"forward of {block}"], value)
            for r in tracked if r["strategy"] == "FSDP"
            for block, value in r["forward_peaks"].items()}


@pytest.fixture(scope="module")
def predicted():
    model = WideMLP(WIDTH, DEPTH)
    return plan(model, BATCH, RANKS, torch.float64, units=model.blocks)


def test_every_rank_holds_what_the_calculator_predicts_to_the_byte(measured, predicted):
    seen = {(r["strategy"], r["rank"]) for r in measured}
    assert seen == {(s, rank) for s, ranks in predicted.items() for rank in range(len(ranks))}
    for record in measured:
        expected = predicted[record["strategy"]][record["rank"]]
        for part in PARTS[:4]:
            assert record[part] == expected[part], (record["strategy"], record["rank"], part)


def test_the_splits_are_uneven_where_the_text_says(measured):
    zero = [r["optimizer"] for r in measured if r["strategy"] == "ZeRO-1"]
    fsdp = [r for r in measured if r["strategy"] == "FSDP"]
    assert len(set(zero)) > 1  # whole tensors per rank: the shares differ
    assert len({r["parameters"] for r in fsdp}) == 1  # padded: every rank allocates the same
    assert fsdp[-1]["optimizer"] < fsdp[0]["optimizer"]  # the state follows the real rows


def test_fsdp_holds_at_most_its_shards_the_root_and_one_block_and_ddp_all_along(measured,
                                                                                 predicted):
    for record in measured:
        held = [point["bytes"] for point in record["timeline"]]
        expected = predicted[record["strategy"]][record["rank"]]
        assert max(held) == expected["parameters"] + expected["gathered"]
        if record["strategy"] == "FSDP":
            assert held[0] == held[-1] == expected["parameters"]  # shards only, at rest
        else:
            assert set(held) == {expected["parameters"]}


def test_every_ranks_peak_is_the_tracked_one_within_the_tolerance(tracked):
    assert len(tracked) == 1 + 4 * RANKS  # one process; DDP, its bucket view, ZeRO-1, FSDP
    assert all(peaks_agree(tracked).values()), peaks_agree(tracked)
    for record in tracked:  # the tracker saw buffers the counted tensors do not hold
        assert record["tracked_peak"] > 0 and record["categories"]
        assert record["max_memory_allocated"] is None  # on the CPU


@pytest.mark.parametrize("rule, strategies", [
    ("bucket", {"DDP", "DDP, bucket view", "ZeRO-1"}),
    ("reduce-scatter buffer", {"FSDP"}),
])
def test_a_rule_left_out_fails_the_check(tracked, rule, strategies):
    agree = peaks_agree(tracked, **{rule: False})
    assert {strategy for (strategy, _), ok in agree.items() if not ok} == strategies


def test_each_blocks_forward_peak_is_the_tracked_one(tracked):
    agree = forward_points_agree(tracked)
    assert len(agree) == RANKS * DEPTH and all(agree.values()), agree


def test_without_the_previous_units_all_gather_buffer_every_forward_point_fails(tracked):
    """Here FSDP's peak falls in backward, so the forward points are checked on their own:
    each block is copied out of its all-gather output beside the previous unit's."""
    assert not any(forward_points_agree(tracked, **{"all-gather buffers": False}).values())


def test_ddps_buckets_cost_a_copy_of_the_gradients_unless_they_are_the_gradients(tracked):
    model = WideMLP(WIDTH, DEPTH)
    planned = peak_plan(model, BATCH, RANKS, torch.float64, units=model.blocks)
    ddp, view = (planned[s][0] for s in ("DDP", "DDP, bucket view"))
    assert ddp["parts"]["DDP buckets"] == ddp["parts"]["gradients"]
    assert view["parts"]["gradients being made"] < ddp["parts"]["gradients"]
    peak = {r["strategy"]: r["tracked_peak"] for r in tracked if r["rank"] == 0}
    assert peak["DDP"] - peak["DDP, bucket view"] == pytest.approx(
        ddp["peak"] - view["peak"], rel=0.01)
    for record in tracked:  # DDP and ZeRO-1 peak where the last gradient is made
        if record["strategy"] != "FSDP":
            assert record["tracked_at"] == "backward of stem"


def test_the_peak_is_above_the_parts_after_the_step_and_the_calculator_adds_it_up():
    from notebooks.fsdp_memory import PEAK_COLUMNS, calculator_table
    table = calculator_table(WIDTH, DEPTH, BATCH, RANKS, "float64", "sgd-momentum")
    parts = table[[f"{column} (MB)" for column in PEAK_COLUMNS]].sum(axis=1)
    assert parts.tolist() == pytest.approx(table["peak (MB)"].tolist())
    model = WideMLP(WIDTH, DEPTH)
    after = plan(model, BATCH, RANKS, torch.float64, units=model.blocks)
    for strategy in ("DDP", "FSDP"):
        assert table.loc[strategy, "peak (MB)"] * 1e6 > sum(after[strategy][0][p]
                                                            for p in PARTS[:4])


@pytest.mark.parametrize("rows", range(1, 12))
@pytest.mark.parametrize("ranks", range(1, 6))
def test_chunk_rows_are_torch_chunks_pieces(rows, ranks):
    pieces = torch.chunk(torch.arange(rows), ranks)
    for rank in range(ranks):
        real = len(pieces[rank]) if rank < len(pieces) else 0
        assert chunk_rows(rows, ranks, rank) == (len(pieces[0]), real)


def test_the_calculator_refuses_what_it_cannot_plan():
    model = WideMLP(32, 1)
    with pytest.raises(ValueError, match="does not split evenly"):
        plan(model, 10, 4)
    for optimizer in ("adam", "sgd"):  # only SGD with momentum's step is planned
        with pytest.raises(ValueError, match="plans sgd-momentum only"):
            plan(model, 8, 4, optimizer=optimizer)


def test_memory_run_says_what_is_wrong_in_one_line():
    assert_one_line_error(run_one_rank("recorders/memory_run.py", "--out", "x", "--dtype", "int8"),
                          "--dtype")
