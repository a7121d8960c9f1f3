"""Shared plumbing for the companion scripts: model, data, device, logging, checkpoints.

Every training script in this folder imports this module, so the lines that differ
between `train_single.py`, `train_dp.py` and `train_ddp.py` are the lessons themselves.
Nothing here starts processes or talks to other ranks except `reduce_sum`.
"""
import argparse
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

CLASSES = ("plane", "car", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


class UsageError(Exception):
    """Bad input: reported as one line on stderr, exit status 2, no traceback."""


def run_cli(main):
    """Call `main()`; turn a UsageError into a one-line message and exit status 2.

    Call it last: afterwards the process's objects are frozen for a quick exit (see below).
    """
    try:
        main()
    except UsageError as error:
        rank = f"[rank {os.environ['RANK']}] " if "RANK" in os.environ else ""
        sys.stderr.write(f"{rank}error: {error}\n")  # one write: see say()
        sys.stderr.flush()
        sys.exit(2)
    finally:
        # The run is over and its files are written and closed. On its way out Python would
        # now garbage-collect the 300,000 objects that importing torch created, again and
        # again (about 1.5 s per process on a small CPU, paid by every rank); freezing them
        # skips that, and the operating system frees the memory as the process ends.
        gc.freeze()


# ---------------------------------------------------------------------------------------
# Command line: one set of options for every script, so every run is comparable.
# ---------------------------------------------------------------------------------------
def build_parser(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--dataset", choices=["cifar10", "synthetic"], default="cifar10",
                   help="cifar10 falls back to synthetic (announced) when it cannot be had")
    p.add_argument("--data-dir", default="data", help="where CIFAR-10 is downloaded")
    p.add_argument("--train-samples", type=int, default=None,
                   help="use only the first N training images (default: all; synthetic: 50000)")
    p.add_argument("--test-samples", type=int, default=None,
                   help="use only the first N test images (default: all; synthetic: 10000)")
    p.add_argument("--model", choices=["cnn", "resnet18"], default="cnn")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], default="auto")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads per process (default: cores / processes)")
    p.add_argument("--out", required=True, help="output directory: metrics.jsonl, checkpoint.pt")
    p.add_argument("--resume", action="store_true",
                   help="continue from OUT/checkpoint.pt if it exists, else start fresh")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in OUT")
    p.add_argument("--stop-after-epoch", type=int, default=None,
                   help="stop after this epoch, as if interrupted (for resume demos)")
    return p


