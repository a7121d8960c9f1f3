"""Chapter 7's figures draw what the runs wrote: a step's parts per sample and its measured
total (step_parts.py's files), the sentences written from them, and the speed-ups of the
article, the recorded H200 and a CPU run, with no bar for a speed its file marks unreliable.
Each verdict the chapter prints is fed a planted flaw (test_planted_...), which it must name,
and a right case (test_right_case_...), which it must pass."""
import json
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest

from ddp_scripts.measure import benchmark
from ddp_scripts.recorders.step_parts import PARTS, REMAINDER, part_that_grew, predicted_ratio
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


def test_the_ratio_from_the_parts_stands_beside_the_benchmarks(runs):
    results = benchmark.load_results(ROOT / "results/cpu-2core-2026-11-30.json")
    bench = float(benchmark.results_table(results).loc["ddp", "x CPU"])
    for run in runs.values():  # the case the ratio reads
        run["cases"]["batch 64"] = run["cases"]["batch 8"]
    results["settings"]["batch_size"] = 8  # equal work: the step's batch
    try:
        parts = predicted_ratio(runs["two-processes"], runs["all-cores"])
        lines = ch07_figures.ratio_from_parts_lines(results, runs)
        assert f"{bench:.2f}x the speed of the cpu run" in lines[0]
        many = sum(parts["many"].values()) * 1e6 / 8
        assert lines[3].startswith("  2 processes x 1 thread: compute ")
        assert lines[3].endswith(f" = {many:.2f}")
        assert f" = {parts['ratio']:.2f}x; their steps spread " in lines[4]
        assert "the part that grew most: " in lines[5] or "no part grew" in lines[5]
        said = " ".join(lines[6:])
        assert ("they agree" in said) + ("they disagree" in said) + ("Not compared" in said) == 1
    finally:
        for run in runs.values():
            del run["cases"]["batch 64"]


def test_planted_an_unreliable_case_is_said(runs):
    case = runs["two-processes"]["cases"]["batch 8"]
    kept = dict(case)
    case.update({"reliable": False, "spread": 2.5})
    try:
        lines = ch07_figures.verdict(runs, "batch 8")
        assert "  2 processes x 1 thread (unreliable: its 4 runs of steps spread 2.50x, more " \
               "than 1.5x)." in lines
        assert all(line.endswith("(unreliable).") for line in lines if " than 1 process" in line)
    finally:
        case.clear()
        case.update(kept)


def test_right_case_cases_that_held_steady_are_not_called_unreliable():
    runs = made_runs()   # every run's groups of steps 1.02x apart
    assert all(ch07_figures.unreliable(run["cases"]["batch 64"]) == "" for run in runs.values())
    assert not any("unreliable" in line for line in ch07_figures.verdict(runs, "batch 64"))


# Step files made by hand, in us per sample of a global batch of 64: one process with every
# core (2 threads), one with one DDP process's thread, and two processes of one thread each.
# The two processes compute a little faster per sample than one with every core; the step's
# difference is the all-reduce that backward waited for, 9 us of it waiting for the other rank.
US = 1e-6
ONE = {"forward": 68.0, "backward compute": 60.0, "optimizer": 9.0}
TWO = {"forward": 63.0, "backward compute": 59.0, "optimizer": 8.0,
       "communication not hidden": 37.0}


def step_file(processes, threads, us, waiting=0.0, share=(1.0, 0.99, 1.0), spread=1.02,
              batch=64):
    """One run's file of the case "batch 64", as step_parts writes it."""
    parts = {part: us.get(part, 0.0) * US * batch for part in [*PARTS, REMAINDER]}
    parts[REMAINDER] = 0.5 * US * batch
    exposed = parts["communication not hidden"]
    found = {"settings": {"batch_size": batch, "batch_per_process": batch // processes,
                          "threads_per_process": threads},
             "parts": parts, "step": sum(parts.values()), "spread": spread,
             "reliable": spread <= benchmark.RELIABLE_SPREAD,
             "communication": {"total": exposed, "hidden": 0.0, "exposed": exposed,
                               "buckets": 1.0 if exposed else 0.0,
                               "waiting for other ranks": waiting * US * batch,
                               "waiting not hidden": waiting * US * batch},
             "cpu share": {"forward": share[0]}, "cpu share range": {"forward": list(share[1:])},
             "all-reduce clock": None if processes == 1 else "wall"}
    found["ranks"] = [found] * processes
    return {"processes": processes, "device": "cpu", "usable_cores": 2, "load_average": [1.0],
            "cases": {"batch 64": found}}


