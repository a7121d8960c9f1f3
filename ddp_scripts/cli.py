"""How a companion script starts, talks and ends: run_cli, say, and the one-line errors' kinds.

Bad input is a UsageError: one line on stderr, exit status 2. A run that cannot go on is a
RunStopped: one line, exit status 1. A run with nothing to do is a NothingToDo: one line,
exit status 0. say() prints one line, tagged with the process's rank. The errors are defined
in mishaps.py, with the rarer ways a run stops and the exit status each ends with
(end_early); every script imports them from here. As a run ends, run_cli lets go of the
folders it holds (out_dir.hold). A torchrun worker on Linux also ends with its torchrun, if
that dies first (end_with_parent).
"""
import contextlib
import os
import signal
import sys
import threading
import time

from ddp_scripts.mishaps import NothingToDo, RunStopped, Terminated, UsageError, first_line

__all__ = ["FAST_EXIT", "HELD_FOLDERS", "NothingToDo", "RunStopped", "Terminated", "UsageError",
           "first_line", "let_go_of_folders", "run_cli", "say"]


def _terminated(*signal_and_frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the parent-death signal may come again
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


# The folders this process holds while its script runs (out_dir.claim_out_dir): each
# path's open, locked descriptor (or None), the folders the claim made, deepest first, and
# the lock file.
HELD_FOLDERS = {}


def let_go_of_folders():
    """run_cli's last step: remove each lock file, then unlock it (out_dir.hold), and
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
    and exit status 2 (as is a run too large for its GPU's memory); RunStopped one line
    and 1 (as is another rank that ended first); NothingToDo one line and 0; SIGTERM or
    Ctrl-C one line; any other exception Python's traceback and 1. Failures also go to
    torchrun's error file (runfiles.py), where torchrun and the launcher read which rank
    failed and why (mishaps.end_early)."""
    previous = signal.signal(signal.SIGTERM, _terminated)  # in the main thread: a script's
    try:
        try:
            if "TORCHELASTIC_RUN_ID" in os.environ and end_with_parent is not None:  # a worker
                end_with_parent()  # of torchrun: it ends when torchrun does
                threading.Thread(target=_end_if_orphaned, daemon=True).start()
            main()
        finally:
            let_go_of_folders()
    except (Exception, KeyboardInterrupt) as error:
        from ddp_scripts.mishaps import end_early  # only a run that did not go as planned
        end_early(error, say)  # exits, unless the error is none of the above:
        raise
    finally:  # the process may go on (a test runs the script in its own process)
        signal.signal(signal.SIGTERM, previous)
    if os.environ.get(FAST_EXIT) == "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _end_if_orphaned(grace_s=10.0):
    """A torchrun worker's watch. Once torchrun has ended, its SIGTERM ends the run with one
    line; but Python runs a signal handler only between steps of its own, not while the
    process waits in C++ (for the rendezvous, say, up to --timeout-s). So this thread sends
    the SIGTERM itself once it sees a new parent (torchrun may have ended before the process
    asked for the signal), and, `grace_s` later, if the handler has still not run, says the
    line and ends the process, with exit status 143 (128 + SIGTERM). A torchrun that ended before this process
    imported cli.py (PARENT is then already its new parent) goes unnoticed: that process ends
    at --timeout-s."""
    while os.getppid() == PARENT:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)  # should the parent have ended before end_with_parent
    time.sleep(grace_s)
    if signal.getsignal(signal.SIGTERM) is _terminated:  # the handler has not run
        sys.stderr.write(f"[rank {os.environ.get('RANK', '0')}] interrupted (SIGTERM: torchrun, "
                         "which started this process, has ended; ended in a wait that Python "
                         "could not interrupt); the last checkpoint saved, if any, is whole\n")
        sys.stderr.flush()
        os._exit(128 + signal.SIGTERM)  # as a shell reports a process ended by SIGTERM


if sys.platform == "linux":
    import ctypes
    _prctl = ctypes.CDLL(None).prctl  # looked up here: the launcher calls end_with_parent in a
    # child between fork and exec, where little more than a call is safe

    def end_with_parent():
        """Ask Linux to send this process SIGTERM when its parent ends (PR_SET_PDEATHSIG;
        strictly, when the parent's thread that started it exits, and it may come again as
        the parent's other threads exit): a torchrun killed by SIGKILL, which it cannot pass
        on, or a notebook kernel that dies, then takes its workers with it."""
        _prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
else:  # no parent-death signal: a worker whose torchrun was killed trains on (chapter 8)
    end_with_parent = None


def say(message):
    """Print one line, tagged with this process's rank, in one write (print() writes the
    newline apart, and two ranks' unbuffered lines could mix)."""
    sys.stdout.write(f"[rank {os.environ.get('RANK', '0')}] {message}\n")
    sys.stdout.flush()
