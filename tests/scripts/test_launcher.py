"""The notebook launcher: live output, failures from the ranks' error files, no stray processes.

Also tested elsewhere, on real runs: a script's bad input named by rank (test_bad_input.py),
the launcher's timeout and a stopped notebook ending a hung run (test_faults.py).
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_scripts import launcher
from ddp_scripts.launcher import (LaunchError, run_command, run_main, run_script, shell_line,
                                  torchrun_command)
from ddp_scripts.mistakes.faults import processes_mentioning
from helpers import ROOT, run_shown_line


def test_output_is_streamed_while_the_run_goes_on(tmp_path):
    """The child prints 'first', then waits until the launcher has shown it (the echo creates
    a file), and only then prints 'second': the run can only end if lines arrive live."""
    shown = tmp_path / "first-was-shown"
    code = ("import pathlib, time\nprint('first', flush=True)\n"
            f"while not pathlib.Path({str(shown)!r}).exists(): time.sleep(0.01)\n"
            "print('second', flush=True)\n")
    arrived = []

    def echo(line):
        arrived.append(line)
        shown.touch()

    lines = run_command([sys.executable, "-c", code], timeout=120, echo=echo)
    assert lines == arrived == ["first", "second"]


def test_a_crash_is_read_from_the_ranks_error_file(tmp_path):
    """torch's `record` writes the exception to the error file torchrun gives each rank."""
    script = tmp_path / "crash.py"
    script.write_text("import os\nfrom torch.distributed.elastic.multiprocessing.errors import record\n"
                      "@record\ndef main():\n    if os.environ.get('RANK') == '1':\n"
                      "        raise ValueError('rank one broke')\nmain()\n")
    with pytest.raises(LaunchError) as caught:
        run_command(torchrun_command(str(script), 2), timeout=120, echo=lambda line: None)
    assert caught.value.rank == 1 and caught.value.exit_code == 1
    assert "ValueError: rank one broke" in str(caught.value)
    assert "raise ValueError('rank one broke')" in caught.value.tail  # the rank's own traceback


def test_a_single_process_failure_is_read_from_its_error_file(tmp_path):
    with pytest.raises(LaunchError) as caught:
        run_script("train_single.py", out=tmp_path, dataset="synthetic", epochs=0,
                   progress=False, echo=lambda line: None)
    assert caught.value.exit_code == 2 and caught.value.rank is None
    assert str(caught.value) == "the run failed with exit code 2: --epochs must be at least 1, got 0"


def test_a_process_killed_by_a_signal_is_named_as_such():
    with pytest.raises(LaunchError) as caught:
        run_command([sys.executable, "-c", "import os, signal; print('going', flush=True); "
                     "os.kill(os.getpid(), signal.SIGKILL)"], timeout=60, echo=lambda line: None)
    assert caught.value.exit_code == -9 and "left no error file" in str(caught.value)
    assert str(caught.value).endswith("it printed last: going")   # all there is to say why


def test_interrupt_ends_the_whole_process_tree(tmp_path):
    marker = f"interrupted-{tmp_path.name}"
    script = tmp_path / f"{marker}.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")

    def interrupt_when_started(line):
        if "started" in line:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_command([sys.executable, str(script)], timeout=120, echo=interrupt_when_started)
    assert processes_mentioning(marker) == []  # end_process_tree waits for every process


def test_a_main_run_in_this_process_gets_its_argv_and_env_and_they_are_restored_after():
    def main():   # what a companion script's main() does: reads argv and env, prints
        print(f"[rank 0] ran with {sys.argv[1:]} as {os.environ['WHO']}")
    saved_argv = list(sys.argv)
    assert run_main(main, ["script.py", "--out", 3], env={"WHO": "me"}) == [
        "[rank 0] ran with ['--out', '3'] as me"]
    assert "WHO" not in os.environ and sys.argv == saved_argv   # both put back


def test_each_main_run_in_this_process_starts_the_scripts_clock_again():
    """A script reads its clock, START, when it is imported: in one process, once. Each run
    of its main() counts its start-up from its own start, and START is put back after."""
    import time
    script = {"START": -1.0, "seen": []}
    exec("def main():\n    seen.append(START)\n", script)
    before = time.perf_counter()
    run_main(script["main"], ["script.py"])
    run_main(script["main"], ["script.py"])
    first, second = script["seen"]
    assert before <= first <= second and script["START"] == -1.0


