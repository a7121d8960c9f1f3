"""Shared plumbing for the companion scripts: options, device, data, model, evaluation, files.

train_single.py, train_dp.py and train_ddp.py import it, so that the lines in which they differ
are the lessons themselves; each script keeps its own training loop in view. Everything that
talks to other ranks is in the section "Between ranks" at the end; the rest works the same
in one process and in many.
"""
import argparse
import contextlib
import datetime
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ddp_scripts.hardware import describe_hardware, usable_cores
from ddp_scripts.runfiles import CHECKPOINT, METRICS, SUMMARY, metrics_rows, write_error_file

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


class UsageError(Exception):
    """Bad input: reported as one line on stderr, exit status 2, no traceback."""


class RunStopped(Exception):
    """The run cannot go on (its loss stopped being finite): one line on stderr, exit status 1."""


# Set to 1 by the book's launcher and tests: a run that succeeds then ends with os._exit(0).
FAST_EXIT = "DDP_SCRIPTS_FAST_EXIT"


def run_cli(main):
    """Call `main()` as a script's entry point, and end the process.

    Bad input (UsageError) is one line on stderr and exit status 2; a run that had to stop
    (RunStopped) is one line and exit status 1; any other exception is Python's traceback and
    exit status 1. Either way the error also goes, as JSON, to the error file torchrun gives
    each worker (ddp_scripts/runfiles.py), where torchrun and the launcher read which rank
    failed and why. A run that succeeds returns, and Python exits as usual.

    With DDP_SCRIPTS_FAST_EXIT=1 it ends with os._exit(0) instead, once its output is
    flushed: that saves the time Python spends on its way out (it frees, one by one, the
    objects importing torch made), which adds up over the many short runs of the book's
    build. It also skips atexit handlers, the flushing of files left open and the wait for
    other threads: a logger you add would lose its last lines. So only the book's own
    launcher and tests set it; leave it unset for your own runs.
    """
    rank = int(os.environ["RANK"]) if "RANK" in os.environ else None
    try:
        main()
    except (UsageError, RunStopped) as error:
        status = 2 if isinstance(error, UsageError) else 1
        write_error_file(error, exit_code=status, rank=rank, with_stack=False)
        tag = f"[rank {rank}] " if rank is not None else ""
        sys.stderr.write(f"{tag}error: {error}\n")  # one write: see say()
        sys.stderr.flush()
        sys.exit(status)
    except Exception as error:
        write_error_file(error, exit_code=1, rank=rank)
        raise
    if os.environ.get(FAST_EXIT) == "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


# ---------------------------------------------------------------------------------------
# Command line: one set of options for every script, so every run is comparable.
# ---------------------------------------------------------------------------------------
class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, with its errors said as every other bad input is: one line (a
    UsageError, which run_cli reports), not the usage text and then the error."""

    def error(self, message):
        # "argument --lr: must be ..." (the types below) reads "--lr must be ..."
        raise UsageError(re.sub(r"^argument (-[^:/ ]+)[^:]*: must be", r"\1 must be", message))


def _number(kind, text, fits, what):
    """`text` read as `kind` (int or float) if it `fits`; else the line that says why."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be {'a whole number' if kind is int else 'a number'}, got {text!r}") from None
    if not ((kind is int or math.isfinite(value)) and fits(value)):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text[:40]}")
    return value


# The types of the numeric options: every value is checked as the options are read.
def count(text):
    return _number(int, text, lambda n: n >= 1, "at least 1")


def non_negative_int(text):
    return _number(int, text, lambda n: n >= 0, "0 or more")


def seed_number(text):  # torch.manual_seed takes up to 2**64 - 1, and the scripts add the epoch
    return _number(int, text, lambda n: 0 <= n < 2**63, "from 0 to 2**63 - 1")


def positive_number(text):
    return _number(float, text, lambda x: x > 0, "a finite number above 0")


def non_negative_number(text):
    return _number(float, text, lambda x: x >= 0, "a finite number, 0 or more")


def seconds(text):  # gloo refuses, in a traceback, a timeout of 1e10 s (it overflows)
    return _number(float, text, lambda x: 0 < x <= 1e9, "a number of seconds above 0, at most 1e9")


