"""Runs recorded once and replayed: the same command, from the same scripts and inputs, run once.

The book's build executes every chapter twice, once per edition (English and Chinese), and
both editions' chapters launch the same commands. With RUN_RECORDS set to a folder,
`launcher.run_command` (and `launcher.run_main`, for a script's main() run in the notebook's
own process) first looks there for a run of the same command: if one is recorded,
it prints one line saying so, echoes the run's output and puts back the files the run left;
if none is, it runs the command and records it, if it succeeds. A failed run is never
recorded: when and how it fails (a timeout's arrival, say) is what a chapter shows. Nor is
a run that something outside it watches while it goes (WATCHED: a fault injector waiting to
kill one of its ranks): it always runs.

A run is the same when its command line, its extra environment variables, every file of
ddp_scripts/ and every input the command names (a file or folder under the repository, such
as the --out folder of a resumed run) are byte for byte the same. The repository's location,
the rendezvous port and torchrun's --log-dir are not part of it. Without RUN_RECORDS nothing
changes: a reader's notebook always runs what it launches.
"""
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

RECORDS_VARIABLE = "RUN_RECORDS"
SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent   # the repository, or the build's copy of one edition of it
DATA = ROOT / "data"     # CIFAR-10, when it is there: read by the scripts, never changed
ROOT_MARK = "<repository>"
# Options whose values change from run to run without changing the run.
UNCOUNTED_OPTIONS = {"--master-port", "--master_port", "--log-dir", "--log_dir"}
UNCOUNTED_VARIABLES = {"MASTER_PORT", "RDZV_PORT"}   # the latter: slurm_multinode.sbatch's
# The folders of runs that something watches while they go (ddp_scripts/mistakes/faults.py
# adds a folder while its fault injector waits for the run that writes there): a command
# that names one of them is run, never replayed or recorded.
WATCHED = set()


def record_for(command, env):
    """The Record of `command` run with `env` (extra variables), or None when RUN_RECORDS
    is not set."""
    folder = os.environ.get(RECORDS_VARIABLE)
    if not folder or WATCHED & set(absolute_paths(command, env)):
        return None
    key = hashlib.sha256()
    key.update(json.dumps([normalised(command), normalised_env(env)]).encode())
    for path in sorted(SCRIPTS.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            key.update(str(path.relative_to(SCRIPTS)).encode() + path.read_bytes())
    for path in named_paths(command, env):
        key.update(str(path.relative_to(ROOT)).encode())
        for part in sorted([path] if path.is_file() else path.rglob("*")):
            if part.is_file():
                key.update(str(part.relative_to(ROOT)).encode() + part.read_bytes())
    return Record(Path(folder) / key.hexdigest()[:24], command, env)


def normalised(command):
    """The command line without what differs between two copies of the same run."""
    words, skip = [], False
    for word in map(str, command):
        if skip:
            words.append("<any>")
        elif "=" in word and word.split("=", 1)[0] in UNCOUNTED_OPTIONS:
            word = word.split("=", 1)[0] + "=<any>"
        if not skip:
            words.append(word.replace(sys.executable, "<python>").replace(str(ROOT), ROOT_MARK))
        skip = word in UNCOUNTED_OPTIONS
    return words


def normalised_env(env):
    return {name: "<any>" if name in UNCOUNTED_VARIABLES else str(value).replace(str(ROOT), ROOT_MARK)
            for name, value in (env or {}).items()}


def absolute_paths(command, env):
    """Every absolute path the command line or the extra environment names, resolved."""
    words = [str(word).split("=", 1)[-1] for word in command]
    for value in (env or {}).values():
        words += str(value).split(os.pathsep)
    return [Path(word).resolve() for word in words if Path(word).is_absolute()]


def named_paths(command, env):
    """The files and folders under the repository (outside ddp_scripts/) that the command
    line or the extra environment names, and that exist."""
    return sorted({path for path in absolute_paths(command, env) if path.exists()
                   and ROOT in path.parents and not {SCRIPTS, DATA} & {path, *path.parents}})


class Record:
    """One recorded run: RECORDS/<key>/record.json (its output lines and failure) and
    RECORDS/<key>/files/ (the files and folders it named, as it left them)."""

    def __init__(self, folder, command, env):
        self.folder, self.command, self.env = folder, command, env

    def exists(self):
        return (self.folder / "record.json").exists()

    def replay(self, echo):
        """Echo the recorded lines, put back the recorded files, and return the lines."""
        record = json.loads((self.folder / "record.json").read_text())
        print("(the same command, from the same scripts and inputs, ran earlier in this build "
              "of the book: its output and files are shown again, not run twice)", flush=True)
        for relative in record["paths"]:
            saved, target = self.folder / "files" / relative, ROOT / relative
            if target.is_dir():
                shutil.rmtree(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if saved.is_dir() else shutil.copy2)(saved, target)
        lines = [line.replace(ROOT_MARK, str(ROOT)) for line in record["lines"]]
        for line in lines:
            echo(line)
        return lines

    def save(self, lines):
        """Record a run that succeeded: its lines, and the files and folders it named.
        Written whole or not at all; a run recorded already is kept."""
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".recording-", dir=self.folder.parent))
        paths = [path.relative_to(ROOT) for path in named_paths(self.command, self.env)]
        for relative in paths:
            source, saved = ROOT / relative, staging / "files" / relative
            saved.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if source.is_dir() else shutil.copy2)(source, saved)
        record = {"lines": [line.replace(str(ROOT), ROOT_MARK) for line in lines],
                  "paths": [str(path) for path in paths]}
        (staging / "record.json").write_text(json.dumps(record))
        try:
            staging.rename(self.folder)
        except OSError:   # recorded meanwhile by another build lane: keep that one
            shutil.rmtree(staging, ignore_errors=True)
