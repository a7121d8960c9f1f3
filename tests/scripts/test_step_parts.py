"""ddp_scripts/recorders/step_parts.py: the parts of a step add up to the measured step, the remainder is
what the timed phases leave of it, the all-reduce is timed inside backward and split into its
hidden and exposed shares (the wall clock on gloo, CUDA events under NCCL, put on the wall
clock after the step), no all-reduce ends before every rank has launched it, a case's spread
is the benchmark's, a step is put together from its measured parts, the part that grew is the
one the numbers say, and bad options are one line and exit status 2. --model times the
reader's model (an image model, a token model) as it times the book's CNN, a model that cannot
be had or refuses its sample is one line, and on GPUs each all-reduce's CUDA events give its
own time."""
import json
import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_scripts.launcher import run_command, torchrun_command
from ddp_scripts.measure.benchmark import RELIABLE_SPREAD
from ddp_scripts.models import Decoder, build_model
from ddp_scripts.practice.hooks import attach_timers
from ddp_scripts.recorders.step_parts import (COMPUTE, PARTS, PHASES, REMAINDER,
                                             all_reduce_time, batches, breakdown, communication,
                                             cuda_event, hook_clock, note_waiting, on_the_wall,
                                             part_that_grew, predicted_ratio, spread,
                                             step_from_parts, timed_steps)
from helpers import assert_one_line_error, run_in_process

QUICK = ["--steps", "4", "--warmup", "1", "--cases", "batch 8,all cores each"]
RESNET = ["--model", "torchvision.models:resnet18", "--input-shape", "3,32,32"]
DECODER = ["--model", "ddp_scripts.models:Decoder", "--input-dtype", "long", "--input-shape", "32"]


def check_adds_up(case):
    steps, parts = case["steps"], case["parts"]
    assert list(parts) == [*PARTS, REMAINDER]
    assert sum(parts.values()) == pytest.approx(case["step"], rel=1e-12, abs=1e-12)
    for row in steps:  # each step runs from its start to the next: the phases fit inside it
        assert row["step"] >= sum(row[phase] for phase in PHASES)
        assert set(row["cpu"]) == set(PHASES) and all(t >= 0 for t in row["cpu"].values())
    # The remainder is exactly the mean of what the phases leave of each step.
    left = sum(row["step"] - sum(row[phase] for phase in PHASES) for row in steps) / len(steps)
    assert parts[REMAINDER] == pytest.approx(left, rel=1e-9, abs=1e-12)
    assert case["spread"] == spread(steps) >= 1
    assert case["reliable"] == (case["spread"] <= RELIABLE_SPREAD)
    backward = sum(row["backward"] for row in steps) / len(steps)
    assert parts["backward compute"] + parts["communication not hidden"] == pytest.approx(backward)


def test_one_process_parts_add_up_to_the_step(tmp_path):
    result = run_in_process("recorders/step_parts.py", *QUICK, "--threads", "1", "--out",
                            tmp_path / "one.json")
    assert result.returncode == 0, result.stderr
    run = json.loads((tmp_path / "one.json").read_text())
    assert run["processes"] == 1 and list(run["cases"]) == ["batch 8", "all cores each"]
    for case in run["cases"].values():
        check_adds_up(case)
        assert case["parts"]["communication not hidden"] == 0
        assert case["communication"]["total"] == 0 and "all-reduces" not in case["steps"][0]
    assert run["cases"]["batch 8"]["settings"]["threads_per_process"] == 1
    assert run["cases"]["all cores each"]["settings"]["threads_per_process"] == run["usable_cores"]


def early_ends(every_rank):
    """(rank, step, bucket) of each all-reduce whose end came before some rank's launch of
    the same bucket: an all-reduce cannot have finished before every rank contributed."""
    found = []
    for rank, steps in enumerate(every_rank):
        for index, buckets in enumerate(steps):
            for bucket, (_, end) in enumerate(buckets):
                last = max(other[index][bucket][0] for other in every_rank)
                if end < last:
                    found.append((rank, index, bucket))
    return found


