"""`make gpu-check`: validate the book on the machine at hand, and record what its GPUs print.

    python3 book/tools/gpu_check.py                  # everything (what `make gpu-check` runs)
    python3 book/tools/gpu_check.py --dry-run        # only say what it would do here
    python3 book/tools/gpu_check.py --only notebooks/01_devices.ipynb   # one notebook, quick

For a maintainer, or a lab with GPUs, with the interpreter that has the book's requirements
(`PYTHON=python3 make gpu-check`: no virtual environment is created, no site is built, no
browser is needed, and nothing is fetched from the network). In order:

1. Every notebook is executed under nbmake, one after the other, in a copy of the sources
   (_build/gpu-check/src; the committed notebooks stay without outputs), as `make book` does.
2. `pytest -m gpu tests`: the tests that need a CUDA GPU.
3. `ddp_scripts/benchmark.py --size full` for the CNN, and with `--model resnet18` (the GPU
   configurations only: ResNet-18 on a CPU at full size takes hours). The results files go to
   results/<hardware>-full.json and results/<hardware>-resnet18.json.
4. With CUDA, the executed notebooks become a recorded GPU run,
   results/gpu-runs/<date>-<hardware>/ (book/tools/gpu_recordings.py: the outputs of every
   cell tagged `gpu-output`, with the hash of its code), which the book shows beside the
   build machine's outputs. Terminal escape codes are taken out of the results files' text.
5. A short report: each notebook passed or failed, with its time; each step's outcome; the
   headline ratios of the benchmark. It is printed, and written as report.md beside the
   recording (without CUDA: _build/gpu-check/report.md).

On a machine without CUDA the notebooks still run (every chapter runs on a CPU), and every step
that needs a GPU is reported as "no CUDA: skipped ..." instead of being run: the gpu tests, the
full-size benchmarks, and the recording (a CPU run is no GPU recording). Exit status: 0 when
everything that ran passed, 1 when something failed.
"""
import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_recordings  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "_build" / "gpu-check"
COPIED = ["notebooks", "ddp_scripts", "results", "_config.yml", "_toc.yml"]
NOTEBOOK_TIMEOUT_S = 900


def describe_hardware():
    """{'cuda': bool, 'gpus': [names], 'cpu': str, 'cores': int, 'torch': str, 'slug': str}."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count() or 1, "cuda": False, "gpus": [],
            "memory_gib": [], "torch": None, "cuda_version": None, "driver": None}
    try:
        import torch
        info["torch"] = torch.__version__
        info["cuda_version"] = torch.version.cuda
        if torch.cuda.is_available():
            info["cuda"] = True
            for i in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(i)
                info["gpus"].append(props.name)
                info["memory_gib"].append(round(props.total_memory / 2**30, 1))  # as benchmark.py
    except ImportError:
        pass
    if info["cuda"] and shutil.which("nvidia-smi"):
        result = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                                 "--format=csv,noheader"], capture_output=True, text=True)
        info["driver"] = (result.stdout.strip().splitlines() or [None])[0]
    if info["gpus"]:
        model = re.sub(r"^NVIDIA\s+", "", info["gpus"][0])
        info["slug"] = f"{len(info['gpus'])}x-{slug(model)}"
        info["label"] = gpu_recordings.hardware_label(
            list(zip(info["gpus"], info["memory_gib"])), info["cores"], info["driver"],
            info["torch"], info["cuda_version"])
    else:
        info["slug"] = f"cpu-{info['cores']}core"
        info["label"] = f"{info['cores']} CPU cores ({cpu}), no CUDA GPU, torch {info['torch']}"
    return info


def slug(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def current_commit():
    """The short commit of HEAD, '-modified' when the book's sources differ from it."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "notebooks",
                                "ddp_scripts"], cwd=ROOT, capture_output=True,
                               text=True).stdout.strip()
        return commit + ("-modified" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def copy_sources(target):
    """The sources, copied as build.py copies them, so the committed notebooks stay clean."""
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", "*.pyc")
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=ignore)
        elif source.exists():
            shutil.copy2(source, target / name)
    # The Chinese chapters run the English chapters' code cells, character for character
    # (tests/test_zh_edition.py), so their pages show the same recordings: on the GPU only
    # the English ones run.
    shutil.rmtree(target / "notebooks" / "zh", ignore_errors=True)
    if (ROOT / "data").is_dir():   # a downloaded CIFAR-10 is used, never fetched again
        (target / "data").symlink_to(ROOT / "data", target_is_directory=True)
    # nbmake skips notebooks under a `_build` folder; this plugin collects them.
    shutil.copy2(ROOT / "book" / "tools" / "nbmake_build_copy.py", target / "conftest.py")


