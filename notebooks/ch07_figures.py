"""Chapter 7's figures: a step taken apart (ddp_scripts/recorders/step_parts.py's files), and the speed-ups
of the article, of the recorded GPU machine and of this build's run, side by side.

Each function takes what a run wrote and draws it with notebooks.figures; it returns what it
drew, so a test can hold the drawing to the data.
"""
import json
import math
import textwrap

from ddp_scripts.measure import benchmark
from ddp_scripts.recorders.step_parts import (PARTS, REMAINDER, SPREAD_GROUPS, grew_most,
                                             part_that_grew, predicted_ratio)
from notebooks.figures import colour, stacked_bars

# Why a part grows from one process to N with the same threads each, said once, for the
# cell and the figure's reader.
WHY = {
    "data wait": "the loader prepares each batch in the training process, and the step waits for it",
    "copy to device": "more bytes, or slower copies, between the host and the device",
    "forward": "each process gets less of a core: the processes, their threads and other "
               "programs share the cores",
    "backward compute": "each process gets less of a core: the processes, their threads and "
                        "other programs share the cores",
    "communication not hidden": "backward waits for the all-reduce: for the other ranks to "
                                "reach it, then for the gradients to travel",
    "optimizer": "each process gets less of a core for the optimizer's step",
    REMAINDER: "the loop itself, between the timed phases, took longer",
}
# Why a part of the step put together from its parts (step_parts.step_from_parts) grows from
# one process with every core to N processes that split the cores.
WHY_GAP = {
    "compute": "the processes computed their shares of the batch more slowly than one process "
               "computed all of it with every core",
    "waiting for the other ranks": "one rank reached the all-reduce first and waited for the "
                                   "other",
    "all-reduce not hidden": "backward waited for the gradients to travel, with every rank "
                             "there, and no computation hid it",
}
US = 1e6  # seconds to microseconds
# A run's wall time less its start-up (from the script's first line) and its epochs: under
# torchrun that includes the launcher starting the workers and ending them.
REST = "the rest (evaluation, exit;\nfor ddp also torchrun starting\nand ending its workers)"


def label(run, case):
    """A step_parts file's configuration for `case`, e.g. "2 processes x 1 thread"."""
    n, threads = run["processes"], run["cases"][case]["settings"]["threads_per_process"]
    return (f"{n} process{'es' if n > 1 else ''} x {threads} "
            f"thread{'s' if threads > 1 else ''}")


def per_sample(found):
    """One case of a run: each part and the measured step in microseconds per sample of the
    global batch (the same work whatever the number of processes)."""
    batch = found["settings"]["batch_size"]
    return {**{part: found["parts"][part] * US / batch for part in [*PARTS, REMAINDER]},
            "measured step": found["step"] * US / batch}


def configurations(runs, case):
    """{configuration label: the case as that run recorded it}, for the runs that ran it."""
    return {label(run, case): run["cases"][case] for run in runs.values() if case in run["cases"]}


def unreliable(found):
    """" (unreliable: ...)" for a case whose steps spread more than the benchmark allows,
    else ""."""
    if found.get("reliable", True):
        return ""
    return (f" (unreliable: its {SPREAD_GROUPS} runs of steps spread {found['spread']:.2f}x, "
            f"more than {benchmark.RELIABLE_SPREAD}x)")


def step_table(runs, cases):
    """One row per case and configuration: the parts and the step in us per sample, the
    speed, and how much of a core forward got (CPU time over wall time)."""
    import pandas as pd
    rows = {}
    for case in cases:
        for name, found in configurations(runs, case).items():
            rows[(case, name)] = {**per_sample(found),
                                  "samples/s": found["settings"]["batch_size"] / found["step"],
                                  "forward CPU/wall": found["cpu share"]["forward"]}
    return pd.DataFrame(rows).T.rename_axis(["case", "configuration"])


