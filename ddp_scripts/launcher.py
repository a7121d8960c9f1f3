"""Run a companion script from a notebook, under torchrun or as one process, and read its log.

DistributedDataParallel needs one process per rank, which a notebook kernel cannot be. So a
notebook calls `run_script(...)`: it starts the script as a subprocess (no shell), streams
every rank's output into the notebook as it comes, and returns metrics.jsonl as a DataFrame.
Whatever happens (failure, timeout, a kernel interrupt) the whole process tree is ended;
on Linux, even when the kernel itself dies.

    from ddp_scripts.launcher import run_script
    df = run_script("train_ddp.py", nproc=2, out="runs/ddp", dataset="synthetic", epochs=2)
    df = run_script("train_single.py", out="runs/one", dataset="synthetic", epochs=2)

Nothing printed is parsed: progress comes from the run's metrics.jsonl, and a failure from
the JSON error file each rank writes (ddp_scripts/runfiles.py) in torchrun's --log-dir.
"""
import atexit
import contextlib
import io
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ddp_scripts.cli import FAST_EXIT, end_with_parent
from ddp_scripts.runfiles import (ERROR_FILE_NAME, ERROR_FILE_VARIABLE, logged_epochs,
                                  metrics_rows, ranks_without_error_file, read_error_files)

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent


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


def torchrun_command(script, nproc=2, script_args=(), port=None, torchrun_args=(),
                     log_dir=None):
    """The command line torchrun would be given in a terminal, as a list (no shell).

    `log_dir` is torchrun's --log-dir, where each worker's error file goes (a new temporary
    folder by default, removed by run_command once it has read it)."""
    port = port or free_port()
    if log_dir is None:
        log_dir = tempfile.mkdtemp(prefix="torchrun-")
        _TEMPORARY_LOG_DIRS.add(log_dir)
    return [sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "1", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(port), "--log-dir", str(log_dir),
            *torchrun_args, str(SCRIPTS / script), *script_args]


# The --log-dir folders torchrun_command made: run_command removes each one it ran; a command
# run otherwise (subprocess.run, as chapter 8 does) has its folder removed as Python exits.
_TEMPORARY_LOG_DIRS = set()


@atexit.register
def _remove_temporary_log_dirs():
    for folder in _TEMPORARY_LOG_DIRS:
        shutil.rmtree(folder, ignore_errors=True)


def run_script(script, nproc=None, out=None, timeout=600, progress="auto", torchrun_args=(),
               env=None, echo=print, show_command=False, log_dir=None, **options):
    """Run `script` from ddp_scripts/ and return its metrics as a pandas DataFrame.

    script   e.g. "train_ddp.py" or "train_single.py"
    nproc    None: one process, `python script`; a number: that many under torchrun
    out      output directory (the script's --out); metrics are read from there
    timeout  seconds before the whole run is ended and LaunchTimeout raised
    progress "auto": a progress bar in an interactive notebook, plain lines otherwise
    echo     called with each output line (default: print it)
    show_command  first echo the command line this runs, as a shell would take it
    log_dir  torchrun's --log-dir, where each rank's error file goes, kept after the run
             (None: a temporary folder, removed once read)
    options  the script's own options, as keywords: epochs=2, batch_size=32, resume=True
    """
    if out is not None:
        options["out"] = str(out)
    script_args = as_cli(options)
    if nproc is None:
        command = [sys.executable, str(SCRIPTS / script), *script_args]
    else:
        command = torchrun_command(script, nproc, script_args, torchrun_args=torchrun_args,
                                   log_dir=log_dir)
    if show_command:
        echo("$ " + shell_line(command, env))
    run_command(command, timeout=timeout, progress=progress, out=out,
                total_epochs=options.get("epochs"), env=env, echo=echo)
    return read_metrics(out) if out is not None else None


def added_environment(env=None):
    """The variables a run gets on top of this process's: `env`, and the launcher's own.
    PYTHONUNBUFFERED makes every line arrive as it is printed; DDP_SCRIPTS_FAST_EXIT ends a
    companion script at once when it has finished (cli.run_cli: the book runs many short
    runs); OMP_NUM_THREADS set here spares every run torchrun's banner about it (the scripts
    choose their own thread count, cores / processes, anyway)."""
    added = {"PYTHONUNBUFFERED": "1", FAST_EXIT: "1", **(env or {})}
    if "OMP_NUM_THREADS" not in os.environ:
        added.setdefault("OMP_NUM_THREADS", "1")
    return added