def run_step(command, cwd, timeout_s, log):
    """Run one command, its output to the terminal and to log; (exit status, seconds)."""
    print("+", " ".join(map(str, command)), flush=True)
    start = time.perf_counter()
    with open(log, "a", encoding="utf-8") as out:
        out.write("+ " + " ".join(map(str, command)) + "\n")
        out.flush()
        try:
            process = subprocess.Popen(list(map(str, command)), cwd=cwd, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True, bufsize=1)
            for line in process.stdout:
                sys.stdout.write(line)
                out.write(line)
            status = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            status = "timeout"
        except OSError as error:
            out.write(f"could not start: {error}\n")
            status = "could not start"
    return status, time.perf_counter() - start


def notebook_results(junit):
    """[(notebook name, seconds, 'passed' | 'failed')] from nbmake's JUnit file."""
    if not junit.exists():
        return []
    rows = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        name = Path(case.get("file") or case.get("name")).name
        rows.append((name, float(case.get("time", 0)), "failed" if failed else "passed"))
    return sorted(rows)


def headline_ratios(path):
    """Lines like 'gpu: 26,286 samples/s, 1.21x cpu' from a benchmark results file."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        return [f"no results file ({error})"]
    measured = {run["config"]: run["samples_per_s"] for run in data.get("runs", [])
                if run.get("status") == "measured" and run.get("samples_per_s")}
    lines = []
    base = "cpu" if "cpu" in measured else ("gpu" if "gpu" in measured else None)
    for run in data.get("runs", []):
        name = run.get("config")
        if name in measured:
            ratio = (f", {measured[name] / measured[base]:.2f}x {base}"
                     if base and name != base else "")
            lines.append(f"{name}: {measured[name]:,.0f} samples/s{ratio}")
        else:
            lines.append(f"{name}: {run.get('status', 'not run')}"
                         + (f" ({run['reason']})" if run.get("reason") else ""))
    return lines


def plan(args, hardware):
    """[(step name, command or None, why it is skipped or None)]."""
    python = sys.executable
    notebooks = [str(Path(p)) for p in args.only] if args.only else ["notebooks"]
    no_cuda = None if hardware["cuda"] else "no CUDA"
    results = ROOT / "results"
    cnn = results / f"{hardware['slug']}-full.json"
    resnet = results / f"{hardware['slug']}-resnet18.json"
    dataset = ["--dataset", args.dataset] if args.dataset else []
    steps = [
        ("notebooks under nbmake",
         [python, "-m", "pytest", "--nbmake", "--overwrite",
          f"--nbmake-timeout={NOTEBOOK_TIMEOUT_S}", "-p", "no:cacheprovider",
          f"--junitxml={WORK / 'notebook-timings.xml'}", "-o", "junit_family=xunit1",
          "-o", "addopts=", "--rootdir", str(WORK / "src"),
          *[str(WORK / "src" / n) for n in notebooks]], None),
        ("pytest -m gpu tests",
         [python, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "tests"],
         no_cuda and "no CUDA: skipped `pytest -m gpu tests` (they need a CUDA GPU)"),
        ("benchmark, CNN, full size",
         [python, "ddp_scripts/benchmark.py", "--size", "full", "--overwrite", *dataset,
          "--out", str(cnn)],
         no_cuda and "no CUDA: skipped `benchmark.py --size full` (the CNN on CPU, one GPU, "
                     "DataParallel and DDP: without a GPU only the CPU rows could be measured, "
                     "and they take hours at full size)"),
        ("benchmark, ResNet-18, full size",
         [python, "ddp_scripts/benchmark.py", "--size", "full", "--model", "resnet18",
          "--configs", "gpu,dp,ddp", "--overwrite", *dataset, "--out", str(resnet)],
         no_cuda and "no CUDA: skipped `benchmark.py --size full --model resnet18` (its "
                     "configurations are one GPU, DataParallel and DDP over GPUs)"),
    ]
    if args.only and not no_cuda:
        steps[1] = (steps[1][0], steps[1][1], "skipped with --only (a partial check)")
        steps[2] = (steps[2][0], steps[2][1], "skipped with --only (a partial check)")
        steps[3] = (steps[3][0], steps[3][1], "skipped with --only (a partial check)")
    if args.skip_benchmark:
        for i in (2, 3):
            steps[i] = (steps[i][0], steps[i][1], steps[i][2] or "skipped (--skip-benchmark)")
    return steps, cnn, resnet


def recording_folder(hardware, date):
    return ROOT / "results" / "gpu-runs" / f"{date}-{hardware['slug']}"


def write_report(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="say what would run and what would be skipped here; run nothing")
    parser.add_argument("--only", nargs="+", metavar="NOTEBOOK",
                        help="execute only these notebooks (a quick, partial check: no "
                             "benchmark, no recording)")
    parser.add_argument("--skip-benchmark", action="store_true",
                        help="leave out the full-size benchmarks (they take the longest)")
    parser.add_argument("--dataset", choices=["cifar10", "synthetic"],
                        help="passed on to the benchmark (default: the benchmark's own)")
    parser.add_argument("--step-timeout-s", type=float, default=4 * 3600,
                        help="the longest any one step may run")
    args = parser.parse_args(argv)
    for notebook in args.only or []:
        if not (ROOT / notebook).is_file():
            print(f"error: no such notebook: {notebook}", file=sys.stderr)
            return 2

    hardware = describe_hardware()
    date = dt.datetime.now(dt.timezone.utc).date().isoformat()
    commit = current_commit()
    steps, cnn, resnet = plan(args, hardware)
    record = hardware["cuda"] and not args.only
    folder = recording_folder(hardware, date) if record else WORK
    report_path = folder / "report.md"
    header = [f"# gpu-check: {hardware['label']}", "",
              f"Date {date}, commit {commit}, Python {platform.python_version()}.", ""]
    if not hardware["cuda"]:
        header += ["**No CUDA GPU on this machine**: the notebooks run on the CPU, and what "
                   "needs a GPU is skipped and listed below. Nothing here is a GPU recording.",
                   ""]

    if args.dry_run:
        print("\n".join(header))
        for name, command, skipped in steps:
            print(f"- {name}: {skipped}" if skipped else
                  f"- {name}: would run `{' '.join(map(str, command))}`")
        print(f"- recording: would write {folder.relative_to(ROOT)}/" if record else
              ("- recording: no CUDA: skipped (a CPU run is no GPU recording)"
               if not hardware["cuda"] else "- recording: skipped with --only"))
        print(f"- report: would write {report_path.relative_to(ROOT)}")
        return 0

    WORK.mkdir(parents=True, exist_ok=True)
    log = WORK / "gpu-check.log"
    log.write_text("")
    copy_sources(WORK / "src")
    outcome = []
    failed = False
    notebook_rows = []
    for name, command, skipped in steps:
        if skipped:
            print(skipped, flush=True)
            outcome.append(f"- {name}: {skipped}")
            continue
        cwd = WORK / "src" if name.startswith("notebooks") else ROOT
        if name.startswith("notebooks"):
            (WORK / "notebook-timings.xml").unlink(missing_ok=True)
        status, seconds = run_step(command, cwd, args.step_timeout_s, log)
        if name.startswith("pytest") and status == 5:
            outcome.append(f"- {name}: no test is marked `gpu` ({seconds:.0f} s)")
            continue
        ok = status == 0
        failed |= not ok
        outcome.append(f"- {name}: {'passed' if ok else f'FAILED (exit status {status})'} "
                       f"({seconds:.0f} s)")
        if name.startswith("notebooks"):
            notebook_rows = notebook_results(WORK / "notebook-timings.xml")
    lines = header + ["## Notebooks (nbmake, one after the other)", "",
                      "| notebook | result | seconds |", "| --- | --- | ---: |"]
    lines += [f"| {n} | {r} | {s:.1f} |" for n, s, r in notebook_rows]
    if not notebook_rows:
        lines.append("| (none executed) | | |")
        failed = True
    lines += ["", "## Steps", ""] + outcome
    lines += ["", "## Headline ratios", ""]
    for path in (cnn, resnet):
        if path.exists() and hardware["cuda"] and not args.only and not args.skip_benchmark:
            removed = gpu_recordings.clean_results_file(path, path)
            lines.append(f"`{path.relative_to(ROOT)}`"
                         + (f" ({removed} terminal escape codes removed)" if removed else "")
                         + ":")
            lines += [f"- {line}" for line in headline_ratios(path)]
        else:
            lines.append(f"- `{path.name}`: not measured in this check")
    if record:
        cells = gpu_recordings.record(WORK / "src" / "notebooks")
        run = {"hardware": hardware["label"], "gpus": len(hardware["gpus"]), "date": date,
               "commit": commit, "note": "written by book/tools/gpu_check.py"}
        gpu_recordings.write_recording(folder, run, cells)
        for path in (cnn, resnet):
            if path.exists():
                shutil.copy2(path, folder / path.name)
        lines += ["", f"Recorded run: `{folder.relative_to(ROOT)}/` "
                      f"({sum(map(len, cells.values()))} gpu-output cells)."]
    else:
        lines += ["", "Recorded run: " + ("no CUDA: skipped (a CPU run is no GPU recording)."
                                          if not hardware["cuda"] else "skipped with --only.")]
    write_report(report_path, lines)
    print("\n".join(lines))
    print(f"\nreport: {report_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
