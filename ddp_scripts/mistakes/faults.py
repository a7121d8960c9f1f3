"""Inject a fault into a running job: kill one rank once an epoch is saved, like a crashed GPU.

    python ddp_scripts/mistakes/faults.py --out runs/ddp --after-epoch 1 --rank 1

run beside a torchrun job writing to runs/ddp waits for its checkpoint of epoch 1, then
sends SIGKILL to the worker whose RANK is 1. From Python, `kill_rank_after_epoch` does the
same in a background thread and reports what it saw: which process died, when, and when the
job had recovered (logged the next epoch).
"""
import argparse
import os
import signal
import threading
import time
from pathlib import Path

import psutil

from ddp_scripts.runfiles import CHECKPOINT, METRICS, logged_epochs


def processes_mentioning(text):
    """Every running process whose command line contains `text` (a script, an out dir). A
    process that has ended but not been waited for (a zombie) has an empty command line in
    /proc, which psutil reads as None: it mentions nothing, so it is never counted."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if text in cmdline and proc.pid != os.getpid():
            found.append(proc)
    return found


def workers_of(out):
    """The training processes writing to `out` (torchrun's children, not torchrun itself)."""
    workers = []
    for proc in processes_mentioning(str(out)):
        try:
            if "torch.distributed.run" not in " ".join(proc.cmdline()):
                workers.append(proc)
        except psutil.Error:  # it has just ended
            pass
    return workers


def saved_epoch_done(out, epoch):
    """True once epoch `epoch` is logged and its checkpoint written (the save follows the log)."""
    metrics, checkpoint = Path(out) / METRICS, Path(out) / CHECKPOINT
    try:
        return (max(logged_epochs(out), default=0) >= epoch
                and checkpoint.stat().st_mtime >= metrics.stat().st_mtime)
    except OSError:
        return False


class RankKiller(threading.Thread):
    """Waits for `after_epoch` to be saved in `out`, then kills the worker with RANK=`rank`."""

    def __init__(self, out, after_epoch=1, rank=1, sig=signal.SIGKILL, give_up_s=600):
        super().__init__(daemon=True)
        self.out, self.after_epoch, self.rank, self.sig = Path(out), after_epoch, rank, sig
        self.give_up_s = give_up_s
        self.killed_pid = self.killed_at = self.epochs_at_kill = None
        self.recovered_at = None

    def run(self):
        deadline = time.monotonic() + self.give_up_s
        while time.monotonic() < deadline and self.killed_pid is None:
            if saved_epoch_done(self.out, self.after_epoch):
                self._kill()
            time.sleep(0.05)
        while time.monotonic() < deadline and self.killed_pid is not None:
            if max(logged_epochs(self.out), default=0) > max(self.epochs_at_kill, default=0):
                self.recovered_at = time.monotonic()  # a restarted worker group logged an epoch
                return
            time.sleep(0.05)

    def _kill(self):
        for proc in workers_of(self.out):
            try:
                if proc.environ().get("RANK") == str(self.rank):
                    self.epochs_at_kill = logged_epochs(self.out)
                    proc.send_signal(self.sig)
                    self.killed_pid, self.killed_at = proc.pid, time.monotonic()
                    return
            except psutil.Error:  # it ended by itself in the meantime
                pass

    def report(self):
        """One line: what was killed, and how long the job took to log its next epoch."""
        if self.killed_pid is None:
            return f"no rank {self.rank} was killed (epoch {self.after_epoch} never saved?)"
        recovery = (f"the next epoch was logged {self.recovered_at - self.killed_at:.1f} s later"
                    if self.recovered_at else "no epoch was logged after it")
        return (f"killed rank {self.rank} (pid {self.killed_pid}) with {self.sig.name} after "
                f"epochs {self.epochs_at_kill} were saved; {recovery}")


def kill_rank_after_epoch(out, after_epoch=1, rank=1, sig=signal.SIGKILL):
    """Start a RankKiller thread and return it; call .report() once the job has ended."""
    killer = RankKiller(out, after_epoch, rank, sig)
    killer.start()
    return killer


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the job's output directory")
    parser.add_argument("--after-epoch", type=int, default=1)
    parser.add_argument("--rank", type=int, default=1)
    args = parser.parse_args()
    killer = kill_rank_after_epoch(args.out, args.after_epoch, args.rank)
    killer.join()
    print(killer.report())
