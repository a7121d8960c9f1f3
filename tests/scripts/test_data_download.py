"""CIFAR-10's download: a time limit, and one line that says how to place the archive by hand
(ddp_scripts/cifar10.py). A local server plays the host; nothing goes to the internet."""
import http.server
import os
import threading

import pytest

from ddp_scripts import cifar10, data


class Trickle(http.server.BaseHTTPRequestHandler):
    """A host that answers, then sends the archive one byte at a time, until told to stop."""
    stop = threading.Event()

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(cifar10.ARCHIVE_BYTES))
        self.end_headers()
        while not self.stop.wait(0.05):
            try:
                self.wfile.write(b"x")
                self.wfile.flush()
            except OSError:
                return

    def log_message(self, *args):
        pass


@pytest.fixture
def slow_host():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    Trickle.stop.clear()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/{cifar10.ARCHIVE}"
    Trickle.stop.set()
    server.shutdown()
    server.server_close()


def test_a_slow_host_gives_up_in_the_time_limit_and_says_how_to_place_the_file(slow_host, tmp_path):
    with pytest.raises(OSError) as raised:
        cifar10.fetch_archive(tmp_path, url=slow_host, limit_s=0.5)
    message = str(raised.value)
    assert "\n" not in message and "not done after 0.5 s" in message
    assert f"put {cifar10.ARCHIVE} (170,498,071 bytes, MD5 {cifar10.ARCHIVE_MD5}) into {tmp_path}/" in message
    assert list(tmp_path.iterdir()) == [], "a half download is left behind"


def test_a_refused_connection_says_how_to_place_the_file(tmp_path):
    with pytest.raises(OSError, match="by hand and run again$"):
        cifar10.fetch_archive(tmp_path, url="http://127.0.0.1:9/none.tar.gz", limit_s=5)


def test_the_md5_is_torchvision_s_and_a_wrong_file_in_place_is_named_not_deleted(tmp_path):
    from torchvision.datasets import CIFAR10
    assert (cifar10.ARCHIVE, cifar10.ARCHIVE_MD5) == (CIFAR10.filename, CIFAR10.tgz_md5)
    placed = tmp_path / cifar10.ARCHIVE
    placed.write_bytes(b"not the archive")
    with pytest.raises(OSError, match="is not the CIFAR-10 archive"):
        cifar10.fetch_archive(tmp_path, url="http://127.0.0.1:9/never-asked", limit_s=5)
    assert placed.read_bytes() == b"not the archive"


def test_the_fallback_line_carries_the_placing_instructions(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cifar10, "DOWNLOAD_TIMEOUT_S", 5)
    monkeypatch.setattr(cifar10.fetch_archive, "__defaults__", ("http://127.0.0.1:9/x", 5, 5))
    train, _ = data.load_datasets("cifar10", str(tmp_path), train_samples=64, test_samples=16)
    assert train.source == "synthetic (fallback)"
    [line] = [line for line in capsys.readouterr().out.splitlines() if "could not be loaded" in line]
    assert f"MD5 {cifar10.ARCHIVE_MD5}" in line and "using the synthetic CIFAR-shaped data set" in line


# --- the unpacked files, the lock, and the runs that cannot get CIFAR-10 -------------------

def fake_unpacked(monkeypatch, data_dir, names=("data_batch_1", "test_batch", "batches.meta")):
    """CIFAR-10's unpacked folder with small stand-in files, each of which passes the MD5
    check: unpacked_files() is made to list these files with their own MD5s."""
    import hashlib
    from torchvision.datasets import CIFAR10
    folder = data_dir / CIFAR10.base_folder
    folder.mkdir(parents=True)
    listed = []
    for name in names:
        (folder / name).write_bytes(name.encode())
        listed.append([name, hashlib.md5(name.encode()).hexdigest()])
    monkeypatch.setattr(cifar10, "unpacked_files", lambda: listed)
    return folder


def offline(monkeypatch, proxy="http://127.0.0.1:9"):
    """Every download goes through a proxy: by default a port where nothing listens."""
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(name, proxy)


def test_batches_meta_counts_as_part_of_the_unpacked_files():
    from torchvision.datasets import CIFAR10
    names = [name for name, _ in cifar10.unpacked_files()]
    assert names == [*(name for name, _ in CIFAR10.train_list + CIFAR10.test_list), "batches.meta"]


