"""On CUDA GPUs: what a machine with one GPU, and one with several, must show.

Marked `gpu`: on a machine without CUDA (or with fewer GPUs than a test needs) each test is
skipped with its reason. `pytest -m gpu tests` runs them; `make gpu-check` does too.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from ddp_scripts.launcher import LaunchError, run_command, run_script, torchrun_command
from ddp_scripts.runfiles import CHECKPOINT, metrics_rows
from helpers import ROOT, SCRIPTS, SMALL, load_model_state, max_difference, run_in_process

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.gpu
one_gpu = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU; this machine has none")
two_gpus = pytest.mark.skipif(GPUS < 2, reason=f"needs two or more CUDA GPUs; this machine has {GPUS}")
exactly_one_gpu = pytest.mark.skipif(GPUS != 1, reason=f"checks a machine with exactly one GPU; this one has {GPUS}")
TF32_OFF = ["--dtype", "float64"]  # float64 never uses TF32; float32 runs keep it off by default


@one_gpu
def test_single_process_trains_on_cuda_and_its_checkpoint_loads_without_a_gpu(tmp_path):
    result = run_in_process("train_single.py", *SMALL, "--epochs", "2", "--device", "cuda",
                            "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    rows = metrics_rows(tmp_path, strict=True)
    assert rows[-1]["device"] == "cuda:0" and rows[-1]["train_loss"] < rows[0]["train_loss"]
    loader = ("import sys, torch;"
              "from ddp_scripts.resume import load_checkpoint; from ddp_scripts.models import build_model;"
              "assert not torch.cuda.is_available();"
              "build_model().load_state_dict(load_checkpoint(sys.argv[1])['model']); print('ok')")
    done = subprocess.run([sys.executable, "-c", loader, str(tmp_path / CHECKPOINT)], cwd=ROOT,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@one_gpu
def test_data_parallel_trains_on_the_visible_gpus(tmp_path):
    result = run_in_process("train_dp.py", *SMALL, "--epochs", "1", "--device", "cuda",
                            "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    row = metrics_rows(tmp_path, strict=True)[0]
    assert (row["strategy"], row["gpus"]) == ("dp", GPUS)
    assert not any(key.startswith("module.") for key in load_model_state(tmp_path))


@one_gpu
def test_ddp_one_process_per_gpu_over_nccl(tmp_path):
    frame = run_script("train_ddp.py", nproc=GPUS, out=tmp_path, device="cuda", epochs=1,
                       batch_size=16, timeout=600, progress=False, dataset="synthetic",
                       train_samples=512, test_samples=128)
    row = frame.iloc[-1]
    assert (row["backend"], row["world_size"], row["device"]) == ("nccl", GPUS, "cuda:0")


@one_gpu
def test_benchmark_measures_the_gpu_row(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPTS / "measure" / "benchmark.py"), "--configs", "cpu,gpu",
                           "--out", tmp_path / "b.json", "--runs-dir", tmp_path / "runs"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    runs = {run["config"]: run for run in json.loads((tmp_path / "b.json").read_text())["runs"]}
    assert runs["gpu"]["status"] == "measured" and runs["gpu"]["run_device"] == "cuda:0"


@exactly_one_gpu
def test_two_processes_on_one_gpu_are_one_line_errors(tmp_path):
    lines = []
    with pytest.raises(LaunchError) as caught:
        run_script("train_ddp.py", nproc=2, out=tmp_path, device="cuda", timeout=600,
                   progress=False, echo=lines.append, **dict(dataset="synthetic", epochs=1))
    assert caught.value.exit_code == 2, "\n".join(lines)
    assert "local rank 1 needs GPU 1, but only 1 GPU(s) are visible" in str(caught.value)


@two_gpus
def test_ddp_over_nccl_equals_one_process_with_twice_the_batch(tmp_path):
    run_script("train_ddp.py", nproc=2, out=tmp_path / "two", device="cuda", epochs=1,
               batch_size=16, dtype="float64", timeout=600, progress=False,
               dataset="synthetic", train_samples=512, test_samples=128)
    one = run_in_process("train_single.py", *SMALL, *TF32_OFF, "--epochs", "1", "--batch-size",
                         "32", "--device", "cuda", "--out", tmp_path / "one")
    assert one.returncode == 0, one.stderr
    assert max_difference(load_model_state(tmp_path / "one"), load_model_state(tmp_path / "two")) < 1e-10


@two_gpus
def test_data_parallel_splits_a_batch_over_the_gpus():
    seen = []

    class Report(torch.nn.Module):
        def forward(self, x):
            seen.append(x.device.index)
            return x

    torch.nn.DataParallel(Report().cuda())(torch.zeros(4 * GPUS, 3, device="cuda:0"))
    assert sorted(seen) == list(range(GPUS))


@two_gpus
def test_ddp_resume_over_nccl_is_bit_identical(tmp_path):
    options = dict(device="cuda", epochs=3, batch_size=16, timeout=600, progress=False,
                   dataset="synthetic", train_samples=512, test_samples=128)
    run_script("train_ddp.py", nproc=2, out=tmp_path / "straight", **options)
    run_script("train_ddp.py", nproc=2, out=tmp_path / "resumed", stop_after_epoch=1, **options)
    run_script("train_ddp.py", nproc=2, out=tmp_path / "resumed", resume=True, **options)
    straight, resumed = (torch.load(tmp_path / name / CHECKPOINT, weights_only=True)
                         for name in ("straight", "resumed"))
    assert max_difference(straight["model"], resumed["model"]) == 0.0


@two_gpus
def test_batchnorm_statistics_agree_across_gpus(tmp_path):
    run_command(torchrun_command(str(ROOT / "tests" / "scripts" / "ranks_probe.py"), 2, [str(tmp_path), "cuda"]),
                timeout=600, echo=lambda line: None)
    means = [json.loads((tmp_path / f"rank{rank}.json").read_text())["running_mean"]
             for rank in (0, 1)]
    assert means[0] == means[1]


FSDP_SMALL = dict(dataset="synthetic", train_samples=512, test_samples=128, batch_size=16,
                  timeout=600, progress=False)


@one_gpu
def test_fsdp_on_one_gpu_trains_and_reports_its_memory_per_rank(tmp_path):
    frame = run_script("train_fsdp.py", nproc=1, out=tmp_path, device="cuda", epochs=1,
                       model="mlp", width=1024, **FSDP_SMALL)
    row = frame.iloc[-1]
    assert (row["backend"], row["world_size"], row["device"]) == ("nccl", 1, "cuda:0")
    # world size 1: the one rank holds every parameter, and the GPU's peak is measured
    assert row["param_bytes_per_rank"] == 4 * row["parameters"]
    assert row["max_memory_allocated"] >= row["param_bytes_per_rank"]


@one_gpu
def test_fsdp_sharded_checkpoint_resumes_over_nccl_as_an_uninterrupted_run(tmp_path):
    options = dict(device="cuda", epochs=2, model="mlp", width=256, dtype="float64",
                   **FSDP_SMALL)
    run_script("train_fsdp.py", nproc=1, out=tmp_path / "straight", **options)
    run_script("train_fsdp.py", nproc=1, out=tmp_path / "resumed", stop_after_epoch=1, **options)
    run_script("train_fsdp.py", nproc=1, out=tmp_path / "resumed", resume=True, **options)
    straight, resumed = (torch.load(tmp_path / name / CHECKPOINT, weights_only=True)
                         for name in ("straight", "resumed"))
    assert resumed["epoch"] == straight["epoch"] == 2
    assert max_difference(straight["model"], resumed["model"]) < 1e-12
    assert [r["epoch"] for r in metrics_rows(tmp_path / "resumed", strict=True)] == [1, 2]


# train_fast.py: train_ddp.py with chapter 10's levers, on one GPU under torchrun.
LEVERS = [
    ({"data_on_device": True}, {"data_on_device": True}),
    ({"workers": 2, "pin_memory": True}, {"workers": 2, "pin_memory": True}),
    ({"augment": True}, {"augment": True}),
    ({"amp": "bf16", "channels_last": True}, {"amp": "bf16", "channels_last": True}),
    ({"amp": "fp16"}, {"amp": "fp16"}),
    ({"compile": "default"}, {"compile": "default"}),
    ({"compile": "reduce-overhead", "data_on_device": True},
     {"compile": "reduce-overhead", "data_on_device": True}),
]


@one_gpu
@pytest.mark.parametrize("levers, recorded", LEVERS,
                         ids=["-".join(f"{k}={v}" for k, v in lv.items()) for lv, _ in LEVERS])
def test_train_fast_levers_take_effect_on_the_gpu_and_it_still_learns(tmp_path, levers, recorded):
    frame = run_script("train_fast.py", nproc=1, out=tmp_path, device="cuda", epochs=2,
                       **levers, **FSDP_SMALL)
    first, last = frame.iloc[0], frame.iloc[-1]
    assert (last["backend"], last["device"]) == ("nccl", "cuda:0")
    for key, value in recorded.items():
        assert last[key] == value, (key, last[key])
    assert last["train_loss"] < first["train_loss"]
    if levers.get("compile", "off") != "off":
        assert last["compile_s"] > 0
