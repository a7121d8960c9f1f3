"""What the chapters' own runs show holds: read from the build's copy, not run again.

Chapters 5, 8 and 11 launch the companion scripts' decisive runs (DDP against one process,
a killed rank restarted, FSDP against DDP, a sharded checkpoint resumed on another number of
ranks, the article's old launcher, a collective one rank skips, a node that never joins). The
build executes them once; these tests read the folders they wrote (_build/src/runs) and the
outputs the executed chapters hold (_build/src/notebooks), so no torchrun start is paid twice.
On a machine with two GPUs or more chapter 5 runs on them (nccl), where kernels need not add
in a fixed order: its float32 comparison then allows 1e-3 instead of the CPU's 1e-5.
"""
import json
import re

import pytest
import torch

from book_files import BUILT_SOURCES, MISSING_SITE, built_run, load_notebook
from ddp_scripts.mistakes.faults import processes_mentioning
from ddp_scripts.runfiles import CHECKPOINT, SHARDED_CHECKPOINT, SUMMARY, metrics_rows
from helpers import max_difference, momentum_buffers

CONTRACT_KEYS = {"epoch", "train_loss", "test_loss", "test_accuracy", "epoch_time_s",
                 "samples_per_s", "world_size", "device", "backend", "strategy"}


def output_of(chapter, cell_id):
    """The text output of the executed chapter's code cell with this id (ids stay when code changes)."""
    path = BUILT_SOURCES / "notebooks" / f"{chapter}.ipynb"
    if not path.exists():
        pytest.fail(MISSING_SITE.format(path), pytrace=False)
    cell = next((cell for cell in load_notebook(path)["cells"]
                 if cell["cell_type"] == "code" and cell.get("id") == cell_id), None)
    assert cell is not None, f"{chapter} has no code cell with the id {cell_id!r}"
    return "".join("".join(out.get("text", "")) for out in cell.get("outputs", []))


def checkpoint(name):
    return torch.load(built_run(name) / CHECKPOINT, map_location="cpu", weights_only=True)


def moved_from_the_start(state, dtype):
    from ddp_scripts.models import build_model
    return max_difference(build_model("cnn", seed=0, dtype=dtype).state_dict(), state["model"])


# Chapter 5: DDP on N processes against one process with N times the batch -----------------
def test_ddp_equals_one_process_with_the_whole_batch_in_float64():
    ddp, single = checkpoint("ch05-ddp-float64"), checkpoint("ch05-single-float64")
    assert ddp["model"]["fc3.weight"].dtype == torch.float64
    assert max_difference(ddp["model"], single["model"]) < 1e-12
    assert moved_from_the_start(ddp, torch.float64) > 1e-3   # not equal by not training


def test_ddp_equals_one_process_after_an_epoch_in_float32():
    snapshots = built_run("ch05-snapshots")
    ddp, single = (torch.load(snapshots / name, map_location="cpu", weights_only=True)
                   for name in ("ddp-epoch1.pt", "single-epoch1.pt"))
    device = metrics_rows(built_run("ch05-ddp"), strict=True)[0]["device"]
    assert max_difference(ddp["model"], single["model"]) < (1e-5 if device == "cpu" else 1e-3)
    assert moved_from_the_start(ddp, torch.float32) > 1e-3


def test_the_chapters_checks_call_the_gap_between_ddp_and_one_process_rounding():
    """The lines under chapter 5's table (notebooks/ddp_figures.py: each check has a planted
    flaw in tests/figures/test_figures_ch05.py): on the book's own runs, rounding only."""
    output = output_of("05_distributed_data_parallel", "ch05-42")
    assert output.count("difference below 1% of the change: True") == 2, output
    # notebooks/ddp_figures.py rounding_line: both gaps within the bound for rounding alone,
    # not "... beyond it, so the runs compute different things".
    line = next((line for line in output.splitlines() if line.startswith("after epoch 1 (")), "")
    assert re.fullmatch(r"after epoch 1 \(\d+ steps\): the float32 gap is \S+ epsilons, the "
                        r"float64 gap \S+; the bound for rounding alone: [\d,]+ \(\d+ per step\): "
                        r"both gaps are within it, so it is rounding", line), output
    assert "so the runs compute different things" not in output, output


