"""Per-rank seeding of data augmentation: the same seed on every rank is the bug.

Each rank draws random crop offsets and flips for its next four images. Seeded with the same
number everywhere, every rank draws the same ones; seeded with seed + rank, each its own.

    torchrun --nproc-per-node 2 ddp_scripts/practice/seeding.py --out runs/practice
"""
import sys
from pathlib import Path

if not __package__:  # run as a file, not imported: find ddp_scripts as notebooks do
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import torch
import torch.distributed as dist

from ddp_scripts.practice.group import gather, main

SEED, IMAGES = 0, 4


def augmentations(generator):
    """Random crop offsets (0..8 pixels, as in padding-4 random crops) and flips for 4 images."""
    offsets = torch.randint(0, 9, (IMAGES, 2), generator=generator)
    flips = torch.rand(IMAGES, generator=generator) < 0.5
    return [f"({dx},{dy}){' flip' if flip else ''}"
            for (dx, dy), flip in zip(offsets.tolist(), flips.tolist())]


def demo(out):
    rank = dist.get_rank()
    same_seed = torch.Generator().manual_seed(SEED)            # the bug: one seed for all
    own_seed = torch.Generator().manual_seed(SEED + rank)      # the fix: a seed per rank
    bug, fix = gather(augmentations(same_seed)), gather(augmentations(own_seed))
    return {"seed": SEED, "images": IMAGES,
            "same_seed": bug, "same_seed_identical": all(b == bug[0] for b in bug),
            "seed_plus_rank": fix, "seed_plus_rank_identical": all(f == fix[0] for f in fix)}


if __name__ == "__main__":
    main({"seeding": demo}, __doc__.splitlines()[0])
