"""`make gpu-check`: run on a GPU machine what needs one, and record it for the pages.

    python -m book.tools gpu-check [STEP ...] [--budget-s S] [--pack FILE] [--commit C]
    python -m book.tools gpu-check --plan [--budget-s S]      # the order and each step's expected time
    python -m book.tools gpu-check --dry-run [--budget-s S]   # the bookkeeping, no step run
    python -m book.tools gpu-check --bundle   # the wheels a GPU machine without a package index needs

STEP is `notebooks` (every chapter, one at a time), one notebook's path, `tests` (`pytest -m gpu`),
`micro` (ddp_scripts/measure/gpu_micro.py) or `benchmark`; all four by default, in that order. The
chapters go most valuable first: those with no box current, then those with boxes stale or not
recorded, each the one with most boxes to gain first (plan_order). With a budget, a step whose
expected seconds do not fit in what is left is not started, and a step started is ended when the
budget is spent. With CUDA, each step is written into results/gpu-runs/<date>-<hardware>/ as it
ends (with a README.md), so a later call the same day adds to that folder, and --pack writes that
folder as a .tar.gz after each step. Without CUDA the notebooks run on the CPU, the other steps are
skipped, and nothing is recorded (the folder is _build/gpu-check/results).
"""
import argparse
import datetime as dt
import errno
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from book.tools import ROOT, ToolError, build, gpu_recordings as rec
from ddp_scripts.measure.links import describe_machine

WORK = ROOT / "_build" / "gpu-check"
STEPS = ["notebooks", "tests", "micro", "benchmark"]
STEP_TIMEOUT_S = 1800   # as build.py's limit for a notebook; `timeout` then ends the step's processes
STEPS_FILE = "steps.json"
# A step no run has timed: the plan expects this many seconds of it.
UNTIMED_STEP_S = 300
# nbmake's durations in a recording's check log (pytest --durations): "98.23s call notebooks/NAME::..."
LOGGED_DURATION = re.compile(r"^([\d.]+)s call\s+notebooks/([\w.-]+\.ipynb)::", re.M)
# ResNet-18 below full size: three repeats with the tuned rows would take most of an hour.
BENCHMARKS = {"full": ["--model", "cnn", "--tuned"], "resnet18": ["--model", "resnet18", "--configs", "gpu,dp,ddp",
              "--tuned", "--train-samples", "20480", "--test-samples", "2048", "--epochs", "3"]}
BUNDLE = ["nbmake", "ipykernel", "ipywidgets", "nbclient", "nbformat"]
# Left out of the bundle: the stack's dependencies the GPU image has (a second copy would shadow them).
ON_GPU_IMAGE = set("""pytest pluggy iniconfig packaging pygments psutil attrs python-dateutil six typing-extensions
    tzdata numpy pyyaml jinja2 markupsafe setuptools pip requests urllib3 idna certifi""".split())
PLATFORMS = [*(f"manylinux_2_{glibc}_x86_64" for glibc in (17, 27, 28, 34)), "any"]


def this_machine():
    """links.describe_machine (its label names the recordings), with cores and a slug."""
    machine = describe_machine()
    machine["cores"] = machine["cpu"]["usable_cores"]   # as its label says
    gpus = ["-".join(gpu["name"].lower().removeprefix("nvidia ").split()) for gpu in machine["gpus"]]
    machine["slug"] = f"{len(gpus)}x-{gpus[0]}" if gpus else f"cpu-{machine['cores']}core"
    return machine


