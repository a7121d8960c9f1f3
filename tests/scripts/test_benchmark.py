"""The benchmark (ddp_scripts/measure/benchmark.py): its plans, tables and refusals. Its runs end to end
are checked in the runs chapters 7 and 10 make (tests/site/test_benchmark_runs.py)."""
import pytest
import torch

from ddp_scripts.measure.benchmark import (CONFIGS, command_for, load_results, parse_configs, plan_runs,
                                   readable, results_table, settings_for)
from ddp_scripts.cli import UsageError
from ddp_scripts.hardware import hardware_label
from ddp_scripts.measure.links import _first_line, parse_topology, visible_gpu_indices
from ddp_scripts.runfiles import METRICS
from helpers import run_in_process

NO_GPU = not torch.cuda.is_available()


def benchmark(*args):
    """`python ddp_scripts/measure/benchmark.py ARGS`, run inside this process (helpers.run_in_process:
    the same exit status and output, without a new process's torch import)."""
    return run_in_process("measure/benchmark.py", *args)


def test_an_existing_results_file_is_not_overwritten(tmp_path):
    out = tmp_path / "results.json"
    out.write_text('{"runs": []}')
    before = out.read_bytes()
    done = benchmark("--size", "smoke", "--out", out, "--runs-dir", tmp_path / "runs")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "--overwrite" in done.stderr
    assert out.read_bytes() == before


def test_existing_runs_are_not_overwritten(tmp_path):
    held = tmp_path / "runs" / "cpu" / "repeat-1"
    held.mkdir(parents=True)
    (held / METRICS).write_text("")
    done = benchmark("--configs", "cpu", "--out", tmp_path / "new.json",
                     "--runs-dir", tmp_path / "runs")
    assert done.returncode == 2 and "already holds a run" in done.stderr
    assert not (tmp_path / "new.json").exists()
    assert (held / METRICS).read_text() == ""


@pytest.mark.skipif(not NO_GPU, reason="on a GPU machine these configurations would run")
def test_overwrite_replaces_the_results_file_when_asked(tmp_path):
    out = tmp_path / "results.json"
    out.write_text("{}")
    done = benchmark("--configs", "gpu,dp", "--out", out, "--runs-dir", tmp_path / "runs",
                     "--overwrite")
    assert done.returncode == 0, done.stderr
    runs = load_results(out)["runs"]
    assert [run["status"] for run in runs] == ["skipped", "skipped"]


def test_bad_configuration_names_are_one_line_and_exit_2(tmp_path):
    done = benchmark("--configs", "cpu,tpu", "--out", tmp_path / "r.json")
    assert done.returncode == 2
    assert done.stderr.startswith("error: unknown configuration 'tpu'")
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("text", [",", "gpus", "cpu,,ddp,x"])
def test_configuration_lists_are_checked_before_anything_runs(text):
    with pytest.raises(UsageError, match="unknown configuration"):
        parse_configs(text)
    assert parse_configs("all") == list(CONFIGS) and parse_configs("ddp, cpu,ddp") == ["ddp", "cpu"]


def test_topology_is_read_from_nvidia_smi_output():
    text = ("\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
            "GPU0\t X \tNV4\tPIX\t0-15\t0\t\tN/A\n"
            "GPU1\tNV4\t X \tSYS\t0-15\t0\t\tN/A\n"
            "NIC0\tPIX\tSYS\t X \n\nLegend:\n  X    = Self\n")
    assert parse_topology(text) == {"GPU0-GPU1": "NV4"}


# nvidia-smi underlines the header with terminal escape codes, even into a pipe: the H200
# record (shared/gpu-runs/2026-11-30-h200/h200-full.json) stores them, as here.
H200_TOPOLOGY = ("\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
                 "GPU0\t X \t0-15\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n")
FOUR_GPUS = ("\x1b[4m\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
             "GPU0\t X \tNV12\tSYS\tSYS\t0-15\t0\t\tN/A\n"
             "GPU1\tNV12\t X \tSYS\tSYS\t0-15\t0\t\tN/A\n"
             "GPU2\tSYS\tSYS\t X \tNV12\t16-31\t1\t\tN/A\n"
             "GPU3\tSYS\tSYS\tNV12\t X \t16-31\t1\t\tN/A\n\nLegend:\n  X    = Self\n")