def build_parser(description):
    p = ArgumentParser(description=description)
    p.add_argument("--dataset", choices=["cifar10", "synthetic"], default="cifar10",
                   help="cifar10 falls back to synthetic (announced) when it cannot be had")
    p.add_argument("--data-dir", default="data", help="where CIFAR-10 is downloaded")
    p.add_argument("--train-samples", type=count, default=None,
                   help="use only the first N training images (default: all; synthetic: 50000)")
    p.add_argument("--test-samples", type=count, default=None,
                   help="use only the first N test images (default: all; synthetic: 10000)")
    p.add_argument("--model", choices=["cnn", "resnet18"], default="cnn",
                   help="cnn: the CNN of PyTorch's CIFAR-10 tutorial; resnet18: ResNet-18 as "
                        "CIFAR-10 papers use it (3x3 stride-1 stem, no max-pool), not "
                        "torchvision's ImageNet stem")
    p.add_argument("--epochs", type=count, default=2)
    p.add_argument("--batch-size", type=count, default=32, help="per process")
    p.add_argument("--lr", type=positive_number, default=0.01)
    p.add_argument("--momentum", type=non_negative_number, default=0.9)
    p.add_argument("--seed", type=seed_number, default=0)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], default="auto")
    p.add_argument("--threads", type=count, default=None,
                   help="torch CPU threads per process (default: cores / processes)")
    p.add_argument("--out", required=True, help="output directory: metrics.jsonl, checkpoint.pt")
    p.add_argument("--resume", action="store_true",
                   help="continue from OUT/checkpoint.pt if it exists, else start fresh")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in OUT")
    p.add_argument("--stop-after-epoch", type=count, default=None,
                   help="stop after this epoch, as if interrupted (for resume demos)")
    p.add_argument("--tf32", action="store_true",
                   help="let float32 convolutions and matrix products use TF32 on Ampere and "
                        "newer GPUs: faster, about 3 decimal digits (default: full float32)")
    p.add_argument("--timeout-s", type=seconds, default=600,
                   help="DDP: how long a collective waits for the other ranks before failing")
    # The source article's launcher, python -m torch.distributed.launch, passes this option
    # to every process; torchrun sets the LOCAL_RANK variable instead.
    p.add_argument("--local-rank", "--local_rank", type=non_negative_int, default=None, help=argparse.SUPPRESS)
    return p


def check_at_least_one(**options):
    """--name VALUE must be a positive count (None: not given, fine)."""
    for name, value in options.items():
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {value}")