def made_runs(two=TWO, waiting=9.0, one=ONE, share_one=(1.0, 0.99, 1.0),
              share_two=(1.0, 0.99, 1.0)):
    return {"all-cores": step_file(1, 2, one),
            "ddp-threads": step_file(1, 1, {part: 1.5 * value for part, value in one.items()},
                                     share=share_one),
            "two-processes": step_file(2, 1, two, waiting, share=share_two)}


def benchmark_file(ratio, spread=1.03):
    """The committed CPU results file with its ddp row set to `ratio` times the cpu row's
    speed, and both rows' steady epochs spread `spread`."""
    results = benchmark.load_results(ROOT / "results/cpu-2core-2026-11-30.json")
    rows = {run["config"]: run for run in results["runs"]}
    rows["ddp"]["steady_epoch_s"] = rows["cpu"]["steady_epoch_s"] / ratio
    for config in ("cpu", "ddp"):
        rows[config].update(spread=spread, reliable=spread <= benchmark.RELIABLE_SPREAD)
    return results


def said(lines):
    """The verdict of ratio_from_parts_lines's last line."""
    last = lines[-1]
    for verdict in ("they agree", "they disagree on the direction", "they disagree on the size",
                    "Not compared"):
        if verdict in last:
            return verdict
    raise AssertionError(f"no verdict in {last!r}")


def test_right_case_the_parts_and_the_benchmark_agree():
    runs = made_runs()
    predicted = predicted_ratio(runs["two-processes"], runs["all-cores"])["ratio"]
    assert predicted == pytest.approx(137 / 167)  # no remainder, no middle run in it
    lines = ch07_figures.ratio_from_parts_lines(benchmark_file(0.80), runs)
    assert said(lines) == "they agree"
    assert "Both say the processes are slower than one process with every core" in lines[-1]
    # The bound is the four runs' spreads multiplied: 1.03 * 1.03 * 1.02 * 1.02.
    assert f"allow {1.03 ** 2 * 1.02 ** 2:.2f}x" in lines[-1]
    assert "  1 process x 2 threads: compute 137.00 = 137.00" in lines
    assert ("  2 processes x 1 thread: compute 130.00 + waiting for the other ranks 9.00 + "
            "all-reduce not hidden 28.00 = 167.00") in lines


def test_planted_doubled_part_makes_the_ratios_disagree():
    doubled = {**TWO, "backward compute": 2 * TWO["backward compute"]}
    lines = ch07_figures.ratio_from_parts_lines(benchmark_file(0.80), made_runs(two=doubled))
    assert said(lines) == "they disagree on the size"
    assert "Not reproduced on this run" in lines[-1]


def test_planted_dropped_part_makes_the_ratios_disagree():
    dropped = {part: value for part, value in TWO.items() if part != "communication not hidden"}
    lines = ch07_figures.ratio_from_parts_lines(benchmark_file(0.80),
                                                made_runs(two=dropped, waiting=0.0))
    assert said(lines).startswith("they disagree")


