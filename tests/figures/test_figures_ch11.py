"""Chapter 11's figures and tables, fed a run of ddp_scripts/fit/memory_run.py on 3 gloo ranks (run
as the chapter runs it, smaller): what they draw is what the calculator predicted and what the
run measured."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch

from ddp_scripts.launcher import run_command, torchrun_command
from ddp_scripts.fit.memory_plan import PARTS, PEAK_STRATEGIES, peak_plan
from notebooks.figures import new_figure
from notebooks.fsdp_memory import (PEAK_COLUMNS, all_plain, calculator_cases, calculator_form,
                                   calculator_table, collectives_allowed, collectives_line,
                                   draw_collectives, draw_held, draw_step, equal_to_the_byte,
                                   fake_tracked, identical, optimizer_holds, parts_agree,
                                   peaks_side_by_side, plan_for, read_collectives, read_peaks,
                                   read_run, side_by_side)
from ddp_scripts.sharding import WideMLP


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ch11-memory")
    run_command(torchrun_command("fit/memory_run.py", 3, [
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


def test_the_step_figure_shows_the_last_ranks_line_over_rank_0s(run):
    from matplotlib.colors import to_rgba
    measured, _, _, _ = run
    fig, ax = new_figure()
    drawn = draw_step(ax, measured)
    fig.canvas.draw()
    plt.close(fig)
    first, last = (next(line for line in ax.get_lines() if line.get_label() == label)
                   for label in ("FSDP, rank 0", "FSDP, rank 2"))
    assert to_rgba(first.get_color()) != to_rgba(last.get_color())
    assert last.get_zorder() >= first.get_zorder() and ax.get_lines().index(last) > \
        ax.get_lines().index(first)                      # drawn on top of rank 0's ...
    assert last.get_linewidth() < first.get_linewidth()  # ... and thinner: both show
    assert drawn["FSDP, rank 0"] == drawn["FSDP, rank 2"]  # padded shards: the same bytes
    assert any("ranks 0 and 2" in text.get_text() and "the same" in text.get_text()
               for text in ax.texts)


def test_planted_ranks_that_differ_are_not_called_the_same(run):
    import copy
    measured, _, _, _ = run
    changed = copy.deepcopy(measured)
    changed[("FSDP", 2)]["timeline"][0]["bytes"] -= 8
    fig, ax = new_figure()
    draw_step(ax, changed)
    plt.close(fig)
    assert not any("the same" in text.get_text() for text in ax.texts)


def test_the_step_figures_x_axis_names_the_layers(run):
    measured, _, _, _ = run
    fig, ax = new_figure()
    draw_step(ax, measured)
    plt.close(fig)
    timeline = measured[("FSDP", 0)]["timeline"]
    ticks = [(tick, label.get_text()) for tick, label in zip(ax.get_xticks(),
                                                               ax.get_xticklabels())]
    assert len(ticks) > 4
    for tick, label in ticks:   # each tick named after the layer (or unit) whose hook it is
        layer = timeline[int(tick)]["layer"]
        assert layer == label or layer.startswith((label + ".", label + " ")), (tick, label)
    named = [label for _, label in ticks]
    for unit in ("stem", "blocks.0", "blocks.1", "head"):   # forward and backward
        assert named.count(unit) == 2, unit


def test_right_case_every_part_on_every_rank_is_the_calculators_to_the_byte(run):
    measured, planned, _, _ = run
    table = side_by_side(planned, measured)
    assert len(table) == len(measured)
    assert (table["difference (B)"] == 0).all() and parts_agree(table)
    assert table["predicted"].tolist() == pytest.approx(table["measured"].tolist())


def test_planted_fsdp_padding_left_out_of_the_calculator_fails_the_parts_check(run, monkeypatch):
    """Width 64 over 3 ranks: pieces of 22, 22 and 20 rows, the last allocated as 22."""
    import ddp_scripts.fit.memory_plan as memory_plan
    measured, _, _, settings = run
    right = memory_plan.chunk_rows
    monkeypatch.setattr(memory_plan, "chunk_rows",
                        lambda rows, ranks, rank: (right(rows, ranks, rank)[1],) * 2)
    table = side_by_side(plan_for(settings), measured).set_index(["strategy", "rank"])
    assert not parts_agree(table)
    assert (table["difference (B)"] > 0).tolist() == [key == ("FSDP", 2) for key in table.index]


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


def test_the_form_plans_adam_and_its_columns_add_up():
    form = calculator_form(64, 2, 6, 3)
    optimizer = form.children[1].children[-1]
    assert list(optimizer.options) == ["sgd-momentum", "adam"]
    optimizer.value = "adam"
    table = calculator_table(64, 2, 6, 3, "float64", "adam")
    assert table.to_html(float_format="{:,.2f}".format) == form.children[-1].value
    parts = table[[f"{column} (MB)" for column in PEAK_COLUMNS]].sum(axis=1)
    assert parts.tolist() == pytest.approx(table["peak (MB)"].tolist())
    momentum = calculator_table(64, 2, 6, 3, "float64", "sgd-momentum")
    assert (table["optimizer (MB)"] > momentum["optimizer (MB)"]).all()


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


def test_right_case_the_collectives_drawing_ends_where_torchs_collectives_did(run):
    _, _, out, _ = run
    pieces = read_collectives(out / "collectives.json")
    assert [p["rank"] for p in pieces] == [0, 1, 2]
    fig, axes = new_figure(4, 1)
    grids, gaps = draw_collectives(axes, pieces)
    plt.close(fig)
    assert gaps["whole after all-gather"] == 0  # copies: exact
    allowed = collectives_allowed(pieces)["shard after reduce-scatter"]
    assert gaps["shard after reduce-scatter"] <= allowed < 1e-13  # a sum in another order
    assert collectives_line(gaps, pieces).endswith(": the same")
    for ax, (name, grid) in zip(axes, grids.items()):
        written = [text.get_text() for text in ax.texts]
        assert written == [f"{value:+.2f}" for value in grid.reshape(-1).tolist()], name
    whole = grids["whole after all-gather"]
    assert (whole == whole[0]).all() and whole.shape == (3, 3 * 2)


def test_the_collectives_figure_puts_rank_rs_piece_in_slot_r(run):
    from matplotlib.patches import ConnectionPatch
    _, _, out, _ = run
    pieces = read_collectives(out / "collectives.json")
    fig, axes = new_figure(4, 1)
    grids, _ = draw_collectives(axes, pieces)
    plt.close(fig)
    world, width = grids["shard before all-gather"].shape
    for ax, name in ((axes[0], "shard before all-gather"), (axes[3], "shard after reduce-scatter")):
        assert ax.get_xlim() == axes[1].get_xlim()   # the whole tensor's columns
        for text in ax.texts:   # rank r's numbers in slot r of the whole tensor, nowhere else
            column, row = (round(v) for v in text.get_position())
            assert column // width == row, (name, text.get_text())
            assert text.get_text() == f"{grids[name][row, column % width]:+.2f}"
        assert len(ax.texts) == world * width
    arrows = [(axes.tolist().index(a.axesA), a.xy1, axes.tolist().index(a.axesB), a.xy2)
              for a in fig.artists if isinstance(a, ConnectionPatch)]
    middle = [(rank + 0.5) * width - 0.5 for rank in range(world)]   # slot r's middle
    for rank in range(world):   # all-gather: from rank r's shard to slot r of the whole
        (_, (x0, y0), _, (x1, _)), = [a for a in arrows if a[0] == 0 and a[1][1] >= rank
                                       and a[1][1] < rank + 1]
        assert x0 == x1 == middle[rank]
    # reduce-scatter: from slot r of the ranks' gradients to rank r's piece
    ends = sorted((x1, y1) for start, (x0, _), end, (x1, y1) in arrows if start == 2)
    assert [x for x, _ in ends] == middle and [round(y) for _, y in ends] == list(range(world))


def drawn_with(run, monkeypatch, change):
    """The drawing's gaps and its line, with collective_steps' grids changed by `change`."""
    import notebooks.fsdp_memory as fsdp_memory
    _, _, out, _ = run
    right = fsdp_memory.collective_steps

    def planted(pieces):
        steps = right(pieces)
        change(steps, len(pieces))
        return steps

    monkeypatch.setattr(fsdp_memory, "collective_steps", planted)
    pieces = read_collectives(out / "collectives.json")
    fig, axes = new_figure(4, 1)
    _, gaps = draw_collectives(axes, pieces)
    plt.close(fig)
    return gaps, collectives_line(gaps, pieces)


def test_planted_a_drawing_that_sums_instead_of_averaging_fails_the_check(run, monkeypatch):
    def summing(steps, world):
        steps["shard after reduce-scatter"] = steps["shard after reduce-scatter"] * world

    gaps, line = drawn_with(run, monkeypatch, summing)
    assert gaps["shard after reduce-scatter"] > 1e-3 and gaps["whole after all-gather"] == 0
    assert line.endswith(": NOT the same")


def test_planted_an_all_gather_drawn_in_reverse_rank_order_fails_the_check(run, monkeypatch):
    def reversed_ranks(steps, world):
        pieces = steps["shard before all-gather"].flip(0)
        steps["whole after all-gather"] = pieces.reshape(1, -1).repeat(world, 1)

    gaps, line = drawn_with(run, monkeypatch, reversed_ranks)
    assert gaps["whole after all-gather"] > 0 and line.endswith(": NOT the same")


# The chapter's other verdicts -------------------------------------------------------------------
@pytest.fixture
def fake_world():
    """fake_world(n): this process as rank 0 of a fake process group of n ranks (collectives
    move nothing; fully_shard makes rank 0's shards); left again after the test."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def join(n):
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=n)
    yield join
    if dist.is_initialized():
        dist.destroy_process_group()