def test_show_command_echoes_the_command_that_runs(tmp_path, monkeypatch):
    """The line shown is the one run: a shell given it starts the same script with the same
    arguments and the launcher's variables, and prints what the launched run printed."""
    script = tmp_path / "says.py"
    script.write_text("import os, sys\nprint(sys.argv[1:], os.environ['PYTHONUNBUFFERED'],"
                      " os.environ['WHO'], flush=True)\n")
    shown = []
    monkeypatch.setattr(launcher, "SCRIPTS", tmp_path)
    assert run_script("says.py", env={"WHO": "me too"}, progress=False, echo=shown.append,
                      show_command=True, note="two words", flag=True) is None
    line, printed = shown
    assert line.startswith("$ PYTHONUNBUFFERED=1 WHO='me too' ")
    assert "DDP_SCRIPTS_FAST_EXIT" not in line   # the book's speed-up, not part of your command
    assert printed == "['--note', 'two words', '--flag'] 1 me too"
    assert " python " in line   # as a reader types it, in a shell where this Python is `python`
    again = run_shown_line(line, timeout=120)
    assert again.stdout.strip() == printed


def test_a_torchrun_line_is_shown_as_torchrun_with_the_script_s_path():
    line = shell_line(torchrun_command("train_ddp.py", 2, ["--epochs", "1"], port=29500))
    assert sys.executable not in line and "torch.distributed.run" not in line
    assert " torchrun --nnodes 1 --nproc-per-node 2 " in line
    assert line.endswith(" ddp_scripts/train_ddp.py --epochs 1")