def test_ddp_metrics_and_checkpoint_contract():
    out = built_run("ch05-ddp")
    rows = metrics_rows(out, strict=True)
    assert [row["epoch"] for row in rows] == [1, 2, 3]   # stopped after 1, resumed: each once
    for row in rows:
        assert CONTRACT_KEYS <= row.keys()
        assert row["strategy"] == "ddp" and row["world_size"] >= 2
        assert row["backend"] == ("gloo" if row["device"] == "cpu" else "nccl")
        assert row["global_batch_size"] == row["batch_size"] * row["world_size"]
        assert 0.0 <= row["test_accuracy"] <= 1.0 and row["samples_per_s"] > 0
        assert (row["dtype"], row["tf32"]) == ("float32", False)
    # Distributed evaluation scores each test image exactly once.
    assert rows[-1]["test_samples"] == 512
    state = checkpoint("ch05-ddp")
    assert {"model", "optimizer", "epoch"} <= state.keys() and state["epoch"] == 3
    assert not any(key.startswith("module.") for key in state["model"])
    summary = json.loads((out / SUMMARY).read_text())
    assert summary["startup_s"] > 0 and summary["train_s"] > 0
    assert summary["world_size"] == rows[-1]["world_size"]
    assert summary["hardware"]["device"] == rows[-1]["device"].split(":")[0]


def test_the_source_articles_launcher_still_works():
    """python -m torch.distributed.launch passes --local-rank; the script takes it, says so."""
    output = output_of("05_distributed_data_parallel", "ch05-49")
    if "no longer has torch.distributed.launch" in output:
        pytest.skip("this torch has no torch.distributed.launch; the chapter says so")
    notices = [line for line in output.splitlines()
               if line.startswith("notice: --local-rank comes from the deprecated")]
    assert len(notices) == 1, output[-3000:]   # once: rank 0 says it, not every rank
    assert metrics_rows(built_run("ch05-old-launch"), strict=True)[-1]["world_size"] >= 2


# Chapter 8: faults --------------------------------------------------------------------------
def test_a_killed_rank_restarts_and_ends_with_the_uninterrupted_model():
    output = output_of("08_troubleshooting", "ch08-restart")
    report = output_of("08_troubleshooting", "ch08-killer-report")
    assert "restarts: 1 " in report, report
    assert re.search(r"killed rank 1 \(pid \d+\) with SIGKILL", report), report
    # torchrun names the killed rank, not the survivor it stopped: the survivor's error file
    # sorts after the death (runfiles.write_error_file, lost_peer)
    assert re.search(r"failed \(exitcode: -9\) local_rank: 1\b", output), output[-3000:]
    # what the page says the survivor reported is what it printed above
    survivor = re.search(r"^the survivor: (.*)$", report, re.MULTILINE)
    assert survivor, report
    if "(it lost its peer): " in survivor[1]:
        said = survivor[1].split("(it lost its peer): ", 1)[1]
        assert f"[rank 0] error: {said}" in output, (survivor[1], output[-3000:])
    else:
        assert "rank 0 wrote no error file in attempt 0" in survivor[1], survivor[1]
        assert "[rank 0] error:" not in output, output[-3000:]
    assert [row["epoch"] for row in metrics_rows(built_run("ch08-restarted"), strict=True)] \
        == [1, 2]   # each epoch once, although epoch 2 ran twice
    reference, restarted = checkpoint("ch08-uninterrupted"), checkpoint("ch08-restarted")
    assert reference["epoch"] == restarted["epoch"] == 2
    assert max_difference(reference["model"], restarted["model"]) == 0.0
    # The optimizer too: SGD's momentum buffers came back from the checkpoint.
    assert max_difference(momentum_buffers(reference), momentum_buffers(restarted)) == 0.0


def test_a_rank_that_skips_a_collective_fails_with_the_groups_timeout():
    output = output_of("08_troubleshooting", "ch08-mismatch")
    assert output.count("joined the group") == 2, output
    # The rank that gives up last may see its partner's connection close instead of its own
    # timeout, and either may fail first: the group's own 3 s timeout must be in the output.
    assert "Timed out waiting 3000ms" in output, output
    assert re.search(r"^LaunchError: .*exit code 1\b", output, re.MULTILINE), output
    # the count is of ranks, from their records: each rank that timed out and printed its
    # traceback (torchrun may end it first) is one, however often the output repeats it
    timed_out = set(re.findall(r"\[rank(\d+)\]: RuntimeError: .*Timed out", output))
    counted = re.search(r"From each rank's own record: (\d) of 2 ranks timed out", output)
    assert counted and len(timed_out) <= int(counted[1]) and 1 <= int(counted[1]) <= 2, output


def test_torchruns_summary_is_shown_with_a_root_cause_that_is_not_blank():
    shown = output_of("08_troubleshooting", "ch08-torchrun-summary")
    assert re.search(r"^torchrun's own traceback: \d+ lines", shown), shown
    cause = shown[shown.index("Root Cause (first observed failure):"):]
    assert re.search(r"traceback : \S", cause) and "Timed out" in cause, shown


def test_the_knot_outlives_sigterm_and_ends_by_sigkill():
    shown = output_of("08_troubleshooting", "ch08-exit-knot")
    if "needs Linux" in shown:
        pytest.skip("the demonstration runs on Linux only")
    assert "still running 3 s after SIGTERM: True" in shown, shown
    assert "exit status after SIGKILL: -9" in shown, shown