def test_a_damaged_or_missing_file_is_named_and_the_rest_are_not(tmp_path, monkeypatch):
    assert cifar10.unpacked_state(tmp_path) == (False, "")  # nothing there yet: nothing to say
    folder = fake_unpacked(monkeypatch, tmp_path)
    assert cifar10.unpacked_state(tmp_path) == (True, "")
    (folder / "data_batch_1").write_bytes(b"data_batch")  # cut short, as a copy stopped half-way
    (folder / "batches.meta").unlink()
    whole, wrong = cifar10.unpacked_state(tmp_path)
    assert not whole
    assert wrong == (f"data_batch_1 in {folder}/ failed the MD5 check (damaged, or copied in "
                     f"part); {folder}/ lacks batches.meta")


def test_damaged_files_are_named_in_the_fallback_line_beside_the_failed_download(
        tmp_path, monkeypatch, capsys):
    folder = fake_unpacked(monkeypatch, tmp_path)
    (folder / "test_batch").write_bytes(b"")
    offline(monkeypatch)
    train, _ = data.load_datasets("cifar10", str(tmp_path), train_samples=64, test_samples=16)
    assert train.source == "synthetic (fallback)"
    [line] = [line for line in capsys.readouterr().out.splitlines() if "could not be loaded" in line]
    assert f"(test_batch in {folder}/ failed the MD5 check (damaged, or copied in part); " \
           f"download of {cifar10.ARCHIVE} failed (" in line
    assert line.endswith("by hand and run again); using the synthetic CIFAR-shaped data set instead")


def test_whole_files_are_read_without_a_lock_or_a_word(tmp_path, monkeypatch, capsys):
    import numpy as np
    import torchvision
    fake_unpacked(monkeypatch, tmp_path)

    class Read:  # what torchvision's CIFAR10 gives: uint8 images (N, 32, 32, 3), int labels
        base_folder = torchvision.datasets.CIFAR10.base_folder

        def __init__(self, root, train, download):
            assert download is False  # the files were checked: nothing to fetch
            self.data, self.targets = np.zeros((4, 32, 32, 3), np.uint8), [0, 1, 2, 3]
    monkeypatch.setattr(torchvision.datasets, "CIFAR10", Read)
    locked = []
    monkeypatch.setattr(cifar10, "_one_process_at_a_time", lambda path: locked.append(path))
    (train, _), _ = cifar10.cifar10_tensors(tmp_path, download=True)
    assert train.shape == (4, 3, 32, 32)
    assert locked == [] and capsys.readouterr().out == ""
    assert not (tmp_path / ".download.lock").exists()


def test_the_lock_file_is_opened_for_writing_as_nfs_needs(tmp_path, monkeypatch):
    import fcntl
    modes = []
    real_flock = fcntl.flock

    def flock(fd, operation):
        modes.append(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE)
        return real_flock(fd, operation)
    monkeypatch.setattr(fcntl, "flock", flock)
    with cifar10._one_process_at_a_time(tmp_path / ".download.lock"):
        pass
    assert modes == [os.O_RDWR]


def test_a_lock_file_that_may_only_be_read_still_serves(tmp_path, monkeypatch, capsys):
    """A read-only folder (EACCES, EROFS) where the lock file already exists: read-only is
    enough for flock on a local disk."""
    import errno
    import fcntl
    lock = tmp_path / ".download.lock"
    lock.touch()
    real_open = os.open

    def read_only_folder(path, flags, *mode):
        if flags & os.O_ACCMODE != os.O_RDONLY:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *mode)
    monkeypatch.setattr(os, "open", read_only_folder)
    with cifar10._one_process_at_a_time(lock):
        with open(lock) as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert capsys.readouterr().out == ""


def test_the_download_limit_leaves_half_the_group_timeout_to_unpack_and_read():
    """Under torchrun the other ranks wait for rank 0's download in a collective, which fails
    after --timeout-s."""
    from ddp_scripts.options import build_parser
    default = build_parser("test").parse_args(["--out", "x"]).timeout_s
    assert cifar10.DOWNLOAD_TIMEOUT_S <= default / 2


