"""Chapter 11's memory pages: the calculator's tables beside the run, its form, two figures,
and the checks whose verdicts the chapter prints.

The predictions come from ddp_scripts/fit/memory_plan.py, the measurements from the lines
ddp_scripts/fit/memory_run.py wrote (memory.jsonl, and peaks.jsonl for torch's tracker); the
figures draw both with notebooks/figures.py.
"""
import json

import pandas as pd
import torch
from matplotlib.patches import ConnectionPatch, Rectangle

from ddp_scripts.fit.memory_plan import (PARTS, PEAK_STRATEGIES, STATES_PER_PARAMETER,
                                               STRATEGIES, peak_agrees, peak_plan, plan)
from ddp_scripts.fit.memory_run import fake_peaks
from ddp_scripts.out_dir import identical  # noqa: F401 (the chapter imports it from here)
from ddp_scripts.sharding import WideMLP
from notebooks.figures import colour, stacked_bars, tensor_grid

MEASURED = PARTS[:4]   # what the run measures on every rank: all but "gathered"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def read_run(path):
    """The run's lines, as {(strategy, rank): record}, and its settings."""
    records = [json.loads(line) for line in open(path) if line.strip()]
    settings = {key: records[0][key] for key in ("world_size", "width", "depth", "dtype",
                                                 "global_batch_size")}
    records.sort(key=lambda r: (STRATEGIES.index(r["strategy"]), r["rank"]))
    return {(r["strategy"], r["rank"]): r for r in records}, settings


def plan_for(settings, planner=plan, **options):
    """memory_plan.plan (or peak_plan) for the run's own model, batch, dtype and world size."""
    with torch.device("meta"):   # shapes only: even a model too large for this machine
        model = WideMLP(settings["width"], settings["depth"])
    return planner(model, settings["global_batch_size"], settings["world_size"],
                   DTYPES[settings["dtype"]], units=model.blocks, **options)


def read_peaks(path):
    """peaks.jsonl: {(strategy, rank): record} in PEAK_STRATEGIES' order."""
    records = [json.loads(line) for line in open(path) if line.strip()]
    records.sort(key=lambda r: (PEAK_STRATEGIES.index(r["strategy"]), r["rank"]))
    return {(r["strategy"], r["rank"]): r for r in records}


def fake_tracked(settings, strategies=PEAK_STRATEGIES):
    """torch's tracker on each rank of the run's settings (read_run's), in this process under
    FakeTensorMode (memory_run.fake_peaks): {(strategy, rank): record}, as read_peaks."""
    records = fake_peaks(settings["width"], settings["depth"], settings["global_batch_size"],
                         settings["world_size"], DTYPES[settings["dtype"]], strategies)
    return {(r["strategy"], r["rank"]): r for r in records}


def case_checked(width, depth, batch, ranks, dtype, optimizer="sgd-momentum",
                 strategies=PEAK_STRATEGIES):
    """peaks_side_by_side for one of calculator_cases' cases, tracked in fake mode."""
    settings = {"width": width, "depth": depth, "global_batch_size": batch,
                "world_size": ranks, "dtype": dtype}
    return peaks_side_by_side(plan_for(settings, peak_plan, optimizer=optimizer),
                              fake_tracked(settings, strategies))


