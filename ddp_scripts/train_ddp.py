"""Train and test the CIFAR-10 CNN with DDP: one process per GPU (or per share of the CPU).

The progression: each script is its parent with a few lines changed, each marked with its
topic, train_single.py -> train_dp.py (DP) and -> train_ddp.py (DDP), and from train_ddp.py
-> train_fast.py (FAST) and -> train_fsdp.py (FSDP). `diff` between neighbours is the lesson.
"""
# Run it:  torchrun --standalone --nproc_per_node 2 ddp_scripts/train_ddp.py \
#            --dataset synthetic --out runs/ddp
import time

import os  # DDP: torchrun's variables
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP  # DDP
from torch.utils.data.distributed import DistributedSampler  # DDP

from ddp_scripts.cli import run_cli, say
from ddp_scripts.options import build_parser, check_args
from ddp_scripts.devices import pick_device, set_cpu_threads, set_precision, synchronize
from ddp_scripts.data import check_batch_fits, load_datasets, make_loader
from ddp_scripts.models import build_model, evaluate
from ddp_scripts.out_dir import prepare_out_dir, resume_from, save_epoch, start_out_dir
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
        loss = F.cross_entropy(model(images), labels)
        # DDP: backward() also averages the gradients over the ranks, bucket by bucket
        loss.backward()
        optimizer.step()
        totals[0] += loss.detach() * len(labels)
        totals[1] += len(labels)
        totals[2] += totals[0].isfinite()  # steps before the loss became nan or inf, if it does
    return totals


def main():
    args = build_parser(__doc__.splitlines()[0]).parse_args()
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
    checkpoint = on_rank_0(prepare_out_dir, args)  # DDP: rank 0 reads OUT and tells every rank
    train_set, test_set = load_datasets(args.dataset, args.data_dir, args.train_samples,
                                        args.test_samples, args.dtype,
                                        fallback=not args.no_synthetic_fallback)
    check_batch_fits(args.batch_size, len(train_set))

    # 2. The model goes to the device once, where it is built; the optimizer follows it.
    model = build_model(args.model, args.seed, getattr(torch, args.dtype)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    first_epoch = resume_from(checkpoint, model, optimizer, args.out)
    # DDP: the model is wrapped after .to(device)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)  # DDP
    on_rank_0(start_out_dir, args, checkpoint)  # DDP: one process writes

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
        average_buffers(model.module)  # DDP: BatchNorm statistics differ by the last step
        test_totals = reduce_sum(evaluate(model.module, test_loader, device))  # DDP
        if rank == 0:  # DDP: one process writes; every rank holds the same model
            save_epoch(args, epoch, model.module, optimizer, train_totals, test_totals,  # DDP
                       epoch_time, context)
        if epoch == args.stop_after_epoch:
            say(f"stopping after epoch {epoch} as asked (--stop-after-epoch)")
            break
    on_rank_0(write_summary, args.out, model, device, train_start, args)  # DDP: one process writes
    # DDP: the model goes before its group, or a rank can hang as it exits
    del model  # DDP
    leave_process_group()  # DDP: leave the group cleanly


if __name__ == "__main__":
    run_cli(main)
