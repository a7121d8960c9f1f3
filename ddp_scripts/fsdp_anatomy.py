"""One training step of the wide MLP, taken apart: what each rank holds, gathers, frees and sends.

    torchrun --standalone --nproc_per_node 2 ddp_scripts/fsdp_anatomy.py --out runs/ch11-anatomy

Chapter 11 starts it. For each way of spreading the model over the ranks,

    ddp             DistributedDataParallel: every rank holds everything
    fsdp            fully_shard on each block, then on the root (train_fsdp.py's way)
    fsdp-keep       the same with reshard_after_forward=False: gathered weights kept until backward
    fsdp-bf16       fsdp with MixedPrecisionPolicy: gathered and computed in bfloat16,
                    gradients reduced in float32
    fsdp-one-unit   fully_shard on the root only, a classic mistake: one unit, the whole model

it takes one step and records every collective (kind, bytes of the whole tensor, forward or
backward), what the rank holds after the step (parameters, gradients, optimizer state) and how
many bytes of weights are whole between forward and backward. Rank 0 writes OUT/anatomy.json.
Every rank also saves its FSDP model the classic wrong way, torch.save(model.state_dict()), to
OUT/state_dict_rank<N>.pt, for the chapter to load.
"""
import argparse
import json
import sys
from pathlib import Path

if not __package__:  # run as a file, not imported: find ddp_scripts as notebooks do
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_scripts.sharding import WideMLP, local_bytes

SETUPS = ["ddp", "fsdp", "fsdp-keep", "fsdp-bf16", "fsdp-one-unit"]
phase = ["setup"]   # where the step is: "forward" or "backward"
sent = []           # the collectives of the current set-up, in order


def whole_tensor(kind, args, kwargs):
    """The argument that holds the whole tensor: an all-gather's output, a reduce-scatter's input."""
    names, position = ((("output_tensor", "output"), 0) if kind == "all-gather"
                       else (("input_tensor", "input"), 1))
    given = [kwargs[name] for name in names if name in kwargs]
    return given[0] if given else args[position]


def note_collectives():
    """Wrap the collectives FSDP2 calls from Python (the *_tensor names in torch 2.11, the
    *_single ones later), so that each call is noted before it runs."""
    for name, kind in [("all_gather_into_tensor", "all-gather"), ("all_gather_single", "all-gather"),
                       ("reduce_scatter_tensor", "reduce-scatter"),
                       ("reduce_scatter_single", "reduce-scatter")]:
        if hasattr(dist, name):
            def noted(*args, collective=getattr(dist, name), kind=kind, **kwargs):
                tensor = whole_tensor(kind, args, kwargs)
                sent.append({"kind": kind, "phase": phase[0],
                             "bytes": tensor.numel() * tensor.element_size()})
                return collective(*args, **kwargs)
            setattr(dist, name, noted)


def noting_allreduce(state, bucket):
    """A DDP communication hook: note the bucket, then the usual all-reduce."""
    buffer = bucket.buffer()
    sent.append({"kind": "all-reduce", "phase": phase[0],
                 "bytes": buffer.numel() * buffer.element_size()})
    return default_hooks.allreduce_hook(None, bucket)


def build(setup, width, depth):
    torch.manual_seed(0)
    model = WideMLP(width, depth)
    if setup == "ddp":
        model = DDP(model)
        model.register_comm_hook(None, noting_allreduce)
        return model
    options = {"mesh": init_device_mesh("cpu", (dist.get_world_size(),)),
               "reshard_after_forward": setup != "fsdp-keep"}
    if setup == "fsdp-bf16":
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                    reduce_dtype=torch.float32)
    if setup != "fsdp-one-unit":
        for block in model.blocks:
            fully_shard(block, **options)
    fully_shard(model, **options)
    return model


def whole_weight_bytes(model):
    """Bytes of weights this rank holds whole (not as a DTensor shard) right now: under FSDP
    a unit's parameters are plain tensors between its all-gather and its reshard."""
    return sum(local_bytes(p) for p in model.parameters() if not isinstance(p, DTensor))


def one_step(setup, width, depth, batch):
    model = build(setup, width, depth)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)  # after sharding
    generator = torch.Generator().manual_seed(dist.get_rank())
    images = torch.randn(batch, 3, 32, 32, generator=generator)
    labels = torch.randint(0, 10, (batch,), generator=generator)
    sent.clear()
    phase[0] = "forward"
    loss = F.cross_entropy(model(images), labels)
    whole_between = whole_weight_bytes(model)
    phase[0] = "backward"
    loss.backward()
    phase[0] = "step"
    optimizer.step()
    plain = model.module if isinstance(model, DDP) else model
    held = {"param_bytes": sum(local_bytes(p) for p in plain.parameters()),
            "grad_bytes": sum(local_bytes(p.grad) for p in plain.parameters()),
            "optimizer_bytes": sum(local_bytes(v) for s in optimizer.state.values()
                                   for v in s.values() if torch.is_tensor(v) and v.dim() > 0)}
    return model, {"setup": setup, "collectives": list(sent),
                   "whole_weight_bytes_between_forward_and_backward": whole_between, **held,
                   "parameters": sum(p.numel() for p in plain.parameters())}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8, help="per rank")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    note_collectives()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for setup in SETUPS:
        model, result = one_step(setup, args.width, args.depth, args.batch_size)
        results.append(result)
        if setup == "fsdp":  # the classic mistake: every rank saves its own shards, as if whole
            torch.save(model.state_dict(), out / f"state_dict_rank{dist.get_rank()}.pt")
    if dist.get_rank() == 0:
        summary = {"world_size": dist.get_world_size(), "width": args.width, "depth": args.depth,
                   "batch_size": args.batch_size, "results": results}
        (out / "anatomy.json").write_text(json.dumps(summary, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