def shell_line(command, env=None):
    """`command`, run with `env`, as one line a reader types in a shell: the variables the
    launcher adds first, but for the book's own two (the error file's, a temporary path, and
    DDP_SCRIPTS_FAST_EXIT, which cli.run_cli asks to leave out of your own runs), this Python
    as `python` (`torchrun` for its `-m torch.distributed.run`: the same program), every word
    quoted where it must be, paths inside the repository relative to it (run it from there)."""
    variables = [f"{name}={shlex.quote(value)}" for name, value in added_environment(env).items()
                 if name != FAST_EXIT]
    words = [str(word) for word in command]
    if words[:3] == [sys.executable, "-m", "torch.distributed.run"]:
        words = ["torchrun", *words[3:]]
    elif words[:1] == [sys.executable]:
        words = ["python", *words[1:]]
    return " ".join([*variables, shlex.join(repository_relative(word) for word in words)])


def repository_relative(word):
    """An absolute path inside the repository, relative to it; anything else unchanged
    (the commands shown and the benchmark's results files name paths so)."""
    if not Path(word).is_absolute():
        return word
    try:
        return str(Path(word).resolve().relative_to(ROOT.resolve()))
    except (ValueError, OSError):
        return word


def read_metrics(out):
    """metrics.jsonl as a DataFrame, one row per epoch."""
    import pandas as pd
    return pd.DataFrame(metrics_rows(out, strict=True))


def run_main(main, argv, env=None):
    """A companion script's main() in this process, as the command line `argv` would run it
    (a new process per run would spend seconds importing torch): sys.argv is `argv` and
    `env` is added to os.environ for the call; both, and torch's thread count, are restored
    after. Returns the lines it printed."""
    argv = [str(word) for word in argv]
    import torch
    saved_argv, saved_env, threads = sys.argv, dict(os.environ), torch.get_num_threads()
    # The script's clock, START, was read when it was imported: once in this process, for
    # its first run. Each run restarts it, so that its start-up is its own (run.json).
    clock, saved_clock = main.__globals__, main.__globals__.get("START")
    printed = io.StringIO()
    try:
        sys.argv = argv
        os.environ.update(env or {})
        if saved_clock is not None:
            clock["START"] = time.perf_counter()
        with contextlib.redirect_stdout(printed):
            main()
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(threads)
        if saved_clock is not None:
            clock["START"] = saved_clock
    return printed.getvalue().splitlines()


def run_command(command, timeout=600, progress="auto", out=None, total_epochs=None, env=None,
                echo=print):
    """Run `command`, stream its output, end its process tree whatever happens.

    Returns the output lines. Raises LaunchError (non-zero exit: which rank failed, with what
    exit status and why, from the ranks' error files), LaunchTimeout, or KeyboardInterrupt
    (after cleaning up) on an interrupt. With `out` and `total_epochs`, an interactive
    notebook shows a progress bar that follows OUT/metrics.jsonl. Once the command has
    exited, what it left running in its session, or among the processes seen as its
    descendants (a background child that keeps its output open, say), is ended too, and the
    command's own exit status counts. A process that left the session with setsid once its
    parent had ended cannot be found: it runs on.
    """
    # Where failures are recorded: torchrun's --log-dir for its workers' error files; the
    # variable, for a single process (or for torchrun's own failure, such as a rendezvous
    # that times out).
    log_dir = command[command.index("--log-dir") + 1] if "--log-dir" in command else None
    error_dir = log_dir or tempfile.mkdtemp(prefix="launch-")
    full_env = {**os.environ, **added_environment(env),
                ERROR_FILE_VARIABLE: str(Path(error_dir) / ERROR_FILE_NAME)}
    lines, bar = [], _progress_bar(progress, total_epochs if out is not None else None)

    def show(line):
        lines.append(line)
        (bar.write if bar is not None and echo is print else echo)(line)

    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, text=True, errors="replace",
                                    env=full_env, start_new_session=True, bufsize=1,
                                    # should the notebook's kernel die (killed, out of memory), Linux sends
                                    # torchrun SIGTERM, and torchrun ends its workers
                                    preexec_fn=end_with_parent)
        tree = _Tree(process)
        reader = queue.Queue()
        threading.Thread(target=_pump, args=(process.stdout, reader), daemon=True).start()
        deadline = time.monotonic() + timeout
        output_open, exited_at = True, None
        try:
            while output_open or exited_at is None:
                now = time.monotonic()
                if now > deadline:
                    raise LaunchTimeout(f"run did not finish within {timeout:g} s and was ended",
                                        tail="\n".join(lines[-15:]))
                if exited_at is None and tree.exited():
                    exited_at = now
                elif exited_at is not None and now > exited_at + OUTPUT_AFTER_EXIT_S:
                    break  # a process the command left holds its output: ended below
                try:
                    line = reader.get(timeout=max(0.0, min(0.2 if output_open else 0.05,
                                                           deadline - now)))
                except queue.Empty:
                    line = ""
                if line is None:  # output closed: the command has ended or is ending
                    output_open = False
                elif line:
                    show(line)
                if bar is not None:
                    bar.update(len(logged_epochs(out)) - bar.n)
                tree.note_descendants()
        finally:
            end_process_tree(process, seen=tree.seen)
            if bar is not None:
                bar.close()
        # what is left in the pipe: once every process that held it has ended, its end comes
        ends = time.monotonic() + OUTPUT_AFTER_EXIT_S
        while output_open and (line := _next_line(reader, ends)) is not False:
            if line is None:
                break
            show(line)
        if process.returncode != 0:
            errors = read_error_files(error_dir)
            raise (port_taken(command, errors, process.returncode, lines)
                   or failure(process.returncode, errors, lines,
                              ranks_without_error_file(error_dir)))
    finally:
        if log_dir is None or log_dir in _TEMPORARY_LOG_DIRS:
            shutil.rmtree(error_dir, ignore_errors=True)
            _TEMPORARY_LOG_DIRS.discard(error_dir)
    return lines


