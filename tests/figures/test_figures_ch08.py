"""Chapter 8's figures, fed their runs' data: the hang drawn from the JSON lines the ranks of
ddp_scripts/mistakes/rank_dependent_collective.py wrote, and DistributedSampler's padding."""
import json
import os

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from ddp_scripts.launcher import LaunchError, run_command, torchrun_command
from notebooks import chapter_tools, timeline_figures
from helpers import sampler_orders

TIMEOUT_S = 2


@pytest.fixture(scope="module")
def hang_run(tmp_path_factory):
    """The hang's events folder, and every line the run printed."""
    out, lines = tmp_path_factory.mktemp("ch08-hang"), []
    with pytest.raises(LaunchError):
        run_command(torchrun_command("mistakes/rank_dependent_collective.py", 2,
                                     ["--timeout-s", str(TIMEOUT_S), "--events", str(out)]),
                    timeout=300, env={"OMP_NUM_THREADS": "1"}, echo=lines.append)
    return out, lines


@pytest.fixture(scope="module")
def hang(hang_run):
    return hang_run[0]



def test_each_rank_recorded_its_arrival_and_the_timeout_that_ended_its_wait(hang):
    events = timeline_figures.hang_events(hang)
    assert list(events) == [0, 1]
    for rank, records in events.items():
        assert records[0]["event"] == "joined" and records[0]["timeout_s"] == TIMEOUT_S
        arrived = records[1]
        assert (arrived["event"], arrived["collective"]) == \
            ("reached", "all_reduce" if rank == 0 else "barrier")
    # Rank 0 (never answered) fails with gloo's timeout; rank 1 either times out too or sees
    # rank 0's connection close first, or torchrun stops it before it writes again.
    failed = events[0][2]
    assert failed["event"] == "failed" and "Timed out" in failed["error"], failed
    assert failed["time_s"] - events[0][1]["time_s"] >= TIMEOUT_S
    assert all(r["event"] != "left" for records in events.values() for r in records)


def test_the_hang_timeline_draws_each_wait_from_arrival_to_its_end(hang, axes):
    events = timeline_figures.hang_events(hang)
    drawn = timeline_figures.draw_hang(axes, hang)
    origin = min(r["time_s"] for records in events.values() for r in records)
    start, width, kind = drawn["bars"]["rank 0"][0]
    assert kind == "waits in all_reduce"
    assert start == pytest.approx(events[0][1]["time_s"] - origin)
    assert start + width == pytest.approx(events[0][2]["time_s"] - origin)
    assert drawn["ends"]["rank 0"][1] == "failed"
    assert drawn["bars"]["rank 1"][0][2] == "waits in barrier"
    assert drawn["timeout_s"] == TIMEOUT_S
    assert [t.get_text() for t in axes.get_yticklabels()] == ["rank 0", "rank 1"]


def test_a_rank_with_no_record_after_its_arrival_waits_until_the_last_record(tmp_path, axes):
    (tmp_path / "rank0.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"rank": 0, "event": "joined", "time_s": 10.0, "timeout_s": 5},
        {"rank": 0, "collective": "all_reduce", "event": "reached", "time_s": 10.5}]))
    (tmp_path / "rank1.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"rank": 1, "event": "joined", "time_s": 10.0, "timeout_s": 5},
        {"rank": 1, "collective": "barrier", "event": "reached", "time_s": 11.0},
        {"rank": 1, "collective": "barrier", "event": "failed", "time_s": 16.0, "error": "x"}]))
    rows, ends, timeout_s = timeline_figures.hang_rows(timeline_figures.hang_events(tmp_path))
    assert rows == {"rank 0": [(0.5, 6.0, "waits in all_reduce")],
                    "rank 1": [(1.0, 6.0, "waits in barrier")]}
    assert ends == {"rank 0": (6.0, "no record"), "rank 1": (6.0, "failed")}
    assert timeout_s == 5


@pytest.mark.parametrize("samples, world", [(10, 8), (1001, 8), (12, 4)])
def test_the_padding_grid_writes_what_the_sampler_gives_each_rank(samples, world, axes):
    from torch.utils.data.distributed import DistributedSampler
    correct = torch.arange(samples) % 3 == 0
    drawn = timeline_figures.draw_padding(axes, samples, world, correct)
    shares = [list(DistributedSampler(range(samples), num_replicas=world, rank=r, shuffle=False))
              for r in range(world)]
    assert drawn["texts"] == [[str(i) for i in share] for share in shares]
    outlined = sum(1 for patch in axes.patches if patch.get_linewidth() == 3)
    assert outlined == sum(len(s) for s in shares) - samples
    scored = torch.tensor([i for share in shares for i in share])
    assert drawn["accuracy"] == pytest.approx((correct[scored].float().mean().item(),
                                               correct.float().mean().item()))