def compared(runs, case):
    """(one, many): the N-process run of `case` and the one-process run with as many
    threads per process, so that what grew is what the processes added."""
    many = [run for run in runs.values() if run["processes"] > 1 and case in run["cases"]][0]
    threads = many["cases"][case]["settings"]["threads_per_process"]
    one = [run for run in runs.values() if run["processes"] == 1 and case in run["cases"]
           and run["cases"][case]["settings"]["threads_per_process"] == threads][0]
    return one, many


def grew(runs, case):
    """(part, us per sample it grew by, one's label, many's label) for `case`, from one
    process to N with the same threads each."""
    one, many = compared(runs, case)
    part, by = part_that_grew(one["cases"][case], many["cases"][case])
    return part, by * US / many["cases"][case]["settings"]["batch_size"], label(one, case), \
        label(many, case)


def verdict(runs, case):
    """The lines the cell prints for `case`: N processes against every one-process run, and
    the part that grew most from one process to N with the same threads each."""
    _, many = compared(runs, case)
    speed = {name: found["settings"]["batch_size"] / found["step"]
             for name, found in configurations(runs, case).items()}
    lines = [f"{case}: " + ", ".join(f"{name} {value:,.0f}" for name, value in speed.items())
             + " samples/s."]
    lines += [f"  {name}{unreliable(found)}." for name, found in configurations(runs, case).items()
              if unreliable(found)]
    for run in runs.values():
        if run["processes"] == 1 and case in run["cases"]:
            ratio = speed[label(many, case)] / speed[label(run, case)]
            how = f"{1 / ratio:.2f}x slower" if ratio < 1 else f"{ratio:.2f}x faster"
            shaky = not (run["cases"][case].get("reliable", True)
                         and many["cases"][case].get("reliable", True))
            lines.append(f"  {label(many, case)}: {how} than {label(run, case)}"
                         + (" (unreliable)." if shaky else "."))
    part, by, one_name, many_name = grew(runs, case)
    if round(by, 2) > 0:  # as printed: a growth under 0.01 us is none
        cause = why(runs, case, part)
        lines.append(f"  From {one_name} to {many_name}, the part that grew most: "
                     f"{part_label(runs, case, part)} (+{by:.2f} us per sample)"
                     + (f": {cause}." if cause else "."))
    else:
        lines.append(f"  From {one_name} to {many_name}, no part grew by 0.01 us per sample.")
    return lines


# A thread that gets a share s of a core takes 1/s as long for the same CPU time. A smaller
# share of a core is named as the cause of a part's growth only where forward's CPU share fell
# beyond either run's range over its groups of steps, and the 1/s it makes is at least this
# much of the part's growth, on the scale where the two multiply (log(before / now) over
# log(part's growth)): the share explains at least half of the growth.
CORE_SHARE_EXPLAINS = 0.5
UNTIMED_LABEL = "backward compute (includes the all-reduce, untimed under NCCL)"


def all_reduce_timed(found):
    """Whether an N-process case timed the all-reduce apart from backward: its file names the
    clock the hooks read ("all-reduce clock"). A file without one (an NCCL run from before the
    hooks read CUDA events, "communication timed": false) left it inside backward compute."""
    return found.get("all-reduce clock") is not None or found.get("communication timed", False)


def part_label(runs, case, part):
    """The part's name as the verdict prints it: backward compute says that it holds the
    all-reduce where the N-process run did not time it apart."""
    _, many = compared(runs, case)
    if part == "backward compute" and not all_reduce_timed(many["cases"][case]):
        return UNTIMED_LABEL
    return part


