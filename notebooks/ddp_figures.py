"""Chapter 5's figures, drawn from what ddp_scripts/recorders/ddp_anatomy.py recorded on the ranks.

    from notebooks.ddp_figures import load_anatomy, draw_job, draw_sampler, ...
    from notebooks.ddp_figures import ring_agrees, first_bucket_line, buckets_line, ...

Each drawing function takes the ranks' records (anatomy.json's "ranks") and returns what it
drew, for tests/figures/test_figures_ch05.py to compare with the data.
"""
import json
from pathlib import Path

import torch
from matplotlib.patches import Circle, FancyBboxPatch, Rectangle

from notebooks.figures import animate, colour, new_figure, tensor_grid, timeline


def load_anatomy(out):
    """The ranks' records, rank 0 first, from OUT/anatomy.json."""
    return json.loads((Path(out) / "anatomy.json").read_text())["ranks"]


def draw_job(ax, ranks):
    """Each machine of the job, and each process in it, as the processes described themselves."""
    ax.axis("off")
    world = len(ranks)
    ax.set_xlim(0, world)
    ax.set_ylim(-0.9, 3.1)
    ax.add_patch(FancyBboxPatch((0.03, 0.05), world - 0.06, 2.95, boxstyle="round,pad=0.02",
                                fc="#f2f2f2", ec="#555555"))
    first = ranks[0]["job"]
    ax.text(0.1, 2.75, f"machine {first['host']}: node rank {first['group_rank']}, "
            f"{first['local_world_size']} processes", weight="bold", va="center")
    drawn = []
    for position, record in enumerate(ranks):
        me = record["job"]
        ax.add_patch(FancyBboxPatch((position + 0.1, 0.25), 0.8, 2.1, boxstyle="round,pad=0.02",
                                    fc="#dbe9f6", ec=colour("compute")))
        lines = [f"rank {me['rank']}", f"local rank {me['local_rank']}", f"pid {me['pid']}",
                 f"device {me['device']}"]
        for row, text in enumerate(lines):
            ax.text(position + 0.5, 2.0 - 0.45 * row, text, ha="center", va="center",
                    weight="bold" if row == 0 else "normal")
        ax.plot([position + 0.5, position + 0.5], [0.25, -0.3], color=colour("communication"))
        drawn.append(lines)
    ax.add_patch(FancyBboxPatch((0.03, -0.8), world - 0.06, 0.5, boxstyle="round,pad=0.02",
                                fc="#fdebd3", ec=colour("communication")))
    group = f"process group: world size {first['world_size']}, backend {first['backend']}"
    ax.text(world / 2, -0.55, group, ha="center", va="center")
    return {"processes": drawn, "group": group}


def sampler_order(ranks):
    """The sampler's shuffled, padded list of indices, put back together from the ranks' shares:
    rank r took positions r, r + world, r + 2 world, ...; positions past the data set's size
    are the padding."""
    world = len(ranks)
    size = ranks[0]["sampler"]["dataset_size"]
    order = []
    for step in range(len(ranks[0]["sampler"]["indices"])):
        for rank, record in enumerate(ranks):
            position = step * world + rank
            order.append({"position": position, "index": record["sampler"]["indices"][step],
                          "rank": rank, "padded": position >= size})
    return order


def draw_sampler(ax, ranks):
    """Top: the shuffled list, each index in the colour of the rank that takes it (padding
    outlined). Below: each rank's share, in the order the rank received it."""
    order = sampler_order(ranks)
    world = len(ranks)
    ax.axis("off")
    ax.set_xlim(-2.6, len(order))
    ax.set_ylim(world + 2.2, -0.8)

    def cell(x, y, entry):
        ax.add_patch(Rectangle((x, y), 0.92, 0.85, fc=colour("", entry["rank"]), alpha=0.85,
                               ec=colour("communication") if entry["padded"] else "white",
                               lw=3 if entry["padded"] else 1))
        ax.text(x + 0.46, y + 0.43, str(entry["index"]), ha="center", va="center",
                color="white", weight="bold")

    ax.text(-0.2, 0.43, "shuffled", ha="right", va="center")
    for entry in order:
        cell(entry["position"], 0, entry)
        ax.text(entry["position"] + 0.46, -0.35, str(entry["position"]), ha="center",
                va="center", fontsize=10, color="#555555")
    shares = {}
    for rank in range(world):
        ax.text(-0.2, rank + 1.6, f"rank {rank}", ha="right", va="center")
        mine = [entry for entry in order if entry["rank"] == rank]
        shares[rank] = [entry["index"] for entry in mine]
        for step, entry in enumerate(mine):
            cell(step, rank + 1.2, entry)
    padded = [entry["index"] for entry in order if entry["padded"]]
    ax.text(len(order) / 2, world + 1.7,
            f"{len(order)} places for {ranks[0]['sampler']['dataset_size']} samples: "
            f"padded (outlined) with {padded}", ha="center", va="center")
    return {"order": [entry["index"] for entry in order], "shares": shares, "padded": padded}


