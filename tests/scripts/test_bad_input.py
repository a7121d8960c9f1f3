"""Bad input: one clear line on stderr, exit status 2, no traceback, nothing overwritten.

Most cases run the script inside this process (helpers.run_in_process): the same status and
output, without seconds of torch import per case. A GPU asked for where there is none, and
train_ddp.py outside torchrun, run as processes of their own, as a shell would start them.
"""
import pytest
import torch

from ddp_scripts.launcher import LaunchError, run_script
from helpers import SMALL, assert_one_line_error, run_in_process


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cuda_without_a_gpu(tmp_path):
    result = run_in_process("train_single.py", *SMALL, "--device", "cuda", "--out", tmp_path / "run")
    assert_one_line_error(result, "no usable CUDA GPU")
    assert not (tmp_path / "run").exists()


def test_data_parallel_on_the_cpu(tmp_path):
    result = run_in_process("train_dp.py", *SMALL, "--device", "cpu", "--out", tmp_path / "run")
    assert_one_line_error(result, "DataParallel needs CUDA GPUs, and this run is on cpu")
    assert not (tmp_path / "run").exists()


def test_more_processes_than_gpus_with_nccl(monkeypatch):
    from ddp_scripts import cli, devices, ranks
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert devices.pick_device("cuda", local_rank=1) == torch.device("cuda", 1)
    with pytest.raises(cli.UsageError, match="only 2 GPU\\(s\\) are visible"):
        devices.pick_device("cuda", local_rank=2)
    assert ranks.backend_for(torch.device("cuda", 0)) == "nccl"
    assert ranks.backend_for(torch.device("cpu")) == "gloo"


def test_one_gpu_per_task_clusters_and_one_gpu_machines(monkeypatch):
    """A scheduler that binds one GPU to each task shows every process only cuda:0; a
    machine with one GPU and two processes is an error, not two ranks on one GPU."""
    from ddp_scripts import cli, devices
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # what Slurm's --gpus-per-task=1 sets
    assert devices.pick_device("cuda", local_rank=2) == torch.device("cuda", 0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with pytest.raises(cli.UsageError, match="local rank 1 needs GPU 1, but only 1"):
        devices.pick_device("auto", local_rank=1)


def test_under_torchrun_a_second_rank_on_one_visible_gpu_is_an_error(monkeypatch):
    """torchrun's workers share one CUDA_VISIBLE_DEVICES (Slurm sets it for every GPU job):
    there one visible GPU and local rank 1 is the mistake, said in one line, not a binding."""
    from ddp_scripts import cli, devices
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")   # what Slurm's --gres=gpu:1 sets
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # what torchrun gives each worker
    with pytest.raises(cli.UsageError, match="local rank 1 needs GPU 1, but only 1 GPU"):
        devices.pick_device("cuda", local_rank=1)
    assert devices.pick_device("cuda", local_rank=0) == torch.device("cuda", 0)


def test_threads_follow_the_cores_this_process_may_use(monkeypatch):
    """In a Slurm job or a container, a process may run on fewer cores than the machine has,
    or have a CPU quota that allows fewer still."""
    from ddp_scripts import devices
    from ddp_scripts import hardware
    saved = torch.get_num_threads()
    monkeypatch.setattr(devices.os, "sched_getaffinity", lambda pid: {4, 5, 6, 7}, raising=False)
    monkeypatch.setattr(devices.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(hardware, "cpu_quota_cores", lambda: None)
    try:
        assert devices.set_cpu_threads(None, processes_per_node=2) == 2
        assert devices.set_cpu_threads(None, processes_per_node=8) == 1
        assert devices.set_cpu_threads(3, processes_per_node=2) == 3  # --threads wins
        monkeypatch.setattr(hardware, "cpu_quota_cores", lambda: 2)  # docker run --cpus 1.5
        assert devices.set_cpu_threads(None, processes_per_node=1) == 2
        monkeypatch.setattr(hardware, "cpu_quota_cores", lambda: 16)  # more than it may run on
        assert devices.set_cpu_threads(None, processes_per_node=1) == 4
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("files, cores", [
    ({"cpu.max": "max 100000\n"}, None),          # cgroup v2, no quota
    ({"cpu.max": "150000 100000\n"}, 2),          # docker run --cpus 1.5: rounded up
    ({"cpu.max": "400000 100000\n"}, 4),
    ({"cpu.max": "50000 100000\n"}, 1),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),  # v1
    ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3),
    ({}, None),                                    # no cgroup file system (macOS)
])
def test_cpu_quota_is_read_from_the_cgroup(tmp_path, files, cores):
    from ddp_scripts.hardware import cpu_quota_cores
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cpu_quota_cores(tmp_path) == cores