def why(runs, case, part):
    """WHY[part]; for a part that computes, a cause only where the clocks show one; None for a
    part that did not grow. On GPUs the GPU computes, so the CPU's clocks name none (the
    profiler of chapter 10 can); where the all-reduce sat untimed inside backward compute,
    none either. On the CPU: forward's CPU time over its wall time (forward waits for no
    other rank), in one process and in N. A fall beyond the range either run took over its
    groups of steps is named as the cause where it explains at least CORE_SHARE_EXPLAINS
    (half) of the part's growth. Otherwise the part's CPU time grew where it grew even at the
    ends of both ranges (the part's growth times the N-process run's lowest share over the
    one-process run's highest, above 1); any other change is too small to tell."""
    one_run, many_run = compared(runs, case)
    one, many = one_run["cases"][case], many_run["cases"][case]
    if many["parts"][part] <= one["parts"][part]:
        return None
    took = many["parts"][part] / one["parts"][part] if one["parts"][part] > 0 else math.inf
    if part not in ("forward", "backward compute", "optimizer"):
        return WHY[part]
    if many_run["device"].startswith("cuda"):
        return ("on GPUs the GPU computes it, so the CPU's clocks cannot say why; "
                "torch.profiler shows each kernel of the step (chapter 10)")
    if part == "backward compute" and not all_reduce_timed(many):
        return ("the all-reduce was not timed apart from backward, so the clocks cannot say "
                "which of the two grew")
    before, now = one["cpu share"]["forward"], many["cpu share"]["forward"]
    (low, high), (low_n, high_n) = (found["cpu share range"]["forward"] for found in (one, many))
    missing = [label(run, case) for run, share, top in ((one_run, before, high),
                                                        (many_run, now, high_n))
               if not (share > 0 and top > 0)]
    if missing:  # a thread that ran got some share of a core: 0 is no measurement
        return (f"forward's CPU time over its wall time was not measured in "
                f"{' and '.join(missing)}, so the clocks cannot say why")
    said = f"forward's CPU time over its wall time: {before:.2f} -> {now:.2f}"
    ranges = (f"over the groups of steps of each run {low:.2f}-{high:.2f} and "
              f"{low_n:.2f}-{high_n:.2f}")
    cpu_time = f"its CPU time took {took * now / before:.2f}x, {took * low_n / high:.2f}x at least"
    if not (high_n < low and now < before):
        if took * low_n / high > 1:
            return (f"not that the step's thread got less of a core ({said}; {ranges}): "
                    f"its CPU time grew ({cpu_time}; the part took {took:.2f}x)")
        return (f"too small to tell: within the runs' ranges the step's thread may have got "
                f"less of a core, and the part's CPU time may have fallen or grown ({said}; "
                f"{ranges}; the part took {took:.2f}x, {cpu_time})")
    slower = before / now  # how much longer the same CPU time takes with the smaller share
    explains = math.log(slower) / math.log(took)
    found = (f"{said}, so the same CPU time takes {slower:.2f}x as long; the part took "
             f"{took:.2f}x")
    if explains >= CORE_SHARE_EXPLAINS:
        return f"{WHY[part]} ({found})"
    return (f"too small to tell: the step's thread got less of a core, but that explains less "
            f"than half of the growth ({found}; {ranges})")


def communication_lines(runs, case):
    """Per rank of the N-process run: the all-reduce's time per step, its hidden and exposed
    shares, and the time it spent before the last rank had launched it."""
    _, many = compared(runs, case)
    found = many["cases"][case]
    clock = {"CUDA events": " (timed with CUDA events)"}.get(found.get("all-reduce clock"), "")
    lines = []
    for rank, breakdown in enumerate(found["ranks"]):
        comm = breakdown["communication"]
        total = comm["total"] * 1e3
        shares = (f"hidden {comm['hidden'] / comm['total']:.0%}, exposed "
                  f"{comm['exposed'] / comm['total']:.0%}" if comm["total"] else "none")
        lines.append(f"  rank {rank}: all-reduce{clock} {total:.2f} ms per step in "
                     f"{comm['buckets']:.0f} bucket(s): {shares}; "
                     f"{comm['waiting for other ranks'] * 1e3:.2f} ms of it before the "
                     "last rank had launched it")
    return lines


