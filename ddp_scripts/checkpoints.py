"""The run's folder, OUT: metrics.jsonl and checkpoint.pt, never overwritten by accident.

prepare_out_dir checks OUT before any work starts, and start_out_dir makes it. After each
epoch, save_epoch logs the epoch and saves the checkpoint that covers it; resume_from loads
that checkpoint into a new run. The files' names are in runfiles.py.
"""
import json
import os
from pathlib import Path

import torch

from ddp_scripts.cli import UsageError, first_line, say
from ddp_scripts.runfiles import CHECKPOINT, METRICS, SUMMARY, metrics_rows


def prepare_out_dir(args):
    """Check OUT before any work starts. Returns the checkpoint to resume from, or None.

    Only reads: under DDP rank 0 calls it (see on_rank_0) and tells the others what it found.
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
    """Create OUT; keep only the epochs the checkpoint has, or start empty.

    After a crash OUT may hold an epoch logged just before its checkpoint was due (it is
    trained again, so its line goes), half a line, or the temporary file of a save that
    never finished: none of them survives here.
    """
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kept = []
    if checkpoint is not None:
        kept = [row for row in metrics_rows(out) if row["epoch"] <= checkpoint["epoch"]]
    write_atomically(out / METRICS, lambda f: f.write("".join(json.dumps(row) + "\n"
                                                              for row in kept)), mode="w")
    (out / SUMMARY).unlink(missing_ok=True)
    for unfinished in out.glob(".*.tmp*"):  # see write_atomically
        unfinished.unlink(missing_ok=True)


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
        raise UsageError(f"cannot read checkpoint {path}: {first_line(error)[:200]}") from None
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


def save_epoch(args, epoch, model, optimizer, train_totals, test_totals, epoch_time_s, context):
    """Log the epoch to metrics.jsonl, then save the checkpoint that covers it, then say so."""
    record = epoch_record(epoch, train_totals, test_totals, epoch_time_s, **context)
    append_metrics(args.out, record)
    save_checkpoint(args.out, model, optimizer, epoch, args)
    say(f"epoch {epoch}/{args.epochs} train_loss={record['train_loss']:.4f} "
        f"test_accuracy={record['test_accuracy']:.4f} samples/s={record['samples_per_s']:.0f}")


def resume_from(checkpoint, model, optimizer, out):
    """Load a checkpoint (or None) into the model and optimizer; returns the first epoch to run."""
    if checkpoint is None:
        return 1
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    say(f"resuming after epoch {checkpoint['epoch']} from {out}")
    return checkpoint["epoch"] + 1
