"""Each worker of a torchrun job writes down who it is: one JSON file per global rank.

    torchrun --nnodes 2 --nproc-per-node 2 --node-rank 0 --master-addr 127.0.0.1 \\
             --master-port 29500 ddp_scripts/recorders/who_am_i.py --out runs/who

It records the variables torchrun gave it (RANK, LOCAL_RANK, GROUP_RANK: the node rank,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), its host name, and three moments:
when its launcher (torchrun, its parent process) started, when the worker itself started,
and when it had joined the process group. It also records CUDA_VISIBLE_DEVICES, torch's
reading of it, and the device pick_device gives its LOCAL_RANK (with the GPU's UUID), or why
it gives none. Chapters 3 and 6 draw the job from these files.
"""
import datetime
import json
import os
import socket
import time
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from ddp_scripts.cli import UsageError, run_cli
from ddp_scripts.devices import pick_device
from ddp_scripts.options import ArgumentParser, seconds

VARIABLES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
             "MASTER_ADDR", "MASTER_PORT")


def main():
    parser = ArgumentParser(description="Write what torchrun told this worker, as JSON.")
    parser.add_argument("--out", type=Path, required=True, help="folder for worker-RANK.json")
    parser.add_argument("--timeout-s", type=seconds, default=60.0,
                        help="how long to wait for the other workers")
    args = parser.parse_args()
    missing = [name for name in VARIABLES if name not in os.environ]
    if missing:
        raise UsageError(f"{', '.join(missing)} not set: start this script with torchrun")
    me = psutil.Process()
    record = {name: os.environ[name] for name in VARIABLES}
    record.update(hostname=socket.gethostname(), pid=me.pid,
                  launcher_started=me.parent().create_time(), worker_started=me.create_time())
    record.update(CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES"),
                  visible_parsed=torch.cuda._parse_visible_devices(), gpu_uuid=None)
    try:
        device = pick_device("auto", int(record["LOCAL_RANK"]))
        record["device"] = str(device)
        if device.type == "cuda":
            # This worker's GPU becomes its current one: whatever CUDA work is added below
            # lands there, not on GPU 0 beside every other worker's.
            torch.cuda.set_device(device)
            record["gpu_uuid"] = str(torch.cuda.get_device_properties(device).uuid)
    except UsageError as error:  # more local ranks than visible GPUs: say so in the record
        record["device"] = f"none: {error}"
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    record.update(joined=time.time(), group_rank=dist.get_rank(),
                  group_size=dist.get_world_size())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"worker-{record['RANK']}.json").write_text(json.dumps(record) + "\n")
    dist.barrier()  # every file is written before any worker leaves
    dist.destroy_process_group()


if __name__ == "__main__":
    run_cli(main)