def benchmark_ratio(results, many, case):
    """The benchmark's ratio that the step's runs measure again, on equal work: ddp over cpu
    when the step's runs ran on the CPU, ddp over gpu on GPUs. ({"ratio", "words", "spreads"
    (base's, ddp's)}, None), or (None, why there is none to compare)."""
    table = benchmark.results_table(results)
    on_gpus = many["device"].startswith("cuda")
    base, column = ("gpu", "x 1 GPU") if on_gpus else ("cpu", "x CPU")
    for config in (base, "ddp"):
        if config not in table.index or table.loc[config, "status"] != "measured":
            return None, f"its {config} row was not measured"
    ddp = table.loc["ddp"]
    if (ddp["gpus"] > 0) != on_gpus:
        return None, (f"its ddp row ran on {'GPUs' if ddp['gpus'] else 'the CPU'}, the step's "
                      f"runs on {'GPUs' if on_gpus else 'the CPU'}")
    if ddp["processes"] != many["processes"]:
        return None, (f"its ddp row ran {ddp['processes']:.0f} processes, the step's runs "
                      f"{many['processes']}")
    batch = many["cases"][case]["settings"]["batch_size"]
    if results["settings"]["batch_size"] != batch:
        return None, (f"its global batch was {results['settings']['batch_size']}, the step's "
                      f"{batch}")
    words = (f"Benchmark (steady epochs, global batch {batch}): ddp, {ddp['processes']:.0f} "
             f"processes x {ddp['threads/process']:.0f} thread(s), {ddp[column]:.2f}x the "
             f"speed of the {base} run; their steady epochs spread {table.loc[base, 'spread']:.2f}x "
             f"({base}) and {ddp['spread']:.2f}x (ddp)")
    return {"ratio": float(ddp[column]), "words": words, "base": base,
            "spreads": [float(table.loc[base, "spread"]), float(ddp["spread"])]}, None


def benchmark_like_the_step(many, case):
    """The benchmark's command that measures what the step's N-process run ran: the same
    device, as many processes (on GPUs, as many visible GPUs, one process each), the same
    global batch."""
    batch = many["cases"][case]["settings"]["batch_size"]
    if many["device"].startswith("cuda"):
        visible = ",".join(str(gpu) for gpu in range(many["processes"]))
        configs = "gpu,ddp"
    else:  # no GPU visible: ddp runs as processes on the CPU
        visible, configs = "", f"cpu,ddp --cpu-processes {many['processes']}"
    return (f"CUDA_VISIBLE_DEVICES={visible} python ddp_scripts/measure/benchmark.py --configs "
            f"{configs} --batch-size {batch} --out runs/benchmark-like-the-step.json")


def agreement(measured, predicted, spreads):
    """("agree" | "disagree on the direction" | "disagree on the size", how many times apart
    the two ratios are, the bound): a ratio of two runs can be off by their two spreads
    multiplied (each run's speed moved that much while it ran), so two such ratios by all
    their runs' spreads multiplied. They agree only when both say the same direction (faster
    or slower) and are no further apart than that."""
    apart = max(measured, predicted) / min(measured, predicted)
    bound = 1.0
    for value in spreads:
        bound *= value
    if (measured < 1) != (predicted < 1):
        return "disagree on the direction", apart, bound
    return ("agree" if apart <= bound else "disagree on the size"), apart, bound


