"""The deadlock of a rank that hangs as it exits, in miniature, with no torch (Linux).

    python ddp_scripts/mistakes/exit_hang.py

On torch 2.11-2.13, a DDP rank that freed its model after destroy_process_group() could hang
at its very end (chapter 8). Its main thread held Python's GIL and waited for a gloo thread,
and that thread waited for the GIL.

This program ties the same knot. The main thread waits for a worker thread from C code that
keeps the GIL: a function called through ctypes.PyDLL keeps it, through ctypes.CDLL it would
be released. The worker, to go on, needs the GIL. Like a training script, the program has a
Python handler for SIGTERM. Python runs such a handler only once the main thread is back in
Python code, which never happens here: SIGTERM does nothing, and only SIGKILL ends it.

The knot is tied whatever the timing: the main thread's pthread_cond_wait releases the mutex
the worker waits for only once it waits itself, holding the GIL. glibc's mutex and condition
start as zero bytes, so this runs on Linux only.
"""
import ctypes
import signal
import sys
import threading
import time
from pathlib import Path

RELEASING_THE_GIL = ctypes.CDLL(None)  # libc, its calls made without the GIL
KEEPING_THE_GIL = ctypes.PyDLL(None)  # the same functions, called with the GIL held


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("the SIGTERM handler ran"))
    mutex, wake = ctypes.create_string_buffer(64), ctypes.create_string_buffer(64)  # zeros
    RELEASING_THE_GIL.pthread_mutex_lock(mutex)

    def worker():
        RELEASING_THE_GIL.pthread_mutex_lock(mutex)  # waits until main waits below
        RELEASING_THE_GIL.pthread_cond_signal(wake)  # to get here, it needs the GIL again
        RELEASING_THE_GIL.pthread_mutex_unlock(mutex)

    threading.Thread(target=worker, daemon=True).start()
    print("main thread: waiting for the worker, holding the GIL", flush=True)
    KEEPING_THE_GIL.pthread_cond_wait(wake, mutex)  # lets go of the mutex, not of the GIL
    print("main thread: never printed")


def wait_until_asleep(pid, limit_s=60):
    """Return once process `pid`'s main thread sleeps in the kernel (state S in /proc), as it
    does in pthread_cond_wait; False if it ended or `limit_s` passed first."""
    stat = Path(f"/proc/{pid}/task/{pid}/stat")
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "S":
                return True
        except (OSError, IndexError):
            return False
        time.sleep(0.01)
    return False


if __name__ == "__main__":
    main()
