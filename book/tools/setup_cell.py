# Setup: find the companion scripts (ddp_scripts/) next to this notebook, and install them
# (pip install -e) where this Python lacks them; opened alone (on Colab, say), fetch them from
# the book's repository first, or from a mirror of it named by the environment variable
# BOOK_REPO_URL (in a notebook already running, set it in a cell above this one:
# os.environ["BOOK_REPO_URL"] = "https://...").
import importlib.util, os, pathlib, shutil, site, subprocess, sys, sysconfig

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
installed = importlib.util.find_spec("ddp_scripts")
if installed is None:  # not installed in this Python yet
    # Installed editable, so an edit to the scripts counts. Python reads the install's .pth file
    # only as it starts; site.addsitedir reads it now, so the kernel needs no restart.
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)]
    # built with the setuptools already here (no download) where it can, else as pip does
    why = []  # the last line of each failed try's error
    for command in ([*pip, "--no-build-isolation"], pip):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode == 0:
            break
        why.append((done.stderr.strip().splitlines() or ["no message"])[-1])
    else:  # no pip, a read-only site-packages, offline without setuptools, ...
        why = "; ".join(dict.fromkeys(why))
        raise SystemExit(
            f"Could not install the book's code with pip ({why}). Run pip install -e {ROOT} "
            f"by hand (or in a venv of your own, and start Jupyter from it); then run this "
            f"cell again.\n"
            f"无法用 pip 安装本书代码（{why}）。请手动运行 pip install -e {ROOT}"
            f"（或在自己的虚拟环境中运行，并从中启动 Jupyter），然后重新运行本单元格。")
    for folder in filter(os.path.isdir, {sysconfig.get_path("purelib"), site.getusersitepackages()}):
        site.addsitedir(folder)
elif (used := pathlib.Path(installed.origin).parents[1].resolve()) != ROOT:
    print(f"notice: this Python uses the book's code installed from {used}, not {ROOT}'s: "
          f"pip install -e {ROOT} and restart the kernel to use this copy\n"
          f"注意：此 Python 使用的是从 {used} 安装的本书代码，而非 {ROOT} 中的："
          f"运行 pip install -e {ROOT} 并重启 Jupyter 内核即可改用这份副本")
RUNS = ROOT / "runs"  # where the companion scripts write their logs and checkpoints
