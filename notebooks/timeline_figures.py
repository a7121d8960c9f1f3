"""Figures of chapters 8 and 10, drawn from what their runs recorded, and chapter 10's verdicts.

    from notebooks.timeline_figures import draw_hang, draw_padding, draw_step, draw_micro

Each `draw_*` takes a run's data (files the ranks wrote, a sampler, profiler events, a results
file) and draws it with notebooks.figures; it returns what it drew, for a test to compare with
the data. The `*_rows` functions turn the data into the rows the figure shows. The `*_line`
functions and `grads_in_buckets` decide what chapter 10 prints under its tables.
"""
import json
from pathlib import Path

import pandas as pd

from notebooks.figures import colour, stacked_bars, tensor_grid, timeline


# Chapter 8: a hang, as the ranks recorded it -----------------------------------------------

def hang_events(folder):
    """{rank: [record, ...]} from the rank<N>.jsonl files that
    ddp_scripts/mistakes/rank_dependent_collective.py --events FOLDER wrote."""
    events = {}
    for path in sorted(Path(folder).glob("rank*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        events[records[0]["rank"]] = records
    return dict(sorted(events.items()))


def hang_rows(events):
    """The timeline's rows, in seconds from the first rank's joining the group.

    Returns (rows, ends, timeout_s): rows {"rank N": [(start, end, kind)]} with kind
    "waits in <collective>" (from its arrival to its exit or error); ends {"rank N": (time,
    "left" | "failed" | "no record")} for each rank's last collective: a rank with no record
    after its arrival ran until the last record of any rank (torchrun stopped it then).
    """
    origin = min(r["time_s"] for records in events.values() for r in records)
    last = max(r["time_s"] for records in events.values() for r in records) - origin
    rows, ends, timeout_s = {}, {}, None
    for rank, records in events.items():
        label, arrived = f"rank {rank}", None
        rows[label] = []
        for record in records:
            t = record["time_s"] - origin
            if record["event"] == "joined":
                timeout_s = record["timeout_s"]
            elif record["event"] == "reached":
                arrived = (t, record["collective"])
            elif arrived:
                rows[label].append((arrived[0], t, f"waits in {arrived[1]}"))
                ends[label] = (t, record["event"])
                arrived = None
        if arrived:  # the last record: it reached a collective and never wrote again
            rows[label].append((arrived[0], last, f"waits in {arrived[1]}"))
            ends[label] = (last, "no record")
    return rows, ends, timeout_s


def how_each_rank_ended(events):
    """{rank: (how, collective, error)} from each rank's last record: how is "timed out" (the
    group's timeout), "lost its peer" (the other rank's connection closed or reset), "failed"
    (any other error), "left" (the collective finished) or "no record" (it was still waiting
    when torchrun ended it)."""
    from ddp_scripts.launcher import LOST_PEER
    ended = {}
    for rank, records in events.items():
        last = records[-1]
        error = last.get("error", "")
        if last["event"] == "failed":
            how = ("timed out" if "Timed out" in error
                   else "lost its peer" if LOST_PEER.search(error) else "failed")
        else:
            how = {"left": "left", "reached": "no record"}.get(last["event"], "no record")
        ended[rank] = (how, last.get("collective", "-"), error)
    return ended


def hang_outcome(events):
    """One line: how many ranks timed out, counted once per rank from their own records (the
    output repeats a rank's error: its traceback, then torchrun's copy of it), and how the
    others ended."""
    ended = how_each_rank_ended(events)
    timed_out = [rank for rank, (how, _, _) in ended.items() if how == "timed out"]
    said = {"lost its peer": "saw its peer's connection close", "failed": "failed otherwise",
            "left": "finished it", "no record": "was still waiting when torchrun ended it"}
    parts = [f"{len(timed_out)} of {len(ended)} ranks timed out"
             + (f" ({', '.join(f'rank {r} in {ended[r][1]}' for r in timed_out)})"
                if timed_out else "")]
    parts += [f"rank {rank} {said[how]} in {collective}"
              for rank, (how, collective, _) in ended.items() if how != "timed out"]
    return "; ".join(parts)


def draw_hang(ax, folder):
    """Each rank's wait in its collective, where it ended (x: error, |: left), and the
    group's timeout counted from each arrival. Returns {"bars", "ends", "timeout_s"}."""
    rows, ends, timeout_s = hang_rows(hang_events(folder))
    bars = timeline(ax, rows, unit="s")
    for y, label in enumerate(rows):
        if label in ends:
            t, how = ends[label]
            ax.scatter([t], [y], marker="x" if how == "failed" else "|", s=120, color="black",
                       zorder=3)
            ax.annotate({"failed": "error", "left": "left", "no record": "no record"}[how],
                        (t, y), xytext=(6, 8), textcoords="offset points", fontsize=10)
    if timeout_s is not None:
        first_arrival = min(start for bars_of in rows.values() for start, _, _ in bars_of)
        ax.axvline(first_arrival + timeout_s, color=colour("communication"), linestyle="--",
                   linewidth=1)
        ax.annotate(f"timeout: {timeout_s:g} s after the first arrival",
                    (first_arrival + timeout_s, (len(rows) - 1) / 2), xytext=(-6, 0),
                    textcoords="offset points", ha="right", va="center", fontsize=10)
    return {"bars": bars, "ends": ends, "timeout_s": timeout_s}


# Chapter 8: DistributedSampler's padding, per rank -----------------------------------------

def padding_rows(samples, world):
    """What DistributedSampler (shuffle off) gives each rank of `world` for `samples` images:
    (indices per rank, padded per rank), padded True where an index repeats an earlier one."""
    from torch.utils.data.distributed import DistributedSampler
    indices = [list(DistributedSampler(range(samples), num_replicas=world, rank=rank,
                                       shuffle=False)) for rank in range(world)]
    # The sampler deals index k of its padded list to rank k % world; k >= samples is padding.
    padded = [[rank + world * column >= samples for column in range(len(row))]
              for rank, row in enumerate(indices)]
    return indices, padded


def draw_padding(ax, samples, world, correct=None):
    """The index each rank scores, one row per rank; repeated (padded) ones outlined.
    correct: a tensor, 1 where the model classified test image i correctly; the title then
    gives the accuracy as the sampler counts it and with every image counted once.
    Returns {"texts": the indices written, "accuracy": (as counted, once each) or None}."""
    indices, padded = padding_rows(samples, world)
    texts = tensor_grid(ax, indices, row_labels=[f"rank {r}" for r in range(world)],
                        column_labels=[f"#{c + 1}" for c in range(len(indices[0]))],
                        fmt="{:.0f}", highlight=padded)
    ax.set_xlabel("each rank's test images (outlined: scored a second time)")
    accuracy = None
    if correct is not None:
        scored = [i for row in indices for i in row]
        accuracy = (float(correct[scored].float().mean()), float(correct[:samples].float().mean()))
        ax.set_title(f"accuracy as the sampler counts: {accuracy[0]:.3f}; "
                     f"each image once: {accuracy[1]:.3f}")
    return {"texts": texts, "accuracy": accuracy}


# Chapter 10: one training step, from the profiler ------------------------------------------

def step_rows(events, step=1):
    """One training step of a profiled `train_one_epoch`, in ms from the step's start.

    events: the profiler's events (`prof.events()`). A step runs from one fetch of a batch
    (the DataLoader's `__next__`) to the next. Host rows, one per CPU thread that ran
    operators: each top-level operator's kind is "data" (the loader), "copy" (`.to`),
    "optimizer" (`zero_grad`, `step`), "backward" (the autograd engine), "wait" (a
    synchronisation), "forward" (operators between `zero_grad` and backward), or "other";
    consecutive operators of one kind are one interval. A "GPU" row, where there are CUDA
    events: kernels ("compute") and copies ("copy").
    """
    top = sorted((e for e in events if e.cpu_parent is None and not _on_gpu(e)),
                 key=lambda e: e.time_range.start)
    starts = [e.time_range.start for e in top if e.name.startswith("enumerate(DataLoader)")]
    if len(starts) <= step:
        raise ValueError(f"the profile has {len(starts)} step(s); asked for step {step}")
    begin = starts[step]
    end = starts[step + 1] if step + 1 < len(starts) else max(e.time_range.end for e in top)
    main_thread = next(e.thread for e in top if e.name.startswith("enumerate(DataLoader)"))
    rows, phase = {}, "other"
    for e in top:
        if not begin <= e.time_range.start < end:
            continue
        kind, phase = _host_kind(e.name, phase)
        label = "CPU: main thread" if e.thread == main_thread else "CPU: autograd thread"
        _add(rows.setdefault(label, []), e.time_range.start - begin, e.time_range.end - begin,
             kind)
    gpu = sorted((e for e in events if _on_gpu(e) and begin <= e.time_range.start < end),
                 key=lambda e: e.time_range.start)
    for e in gpu:
        kind = "copy" if "memcpy" in e.name.lower() or "memset" in e.name.lower() else "compute"
        _add(rows.setdefault("GPU", []), e.time_range.start - begin, e.time_range.end - begin,
             kind)
    return {label: [(start / 1e3, stop / 1e3, kind) for start, stop, kind in intervals]
            for label, intervals in rows.items()}


def _on_gpu(event):
    return str(getattr(event, "device_type", "")).endswith("CUDA")


def _host_kind(name, phase):
    """(kind of this operator, the phase of the step after it)."""
    if name.startswith("enumerate(DataLoader)"):
        return "data", "other"
    if name.startswith("Optimizer.zero_grad"):
        return "optimizer", "forward"
    if name.startswith("Optimizer.step"):
        return "optimizer", "other"
    if name.startswith("autograd::engine"):
        return "backward", "other"
    if "Synchronize" in name or name in ("aten::item", "aten::_local_scalar_dense"):
        return "wait", phase
    if name in ("aten::to", "aten::_to_copy") and phase == "other":
        return "copy", phase
    return phase, phase


def _add(intervals, start, stop, kind):
    """Append an interval, joined to the last one when it is of the same kind."""
    if intervals and intervals[-1][2] == kind:
        intervals[-1] = (intervals[-1][0], max(stop, intervals[-1][1]), kind)
    else:
        intervals.append((start, stop, kind))


NO_GPU_ROW = "no GPU on this machine: a GPU run draws its kernels in this row"


def draw_step(ax, events, step=1):
    """The step's rows (step_rows) on a timeline; returns what timeline drew. Without GPU
    events the GPU row is drawn empty, saying that it needs a GPU."""
    rows = step_rows(events, step)
    if "GPU" in rows:
        return timeline(ax, rows, unit="ms")
    drawn = timeline(ax, {**rows, "GPU": []}, unit="ms")
    ax.text(0.5, len(rows), NO_GPU_ROW, transform=ax.get_yaxis_transform(), ha="center",
            va="center", color="#555555")
    return drawn


# Chapter 10: what one H200 measured, per data path ------------------------------------------

def micro_panels(micro):
    """{(model, batch): {path: samples/s}} from the chapter's `micro` table (model, batch,
    path, samples/s: micro.py's lines, as results/gpu-runs/*/micro.txt has them)."""
    panels = {}
    for row in micro.to_dict("records"):
        panels.setdefault((row["model"], row["batch"]), {})[row["path"]] = row["samples/s"]
    return panels


SHORT_PATHS = {"scripts' path (CPU tensors, DataLoader)": "DataLoader", "data on GPU": "on GPU",
               "data on GPU CUDA graph": "on GPU, graph",
               "data on GPU channels_last bf16": "on GPU, bf16 NHWC",
               "data on GPU channels_last bf16 CUDA graph": "bf16 NHWC, graph"}


MODEL_NAMES = {"cnn": "CNN", "resnet18": "ResNet-18"}

# micro.py captured its graphs after zero_grad(set_to_none=False): each replay adds into
# gradients no replay zeroes, so those rows time a step that does not train correctly.
GRAPH_ROWS = "graph replay (flawed capture)"


def draw_micro(axes, panels):
    """One panel per (model, batch): a bar per data path, coloured by how the step ran
    (eager, or replayed as a CUDA graph), its samples/s written beside it.
    Returns {(model, batch): stacked_bars' drawing}."""
    drawn, axes = {}, list(axes)
    for ax, ((model, batch), paths) in zip(axes, panels.items()):
        bars = {SHORT_PATHS.get(path, path):
                {GRAPH_ROWS if "CUDA graph" in path else "eager": value}
                for path, value in paths.items()}
        drawn[(model, batch)] = stacked_bars(ax, bars, unit="samples/s")
        for position, parts in enumerate(bars.values()):
            value = sum(parts.values())
            thousands = f"{value / 1e3:,.1f}" if value < 1e4 else f"{value / 1e3:,.0f}"
            ax.text(value, position, f" {thousands}k", va="center", fontsize=10)
        ax.set_title(f"{MODEL_NAMES.get(model, model)}, batch {batch}")
        ax.set_xlim(0, max(sum(p.values()) for p in bars.values()) * 1.3)
        ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1e3:,.0f}k" if x else "0")
        if ax is not axes[len(panels) - 1]:
            ax.get_legend().remove()  # one legend, under the last panel
    return drawn


# Chapter 10: the lines printed under the tables --------------------------------------------

def accuracy_line(accuracy, lever="--augment", baseline="untuned"):
    """The line under the levers' table: how far `lever`'s test accuracy is from `baseline`'s,
    how far the other levers' are at most, and whether `lever` moves it most.
    accuracy: {row: test accuracy}; rows that did not run (None, NaN) are left out."""
    accuracy = pd.Series(accuracy, dtype=float).dropna()
    moved = (accuracy - accuracy[baseline]).abs().drop(baseline)
    others = moved.drop(lever).max()
    return (f"test accuracy against the untuned run's: {lever} {moved[lever]:.3f} apart, "
            f"every other lever within {others:.3f}: {lever} moves it "
            + ("most" if moved[lever] > others else "NOT most"))


def scaling_line(accuracy, test_images):
    """The line under the batch-size table. accuracy: the test accuracies of the small batch,
    the 8x batch at the same rate, with the linear rule, and with warm-up, in that order.

    Each accuracy measured on `test_images` images is uncertain by about one standard error,
    sqrt(p (1 - p) / test_images); their difference, by the two combined. A loss within two
    standard errors of the difference may be chance: the share the linear rule wins back is
    given only for a loss beyond that."""
    small, large, linear, warm = accuracy
    lost = small - large
    noise = 2 * ((small * (1 - small) + large * (1 - large)) / test_images) ** 0.5
    if lost > noise:
        back = f"the linear rule wins back {(linear - large) / lost:.0%} of it"
    else:
        back = (f"{'a gain beyond' if lost < -noise else 'within'} the noise of "
                f"{test_images:,} test images (two standard errors of the difference, "
                f"{noise:.3f}): no gap for the linear rule to win back at this scale")
    return (f"8x batch, same lr: accuracy {-lost:+.3f}; {back}; warm-up then changes the "
            f"accuracy by {warm - linear:+.3f}")


def grads_in_buckets(parameters, buffers):
    """Whether every parameter's .grad is a view of one of DDP's bucket buffers (what a
    communication hook gets as `bucket.buffer()`): a tensor in a buffer's memory."""
    bucket_memory = {buffer.untyped_storage().data_ptr() for buffer in buffers}
    grads = [p.grad for p in parameters if p.grad is not None]
    return bool(grads) and all(grad.untyped_storage().data_ptr() in bucket_memory
                               for grad in grads)
