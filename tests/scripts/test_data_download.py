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
def slow_host(monkeypatch):
    direct(monkeypatch)
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

def listed_by_cifar10(monkeypatch, files):
    """torchvision's CIFAR10 made to list `files` ({name: bytes}) with their MD5s, as it lists
    its own: test_batch as its test split, batches.meta as its class names, the rest as its
    training split."""
    import hashlib
    from torchvision.datasets import CIFAR10
    md5 = {name: hashlib.md5(content).hexdigest() for name, content in files.items()}
    monkeypatch.setattr(CIFAR10, "train_list", [[name, md5[name]] for name in files
                                                if name not in ("test_batch", "batches.meta")])
    monkeypatch.setattr(CIFAR10, "test_list", [["test_batch", md5["test_batch"]]])
    monkeypatch.setattr(CIFAR10, "meta", {**CIFAR10.meta, "md5": md5["batches.meta"]})


def fake_unpacked(monkeypatch, data_dir, names=("data_batch_1", "test_batch", "batches.meta")):
    """CIFAR-10's unpacked folder with small stand-in files, each of which passes the MD5
    check: CIFAR10 is made to list these files with their own MD5s."""
    from torchvision.datasets import CIFAR10
    folder = data_dir / CIFAR10.base_folder
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_bytes(name.encode())
    listed_by_cifar10(monkeypatch, {name: name.encode() for name in names})
    return folder


def offline(monkeypatch, proxy="http://127.0.0.1:9"):
    """Every download goes through a proxy: by default a port where nothing listens."""
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(name, proxy)
    new_opener(monkeypatch)


def new_opener(monkeypatch):
    """urlopen keeps the opener it built first, with the proxies of that moment: the next
    one is built anew, from the environment as it is now."""
    import urllib.request
    monkeypatch.setattr(urllib.request, "_opener", None)


def direct(monkeypatch):
    """Downloads from 127.0.0.1 go to it, not through a proxy the environment may name."""
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.setenv(name, "127.0.0.1")
    new_opener(monkeypatch)


def test_batches_meta_counts_as_part_of_the_unpacked_files(tmp_path, monkeypatch):
    """torchvision's own check leaves batches.meta (the class names) out; CIFAR10 needs it."""
    from torchvision.datasets import CIFAR10
    unpack_mini_cifar(monkeypatch, tmp_path)
    assert cifar10.unpacked_state(tmp_path) == (True, "")
    (tmp_path / CIFAR10.base_folder / "batches.meta").unlink()
    assert cifar10.unpacked_state(tmp_path) == (False, f"{tmp_path / CIFAR10.base_folder}/ lacks "
                                                       "batches.meta")


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

    class Read(torchvision.datasets.CIFAR10):  # what it gives: uint8 images (N, 32, 32, 3), labels
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
    """NFS emulates flock with fcntl's byte-range locks, and an exclusive one needs a file
    open for writing (flock(2), "NFS details")."""
    import fcntl
    modes = []
    real_flock = fcntl.flock

    def flock(fd, operation):
        modes.append(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE)
        return real_flock(fd, operation)
    monkeypatch.setattr(fcntl, "flock", flock)
    with cifar10._one_process_at_a_time(tmp_path / ".download.lock"):
        pass
    assert modes and set(modes) == {os.O_RDWR}, modes


def test_a_lock_file_that_may_only_be_read_means_no_lock_said_in_one_line(tmp_path, monkeypatch,
                                                                          capsys):
    """Another user's lock file in a shared folder, which this user may read but not write:
    no lock (NFS could not lock it either), said in one line; the download goes on."""
    import errno
    lock = tmp_path / ".download.lock"
    lock.touch()
    real_open = os.open

    def read_only_file(path, flags, *mode):
        if os.fspath(path) == str(lock) and flags & os.O_ACCMODE != os.O_RDONLY:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *mode)
    monkeypatch.setattr(os, "open", read_only_file)
    ran = []
    with cifar10._one_process_at_a_time(lock):
        ran.append(True)
    assert ran == [True]
    said = capsys.readouterr().out.splitlines()
    assert len(said) == 1 and said[0].startswith("[rank 0] no download lock ("), said
    assert "Permission denied" in said[0]


