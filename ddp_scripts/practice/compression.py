"""DDP communication hooks for slow links: gradients sent in fp16, in bf16, or compressed
with PowerSGD, against plain DDP: the bytes each sends per step, and how far its model ends
from plain DDP's.

A comm hook replaces the all-reduce of each bucket: `register_comm_hook(state, hook)`, one
line after wrapping. The bytes are counted at the all_reduce calls the hooks make.

    torchrun --nproc-per-node 2 ddp_scripts/practice/compression.py --out runs/practice
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_scripts.practice.by_hand import my_batches
from ddp_scripts.practice.group import counting_all_reduces, largest_difference, main

LR, WIDTH = 0.05, 64


def make_model():
    """A float32 network with 64 x 64 weight matrices, the shape PowerSGD compresses."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH), nn.Tanh(),
                         nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 1))


def hooks():
    """{name: (state, hook)}: what `model.register_comm_hook(state, hook)` is given."""
    power_sgd = powerSGD_hook.PowerSGDState(
        process_group=None, matrix_approximation_rank=1,  # each matrix sent as two vectors
        start_powerSGD_iter=2)  # plain all-reduces first (the default waits 1,000 steps)
    return {"plain all-reduce (DDP's default)": (None, default_hooks.allreduce_hook),
            "fp16_compress_hook": (None, default_hooks.fp16_compress_hook),
            "bf16_compress_hook": (None, default_hooks.bf16_compress_hook),
            "powerSGD_hook, rank 1": (power_sgd, powerSGD_hook.powerSGD_hook)}


def train(state, hook, batches):
    """Train with the hook; the bytes all-reduced in the last step, and the losses."""
    model = DDP(make_model())
    model.register_comm_hook(state, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in batches:
        optimizer.zero_grad()
        with counting_all_reduces() as sent:     # the last step's calls are kept
            loss = F.mse_loss(model(x.float()), y.float())
            loss.backward()
        optimizer.step()
    return model.module, sum(sent), loss.item()


def demo(out):
    batches = my_batches(dist.get_rank(), dist.get_world_size())
    models, rows = {}, {}
    for name, (state, hook) in hooks().items():
        models[name], sent, loss = train(state, hook, batches)
        rows[name] = {"bytes_per_step": sent, "last_loss": loss}
    plain = [p.detach() for p in models["plain all-reduce (DDP's default)"].parameters()]
    for name, model in models.items():
        rows[name]["largest_difference_from_plain"] = largest_difference(
            plain, [p.detach() for p in model.parameters()])
    return {"steps": len(batches), "dtype": "float32",
            "parameters": sum(p.numel() for p in plain), "hooks": rows}


if __name__ == "__main__":
    main({"compression": demo}, __doc__.splitlines()[0])
