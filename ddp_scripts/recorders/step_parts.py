"""A training step taken apart: where the time of one step goes, in one process or in N.

    python ddp_scripts/recorders/step_parts.py --out runs/parts-1.json
    torchrun --standalone --nproc-per-node 2 ddp_scripts/recorders/step_parts.py --out runs/parts-2.json

Each step is timed phase by phase, after a synchronize (a no-op on the CPU) so that a phase's
clock includes its GPU work: waiting for the data, copying it to the device, forward, backward,
the optimizer. Two clocks are read at every boundary: time.monotonic (the wall, one clock for
every process of the machine) and time.thread_time (the CPU time of the thread that runs the
step), so a phase's CPU time over its wall time says how much of a core it got.
Under DDP on the CPU (gloo), a comm hook (practice/hooks.py's attach_timers) records when
each bucket's all-reduce was launched and when its future completed, and the gradient hooks
when backward computed its last gradient. Communication before that point ran while backward
computed (hidden); the rest, backward waited for (exposed). Part of it passes before the last
rank has launched the same bucket: waiting for the others. Under NCCL the future completes
once the all-reduce is queued on the GPU, not when it has run (torch.futures.Future.then's
docstring), so a CPU clock cannot split it: on GPUs the all-reduce stays inside backward,
untimed, and the file says so ("communication timed": false).
The steps of a case are cut into SPREAD_GROUPS runs of consecutive steps, as the benchmark
cuts a run into epochs; a case whose slowest group's mean step is more than the benchmark's
RELIABLE_SPREAD times its fastest's is marked unreliable.
The measured step runs from one step's start to the next; what the phases leave of it (the
loop, the timers) is reported as the remainder. Every run processes the same global batch per
step, split over the processes, so time per sample compares equal work.
Rank 0 writes one JSON file: every case's parts, per step and as means, and each rank's means.
"""
import itertools
import json
import os
import sys
import time
from pathlib import Path

if not __package__:  # run as a file, not imported: find ddp_scripts as notebooks do
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_scripts.cli import UsageError, run_cli
from ddp_scripts.devices import pick_device, set_cpu_threads, synchronize
from ddp_scripts.measure.hardware import usable_cores
from ddp_scripts.measure.benchmark import RELIABLE_SPREAD
from ddp_scripts.models import build_model
from ddp_scripts.options import ArgumentParser, count, non_negative_int, seconds
from ddp_scripts.practice.hooks import attach_timers
from ddp_scripts.ranks import init_process_group

# The cases, run one after the other in the same processes. batch_size is the global batch
# (split over the processes). Each process computes with --threads threads; by default the
# benchmark's share (set_cpu_threads: the usable cores split between the processes), so that
# processes x threads is the core count. "all cores each" gives every process all the usable
# cores instead, so that processes x threads exceeds them (and, being slow, runs fewer steps).
CASES = {
    "batch 64": {"batch_size": 64},
    "batch 8": {"batch_size": 8},
    "all cores each": {"batch_size": 64, "threads": "all", "steps": 5, "warmup": 1},
}
PHASES = ["data wait", "copy to device", "forward", "backward", "optimizer"]
PARTS = ["data wait", "copy to device", "forward", "backward compute",
         "communication not hidden", "optimizer"]
REMAINDER = "other (loop, timers)"
SPREAD_GROUPS = 4
UNTIMED = ("under NCCL the all-reduce's future completes once the all-reduce is queued on the "
           "GPU, not when it has run, so the CPU's clocks cannot split it into hidden and "
           "exposed: here it stays inside backward compute")


def threads_option(text):
    """--threads: a count, or "all" (every usable core)."""
    return text if text == "all" else count(text)


def parse_args(argv=None):
    p = ArgumentParser(description="Time each part of a training step, in 1 or N processes.")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {list(CASES)}")
    p.add_argument("--steps", type=count, default=20, help="timed steps per case")
    p.add_argument("--warmup", type=non_negative_int, default=5, help="untimed steps first")
    p.add_argument("--threads", type=threads_option, default=None,
                   help="threads per process, or 'all' (default: the usable cores split "
                        "between the processes, as the benchmark does)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--timeout-s", type=seconds, default=300)
    p.add_argument("--out", required=True, help="the JSON file rank 0 writes")
    args = p.parse_args(argv)
    args.cases = [name.strip() for name in args.cases.split(",")]
    unknown = [name for name in args.cases if name not in CASES]
    if unknown:
        raise UsageError(f"--cases: unknown case {unknown[0]!r}; choose from {', '.join(CASES)}")
    return args


