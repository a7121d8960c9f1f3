"""Continuing a run (--resume): loading its checkpoint (load_checkpoint), and the checks that
the new run's options would train as the saved run did (what out_dir.save_checkpoint
records of it), each refused in one line where they differ.

out_dir.prepare_out_dir imports it only when a run resumes (checkpoint_to_resume).
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
    out_dir.run_identity and training_settings), each difference refused in one line; or
    None (start from epoch 1) where nothing trained would be lost."""
    out = Path(out)
    if (out / SHARDED_CHECKPOINT).exists():
        raise UsageError(f"{out} holds a train_fsdp.py run ({SHARDED_CHECKPOINT}): resume it "
                         "with train_fsdp.py, or pass --overwrite to start again")
    if not (out / CHECKPOINT).exists():  # a crash before the first save, say
        return start_again_without_checkpoint(out)
    checkpoint = load_checkpoint(out / CHECKPOINT, expect=identity)
    stop_if_nothing_to_do(checkpoint["epoch"], epochs, out / CHECKPOINT)
    group = checkpoint["optimizer"].get("param_groups", [{}])[0]
    saved = {key: group[key] for key in ("lr", "momentum") if key in group}
    check_same_training({**checkpoint.get("trained", {}), **saved}, now, out / CHECKPOINT)
    metrics_to_keep(out, checkpoint["epoch"], quiet=True)
    return checkpoint


def start_again_without_checkpoint(out):
    """--resume, and OUT has no checkpoint: start fresh (None) only if nothing trained is
    lost. Epoch 1 logged, no run.json: a crash after epoch 1 was logged, before its
    checkpoint."""
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
        was = saved.get(option, now[option])
        if was == now[option]:
            continue
        if option != "global_batch_size":
            flag = "--" + option.replace("_", "-")
            said = (f"{flag} {was} and this run asks for {now[option]}: pass {flag} {was} "
                    "to continue it")
        else:
            per_rank, left = divmod(was, now["world_size"])
            fix = (f"pass --batch-size {per_rank} to continue it on {now['world_size']} rank(s)"
                   if left == 0 and per_rank else f"run it on {saved['world_size']} rank(s)")
            said = (f"a global batch of {was} ({saved['world_size']} rank(s) of "
                    f"{saved['batch_size']}) and this run's is {now[option]}: {fix}")
        raise UsageError(f"{where} was trained with {said}, or --overwrite to start again")


def metrics_to_keep(out, epoch, quiet=False):
    """The lines of OUT/metrics.jsonl that a resume from a checkpoint of `epoch` (0: none)
    keeps: epochs 1 to `epoch`, once each, in order (later epochs are trained again). A last
    line cut short by a crash is dropped with a word (left to start_out_dir's call when
    `quiet`); anything else is refused in one line, never dropped: the log is the run's record."""
    path, lines, kept, out_of_step = Path(out) / METRICS, metrics_lines(out), [], None
    for index, (number, row, why) in enumerate(lines):
        if row is None and index == len(lines) - 1 and len(kept) == epoch:
            if not quiet:
                when = f"after epoch {epoch}'s checkpoint" if epoch else "before any checkpoint"
                say(f"{path}, line {number}, is not whole ({why}), and the run stopped "
                    f"{when}: the line is dropped, and its epoch trained again")
        elif row is None:
            raise UsageError(f"{path}, line {number}, is damaged ({why}): restore it from a "
                             "copy, or pass --overwrite to start again")
        elif row["epoch"] > epoch:
            pass  # logged after the checkpoint: trained again
        elif row["epoch"] == len(kept) + 1:
            kept.append(row)
        else:  # an epoch twice, or out of order
            out_of_step = f", line {number}, logs epoch {row['epoch']} out of step"
            break
    if out_of_step or len(kept) < epoch:
        raise UsageError(f"{path}{out_of_step or f' lacks epoch {len(kept) + 1}'}: the "
                         f"checkpoint (epoch {epoch}) needs epochs 1 to {epoch} logged once "
                         "each, in order; mend the log (from a copy, say), or pass "
                         "--overwrite to start again")
    return kept


def check_same_data(out, source):
    """After start_out_dir: the epochs kept were trained on `source`, the data this run loaded
    (not so if CIFAR-10 was placed, or lost, since a run fell back to the synthetic set)."""
    trained_on = {row.get("dataset", source) for row in metrics_rows(out)}
    if trained_on - {source}:
        raise UsageError(f"{out} was trained on {', '.join(sorted(trained_on))} data and this "
                         f"run loaded {source}: pass --overwrite to start again on it")