def first_line(error):
    """An exception's message in one line, for a one-line error or announcement."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def check_args(args):
    """Reject values that cannot work, with a message that says what to do instead (each
    number alone is checked as it is read: see the types above build_parser)."""
    if args.resume and args.overwrite:
        raise UsageError("--resume and --overwrite contradict each other: pick one")
    if args.local_rank is not None:  # started by torch.distributed.launch, the article's way
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
        if os.environ["LOCAL_RANK"] == "0":
            print("notice: --local-rank comes from the deprecated torch.distributed.launch; "
                  "torchrun sets LOCAL_RANK instead", flush=True)
    set_precision(args.tf32)


# ---------------------------------------------------------------------------------------
# Device, precision, threads
# ---------------------------------------------------------------------------------------
def pick_device(requested="auto", local_rank=0):
    """The device this process trains on. 'auto' means CUDA if present, else CPU.

    Process `local_rank` of a node takes GPU `local_rank`. A cluster that starts one task
    per GPU itself (srun, no torchrun) shows each a single GPU, as cuda:0: with one GPU
    visible, a process of a later local rank takes it when the scheduler chose it
    (CUDA_VISIBLE_DEVICES is set). Under torchrun (TORCHELASTIC_RUN_ID is set) every worker
    of a node sees the same GPUs, so there, and on a machine with one GPU, a later local
    rank than there are GPUs is an error: two processes cannot share one GPU under nccl.
    """
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda asked for, but this machine has no usable CUDA GPU "
                             "(use --device cpu or --device auto)")
        visible = torch.cuda.device_count()
        bound_by_scheduler = (os.environ.get("CUDA_VISIBLE_DEVICES")
                              and "TORCHELASTIC_RUN_ID" not in os.environ)
        if visible == 1 and local_rank > 0 and bound_by_scheduler:
            return torch.device("cuda", 0)  # the one GPU the scheduler bound to this process
        if local_rank >= visible:
            raise UsageError(f"local rank {local_rank} needs GPU {local_rank}, but only "
                             f"{visible} GPU(s) are visible: start at most {visible} "
                             "processes per node, or use --device cpu")
        return torch.device("cuda", local_rank)
    if requested == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise UsageError("--device mps asked for, but Apple's MPS backend is not available here")
        return torch.device("mps")
    return torch.device("cpu")


def say_device(device, requested, world_size=1, gpus=0):
    """Say once (rank 0) where the run trains; louder when --device auto found no GPU
    although this PyTorch is built for CUDA (a driver, or CUDA_VISIBLE_DEVICES, hides it)."""
    if os.environ.get("RANK", "0") != "0":
        return
    where = str(device)
    if device.type == "cuda":
        where += f" ({torch.cuda.get_device_name(device)})"
        if world_size == 1 and gpus > 1:  # DataParallel
            where += f" and {gpus - 1} more GPU(s)"
    if world_size > 1:
        where += f", one of {world_size} processes"
    if device.type == "cpu" and requested == "auto" and torch.version.cuda:
        say(f"notice: training on {where}: --device auto found no usable GPU, although this "
            f"PyTorch is built for CUDA {torch.version.cuda} (no GPU, no driver, or "
            "CUDA_VISIBLE_DEVICES hides them)")
    else:
        say(f"training on {where}")


def require_gpus_for_data_parallel(device):
    """nn.DataParallel scatters batches over CUDA GPUs; on anything else it does nothing."""
    if device.type != "cuda":
        raise UsageError(f"DataParallel needs CUDA GPUs, and this run is on {device.type}: "
                         "use train_single.py, or --device cuda on a machine with GPUs")


def set_precision(tf32=False):
    """TF32: on Ampere and newer GPUs, PyTorch runs float32 convolutions (cuDNN) with 10-bit
    mantissas by default (torch.backends.cudnn.conv.fp32_precision is "tf32"), matrix products
    in full float32. Off (the default here), float32 means float32 everywhere ("ieee"), and a
    DDP run matches a single-process run as closely on a GPU as on a CPU; --tf32 trades that
    for speed. Only the fp32_precision settings are used: PyTorch refuses to read a mix of
    them and of the legacy allow_tf32 flags."""
    precision = "tf32" if tf32 else "ieee"
    torch.backends.cuda.matmul.fp32_precision = precision
    torch.backends.cudnn.conv.fp32_precision = precision


def set_cpu_threads(threads=None, processes_per_node=None):
    """Split the cores this process may use between the processes of its node: torchrun's
    LOCAL_WORLD_SIZE of them (1 without torchrun), unless `processes_per_node` is given.

    The cores it may use, not all of the machine's: a Slurm job or a container may pin it
    to fewer, or cap its CPU time (hardware.usable_cores), and counting all of them
    oversubscribes."""
    if processes_per_node is None:
        processes_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    threads = threads or max(1, usable_cores() // processes_per_node)
    torch.set_num_threads(threads)
    return threads


def synchronize(device):
    """Wait for queued GPU work, so that a clock read afterwards measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


