"""`make gpu-check`: validate the book on a GPU machine and record what its GPUs print, within a budget.

    python3 -m book.tools gpu-check --budget 540          # what fits in 540 s, then stop cleanly
    python3 -m book.tools gpu-check --budget 540          # again: continues where the last stopped
    python3 -m book.tools gpu-check --dry-run --budget 540   # the plan, with each step's estimate
    python3 -m book.tools gpu-check --only notebooks/01_devices.ipynb   # one notebook, no record
    python3 -m book.tools gpu-check --bundle --budget 540  # wheels for a machine without an index

For a maintainer, or a lab with GPUs, with the interpreter that has the book's requirements
(`PYTHON=python3 make gpu-check BUDGET=540`: no virtual environment is made, no site is built,
nothing is fetched). The work is planned in order of value, each step with an estimate of its
time taken from the last recording of this hardware (or, without one, of the newest recording):

1. each notebook with a `gpu-output` cell that is stale or was never recorded;
2. `pytest -m gpu tests` (the scripts, FSDP, DCP and chapter 10's levers on the GPU);
3. book/tools/gpu_micro.py: where the GPU time goes (chapter 10's CUDA-graph limit);
4. the benchmarks at full size: the CNN with its tuned rows (`benchmark.py --tuned`), ResNet-18;
5. the notebooks whose recording is current but was made on a loaded machine, then the others.

A step runs only if its estimate fits in what is left of the budget (less a margin for start-up
and for writing the recording); one that does not is left for the next call, and a later, smaller
one may still run. A step still running when the budget ends is stopped and left, not failed.
Notebooks run one at a time, never concurrently, under build.py's nbmake command in build.py's
staged copy (_build/gpu-check/src; the committed notebooks stay without outputs), and each one's
load average (1 min) before and after is recorded with it; a benchmark file whose machine was
busy before it started (load of half the cores or more, chapter 7's rule) is labelled so.

With CUDA, everything goes into the recording's folder, results/gpu-runs/<date>-<hardware>/,
as soon as each step ends: cells.json (gpu_recordings.py), run.json (the label), conditions.json
(how each notebook ran), state.json (what is done and what is left: a second call continues the
newest unfinished folder of this hardware), the results files, micro.txt/json, the log, and a
README.md that says how the recording was made; nothing in it is edited by hand. --pack FILE
writes the folder as one .tar.gz as well. Without CUDA the notebooks still run (every chapter
runs on a CPU), the steps that need a GPU are reported as skipped, nothing is recorded, and the
state lives in _build/gpu-check. Exit status: 0 when everything that ran passed, 1 when
something failed, 2 for bad input.
"""
import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from book.tools import build, gpu_recordings
from book.tools.notebooks import read_notebook
from ddp_scripts.hardware import describe_hardware as describe_machine

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "_build" / "gpu-check"
STATE_FILE = "state.json"
LOG_FILE = "gpu-check.log"
START_UP_S = 45     # before the first step: the interpreter, staging the copy, importing torch
CLOSE_S = 20        # after the last: the recording, its README, the pack
ASSUMED_S = {"notebook": 240, "tests": 300, "micro": 180, "benchmark": 300}
WHEELS = ROOT / ".gpu-wheels"
# The jupyter stack nbmake needs; the GPU image has torch, pytest, pandas and matplotlib but
# none of these, and no package index.
BUNDLE = ["nbmake", "ipykernel", "ipywidgets", "nbclient", "nbformat"]
# What the GPU image has already (a second copy in --target would shadow it): left out.
ON_GPU_IMAGE = {"torch", "pytest", "pytest-xdist", "pytest-timeout", "execnet", "pluggy",
                "iniconfig", "packaging", "pygments", "pandas", "matplotlib", "numpy", "psutil",
                "attrs", "pyyaml", "jinja2", "markupsafe", "python-dateutil", "six", "tqdm",
                "typing-extensions", "setuptools", "wheel", "pip", "filelock", "fsspec",
                "networkx", "sympy", "mpmath", "triton", "pillow", "torchvision", "pytz",
                "tzdata", "certifi", "idna", "requests", "urllib3", "charset-normalizer"}
