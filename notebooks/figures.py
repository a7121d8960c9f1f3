"""The book's figures: one look, drawn from what a run recorded, never from typed numbers.

    from notebooks.figures import new_figure, timeline, stacked_bars, tensor_grid, animate

Each function takes data a run produced (a run's files, hooks, profiler events, tensors) and
draws it on a matplotlib Axes; the chapter's cell gathers the data, draws, and shows one figure.
The caption and the alt text live in the cell's metadata (`mystnb.figure`, `mystnb.image.alt`),
so the page numbers the figure and each edition captions it in its own language.
"""
import re

import matplotlib
import matplotlib.pyplot as plt

# Sizes for a phone as much as a laptop: a figure at most 7 inches wide, text 11 points or more.
WIDTH = 7.0
STYLE = {"font.size": 11, "axes.titlesize": 11, "axes.labelsize": 11, "legend.fontsize": 10,
         "xtick.labelsize": 10, "ytick.labelsize": 10, "figure.dpi": 100, "savefig.dpi": 110,
         "axes.spines.top": False, "axes.spines.right": False, "figure.constrained_layout.use": True}
# One colour per kind of work, the same in every chapter (matplotlib's colour-blind-safe cycle).
KINDS = {"compute": "#0173b2", "forward": "#0173b2", "backward": "#56b4e9",
         "communication": "#de8f05", "all-reduce": "#de8f05", "gather": "#de8f05",
         "wait": "#cccccc", "idle": "#eeeeee", "data": "#029e73", "copy": "#cc78bc",
         "optimizer": "#ca9161", "other": "#949494", "gradient ready": "#d55e00"}
# The parts of a training step as ddp_scripts/recorders/step_parts.py names them, in their kinds' colours.
KINDS.update({"data wait": KINDS["data"], "copy to device": KINDS["copy"],
              "backward compute": KINDS["backward"],
              "communication not hidden": KINDS["communication"],
              "other (loop, timers)": KINDS["other"]})
PALETTE = ["#0173b2", "#de8f05", "#029e73", "#d55e00", "#cc78bc", "#ca9161", "#fbafe4",
           "#949494", "#ece133", "#56b4e9"]
matplotlib.rcParams.update(STYLE)


def colour(name, index=0):
    """The colour of a kind of work (KINDS), or the index-th colour of the palette."""
    return KINDS.get(name, PALETTE[index % len(PALETTE)])


def new_figure(rows=1, columns=1, height=3.2, width=WIDTH, **kwargs):
    """(figure, axes) of the book's size; kwargs go to plt.subplots."""
    return plt.subplots(rows, columns, figsize=(width, height), **kwargs)


def timeline(ax, rows, unit="ms", legend=True):
    """Intervals on one line per row (a rank, a device, a stream), as a run recorded them.

    rows: {row label: [(start, end, kind), ...]}, times in `unit` from a common origin; kind
    names the work (a key of KINDS, or any label: it gets a palette colour and a legend entry).
    Returns the drawn bars as {row label: [(start, width, kind), ...]} for a test to read back.
    """
    drawn, kinds = {}, []
    labels = list(rows)
    for y, label in enumerate(labels):
        drawn[label] = []
        for start, end, kind in rows[label]:
            if kind not in kinds:
                kinds.append(kind)
            ax.broken_barh([(start, end - start)], (y - 0.35, 0.7),
                           facecolors=colour(kind, kinds.index(kind)), edgecolor="#333333",
                           linewidth=0.5)
            drawn[label].append((start, end - start, kind))
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)   # the first row on top
    ax.set_xlabel(f"time ({unit})")
    if legend and kinds:
        handles = [plt.Rectangle((0, 0), 1, 1, color=colour(k, kinds.index(k))) for k in kinds]
        ax.legend(handles, kinds, loc="upper center", bbox_to_anchor=(0.5, -0.25),
                  ncol=min(len(kinds), 4), frameon=False)
    return drawn


