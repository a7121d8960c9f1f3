"""Chapter 9's figures, drawn from what ddp_scripts/practice/hooks.py recorded on the ranks.

    from notebooks.practice_figures import overlap_rows, draw_overlap, draw_no_sync, overlap_line

The chapter's cells and tests/figures/test_figures_ch09.py call the same functions.
"""
from notebooks.figures import colour, new_figure, timeline

TICK = 0.008   # a gradient's "ready" mark: an instant, drawn 0.8% of the step's span wide


def overlap_rows(steps_per_rank, step):
    """Timeline rows of one step: per rank, backward with its gradients' ready marks, then one
    row per bucket with its all-reduce (launched to finished). Times in ms from the moment
    the first rank began backward; every row of every bucket seen in any step is kept."""
    origin = min(steps[step]["backward_start"] for steps in steps_per_rank)
    buckets = sorted({b["index"] for steps in steps_per_rank for s in steps for b in s["buckets"]})
    end = max(max([s[step]["backward_end"]] + [b["finished"] for b in s[step]["buckets"]])
              for s in steps_per_rank)
    tick = TICK * (end - origin)
    rows = {}
    for rank, steps in enumerate(steps_per_rank):
        events = steps[step]
        last_ready = max(t for _, t in events["ready"])
        spans = [(events["backward_start"] - origin, last_ready - origin, "backward")]
        spans += [(t - origin, t - origin + tick, "gradient ready") for _, t in events["ready"]]
        rows[f"rank {rank} backward"] = spans
        for index in buckets:
            rows[f"rank {rank} bucket {index}"] = [
                (b["launched"] - origin, b["finished"] - origin, "all-reduce")
                for b in events["buckets"] if b["index"] == index]
    return rows


def overlap_line(steps_per_rank, step=-1):
    """Whether bucket 0's all-reduce was launched before the rank's last gradient was ready,
    in step `step` of every rank: one line."""
    late = [rank for rank, steps in enumerate(steps_per_rank)
            if steps[step]["buckets"][0]["launched"] >= max(t for _, t in steps[step]["ready"])]
    number = step % len(steps_per_rank[0]) + 1
    return f"step {number}: " + (
        "bucket 0's all-reduce started while backward still ran, on every rank" if not late
        else f"on rank(s) {late}, bucket 0's all-reduce started only after backward ended")


def draw_overlap(overlap, steps=(0, -1)):
    """Two timelines, one above the other: the first step (one bucket, sent after backward)
    and a later one (the rebuilt buckets, sent during backward). Returns (figure, {step
    title: what timeline drew})."""
    runs = overlap["steps_per_rank"]
    fig, axes = new_figure(len(steps), 1, height=3.0 * len(steps), sharex=True)
    drawn = {}
    for n, (ax, step) in enumerate(zip(axes, steps)):
        number = step % len(runs[0]) + 1
        rows = overlap_rows(runs, step)
        count = max(len(r[step]["buckets"]) for r in runs)
        title = f"step {number}: {count} bucket{'s' if count > 1 else ''}"
        drawn[title] = timeline(ax, rows, legend=n == len(steps) - 1)
        ax.set_title(title, loc="left")
        ax.tick_params(axis="x", labelbottom=True)   # numbered, though the panels share it
        if n < len(steps) - 1:
            ax.set_xlabel("")
    axes[-1].set_xlabel("time since the first rank began backward (ms)")
    return fig, drawn


def draw_no_sync(no_sync):
    """Above: one gradient's value on each rank after every micro-batch, with and without
    no_sync(). Below: the all-reduces DDP ran in each micro-batch. Returns (figure, {"grad":
    {line label: values}, "all_reduces": {bar label: counts}})."""
    runs = no_sync["per_rank"]
    fig, (top, bottom) = new_figure(2, 1, height=5.6, sharex=True)
    drawn = {"grad": {}, "all_reduces": {}}
    styles = {"without no_sync()": dict(linestyle="--", marker="s", markersize=9,
                                        fillstyle="none"),
              "with no_sync()": dict(linestyle="-", marker="o", markersize=5)}
    for run, per_rank in runs.items():
        for rank, micro in enumerate(per_rank):
            label = f"rank {rank}, {run}"
            x = [m["micro_batch"] for m in micro]
            values = [m["grad"] for m in micro]
            top.plot(x, values, color=colour("", rank), label=label, **styles[run])
            drawn["grad"][label] = values
    top.set_ylabel("a gradient element")
    top.legend(loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2, frameon=False)
    width = 0.38
    for n, (run, per_rank) in enumerate(runs.items()):
        micro = per_rank[0]
        x = [m["micro_batch"] + (n - 0.5) * width for m in micro]
        counts = [m["all_reduces"] for m in micro]
        bottom.bar(x, counts, width, color=colour("all-reduce") if n else colour("wait"),
                   edgecolor="#333333", linewidth=0.5, label=run)
        drawn["all_reduces"][run] = counts
    steps = [m["micro_batch"] for m in next(iter(runs.values()))[0] if m["optimizer_step"]]
    for ax in (top, bottom):
        for s in steps:
            ax.axvline(s + 0.5, color="#333333", linewidth=0.8, linestyle=":")
    most = max(max(c) for c in drawn["all_reduces"].values())
    bottom.set_ylabel("all-reduces")
    bottom.set_yticks(range(0, most + 1))
    bottom.set_ylim(0, most * 1.45)   # room above the bars for the legend
    bottom.set_xticks([m["micro_batch"] for m in next(iter(runs.values()))[0]])
    bottom.set_xlabel("micro-batch (dotted line: optimizer step)")
    bottom.legend(loc="upper center", ncol=2, frameon=False)
    return fig, drawn