RESNET_SIZE = ["--train-samples", "20480", "--test-samples", "2048", "--epochs", "3"]
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64",
             "manylinux_2_34_x86_64", "any"]


# --- the machine --------------------------------------------------------------------------

def describe_hardware():
    """This machine as ddp_scripts/hardware.py describes every result's machine (its label is
    the recordings' label), with what the plan needs: cuda, cores and the folder's slug."""
    machine = describe_machine()
    names = [gpu["name"] for gpu in machine["gpus"]]
    machine["cuda"], machine["cores"] = bool(names), machine["cpu"]["logical_cores"]
    model = re.sub(r"^NVIDIA\s+", "", names[0]) if names else None
    machine["slug"] = f"{len(names)}x-{slug(model)}" if names else f"cpu-{machine['cores']}core"
    return machine


def slug(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def load_average():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def busy(load_before, cores):
    """Chapter 7's rule: other work was using the machine when a measurement started."""
    return bool(load_before) and load_before[0] >= cores / 2


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


# --- what the last recording says ---------------------------------------------------------

def reference(hardware, recordings):
    """The recording a plan is measured against: this hardware's newest, else the newest."""
    same = [r for r in recordings if r[1]["hardware"] == hardware["label"]]
    ordered = sorted(same or recordings, key=lambda r: r[0].name)
    return ordered[-1] if ordered else None


def recorded_timings(folder):
    """{step key: (seconds, where from)} measured by a recording: its state.json (written by
    this tool), else the log of a run made before it (check-log.txt: nbmake's durations)."""
    timings = {}
    if folder is None:
        return timings
    state = folder / STATE_FILE
    if state.exists():
        for key, done in json.loads(state.read_text()).get("done", {}).items():
            timings[key] = (done["seconds"], f"{folder.name}, alone")
    log = folder / "check-log.txt"
    if log.exists():
        text = log.read_text(errors="replace")
        concurrent = re.search(r"--nbmake.*?-n (\d+)", (folder / "check.sh").read_text()
                               if (folder / "check.sh").exists() else "")
        how = f", {concurrent[1]} at a time" if concurrent else ""
        for seconds, name in re.findall(r"([\d.]+)s call\s+notebooks/(\S+?\.ipynb)::", text):
            timings.setdefault(f"notebook:{name}", (float(seconds), f"{folder.name}{how}"))
    return timings


def benchmark_estimate(results_file, now):
    """Seconds for a benchmark from an earlier results file: its measured wall times, scaled
    by the work now (repeats x epochs x images) over the work then. None without one."""
    try:
        then = json.loads(Path(results_file).read_text())
    except (OSError, ValueError):
        return None
    measured = [r for r in then.get("runs", []) if r.get("status") == "measured"]
    if not measured:
        return None
    # wall_s: one repeat's (the median of several); a file before repeats has one each
    one_repeat = sum(r.get("wall_s") or 0 for r in measured)
    work_then = then["settings"]["epochs"] * measured[0]["train_samples"]
    return one_repeat * now["repeats"] * now["epochs"] * now["train_samples"] / work_then


# --- the plan -----------------------------------------------------------------------------

def committed_notebooks():
    return sorted(p.name for p in (ROOT / "notebooks").glob("[0-9]*.ipynb"))


def notebook_status(name, recording):
    """('stale' | 'unrecorded' | 'loaded' | 'current' | 'none', gpu-output cells) of a notebook."""
    cells = gpu_recordings.gpu_cells(read_notebook(ROOT / "notebooks" / name))
    if not cells:
        return "none", 0
    entries = recording[2].get(name, {}) if recording else {}
    hashes = [(entries.get(c["id"]) or {}).get("source_sha256") for c in cells]
    if any(h is None for h in hashes):
        return "unrecorded", len(cells)
    if any(h != gpu_recordings.source_hash(gpu_recordings.source_of(c))
           for h, c in zip(hashes, cells)):
        return "stale", len(cells)
    found = gpu_recordings.notebook_conditions(recording[1], name)
    return ("loaded" if found is None or found[0] else "current"), len(cells)


def candidate_steps(hardware, recording, args, notebooks=None):
    """Every step of a full check, in order of value: dicts with key, group, title, command,
    cwd ('src' or 'root'), needs_cuda, estimate_s and estimate_from."""
    python = sys.executable
    timings = recorded_timings(recording[0] if recording else None)
    folder = recording[0] if recording else None
    steps = []

    def add(key, group, title, kind, command, cwd="root", needs_cuda=True, estimate=None):
        if key in timings:
            seconds, source = timings[key]
        elif estimate is not None:
            seconds, source = estimate
        else:
            seconds, source = ASSUMED_S[kind], "never timed: assumed"
        steps.append({"key": key, "group": group, "title": title, "kind": kind,
                      "command": [str(c) for c in command], "cwd": cwd,
                      "needs_cuda": needs_cuda, "estimate_s": round(seconds, 1),
                      "estimate_from": source})

    status = {name: notebook_status(name, recording) for name in (notebooks or
                                                                   committed_notebooks())}
    for name, (state, cells) in status.items():
        if notebooks or state in ("stale", "unrecorded"):
            plural = "s" if cells != 1 else ""
            add(f"notebook:{name}", 1, f"{name} ({cells} gpu-output cell{plural}, {state})", "notebook",
                [], cwd="src", needs_cuda=False)
    if not notebooks:
        add("tests", 2, "pytest -m gpu tests", "tests",
            [python, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-o", "addopts=",
             "-q", "-rs", "tests"])
        add("micro", 3, "where the GPU time goes (gpu_micro.py)", "micro",
            [python, "-m", "book.tools.gpu_micro", "--out", "{out}", "--commit", "{commit}"])
        # ResNet-18 at the size of the last recording's run: at full size, three repeats of
        # it and its tuned rows take longer than one call's budget.
        for model, extra in (("cnn", ["--tuned"]),
                             ("resnet18", ["--configs", "gpu,dp,ddp", "--tuned", *RESNET_SIZE])):
            name = f"{hardware['slug']}-{'full' if model == 'cnn' else 'resnet18'}.json"
            estimate = None
            if folder is not None:
                old = next(iter(sorted(folder.glob(f"*-{'full' if model == 'cnn' else 'resnet18'}"
                                                   ".json"))), None)
                seconds = benchmark_estimate(old, benchmark_work(extra)) if old else None
                if seconds:  # --tuned adds a row for each plain one
                    estimate = (2 * seconds, f"{folder.name}/{old.name}, scaled to this size, "
                                             "doubled for the tuned rows")
            add(f"benchmark:{model}", 4, f"benchmark.py --size full --model {model} "
                + " ".join(extra), "benchmark",
                [python, "ddp_scripts/benchmark.py", "--size", "full", "--model", model, *extra,
                 "--overwrite", "--dataset", args.dataset, "--out", "{out}/" + name],
                estimate=estimate)
        for wanted in ("loaded", "current", "none"):
            for name, (state, cells) in status.items():
                if state == wanted:
                    why = {"loaded": "recorded on a loaded machine: again, alone",
                           "current": "recorded and current: again, to validate",
                           "none": "no gpu-output cell: to validate"}[wanted]
                    add(f"notebook:{name}", 5, f"{name} ({why})", "notebook", [], cwd="src",
                        needs_cuda=False)
    return steps


def benchmark_work(extra):
    """The repeats, epochs and images of a full-size benchmark with these options, as
    benchmark.py's SIZES has them."""
    from ddp_scripts.benchmark import SIZES
    full = SIZES["full"]
    given = {flag: value for flag, value in zip(extra, extra[1:]) if flag.startswith("--")}
    return {"repeats": full["repeats"], "epochs": int(given.get("--epochs", full["epochs"])),
            "train_samples": int(given.get("--train-samples", full["train_samples"] or 50_000))}


def fit(steps, budget_s, done=()):
    """(planned, left): in order of value, each step not done whose estimate fits in what is
    left of the budget after the start-up and closing margins; the others are left."""
    room = None if budget_s is None else budget_s - START_UP_S - CLOSE_S
    planned, left = [], []
    for step in steps:
        if step["key"] in done:
            continue
        if room is None or step["estimate_s"] <= room:
            planned.append(step)
            room = None if room is None else room - step["estimate_s"]
        else:
            left.append(step)
            if budget_s is not None and step["estimate_s"] > budget_s - START_UP_S - CLOSE_S:
                step["too_long"] = True   # no call of this budget can run it
    return planned, left


# --- running ------------------------------------------------------------------------------

def run_command(command, cwd, timeout_s, log):
    """Run one command in its own process group, its output to the terminal and to log;
    ('passed' | 'failed' | 'timeout' | 'could not start', exit status, seconds). On timeout
    the whole group (torchrun's workers, a notebook's kernel) is ended."""
    print("+", " ".join(command), flush=True)
    start = time.perf_counter()
    with open(log, "a", encoding="utf-8") as out:
        out.write("+ " + " ".join(command) + "\n")
        out.flush()
        try:
            process = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        except OSError as error:
            out.write(f"could not start: {error}\n")
            return "could not start", None, time.perf_counter() - start
        try:
            status = process.wait(timeout=max(timeout_s, 1))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return "timeout", None, time.perf_counter() - start
    return ("passed" if status == 0 else "failed"), status, time.perf_counter() - start


class Check:
    """One call of gpu-check: the folder it writes, its state, and what each step does."""

    def __init__(self, hardware, folder, record, commit, budget_s, args, clock=time.monotonic,
                 execute=None):
        self.hardware, self.folder, self.record, self.commit = hardware, folder, record, commit
        self.budget_s, self.args, self.clock = budget_s, args, clock
        self.started = clock()
        self.execute = execute or run_command
        Path(folder).mkdir(parents=True, exist_ok=True)
        self.state = load_state(folder)
        self.state.setdefault("calls", []).append({
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "commit": commit, "budget_s": budget_s, "ran": [], "left": []})
        self.failed = False

    def seconds_left(self):
        if self.budget_s is None:
            return None
        return self.budget_s - CLOSE_S - (self.clock() - self.started)

    def run(self, planned):
        call = self.state["calls"][-1]
        for step in planned:
            left = self.seconds_left()
            if left is not None and step["estimate_s"] > left:
                call["left"].append({"key": step["key"], "why": "no time left for its estimate"})
                continue
            if step["needs_cuda"] and not self.hardware["cuda"]:
                call["ran"].append({"key": step["key"], "result": "skipped: no CUDA"})
                continue
            timeout = self.args.step_timeout_s if left is None else min(left,
                                                                       self.args.step_timeout_s)
            before = load_average()
            result, status, seconds = self.execute(self.command_of(step), self.cwd_of(step),
                                                   timeout, self.folder / LOG_FILE)
            after = load_average()
            if result == "timeout" and left is not None and timeout >= left:
                call["left"].append({"key": step["key"], "why": f"stopped after {seconds:.0f} s:"
                                                                " the budget ran out"})
                continue
            entry = {"key": step["key"], "result": result, "exit_status": status,
                     "seconds": round(seconds, 1), "load_average_before": before,
                     "load_average_after": after, "commit": self.commit}
            call["ran"].append(entry)
            if result == "passed":
                self.state.setdefault("done", {})[step["key"]] = entry
            else:
                self.failed = True
            self.after_step(step, entry)
        return call

    def command_of(self, step):
        if step["kind"] == "notebook":
            name = step["key"].split(":", 1)[1]
            return build.nbmake_command(WORK / "src", [WORK / "src" / "notebooks" / name],
                                        WORK / "notebook-timings.xml")
        return [c.replace("{out}", str(self.folder)).replace("{commit}", self.commit)
                for c in step["command"]]

    def cwd_of(self, step):
        return WORK / "src" if step["cwd"] == "src" else ROOT

    def after_step(self, step, entry):
        """Everything a step finished is written down at once: state, cells, conditions."""
        if step["kind"] == "notebook" and entry["result"] == "passed" and self.record:
            name = step["key"].split(":", 1)[1]
            cells = read_json(self.folder / gpu_recordings.CELLS_FILE, {})
            cells.update(gpu_recordings.record(WORK / "src" / "notebooks", names={name}))
            gpu_recordings.write_json(self.folder / gpu_recordings.CELLS_FILE, dict(sorted(
                cells.items())))
            conditions = read_json(self.folder / gpu_recordings.CONDITIONS_FILE, {
                "concurrent_notebooks": 1, "cores": self.hardware["cores"],
                "source": "book/tools/gpu_check.py: one notebook at a time", "notebooks": {}})
            conditions["notebooks"][name] = {k: entry[k] for k in (
                "load_average_before", "load_average_after", "seconds", "commit")}
            gpu_recordings.write_json(self.folder / gpu_recordings.CONDITIONS_FILE, conditions)
        if step["kind"] == "benchmark" and self.record:
            for path in self.folder.glob("*.json"):
                if path.name.endswith(("-full.json", "-resnet18.json")):
                    gpu_recordings.clean_results_file(path, path)
        save_state(self.folder, self.state)


def read_json(path, default):
    return json.loads(Path(path).read_text()) if Path(path).exists() else default


def load_state(folder):
    return read_json(Path(folder) / STATE_FILE, {"done": {}, "calls": []})


def save_state(folder, state):
    Path(folder).mkdir(parents=True, exist_ok=True)
    gpu_recordings.write_json(Path(folder) / STATE_FILE, state)


def output_folder(hardware, record, out=None):
    """Where this call writes: --out; else this hardware's newest unfinished recording (a
    second call continues it); else a new results/gpu-runs/<date>-<hardware>/."""
    if out:
        return Path(out).resolve()
    if not record:
        return WORK
    unfinished = [f for f in sorted(gpu_recordings.RECORDINGS.glob(f"*-{hardware['slug']}"))
                  if (f / STATE_FILE).exists() and not read_json(f / STATE_FILE, {}).get(
                      "complete")]
    if unfinished:
        return unfinished[-1]
    date = dt.datetime.now(dt.timezone.utc).date().isoformat()
    return gpu_recordings.RECORDINGS / f"{date}-{hardware['slug']}"


def stage_sources():
    """build.py's staged copy of the English edition (the Chinese chapters run the same code
    cells, character for character, so they show the same recordings), for executing only."""
    edition = build.Edition("en", WORK / "src", None, WORK / "notebook-timings.xml",
                            ROOT / "notebooks", ROOT / "book")
    build.stage(edition, site=False)
    if (ROOT / "data").is_dir():   # a downloaded CIFAR-10 is used, never fetched again
        (WORK / "src" / "data").symlink_to(ROOT / "data", target_is_directory=True)


# --- what is written ----------------------------------------------------------------------

def headline_ratios(path, cores=None):
    """Lines like 'gpu: 26,286 samples/s, 1.21x cpu' from a benchmark results file; a file
    whose machine was busy when it started says so first, as chapter 7 does."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        return [f"no results file ({error})"]
    lines = []
    hardware = data.get("hardware", {})
    before = hardware.get("load_average_before")
    cores = cores or hardware.get("cpu", {}).get("usable_cores") or hardware.get(
        "cpu", {}).get("logical_cores")
    if cores and busy(before, cores):
        lines.append(f"BUSY: load average (1 min) {before[0]} before the runs on {cores} cores: "
                     "other work was using the machine; these speeds are not an idle machine's")
    measured = {run["config"]: run["samples_per_s"] for run in data.get("runs", [])
                if run.get("status") == "measured" and run.get("samples_per_s")}
    base = "cpu" if "cpu" in measured else ("gpu" if "gpu" in measured else None)
    for run in data.get("runs", []):
        name = run.get("config")
        if name in measured:
            ratio = (f", {measured[name] / measured[base]:.2f}x {base}"
                     if base and name != base else "")
            shaky = " (unreliable: its epochs spread too far)" if run.get("reliable") is False \
                else ""
            lines.append(f"{name}: {measured[name]:,.0f} samples/s{ratio}{shaky}")
        else:
            lines.append(f"{name}: {run.get('status', 'not run')}"
                         + (f" ({run['reason']})" if run.get("reason") else ""))
    return lines


def describe_step(step):
    return (f"{step['title']}: about {step['estimate_s']:.0f} s ({step['estimate_from']})"
            + ("; longer than this budget allows: give it a larger --budget"
               if step.get("too_long") else ""))


def write_readme(folder, hardware, state, left):
    """The recording's README: how it was made, from its state; written by this tool only."""
    done = state.get("done", {})
    lines = [f"# Recorded GPU run: {hardware['label']}", "",
             "Written by `book/tools/gpu_check.py` (`make gpu-check`); nothing here was edited "
             "by hand. Each call ran what fitted in its budget, one notebook at a time (never "
             "two at once), and wrote each step's result as soon as it ended.", "",
             "| call (UTC) | commit | budget | steps run | left for the next call |",
             "| --- | --- | ---: | --- | --- |"]
    for call in state.get("calls", []):
        ran = ", ".join(f"{r['key']} {r['result']}" for r in call["ran"]) or "none"
        gone = ", ".join(r["key"] for r in call["left"]) or "none"
        budget = f"{call['budget_s']:.0f} s" if call.get("budget_s") else "none"
        lines.append(f"| {call['date']} | {call['commit']} | {budget} | {ran} | {gone} |")
    lines += ["", "## Steps done", "",
              "| step | result | seconds | load average (1 min) before → after | machine |",
              "| --- | --- | ---: | --- | --- |"]
    for key, entry in sorted(done.items()):
        before, after = entry.get("load_average_before"), entry.get("load_average_after")
        load = f"{before[0]} → {after[0]}" if before and after else "not recorded"
        machine = "busy" if busy(before, hardware["cores"]) else "idle"
        lines.append(f"| {key} | {entry['result']} | {entry['seconds']:.1f} | {load} on "
                     f"{hardware['cores']} cores | {machine} |")
    lines += ["", "## Left for the next call", ""]
    lines += [f"- {describe_step(step)}" for step in left] or ["- nothing: the check is complete"]
    lines += ["", "## Files", "",
              "| file | what it is |", "| --- | --- |",
              "| `run.json` | the label every page box shows: hardware, GPU count, date, commit |",
              "| `cells.json` | every recorded `gpu-output` cell: the sha256 of its code and its "
              "outputs (gpu_recordings.py) |",
              "| `conditions.json` | how each notebook ran: alone, its load average before and "
              "after, its seconds |",
              "| `state.json` | every call: its budget, what it ran and left |",
              f"| `{LOG_FILE}` | every command and its output |",
              "| `*-full.json`, `*-resnet18.json` | `benchmark.py --size full --tuned` (CNN, "
              "ResNet-18), terminal escape codes removed |",
              "| `micro.txt`, `micro.json` | `book/tools/gpu_micro.py`: the scripts' data path, "
              "data on the GPU, CUDA-graph replay |", ""]
    (folder / "README.md").write_text("\n".join(lines), encoding="utf-8")


def write_run(folder, hardware, state):
    commits = list(dict.fromkeys(e["commit"] for e in state.get("done", {}).values()))
    dates = [c["date"][:10] for c in state.get("calls", [])]
    run = {"hardware": hardware["label"], "gpus": len(hardware["gpus"]),
           "date": dates[0] if dates else "", "commit": ", ".join(commits) or "none",
           "note": "written by book/tools/gpu_check.py, one notebook at a time"}
    gpu_recordings.write_json(folder / gpu_recordings.RUN_FILE, run)
    if not (folder / gpu_recordings.CELLS_FILE).exists():
        gpu_recordings.write_json(folder / gpu_recordings.CELLS_FILE, {})


def pack(folder, target):
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(target, "w:gz") as archive:
        archive.add(folder, arcname=f"results/gpu-runs/{folder.name}")
    return target


# --- the bundle ---------------------------------------------------------------------------

def bundle(budget_s, python="python3"):
    """Download the wheels a GPU machine without a package index needs into .gpu-wheels/, and
    print the one command line that installs them there and runs the check."""
    if WHEELS.exists():
        shutil.rmtree(WHEELS)
    WHEELS.mkdir()
    command = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
               "--python-version", "3.12", "--implementation", "cp",
               *[f"--platform={p}" for p in PLATFORMS], "-d", str(WHEELS), *BUNDLE]
    print("+", " ".join(command), flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"error: pip download failed (it needs a package index, PyPI or a mirror): {last}",
              file=sys.stderr)
        return 1
    removed = []
    for wheel in sorted(WHEELS.glob("*.whl")):
        project = wheel.name.split("-")[0].lower().replace("_", "-")
        if project in ON_GPU_IMAGE:
            wheel.unlink()
            removed.append(project)
    kept = sorted(w.name for w in WHEELS.glob("*.whl"))
    size = sum(w.stat().st_size for w in WHEELS.glob("*.whl")) / 2**20
    print(f"{len(kept)} wheels ({size:.1f} MiB) in {WHEELS.relative_to(ROOT)}/; left out, as the "
          f"GPU image has them: {', '.join(sorted(set(removed))) or 'none'}")
    budget = f" --budget {budget_s:.0f}" if budget_s else ""
    print("On the GPU machine, from the repository's root (with .gpu-wheels/ beside it):")
    print(f"{python} -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "
          f"--upgrade --target /tmp/site .gpu-wheels/*.whl && PYTHONPATH=/tmp/site "
          f"PYTHONUNBUFFERED=1 {python} -m book.tools gpu-check{budget} --pack "
          f"\"${{OUT:-_build}}/gpu-check.tgz\"")
    return 0