def stacked_bars(ax, bars, unit="", total=None, horizontal=True):
    """One bar per entry, stacked from its parts, in the order given.

    bars: {bar label: {part: value}}; the parts' order is the first bar's, then any new ones.
    total: {bar label: measured total}, drawn as a tick, so a remainder the parts leave shows.
    Returns {bar label: [(part, start, value)]} as drawn.
    """
    parts = []
    for values in bars.values():
        parts += [part for part in values if part not in parts]
    drawn = {}
    put = ax.barh if horizontal else ax.bar
    for position, (label, values) in enumerate(bars.items()):
        start, drawn[label] = 0.0, []
        for index, part in enumerate(parts):
            value = values.get(part, 0.0)
            if value:
                put(position, value, 0.6, start, color=colour(part, index),
                    label=part if part not in ax.get_legend_handles_labels()[1] else None)
                drawn[label].append((part, start, value))
            start += value
        if total and label in total:
            marker = dict(marker="|" if horizontal else "_", s=900, color="black", zorder=3)
            point = (total[label], position) if horizontal else (position, total[label])
            ax.scatter(*point, **marker, label=None if position else "measured total")
    ticks = (ax.set_yticks if horizontal else ax.set_xticks)
    ticks(range(len(bars)), list(bars))
    if horizontal:
        ax.invert_yaxis()
        ax.set_xlabel(unit)
    else:
        ax.set_ylabel(unit)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=min(len(parts) + 1, 3),
              frameon=False)
    return drawn


def tensor_grid(ax, values, row_labels=(), column_labels=(), fmt="{:.2f}", highlight=None,
                title=None):
    """A small tensor as a table of coloured cells with its values written in.

    values: a 2-d tensor, array or nested list (a 1-d one is one row). highlight: a boolean grid
    of the same shape; highlighted cells get a thick border (a chunk in flight, a padded sample).
    Returns the texts written, row by row, for a test to compare with the data.
    """
    import numpy as np
    grid = np.asarray(values.detach().cpu() if hasattr(values, "detach") else values, dtype=float)
    grid = grid.reshape(1, -1) if grid.ndim == 1 else grid
    ax.imshow(grid, cmap="Blues", aspect="auto", vmin=grid.min() - 0.25 * (np.ptp(grid) or 1),
              vmax=grid.max() + 0.25 * (np.ptp(grid) or 1))
    texts = []
    for r in range(grid.shape[0]):
        texts.append([])
        for c in range(grid.shape[1]):
            text = fmt.format(grid[r, c])
            ax.text(c, r, text, ha="center", va="center", fontsize=10)
            texts[-1].append(text)
            if highlight is not None and np.asarray(highlight)[r, c]:
                ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, lw=3,
                                           edgecolor=colour("communication")))
    ax.set_xticks(range(grid.shape[1]), list(column_labels) or [""] * grid.shape[1])
    ax.set_yticks(range(grid.shape[0]), list(row_labels) or [""] * grid.shape[0])
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    if title:
        ax.set_title(title)
    return texts


def animate(fig, draw_frame, frames, interval_ms=900):
    """An animation as self-contained HTML (frames embedded, player inline: no request leaves the
    page): draw_frame(i) redraws the figure for frame i. Returns IPython's HTML, to display."""
    from IPython.display import HTML
    from matplotlib.animation import FuncAnimation
    animation = FuncAnimation(fig, draw_frame, frames=frames, interval=interval_ms, repeat=False)
    page = animation.to_jshtml(default_mode="once")
    plt.close(fig)
    return HTML(offline_player(page))


# matplotlib's player draws its buttons with Font Awesome 4 from a CDN: on a page read offline
# (or from a site that makes no outside request) the buttons would be blank. Plain symbols,
# from fonts every system has (each button keeps its title and aria-label).
PLAYER_ICONS = {"fa fa-minus": "−", "fa fa-fast-backward": "«", "fa fa-step-backward": "‹",
                "fa fa-play fa-flip-horizontal": "◀", "fa fa-pause": "||", "fa fa-play": "▶",
                "fa fa-step-forward": "›", "fa fa-fast-forward": "»", "fa fa-plus": "+"}


def offline_player(page):
    """The player's HTML with no outside link: its icons as text."""
    page = re.sub(r"<link[^>]*font-awesome[^>]*>", "", page)
    return re.sub(r'<i class="([^"]+)"></i>',
                  lambda m: f"<span>{PLAYER_ICONS.get(m.group(1), '?')}</span>", page)

