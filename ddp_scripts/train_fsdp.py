"""Train and test a model with FSDP: each rank holds a shard of every weight (sharding.py).

The progression: each script is its parent with a few lines changed, each marked with its
topic, train_single.py -> train_dp.py (DP) and -> train_ddp.py (DDP), and from train_ddp.py
-> train_fast.py (FAST) and -> train_fsdp.py (FSDP). `diff` between neighbours is the lesson.
"""
# Run it:  torchrun --standalone --nproc_per_node 2 ddp_scripts/train_fsdp.py \
#            --dataset synthetic --out runs/fsdp
import time

import os  # DDP: torchrun's variables
import torch
import torch.distributed as dist  # FSDP: init_device_mesh
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard  # FSDP: instead of DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler  # DDP

from ddp_scripts.cli import run_cli, say
from ddp_scripts.options import check_args  # FSDP: sharding.parse_args instead of build_parser
from ddp_scripts.devices import pick_device, set_cpu_threads, set_precision, synchronize
from ddp_scripts.data import check_batch_fits, load_datasets, make_loader
from ddp_scripts.models import evaluate  # FSDP: sharding.build_fsdp_model instead of build_model
from ddp_scripts import fsdp_out_dir, sharding  # FSDP: its run folder, its shards
from ddp_scripts.out_dir import run_context, stop_if_loss_not_finite, write_summary
from ddp_scripts.ranks import average_buffers, init_process_group, leave_process_group  # DDP
from ddp_scripts.ranks import on_rank_0, reduce_sum, require_torchrun  # DDP


def train_one_epoch(model, loader, optimizer, device):
    """One pass over the training batches; returns (sum of losses, samples, steps while that
    sum was finite) on `device`.

    The loss is added up on the device and read once per epoch: `.item()` in the loop
    would make the CPU wait for the GPU at every step.
    """
    model.train()
    totals = torch.zeros(3, device=device, dtype=torch.float64)
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)  # the batch goes where the model is
        optimizer.zero_grad()
        # FSDP: each block gathers its weights, runs, frees them; the root stays whole
        loss = F.cross_entropy(model(images), labels)
        # FSDP: backward() gathers each block again, then reduce-scatters:
        # each rank keeps its shard's average
        loss.backward()
        optimizer.step()
        totals[0] += loss.detach() * len(labels)
        totals[1] += len(labels)
        totals[2] += totals[0].isfinite()  # steps before the loss became nan or inf, if it does
    return totals


def main():
    # FSDP: options.py's options, sharding's, the batch per rank
    args = sharding.parse_args(__doc__.splitlines()[0])  # FSDP
    check_args(args)

    # 1. Where to train: one process per GPU (or per share of the CPU cores), all in one group.
    require_torchrun(__file__)  # DDP: torchrun tells each process who it is
    rank = int(os.environ["RANK"])  # DDP: who I am among all processes
    world_size = int(os.environ["WORLD_SIZE"])  # DDP: how many processes in all
    device = pick_device(args.device, int(os.environ["LOCAL_RANK"]))  # DDP: my GPU on this machine
    if device.type == "cuda":  # DDP
        torch.cuda.set_device(device)  # DDP: before the group, so that nccl uses this GPU
    init_process_group(device, args.timeout_s)  # DDP: nccl on GPUs, gloo on CPUs
    threads = set_cpu_threads(args.threads)
    set_precision(args.tf32)  # float32 as float32; TF32 on newer GPUs only with --tf32
    # FSDP: the sharded checkpoint, found by rank 0 and told to every rank
    checkpoint = on_rank_0(fsdp_out_dir.prepare_out_dir, args, args.batch_size * world_size)  # FSDP
    train_set, test_set = load_datasets(args.dataset, args.data_dir, args.train_samples,
                                        args.test_samples, args.dtype,
                                        fallback=not args.no_synthetic_fallback)
    check_batch_fits(args.batch_size, len(train_set))
    # FSDP: as many test batches on every rank, so that their forwards run in step
    sharding.check_same_number_of_batches(len(test_set), args.batch_size, world_size)  # FSDP

    # 2. The model is built on the meta device (shapes only), sharded, and only its shards are made.
    with torch.device("meta"):  # FSDP: no memory yet: the whole model never exists on a rank
        model = sharding.build_fsdp_model(args, getattr(torch, args.dtype))  # FSDP: or the wide MLP
    mesh = dist.init_device_mesh(device.type, (world_size,))  # FSDP: all ranks share each weight
    # FSDP: one unit per block, gathered only while it computes; its weights become DTensor shards
    for block in sharding.blocks_of(model):  # FSDP
        fully_shard(block, mesh=mesh, **sharding.fsdp_policies(args, device))  # FSDP
    # FSDP: the root last, what is left (stem, head);
    # PyTorch's default keeps it whole from forward to backward
    fully_shard(model, mesh=mesh, **sharding.fsdp_policies(args, device, root=True))  # FSDP
    # FSDP: only this rank's shards are allocated,
    # with the weights build_model gives every other script
    sharding.materialize_shards(model, device, args, getattr(torch, args.dtype))  # FSDP
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    # FSDP: resumes on any number of ranks
    first_epoch = fsdp_out_dir.resume_from(checkpoint, model, optimizer, args.out)  # FSDP
    on_rank_0(fsdp_out_dir.start_out_dir, args, checkpoint)  # FSDP

    # 3. The data: a new shuffle every epoch, seeded with seed + epoch, the same in every script.
    shuffle = DistributedSampler(train_set, num_replicas=world_size, rank=rank,  # DDP: a share each
                                 seed=args.seed)
    train_loader = make_loader(train_set, args.batch_size, shuffle)
    test_loader = make_loader(test_set, args.batch_size,
                              range(rank, len(test_set), world_size))  # DDP: each image once
    context = run_context(args, device, model, threads, train_set.source)

    # 4. Train and test, epoch after epoch; each batch goes to the device in train_one_epoch.
    train_start = time.perf_counter()
    for epoch in range(first_epoch, args.epochs + 1):
        shuffle.set_epoch(epoch)  # DDP: without it, every epoch repeats the same shuffle
        epoch_start = time.perf_counter()
        train_totals = train_one_epoch(model, train_loader, optimizer, device)
        stop_if_loss_not_finite(train_totals, epoch)  # nan or inf: stop before saving anything
        train_totals = reduce_sum(train_totals)  # DDP: add up the ranks
        synchronize(device)  # GPU work is queued: wait for it before reading the clock
        epoch_time = time.perf_counter() - epoch_start
        average_buffers(model)  # FSDP: no .module: fully_shard changes the model's class in place
        # FSDP: every rank runs each forward
        test_totals = reduce_sum(evaluate(model, test_loader, device))  # FSDP
        # FSDP: every rank saves its shards; rank 0 logs the epoch
        fsdp_out_dir.save_epoch(args, epoch, model, optimizer, train_totals, test_totals,  # FSDP
                                epoch_time, context)
        if epoch == args.stop_after_epoch:
            say(f"stopping after epoch {epoch} as asked (--stop-after-epoch)")
            break
    fsdp_out_dir.export_full_checkpoint(args, model, optimizer)  # FSDP: the whole model, on rank 0
    on_rank_0(write_summary, args.out, model, device, train_start, args)  # DDP: one process writes
    # FSDP: the same order as DDP's, though fully_shard holds no Reducer
    del model  # DDP
    leave_process_group()  # DDP: leave the group cleanly


if __name__ == "__main__":
    run_cli(main)
