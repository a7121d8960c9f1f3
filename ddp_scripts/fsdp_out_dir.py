"""What train_fsdp.py leaves in OUT: its sharded checkpoint, never overwritten by accident and
resumed on any number of ranks, and the whole model, gathered for one process at the end.

    OUT/checkpoint.dcp/  the sharded checkpoint (torch.distributed.checkpoint): every rank
                         writes its own shards of the model and of the optimizer state, rank 0
                         the plan (.metadata) and checkpoint.json (epoch, run, global batch).
                         It loads on any number of ranks: DCP reads, on each, the pieces of
                         the shards it now owns. Every rank must see the folder (one machine,
                         or a file system shared by the nodes).
    OUT/checkpoint.pt    the whole model and optimizer state, gathered on rank 0 when the run
                         ends, in the format of the other scripts' checkpoints: one process
                         loads it with torch.load(weights_only=True), no process group.

Everything that takes an FSDP model or its optimizer is a collective: every rank calls it.
"""
import json
import os
import shutil
import textwrap
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, get_state_dict,
                                                     set_state_dict)

from ddp_scripts import out_dir
from ddp_scripts.cli import UsageError, first_line, say
from ddp_scripts.out_dir import (append_metrics, claim_out_dir, epoch_record, run_identity,
                                 training_settings, write_atomically)
from ddp_scripts.resume import (check_same_training, load_checkpoint, metrics_to_keep,
                                stop_if_nothing_to_do)
from ddp_scripts.runfiles import (CHECKPOINT, SHARDED_CHECKPOINT, SUMMARY, holds_a_run,
                                  logged_epochs, metrics_rows)
from ddp_scripts.sharding import bytes_per_rank

CHECKPOINT_INFO = "checkpoint.json"  # inside OUT/checkpoint.dcp, next to DCP's .metadata


# ---------------------------------------------------------------------------------------
# OUT: the sharded checkpoint, never overwritten by accident
# ---------------------------------------------------------------------------------------
def sharded_identity(args):
    """What must match for a sharded checkpoint to belong to this run."""
    identity = run_identity(args)
    if args.model == "mlp":
        identity.update(width=args.width, depth=args.depth)
    return identity


