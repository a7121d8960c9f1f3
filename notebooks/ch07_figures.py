"""Chapter 7's figures: a step taken apart (ddp_scripts/step_parts.py's files), and the speed-ups
of the article, of the recorded GPU machine and of this build's run, side by side.

Each function takes what a run wrote and draws it with notebooks.figures; it returns what it
drew, so a test can hold the drawing to the data.
"""
import json
import textwrap

from ddp_scripts import benchmark
from ddp_scripts.step_parts import PARTS, REMAINDER, part_that_grew
from notebooks.figures import stacked_bars

# Why a part grows from one process to N, said once, for the cell and the figure's reader.
WHY = {
    "data wait": "the loader prepares each batch in the training process, and the step waits for it",
    "copy to device": "more bytes, or slower copies, between the host and the device",
    "forward": "each process gets less of a core: the processes, their threads and other "
               "programs share the cores",
    "backward compute": "each process gets less of a core: the processes, their threads and "
                        "other programs share the cores",
    "communication not hidden": "the all-reduce takes longer than the backward it overlaps: "
                                "too little compute per step to hide it, or processes that "
                                "wait for a core before they can send",
    "optimizer": "each process gets less of a core for the optimizer's step",
    REMAINDER: "the loop itself, between the timed phases, took longer",
}


def step_table(runs, case):
    """One row per run (label -> a step_parts file's dict): each part and the step, in ms."""
    import pandas as pd
    rows = {}
    for label, run in runs.items():
        found = run["cases"][case]
        rows[label] = {**{part: found["parts"][part] * 1e3 for part in [*PARTS, REMAINDER]},
                       "measured step": found["step"] * 1e3}
    return pd.DataFrame(rows).T


def grew(runs, case):
    """(part, ms it grew by, one's step ms, many's step ms), first run to last, for `case`."""
    one, many = (run["cases"][case] for run in runs.values())
    part, by = part_that_grew(one, many)
    return part, by * 1e3, one["step"] * 1e3, many["step"] * 1e3


def draw_step_parts(axes, runs, cases):
    """One panel per case, one bar per run: the parts in ms, the measured step as a tick."""
    drawn, legend = {}, {}
    for ax, case in zip(axes, cases):
        bars = {label: {part: run["cases"][case]["parts"][part] * 1e3
                        for part in [*PARTS, REMAINDER]} for label, run in runs.items()}
        totals = {label: run["cases"][case]["step"] * 1e3 for label, run in runs.items()}
        drawn[case] = stacked_bars(ax, bars, unit="ms per step", total=totals)
        ax.set_title(case, loc="left")
        ax.get_legend().remove()
        ax.set_xlabel("")
        legend.update(zip(*reversed(ax.get_legend_handles_labels())))
    axes[-1].set_xlabel("ms per step")
    axes[0].figure.legend(list(legend.values()), list(legend), loc="outside lower center",
                          ncol=2, frameon=False)
    return drawn


def article_speedups(path):
    """The article's speed-ups over its CPU, from the committed file of its four times."""
    article = json.loads(path.read_text())
    times = article["wall_s"]
    return {config: times["cpu"] / seconds for config, seconds in times.items()}, article


def measured_speedups(results):
    """x CPU per configuration of a benchmark results file: measured, reliable ratios only."""
    table = benchmark.results_table(results)
    keep = (table["status"] == "measured") & (table["ratios"] != "unreliable")
    return {config: float(value) for config, value in table.loc[keep, "x CPU"].items()
            if value == value}  # NaN: no CPU baseline in this file


def draw_speedups(axes, sources):
    """One panel per source ({title: {config: x CPU}}), one bar per configuration."""
    drawn = {}
    for ax, (title, speedups) in zip(axes, sources.items()):
        if not speedups:  # every speed unreliable or skipped: say so where the bars would be
            ax.text(0.5, 0.5, "no reliable speed-up to draw", transform=ax.transAxes,
                    ha="center", va="center", color="gray")
            ax.set_yticks([])
        bars = {config: {config: value} for config, value in speedups.items()}
        drawn[title] = stacked_bars(ax, bars, unit="speed-up over the CPU (x)") if bars else {}
        if ax.get_legend():
            ax.get_legend().remove()
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_title(title, loc="left")
        if ax is not axes[-1]:
            ax.set_xlabel("")
        for y, value in enumerate(speedups.values()):
            ax.text(value, y, f" {value:.2f}x", va="center")
    axes[-1].set_xlabel("speed-up over the CPU (x)")
    return drawn


def draw_run(left, right, results):
    """A benchmark run: where each configuration's wall time went (left), and its speed-ups
    (right), with no bar for a speed-up that has an unreliable speed in it."""
    runs = results["runs"]
    table = benchmark.results_table(results)
    names = [run["config"] for run in runs]
    bars, walls = {}, {}
    for y, run in enumerate(runs):
        bars[run["config"]] = {}
        if run["status"] != "measured":
            left.text(0, y, f"  {run['status']}", va="center", color="gray")
            continue
        epochs = sum(run["epoch_time_s"])
        bars[run["config"]] = {"start-up": run["startup_s"], "training epochs": epochs,
                               "the rest (evaluation, exit)":
                                   max(0.0, run["wall_s"] - run["startup_s"] - epochs)}
        walls[run["config"]] = run["wall_s"]
    drawn_wall = stacked_bars(left, bars, unit="wall time (s)", total=walls)
    left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1, frameon=False)
    width = 0.4
    x = range(len(names))
    # A speed-up with an unreliable speed in it (the run's or its baseline's): not drawn.
    shaky = [table.loc[config, "ratios"] == "unreliable" for config in names]
    drawn = lambda column: [0 if s else v for v, s in zip(table[column].fillna(0), shaky)]
    right.bar([i - width / 2 for i in x], drawn("x CPU"), width, label="vs CPU")
    right.bar([i + width / 2 for i in x], drawn("x 1 GPU"), width, label="vs one GPU")
    for i, config in enumerate(names):
        if table.loc[config, "status"] != "measured":
            right.text(i, 0.05, table.loc[config, "status"], ha="center", rotation=90,
                       color="gray")
        elif shaky[i]:
            right.text(i, 0.05, "left out", ha="center", rotation=90, color="gray")
    right.axhline(1.0, color="black", linewidth=0.8)
    right.set_xticks(list(x), names)
    right.set_ylabel("speed-up (steady epochs)")
    right.legend()
    unsteady = table[(table["status"] == "measured") & ~table["reliable"]]
    if len(unsteady):
        left_out = [config for config, s in zip(names, shaky) if s]
        spreads = ", ".join(f"{config} spread {spread:.1f}x" for config, spread
                            in unsteady["spread"].items())
        right.set_title(textwrap.fill(
            f"No speed-ups drawn for {', '.join(left_out)}: the steady epochs of "
            f"{spreads}, fastest over slowest (more than the "
            f"{results.get('reliable_spread')}x allowed). Other work held the cores then.",
            45))
    return drawn_wall, {"x CPU": drawn("x CPU"), "x 1 GPU": drawn("x 1 GPU")}
