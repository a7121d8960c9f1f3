"""Chapter 10's levers in train_fast.py (ddp_scripts/speed.py): each trains, is recorded,
refuses what cannot work in one line; with every lever off train_fast.py trains what train_ddp.py
trains, and train_single.py (lever-free) what a bare loop trains, bit for bit.

Runs go through run_in_process and are shared: a run made for one test is kept for the others
(the `runs` fixture). train_fast.py and train_ddp.py run as `torchrun --nproc-per-node 1` would
start them, in a world of one joined over gloo inside the test process. What needs a CUDA GPU
is marked `gpu` and skipped here.
"""
import argparse
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ddp_scripts.cli import UsageError
from ddp_scripts.devices import set_cpu_threads
from ddp_scripts.models import build_model
from ddp_scripts.data import synthetic_cifar
from ddp_scripts.runfiles import SUMMARY, metrics_rows
from ddp_scripts.speed import (AMP_DTYPES, DeviceBatches, RandomCropFlip, add_speed_options,
                               check_levers, train_batches)
from helpers import load_model_state, max_difference, run_in_process, run_one_rank

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none is visible here)")
# Small enough for seconds on two busy cores, large enough for the loss to fall visibly.
RUN = ["--dataset", "synthetic", "--train-samples", "512", "--test-samples", "128",
       "--epochs", "2", "--batch-size", "32", "--lr", "0.05", "--device", "cpu"]
LEVER_KEYS = {"data_on_device", "workers", "pin_memory", "augment", "amp", "channels_last",
              "compile"}
shares_runs = pytest.mark.xdist_group("speed_option_runs")


def run_fast(*args):
    return run_one_rank("train_fast.py", *args)


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """train_fast.py (one rank) with RUN and extra options, each made once: runs(*options)."""
    made = {}

    def run(*options, script="train_fast.py"):
        key = (script, *options)
        if key not in made:
            out = tmp_path_factory.mktemp("speed")
            if script == "train_single.py":
                result = run_in_process(script, *RUN, *options, "--out", out)
            else:
                result = run_one_rank(script, *RUN, *options, "--out", out)
            made[key] = argparse.Namespace(out=out, returncode=result.returncode,
                                           stdout=result.stdout, stderr=result.stderr,
                                           rows=metrics_rows(out))
        return made[key]
    return run


def trained(run):
    """The run succeeded, and its training loss fell from the first epoch to the last."""
    assert run.returncode == 0, run.stderr[-3000:]
    losses = [row["train_loss"] for row in run.rows]
    assert len(losses) == 2 and losses[-1] < losses[0], losses
    return run.rows[-1]


