"""Chapter 11's figures and tables, fed a run of ddp_scripts/recorders/memory_run.py on 3 gloo ranks (run
as the chapter runs it, smaller): what they draw is what the calculator predicted and what the
run measured."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch

from ddp_scripts.launcher import run_command, torchrun_command
from ddp_scripts.recorders.memory_plan import PARTS, PEAK_STRATEGIES, peak_plan
from notebooks.figures import new_figure
from notebooks.fsdp_memory import (PEAK_COLUMNS, calculator_cases, calculator_form,
                                   calculator_table, draw_collectives, draw_held, draw_step,
                                   fake_tracked, peaks_side_by_side, plan_for,
                                   read_collectives, read_peaks, read_run, side_by_side)
from ddp_scripts.sharding import WideMLP


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ch11-memory")
    run_command(torchrun_command("recorders/memory_run.py", 3, [
        "--out", str(out), "--width", "64", "--depth", "2", "--global-batch-size", "6"]),
        timeout=300, echo=lambda line: None)
    measured, settings = read_run(out / "memory.jsonl")
    return measured, plan_for(settings), out, settings


def test_the_stacked_bars_are_the_prediction_and_their_ticks_the_measured_totals(run):
    measured, planned, _, _ = run
    fig, ax = new_figure()
    drawn = draw_held(ax, planned, measured)
    plt.close(fig)
    assert list(drawn) == ["one process", "DDP, rank 0", "ZeRO-1, rank 0", "ZeRO-1, rank 1",
                           "ZeRO-1, rank 2", "FSDP, rank 0", "FSDP, rank 1", "FSDP, rank 2"]
    for label, parts in drawn.items():
        strategy, rank = (label, 0) if label == "one process" else label.split(", rank ")
        predicted = planned[strategy][int(rank)]
        assert [(part, value * 1e6) for part, _, value in parts] == pytest.approx(
            [(part, predicted[part]) for part in PARTS[:4] if predicted[part]])
    ticks = [collection.get_offsets()[0] for collection in ax.collections]
    totals = [sum(measured[key][part] for part in PARTS[:4]) / 1e6
              for key in measured if key[0] != "DDP" or key[1] == 0]
    assert [x for x, _ in ticks] == pytest.approx(totals)


def test_the_step_figure_draws_every_hook_point_the_run_noted(run):
    measured, _, _, _ = run
    fig, ax = new_figure()
    drawn = draw_step(ax, measured)
    plt.close(fig)
    assert list(drawn) == ["DDP, rank 0", "FSDP, rank 0", "FSDP, rank 2"]
    for label, values in drawn.items():
        strategy, rank = label.split(", rank ")
        timeline = measured[(strategy, int(rank))]["timeline"]
        assert values == [point["bytes"] / 1e6 for point in timeline]
        lines = [line for line in ax.get_lines() if line.get_label() == label]
        assert list(lines[0].get_ydata()) == values
    assert len(set(drawn["DDP, rank 0"])) == 1 and len(set(drawn["FSDP, rank 0"])) > 2


def test_the_table_sets_prediction_beside_measurement_and_they_agree(run):
    measured, planned, _, _ = run
    table = side_by_side(planned, measured)
    assert len(table) == len(measured)
    assert (table["difference (B)"] == 0).all()
    assert table["predicted"].tolist() == pytest.approx(table["measured"].tolist())


def test_the_form_shows_the_calculators_table_and_answers_a_change():
    form = calculator_form(64, 2, 6, 3)
    answer = form.children[-1]
    assert "FSDP" in answer.value and "ZeRO-1" in answer.value
    first = answer.value
    form.children[1].children[0].value = 6  # ranks: 3 -> 6
    assert answer.value != first
    assert calculator_table(64, 2, 6, 6, "float64", "sgd-momentum").to_html(
        float_format="{:,.2f}".format) == answer.value
    form.children[1].children[0].value = 4  # 6 does not split over 4
    assert "does not split evenly" in answer.value


def test_the_peak_table_sets_each_ranks_prediction_beside_the_tracker(run):
    _, _, out, settings = run
    gloo = read_peaks(out / "peaks.jsonl")
    tracked = fake_tracked(settings)
    predicted = plan_for(settings, peak_plan)
    table = peaks_side_by_side(predicted, tracked, gloo)
    assert [strategy for strategy, _ in table.index] == [key[0] for key in tracked]
    assert list(tracked) == list(gloo)
    assert list(dict.fromkeys(s for s, _ in table.index)) == list(PEAK_STRATEGIES)
    for (strategy, rank), row in table.iterrows():
        assert row["predicted peak (MB)"] * 1e6 == predicted[strategy][rank]["peak"]
        assert row["tracked (MB)"] * 1e6 == tracked[(strategy, rank)]["tracked_peak"]
        assert row["gloo run (MB)"] * 1e6 == gloo[(strategy, rank)]["tracked_peak"]
        assert row["gap (B)"] == (tracked[(strategy, rank)]["tracked_peak"]
                                  - predicted[strategy][rank]["peak"])
        assert row["falls at"] == predicted[strategy][rank]["at"]
        assert row["gloo may add (B)"] == predicted[strategy][rank].get("gloo clone", 0)
    assert table["agrees"].all()


def test_the_calculators_columns_add_up_to_the_peak_for_every_case():
    cases = [dict(width=64, depth=2, batch=6, ranks=3, dtype="float64", optimizer="sgd-momentum"),
             dict(width=128, depth=3, batch=16, ranks=8, dtype="float32",
                  optimizer="sgd-momentum")]
    tables = calculator_cases(cases)
    assert len(tables) == 2 and all("rank(s)" in title for title in tables)
    for table in tables.values():
        parts = table[[f"{column} (MB)" for column in PEAK_COLUMNS]].sum(axis=1)
        assert parts.tolist() == pytest.approx(table["peak (MB)"].tolist())
        assert set(table.index) == set(PEAK_STRATEGIES)
        assert table.loc["FSDP", "peak (MB)"] < table.loc["DDP", "peak (MB)"]
    case = cases[1]  # each row is peak_plan's for the rank that holds most
    with torch.device("meta"):
        model = WideMLP(case["width"], case["depth"])
    planned = peak_plan(model, case["batch"], case["ranks"], torch.float32, units=model.blocks)
    table = next(iter(calculator_cases(cases[1:]).values()))
    for strategy, rows in planned.items():
        top = max(rows, key=lambda row: row["peak"])
        assert table.loc[strategy, "peak (MB)"] == top["peak"] / 1e6
        assert table.loc[strategy, "peak falls at"] == top["at"]
    assert table.loc["DDP", "communication buffers (MB)"] == table.loc["DDP", "gradients (MB)"]


def test_the_collectives_drawing_ends_where_torchs_collectives_did(run):
    _, _, out, _ = run
    pieces = read_collectives(out / "collectives.json")
    assert [p["rank"] for p in pieces] == [0, 1, 2]
    fig, axes = new_figure(4, 1)
    grids, gaps = draw_collectives(axes, pieces)
    plt.close(fig)
    assert gaps["whole after all-gather"] == 0  # copies: exact
    assert gaps["shard after reduce-scatter"] < 1e-12  # a sum in another order: rounding
    for ax, (name, grid) in zip(axes, grids.items()):
        written = [text.get_text() for text in ax.texts]
        assert written == [f"{value:+.2f}" for value in grid.reshape(-1).tolist()], name
    whole = grids["whole after all-gather"]
    assert (whole == whole[0]).all() and whole.shape == (3, 3 * 2)


def test_a_drawing_that_sums_instead_of_averaging_fails_the_check(run, monkeypatch):
    import notebooks.fsdp_memory as fsdp_memory
    _, _, out, _ = run
    right = fsdp_memory.collective_steps

    def summing(pieces):
        steps = right(pieces)
        steps["shard after reduce-scatter"] = steps["shard after reduce-scatter"] * len(pieces)
        return steps

    monkeypatch.setattr(fsdp_memory, "collective_steps", summing)
    fig, axes = new_figure(4, 1)
    _, gaps = draw_collectives(axes, read_collectives(out / "collectives.json"))
    plt.close(fig)
    assert gaps["shard after reduce-scatter"] > 1e-3 and gaps["whole after all-gather"] == 0
