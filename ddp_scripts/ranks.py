"""Between ranks: everything here is a collective (every rank must call it) or a no-op
without a process group, so that train_single.py can call the same functions.
"""
import datetime
import os
from pathlib import Path

import torch
import torch.distributed as dist

from ddp_scripts.cli import NothingToDo, UsageError


def world_size():
    """The processes in the group: 1 without one (a one-process run)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def backend_for(device):
    """nccl talks GPU to GPU; gloo works on CPUs (and is the only choice without a GPU)."""
    return "nccl" if device.type == "cuda" else "gloo"


def require_torchrun(script):
    """The DDP scripts learn their rank from torchrun's variables: say so if they are missing.
    `script`: the script's name or path (its __file__)."""
    example = f"torchrun --standalone --nproc_per_node 2 ddp_scripts/{Path(script).name} ..."
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    if "LOCAL_RANK" not in os.environ:
        raise UsageError(f"LOCAL_RANK is not set: start this script with torchrun, e.g. {example}")
    missing = [name for name in names if name not in os.environ]
    if missing:
        raise UsageError(f"{', '.join(missing)} not set, although LOCAL_RANK is: start this "
                         f"script with torchrun, which sets all of {', '.join(names)}, e.g. {example}")
    value = {name: os.environ[name] for name in names}
    if not all(text.isdigit() for text in value.values()):
        raise UsageError(f"torchrun's variables must be whole numbers, got {value}")
    rank, world, local_rank, local_world = (int(value[name]) for name in names)
    if not (rank < world and local_rank < local_world <= world):
        raise UsageError(f"torchrun's variables contradict each other ({value}): need RANK < "
                         "WORLD_SIZE and LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE")


GROUP = {}  # the group's settings, once init_process_group has made it: timeout_s


def init_process_group(device, timeout_s):
    """Join the group torchrun set up (MASTER_ADDR, RANK, WORLD_SIZE in the environment).
    On a GPU the group is bound to this process's device (device_id), so that nccl's
    collectives, barriers included, run on it and on no other."""
    if device.type == "mps":
        raise UsageError("MPS runs one process only: use train_single.py --device mps")
    if device.type == "cuda":
        # device_id only binds the group; a bare "cuda" tensor (all_gather_object's
        # staging, below) still lands on the current device, which must be this one.
        torch.cuda.set_device(device)
    try:
        dist.init_process_group(backend=backend_for(device),
                                timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)
    except (dist.DistStoreError, dist.DistNetworkError) as error:  # a rank never came
        from ddp_scripts.mishaps import ranks_missing
        raise ranks_missing(error, timeout_s) from None
    GROUP["timeout_s"] = timeout_s  # a download the other ranks wait for ends well within it
    check_one_gpu_per_rank(device)


def check_one_gpu_per_rank(device):
    """Two ranks on one GPU: say so in one line. NCCL itself refuses them while
    init_process_group connects the ranks (device_id binds the group to the GPU, so the
    connection is made there), unless NCCL_MULTI_RANK_GPU_ENABLE=1 allows it; this check
    speaks for the case NCCL lets through, where the ranks would contend for one GPU."""
    if device.type != "cuda" or dist.get_world_size() == 1:
        return
    # Over the group just made (nccl, on the GPU torch.cuda.set_device chose): a second
    # group, of gloo, would need a network interface of its own on every node.
    uuids = [None] * dist.get_world_size()
    dist.all_gather_object(uuids, str(torch.cuda.get_device_properties(device).uuid))
    for rank, uuid in enumerate(uuids):
        if uuids.index(uuid) != rank:
            raise UsageError(f"ranks {uuids.index(uuid)} and {rank} were given the same GPU "
                             f"({uuid}): start one process per GPU")


def barrier():
    """Wait for every rank (a no-op without a process group)."""
    if dist.is_initialized():
        dist.barrier()


def on_rank_0(function, *args):
    """Run function(*args) on rank 0 only; every rank gets its result, or its UsageError
    (or NothingToDo).

    For what only rank 0 can decide. OUT is on rank 0's disk: on several nodes without a
    shared file system the others cannot see it, and each deciding alone would start some
    ranks at epoch 1 while rank 0 resumes, to hang at the first all-reduce.
    """
    if not dist.is_initialized():
        return function(*args)
    answer = [None]
    if dist.get_rank() == 0:
        try:
            answer = [(True, function(*args))]
        except (UsageError, NothingToDo) as error:
            answer = [(False, error)]
    dist.broadcast_object_list(answer, src=0)
    succeeded, value = answer[0]
    if not succeeded:
        raise value
    return value


def agree_on_data_source(source, data_dir):
    """Stop, on every rank, unless every rank loaded the same data set."""
    if not dist.is_initialized():
        return
    sources = [None] * dist.get_world_size()
    dist.all_gather_object(sources, source)
    if len(set(sources)) > 1:
        odd = [rank for rank, other in enumerate(sources) if other != sources[0]]
        raise UsageError(f"the ranks loaded different data: rank 0 {sources[0]!r}, ranks {odd} "
                         f"{sources[odd[0]]!r}; put CIFAR-10 in {data_dir!r} on every node "
                         "(or use a shared file system), or pass --dataset synthetic")


def reduce_sum(totals):
    """Add a tensor of totals over all ranks (a no-op without a process group)."""
    if dist.is_initialized():
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    return totals


def average_buffers(model):
    """Average BatchNorm's running statistics over the ranks (a no-op without a group).

    DDP copies rank 0's buffers to every rank before each forward pass, but each rank then
    updates them on its own batch: after the last step the ranks hold different statistics.
    Averaged, every rank evaluates, and rank 0 saves, the same model."""
    if not dist.is_initialized():
        return
    for buffer in model.buffers():
        if buffer.is_floating_point():
            dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
            buffer /= dist.get_world_size()