# How long the output of a command that has exited is read on: its last lines are in the pipe
# already, and a process that keeps the pipe open after that is one it left running.
OUTPUT_AFTER_EXIT_S = 1.0


def _next_line(reader, until):
    """The next line from `reader`, None at the end of the output, False at `until`."""
    try:
        return reader.get(timeout=max(0.0, until - time.monotonic()))
    except queue.Empty:
        return False


# torchrun's own error when its rendezvous port is in use: torch >= 2.4 (its libuv TCPStore)
# says "port: 29500 ... EADDRINUSE", older versions "bind to [::]:29500 (errno: 98 - Address
# already in use)".
ADDRESS_IN_USE = re.compile(r"EADDRINUSE|address already in use", re.IGNORECASE)
PORT_IN_MESSAGE = re.compile(r"port: (\d+)|:(\d+) \(errno")


def port_taken(command, errors, exit_code, lines):
    """A LaunchError in one line when torchrun (`command`) failed because its rendezvous port
    was in use: torchrun's own error file (rank None: no rank started) says so. None otherwise."""
    if "torch.distributed.run" not in command and Path(str(command[0])).name != "torchrun":
        return None
    own = [error for error in errors if error["rank"] is None
           and ADDRESS_IN_USE.search(error["reason"])]
    if not own:
        return None
    found = PORT_IN_MESSAGE.search(own[0]["reason"])
    port = next((group for group in found.groups() if group), None) if found else None
    stack = own[0].get("message", {}).get("extraInfo", {}).get("py_callstack", "")
    return LaunchError(f"port {port or 'given'} is taken (EADDRINUSE: torchrun could not start "
                       f"its rendezvous there, no rank started): choose another port, or leave "
                       f"it out to use a free one", exit_code=exit_code,
                       tail=stack.strip() or "\n".join(lines[-25:]))


# How a rank reports that another rank is gone (gloo, nccl, a socket): it failed for lack of
# that rank, which is the one to read about. The companion scripts say so in their error file
# (`lost_peer`); the words are for the files other scripts write.
LOST_PEER = re.compile(r"by peer|Connection (?:reset|closed|refused)|remote process|Broken pipe",
                       re.IGNORECASE)


def lost_a_peer(error):
    """Whether a rank's error file says it stopped because another rank ended first."""
    return bool(error.get("lost_peer")) or bool(LOST_PEER.search(error["reason"]))


