"""Gradient accumulation with DDP, with and without no_sync().

Four micro-batches per optimizer step. Without no_sync() every backward all-reduces the
gradients; inside no_sync() the gradients only accumulate locally, and the backward of the
last micro-batch all-reduces the sum once. The all-reduces are counted; the final models agree.

    torchrun --nproc-per-node 2 ddp_scripts/practice/accumulation.py --out runs/practice
"""
import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_scripts.practice.by_hand import make_model, my_batches
from ddp_scripts.practice.group import largest_difference, main

MICRO_BATCHES, LR = 4, 0.05   # one optimizer step every 4 micro-batches


def counting_hook(counter, bucket):
    counter["all_reduces"] += 1
    return allreduce_hook(None, bucket)


def train(batches, use_no_sync):
    model = DDP(make_model())
    counter = {"all_reduces": 0}
    model.register_comm_hook(counter, counting_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    optimizer.zero_grad()
    for i, (x, y) in enumerate(batches, start=1):
        last_of_step = i % MICRO_BATCHES == 0
        # inside no_sync() backward adds to .grad without communicating
        skip = model.no_sync() if use_no_sync and not last_of_step else contextlib.nullcontext()
        with skip:
            loss = F.mse_loss(model(x), y) / MICRO_BATCHES  # the mean over the 4 micro-batches
            loss.backward()
        if last_of_step:
            optimizer.step()
            optimizer.zero_grad()
    return model, counter["all_reduces"]


def demo(out):
    batches = my_batches(dist.get_rank(), dist.get_world_size())  # 20 micro-batches: 5 steps
    every_time, every_time_calls = train(batches, use_no_sync=False)
    once, once_calls = train(batches, use_no_sync=True)
    return {
        "micro_batches": len(batches), "micro_batches_per_step": MICRO_BATCHES,
        "optimizer_steps": len(batches) // MICRO_BATCHES,
        "all_reduces_without_no_sync": every_time_calls,
        "all_reduces_with_no_sync": once_calls,
        "largest_difference": largest_difference(
            [p.detach() for p in every_time.parameters()], [p.detach() for p in once.parameters()]),
    }


if __name__ == "__main__":
    main({"accumulation": demo}, __doc__.splitlines()[0])