def test_planted_opposite_directions_are_never_called_agreement():
    # The benchmark says 0.85x, the parts 1.10x: 1.29x apart, inside spreads that allow 1.5x.
    faster = {"forward": 55.0, "backward compute": 50.0, "optimizer": 5.0,
              "communication not hidden": 14.5}
    runs = made_runs(two=faster, waiting=0.0)
    for run in runs.values():
        run["cases"]["batch 64"]["spread"] = 1.5 ** 0.5  # two runs: 1.5x allowed
    assert predicted_ratio(runs["two-processes"], runs["all-cores"])["ratio"] == \
        pytest.approx(1.10, abs=0.01)
    lines = ch07_figures.ratio_from_parts_lines(benchmark_file(0.85, spread=1.0), runs)
    assert said(lines) == "they disagree on the direction"
    assert not any("agree." in line and "disagree" not in line for line in lines)
    assert not any("Both say" in line for line in lines)


def test_planted_unreliable_run_is_not_compared():
    runs = made_runs()
    runs["all-cores"]["cases"]["batch 64"].update(spread=2.98, reliable=False)
    lines = ch07_figures.ratio_from_parts_lines(benchmark_file(0.80), runs)
    assert said(lines) == "Not compared"
    assert "1 process x 2 threads (unreliable: its 4 runs of steps spread 2.98x" in lines[-1]
    lines = ch07_figures.ratio_from_parts_lines(benchmark_file(0.80, spread=1.6), made_runs())
    assert said(lines) == "Not compared" and "the benchmark's cpu row (spread 1.60x" in lines[-1]


def test_right_case_a_benchmark_of_other_work_is_not_compared():
    results = benchmark_file(0.80)
    results["settings"]["batch_size"] = 128
    lines = ch07_figures.ratio_from_parts_lines(results, made_runs())
    assert lines[0] == ("Benchmark: its global batch was 128, the step's 64: no ratio of its to "
                        "compare.")
    # what the reader can do instead: the benchmark's command for the step's runs
    assert lines[1] == ("  To compare, run the benchmark as the step's runs ran: "
                        "CUDA_VISIBLE_DEVICES= python ddp_scripts/measure/benchmark.py --configs "
                        "cpu,ddp --cpu-processes 2 --batch-size 64 --out "
                        "runs/benchmark-like-the-step.json; then pass its file to "
                        "ch07_figures.ratio_from_parts_lines.")
    gpus = made_runs()
    gpus["two-processes"]["device"] = "cuda:0"
    lines = ch07_figures.ratio_from_parts_lines(benchmark_file(0.80), gpus)
    assert lines[0].startswith("Benchmark: its gpu row was not measured")
    assert ("CUDA_VISIBLE_DEVICES=0,1 python ddp_scripts/measure/benchmark.py --configs gpu,ddp "
            "--batch-size 64 --out") in lines[1]
    # the lines that follow read the step's own parts, as before
    assert lines[2].startswith("Step parts, batch 64")


def test_planted_grown_all_reduce_is_the_part_that_grew_most():
    runs = made_runs()
    lines = ch07_figures.ratio_from_parts_lines(benchmark_file(0.80), runs)
    gap = [line for line in lines if line.startswith("  From 1 process x 2 threads")]
    assert gap == ["  From 1 process x 2 threads to 2 processes x 1 thread: compute -7.00, "
                   "waiting for the other ranks +9.00, all-reduce not hidden +28.00 us per "
                   "sample; the part that grew most: all-reduce not hidden (+28.00): "
                   f"{ch07_figures.WHY_GAP['all-reduce not hidden']}."]
    said_ = ch07_figures.verdict(runs, "batch 64")[-1]
    assert "the part that grew most: communication not hidden (+37.00 us per sample)" in said_


def test_right_case_no_part_grew():
    same = made_runs(two={**ONE}, waiting=0.0)
    lines = ch07_figures.ratio_from_parts_lines(benchmark_file(1.0), same)
    assert any(line.endswith("us per sample; no part grew.") for line in lines)
    same["two-processes"] = step_file(2, 1, {part: 1.5 * v for part, v in ONE.items()})
    assert ch07_figures.verdict(same, "batch 64")[-1] == (
        "  From 1 process x 1 thread to 2 processes x 1 thread, no part grew by 0.01 us per "
        "sample.")


