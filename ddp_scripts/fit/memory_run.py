"""One training step under DDP, ZeRO-1 and FSDP: the bytes each rank holds, measured.

    torchrun --standalone --nproc_per_node 4 ddp_scripts/fit/memory_run.py --out runs/ch11-memory

Chapter 11 starts it, to set memory_plan.py's predictions beside what the ranks hold. The wide
MLP takes one SGD step with momentum, one process alone (rank 0, the whole global batch),
then on every rank under

    DDP      DistributedDataParallel, PyTorch's defaults
    ZeRO-1   DDP with torch.distributed.optim.ZeroRedundancyOptimizer
    FSDP     fully_shard on each block, then on the root (train_fsdp.py's way)

After the step each rank counts, storage by storage (so a padded shard counts as allocated):
its parameters, its gradients and its optimizer state; during the forward pass, the bytes
autograd saves for backward, the weights left out (activations). Through the step it also
notes the bytes of weights it holds (its shards and the units gathered whole) as each layer
starts its forward and its backward, and as each block is done with either: the timeline of
gather, compute, free.

Then each strategy (and DDP with gradient_as_bucket_view=True) takes three more steps under
torch's own tracker, torch.distributed._tools' MemTracker (FSDPMemTracker for FSDP): a
TorchDispatchMode that sees the tensors made on the thread that runs it (not those a
communication library makes on its own threads), and notes the peak, by category, and each
FSDP block's peak in its forward. Its peak is started again before the last step, the one
that counts: the optimizer state exists through it, as in every step after the first. With
--device cuda (one GPU per rank, NCCL) the allocator's peaks over that step are read too:
torch.cuda.max_memory_allocated, and the bytes requested of it (memory_stats'
"requested_bytes.all.peak", before it rounds them up). Beside them, cuBLAS's workspaces: what
the allocator holds after the first step beyond the optimizer state made then. cuBLAS takes
one at the first matrix product of each handle and stream, and keeps it
(torch.backends.cuda.cublas_workspace_size() bytes each); the forward's thread and autograd's
backward thread each have their own handle.

The same steps can run in one process with nothing allocated: fake_peaks() (or
--fake-ranks N, without torchrun) tracks each rank in turn under FakeTensorMode, in a fake
process group of N ranks (torch.testing._internal.distributed.fake_pg), whose collectives
move nothing and have no thread of their own. So the tracker sees every rank's tensors as a
run makes them, the same bytes each time, for a model far larger than this machine.

Last, one tiny layer (nn.Linear(2, N), no bias: one row of weights per rank) is sharded with
fully_shard, and every rank keeps its pieces around the two collectives: its shard before the
all-gather and the whole weight after it; its own gradient before the reduce-scatter and its
shard of the average after it (float64).

Rank 0 writes OUT/memory.jsonl (one line per strategy and rank), OUT/peaks.jsonl (the
tracked peaks, one line per strategy and rank) and OUT/collectives.json (the tiny layer's
pieces, one entry per rank); with --fake-ranks, OUT/peaks.jsonl only.
"""
import contextlib
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_scripts.cli import UsageError, run_cli
from ddp_scripts.options import ArgumentParser, count
from ddp_scripts.ranks import init_process_group, leave_process_group
from ddp_scripts.fit.memory_plan import PEAK_STRATEGIES
from ddp_scripts.sharding import WideMLP

DTYPES = {"float32": torch.float32, "float64": torch.float64}
# The optimizers memory_plan plans, as a run makes them. Adam in its foreach form, CUDA's
# default, which memory_plan predicts (a CPU's default is its for-loop form).
OPTIMIZERS = {"sgd-momentum": (torch.optim.SGD, dict(lr=0.01, momentum=0.9)),
              "adam": (torch.optim.Adam, dict(lr=0.01, foreach=True))}


def storage_bytes(tensors):
    """Bytes of the distinct storages under these tensors (a DTensor's local part)."""
    storages = {}
    for tensor in tensors:
        if tensor is None:
            continue
        storage = (tensor.to_local() if isinstance(tensor, DTensor) else tensor).untyped_storage()
        storages[storage._cdata] = storage.nbytes()
    return sum(storages.values())


