"""A training step taken apart: where the time of one step goes, in one process or in N.

    python ddp_scripts/recorders/step_parts.py --out runs/parts-1.json
    torchrun --standalone --nproc-per-node 2 ddp_scripts/recorders/step_parts.py --out runs/parts-2.json
    python ddp_scripts/recorders/step_parts.py --model torchvision.models:resnet18 \
        --input-shape 3,224,224 --out runs/parts-resnet.json

--model times your own model instead of the book's CNN: package.module:callable or
file.py:callable, called with --kwargs (a JSON object), fed zeros of --input-shape (one sample's
shape) in --input-dtype (long for token models); its loss is fit/trace.py's loss_of. The
benchmark's ResNet-18 is ddp_scripts.models:cifar_resnet18 (--input-shape 3,32,32).

Each step is timed phase by phase, after a synchronize (a no-op on the CPU) so that a phase's
clock includes its GPU work: waiting for the data, copying it to the device, forward, backward,
the optimizer. Two clocks are read at every boundary: time.monotonic (the wall, one clock for
every process of the machine) and time.thread_time (the CPU time of the thread that runs the
step), so a phase's CPU time over its wall time says how much of a core it got.
Under DDP a comm hook (practice/hooks.py's attach_timers) records when each bucket's
all-reduce was launched and when it completed, and the gradient hooks when backward computed
its last gradient. Communication before that point ran while backward computed (hidden); the
rest, backward waited for (exposed). Part of it passes before the last rank has launched the
same bucket: waiting for the others. On the CPU (gloo) the hooks read the wall clock. On GPUs
(NCCL) the all-reduce's future completes once the all-reduce is queued, not when it has run
(torch.futures.Future.then's docstring), so the hooks record CUDA events instead: an event
recorded on the current stream marks when the GPU reaches that point of its queue, and the
future's callback runs on a stream that waits for the all-reduce. After the step's
synchronize, each event is put on the wall clock from one recorded as backward starts; each
bucket's pair of events also gives its all-reduce's own time, summed per step ("all-reduce time").
The steps of a case are cut into SPREAD_GROUPS runs of consecutive steps, as the benchmark
cuts a run into epochs; a case whose slowest group's mean step is more than the benchmark's
RELIABLE_SPREAD times its fastest's is marked unreliable.
The measured step runs from one step's start to the next; what the phases leave of it (the
loop, the timers) is reported as the remainder. Every run processes the same global batch per
step, split over the processes, so time per sample compares equal work. step_from_parts puts
a step together from the clocks' parts alone (compute, waiting for the other ranks, the rest
of the all-reduce not hidden), without the remainder, which no phase's clock times.
Rank 0 writes one JSON file: every case's parts, per step and as means, and each rank's means.
"""
import itertools
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_scripts.cli import UsageError, first_line, run_cli
from ddp_scripts.devices import pick_device, set_cpu_threads, synchronize
from ddp_scripts.fit.trace import INPUT_DTYPES, factory, input_shape, loss_of, parse_kwargs
from ddp_scripts.hardware import usable_cores
from ddp_scripts.measure.benchmark import RELIABLE_SPREAD
from ddp_scripts.models import build_model
from ddp_scripts.options import ArgumentParser, count, non_negative_int, seconds
from ddp_scripts.practice.hooks import attach_timers
from ddp_scripts.ranks import init_process_group, leave_process_group

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
# The parts that compute, with no other rank in them: what step_from_parts calls compute.
COMPUTE = ["data wait", "copy to device", "forward", "backward compute", "optimizer"]
SPREAD_GROUPS = 4


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
    p.add_argument("--model", help="your model instead of the book's CNN: package.module:callable "
                                   "or file.py:callable, e.g. torchvision.models:resnet18")
    p.add_argument("--kwargs", type=parse_kwargs, help="--model's keyword arguments, JSON")
    p.add_argument("--input-shape", type=input_shape, help="--model's sample, e.g. 3,224,224")
    p.add_argument("--input-dtype", choices=list(INPUT_DTYPES),
                   help="--model's input: float32 (the default), or long or int (tokens)")
    p.add_argument("--out", required=True, help="the JSON file rank 0 writes")
    args = p.parse_args(argv)
    if args.model is None:  # else the CNN would run, silently, in place of the model meant
        for option in ("kwargs", "input_shape", "input_dtype"):
            if getattr(args, option) is not None:
                raise UsageError(f"--{option.replace('_', '-')} goes with --model")
    elif args.input_shape is None:
        raise UsageError("--model needs --input-shape, one sample's shape, e.g. 3,224,224")
    args.kwargs = args.kwargs or {}
    args.input_dtype = args.input_dtype or "float32"
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