def test_planted_smaller_share_of_a_core_is_named():
    grown = {**TWO, "backward compute": 300.0, "communication not hidden": 0.0}
    runs = made_runs(two=grown, waiting=0.0, share_one=(1.0, 0.98, 1.0),
                     share_two=(0.5, 0.45, 0.55))
    line = ch07_figures.verdict(runs, "batch 64")[-1]
    assert "the part that grew most: backward compute" in line
    assert "each process gets less of a core" in line and "1.00 -> 0.50" in line


def test_right_case_a_share_that_did_not_fall_does_not_blame_the_core():
    # Forward's share unchanged, within the range either run's groups of steps took: the
    # thread kept its share of a core, so the part's CPU time itself grew.
    grown = {**TWO, "backward compute": TWO["backward compute"] + 378.0}
    runs = made_runs(two=grown, share_one=(1.0, 0.95, 1.0), share_two=(0.97, 0.93, 0.99))
    line = ch07_figures.verdict(runs, "batch 64")[-1]
    assert "the part that grew most: backward compute" in line
    assert "gets less of a core" not in line and "too small to tell" not in line, line
    assert "not that the step's thread got less of a core" in line
    assert "its CPU time grew" in line, line


def test_planted_a_fall_too_small_for_the_growth_is_too_small_to_tell():
    # 1.00 -> 1.00 (0.9995 -> 0.998), beyond both runs' ranges, for a part that grew 4.6x;
    # and 1.00 -> 0.95, a fall of 5%, for a part that grew 3.3x: each explains a few percent
    # of the growth. Neither blames the core, nor says it was not the core.
    for share_one, share_two, grown in (
            ((0.9995, 0.999, 1.0), (0.998, 0.997, 0.9985),
             {**TWO, "backward compute": TWO["backward compute"] + 378.0}),
            ((1.0, 0.99, 1.0), (0.95, 0.94, 0.96),
             {**TWO, "backward compute": 300.0, "communication not hidden": 0.0})):
        runs = made_runs(two=grown, waiting=0.0, share_one=share_one, share_two=share_two)
        line = ch07_figures.verdict(runs, "batch 64")[-1]
        assert "the part that grew most: backward compute" in line
        assert "gets less of a core" not in line and "not that" not in line, line
        assert "too small to tell" in line, line


def test_planted_a_small_fall_that_explains_a_small_growth_blames_the_core():
    # Forward grows 9% and its share falls 1.00 -> 0.92, beyond both runs' ranges: a thread
    # with 92% of a core takes 1.087x as long, nearly all of the 1.09x.
    one = {"forward": 102.0 / 1.5, "backward compute": 60.0, "optimizer": 9.0}
    grown = {"forward": 102.0 * 1.09, "backward compute": 90.0, "optimizer": 13.5,
             "communication not hidden": 0.0}
    runs = made_runs(one=one, two=grown, waiting=0.0, share_one=(1.0, 0.99, 1.0),
                     share_two=(0.92, 0.91, 0.93))
    line = ch07_figures.verdict(runs, "batch 64")[-1]
    assert "the part that grew most: forward" in line, line
    assert "each process gets less of a core" in line and "1.00 -> 0.92" in line, line
    # The same growth with the share held: the CPU time grew, not the core's share
    runs = made_runs(one=one, two=grown, waiting=0.0, share_one=(1.0, 0.99, 1.0),
                     share_two=(1.0, 0.99, 1.0))
    line = ch07_figures.verdict(runs, "batch 64")[-1]
    assert "gets less of a core" not in line and "its CPU time grew" in line, line


