"""Helpers that only the chapters use (the training scripts do not need them).

    from notebooks.chapter_tools import device_table, machine_load, data_notice
    from notebooks.chapter_tools import late_setting_paragraph, load_outcome, distinct_orders
"""
import os

import torch

from ddp_scripts.hardware import cpu_name


def device_table(free_memory=False, uuids=False):
    """What this process can compute on, one row per device: a pandas DataFrame.

    CUDA GPUs first, numbered as this process sees them (CUDA_VISIBLE_DEVICES applies),
    then Apple's MPS if present, then the CPU. `free_memory=True` adds each GPU's free
    memory (torch.cuda.mem_get_info, which starts a CUDA context on every GPU it asks);
    `uuids=True` adds each GPU's UUID, the name that does not change with renumbering.
    """
    import pandas as pd
    columns = ["name", "memory_gib", "compute_capability", "processors"]
    columns += ["free_gib"] if free_memory else []
    columns += ["uuid"] if uuids else []
    rows = []
    for index in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        props = torch.cuda.get_device_properties(index)
        row = {"device": f"cuda:{index}", "name": props.name,
               "memory_gib": round(props.total_memory / 2**30, 1),
               "compute_capability": f"{props.major}.{props.minor}",
               "processors": f"{props.multi_processor_count} SMs"}
        if free_memory:
            row["free_gib"] = round(torch.cuda.mem_get_info(index)[0] / 2**30, 1)
        if uuids:
            uuid = str(getattr(props, "uuid", "?"))  # nvidia-smi writes it GPU-...
            row["uuid"] = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        rows.append(row)
    if hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
        rows.append({"device": "mps", "name": "Apple GPU (Metal)",
                     "processors": "shares the CPU's memory"})
    rows.append({"device": "cpu", "name": cpu_name(), "memory_gib": _ram_gib(),
                 "processors": f"{os.cpu_count()} cores"})
    table = pd.DataFrame(rows).set_index("device").reindex(columns=columns)
    return table.astype(object).where(table.notna(), "-")


def _ram_gib():
    """The machine's memory in GiB, where the system reports it."""
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def machine_load():
    """The condition a timing was taken under, in one line: the 1-minute load average.

    The load average is the number of threads that were running or waiting for a core,
    averaged over the last minute; the measuring process counts too. Above the number of
    usable cores, more work wanted the processor than it has cores, and a CPU time measured
    then is slower than the hardware alone would give.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return f"{cores} usable cores (no load average on this system)"
    busy = (", busy: more work than cores, so CPU times are slower than the hardware alone"
            if load > cores else "")
    return f"load average (1 min) {load:.2f} on {cores} usable cores{busy}"


def data_notice(dataset):
    """A line that cannot be missed when `dataset` is not CIFAR-10 (the synthetic fallback)."""
    if dataset.source == "cifar10":
        return "Data: CIFAR-10."
    rule = "!" * 78
    return "\n".join([
        rule,
        f"!! NOT CIFAR-10: this run uses the {dataset.source} data set.",
        "!! CIFAR-10 could not be downloaded. Every loss and accuracy below is the synthetic",
        "!! set's, not CIFAR-10's. To use CIFAR-10 without a download, put",
        "!! cifar-10-python.tar.gz into the data/ folder and run the cell again.",
        rule])


def show_code(text, language="python"):
    """Code as the page highlights it (a fenced block: Jupyter, Colab and the site all render it),
    not as printed text."""
    from IPython.display import Markdown, display
    fence = "`" * max(3, 1 + max((len(run) for run in text.split() if set(run) == {"`"}), default=0))
    display(Markdown(f"{fence}{language}\n{text.rstrip()}\n{fence}"))


def show_diff(parent, child, parent_name, child_name):
    """The lines child changes from parent (lists of lines), highlighted as a diff; returns the
    diff's lines without its two header lines (what the chapter counts)."""
    import difflib
    diff = list(difflib.unified_diff(parent, child, parent_name, child_name, n=0, lineterm=""))
    show_code("\n".join(diff), "diff")
    return diff[2:]


def torchrun_summary(lines, kept=0):
    """torchrun's report of a failed run, from the lines it printed: (own, box). `own` is the
    number of lines of torchrun's own traceback, which ends in ChildFailedError; `box` the
    summary after it, between its two rules of '=', each rank's traceback cut to its first
    line, `kept` more, and its last line (the error). (0, []) when torchrun printed none."""
    end = next((i for i, line in enumerate(lines)
                if line.startswith("torch.distributed.elastic.multiprocessing.errors."
                                   "ChildFailedError")), None)
    if end is None:
        return 0, []
    start = max(i for i in range(end) if lines[i] == "Traceback (most recent call last):")
    box, frames = [], None      # frames: the lines of the traceback being read, else None
    for line in lines[end + 1:]:
        if frames is not None and line.startswith("    "):
            frames.append(line)
            continue
        if frames is not None:   # the traceback's last line, indented by two
            box += frames[:kept]
            if len(frames) > kept:
                box.append(f"    ... {len(frames) - kept} lines of the rank's traceback left out ...")
            frames = None
        if line.strip():
            box.append(line)
        if "traceback : Traceback (most recent call last):" in line:
            frames = []
        if len(box) > 1 and line.startswith("====="):
            break
    return end + 1 - start, box


