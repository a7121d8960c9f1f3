"""train_fsdp.py: sharded checkpoints that resume on more ranks (1 -> 2), one-line errors,
the memory options, what each rank holds, and that the whole model is never made on a rank.

What chapter 11's own runs show (FSDP = DDP in float64, what each rank holds, a 2-rank
checkpoint resumed on 1 rank) is tested on those runs, in tests/site/test_chapter_runs.py.
Here one torchrun start in all: FSDP on 2 ranks resuming a 1-rank run (resumed). The 1-rank
runs are what `torchrun --nproc-per-node 1` would start, made inside the test process (a
world of one, joined over gloo): no torch import to pay for.
"""
import json
import os
import shutil
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import helpers
from helpers import (SMALL, assert_one_line_error, load_model_state, max_difference,
                     momentum_buffers, run_in_process, shares_float64_runs)

from ddp_scripts.launcher import run_script
from ddp_scripts.mistakes.faults import processes_mentioning
from ddp_scripts.runfiles import CHECKPOINT, SHARDED_CHECKPOINT, metrics_rows

# float64, the CNN, a global batch of 32 however many ranks: every run below trains the same model.
FLOAT64 = [*SMALL, "--dtype", "float64", "--device", "cpu", "--global-batch-size", "32"]
OPTIONS = dict(dataset="synthetic", train_samples=512, test_samples=128, dtype="float64",
               device="cpu", timeout=300, progress=False, echo=lambda line: None)


def run_one_rank(*args):
    """train_fsdp.py as `torchrun --nproc-per-node 1` would run it, inside this process."""
    return helpers.run_one_rank("train_fsdp.py", *args)


@pytest.fixture(scope="session")
def one_rank(tmp_path_factory):
    """FSDP on 1 rank, float64, stopped after epoch 1 of 2: base/"one"."""
    base = tmp_path_factory.mktemp("fsdp")
    first = run_one_rank(*FLOAT64, "--epochs", "2", "--stop-after-epoch", "1", "--out", base / "one")
    assert first.returncode == 0, first.stdout + first.stderr
    return base


@pytest.fixture(scope="session")
def resumed(one_rank):
    """The 1-rank run resumed on 2 ranks (base/"one_then_two"), and the uninterrupted 1-rank
    run it is compared with (base/"straight"); returns the resumed run's output."""
    base = one_rank
    shutil.copytree(base / "one", base / "one_then_two")
    lines = []
    run_script("train_fsdp.py", nproc=2, out=base / "one_then_two", epochs=2, resume=True,
               global_batch_size=32, **dict(OPTIONS, echo=lines.append))
    straight = run_one_rank(*FLOAT64, "--epochs", "2", "--out", base / "straight")
    assert straight.returncode == 0, straight.stdout + straight.stderr
    return "\n".join(lines)


@shares_float64_runs
def test_a_run_resumed_on_more_ranks_equals_an_uninterrupted_one(one_rank, resumed):
    base, resumed_output = one_rank, resumed
    rows = metrics_rows(base / "one_then_two", strict=True)
    assert [(r["epoch"], r["world_size"], r["global_batch_size"]) for r in rows] == [
        (1, 1, 32), (2, 2, 32)]
    resumed = torch.load(base / "one_then_two" / CHECKPOINT, weights_only=True)
    straight = torch.load(base / "straight" / CHECKPOINT, weights_only=True)
    assert resumed["epoch"] == straight["epoch"] == 2
    assert max_difference(resumed["model"], straight["model"]) < 1e-12
    assert max_difference(momentum_buffers(resumed), momentum_buffers(straight)) < 1e-12
    info = json.loads((base / "one_then_two" / SHARDED_CHECKPOINT / "checkpoint.json").read_text())
    assert info["world_size"] == 2
    assert "resuming after epoch 1" in resumed_output
    assert "saved by 1 rank(s), loaded by 2" in resumed_output, resumed_output[-2000:]


