"""Train and test a model with FSDP, fully sharded data parallel: each rank holds a shard of every weight.

    torchrun --standalone --nproc_per_node 2 ddp_scripts/train_fsdp.py --dataset synthetic --out runs/fsdp
    torchrun --standalone --nproc_per_node 2 ddp_scripts/train_fsdp.py --model mlp --width 1024 \
        --global-batch-size 64 --dataset synthetic --out runs/fsdp-mlp --stop-after-epoch 1
    torchrun --standalone --nproc_per_node 1 ddp_scripts/train_fsdp.py --model mlp --width 1024 \
        --global-batch-size 64 --dataset synthetic --out runs/fsdp-mlp --resume

This is train_ddp.py with the lines marked FSDP changed (fully_shard instead of the DDP
wrapper, the optimizer made after sharding, sharded checkpoints): `diff ddp_scripts/train_ddp.py
ddp_scripts/train_fsdp.py` shows what sharding takes. A run saved by N ranks resumes on M
(the last two lines); --global-batch-size keeps the training the same when the ranks change.
"""
import time

START = time.perf_counter()  # start-up (imports, data, model) is reported apart from training

import sys
from pathlib import Path

if not __package__:  # run as a file, not imported: find ddp_scripts as notebooks do
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse  # FSDP: options of its own
import os  # DDP: torchrun's variables
import torch
import torch.distributed as dist  # DDP
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh  # FSDP: the ranks that share each weight
from torch.distributed.fsdp import fully_shard  # FSDP: instead of DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler  # DDP

from ddp_scripts.common import (build_parser, check_args, check_batch_fits,  # FSDP: no build_model
                                evaluate, load_datasets, make_loader, pick_device,
                                reported_if_out_of_memory, run_cli,  # FSDP: checkpoints: sharding.py
                                run_context, say, set_cpu_threads,  # FSDP
                                synchronize, write_summary)
from ddp_scripts.common import (average_buffers, init_process_group, on_rank_0,  # DDP
                                reduce_sum, require_torchrun)
from ddp_scripts.sharding import (MODELS, blocks_of, build_fsdp_model,  # FSDP
                                  check_same_number_of_batches, checkpoint_activations,
                                  export_full_checkpoint, fsdp_policies, per_rank_batch,
                                  prepare_sharded_out_dir, resume_sharded, save_sharded_epoch,
                                  start_sharded_out_dir)


def fsdp_parser():  # FSDP: common's options, and what sharding adds
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], conflict_handler="resolve",
                                parents=[build_parser(__doc__.splitlines()[0])])  # the two below replace common's
    p.add_argument("--model", choices=MODELS, default="cnn", help="mlp: a wide MLP worth sharding")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.dcp, on any number of ranks")
    p.add_argument("--width", type=int, default=256, help="mlp: width of each block")
    p.add_argument("--depth", type=int, default=4, help="mlp: number of blocks")
    p.add_argument("--global-batch-size", type=int, default=None, help="split over the ranks (default: --batch-size each)")
    p.add_argument("--no-reshard-after-forward", action="store_true", help="keep gathered weights until backward")
    p.add_argument("--mixed-precision", choices=["bfloat16"], default=None, help="compute in it, reduce in float32")
    p.add_argument("--activation-checkpointing", action="store_true", help="recompute each block's forward in backward")
    p.add_argument("--cpu-offload", action="store_true", help="GPU runs: shards, gradients and optimizer step on the CPU")
    return p


