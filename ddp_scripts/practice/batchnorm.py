"""SyncBatchNorm against per-rank BatchNorm: which statistics normalise a batch.

Each rank normalises its share of the global batch. Plain BatchNorm uses the share's own mean
and variance; SyncBatchNorm uses those of the whole global batch, added up over the ranks.
nn.SyncBatchNorm runs on GPUs only, so on the CPU the synchronisation is written out: one
all_reduce of the count, the sums and the sums of squares.

    torchrun --nproc-per-node 2 ddp_scripts/practice/batchnorm.py --out runs/practice
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_scripts.practice.group import gather, main, same_on_every_rank

GLOBAL_BATCH, FEATURES, EPS = 16, 3, 1e-5


def synced_batch_norm(x):
    """What SyncBatchNorm computes in training: statistics of the global batch."""
    stats = torch.cat([torch.tensor([float(len(x))], dtype=x.dtype), x.sum(0), (x * x).sum(0)])
    dist.all_reduce(stats)                           # count, sums, sums of squares: added up
    count, total, squares = stats[0], stats[1:1 + FEATURES], stats[1 + FEATURES:]
    mean = total / count
    var = squares / count - mean ** 2                # the biased variance, as BatchNorm uses
    return (x - mean) / torch.sqrt(var + EPS), mean


def running_means_under_ddp(everything, rank, world_size):
    """Per-rank BatchNorm under DDP: are the running means the same on every rank after
    training, and after one more forward through DDP in evaluation mode? And which forwards
    start with rank 0's buffers broadcast (broadcast_buffers=True)?"""
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(FEATURES, FEATURES), nn.BatchNorm1d(FEATURES)).double())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):   # each forward after one that computed gradients: rank 0's buffers
        optimizer.zero_grad()
        model(everything[rank::world_size] + step).pow(2).mean().backward()
        optimizer.step()
    equal_after_training = same_on_every_rank(model.module[1].running_mean.tolist())
    model.eval()
    with torch.no_grad():
        model(everything[rank::world_size])   # broadcasts rank 0's, and updates nothing
    equal_after_an_eval_forward = same_on_every_rank(model.module[1].running_mean.tolist())

    # Make the ranks' buffers differ again, then see them as BatchNorm finds them at the start
    # of the next two training forwards: equal on every rank only if DDP broadcast them first.
    model.train()
    with torch.no_grad():
        model.module[1].running_mean += rank
    seen = []
    model.module[1].register_forward_pre_hook(lambda module, args: seen.append(
        module.running_mean.tolist()))
    for _ in range(2):
        model(everything[rank::world_size]).pow(2).mean().backward()
    first, following = (same_on_every_rank(means) for means in seen)
    return {"equal_after_training": equal_after_training,
            "equal_after_an_eval_forward_through_ddp": equal_after_an_eval_forward,
            "broadcast_first_training_forward_after_eval": first,
            "broadcast_next_training_forward": following}


def demo(out):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(3)
    everything = torch.randn(GLOBAL_BATCH, FEATURES, generator=g, dtype=torch.float64) * 2 + 1
    mine = everything[rank::world_size]              # this rank's share, as a sampler gives it

    per_rank = nn.BatchNorm1d(FEATURES, momentum=1.0).double().train()
    per_rank_output = per_rank(mine)                 # momentum 1: running_mean = this batch's mean
    synced_output, synced_mean = synced_batch_norm(mine)

    # The reference: one process, BatchNorm over the whole global batch at once.
    whole = F.batch_norm(everything, None, None, training=True, eps=EPS)[rank::world_size]
    try:
        nn.SyncBatchNorm(FEATURES).double().train()(mine)
        sync_on_cpu = "ran"
    except ValueError as error:
        sync_on_cpu = f"ValueError: {error}"
    return {
        "global_batch": GLOBAL_BATCH, "world_size": world_size, "features": FEATURES,
        "mean_per_rank": gather(per_rank.running_mean.tolist()),
        "mean_synced_per_rank": gather(synced_mean.tolist()),
        "mean_of_global_batch": everything.mean(0).tolist(),
        "per_rank_vs_one_process": max(gather((per_rank_output - whole).abs().max().item())),
        "synced_vs_one_process": max(gather((synced_output - whole).abs().max().item())),
        "sync_batchnorm_on_cpu": sync_on_cpu,
        "ddp_running_means": running_means_under_ddp(everything, rank, world_size),
    }


if __name__ == "__main__":
    main({"batchnorm": demo}, __doc__.splitlines()[0])
