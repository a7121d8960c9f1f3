"""`make gpu-check`: run the book on a GPU machine within a budget, recording what the GPUs print.

    python -m book.tools gpu-check [--budget S] [--dry-run] [--only NOTEBOOK ...] [--out DIR] [--pack FILE] [--bundle]

Steps, in order of value: notebooks with stale or unrecorded `gpu-output` cells, `pytest -m gpu tests`,
ddp_scripts/measure/gpu_micro.py, the full-size benchmarks, the other notebooks; those whose estimate fits run,
one at a time, into results/gpu-runs/<date>-<hardware>/ (with CUDA), and the next call continues.
"""
import argparse
import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from book.tools import ToolError, build, gpu_recordings as rec
from book.tools.notebooks import read_notebook
from ddp_scripts.measure.hardware import describe_hardware

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "_build" / "gpu-check"
STATE_FILE = "state.json"
START_UP_S, CLOSE_S = 45, 20   # staging the copy and importing torch; writing the recording
# A step this hardware never timed: about what the H200 took (its notebooks 7 to 112 s).
ASSUMED_S = {"notebook": 90, "tests": 300, "micro": 180, "benchmark": 270}
# ResNet-18 below full size: three repeats with the tuned rows would outlast a call's budget.
BENCHMARKS = {"full": ["--model", "cnn", "--tuned"], "resnet18": ["--model", "resnet18", "--configs", "gpu,dp,ddp",
              "--tuned", "--train-samples", "20480", "--test-samples", "2048", "--epochs", "3"]}
FILES = """Files: `run.json` labels every page box; `cells.json` holds each `gpu-output` cell's code hash and
outputs; `conditions.json` each notebook's load before and after; `state.json` the calls; `gpu-check.log`
every command's output; `*-full.json`, `*-resnet18.json`, `micro.*` the benchmarks and gpu_micro.py."""
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
    """HEAD's short commit, '-modified' when the notebooks or scripts differ from it."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    changed = subprocess.run(["git", "status", "--porcelain", "--", "notebooks", "ddp_scripts"],
                             cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return commit + ("-modified" if changed else "")


def candidate_steps(hardware, recordings):
    """Every step in order of value, estimated from what this hardware measured, else ASSUMED_S."""
    measured, mine = {}, [r for r in recordings if r[1]["hardware"] == hardware["label"]]
    for folder, _, _ in sorted(mine, key=lambda r: r[0].name):
        for key, done in rec.read_json(folder / STATE_FILE, {"done": {}})["done"].items():
            measured[key] = (done["seconds"], f"measured in {folder.name}")
    recordings = mine or recordings   # stale: against this hardware's recordings, else the pages'.
    names = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9]*.ipynb"))
    stale = {}   # a gpu-output cell of the notebook's page is stale or not recorded
    for name in names:
        notebook = read_notebook(ROOT / "notebooks" / name)
        stale[name] = bool(rec.annotate(notebook, name, recordings) if recordings else rec.gpu_cells(notebook))
    python, steps = sys.executable, []

    def add(key, kind, title, command):
        seconds, source = measured.get(key, (ASSUMED_S[kind], "assumed"))
        steps.append({"key": key, "kind": kind, "title": title, "command": command,
                      "estimate_s": seconds, "estimate_from": source})

    def add_notebook(name):
        add(f"notebook:{name}", "notebook", f"{name} ({'to record' if stale[name] else 'to validate'})",
            build.nbmake_command(WORK / "src", [WORK / "src" / "notebooks" / name], WORK / "notebook-timings.xml"))

    for name in names:
        if stale[name]:
            add_notebook(name)
    add("tests", "tests", "pytest -m gpu tests",
        [python, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-o", "addopts=", "-rs", "tests"])
    add("micro", "micro", "ddp_scripts/measure/gpu_micro.py",
        [python, "-m", "ddp_scripts.measure.gpu_micro", "--out", "{out}", "--commit", "{commit}"])
    for name, options in BENCHMARKS.items():
        add(f"benchmark:{name}", "benchmark", "benchmark.py --size full " + " ".join(options),
            [python, "ddp_scripts/measure/benchmark.py", "--size", "full", *options, "--overwrite",
             "--dataset", "synthetic", "--out", f"{{out}}/{hardware['slug']}-{name}.json"])
    for name in names:
        if not stale[name]:
            add_notebook(name)
    return steps


def fit(steps, budget_s, done=()):
    """(planned, left): in order, each step not done whose estimate fits what the budget leaves."""
    room = float("inf") if budget_s is None else budget_s - START_UP_S - CLOSE_S
    planned, left = [], []
    for step in (step for step in steps if step["key"] not in done):
        if step["estimate_s"] <= room:
            planned.append(step)
            room -= step["estimate_s"]
        else:
            left.append(dict(step, too_long=budget_s - START_UP_S - CLOSE_S < step["estimate_s"]))
    return planned, left


def run_command(command, cwd, timeout_s, log):
    """(result, exit status, seconds). Out of time or interrupted, its process group (nbmake, torchrun
    and its workers) is killed; a notebook's kernel, in a session of its own, ends with nbmake."""
    print("+", " ".join(command), flush=True)
    start = time.perf_counter()
    with open(log, "a", encoding="utf-8") as out:
        print("+", " ".join(command), file=out, flush=True)
        process = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            status = process.wait(timeout=timeout_s)
        except BaseException as stopped:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            if not isinstance(stopped, subprocess.TimeoutExpired):
                raise
            return "timeout", None, time.perf_counter() - start
    return ("passed" if status == 0 else "failed"), status, time.perf_counter() - start


