"""The notebook launcher: live output, failures from the ranks' error files, no stray processes.

Also tested elsewhere, on real runs: a script's bad input named by rank (test_bad_input.py),
the launcher's timeout and a stopped notebook ending a hung run (test_faults.py).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_scripts import launcher
from ddp_scripts.launcher import LaunchError, run_command, run_main, run_script, torchrun_command
from ddp_scripts.mistakes.faults import processes_mentioning
from helpers import ROOT


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
    again = subprocess.run(["bash", "-c", line.removeprefix("$ ")], capture_output=True,
                           text=True, timeout=120)
    assert again.stdout.strip() == printed


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
