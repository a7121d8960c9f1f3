"""DDP's buckets with the default `bucket_cap_mb=None` and with `bucket_cap_mb=25` passed:
not the same. Only the default keeps a small first bucket (1 MiB) for the gradients that are
ready first; any value passed, 25 included, caps the first bucket like the others. And the
first step of a run sends every gradient in one bucket: DDP builds its buckets only once it
has seen the order in which the gradients arrive.

    torchrun --nproc-per-node 2 ddp_scripts/practice/buckets.py --out runs/practice
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_scripts.practice.group import main

LAYERS, WIDTH, STEPS, MiB = 8, 256, 3, 2 ** 20   # 8 weights of 256 x 256 float64: 0.5 MiB each


def bucket_sizes(bucket_cap_mb):
    """MiB of every bucket DDP all-reduces, step by step."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)]).double()
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    steps = []

    def recording_hook(_, bucket):
        steps[-1].append(round(bucket.buffer().numel() * bucket.buffer().element_size() / MiB, 3))
        return allreduce_hook(None, bucket)

    ddp.register_comm_hook(None, recording_hook)
    x = torch.randn(4, WIDTH, dtype=torch.float64)
    for _ in range(STEPS):
        steps.append([])
        ddp(x).sum().backward()
    return steps


def demo(out):
    return {"model_mib": round(LAYERS * (WIDTH * WIDTH + WIDTH) * 8 / MiB, 3),
            "first_bucket_cap_mib_default": dist._DEFAULT_FIRST_BUCKET_BYTES / MiB,
            "bucket_mib_per_step": {"bucket_cap_mb=None (the default)": bucket_sizes(None),
                                    "bucket_cap_mb=25": bucket_sizes(25)}}


if __name__ == "__main__":
    main({"buckets": demo}, __doc__.splitlines()[0])
