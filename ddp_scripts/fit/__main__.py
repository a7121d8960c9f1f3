"""Will a model fit on each rank, and where in the step is its peak?

    python -m ddp_scripts.fit --model torchvision.models:resnet50 --input-shape 3,224,224 \
        --batch-size 32 --optimizer adamw --strategy fsdp --ranks 8 --gpu-memory 80GB

The model is built with no memory (its shapes only), so a model far larger than this
machine can be asked about, on a laptop with no GPU. For each rank it prints the peak the
rules predict, where in the step it falls and its bytes by kind; then the peak of torch's
own tracker over the same step (FakeTensorMode: nothing allocated) and the gap between them;
and whether the peak fits --gpu-memory. --json prints the same as one JSON object.
"""
import json
import sys

import torch

from ddp_scripts.cli import run_cli
from ddp_scripts.fit import trace
from ddp_scripts.fit.check import GPUS, fit, memory_size
from ddp_scripts.options import ArgumentParser, count

STRATEGIES = {"single": "one process", "ddp": "DDP", "fsdp": "FSDP",
              "fsdp-keep": "FSDP, not resharded after forward"}


def gib(n):
    return f"{n / 2**30:,.2f} GiB" if n >= 2**28 else f"{n / 2**20:,.2f} MiB"


def report(answer):
    setup = answer["setup"]
    lines = [f"{setup['model']}: batch {setup['batch']} per rank, "
             f"{'x'.join(map(str, setup['input_shape']))} {setup['input_dtype']}; "
             f"{setup['optimizer']}, {setup['precision']}, "
             f"{'checkpointing each unit' if setup['checkpointing'] else 'no checkpointing'}; "
             f"{STRATEGIES[setup['strategy']]}"
             + (f" on {setup['ranks']} ranks" if setup["strategy"] != "single" else "")]
    units = answer["units"]
    lines.append(f"units (sharded and checkpointed alike): {len(units)}"
                 + (f", {units[0]} ... {units[-1]}" if units else ""))
    for note in answer["notes"]:
        lines.append(f"note: {note}")
    seen = set()
    for row in answer["ranks"]:
        if row["rank"] in seen:
            continue
        seen.update(row["alike"])
        others = ", ".join(map(str, row["alike"][1:]))
        lines.append(f"rank {row['rank']}" + (f" (ranks {others} the same)" if others else "") + ":")
        lines.append(f"  predicted peak  {gib(row['predicted_peak_bytes'])} at {row['peak_point']}")
        lines.append("    " + ", ".join(f"{k} {gib(v)}" for k, v in row["by_kind"].items()))
        if "tracker_peak_bytes" in row:
            lines.append(f"  torch's tracker {gib(row['tracker_peak_bytes'])} at "
                         f"{row['tracker_point']} (FakeTensorMode: nothing allocated)")
            share = row["gap_bytes"] / row["tracker_peak_bytes"]
            verdict = ("agrees" if row["agrees"] else
                       f"differs most in {row['differs']}: the rules have "
                       f"{gib(row['by_kind'][row['differs']])}, the tracker "
                       f"{gib(row['tracker_by_kind'][row['differs']])}")
            lines.append(f"  gap {share:+.1%} (tolerance {answer['tolerance']:.0%}): {verdict}")
        if "fits" in row:
            spare = answer["gpu_memory_bytes"] - row["predicted_peak_bytes"]
            lines.append(f"  fits {gib(answer['gpu_memory_bytes'])}: " +
                         (f"yes, {gib(spare)} to spare" if row["fits"] else
                          f"no, {gib(-spare)} short"))
    return "\n".join(lines)


def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True,
                        help="module:callable or file.py:callable, e.g. torchvision.models:resnet50")
    parser.add_argument("--kwargs", default="{}", help="the callable's keyword arguments, as JSON")
    parser.add_argument("--input-shape", type=str, required=True, help="one sample, e.g. 3,224,224")
    parser.add_argument("--input-dtype", choices=sorted(trace.INPUT_DTYPES), default="float32",
                        help="long: token ids (zeros)")
    parser.add_argument("--batch-size", type=count, default=32, help="per rank")
    parser.add_argument("--optimizer", choices=["sgd", "sgd-momentum", "adam", "adamw"],
                        default="adamw")
    parser.add_argument("--precision", choices=list(trace.PRECISIONS), default="float32",
                        help="bf16-autocast: float32 weights, bfloat16 compute; bf16: all bfloat16; "
                        "float64: as the book's exact comparisons train")
    parser.add_argument("--checkpointing", action="store_true",
                        help="activation checkpointing of each unit")
    parser.add_argument("--strategy", choices=list(STRATEGIES), default="single",
                        help="fsdp-keep: FSDP without resharding after forward")
    parser.add_argument("--ranks", type=count, default=None, help="default: 1, or 2 for ddp/fsdp")
    parser.add_argument("--units", default=None,
                        help="the class of module to shard and checkpoint (default: the "
                             "repeating block that holds the most parameters)")
    parser.add_argument("--gpu-memory", default=None,
                        help="e.g. 80GB, 24GiB, or a card: " + ", ".join(GPUS))
    parser.add_argument("--no-tracker", action="store_true", help="the rules only (faster)")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args()
    gpu_memory = memory_size(args.gpu_memory) if args.gpu_memory else None
    ranks = args.ranks or (1 if args.strategy == "single" else 2)
    model = trace.build(args.model, trace.parse_kwargs(args.kwargs))
    units = trace.units_of(model, args.units)
    setup = {"model": args.model, "kwargs": args.kwargs,
             "input_shape": trace.input_shape(args.input_shape),
             "input_dtype": trace.INPUT_DTYPES[args.input_dtype], "batch": args.batch_size,
             "optimizer": args.optimizer, "precision": args.precision,
             "checkpointing": args.checkpointing, "strategy": args.strategy, "ranks": ranks}
    torch.set_num_threads(1)
    try:
        answer = fit(model, units, setup, track=not args.no_tracker, gpu_memory=gpu_memory)
    except KeyboardInterrupt:   # it writes nothing: nothing is left half done
        print("error: interrupted (Ctrl-C); nothing was written", file=sys.stderr)
        sys.exit(130)
    print(json.dumps(answer) if args.json else report(answer))


if __name__ == "__main__":
    run_cli(main)
