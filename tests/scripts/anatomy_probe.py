"""Run under torchrun by test_fsdp_anatomy.py, on 2 CPU processes with the repository on
PYTHONPATH: the verdicts chapter 11 reads from ddp_scripts/recorders/fsdp_anatomy.py, taken as
the script takes them, then each with the flaw it exists to catch planted. Rank 0 writes
OUT/probe.json.

    making    the shards made as train_fsdp.py makes them hold build_model's weights;
              planted: the shards made with another seed
    initial   DDP's replicas equal rank 0's after the wrap; planted: a wrap that does not
              broadcast (init_sync=False). FSDP's rows are each rank's own; planted: one seed
              on every rank
    steps     the most weights held whole at once: fsdp, and the one flat unit (fsdp-one-unit)
"""
import functools
import json
import sys
import types
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_scripts import sharding
from ddp_scripts.recorders import fsdp_anatomy

WIDTH, DEPTH, BATCH = 16, 2, 2
out = Path(sys.argv[1])
torch.set_num_threads(1)
dist.init_process_group("gloo")
fsdp_anatomy.note_collectives()

right = {"making": fsdp_anatomy.making(WIDTH, DEPTH),
         "initial": fsdp_anatomy.initial(WIDTH, DEPTH),
         "steps": {setup: fsdp_anatomy.one_step(setup, WIDTH, DEPTH, BATCH)[1]
                   for setup in ("fsdp", "fsdp-one-unit")}}

materialize, build = sharding.materialize_shards, fsdp_anatomy.build


def another_seed(model, device, args, dtype):
    materialize(model, device, types.SimpleNamespace(**{**vars(args), "seed": args.seed + 1}),
                dtype)


def one_seed_for_fsdp(setup, width, depth, seed=0, dtype=torch.float32):
    return build(setup, width, depth, seed=0 if setup == "fsdp" else seed, dtype=dtype)


planted = {}
with mock.patch.object(sharding, "materialize_shards", another_seed):
    planted["shards made with another seed"] = fsdp_anatomy.making(WIDTH, DEPTH)
with mock.patch.object(fsdp_anatomy, "DDP", functools.partial(DDP, init_sync=False)):
    planted["a wrap that does not broadcast"] = fsdp_anatomy.initial(WIDTH, DEPTH)
with mock.patch.object(fsdp_anatomy, "build", one_seed_for_fsdp):
    planted["one seed on every rank"] = fsdp_anatomy.initial(WIDTH, DEPTH)

if dist.get_rank() == 0:
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(json.dumps({"right": right, "planted": planted}, indent=1))
dist.barrier()
dist.destroy_process_group()