# ---------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------
class Net(nn.Module):
    """The CNN of PyTorch's CIFAR-10 tutorial, which the source article trains."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def build_model(name="cnn", seed=0, dtype=torch.float32):
    """The same seed gives the same initial weights in every process."""
    torch.manual_seed(seed)
    if name == "cnn":
        model = Net()
    else:
        model = cifar_resnet18()
    return model.to(dtype)


def cifar_resnet18():
    """ResNet-18 as CIFAR-10 papers use it: torchvision's network with a 3x3 stride-1 stem and
    no max-pool. torchvision's ImageNet stem (7x7 stride-2 convolution, then a stride-2
    max-pool) would shrink a 32x32 image to 8x8 before the first block and to 1x1 at the end."""
    import torchvision  # imported only here: it costs seconds at start-up
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")  # as torchvision's
    model.maxpool = nn.Identity()
    return model


# ---------------------------------------------------------------------------------------
# Data: whole data sets as tensors, batches cut out by index
# ---------------------------------------------------------------------------------------
class TensorImages(torch.utils.data.Dataset):
    """Images and labels held as two tensors.

    `__getitems__` lets a DataLoader fetch a whole batch with one indexing operation
    instead of one call per image; `keep_batch` then passes that batch through as is.
    """

    def __init__(self, images, labels, source):
        self.images, self.labels, self.source = images, labels, source

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.images[index], self.labels[index]

    def __getitems__(self, indices):
        indices = torch.as_tensor(indices)
        return self.images[indices], self.labels[indices]


def keep_batch(batch):
    """collate_fn for TensorImages: the batch is already two stacked tensors."""
    return batch


def synthetic_cifar(train_samples=50_000, test_samples=10_000, seed=1234):
    """A learnable stand-in for CIFAR-10: same shapes, ten classes, offline.

    Each class has its own smooth colour pattern; an image is its class's pattern, shifted
    by up to 8 pixels, scaled, under strong noise. The CNN gets well above chance (10%) in
    one epoch and keeps improving for several, like on CIFAR-10, and accuracy on the
    separate test split (other images, same patterns) is meaningful.
    """
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(10, 3, 4, 4, generator=g)
    patterns = F.interpolate(coarse, size=(40, 40), mode="bicubic", align_corners=False)

    def make(n, split_seed):
        g_split = torch.Generator().manual_seed(split_seed)
        labels = torch.randint(0, 10, (n,), generator=g_split)
        dx, dy = torch.randint(0, 9, (2, n), generator=g_split)
        images = _shifted_crops(patterns, labels, dx, dy)
        # The pattern is faint (a sixth of the noise, or less): CIFAR-like difficulty.
        scale = (0.3 + 0.7 * torch.rand(n, 1, 1, 1, generator=g_split)) / 6
        images = scale * images + torch.randn(n, 3, 32, 32, generator=g_split)
        return images, labels

    return make(train_samples, seed + 1), make(test_samples, seed + 2)


def _shifted_crops(patterns, labels, dx, dy):
    """32x32 windows of each label's 40x40 pattern, starting at (dy, dx), without a loop."""
    rows = (dy[:, None] + torch.arange(32))[:, None, :, None]    # (n, 1, 32, 1)
    cols = (dx[:, None] + torch.arange(32))[:, None, None, :]    # (n, 1, 1, 32)
    channel = torch.arange(3)[None, :, None, None]                # (1, 3, 1, 1)
    return patterns[labels[:, None, None, None], channel, rows, cols]


def cifar10_tensors(data_dir, download):
    """CIFAR-10 through torchvision, normalised, as tensors. Raises if it cannot be had."""
    import torchvision  # imported here only: it costs seconds at start-up
    splits = []
    for train in (True, False):
        ds = torchvision.datasets.CIFAR10(root=data_dir, train=train, download=download)
        images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).float().div_(255)
        mean = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1)
        std = torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
        splits.append(((images - mean) / std, torch.tensor(ds.targets)))
    return splits