def fsdp_setup(args):  # FSDP: ddp_setup, and the batch each rank takes
    require_torchrun("train_fsdp.py")
    local_rank = int(os.environ["LOCAL_RANK"])   # which GPU on this machine
    rank = int(os.environ["RANK"])               # who I am among all processes
    world_size = int(os.environ["WORLD_SIZE"])   # how many processes in all
    args.batch_size = per_rank_batch(args, world_size)  # FSDP: --global-batch-size / world_size
    device = pick_device(args.device, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before the group, so that nccl uses this GPU
    init_process_group(device, args.timeout_s)  # nccl on GPUs, gloo on CPUs
    return local_rank, rank, world_size, device


def train_one_epoch(model, loader, optimizer, device):  # FSDP: without chapter 10's levers
    """One pass over the training batches; returns (sum of losses, samples) on `device`.

    The loss is added up on the device and read once per epoch: `.item()` in the loop
    would make the CPU wait for the GPU at every step.
    """
    model.train()
    totals = torch.zeros(2, device=device, dtype=torch.float64)
    for images, labels in loader:  # FSDP: batches from make_loader, copied to the device below
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with reported_if_out_of_memory(len(labels), device):
            loss = F.cross_entropy(model(images), labels)  # FSDP: each block gathers its weights, runs, frees them
            loss.backward()  # FSDP: gathers again, then reduce-scatters: each rank keeps its shard's average
        optimizer.step()
        totals[0] += loss.detach() * len(labels)
        totals[1] += len(labels)
    return totals


def main():
    args = fsdp_parser().parse_args()  # FSDP
    check_args(args)

    # 1. Where to train: one process per GPU (or per share of the CPU cores), all in one group.
    local_rank, rank, world_size, device = fsdp_setup(args)  # FSDP
    threads = set_cpu_threads(args.threads, int(os.environ["LOCAL_WORLD_SIZE"]))  # DDP: share the node's cores
    checkpoint = on_rank_0(prepare_sharded_out_dir, args, args.batch_size * world_size)  # FSDP: the sharded checkpoint
    train_set, test_set = load_datasets(args.dataset, args.data_dir, args.train_samples,
                                        args.test_samples, args.dtype)
    check_batch_fits(args.batch_size, len(train_set))
    check_same_number_of_batches(len(test_set), args.batch_size, world_size)  # FSDP: forwards in step

    # 2. The model goes to the device once, where it is built; then it is sharded, then the optimizer.
    model = build_fsdp_model(args, getattr(torch, args.dtype)).to(device)  # FSDP: or the wide MLP
    mesh, policies = init_device_mesh(device.type, (world_size,)), fsdp_policies(args, device)  # FSDP
    for block in blocks_of(model):  # FSDP: one unit per block, gathered only while it computes
        if args.activation_checkpointing:  # FSDP: keep the block's input, recompute the rest
            checkpoint_activations(block)
        fully_shard(block, mesh=mesh, **policies)  # FSDP: its weights become DTensor shards
    fully_shard(model, mesh=mesh, **policies)  # FSDP: the root last: what is left (stem, head)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)  # FSDP: after sharding
    first_epoch = resume_sharded(checkpoint, model, optimizer, args.out)  # FSDP: on any number of ranks
    if rank == 0:  # DDP: one process writes
        start_sharded_out_dir(args, checkpoint)  # FSDP

    # 3. The data: a new shuffle every epoch, seeded with seed + epoch, the same in every script.
    train_sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=args.seed)  # DDP: 1/world_size each
    train_loader = make_loader(train_set, args.batch_size, train_sampler)  # DDP
    test_loader = make_loader(test_set, args.batch_size, range(rank, len(test_set), world_size))  # DDP: each image once
    context = run_context(args, device, "fsdp", threads, train_set.source, world_size)  # FSDP

    # 4. Train and test, epoch after epoch; each batch goes to the device in train_one_epoch.
    train_start = time.perf_counter()
    for epoch in range(first_epoch, args.epochs + 1):
        train_sampler.set_epoch(epoch)  # DDP: without it, every epoch repeats the same shuffle
        epoch_start = time.perf_counter()
        train_totals = reduce_sum(train_one_epoch(model, train_loader, optimizer, device))  # FSDP, as DDP: add up the ranks
        synchronize(device)  # GPU work is queued: wait for it before reading the clock
        epoch_time = time.perf_counter() - epoch_start
        average_buffers(model)  # FSDP: no .module: fully_shard changes the model's class in place
        test_totals = reduce_sum(evaluate(model, test_loader, device))  # FSDP: every rank runs each forward
        save_sharded_epoch(args, epoch, model, optimizer, train_totals, test_totals, epoch_time,  # FSDP: every
                           context, args.batch_size * world_size)  # rank saves its shards
        if epoch == args.stop_after_epoch:
            say(f"stopping after epoch {epoch} as asked (--stop-after-epoch)")
            break
    export_full_checkpoint(args, model, optimizer)  # FSDP: rank 0 gathers the whole model
    if rank == 0:  # DDP
        write_summary(args.out, "fsdp", device, START, train_start, args, world_size)  # FSDP
    dist.destroy_process_group()  # DDP: leave the group cleanly


if __name__ == "__main__":
    run_cli(main)