def test_two_processes_time_the_all_reduce_inside_backward(tmp_path):
    out = tmp_path / "two.json"
    run_command(torchrun_command("recorders/step_parts.py", 2, [*QUICK, "--out", str(out)]),
                timeout=300, progress=False, echo=lambda line: None)
    run = json.loads(out.read_text())
    assert run["processes"] == 2
    for case in run["cases"].values():
        check_adds_up(case)
        assert case["all-reduce clock"] == "wall"
        every_rank = case["all-reduces of every rank"]
        assert every_rank[0] == [row["all-reduces"] for row in case["steps"]]
        assert len(every_rank) == 2 and not early_ends(every_rank)
        # A timer that stamped the end at launch (as a future completed at enqueue would)
        # fails it: one of the two ranks launched each bucket first.
        stamped_at_launch = [[[[start, start] for start, _ in buckets] for buckets in steps]
                             for steps in every_rank]
        buckets = sum(len(row["all-reduces"]) for row in case["steps"])
        assert len(early_ends(stamped_at_launch)) == buckets
        assert case["settings"]["batch_per_process"] * 2 == case["settings"]["batch_size"]
        assert len(case["ranks"]) == 2
        assert case["ranks"][0] == breakdown(case["steps"])
        for row in case["steps"]:
            assert row["all-reduces"], "every DDP step all-reduces"
            for start, end in row["all-reduces"]:  # launched in backward, waited for by it
                assert row["backward start"] <= start <= end <= row["backward end"]
            assert row["backward start"] <= row["last gradient"] <= row["backward end"]
            comm = communication(row)
            assert comm["hidden"] + comm["exposed"] == pytest.approx(comm["total"])
            assert 0 <= row["waiting for other ranks"] <= comm["total"] + 1e-12
            assert 0 <= row["waiting not hidden"] <= min(row["waiting for other ranks"],
                                                         comm["exposed"]) + 1e-12
        exposed = sum(communication(row)["exposed"] for row in case["steps"]) / len(case["steps"])
        assert case["parts"]["communication not hidden"] == pytest.approx(exposed)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs: nccl, one rank each")
def test_two_processes_on_two_gpus(tmp_path):
    # Each rank on its own GPU: init_process_group sets the device before the group's first
    # collective, which stages its bytes on the current device.
    out = tmp_path / "two.json"
    run_command(torchrun_command("recorders/step_parts.py", 2, [*QUICK, "--device", "cuda", "--out",
                                                      str(out)]),
                timeout=300, progress=False, echo=lambda line: None)
    run = json.loads(out.read_text())
    assert run["device"] == "cuda:0"
    for case in run["cases"].values():
        check_adds_up(case)
        # Under NCCL the hooks read CUDA events: the all-reduce is timed apart from backward.
        # Each rank puts its events on the wall clock from its own origin, a few microseconds
        # apart: an end may seem that much before another rank's launch, not more.
        assert case["all-reduce clock"] == "CUDA events"
        every_rank = case["all-reduces of every rank"]
        shifted = [[[[start - 1e-4, end] for start, end in buckets] for buckets in steps]
                   for steps in every_rank]
        assert not early_ends(shifted)
        for row in case["steps"]:
            assert row["all-reduces"] and communication(row)["total"] > 0
            for start, end in row["all-reduces"]:
                assert row["backward start"] <= start <= end <= row["backward end"] + 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs: nccl, one rank each")
def test_a_readers_model_on_two_gpus_times_each_all_reduce_with_its_cuda_events(tmp_path):
    out = tmp_path / "two.json"
    options = [*RESNET, "--steps", "4", "--warmup", "1", "--cases", "batch 8", "--device", "cuda"]
    run_command(torchrun_command("recorders/step_parts.py", 2, [*options, "--out", str(out)]),
                timeout=300, progress=False, echo=lambda line: None)
    case = json.loads(out.read_text())["cases"]["batch 8"]
    check_adds_up(case)  # loss_on made its labels on the GPU
    assert case["all-reduce clock"] == "CUDA events"
    # Each step's sum of its buckets' event pairs, read before they went on the wall clock,
    # is the sum of the same intervals on it (to the events' half-microsecond resolution).
    for row in case["steps"]:
        on_wall = sum(end - start for start, end in row["all-reduces"])
        assert row["all-reduce time"] == pytest.approx(on_wall, abs=1e-5) and on_wall > 0
    mean = sum(row["all-reduce time"] for row in case["steps"]) / len(case["steps"])
    assert case["all-reduce time per step"] == pytest.approx(mean)


