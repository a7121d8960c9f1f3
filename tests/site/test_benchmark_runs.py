"""The benchmark (ddp_scripts/measure/benchmark.py) end to end, in the runs chapters 7 and 10 made when
the book was built (_build/src/runs): chapter 7's smoke benchmark of every configuration, and
chapter 10's with --tuned. Nothing here compares a speed with a threshold."""
import pytest
import torch

from book_files import built_run
from ddp_scripts.measure.benchmark import CONFIGS, load_results, results_table
from ddp_scripts.runfiles import SUMMARY

NO_GPU = not torch.cuda.is_available()


@pytest.fixture(scope="module")
def smoke():
    """Chapter 7's benchmark: its results file and its runs' folder."""
    where = built_run("ch07-benchmark")
    return where / "results.json", where


def test_the_smoke_benchmark_writes_a_valid_results_file(smoke):
    out, where = smoke
    results = load_results(out)
    assert results["size"] == "smoke" and results["settings"]["dataset"] == "synthetic"
    hardware = results["hardware"]
    assert hardware["label"] and hardware["torch"] == torch.__version__
    assert hardware["cpu"]["logical_cores"] >= 1 and hardware["gpu_count"] == len(hardware["gpus"])
    runs = {run["config"]: run for run in results["runs"]}
    assert list(runs) == list(CONFIGS)
    for run in runs.values():
        assert run["status"] in ("measured", "skipped"), run
        if run["status"] == "skipped":
            assert run["reason"], run
            continue
        assert len(run["repeats"]) == results["settings"]["repeats"] == 2
        for repeat in run["repeats"]:
            assert repeat["wall_s"] > repeat["startup_s"] > 0
            assert repeat["wall_s"] >= repeat["total_s"] >= repeat["train_s"] > 0
            assert len(repeat["epoch_time_s"]) == results["settings"]["epochs"] == 3
            assert repeat["warmup_epochs"] == 1 and len(repeat["steady_samples_per_s"]) == 2
        low, high = run["samples_per_s_range"]
        assert low <= run["samples_per_s"] <= high and run["spread"] == high / low
        assert run["reliable"] == (run["spread"] <= results["reliable_spread"])
        assert 0 <= run["test_accuracy"] <= 1
        # The global batch is held fixed: N processes get global/N each.
        assert run["batch_size_per_process"] * run["processes"] == run["global_batch_size"]
        for repeat in (1, 2):
            assert (where / run["config"] / f"repeat-{repeat}" / SUMMARY).exists()
    assert runs["ddp"]["processes"] >= 2 or runs["ddp"]["status"] == "skipped"


@pytest.mark.skipif(not NO_GPU, reason="checks what a machine without a GPU records")
def test_without_a_gpu_cpu_and_ddp_run_and_the_gpu_rows_say_why_not(smoke):
    runs = {run["config"]: run for run in load_results(smoke[0])["runs"]}
    assert runs["cpu"]["status"] == runs["ddp"]["status"] == "measured"
    assert runs["ddp"]["backend"] == "gloo" and runs["ddp"]["world_size"] == 2
    assert runs["ddp"]["batch_size_per_process"] == runs["cpu"]["batch_size_per_process"] // 2
    for config in ("gpu", "dp"):
        assert runs[config]["status"] == "skipped" and "GPU" in runs[config]["reason"]
    table = results_table(load_results(smoke[0]))
    assert table.loc["cpu", "x CPU"] == 1.0
    assert table.loc["ddp", "x CPU"] > 0 and table["x 1 GPU"].isna().all()
    # Interleaved: round 1 ran cpu then ddp, round 2 again, each in a directory of its own.
    finished = [(smoke[1] / config / f"repeat-{repeat}" / SUMMARY).stat().st_mtime_ns
                for repeat in (1, 2) for config in ("cpu", "ddp")]
    assert finished == sorted(finished)


def test_the_tuned_smoke_benchmark_has_the_probe_and_both_rows():
    """`--tuned` end to end, as chapter 10 runs it (`--size smoke --configs cpu,gpu --tuned`):
    the CPU probe, the plain and tuned cpu rows (and the GPU rows where there is a GPU, else
    skipped with the reason)."""
    results = load_results(built_run("ch10") / "benchmark" / "tuned.json")
    runs = {run["config"]: run for run in results["runs"]}
    assert list(runs) == ["cpu", "cpu-tuned", "gpu", "gpu-tuned"] and results["tuned"]
    probe = results["cpu_probe"]
    assert runs["cpu-tuned"]["status"] == "measured"
    assert runs["cpu-tuned"]["levers"] == {"threads": probe["threads"],
                                           "batch_size": probe["batch_size"]}
    assert runs["cpu-tuned"]["threads_per_process"] == probe["threads"]
    assert len(probe["probe"]) >= 2 and all(row["samples_per_s"] > 0 for row in probe["probe"])
    if NO_GPU:
        assert runs["gpu-tuned"]["status"] == "skipped" and "GPU" in runs["gpu-tuned"]["reason"]
    assert results_table(results).loc["cpu-tuned", "x untuned"] > 0
