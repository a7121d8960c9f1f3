"""A collective that only one rank calls: the other never answers, and the call times out.

    torchrun --standalone --nproc-per-node 2 ddp_scripts/mistakes/rank_dependent_collective.py --timeout-s 5
    torchrun --standalone --nproc-per-node 2 ddp_scripts/mistakes/rank_dependent_collective.py --fixed
    torchrun --standalone --nproc-per-node 2 ddp_scripts/mistakes/rank_dependent_collective.py --events runs/hang

Every rank must call every collective (all_reduce, barrier, broadcast, and the all_reduce
hidden in DDP's backward) in the same order. Here rank 0 wants the total number of samples
for a log line and calls all_reduce inside `if rank == 0:`; rank 1 has gone on to the end
of the epoch and waits at a barrier. Each waits for the other until the process group's
timeout, then fails.
"""
import argparse
import datetime
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ddp_scripts.cli import run_cli, say


def log_total_buggy(samples, rank):
    if rank == 0:
        dist.all_reduce(samples)   # only rank 0 gets here: it waits for rank 1 in vain
        say(f"samples seen by all ranks: {samples.item():.0f}")


def log_total_fixed(samples, rank):
    dist.all_reduce(samples)       # every rank calls the collective...
    if rank == 0:                  # ...and only the printing depends on the rank
        say(f"samples seen by all ranks: {samples.item():.0f}")


def recording(collective, path):
    """`collective`, with this rank's arrival at it and its exit (or error) written to `path`
    as JSON lines: when each rank reached a collective and when it left, for a timeline."""
    def note(event, **more):
        record = {"rank": dist.get_rank(), "collective": collective.__name__, "event": event,
                  "time_s": time.time(), **more}
        with open(path, "a") as file:
            file.write(json.dumps(record) + "\n")

    def call(*args, **kwargs):
        note("reached")
        try:
            result = collective(*args, **kwargs)
        except Exception as error:
            note("failed", error=str(error).splitlines()[0][:300])
            raise
        note("left")
        return result
    return call


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout-s", type=float, default=600,
                        help="how long a collective waits for the other ranks before failing")
    parser.add_argument("--fixed", action="store_true", help="every rank calls all_reduce")
    parser.add_argument("--events", type=Path, default=None,
                        help="folder for each rank's JSON lines: when it reached and left "
                             "each collective (rank<N>.jsonl)")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    rank = dist.get_rank()
    say(f"joined the group; collectives time out after {args.timeout_s:g} s")
    if args.events:  # the lesson's functions stay as they are: the two collectives are wrapped
        args.events.mkdir(parents=True, exist_ok=True)
        path = args.events / f"rank{rank}.jsonl"
        with open(path, "w") as file:
            file.write(json.dumps({"rank": rank, "event": "joined", "time_s": time.time(),
                                   "timeout_s": args.timeout_s}) + "\n")
        dist.all_reduce = recording(dist.all_reduce, path)
        dist.barrier = recording(dist.barrier, path)
    samples = torch.tensor([1000.0 * (rank + 1)])  # what this rank trained on this epoch
    start = time.perf_counter()
    (log_total_fixed if args.fixed else log_total_buggy)(samples, rank)
    dist.barrier()                 # the end of the epoch: every rank waits for all the others
    say(f"epoch done after {time.perf_counter() - start:.1f} s")
    dist.destroy_process_group()


if __name__ == "__main__":
    run_cli(main)