def build(strategy, width, depth, dtype, device, mesh=None, optimizer="sgd-momentum"):
    torch.manual_seed(0)
    model = WideMLP(width, depth)
    first = next(model.parameters())  # made in dtype already under fake_peak, whose fake
    if first.dtype != dtype or first.device != device:  # parameters .to() cannot swap
        model = model.to(device, dtype)
    if strategy == "FSDP":
        mesh = mesh or init_device_mesh(device.type, (dist.get_world_size(),))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif strategy in ("DDP", "ZeRO-1"):
        model = DDP(model)
    elif strategy == "DDP, bucket view":
        model = DDP(model, gradient_as_bucket_view=True)
    if isinstance(model, DDP) and dist.get_backend() == "fake":
        model.register_comm_hook(None, all_reduce_in_place)
    kind, settings = OPTIMIZERS[optimizer]
    if strategy == "ZeRO-1":
        return model, ZeroRedundancyOptimizer(model.parameters(), kind, **settings)
    return model, kind(model.parameters(), **settings)


def all_reduce_in_place(state, bucket):
    """DDP's all-reduce of a bucket, in place, as its own does, for the fake process group,
    whose work hands back no tensor for DDP's built-in hook to read."""
    buffer = bucket.buffer()
    dist.all_reduce(buffer)
    buffer.div_(dist.get_world_size())
    done = torch.futures.Future()
    done.set_result(buffer)
    return done


def weights_held(model, shards):
    """Bytes of weights this rank holds now: its shards, and the units gathered whole
    (under FSDP a gathered unit's parameters are plain tensors until it reshards)."""
    gathered = sum(p.numel() * p.element_size() for p in model.parameters()
                   if not isinstance(p, DTensor)) if shards else 0
    return storage_bytes(shards or list(model.parameters())) + gathered


def note_weights(model, shards, timeline, phase):
    """Note the weights held as each layer starts its forward, and as its backward starts
    (a hook on the layer's output, called when its gradient arrives)."""
    def note(name):
        timeline.append({"phase": phase[0], "layer": name, "bytes": weights_held(model, shards)})

    def in_backward(output, name):
        if output.requires_grad:
            output.register_hook(lambda grad: note(name))

    def after_backward(inputs, name):  # the input's gradient is complete: the unit is done
        for tensor in inputs:
            if torch.is_tensor(tensor) and tensor.requires_grad:
                tensor.register_hook(lambda grad: note(name))

    for name, layer in model.named_modules():
        if not list(layer.children()):
            layer.register_forward_pre_hook(lambda m, inputs, name=name: note(name))
            layer.register_forward_hook(lambda m, inputs, output, name=name:
                                        in_backward(output, name))
    for index, block in enumerate(model.blocks):  # FSDP's units: noted once each is done
        done = f"blocks.{index} done"
        # Run after FSDP's own hooks (it frees the unit in its forward hook), and before them
        # (to see the input as it came, whose gradient comes after FSDP's post-backward).
        block.register_forward_hook(lambda m, inputs, output, done=done: note(done))
        block.register_forward_pre_hook(lambda m, inputs, done=done: after_backward(inputs, done),
                                        prepend=True)
    return note