def test_a_file_system_without_flock_means_no_lock_said_in_one_line_and_no_marker(
        tmp_path, monkeypatch, capsys, recwarn):
    """flock refused (ENOSYS, as on some network file systems): no lock, said in one line. Not
    filelock's fallback, a marker file, which a process killed on another node would leave
    behind to hold every later run."""
    import errno
    import fcntl

    def no_flock(fd, operation):
        raise OSError(errno.ENOSYS, "Function not implemented")
    monkeypatch.setattr(fcntl, "flock", no_flock)
    ran = []
    with cifar10._one_process_at_a_time(tmp_path / ".download.lock"):
        ran.append(True)
    assert ran == [True]
    said = capsys.readouterr().out.splitlines()
    assert len(said) == 1 and said[0].startswith("[rank 0] no download lock ("), said
    assert not recwarn.list, [str(warning.message) for warning in recwarn.list]
    assert [path.name for path in tmp_path.iterdir() if path.name != ".download.lock"] == []


def test_the_lock_file_may_be_locked_by_every_user_of_a_shared_folder(tmp_path):
    """Made writable by all (0o666, whatever the umask): the next user of a group's data
    folder locks it too, where a file of mode 0o644 would leave them without a lock."""
    lock = tmp_path / ".download.lock"
    with cifar10._one_process_at_a_time(lock):
        pass
    assert lock.stat().st_mode & 0o777 == 0o666


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
    listed_by_cifar10(monkeypatch, {name: name.encode() for name in names})

    class Read(torchvision.datasets.CIFAR10):  # its lists of files, and these images
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


# --- a data folder that cannot be written, and Ctrl-C during the download -----------------

