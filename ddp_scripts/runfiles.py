"""What a run leaves behind, named once: the files in --out, and a failed rank's error file,
which this module writes and reads.

out_dir.py and fsdp_out_dir.py write the files in --out; the launcher, the benchmark, the
notebooks and the tests read the metrics with this module. Nothing here imports torch, so the
launcher stays quick to import.

    OUT/metrics.jsonl   one JSON object per finished epoch (the last line may be cut short
                        by a crash: readers skip it; a resume names it, see resume.py)
    OUT/checkpoint.pt   model, optimizer and epoch, written atomically after each epoch
                        (train_fsdp.py: the whole model gathered once, when the run ends)
    OUT/checkpoint.dcp/ train_fsdp.py's sharded checkpoint (torch.distributed.checkpoint),
                        every rank's shards, replaced whole after each epoch
    OUT/run.json        the run's summary, written once it has finished

A rank that fails writes a JSON error file where torchrun's agent tells it to
(TORCHELASTIC_ERROR_FILE, in the folder given by torchrun's --log-dir): the format of
torch.distributed.elastic's `record`, which torchrun reads, plus the rank, the exit status
and whether it stopped because another rank ended first.
"""
import json
import math
import os
import time
import traceback
from pathlib import Path

METRICS, CHECKPOINT, SUMMARY = "metrics.jsonl", "checkpoint.pt", "run.json"
SHARDED_CHECKPOINT = "checkpoint.dcp"
ERROR_FILE_VARIABLE = "TORCHELASTIC_ERROR_FILE"
ERROR_FILE_NAME = "error.json"


def metrics_lines(out):
    """OUT/metrics.jsonl line by line: (line number, row, why), where row is the line's dict
    and why None, or row is None for a line that is not one epoch's whole record (cut short by
    a crash, bytes that are not UTF-8, an epoch that is not a whole number) and why says what
    is wrong. Blank lines, and a byte-order mark that an editor may add, are passed over."""
    try:
        data = (Path(out) / METRICS).read_bytes()
    except FileNotFoundError:
        return []
    lines = []
    for number, raw in enumerate(data.removeprefix(b"\xef\xbb\xbf").splitlines(), start=1):
        if not raw.strip():  # a blank line (an editor's last newline, say): nothing logged
            continue
        try:
            row, why = json.loads(raw.decode()), None
        except ValueError as error:  # UnicodeDecodeError is one
            row, why = None, ("not UTF-8 text" if isinstance(error, UnicodeDecodeError)
                              else "not whole JSON: cut short, or not a metrics line")
        else:
            epoch = row.get("epoch") if isinstance(row, dict) else None
            if type(epoch) is not int or epoch < 1:
                row, why = None, f"its epoch is {epoch!r}, not a whole number from 1"
        lines.append((number, row, why))
    return lines


def metrics_rows(out, strict=False):
    """OUT/metrics.jsonl as a list of dicts, one per logged epoch ([] before the first).

    A line that is not one epoch's whole record (metrics_lines) is skipped, or with
    `strict=True` raises ValueError naming it: a finished run never has one.
    """
    lines = metrics_lines(out)
    for number, row, why in lines:
        if row is None and strict:
            raise ValueError(f"{Path(out) / METRICS}, line {number}: {why}")
    return [row for _, row, _ in lines if row is not None]


def holds_a_run(out):
    """Whether OUT holds a run: a checkpoint, a summary, or a log with at least one line that
    is not blank (a run stopped in its first epoch leaves an empty log, and nothing trained)."""
    out = Path(out)
    metrics = out / METRICS
    return (any((out / name).exists() for name in (CHECKPOINT, SHARDED_CHECKPOINT, SUMMARY))
            or (metrics.exists() and (not metrics.is_file() or bool(metrics_lines(out)))))


def logged_epochs(out):
    """The epochs in OUT/metrics.jsonl so far."""
    return [row["epoch"] for row in metrics_rows(out)]


def write_error_file(error, exit_code, rank=None, with_stack=True, lost_peer=False):
    """Record why this process fails, for torchrun and the launcher. No-op outside torchrun
    (and outside the launcher, which sets the variable for a single process too).
    `with_stack=False`: an error said in one line, whose traceback would say nothing more; the
    line then stands in the traceback's place, which torchrun's summary shows.
    `lost_peer=True`: this rank stops because another rank ended first (mishaps.peer_lost).
    torchrun names as the cause the failure with the earliest time, in whole seconds, ties
    going to the rank it saw end first; it times a rank killed by a signal, which writes no
    file, when it notices the death, a poll later. So a rank that lost its peer rounds its
    time up, not down, to sort after the rank it lost.
    A log folder that cannot be written loses the file, not the error's line or exit status."""
    path = os.environ.get(ERROR_FILE_VARIABLE)
    if not path:
        return
    said = f"{type(error).__name__}: {error}"
    stack = "".join(traceback.format_exception(error)) if with_stack else said
    now = time.time()
    data = {"message": {"message": said,
                        "extraInfo": {"py_callstack": stack,
                                      "timestamp": str(math.ceil(now) if lost_peer else int(now))}},
            "reason": str(error), "rank": rank, "exit_code": exit_code, "time": now,
            "lost_peer": lost_peer}
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:
        pass  # the error's own line is out already; torchrun then reports the exit status


def _last_attempt(log_dir, number=None):
    """torchrun's folder for its last attempt under `log_dir` (or for attempt `number`, the
    first being 0), or None: one subfolder per local rank, made by torchrun before the rank
    starts."""
    attempts = sorted(Path(log_dir).glob("*/attempt_*"),
                      key=lambda p: (p.parent.stat().st_mtime, int(p.name.split("_")[1])))
    if number is not None:
        attempts = [p for p in attempts if p.name == f"attempt_{number}"]
    return attempts[-1] if attempts else None


def ranks_without_error_file(log_dir):
    """The local ranks of torchrun's last attempt under `log_dir` whose folder holds no error
    file: killed by a signal, or ended by torchrun once another rank had failed."""
    attempt = _last_attempt(log_dir)
    if attempt is None:
        return []
    return sorted(int(p.name) for p in attempt.iterdir()
                  if p.name.isdigit() and not (p / ERROR_FILE_NAME).exists())


def read_error_files(log_dir, attempt=None):
    """The error files of a failed run under `log_dir`, earliest failure first.

    torchrun's workers write `<log_dir>/<run>/attempt_<n>/<local rank>/error.json` (the
    last attempt counts, or attempt `attempt`: a run torchrun restarted failed in an earlier
    one). `<log_dir>/error.json` is a single process's, or torchrun's own: its own failure (a
    rendezvous that timed out), or a copy of its first failed worker's.
    """
    folder = _last_attempt(log_dir, attempt)
    files = list(folder.glob(f"*/{ERROR_FILE_NAME}")) if folder else []
    if not files and attempt is None:
        files = list(Path(log_dir).glob(ERROR_FILE_NAME))
    errors = []
    for path in files:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a rank killed while writing it
        data.setdefault("rank", None)
        if data["rank"] is None and path.parent.name.isdigit():
            data["rank"] = int(path.parent.name)  # written by torch's own `record`
        message = data.get("message", {})
        data.setdefault("reason", message.get("message", "") if isinstance(message, dict)
                        else str(message))
        data.setdefault("exit_code", 1)  # an exception that Python reports: exit status 1
        data.setdefault("time", float(message.get("extraInfo", {}).get("timestamp", 0))
                        if isinstance(message, dict) else 0.0)
        errors.append(data)
    return sorted(errors, key=lambda e: (e["time"], e["rank"] if e["rank"] is not None else 0))