def peaks_side_by_side(predicted, tracked, gloo=None):
    """One row per strategy and rank: the predicted peak and where it falls, the tracker's peak
    and where it rose last, in MB, the gap in bytes, and whether they agree (to the byte:
    memory_plan.EXACT). `tracked` is read_peaks' dict; run under FakeTensorMode (fake_peaks)
    nothing is known to differ.

    gloo: the same run's peaks on gloo ranks, set beside them with what such a run may hold
    beyond: an FSDP rank, one reduce-scatter input more (the clone gloo all-reduces; "gloo
    clone" in peak_plan's rows), any other rank nothing. On a GPU, the allocator's peak too:
    the bytes requested of it, less cuBLAS's workspaces (allocator_agrees)."""
    rows = []
    for (strategy, rank), record in tracked.items():
        guess = predicted[strategy][rank]
        row = {"strategy": strategy, "rank": rank, "predicted peak (MB)": guess["peak"] / 1e6,
               "falls at": guess["at"], "tracked (MB)": record["tracked_peak"] / 1e6,
               "tracked at": record["tracked_at"],
               "gap (B)": record["tracked_peak"] - guess["peak"],
               "agrees": peak_agrees(guess["peak"], record["tracked_peak"])}
        if gloo is not None:
            real = gloo[(strategy, rank)]["tracked_peak"]
            row.update({"gloo run (MB)": real / 1e6,
                        "gloo beyond (B)": real - record["tracked_peak"],
                        "gloo may add (B)": guess.get("gloo clone", 0)})
        if record.get("requested_peak") is not None:
            row.update({"max_memory_allocated (MB)": record["max_memory_allocated"] / 1e6,
                        "allocator less workspaces (MB)": (record["requested_peak"]
                                                          - record["cublas_workspaces"]) / 1e6,
                        "allocator agrees": allocator_agrees(guess["peak"],
                                                             record["requested_peak"],
                                                             record["cublas_workspaces"])})
        rows.append(row)
    return pd.DataFrame(rows).set_index(["strategy", "rank"])


def allocator_agrees(predicted, requested, workspaces):
    """Whether a GPU's allocator saw the predicted bytes: the bytes requested of it, at its
    peak or now (memory_stats' "requested_bytes.all.peak" or ".current", each tensor's own
    size, before the allocator rounds it up to a multiple of 512 bytes as
    max_memory_allocated counts it), less cuBLAS's workspaces, which the allocator gave cuBLAS
    at the first step's matrix products and no tensor holds (memory_run.tracked_peak measures
    them: what the allocator held after the first step beyond the optimizer state made then).
    Nothing else is known to differ, so to the byte."""
    return peak_agrees(predicted, requested - workspaces)


def points_agree(checked):
    """For each row of peaks_side_by_side: whether the tracker's peak last rose at the point
    of the step where the prediction puts the peak."""
    return checked["falls at"] == checked["tracked at"]


def within_gloos_clone(checked):
    """For each row of peaks_side_by_side (with its gloo columns): whether the gloo run held
    no less than fake mode and at most what gloo's clone may add."""
    beyond, may_add = checked["gloo beyond (B)"], checked["gloo may add (B)"]
    return (beyond >= 0) & (beyond <= may_add)


def gap_notes(checked):
    """A line for each row of peaks_side_by_side that needs one: a prediction the tracker does
    not agree with (a rule is missing or wrong), and a gloo run that held more than the same
    steps in fake mode, named as gloo's clone only within what the clone can add."""
    notes = []
    clone = (within_gloos_clone(checked) if "gloo beyond (B)" in checked
             else pd.Series(False, index=checked.index))
    for (strategy, rank), row in checked.iterrows():
        if not row["agrees"]:
            notes.append(f"{strategy}, rank {rank}: the tracker holds {row['gap (B)']:+,} B "
                         f"beyond the prediction, at {row['tracked at']} (predicted at "
                         f"{row['falls at']}): a rule is missing or wrong")
        beyond = row.get("gloo beyond (B)", 0)
        if beyond and clone[(strategy, rank)]:
            notes.append(f"{strategy}, rank {rank}: the gloo run held {beyond:,} B more than "
                         "the same steps in fake mode: the clone of a reduce-scatter input "
                         "that gloo all-reduces, freed by its worker thread")
        elif beyond:
            notes.append(f"{strategy}, rank {rank}: the gloo run held {beyond:+,} B beyond "
                         "the same steps in fake mode, which gloo's clone does not explain")
    return notes


