"""What a number was measured on: one description of the machine, stored beside every result.

The training scripts put it in run.json, the benchmark in its results file, the build on the
execution-times page. torch is imported only when a description is asked for.
"""
import os
import platform
import re
import shutil
import subprocess
import time
from pathlib import Path

# Terminal escape codes: nvidia-smi underlines the header of `topo -m` with them, even into a
# pipe. They are taken out when it is read, so no results file and no page shows them.
ESCAPE_CODES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


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
    """CPU, visible GPUs and how they are linked, driver and library versions, and a label."""
    import torch
    gpus = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append({"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1)})
    try:
        import psutil
        physical_cores = psutil.cpu_count(logical=False)
    except ImportError:
        physical_cores = None
    machine = {
        "cpu": {"model": cpu_name(), "logical_cores": os.cpu_count(),
                "physical_cores": physical_cores, "usable_cores": usable_cores()},
        "gpus": gpus, "gpu_count": len(gpus),
        "interconnect": gpu_interconnect(len(gpus)),
        "driver": _first_line(_nvidia_smi(["--query-gpu=driver_version", "--format=csv,noheader"]))
        if gpus else None,
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": _nccl_version() if gpus else None,
        "python": platform.python_version(), "platform": platform.platform(),
        "device": str(device) if device is not None else None,
    }
    machine["label"] = hardware_label(machine)
    return machine


def hardware_label(machine):
    """One line naming the hardware, the one label of every result, e.g.
    '2 x NVIDIA TITAN Xp (NV2); Intel Xeon, 16 cores; driver 535.104, torch 2.4.0, CUDA 12.1'
    (a GPU machine's driver and library versions are part of what its numbers mean), or
    'AMD EPYC, 2 cores, no GPU'."""
    cpu = machine["cpu"]
    cores = f"{cpu['usable_cores']} core{'s' if cpu['usable_cores'] != 1 else ''}"
    names = [gpu["name"] for gpu in machine["gpus"]]
    if not names:
        return f"{cpu['model']}, {cores}, no GPU"
    gpus = f"{len(names)} x {names[0]}" if len(set(names)) == 1 else " + ".join(names)
    links = sorted(set(machine["interconnect"].get("links", {}).values()))
    if links:
        gpus += f" ({'/'.join(links)})"
    versions = [f"{what} {machine[key]}" for what, key in
                (("driver", "driver"), ("torch", "torch"), ("CUDA", "cuda")) if machine.get(key)]
    return "; ".join([gpus, f"{cpu['model']}, {cores}"] + ([", ".join(versions)] if versions else []))


def gpu_interconnect(gpu_count):
    """`nvidia-smi topo -m` as text, and the link between each pair of the GPUs this process
    sees (NV#, PIX, SYS...). nvidia-smi numbers all of the machine's GPUs and ignores
    CUDA_VISIBLE_DEVICES, so the links are kept only between the visible ones."""
    if gpu_count == 0:
        return {"topology": None, "links": {}, "note": "no GPU visible"}
    text = _nvidia_smi(["topo", "-m"])
    if text is None:
        return {"topology": None, "links": {},
                "note": "nvidia-smi is not available here, so the links are unknown"}
    text = ESCAPE_CODES.sub("", text)
    visible = visible_gpu_indices(os.environ.get("CUDA_VISIBLE_DEVICES"), _gpu_uuids())
    return {"topology": text, "links": parse_topology(text, visible),
            "note": None if visible is None else
            f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}: links between "
            f"GPUs {', '.join(map(str, visible))} only (nvidia-smi's numbering)"}


def parse_topology(text, visible=None):
    """{"GPU0-GPU1": "NV4", ...} from the matrix `nvidia-smi topo -m` prints.

    `visible`: nvidia-smi's indices of the GPUs to keep (None: all of them)."""
    rows = [ESCAPE_CODES.sub("", line).split() for line in text.splitlines() if line.strip()]
    header = next((row for row in rows if row and re.fullmatch(r"GPU\d+", row[0])), None)
    if header is None:
        return {}
    gpus = [column for column in header if re.fullmatch(r"GPU\d+", column)]
    keep = set(gpus) if visible is None else {f"GPU{i}" for i in visible}
    links = {}
    for row in rows[rows.index(header) + 1:]:
        if row and row[0] in gpus:
            for column, link in zip(gpus, row[1:1 + len(gpus)]):
                if (gpus.index(column) > gpus.index(row[0])  # each pair once
                        and {row[0], column} <= keep):
                    links[f"{row[0]}-{column}"] = link
    return links


def visible_gpu_indices(cuda_visible_devices, uuids_by_index=None):
    """nvidia-smi's indices of the GPUs that CUDA_VISIBLE_DEVICES lets a process see, in
    order; None when the variable is unset (every GPU is visible). Entries may be indices
    or UUIDs (GPU-...); the list stops at the first entry that is neither, as CUDA does."""
    if cuda_visible_devices is None:
        return None
    uuids_by_index = uuids_by_index or {}
    indices = []
    for entry in filter(None, (e.strip() for e in cuda_visible_devices.split(","))):
        if entry.isdigit():
            indices.append(int(entry))
            continue
        match = [i for i, uuid in uuids_by_index.items() if uuid.startswith(entry)]
        if len(match) != 1:
            break
        indices.append(match[0])
    return indices


def _gpu_uuids():
    text = _nvidia_smi(["--query-gpu=index,uuid", "--format=csv,noheader"]) or ""
    pairs = [line.split(",") for line in text.splitlines() if "," in line]
    return {int(index): uuid.strip() for index, uuid in pairs if index.strip().isdigit()}


def _nccl_version():
    try:
        import torch
        version = torch.cuda.nccl.version()
    except Exception:  # a build of torch without NCCL
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _first_line(text):
    """nvidia-smi --query-gpu prints one line per GPU; they agree on the driver."""
    return text.splitlines()[0].strip() if text else None


def _nvidia_smi(arguments):
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", *arguments], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


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