def test_planted_a_fall_that_explains_half_the_growth_blames_the_core():
    # backward compute 90 -> 300 us (3.33x); a share of 1.00 -> 0.45 makes it 2.22x: 66% of
    # the growth, on the scale where the two multiply. 1.00 -> 0.85 (1.18x) makes 13%.
    grown = {**TWO, "backward compute": 300.0, "communication not hidden": 0.0}
    runs = made_runs(two=grown, waiting=0.0, share_one=(1.0, 0.99, 1.0),
                     share_two=(0.45, 0.44, 0.46))
    assert "each process gets less of a core" in ch07_figures.verdict(runs, "batch 64")[-1]
    runs = made_runs(two=grown, waiting=0.0, share_one=(1.0, 0.99, 1.0),
                     share_two=(0.85, 0.84, 0.86))
    assert "too small to tell" in ch07_figures.verdict(runs, "batch 64")[-1]


def test_planted_a_fall_within_overlapping_ranges_is_too_small_to_tell():
    # Forward's share 0.95 -> 0.82, within ranges 0.80-1.00 and 0.70-0.90, for a part that
    # grew 1.1x: its CPU time changed by 1.1 x 0.82 / 0.95 = 0.95x, and anywhere from
    # 1.1 x 0.70 / 1.00 to 1.1 x 0.90 / 0.80 within the ranges, so the clocks cannot say
    # whether it grew.
    grown = {**TWO, "backward compute": 1.1 * 90.0, "communication not hidden": 0.0}
    runs = made_runs(two=grown, waiting=0.0, share_one=(0.95, 0.80, 1.0),
                     share_two=(0.82, 0.70, 0.90))
    line = ch07_figures.verdict(runs, "batch 64")[-1]
    assert "the part that grew most: backward compute" in line, line
    assert "its CPU time grew" not in line and "gets less of a core" not in line, line
    assert "too small to tell" in line, line


def test_right_case_a_growth_beyond_overlapping_ranges_is_a_grown_cpu_time():
    # The same shares for a part that grew 2x: within the ranges its CPU time grew at least
    # 2 x 0.70 / 1.00 = 1.4x.
    grown = {**TWO, "backward compute": 2 * 90.0, "communication not hidden": 0.0}
    runs = made_runs(two=grown, waiting=0.0, share_one=(0.95, 0.80, 1.0),
                     share_two=(0.82, 0.70, 0.90))
    line = ch07_figures.verdict(runs, "batch 64")[-1]
    assert "not that the step's thread got less of a core" in line, line
    assert "its CPU time grew" in line, line


def test_planted_a_fall_that_explains_under_half_is_said_in_the_rules_words():
    # The rule blames the core where the fall explains at least half of the growth: exactly
    # half (1.00 -> 0.50, 2x, for a part that grew 4x) blames it, and the verdict on a smaller
    # one says it explains less than half, not "most".
    assert ch07_figures.CORE_SHARE_EXPLAINS == 0.5
    grown = {**TWO, "backward compute": 4 * 90.0, "communication not hidden": 0.0}
    runs = made_runs(two=grown, waiting=0.0, share_one=(1.0, 0.99, 1.0),
                     share_two=(0.5, 0.49, 0.51))
    assert "each process gets less of a core" in ch07_figures.verdict(runs, "batch 64")[-1]
    runs = made_runs(two=grown, waiting=0.0, share_one=(1.0, 0.99, 1.0),
                     share_two=(0.85, 0.84, 0.86))
    line = ch07_figures.verdict(runs, "batch 64")[-1]
    assert "too small to tell" in line and "less than half of the growth" in line, line
    assert "most" not in line.split("grew most:")[1], line


def test_planted_a_share_of_zero_is_a_missing_measurement():
    grown = {**TWO, "backward compute": 300.0, "communication not hidden": 0.0}
    for share_one, share_two in (((1.0, 0.99, 1.0), (0.0, 0.0, 0.0)),
                                 ((0.0, 0.0, 0.0), (0.5, 0.45, 0.55))):
        runs = made_runs(two=grown, waiting=0.0, share_one=share_one, share_two=share_two)
        line = ch07_figures.verdict(runs, "batch 64")[-1]
        assert "less of a core" not in line and "CPU time grew" not in line, line
        assert "was not measured" in line, line