def side_by_side(planned, measured):
    """One row per strategy and rank: the predicted parts and total, the measured total (MB),
    and the bytes by which measured and predicted parts differ, summed without sign."""
    rows = []
    for (strategy, rank), record in measured.items():
        predicted = planned[strategy][rank]
        row = {"strategy": strategy, "rank": rank}
        row.update({part: predicted[part] / 1e6 for part in MEASURED})
        row["predicted"] = sum(predicted[part] for part in MEASURED) / 1e6
        row["measured"] = sum(record[part] for part in MEASURED) / 1e6
        row["difference (B)"] = sum(abs(record[p] - predicted[p]) for p in MEASURED)
        rows.append(row)
    return pd.DataFrame(rows)


def parts_agree(side):
    """Whether side_by_side's table has every part of every rank equal to the byte: the run
    counts the bytes of tensors and the calculator the same tensors' bytes, so nothing is
    known to differ."""
    return bool((side["difference (B)"] == 0).all())


def equal_to_the_byte(measured, formula):
    """Whether two columns of byte counts, one row per world size, are equal on every row."""
    return list(measured) == list(formula)


def bar_label(strategy, rank):
    return strategy if strategy == "one process" else f"{strategy}, rank {rank}"


def draw_held(ax, planned, measured, strategies=("one process", "DDP", "ZeRO-1", "FSDP")):
    """Stacked bars of the predicted parts (MB) for each strategy and rank (DDP's ranks are all
    alike: rank 0 stands for them), each with the run's measured total as a tick."""
    bars, totals = {}, {}
    for (strategy, rank), record in measured.items():
        if strategy not in strategies or (strategy == "DDP" and rank):
            continue
        label = bar_label(strategy, rank)
        bars[label] = {part: planned[strategy][rank][part] / 1e6 for part in MEASURED}
        totals[label] = sum(record[part] for part in MEASURED) / 1e6
    return stacked_bars(ax, bars, unit="MB per rank", total=totals)


def unit_of(layer):
    """The unit a hook point belongs to: "blocks.1" for "blocks.1.up" or "blocks.1 done", the
    first part of any other layer's name ("head" for "head.0"), or the point itself ("start")."""
    parts = layer.split(" ")[0].split(".")
    return ".".join(parts[:2]) if parts[0] == "blocks" else parts[0]


def layer_ticks(timeline):
    """Where the step figure names its hook points: the first point of each unit, named after
    the unit; a block's "done" point away from the block's own points, by its own name."""
    ticks = {}
    for i, point in enumerate(timeline):
        unit = unit_of(point["layer"])
        if not i or unit != unit_of(timeline[i - 1]["layer"]):
            ticks[i] = point["layer"] if point["layer"].endswith(" done") else unit
    return ticks