def test_the_exit_benchmark_table_shows_both_orders():
    shown = output_of("08_troubleshooting", "ch08-exit-benchmark")
    assert re.search(r"model freed before the group: \d+ of \d+ runs hung", shown), shown
    assert re.search(r"model freed after the group: \d+ of \d+ runs hung", shown), shown


def test_the_stops_show_a_folder_in_use_and_a_resume_that_would_train_differently():
    in_use = output_of("08_troubleshooting", "ch08-stops-in-use")
    assert re.search(r"^the second run: exit status 2: .* is in use by another run", in_use,
                     re.MULTILINE), in_use
    assert "the first run: exit status -15: interrupted (SIGTERM)" in in_use, in_use
    resumed = output_of("08_troubleshooting", "ch08-stops-resume-run")
    assert re.search(r"^--resume --lr 0.1: exit status 2: .*was trained with --lr 0.01", resumed,
                     re.MULTILINE), resumed
    assert re.search(r"^--resume --epochs 1: exit status 0: .*nothing to train", resumed,
                     re.MULTILINE), resumed


def test_a_node_that_never_joins_fails_with_the_static_rendezvous_timeout():
    output = output_of("08_troubleshooting", "ch08-lonely-node-run")
    assert "LaunchError" in output and "1/2 clients joined" in output, output
    # No worker was ever started: none wrote to the run's folder.
    assert not (BUILT_SOURCES / "runs" / "ch08-lonely-node" / "metrics.jsonl").exists()


# Chapter 11: FSDP -----------------------------------------------------------------------------
def test_fsdp_equals_ddp_in_float64():
    fsdp, ddp = checkpoint("ch11-fsdp"), checkpoint("ch11-ddp")
    assert fsdp["model"]["fc3.weight"].dtype == torch.float64
    assert max_difference(fsdp["model"], ddp["model"]) < 1e-12
    assert moved_from_the_start(fsdp, torch.float64) > 1e-3


def test_fsdp_equals_ddp_in_float32_on_four_ranks_up_to_rounding():
    fsdp, ddp = checkpoint("ch11-fsdp-float32"), checkpoint("ch11-ddp-float32")
    assert fsdp["model"]["fc3.weight"].dtype == torch.float32
    assert metrics_rows(built_run("ch11-fsdp-float32"), strict=True)[-1]["world_size"] == 4
    moved = moved_from_the_start(fsdp, torch.float32)
    assert moved > 1e-3
    assert max_difference(fsdp["model"], ddp["model"]) < 1e-4 * moved


def test_fsdp_bytes_per_rank_are_the_shards_to_the_byte():
    """Chapter 11's MLP runs on 1, 2 and 4 ranks: each tensor's first dimension d cut into
    ceil(d / N) rows; the root (stem and head) held gathered after the evaluation."""
    import math

    from ddp_scripts.sharding import WideMLP
    model = WideMLP(256, 4)
    root = 8 * sum(p.numel() for part in (model.stem, model.head) for p in part.parameters())
    rows = [row for name in ("ch11-two-then-one", "ch11-four")
            for row in metrics_rows(built_run(name), strict=True)]
    assert {row["world_size"] for row in rows} == {1, 2, 4}
    for row in rows:
        n = row["world_size"]
        shards = 8 * sum(math.ceil(p.shape[0] / n) * p[0].numel() for p in model.parameters())
        held = (row["param_bytes_per_rank"], row["grad_bytes_per_rank"], row["optimizer_bytes_per_rank"])
        assert held == (shards, shards, shards), (n, held, shards)
        assert row["gathered_bytes_per_rank"] == root


def test_fsdp_metrics_what_each_rank_holds_and_its_checkpoints():
    out = built_run("ch11-fsdp")
    row = metrics_rows(out, strict=True)[-1]
    assert CONTRACT_KEYS | {"param_bytes_per_rank", "grad_bytes_per_rank",
                            "optimizer_bytes_per_rank", "parameters"} <= row.keys()
    assert row["strategy"] == "fsdp" and row["world_size"] == 2
    assert row["global_batch_size"] == 2 * row["batch_size"]
    # Each rank holds about half of every weight, of its gradient, of its momentum.
    whole = row["parameters"] * 8   # float64
    for key in ("param_bytes_per_rank", "grad_bytes_per_rank", "optimizer_bytes_per_rank"):
        assert whole / 2 <= row[key] < whole / 2 * 1.1, (key, row[key], whole)
    if row["device"] == "cpu":   # GPU figures only
        assert row["max_memory_allocated"] is None and row["max_memory_reserved"] is None
    # The sharded checkpoint: one file of shards per rank, and DCP's plan.
    folder = out / SHARDED_CHECKPOINT
    assert sorted(p.name for p in folder.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert (folder / ".metadata").exists()
    # The whole model, for one process without a process group: plain tensors, as unsharded.
    state = checkpoint("ch11-fsdp")
    from ddp_scripts.models import build_model
    model = build_model("cnn", dtype=torch.float64)
    model.load_state_dict(state["model"])   # strict: every name and shape
    torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9).load_state_dict(state["optimizer"])
    assert all(type(t) is torch.Tensor for t in state["model"].values())