def run(planned, hardware, folder, record, commit, budget_s, clock=time.monotonic,
        execute=run_command, started=None):
    """Run the planned steps while the budget (from `started`) lasts, writing each down as it ends."""
    started = clock() if started is None else started
    folder.mkdir(parents=True, exist_ok=True)
    state = rec.read_json(folder / STATE_FILE, {"done": {}, "calls": []})
    call = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "commit": commit, "budget_s": budget_s, "ran": [], "left": []}
    state["calls"].append(call)
    for step in planned:
        # No step outruns the room fit() plans with (its time must fit the next plan), nor 4 hours.
        left = 4 * 3600 if budget_s is None else min(budget_s - CLOSE_S - (clock() - started),
                                                     budget_s - START_UP_S - CLOSE_S)
        if step["kind"] != "notebook" and not hardware["gpus"]:
            call["ran"].append({"key": step["key"], "result": "skipped: no CUDA"})
            continue
        if step["estimate_s"] > left:
            call["left"].append({"key": step["key"], "why": "no time left for its estimate"})
            continue
        command = [str(part).replace("{out}", str(folder)).replace("{commit}", commit)
                   for part in step["command"]]
        before = [round(load, 2) for load in os.getloadavg()]   # 1, 5 and 15 minutes
        result, status, seconds = execute(command, WORK / "src" if step["kind"] == "notebook"
                                          else ROOT, left, folder / "gpu-check.log")
        if result == "timeout":
            call["left"].append({"key": step["key"], "why": f"stopped after {seconds:.0f} s: out of budget"})
            continue
        entry = {"key": step["key"], "result": result, "exit_status": status,
                 "seconds": round(seconds, 1), "load_average_before": before,
                 "load_average_after": [round(load, 2) for load in os.getloadavg()], "commit": commit}
        call["ran"].append(entry)
        if result == "passed":
            state["done"][step["key"]] = entry
        if result == "passed" and record and step["kind"] == "notebook":
            record_notebook(step["key"].split(":", 1)[1], entry, folder, hardware, state["calls"][0]["date"][:10])
        rec.write_json(folder / STATE_FILE, state)
    return state