def draw_step(ax, measured, ranks=None):
    """Bytes of weights held (shards and gathered units) at each hook point of one step: DDP's
    rank 0 and FSDP's ranks, each later FSDP rank drawn thinner on top of the first, so lines
    that coincide both show (and a note says they do). The x-axis names the layers. Returns
    {line label: [MB, ...]} as drawn."""
    world = max(rank for _, rank in measured) + 1
    ranks = ranks if ranks is not None else sorted({0, world - 1})
    lines = {"DDP, rank 0": measured[("DDP", 0)]["timeline"]}
    lines.update({f"FSDP, rank {r}": measured[("FSDP", r)]["timeline"] for r in ranks})
    styles = [dict(color=colour("other"), lw=2), dict(color=colour("gather"), lw=5)]
    styles += [dict(color=colour("", 2 * n), lw=1.8, linestyle="--") for n in range(len(ranks))]
    drawn = {}
    for (label, timeline), style in zip(lines.items(), styles):
        drawn[label] = [point["bytes"] / 1e6 for point in timeline]
        ax.step(range(len(timeline)), drawn[label], where="post", label=label, **style)
    fsdp = lines[f"FSDP, rank {ranks[0]}"]
    same = [r for r in ranks[1:] if drawn[f"FSDP, rank {r}"] == drawn[f"FSDP, rank {ranks[0]}"]]
    if same:
        ax.text(0.5, 0.08, f"FSDP's ranks {', '.join(map(str, [ranks[0]] + same[:-1]))} and "
                f"{same[-1]} hold the same bytes at every point: the lines coincide",
                transform=ax.transAxes, ha="center", fontsize=10)
    turn = next(i for i, point in enumerate(fsdp) if point["phase"] == "backward")
    ax.axvline(turn - 0.5, color="#333333", linewidth=0.8)
    top = max(max(values) for values in drawn.values())
    ax.text(turn - 1, top * 0.3, "forward", ha="right")
    ax.text(turn, top * 0.3, "backward", ha="left")
    ax.set_ylim(0, top * 1.3)   # room for the legend above the lines
    ticks = layer_ticks(fsdp)
    ax.set_xticks(list(ticks), list(ticks.values()), rotation=90)
    ax.set_xticks(range(len(fsdp)), minor=True)
    ax.set_xlabel("hook point: a layer starts its forward or backward")
    ax.set_ylabel("MB of weights held")
    ax.legend(loc="upper center", ncol=3, frameon=False)
    return drawn


# The peak's parts, grouped into the calculator's columns: they add up to the peak.
PEAK_COLUMNS = {
    "weights": ("parameters", "root whole", "block whole", "buffers"),
    "gradients": ("gradients", "gradients being made", "sharded gradients", "root's gradients",
                  "block's gradients"),
    "optimizer": ("optimizer", "step counts", "step temporaries"),
    "activations and batch": ("activations", "batch"),
    "activation gradients": ("activation gradients",),
    "communication buffers": ("DDP buckets", "all-gather output",
                              "previous all-gather output", "prefetched all-gather output",
                              "reduce-scatter input",
                              "reduce-scatter output"),
}


def calculator_table(width, depth, batch, ranks, dtype, optimizer):
    """The calculator's answer for the rank with the highest peak, one row per strategy, in
    MB: what that rank holds at its peak, by kind (the columns add up to the peak), and the
    point of the step where the peak falls."""
    with torch.device("meta"):
        model = WideMLP(width, depth)
    peaks = peak_plan(model, batch, ranks, DTYPES[dtype], optimizer, units=model.blocks)
    rows = {}
    for strategy, per_rank in peaks.items():
        top = max(per_rank, key=lambda row: row["peak"])
        rows[strategy] = {f"{column} (MB)": sum(top["parts"].get(part, 0) for part in parts)
                          / 1e6 for column, parts in PEAK_COLUMNS.items()}
        rows[strategy].update({"peak (MB)": top["peak"] / 1e6, "peak falls at": top["at"]})
    table = pd.DataFrame(rows).T
    table.index.name = "strategy"
    return table


def calculator_cases(cases):
    """calculator_table for several cases, one after the other: {title: table}."""
    return {f"WideMLP({c['width']}, {c['depth']}), {c['ranks']} rank(s), batch {c['batch']}, "
            f"{c['dtype']}, {c['optimizer']}": calculator_table(**c) for c in cases}


def calculator_form(width, depth, batch, ranks, dtype="float64", optimizer="sgd-momentum"):
    """An ipywidgets form around calculator_table, filled with the given values: its table is
    an HTML widget, so the page built from the executed notebook shows the first answer."""
    import ipywidgets as widgets
    fields = {"width": widgets.BoundedIntText(width, min=1, max=65536, description="width"),
              "depth": widgets.BoundedIntText(depth, min=1, max=256, description="depth"),
              "batch": widgets.BoundedIntText(batch, min=1, max=1 << 20,
                                              description="global batch"),
              "ranks": widgets.BoundedIntText(ranks, min=1, max=4096, description="ranks"),
              "dtype": widgets.Dropdown(options=list(DTYPES), value=dtype, description="dtype"),
              "optimizer": widgets.Dropdown(options=list(STATES_PER_PARAMETER), value=optimizer,
                                            description="optimizer")}
    answer = widgets.HTML()

    def update(change=None):
        values = {name: field.value for name, field in fields.items()}
        try:
            table = calculator_table(**values)
            answer.value = table.to_html(float_format="{:,.2f}".format)
        except ValueError as error:  # a batch that does not split over the ranks
            answer.value = f"<p>{error}</p>"

    for field in fields.values():
        field.observe(update, names="value")
    update()
    return widgets.VBox([widgets.HBox(list(fields.values())[:3]),
                         widgets.HBox(list(fields.values())[3:]), answer])


