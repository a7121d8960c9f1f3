"""What the scripts do when things go wrong, case by case: nothing lost, one line.

A run's folder is claimed, not only checked; a resume trains as the saved run did or is
refused; every failure the scripts can foresee is one line and a non-zero exit, before the
work starts where it can be checked then. Most cases run the script inside this process
(helpers.run_in_process); those that need a process of their own (a signal, a file size
limit, torchrun) are few and small.
"""
import errno
import fcntl
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import CheckpointException

from ddp_scripts import fsdp_out_dir, out_dir, runfiles
from ddp_scripts.measure import benchmark
from ddp_scripts.out_dir import prepare_out_dir, start_out_dir, write_atomically
from ddp_scripts.devices import set_cpu_threads
from ddp_scripts.cli import NothingToDo, RunStopped, UsageError, let_go_of_folders
from ddp_scripts.mistakes.faults import processes_mentioning
from ddp_scripts.launcher import LaunchError, failure, free_port, run_command, run_script, torchrun_command
from ddp_scripts.options import build_parser
from ddp_scripts.resume import load_checkpoint
from ddp_scripts.runfiles import CHECKPOINT, METRICS, SHARDED_CHECKPOINT, SUMMARY, logged_epochs, metrics_rows
from helpers import SMALL, assert_one_line_error, run_in_process, run_one_rank

ROOT = Path(__file__).resolve().parents[2]
RUN = [*SMALL, "--device", "cpu"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run of 2 epochs (batch 32, lr 0.01, momentum 0.9), to be copied."""
    out = tmp_path_factory.mktemp("finished") / "run"
    result = run_in_process("train_single.py", *RUN, "--epochs", "2", "--out", out)
    assert result.returncode == 0, result.stderr
    return out


def copy_of(run, tmp_path):
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def files_in(out):
    """Every file in OUT and its bytes: what a refused or empty run must leave as it was
    (besides the empty file that it claimed OUT by)."""
    return {path.name: path.read_bytes() for path in Path(out).iterdir()
            if path.is_file() and path.name != out_dir.LOCK}


# --- The folder ----------------------------------------------------------------------------
def test_an_out_under_a_file_is_one_line_before_any_work(tmp_path):
    (tmp_path / "afile").write_text("keep me")
    result = run_in_process("train_single.py", *RUN, "--out", tmp_path / "afile" / "run")
    assert_one_line_error(result, "--out", "cannot be written: Not a directory")
    assert "training on" not in result.stdout  # refused before data and model
    assert (tmp_path / "afile").read_text() == "keep me"


def test_an_out_that_cannot_be_written_is_one_line_before_any_work(tmp_path, monkeypatch):
    """A read-only disk, as its probe file meets it (root may write anywhere here)."""
    def read_only(path, data):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
    monkeypatch.setattr(Path, "write_bytes", read_only)
    result = run_in_process("train_single.py", *RUN, "--out", tmp_path / "ro" / "run")
    assert_one_line_error(result, "cannot be written: Read-only file system")
    assert "training on" not in result.stdout


def test_unicode_and_spaces_in_paths(tmp_path):
    out = tmp_path / "ä ö 训练" / "run 1"
    result = run_in_process("train_single.py", *RUN, "--epochs", "1",
                            "--data-dir", tmp_path / "数据 dir", "--out", out)
    assert result.returncode == 0, result.stderr
    assert logged_epochs(out) == [1] and (out / CHECKPOINT).exists()


def test_a_run_refused_before_it_starts_leaves_no_folder_behind(tmp_path):
    result = run_in_process("train_single.py", *RUN, "--batch-size", "1024",
                            "--out", tmp_path / "new" / "run")
    assert_one_line_error(result, "--batch-size")
    assert not (tmp_path / "new").exists()


def test_an_empty_out_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run_in_process("train_single.py", *RUN, "--out", "")
    assert_one_line_error(result, "--out must be the name of a folder, got an empty string")
    assert list(tmp_path.iterdir()) == []


def test_a_second_run_into_a_held_folder_is_refused(finished, tmp_path):
    """While a run holds OUT (its flock), another run into it, --overwrite or not, stops."""
    out = copy_of(finished, tmp_path)
    before = files_in(out)
    holder = os.open(out / out_dir.LOCK, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the first run holds it
        for extra in ([], ["--overwrite"], ["--resume", "--epochs", "3"]):
            result = run_in_process("train_single.py", *RUN, *extra, "--out", out)
            assert_one_line_error(result, "is in use by another run")
        assert files_in(out) == before
    finally:
        os.close(holder)  # as the first run's end lets go of it
    result = run_in_process("train_single.py", *RUN, "--resume", "--epochs", "3", "--out", out)
    assert result.returncode == 0, result.stderr
    assert logged_epochs(out) == [1, 2, 3]


def test_a_run_lets_go_of_its_folder_even_when_it_fails(tmp_path):
    out = tmp_path / "run"
    failed = run_in_process("train_single.py", *RUN, "--lr", "1e30", "--out", out)
    assert failed.returncode == 1 and "the loss became nan" in failed.stderr
    assert not (out / out_dir.LOCK).exists()  # removed as the run let go


def test_a_refused_run_leaves_a_folder_as_it_found_it(finished, tmp_path):
    """A run refused at the start (OUT holds a run) leaves no lock file behind, in a folder
    that was there before; a folder the claim made, it removes."""
    out = copy_of(finished, tmp_path)
    before = sorted(p.name for p in out.iterdir())
    result = run_in_process("train_single.py", *RUN, "--out", out)
    assert_one_line_error(result, "already holds a run")
    assert sorted(p.name for p in out.iterdir()) == before
    result = run_in_process("train_single.py", *RUN, "--batch-size", "100000", "--out", tmp_path / "new" / "run")
    assert_one_line_error(result, "lower --batch-size")  # refused after the claim made the folders
    assert not (tmp_path / "new").exists()


def test_a_lock_removed_while_it_was_taken_is_taken_again(tmp_path, monkeypatch):
    """A run that lets go removes OUT/.lock: a run that opened the old file just before must
    not hold that one (a third run would make a new file and hold it too). It sees the file
    is gone, and takes the new one."""
    lock = tmp_path / out_dir.LOCK
    real_flock, calls = fcntl.flock, []

    def flock_then_let_go(descriptor, operation):
        real_flock(descriptor, operation)
        calls.append(descriptor)
        if len(calls) == 1:
            lock.unlink()  # the holder's let-go, between this run's open and its flock
    monkeypatch.setattr(out_dir.fcntl, "flock", flock_then_let_go)
    descriptor = out_dir.hold(lock)
    try:
        assert len(calls) == 2 and os.path.samestat(os.fstat(descriptor), os.stat(lock))
    finally:
        os.close(descriptor)


def test_a_run_that_lets_go_leaves_another_run_s_lock_file(tmp_path):
    """OUT/.lock removed by hand while a run held it, and a new one made and held by another
    run: the first run's end leaves the new file alone."""
    out = tmp_path / "run"
    out_dir.claim_out_dir(out)
    (out / out_dir.LOCK).unlink()  # by hand
    other = os.open(out / out_dir.LOCK, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the other run's
        let_go_of_folders()
        assert (out / out_dir.LOCK).exists()
    finally:
        os.close(other)


def test_a_run_that_stops_early_leaves_its_process_group(tmp_path):
    """A refusal or a resume with nothing to do, after the group formed: run_cli destroys the
    group. Left open, gloo's threads aborted the exiting process ("terminate called without
    an active exception") in 7 of 10 two-rank resumes with nothing to do."""
    from ddp_scripts.cli import run_cli
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}",
                                         rank=0, world_size=1)

    def main():
        raise NothingToDo("nothing to train")
    with pytest.raises(SystemExit) as ended:
        run_cli(main)
    assert ended.value.code == 0 and not torch.distributed.is_initialized()


