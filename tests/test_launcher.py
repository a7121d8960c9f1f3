"""The notebook launcher: live output, failures with their rank, timeouts, no stray processes."""
import sys
import time

import pytest

from ddp_scripts.launcher import LaunchError, LaunchTimeout, run_command, run_script
from ddp_scripts.mistakes.faults import processes_mentioning


def test_output_is_streamed_while_the_run_goes_on():
    arrivals = []
    code = "import time; print('first', flush=True); time.sleep(1.5); print('second', flush=True)"
    lines = run_command([sys.executable, "-c", code], timeout=60,
                        echo=lambda line: arrivals.append((line, time.monotonic())))
    assert lines == ["first", "second"]
    assert arrivals[1][1] - arrivals[0][1] > 1.0  # 'first' was shown before 'second' existed


def test_failure_names_the_rank_its_exit_code_and_message(tmp_path):
    with pytest.raises(LaunchError) as caught:
        run_script("train_ddp.py", nproc=2, out=tmp_path, dataset="synthetic", batch_size=0,
                   timeout=240, progress=False)
    error = caught.value
    assert error.rank in (0, 1) and error.exit_code == 2
    assert "--batch-size must be at least 1" in str(error)
    assert f"rank {error.rank} failed with exit code 2" in str(error)


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


def test_timeout_ends_the_whole_process_tree(tmp_path):
    marker = f"sleeper-{tmp_path.name}"
    script = tmp_path / f"{marker}.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    from ddp_scripts import launcher
    command = launcher.torchrun_command(str(script), 2)
    started = time.monotonic()
    with pytest.raises(LaunchTimeout):
        run_command(command, timeout=12, echo=lambda line: None)
    assert time.monotonic() - started < 40
    time.sleep(0.5)
    assert processes_mentioning(marker) == []


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
