"""A model with a branch its forward never uses: DDP's error, then find_unused_parameters
and static_graph, and what each costs per step.

    torchrun --nproc-per-node 2 ddp_scripts/practice/unused_parameters.py --out runs/practice
"""
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_scripts.practice.by_hand import my_batches
from ddp_scripts.practice.group import gather, main

TIMED_STEPS, DEPTH = 60, 40


class TwoHeads(nn.Module):
    """A body and two output heads; forward uses one. A multi-task model on a one-task batch,
    a frozen branch, an auxiliary head switched off: the same situation."""

    def __init__(self, with_spare_head=True, depth=DEPTH):
        super().__init__()
        torch.manual_seed(0)
        layers = [nn.Linear(8, 16), nn.Tanh()]
        for _ in range(depth - 1):  # deep and thin: a large autograd graph, little arithmetic
            layers += [nn.Linear(16, 16), nn.Tanh()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(16, 1)
        self.spare_head = nn.Linear(16, 1) if with_spare_head else None

    def forward(self, x):
        return self.head(self.body(x))    # spare_head gets no gradient


def timed_steps(models, batches):
    """Seconds of every training step (forward, backward with its all-reduce, update) of
    each model; the models take turns, step by step, so that they share the machine's ups
    and downs alike."""
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=0.01) for name, m in models.items()}
    times = {name: [] for name in models}
    for x, y in batches:
        for name, model in models.items():
            start = time.perf_counter()
            optimizers[name].zero_grad()
            F.mse_loss(model(x.float()), y.float()).backward()
            optimizers[name].step()
            times[name].append(time.perf_counter() - start)
    return times


def two_steps(model, batches):
    """(steps done, the error's text or None): the second step of plain DDP refuses."""
    steps_done = 0
    try:
        for x, y in batches[:2]:
            F.mse_loss(model(x.float()), y.float()).backward()
            steps_done += 1
    except RuntimeError as raised:
        return steps_done, str(raised)
    return steps_done, None


def failed_on_every_rank(errors):
    """Whether every rank's step raised (errors: each rank's error text, None where none)."""
    return all(error is not None for error in errors)


def demo(out):
    batches = my_batches(dist.get_rank(), dist.get_world_size())
    # 1. Plain DDP: the first step passes, the second refuses to start.
    steps_done, error = two_steps(DDP(TwoHeads()), batches)
    # The same in a world of one process (each rank in a group of its own): one GPU is no
    # escape, DDP's reducer is the same.
    alone, _ = dist.new_subgroups(group_size=1)
    _, error_alone = two_steps(DDP(TwoHeads(), process_group=alone), batches)
    # 2. The two fixes, and a model without the spare head for comparison; each timed.
    runs = {"no spare head, plain DDP": DDP(TwoHeads(with_spare_head=False)),
            "find_unused_parameters=True": DDP(TwoHeads(), find_unused_parameters=True),
            "static_graph=True": DDP(TwoHeads(), static_graph=True)}
    timed = (batches * 3)[:TIMED_STEPS]
    times = timed_steps(runs, timed)
    medians = {name: statistics.median(t[5:]) * 1e6 for name, t in times.items()}  # after set-up
    fixed = runs["find_unused_parameters=True"].module
    return {
        "steps_before_the_error": steps_done,
        "error_on_every_rank": failed_on_every_rank(gather(error)),
        "error": error,
        "error_in_a_world_of_one": error_alone,
        "spare_head_grad_is_none": fixed.spare_head.weight.grad is None,
        "median_step_us": {name: max(gather(value)) for name, value in medians.items()},
        "timed_steps": len(timed) - 5,
    }


if __name__ == "__main__":
    main({"unused_parameters": demo}, __doc__.splitlines()[0])
