"""Faults a distributed run must survive, on the CPU with gloo.

A crash in the middle of a save or between a log line and its checkpoint; a second node
that never joins the c10d rendezvous; a launcher that times out, is interrupted, or loses the
kernel that started it; a download lock that cannot be had; a loss that becomes nan.
Chapter 8's own runs show a killed rank restarted to the model an uninterrupted run ends
with, a rank that skips a collective, and a node that never joins the static rendezvous:
tests/site/test_chapter_runs.py tests those runs. Each torchrun start costs seconds on two
cores, so the runs are small and few; every timeout is generous, and every test checks
something that a broken script or launcher would get wrong.
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

from ddp_scripts.options import build_parser
from ddp_scripts.models import build_model
from ddp_scripts.out_dir import append_metrics, prepare_out_dir, save_checkpoint, start_out_dir
from ddp_scripts.resume import load_checkpoint
from ddp_scripts.launcher import (LaunchError, LaunchTimeout, free_port, run_command,
                                  run_script, torchrun_command)
from ddp_scripts.mistakes.faults import processes_mentioning
from ddp_scripts.runfiles import CHECKPOINT, logged_epochs, metrics_rows

ROOT = Path(__file__).resolve().parents[2]
# A run longer than a stop takes to arrive: it is stopped in its first epochs.
RUN = dict(dataset="synthetic", epochs=3, batch_size=32, train_samples=2048, test_samples=256,
           device="cpu")
COLLECTIVE_DEMO = "mistakes/rank_dependent_collective.py"


class ProcessWatcher:
    """Notes every process this test process starts, children's children included."""

    def __init__(self):
        self.seen, self._stop = {}, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self):
        # Processes started before (a browser another test of this worker keeps open for the
        # session, say), and what they start meanwhile, are not this test's.
        self.before = {p.pid for p in psutil.Process().children(recursive=True)}
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _watch(self):
        me = psutil.Process()
        while not self._stop.is_set():
            for proc in me.children(recursive=True):
                try:  # the latest command line: a child just forked still shows its parent's
                    command = " ".join(proc.cmdline())
                    theirs = {proc.pid, *(parent.pid for parent in proc.parents())} & self.before
                    if command and not theirs:
                        self.seen[(proc.pid, proc.create_time())] = command
                except psutil.Error:
                    pass
            time.sleep(0.05)

    def workers(self, marker):
        """Command lines of the processes seen that ran `marker`, torchrun itself excluded."""
        return [cmd for cmd in self.seen.values()
                if marker in cmd and "torch.distributed.run" not in cmd]

    def survivors(self, grace_s=30):
        """The processes seen that are still running `grace_s` seconds from now, at the latest."""
        deadline = time.monotonic() + grace_s
        while True:
            alive = [cmd for (pid, created), cmd in self.seen.items() if _alive(pid, created)]
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.2)


def _alive(pid, created):
    try:
        proc = psutil.Process(pid)
        return proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def epochs_in_metrics(out):
    """The epoch of every line of OUT/metrics.jsonl; a line that is not whole JSON fails."""
    return [row["epoch"] for row in metrics_rows(out, strict=True)]


def test_crash_during_a_save_leaves_the_last_checkpoint_whole(tmp_path):
    """The process dies half-way through writing the checkpoint of epoch 2."""
    args = build_parser("test").parse_args(["--out", str(tmp_path), "--dataset", "synthetic"])
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    append_metrics(tmp_path, {"epoch": 1})
    save_checkpoint(tmp_path, model, optimizer, 1, args)
    before = (tmp_path / CHECKPOINT).read_bytes()
    crash = f"""
import io, os, signal, sys, torch
from ddp_scripts import models, options, out_dir
real_save = torch.save

def save_half_then_die(obj, f):
    buffer = io.BytesIO()
    real_save(obj, buffer)
    f.write(buffer.getvalue()[:buffer.tell() // 2])
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)

torch.save = save_half_then_die
args = options.build_parser("crash").parse_args(["--out", {str(tmp_path)!r}, "--dataset", "synthetic"])
model = models.build_model(seed=1)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
out_dir.save_checkpoint({str(tmp_path)!r}, model, optimizer, 2, args)
"""
    result = subprocess.run([sys.executable, "-c", crash], cwd=ROOT, capture_output=True, timeout=300)
    assert result.returncode == -signal.SIGKILL, result.stderr.decode()[-2000:]
    leftovers = list(tmp_path.glob(".checkpoint.pt.tmp*"))
    assert len(leftovers) == 1 and leftovers[0].stat().st_size > 0  # it did die mid-write
    assert (tmp_path / CHECKPOINT).read_bytes() == before
    assert load_checkpoint(tmp_path / CHECKPOINT)["epoch"] == 1
    # The next start with --resume continues from epoch 1 and removes the unfinished file.
    args.resume = True
    start_out_dir(args, prepare_out_dir(args))
    assert not list(tmp_path.glob(".*.tmp*"))