def read_collectives(path):
    """collectives.json: the tiny layer's pieces on every rank, in rank order."""
    return sorted(json.loads(open(path).read()), key=lambda record: record["rank"])


def collective_steps(pieces):
    """FSDP's two collectives computed from the ranks' pieces as they were before: the
    all-gather puts every rank's shard, in rank order, into one whole tensor on every rank;
    the reduce-scatter averages the ranks' gradients and gives rank r the r-th piece
    (torch.chunk's cut along the first dimension). Returns the four grids (ranks x numbers)."""
    world = len(pieces)
    shards = torch.tensor([sum(p["shard before all-gather"], []) for p in pieces],
                          dtype=torch.float64)
    grads = torch.tensor([sum(p["gradient before reduce-scatter"], []) for p in pieces],
                         dtype=torch.float64)
    rows = len(pieces[0]["gradient before reduce-scatter"])
    average = (grads.sum(0) / world).reshape(rows, -1)
    return {"shard before all-gather": shards,
            "whole after all-gather": shards.reshape(1, -1).repeat(world, 1),
            "gradient before reduce-scatter": grads,
            "shard after reduce-scatter": torch.stack(
                [piece.reshape(-1) for piece in torch.chunk(average, world)])}


def slotted_grid(ax, pieces, names, title=None):
    """tensor_grid of the ranks' pieces, each in its own slot of the whole tensor (rank r's in
    slot r, its columns r x width to (r + 1) x width), the other slots blank."""
    world, width = pieces.shape
    whole = pieces.mean().repeat(world, world * width)   # blanks: a colour inside the range
    for rank in range(world):
        whole[rank, rank * width:(rank + 1) * width] = pieces[rank]
    tensor_grid(ax, whole, names, fmt="{:+.2f}", title=title)
    texts = list(ax.texts)
    for rank in range(world):
        for slot in range(world):
            if slot != rank:
                for text in texts[(rank * world + slot) * width:(rank * world + slot + 1) * width]:
                    text.remove()
                ax.add_patch(Rectangle((slot * width - 0.5, rank - 0.5), width, 1, fc="white",
                                       ec="#cccccc", lw=0.8, zorder=1))