def test_topology_with_escape_codes_keeps_every_gpu():
    assert parse_topology(H200_TOPOLOGY) == {}  # one GPU: no pair
    assert parse_topology(FOUR_GPUS) == {"GPU0-GPU1": "NV12", "GPU0-GPU2": "SYS",
                                         "GPU0-GPU3": "SYS", "GPU1-GPU2": "SYS",
                                         "GPU1-GPU3": "SYS", "GPU2-GPU3": "NV12"}


def test_topology_keeps_only_the_gpus_the_run_can_see():
    uuids = {0: "GPU-aaaa", 1: "GPU-bbbb", 2: "GPU-cccc", 3: "GPU-dddd"}
    assert visible_gpu_indices(None) is None
    assert visible_gpu_indices("2,3") == [2, 3]
    assert visible_gpu_indices("GPU-cccc,GPU-dd", uuids) == [2, 3]  # UUIDs, or their start
    assert visible_gpu_indices("1,-1,0") == [1]  # CUDA stops at the first invalid entry
    assert parse_topology(FOUR_GPUS, visible=[2, 3]) == {"GPU2-GPU3": "NV12"}
    assert parse_topology(FOUR_GPUS, visible=[1, 2]) == {"GPU1-GPU2": "SYS"}


def test_driver_version_is_one_line_on_a_machine_with_several_gpus():
    assert _first_line("580.159.04\n580.159.04\n580.159.04\n") == "580.159.04"
    assert _first_line(None) is None


def plan_for(gpu_count, batch_size=64):
    settings = settings_for("smoke", batch_size=batch_size)
    names = ["NVIDIA TITAN Xp"] * gpu_count
    return {run["config"]: run for run in plan_runs(CONFIGS, settings, gpu_count, "runs/b",
                                                     gpu_names=names)}


def test_plan_on_two_gpus_splits_the_global_batch_over_one_process_per_gpu():
    runs = plan_for(2)
    assert not any("skip" in run for run in runs.values())
    assert runs["dp"]["processes"] == 1 and runs["dp"]["batch_size_per_process"] == 64
    assert runs["ddp"]["processes"] == 2 and runs["ddp"]["batch_size_per_process"] == 32
    assert runs["ddp"]["backend"] == "nccl"
    ddp = readable(command_for(runs["ddp"]))
    assert ddp.startswith("torchrun --standalone") and "--nproc-per-node 2" in ddp
    assert "--batch-size 32" in ddp and "--device cuda" in ddp
    assert readable(command_for(runs["dp"])).startswith("python ddp_scripts/train_dp.py")
    assert "--log-dir" not in ddp and "--master-port" not in ddp  # the launcher's own details


def test_plan_on_one_gpu_says_why_dp_and_ddp_do_not_run():
    runs = plan_for(1)
    assert "skip" not in runs["cpu"] and "skip" not in runs["gpu"]
    for config in ("dp", "ddp"):
        assert "only one GPU is visible (NVIDIA TITAN Xp)" in runs[config]["skip"]


def test_plan_uses_as_many_gpus_as_the_batch_splits_over():
    for gpus, processes in ((3, 2), (4, 4), (5, 4), (6, 4), (7, 4), (8, 8)):
        ddp = plan_for(gpus)["ddp"]
        assert "skip" not in ddp and ddp["processes"] == processes, (gpus, ddp)
        assert ddp["batch_size_per_process"] * processes == 64
        assert (f"on {processes} of the {gpus} GPUs" in ddp["description"]) == (processes < gpus)
    assert "skip" not in plan_for(3)["dp"]
    assert "does not split evenly over 2 or more" in plan_for(2, batch_size=7)["ddp"]["skip"]



