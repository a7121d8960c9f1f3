"""The ways a run cannot start or go on, each said in one line.

First the errors every script raises (cli.py names them for the scripts): UsageError, bad
input, exit status 2; RunStopped, a run that cannot go on, 1; NothingToDo, 0. Then the rarer
ways, each called inside the branch that meets one, so that a reader who follows a run that
goes as planned does not read them: another rank that ended first, Ctrl-C or SIGTERM, a rank
that never joined, a folder that cannot be made or is in use, a full disk. end_early is how
cli.run_cli ends a run whose main() raised. Nothing here imports cli.py, which imports this.
"""
import gc
import os
import signal
import sys
import traceback
from pathlib import Path

from ddp_scripts.runfiles import CHECKPOINT, METRICS, SUMMARY, write_error_file


class UsageError(Exception):
    """Bad input: reported as one line on stderr, exit status 2, no traceback."""


class RunStopped(Exception):
    """The run cannot go on (its loss stopped being finite): one line on stderr, exit status 1."""


class PeerLost(RunStopped):
    """Another rank ended first, and this one stops for want of it (peer_lost)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, torchrun or a job scheduler ending the run): handled as Ctrl-C is."""


class NothingToDo(Exception):
    """The run has nothing to do (a resume of a finished run): one line, exit status 0."""


def first_line(error):
    """An exception's message in one line, for a one-line error or announcement."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def end_early(error, say):
    """End a run whose main() raised `error` as cli.run_cli says, with one line and an exit
    status. An error that is none of those run_cli names gets its error file only, and run_cli
    then re-raises it. `say`: cli.say, for rank 0's line about a NothingToDo."""
    rank = os.environ.get("RANK")  # checked by ranks.require_torchrun, if the script needs it
    rank = int(rank) if rank and rank.isdigit() else None
    tag = f"[rank {rank}] " if rank is not None else ""
    if not isinstance(error, (KeyboardInterrupt, UsageError, RunStopped, NothingToDo)):
        error = out_of_memory(interrupt_behind(error))
    if isinstance(error, RuntimeError):  # gloo's, if another rank ended first: then one line
        error = peer_lost(error)
    if isinstance(error, KeyboardInterrupt):  # Ctrl-C, or SIGTERM (Terminated)
        end_interrupted(error, tag)
    if isinstance(error, NothingToDo):
        if not rank:
            say(str(error))
        leave_the_group()
        sys.exit(0)
    if isinstance(error, (UsageError, RunStopped)):  # the error file: for torchrun and the launcher
        status = 2 if isinstance(error, UsageError) else 1
        sys.stderr.write(f"{tag}error: {error}\n")  # one write: see cli.say()
        sys.stderr.flush()
        write_error_file(error, exit_code=status, rank=rank, with_stack=False,
                         lost_peer=isinstance(error, PeerLost))
        leave_the_group()  # after the error file: a peer that then loses us writes its own later
        sys.exit(status)
    write_error_file(error, exit_code=1, rank=rank)
    leave_the_group()


def interrupt_behind(error):
    """Ctrl-C or SIGTERM in the middle of a save: torch.save's zip writer then fails on its
    way out, and its error hides the interrupt, which is found in the error's context. An
    error raised `from None` (its context suppressed) stands as it is."""
    context = error
    while context is not None and not context.__suppress_context__:
        context = context.__context__
        if isinstance(context, KeyboardInterrupt):
            return context
    return error