def test_planted_a_part_that_did_not_grow_gets_no_cause():
    # Forward fell from 102 to 63 us while its share fell 1.00 -> 0.50: nothing to explain.
    runs = made_runs(waiting=0.0, share_one=(1.0, 0.99, 1.0), share_two=(0.5, 0.45, 0.55))
    assert ch07_figures.why(runs, "batch 64", "forward") is None
    assert ch07_figures.why(runs, "batch 64", "optimizer") is None


def untimed(runs):
    """The review's replay: the two-process file as a run whose all-reduce was not timed
    apart from backward (an NCCL run before the hooks read CUDA events) records it."""
    found = runs["two-processes"]["cases"]["batch 64"]
    found.pop("all-reduce clock", None)
    found["communication timed"] = False
    return runs


def test_planted_m2_an_untimed_all_reduce_inside_backward_does_not_blame_the_core():
    folded = {**TWO, "backward compute": TWO["backward compute"] + 378.0,
              "communication not hidden": 0.0}
    for shares in (((0.9995, 0.999, 1.0), (0.998, 0.997, 0.9985)),   # 1.00 -> 1.00
                   ((1.0, 0.98, 1.0), (0.5, 0.45, 0.55))):            # a real fall as well
        runs = untimed(made_runs(two=folded, waiting=0.0, share_one=shares[0],
                                 share_two=shares[1]))
        line = ch07_figures.verdict(runs, "batch 64")[-1]
        assert ("the part that grew most: backward compute (includes the all-reduce, untimed "
                "under NCCL) (+347.00 us per sample)") in line, line
        assert "less of a core" not in line, line
        assert "the all-reduce was not timed apart from backward" in line, line


def test_planted_on_gpus_a_fall_of_the_cpu_share_names_no_cause():
    # On GPUs the compute is the GPU's: a CPU clock's share names no cause, the profiler does.
    grown = {**TWO, "backward compute": 300.0, "communication not hidden": 0.0}
    runs = made_runs(two=grown, waiting=0.0, share_one=(1.0, 0.98, 1.0),
                     share_two=(0.5, 0.45, 0.55))
    for run in runs.values():
        run["device"] = "cuda:0"
    runs["two-processes"]["cases"]["batch 64"]["all-reduce clock"] = "CUDA events"
    line = ch07_figures.verdict(runs, "batch 64")[-1]
    assert "less of a core" not in line, line
    assert "torch.profiler" in line and "chapter 10" in line, line


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


def test_right_case_reliable_speeds_get_their_bars():
    results = benchmark.load_results(ROOT / "results/cpu-2core-2026-11-30.json")
    table = benchmark.results_table(results)
    assert set(ch07_figures.measured_speedups(results)) == {"cpu", "ddp"}
    assert ch07_figures.measured_speedups(results)["ddp"] == table.loc["ddp", "x CPU"]


def test_planted_a_speed_marked_unreliable_gets_no_bar():
    results = benchmark.load_results(ROOT / "results/cpu-2core-2026-11-30.json")
    for run in results["runs"]:
        if run["config"] == "ddp":
            run["reliable"] = False
    assert set(ch07_figures.measured_speedups(results)) == {"cpu"}
    for run in results["runs"]:
        if run["config"] == "cpu":
            run["reliable"] = False  # the baseline too: no ratio can be drawn
    assert ch07_figures.measured_speedups(results) == {}


def test_right_case_the_run_figure_draws_each_runs_wall_time_and_speedup():
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
    assert right.get_title() == ""                         # nothing left out, nothing said
    matplotlib.pyplot.close(fig)


def test_planted_an_unreliable_speedup_is_left_out_of_the_run_figure():
    results = benchmark.load_results(ROOT / "results/cpu-2core-2026-11-30.json")
    runs = {run["config"]: run for run in results["runs"]}
    runs["ddp"].update(reliable=False, spread=2.98)        # then its speed-up is not drawn
    fig, (left, right) = new_figure(1, 2)
    _, speedups = ch07_figures.draw_run(left, right, results)
    assert speedups["x CPU"][list(runs).index("ddp")] == 0
    assert speedups["x CPU"][list(runs).index("cpu")] == 1.0
    assert " ".join(right.get_title().split()).startswith(
        "No speed-ups drawn for ddp: the steady epochs of ddp spread 3.0x")
    matplotlib.pyplot.close(fig)


