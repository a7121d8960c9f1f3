"""Continuing a run (--resume): loading its checkpoint (load_checkpoint), and the checks that
the new run's options would train as the saved run did (what checkpoints.save_checkpoint
records of it), each refused in one line where they differ.

checkpoints.prepare_out_dir imports it only when a run resumes (checkpoint_to_resume).
"""
from pathlib import Path

import torch

from ddp_scripts.cli import NothingToDo, UsageError, say
from ddp_scripts.runfiles import (CHECKPOINT, METRICS, SHARDED_CHECKPOINT, SUMMARY, logged_epochs,
                                  metrics_lines, metrics_rows)


def load_checkpoint(path, expect=None):
    """Load on the CPU (`map_location`), tensors only (`weights_only`), checked: a checkpoint
    of these scripts, and of the run `expect` (run_identity) if given."""
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


def checkpoint_to_resume(out, epochs, identity, now):
    """--resume: the checkpoint in OUT, checked against this run's options (`identity`, `now`:
    checkpoints.run_identity and training_settings); or None (start from epoch 1) where
    nothing trained would be lost."""
    out = Path(out)
    if (out / SHARDED_CHECKPOINT).exists() or not (out / CHECKPOINT).exists():
        return start_again_without_checkpoint(out)  # train_fsdp.py's, or a crash before a save
    checkpoint = load_checkpoint(out / CHECKPOINT, expect=identity)
    check_resume(checkpoint, now, epochs, out / CHECKPOINT)
    metrics_to_keep(out, checkpoint["epoch"], quiet=True)
    return checkpoint


def check_resume(checkpoint, now, epochs, where):
    """What a resume's checkpoint fixes, against this run's options (`now`:
    checkpoints.training_settings): refused in one line where they differ."""
    stop_if_nothing_to_do(checkpoint["epoch"], epochs, where)
    group = checkpoint["optimizer"].get("param_groups", [{}])[0]
    saved = {key: group[key] for key in ("lr", "momentum") if key in group}
    check_same_training({**checkpoint.get("trained", {}), **saved}, now, where)


def stop_if_nothing_to_do(epoch, epochs, where):
    """A resume whose checkpoint is already at --epochs: say so, and leave OUT as it is."""
    if epoch >= epochs:
        raise NothingToDo(f"{where} is at epoch {epoch}, and --epochs is {epochs}: "
                          "nothing to train, the run is left as it is (pass a larger --epochs "
                          "to train on)")


def check_same_training(saved, now, where):
    """Refuse a resume whose options would train differently from the run in `where`.
    `saved`: the settings it was trained with (older checkpoints lack some: not checked).
    The number of ranks may change, if the global batch stays the same."""
    for option in ("lr", "momentum", "train_samples", "seed", "global_batch_size"):
        if saved.get(option, now[option]) != now[option]:
            raise trained_differently(saved, now, option, where)


def trained_differently(saved, now, option, where):
    """The UsageError for a resume whose `option` differs from the run's in `where`."""
    if option != "global_batch_size":
        flag = "--" + option.replace("_", "-")
        return UsageError(f"{where} was trained with {flag} {saved[option]} and this run "
                          f"asks for {now[option]}: pass {flag} {saved[option]} to continue "
                          "that training, or --overwrite to start again")
    batch = saved[option]
    per_rank, ranks = divmod(batch, now["world_size"])
    fix = (f"pass --batch-size {per_rank} to continue it on {now['world_size']} rank(s)"
           if ranks == 0 and per_rank else f"run it on {saved['world_size']} rank(s)")
    return UsageError(f"{where} was trained with a global batch of {batch} "
                      f"({saved['world_size']} rank(s) of {saved['batch_size']}) and this "
                      f"run's is {now['global_batch_size']}: {fix}, or --overwrite to start again")


def start_again_without_checkpoint(out):
    """--resume, and OUT has no checkpoint: start fresh (None) only if nothing trained is
    lost. Epoch 1 logged, no run.json: a crash after epoch 1 was logged, before its
    checkpoint."""
    if (out / SHARDED_CHECKPOINT).exists():
        raise UsageError(f"{out} holds a train_fsdp.py run ({SHARDED_CHECKPOINT}): resume it "
                         "with train_fsdp.py, or pass --overwrite to start again")
    metrics_to_keep(out, 0, quiet=True)  # a damaged line: refused, not trained over
    logged = logged_epochs(out)
    if logged == [1] and not (out / SUMMARY).exists():
        say(f"{out} holds epoch 1 but not its {CHECKPOINT} (cut short before it was saved): "
            "training from epoch 1 again")
    elif logged or (out / SUMMARY).exists():
        held = f"epochs {logged}" if logged else f"a {SUMMARY}"
        raise UsageError(f"{out} holds {held} but no {CHECKPOINT}: restore it, "
                         "or pass --overwrite to start again")
    else:
        say(f"{out} holds no run to resume: training from epoch 1")
    return None


def metrics_to_keep(out, epoch, quiet=False):
    """The lines of OUT/metrics.jsonl that a resume from a checkpoint of `epoch` (0: none)
    keeps: epochs 1 to `epoch`, each whole and once, in order. Lines after them were logged
    by a run cut short before its next checkpoint: those epochs are trained again, and a last
    line that is not whole (a crash as it was written, say) is dropped, with a word. Anything
    else is refused in one line, never dropped: the log is the run's record. `quiet`: a check
    before the work starts (checkpoint_to_resume), which leaves the word to the resume itself
    (start_out_dir)."""
    path = Path(out) / METRICS
    lines = metrics_lines(out)
    kept, seen = [], {}
    for index, (number, row, text) in enumerate(lines):
        if row is None:
            if index == len(lines) - 1 and len(kept) == epoch:  # a crash's own line, likely
                if not quiet:
                    when = f"after epoch {epoch}'s checkpoint" if epoch else "before any checkpoint"
                    say(f"{path}, line {number}, is not whole ({text}), and the run stopped "
                        f"{when}: the line is dropped, and its epoch trained again")
                continue
            raise UsageError(f"{path}, line {number}, is damaged ({text}): restore it from a "
                             "copy, or pass --overwrite to start again")
        if row["epoch"] > epoch:
            continue  # logged, not yet saved by a checkpoint: trained again
        if row["epoch"] in seen:
            raise UsageError(f"{path} logs epoch {row['epoch']} twice (lines "
                             f"{seen[row['epoch']]} and {number}): remove the line that does not "
                             "belong, or pass --overwrite to start again")
        seen[row["epoch"]] = number
        if row["epoch"] != len(kept) + 1:
            if not any(later is not None and later["epoch"] == len(kept) + 1
                       for _, later, _ in lines[index:]):
                break  # that epoch is nowhere: said below
            raise UsageError(f"{path}, line {number}, logs epoch {row['epoch']} where epoch "
                             f"{len(kept) + 1} was due: put the lines in order, or pass "
                             "--overwrite to start again")
        kept.append(row)
    if len(kept) != epoch:
        raise UsageError(f"{path} lacks epoch {len(kept) + 1}, which the checkpoint (epoch "
                         f"{epoch}) covers: restore that line, or pass --overwrite to start again")
    return kept


def check_same_data(out, source):
    """After start_out_dir: the epochs kept were trained on `source`, the data this run loaded
    (not so if CIFAR-10 was placed, or lost, since a run fell back to the synthetic set)."""
    trained_on = {row.get("dataset", source) for row in metrics_rows(out)}
    if trained_on - {source}:
        raise UsageError(f"{out} was trained on {', '.join(sorted(trained_on))} data and this "
                         f"run loaded {source}: pass --overwrite to start again on it")