def value_labels(record):
    """Short column names for the flattened gradient: w00 ... for the weight, b0 ... the bias."""
    labels = []
    for name in record["gradients"]["names"]:
        shape = record["gradients"]["shapes"][name]
        if len(shape) == 2:
            labels += [f"w{i}{j}" for i in range(shape[0]) for j in range(shape[1])]
        else:
            labels += [f"{name[0]}{i}" for i in range(shape[0])]
    return labels


def draw_gradients(axes, ranks):
    """Top: each rank's own gradient of the tiny layer; bottom: the same average on every rank."""
    before = torch.tensor([record["gradients"]["before"] for record in ranks])
    after = torch.tensor([record["gradients"]["after"] for record in ranks])
    names = [f"rank {rank}" for rank in range(len(ranks))]
    return {"before": tensor_grid(axes[0], before, names, value_labels(ranks[0]),
                                  title="before the all-reduce: each rank's own gradient"),
            "after": tensor_grid(axes[1], after, names, value_labels(ranks[0]),
                                 title="after: the average, the same on every rank")}


def ring_steps(before):
    """A ring all-reduce of the ranks' gradients, simulated step by step on their values, in
    the order gloo's ring runs it (gloo/allreduce.cc, `ring`): rank r sends to rank r - 1.

    before: one flat tensor per rank (what DDP's hook found in the bucket). As DDP's default
    hook does, each rank first divides by the world size; then the sum travels the ring:
    world - 1 reduce-scatter steps (in step s rank r sends chunk r + 1 + s, and the receiver
    adds it to its own), after which rank r holds the finished chunk r; then world - 1
    all-gather steps (in step s rank r sends the finished chunk r + s, copied). Returns the
    frames: {"title", "values" (ranks x values), "chunks" (their lengths), "sends" (sender,
    receiver, chunk), "received" (rank, chunk), "finished" (rank, chunk): chunks that hold
    the whole sum}.
    """
    world = len(before)
    chunks = [list(torch.tensor_split(torch.as_tensor(v, dtype=torch.float64) / world, world))
              for v in before]
    finished = []

    def snapshot(title, sends=()):
        return {"title": title, "values": torch.stack([torch.cat(mine) for mine in chunks]),
                "chunks": [len(c) for c in chunks[0]], "sends": list(sends),
                "received": [(to, chunk) for _, to, chunk in sends],
                "finished": list(finished)}

    def step(first_chunk, add):
        sends = [(rank, (rank - 1) % world, (rank + first_chunk) % world)
                 for rank in range(world)]
        old = [[c.clone() for c in mine] for mine in chunks]
        for sender, to, chunk in sends:
            chunks[to][chunk] = old[sender][chunk] + (old[to][chunk] if add else 0)
        return sends

    frames = [snapshot(f"start: each rank's gradient / {world}")]
    for s in range(world - 1):
        sends = step(1 + s, add=True)
        if s == world - 2:
            finished.extend((rank, rank) for rank in range(world))
        frames.append(snapshot(f"reduce-scatter {s + 1} of {world - 1}: each rank adds the "
                               "chunk it receives", sends))
    for s in range(world - 1):
        sends = step(s, add=False)
        finished.extend((to, chunk) for _, to, chunk in sends)
        frames.append(snapshot(f"all-gather {s + 1} of {world - 1}: each rank copies the "
                               "finished chunk it receives", sends))
    return frames