def one_step(strategy, args, batch, device):
    dtype = DTYPES[args.dtype]
    model, optimizer = build(strategy, args.width, args.depth, dtype, device)
    plain = model.module if isinstance(model, DDP) else model
    shards = list(plain.parameters()) if strategy == "FSDP" else []
    generator = torch.Generator().manual_seed(dist.get_rank())
    images = torch.randn(batch, 3, 32, 32, generator=generator, dtype=dtype).to(device)
    labels = torch.randint(0, 10, (batch,), generator=generator).to(device)
    timeline, phase, saved = [], ["forward"], {}
    note = note_weights(plain, shards, timeline, phase)

    def pack(tensor):  # what autograd saves for backward, the weights (gathered or not) left out
        weights = {p.untyped_storage()._cdata for p in plain.parameters()}
        storage = tensor.untyped_storage()
        if storage._cdata not in weights:
            saved[storage._cdata] = storage.nbytes()
        return tensor

    note("start")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = F.cross_entropy(model(images), labels)
    note("loss")
    phase[0] = "backward"
    loss.backward()
    phase[0] = "step"
    optimizer.step()
    note("end")
    state = (optimizer.optim if strategy == "ZeRO-1" else optimizer).state
    return {"strategy": strategy, "rank": dist.get_rank(), "batch": batch,
            "parameters": storage_bytes(shards or list(plain.parameters())),
            "gradients": storage_bytes([p.grad for p in shards or plain.parameters()]),
            "optimizer": storage_bytes([v for s in state.values() for v in s.values()
                                        if torch.is_tensor(v) and v.dim() > 0]),
            "activations": sum(saved.values()), "timeline": timeline}


def note_where_the_peak_rises(tracker, where):
    """Keep in where[0] the point of the step at which the tracker's peak last rose: the
    innermost module running, in forward or backward (or the optimizer step). The tracker
    keeps no such record; this wraps the method that updates its peak."""
    update = tracker._update_peak_stats

    def wrapped(state):
        before = dict(tracker._peak_mem)
        update(state)
        if tracker._peak_mem != before:
            names = [name for name in tracker._mod_tracker.parents if "." in name]
            inner = max(names, key=lambda name: name.count("."), default="")
            inner = inner.split(".", 1)[1].removeprefix("module.") if inner else "the root"
            phase = "backward" if tracker._mod_tracker.is_bw else "forward"
            where[0] = "optimizer step" if tracker._in_opt else f"{phase} of {inner}"

    tracker._update_peak_stats = wrapped


def forget_the_peak(tracker):
    """Start the tracker's overall peak again, so that it is the measured step's: its
    reset_mod_stats clears only the per-module counts (mem_tracker.py:875-879), and the peak
    lives in _peak_mem and _peak_mem_snap (mem_tracker.py:376-377, 521-523)."""
    if hasattr(tracker, "_peak_mem"):
        tracker._peak_mem.clear()
        tracker._peak_mem_snap.clear()


def forward_peaks(tracker, model):
    """{"blocks.i": bytes}: the tracker's peak in each block's forward, its all-gather
    included (FSDPMemTracker's Peak-Forward snapshot of the module, the last step's)."""
    peaks = {}
    for index, block in enumerate(model.blocks):
        snapshots = tracker.memory_tracking[block].snapshots
        state = next(state for state in snapshots if state.name == "PEAK_FW")
        peaks[f"blocks.{index}"] = next(iter(snapshots[state][-1].values()))["Total"]
    return peaks


# Steps under the tracker; the last is measured. By then every op has run once, so the
# tracker sees only what a step allocates (torch 2.11's tracker also counted the shapes that
# DTensor works out, on fake tensors of its own, the first time it meets an op).
TRACKED_STEPS = 3