def test_a_sharded_run_resumed_on_fewer_ranks_equals_an_uninterrupted_one():
    """Saved by 2 ranks after epoch 1, resumed on 1: the 4-rank run's model, to rounding."""
    output = output_of("11_fsdp", "ch11-06")
    assert "resuming after epoch 1" in output and "saved by 2 rank(s), loaded by 1" in output, output
    rows = metrics_rows(built_run("ch11-two-then-one"), strict=True)
    assert [(r["epoch"], r["world_size"]) for r in rows] == [(1, 2), (2, 1)]
    assert rows[0]["global_batch_size"] == rows[1]["global_batch_size"]
    resumed, straight = checkpoint("ch11-two-then-one"), checkpoint("ch11-four")
    assert resumed["epoch"] == straight["epoch"] == 2
    assert max_difference(resumed["model"], straight["model"]) < 1e-12
    assert max_difference(momentum_buffers(resumed), momentum_buffers(straight)) < 1e-12


def test_the_memory_calculator_equals_what_every_rank_held():
    """Chapter 11's memory run on 4 ranks: memory_plan.py's prediction, part by part, as the
    chapter prints it."""
    from notebooks.fsdp_memory import MEASURED, plan_for, read_run
    measured, settings = read_run(built_run("ch11-memory") / "memory.jsonl")
    planned = plan_for(settings)
    assert settings["world_size"] == 4 and len(measured) == 1 + 3 * 4
    for (strategy, rank), record in measured.items():
        for part in MEASURED:
            assert record[part] == planned[strategy][rank][part], (strategy, rank, part)
    output = output_of("11_fsdp", "ch11-mem-run")
    assert "every part equal to the byte on every rank: True" in output, output


def test_every_ranks_predicted_peak_is_the_one_torchs_tracker_saw():
    """Chapter 11's peaks, as it prints them: memory_plan.peak_plan's, for every strategy and
    rank, equal to the byte to MemTracker's and FSDPMemTracker's in fake mode, and each
    block's forward too; the gloo run beside it held what fake mode held, or on an FSDP rank at
    most gloo's clone more."""
    from notebooks.fsdp_memory import plan_for, read_peaks, read_run
    from ddp_scripts.fit.memory_plan import peak_plan
    _, settings = read_run(built_run("ch11-memory") / "memory.jsonl")
    gloo = read_peaks(built_run("ch11-memory") / "peaks.jsonl")
    assert settings["world_size"] == 4 and len(gloo) == 1 + 4 * 4
    output = output_of("11_fsdp", "ch11-peak-check")
    rows = 1 + 4 * settings["world_size"]
    assert f"{rows} of {rows} rows equal to the byte; the largest gap 0 B" in output, output
    points = settings["world_size"] * settings["depth"]
    assert f"{points} of {points} points equal to the tracker's peak there" in output, output
    assert f"{rows} within what gloo may add" in output, output
    assert "a rule is missing or wrong" not in output, output
    # what the gloo ranks held, against the same prediction: at most gloo's clone beyond
    predicted = plan_for(settings, peak_plan)
    for (strategy, rank), record in gloo.items():
        beyond = record["tracked_peak"] - predicted[strategy][rank]["peak"]
        assert 0 <= beyond <= predicted[strategy][rank].get("gloo clone", 0), (strategy, rank)


def test_the_calculators_cases_are_each_checked_in_fake_mode():
    """Chapter 11's three calculator cases: every row tracked equals the prediction, the
    14.6 GB-per-rank one included, and activations dominate the second."""
    output = output_of("11_fsdp", "ch11-mem-form")
    assert output.count("equal to the byte") == 3, output
    assert "17 of 17 rows equal to the byte" in output, output
    assert "9 of 9 rows equal to the byte" in output, output
    lines = [line for line in output.splitlines() if "tracked in fake mode" in line]
    assert "(one process; FSDP): 9 of 9 rows" in lines[2], lines
    share = int(lines[1].split("per rank, ")[1].split("%")[0])
    assert share > 50, lines[1]


# The whole build ------------------------------------------------------------------------------
def test_the_build_left_no_process_behind():
    """Every run a chapter started, failed, killed or timed out included, has ended."""
    for copy in (BUILT_SOURCES, BUILT_SOURCES.with_name(BUILT_SOURCES.name + "-zh")):
        assert processes_mentioning(f"{copy}/") == [], copy
