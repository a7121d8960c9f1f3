"""The rarer ways a run cannot start or go on, each said in one line.

Imported inside the branch that meets one, so that a reader who follows a run that goes as
planned does not read them: a rank that never joined, a folder that cannot be locked, a
resume without its checkpoint, a run.json that cannot be written. (Another rank that ended
first, and SIGTERM, are run_cli's: cli.py.)
"""
import os

from ddp_scripts.cli import RunStopped, UsageError, first_line, say
from ddp_scripts.runfiles import CHECKPOINT, METRICS, SUMMARY, logged_epochs, metrics_rows


def ranks_missing(error, timeout_s):
    """The RunStopped for a process group that did not form: the store says how many came."""
    import re
    joined = re.search(r"(\d+)/(\d+) clients joined", str(error))
    who = f"{joined[1]} of {joined[2]} ranks" if joined else "not every rank"
    return RunStopped(f"{who} joined within --timeout-s {timeout_s:g} ({first_line(error)}): "
                      "start every rank, with the same MASTER_ADDR and MASTER_PORT")


def unlocked(out, descriptor, error):
    """No lock to be had on OUT/.lock (a file system without flock, or no fcntl on Windows):
    said in one line; returns the descriptor to hold, None."""
    os.close(descriptor)
    reason = "no flock here" if isinstance(error, AttributeError) else error.strerror or error
    say(f"{out} cannot be locked ({reason}): nothing stops another run from writing there")


def check_same_data(out, source):
    """After start_out_dir: the epochs kept were trained on `source`, the data this run loaded
    (not so if CIFAR-10 was placed, or lost, since a run fell back to the synthetic set)."""
    trained_on = {row.get("dataset", source) for row in metrics_rows(out)}
    if trained_on - {source}:
        raise UsageError(f"{out} was trained on {', '.join(sorted(trained_on))} data and this "
                         f"run loaded {source}: pass --overwrite to start again on it")


def start_again_without_checkpoint(out):
    """--resume, and OUT has no checkpoint: start fresh (None) only if nothing trained is
    lost. Epoch 1 logged, no run.json: a crash after epoch 1 was logged, before its
    checkpoint."""
    logged = logged_epochs(out)
    if logged == [1] and not (out / SUMMARY).exists():
        say(f"{out} holds epoch 1 but not its {CHECKPOINT} (cut short before it was saved): "
            "training from epoch 1 again")
    elif logged or (out / SUMMARY).exists():
        held = f"epochs {logged}" if logged else f"a {SUMMARY}"
        raise UsageError(f"{out} holds {held} but no {CHECKPOINT}: restore it, "
                         "or pass --overwrite to start again")
    return None


def summary_not_written(out, error):
    """A run.json that cannot be written (a full disk, say): the training itself is saved."""
    return RunStopped(f"cannot write {SUMMARY} in {out} ({error.strerror or error}); the "
                      f"training is saved: {METRICS} and {CHECKPOINT} of the last epoch are "
                      "whole")


def too_many_images(images, error):
    """The UsageError for a synthetic set the memory cannot hold (the allocator's error says
    how many bytes it was asked for); any other error, as it is."""
    if "can't allocate memory" not in str(error):
        return error
    return UsageError(f"{images:,} synthetic images do not fit in this machine's memory "
                      f"({first_line(error)[:200]}): lower --train-samples or --test-samples")