def failure(exit_code, errors, lines, silent=()):
    """A LaunchError from the error files of a failed run: the first rank that failed, its
    exit status and its reason. A rank that lost a peer failed because of another, whatever
    the order of their files: the first rank that failed on its own is named, else the first
    silent rank (killed by a signal, it writes no error file: runfiles.ranks_without_error_file),
    as torchrun names it. With no error file at all: the run's own exit status, and the last
    lines it printed."""
    own = [error for error in errors if not lost_a_peer(error)]
    if errors and silent and not own:
        rank = silent[0]
        return LaunchError(f"rank {rank} ended without an error file (killed by a signal?); "
                           f"then rank {errors[0]['rank']} failed: {errors[0]['reason']}"[:600],
                           rank=rank, exit_code=exit_code, tail="\n".join(lines[-25:]))
    if not errors:   # then what it printed last is all there is to say why
        last = " | ".join(line.strip() for line in lines[-4:]) or "nothing"
        return LaunchError(f"the run failed with exit code {exit_code} and left no error "
                           f"file (killed by a signal, or ended before it started); it "
                           f"printed last: {last}", exit_code=exit_code,
                           tail="\n".join(lines[-25:]))
    first = (own or errors)[0]
    rank, code = first["rank"], first["exit_code"]
    stack = first.get("message", {}).get("extraInfo", {}).get("py_callstack", "")
    who = f"rank {rank}" if rank is not None else "the run"
    return LaunchError(f"{who} failed with exit code {code}: {first['reason']}", rank=rank,
                       exit_code=code, tail=stack.strip() or "\n".join(lines[-25:]))


def _pump(stream, reader):
    """Put each line of `stream` on `reader`, then None at its end. This thread alone reads
    the stream, and it closes it: a close from another thread would wait for its read."""
    try:
        with stream:
            for line in stream:
                reader.put(line.rstrip("\n"))
    finally:
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


class _Tree:
    """A running command's processes: itself, and the descendants seen while it runs (a
    process whose parent has ended is no one's descendant any more)."""

    def __init__(self, process):
        import psutil
        self.seen, self._next_look = set(), 0.0
        try:
            self.leader = psutil.Process(process.pid)
        except psutil.NoSuchProcess:
            self.leader = None

    def exited(self):
        """Whether the command has exited. It is not waited for here: until it is, its process
        id, and so its session's and group's, stays its own."""
        return self.leader is None or _gone(self.leader)

    def note_descendants(self, every_s=1.0):
        if self.leader is None or time.monotonic() < self._next_look:
            return
        self._next_look = time.monotonic() + every_s
        import psutil
        try:
            self.seen.update(self.leader.children(recursive=True))
        except psutil.Error:
            pass


def end_process_tree(process, grace_s=5.0, seen=()):
    """Terminate `process` and every process it started, kill what is left after `grace_s`
    seconds, then wait for `process`. What it started is found three ways: its descendants now;
    `seen`, its descendants seen earlier (torchrun's workers run in sessions of their own, so
    a session kill would miss them); and every process of its session, which it leads when it
    was started with start_new_session=True (a background child stays there when its parent
    ends, and is then no one's descendant)."""
    import psutil
    leader = None
    if process.returncode is None:  # not waited for: its process id is still its own
        try:
            leader = psutil.Process(process.pid)
        except psutil.NoSuchProcess:
            pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        procs = _started_by(process, leader, seen)
        if leader is not None and not _gone(leader):
            procs.append(leader)
        if not procs:
            break
        if hasattr(os, "killpg") and _ids_are_its_own(process, leader):
            with contextlib.suppress(OSError):
                os.killpg(process.pid, sig)  # its group, should it lead one
        for proc in procs:
            _signal(proc, sig)
        deadline = time.monotonic() + grace_s
        while not all(_gone(proc) for proc in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass


def _started_by(process, leader, seen):
    """The running processes `process` started (see end_process_tree), itself left out."""
    import psutil
    found = {proc for proc in seen if not _gone(proc)}
    if leader is not None:
        with contextlib.suppress(psutil.Error):
            found.update(leader.children(recursive=True))
    if hasattr(os, "getsid") and _ids_are_its_own(process, leader):
        for pid in psutil.pids():
            if pid in (process.pid, os.getpid()):
                continue
            with contextlib.suppress(OSError, psutil.Error):
                if os.getsid(pid) == process.pid:
                    found.add(psutil.Process(pid))
    return [proc for proc in found if not _gone(proc)]


def _ids_are_its_own(process, leader):
    """Whether the session and group named by `process`'s id are its own: while it has not
    been waited for, or while no process has that id (an id is not given to a new process
    while a session or group of that id lasts). Once another process has the id, they are
    that process's."""
    import psutil
    return leader is not None or not psutil.pid_exists(process.pid)


def _gone(proc):
    """Whether `proc` (a psutil.Process) has ended: exited (a zombie counts), or its process id
    now someone else's."""
    import psutil
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _signal(proc, sig):
    try:
        if proc.is_running():  # not a process that has since taken its id
            proc.send_signal(sig)
    except Exception:  # already gone
        pass