# The hang's count: each rank once, from its own record ------------------------------------
def records(rank, collective, error=None):
    ended = ([{"rank": rank, "collective": collective, "event": "failed", "time_s": 14.0,
               "error": error}] if error else [])
    return [{"rank": rank, "event": "joined", "time_s": 10.0, "timeout_s": 3},
            {"rank": rank, "collective": collective, "event": "reached", "time_s": 11.0}, *ended]


TIMED_OUT = ("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
             "3000ms for recv operation to complete")
CLOSED = "[../third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:9115"


def test_planted_one_timeout_printed_twice_counts_one_rank():
    """The build's run: rank 1 timed out (its traceback and torchrun's copy: two lines of the
    output), rank 0 saw its connection close."""
    events = {0: records(0, "all_reduce", CLOSED), 1: records(1, "barrier", TIMED_OUT)}
    assert timeline_figures.hang_outcome(events) == (
        "1 of 2 ranks timed out (rank 1 in barrier); rank 0 saw its peer's connection close in "
        "all_reduce")


def test_right_case_both_ranks_timed_out():
    events = {0: records(0, "all_reduce", TIMED_OUT), 1: records(1, "barrier", TIMED_OUT)}
    assert timeline_figures.hang_outcome(events) == (
        "2 of 2 ranks timed out (rank 0 in all_reduce, rank 1 in barrier)")
    events[1] = records(1, "barrier")   # torchrun ended it before it wrote again
    assert timeline_figures.hang_outcome(events).endswith(
        "rank 1 was still waiting when torchrun ended it in barrier")


def test_the_hang_run_counts_the_ranks_whose_own_traceback_says_timed_out(hang_run):
    out, lines = hang_run
    tracebacks = {line.split("]")[0] for line in lines
                  if line.startswith("[rank") and "RuntimeError: " in line and "Timed out" in line}
    copies = [line for line in lines if "Timed out" in line]
    assert len(copies) > len(tracebacks)   # the output repeats each: lines are not ranks
    counted = int(timeline_figures.hang_outcome(timeline_figures.hang_events(out)).split()[0])
    assert counted == len(tracebacks) >= 1


def test_torchruns_summary_keeps_each_ranks_last_line_and_its_root_cause(hang_run):
    _, lines = hang_run
    own, box = chapter_tools.torchrun_summary(lines)
    assert own > 5 and box[0].startswith("=====") and box[-1].startswith("=====")
    assert box[1].endswith("rank_dependent_collective.py FAILED")
    assert "Failures:" in box and "Root Cause (first observed failure):" in box
    # every rank's block: its error's last line kept, the frames between counted
    errors = [line for line in box if line.startswith("  RuntimeError: ")]
    left_out = [line for line in box if "lines of the rank's traceback left out" in line]
    assert len(errors) == len(left_out) == len([line for line in box
                                                if "traceback : Traceback" in line])
    assert chapter_tools.torchrun_summary(["[rank 0] done"]) == (0, [])


# What the survivor of a killed rank reported: its error file, read from torchrun's --log-dir --
def an_attempt(log_dir, attempt, files):
    """torchrun's folders for one attempt of two ranks, with the error files `files` {rank:
    error} written by the scripts' own writer."""
    from ddp_scripts.runfiles import write_error_file
    for rank in (0, 1):
        folder = log_dir / "run_x" / f"attempt_{attempt}" / str(rank)
        folder.mkdir(parents=True)
        if rank in files:
            os.environ["TORCHELASTIC_ERROR_FILE"] = str(folder / "error.json")
            try:
                write_error_file(files[rank], exit_code=1, rank=rank, with_stack=False,
                                 lost_peer=True)
            finally:
                del os.environ["TORCHELASTIC_ERROR_FILE"]


def test_planted_a_survivor_that_said_why_in_one_line_is_quoted(tmp_path):
    """The build's case: rank 0 wrote one line, no traceback, and the page said 'nothing'."""
    from ddp_scripts.mishaps import peer_lost
    an_attempt(tmp_path, 0, {0: peer_lost(RuntimeError(CLOSED))})
    an_attempt(tmp_path, 1, {})
    said = chapter_tools.what_a_rank_reported(tmp_path, rank=0, attempt=0)
    assert said.startswith("rank 0's error file in attempt 0 (it lost its peer): another rank "
                           "ended first (RuntimeError: [../third_party/gloo"), said