def test_out_of_memory_is_one_line_with_what_to_do(capsys):
    """A run too large for the device, met anywhere in main() (the model, training, the test):
    one line, exit status 2, never CUDA's page of traceback. Anything else goes unchanged."""
    from ddp_scripts import cli

    def main():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
                                     "total capacity of 79.19 GiB of which 1.00 GiB is free.\nmore")
    with pytest.raises(SystemExit) as ended:
        cli.run_cli(main)
    assert ended.value.code == 2
    assert capsys.readouterr().err == (
        "error: the run does not fit in the GPU's memory (CUDA out of memory. Tried to allocate "
        "2.00 GiB): lower the batch (--batch-size; train_fsdp.py: --global-batch-size, if given)\n")

    def other():
        raise ValueError("not about memory")
    with pytest.raises(ValueError, match="not about memory"):
        cli.run_cli(other)


@pytest.mark.parametrize("option, value, fragment", [
    ("--batch-size", "1024", "larger than the 512 training images"),
    ("--epochs", "abc", "--epochs must be a whole number, got 'abc'"),
    ("--lr", "fast", "--lr must be a number, got 'fast'"),
    *[(option, value, f"{option} must be ")
      for option, values in [("--lr", ["nan", "inf", "-inf", "0", "-1"]),
                             ("--momentum", ["nan", "inf", "-0.5"]),
                             ("--epochs", ["0", "-1", "1.5"]),
                             ("--batch-size", ["0", "-1", "nan"]),
                             ("--train-samples", ["0", "-1"]),
                             ("--test-samples", ["0", "-1"]),
                             ("--threads", ["0", "-1"]),
                             ("--stop-after-epoch", ["0", "-1"]),
                             ("--seed", ["-1", str(2**64)]),
                             ("--timeout-s", ["0", "-1", "nan", "inf", "1e10"]),
                             ("--local-rank", ["-1"])]
      for value in values],
])
def test_numbers_that_cannot_work(tmp_path, option, value, fragment):
    """Every numeric option is checked as it is read: one line that names it and the value."""
    result = run_in_process("train_single.py", *SMALL, "--device", "cpu", f"{option}={value}",
                            "--out", tmp_path / "run")
    assert_one_line_error(result, fragment)
    if fragment.endswith("must be "):
        assert result.stderr.strip().endswith((f"got {value}", f"got {value!r}")), result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("script, option, value, fragment", [
    ("train_ddp.py", "--lr", "nan", "--lr must be a finite number above 0, got nan"),
    ("train_fast.py", "--lr", "nan", "--lr must be a finite number above 0, got nan"),
    ("train_fsdp.py", "--lr", "nan", "--lr must be a finite number above 0, got nan"),
    ("train_fsdp.py", "--width", "0", "--width must be at least 1, got 0"),
    ("train_fsdp.py", "--depth", "2.5", "--depth must be a whole number, got '2.5'"),
    ("train_fsdp.py", "--global-batch-size", "-8", "--global-batch-size must be at least 1, got -8"),
])
def test_the_other_scripts_check_their_numbers_too(tmp_path, script, option, value, fragment):
    result = run_in_process(script, *SMALL, option, value, "--out", tmp_path / "run")
    assert_one_line_error(result, fragment)
    assert "usage:" not in result.stdout + result.stderr


@pytest.mark.parametrize("script, arguments, fragment", [
    ("measure/benchmark.py", ["--epochs", "0"], "--epochs must be at least 1, got 0"),
    ("measure/benchmark.py", ["--timeout-s", "nan"], "--timeout-s must be a number of seconds above 0"),
    ("measure/benchmark.py", ["--cpu-processes", "-2"], "--cpu-processes must be at least 1, got -2"),
    ("measure/overhead_benchmark.py", ["--threads", "0"], "--threads must be at least 1, got 0"),
    ("measure/gpu_micro.py", ["--train-samples", "x"], "--train-samples must be a whole number, got 'x'"),
    ("recorders/fsdp_anatomy.py", ["--width", "0"], "--width must be at least 1, got 0"),
    ("recorders/ddp_anatomy.py", ["--samples", "0"], "--samples must be at least 1, got 0"),
    ("recorders/old_launch_style.py", ["--rank", "0", "--world-size", "0", "--init-file", "unused-init"],
     "--world-size must be at least 1, got 0"),
])
def test_the_book_s_other_programs_check_their_numbers_too(tmp_path, script, arguments, fragment):
    takes_out = script != "recorders/old_launch_style.py"   # it joins a group by --init-file instead
    result = run_in_process(script, *arguments, *(["--out", tmp_path / "out"] if takes_out else []))
    assert_one_line_error(result, fragment)
    assert not (tmp_path / "out").exists()


def test_large_finite_numbers_are_accepted():
    """A learning rate of 1e30 is finite: whether it trains is the run's to find out."""
    from ddp_scripts.options import build_parser
    args = build_parser("test").parse_args(["--out", "x", "--lr", "1e30", "--timeout-s", "1e9",
                                            "--seed", str(2**63 - 1), "--momentum", "0"])
    assert (args.lr, args.timeout_s, args.seed, args.momentum) == (1e30, 1e9, 2**63 - 1, 0)