# What describe() says about a results file (e3451e23), and what other work did to the
# threaded run and to the processes (b33811d2): each fed the committed CPU file, changed.

def committed_cpu_file(**changes):
    """The committed CPU results file, with runs changed: {config: {key: value}}."""
    results = benchmark.load_results(ROOT / "results/cpu-2core-2026-11-30.json")
    for run in results["runs"]:
        run.update(changes.get(run["config"], {}))
    return results


def test_planted_a_load_of_half_the_cores_before_the_runs_is_other_work():
    hardware = committed_cpu_file()["hardware"]   # 1.8 before the runs, on 2 cores
    assert ch07_figures.load_line(hardware) == (
        "load average (1 min) before/after the runs: 1.8 / 1.87 on 2 cores: other work was "
        "using the CPU when these runs started")
    hardware["load_average_before"] = [1.0, 1.0, 1.0]   # half of the 2 cores
    assert ch07_figures.load_line(hardware).endswith("other work was using the CPU when "
                                                     "these runs started")


def test_right_case_a_machine_idle_before_the_runs_is_not_said_to_be_busy():
    hardware = committed_cpu_file()["hardware"]
    hardware["load_average_before"] = [0.3, 0.2, 0.1]
    assert ch07_figures.load_line(hardware) == (
        "load average (1 min) before/after the runs: 0.3 / 1.87 on 2 cores")
    del hardware["load_average_before"]
    assert ch07_figures.load_line(hardware) is None     # a file that recorded no load


def test_planted_an_unsteady_run_is_said_unreliable():
    results = committed_cpu_file(ddp={"reliable": False, "spread": 2.98})
    assert ch07_figures.unreliable_lines(results) == [
        "ddp: UNRELIABLE: its steady epochs spread 2.98x, more than the 1.5x allowed; the "
        "ratios that use it are not compared below."]


def test_right_case_steady_runs_get_no_unreliable_line():
    assert ch07_figures.unreliable_lines(committed_cpu_file()) == []


def test_planted_other_work_that_stalled_the_threads_is_called_a_collapse():
    results = committed_cpu_file(cpu={"reliable": False, "spread": 2.98})
    said = ch07_figures.threads_against_processes(results)
    assert said.startswith("Other work took cores during these runs (fastest over slowest "
                           "epoch: 3.0x with 2 threads in one process, 1.1x with 2 one-thread "
                           "processes). The threaded run collapsed")
    results = committed_cpu_file(ddp={"reliable": False, "spread": 2.98})
    assert ch07_figures.threads_against_processes(results) == (
        "Other work took cores during these runs (fastest over slowest epoch: 1.2x with 2 "
        "threads in one process, 3.0x with 2 one-thread processes).")


def test_planted_both_runs_unsteady_is_not_called_a_collapse_of_the_threads():
    results = committed_cpu_file(cpu={"reliable": False, "spread": 2.98},
                                 ddp={"reliable": False, "spread": 2.5})
    assert ch07_figures.threads_against_processes(results) == (
        "Other work took cores during these runs (fastest over slowest epoch: 3.0x with 2 "
        "threads in one process, 2.5x with 2 one-thread processes). Both runs were unsteady, "
        "so they cannot show whether the threads suffer more than the processes.")


def test_right_case_runs_that_held_steady_are_said_to():
    said = ch07_figures.threads_against_processes(committed_cpu_file())
    assert said.startswith("Both runs held steady here")
    on_gpus = committed_cpu_file(ddp={"run_device": "cuda:0"})
    assert ch07_figures.threads_against_processes(on_gpus) is None   # no cores split