def readers_model(args, device):
    """--model, built as every process builds it (the same seed), on `device`, once fed a
    sample: a model that refuses --input-shape says so in one line before any step."""
    made = factory(args.model)
    torch.manual_seed(0)
    try:
        model = made(**args.kwargs)
    except Exception as error:  # the reader's code: any error of its, in one line
        raise UsageError(f"--model {args.model}: {first_line(error)}") from None
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"--model {args.model} made a {type(model).__name__}, not an nn.Module")
    model.to(device).eval()  # eval: BatchNorm takes a batch of one sample
    sample = torch.zeros(1, *args.input_shape, dtype=INPUT_DTYPES[args.input_dtype])
    try:
        with torch.no_grad():
            loss_on(model(sample.to(device)))
    except Exception as error:
        raise UsageError(f"--model {args.model} refuses a sample of shape {args.input_shape} "
                         f"({args.input_dtype}): {first_line(error)}") from None
    return model.train()


def loss_on(output):
    """trace.py's loss_of (cross entropy against class 0, or the sum) with its labels on the
    output's device: loss_of makes them with torch.zeros, on the default device."""
    with torch.device(output.device):
        return loss_of(output)


def clocks():
    return time.monotonic(), time.thread_time()


def cuda_event():
    """A reading of the GPU's clock, for attach_timers: a CUDA event recorded on the current
    stream. It marks when the GPU reaches this point of its queue, not when Python queued it;
    its time can be read once the GPU has passed it (after a synchronize)."""
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def hook_clock(device):
    """The clock the DDP hooks read on `device`: cuda_event on a GPU, where the all-reduce's
    future completes once the all-reduce is queued; None (the wall clock) on the CPU, where
    gloo completes it once the all-reduce has run."""
    return cuda_event if device.type == "cuda" else None


def on_the_wall(events, origin, wall):
    """Put a step's event readings (attach_timers's "at", "start", "end") on the wall clock,
    in place: `origin` was recorded at wall time `wall`, on an idle GPU (just after a
    synchronize), so a reading's wall time is `wall` plus its milliseconds after `origin`."""
    for event in events:
        for key in ("at", "start", "end"):
            if key in event:
                event[key] = wall + origin.elapsed_time(event[key]) / 1e3


def timed_steps(model, optimizer, data, device, count, events=None, gpu_clock=None):
    """Run `count` steps; per step each phase's wall and CPU seconds, and the whole step's.
    events: the list attach_timers fills (DDP), or None; each step keeps its own.
    gpu_clock: the clock the hooks read (cuda_event) when it is the GPU's, or None when
    they read the wall clock; its readings are put on the wall clock after backward."""
    rows, starts = [], []
    for _ in range(count):
        if events is not None:
            events.clear()
        marks = [clocks()]
        starts.append(marks[0][0])
        images, labels = next(data)
        marks.append(clocks())
        images = images.to(device)
        labels = None if labels is None else labels.to(device)  # None: --model's, loss_on's
        synchronize(device)
        marks.append(clocks())
        output = model(images)
        loss = loss_on(output) if labels is None else F.cross_entropy(output, labels)
        synchronize(device)
        marks.append(clocks())
        origin = gpu_clock() if gpu_clock else None  # the GPU is idle here: its queue is empty
        loss.backward()  # under DDP: returns once every bucket's all-reduce is done or queued
        synchronize(device)
        marks.append(clocks())
        gpu_time = None
        if origin is not None and events is not None:  # only with gpu_clock: CUDA on a GPU
            gpu_time = all_reduce_time(events)  # read before on_the_wall replaces the events
            on_the_wall(events, origin, marks[3][0])
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
        if gpu_time is not None:
            row["all-reduce time"] = gpu_time
        rows.append(row)
    starts.append(time.monotonic())
    for row, a, b in zip(rows, starts, starts[1:]):
        row["step"] = b - a  # start to next start: the loop and the timers included
    return rows