class ReadingOfAGpu:
    """A stand-in for a CUDA event on a CPU: it reads the wall clock when it is made, plus a
    fixed lag (the GPU reaches a point of its queue after Python queued it)."""
    lag = 0.002

    def __init__(self):
        self.at = time.monotonic() + self.lag

    def elapsed_time(self, end):
        return (end.at - self.at) * 1e3


def test_right_case_gpu_readings_go_on_the_wall_clock_from_the_origin():
    origin, gradient, launched, ended = ReadingOfAGpu(), ReadingOfAGpu(), ReadingOfAGpu(), \
        ReadingOfAGpu()
    origin.at, gradient.at, launched.at, ended.at = 50.0, 50.004, 50.004, 50.007
    events = [{"kind": "gradient", "name": "w", "at": gradient},
              {"kind": "all-reduce", "bucket": 0, "start": launched, "end": ended}]
    on_the_wall(events, origin, 10.0)
    assert events[0]["at"] == pytest.approx(10.004)
    assert [events[1]["start"], events[1]["end"]] == [pytest.approx(10.004), pytest.approx(10.007)]
    comm = communication({"all-reduces": [[events[1]["start"], events[1]["end"]]],
                          "last gradient": events[0]["at"]})
    assert comm["exposed"] == pytest.approx(0.003) and comm["hidden"] == pytest.approx(0)


def test_the_hooks_read_cuda_events_on_a_gpu_and_the_wall_clock_on_the_cpu():
    assert hook_clock(torch.device("cuda", 0)) is cuda_event
    assert hook_clock(torch.device("cpu")) is None


def test_right_case_the_gpu_path_on_a_cpu_times_the_all_reduce_apart_from_backward():
    """The GPU path, on a CPU: DDP of one rank (gloo) whose hooks read ReadingOfAGpu, as they
    read CUDA events on a GPU. Put on the wall clock, each all-reduce lies inside its backward,
    after the last gradient (one bucket), and its exposed time is taken out of backward
    compute. (A clock read when the all-reduce is queued, as NCCL's future completes, ends it
    before the last rank launched it: test_two_processes_time_the_all_reduce_inside_backward
    plants that.)"""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = DDP(build_model("cnn"))
        events = []
        attach_timers(model, ReadingOfAGpu, events.append)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        steps = timed_steps(model, optimizer, batches(8, seed=0), torch.device("cpu"), 3,
                            events, ReadingOfAGpu)
        for row in steps:
            (start, end), = row["all-reduces"]
            assert row["backward start"] <= row["last gradient"] <= start <= end \
                <= row["backward end"]
            # The readings' own time (elapsed_time), the same as on the wall clock.
            assert row["all-reduce time"] == pytest.approx(end - start) and end > start
        note_waiting(steps, [steps])
        parts = breakdown(steps)["parts"]
        exposed = sum(communication(row)["exposed"] for row in steps) / len(steps)
        assert exposed > 0 and parts["communication not hidden"] == pytest.approx(exposed)
    finally:
        dist.destroy_process_group()


def test_the_all_reduce_time_sums_each_buckets_readings():
    def reading(at):
        made = ReadingOfAGpu()
        made.at = at
        return made
    events = [{"kind": "gradient", "at": reading(0.5)},
              {"kind": "all-reduce", "start": reading(1.0), "end": reading(3.0)},
              {"kind": "all-reduce", "start": reading(2.0), "end": reading(4.0)}]
    # 2 s and 2 s: the second bucket's wait behind the first counts, unlike in the union (3 s).
    assert all_reduce_time(events) == pytest.approx(4.0)
    assert all_reduce_time(events[:1]) == 0


