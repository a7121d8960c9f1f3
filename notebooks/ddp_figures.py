"""Chapter 5's figures, drawn from what ddp_scripts/ddp_anatomy.py recorded on the ranks.

    from notebooks.ddp_figures import load_anatomy, draw_job, draw_sampler, ...

Each drawing function takes the ranks' records (anatomy.json's "ranks") and returns what it
drew, for tests/book/test_figures_ch05.py to compare with the data.
"""
import json
from pathlib import Path

import torch
from matplotlib.patches import FancyBboxPatch, Rectangle

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
    """A ring all-reduce of the ranks' gradients, simulated step by step on their values.

    before: one flat tensor per rank (what DDP's hook found in the bucket). As DDP's default
    hook does, each rank first divides by the world size; then the sum travels the ring:
    world - 1 reduce-scatter steps (rank r sends one chunk to rank r + 1, which adds it to its
    own), then world - 1 all-gather steps (the finished chunks go round, copied). Returns
    the frames: {"title", "values" (ranks x values), "received" (rank, chunk) pairs}.
    """
    world = len(before)
    chunks = [list(torch.tensor_split(torch.as_tensor(v, dtype=torch.float64) / world, world))
              for v in before]
    frames = [{"title": f"start: each rank's gradient / {world}", "received": []}]

    def snapshot(frame):
        frame["values"] = torch.stack([torch.cat(mine) for mine in chunks])
        frame["chunks"] = [[len(c) for c in mine] for mine in chunks][0]
        return frame

    snapshot(frames[0])
    for step in range(world - 1):
        sent = [(rank, (rank - step) % world) for rank in range(world)]
        old = [[c.clone() for c in mine] for mine in chunks]
        for rank, chunk in sent:
            chunks[(rank + 1) % world][chunk] = old[(rank + 1) % world][chunk] + old[rank][chunk]
        frames.append(snapshot({"title": f"reduce-scatter {step + 1} of {world - 1}: "
                                         "each rank adds the chunk it receives",
                                "received": [((r + 1) % world, c) for r, c in sent]}))
    for step in range(world - 1):
        sent = [(rank, (rank + 1 - step) % world) for rank in range(world)]
        old = [[c.clone() for c in mine] for mine in chunks]
        for rank, chunk in sent:
            chunks[(rank + 1) % world][chunk] = old[rank][chunk]
        frames.append(snapshot({"title": f"all-gather {step + 1} of {world - 1}: "
                                         "each rank copies the finished chunk it receives",
                                "received": [((r + 1) % world, c) for r, c in sent]}))
    return frames


def ring_animation(ranks, interval_ms=1400):
    """The ring all-reduce of the ranks' real gradients, one frame per step, as offline HTML.
    Returns (html, frames)."""
    frames = ring_steps([record["gradients"]["before"] for record in ranks])
    labels = value_labels(ranks[0])
    fig, ax = new_figure(height=2.9)
    names = [f"rank {rank}" for rank in range(len(ranks))]

    def draw_frame(i):
        ax.clear()
        frame = frames[i]
        bounds = torch.tensor([0] + frame["chunks"]).cumsum(0).tolist()
        highlight = torch.zeros(frame["values"].shape, dtype=torch.bool)
        for rank, chunk in frame["received"]:
            highlight[rank, bounds[chunk]:bounds[chunk + 1]] = True
        tensor_grid(ax, frame["values"], names, labels, highlight=highlight,
                    title=f"{i}/{len(frames) - 1}  {frame['title']}")
        for bound in bounds[1:-1]:
            ax.axvline(bound - 0.5, color="#333333", lw=2)

    return animate(fig, draw_frame, len(frames), interval_ms=interval_ms), frames


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
    return drawn


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
    colours = [colour("", 0 if name.startswith("float32") else 1) for name in table.index]
    bars = ax.barh(positions, table["largest |difference|"], color=colours,
                   label="largest |difference|")
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