def all_reduce_time(events):
    """A step's all-reduces timed by their own clock readings (CUDA events on a GPU), summed, in
    seconds: each bucket's from the reading its comm hook took as it called allreduce_hook to
    the one taken in the callback of its future, on a stream that waits for the all-reduce. A
    bucket launched while the one before still runs counts its wait in line: the sum can exceed
    the union that communication() takes."""
    return sum(e["start"].elapsed_time(e["end"])
               for e in events if e["kind"] == "all-reduce") / 1e3


def union(intervals):
    """Intervals [start, end] merged where they overlap, in order."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def after(intervals, cut):
    """The time the union of `intervals` covers after the moment `cut`."""
    return sum(max(0.0, end - max(start, cut)) for start, end in union(intervals))


def communication(row):
    """A step's all-reduce time (the union of its buckets' intervals), split at the moment
    backward computed its last gradient: {"total", "hidden" (before it), "exposed" (after),
    "buckets", and the time spent before the last rank had launched the same bucket:
    "waiting for other ranks", and "waiting not hidden" (after the last gradient)}."""
    merged = union(row.get("all-reduces", []))
    cut = row.get("last gradient", 0.0)
    total = sum(end - start for start, end in merged)
    exposed = after(merged, cut)
    return {"total": total, "hidden": total - exposed, "exposed": exposed,
            "buckets": len(row.get("all-reduces", [])),
            "waiting for other ranks": row.get("waiting for other ranks", 0.0),
            "waiting not hidden": row.get("waiting not hidden", 0.0)}


def note_waiting(steps, every_rank):
    """Per step, the time this rank's all-reduces spent before the last rank had launched
    the same bucket, in all and after backward's last gradient. every_rank: each rank's
    steps (the same steps, the same buckets)."""
    for index, row in enumerate(steps):
        waits = []
        for bucket, (start, end) in enumerate(row["all-reduces"]):
            last = max(steps_of[index]["all-reduces"][bucket][0] for steps_of in every_rank)
            if last > start:
                waits.append([start, min(end, last)])
        row["waiting for other ranks"] = after(waits, float("-inf"))
        row["waiting not hidden"] = after(waits, row["last gradient"])


def groups(steps, count=SPREAD_GROUPS):
    """The steps cut into `count` runs of consecutive steps (fewer when there are fewer)."""
    count = min(count, len(steps))
    cuts = [round(i * len(steps) / count) for i in range(count + 1)]
    return [steps[a:b] for a, b in zip(cuts, cuts[1:])]


def breakdown(steps):
    """The mean step split into PARTS plus the remainder, which add up to the mean step;
    the mean communication, the CPU share of each phase (CPU time over wall time), and
    the range that share took over the SPREAD_GROUPS runs of consecutive steps."""
    def mean(values):
        values = list(values)
        return sum(values) / len(values)
    walls = {key: mean(row[key] for row in steps) for key in [*PHASES, "step"]}
    comm = {key: mean(communication(row)[key] for row in steps)
            for key in ("total", "hidden", "exposed", "buckets", "waiting for other ranks",
                        "waiting not hidden")}
    parts = {"data wait": walls["data wait"], "copy to device": walls["copy to device"],
             "forward": walls["forward"], "backward compute": walls["backward"] - comm["exposed"],
             "communication not hidden": comm["exposed"], "optimizer": walls["optimizer"]}
    parts[REMAINDER] = walls["step"] - sum(parts.values())

    def share(rows, phase):
        wall = sum(row[phase] for row in rows)
        return sum(row["cpu"][phase] for row in rows) / wall if wall > 0 else None
    cpu_share = {phase: share(steps, phase) for phase in PHASES if walls[phase] > 0}
    share_range = {}
    for phase in cpu_share:
        shares = [value for rows in groups(steps) if (value := share(rows, phase)) is not None]
        if shares:
            share_range[phase] = [min(shares), max(shares)]
    return {"parts": parts, "step": walls["step"], "communication": comm,
            "cpu share": cpu_share, "cpu share range": share_range}


def spread(steps, groups_of=SPREAD_GROUPS):
    """The slowest over the fastest mean step of `groups_of` runs of consecutive steps (fewer
    when there are fewer steps): the benchmark's epoch spread, on a case's steps."""
    means = [sum(row["step"] for row in rows) / len(rows) for rows in groups(steps, groups_of)]
    return max(means) / min(means)


def grew_most(before, after_):
    """The key of `after_` whose value grew most from `before` (a missing key counts 0),
    and by how much."""
    growth = {key: value - before.get(key, 0.0) for key, value in after_.items()}
    name = max(growth, key=growth.get)
    return name, growth[name]


def part_that_grew(one, many):
    """The part (or the remainder) whose time per sample grew most from `one` to `many`:
    breakdowns of the same global batch, so per step is per sample times the batch."""
    return grew_most(one["parts"], many["parts"])


def step_from_parts(found):
    """A case's step put together from what the clocks measured, in seconds: "compute" (the
    COMPUTE parts), "waiting for the other ranks" (the all-reduce's time before the last
    rank had launched it, that backward did not hide) and "all-reduce not hidden" (the rest
    of what backward waited for). The remainder (the loop, the timers) is left out."""
    waiting = found["communication"].get("waiting not hidden", 0.0)
    return {"compute": sum(found["parts"][part] for part in COMPUTE),
            "waiting for the other ranks": waiting,
            "all-reduce not hidden": found["parts"]["communication not hidden"] - waiting}


def samples_per_s(run, case):
    """A step_parts file's speed for `case`: the global batch over the mean step."""
    found = run["cases"][case]
    return found["settings"]["batch_size"] / found["step"]


