"""Chapter 7's figures draw what the runs wrote: a step's parts and its measured total
(step_parts.py's file), and the speed-ups of the article, the recorded H200 and a CPU run,
with no bar for a speed its file marks unreliable."""
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest

from ddp_scripts import benchmark
from ddp_scripts.step_parts import PARTS, REMAINDER
from helpers import run_in_process
from notebooks import ch07_figures
from notebooks.figures import new_figure

ROOT = Path(__file__).resolve().parents[2]
ARTICLE = ROOT / "results/article/titan-xp.json"
H200 = ROOT / "results/gpu-runs/2026-11-30-h200/h200-full.json"


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("parts") / "one.json"
    result = run_in_process("step_parts.py", "--steps", "3", "--warmup", "1",
                            "--cases", "batch 8,slow loader", "--out", out)
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text())


def test_the_step_figure_draws_each_part_and_the_measured_step(one_process):
    runs = {"1 process": one_process}
    cases = list(one_process["cases"])
    fig, axes = new_figure(len(cases), 1)
    drawn = ch07_figures.draw_step_parts(list(axes), runs, cases)
    for ax, case in zip(axes, cases):
        data = one_process["cases"][case]
        expected, start = [], 0.0
        for part in [*PARTS, REMAINDER]:
            value = data["parts"][part] * 1e3
            if value:
                expected.append((part, pytest.approx(start), pytest.approx(value)))
            start += value
        assert drawn[case]["1 process"] == expected
        tick = ax.collections[0].get_offsets()[0][0]   # the measured step, as a tick
        assert tick == pytest.approx(data["step"] * 1e3)
        assert start == pytest.approx(tick)            # the parts and the remainder reach it
    matplotlib.pyplot.close(fig)


def test_the_table_and_the_part_that_grew_read_the_same_numbers(one_process):
    runs = {"1 process": one_process, "again": one_process}
    table = ch07_figures.step_table(runs, "batch 8")
    data = one_process["cases"]["batch 8"]
    assert table.loc["1 process", "measured step"] == pytest.approx(data["step"] * 1e3)
    assert table.loc["1 process", [*PARTS, REMAINDER]].sum() == pytest.approx(data["step"] * 1e3)
    part, by, one, many = ch07_figures.grew(runs, "batch 8")
    assert by == 0 and one == many == pytest.approx(data["step"] * 1e3)


def test_the_speedup_figure_draws_the_files_and_leaves_unreliable_speeds_out():
    article, _ = ch07_figures.article_speedups(ARTICLE)
    h200 = benchmark.load_results(H200)
    cpu_runs = [benchmark.load_results(p) for p in sorted((ROOT / "results").glob("cpu-*.json"))]
    sources = {"article": article, "h200": ch07_figures.measured_speedups(h200)}
    for index, results in enumerate(cpu_runs):
        sources[f"cpu {index}"] = ch07_figures.measured_speedups(results)
        table = benchmark.results_table(results)
        for config in table.index[table["ratios"] == "unreliable"]:
            assert config not in sources[f"cpu {index}"]
    assert article == {c: 888.595 / t for c, t in
                       {"cpu": 888.595, "gpu": 80.06, "dp": 60.7744, "ddp": 48.7986}.items()}
    assert set(sources["h200"]) == {"cpu", "gpu"}  # dp and ddp were skipped on one GPU
    fig, axes = new_figure(len(sources), 1)
    drawn = ch07_figures.draw_speedups(list(axes), sources)
    for title, speedups in sources.items():
        assert drawn[title] == {c: [(c, 0.0, v)] for c, v in speedups.items()}
    matplotlib.pyplot.close(fig)


def test_the_article_file_holds_the_numbers_it_quotes():
    article = json.loads(ARTICLE.read_text())
    quoted = [float(line.rsplit("耗時", 1)[1].rstrip("s")) for line in article["quote"][1:]]
    assert quoted == list(article["wall_s"].values())


def test_a_speed_marked_unreliable_gets_no_bar():
    results = benchmark.load_results(ROOT / "results/cpu-2core-2026-11-30.json")
    assert set(ch07_figures.measured_speedups(results)) == {"cpu", "ddp"}
    for run in results["runs"]:
        if run["config"] == "ddp":
            run["reliable"] = False
    assert set(ch07_figures.measured_speedups(results)) == {"cpu"}
    for run in results["runs"]:
        if run["config"] == "cpu":
            run["reliable"] = False  # the baseline too: no ratio can be drawn
    assert ch07_figures.measured_speedups(results) == {}


def test_the_run_figure_draws_each_runs_wall_time_and_no_unreliable_speedup():
    results = benchmark.load_results(ROOT / "results/cpu-2core-2026-11-30.json")
    runs = {run["config"]: run for run in results["runs"]}
    fig, (left, right) = new_figure(1, 2)
    wall, speedups = ch07_figures.draw_run(left, right, results)
    cpu = runs["cpu"]
    epochs = sum(cpu["epoch_time_s"])
    assert wall["cpu"] == [("start-up", 0.0, cpu["startup_s"]),
                           ("training epochs", cpu["startup_s"], epochs),
                           ("the rest (evaluation, exit)", cpu["startup_s"] + epochs,
                            pytest.approx(cpu["wall_s"] - cpu["startup_s"] - epochs))]
    assert wall["gpu"] == []                               # skipped: no bar
    ticks = [point[0] for point in left.collections[0].get_offsets()] + \
            [point[0] for point in left.collections[1].get_offsets()]
    assert ticks == [runs["cpu"]["wall_s"], runs["ddp"]["wall_s"]]
    table = benchmark.results_table(results)
    assert speedups["x CPU"] == pytest.approx(list(table["x CPU"].fillna(0)))
    matplotlib.pyplot.close(fig)
    runs["ddp"]["reliable"] = False                        # then its speed-up is not drawn
    fig, (left, right) = new_figure(1, 2)
    _, speedups = ch07_figures.draw_run(left, right, results)
    assert speedups["x CPU"][list(runs).index("ddp")] == 0
    assert speedups["x CPU"][list(runs).index("cpu")] == 1.0
    matplotlib.pyplot.close(fig)