def batches(batch, seed, ahead=4):
    """Synthetic CIFAR-shaped batches, made ahead and taken in turn: the loader costs as
    little as it can, so that the step's other parts show."""
    generator = torch.Generator().manual_seed(seed)
    made = [(torch.randn(batch, 3, 32, 32, generator=generator),
             torch.randint(0, 10, (batch,), generator=generator)) for _ in range(ahead)]
    return itertools.cycle(made)


def clocks():
    return time.monotonic(), time.thread_time()


def timed_steps(model, optimizer, data, device, count, events=None):
    """Run `count` steps; per step each phase's wall and CPU seconds, and the whole step's.
    events: the list attach_timers fills (DDP), or None; each step keeps its own."""
    rows, starts = [], []
    for _ in range(count):
        if events is not None:
            events.clear()
        marks = [clocks()]
        starts.append(marks[0][0])
        images, labels = next(data)
        marks.append(clocks())
        images, labels = images.to(device), labels.to(device)
        synchronize(device)
        marks.append(clocks())
        loss = F.cross_entropy(model(images), labels)
        synchronize(device)
        marks.append(clocks())
        loss.backward()  # under DDP: returns once every bucket's all-reduce has completed
        synchronize(device)
        marks.append(clocks())
        optimizer.step()
        optimizer.zero_grad()
        synchronize(device)
        marks.append(clocks())
        row = {phase: b[0] - a[0] for phase, a, b in zip(PHASES, marks, marks[1:])}
        row["cpu"] = {phase: b[1] - a[1] for phase, a, b in zip(PHASES, marks, marks[1:])}
        if events is not None:
            row["backward start"], row["backward end"] = marks[3][0], marks[4][0]
            row["last gradient"] = max(e["at"] for e in events if e["kind"] == "gradient")
            row["all-reduces"] = [[e["start"], e["end"]] for e in events
                                  if e["kind"] == "all-reduce"]
        rows.append(row)
    starts.append(time.monotonic())
    for row, a, b in zip(rows, starts, starts[1:]):
        row["step"] = b - a  # start to next start: the loop and the timers included
    return rows


def communication(row):
    """A step's all-reduce time (the union of its buckets' intervals), split at the moment
    backward computed its last gradient: {"total", "hidden" (before it), "exposed" (after)}."""
    merged = []
    for start, end in sorted(row.get("all-reduces", [])):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    cut = row.get("last gradient", 0.0)
    hidden = sum(max(0.0, min(end, cut) - start) for start, end in merged)
    exposed = sum(max(0.0, end - max(start, cut)) for start, end in merged)
    return {"total": sum(end - start for start, end in merged), "hidden": hidden,
            "exposed": exposed, "buckets": len(row.get("all-reduces", [])),
            "waiting for other ranks": row.get("waiting for other ranks", 0.0)}


def note_waiting(steps, every_rank):
    """Per step, the time this rank's all-reduces spent before the last rank had launched
    the same bucket. every_rank: each rank's steps (the same steps, the same buckets)."""
    for index, row in enumerate(steps):
        waited = 0.0
        for bucket, (start, end) in enumerate(row["all-reduces"]):
            last = max(steps_of[index]["all-reduces"][bucket][0] for steps_of in every_rank)
            waited += max(0.0, min(end, last) - start)
        row["waiting for other ranks"] = waited


def breakdown(steps):
    """The mean step split into PARTS plus the remainder, which add up to the mean step;
    the mean communication (total, hidden, exposed), and the CPU share of each phase."""
    def mean(values):
        values = list(values)
        return sum(values) / len(values)
    walls = {key: mean(row[key] for row in steps) for key in [*PHASES, "step"]}
    comm = {key: mean(communication(row)[key] for row in steps)
            for key in ("total", "hidden", "exposed", "buckets", "waiting for other ranks")}
    parts = {"data wait": walls["data wait"], "copy to device": walls["copy to device"],
             "forward": walls["forward"], "backward compute": walls["backward"] - comm["exposed"],
             "communication not hidden": comm["exposed"], "optimizer": walls["optimizer"]}
    parts[REMAINDER] = walls["step"] - sum(parts.values())
    cpu_share = {phase: mean(row["cpu"][phase] for row in steps) / walls[phase]
                 for phase in PHASES if walls[phase] > 0}
    return {"parts": parts, "step": walls["step"], "communication": comm,
            "cpu share": cpu_share}


