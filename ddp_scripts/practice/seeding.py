"""Per-rank seeding of data augmentation: the same seed on every rank is the bug; and the
model's initial weights, where a seed per rank is the bug under FSDP.

Each rank draws random crop offsets and flips for its next four images. Seeded with the same
number everywhere, every rank draws the same ones; seeded with seed + rank, each its own.
Then each rank builds a layer with seed + rank and shards it with FSDP2's fully_shard, which
keeps each rank's own slice of its own weights: the layer is stitched from two
initialisations. DDP would have broadcast rank 0's.

    torchrun --nproc-per-node 2 ddp_scripts/practice/seeding.py --out runs/practice
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from ddp_scripts.practice.group import all_equal, gather, main

SEED, IMAGES = 0, 4


def augmentations(generator):
    """Random crop offsets (0..8 pixels, as in padding-4 random crops) and flips for 4 images."""
    offsets = torch.randint(0, 9, (IMAGES, 2), generator=generator)
    flips = torch.rand(IMAGES, generator=generator) < 0.5
    return [f"({dx},{dy}){' flip' if flip else ''}"
            for (dx, dy), flip in zip(offsets.tolist(), flips.tolist())]


def whose_rows(whole, inits):
    """For each row of the weight FSDP trains, the first rank whose own initialisation has it
    (None: no rank's), and whether the whole weight is rank 0's initialisation."""
    return {"row_from_rank": [next((r for r, init in enumerate(inits)
                                    if torch.equal(whole[i], init[i])), None)
                              for i in range(len(whole))],
            "equal_to_rank_0s_init": torch.equal(whole, inits[0])}


def stitched_by_fsdp(rank, world_size):
    """A layer initialised with seed + rank on each rank, then sharded: whose rows is it?"""
    torch.manual_seed(SEED + rank)                  # the mistake, for weights
    layer = nn.Linear(2, 2 * world_size, bias=False)
    mine = gather(layer.weight.detach().clone())    # each rank's own initialisation
    fully_shard(layer, mesh=init_device_mesh("cpu", (world_size,)))
    whole = layer.weight.full_tensor().detach()     # the model FSDP trains
    rows = len(whole) // world_size                 # rank r holds rows r*rows ... on dim 0
    return {**whose_rows(whole, mine), "rows_per_rank": rows}


def demo(out):
    rank = dist.get_rank()
    same_seed = torch.Generator().manual_seed(SEED)            # the bug: one seed for all
    own_seed = torch.Generator().manual_seed(SEED + rank)      # the fix: a seed per rank
    bug, fix = gather(augmentations(same_seed)), gather(augmentations(own_seed))
    return {"seed": SEED, "images": IMAGES,
            "same_seed": bug, "same_seed_identical": all_equal(bug),
            "seed_plus_rank": fix, "seed_plus_rank_identical": all_equal(fix),
            "fsdp_weights_seeded_per_rank": stitched_by_fsdp(rank, dist.get_world_size())}


if __name__ == "__main__":
    main({"seeding": demo}, __doc__.splitlines()[0])
