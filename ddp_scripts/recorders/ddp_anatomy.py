"""What each rank of a DDP job is, receives, computes and sends: the data of chapter 5's figures.

    torchrun --standalone --nproc_per_node 4 ddp_scripts/recorders/ddp_anatomy.py --out runs/ch05-anatomy

Each rank records, on the CPU over gloo,

    job         who it is: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and GROUP_RANK (the
                node rank) as torchrun set them, its host name, process id, backend and device
    sampler     the indices DistributedSampler gives it from a small data set whose size the
                world size does not divide (so the sampler pads), shuffled, epoch 0
    gradients   a tiny linear layer wrapped in DDP, fed the rank's own samples: its gradient
                before the all-reduce (what a communication hook finds in the bucket) and
                after it (the layer's .grad once backward has returned)
    timeline    two training steps of the book's CNN with small buckets: when each forward,
                each parameter's gradient (register_post_accumulate_grad_hook) and each
                bucket's all-reduce (a communication hook, timed until its future completes)
                started and ended, in ms from the rank's own start of the step

Rank 0 gathers everything and writes OUT/anatomy.json.
"""
import json
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from ddp_scripts.cli import run_cli
from ddp_scripts.models import build_model
from ddp_scripts.options import ArgumentParser, count
from ddp_scripts.practice.hooks import attach_timers
from ddp_scripts.ranks import init_process_group, leave_process_group


def job():
    """This process, in the words torchrun and the process group use."""
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")
    return {**{name.lower(): int(os.environ[name]) for name in names},
            "host": socket.gethostname(), "pid": os.getpid(),
            "backend": dist.get_backend(), "device": "cpu"}


def sampler_share(samples):
    """The indices DistributedSampler gives this rank, shuffled, in epoch 0."""
    sampler = DistributedSampler(range(samples), shuffle=True, seed=0)
    sampler.set_epoch(0)
    return {"dataset_size": samples, "total_size": sampler.total_size, "indices": list(sampler)}


def gradients(indices, samples):
    """A tiny layer's gradient on this rank's samples, before and after DDP's all-reduce."""
    torch.manual_seed(0)  # the same data set and the same layer on every rank
    features, targets = torch.randn(samples, 3), torch.randn(samples, 2)
    layer = DDP(torch.nn.Linear(3, 2))
    seen = {}

    def noting_allreduce(state, bucket):
        # DDP calls the hook with the bucket: the rank's own gradients, flattened, not yet sent.
        seen["bucket"] = bucket.buffer().clone().tolist()
        seen["names"] = [name for p in bucket.parameters()
                         for name, q in layer.module.named_parameters() if q is p]
        return default_hooks.allreduce_hook(None, bucket)  # divides by world size, sums

    layer.register_comm_hook(None, noting_allreduce)
    batch = torch.tensor(indices)
    F.mse_loss(layer(features[batch]), targets[batch]).backward()
    after = dict(layer.module.named_parameters())
    return {"before": seen["bucket"], "names": seen["names"],
            "after": torch.cat([after[name].grad.flatten() for name in seen["names"]]).tolist(),
            "shapes": {name: list(after[name].shape) for name in seen["names"]}}


def timeline(steps=2, batch_size=16, bucket_cap_mb=0.05):
    """When each piece of work ran in each step on this rank, in ms from the step's start."""
    model = build_model("cnn", seed=0)
    events, clock = [], {}

    def now():
        return (time.perf_counter() - clock["start"]) * 1000

    ddp_model = DDP(model, bucket_cap_mb=bucket_cap_mb)
    attach_timers(ddp_model, now, events.append)   # gradients ready, buckets all-reduced
    torch.manual_seed(dist.get_rank())
    images, labels = torch.randn(batch_size, 3, 32, 32), torch.randint(0, 10, (batch_size,))
    recorded = []
    for step in range(1, steps + 1):
        events.clear()
        dist.barrier()
        clock["start"] = time.perf_counter()
        output = ddp_model(images)
        events.append({"kind": "forward", "start": 0.0, "end": now()})
        loss = F.cross_entropy(output, labels)
        backward_start = now()
        loss.backward()
        events.append({"kind": "backward", "start": backward_start, "end": now()})
        ddp_model.zero_grad()
        recorded.append({"step": step, "events": [dict(event) for event in events]})
    return recorded


def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--samples", type=count, default=10,
                        help="size of the sampler's data set (pick one the world size does not divide)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # gloo on the CPU; a rank that never comes ends the others in two minutes, not thirty
    init_process_group(torch.device("cpu"), timeout_s=120)
    share = sampler_share(args.samples)
    mine = {"job": job(), "sampler": share, "gradients": gradients(share["indices"], args.samples),
            "timeline": timeline()}
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    if dist.get_rank() == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "anatomy.json").write_text(json.dumps({"torch": torch.__version__,
                                                      "ranks": ranks}, indent=1))
    dist.barrier()
    leave_process_group()  # after every DDP model is freed


if __name__ == "__main__":
    run_cli(main)