def predicted_ratio(many, one, case="batch 64"):
    """The speed of the N-process run (`many`) over that of the one-process run (`one`),
    both with the same global batch, from their steps put together from their parts
    (step_from_parts): {"one", "many" (seconds per step, by part), "ratio"}."""
    found = one["cases"][case], many["cases"][case]
    batches_ = {f["settings"]["batch_size"] for f in found}
    if len(batches_) > 1:
        raise ValueError(f"{case}: the two runs' global batches differ ({sorted(batches_)})")
    parts = [step_from_parts(f) for f in found]
    return {"one": parts[0], "many": parts[1],
            "ratio": sum(parts[0].values()) / sum(parts[1].values())}


def run_case(name, settings, device, world_size, rank, args):
    wanted = settings.get("threads", args.threads)
    threads = set_cpu_threads(usable_cores() if wanted == "all" else wanted)
    batch = settings["batch_size"]
    if batch % world_size:
        raise UsageError(f"case {name!r}: global batch {batch} does not split over {world_size}")
    timed = min(args.steps, settings.get("steps", args.steps))
    warmup = min(args.warmup, settings.get("warmup", args.warmup))
    if args.model is None:
        data, model = batches(batch // world_size, seed=rank), build_model("cnn").to(device)
    else:  # zeros, made once: a valid token for every vocabulary; the labels are loss_on's
        shape, dtype = args.input_shape, INPUT_DTYPES[args.input_dtype]
        data = itertools.repeat((torch.zeros(batch // world_size, *shape, dtype=dtype), None))
        model = readers_model(args, device)
    events, gpu_clock = None, None
    if world_size > 1:
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        events, gpu_clock = [], hook_clock(device)
        attach_timers(model, gpu_clock or time.monotonic, events.append)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    timed_steps(model, optimizer, data, device, warmup, events, gpu_clock)
    steps = timed_steps(model, optimizer, data, device, timed, events, gpu_clock)
    every_rank = None
    if world_size > 1:
        every_rank = [None] * world_size
        dist.all_gather_object(every_rank, [{"all-reduces": row["all-reduces"]} for row in steps])
        note_waiting(steps, every_rank)
    result = {"settings": {**settings, "batch_per_process": batch // world_size,
                           "threads_per_process": threads},
              **breakdown(steps), "steps": steps, "spread": spread(steps),
              "all-reduce clock": None if world_size == 1 else
              "CUDA events" if gpu_clock else "wall"}
    result["reliable"] = result["spread"] <= RELIABLE_SPREAD
    result["parameters"] = sum(p.numel() for p in model.parameters())
    if gpu_clock:  # the all-reduce on its own, from the CUDA events alone (all_reduce_time)
        result["all-reduce time per step"] = sum(r["all-reduce time"] for r in steps) / len(steps)
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
             "steps": args.steps, "warmup": args.warmup,
             "model": {"spec": args.model, "kwargs": args.kwargs, "input shape": args.input_shape,
                       "input dtype": args.input_dtype} if args.model else "the book's CNN",
             "cases": cases}, indent=1))
    if world_size > 1:
        leave_process_group()  # after every DDP model is freed


if __name__ == "__main__":
    run_cli(main)