def test_a_log_folder_made_for_a_command_run_elsewhere_is_removed_as_python_exits():
    """torchrun_command makes a temporary --log-dir; a command not run by run_command (chapter
    8 runs one with subprocess.run) leaves no folder behind once its Python has exited."""
    made = subprocess.run([sys.executable, "-c",
                           "from ddp_scripts.launcher import torchrun_command\n"
                           "command = torchrun_command('train_ddp.py')\n"
                           "folder = command[command.index('--log-dir') + 1]\n"
                           "open(folder + '/error.json', 'w').close()\n"
                           "print(folder)"],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert made and not Path(made).exists(), made


# Which rank failed first. A rank that loses its peer fails too, and its error file can come
# first: gloo closes a timed-out pair at once, and the rank still writing its traceback is
# seen second. torchrun compares whole seconds. Each test plants such an order.
def an_error(rank, time, reason, lost_peer=False):
    return {"rank": rank, "exit_code": 1, "time": time, "reason": reason, "lost_peer": lost_peer,
            "message": {}}


TIMED_OUT = an_error(1, 2.0, "RuntimeError: [../gloo/transport/tcp/unbound_buffer.cc:81] "
                             "Timed out waiting 3000ms for recv operation to complete")
LOST = an_error(0, 1.0, "another rank ended first (RuntimeError: [../gloo/transport/tcp/"
                        "pair.cc:561] Connection closed by peer [127.0.0.1]:9115); ...",
                lost_peer=True)


def test_planted_lost_peer_file_first_the_launcher_names_the_rank_that_failed():
    """The build's case: rank 0's file (it lost its peer) is a second older than rank 1's
    timeout, the cause."""
    error = launcher.failure(1, [LOST, TIMED_OUT], [])
    assert error.rank == 1 and str(error).startswith("rank 1 failed with exit code 1: "
                                                     "RuntimeError: [../gloo"), str(error)


def test_right_case_the_first_file_is_the_cause_and_is_named():
    error = launcher.failure(1, [TIMED_OUT, dict(LOST, time=3.0)], [])
    assert error.rank == 1 and "Timed out" in str(error), str(error)
    # a rank that lost its peer, and no other failure to blame: it is named
    assert launcher.failure(1, [LOST], []).rank == 0


def torchrun_summary(lines):
    """torchrun's summary of a failed run, from its printed lines: the rank torchrun's own
    'failed' line names, and each failure's rank and 'traceback :' line, the cause first."""
    named = next(int(line.rsplit("local_rank: ", 1)[1].split()[0]) for line in lines
                 if "failed (exitcode:" in line)
    text = "\n".join(lines)
    cause = text[text.index("Root Cause (first observed failure):"):]
    others = text[text.index("Failures:"):text.index("Root Cause")]
    def failures(part):
        return [(int(rank), said) for rank, said in
                re.findall(r"rank\s+: (\d+) [^\n]*\n(?:[^\n]*\n)*?\s*traceback : ([^\n]*)", part)]
    return named, failures(cause), failures(others)


SURVIVOR_AND_VICTIM = """import os, pathlib, signal, sys, time
from ddp_scripts import runfiles
from ddp_scripts.mishaps import peer_lost
told = pathlib.Path({told!r})
if os.environ["RANK"] == "0":
    # rank 0 records that it lost its peer just before a second begins ...
    while time.time() % 1 < 0.8:
        time.sleep(0.01)
    runfiles.write_error_file(peer_lost(RuntimeError("Connection reset by peer")), exit_code=1,
                              rank=0, with_stack=False, lost_peer=True)
    told.write_text(str(time.time()))
    time.sleep(60)   # and waits, as a rank does that torchrun has not stopped yet
else:
    # ... and rank 1, which it lost, dies in that next second
    while not told.exists() or not told.read_text():
        time.sleep(0.01)
    while int(time.time()) == int(float(told.read_text())):
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.timeout(300)
def test_planted_survivor_file_a_second_before_the_death_torchrun_names_the_killed_rank(tmp_path):
    """Rank 0's error file (a lost peer) is written in the second before rank 1 dies, and
    torchrun times rank 1 by its poll: rounded down, rank 0's time would be the earliest."""
    script = tmp_path / "killed.py"
    script.write_text(SURVIVOR_AND_VICTIM.format(told=str(tmp_path / "told")))
    lines = []
    with pytest.raises(LaunchError) as caught:
        run_command(torchrun_command(str(script), 2), timeout=120, echo=lines.append)
    assert caught.value.rank == 1, str(caught.value)
    named, cause, others = torchrun_summary(lines)
    assert named == 1 and [rank for rank, _ in cause] == [1], "\n".join(lines)
    # and the survivor's line stands in its traceback's place, not an empty one
    assert others == [(0, "PeerLost: another rank ended first (RuntimeError: Connection reset by "
                          "peer); its own output, or torchrun's exit code for it, says why; the "
                          "last checkpoint saved, if any, is whole")], "\n".join(lines)


def rank_one_raises(script, error):
    """A run_cli script at `script` whose rank 1 raises `error` (Python source) at once, while
    rank 0 waits."""
    script.write_text(f"""import os, sys, time
from ddp_scripts.cli import UsageError, run_cli

def main():
    if os.environ["RANK"] == "1":
        raise {error}
    time.sleep(60)

run_cli(main)
""")
    return script


@pytest.mark.timeout(300)
def test_planted_one_line_stop_torchruns_summary_shows_the_line(tmp_path):
    """A rank that stops with one line (a UsageError) under torchrun: torchrun's summary
    quotes the line where a traceback would be, and names that rank."""
    script = rank_one_raises(tmp_path / "refuses.py", 'UsageError("--out x cannot be written: Not a directory")')
    lines = []
    with pytest.raises(LaunchError) as caught:
        run_command(torchrun_command(str(script), 2), timeout=120, echo=lines.append)
    assert caught.value.rank == 1 and caught.value.exit_code == 2, str(caught.value)
    named, cause, _ = torchrun_summary(lines)
    assert named == 1 and cause == [(1, "UsageError: --out x cannot be written: Not a directory")], \
        "\n".join(lines)


@pytest.mark.timeout(300)
def test_right_case_an_uncaught_error_keeps_its_traceback_in_torchruns_summary(tmp_path):
    script = rank_one_raises(tmp_path / "breaks.py", 'ValueError("rank one broke")')
    lines = []
    with pytest.raises(LaunchError):
        run_command(torchrun_command(str(script), 2), timeout=120, echo=lines.append)
    named, cause, _ = torchrun_summary(lines)
    assert named == 1 and cause == [(1, "Traceback (most recent call last):")], "\n".join(lines)
    assert "  ValueError: rank one broke" in lines, "\n".join(lines)   # its last line, indented
