"""Between ranks: everything here is a collective (every rank must call it) or a no-op
without a process group, so that train_single.py can call the same functions.
"""
import datetime
import gc
import os

import torch
import torch.distributed as dist

from ddp_scripts.cli import NothingToDo, UsageError

# What torchrun tells each worker about its place: a DDP script needs all four, and a script
# of one process ignores any left over in the shell.
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def world_size():
    """The processes in the group: 1 without one (a one-process run)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def backend_for(device):
    """nccl talks GPU to GPU; gloo works on CPUs (and is the only choice without a GPU)."""
    return "nccl" if device.type == "cuda" else "gloo"


def require_torchrun(script):
    """The DDP scripts learn their rank from torchrun's variables: say so if they are missing
    or contradict each other. `script`: the script's name or path (its __file__)."""
    value = [os.environ.get(name, "") for name in TORCHRUN_VARIABLES]
    if all(text.isdigit() for text in value):
        rank, world, local_rank, local_world = map(int, value)
        if rank < world and local_rank < local_world <= world:
            check_master()  # torchrun sets both; by hand, one may be missing or mistyped
            return
    from ddp_scripts.mishaps import not_started_by_torchrun
    raise not_started_by_torchrun(script, TORCHRUN_VARIABLES)


def check_master():
    """MASTER_ADDR and MASTER_PORT, where rank 0 waits for the others: set, and a port number."""
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if missing:
        raise UsageError(f"{' and '.join(missing)} not set, although RANK and WORLD_SIZE are: "
                         "set MASTER_ADDR to rank 0's address and MASTER_PORT to a free port, "
                         "or start the script with torchrun, which sets them")
    port = os.environ["MASTER_PORT"]
    if not (port.isdigit() and 1 <= int(port) <= 65535):
        raise UsageError(f"MASTER_PORT must be a port number, 1 to 65535, got {port!r}")


GROUP = {}  # the group's settings, once init_process_group has made it: timeout_s


def init_process_group(device, timeout_s):
    """Join the group torchrun set up (MASTER_ADDR, RANK, WORLD_SIZE in the environment), on
    a GPU bound to this process's device (device_id): nccl's collectives run there only."""
    if device.type == "mps":
        raise UsageError("MPS runs one process only: use train_single.py --device mps")
    if device.type == "cuda":  # a bare "cuda" tensor (all_gather_object's) goes to the current one
        torch.cuda.set_device(device)
    try:
        dist.init_process_group(backend=backend_for(device),
                                timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)
    except (dist.DistStoreError, dist.DistNetworkError) as error:  # a rank never came
        from ddp_scripts.mishaps import port_taken, ranks_missing
        raise port_taken(error) or ranks_missing(error, timeout_s) from None
    GROUP["timeout_s"] = timeout_s  # a download the other ranks wait for ends well within it
    check_one_gpu_per_rank(device)


def leave_process_group():
    """Leave the group at the end of a run, after `del model`: DDP's C++ Reducer must not hold
    the group's last reference. If it does, freeing it frees the group with the GIL held, while
    gloo joins a worker thread that may wait for the GIL to free a finished collective's tensors:
    on torch 2.11-2.13 the rank then hangs as it exits, deaf to SIGTERM (chapter 8). gc.collect()
    frees a model held in a reference cycle, which `del` alone leaves alive."""
    gc.collect()
    dist.destroy_process_group()


def check_one_gpu_per_rank(device):
    """Two ranks on one GPU: one line. NCCL refuses them as the group connects, unless
    NCCL_MULTI_RANK_GPU_ENABLE=1 lets them through to contend for the GPU; this says so."""
    if device.type != "cuda" or dist.get_world_size() == 1:
        return
    uuids = [None] * dist.get_world_size()  # over the nccl group: gloo would need a network
    dist.all_gather_object(uuids, str(torch.cuda.get_device_properties(device).uuid))
    if len(set(uuids)) < len(uuids):
        from ddp_scripts.mishaps import gpu_shared
        raise gpu_shared(uuids)


def barrier():
    """Wait for every rank (a no-op without a process group)."""
    if dist.is_initialized():
        dist.barrier()


def on_rank_0(function, *args):
    """Run function(*args) on rank 0 only; every rank gets its result, or its UsageError (or
    NothingToDo). OUT is on rank 0's disk: ranks that each looked could start at different
    epochs, and hang at the first all-reduce."""
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
        from ddp_scripts.mishaps import data_differs
        raise data_differs(sources, data_dir)


def reduce_sum(totals):
    """Add a tensor of totals over all ranks (a no-op without a process group)."""
    if dist.is_initialized():
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    return totals


def average_buffers(model):
    """Average BatchNorm's running statistics over the ranks (a no-op without a group): DDP
    copies rank 0's buffers before each forward, but each rank then updates them on its own
    batch. Averaged, every rank evaluates, and rank 0 saves, the same model."""
    if not dist.is_initialized():
        return
    for buffer in model.buffers():
        if buffer.is_floating_point():
            dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
            buffer /= dist.get_world_size()