def draw_ring(ax, world, sends):
    """The ranks around a circle (rank 0 on top, clockwise) and an arrow for each send of the
    step. Returns the sends drawn: (sender, receiver, chunk)."""
    import math
    place = [(math.sin(2 * math.pi * r / world), math.cos(2 * math.pi * r / world))
             for r in range(world)]
    ax.add_patch(Circle((0, 0), 1, fill=False, color="#cccccc", lw=1))
    for sender, to, _ in sends:
        (x0, y0), (x1, y1) = place[sender], place[to]
        ax.annotate("", (x1, y1), (x0, y0), arrowprops=dict(
            arrowstyle="-|>", color=colour("communication"), lw=2, shrinkA=14, shrinkB=14,
            connectionstyle="arc3,rad=-0.25"))
    for rank, (x, y) in enumerate(place):
        ax.text(x, y, f"rank {rank}", ha="center", va="center", fontsize=9,
                bbox=dict(boxstyle="circle,pad=0.2", fc="white", ec="#333333"))
    ax.set_xlim(-1.5, 1.5)
    ax.set_ylim(-1.5, 1.5)
    ax.set_aspect("equal")
    ax.axis("off")
    return list(sends)


def ring_figure():
    """The animation's figure: the ring on the left, the ranks' values on the right."""
    return new_figure(1, 2, height=3.2, width_ratios=[1, 3])


# Where a chunk's outlines sit inside its cells (in cells): orange along the chunk's edge,
# green well inside it, so a chunk both just received and finished shows both apart.
RECEIVED_INSET, FINISHED_INSET = (0.03, 0.05), (0.13, 0.2)


def draw_ring_frame(ring_ax, ax, frame, labels):
    """One frame of ring_steps: the ring and the step's sends on ring_ax; on ax, the ranks'
    values, each chunk just received outlined in orange along its edge, each finished one (the
    whole sum) in green inside. Returns the outlines: {"received", "finished": {(rank, chunk):
    Rectangle}}."""
    ring_ax.clear()
    ax.clear()
    world = len(frame["values"])
    bounds = torch.tensor([0] + frame["chunks"]).cumsum(0).tolist()
    tensor_grid(ax, frame["values"], [f"rank {rank}" for rank in range(world)], labels)
    for bound in bounds[1:-1]:
        ax.axvline(bound - 0.5, color="#333333", lw=2)

    def outline(rank, chunk, inset, lw, kind):
        (dx, dy), start, end = inset, bounds[chunk] - 0.5, bounds[chunk + 1] - 0.5
        return ax.add_patch(Rectangle((start + dx, rank - 0.5 + dy), end - start - 2 * dx,
                                      1 - 2 * dy, fill=False, lw=lw, edgecolor=colour(kind),
                                      zorder=4))

    boxes = {"received": {(rank, chunk): outline(rank, chunk, RECEIVED_INSET, 3, "communication")
                          for rank, chunk in frame["received"]},
             "finished": {(rank, chunk): outline(rank, chunk, FINISHED_INSET, 2, "data")
                          for rank, chunk in frame["finished"]}}
    draw_ring(ring_ax, world, frame["sends"])
    ring_ax.set_title("sends: rank r to r − 1", fontsize=10)
    ring_ax.text(0, -1.45, "orange: just received", ha="center", va="top", fontsize=9,
                 color=colour("communication"))
    ring_ax.text(0, -1.8, "green: the whole sum", ha="center", va="top", fontsize=9,
                 color=colour("data"))
    return boxes


def ring_animation(ranks, interval_ms=1400):
    """The ring all-reduce of the ranks' real gradients, one frame per step, as offline HTML:
    the ring with the step's sends on the left, the ranks' values on the right, chunks just
    received outlined in orange, finished ones (the whole sum) in green inside them
    (draw_ring_frame). Returns (html, frames)."""
    frames = ring_steps([record["gradients"]["before"] for record in ranks])
    labels = value_labels(ranks[0])
    fig, (ring_ax, ax) = ring_figure()

    def draw_frame(i):
        draw_ring_frame(ring_ax, ax, frames[i], labels)
        fig.suptitle(f"{i}/{len(frames) - 1}  {frames[i]['title']}")

    return animate(fig, draw_frame, len(frames), interval_ms=interval_ms), frames


def ring_agrees(frames, ranks):
    """Whether the ring's last frame holds, on every rank, what that rank's all-reduce left in
    .grad. The ranks divided their float32 gradients by the world size and added them, world - 1
    additions in an order of gloo's; the simulation does the same in float64. Each of those
    float32 roundings is at most half of float32's epsilon of the numbers it rounds, so the
    two results may differ by up to world x epsilon x the sum of the ranks' |value / world|,
    and no more: a ring that ends a step short, or an all-reduce that summed without
    dividing, is off by a whole chunk of the gradient."""
    before = torch.tensor([record["gradients"]["before"] for record in ranks],
                          dtype=torch.float64)
    world = len(ranks)
    bound = world * torch.finfo(torch.float32).eps * (before / world).abs().sum(0)
    last = frames[-1]["values"]
    return all(bool(((last[rank] - torch.tensor(record["gradients"]["after"],
                                                 dtype=torch.float64)).abs() <= bound).all())
               for rank, record in enumerate(ranks))


