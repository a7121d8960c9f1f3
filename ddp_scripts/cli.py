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
    """run_cli's last step: unlock the folders held, and remove those the claim made if the
    script left nothing in them (it stopped before it started)."""
    for descriptor, made, lock in HELD_FOLDERS.values():
        if descriptor is not None:
            os.close(descriptor)  # and with it the lock
        if made and os.listdir(made[0]) == [lock.name]:  # the claim made OUT and nothing more
            lock.unlink()
        for folder in made:
            try:
                os.rmdir(folder)  # only if empty
            except OSError:
                break
    HELD_FOLDERS.clear()


# Set to 1 by the book's launcher and tests: a run that succeeds then ends with os._exit(0).
FAST_EXIT = "DDP_SCRIPTS_FAST_EXIT"


def run_cli(main):
    """Call `main()` as a script's entry point, and end the process.

    Bad input (UsageError): one line on stderr, exit status 2; a run that had to stop
    (RunStopped), or another rank that ended first (peer_lost): one line, status 1;
    SIGTERM or Ctrl-C: one line; any other exception: Python's traceback, status 1. The
    error also goes to torchrun's error file for this worker (runfiles.py), where torchrun
    and the launcher read which rank failed and why.

    With DDP_SCRIPTS_FAST_EXIT=1, a run that succeeds ends with os._exit(0): it skips Python's
    slow way out after importing torch, but also atexit handlers and unflushed files, so only
    the book's launcher and tests set it; leave it unset for your own runs.
    """
    rank = os.environ.get("RANK")  # checked by ranks.require_torchrun, if the script needs it
    rank = int(rank) if rank and rank.isdigit() else None
    tag = f"[rank {rank}] " if rank is not None else ""
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
        sys.exit(0)
    except (UsageError, RunStopped) as error:
        status = 2 if isinstance(error, UsageError) else 1
        sys.stderr.write(f"{tag}error: {error}\n")  # one write: see say(); first, in case
        sys.stderr.flush()                         # the error file cannot be written
        _write_error_file(error, exit_code=status, rank=rank, with_stack=False)
        sys.exit(status)
    except KeyboardInterrupt as error:  # Ctrl-C, or SIGTERM (Terminated)
        end_interrupted(error, tag)
    except Exception as error:
        _write_error_file(error, exit_code=1, rank=rank)
        raise
    if os.environ.get(FAST_EXIT) == "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def peer_lost(error):
    """gloo's error on a rank whose peer's process ended (killed, say) in a collective, as a
    RunStopped (its traceback says nothing about why); any other error as it is."""
    if not any(text in str(error) for text in ("Connection reset by peer", "Connection closed by peer")):
        return error
    return RunStopped(f"another rank ended first ({type(error).__name__}: "
                      f"{first_line(error).split('. ')[0]}); its own output says why; the last "
                      "checkpoint saved, if any, is whole")


def end_interrupted(error, tag):
    """Ctrl-C or SIGTERM (cli.Terminated): one line, as the files are as the last finished
    epoch left them. Ctrl-C ends with exit status 130; SIGTERM ends the process by SIGTERM
    itself, as torchrun and shells expect (exit status 143 in a shell, -15 in Python)."""
    how = "SIGTERM" if isinstance(error, Terminated) else "Ctrl-C"
    sys.stderr.write(f"{tag}interrupted ({how}); the last checkpoint saved, if any, is whole\n")
    sys.stderr.flush()
    if isinstance(error, Terminated):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    sys.exit(130)


def _write_error_file(error, **details):
    """write_error_file, which must not turn one error into another: a log folder removed or
    full while the run went on loses the error file, not the error's line or exit status."""
    from ddp_scripts.runfiles import write_error_file  # for torchrun and the launcher, on failure
    try:
        write_error_file(error, **details)
    except OSError:
        pass  # the error's own line is out already; torchrun then reports the exit status


def cannot_write(option, path, error):
    """The UsageError for a path an option names that cannot be made or written (OSError)."""
    reason = ("Not a directory" if isinstance(error, FileExistsError)  # a file where a folder goes
              else error.strerror or first_line(error))
    where = f" ({error.filename})" if error.filename not in (None, str(path)) else ""
    return UsageError(f"{option} {path} cannot be written: {reason}{where}")


def first_line(error):
    """An exception's message in one line, for a one-line error or announcement."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def say(message):
    """Print one line, tagged with this process's rank, flushed at once.

    The line and its newline go out in one write: print() writes them apart, and with
    unbuffered output (PYTHONUNBUFFERED=1, as the launcher sets) two ranks' lines can mix.
    """
    sys.stdout.write(f"[rank {os.environ.get('RANK', '0')}] {message}\n")
    sys.stdout.flush()
