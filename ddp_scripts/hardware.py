"""What a run was measured on, stored beside every result: the CPU and the cores this process
may use, the GPUs, and the library versions, with one label that names them. Every training
script records it in run.json. The benchmark adds how the GPUs are linked (measure/links.py).
"""
import os
import platform
import time
from pathlib import Path


def cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores():
    """The cores this process may keep busy: those it may run on (os.sched_getaffinity: fewer
    in a Slurm job or a container pinned to cores), or fewer still under a container's CPU
    quota (docker --cpus, Kubernetes CPU limits), which the pinning does not show."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    quota = cpu_quota_cores()
    return min(cores, quota) if quota else cores


def cpu_quota_cores(cgroup="/sys/fs/cgroup"):
    """The CPU time a quota allows this process's cgroup, in cores (rounded up), or None.

    cgroup v2 writes it as "QUOTA PERIOD" in cpu.max ("max PERIOD": no quota); cgroup v1 as
    cpu/cpu.cfs_quota_us (-1: no quota) and cpu/cpu.cfs_period_us. Inside a container,
    /sys/fs/cgroup shows the container's own cgroup; elsewhere its top, where no quota is."""
    root = Path(cgroup)
    v2 = _read(root / "cpu.max")
    if v2 is not None:
        return quota_cores(*(v2.split() + ["100000"])[:2])
    return quota_cores(_read(root / "cpu" / "cpu.cfs_quota_us"),
                       _read(root / "cpu" / "cpu.cfs_period_us"))


def quota_cores(quota, period):
    """ceil(quota / period) for two numbers as cgroups write them; None for no quota."""
    try:
        quota, period = int(quota), int(period)
    except (TypeError, ValueError):  # "max", or a file that is not there
        return None
    return -(-quota // period) if quota > 0 and period > 0 else None


def _read(path):
    try:
        return path.read_text().strip()
    except OSError:
        return None


def describe_hardware(device=None):
    """CPU, visible GPUs, library versions, the device a run used, and the label."""
    import torch
    gpus = [{"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1)}
            for props in map(torch.cuda.get_device_properties, range(torch.cuda.device_count()))]
    machine = {"cpu": {"model": cpu_name(), "logical_cores": os.cpu_count(), "usable_cores": usable_cores()},
               "gpus": gpus, "gpu_count": len(gpus), "torch": torch.__version__, "cuda": torch.version.cuda,
               "python": platform.python_version(), "platform": platform.platform(),
               "device": str(device) if device is not None else None}
    machine["label"] = hardware_label(machine)
    return machine


def hardware_label(machine):
    """One line naming the hardware, the one label of every result, e.g.
    '2 x NVIDIA TITAN Xp (NV2); Intel Xeon, 16 cores; driver 535.104, torch 2.4.0, CUDA 12.1'
    (the links and the driver where measure/links.py added them), or 'AMD EPYC, 2 cores, no GPU'."""
    cpu = machine["cpu"]
    cores = f"{cpu['usable_cores']} core{'s' if cpu['usable_cores'] != 1 else ''}"
    names = [gpu["name"] for gpu in machine["gpus"]]
    if not names:
        return f"{cpu['model']}, {cores}, no GPU"
    gpus = f"{len(names)} x {names[0]}" if len(set(names)) == 1 else " + ".join(names)
    links = sorted(set(machine.get("interconnect", {}).get("links", {}).values()))
    if links:
        gpus += f" ({'/'.join(links)})"
    versions = [f"{what} {machine[key]}" for what, key in
                (("driver", "driver"), ("torch", "torch"), ("CUDA", "cuda")) if machine.get(key)]
    return "; ".join([gpus, f"{cpu['model']}, {cores}"] + ([", ".join(versions)] if versions else []))


def seconds_since_start():
    """How long ago this process started. On Linux from /proc, in 10 ms steps (psutil's
    create_time adds the boot time in whole seconds); elsewhere from psutil."""
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        started = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        return uptime - started / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        import psutil
        return time.time() - psutil.Process().create_time()