def tracked_peak(strategy, width, depth, batch, dtype, device, mesh=None,
                 optimizer="sgd-momentum"):
    """TRACKED_STEPS steps under torch's tracker; the last step's peak, in bytes, with its
    categories and the point where it last rose (and, on a GPU, the allocator's peaks)."""
    generator = torch.Generator().manual_seed(dist.get_rank() if dist.is_initialized() else 0)
    images = torch.randn(batch, 3, 32, 32, generator=generator, dtype=dtype).to(device)
    labels = torch.randint(0, 10, (batch,), generator=generator).to(device)
    kind = optimizer
    if strategy == "FSDP":  # FSDPMemTracker takes the sharded model; made outside it
        model, optimizer = build(strategy, width, depth, dtype, device, mesh, kind)
        tracker = FSDPMemTracker(model, optimizer)
        tracker.track_inputs((images, labels))
    else:  # made inside the tracker, so that it sees DDP's buckets allocated
        tracker = MemTracker()
        tracker.track_external(images, labels)
    where = [None]
    note_where_the_peak_rises(tracker, where)
    with tracker:
        if strategy != "FSDP":
            model, optimizer = build(strategy, width, depth, dtype, device, optimizer=kind)
        if device.type == "cuda":  # the workspaces an earlier strategy left: the first step
            torch._C._cuda_clearCublasWorkspaces()  # makes its own, measured below
        before = requested(device)
        for step in range(TRACKED_STEPS):
            if step:
                tracker.reset_mod_stats()  # its per-module counts refuse a second step
            if step == TRACKED_STEPS - 1:
                forget_the_peak(tracker)
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()
            optimizer.zero_grad()  # set_to_none=True, PyTorch's default
            if step == 0 and device.type == "cuda":  # kept from the first step on: the
                # optimizer state, and cuBLAS's workspaces
                state = (optimizer.optim if strategy == "ZeRO-1" else optimizer).state
                workspaces = requested(device) - before - storage_bytes(
                    [v for s in state.values() for v in s.values() if torch.is_tensor(v)])
        peak = tracker.get_tracker_snapshot("peak")
    forward = forward_peaks(tracker, model) if strategy == "FSDP" else {}
    snapshot = next(iter(peak.values()))
    categories = {str(getattr(key, "value", key)): value for key, value in snapshot.items()}
    record = {"strategy": strategy, "rank": dist.get_rank() if dist.is_initialized() else 0,
              "batch": batch, "tracked_peak": categories.pop("Total"), "tracked_at": where[0],
              "categories": categories, "forward_peaks": forward,
              "max_memory_allocated": None, "requested_peak": None, "cublas_workspaces": None}
    if device.type == "cuda":
        record.update(max_memory_allocated=torch.cuda.max_memory_allocated(device),
                      requested_peak=torch.cuda.memory_stats(device)[
                          "requested_bytes.all.peak"], cublas_workspaces=workspaces)
    return record


def requested(device):
    """The bytes the CUDA caching allocator holds for its callers now, as they asked for them
    (before it rounds each up to a multiple of 512 bytes); 0 off a GPU."""
    if device.type != "cuda":
        return 0
    return torch.cuda.memory_stats(device)["requested_bytes.all.current"]


