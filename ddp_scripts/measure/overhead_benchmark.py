"""How much do the companion scripts and the launcher cost, against bare PyTorch?

    python -m ddp_scripts.measure.overhead_benchmark --out results/overhead/<machine>.json

1. Training speed, at each batch size asked for: the samples/s of
   - a bare loop: the same CNN, batch, tensors and shuffle; no DataLoader, no logging;
   - the same bare loop with the model wrapped in DistributedDataParallel (one process, gloo):
     what DDP itself costs, before any script;
   - train_single.py, and train_ddp.py with one process under torchrun.
   Each runs in a new process of its own, as the scripts do (a long-lived process that has
   run many trainings is not a fair floor), and trains --epochs epochs; the first pays for
   warm-up (oneDNN picks its kernels, the allocator grows) and is left out, and the median
   of the others is kept. Within a repeat the four run one after the other, so a slow
   minute on a shared machine hits them all.
2. Start-up: from the launcher's call to the first epoch logged, two processes on the CPU,
   against a bare torchrun start of two ranks that only join the process group and leave.
Each measurement is repeated and the median kept; the file records the hardware.
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from ddp_scripts.cli import UsageError, run_cli  # noqa: E402
from ddp_scripts.data import synthetic_cifar  # noqa: E402
from ddp_scripts.models import build_model  # noqa: E402
from ddp_scripts.options import ArgumentParser, count  # noqa: E402
from ddp_scripts.hardware import describe_hardware  # noqa: E402
from ddp_scripts.launcher import (free_port, run_command, run_script,  # noqa: E402
                                  torchrun_command)
from ddp_scripts.ranks import leave_process_group  # noqa: E402

JOIN_ONLY = """
import torch.distributed as dist
dist.init_process_group("gloo")
dist.destroy_process_group()
"""


def bare_loop_samples_per_s(samples, batch_size, threads, epochs, wrap_in_ddp=False, seed=0):
    """The floor: the same work as the scripts' training, written as plainly as possible."""
    torch.set_num_threads(threads)
    (images, labels), _ = synthetic_cifar(samples, 16)
    model = build_model("cnn", seed)
    if wrap_in_ddp:  # one process, gloo: what the wrapper costs by itself
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                                rank=0, world_size=1)
        model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    speeds = []
    for epoch in range(1, epochs + 1):
        order = torch.randperm(samples, generator=torch.Generator().manual_seed(seed + epoch))
        start = time.perf_counter()
        for i in range(0, samples, batch_size):
            index = order[i:i + batch_size]
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(images[index]), labels[index]).backward()
            optimizer.step()
        speeds.append(samples / (time.perf_counter() - start))
    if wrap_in_ddp:
        del model, optimizer  # DDP's Reducer goes before its group (ranks.leave_process_group)
        leave_process_group()
    return statistics.median(speeds[1:])  # the first epoch warms up


def bare_loop_in_a_new_process(samples, batch_size, threads, epochs, wrap_in_ddp=False):
    command = [sys.executable, "-m", "ddp_scripts.measure.overhead_benchmark", "--bare-loop", "--out", "-",
               "--samples", str(samples), "--batch-sizes", str(batch_size), "--threads", str(threads),
               "--epochs", str(epochs), *(["--ddp"] if wrap_in_ddp else [])]
    return float(run_command(command, timeout=600, echo=lambda line: None)[-1])


def script_samples_per_s(script, samples, batch_size, threads, epochs, work):
    out = Path(tempfile.mkdtemp(dir=work))
    frame = run_script(script, nproc=1 if script == "train_ddp.py" else None, out=out, dataset="synthetic",
                       train_samples=samples,
                       test_samples=16, epochs=epochs, batch_size=batch_size, threads=threads,
                       progress=False, echo=lambda line: None)
    return float(frame["samples_per_s"].iloc[1:].median())  # the first epoch warms up


