"""What a run says about itself: how it was made, on every line of metrics.jsonl (run_context;
rank 0 also says where it trains), and once it has finished, run.json (write_summary).
"""
import json
import os
import time
from pathlib import Path

import psutil
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
    """What every line of metrics.jsonl records about how the run was made; `levers`: the
    options of chapter 10 (train_fast.py, speed.lever_settings). Rank 0 also says, once, on
    which device the run trains, and checks that a resumed run trains on the same data."""
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
    """OUT/run.json, once the run has finished: times, hardware, options; `extra`: more keys
    to record. The start-up is timed from the process's start (started_at), so that the
    scripts need no clock before their imports."""
    # The machine, for the record (nvidia-smi, cgroups): measurement plumbing, not the lesson.
    from ddp_scripts.measure.hardware import describe_hardware
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


def seconds_since_start():
    """How long ago this process started. On Linux from /proc, in 10 ms steps (psutil's
    create_time adds the boot time in whole seconds); elsewhere from psutil."""
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        started = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        return uptime - started / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time() - psutil.Process().create_time()
