"""The data: CIFAR-10, or a synthetic stand-in, as whole tensors; batches cut out by index.

Under DDP, CIFAR-10 is downloaded once (a lock file per disk), and the ranks check that they
all loaded the same data.
"""
import contextlib
import errno
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddp_scripts.cli import RunStopped, UsageError, first_line, say
from ddp_scripts.ranks import agree_on_data_source

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


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


# The archive torchvision unpacks: its name, size and MD5 (torchvision's CIFAR10.tgz_md5, which it
# checks before unpacking). A copy put into the data folder by hand is used as it is.
ARCHIVE, ARCHIVE_BYTES = "cifar-10-python.tar.gz", 170_498_071
ARCHIVE_MD5 = "c58f30108f718f92721af3b95e74349a"
# The whole download: a slow host gives up, and says how to go on. Under torchrun the other
# ranks wait for rank 0's download in a collective, which fails after the process group's
# timeout (--timeout-s, 600 s by default): half of that leaves time to unpack and read.
DOWNLOAD_TIMEOUT_S = 300
STALL_S = 30               # one read that brings no byte


def how_to_place(data_dir):
    return (f"put {ARCHIVE} ({ARCHIVE_BYTES:,} bytes, MD5 {ARCHIVE_MD5}) into {data_dir}/ "
            "by hand and run again")


def fetch_archive(data_dir, url=None, limit_s=DOWNLOAD_TIMEOUT_S, stall_s=STALL_S):
    """The CIFAR-10 archive in data_dir, downloaded within limit_s seconds if it is not there.

    The download goes to a .part file, renamed only when whole: a run stopped half-way leaves
    nothing that looks like the archive. Raises OSError in one line, saying how to place it."""
    import time
    import urllib.request
    from torchvision.datasets import CIFAR10
    from torchvision.datasets.utils import check_integrity
    target = Path(data_dir) / ARCHIVE
    if target.exists():
        if not check_integrity(str(target), ARCHIVE_MD5):
            raise OSError(f"{target} is not the CIFAR-10 archive (its MD5 is not {ARCHIVE_MD5}); "
                          f"replace it: {ARCHIVE_BYTES:,} bytes")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f"{ARCHIVE}.{os.getpid()}.part")
    deadline = time.monotonic() + limit_s
    try:
        with urllib.request.urlopen(url or CIFAR10.url, timeout=stall_s) as response, \
                open(part, "wb") as out:
            while chunk := response.read1(1 << 20):   # what has come, not a full 1 MiB
                out.write(chunk)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not done after {limit_s:g} s")
        os.replace(part, target)
    except (OSError, ValueError) as error:   # no network, a refused or slow host, a bad URL
        raise OSError(f"download of {ARCHIVE} failed ({first_line(error)}): "
                      f"{how_to_place(data_dir)}") from None
    finally:
        part.unlink(missing_ok=True)
    return target


def unpacked_files():
    """The files CIFAR10 reads, with torchvision's MD5 of each: the six batches, and
    batches.meta (the class names), which torchvision's own check leaves out."""
    from torchvision.datasets import CIFAR10
    return [*CIFAR10.train_list, *CIFAR10.test_list, [CIFAR10.meta["filename"], CIFAR10.meta["md5"]]]


def unpacked_state(data_dir):
    """(whole, what is wrong): whether data_dir holds CIFAR-10's unpacked files, each with its
    MD5; and, in words, which are missing or fail their MD5 ("" if none is there yet)."""
    from torchvision.datasets import CIFAR10
    from torchvision.datasets.utils import check_integrity
    folder = Path(data_dir) / CIFAR10.base_folder
    missing = [name for name, _ in unpacked_files() if not (folder / name).is_file()]
    damaged = [name for name, md5 in unpacked_files()
               if name not in missing and not check_integrity(str(folder / name), md5)]
    if not damaged and len(missing) == len(unpacked_files()):
        return False, ""
    wrong = [f"{', '.join(damaged)} in {folder}/ failed the MD5 check (damaged, or copied in part)"
             ] if damaged else []
    if missing:
        wrong.append(f"{folder}/ lacks {', '.join(missing)}")
    return not wrong, "; ".join(wrong)


def unpacked_whole(data_dir):
    """Whether data_dir holds CIFAR-10's unpacked files, each with torchvision's checksum."""
    return unpacked_state(data_dir)[0]


class Cifar10Missing(OSError):
    """CIFAR-10 cannot be read from a folder: what is wrong with the files there (`wrong`), and
    why none were downloaded (`download`, which says how to place the archive by hand)."""

    def __init__(self, data_dir, wrong, download):
        self.wrong, self.download = wrong, download
        super().__init__("; ".join(part for part in (wrong, download) if part)
                         or f"no CIFAR-10 in {data_dir}/: {how_to_place(data_dir)}")


def cifar10_tensors(data_dir, download):
    """CIFAR-10 through torchvision, normalised, as tensors. Raises if it cannot be had: a
    Cifar10Missing, in one line, when the files are not whole and cannot be downloaded."""
    import torchvision  # imported here only: it costs seconds at start-up
    whole, wrong = unpacked_state(data_dir)
    if not whole:
        if not download:
            raise Cifar10Missing(data_dir, wrong, None)
        # Taken only when there is something to download: a run that finds the files says nothing.
        with _one_process_at_a_time(Path(data_dir) / ".download.lock"):
            if not unpacked_whole(data_dir):   # else filled by another process while this one waited
                try:
                    _unpack(fetch_archive(data_dir), data_dir)   # within a time limit
                except OSError as error:
                    raise Cifar10Missing(data_dir, wrong, first_line(error)) from None
    splits = []
    for train in (True, False):
        ds = torchvision.datasets.CIFAR10(root=data_dir, train=train, download=False)
        images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).float().div_(255)
        mean = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1)
        std = torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
        splits.append(((images - mean) / std, torch.tensor(ds.targets)))
    return splits


