"""Checks of the machine a reader trains on: chapter 8, "The machines readers have".

    from notebooks.machine_check import gather_facts, check, print_findings, strings_in_library

`gather_facts()` reads this machine (GPUs, peer-to-peer access, /dev/shm, driver, the wheel's
CUDA version and architectures; the GPUs pair by pair in a child process, with a time limit,
as a copy between two GPUs can hang); `check(facts)` turns facts into findings, each with what to
change; `print_findings` prints them. `check` reads nothing itself, so the tests can give it any
machine (a 64 MB /dev/shm, two GPUs without peer-to-peer, a TITAN Xp).
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import torch

# Docker gives a container a 64 MB /dev/shm unless told otherwise (`docker run --shm-size`).
DOCKER_DEFAULT_SHM = 64 * 2**20
# Below this the check asks for more. A margin of this book's choosing, not a limit of PyTorch or
# NCCL: what they need grows with the GPUs, the batch and the DataLoader's workers.
SHM_WANTED = 2**30

# The oldest driver branch each CUDA major version runs on, on Linux (NVIDIA's "CUDA
# Compatibility" guide, minor version compatibility: 13.x >= 580, 12.x >= 525, 11.x >= 450).
MIN_DRIVER = {13: 580, 12: 525, 11: 450}

# Seconds the copies between every pair of GPUs may take (1 MiB each: well under a second a
# pair on a healthy machine; the rest is the child's start, importing torch, starting CUDA).
PAIRS_TIMEOUT_S = 120

# Integrated (Jetson) GPUs: code for another compute capability does not run on them.
INTEGRATED = {53, 62, 72, 87, 101, 110}

# GPUs the chapter names, with their compute capability, for a machine that has none to check.
EXAMPLE_GPUS = {"TITAN Xp (the source article's)": (6, 1), "Tesla V100": (7, 0),
                "Tesla T4": (7, 5), "RTX 4090": (8, 9), "H100": (9, 0)}


def _code_number(arch):
    """'sm_86' -> (86, ''), 'compute_90' -> (90, ''), 'sm_90a' -> (90, 'a')."""
    number = arch.split("_", 1)[1]
    digits = "".join(c for c in number if c.isdigit())
    return int(digits), number[len(digits):]


def runs_on(capability, arch):
    """Whether code built for `arch` (an entry of torch.cuda.get_arch_list()) runs on a GPU of
    compute capability `capability` = (major, minor).

    Machine code (sm_XY) runs on the GPUs of the same major version and a minor version at least
    Y; PTX (compute_XY) is compiled by the driver for any GPU of capability X.Y or newer. An
    'a' suffix (sm_90a) marks code for exactly that capability."""
    device = 10 * capability[0] + capability[1]
    code, suffix = _code_number(arch)
    if arch.startswith("compute_"):
        return device >= code
    if suffix == "a" or device in INTEGRATED or code in INTEGRATED:
        return device == code
    return device // 10 == code // 10 and device >= code


def shm_bytes(path="/dev/shm"):
    """The size of the shared-memory file system, or None where there is none."""
    try:
        stats = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return stats.f_frsize * stats.f_blocks


def driver_version():
    """The NVIDIA driver's version as nvidia-smi prints it ('580.159.04'), or None."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def gather_facts(pairs_timeout_s=PAIRS_TIMEOUT_S):
    """What the checks need, read from this machine and this torch. The GPUs are compared
    pair by pair in a child process (`pairs_in_child`), which starts CUDA on every visible GPU
    and ends with it; this process only reads their names and compute capabilities."""
    gpus, pairs = [], {"peer": {}, "copies_equal": {}, "pairs_problem": None}
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            gpus.append({"index": index, "name": torch.cuda.get_device_name(index),
                         "capability": tuple(torch.cuda.get_device_capability(index))})
        if len(gpus) > 1:
            pairs = pairs_in_child(timeout_s=pairs_timeout_s)
    return {"gpus": gpus, **pairs, "shm_bytes": shm_bytes(),
            "driver": driver_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "arch_list": torch.cuda.get_arch_list(),
            "releases": dict(getattr(torch.cuda, "PYTORCH_RELEASES_CODE_CC", {}))}


def pair_facts():
    """For every ordered pair of visible GPUs: peer-to-peer access, and whether a copy comes
    back equal. Creates a CUDA context on every GPU: run it in a child (`pairs_in_child`)."""
    peer, copies = {}, {}
    count = torch.cuda.device_count()
    for i in range(count):
        for j in range(count):
            if i != j:
                peer[i, j] = torch.cuda.can_device_access_peer(i, j)
                copies[i, j] = copy_comes_back_equal(i, j)
    return {"peer": peer, "copies_equal": copies}


