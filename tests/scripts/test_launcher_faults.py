"""The launcher when its command misbehaves: a process it leaves running that holds its
output, SIGTERM ignored, a rendezvous port already taken; and paths with spaces and non-ASCII
letters, in a DDP run and in the line shown to paste in a shell.

The commands are small Python programs; the runs, synthetic and one epoch. Each process a
test starts prints its pid, and the test checks that it is gone. A launcher that hangs is
seen as one: run_command runs in a thread, given minutes where it needs seconds.
"""
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time

import psutil
import pytest

from ddp_scripts import launcher
from ddp_scripts.launcher import (LaunchError, LaunchTimeout, run_command, run_script,
                                  torchrun_command)
from ddp_scripts.runfiles import logged_epochs
from helpers import ROOT, run_shown_line

HANG_S = 90   # far more than any of these runs takes: a guard against a hang, not a measure


@pytest.fixture
def own_tmpdir(tmp_path, monkeypatch):
    """A TMPDIR of the test's own, where the launcher's temporary folders go."""
    folder = tmp_path / "tmpdir"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def launch(command, interrupt=False, meanwhile=None, **kwargs):
    """run_command(command, **kwargs) in a thread, ended within HANG_S or reported as a hang.
    Returns (what it returned or raised, the lines it echoed, the pids they name: each
    program below prints 'pid N' for every process it starts). With `interrupt`, the first
    line echoed raises KeyboardInterrupt, as Ctrl-C in a notebook does. `meanwhile(lines)`
    runs in this thread while the command runs."""
    lines, outcome = [], []

    def echo(line):
        lines.append(line)
        if interrupt:
            raise KeyboardInterrupt

    def target():
        try:
            outcome.append(run_command(command, echo=echo, **kwargs))
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        if meanwhile is not None:
            meanwhile(lines)
    finally:
        thread.join(HANG_S)
    pids = [int(line.split()[1]) for line in lines if line.startswith("pid ")]
    if thread.is_alive():
        for pid in pids:   # the processes that hold the launcher: ended here, by pid
            with_pid(pid, psutil.Process.kill)
        thread.join(HANG_S)
        pytest.fail(f"run_command did not return within {HANG_S} s; it printed {lines}")
    return outcome[0], lines, pids


def with_pid(pid, action):
    try:
        action(psutil.Process(pid))
    except psutil.Error:
        pass


def running(pid):
    """Whether process `pid` still runs (one that has exited but not been waited for, a
    zombie, does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def temporary_folders(tmpdir):
    """The launcher's temporary folders in `tmpdir` (torch keeps caches of its own there)."""
    return sorted(path.name for path in tmpdir.iterdir()
                  if path.name.startswith(("launch-", "torchrun-")))


def ended_and_cleaned(pids, tmpdir):
    """Every process named is gone, and the launcher left no temporary folder."""
    try:
        assert pids and not [pid for pid in pids if running(pid)], pids
        assert temporary_folders(tmpdir) == []
    finally:
        for pid in pids:
            with_pid(pid, psutil.Process.kill)


# A command that starts a child in the background, which inherits its output, and exits.
LEAVES_A_CHILD = ("import subprocess, sys\n"
                  "child = subprocess.Popen(['sleep', '120'])\n"
                  "print('pid', child.pid, flush=True)\n"
                  "sys.exit({status})\n")


@pytest.mark.parametrize("status", [0, 3])
def test_a_child_left_running_with_the_output_is_ended_when_the_command_exits(own_tmpdir,
                                                                             status):
    """The command's own exit status is the run's, once it has exited: its child, which
    still holds the output, is ended then, long before the timeout."""
    command = [sys.executable, "-c", LEAVES_A_CHILD.format(status=status)]
    outcome, lines, pids = launch(command, timeout=HANG_S * 2)
    if status == 0:
        assert outcome == lines == [f"pid {pids[0]}"], outcome
    else:
        assert isinstance(outcome, LaunchError) and not isinstance(outcome, LaunchTimeout)
        assert outcome.exit_code == 3, outcome
    ended_and_cleaned(pids, own_tmpdir)


def test_a_child_left_running_with_a_short_timeout_the_exit_status_still_counts(own_tmpdir):
    """A timeout (30 s: a loaded machine may take seconds to start Python) far below the
    child's 120 s: the command exits 0 and leaves `sleep 120` behind."""
    command = [sys.executable, "-c", LEAVES_A_CHILD.format(status=0)]
    outcome, lines, pids = launch(command, timeout=30)
    assert outcome == lines, outcome
    ended_and_cleaned(pids, own_tmpdir)


# A command that never ends, and whose grandchild holds its output from a process group of
# its own: its parent has exited, so it is no one's descendant any more, but it is still in
# the command's session.
ORPHAN_IN_ITS_OWN_GROUP = """import os, time
if os.fork() == 0:
    os.setpgid(0, 0)
    if os.fork() == 0:
        print('pid', os.getpid(), flush=True)
        time.sleep(120)
    os._exit(0)
time.sleep(600)
"""