def test_hidden_and_exposed_split_at_the_last_gradient():
    # Two buckets: one from 1 to 3 (before the last gradient at 2.5: 1.5 hidden, 0.5 exposed),
    # one from 2.8 to 4 overlapping the first; the union is 1 to 4.
    row = {"all-reduces": [[2.8, 4.0], [1.0, 3.0]], "last gradient": 2.5}
    comm = communication(row)
    assert comm["total"] == pytest.approx(3.0)
    assert comm["hidden"] == pytest.approx(1.5) and comm["exposed"] == pytest.approx(1.5)
    assert comm["buckets"] == 2
    assert communication({"all-reduces": [[3.0, 4.0]], "last gradient": 3.0})["hidden"] == 0


def test_a_cases_spread_is_its_slowest_group_of_steps_over_its_fastest():
    steps = [{"step": t} for t in [1, 1, 2, 2, 1, 3, 4, 4]]  # groups of 2: 1, 2, 2, 4
    assert spread(steps) == pytest.approx(4.0)
    assert spread(steps[:3]) == pytest.approx(2.0)  # fewer steps than groups: one per group
    assert spread([{"step": 0.5}] * 8) == 1.0


def test_waiting_is_split_at_the_last_gradient_and_counted_once():
    # Two buckets of rank 0, launched at 1.0 and 2.8; rank 1 launched them at 2.0 and 3.5.
    # Rank 0 waited 1.0-2.0 and 2.8-3.5 (one union); after the last gradient (2.5), 0.7.
    mine = [{"all-reduces": [[1.0, 3.0], [2.8, 4.0]], "last gradient": 2.5}]
    other = [{"all-reduces": [[2.0, 3.0], [3.5, 4.0]]}]
    note_waiting(mine, [mine, other])
    assert mine[0]["waiting for other ranks"] == pytest.approx(1.7)
    assert mine[0]["waiting not hidden"] == pytest.approx(0.7)
    # Overlapping waits are one wait, not two.
    both = [{"all-reduces": [[1.0, 3.0], [1.0, 3.0]], "last gradient": 0.0}]
    note_waiting(both, [both, [{"all-reduces": [[2.0, 3.0], [2.0, 3.0]]}]])
    assert both[0]["waiting for other ranks"] == pytest.approx(1.0)


def test_a_step_is_put_together_from_its_measured_parts():
    def found(forward, exposed=0.0, waiting=0.0, batch=64, remainder=0.0005):
        parts = {part: 0.001 for part in COMPUTE}
        parts.update({"forward": forward, "communication not hidden": exposed,
                      REMAINDER: remainder})
        return {"settings": {"batch_size": batch}, "parts": parts,
                "communication": {"waiting not hidden": waiting}}
    many = found(0.003, exposed=0.004, waiting=0.001)
    assert step_from_parts(many) == {"compute": pytest.approx(0.007),
                                     "waiting for the other ranks": 0.001,
                                     "all-reduce not hidden": pytest.approx(0.003)}
    one = found(0.005)
    got = predicted_ratio({"cases": {"batch 64": many}}, {"cases": {"batch 64": one}})
    # The remainder (loop, timers) is no measured part: it is left out of both steps.
    assert got["ratio"] == pytest.approx(0.009 / 0.011)
    assert got["one"]["waiting for the other ranks"] == 0
    with pytest.raises(ValueError, match="global batches differ"):
        predicted_ratio({"cases": {"batch 64": many}}, {"cases": {"batch 64": found(0.005, batch=32)}})


def test_the_part_that_grew_is_named_from_the_numbers():
    def made(**parts):
        full = {part: parts.get(part.split()[0], 0.001) for part in [*PARTS, REMAINDER]}
        return {"parts": full, "step": sum(full.values())}
    one = made(forward=0.002)
    assert part_that_grew(one, made(forward=0.002, communication=0.004)) == \
        ("communication not hidden", pytest.approx(0.003))
    assert part_that_grew(one, made(forward=0.005))[0] == "forward"
    assert part_that_grew(one, made(data=0.009))[0] == "data wait"