# The child's program: the pairs, printed as one line of JSON (pairs as "i,j" keys).
PAIRS_CHILD = """import json
from notebooks.machine_check import pair_facts
print(json.dumps({name: {f"{i},{j}": ok for (i, j), ok in facts.items()}
                  for name, facts in pair_facts().items()}))
"""


def pairs_in_child(timeout_s=PAIRS_TIMEOUT_S, program=PAIRS_CHILD):
    """pair_facts() in a child process that gets `timeout_s` seconds. A copy between two GPUs
    can hang (peer-to-peer through a PCIe switch with ACS on, say): then the child is killed,
    and "pairs_problem" says so, for the check to report, instead of the notebook freezing.
    A child that fails says so there too. The child inherits CUDA_VISIBLE_DEVICES."""
    nothing = {"peer": {}, "copies_equal": {}}
    child = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        out, err = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        try:
            child.communicate(timeout=30)  # a process stuck in the driver may not even die
        except subprocess.TimeoutExpired:
            pass
        return {**nothing, "pairs_problem": f"did not finish within {timeout_s:g} s and was ended"}
    lines = out.strip().splitlines()
    if child.returncode != 0 or not lines:
        last = (err.strip().splitlines() or ["no output"])[-1]
        return {**nothing, "pairs_problem": f"failed (exit status {child.returncode}): {last}"}
    read = json.loads(lines[-1])
    return {**{name: {tuple(map(int, pair.split(","))): ok for pair, ok in facts.items()}
               for name, facts in read.items()}, "pairs_problem": None}


def copy_comes_back_equal(source, target):
    """Copy 1 MiB of numbers from GPU `source` to GPU `target` and compare: a driver with broken
    peer-to-peer copies returns zeros or other values there, without an error."""
    numbers = torch.arange(2**18, dtype=torch.float32, device=f"cuda:{source}")
    return torch.equal(numbers.to(f"cuda:{target}").cpu(), numbers.cpu())


def strings_in_library(path, *phrases):
    """For each phrase, the first text in the compiled library `path` that contains it: the
    messages a library prints, read from the library itself (as `strings` does)."""
    data = pathlib.Path(path).read_bytes()
    found = []
    for phrase in phrases:
        at = data.find(phrase.encode())
        if at < 0:
            found.append(f"({phrase!r} is not in {pathlib.Path(path).name})")
            continue
        start, end = data.rfind(b"\0", 0, at) + 1, data.find(b"\0", at)
        found.append(data[start:end].decode(errors="replace"))
    return found


def _mib(size):
    return f"{size / 2**20:,.0f} MiB" if size < 2**30 else f"{size / 2**30:,.1f} GiB"


def _older_wheels(facts, capability=None, driver_branch=None):
    """The CUDA builds of this torch release that fit a GPU or a driver, from torch's own table
    (torch.cuda.PYTORCH_RELEASES_CODE_CC; for x86_64 machines)."""
    fitting = []
    for cuda, by_host in sorted(facts.get("releases", {}).items()):
        codes = by_host.get("x86_64", set())
        if capability is not None and not any(runs_on(capability, f"sm_{c}") for c in codes):
            continue
        if driver_branch is not None and MIN_DRIVER.get(int(cuda.split(".")[0]), 10**6) > driver_branch:
            continue
        fitting.append(cuda)
    if not fitting:
        return "no CUDA build of this torch release fits; an older release may (pytorch.org)"
    base = facts["torch"].split("+")[0]
    return "; ".join(f"pip install torch=={base} --index-url https://download.pytorch.org/whl/"
                     f"cu{cuda.replace('.', '')}" for cuda in fitting)


