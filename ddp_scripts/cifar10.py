"""CIFAR-10 on disk: downloaded once per job within a time limit, one process at a time per
disk (a lock file), checked file by file, and in one line how to place it by hand if it
cannot be had.
"""
import contextlib
import errno
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from ddp_scripts.cli import RunStopped, UsageError, first_line, say

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)

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


def download_limits():
    """(the whole download, one read) in seconds: DOWNLOAD_TIMEOUT_S and STALL_S, or half the
    process group's timeout (--timeout-s) if that is shorter: the other ranks wait for rank
    0's download in a collective, which fails after that timeout."""
    from ddp_scripts import ranks
    group = ranks.GROUP.get("timeout_s") if dist.is_initialized() else None
    half = group / 2 if group else DOWNLOAD_TIMEOUT_S
    return min(DOWNLOAD_TIMEOUT_S, half), min(STALL_S, half)


def fetch_archive(data_dir, url=None, limit_s=None, stall_s=None):
    """The CIFAR-10 archive in data_dir, downloaded within limit_s seconds if it is not there
    (by default download_limits()).

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
    limit_s, stall_s = (given if given is not None else default
                        for given, default in zip((limit_s, stall_s), download_limits()))
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
        if part.exists():  # not on a read-only disk, where unlink would fail and hide the cause
            part.unlink()
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
        if unwritable := cannot_write(data_dir):   # a read-only disk, or another user's folder
            raise Cifar10Missing(data_dir, wrong, unwritable)
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


def cannot_write(data_dir):
    """Why no file can be made in data_dir (made first if missing), in one line that says what
    to do; None if one can. Probed with a nameless temporary file: nothing is left behind."""
    import tempfile

    from torchvision.datasets import CIFAR10
    try:
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=data_dir):
            pass
    except OSError as error:
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            return None  # the download meets it too, and says so
        return (f"{data_dir}/ cannot be written ({error.strerror}): CIFAR-10 cannot be "
                f"downloaded or unpacked there; pass another --data-dir, or place the unpacked "
                f"{CIFAR10.base_folder}/ in it")
    return None


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


def downloaded_once(data_dir):
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


def cifar10_or_why(data_dir, fallback):
    """(CIFAR-10's train and test tensors, "cifar10"); if they cannot be had, (None, the
    synthetic fallback's name), said once per node; without fallback, the RunStopped each
    rank raises once the ranks have compared their data sources, and "none"."""
    folder = Path(data_dir)  # os.path's tests: an unreadable or too long path is not there
    there = next((path for path in (folder, *folder.parents) if os.path.exists(path)), folder)
    if os.path.exists(there) and not os.path.isdir(there):  # a mistake, not a reason to fall back
        raise UsageError(f"--data-dir {data_dir} is a file, not a directory" if there == folder
                         else f"--data-dir {data_dir} cannot be made: {there} is a file")
    try:
        return downloaded_once(data_dir), "cifar10"
    except Exception as error:  # offline, or a broken download
        reason = first_line(error)
    if not fallback:
        return RunStopped(f"CIFAR-10 could not be loaded from {data_dir!r} ({reason}); "
                          "--no-synthetic-fallback: not training on the synthetic set"), "none"
    # Said before the ranks compare: a node that fell back says why, also when the others did
    # not. Once per node (by every worker under torchrun --virtual-local-rank, all 0).
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        say(f"CIFAR-10 could not be loaded from {data_dir!r} ({reason}); "
            "using the synthetic CIFAR-shaped data set instead")
    return None, "synthetic (fallback)"


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
