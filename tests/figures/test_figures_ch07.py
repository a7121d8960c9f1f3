"""Chapter 7's figures draw what the runs wrote: a step's parts per sample and its measured
total (step_parts.py's files), the sentences written from them, and the speed-ups of the
article, the recorded H200 and a CPU run, with no bar for a speed its file marks unreliable."""
import json
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest

from ddp_scripts.measure import benchmark
from ddp_scripts.recorders.step_parts import PARTS, REMAINDER, part_that_grew, ratio_from_parts
from helpers import run_in_process
from notebooks import ch07_figures
from notebooks.figures import new_figure

ROOT = Path(__file__).resolve().parents[2]
ARTICLE = ROOT / "results/article/titan-xp.json"
H200 = ROOT / "results/gpu-runs/2026-11-30-h200/h200-full.json"


QUICK = ["--steps", "3", "--warmup", "1", "--cases", "batch 8,all cores each"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Real step_parts files: one process with all the cores, one with one thread (batch 8
    only, as in the chapter), and two processes with one thread each, shortened."""
    from ddp_scripts.launcher import run_command, torchrun_command
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 cores: with one, all cores and one thread are the same run")
    folder = tmp_path_factory.mktemp("parts")
    # The chapter's runs see every core; a pytest-xdist worker is pinned to its share of them
    # (tests/conftest.py), under which "all cores" would be one thread, the same as one DDP
    # process's. The runs (and the processes they start) get the machine's cores back.
    share = os.sched_getaffinity(0)
    os.sched_setaffinity(0, range(os.cpu_count()))
    try:
        for name, options in (("all-cores", [*QUICK, "--threads", "all"]),
                              ("ddp-threads", [*QUICK[:-1], "batch 8", "--threads", "1"])):
            result = run_in_process("recorders/step_parts.py", *options,
                                    "--out", folder / f"{name}.json")
            assert result.returncode == 0, result.stderr
        run_command(torchrun_command("recorders/step_parts.py", 2,
                                     [*QUICK, "--threads", "1",
                                      "--out", str(folder / "two-processes.json")]),
                    timeout=300, progress=False, echo=lambda line: None)
    finally:
        os.sched_setaffinity(0, share)
    return {name: json.loads((folder / f"{name}.json").read_text())
            for name in ("all-cores", "ddp-threads", "two-processes")}


def test_the_step_figure_draws_each_part_per_sample_and_the_measured_step(runs):
    cases = ["batch 8", "all cores each"]
    fig, axes = new_figure(len(cases), 1)
    drawn = ch07_figures.draw_step_parts(list(axes), runs, cases)
    for ax, case in zip(axes, cases):
        ran = {name: run for name, run in runs.items() if case in run["cases"]}
        assert list(drawn[case]) == [ch07_figures.label(run, case) for run in ran.values()]
        ticks = [point[0] for collection in ax.collections for point in collection.get_offsets()]
        for bar, (name, run) in enumerate(ran.items()):
            data = run["cases"][case]
            batch = data["settings"]["batch_size"]
            expected, start = [], 0.0
            for part in [*PARTS, REMAINDER]:
                value = data["parts"][part] * 1e6 / batch
                if value:
                    expected.append((part, pytest.approx(start), pytest.approx(value)))
                start += value
            assert drawn[case][ch07_figures.label(run, case)] == expected, name
            assert ticks[bar] == pytest.approx(data["step"] * 1e6 / batch)  # the measured step
            assert start == pytest.approx(ticks[bar])  # the parts and the remainder reach it
    matplotlib.pyplot.close(fig)


def test_the_table_has_no_empty_cell_and_reads_the_same_numbers(runs):
    table = ch07_figures.step_table(runs, ["batch 8", "all cores each"])
    assert not table.isna().any().any()
    two = runs["two-processes"]["cases"]["batch 8"]
    row = table.loc[("batch 8", "2 processes x 1 thread")]
    assert row["measured step"] == pytest.approx(two["step"] * 1e6 / 8)
    assert row[[*PARTS, REMAINDER]].sum() == pytest.approx(row["measured step"])
    assert row["samples/s"] == pytest.approx(8 / two["step"])
    assert row["forward CPU/wall"] == two["cpu share"]["forward"]


def test_the_verdicts_are_written_from_the_numbers(runs):
    case = "batch 8"
    one, many = ch07_figures.compared(runs, case)
    assert one is runs["ddp-threads"] and many is runs["two-processes"]  # the same threads
    speed = {name: 8 / run["cases"][case]["step"] for name, run in runs.items()}
    lines = ch07_figures.verdict(runs, case)
    ratio = speed["two-processes"] / speed["ddp-threads"]
    said = f"{1 / ratio:.2f}x slower" if ratio < 1 else f"{ratio:.2f}x faster"
    shaky = not (one["cases"][case]["reliable"] and many["cases"][case]["reliable"])
    end = " (unreliable)." if shaky else "."
    assert f"  2 processes x 1 thread: {said} than 1 process x 1 thread{end}" in lines
    part, by, _, _ = ch07_figures.grew(runs, case)
    assert part_that_grew(one["cases"][case], many["cases"][case])[0] == part
    assert any(f"part that grew most: {part} (+{by:.2f} us" in line for line in lines) or \
        round(by, 2) <= 0
    comm = ch07_figures.communication_lines(runs, case)
    assert len(comm) == 2 and all("bucket(s)" in line for line in comm)


def test_less_of_a_core_is_said_only_where_the_clocks_measured_it(runs):
    one, many = ch07_figures.compared(runs, "batch 8")
    shares = one["cases"]["batch 8"]["cpu share"], many["cases"]["batch 8"]["cpu share"]
    kept = [share["forward"] for share in shares]
    shares[0]["forward"], shares[1]["forward"] = 1.0, 0.5
    assert "gets less of a core" in ch07_figures.why(runs, "batch 8", "backward compute")
    shares[0]["forward"], shares[1]["forward"] = 0.5, 1.0
    said = ch07_figures.why(runs, "batch 8", "forward")
    assert "did not get less of a core" in said and "0.50 -> 1.00" in said
    assert ch07_figures.why(runs, "batch 8", "data wait") == ch07_figures.WHY["data wait"]
    shares[0]["forward"], shares[1]["forward"] = kept


def test_the_ratio_from_the_parts_stands_beside_the_benchmarks(runs):
    results = benchmark.load_results(ROOT / "results/cpu-2core-2026-11-30.json")
    bench = float(benchmark.results_table(results).loc["ddp", "x CPU"])
    for run in runs.values():  # the case the ratio reads
        run["cases"]["batch 64"] = run["cases"]["batch 8"]
    parts = ratio_from_parts(runs["two-processes"], runs["ddp-threads"], runs["all-cores"])
    lines = ch07_figures.ratio_from_parts_lines(results, runs)
    assert f"{bench:.2f}x the speed of the cpu run" in lines[0]
    assert "unreliable" not in lines[0]  # the file's ratios are ok
    assert lines[1].endswith(f"= {parts['ratio']:.2f}x.")
    shaky = [run for run in runs.values() if not run["cases"]["batch 64"]["reliable"]]
    assert ("Step parts: " in lines[2]) == bool(shaky)
    assert all(f"spread {run['cases']['batch 64']['spread']:.2f}x" in lines[2] for run in shaky)
    agree = (bench < 1) == (parts["ratio"] < 1)
    assert lines[-2].startswith("Both say" if agree else "The two disagree")
    apart = max(bench, parts["ratio"]) / min(bench, parts["ratio"])
    assert lines[-1].startswith(f"The two ratios are {apart:.2f}x apart")
    assert ("they agree" in lines[-1]) == (apart <= 1.5)
    for run in results["runs"]:  # the other direction: the sentence follows the numbers
        if run["config"] == "ddp":
            run["steady_epoch_s"] *= 1e-3 if bench < 1 else 1e3
    flipped = ch07_figures.ratio_from_parts_lines(results, runs)
    assert flipped[-2].startswith("The two disagree" if agree else "Both say")
    far = max(bench * 1e3, parts["ratio"]) / min(bench * 1e3, parts["ratio"]) if bench < 1 \
        else max(bench * 1e-3, parts["ratio"]) / min(bench * 1e-3, parts["ratio"])
    assert flipped[-1].startswith(f"The two ratios are {far:.2f}x apart, more than the 1.5x")
    loaded = max(run["load_average"][0] for run in runs.values()) > \
        min(run["usable_cores"] for run in runs.values())
    assert ("under this load" in flipped[-1]) == loaded
    for run in runs.values():
        del run["cases"]["batch 64"]


def test_an_unreliable_case_and_an_untimed_all_reduce_are_said(runs):
    case = runs["two-processes"]["cases"]["batch 8"]
    kept = dict(case)
    case.update({"reliable": False, "spread": 2.5, "communication timed": False,
                 "communication untimed": "under NCCL ..."})
    try:
        lines = ch07_figures.verdict(runs, "batch 8")
        assert "  2 processes x 1 thread (unreliable: its 4 runs of steps spread 2.50x, more " \
               "than 1.5x)." in lines
        assert all(line.endswith("(unreliable).") for line in lines if " than 1 process" in line)
        assert ch07_figures.communication_lines(runs, "batch 8") == [
            "  all-reduce not split: under NCCL ...."]
        table = ch07_figures.step_table(runs, ["batch 8"])
        assert "communication not hidden" not in table and "backward compute" in table
    finally:
        case.clear()
        case.update(kept)


def test_each_configuration_keeps_its_colour_in_every_panel():
    sources = {"all four": {"cpu": 1.0, "gpu": 3.0, "dp": 4.0, "ddp": 5.0},
               "two": {"cpu": 1.0, "ddp": 0.8}}
    fig, axes = new_figure(2, 1)
    ch07_figures.draw_speedups(list(axes), sources)
    colours = [{label.get_text(): matplotlib.colors.to_hex(bar.get_facecolor())
                for label, bar in zip(ax.get_yticklabels(), ax.patches)} for ax in axes]
    assert colours[0]["ddp"] == colours[1]["ddp"] != colours[0]["gpu"]
    assert colours[0]["cpu"] == colours[1]["cpu"]
    matplotlib.pyplot.close(fig)


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
                           (ch07_figures.REST, cpu["startup_s"] + epochs,
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