def test_no_synthetic_fallback_stops_the_run_in_one_line(tmp_path, monkeypatch):
    from helpers import run_in_process
    offline(monkeypatch)
    result = run_in_process("train_single.py", "--data-dir", tmp_path / "data", "--epochs", "1",
                            "--train-samples", "64", "--test-samples", "16", "--device", "cpu",
                            "--no-synthetic-fallback", "--out", tmp_path / "run")
    assert result.returncode == 1, (result.stdout, result.stderr)
    [line] = result.stderr.splitlines()
    assert line.startswith("error: CIFAR-10 could not be loaded from ") and "by hand" in line, line
    assert line.endswith("--no-synthetic-fallback: not training on the synthetic set"), line
    assert "synthetic CIFAR-shaped" not in result.stdout
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


class RefusingProxy(http.server.BaseHTTPRequestHandler):
    """A proxy that counts the downloads asked of it and refuses each: an offline node."""
    asked = []

    def do_CONNECT(self):
        self.asked.append(self.path)
        self.send_error(403, "offline")

    def log_message(self, *args):
        pass


@pytest.mark.timeout(300)
def test_under_torchrun_every_rank_says_how_to_place_the_archive_after_one_attempt(tmp_path, monkeypatch):
    """train_ddp.py on 2 ranks, offline: rank 0 tries the download once, the other rank does
    not try again, and each rank's line (every worker is local rank 0 under
    --virtual-local-rank) names the archive, its size, its MD5 and the folder."""
    from ddp_scripts.launcher import run_script
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RefusingProxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    RefusingProxy.asked.clear()
    offline(monkeypatch, f"http://127.0.0.1:{server.server_address[1]}")
    lines = []
    try:
        run_script("train_ddp.py", nproc=2, out=tmp_path / "run", timeout=240, progress=False,
                   echo=lines.append, torchrun_args=["--virtual-local-rank"], dataset="cifar10",
                   data_dir=tmp_path / "data", epochs=1, train_samples=128, test_samples=32,
                   device="cpu", timeout_s=90)
    finally:
        server.shutdown()
        server.server_close()
    assert RefusingProxy.asked == ["www.cs.toronto.edu:443"]
    for rank in (0, 1):
        [line] = [line for line in lines if line.startswith(f"[rank {rank}] CIFAR-10 could not")]
        assert f"put {cifar10.ARCHIVE} (170,498,071 bytes, MD5 {cifar10.ARCHIVE_MD5}) into " \
               f"{tmp_path / 'data'}/ by hand and run again" in line, line
    assert not any("download=True" in line or "Traceback" in line for line in lines), "\n".join(lines)


def test_an_archive_put_in_place_by_hand_is_unpacked_and_read(tmp_path, monkeypatch, capsys):
    """The archive's MD5 checked, its files renamed into place from a folder of this process's
    own (nothing of it left behind), then read; no download is asked for."""
    import hashlib
    import io
    import tarfile

    import numpy as np
    import torchvision
    names = ("data_batch_1", "test_batch", "batches.meta")
    archive = tmp_path / cifar10.ARCHIVE
    with tarfile.open(archive, "w:gz") as tar:
        for name in names:
            info = tarfile.TarInfo(f"{torchvision.datasets.CIFAR10.base_folder}/{name}")
            info.size = len(name)
            tar.addfile(info, io.BytesIO(name.encode()))
    monkeypatch.setattr(cifar10, "ARCHIVE_MD5", hashlib.md5(archive.read_bytes()).hexdigest())
    monkeypatch.setattr(cifar10, "unpacked_files",
                        lambda: [[name, hashlib.md5(name.encode()).hexdigest()] for name in names])

    class Read:
        base_folder = torchvision.datasets.CIFAR10.base_folder

        def __init__(self, root, train, download):
            self.data, self.targets = np.zeros((2, 32, 32, 3), np.uint8), [0, 1]
    monkeypatch.setattr(torchvision.datasets, "CIFAR10", Read)
    offline(monkeypatch)  # a download would fail
    (train, _), _ = cifar10.cifar10_tensors(tmp_path, download=True)
    assert train.shape == (2, 3, 32, 32)
    assert cifar10.unpacked_state(tmp_path) == (True, "")
    assert sorted(path.name for path in tmp_path.iterdir()) == \
        sorted([".download.lock", cifar10.ARCHIVE, Read.base_folder])
    assert capsys.readouterr().out == ""
