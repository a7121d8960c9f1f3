"""What the ranks decide together (ranks.py), on 2 CPU processes.

One torchrun start of tests/scripts/ranks_probe.py checks: a resume decided by rank 0 for ranks that
cannot see its disk; rank 0's bad-input verdict on every rank; CIFAR-10 downloaded by rank 0
alone and a run stopped when ranks load different data; BatchNorm statistics averaged. A second,
of tests/scripts/same_gpu_probe.py, checks that two ranks given one GPU are refused over the
group the run already has.
"""
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
import torch

from ddp_scripts.options import build_parser
from ddp_scripts.models import build_model
from ddp_scripts.out_dir import append_metrics, save_checkpoint
from ddp_scripts.launcher import run_command, torchrun_command
from ddp_scripts.mistakes.faults import saved_epoch_done, workers_of
from helpers import ROOT, assert_one_line_error

# Every test here reads the one run: on one test worker, which starts it once.
pytestmark = pytest.mark.xdist_group("ranks_probe")


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks")
    args = build_parser("test").parse_args(["--out", str(out / "rank0"), "--dataset", "synthetic"])
    (out / "rank0").mkdir()
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    for epoch in (1, 2, 3):  # the log of the epochs the checkpoint covers
        append_metrics(out / "rank0", {"epoch": epoch})
    save_checkpoint(out / "rank0", model, optimizer, 3, args)  # 1 rank of 32: the probe's 2 x 16
    run_command(torchrun_command(str(ROOT / "tests" / "scripts" / "ranks_probe.py"), 2, [str(out)]),
                timeout=300, echo=lambda line: None)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def test_every_rank_resumes_as_rank_0_decides(seen):
    assert [rank["resumes_after_epoch"] for rank in seen] == [3, 3]


def test_rank_0s_refusal_reaches_every_rank(seen):
    assert seen[0]["refused"] == seen[1]["refused"]
    assert "already holds a run" in seen[1]["refused"]


def test_cifar10_is_downloaded_by_rank_0_alone_and_different_data_stops_the_run(seen):
    assert seen[0]["cifar10_calls"] == [True]  # download if need be, and read
    # then, rank 0 having succeeded, rank 1 asks for it too, under the download lock: it finds
    # whole files on a disk rank 0 filled, and fetches only what its own disk lacks
    assert seen[1]["cifar10_calls"] == [True]
    for rank in seen:
        assert "the ranks loaded different data: rank 0 'cifar10', ranks [1] " \
               "'synthetic (fallback)'" in rank["data_refused"]


def test_batchnorm_statistics_agree_after_averaging(seen):
    assert seen[0]["running_mean"] == seen[1]["running_mean"]
    assert seen[0]["running_mean"] != [0.0, 0.0, 0.0]


def test_two_ranks_on_one_gpu_are_refused_over_the_default_group(tmp_path):
    """check_one_gpu_per_rank compares the ranks' GPU UUIDs over the group the run already
    has (faked UUIDs, gloo, on the CPU): no second group, so no second network transport."""
    run_command(torchrun_command(str(ROOT / "tests" / "scripts" / "same_gpu_probe.py"), 2,
                                 [str(tmp_path)]), timeout=300, echo=lambda line: None,
                env={"PYTHONPATH": str(ROOT)})
    seen = [json.loads((tmp_path / f"gpus{rank}.json").read_text()) for rank in (0, 1)]
    for rank in seen:
        assert rank["different"] == "passed"
        assert rank["same"] == ("ranks 0 and 1 were given the same GPU (GPU-shared): "
                                "start one process per GPU")


