"""Chapter 8's knot in miniature (ddp_scripts/mistakes/exit_hang.py): SIGTERM cannot end a
process whose main thread waits in C code holding the GIL for a thread that needs the GIL;
SIGKILL can. The planted flaw releases the GIL in that wait: then nothing is stuck."""
import signal
import subprocess
import sys

import pytest

from tests.helpers import SCRIPTS, assert_one_line_error
from ddp_scripts.mistakes.exit_hang import wait_until_asleep

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(sys.platform != "linux", reason="glibc's pthread objects, /proc")]
PROGRAM = SCRIPTS / "mistakes" / "exit_hang.py"


def start(path):
    knot = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, text=True)
    assert "waiting for the worker" in knot.stdout.readline()
    return knot


def test_right_case_sigterm_leaves_the_knot_and_sigkill_ends_it():
    knot = start(PROGRAM)
    try:
        assert wait_until_asleep(knot.pid)
        knot.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):  # it cannot end: nothing is timed here
            knot.wait(2)
    finally:
        knot.kill()
    assert knot.wait(60) == -signal.SIGKILL


def test_planted_gil_released_in_the_wait_lets_the_program_end(tmp_path):
    planted = tmp_path / "exit_hang_released.py"
    source = PROGRAM.read_text()
    call = "KEEPING_THE_GIL.pthread_cond_wait(wake, mutex)"
    assert call in source
    planted.write_text(source.replace(call, "RELEASING_THE_GIL.pthread_cond_wait(wake, mutex)"))
    knot = start(planted)
    try:
        assert knot.wait(60) == 0  # the worker got the GIL and woke the main thread
        assert "never printed" in knot.stdout.read()
    finally:
        knot.kill()


@pytest.mark.parametrize("args, fragment", [
    (["--python", "/bin/true"], "cannot import torch"),
    (["--python", sys.executable, "--script", "../README.md"], "not a script of"),
    (["--python", sys.executable, "--out", "/proc/no/such.jsonl"], "cannot write to it"),
])
def test_the_exit_benchmark_refuses_bad_input_before_any_run(args, fragment, tmp_path):
    result = subprocess.run([sys.executable, "-m", "ddp_scripts.measure.exit_benchmark",
                             "--out", str(tmp_path / "out.jsonl"), *args],
                            capture_output=True, text=True, cwd=SCRIPTS.parent, timeout=300)
    assert_one_line_error(result, fragment)
