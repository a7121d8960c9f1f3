"""One training step of the wide MLP, taken apart: what each rank holds, gathers, frees and sends.

    torchrun --standalone --nproc_per_node 2 ddp_scripts/recorders/fsdp_anatomy.py --out runs/ch11-anatomy

Chapter 11 starts it. For each way of spreading the model over the ranks,

    ddp             DistributedDataParallel: every rank holds everything
    fsdp            fully_shard on each block, then on the root (train_fsdp.py's way); the
                    root keeps PyTorch's default: not resharded after forward
    fsdp-keep       the blocks with reshard_after_forward=False: gathered weights kept until backward
    fsdp-bf16       fsdp with MixedPrecisionPolicy: gathered and computed in bfloat16,
                    gradients reduced in float32, the logits cast back to float32
    fsdp-one-unit   fully_shard on the root only, with its defaults, a classic mistake: one
                    unit, the whole model

it takes one step and records every collective (kind, bytes of the whole tensor, forward or
backward), what the rank holds after the step (parameters, gradients, optimizer state), how
many bytes of weights are whole between forward and backward, and the most held whole at once
(counted as each layer starts its forward and its backward). Then, in float64:

    accumulation    two micro-batches with set_requires_gradient_sync(False) on the first
                    (FSDP's no_sync) against one batch of both: gradients, reduce-scatters
    making          the model made as train_fsdp.py makes it (meta device, fully_shard,
                    sharding.materialize_shards) against build_model's whole one: the largest
                    tensor each makes on a rank
    initial         a different seed on each rank: DDP copies rank 0's weights at the wrap,
                    FSDP keeps each rank's own rows

Rank 0 writes OUT/anatomy.json. Every rank also saves its FSDP model the classic wrong way,
torch.save(model.state_dict()), to OUT/state_dict_rank<N>.pt, for the chapter to load.
"""
import json
import types
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ddp_scripts import sharding
from ddp_scripts.cli import run_cli
from ddp_scripts.options import ArgumentParser, count
from ddp_scripts.ranks import leave_process_group
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
            def noted(*args, collective=getattr(dist, name), kind=kind, **kwargs):  # noqa: B008 - bound now, per name
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


def build(setup, width, depth, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    model = WideMLP(width, depth).to(dtype)
    if setup == "ddp":
        model = DDP(model)
        model.register_comm_hook(None, noting_allreduce)
        return model
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    if setup == "fsdp-one-unit":  # the mistake, made the natural way: fully_shard(model)
        fully_shard(model, mesh=mesh)
        return model
    policy, root_policy = MixedPrecisionPolicy(), MixedPrecisionPolicy()
    if setup == "fsdp-bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        root_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                           output_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=setup != "fsdp-keep", mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=root_policy)  # the root: PyTorch's default
    return model


def whole_weight_bytes(model):
    """Bytes of weights this rank holds whole (not as a DTensor shard) right now: under FSDP
    a unit's parameters are plain tensors between its all-gather and its reshard."""
    return sum(local_bytes(p) for p in model.parameters() if not isinstance(p, DTensor))


def note_whole_weights(model, samples):
    """Count the whole weights as each layer starts its forward and its backward. The
    backward count is a hook on the layer's output, called when its gradient arrives, the
    moment the layer's backward starts. (A module backward hook would do the same, but it
    returns the layer's output as a view, and FSDP2 warns when a unit returns a view.)"""
    def count(name):
        samples.append((phase[0], name, whole_weight_bytes(model)))

    def count_in_backward(layer, inputs, output, name):
        if output.requires_grad:
            output.register_hook(lambda grad: count(name))

    layers = [(name, m) for name, m in model.named_modules() if not list(m.children())]
    for name, layer in layers:
        layer.register_forward_pre_hook(lambda m, inputs, name=name: count(name))
        layer.register_forward_hook(lambda m, inputs, output, name=name:
                                    count_in_backward(m, inputs, output, name))


def one_step(setup, width, depth, batch):
    model = build(setup, width, depth)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)  # after sharding
    generator = torch.Generator().manual_seed(dist.get_rank())
    images = torch.randn(batch, 3, 32, 32, generator=generator)
    labels = torch.randint(0, 10, (batch,), generator=generator)
    samples = []
    note_whole_weights(model, samples)
    sent.clear()
    phase[0] = "forward"
    loss = F.cross_entropy(model(images).float(), labels)  # the loss in float32, whatever the compute
    whole_between = whole_weight_bytes(model)
    phase[0] = "backward"
    loss.backward()
    phase[0] = "step"
    optimizer.step()
    peak = max(samples, key=lambda sample: sample[2])
    plain = model.module if isinstance(model, DDP) else model
    held = {"param_bytes": sum(local_bytes(p) for p in plain.parameters()),
            "grad_bytes": sum(local_bytes(p.grad) for p in plain.parameters()),
            "optimizer_bytes": sum(local_bytes(v) for s in optimizer.state.values()
                                   for v in s.values() if torch.is_tensor(v) and v.dim() > 0)}
    return model, {"setup": setup, "collectives": list(sent),
                   "whole_weight_bytes_between_forward_and_backward": whole_between,
                   "most_whole_weight_bytes": peak[2], "most_whole_at": peak[:2], **held,
                   "parameters": sum(p.numel() for p in plain.parameters())}