@shares_float64_runs
def test_no_process_is_left_behind(one_rank, resumed):
    base = one_rank
    # the runs' own folder is in every command line they started (another test, on the other
    # pytest-xdist worker, may be running train_fsdp.py now: its processes are not ours)
    assert processes_mentioning(str(base)) == []


# ---------------------------------------------------------------------------------------
# Bad input: one line, exit status 2, nothing overwritten
# ---------------------------------------------------------------------------------------
@shares_float64_runs
def test_refuses_to_overwrite_a_run(one_rank, tmp_path):
    shutil.copytree(one_rank / "one", tmp_path / "one")
    before = (tmp_path / "one" / "metrics.jsonl").read_text()
    result = run_one_rank(*FLOAT64, "--epochs", "2", "--out", tmp_path / "one")
    assert_one_line_error(result, "already holds a run; pass --resume")
    assert (tmp_path / "one" / "metrics.jsonl").read_text() == before


@shares_float64_runs
def test_a_missing_or_broken_sharded_checkpoint_is_an_error_not_a_fresh_start(one_rank, tmp_path):
    shutil.copytree(one_rank / "one", tmp_path / "one")
    shutil.rmtree(tmp_path / "one" / SHARDED_CHECKPOINT)
    result = run_one_rank(*FLOAT64, "--epochs", "2", "--resume", "--out", tmp_path / "one")
    assert_one_line_error(result, "holds epochs [1] but no sharded checkpoint",
                          "checkpoint.dcp is missing")
    assert [r["epoch"] for r in metrics_rows(tmp_path / "one")] == [1]
    # A folder without DCP's plan (.metadata): unreadable, said in one line too.
    shutil.copytree(one_rank / "one" / SHARDED_CHECKPOINT, tmp_path / "one" / SHARDED_CHECKPOINT)
    (tmp_path / "one" / SHARDED_CHECKPOINT / ".metadata").unlink()
    result = run_one_rank(*FLOAT64, "--epochs", "2", "--resume", "--out", tmp_path / "one")
    assert_one_line_error(result, "cannot read the sharded checkpoint")


@shares_float64_runs
def test_resuming_with_another_global_batch_says_which(one_rank, tmp_path):
    shutil.copytree(one_rank / "one", tmp_path / "one")
    args = [arg for arg in FLOAT64 if arg not in ("--global-batch-size", "32")]
    result = run_one_rank(*args, "--batch-size", "16", "--epochs", "2", "--resume",
                          "--out", tmp_path / "one")
    assert_one_line_error(result, "trained with a global batch of 32 and this run's is 16",
                          "--global-batch-size 32")