def timeline_rows(record, step, label=None):
    """One rank's step as timeline rows. On one row: forward; backward until the last gradient
    was ready; then the wait, inside backward(), for the all-reduces to finish. Each bucket's
    all-reduce (from the hook's call until its future completed) on a row of its own."""
    events = next(s for s in record["timeline"] if s["step"] == step)["events"]
    label = label or f"rank {record['job']['rank']}"
    forward = next(e for e in events if e["kind"] == "forward")
    backward = next(e for e in events if e["kind"] == "backward")
    last_gradient = max(e["at"] for e in events if e["kind"] == "gradient")
    rows = {f"{label} compute": [(forward["start"], forward["end"], "forward"),
                                 (backward["start"], last_gradient, "backward"),
                                 (last_gradient, backward["end"], "wait")]}
    for e in sorted((e for e in events if e["kind"] == "all-reduce"), key=lambda e: e["bucket"]):
        rows[f"{label} bucket {e['bucket']}"] = [(e["start"], e["end"], "all-reduce")]
    return rows


def draw_timeline(axes, ranks, steps=(1, 2), shown=(0, 1)):
    """One panel per step: the shown ranks' compute and bucket all-reduces."""
    drawn = {}
    for ax, step in zip(axes, steps):
        rows = {}
        for rank in shown:
            rows.update(timeline_rows(ranks[rank], step))
        drawn[step] = timeline(ax, rows, legend=step == steps[-1])
        ax.set_title(f"step {step}")
        ax.tick_params(axis="x", labelbottom=True)   # numbered even when the panels share it
    return drawn


def first_bucket_line(record, step=2):
    """Whether, in step `step` of one rank's timeline, the first bucket's all-reduce left
    before backward had made its last gradient, and by how many ms: one line."""
    events = next(s for s in record["timeline"] if s["step"] == step)["events"]
    last_gradient = max(e["at"] for e in events if e["kind"] == "gradient")
    sent = sorted(e["start"] for e in events if e["kind"] == "all-reduce")
    lead = last_gradient - sent[0]
    return (f"rank {record['job']['rank']}, step {step}: {len(sent)} buckets; the first left "
            + (f"{lead:.1f} ms before the last gradient" if lead > 0
               else f"{-lead:.1f} ms after the last gradient: no overlap in this run"))


def buckets_line(step, events):
    """From one step's notes, in the order they were taken (a line with "backward" for each
    gradient ready, one with "all-reduce" for each bucket handed to the all-reduce): how many
    buckets, and whether the first all-reduce started before backward's last gradient."""
    first_send = next(i for i, e in enumerate(events) if "all-reduce" in e)
    last_gradient = max(i for i, e in enumerate(events) if "backward" in e)
    buckets = sum("all-reduce" in e for e in events)
    return (f"step {step}: {buckets} bucket(s); the first all-reduce starts before backward is"
            f" over: {first_send < last_gradient}")


def draw_metrics(left, right, metrics):
    """A run's per-epoch losses (left) and test accuracy (right), from its metrics.jsonl rows.
    Returns {line label: (epochs, values)} as drawn."""
    drawn = {}
    for ax, column, style, label in ((left, "train_loss", "o-", "train loss"),
                                     (left, "test_loss", "s--", "test loss"),
                                     (right, "test_accuracy", "o-", "test accuracy")):
        line, = ax.plot(metrics["epoch"], metrics[column], style, label=label,
                        color=colour("data") if ax is right else None)
        drawn[label] = (list(line.get_xdata()), list(line.get_ydata()))
    left.set_ylabel("cross-entropy")
    left.legend()
    right.set_ylabel("test accuracy")
    for ax in (left, right):
        ax.set_xlabel("epoch")
        ax.set_xticks(metrics["epoch"])
    return drawn