def record_notebook(name, entry, folder, hardware, first_day):
    """The notebook's gpu-output cells as they ran, how it ran, and the label of every page box."""
    cells = rec.read_json(folder / rec.CELLS_FILE, {})
    cells[name] = rec.record(WORK / "src" / "notebooks" / name, ROOT / "notebooks" / name)
    rec.write_json(folder / rec.CELLS_FILE, dict(sorted(cells.items())))
    conditions = rec.read_json(folder / rec.CONDITIONS_FILE, {
        "concurrent_notebooks": 1, "cores": hardware["cores"], "notebooks": {}})
    conditions["notebooks"][name] = {key: entry[key] for key in (
        "load_average_before", "load_average_after", "seconds", "commit")}
    rec.write_json(folder / rec.CONDITIONS_FILE, conditions)
    commits = dict.fromkeys(notebook["commit"] for notebook in conditions["notebooks"].values())
    rec.write_json(folder / rec.RUN_FILE, {"hardware": hardware["label"], "gpus": len(hardware["gpus"]),
                                           "date": first_day, "commit": ", ".join(commits)})


def output_folder(hardware, record, out=None):
    """--out, _build/gpu-check if nothing is recorded, this hardware's unfinished recording, or a new one."""
    if out or not record:
        return Path(out).resolve() if out else WORK
    unfinished = [folder for folder in sorted(rec.RECORDINGS.glob(f"*-{hardware['slug']}"))
                  if not rec.read_json(folder / STATE_FILE, {"complete": True}).get("complete")]
    date = dt.datetime.now(dt.timezone.utc).date().isoformat()
    return unfinished[-1] if unfinished else rec.RECORDINGS / f"{date}-{hardware['slug']}"


def describe(step):
    too_long = "; longer than this budget allows: give it a larger --budget" if step.get("too_long") else ""
    return f"- {step['title']}: about {step['estimate_s']:.0f} s ({step['estimate_from']}){too_long}"


def summary(hardware, state, left, record):
    """The folder's README.md: the calls, the steps done with their load, what is left, the files."""
    cores = hardware["cores"]
    lines = [f"# gpu-check on {hardware['label']}", "", "Written by `book/tools/gpu_check.py`, nothing by hand: "
             "each call ran what fitted in its budget, one notebook at a time, each result written as it ended.", "",
             "| call (UTC) | commit | budget (s) | ran | left |", "| --- | --- | ---: | --- | --- |"]
    for call in state["calls"]:
        ran = ", ".join(f"{r['key']} {r['result']}" for r in call["ran"]) or "none"
        gone = ", ".join(r["key"] for r in call["left"]) or "none"
        lines.append(f"| {call['date']} | {call['commit']} | {call['budget_s'] or 'none'} | {ran} | {gone} |")
    lines += ["", "| step done | seconds | load average (1 min) before → after | machine |",
              "| --- | ---: | --- | --- |"]
    for key, entry in sorted(state["done"].items()):
        before, after = entry["load_average_before"][0], entry["load_average_after"][0]
        machine = "busy" if before >= cores / 2 else "idle"   # chapter 7's rule
        lines.append(f"| {key} | {entry['seconds']} | {before} → {after} on {cores} cores | {machine} |")
    lines += ["", "Left for the next call:", *map(describe, left)] if left else ["", "Complete."]
    return "\n".join([*lines, "", FILES if record else "Nothing recorded (no CUDA, or --only).", ""])