def bare_loop(epochs=2, samples=512, batch_size=32, lr=0.05, seed=0):
    """The training of train_single.py, written out plainly: the same model, shuffle,
    batches and steps, on as many threads as the script takes."""
    set_cpu_threads()
    (images, labels), _ = synthetic_cifar(samples, 128)
    model = build_model("cnn", seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for epoch in range(1, epochs + 1):
        order = torch.randperm(samples, generator=torch.Generator().manual_seed(seed + epoch))
        for start in range(0, samples, batch_size):
            index = order[start:start + batch_size]
            optimizer.zero_grad()
            F.cross_entropy(model(images[index]), labels[index]).backward()
            optimizer.step()
    return model.state_dict()


# ---------------------------------------------------------------------------------------
# Defaults: the lever-free script is a bare loop; train_fast.py with every lever off is train_ddp.py
# ---------------------------------------------------------------------------------------
@shares_runs
def test_the_lever_free_script_is_a_bare_loop_bit_for_bit(runs):
    single = runs(script="train_single.py")
    trained(single)
    assert max_difference(load_model_state(single.out), bare_loop()) == 0.0


@shares_runs
def test_every_lever_off_trains_what_train_ddp_trains(runs):
    fast, ddp = runs(), runs(script="train_ddp.py")
    row = trained(fast)
    assert {key: row[key] for key in LEVER_KEYS} == {
        "data_on_device": False, "workers": 0, "pin_memory": False, "augment": False,
        "amp": "off", "channels_last": False, "compile": "off"}
    assert max_difference(load_model_state(fast.out), load_model_state(ddp.out)) == 0.0
    trained(ddp)
    assert [r["train_loss"] for r in fast.rows] == [r["train_loss"] for r in ddp.rows]
    explicit = runs("--amp", "off", "--compile", "off", "--workers", "0")
    assert explicit.returncode == 0, explicit.stderr
    assert max_difference(load_model_state(explicit.out), load_model_state(fast.out)) == 0.0


# ---------------------------------------------------------------------------------------
# Each option on the CPU: it trains, and what took effect is recorded
# ---------------------------------------------------------------------------------------
@shares_runs
# Each test worker has one core of its own (tests/conftest.py), so the DataLoader warns that
# two workers are more than it suggests; two are what the test asks for.
@pytest.mark.filterwarnings("ignore:This DataLoader will create 2 worker processes")
@pytest.mark.parametrize("options, recorded", [
    (["--augment"], {"augment": True}),
    (["--workers", "2"], {"workers": 2}),
    (["--workers", "2", "--augment"], {"workers": 2, "augment": True}),
    (["--amp", "bf16"], {"amp": "bf16"}),
    (["--amp", "fp16"], {"amp": "fp16"}),
    (["--channels-last"], {"channels_last": True}),
], ids=lambda value: " ".join(value) if isinstance(value, list) else None)
def test_each_option_trains_and_is_recorded(runs, options, recorded):
    run = runs(*options)
    row = trained(run)
    assert {key: row[key] for key in recorded} == recorded
    summary = json.loads((run.out / SUMMARY).read_text())["args"]  # as they took effect
    assert {key: summary[key] for key in recorded} == recorded
    assert LEVER_KEYS <= summary.keys()


@shares_runs
@pytest.mark.parametrize("option, says", [
    ("--data-on-device", "--data-on-device changes nothing on the CPU"),
    ("--pin-memory", "--pin-memory changes nothing on cpu"),
])
def test_options_for_a_gpu_say_they_change_nothing_on_the_cpu(runs, option, says):
    run = runs(option)
    row = trained(run)
    assert says in run.stdout
    assert row[option[2:].replace("-", "_")] is False  # recorded as what took effect
    default = runs()
    assert max_difference(load_model_state(run.out), load_model_state(default.out)) == 0.0


@shares_runs
def test_amp_changes_the_numbers_but_not_the_learning(runs):
    default, bf16 = runs(), runs("--amp", "bf16")
    difference = max_difference(load_model_state(default.out), load_model_state(bf16.out))
    assert 0 < difference < 0.05, difference  # bf16 rounds (8 bits of mantissa), no more
    assert abs(trained(bf16)["train_loss"] - trained(default)["train_loss"]) < 0.05


@shares_runs
def test_channels_last_computes_the_same_model(runs):
    default, nhwc = runs(), runs("--channels-last")
    difference = max_difference(load_model_state(default.out), load_model_state(nhwc.out))
    assert difference < 1e-4, difference  # the same arithmetic in another order


@shares_runs
def test_augmented_run_resumed_equals_the_uninterrupted_one(runs, tmp_path):
    straight = runs("--augment")
    first = run_fast(*RUN, "--augment", "--stop-after-epoch", "1", "--out", tmp_path)
    second = run_fast(*RUN, "--augment", "--resume", "--out", tmp_path)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert max_difference(load_model_state(tmp_path), load_model_state(straight.out)) == 0.0
    default = runs()
    assert max_difference(load_model_state(straight.out), load_model_state(default.out)) > 1e-3


@shares_runs
@pytest.mark.filterwarnings("ignore:This DataLoader will create 2 worker processes")
def test_workers_train_the_model_the_training_process_trains(runs):
    """Each batch's crops are keyed by its epoch and number, not by the process that makes it."""
    alone, workers = runs("--augment"), runs("--workers", "2", "--augment")
    trained(workers)
    assert max_difference(load_model_state(workers.out), load_model_state(alone.out)) == 0.0


@shares_runs
def test_compile_default_trains_and_keeps_the_models_own_keys(runs):
    run = runs("--compile", "default")
    row = trained(run)
    assert row["compile"] == "default"
    # Compiled at model build, around DDP: the checkpoint is model.module's, with its own
    # keys, and the run took the steps of the uncompiled one (fused kernels round differently).
    state = load_model_state(run.out)
    assert not any(key.startswith(("_orig_mod.", "module.")) for key in state)
    assert max_difference(state, load_model_state(runs().out)) < 1e-3


def test_two_processes_with_the_cpu_levers(tmp_path):
    """DDP on the CPU (gloo) with augmentation in a worker, bf16 and channels_last."""
    from ddp_scripts.launcher import run_script
    frame = run_script("train_fast.py", nproc=2, out=tmp_path, dataset="synthetic",
                       train_samples=512, test_samples=128, epochs=2, batch_size=16, lr=0.05,
                       device="cpu", augment=True, workers=1, amp="bf16", channels_last=True,
                       timeout=300, progress=False)
    assert list(frame["world_size"]) == [2, 2]
    assert frame["train_loss"].iloc[-1] < frame["train_loss"].iloc[0]
    last = frame.iloc[-1]
    assert (last["augment"], last["workers"], last["amp"], last["channels_last"]) == (
        True, 1, "bf16", True)


# ---------------------------------------------------------------------------------------
# Refusals: one line on stderr, exit status 2, nothing trained
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("options, says", [
    (["--workers", "-1"], "--workers must be 0 or more"),
    (["--data-on-device", "--workers", "2"], "choose one or the other"),
    (["--data-on-device", "--pin-memory"], "choose one or the other"),
    (["--amp", "bf16", "--dtype", "float64"], "--amp bf16 lowers float32 to 16 bits"),
    (["--compile", "reduce-overhead"], "replays CUDA graphs, which need a CUDA GPU"),
    (["--amp", "fp32"], "invalid choice: 'fp32'"),
])
def test_bad_combinations_are_one_line_errors(tmp_path, options, says):
    result = run_fast(*RUN, *options, "--out", tmp_path / "run")
    assert result.returncode == 2, result.stdout + result.stderr
    assert says in result.stderr and "Traceback" not in result.stderr
    if "invalid choice" not in says:  # argparse prints its usage first
        assert result.stderr.strip().count("\n") == 0, result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def lever_args(**options):
    args = add_speed_options(argparse.ArgumentParser()).parse_args([])
    args.seed, args.dtype = 0, "float32"
    vars(args).update(options)
    return args


def test_bf16_on_a_gpu_without_it_is_refused_with_the_reason(monkeypatch):
    class T4:
        name, major, minor = "Tesla T4", 7, 5
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: T4)
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda device_type: True)
    with pytest.raises(UsageError, match=r"Tesla T4 \(compute capability 7.5\) has no bfloat16 "
                                         r"arithmetic.*use --amp fp16"):
        check_levers(lever_args(amp="bf16"), torch.device("cuda"))