def accumulation(width, depth, batch):
    """Two micro-batches, the first without gradient sync, against one batch of both."""
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(100 + rank)
    images = torch.randn(2 * batch, 3, 32, 32, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 10, (2 * batch,), generator=generator)
    gradients, counts = {}, {}
    for way in ("one batch", "two micro-batches, synced once", "two micro-batches, synced twice"):
        model = build("fsdp", width, depth, dtype=torch.float64)
        sent.clear()
        if way == "one batch":
            F.cross_entropy(model(images), labels).backward()
        else:
            for i, part in enumerate((slice(0, batch), slice(batch, 2 * batch))):
                if way.endswith("once"):  # FSDP's no_sync: no reduce-scatter before the last
                    model.set_requires_gradient_sync(i == 1)
                (F.cross_entropy(model(images[part]), labels[part]) / 2).backward()
        gradients[way] = [p.grad.to_local().clone() for p in model.parameters()]
        counts[way] = sum(c["kind"] == "reduce-scatter" for c in sent)
    largest = {way: max((a - b).abs().max().item() for a, b in zip(gradients[way], gradients["one batch"], strict=True))
               for way in gradients}
    return {"reduce_scatters": counts, "largest_gradient_difference": largest,
            "micro_batch": batch}


class LargestPlainTensor(TorchDispatchMode):
    """The largest plain tensor (not meta, not a DTensor) that any operation makes."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if type(tensor) is torch.Tensor and tensor.device.type != "meta":
                self.largest = max(self.largest, tensor.numel())
        return out


def making(width, depth):
    """The largest tensor a rank makes: the whole model built as DDP's scripts build it, and
    the model made as train_fsdp.py makes it; and whether the two hold the same weights."""
    args = types.SimpleNamespace(model="mlp", width=width, depth=depth, seed=0,
                                 activation_checkpointing=False, no_reshard_after_forward=False,
                                 mixed_precision=None, cpu_offload=False, dtype="float64")
    with LargestPlainTensor() as whole_way:
        whole = sharding.build_fsdp_model(args, torch.float64)
    device, mesh = torch.device("cpu"), init_device_mesh("cpu", (dist.get_world_size(),))
    with LargestPlainTensor() as sharded_way:
        with torch.device("meta"):
            model = sharding.build_fsdp_model(args, torch.float64)
        for block in sharding.blocks_of(model):
            fully_shard(block, mesh=mesh, **sharding.fsdp_policies(args, device))
        fully_shard(model, mesh=mesh, **sharding.fsdp_policies(args, device, root=True))
        sharding.materialize_shards(model, device, args, torch.float64)
    same = all(torch.equal(p.full_tensor(), whole.get_parameter(name))
               for name, p in model.named_parameters())
    return {"largest_tensor_whole_model": whole_way.largest,
            "largest_tensor_train_fsdp": sharded_way.largest,
            "largest_parameter": max(p.numel() for p in whole.parameters()),
            "shard_bytes": sum(local_bytes(p) for p in model.parameters()),
            "whole_bytes": sum(local_bytes(p) for p in whole.parameters()),
            "same_weights_as_build_model": same}


def initial(width, depth):
    """Each rank builds with its own seed: what each strategy does with rank 0's weights."""
    rank, n = dist.get_rank(), dist.get_world_size()
    ddp = build("ddp", width, depth, seed=rank)
    fsdp = build("fsdp", width, depth, seed=rank)
    torch.manual_seed(0)
    rank_0 = WideMLP(width, depth)
    ddp_equal = torch.equal(ddp.module.stem.weight, rank_0.stem.weight)
    ddp_all = [None] * n
    dist.all_gather_object(ddp_all, ddp_equal)
    whole = fsdp.stem.weight.full_tensor()  # the rows every rank holds, put together
    rows = whole.shape[0] // n
    from_rank = []
    for r in range(n):
        torch.manual_seed(r)
        own = WideMLP(width, depth).stem.weight
        from_rank.append(bool(torch.equal(whole[r * rows:(r + 1) * rows], own[r * rows:(r + 1) * rows])))
    return {"ddp_equals_rank_0_on_every_rank": all(ddp_all),
            "fsdp_rows_are_each_rank_own": from_rank}


def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--width", type=count, default=256)
    parser.add_argument("--depth", type=count, default=4)
    parser.add_argument("--batch-size", type=count, default=8, help="per rank")
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
    extra = {"accumulation": accumulation(args.width, args.depth, args.batch_size),
             "making": making(args.width, args.depth), "initial": initial(args.width, args.depth)}
    if dist.get_rank() == 0:
        summary = {"world_size": dist.get_world_size(), "width": args.width, "depth": args.depth,
                   "batch_size": args.batch_size, "results": results, **extra}
        (out / "anatomy.json").write_text(json.dumps(summary, indent=1))
    dist.barrier()
    leave_process_group()  # after every DDP model is freed


if __name__ == "__main__":
    run_cli(main)
