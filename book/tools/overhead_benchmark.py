"""How much do the companion scripts and the launcher cost, against bare PyTorch?

    python book/tools/overhead_benchmark.py --out results/overhead/<machine>.json

1. Training speed: samples/s of a bare loop (the same CNN, batch, tensors and shuffle, no
   DataLoader, no logging) against train_single.py and train_ddp.py with one process. Each
   trains two epochs and the second is timed: the first pays for warm-up (oneDNN picks its
   kernels, the allocator grows) in every process alike.
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ddp_scripts.common import (build_model, describe_hardware, synthetic_cifar,  # noqa: E402
                                UsageError, run_cli)
from ddp_scripts.launcher import run_command, run_script, torchrun_command  # noqa: E402

JOIN_ONLY = """
import torch.distributed as dist
dist.init_process_group("gloo")
dist.destroy_process_group()
"""


def bare_loop_samples_per_s(samples, batch_size, threads, seed=0):
    """The floor: the same work as the scripts' training, written as plainly as possible."""
    torch.set_num_threads(threads)
    (images, labels), _ = synthetic_cifar(samples, 16)
    model = build_model("cnn", seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    for epoch in (1, 2):  # the second epoch is timed, as for the scripts
        order = torch.randperm(samples, generator=torch.Generator().manual_seed(seed + epoch))
        start = time.perf_counter()
        for i in range(0, samples, batch_size):
            index = order[i:i + batch_size]
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(images[index]), labels[index]).backward()
            optimizer.step()
        elapsed = time.perf_counter() - start
    return samples / elapsed


def script_samples_per_s(script, samples, batch_size, threads, work):
    out = Path(tempfile.mkdtemp(dir=work))
    frame = run_script(script, nproc=1, out=out, dataset="synthetic", train_samples=samples,
                       test_samples=16, epochs=2, batch_size=batch_size, threads=threads,
                       progress=False, echo=lambda line: None)
    return float(frame["samples_per_s"].iloc[-1])


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


def median_of(repeats, measure, *args):
    values = [measure(*args) for _ in range(repeats)]
    return {"median": statistics.median(values), "values": values}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="results file (JSON) to write")
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise UsageError(f"{out} exists; pass --overwrite to replace it")
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as work:
        speed = {
            "bare_loop": median_of(args.repeats, bare_loop_samples_per_s, args.samples,
                                   args.batch_size, threads),
            "train_single": median_of(args.repeats, script_samples_per_s, "train_single.py",
                                      args.samples, args.batch_size, threads, work),
            "train_ddp_1_process": median_of(args.repeats, script_samples_per_s,
                                             "train_ddp.py", args.samples, args.batch_size,
                                             threads, work),
        }
        startup = {"launcher_to_first_epoch_s": median_of(args.repeats,
                                                          launcher_to_first_epoch_s, work),
                   "bare_torchrun_join_s": median_of(args.repeats, bare_torchrun_join_s, work)}
    bare = speed["bare_loop"]["median"]
    result = {"what": "overhead of the companion scripts and launcher against bare PyTorch",
              "samples": args.samples, "batch_size": args.batch_size, "threads": threads,
              "samples_per_s": speed, "startup": startup,
              "ratio_to_bare_loop": {name: value["median"] / bare for name, value in speed.items()},
              "hardware": describe_hardware(torch.device("cpu"))}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"ratio_to_bare_loop": result["ratio_to_bare_loop"],
                      "startup_medians_s": {k: v["median"] for k, v in startup.items()}},
                     indent=1))


if __name__ == "__main__":
    run_cli(main)
