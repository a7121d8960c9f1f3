"""Uneven inputs: one rank has a batch more than the other. By hand, its extra all_reduce
waits for a partner that has finished (here a group with a 3-second timeout turns the hang
into an error); DDP inside Join() lets the finished rank keep answering until all are done.

    torchrun --nproc-per-node 2 ddp_scripts/practice/uneven_inputs.py --out runs/practice
"""
import sys
from pathlib import Path

if not __package__:  # run as a file, not imported: find ddp_scripts as notebooks do
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import datetime
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_scripts.practice.by_hand import fingerprint, make_model, my_batches, train_by_hand
from ddp_scripts.practice.group import gather, main

TIMEOUT_S = 3


def uneven_batches(rank, world_size):
    """Rank 0 gets one batch more than the others: a data set that does not split evenly."""
    batches = my_batches(rank, world_size)[:4]
    return batches + my_batches(rank, world_size)[4:5] if rank == 0 else batches


def demo(out):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    batches = uneven_batches(rank, world_size)
    # 1. By hand, in a group of its own whose collectives give up after TIMEOUT_S seconds
    #    (without a timeout, rank 0 would wait for 30 minutes, the default of gloo).
    short_fuse = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    dist.barrier()                     # start together: only the extra step may wait
    start = time.monotonic()
    try:
        train_by_hand(make_model(), batches, group=short_fuse)
        outcome = "finished"
    except RuntimeError as error:
        outcome = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    waited = time.monotonic() - start
    dist.barrier()                     # the default group still works: everyone meets here
    # 2. DDP under Join: a rank out of data shadows the others' all-reduces until all finish.
    model = DDP(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    steps = 0
    with Join([model]):
        for x, y in batches:
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            steps += 1
    return {
        "timeout_s": TIMEOUT_S,
        "batches_per_rank": gather(len(batches)),
        "by_hand_outcome_per_rank": gather(outcome),
        "by_hand_seconds_per_rank": gather(round(waited, 2)),
        "join_steps_per_rank": gather(steps),
        "join_models_identical": len(set(gather(fingerprint(
            [p.detach() for p in model.parameters()])))) == 1,
    }


if __name__ == "__main__":
    main({"uneven_inputs": demo}, __doc__.splitlines()[0])
