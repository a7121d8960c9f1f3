"""Run a companion script from a notebook, under torchrun or as one process, and read its log.

DistributedDataParallel needs one process per rank, which a notebook kernel cannot be. So a
notebook calls `run_script(...)`: it starts the script as a subprocess (no shell), streams
every rank's output into the notebook as it comes, and returns metrics.jsonl as a DataFrame.
Whatever happens (failure, timeout, a kernel interrupt) the whole process tree is ended;
on Linux, even when the kernel itself dies.

    from ddp_scripts.launcher import run_script
    df = run_script("train_ddp.py", nproc=2, out="runs/ddp", dataset="synthetic", epochs=2)
"""
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent


class LaunchError(RuntimeError):
    """A launched run failed. Carries the failing rank, its exit code and its last lines."""

    def __init__(self, message, rank=None, exit_code=None, tail=""):
        super().__init__(message)
        self.rank, self.exit_code, self.tail = rank, exit_code, tail


class LaunchTimeout(LaunchError):
    """A launched run took longer than its timeout and was ended."""


def free_port():
    """A TCP port nobody listens on right now, for the rendezvous of the next run."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_cli(options):
    """{"batch_size": 32, "resume": True} -> ["--batch-size", "32", "--resume"]."""
    args = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is not False and value is not None:  # 0 is a value, False is "off"
            args += [flag, str(value)]
    return args


def torchrun_command(script, nproc=2, script_args=(), port=None, torchrun_args=()):
    """The command line torchrun would be given in a terminal, as a list (no shell)."""
    port = port or free_port()
    return [sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "1", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(port),
            *torchrun_args, str(SCRIPTS / script), *script_args]


def run_script(script, nproc=2, out=None, timeout=600, torchrun=None, progress="auto",
               torchrun_args=(), env=None, echo=print, **options):
    """Run `script` from ddp_scripts/ and return its metrics as a pandas DataFrame.

    script   e.g. "train_ddp.py" (under torchrun) or "train_single.py" (one process)
    nproc    processes for torchrun; ignored for single-process scripts
    out      output directory (the script's --out); metrics are read from there
    timeout  seconds before the whole run is ended and LaunchTimeout raised
    torchrun None: decide by the script's name (train_ddp -> torchrun)
    progress "auto": a progress bar in an interactive notebook, plain lines otherwise
    echo     called with each output line (default: print it)
    options  the script's own options, as keywords: epochs=2, batch_size=32, resume=True
    """
    if out is not None:
        options["out"] = str(out)
    if torchrun is None:
        torchrun = "ddp" in Path(script).stem
    script_args = as_cli(options)
    if torchrun:
        command = torchrun_command(script, nproc, script_args, torchrun_args=torchrun_args)
    else:
        command = [sys.executable, str(SCRIPTS / script), *script_args]
    total = options.get("epochs")
    run_command(command, timeout=timeout, progress=progress, total_epochs=total, env=env,
                echo=echo)
    return read_metrics(out) if out is not None else None


def read_metrics(out):
    """metrics.jsonl as a DataFrame, one row per epoch."""
    import pandas as pd
    path = Path(out) / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return pd.DataFrame(rows)


def run_command(command, timeout=600, progress="auto", total_epochs=None, env=None, echo=print):
    """Run `command`, stream its output, end its process tree whatever happens.

    Returns the output lines. Raises LaunchError (non-zero exit), LaunchTimeout, or
    KeyboardInterrupt (after cleaning up) on an interrupt.
    """
    # OMP_NUM_THREADS set here spares every run torchrun's banner about it; the scripts
    # choose their own thread count (cores / processes) anyway.
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.setdefault("OMP_NUM_THREADS", "1")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, text=True, env=full_env,
                               start_new_session=True, bufsize=1, preexec_fn=_end_with_parent)
    lines, bar = [], _progress_bar(progress, total_epochs)
    reader = queue.Queue()
    threading.Thread(target=_pump, args=(process.stdout, reader), daemon=True).start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                line = reader.get(timeout=max(0.0, min(0.2, deadline - time.monotonic())))
            except queue.Empty:
                line = ""
            if line is None:  # output closed: the process has ended or is ending
                process.wait(timeout=max(1.0, deadline - time.monotonic()))
                break
            if line:
                lines.append(line)
                _show(line, bar, echo)
            if time.monotonic() > deadline:
                raise LaunchTimeout(f"run did not finish within {timeout:g} s and was ended",
                                    tail="\n".join(lines[-15:]))
    except subprocess.TimeoutExpired:
        raise LaunchTimeout(f"run did not finish within {timeout:g} s and was ended",
                            tail="\n".join(lines[-15:])) from None
    finally:
        end_process_tree(process)
        if bar is not None:
            bar.close()
    if process.returncode != 0:
        raise failure_from_output(process.returncode, lines)
    return lines


if sys.platform == "linux":
    import ctypes
    _prctl = ctypes.CDLL(None).prctl  # looked up here: between fork and exec it is only called

    def _end_with_parent():
        """Runs in the child before it starts: should the kernel die (killed, out of memory),
        Linux sends the child SIGTERM, and torchrun ends its workers instead of going on."""
        _prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
else:
    _end_with_parent = None


def _pump(stream, reader):
    for line in stream:
        reader.put(line.rstrip("\n"))
    reader.put(None)


def _progress_bar(progress, total_epochs):
    if progress == "auto":
        progress = _in_interactive_notebook()
    if not progress or not total_epochs:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total_epochs, desc="epochs", unit="epoch")


def _in_interactive_notebook():
    """True in a notebook someone is looking at; False under nbmake, CI, or a terminal."""
    if os.environ.get("CI") or "PYTEST_CURRENT_TEST" in os.environ:
        return False
    try:
        from IPython import get_ipython
        shell = get_ipython()
    except ImportError:
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


EPOCH_LINE = re.compile(r"\[rank 0\] epoch (\d+)/(\d+)")


def _show(line, bar, echo):
    if bar is None:
        echo(line)
        return
    match = EPOCH_LINE.search(line)
    if match:
        bar.update(int(match.group(1)) - bar.n)
    # Printed lines go above the bar; a caller's own echo (collecting lines) still gets them.
    (bar.write if echo is print else echo)(line)


def end_process_tree(process, grace_s=5.0):
    """Terminate `process` and every process it started (torchrun's workers run in sessions
    of their own, so a process-group kill would miss them), then kill what is left."""
    import psutil
    try:
        parent = psutil.Process(process.pid)
        tree = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for proc in tree:
        _signal(proc, signal.SIGTERM)
    _, alive = psutil.wait_procs(tree, timeout=grace_s)
    for proc in alive:
        _signal(proc, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=grace_s)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    if process.stdout:
        process.stdout.close()


def _signal(proc, sig):
    try:
        proc.send_signal(sig)
    except Exception:  # already gone
        pass


SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)", re.M)
SUMMARY_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)", re.M)
OUR_ERROR = re.compile(r"^\[rank (\d+)\] error: (.*)$")
# Once its process group is up, a worker's traceback comes with "[rank0]: " on every line.
RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")
EXCEPTION_LINE = re.compile(r"^(\[rank\d+\]:)?\s*\w+(\.\w+)*(Error|Exception|Interrupt)(:|$)")


def failure_from_output(exit_code, lines):
    """Build a LaunchError from a failed run's output: which rank, which code, what it said.

    torchrun ends a failed run with a summary naming the first failing rank and its exit
    code; the companion scripts print bad input as one line "[rank N] error: ...".
    """
    text = "\n".join(lines)
    tail = "\n".join(lines[-25:])
    failures = text.rsplit("Failures:", 1)[-1] if "Failures:" in text else text
    root = text.rsplit("Root Cause", 1)[-1] if "Root Cause" in text else failures
    rank_match, exit_match = SUMMARY_RANK.search(root), SUMMARY_EXIT.search(root)
    rank = int(rank_match.group(1)) if rank_match else None
    code = int(exit_match.group(1)) if exit_match else exit_code
    ours = [OUR_ERROR.match(line) for line in lines]
    ours = [m for m in ours if m]
    plain = [line for line in lines if line.startswith("error: ")]
    if ours:
        rank = int(ours[0].group(1)) if rank is None else rank
        reason = ours[0].group(2)
    elif plain:
        reason = plain[0][len("error: "):]
    else:
        # The first exception line is the rank's own; torchrun's ChildFailedError follows.
        errors = [i for i, line in enumerate(lines)
                  if EXCEPTION_LINE.match(line) and "ChildFailedError" not in line]
        reason = RANK_PREFIX.sub("", lines[errors[0]]).strip() if errors else f"exit code {code}"
        if errors:  # the failing rank's own traceback, not torchrun's
            starts = [i for i in range(errors[0])
                      if RANK_PREFIX.sub("", lines[i]).startswith("Traceback")]
            tail = "\n".join(lines[starts[-1] if starts else max(0, errors[0] - 15):errors[0] + 1])
    who = f"rank {rank}" if rank is not None else "the run"
    return LaunchError(f"{who} failed with exit code {code}: {reason}", rank=rank,
                       exit_code=code, tail=tail)
