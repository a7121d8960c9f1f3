# Setup: find the companion scripts (ddp_scripts/) next to this notebook; opened alone
# (on Colab, say), fetch them from the book's repository first, or from a mirror of it
# named by the environment variable BOOK_REPO_URL (in a notebook already running, set it
# in a cell above this one: os.environ["BOOK_REPO_URL"] = "https://...").
import os, pathlib, shutil, subprocess, sys

REPOSITORY = "https://github.com/pytorch-gpu-book/pytorch-gpu-book"
here = pathlib.Path.cwd().resolve()
clone = here / "gpu-book"  # a notebook opened alone keeps its copy of the repository here
# or an archive unpacked beside it: the site's book-source.zip (pytorch-gpu-book/), or a
# repository's "Download ZIP" (pytorch-gpu-book-main/, say)
unzipped = sorted(here.glob("pytorch-gpu-book*"))
places = [here, *here.parents, clone, *unzipped]
ROOT = next((p for p in places if (p / "ddp_scripts" / "train_single.py").exists()), None)
if ROOT is None:
    url = os.environ.get("BOOK_REPO_URL", REPOSITORY)
    # seconds: a stalled clone ends
    limit = float(os.environ.get("BOOK_CLONE_TIMEOUT", "300"))
    git = ["git", "clone", "--depth", "1", url, str(clone)]
    try:
        quiet = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}  # no password prompt to hang on
        cloned = subprocess.run(git, timeout=limit, env=quiet).returncode == 0
    except (OSError, subprocess.TimeoutExpired):  # no git here, or no answer in time
        cloned = False
    if not cloned:
        # a half-made clone would block the next try
        shutil.rmtree(clone, ignore_errors=True)
        raise SystemExit(
            f"Could not clone {url} (time limit {limit:g} s). Unpack book-source.zip "
            f"(on the book's site, in How to run) or a zip of the repository into {here}, "
            f"or set BOOK_REPO_URL to a mirror; then run this cell again.\n"
            f"无法克隆 {url}（时限 {limit:g} 秒）。"
            f"请把 book-source.zip（本书网站“如何运行”页）"
            f"或仓库的 zip 解压到 {here}，"
            f"或把 BOOK_REPO_URL 设为镜像地址，然后重新运行本单元格。")
    ROOT = clone
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
RUNS = ROOT / "runs"  # where the companion scripts write their logs and checkpoints
