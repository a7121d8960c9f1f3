"""A training step taken apart: where the time of one step goes, in one process or in N.

    python ddp_scripts/step_parts.py --out runs/parts-1.json
    torchrun --standalone --nproc-per-node 2 ddp_scripts/step_parts.py --out runs/parts-2.json

Each step is timed phase by phase with time.perf_counter, after a synchronize (a no-op on the
CPU) so that a phase's clock includes its GPU work: waiting for the data, copying it to the
device, forward, backward, the optimizer. Under DDP, backward also waits for the gradients'
all-reduce where overlap did not hide it. To split the two, a few more steps run backward
inside `no_sync()` (no all-reduce): their mean is the compute, and the rest of DDP's backward
is communication that overlap did not hide. The measured step runs from one step's start to
the next; what the phases leave of it (the loop, the timers) is reported as the remainder.
Rank 0 writes one JSON file: every case's parts, per step and as means, and each rank's means.
"""
import json
import os
import sys
import time
from pathlib import Path

if not __package__:  # run as a file, not imported: find ddp_scripts as notebooks do
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset, default_collate

from ddp_scripts.cli import UsageError, run_cli
from ddp_scripts.devices import pick_device, synchronize
from ddp_scripts.hardware import usable_cores
from ddp_scripts.models import build_model
from ddp_scripts.options import ArgumentParser, count, non_negative_int, seconds
from ddp_scripts.ranks import init_process_group

# The cases, run one after the other in the same processes. batch_size is the global batch
# (split over the processes); decode_us stands in for decoding each image (the loader sleeps).
# Each process computes with one thread, so N processes use N cores; threads "all" gives every
# process all the usable cores instead, so that processes x threads exceeds the cores (and,
# being slow, it runs fewer steps).
CASES = {
    "batch 64": {"batch_size": 64},
    "batch 8": {"batch_size": 8},
    "slow loader": {"batch_size": 64, "decode_us": 150},
    "all cores each": {"batch_size": 64, "threads": "all", "steps": 5, "warmup": 1},
}
PHASES = ["data wait", "copy to device", "forward", "backward", "optimizer"]
PARTS = ["data wait", "copy to device", "forward", "backward compute",
         "communication not hidden", "optimizer"]
REMAINDER = "other (loop, timers)"


def parse_args(argv=None):
    p = ArgumentParser(description="Time each part of a training step, in 1 or N processes.")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {list(CASES)}")
    p.add_argument("--steps", type=count, default=20, help="timed steps per case")
    p.add_argument("--warmup", type=non_negative_int, default=5, help="untimed steps first")
    p.add_argument("--probe-steps", type=count, default=8,
                   help="DDP: steps whose backward runs in no_sync(), to time the compute")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--timeout-s", type=seconds, default=300)
    p.add_argument("--out", required=True, help="the JSON file rank 0 writes")
    args = p.parse_args(argv)
    args.cases = [name.strip() for name in args.cases.split(",")]
    unknown = [name for name in args.cases if name not in CASES]
    if unknown:
        raise UsageError(f"--cases: unknown case {unknown[0]!r}; choose from {', '.join(CASES)}")
    return args


def loader(batch, steps, decode_us, seed):
    """Synthetic CIFAR-shaped batches; a loader with decode_us sleeps that long per image."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(batch * steps, 3, 32, 32, generator=generator)
    labels = torch.randint(0, 10, (batch * steps,), generator=generator)

    def collate(samples):
        time.sleep(decode_us * 1e-6 * len(samples))  # a stand-in for decoding the images
        return default_collate(samples)

    return DataLoader(TensorDataset(images, labels), batch_size=batch, collate_fn=collate)


def timed_steps(model, optimizer, batches, device, count, probe=False):
    """Run `count` steps; return per step each phase's seconds and the whole step's."""
    rows, starts = [], []
    for _ in range(count):
        start = time.perf_counter()
        starts.append(start)
        images, labels = next(batches)
        t_data = time.perf_counter()
        images, labels = images.to(device), labels.to(device)
        synchronize(device)
        t_copy = time.perf_counter()
        loss = F.cross_entropy(model(images), labels)
        synchronize(device)
        t_forward = time.perf_counter()
        if probe:
            with model.no_sync():  # the same backward, without the all-reduce
                loss.backward()
        else:
            loss.backward()
        synchronize(device)
        t_backward = time.perf_counter()
        if not probe:
            optimizer.step()
        optimizer.zero_grad()
        synchronize(device)
        t_end = time.perf_counter()
        marks = [start, t_data, t_copy, t_forward, t_backward, t_end]
        rows.append({phase: b - a for phase, a, b in zip(PHASES, marks, marks[1:])})
    starts.append(time.perf_counter())
    for row, a, b in zip(rows, starts, starts[1:]):
        row["step"] = b - a  # start to next start: the loop and the timers included
    return rows


def breakdown(steps, probes=()):
    """The mean step split into PARTS plus the remainder, which add up to the mean step.

    probes: no_sync steps (DDP); their mean backward is the compute, and the rest of the
    mean backward is communication that overlap did not hide (none without probes)."""
    mean = {key: sum(row[key] for row in steps) / len(steps) for key in [*PHASES, "step"]}
    compute = mean["backward"]
    if probes:
        compute = min(compute, sum(row["backward"] for row in probes) / len(probes))
    parts = {"data wait": mean["data wait"], "copy to device": mean["copy to device"],
             "forward": mean["forward"], "backward compute": compute,
             "communication not hidden": mean["backward"] - compute,
             "optimizer": mean["optimizer"]}
    parts[REMAINDER] = mean["step"] - sum(parts.values())
    return {"parts": parts, "step": mean["step"]}


def part_that_grew(one, many):
    """The part (or the remainder) whose mean grew most from `one` breakdown to `many`."""
    growth = {part: many["parts"][part] - one["parts"].get(part, 0.0) for part in many["parts"]}
    name = max(growth, key=growth.get)
    return name, growth[name]


def run_case(name, settings, device, world_size, rank, args):
    threads = usable_cores() if settings.get("threads") == "all" else 1
    torch.set_num_threads(threads)
    batch = settings["batch_size"]
    if batch % world_size:
        raise UsageError(f"case {name!r}: global batch {batch} does not split over {world_size}")
    timed = min(args.steps, settings.get("steps", args.steps))
    warmup = min(args.warmup, settings.get("warmup", args.warmup))
    probe = min(args.probe_steps, timed)
    total = warmup + timed + (probe if world_size > 1 else 0)
    batches = iter(loader(batch // world_size, total, settings.get("decode_us", 0), rank))
    model = build_model("cnn").to(device)
    if world_size > 1:
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    timed_steps(model, optimizer, batches, device, warmup)
    steps = timed_steps(model, optimizer, batches, device, timed)
    probes = timed_steps(model, optimizer, batches, device, probe, probe=True) \
        if world_size > 1 else []
    result = {"settings": {**settings, "batch_per_process": batch // world_size,
                           "threads_per_process": threads},
              **breakdown(steps, probes), "steps": steps, "probes": probes}
    ranks = [None] * world_size
    if world_size > 1:
        dist.all_gather_object(ranks, breakdown(steps, probes))
    result["ranks"] = ranks if world_size > 1 else [breakdown(steps)]
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