def check(facts):
    """Findings about a machine: a list of (status, topic, text), status 'ok', 'change' or
    'not checked'."""
    findings = []
    gpus = facts["gpus"]

    # /dev/shm: DataLoader workers and NCCL between the GPUs of one machine go through it.
    size = facts["shm_bytes"]
    if size is None:
        findings.append(("not checked", "/dev/shm", "this system has no /dev/shm (not Linux?)"))
    elif size < SHM_WANTED:
        docker = " (Docker's default)" if size <= DOCKER_DEFAULT_SHM else ""
        findings.append(("change", "/dev/shm", (
            f"only {_mib(size)}{docker}. DataLoader workers can die with 'Bus error' and NCCL "
            "between the GPUs of this machine with 'Error while creating shared memory segment'. "
            "Start the container with --shm-size=8g (or --ipc=host); or keep --workers 0 and set "
            "NCCL_SHM_DISABLE=1, which is slower.")))
    else:
        findings.append(("ok", "/dev/shm", f"{_mib(size)}, at least the {_mib(SHM_WANTED)} this "
                                           "book asks for"))

    # The wheel: which CUDA it was built for, and so which driver it needs.
    cuda = facts["cuda"]
    if cuda is None:
        findings.append(("change" if gpus or facts["driver"] else "ok", "torch build", (
            f"torch {facts['torch']} is built without CUDA: it cannot use a GPU. "
            + ("Install a CUDA build (pytorch.org)." if gpus or facts["driver"]
               else "Fine on a machine without an NVIDIA GPU."))))
        return findings
    need = MIN_DRIVER.get(int(cuda.split(".")[0]))
    findings.append(("ok", "torch build", (
        f"torch {facts['torch']} is built for CUDA {cuda}, which needs an NVIDIA driver of "
        f"branch {need} or newer")))

    # The driver against the wheel.
    driver = facts["driver"]
    if driver is None:
        findings.append(("not checked", "driver", (
            f"no NVIDIA driver found (no nvidia-smi). With one older than {need}, "
            "torch.cuda.is_available() is False after the warning 'CUDA initialization: The NVIDIA "
            "driver on your system is too old'")))
    else:
        branch = int(driver.split(".")[0])
        if need is not None and branch < need:
            findings.append(("change", "driver", (
                f"driver {driver} is older than {need}: torch.cuda.is_available() is False and "
                "torch warns 'CUDA initialization: The NVIDIA driver on your system is too old'. "
                "Update the driver, or install a build for an older CUDA: "
                + _older_wheels(facts, driver_branch=branch))))
        else:
            findings.append(("ok", "driver", f"driver {driver}, branch {need} or newer needed"))

    # The wheel's architectures against the GPUs.
    arch_list = facts["arch_list"]
    if gpus:
        for gpu in gpus:
            cc = gpu["capability"]
            where = f"GPU {gpu['index']} ({gpu['name']}, compute capability {cc[0]}.{cc[1]})"
            if any(runs_on(cc, arch) for arch in arch_list):
                findings.append(("ok", "GPU code", f"{where}: this build has code for it"))
            else:
                findings.append(("change", "GPU code", (
                    f"{where}: this build has no code for it ({' '.join(arch_list)}). torch warns "
                    "when CUDA starts, and the first kernel fails with 'CUDA error: no kernel image "
                    "is available for execution on the device'. Install a build that has it: "
                    + _older_wheels(facts, capability=cc))))
    else:
        yes = [name for name, cc in EXAMPLE_GPUS.items() if any(runs_on(cc, a) for a in arch_list)]
        no = [name for name, cc in EXAMPLE_GPUS.items() if name not in yes]
        findings.append(("not checked", "GPU code", (
            f"no GPU here. This build has code for {' '.join(arch_list)}: it would run on "
            f"{', '.join(yes) or 'none of them'}; not on {', '.join(no) or 'none'}")))

    # Peer-to-peer between every pair of GPUs, and whether a copy between them is right.
    if len(gpus) < 2:
        findings.append(("not checked", "peer-to-peer", (
            f"{len(gpus)} GPU(s): with two or more this checks "
            "torch.cuda.can_device_access_peer for every pair, and copies between them, in a "
            "child process with a time limit")))
    elif facts.get("pairs_problem"):
        findings.append(("change", "peer-to-peer", (
            f"the copies between every pair of GPUs {facts['pairs_problem']}. Where copies "
            "between GPUs hang or fail, NCCL and DataParallel do too: try NCCL_P2P_DISABLE=1, "
            "and on a server ask whether ACS or the IOMMU is on. Run the check with "
            "CUDA_VISIBLE_DEVICES=0,1 (and so on) to test one pair at a time")))
    else:
        without = sorted((i, j) for (i, j), ok in facts["peer"].items() if not ok and i < j)
        wrong = sorted(pair for pair, ok in facts["copies_equal"].items() if not ok)
        if without:
            pairs = ", ".join(f"{i}-{j}" for i, j in without)
            findings.append(("change", "peer-to-peer", (
                f"no peer-to-peer between GPUs {pairs}: copies between them go through host "
                "memory, and NCCL through /dev/shm (see above). If NCCL hangs, set "
                "NCCL_P2P_DISABLE=1; on a server, ask whether ACS or the IOMMU is on")))
        else:
            findings.append(("ok", "peer-to-peer", "every pair of GPUs can access each other"))
        if wrong:
            pairs = ", ".join(f"cuda:{i} -> cuda:{j}" for i, j in wrong)
            findings.append(("change", "copies", (
                f"copies {pairs} came back different: DataParallel would train on wrong numbers. "
                "Update the driver; until then do not use DataParallel on these GPUs")))
        else:
            findings.append(("ok", "copies", "a copy between every pair of GPUs comes back equal"))
    return findings


def print_findings(findings):
    import textwrap
    for status, topic, text in findings:
        print(textwrap.fill(f"[{status}] {topic}: {text}", width=100,
                            subsequent_indent=" " * 4))
