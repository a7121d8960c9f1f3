"""Small helpers shared by the tests: run a companion script, compare two checkpoints."""
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "ddp_scripts"
# A run small enough for seconds on two cores, large enough to learn something.
SMALL = ["--dataset", "synthetic", "--train-samples", "512", "--test-samples", "128"]


def run_python(script, *args, timeout=180, env=None):
    """Run ddp_scripts/<script> as one process; returns the CompletedProcess (text)."""
    return subprocess.run([sys.executable, str(SCRIPTS / script), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)


def run_torchrun(nproc, script, *args, timeout=240, torchrun_args=()):
    """Run ddp_scripts/<script> under torchrun on a free port; returns the CompletedProcess."""
    from ddp_scripts.launcher import torchrun_command
    command = torchrun_command(script, nproc, list(map(str, args)), torchrun_args=torchrun_args)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def load_model_state(out):
    return torch.load(Path(out) / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]


def max_difference(a, b):
    """Largest difference between two (nested) dicts of tensors and numbers."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        return max((max_difference(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, (list, tuple)):
        return max((max_difference(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    if isinstance(a, torch.Tensor):
        return (a.double() - b.double()).abs().max().item()
    return 0.0 if a == b else float("inf")
