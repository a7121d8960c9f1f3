"""`make gpu-check`: run on a GPU machine what needs one, and record it for the pages.

    python -m book.tools gpu-check [STEP ...] [--pack FILE]
    python -m book.tools gpu-check --bundle   # the wheels a GPU machine without a package index needs

STEP is `notebooks` (every chapter, one at a time), one notebook's path, `tests` (`pytest -m gpu`),
`micro` (ddp_scripts/measure/gpu_micro.py) or `benchmark`; all four by default, in that order. With
CUDA, each step is written into results/gpu-runs/<date>-<hardware>/ as it ends, so a later call the
same day adds to that folder. Without CUDA the notebooks run on the CPU, the other steps are
skipped, and nothing is recorded (the folder is _build/gpu-check/results).
"""
import argparse
import datetime as dt
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from book.tools import ROOT, ToolError, build, gpu_recordings as rec
from ddp_scripts.measure.hardware import describe_hardware

WORK = ROOT / "_build" / "gpu-check"
STEPS = ["notebooks", "tests", "micro", "benchmark"]
STEP_TIMEOUT_S = 1800   # as build.py's limit for a notebook; `timeout` then ends the step's processes
STEPS_FILE = "steps.json"
# ResNet-18 below full size: three repeats with the tuned rows would take most of an hour.
BENCHMARKS = {"full": ["--model", "cnn", "--tuned"], "resnet18": ["--model", "resnet18", "--configs", "gpu,dp,ddp",
              "--tuned", "--train-samples", "20480", "--test-samples", "2048", "--epochs", "3"]}
BUNDLE = ["nbmake", "ipykernel", "ipywidgets", "nbclient", "nbformat"]
# Left out of the bundle: the stack's dependencies the GPU image has (a second copy would shadow them).
ON_GPU_IMAGE = set("""pytest pluggy iniconfig packaging pygments psutil attrs python-dateutil six typing-extensions
    tzdata numpy pyyaml jinja2 markupsafe setuptools pip requests urllib3 idna certifi""".split())
PLATFORMS = [*(f"manylinux_2_{glibc}_x86_64" for glibc in (17, 27, 28, 34)), "any"]


def this_machine():
    """hardware.py's description (its label names the recordings), with cores and a slug."""
    machine = describe_hardware()
    machine["cores"] = machine["cpu"]["usable_cores"]   # as its label says
    gpus = ["-".join(gpu["name"].lower().removeprefix("nvidia ").split()) for gpu in machine["gpus"]]
    machine["slug"] = f"{len(gpus)}x-{gpus[0]}" if gpus else f"cpu-{machine['cores']}core"
    return machine


def current_commit():
    """HEAD's short commit, '-modified' when a tracked file differs from it."""
    done = subprocess.run(["git", "describe", "--always", "--exclude=*", "--dirty=-modified"], cwd=ROOT,
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown (not a git checkout)"


def commands(steps, slug):
    """[(key, command)] for the steps asked, in order; {out} is the recording's folder."""
    python, names = sys.executable, [path.name for path in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))]
    table = {f"notebooks/{name}": [(f"notebook:{name}", build.nbmake_command(
        WORK / "src", [WORK / "src" / "notebooks" / name], WORK / "notebook-timings.xml"))] for name in names}
    table["notebooks"] = [command for name in names for command in table[f"notebooks/{name}"]]
    table["tests"] = [("tests", [python, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-o", "addopts=",
                                 "-rs", "tests"])]
    table["micro"] = [("micro", [python, "-m", "ddp_scripts.measure.gpu_micro",
                                 "--out", "{out}", "--commit", "{commit}"])]
    table["benchmark"] = [(f"benchmark:{name}", [python, "ddp_scripts/measure/benchmark.py", "--size", "full",
                                                 *options, "--overwrite", "--dataset", "synthetic",
                                                 "--out", f"{{out}}/{slug}-{name}.json"])
                          for name, options in BENCHMARKS.items()]
    for step in steps:
        if step not in table:
            raise ToolError(f"no step {step!r}; one of: {', '.join(STEPS)}, or a notebook's path, notebooks/NAME.ipynb")
    return [command for step in steps or STEPS for command in table[step]]


def run_step(command, cwd, log):
    """How one command went: its result, exit status, seconds and load averages (1, 5, 15 min)."""
    before, start = [round(load, 2) for load in os.getloadavg()], time.perf_counter()
    with open(log, "a", encoding="utf-8") as out:
        print("+", " ".join(command), file=out, flush=True)
        status = subprocess.run(["timeout", "-k", "10", str(STEP_TIMEOUT_S), *command], cwd=cwd,
                                stdout=out, stderr=subprocess.STDOUT).returncode
    result = "passed" if status == 0 else "timeout" if status in (124, 137) else "failed"
    return {"result": result, "exit_status": status, "seconds": round(time.perf_counter() - start, 1),
            "load_average_before": before, "load_average_after": [round(load, 2) for load in os.getloadavg()]}


