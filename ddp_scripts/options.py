"""The command line: one set of options for every script, so every run is comparable.

Each number is checked as it is read (the types above build_parser); check_args then rejects
the options that contradict each other.
"""
import argparse
import math
import re

from ddp_scripts.cli import UsageError


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, with its errors said as every other bad input is: one line (a
    UsageError, which run_cli reports), not the usage text and then the error."""

    def error(self, message):
        # "argument --lr: must be ..." (the types below) reads "--lr must be ..."
        raise UsageError(re.sub(r"^argument (-[^:/ ]+)[^:]*: must be", r"\1 must be", message))


def number(kind, fits, what):
    """An argparse type: the text read as `kind` (int or float) if it `fits`, else the line
    that says why."""
    def read(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be {'a whole number' if kind is int else 'a number'}, got {text!r}") from None
        if not ((kind is int or math.isfinite(value)) and fits(value)):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text[:40]}")
        return value
    return read


# The types of the numeric options: every value is checked as the options are read.
count = number(int, lambda n: n >= 1, "at least 1")
non_negative_int = number(int, lambda n: n >= 0, "0 or more")
# torch.manual_seed takes up to 2**64 - 1, and the scripts add the epoch
seed_number = number(int, lambda n: 0 <= n < 2**63, "from 0 to 2**63 - 1")
positive_number = number(float, lambda x: x > 0, "a finite number above 0")
non_negative_number = number(float, lambda x: x >= 0, "a finite number, 0 or more")
# gloo refuses, in a traceback, a timeout of 1e10 s (it overflows)
seconds = number(float, lambda x: 0 < x <= 1e9, "a number of seconds above 0, at most 1e9")


def folder(text):  # "" would be the current directory, without a word
    if not text.strip():
        raise argparse.ArgumentTypeError("must be the name of a folder, got an empty string")
    return text


def build_parser(description):
    p = ArgumentParser(description=description)
    p.add_argument("--dataset", choices=["cifar10", "synthetic"], default="cifar10",
                   help="cifar10 falls back to synthetic (announced) when it cannot be had")
    p.add_argument("--no-synthetic-fallback", action="store_true",
                   help="cifar10: stop (exit 1) if CIFAR-10 cannot be loaded, not train on synthetic data")
    p.add_argument("--data-dir", default="data", help="where CIFAR-10 is downloaded")
    p.add_argument("--train-samples", type=count, default=None,
                   help="use only the first N training images (default: all; synthetic: 50000)")
    p.add_argument("--test-samples", type=count, default=None,
                   help="use only the first N test images (default: all; synthetic: 10000)")
    p.add_argument("--model", choices=["cnn", "resnet18"], default="cnn",
                   help="cnn: PyTorch's CIFAR-10 tutorial's; resnet18: as CIFAR-10 papers use it")
    p.add_argument("--epochs", type=count, default=2)
    p.add_argument("--batch-size", type=count, default=32, help="per process")
    p.add_argument("--lr", type=positive_number, default=0.01)
    p.add_argument("--momentum", type=non_negative_number, default=0.9)
    p.add_argument("--seed", type=seed_number, default=0)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], default="auto")
    p.add_argument("--threads", type=count, default=None,
                   help="torch CPU threads per process (default: cores / processes)")
    p.add_argument("--out", type=folder, required=True,
                   help="output directory: metrics.jsonl, checkpoint.pt")
    p.add_argument("--resume", action="store_true",
                   help="continue from OUT/checkpoint.pt, with the options it was trained with "
                        "(or start, if OUT holds no run)")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in OUT")
    p.add_argument("--stop-after-epoch", type=count, default=None,
                   help="stop after this epoch, as if interrupted (for resume demos)")
    p.add_argument("--tf32", action="store_true",
                   help="float32 as TF32 on Ampere and newer GPUs: faster, about 3 decimal digits")
    p.add_argument("--timeout-s", type=seconds, default=600,
                   help="DDP: how long a collective waits for the other ranks before failing")
    # The source article's launcher, torch.distributed.launch, passes it; torchrun sets LOCAL_RANK
    p.add_argument("--local-rank", "--local_rank", type=non_negative_int, default=None, help=argparse.SUPPRESS)
    return p


def check_at_least_one(**options):
    """--name VALUE must be a positive count (None: not given, fine)."""
    for name, value in options.items():
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {value}")


def check_args(args):
    """Reject values that cannot work, with a message that says what to do instead (each
    number alone is checked as it is read: see the types above build_parser)."""
    if args.resume and args.overwrite:
        raise UsageError("--resume and --overwrite contradict each other: pick one")
    if args.local_rank is not None:  # passed by torch.distributed.launch (torchrun sets LOCAL_RANK)
        from ddp_scripts.mishaps import launched_the_old_way
        launched_the_old_way(args.local_rank)
