"""How a companion script starts, talks and ends: run_cli, its one-line errors, say.

Bad input is a UsageError: one line on stderr, exit status 2. A run that cannot go on is a
RunStopped: one line, exit status 1. A run with nothing to do is a NothingToDo: one line,
exit status 0. say() prints one line, tagged with the process's rank.
"""
import os
import signal
import sys


class UsageError(Exception):
    """Bad input: reported as one line on stderr, exit status 2, no traceback."""


class RunStopped(Exception):
    """The run cannot go on (its loss stopped being finite): one line on stderr, exit status 1."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, torchrun or a job scheduler ending the run): handled as Ctrl-C is."""


def _terminated(*signal_and_frame):
    raise Terminated


class NothingToDo(Exception):
    """The run has nothing to do (a resume of a finished run): one line, exit status 0."""


# The folders this process holds while its script runs (checkpoints.claim_out_dir): each
# path's open, locked descriptor (or None), the folders the claim made, deepest first, and
# the lock file.
HELD_FOLDERS = {}


def let_go_of_folders():
    """run_cli's last step: remove each lock file, then unlock it (checkpoints.hold), and
    remove the folders the claim made if the script left nothing in them."""
    for descriptor, made, lock in HELD_FOLDERS.values():
        if descriptor is not None:
            try:  # the file it locked, empty as it made it: not another run's or program's
                if os.path.samestat(mine := os.fstat(descriptor), os.stat(lock)) and not mine.st_size:
                    lock.unlink()
            except FileNotFoundError:
                pass
            os.close(descriptor)  # and with it the lock
        for folder in made:
            try:
                os.rmdir(folder)  # only if empty
            except OSError:
                break
    HELD_FOLDERS.clear()


def leave_the_group():
    """A DDP run that stops early leaves its process group too, as train_ddp.py does at its
    end: left open, gloo's threads could abort the process as it exits. Called once this
    rank's error file is written, so that torchrun and the launcher, which name the rank
    whose error came first, name this one, not a peer that lost it."""
    dist = sys.modules.get("torch.distributed")  # imported by the script, if it uses one
    if dist is not None and dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # after a lost peer, say: the run's own error is the one to show
            pass


# Set to 1 by the book's launcher and tests only: a run that succeeds then ends with
# os._exit(0), which skips Python's slow way out after importing torch, but also atexit
# handlers and unflushed files; leave it unset for your own runs.
FAST_EXIT = "DDP_SCRIPTS_FAST_EXIT"


def run_cli(main):
    """Call `main()` as a script's entry point, and end the process: UsageError is one line
    and exit status 2; RunStopped (or peer_lost) one line and 1; SIGTERM or Ctrl-C one line;
    any other exception Python's traceback and 1. Failures also go to torchrun's error file
    (runfiles.py), where torchrun and the launcher read which rank failed and why."""
    rank = os.environ.get("RANK")  # checked by ranks.require_torchrun, if the script needs it
    rank = int(rank) if rank and rank.isdigit() else None
    previous = signal.signal(signal.SIGTERM, _terminated)  # in the main thread: a script's
    try:
        try:
            main()
        except RuntimeError as error:  # gloo's, if another rank ended first: then one line
            raise peer_lost(error)  # noqa: B904 (the error itself, or a one-line RunStopped)
        finally:  # the process may go on (a test runs the script in its own process)
            let_go_of_folders()
            signal.signal(signal.SIGTERM, previous)
    except NothingToDo as error:
        if not rank:
            say(str(error))
        leave_the_group()
        sys.exit(0)
    except (UsageError, RunStopped) as error:
        from ddp_scripts.runfiles import write_error_file  # for torchrun and the launcher
        status = 2 if isinstance(error, UsageError) else 1
        sys.stderr.write(f"{tag(rank)}error: {error}\n")  # one write: see say()
        sys.stderr.flush()
        write_error_file(error, exit_code=status, rank=rank, with_stack=False)
        leave_the_group()  # after the error file: a peer that then loses us writes its own later
        sys.exit(status)
    except KeyboardInterrupt as error:  # Ctrl-C, or SIGTERM (Terminated)
        end_interrupted(error, tag(rank))
    except Exception as error:
        from ddp_scripts.runfiles import write_error_file
        write_error_file(error, exit_code=1, rank=rank)
        leave_the_group()
        raise
    if os.environ.get(FAST_EXIT) == "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def peer_lost(error):
    """gloo's error when another rank's process ended in a collective, as one line."""
    if not any(text in str(error) for text in ("Connection reset by peer", "Connection closed by peer")):
        return error
    return RunStopped(f"another rank ended first ({type(error).__name__}: "
                      f"{first_line(error).split('. ')[0]}); its own output says why; the last "
                      "checkpoint saved, if any, is whole")


def end_interrupted(error, tag):
    """Ctrl-C or SIGTERM: one line. Ctrl-C exits with 130; SIGTERM ends the process by
    SIGTERM itself, as torchrun and shells expect (143 in a shell, -15 in Python)."""
    how = "SIGTERM" if isinstance(error, Terminated) else "Ctrl-C"
    sys.stderr.write(f"{tag}interrupted ({how}); the last checkpoint saved, if any, is whole\n")
    sys.stderr.flush()
    if isinstance(error, Terminated):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    sys.exit(130)


def first_line(error):
    """An exception's message in one line, for a one-line error or announcement."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def tag(rank):
    return f"[rank {rank}] " if rank is not None else ""


def say(message):
    """Print one line, tagged with this process's rank, in one write (print() writes the
    newline apart, and two ranks' unbuffered lines could mix)."""
    sys.stdout.write(f"[rank {os.environ.get('RANK', '0')}] {message}\n")
    sys.stdout.flush()