def load_datasets(dataset="cifar10", data_dir="data", train_samples=None, test_samples=None,
                  dtype="float32"):
    """Train and test sets as TensorImages. CIFAR-10 falls back to synthetic, announced.

    Under DDP every rank must train on the same data: CIFAR-10 is downloaded once, and the
    ranks compare what they loaded; if it differs (a node that could not get CIFAR-10 while
    the others did), the run stops with one line on every rank.
    """
    reason = None  # why CIFAR-10 could not be had, if it could not
    if dataset == "cifar10":
        try:
            (train, test), source = _cifar10_downloaded_once(data_dir), "cifar10"
        except Exception as error:  # offline, or a broken download
            reason = first_line(error)
            train, test = synthetic_cifar(train_samples or 50_000, test_samples or 10_000)
            source = "synthetic (fallback)"
    else:
        train, test = synthetic_cifar(train_samples or 50_000, test_samples or 10_000)
        source = "synthetic"
    agree_on_data_source(source, data_dir)
    # once per node (by every worker under torchrun --virtual-local-rank, where all are 0)
    if reason is not None and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        say(f"CIFAR-10 could not be loaded from {data_dir!r} ({reason}); "
            "using the synthetic CIFAR-shaped data set instead")
    (x_train, y_train), (x_test, y_test) = train, test
    if train_samples:
        x_train, y_train = x_train[:train_samples], y_train[:train_samples]
    if test_samples:
        x_test, y_test = x_test[:test_samples], y_test[:test_samples]
    dtype = getattr(torch, dtype)
    return (TensorImages(x_train.to(dtype), y_train, source),
            TensorImages(x_test.to(dtype), y_test, source))


def _cifar10_downloaded_once(data_dir):
    """Rank 0 downloads first, alone. Then every other rank whose disk lacks the files (a
    node without a shared file system) downloads them, one process at a time per disk (a
    lock file in data_dir), and the others on that disk find them whole and fetch nothing.
    The lock, not LOCAL_RANK, decides: under torchrun --virtual-local-rank every worker's
    LOCAL_RANK is 0. Then every rank reads them.

    Every rank meets the others at both barriers whatever happens in its turn: a rank that
    left the sequence early would meet the others in another collective, and the run would
    hang there."""
    if dist.is_initialized():
        for my_turn in (dist.get_rank() == 0, dist.get_rank() != 0):
            try:
                if my_turn:
                    with _one_process_at_a_time(Path(data_dir) / ".download.lock"):
                        cifar10_tensors(data_dir, download=True)  # verifies files it finds
            except Exception:  # reported below, when reading the files fails too
                pass
            finally:
                barrier()
    return cifar10_tensors(data_dir, download=not dist.is_initialized())


@contextlib.contextmanager
def _one_process_at_a_time(lock_path):
    """An exclusive lock on a file (POSIX flock). Where none can be had (Windows, a
    read-only folder, a file system without flock), no lock, said in one line: the
    download verifies what it finds, so the lock only saves downloading twice."""
    lock = None
    try:
        import fcntl
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        # read-only, created if missing: an existing lock file in a read-only folder serves
        lock = os.open(lock_path, os.O_RDONLY | os.O_CREAT, 0o666)
        fcntl.flock(lock, fcntl.LOCK_EX)
    except ImportError:  # Windows: no flock
        pass
    except OSError as error:
        say(f"no download lock ({first_line(error)}): downloading without one")
        if lock is not None:
            os.close(lock)
            lock = None
    try:
        yield
    finally:
        if lock is not None:
            os.close(lock)  # closing the file releases the lock


def check_batch_fits(batch_size, train_samples, world_size=None):
    """A global batch larger than the training set would make every epoch a single step.

    The global batch is batch_size times the number of processes in the group (one without
    a process group), unless `world_size` says otherwise."""
    if world_size is None:
        world_size = dist.get_world_size() if dist.is_initialized() else 1
    if batch_size * world_size > train_samples:
        raise UsageError(f"a global batch of {batch_size * world_size} ({world_size} x "
                         f"--batch-size {batch_size}) is larger than the {train_samples} "
                         "training images: lower --batch-size")


def make_loader(dataset, batch_size, sampler):
    """A DataLoader over a TensorImages set: one indexing operation per batch."""
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler,
                                       collate_fn=keep_batch)


# ---------------------------------------------------------------------------------------
# Evaluation, and what one epoch leaves behind
# ---------------------------------------------------------------------------------------
class reported_if_out_of_memory:
    """Around forward and backward: a batch too large for the device's memory becomes
    one line that says what to do, instead of a page of CUDA traceback."""

    def __init__(self, batch_size, device):
        self.batch_size, self.device = batch_size, device

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if kind is not None and issubclass(kind, torch.OutOfMemoryError):
            raise UsageError(f"a batch of {self.batch_size} images does not fit in the memory "
                             f"of {self.device}: lower --batch-size") from None
        return False


