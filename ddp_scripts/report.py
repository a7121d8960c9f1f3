"""What a run says about itself: how it was made, on every line of metrics.jsonl (run_context;
rank 0 also says where it trains), and once it has finished, run.json (write_summary).
"""
import json
import time
from pathlib import Path

import torch.distributed as dist

from ddp_scripts.checkpoints import write_atomically
from ddp_scripts.devices import say_device
from ddp_scripts.hardware import describe_hardware
from ddp_scripts.runfiles import SUMMARY


def run_context(args, device, strategy, threads, data_source, world_size=1, gpus=None, **levers):
    """What every line of metrics.jsonl records about how the run was made; `levers`: the
    options of chapter 10 (train_fast.py, speed.lever_settings). Rank 0 also says, once, on
    which device the run trains."""
    if gpus is None:
        gpus = world_size if device.type == "cuda" else 0
    say_device(device, args.device, world_size, gpus)
    return {"world_size": world_size, "device": str(device),
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "strategy": strategy, "gpus": gpus, "threads": threads,
            "batch_size": args.batch_size, "global_batch_size": args.batch_size * world_size,
            "dtype": args.dtype, "tf32": args.tf32, "dataset": data_source, **levers}


def write_summary(out, strategy, device, start, train_start, args, world_size=1, **extra):
    """OUT/run.json, once the run has finished: times, hardware, options; `extra`: more keys
    to record."""
    end = time.perf_counter()  # the clock the scripts' START was read from
    summary = {"strategy": strategy, "world_size": world_size,
               "startup_s": train_start - start, "train_s": end - train_start,
               "total_s": end - start, "hardware": describe_hardware(device), "args": vars(args),
               **extra}
    write_atomically(Path(out) / SUMMARY, lambda f: f.write(json.dumps(summary, indent=1)),
                     mode="w")