def test_crash_between_log_and_checkpoint_logs_each_epoch_once(tmp_path):
    """Epoch 3 was logged but its checkpoint never written; epoch 4's line was cut short."""
    args = build_parser("test").parse_args(["--out", str(tmp_path), "--dataset", "synthetic",
                                            "--resume", "--epochs", "4"])
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    for epoch in (1, 2, 3):
        append_metrics(tmp_path, {"epoch": epoch, "test_accuracy": 0.1 * epoch})
        if epoch < 3:
            save_checkpoint(tmp_path, model, optimizer, epoch, args)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 4, "test_acc')
    start_out_dir(args, prepare_out_dir(args))  # what a restarted rank 0 does first
    assert epochs_in_metrics(tmp_path) == [1, 2]
    for epoch in (3, 4):  # training goes on from epoch 3
        append_metrics(tmp_path, {"epoch": epoch, "test_accuracy": 0.1 * epoch})
    assert epochs_in_metrics(tmp_path) == [1, 2, 3, 4]


def test_launcher_timeout_ends_a_hung_run():
    """A collective that would wait 600 s: the launcher's own timeout ends it first."""
    with ProcessWatcher() as watcher, pytest.raises(LaunchTimeout):
        run_command(torchrun_command(COLLECTIVE_DEMO, 2, ["--timeout-s", "600"]), timeout=20,
                    echo=lambda line: None)
    assert len(watcher.workers(COLLECTIVE_DEMO)) >= 2  # the workers had started (and any child they forked)
    assert watcher.survivors() == []


@pytest.mark.parametrize("stop", ["interrupt", "kernel dies"])
def test_a_stopped_notebook_leaves_no_process_behind(tmp_path, stop):
    """'Interrupt the kernel' (or Ctrl-C) raises KeyboardInterrupt, and the launcher ends its
    run. A kernel that dies outright (killed, out of memory) cleans nothing up: Linux then
    sends torchrun SIGTERM (the launcher asked for it), and torchrun ends its workers."""
    out = tmp_path / "run"
    # The driver stands for the notebook's kernel: Ctrl-C raises KeyboardInterrupt there
    # (restored, in case the test runner's process ignores SIGINT and the child inherited
    # that), and the run has more epochs than it can finish before it is stopped.
    driver = f"""
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from ddp_scripts.launcher import run_script
run_script("train_ddp.py", nproc=2, out={str(out)!r}, timeout=600, progress=False,
           **{dict(RUN, epochs=100_000)!r})
"""
    log = tmp_path / "notebook.log"
    with open(log, "w") as sink:
        # TMPDIR: a kernel killed outright cannot remove the launcher's temporary log folder
        process = subprocess.Popen([sys.executable, "-c", driver], cwd=ROOT, stdout=sink,
                                   stderr=subprocess.STDOUT,
                                   env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        deadline = time.monotonic() + 300
        while not logged_epochs(out) and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.1)
        assert logged_epochs(out), "the run never logged an epoch:\n" + log.read_text()[-3000:]
        running = {proc.pid for proc in processes_mentioning(str(out))} - {process.pid}
        assert len(running) >= 3, running  # torchrun and its two workers
        stopped = time.monotonic()
        process.send_signal(signal.SIGINT if stop == "interrupt" else signal.SIGKILL)
        process.wait(timeout=120)
        while processes_mentioning(str(out)) and time.monotonic() < stopped + 60:
            time.sleep(0.2)
    finally:
        process.kill()
    left = [proc.pid for proc in processes_mentioning(str(out))]
    print(f"{stop}: the run's last process ended {time.monotonic() - stopped:.1f} s later")
    assert left == [], f"processes left behind: {left}"
    if stop == "interrupt":
        assert "KeyboardInterrupt" in log.read_text()


