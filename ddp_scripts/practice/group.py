"""The plumbing every practice program shares: join the group, gather, write the results.

Imported as `ddp_scripts.practice.group` by the programs beside it.
"""
import argparse
import contextlib
import datetime
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from ddp_scripts.out_dir import write_atomically
from ddp_scripts.ranks import leave_process_group


def join_group(timeout_s=60):
    """Join the group torchrun describes (env://) with gloo, on the CPU; (rank, world size)."""
    torch.set_num_threads(1)  # two processes on a small machine: one core each
    dist.init_process_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def gather(value):
    """[value of rank 0, value of rank 1, ...] on every rank (any picklable value)."""
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def all_equal(values):
    """Whether every rank's value equals rank 0's (values as gather returns them)."""
    return all(value == values[0] for value in values)


def same_on_every_rank(value):
    """Whether every rank holds the same value (any picklable value)."""
    return all_equal(gather(value))


def largest_difference(first, second):
    """The largest absolute difference between two lists of tensors (0.0 when equal)."""
    return max((a - b).abs().max().item() for a, b in zip(first, second))


@contextlib.contextmanager
def counting_all_reduces():
    """Count the all_reduce calls made through torch.distributed in the block, and their bytes.

    DDP's own gradient buckets go from C++ straight to the process group and are not seen;
    what is counted is what Python code calls: Join's flags, a comm hook's all-reduces."""
    calls = []
    original = dist.all_reduce

    def counted(tensor, *args, **kwargs):
        calls.append(tensor.numel() * tensor.element_size())
        return original(tensor, *args, **kwargs)

    dist.all_reduce = counted
    try:
        yield calls
    finally:
        dist.all_reduce = original


def write_result(out, name, result):
    """Rank 0 writes OUT/NAME.json (write-then-rename: a reader never sees half a file)."""
    if dist.get_rank() == 0:
        text = json.dumps(result, indent=1)
        write_atomically(Path(out) / f"{name}.json", lambda f: f.write(text), mode="w")


def main(demos, description):
    """Command line of a practice program: run `demos` ({name: function(out)}) in one group."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", required=True, help="folder for the results (NAME.json)")
    parser.add_argument("demos", nargs="*", help=f"default: all of {', '.join(demos)}")
    args = parser.parse_args()
    unknown = [name for name in args.demos if name not in demos]
    if unknown:
        parser.error(f"unknown demonstration(s) {unknown}: choose from {', '.join(demos)}")
    if "RANK" not in os.environ:
        parser.error("start it with torchrun, for example: torchrun --nproc-per-node 2 "
                     f"{Path(parser.prog)} --out runs/practice")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    join_group()
    for name in args.demos or list(demos):
        write_result(args.out, name, demos[name](args.out))
        dist.barrier()
    leave_process_group()  # after every DDP model is freed
