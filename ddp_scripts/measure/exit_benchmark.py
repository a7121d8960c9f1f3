"""How often a training script ends, run after run, under one Python environment's torch.

    python -m ddp_scripts.measure.exit_benchmark --python /path/to/venv/bin/python \
        --runs 10 --out results/exit-benchmark.jsonl [--script train_ddp.py] [--source DIR]

Each run is `torchrun --standalone --nproc-per-node 2 SCRIPT` on a small synthetic set, one
epoch, on the CPU. A run that has not ended within --limit-s seconds is counted as hung and
its whole process group is killed with SIGKILL, the one signal a hung rank cannot miss
(chapter 8). One JSON line per call is appended to --out: the torch of that environment, the
script, the source folder's commit, whether its script frees the model before it leaves the
process group, how many runs ended (and with which exit status) and how many hung, and the
machine's load before and after. A count, not a time: the limit only needs to be far above a run's
length (about 10 s here).
"""
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

from ddp_scripts.cli import UsageError, run_cli
from ddp_scripts.hardware import usable_cores
from ddp_scripts.options import ArgumentParser, count, seconds

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", required=True, help="the interpreter whose torch is measured")
    p.add_argument("--script", default="train_ddp.py", help="a script of ddp_scripts/")
    p.add_argument("--source", type=Path, default=ROOT, help="the checkout whose scripts run")
    p.add_argument("--runs", type=count, default=10)
    p.add_argument("--limit-s", type=seconds, default=60)
    p.add_argument("--out", type=Path, required=True, help="a .jsonl file; one line is added")
    return p.parse_args(argv)


def one_run(args, out):
    """The run's exit status if it ended by itself, None if it was killed."""
    command = [args.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(args.source / "ddp_scripts" / args.script), "--dataset", "synthetic",
               "--train-samples", "256", "--test-samples", "128", "--epochs", "1", "--out", out]
    with open(Path(out).with_suffix(".log"), "w") as log:
        run = subprocess.Popen(command, cwd=args.source, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
        try:
            return run.wait(args.limit_s)
        except subprocess.TimeoutExpired:
            return None
        finally:
            end_all(run)


def end_all(run):
    """SIGKILL to torchrun and every process under it: torchrun starts each rank in a session
    of its own, which a signal to torchrun's process group would miss."""
    try:
        family = [psutil.Process(run.pid), *psutil.Process(run.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for process in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGKILL)
    run.wait()
    psutil.wait_procs(family, timeout=30)


def main(argv=None):
    args = parse_args(argv)
    if Path(args.script).name != args.script or not args.script.endswith(".py") \
            or not (args.source / "ddp_scripts" / args.script).is_file():
        raise UsageError(f"--script {args.script}: not a script of {args.source / 'ddp_scripts'}")
    try:
        versions = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"],
                                  capture_output=True, text=True)
    except OSError:
        versions = None
    if versions is None or versions.returncode != 0 or not re.match(r"\d+\.\d+", versions.stdout):
        raise UsageError(f"--python {args.python}: cannot import torch")
    try:  # before the runs, so that a folder it cannot write to costs none of them
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a"):
            pass
    except OSError as error:
        raise UsageError(f"--out {args.out}: cannot write to it ({error.strerror})") from None
    commit = subprocess.run(["git", "-C", str(args.source), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or None
    load_before, statuses = os.getloadavg(), []
    with tempfile.TemporaryDirectory(prefix="exit-benchmark-") as scratch:
        for run in range(1, args.runs + 1):
            statuses.append(one_run(args, str(Path(scratch) / f"run{run}")))
            print(f"run {run}: exit status {statuses[-1]} (None: hung, killed)", flush=True)
    ended = sum(status is not None for status in statuses)
    source = (args.source / "ddp_scripts" / args.script).read_text()
    record = {"torch": versions.stdout.strip(), "script": args.script, "commit": commit,
              "frees_model_first": "leave_process_group()" in source,  # ranks.py says why
              "runs": args.runs, "ended": ended, "hung": args.runs - ended,
              "ended_with_status_0": statuses.count(0), "exit_statuses": statuses,
              "limit_s": args.limit_s, "usable_cores": usable_cores(),
              "load_before": [round(x, 2) for x in load_before],
              "load_after": [round(x, 2) for x in os.getloadavg()], "platform": sys.platform}
    with open(args.out, "a") as out:
        out.write(json.dumps(record) + "\n")
    print(json.dumps(record))


if __name__ == "__main__":
    run_cli(main)