def test_someone_else_s_lock_file_is_left_where_it_was(tmp_path):
    """A .lock with content in OUT is not a lock these scripts made: the run holds it, and
    leaves it."""
    (tmp_path / out_dir.LOCK).write_text("someone's lock")
    result = run_in_process("train_single.py", *RUN, "--epochs", "1", "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / out_dir.LOCK).read_text() == "someone's lock"


def test_an_overwrite_leaves_no_sharded_checkpoint_of_the_run_it_replaced(tmp_path):
    """train_single.py --overwrite over a train_fsdp.py run: a later train_fsdp.py --resume
    must not find the replaced run's shards."""
    for name in (SHARDED_CHECKPOINT, SHARDED_CHECKPOINT + ".old"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "shard").write_text("x")
    (tmp_path / METRICS).write_text('{"epoch": 1}\n')
    result = run_in_process("train_single.py", *RUN, "--epochs", "1", "--overwrite", "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    assert not list(tmp_path.glob(SHARDED_CHECKPOINT + "*"))


def test_a_resume_with_nothing_to_resume_says_it_starts(tmp_path):
    result = run_in_process("train_single.py", *RUN, "--epochs", "1", "--resume", "--out", tmp_path / "new")
    assert result.returncode == 0, result.stderr
    assert f"{tmp_path / 'new'} holds no run to resume: training from epoch 1" in result.stdout


def test_a_folder_removed_between_its_making_and_its_lock_is_made_again(tmp_path, monkeypatch):
    """Another run that made OUT, and ended with it empty, removes it: this run makes it again."""
    out, real_open, opened = tmp_path / "run", os.open, []

    def open_after_it_went(path, *args):
        if not opened:
            opened.append(path)
            os.rmdir(out)  # the other run's end, between this run's mkdir and its open
        return real_open(path, *args)
    monkeypatch.setattr(out_dir.os, "open", open_after_it_went)
    out_dir.claim_out_dir(out)
    monkeypatch.undo()
    try:
        assert (out / out_dir.LOCK).exists()
    finally:
        let_go_of_folders()


@pytest.mark.parametrize("lock", ["a link into a folder that is not there", "a folder"])
def test_a_lock_that_cannot_be_opened_is_one_line(tmp_path, lock):
    if lock == "a folder":
        (tmp_path / out_dir.LOCK).mkdir()
    else:
        (tmp_path / out_dir.LOCK).symlink_to(tmp_path / "nowhere" / "x")
    result = run_in_process("train_single.py", *RUN, "--epochs", "1", "--out", tmp_path)
    assert_one_line_error(result, f"--out {tmp_path} cannot be written")


def test_a_save_that_fails_for_another_reason_keeps_its_context(tmp_path, monkeypatch):
    """Not the disk (no OSError behind it): the error as it was, with what it was raised in."""
    def broken_save(*args):
        try:
            raise KeyError("inner")
        except KeyError:
            raise ValueError("not the disk")  # noqa: B904 (its context is the point)
    monkeypatch.setattr(out_dir, "save_checkpoint", broken_save)
    args = build_parser("test").parse_args(["--out", str(tmp_path)])
    totals = torch.tensor([1.0, 2.0, 2.0], dtype=torch.float64)
    with pytest.raises(ValueError) as raised:
        out_dir.save_epoch(args, 1, None, None, totals, torch.tensor([1.0, 1.0, 2.0]), 1.0, {})
    assert isinstance(raised.value.__context__, KeyError) and not raised.value.__suppress_context__


def test_an_overwrite_removes_a_sharded_checkpoint_that_is_a_link_or_a_file(tmp_path):
    elsewhere = tmp_path / "big-disk" / "shards"
    elsewhere.mkdir(parents=True)
    out = tmp_path / "run"
    out.mkdir()
    (out / SHARDED_CHECKPOINT).symlink_to(elsewhere)
    (out / (SHARDED_CHECKPOINT + ".old")).write_text("x")
    result = run_in_process("train_single.py", *RUN, "--epochs", "1", "--overwrite", "--out", out)
    assert result.returncode == 0, result.stderr
    assert not list(out.glob(SHARDED_CHECKPOINT + "*")) and elsewhere.exists()  # the link, not its target


def test_fsdp_says_too_when_there_is_no_run_to_resume(tmp_path):
    result = run_one_rank("train_fsdp.py", *RUN, "--epochs", "1", "--resume", "--out", tmp_path / "new")
    assert result.returncode == 0, result.stderr
    assert f"{tmp_path / 'new'} holds no run to resume: training from epoch 1" in result.stdout


def test_a_new_run_removes_only_the_temporary_files_of_its_own_kind(tmp_path):
    for name in (".notes.tmp", ".env.tmpl", "data.csv", ".metrics.jsonl.tmpl",
                 f".{CHECKPOINT}.tmp123", f".{METRICS}.tmp45", f".{SUMMARY}.tmp6"):
        (tmp_path / name).write_text("x")
    args = build_parser("test").parse_args(["--out", str(tmp_path)])
    start_out_dir(args, prepare_out_dir(args))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".env.tmpl", out_dir.LOCK, ".metrics.jsonl.tmpl", ".notes.tmp", "data.csv", METRICS]


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary_one(tmp_path):
    (tmp_path / "file").write_text("old")

    def full_disk(f):
        f.write("half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with pytest.raises(OSError):
        write_atomically(tmp_path / "file", full_disk, mode="w")
    assert [p.name for p in tmp_path.iterdir()] == ["file"]
    assert (tmp_path / "file").read_text() == "old"


def _file_size_limit(limit):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it fails (EFBIG) instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.timeout(300)
def test_a_save_that_fails_mid_run_says_what_was_kept(finished, tmp_path):
    """A disk that fills while epoch 3's checkpoint is written (here: a file size limit
    smaller than the checkpoint): one line, exit 1, epoch 2's checkpoint whole, no
    temporary file."""
    out = copy_of(finished, tmp_path)
    checkpoint = (out / CHECKPOINT).read_bytes()
    result = subprocess.run(
        [sys.executable, "ddp_scripts/train_single.py", *RUN, "--epochs", "3", "--resume",
         "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=240,
        preexec_fn=_file_size_limit(len(checkpoint) // 2))
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: cannot save epoch 3 in {out} (File too large); {CHECKPOINT} of epoch 2 is "
        "whole: --resume continues from it"], result.stderr
    assert (out / CHECKPOINT).read_bytes() == checkpoint
    assert not [p.name for p in out.iterdir() if ".tmp" in p.name]


# --- An honest resume ------------------------------------------------------------------------
@pytest.mark.parametrize("option, value, fragment", [
    ("--lr", "5", "was trained with --lr 0.01 and this run asks for 5.0: pass --lr 0.01"),
    ("--momentum", "0", "was trained with --momentum 0.9 and this run asks for 0.0"),
    ("--batch-size", "64", "was trained with a global batch of 32 (1 rank(s) of 32) and this "
                           "run's is 64: pass --batch-size 32"),
    ("--train-samples", "256", "was trained with --train-samples 512 and this run asks for 256"),
])
def test_a_resume_that_would_train_differently_is_refused(finished, tmp_path, option, value,
                                                          fragment):
    out = copy_of(finished, tmp_path)
    before = files_in(out)
    result = run_in_process("train_single.py", *RUN, "--epochs", "3", option, value, "--resume",
                            "--out", out)
    assert_one_line_error(result, fragment, "--overwrite")
    assert files_in(out) == before


def test_a_resume_records_what_it_trained_with(finished, tmp_path):
    out = copy_of(finished, tmp_path)
    result = run_in_process("train_single.py", *RUN, "--epochs", "3", "--resume", "--out", out)
    assert result.returncode == 0, result.stderr
    saved = torch.load(out / CHECKPOINT, weights_only=True)
    summary = json.loads((out / SUMMARY).read_text())
    assert saved["optimizer"]["param_groups"][0]["lr"] == summary["args"]["lr"] == 0.01
    assert saved["trained"]["global_batch_size"] == 32 and saved["epoch"] == 3


def test_a_resume_on_another_number_of_ranks_keeps_the_global_batch(finished, tmp_path,
                                                                   monkeypatch):
    """Saved by 1 rank of 32; resumed by 2 ranks: 2 x 32 is refused, 2 x 16 continues. On 3
    ranks no batch size gives 32: run it on 1."""
    out = copy_of(finished, tmp_path)
    monkeypatch.setattr(out_dir, "world_size", lambda: 2)
    parse = build_parser("test").parse_args
    with pytest.raises(UsageError, match=r"global batch of 32 \(1 rank\(s\) of 32\) and this "
                                         r"run's is 64: pass --batch-size 16 to continue it on 2"):
        prepare_out_dir(parse([*RUN, "--epochs", "3", "--resume", "--out", str(out)]))
    args = parse([*RUN, "--epochs", "3", "--batch-size", "16", "--resume", "--out", str(out)])
    assert prepare_out_dir(args)["epoch"] == 2
    monkeypatch.setattr(out_dir, "world_size", lambda: 3)  # 32 does not split over 3 ranks
    with pytest.raises(UsageError, match=r"and this run's is 48: run it on 1 rank\(s\), or "
                                         "--overwrite"):
        prepare_out_dir(args)


@pytest.mark.parametrize("epochs", ["1", "2"])
def test_a_resume_with_nothing_to_do_says_so_and_changes_nothing(finished, tmp_path, epochs):
    out = copy_of(finished, tmp_path)
    before = files_in(out)
    result = run_in_process("train_single.py", *RUN, "--epochs", epochs, "--resume", "--out", out)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.strip() == (f"[rank 0] {out / CHECKPOINT} is at epoch 2, and --epochs is "
                                     f"{epochs}: nothing to train, the run is left as it is (pass "
                                     "a larger --epochs to train on)")
    assert files_in(out) == before


def test_a_logged_run_without_its_checkpoint_is_refused_not_restarted(finished, tmp_path):
    out = copy_of(finished, tmp_path)
    (out / CHECKPOINT).unlink()
    before = files_in(out)
    result = run_in_process("train_single.py", *RUN, "--epochs", "1", "--resume", "--out", out)
    assert_one_line_error(result, f"holds epochs [1, 2] but no {CHECKPOINT}", "--overwrite")
    assert files_in(out) == before


def damage(out, line, how):
    """Damage one line (0-based) of OUT/metrics.jsonl as a crash, a disk or a hand might."""
    lines = (out / METRICS).read_bytes().splitlines(keepends=True)
    lines[line] = {"cut": lambda text: text[:-100] + b"\n",       # the last 100 bytes lost
                   "half": lambda text: text[:len(text) // 2] + b"\n",
                   "bytes": lambda text: b"\xff\xfe" + text[2:],  # not UTF-8
                   "string": lambda text: text.replace(b'"epoch": ', b'"epoch": "', 1).replace(
                       b", ", b'", ', 1),                          # "epoch": "2"
                   "twice": lambda text: text + text}[how](lines[line])
    (out / METRICS).write_bytes(b"".join(lines))


@pytest.mark.parametrize("line, how, fragment", [
    (1, "cut", "line 2, is damaged (not whole JSON"),          # the last line cut short
    (0, "half", "line 1, is damaged (not whole JSON"),         # the first line half-written
    (0, "bytes", "line 1, is damaged (not UTF-8 text)"),
    (1, "string", "line 2, is damaged (its epoch is '2', not a whole number from 1)"),
    (0, "twice", "line 2, logs epoch 1 out of step: the checkpoint (epoch 2) needs epochs 1 to 2"),
    (1, "twice", "line 3, logs epoch 2 out of step"),           # doubled after the epochs kept
])
def test_a_damaged_metrics_line_is_refused_not_dropped(finished, tmp_path, line, how, fragment):
    """A resume keeps the log whole: a damaged or doubled line of the epochs it keeps is one
    line and exit 2, with the way out, and every file is left as it was."""
    out = copy_of(finished, tmp_path)
    damage(out, line, how)
    before = files_in(out)
    result = run_in_process("train_single.py", *RUN, "--epochs", "3", "--resume", "--out", out)
    assert_one_line_error(result, f"{out / METRICS}", fragment, "--overwrite")
    assert "resuming" not in result.stdout  # refused before the resume starts
    assert files_in(out) == before


def test_a_metrics_line_cut_short_after_the_checkpoint_is_dropped_with_a_word(finished, tmp_path):
    """A crash while epoch 3 was logged, before its checkpoint: that epoch is trained again,
    and the cut line goes, said in one line."""
    out = copy_of(finished, tmp_path)
    with open(out / METRICS, "a") as log:
        log.write('{"epoch": 3, "train_lo')
    result = run_in_process("train_single.py", *RUN, "--epochs", "3", "--resume", "--out", out)
    assert result.returncode == 0, result.stderr
    assert f"{out / METRICS}, line 3, is not whole (not whole JSON: cut short, or not a " \
           "metrics line), and the run stopped after epoch 2's checkpoint: the line is " \
           "dropped, and its epoch trained again" in result.stdout
    assert logged_epochs(out) == [1, 2, 3]
    assert metrics_rows(out, strict=True)


@pytest.mark.parametrize("left, fragment", [
    (1, "line 1, logs epoch 2 out of step: the checkpoint (epoch 2) needs epochs 1 to 2"),
    (0, "lacks epoch 2: the checkpoint (epoch 2) needs epochs 1 to 2"),  # the log's end lost
])
def test_a_metrics_line_missing_is_refused(finished, tmp_path, left, fragment):
    out = copy_of(finished, tmp_path)
    lines = (out / METRICS).read_text().splitlines(keepends=True)
    (out / METRICS).write_text(lines[left])
    before = files_in(out)
    result = run_in_process("train_single.py", *RUN, "--epochs", "3", "--resume", "--out", out)
    assert_one_line_error(result, f"{out / METRICS}", fragment, "--overwrite")
    assert files_in(out) == before


def test_a_damaged_line_without_a_checkpoint_is_refused_too(tmp_path):
    """No checkpoint yet: a damaged line that is not the log's last is refused, not wiped by
    a start from epoch 1."""
    (tmp_path / METRICS).write_bytes(b'{"epoch": 1, "tr\n{"epoch": 1}\n')
    result = run_in_process("train_single.py", *RUN, "--epochs", "1", "--resume", "--out", tmp_path)
    assert_one_line_error(result, "line 1, is damaged")
    assert (tmp_path / METRICS).read_bytes() == b'{"epoch": 1, "tr\n{"epoch": 1}\n'


def test_a_strict_reader_names_the_damaged_line(tmp_path):
    (tmp_path / METRICS).write_bytes(b'{"epoch": 1}\n\xff\n')
    with pytest.raises(ValueError, match=r"line 2: not UTF-8 text"):
        metrics_rows(tmp_path, strict=True)
    assert logged_epochs(tmp_path) == [1]


def test_blank_lines_and_a_byte_order_mark_are_not_damage(finished, tmp_path):
    out = copy_of(finished, tmp_path)
    lines = (out / METRICS).read_bytes().splitlines(keepends=True)
    (out / METRICS).write_bytes(b"\xef\xbb\xbf" + lines[0] + b"\n" + lines[1] + b"\n")
    result = run_in_process("train_single.py", *RUN, "--epochs", "3", "--resume", "--out", out)
    assert result.returncode == 0, result.stderr
    assert "not whole" not in result.stdout and logged_epochs(out) == [1, 2, 3]


def test_lines_out_of_order_are_named(finished, tmp_path):
    out = copy_of(finished, tmp_path)
    lines = (out / METRICS).read_text().splitlines(keepends=True)
    (out / METRICS).write_text(lines[1] + lines[0])
    result = run_in_process("train_single.py", *RUN, "--epochs", "3", "--resume", "--out", out)
    assert_one_line_error(result, "line 1, logs epoch 2 out of step: the checkpoint (epoch 2) "
                                  "needs epochs 1 to 2 logged once each, in order", "--overwrite")


@pytest.mark.parametrize("resume", ["--resume", "--overwrite"])
def test_a_folder_where_the_log_should_be_is_one_line(finished, tmp_path, resume):
    out = copy_of(finished, tmp_path)
    (out / METRICS).unlink()
    (out / METRICS).mkdir()
    result = run_in_process("train_single.py", *RUN, "--epochs", "3", resume, "--out", out)
    assert_one_line_error(result, f"{out / METRICS} is not a file: move it away")


def test_an_interrupt_hidden_by_the_save_s_own_error_is_one_line(tmp_path, monkeypatch):
    """Ctrl-C (or SIGTERM) while torch.save writes: its zip writer then fails on its way out,
    and that error's context is the interrupt, which is what the line says."""
    def save(state, f):
        try:
            raise KeyboardInterrupt  # as if Ctrl-C came in the middle of the write
        finally:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 2738304")
    monkeypatch.setattr(torch, "save", save)
    result = run_in_process("train_single.py", *RUN, "--epochs", "1", "--out", tmp_path / "run")
    assert result.returncode == 130, result.stderr
    assert result.stderr.strip() == "interrupted (Ctrl-C); the last checkpoint saved, if any, is whole"
    assert not list((tmp_path / "run").glob(".*.tmp*"))


def test_a_folder_with_only_an_empty_log_is_not_a_run(tmp_path):
    """Ctrl-C in epoch 1 leaves an empty metrics.jsonl: nothing trained, so the same command
    starts again without --resume."""
    (tmp_path / METRICS).write_bytes(b"")
    result = run_in_process("train_single.py", *RUN, "--epochs", "1", "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    assert logged_epochs(tmp_path) == [1]
    other = tmp_path / "other"
    other.mkdir()
    (other / METRICS).write_bytes(b"\n\n")  # blank lines: nothing logged either
    assert not runfiles.holds_a_run(other)
    (other / METRICS).write_bytes(b"{\n")  # a line that is not blank is a log
    result = run_in_process("train_single.py", *RUN, "--epochs", "1", "--out", other)
    assert_one_line_error(result, "already holds a run")
    assert (other / METRICS).read_bytes() == b"{\n"


def test_a_crash_before_the_first_checkpoint_starts_again(tmp_path):
    """Epoch 1 logged, its checkpoint never written: nothing is lost by training it again."""
    out_dir.append_metrics(tmp_path, {"epoch": 1})
    result = run_in_process("train_single.py", *RUN, "--epochs", "1", "--resume", "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    assert logged_epochs(tmp_path) == [1] and (tmp_path / CHECKPOINT).exists()


def test_fsdp_killed_before_its_first_save_starts_again(tmp_path, capsys):
    """train_fsdp.py stopped after epoch 1 was logged, before its first sharded save: as the
    other scripts do, a resume says so and trains from epoch 1; with 2 epochs logged, refused."""
    args = build_parser("test").parse_args(["--out", str(tmp_path), "--resume", "--epochs", "3"])
    args.width, args.depth = 8, 2  # train_fsdp.py's options
    out_dir.append_metrics(tmp_path, {"epoch": 1, "strategy": "fsdp"})
    assert fsdp_out_dir.prepare_out_dir(args, 32) is None
    assert "holds epoch 1 but not its checkpoint.dcp (cut short before it was saved): " \
           "training from epoch 1 again" in capsys.readouterr().out
    out_dir.append_metrics(tmp_path, {"epoch": 2, "strategy": "fsdp"})
    with pytest.raises(UsageError, match=r"holds epochs \[1, 2\] but no sharded checkpoint"):
        fsdp_out_dir.prepare_out_dir(args, 32)


def test_the_sharded_checkpoint_is_held_to_the_same_rules(tmp_path):
    args = build_parser("test").parse_args(["--out", str(tmp_path), "--resume", "--epochs", "3"])
    args.width, args.depth = 8, 2  # train_fsdp.py's options
    folder = tmp_path / SHARDED_CHECKPOINT
    folder.mkdir()
    info = {"epoch": 2, "identity": fsdp_out_dir.sharded_identity(args), "lr": 0.01, "momentum": 0.9,
            "world_size": 1, "global_batch_size": 32}
    (folder / fsdp_out_dir.CHECKPOINT_INFO).write_text(json.dumps(info))
    with pytest.raises(UsageError, match="lacks epoch 1: the checkpoint"):  # the log lost
        fsdp_out_dir.prepare_out_dir(args, 32)
    (tmp_path / METRICS).write_text('{"epoch": 1}\n{"epoch": 2}\n')
    assert fsdp_out_dir.prepare_out_dir(args, 32)["epoch"] == 2
    args.lr = 5.0
    with pytest.raises(UsageError, match="was trained with --lr 0.01 and this run asks for 5.0"):
        fsdp_out_dir.prepare_out_dir(args, 32)
    args.epochs = 2
    with pytest.raises(NothingToDo, match="is at epoch 2, and --epochs is 2: nothing to train"):
        fsdp_out_dir.prepare_out_dir(args, 32)


def test_a_damaged_shard_names_the_first_rank_s_exception():
    error = CheckpointException("load failed", {
        1: (OSError("other"), None), 0: (ValueError("short read in __0_0.distcp\nmore"), None)})
    assert fsdp_out_dir.first_failure(error) == "rank 0: ValueError: short read in __0_0.distcp"
    assert fsdp_out_dir.first_failure(CheckpointException("", {0: (EOFError(), None)})) == \
        "rank 0: EOFError"



def test_a_shard_that_cannot_be_read_is_named_however_long_its_folder(tmp_path, monkeypatch):
    """The line names the file by its name in the folder it has already named: a long path
    is not dropped whole when the line is shortened to 200 characters."""
    folder = tmp_path / ("a-long-folder-name-" * 8) / "run" / SHARDED_CHECKPOINT

    def missing_shard(state, checkpoint_id):
        raise CheckpointException("load failed", {0: (FileNotFoundError(
            2, "No such file or directory", str(folder / "__0_0.distcp")), None)})
    monkeypatch.setattr(fsdp_out_dir.dcp, "load", missing_shard)
    monkeypatch.setattr(fsdp_out_dir, "get_state_dict", lambda model, optimizer: ({}, {}))
    with pytest.raises(UsageError) as refused:
        fsdp_out_dir.resume_from({"epoch": 1, "world_size": 1}, None, None, folder.parent)
    assert "__0_0.distcp" in str(refused.value) and "[...]" not in str(refused.value), refused.value


def test_a_data_dir_that_is_a_file_is_one_line_not_a_fallback(tmp_path):
    (tmp_path / "afile").write_text("")
    result = run_in_process("train_single.py", "--dataset", "cifar10", "--data-dir",
                            tmp_path / "afile", "--train-samples", "64", "--test-samples", "64",
                            "--epochs", "1", "--out", tmp_path / "run")
    assert_one_line_error(result, f"--data-dir {tmp_path / 'afile'} is a file, not a directory")
    result = run_in_process("train_single.py", "--dataset", "cifar10",
                            "--data-dir", tmp_path / "afile" / "data", "--train-samples", "64",
                            "--test-samples", "64", "--epochs", "1", "--out", tmp_path / "run2")
    assert_one_line_error(result, f"--data-dir {tmp_path / 'afile' / 'data'} cannot be made: "
                                  f"{tmp_path / 'afile'} is a file")

# --- torchrun's variables, the error file, the options --------------------------------------
@pytest.mark.parametrize("env, fragment", [
    ({"LOCAL_RANK": "0"}, "RANK, WORLD_SIZE, LOCAL_WORLD_SIZE not set, although LOCAL_RANK is"),
    ({"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "2"},  # by hand: rank 1 would never come
     "LOCAL_WORLD_SIZE not set, although LOCAL_RANK is"),
    ({"LOCAL_RANK": "0", "RANK": "2", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"},
     "torchrun's variables contradict each other"),
    ({"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "two", "LOCAL_WORLD_SIZE": "1"},
     "torchrun's variables must be whole numbers"),
])
def test_torchrun_s_variables_are_checked_together(tmp_path, monkeypatch, env, fragment):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = run_in_process("train_ddp.py", *RUN, "--out", tmp_path / "run")
    assert_one_line_error(result, fragment)
    assert not (tmp_path / "run").exists()


def test_rank_variables_by_hand_without_master_addr_are_one_line(tmp_path, monkeypatch):
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                        "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("MASTER_PORT", "29500")
    result = run_in_process("train_ddp.py", *RUN, "--out", tmp_path / "run")
    assert_one_line_error(result, "MASTER_ADDR not set, although RANK and WORLD_SIZE are")
    assert not (tmp_path / "run").exists()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "abc")
    result = run_in_process("train_ddp.py", *RUN, "--out", tmp_path / "run")
    assert_one_line_error(result, "MASTER_PORT must be a port number, 1 to 65535, got 'abc'")


def test_a_local_world_size_of_zero_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "0")
    with pytest.raises(UsageError, match="LOCAL_WORLD_SIZE must be a whole number, 1 or more, "
                                         "got '0'"):
        set_cpu_threads()


def test_torchrun_s_variables_left_in_a_shell_are_one_notice(tmp_path, monkeypatch):
    """RANK=1 WORLD_SIZE=2 (and a LOCAL_WORLD_SIZE of 0) left from an earlier export: a script
    of one process says so once, ignores them, and tags no line with another rank's number."""
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    result = run_in_process("train_single.py", *RUN, "--epochs", "1", "--out", tmp_path / "run")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line for line in lines if "notice: LOCAL_WORLD_SIZE=0 RANK=1 WORLD_SIZE=2 set in the "
            "environment, but this script runs one process without torchrun: ignored" in line]
    assert all(line.startswith("[rank 0] ") for line in lines), result.stdout
    assert logged_epochs(tmp_path / "run") == [1]


def test_an_error_file_that_cannot_be_written_keeps_the_line_and_the_exit_status(tmp_path,
                                                                                 monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "missing" / "error.json"))
    result = run_in_process("train_single.py", *RUN, "--epochs", "0", "--out", tmp_path / "run")
    assert_one_line_error(result, "--epochs must be at least 1, got 0")


def test_workers_are_checked_as_they_are_read(tmp_path):
    result = run_in_process("train_fast.py", *RUN, "--workers", "-1", "--out", tmp_path / "run")
    assert_one_line_error(result, "--workers must be 0 or more, got -1")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sent, name, status", [(signal.SIGINT, "Ctrl-C", 130),
                                                (signal.SIGTERM, "SIGTERM", -signal.SIGTERM)])
def test_ctrl_c_or_sigterm_is_one_line(tmp_path, sent, name, status):
    process = subprocess.Popen(
        [sys.executable, "ddp_scripts/train_single.py", "--dataset", "synthetic", "--train-samples",
         "20000", "--test-samples", "64", "--epochs", "50", "--device", "cpu", "--out", str(tmp_path / "run")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # A shell's background job (CI's, say) starts with SIGINT ignored, and a child keeps
        # that: Python then installs no KeyboardInterrupt. A terminal's Ctrl-C finds it default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert "training on" in process.stdout.readline()
        process.send_signal(sent)
        _, stderr = process.communicate()  # no clock of its own: pytest-timeout ends a hang
    finally:
        process.kill()  # no stray process if an assertion or the timeout ends the test
    assert process.returncode == status, stderr
    assert stderr.splitlines() == [f"interrupted ({name}); the last checkpoint saved, if any, is "
                                   "whole"], stderr


@pytest.mark.timeout(300)
def test_sigterm_to_torchrun_reaches_every_worker_and_keeps_the_files(tmp_path):
    """SIGTERM to torchrun itself, as `kill` from a terminal sends it: each worker says its
    one line, then torchrun ends with a traceback of its own (chapter 8 says it is
    torchrun's); the checkpoint and the log are whole, and nothing is left running."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(ROOT / "ddp_scripts" / "train_ddp.py"), *RUN, "--train-samples", "2048",
               "--epochs", "100", "--out", str(out)]
    torchrun = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    try:
        lines = []
        for line in torchrun.stdout:
            lines.append(line)
            if "epoch 1/100" in line:
                torchrun.send_signal(signal.SIGTERM)
                break
        lines += torchrun.stdout.readlines()
        assert torchrun.wait(timeout=120) != 0
    finally:
        try:
            os.killpg(torchrun.pid, signal.SIGKILL)  # only if a test step above failed
        except ProcessLookupError:
            pass
    output = "".join(lines)
    said = [line for line in lines if "interrupted (SIGTERM); the last checkpoint saved" in line]
    assert sorted(line.split("]")[0] for line in said) == ["[rank 0", "[rank 1"], output
    assert "SignalException" in output  # torchrun's own
    epoch = load_checkpoint(out / CHECKPOINT)["epoch"]
    assert epoch >= 1 and logged_epochs(out)[:epoch] == list(range(1, epoch + 1))
    assert not (out / SUMMARY).exists() and not (out / out_dir.LOCK).exists()
    assert processes_mentioning(str(out)) == []  # torchrun has ended its workers


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_sigkill_to_torchrun_ends_its_workers(tmp_path):
    """SIGKILL to torchrun, which it cannot pass on: each worker asked Linux for SIGTERM when
    torchrun ends (cli.end_with_parent), says why in one line, and nothing trains on."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(ROOT / "ddp_scripts" / "train_ddp.py"), *RUN, "--train-samples", "2048",
               "--epochs", "100", "--out", str(out)]
    log = open(tmp_path / "output", "w+")
    torchrun = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while not (out / CHECKPOINT).exists():  # epoch 1 saved: the workers are training
            assert torchrun.poll() is None, (tmp_path / "output").read_text()
            time.sleep(0.1)
        torchrun.kill()
        torchrun.wait()
        for _ in range(600):  # a hang guard of 60 s, not a measure: they end in well under 1 s
            if not processes_mentioning(str(out)):
                break
            time.sleep(0.1)
        assert processes_mentioning(str(out)) == []
    finally:
        for proc in processes_mentioning(str(out)):  # only if a step above failed
            proc.kill()
        log.close()
    output = (tmp_path / "output").read_text()
    said = [line for line in output.splitlines() if "interrupted (SIGTERM: torchrun, which "
            "started this process, has ended); the last checkpoint saved, if any, is whole" in line]
    assert sorted(line.split("]")[0] for line in said) == ["[rank 0", "[rank 1"], output
    epoch = load_checkpoint(out / CHECKPOINT)["epoch"]
    assert logged_epochs(out)[:epoch] == list(range(1, epoch + 1)) and epoch < 100


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_a_worker_waiting_in_the_rendezvous_ends_soon_after_its_torchrun(tmp_path):
    """torchrun (here a stand-in parent) killed while its worker waits for a rank that never
    comes: Python cannot run the SIGTERM handler in that wait, so the worker's watch ends it,
    in one line, long before its --timeout-s of 300 s."""
    port = free_port()
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": "stand-in"}
    worker = [sys.executable, str(ROOT / "ddp_scripts" / "train_ddp.py"), *RUN, "--timeout-s", "300",
              "--out", str(tmp_path / "run")]
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; "
         f"subprocess.Popen({worker!r}, stderr=open({str(tmp_path / 'stderr')!r}, 'w')); "
         "time.sleep(600)"], env=env, start_new_session=True)
    try:
        while True:  # rank 0 waits in the rendezvous once it listens on MASTER_PORT
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert parent.poll() is None
            time.sleep(0.2)
        parent.kill()
        parent.wait()
        for _ in range(1200):  # a hang guard of 120 s, not a measure: about 11 s here
            if not processes_mentioning(str(tmp_path / "run")):
                break
            time.sleep(0.1)
        assert processes_mentioning(str(tmp_path / "run")) == []
    finally:
        for proc in processes_mentioning(str(tmp_path / "run")):  # only if a step above failed
            proc.kill()
    lines = (tmp_path / "stderr").read_text().strip().splitlines()
    assert lines == ["[rank 0] interrupted (SIGTERM: torchrun, which started this process, has "
                     "ended; ended in a wait that Python could not interrupt); the last "
                     "checkpoint saved, if any, is whole"], lines


def test_an_out_that_cannot_be_made_is_one_line_per_rank_under_ddp(tmp_path):
    (tmp_path / "afile").write_text("")
    lines = []
    with pytest.raises(LaunchError) as caught:
        run_script("train_ddp.py", nproc=2, out=tmp_path / "afile" / "run", timeout=240,
                   progress=False, echo=lines.append, dataset="synthetic", device="cpu")
    said = [line for line in lines if "error:" in line]
    assert said and all("cannot be written: Not a directory" in line for line in said), lines
    # torchrun's own report follows; no traceback comes from the script
    assert not any('File "' in line and "ddp_scripts" in line for line in lines), "\n".join(lines)
    assert caught.value.exit_code == 2 and "cannot be written" in str(caught.value)


# --- The launcher and the benchmark -----------------------------------------------------------
def test_the_launcher_names_the_killed_rank_not_the_survivor():
    """Rank 1 left no error file (SIGKILL); rank 0's says it lost its peer: rank 1 is the one
    to read about, as torchrun's own summary says."""
    survivor = {"rank": 0, "exit_code": 1, "time": 1.0,
                "reason": "RuntimeError: [../gloo/transport/tcp/pair.cc:545] Read error "
                          "[127.0.0.1]:6539: Connection reset by peer", "message": {}}
    error = failure(1, [survivor], [], silent=[1])
    assert error.rank == 1 and str(error).startswith(
        "rank 1 ended without an error file (killed by a signal?); then rank 0 failed: "
        "RuntimeError: [../gloo")
    # a rank that failed on its own is named, not a rank torchrun ended after it
    own = {**survivor, "reason": "UsageError: --out x cannot be written: Not a directory"}
    assert failure(1, [own], [], silent=[1]).rank == 0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("failure", ["UsageError('rank 1 refuses')", "ValueError('rank 1 bug')"])
def test_the_launcher_names_the_rank_that_stopped_not_the_peer_that_lost_it(tmp_path, failure):
    """Rank 1 stops alone while rank 0 waits in a collective. Rank 1 leaves the group only
    after writing its error file, so its file comes first and is the one named."""
    script = tmp_path / "alone.py"
    script.write_text(f"""import os, sys
import torch, torch.distributed as dist
from ddp_scripts.cli import UsageError, run_cli

def main():
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise {failure}
    dist.all_reduce(torch.ones(1))

run_cli(main)
""")
    with pytest.raises(LaunchError) as caught:
        run_command(torchrun_command(str(script), 2), timeout=120, echo=lambda line: None)
    assert caught.value.rank == 1, str(caught.value)
    assert "rank 1 " in str(caught.value).split(":", 1)[1], str(caught.value)


@pytest.mark.timeout(300)
def test_the_launcher_names_a_rank_killed_under_torchrun(tmp_path):
    """Rank 0 records a lost peer (as gloo reports it); then rank 1 is killed, and torchrun
    ends rank 0: the launcher finds rank 1 without an error file."""
    script = tmp_path / "killed.py"
    script.write_text(f"""import os, pathlib, signal, sys, time
from ddp_scripts.runfiles import write_error_file
told = pathlib.Path({str(tmp_path / "told")!r})
if os.environ["RANK"] == "0":
    write_error_file(ConnectionResetError("Connection reset by peer"), exit_code=1, rank=0)
    told.touch()
else:
    while not told.exists():
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
""")
    with pytest.raises(LaunchError) as caught:
        run_command(torchrun_command(str(script), 2), timeout=120, echo=lambda line: None)
    assert caught.value.rank == 1, str(caught.value)
    assert str(caught.value) == ("rank 1 ended without an error file (killed by a signal?); then "
                                 "rank 0 failed: Connection reset by peer")


def test_the_benchmark_checks_its_out_before_anything_runs(tmp_path):
    (tmp_path / "afile").write_text("")
    done = run_in_process("measure/benchmark.py", "--configs", "cpu", "--repeats", "1", "--epochs", "1",
                          "--out", tmp_path / "afile" / "results.json",
                          "--runs-dir", tmp_path / "runs")
    assert_one_line_error(done, "--out", "cannot be written: Not a directory")
    assert not (tmp_path / "runs").exists()


def test_the_benchmark_keeps_each_repeat_as_it_goes(tmp_path, monkeypatch):
    """Interrupted in its second repeat, the results file holds the first."""
    def measure_once(run, overwrite, timeout_s, echo=print):
        if run.get("repeats"):
            raise KeyboardInterrupt
        run["repeats"] = [{"wall_s": 1.5, "startup_s": 0.5, "steady_samples_per_s": [100.0],
                           "test_accuracy": 0.1}]
        run["status"] = "measured"
    monkeypatch.setattr(benchmark, "measure", measure_once)
    settings = benchmark.settings_for("smoke", 0, str(tmp_path / "data"), dataset="synthetic",
                                      repeats=2)
    out = tmp_path / "results.json"
    with pytest.raises(KeyboardInterrupt):
        benchmark.run_benchmark(["cpu"], settings, out, tmp_path / "runs", echo=lambda line: None)
    results = benchmark.load_results(out)
    assert results["finished"] is False
    assert [run["repeats"][0]["wall_s"] for run in results["runs"]] == [1.5]


# --- What OUT holds, told apart ---------------------------------------------------------------
def test_a_folder_holding_only_a_run_json_is_not_taken_over(tmp_path):
    (tmp_path / SUMMARY).write_text('{"mine": 1}')
    result = run_in_process("train_single.py", *RUN, "--epochs", "1", "--out", tmp_path)
    assert_one_line_error(result, "already holds a run; pass --resume")
    result = run_in_process("train_single.py", *RUN, "--epochs", "1", "--resume", "--out", tmp_path)
    assert_one_line_error(result, f"holds a {SUMMARY} but no {CHECKPOINT}", "--overwrite")
    assert (tmp_path / SUMMARY).read_text() == '{"mine": 1}'


def test_an_overwrite_that_stops_in_epoch_1_leaves_no_old_checkpoint(finished, tmp_path):
    out = copy_of(finished, tmp_path)
    failed = run_in_process("train_single.py", *RUN, "--lr", "1e30", "--overwrite", "--out", out)
    assert failed.returncode == 1 and "the loss became nan or inf at epoch 1" in failed.stderr
    assert not (out / CHECKPOINT).exists() and logged_epochs(out) == []
    result = run_in_process("train_single.py", *RUN, "--epochs", "1", "--resume", "--out", out)
    assert result.returncode == 0 and "resuming" not in result.stdout, result.stdout


def test_a_finished_1_epoch_run_without_its_checkpoint_is_refused(tmp_path):
    """Epoch 1 and run.json: a finished run, not a crash before its first checkpoint."""
    out_dir.append_metrics(tmp_path, {"epoch": 1})
    (tmp_path / SUMMARY).write_text("{}")
    before = files_in(tmp_path)
    result = run_in_process("train_single.py", *RUN, "--epochs", "3", "--resume", "--out", tmp_path)
    assert_one_line_error(result, f"holds epochs [1] but no {CHECKPOINT}")
    assert files_in(tmp_path) == before
    (tmp_path / SUMMARY).unlink()  # the crash case: trained again, and said so
    result = run_in_process("train_single.py", *RUN, "--epochs", "1", "--resume", "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"holds epoch 1 but not its {CHECKPOINT}" in result.stdout


def test_a_resume_with_another_seed_is_refused(finished, tmp_path):
    out = copy_of(finished, tmp_path)
    result = run_in_process("train_single.py", *RUN, "--epochs", "3", "--seed", "7", "--resume",
                            "--out", out)
    assert_one_line_error(result, "was trained with --seed 0 and this run asks for 7")


def test_a_resume_on_other_data_than_the_epochs_kept_is_refused(finished, tmp_path):
    """Epochs trained on the synthetic fallback, resumed where CIFAR-10 now loads."""
    out = copy_of(finished, tmp_path)
    rows = [{**row, "dataset": "synthetic (fallback)"} for row in metrics_rows(out)]
    (out / METRICS).write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = run_in_process("train_single.py", *RUN, "--epochs", "3", "--resume", "--out", out)
    assert_one_line_error(result, "was trained on synthetic (fallback) data and this run loaded "
                                  "synthetic: pass --overwrite")
    assert logged_epochs(out) == [1, 2]
    assert (out / SUMMARY).exists() and (out / CHECKPOINT).exists()  # the finished run, whole


def _fsdp_folder(out, epoch, args):
    folder = out / SHARDED_CHECKPOINT
    folder.mkdir(parents=True)
    info = {"epoch": epoch, "identity": fsdp_out_dir.sharded_identity(args), "lr": 0.01,
            "momentum": 0.9, "world_size": 1, "global_batch_size": 32}
    (folder / fsdp_out_dir.CHECKPOINT_INFO).write_text(json.dumps(info))


def test_fsdp_and_the_other_scripts_do_not_resume_each_other_s_runs(finished, tmp_path):
    out = copy_of(finished, tmp_path)  # a train_single.py run, resumed by train_fsdp.py
    args = build_parser("test").parse_args([*RUN, "--resume", "--epochs", "4", "--out", str(out)])
    args.width, args.depth = 8, 2
    with pytest.raises(UsageError, match=r"holds a run of another script \(single"):
        fsdp_out_dir.prepare_out_dir(args, 32)
    _fsdp_folder(out, 1, args)  # checkpoint.pt and metrics trained on past the sharded epoch 1
    with pytest.raises(UsageError, match=r"trained on to epoch 2 by another script, past its "
                                         r"checkpoint.dcp \(epoch 1\)"):
        fsdp_out_dir.prepare_out_dir(args, 32)
    result = run_in_process("train_single.py", *RUN, "--epochs", "3", "--resume", "--out", out)
    assert_one_line_error(result, "holds a train_fsdp.py run (checkpoint.dcp): resume it with "
                                  "train_fsdp.py")


def test_fsdp_s_whole_checkpoint_records_how_it_was_trained(tmp_path, monkeypatch):
    args = build_parser("test").parse_args([*RUN, "--out", str(tmp_path)])
    args.width, args.depth = 8, 2
    _fsdp_folder(tmp_path, 2, args)
    monkeypatch.setattr(fsdp_out_dir, "full_state", lambda model, optimizer: ({}, {}))
    monkeypatch.setattr(fsdp_out_dir.dist, "get_rank", lambda: 0)
    fsdp_out_dir.export_full_checkpoint(args, None, None)
    trained = torch.load(tmp_path / CHECKPOINT, weights_only=True)["trained"]
    assert trained["global_batch_size"] == 32 and trained["train_samples"] == 512


def test_the_claim_is_a_lock_on_a_file_which_network_disks_share(tmp_path, monkeypatch, capsys):
    """NFS shares a file's flock between its clients, not a folder's; no lock at all (flock
    refused: ENOLCK) is said in one line, and the run goes on."""
    out = tmp_path / "run"
    out_dir.claim_out_dir(out)
    try:
        with open(out / out_dir.LOCK, "w") as other:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        let_go_of_folders()

    def no_locks(descriptor, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
    monkeypatch.setattr(out_dir.fcntl, "flock", no_locks)
    out_dir.claim_out_dir(tmp_path / "other")
    let_go_of_folders()
    assert capsys.readouterr().out == (f"[rank 0] {tmp_path / 'other'} cannot be locked (No locks "
                                       "available): nothing stops another run from writing there\n")



def test_letting_go_removes_only_the_folders_the_claim_made(tmp_path):
    """An --out written with `..` names folders that are not its parents: an empty one that
    was there stays; "new", which the claim made to get through it, goes."""
    (tmp_path / "existing").mkdir()
    out_dir.claim_out_dir(tmp_path / "new" / ".." / "existing" / ".." / "made" / "run")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["existing", "made", "new"]
    (tmp_path / "made" / "run" / "metrics.jsonl").write_text("")  # the script wrote there
    let_go_of_folders()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["existing", "made"]
    out_dir.claim_out_dir(tmp_path / "existing" / ".." / "empty")
    let_go_of_folders()  # nothing written: the folder it made goes, "existing" stays
    assert sorted(path.name for path in tmp_path.iterdir()) == ["existing", "made"]

def test_a_run_json_that_cannot_be_written_says_the_training_is_saved(tmp_path, monkeypatch):
    real = out_dir.write_atomically

    def full_disk_for_the_summary(path, write, mode="wb"):
        if Path(path).name != SUMMARY:
            return real(path, write, mode)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(out_dir, "write_atomically", full_disk_for_the_summary)
    result = run_in_process("train_single.py", *RUN, "--epochs", "1", "--out", tmp_path)
    assert result.returncode == 1 and result.stderr.splitlines() == [
        f"error: cannot write {SUMMARY} in {tmp_path} (No space left on device); the training "
        f"is saved: {METRICS} and {CHECKPOINT} of the last epoch are whole"], result.stderr
    assert logged_epochs(tmp_path) == [1] and (tmp_path / CHECKPOINT).exists()


def test_a_sharded_save_that_fails_says_what_was_kept(tmp_path, monkeypatch):
    """A disk that fills while DCP writes epoch 2's shards: one line, the half-written
    checkpoint.dcp.next gone, epoch 1's checkpoint.dcp whole."""
    args = build_parser("test").parse_args([*RUN, "--epochs", "3", "--out", str(tmp_path)])
    args.width, args.depth = 8, 2
    _fsdp_folder(tmp_path, 1, args)

    def full_disk(state, checkpoint_id):
        Path(checkpoint_id).mkdir()
        (Path(checkpoint_id) / "__0_0.distcp").write_bytes(b"half")
        raise CheckpointException("save", {0: (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
                                               None)})
    monkeypatch.setattr(fsdp_out_dir.dcp, "save", full_disk)
    monkeypatch.setattr(fsdp_out_dir, "get_state_dict", lambda model, optimizer: ({}, {}))
    monkeypatch.setattr(fsdp_out_dir, "bytes_per_rank", lambda *held: {})
    monkeypatch.setattr(fsdp_out_dir.dist, "get_rank", lambda: 0)
    totals = torch.tensor([1.0, 4.0, 1.0], dtype=torch.float64)
    with pytest.raises(RunStopped) as stopped:
        fsdp_out_dir.save_epoch(args, 2, None, None, totals, totals, 1.0,
                                {"device": "cpu", "global_batch_size": 32})
    assert str(stopped.value) == (f"cannot save epoch 2 in {tmp_path} (No space left on device); "
                                  f"{SHARDED_CHECKPOINT} of epoch 1 is whole: --resume continues "
                                  "from it")
    assert sorted(p.name for p in tmp_path.iterdir()) == [SHARDED_CHECKPOINT, METRICS]


@pytest.mark.timeout(120)
def test_a_rank_that_never_comes_is_one_line(tmp_path):
    """WORLD_SIZE=2 set by hand, rank 1 never started: rank 0 waits --timeout-s, then says so.
    In a process of its own: a group that failed to form leaves torch.distributed's state
    such that a later FSDP run in the same process cannot find its group."""
    import socket
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = {**os.environ, "LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    result = subprocess.run([sys.executable, str(ROOT / "ddp_scripts" / "train_ddp.py"), *RUN,
                             "--timeout-s", "2", "--out", str(tmp_path / "run")],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 1 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("[rank 0] error: 1 of 2 ranks joined within --timeout-s 2 ("), \
        result.stderr


def test_a_download_the_other_ranks_wait_for_ends_within_half_their_timeout(monkeypatch):
    """Under torchrun --timeout-s 10, rank 0 gives up a stalled CIFAR-10 download after 5 s,
    not 300 s: the others, waiting in a collective, would fail first, each in a traceback."""
    from ddp_scripts import cifar10, ranks
    assert cifar10.download_limits() == (cifar10.DOWNLOAD_TIMEOUT_S, cifar10.STALL_S)
    monkeypatch.setitem(ranks.GROUP, "timeout_s", 10)
    monkeypatch.setattr(cifar10.dist, "is_initialized", lambda: True)
    assert cifar10.download_limits() == (5, 5)
    assert cifar10.fetch_archive.__defaults__ == (None, None, None)  # the limits are read then


def test_an_out_that_links_nowhere_says_so(tmp_path):
    (tmp_path / "run").symlink_to(tmp_path / "gone")
    result = run_in_process("train_single.py", *RUN, "--out", tmp_path / "run")
    assert_one_line_error(result, f"--out {tmp_path / 'run'} is a link to {tmp_path / 'gone'}, "
                                  "which does not exist")
    assert not (tmp_path / "gone").exists()


def test_the_benchmark_checks_its_runs_dir_before_anything_runs(tmp_path):
    (tmp_path / "afile").write_text("")
    done = run_in_process("measure/benchmark.py", "--configs", "cpu", "--repeats", "1",
                          "--epochs", "1", "--out", tmp_path / "results.json",
                          "--runs-dir", tmp_path / "afile" / "runs")
    assert_one_line_error(done, "--runs-dir", "cannot be written: Not a directory")
    assert not (tmp_path / "results.json").exists()


def test_a_rank_that_loses_its_peer_says_so_in_one_line(tmp_path, monkeypatch):
    """gloo's error on the rank left when another is killed mid-collective (SIGKILL)."""
    from ddp_scripts import data

    def peer_killed(*args, **kwargs):
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
                           "[127.0.0.1]:6539: Connection reset by peer. This is typically "
                           "caused by a remote process exiting")  # said once, by the line
    monkeypatch.setattr(data, "load_datasets", peer_killed)
    result = run_in_process("train_single.py", *RUN, "--out", tmp_path / "run")
    assert result.returncode == 1 and result.stderr.splitlines() == [
        "error: another rank ended first (RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:545] "
        "Read error [127.0.0.1]:6539: Connection reset by peer); its own output, or torchrun's "
        "exit code for it, says why; the last checkpoint saved, if any, is whole"], result.stderr


def test_more_synthetic_images_than_memory_is_one_line(tmp_path):
    result = run_in_process("train_single.py", *RUN, "--train-samples", "1000000000000",
                            "--out", tmp_path / "run")
    assert_one_line_error(result, "synthetic images do not fit in this machine's memory",
                          "can't allocate memory", "lower --train-samples")
