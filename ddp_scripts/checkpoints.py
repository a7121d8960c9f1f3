"""The run's folder, OUT: metrics.jsonl and checkpoint.pt, never overwritten by accident.

prepare_out_dir claims OUT before any work starts (no other run may write there meanwhile),
and start_out_dir sets it up. After each epoch, save_epoch logs the epoch and saves the
checkpoint that covers it, unless the loss stopped being finite (stop_if_loss_not_finite);
resume_from loads that checkpoint into a new run, which must train as the saved one did.
The files' names are in runfiles.py.
"""
import json
import math
import os
from pathlib import Path

import torch
import torch.distributed as dist

from ddp_scripts.cli import HELD_FOLDERS, NothingToDo, RunStopped, UsageError, cannot_write, say
from ddp_scripts.ranks import world_size
from ddp_scripts.runfiles import CHECKPOINT, METRICS, SHARDED_CHECKPOINT, SUMMARY, metrics_rows

try:
    import fcntl
except ImportError:  # Windows: no flock, and OUT is not claimed
    fcntl = None

LOCK = ".lock"  # in OUT: the file a run holds OUT by; left in place, empty, when the run ends


def claim_out_dir(out):
    """Make OUT, check that it can be written, and hold it until the script ends.

    The hold is an exclusive flock on OUT/.lock (a file: NFS shares its flock between clients,
    not a folder's): a second run into OUT is refused while this one runs. run_cli lets go
    when the script ends, and the kernel when the process ends, however it ends.
    """
    out = Path(out)
    if out.is_symlink() and not out.exists():
        raise UsageError(f"--out {out} is a link to {os.readlink(out)}, which does not exist")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a directory")
    probe = out / f".{METRICS}.tmp{os.getpid()}"  # the name write_atomically uses: see start_out_dir
    made = [folder for folder in (out, *out.parents) if not folder.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise cannot_write("--out", out, error) from None
    key = os.path.realpath(out)
    if key in HELD_FOLDERS:
        return
    descriptor = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise UsageError(f"{out} is in use by another run, still running: wait for it to end, "
                         "or choose another --out") from None
    except (OSError, AttributeError) as error:  # AttributeError: no fcntl (Windows)
        from ddp_scripts.mishaps import unlocked
        descriptor = unlocked(out, descriptor, error)
    HELD_FOLDERS[key] = (descriptor, made, out / LOCK)


def training_settings(args):
    """What a resumed run must share with the run it continues, besides run_identity: the
    optimizer's settings and the data each step sees. The number of ranks may change, if
    the global batch stays the same (see check_same_training)."""
    return {"lr": args.lr, "momentum": args.momentum, "train_samples": args.train_samples,
            "seed": args.seed, "global_batch_size": args.batch_size * world_size(),
            "batch_size": args.batch_size, "world_size": world_size()}


def check_same_training(saved, args, where):
    """Refuse, in one line, a resume whose options would train differently from the run in
    `where`. `saved`: training_settings of that run (older checkpoints lack some: not checked)."""
    now = training_settings(args)
    for option in ("lr", "momentum", "train_samples", "seed"):
        if option in saved and saved[option] != now[option]:
            flag = "--" + option.replace("_", "-")
            raise UsageError(f"{where} was trained with {flag} {saved[option]} and this run "
                             f"asks for {now[option]}: pass {flag} {saved[option]} to continue "
                             "that training, or --overwrite to start again")
    batch = saved.get("global_batch_size")
    if batch is not None and batch != now["global_batch_size"]:
        per_rank, ranks = divmod(batch, now["world_size"])
        fix = (f"pass --batch-size {per_rank} to continue it on {now['world_size']} rank(s)"
               if ranks == 0 and per_rank else f"run it on {saved['world_size']} rank(s)")
        raise UsageError(f"{where} was trained with a global batch of {batch} "
                         f"({saved['world_size']} rank(s) of {saved['batch_size']}) and this "
                         f"run's is {now['global_batch_size']}: {fix}, or --overwrite to start again")


def prepare_out_dir(args):
    """Claim OUT before any work starts, and check what it holds. Returns the checkpoint to
    resume from, or None.

    Under DDP rank 0 calls it (see on_rank_0) and tells the others what it found.
    """
    out = Path(args.out)
    claim_out_dir(out)
    holds_run = any((out / name).exists() for name in (METRICS, CHECKPOINT, SUMMARY))
    if holds_run and not (args.resume or args.overwrite):
        raise UsageError(f"{out} already holds a run; pass --resume to continue it, "
                         "--overwrite to replace it, or choose another --out")
    if not args.resume:
        return None
    if (out / SHARDED_CHECKPOINT).exists():
        raise UsageError(f"{out} holds a train_fsdp.py run ({SHARDED_CHECKPOINT}): resume it "
                         "with train_fsdp.py, or pass --overwrite to start again")
    if not (out / CHECKPOINT).exists():
        from ddp_scripts.mishaps import start_again_without_checkpoint
        return start_again_without_checkpoint(out)
    checkpoint = load_checkpoint(out / CHECKPOINT, expect=run_identity(args))
    stop_if_nothing_to_do(checkpoint["epoch"], args, out / CHECKPOINT)
    group = checkpoint["optimizer"].get("param_groups", [{}])[0]
    saved = {key: group[key] for key in ("lr", "momentum") if key in group}
    check_same_training({**checkpoint.get("trained", {}), **saved}, args, out / CHECKPOINT)
    return checkpoint


def stop_if_nothing_to_do(epoch, args, where):
    """A resume whose checkpoint is already at --epochs: say so, and leave OUT as it is."""
    if epoch >= args.epochs:
        raise NothingToDo(f"{where} is at epoch {epoch}, and --epochs is {args.epochs}: "
                          "nothing to train, the run is left as it is (pass a larger --epochs "
                          "to train on)")


def start_out_dir(args, checkpoint):
    """Set up OUT: keep only the epochs the checkpoint has, or start empty (--overwrite).

    After a crash OUT may hold an epoch logged just before its checkpoint was due (it is
    trained again, so its line goes), half a line, or the temporary file of a save that
    never finished: none of them survives here. Other files in OUT are left alone.
    """
    out = Path(args.out)
    claim_out_dir(out)
    kept = []
    if checkpoint is not None:
        kept = [row for row in metrics_rows(out) if row["epoch"] <= checkpoint["epoch"]]
    write_atomically(out / METRICS, lambda f: f.write("".join(json.dumps(row) + "\n"
                                                              for row in kept)), mode="w")
    if checkpoint is None:  # --overwrite: the replaced run's summary and checkpoint would
        (out / SUMMARY).unlink(missing_ok=True)     # look like ours (prepare_out_dir let only
        (out / CHECKPOINT).unlink(missing_ok=True)  # a run's own through)
    for name in (METRICS, CHECKPOINT, SUMMARY):  # what write_atomically leaves when cut short
        for unfinished in out.glob(f".{name}.tmp*"):
            if unfinished.name.removeprefix(f".{name}.tmp").isdigit():
                unfinished.unlink(missing_ok=True)


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


def run_identity(args):
    """What must match for a checkpoint to belong to this run."""
    return {"model": args.model, "dataset": args.dataset, "dtype": args.dtype}


def save_checkpoint(out, model, optimizer, epoch, args):
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "epoch": epoch, "identity": run_identity(args), "trained": training_settings(args)}
    write_atomically(Path(out) / CHECKPOINT, lambda f: torch.save(state, f))