def sharded(model, blocks=True, root=True):
    from torch.distributed.fsdp import fully_shard
    for block in model.blocks if blocks else []:
        fully_shard(block)
    if root:
        fully_shard(model)
    return model


def shards_held(fake_world, n):
    """What train_fsdp.py records on n ranks (its largest rank, rank 0: every piece full),
    after one step of WideMLP(64, 2) in float64: parameters, gradients and momentum."""
    from ddp_scripts.sharding import bytes_per_rank
    fake_world(n)
    torch.manual_seed(0)
    model = sharded(WideMLP(64, 2).to(torch.float64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(4, 3, 32, 32, dtype=torch.float64)
    torch.nn.functional.cross_entropy(model(images), torch.randint(0, 10, (4,))).backward()
    optimizer.step()
    held = bytes_per_rank(model, optimizer, torch.device("cpu"))
    return sum(held[f"{part}_bytes_per_rank"] for part in ("param", "grad", "optimizer"))


WORLDS = (1, 2, 4)  # the chapter's; the head's 10 rows do not split over 4


@pytest.fixture
def measured_shards(fake_world):
    return [shards_held(fake_world, n) for n in WORLDS]


def shapes_of(width=64, depth=2):
    with torch.device("meta"):
        return [p.shape for p in WideMLP(width, depth).parameters()]


def test_right_case_the_padded_formula_is_the_measured_shards(measured_shards):
    formula = [3 * 8 * sum(-(-shape[0] // n) * shape[1:].numel() for shape in shapes_of())
               for n in WORLDS]
    assert equal_to_the_byte(measured_shards, formula)


def test_planted_a_formula_without_the_padding_is_not_the_measured_shards(measured_shards):
    whole = 3 * 8 * sum(shape.numel() for shape in shapes_of())
    assert not equal_to_the_byte(measured_shards, [whole / n for n in WORLDS])
    assert not equal_to_the_byte(measured_shards, measured_shards[:2])  # a world size missing


def test_planted_weights_one_bit_apart_are_not_identical():
    torch.manual_seed(0)
    state = WideMLP(16, 1).to(torch.float64).state_dict()
    apart = {name: tensor.clone() for name, tensor in state.items()}
    weight = apart["head.1.weight"]
    weight[0, 0] = torch.nextafter(weight[0, 0], torch.tensor(2.0, dtype=torch.float64))
    assert not identical(apart, state)
    zeros = {"w": torch.zeros(2)}
    assert not identical({"w": -torch.zeros(2)}, zeros)  # torch.equal calls them equal
    assert not identical({"w": torch.zeros(2, dtype=torch.float64)}, zeros)


def test_right_case_the_same_weights_are_identical_bit_for_bit():
    torch.manual_seed(0)
    state = WideMLP(16, 1).to(torch.float64).state_dict()
    assert identical({name: tensor.clone() for name, tensor in state.items()}, state)


def test_planted_a_state_dict_of_shards_is_not_all_plain(fake_world):
    fake_world(2)
    model = sharded(WideMLP(16, 1))
    assert not all_plain(model.state_dict())  # DTensors: each a shard of a mesh


def test_right_case_a_whole_models_state_dict_is_all_plain():
    assert all_plain(WideMLP(16, 1).state_dict())


def test_planted_an_optimizer_made_before_sharding_holds_none_of_the_parameters(fake_world):
    fake_world(2)
    model = WideMLP(16, 2)
    before = torch.optim.SGD(model.parameters(), lr=0.1)
    sharded(model)
    assert not optimizer_holds(before, model)


def test_planted_an_optimizer_made_before_the_root_is_sharded_holds_only_the_blocks(fake_world):
    fake_world(2)
    model = sharded(WideMLP(16, 2), root=False)
    between = torch.optim.SGD(model.parameters(), lr=0.1)
    sharded(model, blocks=False)
    held = {id(p) for group in between.param_groups for p in group["params"]}
    assert any(id(p) in held for p in model.parameters())  # the blocks' shards
    assert not optimizer_holds(between, model)


def test_right_case_an_optimizer_made_after_sharding_holds_every_parameter(fake_world):
    fake_world(2)
    model = sharded(WideMLP(16, 2))
    assert optimizer_holds(torch.optim.SGD(model.parameters(), lr=0.1), model)


def gradient_of_the_stem(model):
    torch.manual_seed(1)
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    torch.nn.functional.cross_entropy(model(images), labels).backward()
    return model.stem.weight.grad


def build(checkpointed, block_change=None):
    from ddp_scripts.sharding import checkpoint_activations
    torch.manual_seed(0)
    model = WideMLP(32, 2)
    for block in model.blocks:
        if block_change:
            block_change(block)
        if checkpointed:
            checkpoint_activations(block)
    return model


def test_right_case_checkpointed_blocks_give_the_same_gradients_bit_for_bit():
    """What chapter 11 compares with torch.equal: the stem's gradient, plain and with each
    block checkpointed (its forward run again in backward)."""
    assert torch.equal(gradient_of_the_stem(build(False)), gradient_of_the_stem(build(True)))


def test_planted_a_recomputed_forward_that_draws_other_random_numbers_changes_the_gradients():
    """A block with dropout whose recomputation does not replay the random draws
    (preserve_rng_state=False): the gradients differ, and torch.equal says so."""
    def with_dropout(block):
        forward = block.forward
        block.forward = lambda x: torch.nn.functional.dropout(forward(x), 0.5)

    def unreplayed(block):
        with_dropout(block)
        forward = block.forward
        block.forward = lambda x: torch.utils.checkpoint.checkpoint(
            forward, x, use_reentrant=False, preserve_rng_state=False)

    plain = gradient_of_the_stem(build(False, with_dropout))
    assert not torch.equal(plain, gradient_of_the_stem(build(False, unreplayed)))
    assert torch.equal(plain, gradient_of_the_stem(build(True, with_dropout)))  # replayed
