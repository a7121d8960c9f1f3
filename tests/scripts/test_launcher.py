"""The notebook launcher: live output, failures from the ranks' error files, no stray processes.

Also tested elsewhere, on real runs: a script's bad input named by rank (test_bad_input.py),
the launcher's timeout and a stopped notebook ending a hung run (test_faults.py).
"""
import os
import shutil
import subprocess
import sys

import pytest

from ddp_scripts import launcher, run_records
from ddp_scripts.launcher import LaunchError, run_command, run_main, run_script, torchrun_command
from ddp_scripts.mistakes.faults import RankKiller, processes_mentioning


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


# A child that adds one file to the folder it is given, prints how many were there, counts
# its runs in a file outside the repository, and fails with exit status 3 when asked.
COUNTING_CHILD = """import pathlib, sys
folder, runs = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
runs.write_text(str(int(runs.read_text() or 0) + 1) if runs.exists() else "1")
folder.mkdir(parents=True, exist_ok=True)
before = len(list(folder.iterdir()))
(folder / f"file{before}").write_text("made by the run")
print(f"{before} file(s) in {folder}", flush=True)
sys.exit(3 if len(sys.argv) > 3 else 0)
"""


@pytest.fixture
def records(tmp_path, tmp_path_factory, monkeypatch):
    """RUN_RECORDS set, tmp_path standing for the repository; returns (repository, runs file)."""
    monkeypatch.setattr(run_records, "ROOT", tmp_path)
    monkeypatch.setenv("RUN_RECORDS", str(tmp_path_factory.mktemp("records")))
    return tmp_path, tmp_path_factory.mktemp("counter") / "runs"


def test_a_recorded_run_is_replayed_with_its_files_and_not_run_twice(records, capsys):
    repository, runs = records
    out = repository / "runs" / "a"
    command = [sys.executable, "-c", COUNTING_CHILD, str(out), str(runs)]
    assert run_command(command, timeout=120, echo=lambda line: None) == [f"0 file(s) in {out}"]
    shutil.rmtree(out)
    capsys.readouterr()
    replayed = []
    assert run_command(command, timeout=120, echo=replayed.append) == [f"0 file(s) in {out}"]
    assert replayed == [f"0 file(s) in {out}"] and runs.read_text() == "1"
    assert "ran earlier in this build" in capsys.readouterr().out   # said, on the page
    assert [p.name for p in out.iterdir()] == ["file0"]             # the run's files put back
    # Its folder now holds a file: an input has changed, so the command runs again.
    assert run_command(command, timeout=120, echo=lambda line: None) == [f"1 file(s) in {out}"]
    assert runs.read_text() == "2"


def test_a_failed_run_is_not_recorded_and_runs_again(records):
    repository, runs = records
    command = [sys.executable, "-c", COUNTING_CHILD, str(repository / "b"), str(runs), "fail"]
    for attempt in range(2):
        shutil.rmtree(repository / "b", ignore_errors=True)   # the same inputs each time
        with pytest.raises(LaunchError) as caught:
            run_command(command, timeout=120, echo=lambda line: None)
        assert caught.value.exit_code == 3
    assert runs.read_text() == "2"


def test_a_main_run_in_this_process_is_restored_after_and_replayed_too(records, capsys,
                                                                      monkeypatch):
    repository, _ = records
    out, calls = repository / "runs" / "in-process", []

    def main():   # what a companion script's main() does: reads argv and env, writes, prints
        calls.append(sys.argv[1:])
        out.mkdir(parents=True)
        (out / "made").write_text(os.environ["WHO"])
        print(f"[rank 0] ran with {sys.argv[1:]}")
    argv, said = ["script.py", "--out", out], [f"[rank 0] ran with ['--out', '{out}']"]
    assert run_main(main, argv, env={"WHO": "me"}) == said
    assert "WHO" not in os.environ and sys.argv[0] != "script.py"   # both put back
    shutil.rmtree(out)
    capsys.readouterr()
    assert run_main(main, argv, env={"WHO": "me"}) == said and len(calls) == 1
    assert (out / "made").read_text() == "me"                        # its files put back
    assert "ran earlier in this build" in capsys.readouterr().out
    monkeypatch.delenv("RUN_RECORDS")
    shutil.rmtree(out)
    assert run_main(main, argv, env={"WHO": "me"}) == said and len(calls) == 2


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


def test_a_run_that_a_fault_injector_watches_always_runs(records, monkeypatch):
    repository, runs = records
    out = repository / "runs" / "watched"
    monkeypatch.setattr(run_records, "WATCHED", {out.resolve()})
    command = [sys.executable, "-c", COUNTING_CHILD, str(out), str(runs)]
    for attempt in range(2):
        shutil.rmtree(out, ignore_errors=True)   # the same inputs each time
        run_command(command, timeout=120, echo=lambda line: None)
    assert runs.read_text() == "2"


def test_a_fault_injector_marks_its_run_watched_until_it_ends(tmp_path):
    out, seen = (tmp_path / "run").resolve(), []
    killer = RankKiller(tmp_path / "run", give_up_s=0)
    killer._watch = lambda: seen.append(out in run_records.WATCHED)   # what it sees while it waits
    killer.start()
    killer.join(timeout=60)
    assert seen == [True] and out not in run_records.WATCHED


def test_without_run_records_every_command_runs(tmp_path, monkeypatch):
    monkeypatch.delenv("RUN_RECORDS", raising=False)
    runs = tmp_path / "runs"
    command = [sys.executable, "-c", COUNTING_CHILD, str(tmp_path / "c"), str(runs)]
    for attempt in range(2):
        run_command(command, timeout=120, echo=lambda line: None)
    assert runs.read_text() == "2"


def test_show_command_echoes_the_command_that_runs(tmp_path, monkeypatch):
    """The line shown is the one run: a shell given it starts the same script with the same
    arguments and the launcher's variables, and prints what the launched run printed."""
    script = tmp_path / "says.py"
    script.write_text("import os, sys\nprint(sys.argv[1:], os.environ['PYTHONUNBUFFERED'],"
                      " os.environ['WHO'], flush=True)\n")
    shown = []
    monkeypatch.setattr(launcher, "SCRIPTS", tmp_path)
    monkeypatch.delenv("RUN_RECORDS", raising=False)   # run, not replayed
    assert run_script("says.py", env={"WHO": "me too"}, progress=False, echo=shown.append,
                      show_command=True, note="two words", flag=True) is None
    line, printed = shown
    assert line.startswith("$ PYTHONUNBUFFERED=1 DDP_SCRIPTS_FAST_EXIT=1 WHO='me too' ")
    assert printed == "['--note', 'two words', '--flag'] 1 me too"
    again = subprocess.run(["bash", "-c", line.removeprefix("$ ")], capture_output=True,
                           text=True, timeout=120)
    assert again.stdout.strip() == printed
