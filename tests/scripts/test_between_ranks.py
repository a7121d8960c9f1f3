"""What the ranks decide together (ranks.py), on 2 CPU processes.

One torchrun start of tests/scripts/ranks_probe.py checks: a resume decided by rank 0 for ranks that
cannot see its disk; rank 0's bad-input verdict on every rank; CIFAR-10 downloaded by rank 0
alone and a run stopped when ranks load different data; BatchNorm statistics averaged. A second,
of tests/scripts/same_gpu_probe.py, checks that two ranks given one GPU are refused over the
group the run already has.
"""
import json

import pytest
import torch

from ddp_scripts.options import build_parser
from ddp_scripts.models import build_model
from ddp_scripts.checkpoints import save_checkpoint
from ddp_scripts.launcher import run_command, torchrun_command
from helpers import ROOT

# Every test here reads the one run: on one test worker, which starts it once.
pytestmark = pytest.mark.xdist_group("ranks_probe")


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks")
    args = build_parser("test").parse_args(["--out", str(out / "rank0"), "--dataset", "synthetic"])
    (out / "rank0").mkdir()
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
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