def current_commit():
    """HEAD's short commit, '-modified' when a tracked file differs from it."""
    done = subprocess.run(["git", "describe", "--always", "--exclude=*", "--dirty=-modified"], cwd=ROOT,
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown (not a git checkout)"


def plan_order(names, counted):
    """The chapters `names`, most valuable to record first: those with no box current (never
    recorded from today's code), then those with a box stale or not recorded, then the rest; in
    each, the most boxes to make current first. counted: gpu_recordings.box_counts_by_notebook."""
    def rank(name):
        counts = counted.get(name, {"boxes": 0, "current": 0})
        gain = counts["boxes"] - counts["current"]
        return (0 if gain and not counts["current"] else 1 if gain else 2, -gain, name)
    return sorted(names, key=rank)


def commands(steps, slug, counted=None):
    """[(key, command)] for the steps asked, in order (the chapters in plan_order, by the boxes
    of `counted`, default: the committed chapters'); {out} is the recording's folder."""
    notebooks = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
    counted = rec.box_counts_by_notebook(notebooks) if counted is None else counted
    python, names = sys.executable, plan_order([path.name for path in notebooks], counted)
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


def run_step(command, cwd, log, limit_s=None):
    """How one command went: its result, exit status, seconds and load averages (1, 5, 15 min).
    It is ended after limit_s seconds (default STEP_TIMEOUT_S), with the processes it started."""
    before, start = [round(load, 2) for load in os.getloadavg()], time.perf_counter()
    limit_s = STEP_TIMEOUT_S if limit_s is None else max(1, int(limit_s))
    with open(log, "a", encoding="utf-8") as out:
        print("+", " ".join(command), file=out, flush=True)
        status = subprocess.run(["timeout", "-k", "10", str(limit_s), *command], cwd=cwd,
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


def logged_seconds(folder):
    """({step key: seconds}, the file) a recording's folder says its steps took: its steps.json
    (written by this tool, a step at a time), else nbmake's durations in its check-log.txt."""
    steps = rec.read_json(Path(folder) / STEPS_FILE, [])
    timed = {step["key"]: step["seconds"] for step in steps if step.get("result") == "passed" and "seconds" in step}
    if timed or not (Path(folder) / "check-log.txt").exists():
        return timed, STEPS_FILE
    log = (Path(folder) / "check-log.txt").read_text(encoding="utf-8")
    return {f"notebook:{name}": float(seconds) for seconds, name in LOGGED_DURATION.findall(log)}, "check-log.txt"


def expected_seconds(keys, recordings_root=rec.RECORDINGS, timings=build.EXECUTED.timings):
    """{key: (seconds, where from)} for each step: the newest GPU recording that timed it, else
    the last build's nbmake timings (the build machine, usually a CPU), else UNTIMED_STEP_S."""
    found = {}
    for folder in sorted(Path(recordings_root).glob("*"), reverse=True):
        timed, file = logged_seconds(folder)
        for key, seconds in timed.items():
            found.setdefault(key, (seconds, f"results/gpu-runs/{folder.name}/{file}"))
    machine = build.MACHINE.read_text().strip().split(";")[0] if build.MACHINE.exists() else "?"
    # the build's timings, else those of the chapters it has executed so far
    for junit in [Path(timings), *sorted(Path(timings).with_suffix("").glob("*.xml"))]:
        for case in ET.parse(junit).getroot().iter("testcase") if junit.exists() else ():
            key = f"notebook:{Path(case.get('file') or case.get('name')).name}"
            found.setdefault(key, (float(case.get("time", 0)), f"last build, {machine}"))
    return {key: found.get(key, (UNTIMED_STEP_S, "untimed: assumed")) for key in keys}


def plan(keys, expected, budget_s=None):
    """[(key, seconds, where from, ends at or None)]: the steps in order, each expected to end
    at the seconds given; with a budget, None for a step that would not fit in what is left
    (it is not started, and the next that fits is)."""
    spent, rows = 0.0, []
    for key in keys:
        seconds, source = expected[key]
        fits = budget_s is None or spent + seconds <= budget_s
        spent += seconds if fits else 0
        rows.append((key, seconds, source, round(spent, 1) if fits else None))
    return rows


def run_steps(steps, expected, budget_s, run_one, clock=time.monotonic, started=None, after=None):
    """Each (key, command) of `steps` run in order by run_one(key, command, limit_s), which returns
    its entry, and after(entry) called: with a budget (seconds since `started`, default now), a
    step whose expected seconds exceed what is left is not started, and one started has what
    is left as its limit. Returns the entries."""
    started, entries = clock() if started is None else started, []
    for key, command in steps:
        left = None if budget_s is None else budget_s - (clock() - started)
        if left is not None and expected[key][0] > left:
            entry = {"key": key, "result": "not started: budget",
                     "expected_seconds": expected[key][0], "left_seconds": round(max(left, 0), 1)}
        else:
            entry = run_one(key, command, STEP_TIMEOUT_S if left is None else min(STEP_TIMEOUT_S, left))
        entries.append(entry)
        if after:
            after(entry)
    return entries


def write_readme(folder, machine, commit, steps, dry_run=False):
    """The folder's README.md: what ran, how it went, and what each file holds."""
    rows = "\n".join(f"| `{step['key']}` | {step['result']} | {step.get('seconds', '')} |" for step in steps)
    title = f"{machine['label'].split(';')[0]}, {folder.name[:10]}, commit {commit}"
    heading = "A dry run of `make gpu-check`, nothing recorded" if dry_run else "Recorded GPU run"
    (Path(folder) / "README.md").write_text(f"""# {heading}: {title}

Written by `make gpu-check` (`book/tools/gpu_check.py`) on {machine['label']}. Each step as it
ended, in the order it ran:

| step | result | seconds |
| --- | --- | ---: |
{rows}

| file | what it is |
| --- | --- |
| `run.json` | the label every page box shows: hardware, GPU count, date, commit |
| `cells.json` | each `gpu-output` cell of the chapters that passed: the sha256 of its code and its outputs |
| `conditions.json` | how each chapter ran: alone, its seconds, the load average before and after |
| `steps.json` | each step's result, seconds and load average |
| `gpu-check.log` | every command's output |
""", encoding="utf-8")


def pack(folder, target):
    """The folder as a .tar.gz, unpacking to results/gpu-runs/<its name>/ from the repository's
    root; written whole or not at all (a run ended mid-write leaves the last one)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    with tarfile.open(partial, "w:gz") as archive:
        archive.add(folder, arcname=f"results/gpu-runs/{Path(folder).name}")
    os.replace(partial, target)


def packed_by_gpu_check(path):
    """Whether `path` is an archive pack() wrote: a gzip tar whose members all lie in one
    results/gpu-runs/<name>/ folder."""
    try:
        with open(path, "rb") as file:
            if file.read(2) != b"\x1f\x8b":
                return False
        with tarfile.open(path, "r:gz") as archive:
            names = archive.getnames()
    except (OSError, tarfile.TarError, EOFError):
        return False
    folders = {re.match(r"results/gpu-runs/([^/]+)(/|$)", name) for name in names}
    return bool(names) and None not in folders and len({match[1] for match in folders}) == 1


def check_pack_target(target):
    """A ToolError unless `target` can be written as pack() writes it: a path, not a folder, no
    file but an archive gpu-check wrote, and the nearest folder that exists takes a new file.
    Checked before any step runs; nothing is made."""
    if not str(target).strip():
        raise ToolError("--pack '': no file named; give the .tar.gz file's path")
    target = Path(target)
    if target.is_dir():
        raise ToolError(f"--pack {target}: a folder; give the .tar.gz file's path")
    if os.path.lexists(target) and not packed_by_gpu_check(target):
        raise ToolError(f"--pack {target}: a file gpu-check did not write; give a new .tar.gz file's path")
    parent = target.absolute().parent
    while not os.path.lexists(parent):
        parent = parent.parent
    if not parent.is_dir():
        raise ToolError(f"--pack {target}: {parent} is a file, not a folder")
    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=f".{target.name}."):
            pass
    except OSError as error:   # /proc answers "No such file or directory" though it exists
        reason = ("it exists and refuses them" if error.errno == errno.ENOENT and parent.is_dir()
                  else error.strerror or error)
        raise ToolError(f"--pack {target}: {parent} takes no new file ({reason})") from None


def budget_seconds(text):
    """The --budget-s given, as seconds; a ToolError that repeats the text typed unless it is a
    finite number above 0."""
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ToolError(f"--budget-s {text}: a budget is a finite number of seconds above 0")
    return seconds


def run_line(python, commit, budget_s=540):
    """The one command line for a GPU machine without a package index, with .gpu-wheels/ beside
    the repository's root: the wheels installed, then the check within budget_s, packed to $OUT.
    The book's own code is not installed there (that needs setuptools the image may lack): the
    root beside the wheels' folder on PYTHONPATH is what `pip install -e .` gives elsewhere."""
    return (f"{python} -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
            f"--target /tmp/site .gpu-wheels/*.whl && PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 {python} "
            f"-m book.tools gpu-check --budget-s {budget_s} --commit {commit} "
            "--pack \"${OUT:-_build}/gpu-check.tgz\"")


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
          "the repository's root with .gpu-wheels/ beside it (the device tool: carry .gpu-wheels, "
          "_build/notebook-timings.xml and _build/notebook-machine.txt, the last two required: they "
          "time the chapters no GPU run has timed; timeout_s 600):")
    if not Path(build.EXECUTED.timings).exists():
        print(f"{build.EXECUTED.timings} is missing: run `make book` first, or the plan assumes "
              f"{UNTIMED_STEP_S} s for each chapter no GPU run has timed.")
    print(run_line(python, current_commit()))
    return 0


def step_of(key):
    """The STEP that runs a plan's key: notebook:NAME is notebooks/NAME, benchmark:NAME is benchmark."""
    kind, _, name = key.partition(":")
    return f"notebooks/{name}" if kind == "notebook" else kind


def print_plan(rows, budget_s, counted=None):
    """The plan, a line a step: its expected seconds, where they come from, when it would end.
    Then, when some step does not fit: the chapters with no box current among them (by the
    boxes of `counted`), and the STEPS of a second call that runs what this one leaves out."""
    print(f"plan: {len(rows)} step(s)" + (f", budget {budget_s:g} s" if budget_s is not None else ", no budget"))
    for number, (key, seconds, source, ends) in enumerate(rows, 1):
        when = f"ends at {ends:7.1f} s" if ends is not None else "not started: over the budget"
        print(f"{number:3}. {key:46} {seconds:7.1f} s  {when}  ({source})")
    started = [row for row in rows if row[3] is not None]
    print(f"{len(started)} of {len(rows)} step(s) within the budget, expected {sum(r[1] for r in started):.1f} s",
          flush=True)
    left_out = [row for row in rows if row[3] is None]
    never = [f"{key.split(':', 1)[1]} ({seconds:.1f} s, {source})" for key, seconds, source, _ in left_out
             if key.startswith("notebook:") and not (counted or {}).get(key.split(":", 1)[1], {}).get("current", 1)]
    if never:
        print(f"No box current and over the budget, so not recorded by this call: {'; '.join(never)}")
    if left_out:
        steps = " ".join(dict.fromkeys(step_of(row[0]) for row in left_out))
        print(f'A second call records what this one leaves out: STEPS="{steps}" (make gpu-check), '
              f"or gpu-check {steps}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", nargs="*", metavar="STEP", help=f"{', '.join(STEPS)} or a notebook (default: all)")
    parser.add_argument("--budget-s", metavar="S",
                        help="start no step that would not end within S seconds of the start; end one that runs over")
    parser.add_argument("--plan", action="store_true",
                        help="print the order and each step's expected seconds, run nothing")
    parser.add_argument("--dry-run", action="store_true",
                        help="the run's bookkeeping, each step taking its expected seconds, none run")
    parser.add_argument("--pack", metavar="FILE", help="also write the folder as a .tar.gz, after every step")
    parser.add_argument("--commit", help="the commit the pages name (default: git's, here)")
    parser.add_argument("--bundle", action="store_true", help="wheels for a GPU machine offline")
    args = parser.parse_args(argv)
    if args.bundle:
        return bundle()
    started = time.monotonic()
    args.budget_s = budget_seconds(args.budget_s)
    counted = rec.box_counts_by_notebook(sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")))
    if args.plan:
        keys = [key for key, _ in commands(args.steps, "SLUG", counted)]
        print_plan(plan(keys, expected_seconds(keys), args.budget_s), args.budget_s, counted)
        return 0
    if args.pack is not None:
        check_pack_target(args.pack)
    machine = this_machine()
    record = bool(machine["gpus"]) and not args.dry_run
    steps = commands(args.steps, machine["slug"], counted)   # a wrong step stops before anything runs
    expected = expected_seconds([key for key, _ in steps])
    print_plan(plan([key for key, _ in steps], expected, args.budget_s), args.budget_s, counted)
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    folder = (rec.RECORDINGS / f"{today}-{machine['slug']}" if record
              else WORK / "dry-run" / f"{today}-{machine['slug']}" if args.dry_run else WORK / "results")
    if not record:
        shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    if not args.dry_run:
        build.stage(build.Edition("en", WORK / "src", None, WORK / "notebook-timings.xml",
                                  ROOT / "notebooks", ROOT / "book"), site=False)
        if (ROOT / "data").is_dir():   # a downloaded CIFAR-10 is used, never fetched again
            (WORK / "src" / "data").symlink_to(ROOT / "data", target_is_directory=True)
    commit, done = args.commit or current_commit(), rec.read_json(folder / STEPS_FILE, [])
    clock = DryClock(started) if args.dry_run else time.monotonic

    def run_one(key, command, limit_s):
        if args.dry_run:
            clock.advance(expected[key][0])
            return {"key": key, "result": "dry run", "seconds": expected[key][0], "limit_s": round(limit_s, 1)}
        if not record and not key.startswith("notebook:"):
            return {"key": key, "result": "skipped: no CUDA"}
        command = [str(part).replace("{out}", str(folder)).replace("{commit}", commit) for part in command]
        entry = {"key": key, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                 "commit": commit, **run_step(command, WORK / "src" if key.startswith("notebook:") else ROOT,
                                              folder / "gpu-check.log", limit_s)}
        if record and key.startswith("notebook:") and entry["result"] == "passed":
            record_notebook(key.split(":", 1)[1], entry, folder, machine)
        return entry

    def written(entry):
        print(f"{entry['key']}: {entry['result']}" + (f" in {entry['seconds']} s" if "seconds" in entry else ""),
              flush=True)
        done.append(entry)
        rec.write_json(folder / STEPS_FILE, done)
        write_readme(folder, machine, commit, done, args.dry_run)
        if args.pack:   # after every step: a machine taken back mid-run still hands over what ended
            pack(folder, args.pack)

    entries = run_steps(steps, expected, args.budget_s, run_one, clock, started, written)
    failed = any(entry["result"] in ("failed", "timeout") for entry in entries)
    left_out = [entry["key"] for entry in entries if entry["result"] == "not started: budget"]
    print(f"{len(done)} step(s) in {folder / STEPS_FILE}" + ("" if record else "; nothing recorded (no CUDA)"
                                                             if not args.dry_run else "; a dry run: nothing ran")
          + (f"; not started within the budget: {', '.join(left_out)}" if left_out else ""), flush=True)
    return 1 if failed else 0


class DryClock:
    """A clock for a dry run: it moves only by the steps' expected seconds."""
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds
