"""The run's folder, OUT: metrics.jsonl, checkpoint.pt and run.json, never overwritten by
accident.

prepare_out_dir claims OUT before any work starts (no other run may write there meanwhile),
and start_out_dir sets it up. After each epoch, save_epoch logs the epoch, with how the run
was made (run_context), and saves the checkpoint that covers it, unless the loss stopped
being finite (stop_if_loss_not_finite); resume_from loads that checkpoint into a new run,
which must train as the saved one did (resume.py). Once the run has finished, write_summary
writes run.json. The files' names are in runfiles.py.
"""
import contextlib
import json
import math
import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule

from ddp_scripts.cli import HELD_FOLDERS, UsageError, say
from ddp_scripts.devices import say_device
from ddp_scripts.hardware import describe_hardware, seconds_since_start
from ddp_scripts.ranks import on_rank_0, world_size
from ddp_scripts.runfiles import CHECKPOINT, METRICS, SHARDED_CHECKPOINT, SUMMARY, holds_a_run

try:
    import fcntl
except ImportError:  # Windows: no flock, and OUT is not claimed
    fcntl = None

LOCK = ".lock"  # in OUT: the file a run holds OUT by, while it runs


def claim_out_dir(out):
    """Make OUT, check that it can be written, and hold it until the script ends: an
    exclusive flock on OUT/.lock (a file: NFS shares a file's flock between clients) refuses
    a second run into OUT while this one runs. run_cli lets go, as does the end of the process."""
    out = Path(out)
    made = [path for path in (out, *out.parents) if not os.path.exists(os.path.realpath(path))]
    probe = out / f".{METRICS}.tmp{os.getpid()}"  # the name write_atomically uses: see start_out_dir
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:  # a file there, a read-only disk, no permission: one line
        from ddp_scripts.mishaps import cannot_make
        raise cannot_make(out, error) from None
    if os.path.realpath(out) not in HELD_FOLDERS:
        HELD_FOLDERS[os.path.realpath(out)] = (hold(out / LOCK), made, out / LOCK)


def hold(lock):
    """An open descriptor of `lock`, flocked; None where no lock can be had (said once)."""
    while True:
        try:
            descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as error:  # OUT removed meanwhile, or .lock a folder or a broken link
            from ddp_scripts.mishaps import lock_not_opened
            lock_not_opened(lock, error)  # makes OUT again, or raises
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (OSError, AttributeError) as error:  # held (BlockingIOError), or no flock here
            from ddp_scripts.mishaps import not_locked
            return not_locked(lock.parent, descriptor, error, say)
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(descriptor), os.stat(lock)):
                return descriptor
        os.close(descriptor)  # a run that held it removed it as it let go: take the new one


def run_identity(args):
    """What must match for a checkpoint to belong to this run."""
    return {"model": args.model, "dataset": args.dataset, "dtype": args.dtype}


def training_settings(args):
    """What a resumed run must share with the run it continues, besides run_identity: the
    optimizer's settings and the data each step sees (resume.checkpoint_to_resume)."""
    return {"lr": args.lr, "momentum": args.momentum, "train_samples": args.train_samples,
            "seed": args.seed, "global_batch_size": args.batch_size * world_size(),
            "batch_size": args.batch_size, "world_size": world_size()}


def prepare_out_dir(args):
    """Claim OUT before any work starts, and check what it holds. Returns the checkpoint to
    resume from, or None. Under DDP rank 0 calls it (on_rank_0) and tells the others."""
    out = Path(args.out)
    claim_out_dir(out)
    refuse_odd_files(out)
    if holds_a_run(out) and not (args.resume or args.overwrite):
        raise UsageError(f"{out} already holds a run; pass --resume to continue it, "
                         "--overwrite to replace it, or choose another --out")
    if not args.resume:
        return None
    from ddp_scripts.resume import checkpoint_to_resume  # the checks of a resume, only then
    return checkpoint_to_resume(out, args.epochs, run_identity(args), training_settings(args))


def refuse_odd_files(out):
    """One line, before any work, where a name of the run's files is taken by a folder (or a
    socket, say): neither a resume nor --overwrite could go on with it."""
    for name in (METRICS, CHECKPOINT, SUMMARY):
        if (out / name).exists() and not (out / name).is_file():
            raise UsageError(f"{out / name} is not a file: move it away, or choose another --out")


def start_out_dir(args, checkpoint):
    """Set up OUT: keep only the epochs the checkpoint has, or start empty (--overwrite). An
    epoch logged after the checkpoint (trained again), or the temporary file of an unfinished
    save, left by a crash: none survives. A damaged line of the epochs kept is refused."""
    out = Path(args.out)
    claim_out_dir(out)
    kept = []
    if args.resume:  # the epochs logged up to its checkpoint, each whole and once
        from ddp_scripts.resume import metrics_to_keep
        kept = metrics_to_keep(out, checkpoint["epoch"] if checkpoint is not None else 0)
    write_atomically(out / METRICS, lambda f: f.writelines(json.dumps(row) + "\n" for row in kept),
                     mode="w")
    if checkpoint is None:  # --overwrite: the replaced run's files would look like ours
        (out / SUMMARY).unlink(missing_ok=True)
        (out / CHECKPOINT).unlink(missing_ok=True)
        for suffix in ("", ".old", ".next"):  # train_fsdp.py's sharded checkpoint
            remove(out / (SHARDED_CHECKPOINT + suffix))
    for name in (METRICS, CHECKPOINT, SUMMARY):  # what write_atomically leaves when cut short
        for unfinished in out.glob(f".{name}.tmp*"):
            if unfinished.name.removeprefix(f".{name}.tmp").isdigit():
                unfinished.unlink(missing_ok=True)


def remove(path):
    """A file, a link (not what it points to) or a folder with all it holds, if there."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def append_metrics(out, record):
    """Append one epoch; flushed to disk before the checkpoint that covers it is written."""
    (Path(out) / SUMMARY).unlink(missing_ok=True)  # a resumed run's: a refused resume kept it
    with open(Path(out) / METRICS, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def write_atomically(path, write, mode="wb"):
    """Write to a temporary file, then rename: a crash mid-write leaves the old file whole."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, say: the old file stays, and no half-written one
        tmp.unlink(missing_ok=True)
        raise


def save_checkpoint(out, model, optimizer, epoch, args):
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "epoch": epoch, "identity": run_identity(args), "trained": training_settings(args)}
    write_atomically(Path(out) / CHECKPOINT, lambda f: torch.save(state, f))


def epoch_record(epoch, train_totals, test_totals, epoch_time_s, **context):
    """One line of metrics.jsonl."""
    train_loss, train_seen = train_totals.tolist()[:2]
    test_loss, correct, test_seen = test_totals.tolist()
    return {"epoch": epoch, "train_loss": train_loss / train_seen, "test_loss": test_loss / test_seen,
            "test_accuracy": correct / test_seen, "epoch_time_s": epoch_time_s,
            "samples_per_s": train_seen / epoch_time_s, "train_samples": int(train_seen),
            "test_samples": int(test_seen), **context}


def stop_if_loss_not_finite(train_totals, epoch):
    """If the loss became nan or inf, stop every rank before anything of the epoch is saved.
    train_totals: (sum of losses, samples, steps before that sum stopped being finite), read
    once per epoch; the ranks agree on the earliest bad step (one all_reduce of one number)."""
    first_bad_step = (train_totals[2] + 1).where(~train_totals[0].isfinite(), math.inf).reshape(1)
    if dist.is_initialized():
        dist.all_reduce(first_bad_step, op=dist.ReduceOp.MIN)
    step = first_bad_step.item()
    if math.isfinite(step):
        from ddp_scripts.mishaps import loss_not_finite
        raise loss_not_finite(epoch, step)


def save_epoch(args, epoch, model, optimizer, train_totals, test_totals, epoch_time_s, context):
    """Log the epoch to metrics.jsonl, then save the checkpoint that covers it, then say so."""
    record = epoch_record(epoch, train_totals, test_totals, epoch_time_s, **context)
    try:
        append_metrics(args.out, record)
        save_checkpoint(args.out, model, optimizer, epoch, args)
    except Exception as error:  # a full disk, say: one line that says what is kept
        from ddp_scripts.mishaps import cannot_save
        if (stopped := cannot_save(error, args.out, epoch)) is error:
            raise
        raise stopped from None
    say(f"epoch {epoch}/{args.epochs} train_loss={record['train_loss']:.4f} "
        f"test_accuracy={record['test_accuracy']:.4f} samples/s={record['samples_per_s']:.0f}")


def identical(state, other):
    """Whether two state dicts hold the same names and, bit for bit, the same tensors (their
    bytes compared: -0.0 is not 0.0 here, as torch.equal would have it)."""
    def bits(tensor):
        return tensor.detach().reshape(-1).contiguous().view(torch.uint8)
    return state.keys() == other.keys() and all(
        state[name].dtype == other[name].dtype and state[name].shape == other[name].shape
        and torch.equal(bits(state[name]), bits(other[name])) for name in state)


def resume_from(checkpoint, model, optimizer, out):
    """Load a checkpoint (or None) into the model and optimizer; returns the first epoch to run."""
    if checkpoint is None:
        return 1
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])  # lr and momentum: checked to be the options'
    saved_by = checkpoint.get("trained", {}).get("world_size", world_size())
    say(f"resuming after epoch {checkpoint['epoch']} from {out}" + (
        f" (saved by {saved_by} rank(s), loaded by {world_size()})" if saved_by != world_size() else ""))
    return checkpoint["epoch"] + 1


def strategy_of(model):
    """How the model is spread, read from its class: "dp", "ddp", "fsdp" or "single"."""
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper (train_fast.py --compile)
    if isinstance(model, nn.DataParallel):
        return "dp"
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return "ddp"
    return "fsdp" if isinstance(model, FSDPModule) else "single"


def run_context(args, device, model, threads, data_source, **levers):
    """What every line of metrics.jsonl records about how the run was made (`levers`: chapter
    10's options). Rank 0 also says where it trains, and checks a resume's data source."""
    if args.resume:
        from ddp_scripts.resume import check_same_data
        on_rank_0(check_same_data, args.out, data_source)
    processes = world_size()
    gpus = processes if device.type == "cuda" else 0
    if isinstance(model, nn.DataParallel):
        gpus = len(model.device_ids)
    say_device(device, args.device, processes, gpus)
    return {"world_size": processes, "device": str(device),
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "strategy": strategy_of(model), "gpus": gpus, "threads": threads,
            "batch_size": args.batch_size, "global_batch_size": args.batch_size * processes,
            "dtype": args.dtype, "tf32": args.tf32, "dataset": data_source, **levers}


def write_summary(out, model, device, train_start, args, **extra):
    """OUT/run.json, once the run has finished: times (start-up from the process's start),
    hardware, options; `extra`: more keys to record."""
    end = time.perf_counter()
    start = end - seconds_since_start()  # the process's start, on perf_counter's clock
    summary = {"strategy": strategy_of(model), "world_size": world_size(),
               "startup_s": train_start - start, "train_s": end - train_start,
               "total_s": end - start, "hardware": describe_hardware(device), "args": vars(args),
               **extra}
    try:
        write_atomically(Path(out) / SUMMARY, lambda f: json.dump(summary, f, indent=1), mode="w")
    except OSError as error:  # a full disk, say: the training itself is saved
        from ddp_scripts.mishaps import summary_not_written
        raise summary_not_written(out, error) from None