def test_right_case_a_survivor_without_an_error_file_is_said_to_have_none(tmp_path):
    an_attempt(tmp_path, 0, {})
    said = chapter_tools.what_a_rank_reported(tmp_path, rank=0, attempt=0)
    assert said.startswith("rank 0 wrote no error file in attempt 0"), said


# CUDA_VISIBLE_DEVICES and OMP_NUM_THREADS set before torch starts, and after (122a31f6).

HIDDEN = {"gpus": 0, "usable": False, "threads": 1}   # the child that set both in time


def test_planted_a_late_setting_that_took_effect_is_not_called_too_late():
    took_effect = {"gpus": 0, "usable": False, "threads": 1}
    said = chapter_tools.late_setting_paragraph(HIDDEN, took_effect, 2)
    assert said == ("The first child saw no GPU. The second counted 0 and found CUDA unusable: "
                    "its setting took effect, although CUDA had started before it.")


def test_planted_a_thread_count_the_late_setting_changed_does_not_show_the_trap():
    said = chapter_tools.late_setting_paragraph(HIDDEN, {**HIDDEN, "threads": 1}, 0)
    assert "Both children run 1 thread(s), so the thread counts do not show the trap" in said
    assert "show the trap:" not in said


def test_planted_a_first_child_that_still_saw_a_gpu_is_said_to():
    said = chapter_tools.late_setting_paragraph({"gpus": 1, "usable": True, "threads": 1},
                                                {"gpus": 0, "usable": True, "threads": 4}, 1)
    assert said.startswith("The first child still saw 1 GPU(s) (CUDA usable: True).")


def test_right_case_a_count_through_nvml_confirms_a_change_that_did_not_happen():
    said = chapter_tools.late_setting_paragraph(HIDDEN, {"gpus": 0, "usable": True,
                                                         "threads": 16}, 1)
    assert said.startswith("The first child saw no GPU. The second counted 0 GPU(s), yet CUDA "
                           "was still usable there, with all 1 GPU(s)")
    assert said.endswith("The count confirms a change that did not happen.")
    said = chapter_tools.late_setting_paragraph(HIDDEN, {"gpus": 2, "usable": True,
                                                         "threads": 16}, 2)
    assert said.endswith("The second counted 2 and found CUDA usable (True): its setting came "
                         "too late.")


def test_right_case_the_late_child_keeps_the_default_threads():
    """The chapter's two children, run here: on a machine without a GPU, the thread counts
    show the trap (the default is one thread per core, so it takes two cores to see it)."""
    import subprocess
    import sys
    if (os.cpu_count() or 1) < 2 or torch.cuda.is_available():
        pytest.skip("needs two cores and no GPU: the case the paragraph reads from threads")
    report = ('print(json.dumps({"gpus": torch.cuda.device_count(), '
              '"usable": torch.cuda.is_available(), "threads": torch.get_num_threads()}))')
    before = ('import json, os\nos.environ["CUDA_VISIBLE_DEVICES"] = ""\n'
              'os.environ["OMP_NUM_THREADS"] = "1"\nimport torch\n' + report)
    late = ('import json, os, torch\ntorch.cuda.is_available()\n'
            'os.environ["CUDA_VISIBLE_DEVICES"] = ""\nos.environ["OMP_NUM_THREADS"] = "1"\n'
            + report)
    clean = {k: v for k, v in os.environ.items()
             if k not in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")}
    # every core: pytest-xdist's workers are pinned to a share of them (tests/conftest.py),
    # which the children would inherit, and torch's default is a thread per usable core
    every_core = (lambda: os.sched_setaffinity(0, range(os.cpu_count()))) \
        if hasattr(os, "sched_setaffinity") else None
    seen = [json.loads(subprocess.run([sys.executable, "-c", program], capture_output=True,
                                      text=True, env=clean, timeout=300,
                                      preexec_fn=every_core).stdout.splitlines()[-1])
            for program in (before, late)]
    assert chapter_tools.late_setting_paragraph(*seen, 0) == (
        "No GPU here, so both children count 0 GPUs and neither finds CUDA usable. The thread "
        "counts show the trap: asked for before torch started, one thread; asked for "
        "afterwards, the default. On a GPU machine the second child can still use every GPU, "
        "although device_count() may count none: before the first CUDA tensor this version of "
        "torch counts through NVML, which reads the variable again.")


# A GPU checkpoint loaded where every GPU is hidden (78f67927): the error, or what loaded.

def loading_child(path, map_location=None):
    import subprocess
    import sys
    where = f", map_location={map_location!r}" if map_location else ""
    program = (f"import torch; torch.load({str(path)!r}, weights_only=True{where}); "
               "print(torch.cuda.is_available())")
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, timeout=300)