def launcher_to_first_epoch_s(work):
    """Seconds from run_script's call until rank 0 logs its first epoch (2 CPU processes)."""
    first = []
    start = time.perf_counter()

    def watch(line):
        if "epoch 1/" in line and not first:
            first.append(time.perf_counter() - start)

    run_script("train_ddp.py", nproc=2, out=Path(tempfile.mkdtemp(dir=work)),
               dataset="synthetic", train_samples=64, test_samples=16, epochs=1,
               batch_size=16, progress=False, echo=watch)
    return first[0]


def bare_torchrun_join_s(work):
    script = Path(work) / "join_only.py"
    script.write_text(JOIN_ONLY)
    start = time.perf_counter()
    run_command(torchrun_command(str(script), 2), echo=lambda line: None)
    return time.perf_counter() - start


def median_of(values):
    return {"median": statistics.median(values), "values": values}


def training_speeds(samples, batch_size, threads, epochs, repeats, work):
    """samples/s of the four trainings, repeat after repeat, each repeat running all four."""
    runs = {
        "bare_loop": lambda: bare_loop_in_a_new_process(samples, batch_size, threads, epochs),
        "bare_loop_in_ddp": lambda: bare_loop_in_a_new_process(samples, batch_size, threads,
                                                               epochs, wrap_in_ddp=True),
        "train_single": lambda: script_samples_per_s("train_single.py", samples, batch_size,
                                                     threads, epochs, work),
        "train_ddp_1_process": lambda: script_samples_per_s("train_ddp.py", samples,
                                                            batch_size, threads, epochs, work),
    }
    values = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            values[name].append(run())
    speeds = {name: median_of(v) for name, v in values.items()}
    bare = speeds["bare_loop"]["median"]
    return {"samples_per_s": speeds,
            "ratio_to_bare_loop": {name: v["median"] / bare for name, v in speeds.items()}}


def main(argv=None):
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="results file (JSON) to write")
    parser.add_argument("--samples", type=count, default=8192)
    parser.add_argument("--batch-sizes", default="32,128",
                        help="comma-separated batch sizes to measure the speed at")
    parser.add_argument("--epochs", type=count, default=4, help="per run; the first is left out")
    parser.add_argument("--repeats", type=count, default=3)
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--threads", type=count, default=torch.get_num_threads(),
                        help="torch CPU threads of every training (default: all cores)")
    # One bare loop in this process, its samples/s printed: how the main run measures it.
    parser.add_argument("--bare-loop", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ddp", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.bare_loop:
        print(bare_loop_samples_per_s(args.samples, int(args.batch_sizes), args.threads,
                                      args.epochs, wrap_in_ddp=args.ddp))
        return
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise UsageError(f"{out} exists; pass --overwrite to replace it")
    try:
        batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        raise UsageError(f"--batch-sizes takes numbers like 32,128, got {args.batch_sizes!r}") from None
    if args.epochs < 2 or args.repeats < 1 or min(batch_sizes) < 1:
        raise UsageError("--epochs must be at least 2 (the first is left out), --repeats and "
                         "each batch size at least 1")
    threads = args.threads
    with tempfile.TemporaryDirectory() as work:
        speed = {str(batch): training_speeds(args.samples, batch, threads, args.epochs,
                                             args.repeats, work) for batch in batch_sizes}
        startup = {
            "launcher_to_first_epoch_s": median_of(
                [launcher_to_first_epoch_s(work) for _ in range(args.repeats)]),
            "bare_torchrun_join_s": median_of(
                [bare_torchrun_join_s(work) for _ in range(args.repeats)])}
    result = {"what": "overhead of the companion scripts and launcher against bare PyTorch",
              "samples": args.samples, "epochs": args.epochs, "timed_epochs": args.epochs - 1,
              "repeats": args.repeats, "threads": threads, "by_batch_size": speed,
              "startup": startup, "hardware": describe_hardware(torch.device("cpu"))}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"ratio_to_bare_loop": {batch: {name: round(ratio, 3) for name, ratio
                                                     in value["ratio_to_bare_loop"].items()}
                                             for batch, value in speed.items()},
                      "startup_medians_s": {k: round(v["median"], 2)
                                            for k, v in startup.items()}}, indent=1))


if __name__ == "__main__":
    run_cli(main)