def spread(steps, groups=SPREAD_GROUPS):
    """The slowest over the fastest mean step of `groups` runs of consecutive steps (fewer
    when there are fewer steps): the benchmark's epoch spread, on a case's steps."""
    times = [row["step"] for row in steps]
    groups = min(groups, len(times))
    cuts = [round(i * len(times) / groups) for i in range(groups + 1)]
    means = [sum(times[a:b]) / (b - a) for a, b in zip(cuts, cuts[1:])]
    return max(means) / min(means)


def part_that_grew(one, many):
    """The part (or the remainder) whose time per sample grew most from `one` to `many`:
    breakdowns of the same global batch, so per step is per sample times the batch."""
    growth = {part: many["parts"][part] - one["parts"].get(part, 0.0) for part in many["parts"]}
    name = max(growth, key=growth.get)
    return name, growth[name]


def samples_per_s(run, case):
    """A step_parts file's speed for `case`: the global batch over the mean step."""
    found = run["cases"][case]
    return found["settings"]["batch_size"] / found["step"]


def ratio_from_parts(many, one_thread, one_all, case="batch 64"):
    """The benchmark's DDP/CPU ratio, from three step_parts files: N processes (`many`), one
    process with one DDP process's threads, and one process with all of them (the benchmark's
    CPU run). What N processes gain over one with their threads, divided by what one process
    gains from the rest of the cores: {"processes gain", "threads gain", "ratio"}."""
    base = samples_per_s(one_thread, case)
    processes = samples_per_s(many, case) / base
    threads = samples_per_s(one_all, case) / base
    return {"processes gain": processes, "threads gain": threads, "ratio": processes / threads}


def run_case(name, settings, device, world_size, rank, args):
    wanted = settings.get("threads", args.threads)
    threads = set_cpu_threads(usable_cores() if wanted == "all" else wanted)
    batch = settings["batch_size"]
    if batch % world_size:
        raise UsageError(f"case {name!r}: global batch {batch} does not split over {world_size}")
    timed = min(args.steps, settings.get("steps", args.steps))
    warmup = min(args.warmup, settings.get("warmup", args.warmup))
    data = batches(batch // world_size, seed=rank)
    model = build_model("cnn").to(device)
    events = None
    split = world_size > 1 and device.type != "cuda"  # see UNTIMED
    if world_size > 1:
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if split:
        events = []
        attach_timers(model, time.monotonic, events.append)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    timed_steps(model, optimizer, data, device, warmup, events)
    steps = timed_steps(model, optimizer, data, device, timed, events)
    every_rank = None
    if split:
        every_rank = [None] * world_size
        dist.all_gather_object(every_rank, [{"all-reduces": row["all-reduces"]} for row in steps])
        note_waiting(steps, every_rank)
    result = {"settings": {**settings, "batch_per_process": batch // world_size,
                           "threads_per_process": threads},
              **breakdown(steps), "steps": steps, "spread": spread(steps),
              "communication timed": split or world_size == 1}
    result["reliable"] = result["spread"] <= RELIABLE_SPREAD
    if world_size > 1 and not split:
        result["communication untimed"] = UNTIMED
    if every_rank:  # per rank, per step, per bucket: [launch, end] on the machine's clock
        result["all-reduces of every rank"] = [[row["all-reduces"] for row in rank_steps]
                                               for rank_steps in every_rank]
    ranks = [breakdown(steps)]
    if world_size > 1:
        ranks = [None] * world_size
        dist.all_gather_object(ranks, breakdown(steps))
    result["ranks"] = ranks
    return result


def main(argv=None):
    args = parse_args(argv)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = pick_device(args.device, local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    if world_size > 1:
        init_process_group(device, args.timeout_s)
    cases = {name: run_case(name, CASES[name], device, world_size, rank, args)
             for name in args.cases}
    if rank == 0:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(
            {"processes": world_size, "device": str(device), "usable_cores": usable_cores(),
             "load_average": list(os.getloadavg()), "torch": torch.__version__,
             "steps": args.steps, "warmup": args.warmup, "cases": cases}, indent=1))
    if world_size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    run_cli(main)