def prepare_out_dir(args, global_batch_size):
    """Check OUT before any work starts; returns what the sharded checkpoint holds (epoch,
    identity, world size, global batch), or None. Claims OUT first (out_dir.claim_out_dir);
    rank 0 calls it (on_rank_0)."""
    out = Path(args.out)
    claim_out_dir(out)
    out_dir.refuse_odd_files(out)
    if holds_a_run(out) and not (args.resume or args.overwrite):
        raise UsageError(f"{out} already holds a run; pass --resume to continue it, "
                         "--overwrite to replace it, or choose another --out")
    if not args.resume:
        return None
    folder = out / SHARDED_CHECKPOINT
    if not folder.exists():
        previous = folder.with_name(folder.name + ".old")  # see save_sharded
        strategy = next((row.get("strategy") for row in metrics_rows(out)[::-1]), "fsdp")
        if strategy != "fsdp":  # a run of the other scripts, which save no sharded checkpoint
            raise UsageError(f"{out} holds a run of another script ({strategy}, {CHECKPOINT}): "
                             "resume it with that script, or pass --overwrite")
        metrics_to_keep(out, 0, quiet=True)  # a damaged line: refused, not trained over
        if logged_epochs(out) == [1] and not previous.exists() and not (out / SUMMARY).exists():
            say(f"{out} holds epoch 1 but not its {SHARDED_CHECKPOINT} (cut short before it "
                "was saved): training from epoch 1 again")  # as resume.py does for the others
            return None
        if logged_epochs(out):  # starting again would throw away epochs that were trained
            hint = (f"rename {previous.name} to {folder.name}" if previous.exists()
                    else "restore it")
            raise UsageError(f"{out} holds epochs {logged_epochs(out)} but no sharded checkpoint "
                             f"({folder} is missing): {hint}, or pass --overwrite")
        say(f"{out} holds no run to resume: training from epoch 1")  # as the other scripts do
        return None
    try:
        info = json.loads((folder / CHECKPOINT_INFO).read_text())
        info["epoch"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UsageError(f"{folder} is not a whole sharded checkpoint ({CHECKPOINT_INFO}: "
                         f"{type(error).__name__}): pass --overwrite to start again") from None
    if info["identity"] != sharded_identity(args):
        raise UsageError(f"{folder} belongs to another run ({info['identity']}), not "
                         f"{sharded_identity(args)}; use another --out or --overwrite")
    refuse_if_trained_on_since(out, info["epoch"])
    stop_if_nothing_to_do(info["epoch"], args.epochs, folder)
    check_same_training({key: info[key] for key in ("lr", "momentum", "seed", "train_samples")
                         if key in info}, training_settings(args), folder)
    if info["global_batch_size"] != global_batch_size:
        raise UsageError(f"{folder} was trained with a global batch of "
                         f"{info['global_batch_size']} and this run's is {global_batch_size}: "
                         f"pass --global-batch-size {info['global_batch_size']} to continue "
                         "the same training on this number of ranks")
    metrics_to_keep(out, info["epoch"], quiet=True)
    return info


def refuse_if_trained_on_since(out, epoch):
    """Another script resumed OUT/checkpoint.pt past the sharded checkpoint's epoch: resuming
    that would throw its epochs away. (Epoch + 1 logged: a crash before its save, trained again.)"""
    logged = max(logged_epochs(out), default=0)
    if (out / CHECKPOINT).exists() and logged > epoch:
        logged = max(logged, load_checkpoint(out / CHECKPOINT)["epoch"])
    if logged > epoch + 1 or (logged > epoch and (out / CHECKPOINT).exists()):
        raise UsageError(f"{out} was trained on to epoch {logged} by another script, past its "
                         f"{SHARDED_CHECKPOINT} (epoch {epoch}): resume it with train_single.py "
                         "or train_ddp.py, or pass --overwrite")


def start_out_dir(args, checkpoint):
    """out_dir.py's start_out_dir (metrics kept up to the checkpoint's epoch), and no sharded
    checkpoint but the one resumed from. checkpoint.pt goes: it is the end of a finished run."""
    out_dir.start_out_dir(args, checkpoint)
    out = Path(args.out)
    (out / CHECKPOINT).unlink(missing_ok=True)
    stale = [".next", ".old"] + ([""] if checkpoint is None else [])
    for suffix in stale:  # a save cut short, or the checkpoint of a run now overwritten
        out_dir.remove(out / (SHARDED_CHECKPOINT + suffix))


def resume_from(checkpoint, model, optimizer, out):
    """Load the sharded checkpoint (or None) into the sharded model and optimizer, on any
    number of ranks; returns the first epoch to run."""
    if checkpoint is None:
        return 1
    model_state, optimizer_state = get_state_dict(model, optimizer)  # this rank's shards
    state = {"model": model_state, "optimizer": optimizer_state}
    folder = Path(out) / SHARDED_CHECKPOINT
    try:
        dcp.load(state, checkpoint_id=folder)  # fills them in place
    except (Exception, dcp.CheckpointException) as error:  # DCP: the same on every rank
        reason = cut_short(folder) or first_failure(error).replace(f"{folder}{os.sep}", "")
        raise UsageError(f"cannot read the sharded checkpoint {folder}: "
                         f"{textwrap.shorten(reason, 200)}; pass --overwrite to start again") from None
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])
    say(f"resuming after epoch {checkpoint['epoch']} from {out} (saved by "
        f"{checkpoint['world_size']} rank(s), loaded by {dist.get_world_size()})")
    return checkpoint["epoch"] + 1


def cut_short(folder):
    """The first shard file in `folder` smaller than DCP's plan (.metadata) says it is, in
    one line; None if every file is long enough, or the plan cannot be read. The plan's
    storage_data maps each item saved to (relative_path, offset, length) in its file."""
    try:
        plan = dcp.FileSystemReader(folder).read_metadata().storage_data
        needs = {}
        for where in plan.values():
            end = where.offset + where.length
            needs[where.relative_path] = max(needs.get(where.relative_path, 0), end)
    except Exception:  # no plan, or a damaged one: DCP's own error says so
        return None
    for name, size in sorted(needs.items()):
        try:
            held = (Path(folder) / name).stat().st_size
        except OSError:  # missing: DCP's own error names it
            continue
        if held < size:
            return (f"{name} is {held:,} bytes; the checkpoint's index needs {size:,}: it was "
                    "cut short, or is not this checkpoint's file")
    return None


