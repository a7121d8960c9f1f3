# Setup: find the companion scripts (ddp_scripts/) next to this notebook; opened alone
# (on Colab, say), fetch them from the book's repository first.
import pathlib, subprocess, sys

REPOSITORY = "https://github.com/pytorch-gpu-book/pytorch-gpu-book"
here = pathlib.Path.cwd().resolve()
ROOT = next((p for p in [here, *here.parents] if (p / "ddp_scripts" / "common.py").exists()), None)
if ROOT is None:
    subprocess.run(["git", "clone", "--depth", "1", REPOSITORY, "gpu-book"], check=True)
    ROOT = (here / "gpu-book").resolve()
sys.path.insert(0, str(ROOT))
RUNS = ROOT / "runs"  # where the companion scripts write their logs and checkpoints