def test_planted_a_child_that_loaded_the_file_is_not_reported_as_an_error(tmp_path):
    torch.save({"weight": torch.ones(2)}, tmp_path / "on-the-cpu.pt")   # nothing to put on a GPU
    assert chapter_tools.load_outcome(loading_child(tmp_path / "on-the-cpu.pt")) == (
        "no error: the child loaded it; torch.cuda.is_available() there: False")
    import subprocess
    warned = subprocess.CompletedProcess([], 0, "True\n", "UserWarning: a warning, no error\n")
    assert chapter_tools.load_outcome(warned) == (
        "no error: the child loaded it; torch.cuda.is_available() there: True")


def test_right_case_a_child_without_cuda_says_why_it_cannot_load(tmp_path):
    torch.save({"weight": torch.ones(2)}, tmp_path / "checkpoint.pt")
    said = chapter_tools.load_outcome(loading_child(tmp_path / "checkpoint.pt", "cuda:0"))
    assert said.startswith("RuntimeError: Attempting to deserialize object on a CUDA device"), said


# set_epoch forgotten (510f1c34): the orders a rank's share came in over three epochs.

def rank_0_orders(set_epoch):
    return sampler_orders(set_epoch, num_replicas=2)


def test_planted_set_epoch_forgotten_gives_one_distinct_order():
    assert chapter_tools.distinct_orders(rank_0_orders(set_epoch=False)) == 1


def test_planted_the_same_samples_in_another_order_count_as_two_orders():
    first = rank_0_orders(set_epoch=False)[0]
    assert chapter_tools.distinct_orders([first, first[::-1]]) == 2


def test_right_case_set_epoch_gives_three_distinct_orders():
    assert chapter_tools.distinct_orders(rank_0_orders(set_epoch=True)) == 3


# The nan stop (ch08-stops-nan): no checkpoint of the epoch that diverged.

def a_checkpoint(folder, value, epoch=1):
    from ddp_scripts.models import Net
    model = Net()
    with torch.no_grad():
        model.fc1.weight.fill_(value)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": {}, "epoch": epoch},
               folder / "checkpoint.pt")


def test_planted_a_checkpoint_of_the_diverged_epoch_is_said_to_be_written(tmp_path):
    a_checkpoint(tmp_path, float("nan"))   # a script that saved before it checked the loss
    assert chapter_tools.checkpoint_written(tmp_path) == (
        "checkpoint.pt written: True (epoch 1, every parameter finite: False)")


def test_right_case_the_diverging_run_writes_no_checkpoint(tmp_path):
    from helpers import run_in_process
    out = tmp_path / "diverging"
    result = run_in_process("train_single.py", "--dataset", "synthetic", "--train-samples", "512",
                            "--test-samples", "128", "--epochs", "2", "--device", "cpu",
                            "--lr", "1e30", "--out", out)
    assert result.returncode == 1, result.stderr
    assert chapter_tools.checkpoint_written(out) == "checkpoint.pt written: False"
    a_checkpoint(tmp_path / "finite", 0.5)
    assert chapter_tools.checkpoint_written(tmp_path / "finite").endswith("finite: True)")


# A restarted run against the uninterrupted one (ch08-killer-report), bit for bit.

def trained_checkpoint(steps=2):
    from ddp_scripts.models import Net
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(4, 3, 32, 32)).square().mean().backward()
        optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 2}


def test_planted_a_parameter_one_bit_apart_is_not_identical():
    import copy
    first, second = trained_checkpoint(), copy.deepcopy(trained_checkpoint())
    weight = second["model"]["fc1.weight"]
    weight[0, 0] = torch.nextafter(weight[0, 0], torch.tensor(1.0))
    assert chapter_tools.same_training_state(first, second) == (False, True)


def test_planted_momentum_of_a_resume_that_lost_it_differs():
    """A resume without the optimizer's state: one step of momentum where the run had two."""
    first, restarted = trained_checkpoint(steps=2), trained_checkpoint(steps=1)
    restarted["model"] = first["model"]
    assert chapter_tools.same_training_state(first, restarted) == (True, False)


def test_right_case_the_same_training_is_identical():
    assert chapter_tools.same_training_state(trained_checkpoint(), trained_checkpoint()) == (
        True, True)