def first_failure(error):
    """What went wrong, in one line. DCP's CheckpointException says only which ranks failed:
    its `failures` maps each rank to (its exception, the exception's stack)."""
    failures = getattr(error, "failures", None)
    if failures:
        rank = min(failures)
        cause = failures[rank][0]
        message = str(cause).strip() and f": {first_line(cause)}"
        return f"rank {rank}: {type(cause).__name__}{message}"
    return first_line(error)


def save_sharded(out, model, optimizer, epoch, args, global_batch_size):
    """Every rank writes its shards into OUT/checkpoint.dcp.next; rank 0 then puts it in place
    of OUT/checkpoint.dcp. A crash mid-save leaves the previous checkpoint whole (between
    the two renames, as checkpoint.dcp.old, which --resume then names)."""
    out = Path(out)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    folder, new, old = (out / (SHARDED_CHECKPOINT + suffix) for suffix in ("", ".next", ".old"))
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=new)
    if dist.get_rank() == 0:  # dcp.save returns once every rank's shards and the plan are written
        info = {"epoch": epoch, "identity": sharded_identity(args), "lr": args.lr,
                "momentum": args.momentum, "seed": args.seed, "train_samples": args.train_samples,
                "world_size": dist.get_world_size(),
                "global_batch_size": global_batch_size}
        write_atomically(new / CHECKPOINT_INFO, lambda f: f.write(json.dumps(info)), mode="w")
        if folder.exists():
            os.replace(folder, old)
        os.replace(new, folder)
        shutil.rmtree(old, ignore_errors=True)
    dist.barrier()  # no rank starts the next save before the folders are in place


def save_epoch(args, epoch, model, optimizer, train_totals, test_totals, epoch_time_s,
                       context):
    """Log the epoch (rank 0), save the sharded checkpoint that covers it (every rank), say so."""
    held = bytes_per_rank(model, optimizer, torch.device(context["device"]))
    record = epoch_record(epoch, train_totals, test_totals, epoch_time_s, **context, **held)
    try:
        if dist.get_rank() == 0:
            append_metrics(args.out, record)
        save_sharded(args.out, model, optimizer, epoch, args, context["global_batch_size"])
    except (Exception, dcp.CheckpointException) as error:  # DCP: every rank's, on every rank
        from ddp_scripts.mishaps import cannot_save, os_error_in  # a full disk, say
        cause = os_error_in(error) or next(
            (os_error_in(failed) for failed, _ in getattr(error, "failures", {}).values()
             if os_error_in(failed)), None)
        if cause is None:
            raise
        if dist.get_rank() == 0:  # the half-written save: resumes only from a whole one
            shutil.rmtree(Path(args.out) / (SHARDED_CHECKPOINT + ".next"), ignore_errors=True)
        raise cannot_save(error, args.out, epoch, SHARDED_CHECKPOINT, cause) from None
    if dist.get_rank() == 0:
        say(f"epoch {epoch}/{args.epochs} train_loss={record['train_loss']:.4f} "
            f"test_accuracy={record['test_accuracy']:.4f} samples/s={record['samples_per_s']:.0f}")


# ---------------------------------------------------------------------------------------
# The whole model, for one process
# ---------------------------------------------------------------------------------------
def full_state(model, optimizer):
    """The whole model and optimizer state, gathered on rank 0's CPU one tensor at a time
    (the other ranks get empty dicts). The optimizer's state is keyed by parameter number,
    as optimizer.state_dict() keys it, so that an unsharded optimizer loads it."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(model, options=options)
    optimizer_state = get_optimizer_state_dict(model, optimizer, options=options)
    if not model_state:
        return {}, {}
    number = {name: i for i, (name, _) in enumerate(model.named_parameters())}
    optimizer_state = {
        "state": {number[name]: state for name, state in optimizer_state["state"].items()},
        "param_groups": [{**group, "params": [number[name] for name in group["params"]]}
                         for group in optimizer_state["param_groups"]]}
    return model_state, optimizer_state


def export_full_checkpoint(args, model, optimizer):
    """OUT/checkpoint.pt as the other scripts write it (model, optimizer, epoch, identity),
    from the state of the last sharded checkpoint."""
    model_state, optimizer_state = full_state(model, optimizer)
    if dist.get_rank() == 0:
        info = json.loads((Path(args.out) / SHARDED_CHECKPOINT / CHECKPOINT_INFO).read_text())
        state = {"model": model_state, "optimizer": optimizer_state, "epoch": info["epoch"],
                 "identity": info["identity"], "trained": training_settings(args)}
        write_atomically(Path(args.out) / CHECKPOINT, lambda f: torch.save(state, f))