def ratio_from_parts_lines(results, runs, case="batch 64"):
    """The benchmark's ratio (its results file) beside the one the step's parts predict
    (step_parts.predicted_ratio: N processes against one process with every core, each step
    put together from its measured parts), with the verdict on the two and the part that
    grew most between the two runs."""
    _, many = compared(runs, case)
    one = max((run for run in runs.values() if run["processes"] == 1 and case in run["cases"]),
              key=lambda run: run["cases"][case]["settings"]["threads_per_process"])
    batch = many["cases"][case]["settings"]["batch_size"]
    parts = predicted_ratio(many, one, case)
    per_sample_ = {side: {part: value * US / batch for part, value in parts[side].items()}
                   for side in ("one", "many")}
    spreads = [one["cases"][case]["spread"], many["cases"][case]["spread"]]
    lines = [f"Step parts, {case}, put together from the measured parts, us per sample (the "
             f"loop and the timers left out):"]
    for side, run in (("one", one), ("many", many)):
        values = per_sample_[side]
        shown = [f"{part} {value:.2f}" for part, value in values.items()
                 if part == "compute" or value]
        lines.append(f"  {label(run, case)}: {' + '.join(shown)} = {sum(values.values()):.2f}")
    lines.append(f"  predicted ratio: {sum(per_sample_['one'].values()):.2f} / "
                 f"{sum(per_sample_['many'].values()):.2f} = {parts['ratio']:.2f}x; their "
                 f"steps spread {spreads[0]:.2f}x and {spreads[1]:.2f}x")
    gap = {part: per_sample_["many"][part] - per_sample_["one"].get(part, 0.0)
           for part in per_sample_["many"]}
    part, by = grew_most(per_sample_["one"], per_sample_["many"])
    grown = (f"the part that grew most: {part} (+{by:.2f}): {WHY_GAP[part]}" if round(by, 2) > 0
             else "no part grew")
    lines.append(f"  From {label(one, case)} to {label(many, case)}: " +
                 ", ".join(f"{name} {value:+.2f}" for name, value in gap.items()) +
                 f" us per sample; {grown}.")
    bench, why_not = benchmark_ratio(results, many, case)
    if bench is None:
        lines[:0] = [f"Benchmark: {why_not}: no ratio of its to compare.",
                     f"  To compare, run the benchmark as the step's runs ran: "
                     f"{benchmark_like_the_step(many, case)}; then pass its file to "
                     f"ch07_figures.ratio_from_parts_lines."]
        return lines
    lines.insert(0, bench["words"] + ".")
    shaky = [f"{label(run, case)}{unreliable(run['cases'][case])}"
             for run in (one, many) if unreliable(run["cases"][case])]
    shaky += [f"the benchmark's {config} row (spread {value:.2f}x, more than "
              f"{benchmark.RELIABLE_SPREAD}x)" for config, value
              in zip((bench["base"], "ddp"), bench["spreads"])
              if value > benchmark.RELIABLE_SPREAD]
    if shaky:
        lines.append("Not compared: " + "; ".join(shaky) + ": the benchmark compares no "
                     "ratio with such a speed in it.")
        return lines
    said, apart, bound = agreement(bench["ratio"], parts["ratio"], [*bench["spreads"], *spreads])
    side = "slower" if parts["ratio"] < 1 else "faster"
    single = "on one GPU" if bench["base"] == "gpu" else "with every core"
    if said == "agree":
        lines.append(f"The two ratios, {bench['ratio']:.2f}x and {parts['ratio']:.2f}x, are "
                     f"{apart:.2f}x apart; the four runs' spreads multiplied allow {bound:.2f}x: "
                     f"they agree. Both say the processes are {side} than one process "
                     f"{single}.")
        return lines
    load = max(run["load_average"][0] for run in runs.values())
    cores = min(run["usable_cores"] for run in runs.values())
    cause = ("the machine's load changed between the runs (load average up to "
             f"{load:.2f} on {cores} cores), or the epochs' other work (the loader, the "
             "all-reduce of the epoch's totals) weighs in")
    lines.append(f"The two ratios, {bench['ratio']:.2f}x and {parts['ratio']:.2f}x, are "
                 f"{apart:.2f}x apart; the four runs' spreads multiplied allow {bound:.2f}x: "
                 f"they {said}. Not reproduced on this run: {cause}.")
    return lines


def draw_step_parts(axes, runs, cases):
    """One panel per case, one bar per configuration: the parts in us per sample, the
    measured step as a tick."""
    drawn, legend = {}, {}
    for ax, case in zip(axes, cases):
        bars, totals = {}, {}
        for name, found in configurations(runs, case).items():
            values = per_sample(found)
            totals[name] = values.pop("measured step")
            bars[name] = values
        drawn[case] = stacked_bars(ax, bars, unit="us per sample", total=totals)
        ax.set_title(case, loc="left")
        ax.get_legend().remove()
        ax.set_xlabel("")
        legend.update(zip(*reversed(ax.get_legend_handles_labels())))
    axes[-1].set_xlabel("microseconds per sample (the same global batch in every run)")
    axes[0].figure.legend(list(legend.values()), list(legend), loc="outside lower center",
                          ncol=2, frameon=False)
    return drawn