def draw_equivalence(ax, table):
    """Per comparison (the table's index), the largest parameter difference as a bar and the
    largest change by training as a tick, on a log scale. Returns {"bars", "ticks"}: (row, value)."""
    positions = list(range(len(table)))
    dtypes = [name.split(",")[0] for name in table.index]  # "float32, after epoch 1"
    kinds = list(dict.fromkeys(dtypes))
    colours = [colour("", kinds.index(dtype)) for dtype in dtypes]
    bars = ax.barh(positions, table["largest |difference|"], color=colours)
    for dtype in kinds:  # one legend entry per dtype, in its bars' colour
        bars[dtypes.index(dtype)].set_label(f"largest |difference|, {dtype}")
    ax.scatter(table["largest change by training"], positions, marker="|", s=400,
               color="black", zorder=3, label="largest change by training")
    ax.set_yticks(positions, list(table.index))
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("parameter difference (log scale)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2, frameon=False)
    ticks = ax.collections[-1].get_offsets()
    return {"bars": [(name, bar.get_width()) for name, bar in zip(table.index, bars)],
            "ticks": [(name, float(x)) for name, (x, _) in zip(table.index, ticks)]}


# The share of the change, and whether the gap is rounding: chapter 5's two checks.
# A difference in what the two runs compute (another learning rate, gradients summed rather
# than averaged) moves their parameters apart by a share of what training moved them.
SAME_TRAINING_SHARE = 0.01


def same_training_line(name, gap, change):
    """Whether the gap between the two runs is below SAME_TRAINING_SHARE of the change."""
    return (f"{name}: difference below {SAME_TRAINING_SHARE:.0%} of the change: "
            f"{gap < SAME_TRAINING_SHARE * change}")


# Rounding alone moves the two runs apart by a few epsilons per step, compounding from step to
# step; a difference in what they compute moves them apart by a share of the change training
# made: in float64, billions of epsilons. The bound between the two is a floor for judgment,
# far from both.
ROUNDING_PER_STEP = 100  # epsilons of each type, per optimizer step taken


def rounding_line(gap32, gap64, steps, epoch=1):
    """Whether the float32 and float64 gaps between the two runs, after the same `steps`
    optimizer steps, are rounding: each gap in epsilons of its own type, against
    ROUNDING_PER_STEP epsilons per step taken. Rounding when both gaps are within it; else
    the runs compute different things, and the line names the gap beyond it."""
    if gap32 == gap64 == 0:
        return f"after epoch {epoch}, both pairs of runs are identical: no gap to explain"
    bound = ROUNDING_PER_STEP * steps
    in_eps = {name: gap / torch.finfo(dtype).eps
              for name, gap, dtype in (("float32", gap32, torch.float32),
                                       ("float64", gap64, torch.float64))}
    beyond = [name for name, value in in_eps.items() if value > bound]
    verdict = ("both gaps are within it, so it is rounding" if not beyond else
               f"{'both gaps are' if len(beyond) == 2 else f'the {beyond[0]} gap is'} beyond "
               f"it, so the runs compute different things")
    return (f"after epoch {epoch} ({steps} steps): the float32 gap is {in_eps['float32']:.2g} "
            f"epsilons, the float64 gap {in_eps['float64']:.2g}; the bound for rounding alone: "
            f"{bound:,} ({ROUNDING_PER_STEP} per step): {verdict}")


# The samplers' checks: what each rank gets, epoch after epoch, against one process.

def every_sample_once(shares, samples):
    """Whether the ranks' shares, together, hold every sample exactly once."""
    return sorted(sum(shares, [])) == sorted(samples)


def same_order_every_epoch(per_epoch):
    """Whether a rank got its share in the same order in every epoch (lists of indices)."""
    return all(order == per_epoch[0] for order in per_epoch)


def same_global_batches(one_process, shares, per_rank):
    """Whether each batch of len(shares) x per_rank samples that one process takes from its
    order holds the samples of the ranks' k-th batches of per_rank, together, for every k;
    and the ranks' shares hold as many samples as the one process's order."""
    size = len(shares) * per_rank
    if sum(len(share) for share in shares) != len(one_process) or len(one_process) < size:
        return False
    return all(sorted(one_process[k * size:(k + 1) * size])
               == sorted(sum((share[k * per_rank:(k + 1) * per_rank] for share in shares), []))
               for k in range(len(one_process) // size))


def launcher_warned(lines):
    """Whether torch.distributed.launch printed its own warning that it is deprecated (a
    FutureWarning that begins "The module torch.distributed.launch is deprecated"); a line of
    the script that only mentions the word does not count."""
    return any("Warning: The module torch.distributed.launch is deprecated" in line
               for line in lines)
