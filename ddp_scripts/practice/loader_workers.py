"""DataLoader workers, seen from inside: which process made each sample, with which seed.

Chapter 9 builds a loader over `WhoMadeMe` twice: workers started by fork and made again
every epoch (the default), and workers started by a forkserver and kept between epochs
(`multiprocessing_context="forkserver"`, `persistent_workers=True`), the safe way in a
process that has already started NCCL. The class lives in a module, not in the notebook:
a forkserver's (or spawn's) worker imports it to unpickle the data set.
"""
import os

import torch
from torch.utils.data import Dataset, get_worker_info


class WhoMadeMe(Dataset):
    """Sample i is (i, the worker's process id, the worker's seed)."""

    def __init__(self, size=4):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return torch.tensor([index, os.getpid(), get_worker_info().seed % 10 ** 6])


def epochs(loader, count=2):
    """[(process ids, seeds) of the workers that made each epoch's samples] for `count` epochs."""
    seen = []
    for _ in range(count):
        rows = torch.cat(list(loader))
        seen.append((sorted(set(rows[:, 1].tolist())), sorted(set(rows[:, 2].tolist()))))
    return seen
