"""Run under torchrun by test_fit.py, with the repository on PYTHONPATH: the bytes DDP's
Reducer holds in its buckets, read in a real gloo run on 2 CPU processes. The buckets are the
flat tensors a communication hook is handed (GradBucket.buffer()); the probe notes each one's
storage in the second step (the first may rebuild them), then rank 0 writes OUT/buckets.json.

    torchrun --nproc-per-node 2 tests/scripts/buckets_probe.py OUT MODEL KWARGS C,H,W BATCH
"""
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ddp_scripts.fit import trace

out, spec, kwargs, shape, batch = sys.argv[1:6]
dist.init_process_group("gloo")
world = dist.get_world_size()
model = DistributedDataParallel(trace.build(spec, json.loads(kwargs), device="cpu"))  # defaults
storages = {}


def note_and_average(state, bucket):
    buffer = bucket.buffer()
    storages[buffer.untyped_storage().data_ptr()] = buffer.untyped_storage().nbytes()
    work = dist.all_reduce(buffer.div_(world), async_op=True)
    return work.get_future().then(lambda future: future.value()[0])


model.register_comm_hook(None, note_and_average)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
inputs = torch.randn(int(batch), *(int(n) for n in shape.split(",")))
for step in range(2):
    storages.clear()
    trace.loss_of(model(inputs)).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
gradients = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
if dist.get_rank() == 0:
    Path(out, "buckets.json").write_text(json.dumps({
        "bucket_bytes": sum(storages.values()), "buckets": len(storages),
        "shared_with_gradients": bool(gradients & set(storages))}))
dist.destroy_process_group()