def record_notebook(name, entry, folder, machine):
    """The notebook's gpu-output cells as they ran, how it ran, and the label of every page box."""
    cells = rec.read_json(folder / rec.CELLS_FILE, {})
    cells[name] = rec.record(WORK / "src" / "notebooks" / name, ROOT / "notebooks" / name)
    rec.write_json(folder / rec.CELLS_FILE, dict(sorted(cells.items())))
    conditions = rec.read_json(folder / rec.CONDITIONS_FILE, {
        "concurrent_notebooks": 1, "cores": machine["cores"], "notebooks": {}})
    conditions["notebooks"][name] = {key: entry[key] for key in (
        "load_average_before", "load_average_after", "seconds", "commit")}
    rec.write_json(folder / rec.CONDITIONS_FILE, conditions)
    commits = dict.fromkeys(notebook["commit"] for notebook in conditions["notebooks"].values())
    rec.write_json(folder / rec.RUN_FILE, {"hardware": machine["label"], "gpus": len(machine["gpus"]),
                                           "date": folder.name[:10], "commit": ", ".join(commits)})


def bundle(python="python3"):
    """.gpu-wheels/ for a GPU machine without a package index, and the line that runs the check there."""
    wheels = ROOT / ".gpu-wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    command = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.12",
               "--implementation", "cp", *[f"--platform={p}" for p in PLATFORMS], "-d", str(wheels), *BUNDLE]
    print("+", " ".join(command), flush=True)
    if subprocess.run(command).returncode != 0:
        raise ToolError("pip download failed (it needs a package index)")
    for wheel in wheels.glob("*.whl"):
        if wheel.name.split("-")[0].lower().replace("_", "-") in ON_GPU_IMAGE:
            wheel.unlink()
    print(f"{len(list(wheels.glob('*.whl')))} wheels in .gpu-wheels/. On the GPU machine, from "
          "the repository's root with .gpu-wheels/ beside it:")
    print(f"{python} -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
          f"--target /tmp/site .gpu-wheels/*.whl && PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 {python} "
          "-m book.tools gpu-check --pack \"${OUT:-_build}/gpu-check.tgz\"")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", nargs="*", metavar="STEP", help=f"{', '.join(STEPS)} or a notebook (default: all)")
    parser.add_argument("--pack", metavar="FILE", help="also write the folder as a .tar.gz")
    parser.add_argument("--bundle", action="store_true", help="wheels for a GPU machine offline")
    args = parser.parse_args(argv)
    if args.bundle:
        return bundle()
    machine = this_machine()
    record = bool(machine["gpus"])
    steps = commands(args.steps, machine["slug"])   # a wrong step stops before anything runs
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    folder = rec.RECORDINGS / f"{today}-{machine['slug']}" if record else WORK / "results"
    if not record:
        shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    build.stage(build.Edition("en", WORK / "src", None, WORK / "notebook-timings.xml",
                              ROOT / "notebooks", ROOT / "book"), site=False)
    if (ROOT / "data").is_dir():   # a downloaded CIFAR-10 is used, never fetched again
        (WORK / "src" / "data").symlink_to(ROOT / "data", target_is_directory=True)
    commit, done, failed = current_commit(), rec.read_json(folder / STEPS_FILE, []), False
    for key, command in steps:
        if not record and not key.startswith("notebook:"):
            entry = {"key": key, "result": "skipped: no CUDA"}
        else:
            command = [str(part).replace("{out}", str(folder)).replace("{commit}", commit) for part in command]
            entry = {"key": key, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                     "commit": commit, **run_step(command, WORK / "src" if key.startswith("notebook:") else ROOT,
                                        folder / "gpu-check.log")}
            if record and key.startswith("notebook:") and entry["result"] == "passed":
                record_notebook(key.split(":", 1)[1], entry, folder, machine)
        print(f"{key}: {entry['result']}" + (f" in {entry['seconds']} s" if "seconds" in entry else ""), flush=True)
        failed |= entry["result"] in ("failed", "timeout")
        done.append(entry)
        rec.write_json(folder / STEPS_FILE, done)
        if args.pack:   # after every step: a machine taken back mid-run still hands over what ended
            Path(args.pack).parent.mkdir(parents=True, exist_ok=True)
            with tarfile.open(args.pack, "w:gz") as archive:
                archive.add(folder, arcname=f"results/gpu-runs/{folder.name}")
    print(f"{len(done)} step(s) in {folder / STEPS_FILE}" + ("" if record else "; nothing recorded (no CUDA)"))
    return 1 if failed else 0
