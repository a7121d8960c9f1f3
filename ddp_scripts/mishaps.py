"""The rarer ways a run cannot start or go on, each said in one line.

Imported inside the branch that meets one, so that a reader who follows a run that goes as
planned does not read them: a rank that never joined, a folder that cannot be made or is in
use, a resume that would train differently or has no checkpoint, a full disk. (Another rank
that ended first, and SIGTERM, are run_cli's: cli.py.)
"""
import os
from pathlib import Path

from ddp_scripts.cli import NothingToDo, RunStopped, UsageError, first_line, say
from ddp_scripts.runfiles import (CHECKPOINT, METRICS, SHARDED_CHECKPOINT, SUMMARY, logged_epochs,
                                  metrics_rows)


def ranks_missing(error, timeout_s):
    """The RunStopped for a process group that did not form: the store says how many came."""
    import re
    joined = re.search(r"(\d+)/(\d+) clients joined", str(error))
    who = f"{joined[1]} of {joined[2]} ranks" if joined else "not every rank"
    return RunStopped(f"{who} joined within --timeout-s {timeout_s:g} ({first_line(error)}): "
                      "start every rank, with the same MASTER_ADDR and MASTER_PORT")


def cannot_write(option, path, error):
    """The UsageError for a path an option names that cannot be made or written (OSError)."""
    reason = ("Not a directory" if isinstance(error, FileExistsError)  # a file where a folder goes
              else error.strerror or first_line(error))
    where = f" ({error.filename})" if error.filename not in (None, str(path)) else ""
    return UsageError(f"{option} {path} cannot be written: {reason}{where}")


def cannot_make(out, error):
    """The UsageError for an --out that cannot be made or written (checkpoints.claim_out_dir)."""
    if out.is_symlink() and not out.exists():
        return UsageError(f"--out {out} is a link to {os.readlink(out)}, which does not exist")
    if out.exists() and not out.is_dir():
        return UsageError(f"--out {out} is a file, not a directory")
    return cannot_write("--out", out, error)


def not_locked(out, descriptor, error):
    """OUT/.lock held by another run: the UsageError that refuses this one. No lock to be had
    (a file system without flock, or no fcntl on Windows): said in one line, and the run
    goes on unlocked (returns None, the descriptor to hold)."""
    os.close(descriptor)
    if isinstance(error, BlockingIOError):
        raise UsageError(f"{out} is in use by another run, still running: wait for it to end, "
                         "or choose another --out")
    reason = "no flock here" if isinstance(error, AttributeError) else error.strerror or error
    say(f"{out} cannot be locked ({reason}): nothing stops another run from writing there")


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


def unreadable_checkpoint(path, error):
    """The UsageError for a checkpoint torch.load cannot read."""
    if isinstance(error, OSError):  # no permission, say
        return UsageError(f"cannot read checkpoint {path}: {error.strerror or error}")
    return UsageError(f"cannot read checkpoint {path}: not a PyTorch checkpoint of tensors "
                      "(damaged, or another program's); use another --out or --overwrite")


def not_this_runs_checkpoint(path, state, expect):
    """The UsageError for a checkpoint of another program, or of another run."""
    if not isinstance(state, dict) or not {"model", "optimizer", "epoch"} <= state.keys():
        return UsageError(f"{path} is not a checkpoint of these scripts "
                          "(expected the keys model, optimizer and epoch)")
    return UsageError(f"{path} belongs to another run ({state['identity']}), not {expect}; "
                      "use another --out or --overwrite")


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


def os_error_in(error):
    """The OSError behind `error`, if any (torch.save reports a full disk as a RuntimeError
    raised while handling it)."""
    while error is not None and not isinstance(error, OSError):
        error = error.__cause__ or error.__context__
    return error


def cannot_save(error, out, epoch):
    """A save that failed for want of disk (an OSError behind it) as one line that says what
    is kept; any other error as it is."""
    cause = os_error_in(error)
    if cause is None:
        return error
    kept = (f"{CHECKPOINT} of epoch {epoch - 1} is whole: --resume continues from it"
            if epoch > 1 and (Path(out) / CHECKPOINT).exists() else "no checkpoint was saved yet")
    return RunStopped(f"cannot save epoch {epoch} in {out} ({cause.strerror or cause}); {kept}")


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
    if (out / SHARDED_CHECKPOINT).exists():
        raise UsageError(f"{out} holds a train_fsdp.py run ({SHARDED_CHECKPOINT}): resume it "
                         "with train_fsdp.py, or pass --overwrite to start again")
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


def not_started_by_torchrun(script, names):
    """The UsageError for torchrun's variables missing, or not whole numbers that agree."""
    example = f"torchrun --standalone --nproc_per_node 2 ddp_scripts/{Path(script).name} ..."
    if "LOCAL_RANK" not in os.environ:
        return UsageError(f"LOCAL_RANK is not set: start this script with torchrun, e.g. {example}")
    missing = [name for name in names if name not in os.environ]
    if missing:
        return UsageError(f"{', '.join(missing)} not set, although LOCAL_RANK is: start this "
                          f"script with torchrun, which sets all of {', '.join(names)}, e.g. {example}")
    value = {name: os.environ[name] for name in names}
    if not all(text.isdigit() for text in value.values()):
        return UsageError(f"torchrun's variables must be whole numbers, got {value}")
    return UsageError(f"torchrun's variables contradict each other ({value}): need RANK < "
                      "WORLD_SIZE and LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE")


def gpu_shared(uuids):
    """The UsageError for two ranks given the same GPU (ranks.check_one_gpu_per_rank)."""
    rank = next(rank for rank, uuid in enumerate(uuids) if uuids.index(uuid) != rank)
    return UsageError(f"ranks {uuids.index(uuids[rank])} and {rank} were given the same GPU "
                      f"({uuids[rank]}): start one process per GPU")


def data_differs(sources, data_dir):
    """The UsageError for ranks that loaded different data (ranks.agree_on_data_source)."""
    odd = [rank for rank, other in enumerate(sources) if other != sources[0]]
    return UsageError(f"the ranks loaded different data: rank 0 {sources[0]!r}, ranks {odd} "
                      f"{sources[odd[0]]!r}; put CIFAR-10 in {data_dir!r} on every node "
                      "(or use a shared file system), or pass --dataset synthetic")


def launched_the_old_way(local_rank):
    """--local-rank: the deprecated torch.distributed.launch passes it; torchrun sets LOCAL_RANK."""
    os.environ.setdefault("LOCAL_RANK", str(local_rank))
    if os.environ["LOCAL_RANK"] == "0":
        print("notice: --local-rank comes from the deprecated torch.distributed.launch; "
              "torchrun sets LOCAL_RANK instead", flush=True)
