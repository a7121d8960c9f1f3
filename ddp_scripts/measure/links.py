"""How the GPUs are linked, and the driver and NCCL versions: what the benchmark adds to a
run's description of its machine (hardware.py), since what it measures, the time of
communication, depends on them. nvidia-smi's `topo -m` is stored as text, and the link
between each pair of visible GPUs (NV#, PIX, SYS...).
"""
import os
import re
import shutil
import subprocess

from ddp_scripts.hardware import describe_hardware, hardware_label

# Terminal escape codes: nvidia-smi underlines the header of `topo -m` with them, even into a
# pipe. They are taken out when it is read, so no results file and no page shows them.
ESCAPE_CODES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def describe_machine(device=None):
    """hardware.describe_hardware, with the GPUs' links, and the driver and NCCL versions."""
    machine = describe_hardware(device)
    gpus = machine["gpu_count"]
    machine.update(interconnect=gpu_interconnect(gpus), nccl=_nccl_version() if gpus else None,
                   driver=_first_line(_nvidia_smi(["--query-gpu=driver_version", "--format=csv,noheader"]))
                   if gpus else None)
    machine["label"] = hardware_label(machine)
    return machine


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