def what_a_rank_reported(log_dir, rank, attempt=0):
    """One line: what rank `rank` of torchrun's attempt `attempt` under `log_dir` (its
    --log-dir) wrote in its error file, or that it wrote none."""
    from ddp_scripts.runfiles import read_error_files
    error = next((e for e in read_error_files(log_dir, attempt) if e["rank"] == rank), None)
    if error is None:
        return (f"rank {rank} wrote no error file in attempt {attempt}: torchrun ended it "
                "(SIGTERM) before it met the lost connection")
    why = ("it lost its peer" if error.get("lost_peer")
           else f"exit status {error['exit_code']}")
    return f"rank {rank}'s error file in attempt {attempt} ({why}): {error['reason']}"


# Chapter 8's verdicts: each a function, so that tests/figures/test_figures_ch08.py can feed it
# the flaw it exists to catch.

def late_setting_paragraph(early, late, gpus):
    """What chapter 8's two children saw, one paragraph. Each child hid every GPU
    (CUDA_VISIBLE_DEVICES="") and asked for one CPU thread (OMP_NUM_THREADS=1): `early`
    before it imported torch, `late` after CUDA had started. Each reports {"gpus": what
    device_count() counted, "usable": torch.cuda.is_available(), "threads":
    torch.get_num_threads()}; `gpus` is the number this kernel has."""
    hid = early["gpus"] == 0 and not early["usable"]
    first = ("The first child saw no GPU." if hid else
             f"The first child still saw {early['gpus']} GPU(s) (CUDA usable: "
             f"{early['usable']}).")
    if gpus and late["usable"] and late["gpus"] != gpus:
        return (f"{first} The second counted {late['gpus']} GPU(s), yet CUDA was still "
                f"usable there, with all {gpus} GPU(s) it had found when it started: "
                "device_count() counted through NVML, which read the changed variable, while "
                "the driver had read it once, at the start. The count confirms a change that "
                "did not happen.")
    if gpus and late["usable"]:
        return (f"{first} The second counted {late['gpus']} and found CUDA usable "
                f"({late['usable']}): its setting came too late.")
    if gpus:
        return (f"{first} The second counted {late['gpus']} and found CUDA unusable: its "
                "setting took effect, although CUDA had started before it.")
    if early["threads"] == 1 and late["threads"] != 1:
        threads = ("The thread counts show the trap: asked for before torch started, one "
                   "thread; asked for afterwards, the default.")
    elif early["threads"] == late["threads"]:
        threads = (f"Both children run {late['threads']} thread(s), so the thread counts do "
                   "not show the trap here.")
    else:
        threads = (f"Asked for before torch started, {early['threads']} thread(s); asked for "
                   f"afterwards, {late['threads']}.")
    counted = ("No GPU here, so both children count 0 GPUs and neither finds CUDA usable."
               if hid and late["gpus"] == 0 and not late["usable"] else
               f"{first} The second counted {late['gpus']} (CUDA usable: {late['usable']}).")
    return (f"{counted} {threads} On a GPU machine the second child can still use every GPU, "
            "although device_count() may count none: before the first CUDA tensor this "
            "version of torch counts through NVML, which reads the variable again.")


def load_outcome(child):
    """How a child process that loaded a GPU checkpoint with every GPU hidden ended (a
    CompletedProcess whose program prints torch.cuda.is_available() after the load): the last
    line of its error, or that it loaded the file and whether CUDA was usable there."""
    if child.returncode != 0:
        return (child.stderr.strip().splitlines()
                or [f"exit status {child.returncode}, and nothing on stderr"])[-1]
    usable = (child.stdout.strip().splitlines() or ["(nothing printed)"])[-1]
    return f"no error: the child loaded it; torch.cuda.is_available() there: {usable}"


def distinct_orders(per_epoch):
    """How many different orders a rank's shares over the epochs came in (lists of indices)."""
    return len({tuple(order) for order in per_epoch})


def checkpoint_written(folder):
    """Whether a run left a checkpoint.pt in `folder`, and if it did, its epoch and whether
    every floating-point tensor of its model is finite: one line."""
    from pathlib import Path

    from ddp_scripts.resume import load_checkpoint
    path = Path(folder) / "checkpoint.pt"
    if not path.exists():
        return "checkpoint.pt written: False"
    state = load_checkpoint(path)
    finite = all(bool(tensor.isfinite().all()) for tensor in state["model"].values()
                 if tensor.is_floating_point())
    return (f"checkpoint.pt written: True (epoch {state['epoch']}, every parameter finite: "
            f"{finite})")


def same_training_state(first, second):
    """(every parameter identical, momentum identical) of two checkpoints of the scripts: the
    same names and every tensor equal bit for bit, in the model and in SGD's momentum."""
    from ddp_scripts.out_dir import identical

    def momentum(checkpoint):
        return {index: state["momentum_buffer"]
                for index, state in checkpoint["optimizer"]["state"].items()}
    return (identical(first["model"], second["model"]),
            identical(momentum(first), momentum(second)))
