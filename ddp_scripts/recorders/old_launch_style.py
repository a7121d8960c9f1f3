"""Join a process group the source article's way: --local_rank, file://, explicit rank.

The article parses --local_rank with argparse and calls init_process_group with
init_method='file://...', a rank and a world size it passes itself. No launcher is needed
for that: start one process per rank, by hand, from a script, or with SLURM's srun:

    python ddp_scripts/recorders/old_launch_style.py --rank 0 --world-size 2 --init-file /tmp/pg &
    python ddp_scripts/recorders/old_launch_style.py --rank 1 --world-size 2 --init-file /tmp/pg

Every process adds up (rank + 1) over the group with all_reduce and prints the sum, which is
world_size * (world_size + 1) / 2 when all of them joined. The init file must not exist
before the processes start (the processes coordinate through it). Today's way is torchrun,
which sets LOCAL_RANK, RANK and WORLD_SIZE, and init_method='env://' (see train_ddp.py).
"""
import datetime
import os

import torch
import torch.distributed as dist

from ddp_scripts.cli import UsageError, run_cli
from ddp_scripts.options import ArgumentParser, count, non_negative_int, seconds


def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    # The article's option. torch.distributed.launch passes --local-rank=N since torch 2.0,
    # which an underscore-only parser rejects; accept both spellings.
    parser.add_argument("--local_rank", "--local-rank", type=non_negative_int, default=0,
                        help="which GPU of this machine (not used here: gloo, CPU tensors)")
    parser.add_argument("--rank", type=non_negative_int, required=True, help="this process: 0 .. world size - 1")
    parser.add_argument("--world-size", type=count, required=True, help="how many processes join")
    parser.add_argument("--init-file", required=True,
                        help="a path every process can reach; it must not exist yet")
    parser.add_argument("--timeout-s", type=seconds, default=60,
                        help="how long to wait for the other processes")
    args = parser.parse_args()
    if args.world_size < 1 or not 0 <= args.rank < args.world_size:
        raise UsageError(f"--rank must be in 0..{args.world_size - 1} and --world-size at "
                         f"least 1, got rank {args.rank} and world size {args.world_size}")

    # The article: backend="nccl", init_method='file://file:///DATA/...' (one scheme too
    # many), rank=0, world_size=1 typed in. gloo here, so that it runs on any machine.
    dist.init_process_group(backend="gloo",
                            init_method="file://" + os.path.abspath(args.init_file),
                            rank=args.rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=args.timeout_s))
    total = torch.tensor([args.rank + 1.0])
    dist.all_reduce(total)  # every process ends with the same sum
    print(f"[rank {dist.get_rank()}] world_size={dist.get_world_size()} "
          f"backend={dist.get_backend()} local_rank={args.local_rank}: "
          f"sum of (rank + 1) over the group = {total.item():g}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    run_cli(main)