@torch.no_grad()
def evaluate(model, loader, device):
    """Returns (sum of losses, correct predictions, samples) as a tensor on `device`."""
    model.eval()
    totals = torch.zeros(3, device=device, dtype=torch.float64)
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        outputs = model(images)
        totals[0] += F.cross_entropy(outputs, labels, reduction="sum")
        totals[1] += (outputs.argmax(1) == labels).sum()
        totals[2] += len(labels)
    return totals


def run_context(args, device, strategy, threads, data_source, world_size=1, gpus=None, **levers):
    """What every line of metrics.jsonl records about how the run was made; `levers`: the
    options of chapter 10 (train_fast.py, speed.lever_settings). Rank 0 also says, once, on
    which device the run trains."""
    if gpus is None:
        gpus = world_size if device.type == "cuda" else 0
    say_device(device, args.device, world_size, gpus)
    return {"world_size": world_size, "device": str(device),
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "strategy": strategy, "gpus": gpus, "threads": threads,
            "batch_size": args.batch_size, "global_batch_size": args.batch_size * world_size,
            "dtype": args.dtype, "tf32": args.tf32, "dataset": data_source, **levers}


def epoch_record(epoch, train_totals, test_totals, epoch_time_s, **context):
    """One line of metrics.jsonl."""
    train_loss, train_seen = train_totals.tolist()[:2]
    test_loss, correct, test_seen = test_totals.tolist()
    return {"epoch": epoch,
            "train_loss": train_loss / train_seen,
            "test_loss": test_loss / test_seen,
            "test_accuracy": correct / test_seen,
            "epoch_time_s": epoch_time_s,
            "samples_per_s": train_seen / epoch_time_s,
            "train_samples": int(train_seen),
            "test_samples": int(test_seen),
            **context}


def save_epoch(args, epoch, model, optimizer, train_totals, test_totals, epoch_time_s, context):
    """Log the epoch to metrics.jsonl, then save the checkpoint that covers it, then say so."""
    record = epoch_record(epoch, train_totals, test_totals, epoch_time_s, **context)
    append_metrics(args.out, record)
    save_checkpoint(args.out, model, optimizer, epoch, args)
    say(f"epoch {epoch}/{args.epochs} train_loss={record['train_loss']:.4f} "
        f"test_accuracy={record['test_accuracy']:.4f} samples/s={record['samples_per_s']:.0f}")


def resume_from(checkpoint, model, optimizer, out):
    """Load a checkpoint (or None) into the model and optimizer; returns the first epoch to run."""
    if checkpoint is None:
        return 1
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    say(f"resuming after epoch {checkpoint['epoch']} from {out}")
    return checkpoint["epoch"] + 1


def write_summary(out, strategy, device, start, train_start, args, world_size=1, **extra):
    """OUT/run.json, once the run has finished: times, hardware, options; `extra`: more keys
    to record."""
    end = time.perf_counter()  # the clock the scripts' START was read from
    summary = {"strategy": strategy, "world_size": world_size,
               "startup_s": train_start - start, "train_s": end - train_start,
               "total_s": end - start, "hardware": describe_hardware(device), "args": vars(args),
               **extra}
    write_atomically(Path(out) / SUMMARY, lambda f: f.write(json.dumps(summary, indent=1)),
                     mode="w")


# ---------------------------------------------------------------------------------------
# Output directory: metrics.jsonl and checkpoint.pt, never overwritten by accident
# ---------------------------------------------------------------------------------------
def prepare_out_dir(args):
    """Check OUT before any work starts. Returns the checkpoint to resume from, or None.

    Only reads: under DDP rank 0 calls it (see on_rank_0) and tells the others what it found.
    """
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a directory")
    holds_run = (out / METRICS).exists() or (out / CHECKPOINT).exists()
    if holds_run and not (args.resume or args.overwrite):
        raise UsageError(f"{out} already holds a run; pass --resume to continue it, "
                         "--overwrite to replace it, or choose another --out")
    if args.resume and (out / CHECKPOINT).exists():
        return load_checkpoint(out / CHECKPOINT, expect=run_identity(args))
    return None