def os_error_in(error):
    """The OSError behind `error`, if any (torch.save reports a full disk as a RuntimeError
    raised while handling it)."""
    while error is not None and not isinstance(error, OSError):
        error = error.__cause__ or error.__context__
    return error


def load_checkpoint(path, expect=None):
    """Load on the CPU (`map_location`), tensors only (`weights_only`), checked."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except OSError as error:  # no permission, say
        raise UsageError(f"cannot read checkpoint {path}: {error.strerror or error}") from None
    except Exception:  # not a zip of tensors, or one cut short, or objects of another program's
        raise UsageError(f"cannot read checkpoint {path}: not a PyTorch checkpoint of tensors "
                         "(damaged, or another program's); use another --out or --overwrite") from None
    if not isinstance(state, dict) or not {"model", "optimizer", "epoch"} <= state.keys():
        raise UsageError(f"{path} is not a checkpoint of these scripts "
                         "(expected the keys model, optimizer and epoch)")
    if expect is not None and state.get("identity", expect) != expect:
        raise UsageError(f"{path} belongs to another run ({state['identity']}), not {expect}; "
                         "use another --out or --overwrite")
    return state


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


def stop_if_loss_not_finite(train_totals, epoch):
    """After an epoch's training, before anything of it is saved: if the loss became nan or
    inf, stop the run (on every rank), in one line that names the epoch and the step; the
    checkpoint of the last good epoch stays.

    train_one_epoch's totals, on the device: (sum of losses, samples, steps before that sum
    stopped being finite). The CPU reads one number per epoch, not the loss at every step.
    Under DDP the ranks agree on the earliest bad step (one all_reduce of one number)."""
    first_bad_step = (train_totals[2] + 1).where(~train_totals[0].isfinite(), math.inf)
    first_bad_step = first_bad_step.reshape(1)
    if dist.is_initialized():
        dist.all_reduce(first_bad_step, op=dist.ReduceOp.MIN)
    step = first_bad_step.item()
    if math.isfinite(step):
        raise RunStopped(f"the loss became nan or inf at epoch {epoch}, step {step:.0f}: lower "
                         f"--lr (nothing of epoch {epoch} was saved: the checkpoint, if there "
                         "is one, holds the epoch before)")


def save_epoch(args, epoch, model, optimizer, train_totals, test_totals, epoch_time_s, context):
    """Log the epoch to metrics.jsonl, then save the checkpoint that covers it, then say so."""
    record = epoch_record(epoch, train_totals, test_totals, epoch_time_s, **context)
    try:
        append_metrics(args.out, record)
        save_checkpoint(args.out, model, optimizer, epoch, args)
    except Exception as error:
        cause = os_error_in(error)
        if cause is None:
            raise
        kept = (f"{CHECKPOINT} of epoch {epoch - 1} is whole: --resume continues from it"
                if epoch > 1 and (Path(args.out) / CHECKPOINT).exists() else "no checkpoint was saved yet")
        raise RunStopped(f"cannot save epoch {epoch} in {args.out} ({cause.strerror or cause}); "
                         f"{kept}") from None
    say(f"epoch {epoch}/{args.epochs} train_loss={record['train_loss']:.4f} "
        f"test_accuracy={record['test_accuracy']:.4f} samples/s={record['samples_per_s']:.0f}")


def resume_from(checkpoint, model, optimizer, out):
    """Load a checkpoint (or None) into the model and optimizer; returns the first epoch to run."""
    if checkpoint is None:
        return 1
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])  # lr and momentum: checked to be the options'
    saved_by = checkpoint.get("trained", {}).get("world_size", world_size())
    ranks = f" (saved by {saved_by} rank(s), loaded by {world_size()})" if saved_by != world_size() else ""
    say(f"resuming after epoch {checkpoint['epoch']} from {out}{ranks}")
    return checkpoint["epoch"] + 1