def fake_peak(strategy, width, depth, batch, ranks, rank, dtype, optimizer="sgd-momentum"):
    """tracked_peak for one rank of `ranks`, in this process, in a fake process group: each
    tensor made under FakeTensorMode, with shapes and no memory. DDP's rows are the
    exception: its Reducer reads its tensors' data (it checks their shapes across the ranks
    and rebuilds its buckets after the first step), so they run on real tensors, which the
    fake group's collectives leave alone."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # the "fake" backend
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=ranks)
    default = torch.get_default_dtype()
    try:
        # the mesh made outside the fake mode: it reads its ranks from a tensor
        mesh = init_device_mesh("cpu", (ranks,)) if strategy == "FSDP" else None
        torch.set_default_dtype(dtype)  # made in dtype, since .to() keeps no fake parameter
        fake = FakeTensorMode() if strategy in ("one process", "FSDP") else contextlib.nullcontext()
        with fake:
            return {**tracked_peak(strategy, width, depth, batch, dtype, torch.device("cpu"),
                                   mesh, optimizer), "rank": rank, "mode": "fake"}
    finally:
        torch.set_default_dtype(default)
        leave_process_group()  # after every DDP model is freed


def fake_peaks(width, depth, global_batch_size, ranks, dtype, strategies=PEAK_STRATEGIES,
               optimizer="sgd-momentum"):
    """fake_peak for every strategy and rank (one process: one rank, the whole batch), as the
    lines of peaks.jsonl; `optimizer` a key of OPTIMIZERS."""
    settings = {"world_size": ranks, "width": width, "depth": depth,
                "dtype": str(dtype).removeprefix("torch."),
                "global_batch_size": global_batch_size, "device": "cpu"}
    if global_batch_size % ranks:
        raise UsageError(f"--global-batch-size {global_batch_size} does not split over "
                         f"{ranks} ranks")
    return [{**settings, **fake_peak(strategy, width, depth, global_batch_size // n, n, rank,
                                     dtype, optimizer)}
            for strategy in strategies
            for n in [1 if strategy == "one process" else ranks] for rank in range(n)]


def tiny_collectives(device):
    """The tiny layer's pieces on this rank, before and after FSDP's all-gather and
    reduce-scatter, as lists of numbers."""
    torch.manual_seed(0)  # the same weights on every rank, as fully_shard expects
    layer = nn.Linear(2, dist.get_world_size(), bias=False).to(device, torch.float64)
    fully_shard(layer, mesh=init_device_mesh(device.type, (dist.get_world_size(),)))
    pieces = {"shard before all-gather": layer.weight.to_local().tolist()}

    def gathered(module, inputs):  # runs after FSDP's own pre-forward hook: the unit is whole
        pieces["whole after all-gather"] = module.weight.detach().tolist()
        module.weight.register_hook(  # the whole gradient, before FSDP reduce-scatters it
            lambda grad: pieces.update({"gradient before reduce-scatter": grad.tolist()}))

    layer.register_forward_pre_hook(gathered)
    generator = torch.Generator().manual_seed(dist.get_rank())  # each rank its own batch
    inputs = torch.randn(2, 2, generator=generator, dtype=torch.float64).to(device)
    layer(inputs).square().sum().backward()
    pieces["shard after reduce-scatter"] = layer.weight.grad.to_local().tolist()
    return {"rank": dist.get_rank(), **pieces}


def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--width", type=count, default=256)
    parser.add_argument("--depth", type=count, default=4)
    parser.add_argument("--global-batch-size", type=count, default=32)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float64")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: the tracked steps on one GPU per rank (NCCL)")
    parser.add_argument("--fake-ranks", type=count, default=None,
                        help="track this many ranks in this one process, nothing allocated "
                             "(without torchrun); writes peaks.jsonl only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.fake_ranks:
        records = fake_peaks(args.width, args.depth, args.global_batch_size, args.fake_ranks,
                             DTYPES[args.dtype])
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "peaks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return
    # a rank that never comes ends the others in two minutes, not thirty
    device = torch.device("cpu")
    if args.device == "cuda":  # one GPU per rank: torchrun's LOCAL_RANK
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    init_process_group(device, timeout_s=120)
    ranks = dist.get_world_size()
    if args.global_batch_size % ranks:
        raise UsageError(f"--global-batch-size {args.global_batch_size} does not split over "
                         f"{ranks} ranks")
    records = []
    if dist.get_rank() == 0:  # one process: no process group in the step, the whole batch
        records.append(one_step("one process", args, args.global_batch_size, device))
    for strategy in ("DDP", "ZeRO-1", "FSDP"):
        records.append(one_step(strategy, args, args.global_batch_size // ranks, device))
    peaks, dtype = [], DTYPES[args.dtype]
    if dist.get_rank() == 0:
        peaks.append(tracked_peak("one process", args.width, args.depth,
                                  args.global_batch_size, dtype, device))
    for strategy in PEAK_STRATEGIES[1:]:
        peaks.append(tracked_peak(strategy, args.width, args.depth,
                                  args.global_batch_size // ranks, dtype, device))
    tiny = tiny_collectives(device)
    everyone = [None] * ranks
    dist.all_gather_object(everyone, (records, peaks, tiny))
    if dist.get_rank() == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        settings = {"world_size": ranks, "width": args.width, "depth": args.depth,
                    "dtype": args.dtype, "global_batch_size": args.global_batch_size,
                    "device": args.device}
        for name, index in (("memory.jsonl", 0), ("peaks.jsonl", 1)):
            lines = [json.dumps({**settings, **r}) for rank in everyone for r in rank[index]]
            (out / name).write_text("\n".join(lines) + "\n")
        (out / "collectives.json").write_text(json.dumps([rank[2] for rank in everyone]))
    dist.barrier()
    leave_process_group()  # after every DDP model is freed


if __name__ == "__main__":
    run_cli(main)