# --- main ---------------------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, metavar="SECONDS",
                        help="stop cleanly before this many seconds; the next call continues")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan, each step's estimate and what the budget leaves")
    parser.add_argument("--only", nargs="+", metavar="NOTEBOOK",
                        help="execute only these notebooks (a quick, partial check: nothing "
                             "is recorded)")
    parser.add_argument("--out", help="the recording's folder (default: continue this "
                                      "hardware's unfinished one, or start a new one)")
    parser.add_argument("--pack", metavar="FILE", help="also write the folder as a .tar.gz")
    parser.add_argument("--bundle", action="store_true",
                        help="download the wheels a GPU machine without an index needs, and "
                             "print the command line to run there")
    parser.add_argument("--dataset", choices=["cifar10", "synthetic"], default="synthetic",
                        help="passed on to the benchmark (default: synthetic, as offline)")
    parser.add_argument("--step-timeout-s", type=float, default=4 * 3600,
                        help="the longest any one step may run")
    args = parser.parse_args(argv)
    if args.budget is not None and args.budget <= START_UP_S + CLOSE_S:
        print(f"error: --budget must be more than {START_UP_S + CLOSE_S} s (the start-up and "
              "closing margins)", file=sys.stderr)
        return 2
    if args.bundle:
        return bundle(args.budget)
    for notebook in args.only or []:
        if not (ROOT / notebook).is_file() or not notebook.endswith(".ipynb"):
            print(f"error: no such notebook: {notebook}", file=sys.stderr)
            return 2

    hardware = describe_hardware()
    recordings = gpu_recordings.load_recordings()
    recording = reference(hardware, recordings)
    record = hardware["cuda"] and not args.only
    folder = output_folder(hardware, record, args.out)
    if not record:   # a check without a recording starts afresh every time
        (folder / STATE_FILE).unlink(missing_ok=True)
    state = load_state(folder)
    steps = candidate_steps(hardware, recording, args,
                            [Path(n).name for n in args.only] if args.only else None)
    planned, left = fit(steps, args.budget, state.get("done", {}))
    commit = current_commit()

    header = [f"# gpu-check: {hardware['label']}", "",
              f"Commit {commit}, Python {platform.python_version()}; estimates from "
              f"{recording[0].relative_to(ROOT) if recording else 'no recording'}"
              + (f"; budget {args.budget:.0f} s (start-up {START_UP_S} s and closing "
                 f"{CLOSE_S} s kept back)" if args.budget else "; no budget") + ".", ""]
    if not hardware["cuda"]:
        header += ["**No CUDA GPU on this machine**: a real call runs the notebooks on the CPU "
                   "and skips the steps that need a GPU; the plan below is what a machine like "
                   "the recording's would run. Nothing here is a GPU recording.", ""]
    if state.get("done"):
        header += [f"Continuing {folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder}"
                   f": {len(state['done'])} step(s) done already.", ""]

    if args.dry_run:
        print("\n".join(header))
        total = 0.0
        print("Would run, in this order:")
        for step in planned:
            total += step["estimate_s"]
            need = " (needs CUDA: skipped here)" if step["needs_cuda"] and not hardware["cuda"] \
                else ""
            print(f"- {describe_step(step)}{need}")
        print(f"Planned: {len(planned)} step(s), about {total:.0f} s"
              + (f" of the {args.budget - START_UP_S - CLOSE_S:.0f} s the budget leaves"
                 if args.budget else "") + ".")
        print("Left for the next call (does not fit in the budget):" if left else
              "Left for the next call: nothing.")
        for step in left:
            print(f"- {describe_step(step)}")
        where = folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder
        print(f"Would write: {where}/" + (" (a GPU recording)" if record else
                                          " (no recording: a GPU machine would write "
                                          "results/gpu-runs/<date>-<hardware>/)"))
        return 0

    WORK.mkdir(parents=True, exist_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    stage_sources()
    check = Check(hardware, folder, record, commit, args.budget, args)
    call = check.run(planned)
    call["left"] += [{"key": s["key"], "why": "did not fit in the budget"} for s in left]
    done = check.state.get("done", {})
    remaining = [s for s in steps if s["key"] not in done]
    check.state["complete"] = not remaining and not check.failed
    save_state(folder, check.state)
    lines = header + ["## This call", ""]
    lines += [f"- {r['key']}: {r['result']}" + (f" ({r['seconds']:.0f} s, load average "
                                                  f"{r['load_average_before']} → "
                                                  f"{r['load_average_after']})"
                                                  if "seconds" in r else "")
              for r in call["ran"]] or ["- nothing ran"]
    lines += ["", "## Left for the next call", ""]
    lines += [f"- {s['title']}" for s in remaining] or ["- nothing: the check is complete"]
    lines += ["", "## Headline ratios", ""]
    for path in sorted(folder.glob("*.json")):
        if path.name.endswith(("-full.json", "-resnet18.json")):
            lines.append(f"`{path.name}`:")
            lines += [f"- {line}" for line in headline_ratios(path)]
    if record:
        write_run(folder, hardware, check.state)
        write_readme(folder, hardware, check.state, remaining)
    (folder / "report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    print(f"\nreport: {folder / 'report.md'}")
    if args.pack:
        print(f"packed: {pack(folder, args.pack)}")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
