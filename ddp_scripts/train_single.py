"""Train and test the CIFAR-10 CNN in one process: on the CPU, on one GPU, or with DataParallel.

    python ddp_scripts/train_single.py --dataset synthetic --epochs 2 --out runs/cpu --device cpu
    python ddp_scripts/train_single.py --device cuda --out runs/gpu            # one GPU
    python ddp_scripts/train_single.py --device cuda --data-parallel --out runs/dp

Read it next to train_ddp.py: the lines that differ are what DistributedDataParallel adds.
"""
import time

START = time.perf_counter()  # start-up (imports, data, model) is reported apart from training

import torch
import torch.nn as nn
from torch.utils.data import RandomSampler, SequentialSampler

from common import (UsageError, append_metrics, build_model, build_parser, check_args,
                    check_batch_fits, describe_hardware, epoch_record, evaluate, load_datasets,
                    make_loader, pick_device, prepare_out_dir, run_cli, save_checkpoint, say,
                    set_cpu_threads, start_out_dir, synchronize, train_one_epoch, unwrap,
                    write_summary)


def main():
    parser = build_parser(__doc__.splitlines()[0])
    parser.add_argument("--data-parallel", action="store_true",
                        help="wrap the model in nn.DataParallel over all visible GPUs")
    args = parser.parse_args()
    check_args(args)

    # 1. Where to train. The source article: torch.device("cuda:0" if available else "cpu").
    device = pick_device(args.device)
    if args.data_parallel and device.type != "cuda":
        raise UsageError("--data-parallel needs CUDA GPUs, and this run is on "
                         f"{device.type}; drop --data-parallel or use --device cuda")
    threads = set_cpu_threads(args)
    checkpoint = prepare_out_dir(args)
    train_set, test_set = load_datasets(args, announce=say)
    check_batch_fits(args.batch_size, 1, len(train_set))

    # 2. The model goes to the device once, where it is built.
    model = build_model(args.model, args.seed, getattr(torch, args.dtype)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    first_epoch = 1
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        first_epoch = checkpoint["epoch"] + 1
        say(f"resuming after epoch {checkpoint['epoch']} from {args.out}")
    if args.data_parallel:
        # Wrap after .to(device): every forward scatters the batch over the GPUs, copies
        # the model to each, and gathers the outputs back on cuda:0.
        model = nn.DataParallel(model)
    start_out_dir(args, checkpoint)

    # The same shuffle DistributedSampler makes: a permutation seeded with seed + epoch, so
    # a resumed run, and a DDP run with the same global batch, see the same order.
    shuffle = torch.Generator()
    train_loader = make_loader(train_set, args.batch_size, RandomSampler(train_set, generator=shuffle))
    test_loader = make_loader(test_set, args.batch_size, SequentialSampler(test_set))
    strategy = "dp" if args.data_parallel else "single"
    gpus = torch.cuda.device_count() if args.data_parallel else int(device.type == "cuda")
    context = {"world_size": 1, "device": str(device), "backend": None, "strategy": strategy,
               "gpus": gpus, "threads": threads, "batch_size": args.batch_size,
               "global_batch_size": args.batch_size, "dataset": train_set.source}

    train_start = time.perf_counter()
    for epoch in range(first_epoch, args.epochs + 1):
        shuffle.manual_seed(args.seed + epoch)
        epoch_start = time.perf_counter()
        # 3. Inside the loop, each batch is moved with .to(device) (see train_one_epoch).
        train_totals = train_one_epoch(model, train_loader, optimizer, device)
        synchronize(device)  # GPU work is queued: wait for it before reading the clock
        epoch_time = time.perf_counter() - epoch_start
        test_totals = evaluate(model, test_loader, device)
        record = epoch_record(epoch, train_totals, test_totals, epoch_time, **context)
        append_metrics(args.out, record)
        save_checkpoint(args.out, unwrap(model), optimizer, epoch, args)
        say(f"epoch {epoch}/{args.epochs} train_loss={record['train_loss']:.4f} "
            f"test_accuracy={record['test_accuracy']:.4f} samples/s={record['samples_per_s']:.0f}")
        if epoch == args.stop_after_epoch:
            say(f"stopping after epoch {epoch} as asked (--stop-after-epoch)")
            break

    end = time.perf_counter()
    write_summary(args.out, {"strategy": strategy, "startup_s": train_start - START,
                             "train_s": end - train_start, "total_s": end - START,
                             "hardware": describe_hardware(device), "args": vars(args)})


if __name__ == "__main__":
    run_cli(main)
