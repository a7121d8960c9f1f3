"""The fit command's answer for each rank: the rules' prediction beside torch's tracker.

    answer = fit(model, units, setup, track=True)   # {"ranks": [...], "notes": [...]}
"""
import re

import torch

from ddp_scripts.cli import UsageError, first_line
from ddp_scripts.fit import rules, trace
from ddp_scripts.fit import track as tracking

# How far the rules may be from torch's tracker, as a share of the tracker's peak. The rules
# count whole segments (a unit, the stem, the head) and the largest tensor each one saves;
# the tracker counts every tensor as the step makes it. Inside a unit's backward an op's
# scratch tensors come and go, which the rules stand in for by the gradients flowing in and
# out and the largest saved tensor: on the test's models that is within 12% either way.
TOLERANCE = 0.12
# The tracker's categories, sorted into the rules' kinds.
TRACKER_KINDS = {
    "Parameter": "parameters", "Buffer": "parameters", "Sharded Param": "parameters",
    "Unsharded Param": "parameters", "Gradient": "gradients", "Sharded Grad": "gradients",
    "Unsharded Grad": "gradients", "Optstate": "optimizer state", "OptState": "optimizer state",
    "Activation": "activations", "Inputs": "activations", "Other": "activations",
    "Temp": "temporaries", "All Gather": "communication buffers",
    "Reduce Scatter": "communication buffers",
}
# Cards by the memory they are sold with (HBM and GDDR come in GiB); a run gets a little
# less (the CUDA context, the allocator's slack).
GPUS = {"T4": 16, "V100": 32, "A100-40GB": 40, "A100": 80, "L4": 24, "RTX4090": 24,
        "TITANXp": 12, "H100": 80, "H200": 141}
UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def memory_size(text):
    """Bytes of "80GB", "79.6GiB", "16e9B" or a card's name (GPUS): a size needs its unit
    (a bare 80 would be 80 bytes)."""
    names = {name.lower(): size for name, size in GPUS.items()}
    if text.lower() in names:
        return names[text.lower()] * 2**30
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([a-zA-Z]+)\s*", text)
    if not match or match.group(2).upper() not in UNITS or float(match.group(1)) <= 0:
        raise UsageError(f"--gpu-memory {text!r}: give a size such as 80GB or 24GiB, or a card: "
                         + ", ".join(GPUS))
    return int(float(match.group(1)) * UNITS[match.group(2).upper()])


def by_kind(categories):
    kinds = dict.fromkeys(rules.KINDS, 0)
    for category, value in categories.items():
        kinds[TRACKER_KINDS.get(category, "temporaries")] += value
    return kinds


def alike(rows):
    """Groups of ranks whose predictions are the same, each as its first rank and the rest."""
    groups = {}
    for row in rows:
        key = (row["peak"], tuple(row["by_kind"].values()))
        groups.setdefault(key, []).append(row["rank"])
    return list(groups.values())


def fit(model, units, setup, track=True, gpu_memory=None):
    """{"setup", "units", "notes", "ranks": [per rank: rank, predicted_peak_bytes, peak_point,
    by_kind, tracker_peak_bytes, tracker_point, tracker_by_kind, gap, agrees, differs, fits]}."""
    strategy, ranks = setup["strategy"], setup["ranks"]
    if strategy == "single" and ranks != 1:
        raise UsageError(f"--strategy single runs one process: leave out --ranks {ranks}, or "
                         "choose ddp or fsdp")
    if strategy != "single" and ranks < 2:
        raise UsageError(f"--strategy {strategy} needs --ranks 2 or more (it was {ranks})")
    scalars = [name for name, p in model.named_parameters() if p.dim() == 0]
    if strategy.startswith("fsdp") and scalars:
        raise UsageError(f"FSDP's fully_shard does not shard a parameter with no dimensions "
                         f"({scalars[0]}): make it of shape (1,)")
    summary = trace.summarize(model, units, setup["input_shape"], setup["input_dtype"],
                              setup["batch"], setup["precision"])
    predicted = rules.predict(summary, setup)
    notes = []
    if strategy == "ddp" and track:
        notes.append("DDP's Reducer cannot run under FakeTensorMode: the tracker ran one "
                     "process on the rank's batch, and the rules' buckets were added to it")
    rows = []
    tracked = {}
    for group in alike(predicted):
        first = group[0]
        if track:
            try:
                tracked[first] = tracking.tracked_peak(
                    model, units, dict(setup, strategy="single" if strategy == "ddp" else strategy),
                    rank=first)
            except (UsageError, KeyboardInterrupt):
                raise
            except Exception as error:   # fully_shard refusing a scalar parameter, say
                raise UsageError(f"torch's tracker cannot run this set-up: {first_line(error)} "
                                 "(--no-tracker gives the rules' answer alone)") from None
        for rank in group:
            tracked[rank] = tracked.get(first)
    if any(found and found["one_at_a_time"] for found in tracked.values()):
        notes.append(f"torch {torch.__version__}'s tracker counts an optimizer step on shards, "
                     "taken all at once, at more than it holds: it tracked the step one tensor "
                     "at a time")
    for row in predicted:
        entry = {"rank": row["rank"], "predicted_peak_bytes": row["peak"],
                 "peak_point": row["at"], "by_kind": row["by_kind"],
                 "alike": next(g for g in alike(predicted) if row["rank"] in g)}
        found = tracked.get(row["rank"])
        if found:
            kinds = by_kind(found["categories"])
            peak = found["peak"]
            if strategy == "ddp":
                buckets = row["by_kind"]["communication buffers"]
                peak += buckets
                kinds["communication buffers"] += buckets
            gap = row["peak"] - peak
            agrees = abs(gap) <= TOLERANCE * peak
            entry.update(tracker_peak_bytes=peak, tracker_point=found["at"],
                         tracker_by_kind=kinds, gap_bytes=gap, agrees=agrees,
                         differs=None if agrees else max(
                             rules.KINDS, key=lambda k: abs(row["by_kind"][k] - kinds[k])))
        if gpu_memory:
            entry["fits"] = row["peak"] <= gpu_memory
        rows.append(entry)
    return {"setup": {k: (str(v).removeprefix("torch.") if k == "input_dtype" else v)
                      for k, v in setup.items()},
            "units": [trace_name(model, u) for u in units], "notes": notes,
            "tolerance": TOLERANCE, "gpu_memory_bytes": gpu_memory, "ranks": rows}


def trace_name(model, unit):
    return next(name for name, m in model.named_modules() if m is unit)