# Chapter 8 counts the processes of a run that are still running (1c70c4a9,
# ch08-stops-sigterm) with processes_mentioning: fed a process left running, and one that ended.

def a_process_naming(folder):
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", str(folder)])


def test_planted_a_process_left_running_is_counted(tmp_path):
    left = a_process_naming(tmp_path / "run")
    try:
        assert [proc.pid for proc in processes_mentioning(str(tmp_path / "run"))] == [left.pid]
    finally:
        left.kill()
        left.wait()


def test_right_case_a_process_that_ended_is_not_counted(tmp_path):
    ended = a_process_naming(tmp_path / "run")
    ended.kill()
    deadline = time.monotonic() + 30   # ended, not yet waited for: a zombie
    while psutil.Process(ended.pid).status() != psutil.STATUS_ZOMBIE and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        # the kernel has emptied a zombie's command line: nothing there names the folder
        assert Path(f"/proc/{ended.pid}/cmdline").read_bytes() == b""
        assert processes_mentioning(str(tmp_path / "run")) == []
    finally:
        ended.wait()
    assert processes_mentioning(str(tmp_path / "run")) == []


def test_node_that_never_joins_fails_with_a_rendezvous_timeout(tmp_path):
    """--nnodes 2 with the c10d rendezvous, but only node 0 is started: it waits 5 s for node 1,
    then gives up. (The static rendezvous's timeout: chapter 8's run, tests/site.)"""
    torchrun_args = ["--nnodes", "2", "--rdzv-backend", "c10d",
                     "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-conf", "join_timeout=5"]
    start = time.monotonic()
    with ProcessWatcher() as watcher, pytest.raises(LaunchError) as caught:
        run_script("train_ddp.py", nproc=1, out=tmp_path / "node0", timeout=300,
                   progress=False, echo=lambda line: None, torchrun_args=torchrun_args, **RUN)
    print(f"c10d: failed after {time.monotonic() - start:.1f} s: {caught.value}")
    assert "RendezvousTimeoutError" in str(caught.value)
    assert not isinstance(caught.value, LaunchTimeout)  # torchrun gave up, not the launcher
    assert watcher.workers("train_ddp.py") == []  # no worker was ever started
    assert watcher.survivors() == []


@pytest.mark.timeout(300)
def test_a_download_lock_that_cannot_be_had_does_not_split_the_ranks(tmp_path, monkeypatch):
    """The data folder's lock file cannot be opened (here a directory stands where it would
    be; on a cluster, a file system without flock): rank 0 says so in one line and downloads
    without it, every rank reaches the same collectives, and the
    run ends by itself, on the announced fallback (no internet here). A rank that left the
    barriers early would hang the run until --timeout-s, then fail with gloo's tracebacks."""
    for name in ("no_proxy", "NO_PROXY"):  # the download must go through the dead proxy
        monkeypatch.delenv(name, raising=False)
    for name in ("http_proxy", "https_proxy"):  # a port where nothing listens: no internet
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    data = tmp_path / "data"
    (data / ".download.lock").mkdir(parents=True)
    lines = []
    run_script("train_ddp.py", nproc=2, out=tmp_path / "run", timeout=240, progress=False,
               echo=lines.append, **dict(RUN, dataset="cifar10", data_dir=data, epochs=1,
                                         train_samples=256, test_samples=64, timeout_s=90))
    said = [line for line in lines if line.startswith("[rank 0] no download lock (")]
    assert len(said) == 1 and "Is a directory" in said[0], "\n".join(lines)
    # rank 0's download failed, so rank 1 does not try: it needs no lock, and says nothing of one
    assert not any(line.startswith("[rank 1] no download lock") for line in lines), "\n".join(lines)
    assert any("using the synthetic CIFAR-shaped data set instead" in line for line in lines)
    assert [line for line in lines if "training on" in line] == \
        ["[rank 0] training on cpu, one of 2 processes"]  # said once, by rank 0
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    assert metrics_rows(tmp_path / "run")[0]["dataset"] == "synthetic (fallback)"


