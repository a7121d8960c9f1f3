"""The figure module (notebooks/figures.py): what each drawing function draws is the data it
was given. The chapters' figures, fed their runs' data: tests/figures/test_figures_*.py."""
import matplotlib

matplotlib.use("Agg")

import torch

from notebooks import figures



def test_a_timeline_draws_each_interval_where_the_run_put_it(axes):
    rows = {"rank 0": [(0.0, 1.5, "forward"), (1.5, 4.0, "backward")],
            "rank 1": [(0.2, 2.0, "forward"), (2.0, 2.5, "all-reduce")]}
    drawn = figures.timeline(axes, rows)
    assert drawn == {label: [(s, e - s, k) for s, e, k in spans] for label, spans in rows.items()}
    bars = [patch for collection in axes.collections for patch in collection.get_paths()]
    assert len(bars) == 4
    assert [t.get_text() for t in axes.get_yticklabels()] == ["rank 0", "rank 1"]
    assert [t.get_text() for t in axes.get_legend().get_texts()] == ["forward", "backward",
                                                                    "all-reduce"]


def test_stacked_bars_put_each_part_after_the_last_and_mark_the_measured_total(axes):
    bars = {"1 process": {"compute": 3.0, "optimizer": 1.0},
            "2 processes": {"compute": 3.5, "all-reduce": 2.0, "optimizer": 1.0}}
    drawn = figures.stacked_bars(axes, bars, unit="ms", total={"2 processes": 7.0})
    assert drawn["2 processes"] == [("compute", 0.0, 3.5), ("optimizer", 3.5, 1.0),
                                    ("all-reduce", 4.5, 2.0)]
    widths = sorted(round(p.get_width(), 6) for p in axes.patches)
    assert widths == [1.0, 1.0, 2.0, 3.0, 3.5]
    assert axes.collections[0].get_offsets()[0][0] == 7.0   # the measured total's tick


def test_a_tensor_grid_writes_the_tensor_s_values(axes):
    values = torch.tensor([[0.5, -1.0], [2.25, 3.0]])
    texts = figures.tensor_grid(axes, values, row_labels=["rank 0", "rank 1"])
    assert texts == [["0.50", "-1.00"], ["2.25", "3.00"]]
    assert sorted(t.get_text() for t in axes.texts) == sorted(sum(texts, []))


def test_an_animation_is_self_contained_html():
    fig, ax = figures.new_figure()
    html = figures.animate(fig, lambda i: ax.set_title(f"step {i}"), frames=3).data
    assert html.count("data:image/png;base64") == 3
    assert "http://" not in html.replace("http://www.w3.org", "")
    assert "https://" not in html


def test_code_is_shown_as_a_fenced_block_the_page_highlights(monkeypatch):
    from IPython import display as ipython_display
    from notebooks import chapter_tools
    shown = []
    monkeypatch.setattr(ipython_display, "display", shown.append)
    changed = chapter_tools.show_diff(["a = 1", "b = 2"], ["a = 1", "b = 3"], "old.py", "new.py")
    assert [line for line in changed if not line.startswith("@@")] == ["-b = 2", "+b = 3"]
    text = shown[0].data
    assert text.startswith("```diff\n--- old.py\n+++ new.py\n") and text.endswith("\n```")


def test_the_parts_of_a_step_take_their_kinds_colours():
    from ddp_scripts.recorders.step_parts import PARTS, REMAINDER
    kinds = {"data wait": "data", "copy to device": "copy", "forward": "forward",
             "backward compute": "backward", "communication not hidden": "communication",
             "optimizer": "optimizer", REMAINDER: "other"}
    assert set(kinds) == {*PARTS, REMAINDER}
    for part, kind in kinds.items():
        assert figures.colour(part) == figures.KINDS[kind]