def _unpack(archive, data_dir):
    """Unpack into a folder of this process's own, then rename each file into place: a process
    that reads while another unpacks (no lock) sees a file whole or not at all."""
    from torchvision.datasets import CIFAR10
    from torchvision.datasets.utils import extract_archive
    scratch = Path(data_dir) / f".unpack.{os.getpid()}"
    try:
        extract_archive(str(archive), str(scratch))
        folder = Path(data_dir) / CIFAR10.base_folder
        folder.mkdir(exist_ok=True)
        for file in (scratch / CIFAR10.base_folder).iterdir():
            os.replace(file, folder / file.name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def load_datasets(dataset="cifar10", data_dir="data", train_samples=None, test_samples=None,
                  dtype="float32", fallback=True):
    """Train and test sets as TensorImages. CIFAR-10 falls back to synthetic, announced;
    with fallback=False (--no-synthetic-fallback) the run stops instead, in one line.

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
            source = "synthetic (fallback)" if fallback else "none"
            if fallback:
                train, test = synthetic_cifar(train_samples or 50_000, test_samples or 10_000)
    else:
        train, test = synthetic_cifar(train_samples or 50_000, test_samples or 10_000)
        source = "synthetic"
    # Said before the ranks compare: a node that fell back says why, also when the others did
    # not and the comparison stops the run. Once per node (by every worker under torchrun
    # --virtual-local-rank, where all are 0).
    if reason is not None and fallback and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        say(f"CIFAR-10 could not be loaded from {data_dir!r} ({reason}); "
            "using the synthetic CIFAR-shaped data set instead")
    agree_on_data_source(source, data_dir)
    if reason is not None and not fallback:
        raise RunStopped(f"CIFAR-10 could not be loaded from {data_dir!r} ({reason}); "
                         "--no-synthetic-fallback: not training on the synthetic set")
    (x_train, y_train), (x_test, y_test) = train, test
    if train_samples:
        x_train, y_train = x_train[:train_samples], y_train[:train_samples]
    if test_samples:
        x_test, y_test = x_test[:test_samples], y_test[:test_samples]
    dtype = getattr(torch, dtype)
    return (TensorImages(x_train.to(dtype), y_train, source),
            TensorImages(x_test.to(dtype), y_test, source))


def _cifar10_downloaded_once(data_dir):
    """Rank 0 downloads first, alone, while the others wait. If it could, every other rank
    whose disk lacks the files (a node without a shared file system) downloads them, one
    process at a time per disk (a lock file in data_dir), and the others on that disk find
    them whole and fetch nothing. The lock, not LOCAL_RANK, decides: under torchrun
    --virtual-local-rank every worker's LOCAL_RANK is 0.

    If rank 0's download failed, no other rank tries: the job's network is the same, and each
    rank would wait its own DOWNLOAD_TIMEOUT_S in turn. Each reads what its own disk holds, or
    raises with what is wrong there and rank 0's reason, which says how to place the archive.
    Every rank meets the others at the one broadcast whatever happens in its turn: a rank that
    left early would meet the others in another collective, and the run would hang there."""
    if not dist.is_initialized():
        return cifar10_tensors(data_dir, download=True)
    loaded, failed = None, None
    if dist.get_rank() == 0:
        loaded, failed = _tried(cifar10_tensors, data_dir, True)
    # The other ranks wait here, in a collective, under the group's timeout: see DOWNLOAD_TIMEOUT_S.
    rank_0_failed = [getattr(failed, "download", None) if failed else None]
    dist.broadcast_object_list(rank_0_failed, src=0)
    if dist.get_rank() != 0:
        loaded, failed = _tried(cifar10_tensors, data_dir, rank_0_failed[0] is None)
        if isinstance(failed, Cifar10Missing) and failed.download is None:
            failed = Cifar10Missing(data_dir, failed.wrong, rank_0_failed[0])
    if failed is not None:
        raise failed
    return loaded


def _tried(function, *args):
    """(function(*args), None), or (None, the exception it raised)."""
    try:
        return function(*args), None
    except Exception as error:
        return None, error


@contextlib.contextmanager
def _one_process_at_a_time(lock_path):
    """An exclusive lock on a file (POSIX flock). Where none can be had (Windows, a file
    system without flock), no lock, said in one line: the processes of a disk then download
    at the same time, each to a file of its own, and the download verifies what it finds."""
    lock = None
    try:
        import fcntl
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        # Open for writing: NFS emulates flock with fcntl's byte-range locks, and an exclusive
        # one needs a file open for writing (flock(2), "NFS details"). A lock file that may
        # only be read (a read-only folder) serves on a local disk.
        try:
            lock = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as error:
            if error.errno not in (errno.EACCES, errno.EROFS):
                raise
            lock = os.open(lock_path, os.O_RDONLY)
        fcntl.flock(lock, fcntl.LOCK_EX)
    except (ImportError, OSError) as error:  # ImportError: Windows, no fcntl
        reason = "no flock on this system" if isinstance(error, ImportError) else first_line(error)
        say(f"no download lock ({reason}): the processes on this disk that lack the files "
            "download them at the same time")
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
