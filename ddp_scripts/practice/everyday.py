"""Chapter 9's demonstrations, several in one process group: one torchrun start for all.

    torchrun --nproc-per-node 2 ddp_scripts/practice/everyday.py --out runs/practice
    torchrun --nproc-per-node 2 ddp_scripts/practice/everyday.py --out runs/p by_hand seeding

Writes OUT/NAME.json for each demonstration. Each also runs alone: by_hand.py, buckets.py,
accumulation.py, batchnorm.py, unused_parameters.py, seeding.py, compression.py, zero.py,
uneven_inputs.py; and hooks.py, which records what the chapter's figures draw.
"""
from ddp_scripts.practice import (accumulation, batchnorm, buckets, by_hand, compression,
                                  hooks, seeding, unused_parameters, uneven_inputs, zero)
from ddp_scripts.practice.group import main

DEMOS = {"by_hand": by_hand.demo, "buckets": buckets.demo, "accumulation": accumulation.demo,
         "batchnorm": batchnorm.demo, "unused_parameters": unused_parameters.demo,
         "seeding": seeding.demo, "compression": compression.demo, "zero": zero.demo,
         "uneven_inputs": uneven_inputs.demo}  # last: its first part breaks a group on purpose
# What hooks recorded during backward, for the chapter's figures: first, on an idle group
RECORDINGS = {"overlap": hooks.overlap, "no_sync_steps": hooks.no_sync_steps}

if __name__ == "__main__":
    main({**RECORDINGS, **DEMOS}, __doc__.splitlines()[0])
