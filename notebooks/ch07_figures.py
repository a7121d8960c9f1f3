"""Chapter 7's figures: a step taken apart (ddp_scripts/step_parts.py's files), and the speed-ups
of the article, of the recorded GPU machine and of this build's run, side by side.

Each function takes what a run wrote and draws it with notebooks.figures; it returns what it
drew, so a test can hold the drawing to the data.
"""
import json

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
                                "the model is too small for its communication",
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
