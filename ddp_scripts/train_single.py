"""Train and test the CIFAR-10 CNN in one process: on the CPU or on one GPU.

The progression: each script is its parent with a few lines changed, each marked with its
topic, train_single.py -> train_dp.py (DP) and -> train_ddp.py (DDP), and from train_ddp.py
-> train_fast.py (FAST) and -> train_fsdp.py (FSDP). `diff` between neighbours is the lesson.
"""
# Run it:  python ddp_scripts/train_single.py --dataset synthetic --epochs 2 --device cpu \
#            --out runs/single
import time

import torch
import torch.nn.functional as F
from torch.utils.data import RandomSampler

from ddp_scripts.cli import run_cli, say
from ddp_scripts.options import build_parser, check_args
from ddp_scripts.devices import pick_device, set_cpu_threads, set_precision, synchronize
from ddp_scripts.data import check_batch_fits, load_datasets, make_loader
from ddp_scripts.models import build_model, evaluate
from ddp_scripts.out_dir import prepare_out_dir, resume_from, save_epoch, start_out_dir
from ddp_scripts.out_dir import run_context, stop_if_loss_not_finite, write_summary


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
        loss.backward()
        optimizer.step()
        totals[0] += loss.detach() * len(labels)
        totals[1] += len(labels)
        totals[2] += totals[0].isfinite()  # steps before the loss became nan or inf, if it does
    return totals


def main():
    args = build_parser(__doc__.splitlines()[0]).parse_args()
    check_args(args)

    # 1. Where to train. The source article: torch.device("cuda:0" if available else "cpu").
    device = pick_device(args.device)
    threads = set_cpu_threads(args.threads)
    set_precision(args.tf32)  # float32 as float32; TF32 on newer GPUs only with --tf32
    checkpoint = prepare_out_dir(args)
    train_set, test_set = load_datasets(args.dataset, args.data_dir, args.train_samples,
                                        args.test_samples, args.dtype,
                                        fallback=not args.no_synthetic_fallback)
    check_batch_fits(args.batch_size, len(train_set))

    # 2. The model goes to the device once, where it is built; the optimizer follows it.
    model = build_model(args.model, args.seed, getattr(torch, args.dtype)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    first_epoch = resume_from(checkpoint, model, optimizer, args.out)
    start_out_dir(args, checkpoint)

    # 3. The data: a new shuffle every epoch, seeded with seed + epoch, the same in every script.
    shuffle = RandomSampler(train_set, generator=torch.Generator())
    train_loader = make_loader(train_set, args.batch_size, shuffle)
    test_loader = make_loader(test_set, args.batch_size,
                              range(len(test_set)))
    context = run_context(args, device, model, threads, train_set.source)

    # 4. Train and test, epoch after epoch; each batch goes to the device in train_one_epoch.
    train_start = time.perf_counter()
    for epoch in range(first_epoch, args.epochs + 1):
        shuffle.generator.manual_seed(args.seed + epoch)
        epoch_start = time.perf_counter()
        train_totals = train_one_epoch(model, train_loader, optimizer, device)
        stop_if_loss_not_finite(train_totals, epoch)  # nan or inf: stop before saving anything
        synchronize(device)  # GPU work is queued: wait for it before reading the clock
        epoch_time = time.perf_counter() - epoch_start
        test_totals = evaluate(model, test_loader, device)
        save_epoch(args, epoch, model, optimizer, train_totals, test_totals, epoch_time, context)
        if epoch == args.stop_after_epoch:
            say(f"stopping after epoch {epoch} as asked (--stop-after-epoch)")
            break
    write_summary(args.out, model, device, train_start, args)


if __name__ == "__main__":
    run_cli(main)