def check_args(args):
    """Reject values that cannot work, with a message that says what to do instead."""
    for name in ("epochs", "batch_size"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    for name in ("train_samples", "test_samples"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.resume and args.overwrite:
        raise UsageError("--resume and --overwrite contradict each other: pick one")


# ---------------------------------------------------------------------------------------
# Device and backend
# ---------------------------------------------------------------------------------------
def pick_device(requested="auto", local_rank=0):
    """The device this process trains on. 'auto' means CUDA if present, else CPU."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda asked for, but this machine has no usable CUDA GPU "
                             "(use --device cpu or --device auto)")
        if local_rank >= torch.cuda.device_count():
            raise UsageError(f"local rank {local_rank} needs GPU {local_rank}, but only "
                             f"{torch.cuda.device_count()} GPU(s) are visible: start at most "
                             f"{torch.cuda.device_count()} processes per node")
        return torch.device("cuda", local_rank)
    if requested == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise UsageError("--device mps asked for, but Apple's MPS backend is not available here")
        return torch.device("mps")
    return torch.device("cpu")


def backend_for(device):
    """nccl talks GPU to GPU; gloo works on CPUs (and is the only choice without a GPU)."""
    return "nccl" if device.type == "cuda" else "gloo"


def set_cpu_threads(args, processes_per_node=1):
    """Split the cores between the processes of this node, so they do not fight over them."""
    threads = args.threads or max(1, (os.cpu_count() or 1) // processes_per_node)
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
    else:  # torchvision is imported only here: it costs seconds at start-up
        import torchvision
        model = torchvision.models.resnet18(num_classes=10)
    return model.to(dtype)


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


def load_datasets(args, rank=0, local_rank=0, announce=print):
    """Train and test sets as TensorImages. CIFAR-10 falls back to synthetic, announced."""
    dtype = getattr(torch, args.dtype)
    if args.dataset == "cifar10":
        try:
            (train, test), source = _cifar10_once_per_node(args.data_dir, local_rank), "cifar10"
        except Exception as error:  # offline, or a broken download
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            if rank == 0:
                announce(f"CIFAR-10 could not be loaded from {args.data_dir!r} ({reason}); "
                         "using the synthetic CIFAR-shaped data set instead")
            train, test = _synthetic_for(args)
            source = "synthetic (fallback)"
    else:
        train, test = _synthetic_for(args)
        source = "synthetic"
    (x_train, y_train), (x_test, y_test) = train, test
    if args.train_samples:
        x_train, y_train = x_train[:args.train_samples], y_train[:args.train_samples]
    if args.test_samples:
        x_test, y_test = x_test[:args.test_samples], y_test[:args.test_samples]
    return (TensorImages(x_train.to(dtype), y_train, source),
            TensorImages(x_test.to(dtype), y_test, source))


def _synthetic_for(args):
    return synthetic_cifar(args.train_samples or 50_000, args.test_samples or 10_000)


def _cifar10_once_per_node(data_dir, local_rank):
    """Only local rank 0 downloads; the others wait for it, then read the files."""
    if dist.is_initialized():
        if local_rank == 0:
            try:
                cifar10_tensors(data_dir, download=True)
            finally:
                dist.barrier()
        else:
            dist.barrier()
        return cifar10_tensors(data_dir, download=False)
    return cifar10_tensors(data_dir, download=True)


def check_batch_fits(batch_size, world_size, train_samples):
    """A global batch larger than the training set would make every epoch a single step."""
    if batch_size * world_size > train_samples:
        raise UsageError(f"a global batch of {batch_size * world_size} ({world_size} x "
                         f"--batch-size {batch_size}) is larger than the {train_samples} "
                         "training images: lower --batch-size")


def make_loader(dataset, batch_size, sampler):
    """A DataLoader over a TensorImages set: one indexing operation per batch."""
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler,
                                       collate_fn=keep_batch)


# ---------------------------------------------------------------------------------------
# One epoch of training, one pass of evaluation
# ---------------------------------------------------------------------------------------
def train_one_epoch(model, loader, optimizer, device):
    """Returns (sum of losses, number of samples) as a tensor on `device`.

    The loss is accumulated on the device and read once per epoch: calling `.item()` in
    the loop would make the CPU wait for the GPU at every step.
    """
    model.train()
    totals = torch.zeros(2, device=device, dtype=torch.float64)
    for images, labels in loader:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        try:
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
        except torch.OutOfMemoryError:
            raise UsageError(f"a batch of {len(labels)} images does not fit in the memory of "
                             f"{device}: lower --batch-size") from None
        optimizer.step()
        totals[0] += loss.detach() * len(labels)
        totals[1] += len(labels)
    return totals


@torch.no_grad()
def evaluate(model, loader, device):
    """Returns (sum of losses, correct predictions, samples) as a tensor on `device`."""
    model.eval()
    totals = torch.zeros(3, device=device, dtype=torch.float64)
    for images, labels in loader:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        outputs = model(images)
        totals[0] += F.cross_entropy(outputs, labels, reduction="sum")
        totals[1] += (outputs.argmax(1) == labels).sum()
        totals[2] += len(labels)
    return totals


def reduce_sum(totals):
    """Add a tensor of totals over all ranks (a no-op without a process group)."""
    if dist.is_initialized():
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    return totals


def epoch_record(epoch, train_totals, test_totals, epoch_time_s, **context):
    """One line of metrics.jsonl."""
    train_loss, train_seen = train_totals.tolist()
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


# ---------------------------------------------------------------------------------------
# Output directory: metrics.jsonl and checkpoint.pt, never overwritten by accident
# ---------------------------------------------------------------------------------------
METRICS, CHECKPOINT, SUMMARY = "metrics.jsonl", "checkpoint.pt", "run.json"


def prepare_out_dir(args):
    """Check OUT before any work starts. Returns the checkpoint to resume from, or None.

    Every rank calls this; only reading happens here, so they all reach the same verdict.
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
    """On rank 0: create OUT; keep only the epochs the checkpoint has, or start empty.

    After a crash OUT may hold an epoch logged just before its checkpoint was due (it is
    trained again, so its line goes), half a line, or the temporary file of a save that
    never finished: none of them survives here.
    """
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kept = []
    if checkpoint is not None and (out / METRICS).exists():
        lines = (out / METRICS).read_text().splitlines()
        kept = [line for line, epoch in zip(lines, map(_logged_epoch, lines))
                if epoch is not None and epoch <= checkpoint["epoch"]]
    write_atomically(out / METRICS, lambda f: f.write("".join(line + "\n" for line in kept)),
                     mode="w")
    (out / SUMMARY).unlink(missing_ok=True)
    for unfinished in out.glob(".*.tmp*"):  # see write_atomically
        unfinished.unlink(missing_ok=True)


def _logged_epoch(line):
    """The epoch of one line of metrics.jsonl; None for a line a crash cut short."""
    try:
        return json.loads(line)["epoch"]
    except (ValueError, KeyError, TypeError):
        return None


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
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(f"cannot read checkpoint {path}: {first[:200]}") from None
    if not isinstance(state, dict) or not {"model", "optimizer", "epoch"} <= state.keys():
        raise UsageError(f"{path} is not a checkpoint of these scripts "
                         "(expected the keys model, optimizer and epoch)")
    if expect is not None and state.get("identity", expect) != expect:
        raise UsageError(f"{path} belongs to another run ({state['identity']}), not {expect}; "
                         "use another --out or --overwrite")
    return state


def unwrap(model):
    """The plain model inside a DataParallel or DistributedDataParallel wrapper."""
    return model.module if hasattr(model, "module") else model


def describe_hardware(device):
    """What a number was measured on: stored beside every result."""
    info = {"platform": platform.platform(), "processor": _cpu_name(),
            "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "device": str(device), "gpus": []}
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def _cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_summary(out, summary):
    write_atomically(Path(out) / SUMMARY, lambda f: f.write(json.dumps(summary, indent=1)),
                     mode="w")


def say(message, rank=0):
    """Print one line, tagged with the rank, flushed at once (launchers read it live).

    The line and its newline go out in one write: print() writes them apart, and with
    unbuffered output (PYTHONUNBUFFERED=1, as the launcher sets) two ranks' lines can mix.
    """
    sys.stdout.write(f"[rank {rank}] {message}\n")
    sys.stdout.flush()


def elapsed_since(start):
    return time.perf_counter() - start


def device_table(free_memory=False, uuids=False):
    """What this process can compute on, one row per device: a pandas DataFrame.

    CUDA GPUs first, numbered as this process sees them (CUDA_VISIBLE_DEVICES applies),
    then Apple's MPS if present, then the CPU. `free_memory=True` adds each GPU's free
    memory (torch.cuda.mem_get_info, which starts a CUDA context on every GPU it asks);
    `uuids=True` adds each GPU's UUID, the name that does not change with renumbering.
    """
    import pandas as pd  # imported here only: the training scripts do not need it
    columns = ["name", "memory_gib", "compute_capability", "processors"]
    columns += ["free_gib"] if free_memory else []
    columns += ["uuid"] if uuids else []
    rows = []
    for index in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        props = torch.cuda.get_device_properties(index)
        row = {"device": f"cuda:{index}", "name": props.name,
               "memory_gib": round(props.total_memory / 2**30, 1),
               "compute_capability": f"{props.major}.{props.minor}",
               "processors": f"{props.multi_processor_count} SMs"}
        if free_memory:
            row["free_gib"] = round(torch.cuda.mem_get_info(index)[0] / 2**30, 1)
        if uuids:
            uuid = str(getattr(props, "uuid", "?"))  # nvidia-smi writes it GPU-...
            row["uuid"] = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        rows.append(row)
    if hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
        rows.append({"device": "mps", "name": "Apple GPU (Metal)",
                     "processors": "shares the CPU's memory"})
    rows.append({"device": "cpu", "name": _cpu_name(), "memory_gib": _ram_gib(),
                 "processors": f"{os.cpu_count()} cores"})
    table = pd.DataFrame(rows).set_index("device").reindex(columns=columns)
    return table.astype(object).where(table.notna(), "-")


def _ram_gib():
    """The machine's memory in GiB, where the system reports it."""
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None