@pytest.mark.parametrize("arguments, fragment", [
    (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    (["--no-such-option"], "unrecognized arguments: --no-such-option"),
])
def test_other_command_line_mistakes_are_one_line_too(tmp_path, arguments, fragment):
    result = run_in_process("train_single.py", *SMALL, *arguments, "--out", tmp_path / "run")
    assert_one_line_error(result, fragment)
    assert "usage:" not in result.stdout + result.stderr


def test_a_missing_out_is_one_line():
    result = run_in_process("train_single.py", *SMALL)
    assert_one_line_error(result, "the following arguments are required: --out")


def test_an_existing_run_is_never_overwritten_silently(tmp_path):
    args = [*SMALL, "--epochs", "1", "--device", "cpu", "--out", tmp_path]
    assert run_in_process("train_single.py", *args).returncode == 0
    before = (tmp_path / "metrics.jsonl").read_bytes(), (tmp_path / "checkpoint.pt").read_bytes()
    result = run_in_process("train_single.py", *args)
    assert_one_line_error(result, "already holds a run", "--resume", "--overwrite")
    after = (tmp_path / "metrics.jsonl").read_bytes(), (tmp_path / "checkpoint.pt").read_bytes()
    assert before == after
    assert run_in_process("train_single.py", *args, "--overwrite").returncode == 0
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1


def test_unreadable_checkpoint(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint at all")
    result = run_in_process("train_single.py", *SMALL, "--device", "cpu", "--resume",
                            "--out", tmp_path)
    assert_one_line_error(result, "cannot read checkpoint", "not a PyTorch checkpoint of tensors "
                                  "(damaged, or another program's)")


def test_foreign_checkpoints(tmp_path):
    torch.save({"weights": torch.zeros(3)}, tmp_path / "checkpoint.pt")
    result = run_in_process("train_single.py", *SMALL, "--device", "cpu", "--resume",
                            "--out", tmp_path)
    assert_one_line_error(result, "is not a checkpoint of these scripts")
    other = tmp_path / "other"
    assert run_in_process("train_single.py", *SMALL, "--epochs", "1", "--device", "cpu",
                          "--out", other).returncode == 0
    result = run_in_process("train_single.py", *SMALL, "--device", "cpu", "--resume",
                            "--dtype", "float64", "--out", other)
    assert_one_line_error(result, "belongs to another run")


def test_ddp_script_outside_torchrun(tmp_path):
    result = run_in_process("train_ddp.py", *SMALL, "--out", tmp_path / "run")
    assert_one_line_error(result, "start this script with torchrun")


def test_ddp_bad_input_is_one_line_per_rank_and_the_launcher_names_the_rank(tmp_path):
    lines = []
    with pytest.raises(LaunchError) as caught:
        run_script("train_ddp.py", nproc=2, out=tmp_path, dataset="synthetic", batch_size=0,
                   device="cpu", timeout=240, progress=False, echo=lines.append)
    # torchrun ends the other rank as soon as one fails: its line may never be printed.
    ours = [line for line in lines if "error: --batch-size" in line]
    assert ours, "\n".join(lines)
    assert set(ours) <= {"[rank 0] error: --batch-size must be at least 1, got 0",
                         "[rank 1] error: --batch-size must be at least 1, got 0"}
    assert not any("cli.UsageError" in line for line in lines)  # no traceback of ours
    error = caught.value  # what the notebook sees: which rank failed, how, and why
    assert error.rank in (0, 1) and error.exit_code == 2
    assert "--batch-size must be at least 1" in str(error)
    assert f"rank {error.rank} failed with exit code 2" in str(error)


def test_cifar10_downloads_take_turns_on_one_disk(tmp_path):
    """The download lock holds against any other process's attempt while it is taken, and
    is free again after: LOCAL_RANK cannot tell who is first under --virtual-local-rank."""
    import fcntl  # POSIX, as every machine the tests run on

    from ddp_scripts import cifar10
    lock = tmp_path / "data" / ".download.lock"
    with cifar10._one_process_at_a_time(lock):
        with open(lock) as other:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(lock) as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


@pytest.mark.parametrize("cannot", ["lock path is a directory", "no flock on this file system"])
def test_a_download_lock_that_cannot_be_had_means_no_lock(tmp_path, monkeypatch, capsys, cannot):
    """A read-only data folder, or a file system without flock (ENOSYS), or a directory where
    the lock file would be: the download goes on without a lock, said in one line."""
    import errno
    import fcntl

    from ddp_scripts import cifar10
    lock = tmp_path / "data" / ".download.lock"
    if cannot == "lock path is a directory":
        lock.mkdir(parents=True)
    else:
        def no_flock(fd, operation):
            raise OSError(errno.ENOSYS, "Function not implemented")
        monkeypatch.setattr(fcntl, "flock", no_flock)
    ran = []
    with cifar10._one_process_at_a_time(lock):
        ran.append(True)
    assert ran == [True]
    said = capsys.readouterr().out.splitlines()
    assert len(said) == 1 and said[0].startswith("[rank 0] no download lock ("), said
    assert said[0].endswith("): the processes on this disk that lack the files download them "
                            "at the same time")
    assert ("Is a directory" if cannot.startswith("lock") else "Function not implemented") in said[0]