def test_amp_on_the_cpu_autocasts_the_step_as_train_fast_does():
    """On the CPU both 16-bit formats run under the step's autocast line; off, nothing changes."""
    for amp, dtype in AMP_DTYPES.items():
        with torch.autocast("cpu", dtype=dtype, enabled=amp != "off"):
            out = nn.Linear(4, 4)(torch.randn(2, 4))
        assert out.dtype == (dtype or torch.float32)


# ---------------------------------------------------------------------------------------
# The parts: batches on the device, the augmentation
# ---------------------------------------------------------------------------------------
def test_device_batches_are_the_dataloaders_batches():
    from ddp_scripts.data import TensorImages, make_loader
    from torch.utils.data import DistributedSampler, RandomSampler
    (images, labels), _ = synthetic_cifar(100, 10)
    data = TensorImages(images, labels, "synthetic")
    samplers = [lambda: RandomSampler(data, generator=torch.Generator().manual_seed(3)),
                lambda: DistributedSampler(data, num_replicas=3, rank=1, seed=5),
                lambda: range(2, 100, 3)]
    for sampler in samplers:
        expected = list(make_loader(data, 16, sampler()))
        got = list(DeviceBatches(data, 16, sampler(), torch.device("cpu")))
        assert len(got) == len(expected) == len(DeviceBatches(data, 16, sampler(), "cpu"))
        for (x1, y1), (x2, y2) in zip(expected, got):
            assert torch.equal(x1, x2) and torch.equal(y1, y2)


def test_crop_and_flip_moves_pixels_only():
    images = torch.randn(64, 3, 32, 32)
    out = RandomCropFlip(seed=0)(images, epoch=1, number=0)
    assert out.shape == images.shape
    shifted = flipped = 0
    for image, result in zip(images, out):  # each result is a shifted view, perhaps mirrored
        found = [(dy, dx, flip) for dy in range(-4, 5) for dx in range(-4, 5)
                 for flip in (False, True)
                 if torch.equal((result.flip(2) if flip else result)[:, 4:28, 4:28],
                                image[:, 4 + dy:28 + dy, 4 + dx:28 + dx])]
        assert found, "not a crop of the padded image"
        shifted += any(dy or dx for dy, dx, _ in found)
        flipped += all(flip for _, _, flip in found)
    assert 40 < shifted and 16 < flipped < 48  # crops move (8 in 81 stay put); half flip


def test_crops_repeat_per_batch_and_differ_between_epochs_ranks_and_batches():
    images = torch.randn(32, 3, 32, 32)

    def crops(epoch, rank=0, number=0):
        crop_flip = RandomCropFlip(seed=0)
        crop_flip.rank = rank
        return crop_flip(images, epoch, number)
    assert torch.equal(crops(1), crops(1))
    for other in (crops(2), crops(1, rank=1), crops(1, number=1)):
        assert not torch.equal(crops(1), other)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 2 worker processes")
def test_workers_start_from_a_forkserver_once_and_draw_each_epochs_crops():
    """--workers: the workers are not forked (chapter 9: a process running NCCL is not safe to
    fork), they serve every epoch, and each epoch's batches are those made without workers."""
    from torch.utils.data import RandomSampler
    from ddp_scripts.data import TensorImages
    (images, labels), _ = synthetic_cifar(96, 10)
    data = TensorImages(images, labels, "synthetic")
    shuffle = torch.Generator()
    made = {workers: train_batches(data, 32, RandomSampler(data, generator=shuffle),
                                   lever_args(augment=True, workers=workers), torch.device("cpu"))
            for workers in (0, 2)}
    assert made[2].multiprocessing_context.get_start_method() == "forkserver"
    assert made[2].persistent_workers and not made[0].persistent_workers
    for epoch in (1, 2):  # kept from epoch 1, the workers still draw epoch 2's crops
        batches = {}
        for workers in (0, 2):
            shuffle.manual_seed(epoch)
            batches[workers] = list(made[workers])
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                   for a, b in zip(batches[0], batches[2], strict=True))


# ---------------------------------------------------------------------------------------
# On a CUDA GPU
# ---------------------------------------------------------------------------------------
GPU_RUN = ["--dataset", "synthetic", "--train-samples", "2048", "--test-samples", "512",
           "--epochs", "2", "--batch-size", "128", "--lr", "0.05", "--device", "cuda"]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("options", [
    ["--data-on-device"], ["--data-on-device", "--augment"], ["--workers", "2", "--pin-memory"],
    ["--amp", "fp16"], ["--amp", "bf16", "--channels-last"],
    ["--compile", "reduce-overhead", "--data-on-device"],
], ids=" ".join)
def test_each_option_trains_on_a_gpu(tmp_path, options):
    if "bf16" in options and not torch.cuda.is_bf16_supported(including_emulation=False):
        pytest.skip("this GPU has no bfloat16 arithmetic")
    result = run_fast(*GPU_RUN, *options, "--out", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = metrics_rows(tmp_path)
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert rows[-1]["data_on_device"] == ("--data-on-device" in options)


@pytest.mark.gpu
@needs_cuda
def test_data_on_the_gpu_takes_the_same_steps(tmp_path):
    plain = run_fast(*GPU_RUN, "--out", tmp_path / "plain")
    on_gpu = run_fast(*GPU_RUN, "--data-on-device", "--out", tmp_path / "on")
    assert plain.returncode == on_gpu.returncode == 0, plain.stderr + on_gpu.stderr
    difference = max_difference(load_model_state(tmp_path / "plain"),
                                load_model_state(tmp_path / "on"))
    assert difference < 1e-4, difference  # the same batches; cuDNN may pick other kernels


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_ddp_on_two_gpus_with_every_lever(tmp_path):
    from ddp_scripts.launcher import run_script
    amp = "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp16"
    frame = run_script("train_fast.py", nproc=2, out=tmp_path, dataset="synthetic",
                       train_samples=2048, test_samples=512, epochs=2, batch_size=64, lr=0.05,
                       device="cuda", data_on_device=True, augment=True, amp=amp,
                       channels_last=True, compile="reduce-overhead", timeout=600,
                       progress=False)
    assert frame["train_loss"].iloc[-1] < frame["train_loss"].iloc[0]
    assert (frame["compile"] == "reduce-overhead").all() and frame["data_on_device"].all()


# ---------------------------------------------------------------------------------------
# The benchmark's tuned rows (benchmark.py --tuned)
# ---------------------------------------------------------------------------------------
def tuned_plan(gpu_count, model="cnn", bf16=True):
    from ddp_scripts.measure.benchmark import CONFIGS, plan_runs, settings_for
    settings = settings_for("smoke", model=model)
    runs = plan_runs(CONFIGS, settings, gpu_count, "runs/b", gpu_names=["NVIDIA H200"] * gpu_count,
                     tuned=True, cpu_best={"threads": 2, "batch_size": 256}, bf16=bf16)
    return {run["config"]: run for run in runs}


def test_tuned_plan_puts_each_tuned_row_beside_its_plain_one():
    from ddp_scripts.measure.benchmark import ROW_ORDER
    assert list(tuned_plan(2)) == list(ROW_ORDER)
    for config, run in tuned_plan(2).items():
        assert run.get("tuned", False) == config.endswith("-tuned")
        assert run["out"].endswith("/" + config)


def test_tuned_cpu_row_gets_its_best_threads_and_batch_only():
    runs = tuned_plan(0)
    cpu, tuned = runs["cpu"]["options"], runs["cpu-tuned"]["options"]
    assert "skip" not in runs["cpu-tuned"]
    assert (tuned["threads"], tuned["batch_size"]) == (2, 256) and "threads" not in cpu
    assert {k: v for k, v in tuned.items() if k not in ("threads", "batch_size")} == {
        k: v for k, v in cpu.items() if k != "batch_size"}
    assert runs["cpu-tuned"]["global_batch_size"] == 256


@pytest.mark.parametrize("model, bf16, extra", [
    ("cnn", True, {"compile": "reduce-overhead"}),
    # BatchNorm under DDP with CUDA graphs: pytorch/pytorch#139207, so compile without them
    ("resnet18", True, {"amp": "bf16", "channels_last": True, "compile": "default"}),
    ("resnet18", False, {"amp": "fp16", "channels_last": True, "compile": "default"}),
])
def test_tuned_gpu_rows_run_train_fast_with_its_levers_at_the_same_batch(model, bf16, extra):
    runs = tuned_plan(2, model, bf16)
    for config in ("gpu", "ddp"):
        plain, tuned = runs[config], runs[config + "-tuned"]
        assert "skip" not in tuned and tuned["processes"] == plain["processes"]
        assert tuned["script"] == "train_fast.py" and tuned["torchrun"]
        assert tuned["batch_size_per_process"] == plain["batch_size_per_process"]
        added = {k: v for k, v in tuned["options"].items() if plain["options"].get(k) != v}
        assert added == {"data_on_device": True, "tf32": True, **extra}
    assert "dp-tuned" not in runs  # DataParallel is not tuned: DDP replaces it


def test_tuned_rows_are_skipped_with_the_plain_rows_reason():
    runs = tuned_plan(1)
    assert "skip" not in runs["gpu-tuned"]
    assert runs["ddp-tuned"]["skip"] == runs["ddp"]["skip"]
    no_gpu = tuned_plan(0)
    assert no_gpu["gpu-tuned"]["skip"] == no_gpu["gpu"]["skip"]
    assert "GPU levers" in no_gpu["ddp-tuned"]["skip"]  # ddp runs on the CPU: nothing to tune


def test_table_shows_tuned_rows_beside_plain_ones_with_their_speed_ups():
    from ddp_scripts.measure.benchmark import results_table

    def measured(config, gpus, epoch_s):
        return {"config": config, "status": "measured", "description": config, "processes": 1,
                "batch_size_per_process": 64, "global_batch_size": 64,
                "threads_per_process": 1, "gpus": gpus, "wall_s": 10 * epoch_s,
                "startup_s": 1.0, "steady_epoch_s": epoch_s, "samples_per_s": 1 / epoch_s,
                "test_accuracy": 0.5}
    results = {"runs": [measured("cpu", 0, 8.0), measured("cpu-tuned", 0, 4.0),
                        measured("gpu", 1, 2.0), measured("gpu-tuned", 1, 0.25),
                        measured("ddp", 2, 1.25), measured("ddp-tuned", 2, 0.2)]}
    table = results_table(results)
    assert list(table.index) == ["cpu", "cpu-tuned", "gpu", "gpu-tuned", "ddp", "ddp-tuned"]
    assert table.loc["gpu-tuned", "x untuned"] == 8.0 and table.loc["cpu-tuned", "x untuned"] == 2.0
    assert table.loc["gpu-tuned", "x tuned CPU"] == 16.0
    assert table.loc["ddp-tuned", "x 1 GPU"] == 1.25  # against the tuned one-GPU row
    assert table.loc["ddp-tuned", "efficiency"] == pytest.approx(0.625)
    assert table["x untuned"].isna().tolist() == [True, False, True, False, True, False]


def test_resnet18_is_the_cifar_variant():
    """3x3 stride-1 stem, no max-pool: a 32x32 image is still 32x32 when the first block
    starts (torchvision's ImageNet stem would leave 8x8)."""
    model = build_model("resnet18")
    again = build_model("resnet18")  # the same seed, the same weights
    assert max_difference(model.state_dict(), again.state_dict()) == 0.0
    assert (model.conv1.kernel_size, model.conv1.stride) == ((3, 3), (1, 1))
    assert isinstance(model.maxpool, nn.Identity)
    stem = nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool)
    with torch.no_grad():
        assert stem(torch.randn(2, 3, 32, 32)).shape == (2, 64, 32, 32)
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_augmented_batches_are_the_same_on_the_device_path_and_the_loader_path():
    """--augment draws the same crops whether batches are cut by DeviceBatches (the path of
    --data-on-device, here on the CPU) or made by the DataLoader in the training process."""
    from torch.utils.data import RandomSampler
    from ddp_scripts.data import TensorImages
    (images, labels), _ = synthetic_cifar(96, 10)
    data = TensorImages(images, labels, "synthetic")
    shuffle = torch.Generator()
    on_device = DeviceBatches(data, 32, RandomSampler(data, generator=shuffle),
                              torch.device("cpu"), RandomCropFlip(seed=0))
    loader = train_batches(data, 32, RandomSampler(data, generator=shuffle),
                           lever_args(augment=True), torch.device("cpu"))
    for epoch in (1, 2):
        shuffle.manual_seed(epoch)
        first = list(on_device)
        shuffle.manual_seed(epoch)
        second = list(loader)
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                   for a, b in zip(first, second, strict=True))
        shuffle.manual_seed(epoch)
        plain = list(DeviceBatches(data, 32, RandomSampler(data, generator=shuffle), "cpu"))
        assert torch.equal(plain[0][1], first[0][1])  # the same images, in the same order,
        assert not torch.equal(plain[0][0], first[0][0])  # cropped and flipped
