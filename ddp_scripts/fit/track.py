"""torch's own memory tracker on the reader's model: two training steps in this process,
nothing allocated, the second step's peak kept.

The model runs under FakeTensorMode. One process stands for one rank; for FSDP it joins a
fake process group of N ranks (torch.testing._internal.distributed.fake_pg), whose
collectives move nothing. torch.distributed._tools' MemTracker (FSDPMemTracker for FSDP)
counts every tensor the step makes, by category, and its peak. DDP's Reducer cannot run
under FakeTensorMode (it reads its tensors' data), so a DDP rank is tracked as one process
on its share of the batch, and rules.py's bucket rule is added to it.
"""
import contextlib

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker

from ddp_scripts.fit.trace import MASTER, fake_model, loss_of, sample_input
from ddp_scripts.ranks import leave_process_group
# TRACKED_STEPS: the last is measured, once every op has run (memory_run.py says why).
from ddp_scripts.fit.memory_run import TRACKED_STEPS, forget_the_peak, note_where_the_peak_rises

# The step as a GPU takes it: all tensors at once (foreach), PyTorch's default on CUDA.
OPTIMIZERS = {
    "sgd": lambda params, foreach=True: torch.optim.SGD(params, lr=0.01, foreach=foreach),
    "sgd-momentum": lambda params, foreach=True: torch.optim.SGD(params, lr=0.01, momentum=0.9,
                                                               foreach=foreach),
    "adam": lambda params, foreach=True: torch.optim.Adam(params, foreach=foreach),
    "adamw": lambda params, foreach=True: torch.optim.AdamW(params, foreach=foreach),
}
_COUNTS_FOREACH_ON_DTENSORS = []


def counts_more_for_foreach_on_dtensors(mesh):
    """Whether this torch's tracker counts a foreach step on sharded parameters (DTensors) at
    more than the step holds, every step: torch 2.11's does (the shapes DTensor works out, on
    fake tensors of its own), 2.14's does not. Asked once, of two small sharded layers and
    their root, in fake mode: does the tracker's optimizer state exceed the momentum's shards?"""
    if not _COUNTS_FOREACH_ON_DTENSORS:
        from torch.distributed.fsdp import fully_shard
        n = mesh.size()
        model = torch.nn.Sequential(torch.nn.Linear(8, 8 * n), torch.nn.Linear(8 * n, 4 * n))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = OPTIMIZERS["sgd-momentum"](model.parameters())
        tracker = FSDPMemTracker(model, optimizer)
        with tracker:
            for step in range(TRACKED_STEPS):
                if step:
                    tracker.reset_mod_stats()
                if step == TRACKED_STEPS - 1:
                    forget_the_peak(tracker)
                model(torch.zeros(1, 8)).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
        peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
        counted = {str(getattr(k, "value", k)): v for k, v in peak.items()}["OptState"]
        held = sum(state["momentum_buffer"].to_local().untyped_storage().nbytes()
                   for state in optimizer.state.values())
        _COUNTS_FOREACH_ON_DTENSORS.append(counted > held)
    return _COUNTS_FOREACH_ON_DTENSORS[0]


def checkpointed(unit):
    """Activation checkpointing of one unit: it keeps only its input for backward and runs
    its forward again there (torch.utils.checkpoint, non-reentrant)."""
    forward = unit.forward
    unit.forward = lambda *inputs, **kwargs: torch.utils.checkpoint.checkpoint(
        forward, *inputs, use_reentrant=False, **kwargs)


def tracked_peak(model, units, setup, rank=0):
    """The tracker's peak over the last of TRACKED_STEPS steps, for `rank` of setup["ranks"]:
    {"peak", "at" (the point where it last rose), "categories", "one_at_a_time" (the step
    tracked one tensor at a time: counts_more_for_foreach_on_dtensors)}."""
    strategy, ranks = setup["strategy"], setup["ranks"]
    fsdp = strategy.startswith("fsdp")
    master = MASTER[setup["precision"]]
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.testing._internal.distributed.fake_pg import FakeStore
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=ranks)
    try:
        mesh = init_device_mesh("cpu", (ranks,)) if fsdp else None
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.unit_list = units
            fake, fake_units = fake_model(model, master)
            if setup["checkpointing"]:
                for unit in fake_units:
                    checkpointed(unit)
            if fsdp:
                reshard = strategy == "fsdp"
                for unit in fake_units:
                    fully_shard(unit, mesh=mesh, reshard_after_forward=reshard)
                fully_shard(fake, mesh=mesh, reshard_after_forward=reshard)
            # Where the tracker would count phantom tensors, it tracks the step one tensor at
            # a time: on shards, the step's own temporaries are small beside the peak.
            one_at_a_time = fsdp and counts_more_for_foreach_on_dtensors(mesh)
            optimizer = OPTIMIZERS[setup["optimizer"]](fake.parameters(), foreach=not one_at_a_time)
            dtype = setup["input_dtype"]
            inputs = sample_input(setup["input_shape"], master if dtype.is_floating_point else dtype,
                                  setup["batch"])
            if fsdp:
                tracker = FSDPMemTracker(fake, optimizer)
                tracker.track_inputs((inputs,))
            else:
                tracker = MemTracker()
                tracker.track_external(fake, optimizer, inputs)
            where = [None]
            note_where_the_peak_rises(tracker, where)
            autocast = (torch.autocast("cpu", dtype=torch.bfloat16)
                        if setup["precision"] == "bf16-autocast" else contextlib.nullcontext())
            with tracker:
                for step in range(TRACKED_STEPS):
                    if step:
                        tracker.reset_mod_stats()   # it tracks one iteration at a time
                    if step == TRACKED_STEPS - 1:
                        forget_the_peak(tracker)
                    with autocast:
                        loss = loss_of(fake(inputs))
                    loss.backward()
                    del loss
                    optimizer.step()
                    optimizer.zero_grad()
                peak = tracker.get_tracker_snapshot("peak")
        snapshot = next(iter(peak.values()))
        categories = {str(getattr(k, "value", k)).removeprefix("_FSDPRefType."): v
                      for k, v in snapshot.items()}
        return {"peak": categories.pop("Total"), "at": where[0], "categories": categories,
                "one_at_a_time": one_at_a_time}
    finally:
        if fsdp:
            leave_process_group()

