"""Memory per rank, predicted: parameters, gradients, optimizer state and activations.

    from ddp_scripts.memory_plan import plan
    table = plan(WideMLP(256, 4), batch=32, ranks=4, dtype=torch.float64, units=model.blocks)

For one process, DDP, ZeRO-1 (torch.distributed.optim.ZeroRedundancyOptimizer) and FSDP
(fully_shard on each unit, then on the root), plan() predicts what each rank holds, rank by
rank, the way PyTorch splits the tensors:

    DDP      every rank holds every parameter, gradient and optimizer state.
    ZeRO-1   parameters and gradients as DDP; each whole parameter's optimizer state lives on
             one rank: ZeroRedundancyOptimizer sorts the parameters, largest first, and gives
             each to the rank with the fewest elements so far (its _partition_parameters).
    FSDP     every tensor cut along its first dimension d into torch.chunk's pieces of
             ceil(d / N) rows. Each rank allocates ceil(d / N) rows for its parameter shard and
             for its gradient shard, padding included (_fsdp_param.py: padded_sharded_size);
             the optimizer state follows the shard's real rows (N - 1 ranks hold ceil(d / N),
             the last what is left, possibly nothing).
             "gathered" is the most FSDP holds whole at once during the step: the root unit
             (kept whole from forward to backward) and the largest other unit.

Activations are what autograd saves for backward (the input batch included, the weights left
out), counted on the meta device: a forward pass of a copy of the model with no memory, so
even a model too large for this machine can be planned. The per-rank batch is batch / ranks
(the whole batch for one process).

The model's parameters give the shapes; its dtype is replaced by `dtype`. Not counted:
mixed precision's second copy, DDP's communication buckets (another G, unless
gradient_as_bucket_view=True), the CUDA context and the caching allocator's slack.
"""
import copy
import math

import torch
import torch.nn.functional as F

STRATEGIES = ("one process", "DDP", "ZeRO-1", "FSDP")
PARTS = ("parameters", "gradients", "optimizer", "activations", "gathered")
# Tensors of optimizer state per parameter, each the parameter's size (Adam's step counter, a
# number per parameter, is left out, as the measurement leaves out 0-dimensional tensors).
STATES_PER_PARAMETER = {"sgd": 0, "sgd-momentum": 1, "adam": 2}


def nbytes(numel, dtype):
    return numel * torch.empty((), dtype=dtype).element_size()


def chunk_rows(rows, ranks, rank):
    """(allocated, real) rows of a tensor's first dimension on `rank` under fully_shard."""
    size = math.ceil(rows / ranks)  # torch.chunk's piece: the first one, always full
    return size, max(0, min(size, rows - rank * size))


def zero1_owners(numels, ranks):
    """Which rank ZeroRedundancyOptimizer gives each parameter (one parameter group): largest
    first (a stable sort), each to the first rank with the fewest elements so far."""
    owner, load = [None] * len(numels), [0] * ranks
    for index in sorted(range(len(numels)), key=lambda i: numels[i], reverse=True):
        rank = load.index(min(load))
        owner[index], load[rank] = rank, load[rank] + numels[index]
    return owner


def activation_bytes(model, batch, dtype, sample_shape=(3, 32, 32), classes=10):
    """Bytes autograd saves for backward in one forward pass and the loss (cross entropy), the
    weights left out, each storage once; counted on the meta device (nothing is allocated)."""
    if batch == 0:
        return 0
    meta = copy.deepcopy(model).to(device="meta", dtype=dtype)
    weights = {p.untyped_storage()._cdata for p in meta.parameters()}
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage._cdata not in weights:
            saved[storage._cdata] = storage.nbytes()
        return tensor

    images = torch.zeros(batch, *sample_shape, dtype=dtype, device="meta")
    labels = torch.zeros(batch, dtype=torch.long, device="meta")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        F.cross_entropy(meta(images), labels)
    return sum(saved.values())


def plan(model, batch, ranks, dtype=torch.float32, optimizer="sgd-momentum", units=(),
         sample_shape=(3, 32, 32)):
    """{strategy: [{part: bytes} for each rank]} for STRATEGIES (one process: one rank).

    batch: the global batch, split evenly over the ranks. units: the modules that fully_shard
    makes units of their own (the rest belongs to the root). optimizer: a key of
    STATES_PER_PARAMETER."""
    if ranks < 1 or batch % ranks:
        raise ValueError(f"a global batch of {batch} does not split evenly over {ranks} rank(s)")
    if optimizer not in STATES_PER_PARAMETER:
        raise ValueError(f"optimizer must be one of {', '.join(STATES_PER_PARAMETER)}")
    k = STATES_PER_PARAMETER[optimizer]
    params = list(model.parameters())
    numels = [p.numel() for p in params]
    whole = nbytes(sum(numels), dtype)
    one = activation_bytes(model, batch, dtype, sample_shape)
    per_rank = activation_bytes(model, batch // ranks, dtype, sample_shape)
    replicated = dict(parameters=whole, gradients=whole, optimizer=k * whole, gathered=0)
    result = {"one process": [dict(replicated, activations=one)],
              "DDP": [dict(replicated, activations=per_rank) for _ in range(ranks)]}
    owners = zero1_owners(numels, ranks)
    result["ZeRO-1"] = [dict(replicated, activations=per_rank, optimizer=k * nbytes(
        sum(n for n, owner in zip(numels, owners) if owner == rank), dtype)) for rank in range(ranks)]
    result["FSDP"] = []
    for rank in range(ranks):
        allocated = real = 0
        for p in params:
            row = p[0].numel() if p.dim() else 1
            size, rows = chunk_rows(p.shape[0] if p.dim() else 1, ranks, rank)
            allocated, real = allocated + size * row, real + rows * row
        result["FSDP"].append(dict(parameters=nbytes(allocated, dtype),
                                   gradients=nbytes(allocated, dtype),
                                   optimizer=k * nbytes(real, dtype), activations=per_rank,
                                   gathered=gathered_bytes(model, units, dtype)))
    return result


def gathered_bytes(model, units, dtype):
    """The root unit whole (what no unit holds) and the largest unit whole."""
    in_units = {id(p) for unit in units for p in unit.parameters()}
    root = sum(p.numel() for p in model.parameters() if id(p) not in in_units)
    largest = max((sum(p.numel() for p in unit.parameters()) for unit in units), default=0)
    return nbytes(root + largest, dtype)


def table_rows(planned, rank=0):
    """One row per strategy for rank `rank` (the last rank for one process): {part: bytes},
    with the total of the first four (what a rank holds between steps plus its activations)."""
    rows = {}
    for strategy, ranks in planned.items():
        held = ranks[min(rank, len(ranks) - 1)]
        rows[strategy] = dict(held, total=sum(held[part] for part in PARTS[:4]))
    return rows