def draw_collectives(axes, pieces):
    """Four grids, one rank a row, each as wide as the whole weight: the shards before the
    all-gather, each in its own slot (rank r's in slot r), and the whole weight after it; each
    rank's gradient before the reduce-scatter, and each rank's piece of the average after it,
    in its slot. Arrows show who sends what: rank r's shard to slot r of every rank; slot r of
    every rank's gradient to rank r. The "after" grids are computed from the "before" ones
    (collective_steps); returns them, with how far they are from what torch's collectives left
    on each rank."""
    grids = collective_steps(pieces)
    names = [f"rank {p['rank']}" for p in pieces]
    world, width = grids["shard before all-gather"].shape
    titles = {"shard before all-gather": "all-gather: rank r's shard (above) lands in slot r "
                                         "on every rank (below)",
              "gradient before reduce-scatter": "reduce-scatter: the ranks' gradients (above); "
                                                "rank r keeps slot r's average (below)"}
    for ax, (name, grid) in zip(axes, grids.items()):
        if grid.shape[1] == width:
            slotted_grid(ax, grid, names, titles.get(name))
        else:
            tensor_grid(ax, grid, names, fmt="{:+.2f}", title=titles.get(name))
        for bound in range(width, world * width, width):   # a line between the slots
            ax.axvline(bound - 0.5, color="#333333", lw=2)
    fig = axes[0].figure
    if fig.get_layout_engine() is not None:   # room between the grids for the arrows
        fig.get_layout_engine().set(hspace=0.1)
    for rank in range(world):
        middle = (rank + 0.5) * width - 0.5
        for (top, start), (bottom, end) in (((axes[0], rank + 0.3), (axes[1], -0.5)),
                                            ((axes[2], world - 0.5), (axes[3], rank - 0.3))):
            fig.add_artist(ConnectionPatch((middle, start), (middle, end), "data", "data",
                                           axesA=top, axesB=bottom, arrowstyle="-|>", lw=2,
                                           mutation_scale=14, color=colour("communication"),
                                           zorder=5))
    real = {name: torch.tensor([sum(p[name], []) for p in pieces], dtype=torch.float64)
            for name in ("whole after all-gather", "shard after reduce-scatter")}
    gaps = {name: float((grids[name] - real[name]).abs().max()) for name in real}
    return grids, gaps


def collectives_allowed(pieces):
    """How far each drawn "after" may be from what torch's collectives left. The all-gather
    copies: nothing. The reduce-scatter adds the N ranks' gradients in gloo's order and divides
    (FSDP2 in float64: by a power of two before the sum, by the rest after it); the drawing adds
    them in rank order and divides by N. Each side rounds N times (N - 1 additions, one
    division), each time by at most half a float64 epsilon of a number no larger than S, the
    sum of the ranks' gradients' magnitudes at that place: so N * eps * S at most."""
    grads = torch.tensor([sum(p["gradient before reduce-scatter"], []) for p in pieces],
                         dtype=torch.float64)
    eps = torch.finfo(torch.float64).eps
    return {"whole after all-gather": 0.0,
            "shard after reduce-scatter": float(len(pieces) * eps * grads.abs().sum(0).max())}


def collectives_line(gaps, pieces):
    """The line under the drawing: its largest difference from torch's collectives on any
    rank, what rounding allows (collectives_allowed), and whether both are within it."""
    allowed = collectives_allowed(pieces)
    same = all(gaps[name] <= allowed[name] for name in allowed)
    return (f"the drawing against torch's collectives, largest difference on any rank: "
            f"all-gather {gaps['whole after all-gather']:.1e} (a copy: none allowed), "
            f"reduce-scatter {gaps['shard after reduce-scatter']:.1e} (rounding allows "
            f"{allowed['shard after reduce-scatter']:.1e}): "
            + ("the same" if same else "NOT the same"))


# The rest of the chapter's verdicts ------------------------------------------------------------

def held_whole_line(setup, step, root_bytes, block_bytes):
    """The line after the traffic table: the most weights a set-up of fsdp_anatomy.py held whole
    at once, and whether that is the root and one block, as FSDP with each block sharded holds."""
    most = step["most_whole_weight_bytes"]
    parts = f"the root {root_bytes / 1e6:.2f} MB + one block {block_bytes / 1e6:.2f} MB"
    return (f"{setup} held at most {most / 1e6:.2f} MB whole (at the start of "
            f"{' '.join(step['most_whole_at'])}): "
            + (parts if most == root_bytes + block_bytes else f"NOT {parts}"))


def all_plain(state):
    """Whether every tensor of a state dict is a plain torch.Tensor (no DTensor, no shard of a
    mesh that lived only in the run)."""
    return all(type(tensor) is torch.Tensor for tensor in state.values())


def optimizer_holds(optimizer, model):
    """Whether the optimizer holds every parameter the model has now (the same tensors, not
    equal ones)."""
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    return all(id(p) in held for p in model.parameters())