def mini_cifar(monkeypatch, per_batch=16):
    """A small CIFAR-10 in torchvision's own format (its six pickled batches of `per_batch`
    images, and batches.meta), as {name: bytes}, and its archive's bytes. CIFAR10's lists of
    files, and ARCHIVE_MD5, are made to carry their MD5s: torchvision reads it as the real one."""
    import hashlib
    import io
    import pickle
    import tarfile

    import numpy as np
    from torchvision.datasets import CIFAR10
    rng = np.random.default_rng(0)
    files = {name: pickle.dumps({"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                                 "labels": rng.integers(0, 10, per_batch).tolist()})
             for name, _ in CIFAR10.train_list + CIFAR10.test_list}
    files["batches.meta"] = pickle.dumps({"label_names": [f"class {n}" for n in range(10)]})
    listed_by_cifar10(monkeypatch, files)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(f"{CIFAR10.base_folder}/{name}")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    monkeypatch.setattr(cifar10, "ARCHIVE_MD5", hashlib.md5(archive.getvalue()).hexdigest())
    return files, archive.getvalue()


def unpack_mini_cifar(monkeypatch, data_dir):
    from torchvision.datasets import CIFAR10
    files, _ = mini_cifar(monkeypatch)
    (data_dir / CIFAR10.base_folder).mkdir(parents=True)
    for name, content in files.items():
        (data_dir / CIFAR10.base_folder / name).write_bytes(content)


def make_read_only(folder, how, monkeypatch):
    """`folder` made read-only: by its mode ("mode 555"; root writes there all the same), or
    as a read-only disk is, by os.open and os.mkdir failing there with EROFS ("read-only
    disk"), as root sees it too."""
    import errno
    if how == "mode 555":
        if os.geteuid() == 0:
            pytest.skip("root writes into a folder of mode 555")
        folder.chmod(0o555)
        return
    real_open, real_mkdir = os.open, os.mkdir

    def inside(path):
        path = os.path.abspath(os.fsdecode(path))
        return os.path.commonpath([path, str(folder)]) == str(folder)

    def read_only_disk(path):
        raise OSError(errno.EROFS, "Read-only file system", os.fsdecode(path))

    def open_there(path, flags, *args, **kwargs):
        if inside(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            read_only_disk(path)
        return real_open(path, flags, *args, **kwargs)

    def mkdir_there(path, *args, **kwargs):
        if inside(path) and not os.path.isdir(path):
            read_only_disk(path)
        return real_mkdir(path, *args, **kwargs)
    monkeypatch.setattr(os, "open", open_there)
    monkeypatch.setattr(os, "mkdir", mkdir_there)


@pytest.fixture
def restore_mode(tmp_path):
    yield
    if (tmp_path / "data").exists():
        (tmp_path / "data").chmod(0o755)  # for pytest's clean-up


READ_ONLY = pytest.mark.parametrize("how, cause", [("read-only disk", "Read-only file system"),
                                                   ("mode 555", "Permission denied")])
CIFAR_RUN = ["--dataset", "cifar10", "--no-synthetic-fallback", "--epochs", "1", "--train-samples",
             "64", "--test-samples", "16", "--device", "cpu"]


@READ_ONLY
@pytest.mark.parametrize("below", [False, True], ids=["the folder", "a folder to make in it"])
def test_a_data_dir_that_cannot_be_written_is_named_as_the_cause(
        tmp_path, monkeypatch, restore_mode, how, cause, below):
    """train_single.py --dataset cifar10 --no-synthetic-fallback --data-dir READ_ONLY[/below]:
    one line that says the folder cannot be written and what to do, and no notice about a
    download lock before it; nothing is written there."""
    from helpers import run_in_process
    data = tmp_path / "data"
    data.mkdir()
    data_dir = data / "below" if below else data
    make_read_only(data, how, monkeypatch)
    offline(monkeypatch)
    result = run_in_process("train_single.py", *CIFAR_RUN, "--data-dir", data_dir,
                            "--out", tmp_path / "run")
    assert result.returncode == 1, (result.stdout, result.stderr)
    [line] = result.stderr.splitlines()
    assert line == (f"error: CIFAR-10 could not be loaded from {str(data_dir)!r} ({data_dir}/ "
                    f"cannot be written ({cause}): CIFAR-10 cannot be downloaded or unpacked "
                    "there; pass another --data-dir, or place the unpacked cifar-10-batches-py/ "
                    "in it); --no-synthetic-fallback: not training on the synthetic set"), line
    assert "lock" not in result.stdout, result.stdout
    assert list(data.iterdir()) == []


@READ_ONLY
def test_whole_files_in_a_data_dir_that_cannot_be_written_are_read_without_a_word(
        tmp_path, monkeypatch, restore_mode, how, cause):
    from helpers import run_in_process
    data_dir = tmp_path / "data"
    unpack_mini_cifar(monkeypatch, data_dir)
    before = sorted(data_dir.rglob("*"))
    make_read_only(data_dir, how, monkeypatch)
    offline(monkeypatch)  # a download would fail
    result = run_in_process("train_single.py", *CIFAR_RUN, "--data-dir", data_dir,
                            "--out", tmp_path / "run")
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert result.stdout.splitlines()[0] == "[rank 0] training on cpu", result.stdout
    assert "lock" not in result.stdout and "could not" not in result.stdout
    assert sorted(data_dir.rglob("*")) == before


def test_a_download_into_a_folder_that_cannot_be_written_names_that_not_the_clean_up(
        slow_host, tmp_path, monkeypatch):
    """fetch_archive on its own: the .part file cannot be made (EROFS), and the clean-up,
    which would fail there too, does not hide that."""
    import errno

    def read_only_disk(path, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(path))
    monkeypatch.setattr(cifar10, "open", read_only_disk, raising=False)
    monkeypatch.setattr(os, "unlink", read_only_disk)
    with pytest.raises(OSError) as raised:
        cifar10.fetch_archive(tmp_path, url=slow_host, limit_s=60)
    assert str(raised.value).startswith(f"download of {cifar10.ARCHIVE} failed ([Errno 30] "
                                        "Read-only file system: "), raised.value


class Host(http.server.BaseHTTPRequestHandler):
    """The archive's host: sends `archive` whole (announced as `length` bytes, if that is
    set), or while it is None, one byte at a time until `stop` is set. `asked` is set at each
    request."""
    archive, length, asked, stop = None, None, threading.Event(), threading.Event()

    def do_GET(self):
        self.asked.set()
        self.send_response(200)
        self.send_header("Content-Length",
                         str(self.length or len(self.archive or b"") or cifar10.ARCHIVE_BYTES))
        self.end_headers()
        try:
            if self.archive is not None:
                self.wfile.write(self.archive)
            while self.archive is None and not self.stop.wait(0.05):
                self.wfile.write(b"x")
                self.wfile.flush()
        except OSError:  # the downloader has gone
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def host():
    """A Host of this test's own, on 127.0.0.1: (its handler class, the archive's URL)."""
    handler = type("Host", (Host,), {"archive": None, "asked": threading.Event(),
                                     "stop": threading.Event()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}/{cifar10.ARCHIVE}"
    handler.stop.set()
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("sent, length", [(b"<html>Sign in to this network</html>", None),
                                          (b"\x1f\x8b cut short", cifar10.ARCHIVE_BYTES)],
                         ids=["another page", "a connection closed half-way"])
def test_a_download_that_is_not_the_archive_leaves_nothing_and_says_how_to_place_it(
        tmp_path, host, monkeypatch, sent, length):
    """A host that answers with something else (a network's sign-in page), or closes the
    connection before the end: its MD5 is wrong, so nothing is renamed into the archive's
    place, where every later run would take it for the archive."""
    handler, url = host
    handler.archive, handler.length = sent, length
    direct(monkeypatch)
    with pytest.raises(OSError) as raised:
        cifar10.fetch_archive(tmp_path, url=url, limit_s=60, stall_s=30)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"download of {cifar10.ARCHIVE} failed ("), message
    assert f"MD5 is not {cifar10.ARCHIVE_MD5}" in message and message.endswith("by hand and run again")
    assert list(tmp_path.iterdir()) == []


# train_single.py as `python ddp_scripts/train_single.py ARGS` runs it, downloading from URL:
# python -c DOWNLOADING_FROM ddp_scripts/train_single.py URL ARGS
DOWNLOADING_FROM = """
import runpy, sys
from ddp_scripts import cifar10
cifar10.fetch_archive.__defaults__ = (sys.argv[2], None, None)
sys.argv[:] = [sys.argv[1], *sys.argv[3:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.timeout(300)
def test_ctrl_c_during_the_download_leaves_no_part_no_lock_and_no_process(tmp_path, host,
                                                                           monkeypatch):
    """Ctrl-C while train_single.py downloads CIFAR-10 (from a slow local host): one line,
    exit status 130; no .part file, nor anything a later run could take for the archive; the
    download lock free; nothing left running. A later run, whose host sends the archive
    whole, downloads, unpacks and trains."""
    import fcntl
    import signal
    import subprocess
    import sys
    import time

    from ddp_scripts.mistakes.faults import processes_mentioning
    from helpers import ROOT, run_in_process
    handler, url = host
    data_dir = tmp_path / "data"
    direct(monkeypatch)
    process = subprocess.Popen(
        [sys.executable, "-c", DOWNLOADING_FROM, "ddp_scripts/train_single.py", url, *CIFAR_RUN,
         "--data-dir", str(data_dir), "--out", str(tmp_path / "run")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # A shell's background job (CI's, say) starts with SIGINT ignored, and a child keeps
        # that: Python then installs no KeyboardInterrupt. A terminal's Ctrl-C finds it default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert handler.asked.wait(240), "no download was asked for"
        while not list(data_dir.glob("*.part")) and process.poll() is None:
            time.sleep(0.05)  # the host has answered: the .part file comes at once
        assert process.poll() is None, process.communicate()
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate()  # no clock of its own: pytest-timeout ends a hang
    finally:
        process.kill()  # no stray process if an assertion or the timeout ends the test
    assert process.returncode == 130, (stdout, stderr)
    assert stderr.splitlines() == ["interrupted (Ctrl-C); the last checkpoint saved, if any, is "
                                   "whole"], stderr
    assert [path.name for path in data_dir.iterdir()] == [".download.lock"]
    with open(data_dir / ".download.lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError if still held
    assert processes_mentioning(str(data_dir)) == []

    handler.archive = mini_cifar(monkeypatch)[1]
    monkeypatch.setattr(cifar10.fetch_archive, "__defaults__", (url, 60, 30))
    result = run_in_process("train_single.py", *CIFAR_RUN, "--data-dir", data_dir,
                            "--out", tmp_path / "run")
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert cifar10.unpacked_state(data_dir) == (True, "")
    assert sorted(path.name for path in data_dir.iterdir()) == \
        sorted([".download.lock", cifar10.ARCHIVE, "cifar-10-batches-py"])