def a_checkpoint_that_diverges(out, *options):
    """A checkpoint of epoch 1 whose learning rate, 1e30, sends the loss to nan within steps,
    saved by a run with these options (a resumed run must ask for the same)."""
    args = build_parser("test").parse_args(["--out", str(out), "--lr", "1e30", *options])
    out.mkdir()
    model = build_model()
    save_checkpoint(out, model, torch.optim.SGD(model.parameters(), lr=args.lr,
                                                momentum=args.momentum), 1, args)
    append_metrics(out, {"epoch": 1, "test_accuracy": 0.1})
    return (out / CHECKPOINT).read_bytes()


def test_a_loss_that_becomes_nan_stops_the_run_and_keeps_the_last_checkpoint(tmp_path):
    from helpers import run_in_process
    small = ["--dataset", "synthetic", "--train-samples", "512", "--test-samples", "128",
             "--device", "cpu"]
    result = run_in_process("train_single.py", *small, "--lr", "1e30", "--out", tmp_path / "fresh")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.splitlines() == [result.stderr.strip()], result.stderr  # one line
    assert re.fullmatch(r"error: the loss became nan or inf at epoch 1, step \d+: lower --lr "
                        r"\(nothing of epoch 1 was saved.*\)", result.stderr.strip()), result.stderr
    assert not (tmp_path / "fresh" / CHECKPOINT).exists() and logged_epochs(tmp_path / "fresh") == []

    before = a_checkpoint_that_diverges(tmp_path / "resumed", *small)
    result = run_in_process("train_single.py", *small, "--epochs", "3", "--resume", "--lr", "1e30",
                            "--out", tmp_path / "resumed")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert re.fullmatch(r"error: the loss became nan or inf at epoch 2, step \d+: .*",
                        result.stderr.strip()), result.stderr
    assert (tmp_path / "resumed" / CHECKPOINT).read_bytes() == before
    assert logged_epochs(tmp_path / "resumed") == [1]


@pytest.mark.timeout(300)
def test_a_loss_that_becomes_nan_stops_every_rank_at_the_same_step(tmp_path):
    """Two ranks, each its own batches: they agree on the first step whose loss was not
    finite, and stop together, with the same line; epoch 1's checkpoint stays."""
    before = a_checkpoint_that_diverges(tmp_path / "run", "--dataset", "synthetic",
                                        "--train-samples", str(RUN["train_samples"]),
                                        "--batch-size", str(2 * RUN["batch_size"]))
    lines = []
    with pytest.raises(LaunchError) as caught:
        run_script("train_ddp.py", nproc=2, out=tmp_path / "run", timeout=240, progress=False,
                   echo=lines.append, resume=True, **dict(RUN, timeout_s=60, lr=1e30))
    said = [line for line in lines if "error: the loss became" in line]
    # torchrun ends the other rank as soon as one fails: its line may never be printed.
    assert said, "\n".join(lines)
    assert len({line.split("] ", 1)[1] for line in said}) == 1, said  # the same step on each
    assert re.fullmatch(r"\[rank [01]\] error: the loss became nan or inf at epoch 2, "
                        r"step \d+: lower --lr .*", said[0]), said[0]
    assert not any('File "' in line and "ddp_scripts" in line for line in lines), "\n".join(lines)
    assert caught.value.exit_code == 1 and "the loss became nan or inf at epoch 2" in str(caught.value)
    assert (tmp_path / "run" / CHECKPOINT).read_bytes() == before
    assert logged_epochs(tmp_path / "run") == [1]
