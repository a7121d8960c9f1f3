"""Data parallelism by hand: a model per process, gradients averaged with all_reduce.

Then the same training with DistributedDataParallel: in float64 the two end with the same
parameters, to rounding. What DDP adds is counted: how many all-reduces each needs per step, with DDP's default
buckets and with tiny ones.

    torchrun --nproc-per-node 2 ddp_scripts/practice/by_hand.py --out runs/practice
"""
from pathlib import Path

import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_scripts.out_dir import identical
from ddp_scripts.practice.group import all_equal, gather, largest_difference, main

STEPS, BATCH, LR = 20, 16, 0.05


def make_model():
    """A small regression network, float64, built the same way on every rank."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 1)).double()


def my_batches(rank, world_size):
    """This rank's share of every global batch: rows rank, rank + world_size, ..."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, BATCH * world_size, 8, generator=g, dtype=torch.float64)
    y = x[..., :1] * x[..., 1:2] + torch.sin(x[..., 2:3])
    return [(x[s, rank::world_size], y[s, rank::world_size]) for s in range(STEPS)]


def train_by_hand(model, batches, group=None):
    """What DDP does for us, written out: same start, averaged gradients, same step."""
    world_size = dist.get_world_size(group)
    for p in model.parameters():                 # 1. every rank starts from rank 0's weights
        dist.broadcast(p.data, src=0, group=group)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    all_reduces = 0
    for x, y in batches:
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()       # 2. gradients of this rank's share
        for p in model.parameters():             # 3. their average over the ranks
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)
            p.grad /= world_size
            all_reduces += 1
        optimizer.step()                         # 4. the same step everywhere
    return all_reduces


def fingerprint(tensors):
    """A short hash of the tensors' bytes: equal only when every bit is."""
    return hashlib.sha256(b"".join(t.numpy().tobytes() for t in tensors)).hexdigest()[:16]


def counting_hook(counter, bucket):
    """DDP's own all-reduce of one bucket of gradients, counted."""
    counter["all_reduces"] += 1
    counter["numbers"] += bucket.buffer().numel()
    return allreduce_hook(None, bucket)


def train_with_ddp(model, batches, bucket_cap_mb=None):
    """The same training with DDP; the all-reduces of the first and of the last step."""
    counter = {"all_reduces": 0, "numbers": 0}
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)    # broadcasts rank 0's weights itself
    ddp.register_comm_hook(counter, counting_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    for step, (x, y) in enumerate(batches):
        counter.update(all_reduces=0, numbers=0)   # count one step
        optimizer.zero_grad()
        F.mse_loss(ddp(x), y).backward()           # averages the gradients during backward
        optimizer.step()
        if step == 0:                              # the first step: one bucket for all;
            first_step = counter["all_reduces"]    # DDP builds its buckets after it
    return {**counter, "first_step": first_step}


def demo(out):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    batches = my_batches(rank, world_size)
    by_hand, with_ddp, small_buckets = make_model(), make_model(), make_model()
    hand_calls = train_by_hand(by_hand, batches)
    ddp_counts = train_with_ddp(with_ddp, batches)
    small_counts = train_with_ddp(small_buckets, batches, bucket_cap_mb=0.004)  # 4 kB buckets
    mine = [p.detach() for p in by_hand.parameters()]
    theirs = [p.detach() for p in with_ddp.parameters()]
    # A barrier before reading what another rank wrote in this run: rank 0 saves, all load.
    checkpoint = Path(out) / "by_hand_checkpoint.pt"
    if rank == 0:
        torch.save(by_hand.state_dict(), checkpoint)
    dist.barrier()                                 # without it, rank 1 may read too early
    loaded = torch.load(checkpoint, map_location="cpu", weights_only=True)
    same_as_saved = identical(loaded, by_hand.state_dict())
    return {
        "world_size": world_size, "steps": STEPS, "batch_per_rank": BATCH,
        "dtype": "float64",
        "parameter_tensors": len(mine), "parameters": sum(p.numel() for p in mine),
        "largest_difference_hand_vs_ddp": largest_difference(mine, theirs),
        "identical_on_every_rank": all_equal(gather(fingerprint(mine))),
        "all_reduces_per_step_by_hand": hand_calls // STEPS,
        "all_reduces_per_step_ddp": ddp_counts["all_reduces"],
        "all_reduces_per_step_ddp_small_buckets": small_counts["all_reduces"],
        "all_reduces_first_step_ddp_small_buckets": small_counts["first_step"],
        "numbers_per_step_ddp": ddp_counts["numbers"],
        "numbers_per_step_ddp_small_buckets": small_counts["numbers"],
        "checkpoint_read_after_barrier_matches": all(gather(same_as_saved)),
    }


if __name__ == "__main__":
    main({"by_hand": demo}, __doc__.splitlines()[0])
