"""A worker for torch.multiprocessing.spawn, kept in a file so that new processes can import it.

    python ddp_scripts/mistakes/spawn_worker.py --nprocs 2

mp.spawn starts fresh Python processes, and each must import the function it is to run. A
function defined in a notebook lives in the kernel's __main__, which no other process can
import; a function in a file like this one can be imported by all of them.
"""
import argparse
import datetime
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ddp_scripts.cli import say
from ddp_scripts.launcher import free_port


def worker(rank, world_size, port):
    """Join a gloo group of `world_size` processes and add up one number from each."""
    os.environ["RANK"] = str(rank)  # what torchrun would set; say() tags lines with it
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=60))
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)  # 1 + 2 + ... + world_size, on every rank
    say(f"the ranks' numbers add up to {total.item():.0f}")
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=2)
    args = parser.parse_args()
    mp.spawn(worker, args=(args.nprocs, free_port()), nprocs=args.nprocs)


if __name__ == "__main__":
    main()
