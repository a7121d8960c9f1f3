"""Small helpers shared by the tests: run a companion script, compare two checkpoints."""
import contextlib
import io
import os
import re
import runpy
import signal
import subprocess
import sys
import sysconfig
import traceback
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.distributed as dist

from ddp_scripts.launcher import free_port
from ddp_scripts.runfiles import CHECKPOINT

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "ddp_scripts"
# The tests that read test_fsdp.py's runs go to one pytest-xdist worker (--dist loadgroup),
# so that the runs are made once: a session fixture lives once per worker.
shares_float64_runs = pytest.mark.xdist_group("float64_runs")
# A run small enough for seconds on two cores, large enough to learn something.
SMALL = ["--dataset", "synthetic", "--train-samples", "512", "--test-samples", "128"]


def run_in_process(script, *args):
    """Run ddp_scripts/<script> as `python <script> ARGS` would, but inside this process.

    A new Python process pays for importing torch (about 6 s of CPU here) before the script
    starts; the tests of single-process runs would spend most of their time on it. The script
    runs as __main__ with this argv; its exit status, stdout and stderr come back as a
    CompletedProcess, and an exception it lets out is printed as Python would print it
    (status 1), so a bare traceback fails the same assertions as in a real process. The
    os._exit(0) that ends a successful run (cli.run_cli) ends the script, not pytest; in a
    process the script forks (a DataLoader worker), os._exit ends that process as usual.
    """
    path = SCRIPTS / script
    argv = [str(path), *map(str, args)]
    stdout, stderr = io.StringIO(), io.StringIO()
    saved = (sys.argv, list(sys.path), torch.get_num_threads(), dict(os.environ),
             signal.getsignal(signal.SIGINT))  # a script that stops on Ctrl-C resets SIGINT
    sys.argv = argv
    status = 0
    real_exit, test_process = os._exit, os.getpid()

    def exit_script(code):
        if os.getpid() != test_process:  # a forked child of the script: it ends for real
            real_exit(code)
        raise SystemExit(code)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), \
                mock.patch("os._exit", side_effect=exit_script):
            try:
                runpy.run_path(str(path), run_name="__main__")
            except SystemExit as exit:  # sys.exit(code) as the interpreter reads it
                if isinstance(exit.code, int) or exit.code is None:
                    status = exit.code or 0
                else:
                    print(exit.code, file=sys.stderr)
                    status = 1
            except Exception:  # noqa: BLE001 - reported as the interpreter would
                traceback.print_exc()
                status = 1
    finally:
        sys.argv, sys.path[:] = saved[0], saved[1]
        torch.set_num_threads(saved[2])
        os.environ.clear()
        os.environ.update(saved[3])
        signal.signal(signal.SIGINT, saved[4])
    return subprocess.CompletedProcess(argv, status, stdout.getvalue(), stderr.getvalue())


def run_shown_line(line, **kwargs):
    """A command line the launcher shows (`$ ...`), run by bash as a reader runs it: in this
    environment, activated, so that its `python` and `torchrun` come first on PATH."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return subprocess.run(["bash", "-c", line.removeprefix("$ ")], capture_output=True,
                          text=True, env={**os.environ, "PATH": path}, **kwargs)


def fresh_venv(folder):
    """The Python of a new virtual environment in `folder`, as a reader's own where the book is
    not installed: this Python's packages (torch, setuptools, ...) come behind its own, so
    nothing is downloaded, but their .pth files are not read from there, so the book's editable
    install is not seen. Run it with PYTHONPATH and PYTHONHOME left out of its environment."""
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, timeout=300)
    python = Path(folder) / "bin" / "python"
    new_site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                              capture_output=True, text=True, check=True).stdout.strip()
    (Path(new_site) / "behind.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python


def load_model_state(out):
    return torch.load(Path(out) / CHECKPOINT, map_location="cpu", weights_only=True)["model"]


def momentum_buffers(state):
    """SGD's momentum buffers in a checkpoint's optimizer state, in parameter order."""
    return [s["momentum_buffer"] for _, s in sorted(state["optimizer"]["state"].items())]


def max_difference(a, b):
    """Largest difference between two (nested) dicts of tensors and numbers."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        return max((max_difference(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, (list, tuple)):
        return max((max_difference(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    if isinstance(a, torch.Tensor):
        return (a.double() - b.double()).abs().max().item()
    return 0.0 if a == b else float("inf")


def run_one_rank(script, *args):
    """A DDP script (train_ddp, train_fast, train_fsdp) as `torchrun --nproc-per-node 1` would
    run it, inside this process; returns what run_in_process returns."""
    env = {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    with mock.patch.dict(os.environ, env):
        try:
            return run_in_process(script, *args)
        finally:
            if dist.is_initialized():  # a run that failed after joining: leave its group
                dist.destroy_process_group()


def assert_one_line_error(result, *fragments):
    """Exit status 2 and one line on stderr, `error: ...` (after torchrun's `[rankN]:`, if it
    ran under torchrun) holding every fragment; no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, result.stderr
    assert re.match(r"(\[rank ?\d+\]:? *)?error: ", errors[0]), errors[0]
    assert "Traceback" not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def sampler_orders(set_epoch, num_replicas=2, epochs=3):
    """The order rank 0's share of 12 samples comes in, epoch after epoch, from a seeded
    DistributedSampler, with or without set_epoch (chapters 5 and 8)."""
    from torch.utils.data.distributed import DistributedSampler
    sampler = DistributedSampler(list(range(12)), num_replicas=num_replicas, rank=0, seed=0)
    orders = []
    for epoch in range(epochs):
        if set_epoch:
            sampler.set_epoch(epoch)
        orders.append(list(sampler))
    return orders