def test_a_rank_on_a_gpu_makes_it_current_before_the_group_forms(monkeypatch):
    """ranks.init_process_group calls torch.cuda.set_device first, so that every script that
    joins through it (step_parts.py too) puts a bare "cuda" tensor (all_gather_object's) on its
    own GPU. Faked here, on a machine without one: the calls are recorded in order."""
    from ddp_scripts import ranks
    calls = []
    monkeypatch.setattr(ranks, "GROUP", {})
    monkeypatch.setattr(ranks.torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(ranks.dist, "init_process_group",
                        lambda **options: calls.append(("join", options["backend"], options["device_id"])))
    monkeypatch.setattr(ranks, "check_one_gpu_per_rank", lambda device: calls.append(("check", device)))
    gpu = torch.device("cuda", 1)
    ranks.init_process_group(gpu, timeout_s=5)
    assert calls == [("set_device", gpu), ("join", "nccl", gpu), ("check", gpu)]


# ---------------------------------------------------------------------------------------
# A group that cannot form, and a rank that stops answering
# ---------------------------------------------------------------------------------------
RUN = ["--dataset", "synthetic", "--device", "cpu", "--timeout-s", "30"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world_size", ["1", "2"])
def test_a_master_port_in_use_is_one_line(world_size, tmp_path):
    """torchrun's variables set by hand, and MASTER_PORT held by another program: rank 0
    cannot listen there. One line names the port and the way out, at once (no wait for
    --timeout-s), and no --out is left. In a process of its own: a group that failed to form
    leaves torch.distributed's state unusable for later runs in the same process."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": world_size,
               "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": world_size}
        result = subprocess.run(
            [sys.executable, str(ROOT / "ddp_scripts" / "train_ddp.py"), *RUN, "--train-samples",
             "64", "--test-samples", "32", "--epochs", "1", "--out", str(tmp_path / "run")],
            env=env, capture_output=True, text=True, timeout=240)
    assert_one_line_error(result, f"MASTER_PORT {port} on 127.0.0.1 is in use by another "
                                  "program (EADDRINUSE): set MASTER_PORT to a free port")
    assert not (tmp_path / "run").exists()


def rank_process(out, rank):
    """The worker writing to `out` whose RANK is `rank`, or None."""
    for proc in workers_of(out):
        with contextlib.suppress(psutil.Error):  # it has just ended
            if proc.environ().get("RANK") == str(rank):
                return proc
    return None


@pytest.mark.timeout(600)
def test_a_stopped_rank_ends_the_run_and_is_not_left_behind(tmp_path):
    """Rank 1 stopped by SIGSTOP after epoch 1 is saved: rank 0 waits --timeout-s at its next
    collective, then stops with one line that says so. torchrun then sends rank 1 SIGTERM,
    which a stopped process cannot act on; after torchrun's grace period (30 s) it sends
    SIGKILL, which ends it, and torchrun ends."""
    out, log = tmp_path / "run", tmp_path / "torchrun.log"
    command = torchrun_command("train_ddp.py", 2, [*RUN, "--train-samples", "512",
                                                   "--test-samples", "64", "--epochs", "1000",
                                                   "--out", str(out)])
    with open(log, "w") as output:
        torchrun = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                    stdout=output, stderr=subprocess.STDOUT,
                                    start_new_session=True)
    stopped = None
    try:
        while stopped is None:
            assert torchrun.poll() is None, log.read_text()[-3000:]
            if saved_epoch_done(out, 1):
                stopped = rank_process(out, 1)
            time.sleep(0.1)
        stopped.send_signal(signal.SIGSTOP)
        torchrun.wait(timeout=480)
        left = workers_of(out)
    finally:  # whatever is left, stopped or not, ends here
        for proc in workers_of(out):
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGCONT)
                proc.kill()
        if torchrun.poll() is None:
            torchrun.kill()
            torchrun.wait()
    output = log.read_text()
    assert torchrun.returncode == 1, output[-3000:]
    assert left == []
    errors = [line for line in output.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(
        "[rank 0] error: another rank did not answer within --timeout-s 30 ("), output[-3000:]
    assert "it is stopped (SIGSTOP, Ctrl-Z), stuck, or slower than that" in errors[0]
    assert 'train_ddp.py", line' not in output  # no worker's traceback (torchrun's own stays)
    assert f"Signal 9 (SIGKILL) received by PID {stopped.pid}" in output