def test_table_computes_speed_ups_and_efficiency():
    def measured(config, gpus, epoch_s, reliable=True):
        return {"config": config, "status": "measured", "description": config, "processes": 1,
                "batch_size_per_process": 64, "global_batch_size": 64,
                "threads_per_process": 1, "gpus": gpus, "wall_s": 10 * epoch_s,
                "startup_s": 1.0, "steady_epoch_s": epoch_s, "samples_per_s": 1 / epoch_s,
                "spread": 1.1 if reliable else 3.0, "reliable": reliable,
                "test_accuracy": 0.5}
    results = {"runs": [measured("cpu", 0, 8.0), measured("gpu", 1, 1.0),
                        measured("dp", 2, 0.8), measured("ddp", 2, 0.625)]}
    table = results_table(results)
    assert table.loc["gpu", "x CPU"] == 8.0 and table.loc["ddp", "x 1 GPU"] == 1.6
    assert table.loc["dp", "efficiency"] == pytest.approx(0.625)
    assert table.loc["ddp", "efficiency"] == pytest.approx(0.8)
    assert table[["efficiency"]].loc[["cpu", "gpu"]].isna().all().all()
    assert (table["ratios"] == "ok").all()
    # An unreliable CPU row makes every ratio against it unreliable; an unreliable DP row
    # only its own.
    results["runs"][0] = measured("cpu", 0, 8.0, reliable=False)
    assert (results_table(results)["ratios"] == "unreliable").all()
    results["runs"][0], results["runs"][2] = measured("cpu", 0, 8.0), measured("dp", 2, 0.8, False)
    assert list(results_table(results)["ratios"]) == ["ok", "ok", "unreliable", "ok"]
    results["runs"][1] = {**measured("gpu", 1, 1.0), "status": "skipped"}
    assert results_table(results).loc["gpu", "ratios"] == ""


def test_planted_a_loaded_machine_is_labelled_unreliable():
    """The artefact seen once in chapter 7: a CPU run slowed by other work, one steady epoch
    at 193 samples/s, made DDP look 20x faster. Its repeats disagree, and it is labelled."""
    from ddp_scripts.measure.benchmark import RELIABLE_SPREAD, summarise_repeats
    run = {"train_samples": 1024, "repeats": [
        {"wall_s": 9.0, "startup_s": 5.0, "train_s": 3.0, "total_s": 8.5,
         "epoch_time_s": [1.0, 5.3, 0.5], "warmup_epochs": 1,
         "steady_samples_per_s": [193.0, 2048.0], "test_accuracy": 0.2},
        {"wall_s": 8.0, "startup_s": 5.0, "train_s": 2.0, "total_s": 7.5,
         "epoch_time_s": [1.0, 0.5, 0.5], "warmup_epochs": 1,
         "steady_samples_per_s": [2000.0, 2100.0], "test_accuracy": 0.2}]}
    summarise_repeats(run)
    assert run["samples_per_s"] == 2048.0 and run["samples_per_s_range"] == [193.0, 2100.0]
    assert run["spread"] > RELIABLE_SPREAD and not run["reliable"]


def test_right_case_steady_repeats_are_reliable():
    """The same two repeats with the slow epoch at the others' speed: reliable."""
    from ddp_scripts.measure.benchmark import RELIABLE_SPREAD, summarise_repeats
    run = {"train_samples": 1024, "repeats": [
        {"wall_s": 9.0, "startup_s": 5.0, "train_s": 3.0, "total_s": 8.5,
         "epoch_time_s": [1.0, 0.5, 0.5], "warmup_epochs": 1,
         "steady_samples_per_s": [1950.0, 2048.0], "test_accuracy": 0.2},
        {"wall_s": 8.0, "startup_s": 5.0, "train_s": 2.0, "total_s": 7.5,
         "epoch_time_s": [1.0, 0.5, 0.5], "warmup_epochs": 1,
         "steady_samples_per_s": [2000.0, 2100.0], "test_accuracy": 0.2}]}
    summarise_repeats(run)
    assert run["spread"] == 2100.0 / 1950.0 <= RELIABLE_SPREAD and run["reliable"]


def test_hardware_label_names_gpus_links_and_cores():
    cpu = {"model": "Intel Xeon", "usable_cores": 16}
    two = {"cpu": cpu, "gpus": [{"name": "NVIDIA TITAN Xp"}] * 2,
           "interconnect": {"links": {"GPU0-GPU1": "PIX"}}}
    assert hardware_label(two) == "2 x NVIDIA TITAN Xp (PIX); Intel Xeon, 16 cores"
    versions = {**two, "driver": "535.104", "torch": "2.4.0", "cuda": "12.1"}
    assert hardware_label(versions) == ("2 x NVIDIA TITAN Xp (PIX); Intel Xeon, 16 cores; "
                                        "driver 535.104, torch 2.4.0, CUDA 12.1")
    assert hardware_label({"cpu": cpu, "gpus": [], "interconnect": {}, "torch": "2.4.0"}) == (
        "Intel Xeon, 16 cores, no GPU")
