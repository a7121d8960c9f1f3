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
from ddp_scripts.recorders.memory_run import TRACKED_STEPS, forget_the_peak, note_where_the_peak_rises

OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.01, foreach=True),
    "sgd-momentum": lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=True),
    "adam": lambda params: torch.optim.Adam(params, foreach=True),
    "adamw": lambda params: torch.optim.AdamW(params, foreach=True),
}


def checkpointed(unit):
    """Activation checkpointing of one unit: it keeps only its input for backward and runs
    its forward again there (torch.utils.checkpoint, non-reentrant)."""
    forward = unit.forward
    unit.forward = lambda *inputs, **kwargs: torch.utils.checkpoint.checkpoint(
        forward, *inputs, use_reentrant=False, **kwargs)


def tracked_peak(model, units, setup, rank=0):
    """The tracker's peak over the last of TRACKED_STEPS steps, for `rank` of setup["ranks"]:
    {"peak", "at" (the point where it last rose), "categories"}."""
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
            optimizer = OPTIMIZERS[setup["optimizer"]](fake.parameters())
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
        return {"peak": categories.pop("Total"), "at": where[0], "categories": categories}
    finally:
        if fsdp:
            leave_process_group()