def out_of_memory(error):
    """torch's OutOfMemoryError (a GPU's: a CPU's allocator raises a RuntimeError), wherever the
    run met it (the model, training, the test), as one line; any other error as it is."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(error, torch.OutOfMemoryError):
        return error
    said = ". ".join(first_line(error).split(". ")[:2])  # "CUDA out of memory. Tried to ..."
    return UsageError(f"the run does not fit in the GPU's memory ({said}): lower the batch "
                      "(--batch-size; train_fsdp.py: --global-batch-size, if given)")


def peer_lost(error):
    """gloo's error when another rank ended first (its connection closed), or did not answer
    within the --timeout-s of a group that ranks.init_process_group formed (it is stopped,
    stuck, or slower than that), as a PeerLost in one line: this rank stops for want of that
    one, which is the one to read about. Any other error as it is, and so a group made
    otherwise (the lessons' own demonstrations) keeps gloo's traceback."""
    import re
    if "Connection reset by peer" in str(error) or "Connection closed by peer" in str(error):
        return PeerLost(f"another rank ended first ({type(error).__name__}: "
                        f"{first_line(error).split('. ')[0]}); its own output, or torchrun's exit "
                        "code for it, says why; the last checkpoint saved, if any, is whole")
    ranks = sys.modules.get("ddp_scripts.ranks")
    timeout_s = ranks.GROUP.get("timeout_s") if ranks is not None else None
    if timeout_s is None or not re.search(r"Timed out waiting \d+ ?ms", str(error)):
        return error
    return PeerLost(f"another rank did not answer within --timeout-s {timeout_s:g} "
                    f"({type(error).__name__}: {first_line(error).split('] ')[-1]}): it is "
                    "stopped (SIGSTOP, Ctrl-Z), stuck, or slower than that (raise --timeout-s "
                    "if it is only slow); the last checkpoint saved, if any, is whole")


def end_interrupted(error, tag):
    """Ctrl-C or SIGTERM: one line. Ctrl-C exits with 130; SIGTERM ends the process by
    SIGTERM itself, as torchrun and shells expect (143 in a shell, -15 in Python)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C: ended at once, in silence
    how = "Ctrl-C"
    if isinstance(error, Terminated):
        how = f"SIGTERM: {error}" if str(error) else "SIGTERM"
    sys.stderr.write(f"{tag}interrupted ({how}); the last checkpoint saved, if any, is whole\n")
    sys.stderr.flush()
    if isinstance(error, Terminated):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    sys.exit(130)


def leave_the_group():
    """A DDP run that stops early leaves its process group too, as train_ddp.py does at its
    end: left open, gloo's threads could abort the process as it exits. Called once this
    rank's error file is written: its peers lose it only then, and their files, which say so
    (runfiles.write_error_file's lost_peer), sort after this one's for torchrun, while the
    launcher names a rank that failed on its own before any that lost a peer."""
    dist = sys.modules.get("torch.distributed")  # imported by the script, if it uses one
    if dist is not None and dist.is_available() and dist.is_initialized():
        # main()'s model lives on in the error's traceback: freed only after the group, its
        # DDP Reducer could hang the rank as it exits (ranks.leave_process_group says why)
        traceback.clear_frames(sys.exc_info()[2])
        gc.collect()
        try:
            dist.destroy_process_group()
        except Exception:  # after a lost peer, say: the run's own error is the one to show
            pass


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


def lock_not_opened(lock, error):
    """OUT/.lock could not be opened: make OUT again if another run removed it (empty, as
    the run that made it ended), else raise the UsageError (out_dir.hold)."""
    if lock.parent.exists():  # .lock a folder, or a broken link
        raise cannot_write("--out", lock.parent, error) from None
    lock.parent.mkdir(parents=True, exist_ok=True)


def cannot_make(out, error):
    """The UsageError for an --out that cannot be made or written (out_dir.claim_out_dir)."""
    if out.is_symlink() and not out.exists():
        return UsageError(f"--out {out} is a link to {os.readlink(out)}, which does not exist")
    if out.exists() and not out.is_dir():
        return UsageError(f"--out {out} is a file, not a directory")
    return cannot_write("--out", out, error)


def not_locked(out, descriptor, error, say):
    """OUT/.lock held by another run: the UsageError that refuses this one. No lock to be had
    (a file system without flock, or no fcntl on Windows): said in one line (`say`: cli.say),
    and the run goes on unlocked (returns None, the descriptor to hold)."""
    os.close(descriptor)
    if isinstance(error, BlockingIOError):
        raise UsageError(f"{out} is in use by another run, still running: wait for it to end, "
                         "or choose another --out")
    reason = "no flock here" if isinstance(error, AttributeError) else error.strerror or error
    say(f"{out} cannot be locked ({reason}): nothing stops another run from writing there")


def ignore_rank_variables(names, say):
    """A script of one process, started without torchrun in a shell that holds torchrun's
    variables (left from an earlier export): one notice, and the variables leave this
    process, so that no later line is tagged with another rank's number (pick_device calls
    it, after the options are checked)."""
    found = " ".join(f"{name}={os.environ.pop(name)}" for name in sorted(names)
                     if name in os.environ)
    say(f"notice: {found} set in the environment, but this script runs one process without "
        "torchrun: ignored (unset them in the shell to silence this)")


def os_error_in(error):
    """The OSError behind `error`, if any (torch.save reports a full disk as a RuntimeError
    raised while handling it)."""
    while error is not None and not isinstance(error, OSError):
        error = error.__cause__ or error.__context__
    return error


def cannot_save(error, out, epoch, saved=CHECKPOINT, cause=None):
    """A save that failed for want of disk (`cause`, an OSError behind it) as one line that
    says what is kept of `saved`; any other error as it is."""
    cause = cause or os_error_in(error)
    if cause is None:
        return error
    kept = (f"{saved} of epoch {epoch - 1} is whole: --resume continues from it"
            if epoch > 1 and (Path(out) / saved).exists() else "no checkpoint was saved yet")
    return RunStopped(f"cannot save epoch {epoch} in {out} ({cause.strerror or cause}); {kept}")


def loss_not_finite(epoch, step):
    """The RunStopped for a loss that became nan or inf (out_dir.stop_if_loss_not_finite)."""
    return RunStopped(f"the loss became nan or inf at epoch {epoch}, step {step:.0f}: lower "
                      f"--lr (nothing of epoch {epoch} was saved: the checkpoint, if there "
                      "is one, holds the epoch before)")


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


def port_taken(error):
    """The UsageError for a MASTER_PORT that rank 0 cannot listen on, since another program
    (or another run) holds it; None for any other failure to form the group."""
    text = str(error)
    if "EADDRINUSE" not in text and "address already in use" not in text.lower():
        return None
    port, host = os.environ.get("MASTER_PORT", "?"), os.environ.get("MASTER_ADDR", "?")
    return UsageError(f"MASTER_PORT {port} on {host} is in use by another program (EADDRINUSE): "
                      "set MASTER_PORT to a free port, or start the script with torchrun "
                      "--standalone, which picks one")
