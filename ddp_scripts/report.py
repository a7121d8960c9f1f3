"""What a run says about itself: how it was made, on every line of metrics.jsonl (run_context;
rank 0 also says where it trains), and once it has finished, run.json (write_summary).
"""
import json
import time
from pathlib import Path

import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule

from ddp_scripts.checkpoints import write_atomically
from ddp_scripts.devices import say_device
from ddp_scripts.ranks import on_rank_0, world_size
from ddp_scripts.runfiles import SUMMARY


def strategy_of(model):
    """How the model is spread, read from its class: "dp", "ddp", "fsdp" or "single"."""
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper (train_fast.py --compile)
    if isinstance(model, nn.DataParallel):
        return "dp"
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return "ddp"
    return "fsdp" if isinstance(model, FSDPModule) else "single"


def run_context(args, device, model, threads, data_source, **levers):
    """What every line of metrics.jsonl records about how the run was made (`levers`: chapter
    10's options). Rank 0 also says where it trains, and checks a resume's data source."""
    if args.resume:
        from ddp_scripts.mishaps import check_same_data
        on_rank_0(check_same_data, args.out, data_source)
    processes = world_size()
    gpus = processes if device.type == "cuda" else 0
    if isinstance(model, nn.DataParallel):
        gpus = len(model.device_ids)
    say_device(device, args.device, processes, gpus)
    return {"world_size": processes, "device": str(device),
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "strategy": strategy_of(model), "gpus": gpus, "threads": threads,
            "batch_size": args.batch_size, "global_batch_size": args.batch_size * processes,
            "dtype": args.dtype, "tf32": args.tf32, "dataset": data_source, **levers}


def write_summary(out, model, device, train_start, args, **extra):
    """OUT/run.json, once the run has finished: times (start-up from the process's start),
    hardware, options; `extra`: more keys to record."""
    # The machine and the process's age (nvidia-smi, cgroups, /proc): measurement, not the lesson.
    from ddp_scripts.measure.hardware import describe_hardware, seconds_since_start
    end = time.perf_counter()
    start = end - seconds_since_start()  # the process's start, on perf_counter's clock
    summary = {"strategy": strategy_of(model), "world_size": world_size(),
               "startup_s": train_start - start, "train_s": end - train_start,
               "total_s": end - start, "hardware": describe_hardware(device), "args": vars(args),
               **extra}
    try:
        write_atomically(Path(out) / SUMMARY, lambda f: f.write(json.dumps(summary, indent=1)),
                         mode="w")
    except OSError as error:  # a full disk, say: the training itself is saved
        from ddp_scripts.mishaps import summary_not_written
        raise summary_not_written(out, error) from None