@pytest.mark.parametrize("args, fragment", [
    (["--steps", "0"], "--steps must be at least 1"),
    (["--cases", "batch 9"], "unknown case 'batch 9'"),
    (["--warmup", "-1"], "--warmup must be 0 or more"),
    (["--threads", "0"], "--threads must be at least 1"),
    ([], "--out"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path, args, fragment):
    if args:
        args = [*args, "--out", tmp_path / "x.json"]
    result = run_in_process("recorders/step_parts.py", *args)
    assert_one_line_error(result, fragment)
    assert not (tmp_path / "x.json").exists()


def model_parameters(options):
    if "ddp_scripts.models:Decoder" in options:
        return sum(p.numel() for p in Decoder().parameters())
    import torchvision
    return sum(p.numel() for p in torchvision.models.resnet18().parameters())


@pytest.mark.parametrize("options, processes", [(RESNET, 1), (RESNET, 2), (DECODER, 1),
                                                (DECODER, 2)],
                         ids=["resnet18-1", "resnet18-2", "decoder-1", "decoder-2"])
def test_a_readers_model_is_timed_as_the_cnn_is(tmp_path, options, processes):
    out = tmp_path / "model.json"
    args = [*options, "--steps", "4", "--warmup", "1", "--cases", "batch 8", "--out", str(out)]
    if processes == 1:
        result = run_in_process("recorders/step_parts.py", *args, "--threads", "1")
        assert result.returncode == 0, result.stderr
    else:
        run_command(torchrun_command("recorders/step_parts.py", 2, args), timeout=300,
                    progress=False, echo=lambda line: None)
    run = json.loads(out.read_text())
    assert run["processes"] == processes and run["model"]["spec"] == options[1]
    case = run["cases"]["batch 8"]
    check_adds_up(case)
    assert case["parameters"] == model_parameters(options)  # that model, not the CNN
    assert "all-reduce time per step" not in case  # a GPU's figure: the CPU keeps the wall's
    if processes == 2:
        assert case["all-reduce clock"] == "wall"
        assert not early_ends(case["all-reduces of every rank"])
        for row in case["steps"]:
            assert row["all-reduces"] and "all-reduce time" not in row
            comm = communication(row)
            assert comm["hidden"] + comm["exposed"] == pytest.approx(comm["total"])


@pytest.mark.parametrize("args, fragment", [
    (["--model", "no_such_module:Net", "--input-shape", "3"], "cannot import no_such_module"),
    (["--model", "ddp_scripts.models:NoSuch", "--input-shape", "3"], "no callable 'NoSuch'"),
    (["--model", "no/such/file.py:Net", "--input-shape", "3"], "no file no/such/file.py"),
    ([*RESNET[:2], "--input-shape", "5,32,32"], "refuses a sample of shape (5, 32, 32)"),
    ([*DECODER[:2], "--input-shape", "32"], "refuses a sample of shape (32,) (float32)"),
    ([*RESNET, "--kwargs", '{"no_such_argument": 1}'], "no_such_argument"),
    ([*RESNET, "--kwargs", "[1]"], "--kwargs must be a JSON object"),
    (RESNET[:2], "--model needs --input-shape"),
    ([*RESNET[:2], "--input-shape", "3,x"], "--input-shape '3,x': give one sample's sizes"),
    (["--input-shape", "3,32,32"], "--input-shape goes with --model"),
    (["--input-dtype", "long"], "--input-dtype goes with --model"),
])
def test_a_bad_model_is_one_line_and_exit_2(tmp_path, args, fragment):
    result = run_in_process("recorders/step_parts.py", *args, "--steps", "1", "--warmup", "0",
                            "--cases", "batch 8", "--out", tmp_path / "x.json")
    assert_one_line_error(result, fragment)
    assert not (tmp_path / "x.json").exists()
