"""The companion scripts' contract: resume, metrics and checkpoint format, one import path.

What chapter 5's own runs show (DDP on two processes equals one process with twice the
batch, in float32 and float64; the metrics and checkpoint of a DDP run; the article's old
launcher) is tested on those runs, in tests/site/test_chapter_runs.py."""
import sys

import torch

from ddp_scripts.runfiles import CHECKPOINT, metrics_rows
from helpers import SCRIPTS, SMALL, max_difference, momentum_buffers, run_in_process

CONTRACT_KEYS = {"epoch", "train_loss", "test_loss", "test_accuracy", "epoch_time_s",
                 "samples_per_s", "world_size", "device", "backend", "strategy"}


def read_metrics(out):
    return metrics_rows(out, strict=True)


def test_single_process_resume_equals_uninterrupted(tmp_path):
    common = [*SMALL, "--epochs", "3", "--device", "cpu", "--batch-size", "32"]
    straight = run_in_process("train_single.py", *common, "--out", tmp_path / "straight")
    first = run_in_process("train_single.py", *common, "--stop-after-epoch", "1",
                           "--out", tmp_path / "resumed")
    assert straight.returncode == 0 and first.returncode == 0, straight.stderr + first.stderr
    assert read_metrics(tmp_path / "resumed")[-1]["epoch"] == 1
    second = run_in_process("train_single.py", *common, "--resume", "--out", tmp_path / "resumed")
    assert second.returncode == 0, second.stderr
    assert "resuming after epoch 1" in second.stdout
    assert [r["epoch"] for r in read_metrics(tmp_path / "resumed")] == [1, 2, 3]
    resumed = torch.load(tmp_path / "resumed" / CHECKPOINT, weights_only=True)
    uninterrupted = torch.load(tmp_path / "straight" / CHECKPOINT, weights_only=True)
    assert max_difference(resumed["model"], uninterrupted["model"]) == 0.0
    assert max_difference(momentum_buffers(resumed), momentum_buffers(uninterrupted)) == 0.0


def test_resume_on_an_empty_directory_starts_fresh(tmp_path):
    result = run_in_process("train_single.py", *SMALL, "--epochs", "1", "--resume",
                            "--device", "cpu", "--out", tmp_path / "new")
    assert result.returncode == 0, result.stderr
    assert "resuming" not in result.stdout
    assert [r["epoch"] for r in read_metrics(tmp_path / "new")] == [1]


def test_synthetic_data_is_deterministic_with_a_separate_test_split():
    from ddp_scripts.data import synthetic_cifar
    (x1, y1), (xt1, yt1) = synthetic_cifar(256, 64)
    (x2, y2), _ = synthetic_cifar(256, 64)
    assert x1.shape == (256, 3, 32, 32) and xt1.shape == (64, 3, 32, 32)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert set(y1.tolist()) == set(range(10))
    assert not torch.equal(x1[:64], xt1)  # the test split holds other images


def test_synthetic_data_is_learnable(tmp_path):
    """Three epochs of the CNN on 2048 synthetic images: well above chance (10%) on the test
    split, which holds other images of the same classes."""
    result = run_in_process("train_single.py", "--dataset", "synthetic", "--train-samples",
                            "2048", "--test-samples", "512", "--epochs", "3", "--device", "cpu",
                            "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    rows = read_metrics(tmp_path)
    assert rows[-1]["test_accuracy"] > 0.3, rows[-1]
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]


