# Setup: find the companion scripts (ddp_scripts/) next to this notebook; opened alone
# (on Colab, say), fetch them from the book's repository first.
import pathlib, subprocess, sys

REPOSITORY = "https://github.com/pytorch-gpu-book/pytorch-gpu-book"
here = pathlib.Path.cwd().resolve()
clone = here / "gpu-book"  # a notebook opened alone keeps its copy of the repository here
places = [here, *here.parents, clone]
ROOT = next((p for p in places if (p / "ddp_scripts" / "common.py").exists()), None)
if ROOT is None:
    subprocess.run(["git", "clone", "--depth", "1", REPOSITORY, str(clone)], check=True)
    ROOT = clone
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
RUNS = ROOT / "runs"  # where the companion scripts write their logs and checkpoints
