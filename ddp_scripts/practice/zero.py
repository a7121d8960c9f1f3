"""ZeroRedundancyOptimizer: ZeRO stage 1 for DDP. Each rank keeps the optimizer state of its
share of the parameters only, steps that share, and broadcasts it; DDP all-reduces the
gradients as before. Against plain DDP with the same Adam: the state each rank holds, and
the difference between the two trained models.

    torchrun --nproc-per-node 2 ddp_scripts/practice/zero.py --out runs/practice
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_scripts.practice.by_hand import make_model, my_batches
from ddp_scripts.practice.group import gather, largest_difference, main

LR = 0.01


def state_bytes(optimizer):
    """Bytes of the optimizer state this rank holds (Adam: two tensors per parameter)."""
    state = optimizer.optim.state if isinstance(optimizer, ZeroRedundancyOptimizer) \
        else optimizer.state
    return sum(t.numel() * t.element_size() for per_parameter in state.values()
               for t in per_parameter.values() if torch.is_tensor(t))


def train(batches, zero):
    model = DDP(make_model())
    if zero:   # the only change: the optimizer class, given the optimizer to shard
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                            lr=LR)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    for x, y in batches:
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    return model.module, state_bytes(optimizer)


def demo(out):
    batches = my_batches(dist.get_rank(), dist.get_world_size())
    plain, plain_bytes = train(batches, zero=False)
    sharded, sharded_bytes = train(batches, zero=True)
    return {
        "dtype": "float64", "steps": len(batches), "optimizer": "Adam",
        "parameter_bytes": sum(p.numel() * p.element_size() for p in plain.parameters()),
        "state_bytes_per_rank_plain": gather(plain_bytes),
        "state_bytes_per_rank_zero": gather(sharded_bytes),
        "largest_difference_zero_vs_plain": max(gather(largest_difference(
            [p.detach() for p in plain.parameters()],
            [p.detach() for p in sharded.parameters()]))),
    }


if __name__ == "__main__":
    main({"zero": demo}, __doc__.splitlines()[0])