def test_a_global_batch_that_does_not_split_over_the_ranks(tmp_path):
    """Found before the ranks meet: a world of 3 need not exist for the error."""
    env = {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    with mock.patch.dict(os.environ, env):
        result = run_in_process("train_fsdp.py", *FLOAT64, "--out", tmp_path / "run")
    assert_one_line_error(result, "a global batch of 32 does not split over 3 ranks")
    assert not (tmp_path / "run").exists()


def test_outside_torchrun_and_cpu_offload_on_a_cpu(tmp_path):
    result = run_in_process("train_fsdp.py", *SMALL, "--device", "cpu", "--out", tmp_path / "a")
    assert_one_line_error(result, "start this script with torchrun")
    result = run_one_rank(*SMALL, "--device", "cpu", "--cpu-offload", "--out", tmp_path / "b")
    assert_one_line_error(result, "--cpu-offload", "on cpu already")


def test_test_batches_that_would_leave_a_rank_waiting():
    from ddp_scripts.cli import UsageError
    from ddp_scripts.sharding import check_same_number_of_batches
    check_same_number_of_batches(128, 16, 2)
    with pytest.raises(UsageError, match="give the 2 ranks 1 or 2 batches"):
        check_same_number_of_batches(33, 16, 2)  # rank 0: 17 images, rank 1: 16


# ---------------------------------------------------------------------------------------
# The model worth sharding, and the memory options
# ---------------------------------------------------------------------------------------
def test_wide_mlp_with_activation_checkpointing_trains_the_same_model(tmp_path):
    """Recomputing activations in backward saves memory and changes no number."""
    mlp = [*SMALL, "--model", "mlp", "--width", "64", "--depth", "2", "--epochs", "1",
           "--device", "cpu"]
    plain = run_one_rank(*mlp, "--out", tmp_path / "plain")
    recomputed = run_one_rank(*mlp, "--activation-checkpointing", "--out", tmp_path / "ac")
    assert plain.returncode == 0 and recomputed.returncode == 0, plain.stderr + recomputed.stderr
    assert max_difference(load_model_state(tmp_path / "plain"),
                          load_model_state(tmp_path / "ac")) == 0.0
    row = metrics_rows(tmp_path / "plain", strict=True)[0]
    assert row["parameters"] == (3072 + 1) * 64 + 2 * (2 * 64 + 8 * 64 * 64 + 5 * 64) \
        + 2 * 64 + 64 * 10 + 10
    low = run_one_rank(*mlp, "--mixed-precision", "bfloat16", "--out", tmp_path / "bf16")
    assert low.returncode == 0, low.stderr
    state = load_model_state(tmp_path / "bf16")
    assert state["stem.weight"].dtype == torch.float32  # the weights stay float32; compute is bf16
    assert torch.isfinite(torch.tensor(metrics_rows(tmp_path / "bf16")[0]["train_loss"]))


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs: nccl, one rank each")
def test_on_two_gpus_nccl_and_peak_memory(tmp_path):
    frame = run_script("train_fsdp.py", nproc=2, out=tmp_path, dataset="synthetic",
                       train_samples=512, test_samples=128, epochs=1, model="mlp",
                       device="cuda", timeout=300, progress=False)
    row = frame.iloc[-1]
    assert (row["backend"], row["device"]) == ("nccl", "cuda:0")
    assert row["max_memory_reserved"] >= row["max_memory_allocated"] > row["param_bytes_per_rank"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: CPU offload")
def test_cpu_offload_on_a_gpu(tmp_path):
    frame = run_script("train_fsdp.py", nproc=1, out=tmp_path, dataset="synthetic",
                       train_samples=256, test_samples=64, epochs=1, model="mlp",
                       cpu_offload=True, device="cuda", timeout=300, progress=False)
    assert frame.iloc[-1]["strategy"] == "fsdp"


# ---------------------------------------------------------------------------------------
# The whole model is never made on a rank
# ---------------------------------------------------------------------------------------
class LargestPlainTensor(torch.utils._python_dispatch.TorchDispatchMode):
    """Notes the largest plain tensor (not meta, not a DTensor) any operation makes while
    `recording` is on."""

    def __init__(self):
        super().__init__()
        self.recording, self.largest = False, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.recording:
            for tensor in torch.utils._pytree.tree_leaves(out):
                if type(tensor) is torch.Tensor and tensor.device.type != "meta":
                    self.largest = max(self.largest, tensor.numel())
        return out


class SetUpDone(Exception):
    pass


def test_train_fsdp_never_makes_a_tensor_of_the_whole_model_size(tmp_path):
    """train_fsdp.py's set-up as rank 0 of 2 (a fake process group: the collectives do
    nothing), from building the model to the optimizer: no tensor as large as the model's
    largest weight is ever made, and the shards hold that weight's rows. build_model, as
    the other scripts call it, makes it whole (the recorder sees it)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import ddp_scripts.train_fsdp as script
    from ddp_scripts import sharding
    from ddp_scripts.models import build_model
    recorder = LargestPlainTensor()
    built, made = sharding.build_fsdp_model, sharding.materialize_shards
    seen = {}

    def build(*args, **kwargs):
        recorder.recording = True
        return built(*args, **kwargs)

    def materialize(model, *args):
        made(model, *args)
        seen["shard"] = model.stem.weight.to_local().clone()
        raise SetUpDone  # the optimizer and training are train_ddp.py's, tested elsewhere

    def fake_group(device, timeout_s):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)

    argv = ["train_fsdp.py", *SMALL, "--model", "mlp", "--width", "64", "--depth", "2",
            "--device", "cpu", "--seed", "5", "--out", str(tmp_path / "run")]
    env = {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}  # as torchrun sets them
    with mock.patch.dict(os.environ, env), mock.patch("sys.argv", argv), \
            mock.patch.object(sharding, "build_fsdp_model", build), \
            mock.patch.object(sharding, "materialize_shards", materialize), \
            mock.patch.object(script, "init_process_group", fake_group), recorder:
        try:
            with pytest.raises(SetUpDone):
                script.main()
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
    torch.manual_seed(5)
    whole = sharding.WideMLP(64, 2)
    largest_weight = max(p.numel() for p in whole.parameters())  # the stem's, 64 x 3072
    assert 0 < recorder.largest <= largest_weight / 2, (recorder.largest, largest_weight)
    assert torch.equal(seen["shard"], whole.stem.weight.detach()[:32])  # rank 0: the first half
    with recorder:
        recorder.largest = 0
        build_model("cnn")
    assert recorder.largest == max(p.numel() for p in build_model("cnn").parameters())


# ---------------------------------------------------------------------------------------
# What each rank holds: the shards, to the byte, and the root's gathered copy beside them
# ---------------------------------------------------------------------------------------
def test_bytes_per_rank_are_the_shards_and_the_gathered_root_comes_beside_them():
    """The wide MLP sharded over 4 ranks (a fake process group: rank 0's shards are made,
    the collectives move nothing), one step, then a forward pass under no_grad as the
    epoch's evaluation runs it. Each tensor's first dimension d is cut into ceil(d / 4)
    rows, rank 0's share (the head's 10 rows: 3 + 3 + 3 + 1): what bytes_per_rank reports,
    exactly. The root (stem and head), not resharded after forward, is held gathered beside
    its shards until state_dict(), which the checkpoint's save calls, reshards it."""
    import math

    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from ddp_scripts.sharding import WideMLP, bytes_per_rank
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        torch.manual_seed(0)
        model = WideMLP(64, 2).to(torch.float64)
        whole = {name: p.shape for name, p in model.named_parameters()}
        root = sum(p.numel() for part in (model.stem, model.head) for p in part.parameters()) * 8
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        images = torch.randn(8, 3, 32, 32, dtype=torch.float64)
        torch.nn.functional.cross_entropy(model(images), torch.randint(0, 10, (8,))).backward()
        optimizer.step()
        with torch.no_grad():
            model(images)
        assert not isinstance(model.stem.weight, DTensor)  # the root's gathered copy, shown
        held = bytes_per_rank(model, optimizer, torch.device("cpu"))
        shards = 8 * sum(math.ceil(shape[0] / 4) * math.prod(shape[1:]) for shape in whole.values())
        assert shards > 8 * sum(math.prod(shape) for shape in whole.values()) / 4  # the head pads
        assert (held["param_bytes_per_rank"], held["grad_bytes_per_rank"],
                held["optimizer_bytes_per_rank"]) == (shards, shards, shards)
        assert held["gathered_bytes_per_rank"] == root
        assert held["parameters"] == sum(math.prod(shape) for shape in whole.values())
        model.state_dict()  # what get_state_dict calls before DCP saves
        assert isinstance(model.stem.weight, DTensor)
        assert bytes_per_rank(model, optimizer, torch.device("cpu"))["gathered_bytes_per_rank"] == 0
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------
# A 2-rank run resumed on 1 rank, and a shard file cut short
# ---------------------------------------------------------------------------------------
# float32, the CNN, 2 ranks of 32 (a global batch of 64): 4 steps an epoch.
TWO_RANKS = dict(dataset="synthetic", train_samples=256, test_samples=64, device="cpu", epochs=3,
                 timeout=300, progress=False, echo=lambda line: None)
ON_ONE_RANK = ["--dataset", "synthetic", "--train-samples", "256", "--test-samples", "64",
               "--device", "cpu", "--epochs", "3", "--resume", "--global-batch-size", "64"]
shares_two_rank_runs = pytest.mark.xdist_group("fsdp_two_ranks")


@pytest.fixture(scope="session")
def two_ranks(tmp_path_factory):
    """FSDP on 2 ranks, stopped after epoch 1 of 3 (base/"stopped"), and the uninterrupted
    3 epochs (base/"straight")."""
    base = tmp_path_factory.mktemp("fsdp_two_ranks")
    run_script("train_fsdp.py", nproc=2, out=base / "stopped", stop_after_epoch=1, **TWO_RANKS)
    run_script("train_fsdp.py", nproc=2, out=base / "straight", **TWO_RANKS)
    return base


@shares_two_rank_runs
def test_a_run_resumed_on_fewer_ranks_equals_an_uninterrupted_one(two_ranks, tmp_path):
    """Saved by 2 ranks of 32, resumed on 1 rank of 64: each step sees the same 64 images
    (DistributedSampler gives rank r the shuffled images r, r + 2, ...), so the losses are
    the uninterrupted run's. Only the order of the float32 sums differs: one rank adds 64
    images' gradients, two ranks add 32 each and then average. That changes the last bits
    (about 1e-7 on a loss of 2.3 here). Momentum buffers lost in the resume change them by
    about 1e-3, as would another order of the data: far more than 1e-5."""
    shutil.copytree(two_ranks / "stopped", tmp_path / "run")
    result = run_one_rank(*ON_ONE_RANK, "--out", tmp_path / "run")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "resuming after epoch 1" in result.stdout
    assert "saved by 2 rank(s), loaded by 1" in result.stdout, result.stdout
    resumed = metrics_rows(tmp_path / "run", strict=True)
    straight = metrics_rows(two_ranks / "straight", strict=True)
    assert [(r["epoch"], r["world_size"], r["global_batch_size"]) for r in resumed] == [
        (1, 2, 64), (2, 1, 64), (3, 1, 64)]
    assert [r["epoch"] for r in straight] == [1, 2, 3]
    for ours, theirs in zip(resumed, straight, strict=True):
        for key in ("train_loss", "test_loss"):
            assert abs(ours[key] - theirs[key]) < 1e-5, (ours["epoch"], key, ours[key], theirs[key])
    assert straight[0]["train_loss"] - straight[2]["train_loss"] > 1e-3  # it trained


@shares_two_rank_runs
def test_a_shard_file_cut_short_is_named_with_its_size(two_ranks, tmp_path):
    """DCP's plan (.metadata) says where each saved item lies in which file: a file shorter
    than that is named in the line, with both sizes; nothing in the run changes."""
    import re
    shutil.copytree(two_ranks / "stopped", tmp_path / "run")
    shard = tmp_path / "run" / SHARDED_CHECKPOINT / "__0_0.distcp"
    size = shard.stat().st_size
    os.truncate(shard, 1000)
    before = {path.name: path.read_bytes() for path in (tmp_path / "run").iterdir()
              if path.is_file()}
    result = run_one_rank(*ON_ONE_RANK, "--out", tmp_path / "run")
    assert_one_line_error(result, f"cannot read the sharded checkpoint {shard.parent}: "
                                  "__0_0.distcp is 1,000 bytes; the checkpoint's index needs ",
                          ": it was cut short, or is not this checkpoint's file; pass "
                          "--overwrite to start again")
    needs = int(re.search(r"index needs ([\d,]+)", result.stderr)[1].replace(",", ""))
    assert 1000 < needs <= size
    assert before == {path.name: path.read_bytes() for path in (tmp_path / "run").iterdir()
                      if path.is_file()}