def bundle(budget_s, python="python3"):
    """.gpu-wheels/ for a GPU machine without a package index, and the line that runs the check there."""
    wheels = ROOT / ".gpu-wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    command = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
               "--python-version", "3.12", "--implementation", "cp",
               *[f"--platform={p}" for p in PLATFORMS], "-d", str(wheels), *BUNDLE]
    print("+", " ".join(command), flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"error: pip download failed (it needs a package index): {done.stderr[-500:]}", file=sys.stderr)
        return 1
    for wheel in wheels.glob("*.whl"):
        if wheel.name.split("-")[0].lower().replace("_", "-") in ON_GPU_IMAGE:
            wheel.unlink()
    print(f"{len(list(wheels.glob('*.whl')))} wheels in .gpu-wheels/. On the GPU machine, from "
          "the repository's root with .gpu-wheels/ beside it:")
    print(f"{python} -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
          f"--target /tmp/site .gpu-wheels/*.whl && PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 {python} "
          f"-m book.tools gpu-check --budget {budget_s:.0f} --pack \"${{OUT:-_build}}/gpu-check.tgz\"")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, metavar="SECONDS", help="seconds; the next call continues")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    parser.add_argument("--only", nargs="+", metavar="NOTEBOOK", help="these alone, no recording")
    parser.add_argument("--out", help="the folder (default: this hardware's unfinished one)")
    parser.add_argument("--pack", metavar="FILE", help="also write the folder as a .tar.gz")
    parser.add_argument("--bundle", action="store_true", help="wheels for a GPU machine offline")
    args, started = parser.parse_args(argv), time.monotonic()
    if args.budget is not None and args.budget <= START_UP_S + CLOSE_S:
        raise ToolError(f"--budget must be more than {START_UP_S + CLOSE_S} s")
    for name in args.only or []:
        if not name.endswith(".ipynb") or not (ROOT / name).is_file():
            raise ToolError(f"no such notebook: {name}")
    if args.bundle:
        return bundle(args.budget or 540)
    hardware = this_machine()
    record = bool(hardware["gpus"]) and not args.only
    folder = output_folder(hardware, record, args.out)
    if not record:   # a check that records nothing starts afresh every time
        (folder / STATE_FILE).unlink(missing_ok=True)
    steps = candidate_steps(hardware, rec.load_recordings())
    if args.only:
        steps = [step for step in steps if step["key"] in {f"notebook:{Path(n).name}" for n in args.only}]
    done = rec.read_json(folder / STATE_FILE, {"done": {}})["done"]
    planned, left = fit(steps, args.budget, done)
    if args.dry_run:
        room = f" of the {args.budget - START_UP_S - CLOSE_S:.0f} s the budget leaves" if args.budget else ""
        where = folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder
        no_gpu = "" if hardware["gpus"] else "; no CUDA GPU here: the GPU steps are skipped and nothing is recorded"
        print(f"gpu-check on {hardware['label']}, commit {current_commit()}, into {where}/; {len(done)} step(s) "
              f"done already{no_gpu}.")
        print("Would run, in this order:", *map(describe, planned), f"Planned: {len(planned)} step(s), "
              f"about {sum(s['estimate_s'] for s in planned):.0f} s{room}.", "Left for the next call:",
              *map(describe, left), sep="\n")
        return 0
    build.stage(build.Edition("en", WORK / "src", None, WORK / "notebook-timings.xml",
                              ROOT / "notebooks", ROOT / "book"), site=False)
    if (ROOT / "data").is_dir():   # a downloaded CIFAR-10 is used, never fetched again
        (WORK / "src" / "data").symlink_to(ROOT / "data", target_is_directory=True)
    state = run(planned, hardware, folder, record, current_commit(), args.budget, started=started)
    state["calls"][-1]["left"] += [{"key": s["key"], "why": "did not fit in the budget"} for s in left]
    failed = any(r["result"] == "failed" for r in state["calls"][-1]["ran"])
    remaining = [step for step in steps if step["key"] not in state["done"]]
    state["complete"] = not remaining and not failed
    rec.write_json(folder / STATE_FILE, state)
    readme = summary(hardware, state, remaining, record)
    (folder / "README.md").write_text(readme, encoding="utf-8")
    print(readme)
    if args.pack:
        Path(args.pack).parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(args.pack, "w:gz") as archive:
            archive.add(folder, arcname=f"results/gpu-runs/{folder.name}")
    return 1 if failed else 0