def test_cifar10_falls_back_to_synthetic_with_an_announcement(tmp_path, monkeypatch):
    for name in ("no_proxy", "NO_PROXY"):  # the download must go through the dead proxy
        monkeypatch.delenv(name, raising=False)
    for name in ("http_proxy", "https_proxy"):  # a port where nothing listens: no internet
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    result = run_in_process("train_single.py", "--dataset", "cifar10",
                                "--data-dir", tmp_path / "none", "--train-samples", "256",
                                "--test-samples", "64", "--epochs", "1", "--device", "cpu",
                                "--out", tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert "CIFAR-10 could not be loaded" in result.stdout
    assert "using the synthetic CIFAR-shaped data set instead" in result.stdout
    assert read_metrics(tmp_path / "run")[0]["dataset"] == "synthetic (fallback)"


def test_one_import_path(tmp_path):
    """Scripts, notebooks and tests import the shared code as ddp_scripts.*, never under a
    second name (`cli`), so one exception class and one monkeypatch reach every caller."""
    result = run_in_process("train_single.py", *SMALL, "--epochs", "1", "--device", "cpu",
                            "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    second_names = {path.stem for path in SCRIPTS.glob("*.py")} - {"ddp_scripts"} & set(sys.modules)
    assert not second_names, f"imported under a second name: {second_names}"
    loaded = [name for name in sys.modules if name.startswith("ddp_scripts")]
    assert "ddp_scripts.cli" in loaded and "ddp_scripts.runfiles" in loaded


def test_nothing_parses_torchruns_printed_summary():
    from helpers import SCRIPTS
    for path in SCRIPTS.rglob("*.py"):
        text = path.read_text()
        for words in ("Root Cause", "exitcode", "ChildFailedError"):
            assert words not in text, f"{path.name} reads torchrun's printed summary ({words})"


def test_tf32_is_off_unless_asked_and_recorded(tmp_path):
    args = [*SMALL, "--epochs", "1", "--device", "cpu"]
    assert run_in_process("train_single.py", *args, "--out", tmp_path / "off").returncode == 0
    assert torch.backends.cudnn.conv.fp32_precision == torch.backends.cuda.matmul.fp32_precision == "ieee"
    assert run_in_process("train_single.py", *args, "--tf32", "--out", tmp_path / "on").returncode == 0
    assert torch.backends.cudnn.conv.fp32_precision == torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert [read_metrics(tmp_path / name)[0]["tf32"] for name in ("off", "on")] == [False, True]
    from ddp_scripts.devices import set_precision
    set_precision(False)


def test_the_run_says_where_it_trains(tmp_path, monkeypatch):
    """Once, on rank 0 (test_faults.py's download-lock run has two ranks); louder when
    --device auto found no GPU in a PyTorch built for CUDA."""
    args = [*SMALL, "--epochs", "1"]
    result = run_in_process("train_single.py", *args, "--device", "cpu", "--out", tmp_path / "cpu")
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stdout.splitlines() if "training on" in line] == \
        ["[rank 0] training on cpu"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    result = run_in_process("train_single.py", *args, "--device", "auto", "--out", tmp_path / "auto")
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stdout.splitlines() if "training on" in line]
    assert said == ["[rank 0] notice: training on cpu: --device auto found no usable GPU, "
                    "although this PyTorch is built for CUDA 13.0 (no GPU, no driver, or "
                    "CUDA_VISIBLE_DEVICES hides them)"], said


def test_a_finished_run_exits_as_python_does_unless_told_otherwise(tmp_path, monkeypatch):
    """run_cli leaves through os._exit(0), which skips atexit handlers and unflushed files,
    only where DDP_SCRIPTS_FAST_EXIT=1 asks for it (the book's launcher and tests)."""
    import os
    import subprocess

    from ddp_scripts import cli
    ended = []
    monkeypatch.setattr(os, "_exit", ended.append)
    monkeypatch.delenv(cli.FAST_EXIT, raising=False)
    assert cli.run_cli(lambda: None) is None and ended == []
    monkeypatch.setenv(cli.FAST_EXIT, "1")
    cli.run_cli(lambda: None)
    assert ended == [0]
    monkeypatch.undo()
    # A script copied from the book, with a handler of its own: it runs.
    script = tmp_path / "mine.py"
    script.write_text("import atexit\nfrom ddp_scripts.cli import run_cli\n"
                      f"atexit.register(lambda: open({str(tmp_path / 'flushed')!r}, 'w').close())\n"
                      "run_cli(lambda: print('trained'))\n")
    env = {key: value for key, value in os.environ.items() if key != cli.FAST_EXIT}
    env["PYTHONPATH"] = str(SCRIPTS.parent)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0 and done.stdout == "trained\n", done.stderr
    assert (tmp_path / "flushed").exists()