# What a results file says about the machine and its runs (describe, in the chapter), and what
# other work on the machine did to the benchmark's threaded run and to its processes.

def load_line(hardware):
    """The load average (1 min) a results file recorded before and after its runs, and, where
    the load before them was at least half the usable cores, that other work was using the
    CPU when they started: the runs use every usable core, and that much other work takes a
    share of them. None where the file recorded no load."""
    if not hardware.get("load_average_before"):
        return None
    before, after = hardware["load_average_before"][0], hardware["load_average_after"][0]
    cores = hardware["cpu"]["usable_cores"]
    busy = before >= cores / 2  # measured before the runs: other work, not theirs
    return (f"load average (1 min) before/after the runs: {before} / {after} on {cores} cores"
            + (": other work was using the CPU when these runs started" if busy else ""))


def unreliable_lines(results):
    """A line for each measured configuration whose steady epochs spread more than the file
    allows (benchmark.results_table's "reliable"): UNRELIABLE, and its ratios not compared."""
    table = benchmark.results_table(results)
    bound = results.get("reliable_spread")
    unsteady = table[(table["status"] == "measured") & ~table["reliable"]]
    return [f"{config}: UNRELIABLE: its steady epochs spread {row['spread']:.2f}x, more than "
            f"the {bound}x allowed; the ratios that use it are not compared below."
            for config, row in unsteady.iterrows()]


def threads_against_processes(results):
    """What other work did to the benchmark's one process with several threads (cpu) and to
    its processes with one thread each (ddp on the CPU), read from each run's spread: one
    line, or None where the file cannot say (a run missing, without a spread, or ddp on
    GPUs)."""
    measured = {run["config"]: run for run in results["runs"] if run["status"] == "measured"}
    threaded, split = measured.get("cpu"), measured.get("ddp")
    if not (threaded and split and threaded.get("spread") and split.get("spread")
            and split["run_device"] == "cpu"):
        return None
    spreads = (f"fastest over slowest epoch: {threaded['spread']:.1f}x with "
               f"{threaded['threads_per_process']} threads in one process, "
               f"{split['spread']:.1f}x with {split['processes']} one-thread processes")
    if not threaded["reliable"] and split["reliable"]:
        return (f"Other work took cores during these runs ({spreads}). The threaded run"
                " collapsed, the processes slowed gently: the threads of one process wait"
                " for each other in every operation, so one busy core holds them all up; a"
                " process with one thread waits for no other.")
    if threaded["reliable"] and split["reliable"]:
        return (f"Both runs held steady here ({spreads}): other work did not take their"
                " cores for long enough to show.")
    if not threaded["reliable"] and not split["reliable"]:
        return (f"Other work took cores during these runs ({spreads}). Both runs were"
                " unsteady, so they cannot show whether the threads suffer more than the"
                " processes.")
    return f"Other work took cores during these runs ({spreads})."


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


def config_colour(config):
    """One colour per configuration, the same in every panel (benchmark.ROW_ORDER's order)."""
    order = list(benchmark.ROW_ORDER)
    return colour(config, order.index(config) if config in order else len(order))


def draw_speedups(axes, sources):
    """One panel per source ({title: {config: x CPU}}), one bar per configuration, each
    configuration in its own colour in every panel."""
    drawn = {}
    for ax, (title, speedups) in zip(axes, sources.items()):
        if not speedups:  # every speed unreliable or skipped: say so where the bars would be
            ax.text(0.5, 0.5, "no reliable speed-up to draw", transform=ax.transAxes,
                    ha="center", va="center", color="gray")
            ax.set_yticks([])
        drawn[title] = {}
        for y, (config, value) in enumerate(speedups.items()):
            ax.barh(y, value, 0.6, color=config_colour(config))
            drawn[title][config] = [(config, 0.0, value)]
        if speedups:
            ax.set_yticks(range(len(speedups)), list(speedups))
            ax.invert_yaxis()
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
                               REST:
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