@pytest.mark.parametrize("stop", ["timeout", "interrupt"])
def test_a_run_ended_at_its_timeout_or_by_an_interrupt_ends_an_orphan_of_its_session(
        own_tmpdir, stop):
    outcome, _, pids = launch([sys.executable, "-c", ORPHAN_IN_ITS_OWN_GROUP],
                              interrupt=stop == "interrupt",
                              timeout=5 if stop == "timeout" else HANG_S * 2)
    assert isinstance(outcome, LaunchTimeout if stop == "timeout" else KeyboardInterrupt), outcome
    ended_and_cleaned(pids, own_tmpdir)


WORKER = "import os, sys, time\nsys.stdout.write(f'pid {os.getpid()}\\n')\ntime.sleep(120)\n"


@pytest.mark.timeout(600)
def test_the_workers_of_a_torchrun_killed_outright_are_ended(tmp_path, own_tmpdir, monkeypatch):
    """SIGKILL to torchrun (the out-of-memory killer's choice, say) leaves its workers, which
    run in sessions of their own and hold the output, running: the launcher ends the workers
    it saw, and reports torchrun's end."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    seen, note = set(), launcher._Tree.note_descendants

    def note_and_tell(tree, *args, **kwargs):   # what the launcher has seen, told to the test
        note(tree, *args, **kwargs)
        seen.update(proc.pid for proc in tree.seen)
    monkeypatch.setattr(launcher._Tree, "note_descendants", note_and_tell)

    def kill_torchrun(lines):
        """Once both workers have printed their pid and the launcher has seen them."""
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            workers = [int(line.split()[1]) for line in lines if line.startswith("pid ")]
            if len(workers) == 2 and set(workers) <= seen:
                os.kill(psutil.Process(workers[0]).ppid(), signal.SIGKILL)
                return
            time.sleep(0.05)

    outcome, lines, pids = launch(torchrun_command(str(script), 2), meanwhile=kill_torchrun,
                                  timeout=HANG_S * 2)
    assert len(pids) == 2, lines
    assert isinstance(outcome, LaunchError) and outcome.exit_code == -signal.SIGKILL, outcome
    ended_and_cleaned(pids, own_tmpdir)


def test_right_case_a_command_that_ignores_sigterm_is_killed_after_the_grace(own_tmpdir):
    code = ("import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('pid', os.getpid(), flush=True)\ntime.sleep(600)\n")
    outcome, _, pids = launch([sys.executable, "-c", code], timeout=3)
    assert isinstance(outcome, LaunchTimeout), outcome
    ended_and_cleaned(pids, own_tmpdir)


TAKEN = ("port {port} is taken (EADDRINUSE: torchrun could not start its rendezvous there, no "
         "rank started): choose another port, or leave it out to use a free one")


@pytest.mark.timeout(600)
def test_a_taken_rendezvous_port_is_named_in_one_line(tmp_path, own_tmpdir):
    """torchrun's own traceback (about 40 lines) becomes one line that names the port; the
    traceback stays in the error's tail."""
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        busy = blocker.getsockname()[1]
        with pytest.raises(LaunchError) as caught:
            run_script("train_ddp.py", nproc=2, out=tmp_path / "run", timeout=300,
                       progress=False, echo=lambda line: None,
                       torchrun_args=["--master-port", str(busy)], dataset="synthetic",
                       train_samples=64, test_samples=32, device="cpu", epochs=1)
        assert str(caught.value) == TAKEN.format(port=busy)
        assert "EADDRINUSE" in caught.value.tail.splitlines()[-1], caught.value.tail
        assert not (tmp_path / "run").exists()   # no rank started
        with pytest.raises(LaunchError) as caught:   # the port given to torchrun_command
            run_command(torchrun_command("train_ddp.py", 2, ["--out", str(tmp_path / "run")],
                                         port=busy), timeout=300, echo=lambda line: None)
        assert str(caught.value) == TAKEN.format(port=busy)
    assert temporary_folders(own_tmpdir) == []


@pytest.mark.timeout(600)
def test_an_out_with_spaces_and_non_ascii_letters_in_ddp_and_in_the_shell_line(tmp_path,
                                                                                own_tmpdir):
    """Two ranks write to the folder asked for; the line shown, run by bash from the
    repository root in this environment, runs the same command into the same folder."""
    out = tmp_path / "é 空 格" / "a run"
    shown = []
    metrics = run_script("train_ddp.py", nproc=2, out=out, timeout=300, progress=False,
                         echo=shown.append, show_command=True, overwrite=True,
                         dataset="synthetic", train_samples=64, test_samples=32, device="cpu",
                         epochs=1)
    assert list(metrics["epoch"]) == [1] and logged_epochs(out) == [1]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tmpdir", "é 空 格"]
    assert temporary_folders(own_tmpdir) == []
    shutil.rmtree(out)
    again = run_shown_line(shown[0], cwd=ROOT, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "[rank 0] epoch 1/1" in again.stdout + again.stderr
    assert logged_epochs(out) == [1]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tmpdir", "é 空 格"]
