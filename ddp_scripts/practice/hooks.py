"""What DDP does during backward, recorded with hooks: the data of chapter 9's figures.

`overlap`: when each gradient became ready (a post-accumulate-grad hook on every parameter)
and when each bucket's all-reduce was launched and finished (a comm hook that times the
future it returns), on every rank, in the first step (one bucket) and in later steps (the
buckets DDP rebuilt in the order the gradients arrived).
`no_sync_steps`: per micro-batch of gradient accumulation, the all-reduces DDP ran (a
counting comm hook) and one gradient's value on each rank, with and without no_sync().

    torchrun --nproc-per-node 2 ddp_scripts/practice/hooks.py --out runs/practice
"""
import contextlib
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_scripts.practice.accumulation import LR, MICRO_BATCHES
from ddp_scripts.practice.by_hand import make_model, my_batches
from ddp_scripts.practice.group import gather, main

LAYERS, WIDTH, BATCH, STEPS = 6, 512, 256, 3   # 6 weights of 512 x 512 float32: 1 MiB each
BUCKET_CAP_MB = 3                              # small on purpose: two buckets after step 1
MS = 1e3


def now_ms():
    """A clock every process on this machine shares (CLOCK_MONOTONIC), in milliseconds."""
    return time.monotonic() * MS


def recorded_step(ddp, x):
    """One forward and backward; the times of this rank's events, in ms on the shared clock."""
    events = {"ready": [], "buckets": []}
    events["forward_start"] = now_ms()
    loss = ddp(x).square().mean()
    events["backward_start"] = now_ms()
    loss.backward()                 # returns once DDP has waited for every bucket's all-reduce
    events["backward_end"] = now_ms()
    return events


def attach_timers(ddp, now, record):
    """Time what DDP does in backward on this rank, with hooks, on the clock now() (ms).

    record(event) gets {"kind": "gradient", "name", "at"} when autograd has added a
    parameter's gradient to .grad (a post-accumulate-grad hook), and {"kind": "all-reduce",
    "bucket", "parameters", "bytes", "start"} when DDP launches a bucket's all-reduce (a comm
    hook, which DDP calls once every gradient of the bucket is ready); that same dict gets
    "end" when the all-reduce's future completes. Chapters 5 and 9 draw these events."""
    names = {p: name for name, p in ddp.module.named_parameters()}
    for parameter, name in names.items():
        parameter.register_post_accumulate_grad_hook(
            lambda _, name=name: record({"kind": "gradient", "name": name, "at": now()}))

    def timed_allreduce(_, bucket):
        event = {"kind": "all-reduce", "bucket": bucket.index(), "start": now(),
                 "parameters": [names[p] for p in bucket.parameters()],
                 "bytes": bucket.buffer().numel() * bucket.buffer().element_size()}
        record(event)

        def finished(future):       # runs when the all-reduce has completed
            event["end"] = now()
            return future.value()   # the averaged bucket, as allreduce_hook's future gives it

        return allreduce_hook(None, bucket).then(finished)

    ddp.register_comm_hook(None, timed_allreduce)


def overlap(out):
    """Gradients ready and buckets all-reduced, per rank, step by step."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB)
    events = []
    attach_timers(ddp, now_ms, events.append)
    x = torch.randn(BATCH, WIDTH)
    steps = []
    for _ in range(STEPS):
        events.clear()
        dist.barrier()              # both ranks start the step together
        timed = recorded_step(ddp, x)
        steps.append({**timed,
                      "ready": [(e["name"], e["at"]) for e in events if e["kind"] == "gradient"],
                      "buckets": [{"index": e["bucket"], "launched": e["start"],
                                   "finished": e["end"], "parameters": e["parameters"],
                                   "bytes": e["bytes"]}
                                  for e in events if e["kind"] == "all-reduce"]})
    return {"layers": LAYERS, "width": WIDTH, "batch_per_rank": BATCH, "dtype": "float32",
            "bucket_cap_mb": BUCKET_CAP_MB, "world_size": dist.get_world_size(),
            "steps_per_rank": gather(steps)}


def no_sync_steps(out):
    """Per micro-batch: the all-reduces DDP ran and one gradient's value on every rank."""
    batches = my_batches(dist.get_rank(), dist.get_world_size())[:2 * MICRO_BATCHES]
    runs = {}
    for use_no_sync in (False, True):
        model = DDP(make_model())
        counter = {"all_reduces": 0}

        def counting_hook(state, bucket):
            state["all_reduces"] += 1
            return allreduce_hook(None, bucket)

        model.register_comm_hook(counter, counting_hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        watched = next(model.parameters())      # the first layer's weight: element [0, 0]
        micro = []
        for i, (x, y) in enumerate(batches, start=1):
            last_of_step = i % MICRO_BATCHES == 0
            skip = model.no_sync() if use_no_sync and not last_of_step else contextlib.nullcontext()
            before = counter["all_reduces"]
            with skip:
                (F.mse_loss(model(x), y) / MICRO_BATCHES).backward()
            micro.append({"micro_batch": i, "all_reduces": counter["all_reduces"] - before,
                          "grad": watched.grad[0, 0].item(), "optimizer_step": last_of_step})
            if last_of_step:
                optimizer.step()
                optimizer.zero_grad()
        runs["with no_sync()" if use_no_sync else "without no_sync()"] = gather(micro)
    return {"micro_batches_per_step": MICRO_BATCHES, "per_rank": runs}


if __name__ == "__main__":
    main({"overlap": overlap, "no_sync_steps": no_sync_steps}, __doc__.splitlines()[0])
