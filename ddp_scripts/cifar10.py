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
    """The CIFAR-10 archive in data_dir, downloaded within limit_s seconds, each read within
    stall_s (by default download_limits()), if it is not there.

    torchvision's download_url has no time limit: the download is written here. It goes to a
    .part file, renamed only once its MD5 is right: a run stopped half-way, a connection closed
    early or a host that sends another page leaves nothing that looks like the archive. Raises
    OSError in one line, saying how to place it."""
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
        if not check_integrity(str(part), ARCHIVE_MD5):   # cut short, or another file
            raise ValueError(f"{part.stat().st_size:,} bytes came, whose MD5 is not {ARCHIVE_MD5}")
        os.replace(part, target)
    except (OSError, ValueError) as error:   # no network, a refused or slow host, a bad URL or file
        raise OSError(f"download of {ARCHIVE} failed ({first_line(error)}): "
                      f"{how_to_place(data_dir)}") from None
    finally:
        if part.exists():  # not on a read-only disk, where unlink would fail and hide the cause
            part.unlink()
    return target


def unpacked_state(data_dir):
    """(whole, what is wrong): whether data_dir holds the files CIFAR10 reads, each with
    torchvision's MD5 (the six batches, and batches.meta, the class names, which torchvision's
    own check leaves out); and, in words, which are missing or fail their MD5 ("" if none is
    there yet)."""
    from torchvision.datasets import CIFAR10
    from torchvision.datasets.utils import check_integrity
    folder = Path(data_dir) / CIFAR10.base_folder
    files = [*CIFAR10.train_list, *CIFAR10.test_list,
             [CIFAR10.meta["filename"], CIFAR10.meta["md5"]]]
    missing = [name for name, _ in files if not (folder / name).is_file()]
    if len(missing) == len(files):
        return False, ""
    damaged = [name for name, md5 in files
               if name not in missing and not check_integrity(str(folder / name), md5)]
    wrong = [f"{', '.join(damaged)} in {folder}/ failed the MD5 check (damaged, or copied in part)"
             ] if damaged else []
    wrong += [f"{folder}/ lacks {', '.join(missing)}"] if missing else []
    return not wrong, "; ".join(wrong)


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
    from torchvision.transforms.functional import normalize
    whole, wrong = unpacked_state(data_dir)
    if not whole:
        if not download:
            raise Cifar10Missing(data_dir, wrong, None)
        if unwritable := cannot_write(data_dir):   # a read-only disk, or another user's folder
            raise Cifar10Missing(data_dir, wrong, unwritable)
        # Taken only when there is something to download: a run that finds the files says nothing.
        with _one_process_at_a_time(Path(data_dir) / ".download.lock"):
            if not unpacked_state(data_dir)[0]:   # else filled by another process meanwhile
                try:
                    _unpack(fetch_archive(data_dir), data_dir)   # within a time limit
                except OSError as error:
                    raise Cifar10Missing(data_dir, wrong, first_line(error)) from None
    splits = []
    for train in (True, False):
        ds = torchvision.datasets.CIFAR10(root=data_dir, train=train, download=False)
        images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).float().div_(255)
        splits.append((normalize(images, CIFAR_MEAN, CIFAR_STD), torch.tensor(ds.targets)))
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
    loaded, failed, rank_0 = None, None, dist.get_rank() == 0
    try:
        if rank_0:
            loaded = cifar10_tensors(data_dir, True)
    except Exception as error:  # raised below, after the broadcast
        failed = error
    # The other ranks wait here, in a collective, under the group's timeout: see DOWNLOAD_TIMEOUT_S.
    why_not = [getattr(failed, "download", None)]   # rank 0's reason not to download
    dist.broadcast_object_list(why_not, src=0)
    if not rank_0:
        try:
            loaded = cifar10_tensors(data_dir, why_not[0] is None)
        except Cifar10Missing as missing:  # with rank 0's reason if it did not download itself
            failed = (missing if missing.download is not None
                      else Cifar10Missing(data_dir, missing.wrong, why_not[0]))
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


def _one_process_at_a_time(lock_path):
    """An exclusive lock on a file, held until the `with` block ends: filelock's FileLock (flock,
    or LockFileEx on Windows), on a file every user of a shared folder may lock (0o666). Where
    none can be had (a file system without flock, a lock file this user may not write), no
    lock, said in one line: the processes of a disk then download at the same time, each to a
    file of its own, and check what they fetched. Not filelock's fallback, a marker file: one
    left by a process killed on another node would hold every later run."""
    from filelock import FileLock
    try:  # the lock is released as the `with` block ends
        return FileLock(lock_path, mode=0o666, fallback_to_soft=False).acquire()
    except OSError as error:
        say(f"no download lock ({first_line(error)}): the processes on this disk that lack the "
            "files download them at the same time")
        return contextlib.nullcontext()
