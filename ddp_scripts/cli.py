"""How a companion script starts, talks and ends: run_cli, say, and the one-line errors.

Bad input is a UsageError: one line on stderr, exit status 2. A run that cannot go on is a
RunStopped: one line, exit status 1. A run with nothing to do is a NothingToDo: one line,
exit status 0. say() prints one line, tagged with the process's rank. The errors are defined
in mishaps.py, with the rarer ways a run stops; every script imports them from here.
"""
import contextlib
import os
import signal
import sys
import time

from ddp_scripts.mishaps import NothingToDo, RunStopped, Terminated, UsageError, first_line

__all__ = ["FAST_EXIT", "HELD_FOLDERS", "NothingToDo", "RunStopped", "Terminated", "UsageError",
           "first_line", "let_go_of_folders", "run_cli", "say"]


def _terminated(*signal_and_frame):
    raise Terminated("torchrun, which started this process, has ended"
                     if "TORCHELASTIC_RUN_ID" in os.environ and parent_ended() else "")


def parent_ended(wait_s=0.5):
    """Whether the process that started this one has ended. The parent-death signal comes as
    the thread that started this process ends, a moment before the rest of its process: so
    wait up to `wait_s` for this process to be handed to another parent."""
    deadline = time.monotonic() + wait_s
    while os.getppid() == PARENT and time.monotonic() < deadline:
        time.sleep(0.01)
    return os.getppid() != PARENT


# The folders this process holds while its script runs (checkpoints.claim_out_dir): each
# path's open, locked descriptor (or None), the folders the claim made, deepest first, and
# the lock file.
HELD_FOLDERS = {}


def let_go_of_folders():
    """run_cli's last step: remove each lock file, then unlock it (checkpoints.hold), and
    remove the folders the claim made if the script left nothing in them."""
    for descriptor, made, lock in HELD_FOLDERS.values():
        if descriptor is not None:
            with contextlib.suppress(FileNotFoundError):  # only the empty file it locked:
                if os.path.samestat(mine := os.fstat(descriptor), os.stat(lock)) and not mine.st_size:
                    lock.unlink()  # not another run's or program's
            os.close(descriptor)  # and with it the lock
        for folder in made:  # deepest first: one the script wrote in stays, and so its parents
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # only if empty
    HELD_FOLDERS.clear()


PARENT = os.getppid()  # the process that started this one (torchrun, for its workers)

# Set to 1 by the book's launcher and tests only: a run that succeeds then ends with
# os._exit(0), which skips Python's slow way out after importing torch, but also atexit
# handlers and unflushed files; leave it unset for your own runs.
FAST_EXIT = "DDP_SCRIPTS_FAST_EXIT"


def run_cli(main):
    """Call `main()` as a script's entry point, and end the process: UsageError is one line
    and exit status 2; RunStopped one line and 1 (as is another rank that ended first);
    NothingToDo one line and 0; SIGTERM or Ctrl-C one line; any other exception Python's
    traceback and 1. Failures also go to torchrun's error file (runfiles.py), where torchrun
    and the launcher read which rank failed and why (mishaps.end_early)."""
    previous = signal.signal(signal.SIGTERM, _terminated)  # in the main thread: a script's
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a worker of torchrun: it ends when torchrun does
        end_with_parent()
        if os.getppid() != PARENT:  # torchrun was gone already, before the call
            os.kill(os.getpid(), signal.SIGTERM)
    try:
        try:
            main()
        finally:  # the process may go on (a test runs the script in its own process)
            let_go_of_folders()
            signal.signal(signal.SIGTERM, previous)
    except (Exception, KeyboardInterrupt) as error:
        from ddp_scripts.mishaps import end_early  # only a run that did not go as planned
        end_early(error, say)  # exits, unless the error is none of the above:
        raise
    if os.environ.get(FAST_EXIT) == "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if sys.platform == "linux":
    import ctypes
    _prctl = ctypes.CDLL(None).prctl  # looked up here: the launcher calls end_with_parent in a
    # child between fork and exec, where little more than a call is safe

    def end_with_parent():
        """Ask Linux to send this process SIGTERM when its parent ends (PR_SET_PDEATHSIG): a
        torchrun killed by SIGKILL, or a notebook kernel that dies, then takes its workers
        with it instead of leaving them to train on (torchrun cannot pass SIGKILL on: it
        cannot be caught)."""
        _prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
else:
    def end_with_parent():
        """No parent-death signal outside Linux: a worker whose torchrun was killed by SIGKILL
        trains on until it is ended by its own process id (chapter 8)."""


def say(message):
    """Print one line, tagged with this process's rank, in one write (print() writes the
    newline apart, and two ranks' unbuffered lines could mix)."""
    sys.stdout.write(f"[rank {os.environ.get('RANK', '0')}] {message}\n")
    sys.stdout.flush()
