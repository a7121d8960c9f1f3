"""Chapter 2's figures, the training run's losses and the clock read two ways, and its checks.

    from notebooks.loop_figures import loss_curves, clock_bars, made_before_the_move, streams_line

Both figures draw what the chapter's cells recorded (the losses of every batch and epoch; the
times of a matrix product), on an Axes from notebooks.figures.new_figure, and return what they
drew. `made_before_the_move` moves a model after its optimizer was made and says whether the
optimizer still holds the model's weight; `streams_line` reads the times of a copy and a matrix
product queued on one stream and on two.
"""
import math

from notebooks.figures import colour

# Rounds timed with CUDA events differ by a few percent from one measurement to the next (the
# GPU's clock, other work on it): a time counts as clearly less than another only below
# CLEARLY_LESS times it.
CLEARLY_LESS = 0.9


def loss_curves(ax, history, batch_losses, steps_per_epoch):
    """Training loss per batch and per epoch, test loss per epoch, and the loss of guessing.

    history: one dict per epoch with "epoch", "train_loss" and "test_loss"; batch_losses: every
    batch's loss in order. A batch's loss is drawn at the fraction of the epochs done after it,
    an epoch's mean training loss in the middle of its epoch, its test loss at its end.
    Returns {label: (xs, ys)} as drawn.
    """
    epochs = [row["epoch"] for row in history]
    lines = {
        "train loss, each batch": ([(i + 1) / steps_per_epoch for i in range(len(batch_losses))],
                                   list(batch_losses)),
        "train loss, epoch mean": ([e - 0.5 for e in epochs], [r["train_loss"] for r in history]),
        "test loss": (epochs, [row["test_loss"] for row in history]),
    }
    styles = {"train loss, each batch": dict(alpha=0.3, color=colour("compute")),
              "train loss, epoch mean": dict(marker="o", color=colour("compute")),
              "test loss": dict(marker="s", color=colour("communication"))}
    for label, (xs, ys) in lines.items():
        ax.plot(xs, ys, label=label, **styles[label])
    guess = math.log(10)
    ax.axhline(guess, color="grey", linestyle=":", label="guessing (ln 10)")
    lines["guessing (ln 10)"] = ([], [guess])
    ax.set_xlabel("epoch")
    ax.set_ylabel("cross-entropy")
    ax.legend(loc="upper right")
    return lines


def clock_bars(ax, timings):
    """Milliseconds per matrix product, one group of bars per device: the clock read without
    waiting for the device, after waiting, and (on CUDA) CUDA events.

    timings: {device: {way of timing: ms}}, the chapter's timing table as a dict of rows (a
    missing or NaN value is not drawn). Returns {device: [(way, ms)]} as drawn.
    """
    ways = []
    for row in timings.values():
        ways += [way for way in row if way not in ways]
    height = 0.8 / max(len(ways), 1)
    drawn = {}
    for position, (device, row) in enumerate(timings.items()):
        drawn[device] = []
        for index, way in enumerate(ways):
            value = row.get(way)
            if value is None or value != value:   # missing, or NaN
                continue
            ax.barh(position + (index - (len(ways) - 1) / 2) * height, value, height,
                    color=colour("", index), label=way if position == 0 or way not in
                    ax.get_legend_handles_labels()[1] else None)
            drawn[device].append((way, value))
    ax.set_yticks(range(len(timings)), list(timings))
    ax.invert_yaxis()
    ax.set_xlabel("ms per product")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=min(len(ways), 3),
              frameon=False)
    return drawn


def made_before_the_move(target):
    """Create an SGD optimizer, then move the model to `target` (a device or a dtype): does the
    optimizer hold net's weight? One row of the chapter's table."""
    import torch
    from ddp_scripts.models import Net
    net = Net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)  # before the move, on purpose
    returned = net.to(target)
    held = optimizer.param_groups[0]["params"][0]
    return {"move": f"net.to({target})", "returns net itself": returned is net,
            "optimizer holds net's weight": held is net.conv1.weight,
            "optimizer's weight": f"{held.device}, {held.dtype}",
            "net's weight": f"{net.conv1.weight.device}, {net.conv1.weight.dtype}"}


def streams_line(alone, one, two):
    """What a copy and a matrix product did on one stream and on two, in one sentence.

    alone: {"copy alone": ms, "product alone": ms}; one, two: ms per round of both, queued on one
    stream and on two. On one stream the product waits for the copy when the round takes about
    the two times added up; on two the copy ran beside the product when the round took clearly
    less than on one."""
    added = sum(alone.values())
    waited = one >= CLEARLY_LESS * added
    overlapped = two <= CLEARLY_LESS * one
    return (f"On one stream a round took {one:.2f} ms, against {added:.2f} ms for the two alone "
            "added up" + (": the product waited for the copy." if waited
                          else ", clearly less than their sum.")
            + f" On two streams it took {two:.2f} ms"
            + (f", {one - two:.2f} ms less: the copy ran beside the product." if overlapped
               else ": no clear gain from the second stream here."))
