"""The notebook launcher: live output, failures with their rank, no stray processes.

Also tested elsewhere, on real runs: a script's bad input named by rank (test_bad_input.py),
the launcher's timeout and a stopped notebook ending a hung run (test_faults.py).
"""
import sys
import time

import pytest

from ddp_scripts.launcher import LaunchError, run_command
from ddp_scripts.mistakes.faults import processes_mentioning


def test_output_is_streamed_while_the_run_goes_on():
    arrivals = []
    code = "import time; print('first', flush=True); time.sleep(1.5); print('second', flush=True)"
    lines = run_command([sys.executable, "-c", code], timeout=60,
                        echo=lambda line: arrivals.append((line, time.monotonic())))
    assert lines == ["first", "second"]
    assert arrivals[1][1] - arrivals[0][1] > 1.0  # 'first' was shown before 'second' existed


def test_a_crash_carries_the_end_of_its_traceback(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("import os\nif os.environ.get('RANK') == '1':\n"
                      "    raise ValueError('rank one broke')\n")
    from ddp_scripts import launcher
    command = launcher.torchrun_command(str(script), 2)
    with pytest.raises(LaunchError) as caught:
        run_command(command, timeout=120, echo=lambda line: None)
    assert caught.value.rank == 1 and caught.value.exit_code == 1
    assert "ValueError: rank one broke" in str(caught.value)
    assert "rank one broke" in caught.value.tail


def test_interrupt_ends_the_whole_process_tree(tmp_path):
    marker = f"interrupted-{tmp_path.name}"
    script = tmp_path / f"{marker}.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")

    def interrupt_when_started(line):
        if "started" in line:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_command([sys.executable, str(script)], timeout=120, echo=interrupt_when_started)
    time.sleep(0.5)
    assert processes_mentioning(marker) == []