def start_out_dir(args, checkpoint):
    """Create OUT; keep only the epochs the checkpoint has, or start empty.

    After a crash OUT may hold an epoch logged just before its checkpoint was due (it is
    trained again, so its line goes), half a line, or the temporary file of a save that
    never finished: none of them survives here.
    """
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kept = []
    if checkpoint is not None:
        kept = [row for row in metrics_rows(out) if row["epoch"] <= checkpoint["epoch"]]
    write_atomically(out / METRICS, lambda f: f.write("".join(json.dumps(row) + "\n"
                                                              for row in kept)), mode="w")
    (out / SUMMARY).unlink(missing_ok=True)
    for unfinished in out.glob(".*.tmp*"):  # see write_atomically
        unfinished.unlink(missing_ok=True)


def append_metrics(out, record):
    """Append one epoch; flushed to disk before the checkpoint that covers it is written."""
    with open(Path(out) / METRICS, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def write_atomically(path, write, mode="wb"):
    """Write to a temporary file, then rename: a crash mid-write leaves the old file whole."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, mode) as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def run_identity(args):
    """What must match for a checkpoint to belong to this run."""
    return {"model": args.model, "dataset": args.dataset, "dtype": args.dtype}


def save_checkpoint(out, model, optimizer, epoch, args):
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "epoch": epoch, "identity": run_identity(args)}
    write_atomically(Path(out) / CHECKPOINT, lambda f: torch.save(state, f))


def load_checkpoint(path, expect=None):
    """Load on the CPU (`map_location`), tensors only (`weights_only`), checked."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise UsageError(f"cannot read checkpoint {path}: {first_line(error)[:200]}") from None
    if not isinstance(state, dict) or not {"model", "optimizer", "epoch"} <= state.keys():
        raise UsageError(f"{path} is not a checkpoint of these scripts "
                         "(expected the keys model, optimizer and epoch)")
    if expect is not None and state.get("identity", expect) != expect:
        raise UsageError(f"{path} belongs to another run ({state['identity']}), not {expect}; "
                         "use another --out or --overwrite")
    return state


def say(message):
    """Print one line, tagged with this process's rank, flushed at once.

    The line and its newline go out in one write: print() writes them apart, and with
    unbuffered output (PYTHONUNBUFFERED=1, as the launcher sets) two ranks' lines can mix.
    """
    sys.stdout.write(f"[rank {os.environ.get('RANK', '0')}] {message}\n")
    sys.stdout.flush()


# ---------------------------------------------------------------------------------------
# Between ranks: everything here is a collective (every rank must call it) or a no-op
# without a process group, so that train_single.py can call the same functions.
# ---------------------------------------------------------------------------------------
def backend_for(device):
    """nccl talks GPU to GPU; gloo works on CPUs (and is the only choice without a GPU)."""
    return "nccl" if device.type == "cuda" else "gloo"


def require_torchrun(script):
    """The DDP scripts learn their rank from torchrun's variables: say so if they are missing.
    `script`: the script's name or path (its __file__)."""
    if "LOCAL_RANK" not in os.environ:
        raise UsageError("LOCAL_RANK is not set: start this script with torchrun, e.g. "
                         f"torchrun --standalone --nproc_per_node 2 ddp_scripts/{Path(script).name} ...")


def init_process_group(device, timeout_s):
    """Join the group torchrun set up (MASTER_ADDR, RANK, WORLD_SIZE in the environment).
    On a GPU the group is bound to this process's device (device_id), so that nccl's
    collectives, barriers included, run on it and on no other."""
    if device.type == "mps":
        raise UsageError("MPS runs one process only: use train_single.py --device mps")
    dist.init_process_group(backend=backend_for(device),
                            timeout=datetime.timedelta(seconds=timeout_s),
                            device_id=device if device.type == "cuda" else None)
    check_one_gpu_per_rank(device)


def check_one_gpu_per_rank(device):
    """Two ranks on one GPU: say so in one line. NCCL itself refuses them while
    init_process_group connects the ranks (device_id binds the group to the GPU, so the
    connection is made there), unless NCCL_MULTI_RANK_GPU_ENABLE=1 allows it; this check
    speaks for the case NCCL lets through, where the ranks would contend for one GPU."""
    if device.type != "cuda" or dist.get_world_size() == 1:
        return
    # Over the group just made (nccl, on the GPU torch.cuda.set_device chose): a second
    # group, of gloo, would need a network interface of its own on every node.
    uuids = [None] * dist.get_world_size()
    dist.all_gather_object(uuids, str(torch.cuda.get_device_properties(device).uuid))
    for rank, uuid in enumerate(uuids):
        if uuids.index(uuid) != rank:
            raise UsageError(f"ranks {uuids.index(uuid)} and {rank} were given the same GPU "
                             f"({uuid}): start one process per GPU")


def barrier():
    """Wait for every rank (a no-op without a process group)."""
    if dist.is_initialized():
        dist.barrier()


def on_rank_0(function, *args):
    """Run function(*args) on rank 0 only; every rank gets its result, or its UsageError.

    For what only rank 0 can decide. OUT is on rank 0's disk: on several nodes without a
    shared file system the others cannot see it, and each deciding alone would start some
    ranks at epoch 1 while rank 0 resumes, to hang at the first all-reduce.
    """
    if not dist.is_initialized():
        return function(*args)
    answer = [None]
    if dist.get_rank() == 0:
        try:
            answer = [(True, function(*args))]
        except UsageError as error:
            answer = [(False, str(error))]
    dist.broadcast_object_list(answer, src=0)
    succeeded, value = answer[0]
    if not succeeded:
        raise UsageError(value)
    return value


def agree_on_data_source(source, data_dir):
    """Stop, on every rank, unless every rank loaded the same data set."""
    if not dist.is_initialized():
        return
    sources = [None] * dist.get_world_size()
    dist.all_gather_object(sources, source)
    if len(set(sources)) > 1:
        odd = [rank for rank, other in enumerate(sources) if other != sources[0]]
        raise UsageError(f"the ranks loaded different data: rank 0 {sources[0]!r}, ranks {odd} "
                         f"{sources[odd[0]]!r}; put CIFAR-10 in {data_dir!r} on every node "
                         "(or use a shared file system), or pass --dataset synthetic")


def stop_if_loss_not_finite(train_totals, epoch):
    """After an epoch's training, before anything of it is saved: if the loss became nan or
    inf, stop the run on every rank, with one line that names the epoch and the step.

    train_one_epoch keeps its totals on the device: (sum of losses, samples, steps before
    that sum stopped being finite). A check at every step would need the CPU to read the
    loss (.item()), and wait for the GPU, at every step; here the device counts the steps
    and the CPU reads one number per epoch. The epoch runs to its end, and the checkpoint
    of the last good epoch stays. The ranks' losses differ (each its own batches), so they
    agree on the earliest step over all ranks: one all_reduce of one number per epoch."""
    first_bad_step = (train_totals[2] + 1).where(~train_totals[0].isfinite(), math.inf)
    first_bad_step = first_bad_step.reshape(1)
    if dist.is_initialized():
        dist.all_reduce(first_bad_step, op=dist.ReduceOp.MIN)
    step = first_bad_step.item()
    if math.isfinite(step):
        raise RunStopped(f"the loss became nan or inf at epoch {epoch}, step {step:.0f}: lower "
                         f"--lr (nothing of epoch {epoch} was saved: the checkpoint, if there "
                         "is one, holds the epoch before)")


def reduce_sum(totals):
    """Add a tensor of totals over all ranks (a no-op without a process group)."""
    if dist.is_initialized():
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    return totals


def average_buffers(model):
    """Average BatchNorm's running statistics over the ranks (a no-op without a group).

    DDP copies rank 0's buffers to every rank before each forward pass, but each rank then
    updates them on its own batch: after the last step the ranks hold different statistics.
    Averaged, every rank evaluates, and rank 0 saves, the same model."""
    if not dist.is_initialized():
        return
    for buffer in model.buffers():
        if buffer.is_floating_point():
            dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
            buffer /= dist.get_world_size()
