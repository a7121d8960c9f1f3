"""Where a run computes: the device (pick_device), its float32 precision (set_precision), the
CPU threads (set_cpu_threads), and waiting for the GPU before reading a clock (synchronize).
"""
import os

import torch

from ddp_scripts.cli import UsageError, say
from ddp_scripts.hardware import usable_cores
from ddp_scripts.ranks import TORCHRUN_VARIABLES


def pick_device(requested="auto", local_rank=None):
    """The device this process trains on; 'auto' means CUDA if present, else CPU. Process
    `local_rank` of a node takes GPU `local_rank` (nccl cannot share one GPU between two),
    unless a scheduler (srun, no torchrun) showed it only the one GPU it chose, as cuda:0."""
    if local_rank is None:  # a script of one process: torchrun's variables are not its own
        if "TORCHELASTIC_RUN_ID" not in os.environ and set(TORCHRUN_VARIABLES) & set(os.environ):
            from ddp_scripts.mishaps import ignore_rank_variables
            ignore_rank_variables(TORCHRUN_VARIABLES, say)
        local_rank = 0
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda asked for, but this machine has no usable CUDA GPU "
                             "(use --device cpu or --device auto)")
        visible = torch.cuda.device_count()
        bound_by_scheduler = (os.environ.get("CUDA_VISIBLE_DEVICES")
                              and "TORCHELASTIC_RUN_ID" not in os.environ)
        if visible == 1 and local_rank > 0 and bound_by_scheduler:
            return torch.device("cuda", 0)  # the one GPU the scheduler bound to this process
        if local_rank >= visible:
            raise UsageError(f"local rank {local_rank} needs GPU {local_rank}, but only "
                             f"{visible} GPU(s) are visible: start at most {visible} "
                             "processes per node, or use --device cpu")
        return torch.device("cuda", local_rank)
    if requested == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise UsageError("--device mps asked for, but Apple's MPS backend is not available here")
        return torch.device("mps")
    return torch.device("cpu")


def say_device(device, requested, world_size=1, gpus=0):
    """Say once (rank 0) where the run trains; louder when --device auto found no GPU
    although this PyTorch is built for CUDA (a driver, or CUDA_VISIBLE_DEVICES, hides it)."""
    if os.environ.get("RANK", "0") != "0":
        return
    where = f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device)
    where += f" and {gpus - 1} more GPU(s)" if world_size == 1 and gpus > 1 else ""  # DataParallel
    where += f", one of {world_size} processes" if world_size > 1 else ""
    if device.type == "cpu" and requested == "auto" and torch.version.cuda:
        say(f"notice: training on {where}: --device auto found no usable GPU, although this "
            f"PyTorch is built for CUDA {torch.version.cuda} (no GPU, no driver, or "
            "CUDA_VISIBLE_DEVICES hides them)")
    else:
        say(f"training on {where}")


def require_gpus_for_data_parallel(device):
    """nn.DataParallel scatters batches over CUDA GPUs; on anything else it does nothing."""
    if device.type != "cuda":
        raise UsageError(f"DataParallel needs CUDA GPUs, and this run is on {device.type}: "
                         "use train_single.py, or --device cuda on a machine with GPUs")


def set_precision(tf32=False):
    """float32 as float32 everywhere ("ieee"), or TF32's 10-bit mantissas on Ampere and newer
    GPUs (--tf32), which PyTorch's default uses for convolutions. Only the fp32_precision
    settings: PyTorch refuses a mix of them and the legacy allow_tf32 flags."""
    precision = "tf32" if tf32 else "ieee"
    torch.backends.cuda.matmul.fp32_precision = precision
    torch.backends.cudnn.conv.fp32_precision = precision


def set_cpu_threads(threads=None, processes_per_node=None):
    """Split the cores this process may use (a Slurm job or a container may allow fewer than
    the machine's) between the LOCAL_WORLD_SIZE processes of its node (1 without torchrun)."""
    if processes_per_node is None:
        text = os.environ.get("LOCAL_WORLD_SIZE", "1")
        if not (text.isdigit() and int(text) >= 1):
            raise UsageError(f"LOCAL_WORLD_SIZE must be a whole number, 1 or more, got {text!r} "
                             "(torchrun sets it; unset it to run one process)")
        processes_per_node = int(text)
    threads = threads or max(1, usable_cores() // processes_per_node)
    torch.set_num_threads(threads)
    return threads


def synchronize(device):
    """Wait for queued GPU work, so that a clock read afterwards measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
