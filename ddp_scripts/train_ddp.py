"""Train and test the CIFAR-10 CNN with DistributedDataParallel: one process per GPU or CPU share.

    torchrun --standalone --nproc_per_node 2 ddp_scripts/train_ddp.py --dataset synthetic --out runs/ddp

torchrun starts the processes and tells each who it is through the environment (LOCAL_RANK,
RANK, WORLD_SIZE). Read it next to train_single.py: the lines marked DDP are the difference.
"""
import time

START = time.perf_counter()  # start-up (imports, process group, data) is reported apart

import argparse
import datetime
import os

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from common import (UsageError, append_metrics, backend_for, build_model, build_parser,
                    check_args, check_batch_fits, describe_hardware, epoch_record, evaluate,
                    load_datasets, make_loader, pick_device, prepare_out_dir, reduce_sum,
                    run_cli, save_checkpoint, say, set_cpu_threads, start_out_dir, synchronize,
                    train_one_epoch, write_summary)


def ddp_setup(args):
    """DDP: who am I, which device is mine, and join the process group."""
    if "LOCAL_RANK" not in os.environ:
        raise UsageError("LOCAL_RANK is not set: start this script with torchrun, e.g. "
                         "torchrun --standalone --nproc_per_node 2 ddp_scripts/train_ddp.py ...")
    local_rank = int(os.environ["LOCAL_RANK"])   # which GPU on this machine
    rank = int(os.environ["RANK"])               # who I am among all processes
    world_size = int(os.environ["WORLD_SIZE"])   # how many processes in all
    device = pick_device(args.device, local_rank)
    if device.type == "mps":
        raise UsageError("MPS runs one process only: use train_single.py --device mps")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before the group, so nccl uses this GPU
    dist.init_process_group(backend=backend_for(device),
                            timeout=datetime.timedelta(seconds=args.timeout_s))
    return local_rank, rank, world_size, device


def main():
    parser = build_parser(__doc__.splitlines()[0])
    parser.add_argument("--timeout-s", type=float, default=600,
                        help="how long a collective waits for the other ranks before failing")
    # The source article's launcher, python -m torch.distributed.launch, passes this option;
    # torchrun sets the LOCAL_RANK variable instead.
    parser.add_argument("--local-rank", "--local_rank", type=int, default=None,
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    check_args(args)
    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
        if os.environ["LOCAL_RANK"] == "0":
            print("notice: --local-rank comes from the deprecated torch.distributed.launch; "
                  "torchrun sets LOCAL_RANK instead", flush=True)
    checkpoint = prepare_out_dir(args)  # every rank, before any rank writes
    local_rank, rank, world_size, device = ddp_setup(args)
    threads = set_cpu_threads(args, int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
    train_set, test_set = load_datasets(args, rank, local_rank,
                                        announce=lambda message: say(message, rank))
    check_batch_fits(args.batch_size, world_size, len(train_set))

    model = build_model(args.model, args.seed, getattr(torch, args.dtype)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    first_epoch = 1
    if checkpoint is not None:  # every rank loads the same file saved by rank 0
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        first_epoch = checkpoint["epoch"] + 1
        say(f"resuming after epoch {checkpoint['epoch']} from {args.out}", rank)
    # DDP: wrap after .to(device). Gradients are all-reduced (averaged over the ranks)
    # during backward, so every rank takes the same optimizer step.
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    if rank == 0:
        start_out_dir(args, checkpoint)

    # DDP: each rank trains on its own 1/world_size of the data, reshuffled every epoch.
    train_sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank,
                                       shuffle=True, seed=args.seed)
    train_loader = make_loader(train_set, args.batch_size, train_sampler)
    # DDP: every test image is scored once by one rank (DistributedSampler would pad the
    # last shard with repeats, and count them); the totals are then added over the ranks.
    test_loader = make_loader(test_set, args.batch_size, range(rank, len(test_set), world_size))
    context = {"world_size": world_size, "device": str(device), "backend": dist.get_backend(),
               "strategy": "ddp", "gpus": world_size if device.type == "cuda" else 0,
               "threads": threads, "batch_size": args.batch_size,
               "global_batch_size": args.batch_size * world_size, "dataset": train_set.source}

    train_start = time.perf_counter()
    for epoch in range(first_epoch, args.epochs + 1):
        train_sampler.set_epoch(epoch)  # DDP: without it, every epoch repeats one shuffle
        epoch_start = time.perf_counter()
        train_totals = reduce_sum(train_one_epoch(model, train_loader, optimizer, device))
        synchronize(device)
        epoch_time = time.perf_counter() - epoch_start
        # DDP: evaluate the plain model inside the wrapper; the reduce adds up the ranks.
        test_totals = reduce_sum(evaluate(model.module, test_loader, device))
        if rank == 0:  # DDP: one process writes; the others hold the same model
            metrics = epoch_record(epoch, train_totals, test_totals, epoch_time, **context)
            append_metrics(args.out, metrics)
            save_checkpoint(args.out, model.module, optimizer, epoch, args)
            say(f"epoch {epoch}/{args.epochs} train_loss={metrics['train_loss']:.4f} "
                f"test_accuracy={metrics['test_accuracy']:.4f} "
                f"samples/s={metrics['samples_per_s']:.0f}", rank)
        if epoch == args.stop_after_epoch:
            say(f"stopping after epoch {epoch} as asked (--stop-after-epoch)", rank)
            break

    end = time.perf_counter()
    if rank == 0:
        write_summary(args.out, {"strategy": "ddp", "startup_s": train_start - START,
                                 "train_s": end - train_start, "total_s": end - START,
                                 "world_size": world_size,
                                 "hardware": describe_hardware(device), "args": vars(args)})
    dist.destroy_process_group()  # DDP: leave the group cleanly


if __name__ == "__main__":
    # record: a crashing rank's traceback appears in torchrun's error summary;
    # run_cli: bad input is one line and exit status 2, no traceback.
    record(run_cli)(main)
