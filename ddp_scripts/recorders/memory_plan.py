"""Memory per rank, predicted: what each rank holds after a step, and its peak during one.

    from ddp_scripts.recorders.memory_plan import peak_plan, plan
    held = plan(WideMLP(256, 4), batch=32, ranks=4, dtype=torch.float64, units=model.blocks)
    peak = peak_plan(WideMLP(256, 4), 32, 4, torch.float64, units=model.blocks)

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
             "gathered" is the weights FSDP holds whole at once, as a layer starts: the root
             unit (kept whole from forward to backward) and the largest other unit. FSDP's
             all-gather and reduce-scatter buffers come beside them: peak_plan counts them.

Activations are what autograd saves for backward (the input batch included, the weights left
out), counted on the meta device: a forward pass of a copy of the model with no memory, so
even a model too large for this machine can be planned. The per-rank batch is batch / ranks
(the whole batch for one process).

The model's parameters give the shapes; its dtype is replaced by `dtype`. plan() leaves out
the communication buffers: DDP's buckets (another G, unless gradient_as_bucket_view=True),
which the Reducer allocates once and keeps from step to step, and FSDP's, which live only
during the step. peak_plan() walks the step's points with them and names the point of the
peak. Neither counts mixed precision's second
copy, the CUDA context, cuBLAS's workspace or the caching allocator's slack.
"""
import copy
import math

import torch
import torch.nn.functional as F

STRATEGIES = ("one process", "DDP", "ZeRO-1", "FSDP")
PARTS = ("parameters", "gradients", "optimizer", "activations", "gathered")
# Tensors of optimizer state per parameter, each the parameter's size. The calculator plans
# SGD with momentum only, as the scripts train: its step updates the momentum and the
# weights in place (optim/sgd.py:364, 378; foreach 445-446, 472), so the step adds nothing to the peak. Adam's step
# makes temporaries the rules do not predict: in its foreach form, PyTorch's default on CUDA
# (optim/optimizer.py:170-191), torch._foreach_sqrt makes a state-sized copy
# (optim/adam.py:762).
STATES_PER_PARAMETER = {"sgd-momentum": 1}


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
        raise ValueError(f"the calculator plans {', '.join(STATES_PER_PARAMETER)} only: Adam's "
                         "step makes temporaries it does not predict")
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


# ---------------------------------------------------------------------------------------
# The peak: what a rank holds at the busiest moment of a step, not the sum of its parts
# ---------------------------------------------------------------------------------------
PEAK_STRATEGIES = ("one process", "DDP", "DDP, bucket view", "ZeRO-1", "FSDP")
# Rules that a test can switch off, to see the check against torch's tracker fail.
RULES = {"bucket": True, "all-gather buffers": True, "reduce-scatter buffer": True}
# How far a prediction may be from torch's tracker. The rules leave out autograd's
# temporaries (the gradient flowing between layers, LayerNorm's and GELU's scratch): under 1 %
# on the chapter's models. On gloo one more buffer can show. ProcessGroupGloo's
# reduce_scatter_tensor_coalesced all-reduces a clone of its input (ProcessGroupGloo.cpp:
# buffers.push_back(inputTensors[i].clone())), held by its work until gloo's worker thread
# lets go, sometimes after the next unit's all-gather copy-out: one block's reduce-scatter
# input more at that point ("gloo clone" in peak_plan's FSDP rows), 2.5 % above the predicted
# peak on the chapter's model when it happened. TOLERANCE allows that. A rule left out
# misses by more on the tests' run (tests/scripts/test_memory_plan.py).
TOLERANCE = 0.03


def peak_agrees(predicted, tracked):
    """Whether a predicted peak is within TOLERANCE of the tracked one."""
    return abs(tracked - predicted) <= TOLERANCE * tracked


def layer_trace(model, batch, dtype, sample_shape=(3, 32, 32), units=()):
    """The model's layers (modules without children) in forward order, traced on the meta
    device: [{"name", "unit", "weights", "saved"}] and the batch's bytes. "unit" is the index of the
    unit holding the layer (None: the root); "saved" the bytes autograd saves first at that
    layer, freed when its backward is done (the input batch left out: the caller holds it)."""
    unit_of = {id(m): index for index, unit in enumerate(units) for m in unit.modules()}
    meta = copy.deepcopy(model).to(device="meta", dtype=dtype)
    layers = []
    images = torch.zeros(batch, *sample_shape, dtype=dtype, device="meta")
    labels = torch.zeros(batch, dtype=torch.long, device="meta")
    seen = {t.untyped_storage()._cdata for t in (*meta.parameters(), images, labels)}

    def enter(name, unit):
        return lambda module, inputs: layers.append({"name": name, "unit": unit, "saved": 0,
                                                     "weights": sum(nbytes(p.numel(), dtype)
                                                                    for p in module.parameters())})

    for (name, original), copied in zip(model.named_modules(), meta.modules()):
        if not list(copied.children()):
            copied.register_forward_pre_hook(enter(name, unit_of.get(id(original))))

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage._cdata not in seen and layers:
            seen.add(storage._cdata)
            layers[-1]["saved"] += storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        F.cross_entropy(meta(images), labels)
    return layers, nbytes(images.numel(), dtype) + nbytes(labels.numel(), torch.long)


def backward_points(layers, held, grads_of, extra=lambda index: {}):
    """[(where, {part: bytes})] as each layer's backward ends, last layer first: what is
    `held` all step, the activations of this layer and those before it, and grads_of(i), the
    gradients made so far. extra(i) adds what a strategy keeps beside them."""
    points = []
    for index in reversed(range(len(layers))):
        parts = dict(held, activations=sum(layer["saved"] for layer in layers[:index + 1]),
                     **grads_of(index), **extra(index))
        points.append((f"backward of {layers[index]['name']}", parts))
    return points


def peak_plan(model, batch, ranks, dtype=torch.float32, optimizer="sgd-momentum", units=(),
              sample_shape=(3, 32, 32), rules=None):
    """{strategy: [{"peak", "at", "parts", "points"} for each rank]} for PEAK_STRATEGIES, in a
    step after the first (the optimizer state exists, the gradients were set to None);
    "points" gives the highest total at each point of the step ("forward of blocks.0", ...).

    Each rule below is PyTorch 2.14.1's (torch/ paths):
    - Autograd frees a layer's saved tensors when its backward is done, and makes the
      gradients of its weights then (AccumulateGrad keeps the new tensor as .grad).
    - DDP: the Reducer allocates its buckets once, a second copy of every gradient
      (nn/parallel/distributed.py:731-741, "the saved memory size will be equal to the total
      gradients size"; the Reducer gets gradient_as_bucket_view at lines 1440-1455). With
      gradient_as_bucket_view=True .grad is a view of the bucket, but each gradient is made
      first as autograd's own tensor and then copied in: one layer's gradients on top.
    - ZeRO-1: DDP's buckets and gradients; the optimizer state of the rank's own tensors.
    - FSDP2: each unit's all-gather output is one flat buffer of the padded shards times N
      (_fsdp_collectives.py foreach_all_gather); the unsharded weights are copied out of it.
      In forward a unit's buffer is kept after its copy-out (_fsdp_param_group.py:486-496,
      "Defer free", only when world size > 1) until the next unit's wait_for_unshard: lines
      440-442 drop comm_ctx's reference, but the local prev_all_gather_state holds it until
      the function returns, after the copy-out (as its docstring, 428-431, says). So as each
      block is copied out, the previous unit's buffer is still there. In backward a
      block's pre_backward prefetches the block before it (_fsdp_param_group.py:592-604,
      821-857): its all-gather output waits beside the current block. One reduce-scatter
      input, the padded gradients of a unit, is kept until the next unit's reduce-scatter
      (_fsdp_param_group.py:113, 660-680), and the unsharded gradients are freed only after
      the copy-in (_fsdp_collectives.py:597-606). World size 1 skips the all-gather
      (_fsdp_param_group.py:402-414) but still copies into a reduce-scatter input."""
    rules = dict(RULES, **(rules or {}))
    if ranks < 1 or batch % ranks:
        raise ValueError(f"a global batch of {batch} does not split evenly over {ranks} rank(s)")
    steady = plan(model, batch, ranks, dtype, optimizer, units, sample_shape)
    result = {}
    for strategy in PEAK_STRATEGIES:
        per_rank = batch if strategy == "one process" else batch // ranks
        layers, inputs = layer_trace(model, per_rank, dtype, sample_shape, units)
        ranks_here = 1 if strategy == "one process" else ranks
        rows = []
        for rank in range(ranks_here):
            held = steady["FSDP" if strategy == "FSDP" else strategy.split(",")[0]][rank]
            if strategy == "FSDP":
                points = fsdp_points(model, layers, units, ranks, dtype, held, inputs, rules)
            else:
                points = replicated_points(strategy, layers, held, inputs, rules)
            at, parts = max(points, key=lambda point: sum(point[1].values()))
            highest = {}  # the highest total at each named point, as the tracker names them
            for where, point in points:
                highest[where] = max(highest.get(where, 0), sum(point.values()))
            rows.append({"peak": sum(parts.values()), "at": at, "parts": parts,
                         "points": highest})
            if strategy == "FSDP":  # see TOLERANCE: what gloo's reduce-scatter may add
                rows[-1]["gloo clone"] = max((padded_bytes(list(unit.parameters()), ranks, dtype)
                                              for unit in units), default=0) if ranks > 1 else 0
        result[strategy] = rows
    return result


def replicated_points(strategy, layers, held, inputs, rules):
    """One process, DDP and ZeRO-1: every rank holds every weight."""
    base = {"parameters": held["parameters"], "optimizer": held["optimizer"], "batch": inputs}
    if strategy in ("DDP", "ZeRO-1", "DDP, bucket view") and rules["bucket"]:
        base["DDP buckets"] = held["gradients"]
    view = strategy == "DDP, bucket view"

    def grads_of(index):
        made = layers[index:] if not view else layers[index:index + 1]
        return {"gradients being made" if view else "gradients":
                sum(layer["weights"] for layer in made)}

    points = backward_points(layers, base, grads_of)
    points.append(("optimizer step", dict(base, **grads_of(0))))
    return points


def fsdp_points(model, layers, units, ranks, dtype, held, inputs, rules):
    """FSDP2: the points of forward and backward where a unit is whole, with the all-gather
    and reduce-scatter buffers that torch keeps beside it."""
    in_units = {id(p) for unit in units for p in unit.parameters()}
    root = [p for p in model.parameters() if id(p) not in in_units]
    padded = [padded_bytes(list(unit.parameters()), ranks, dtype) for unit in units]
    root_padded = padded_bytes(root, ranks, dtype)
    gather = rules["all-gather buffers"] and ranks > 1
    scatter = rules["reduce-scatter buffer"]
    sharded_grad = [padded[i] // ranks for i in range(len(units))]
    base = {"parameters": held["parameters"], "optimizer": held["optimizer"], "batch": inputs,
            "root whole": root_padded}
    points = []
    for index in range(len(units)):
        if gather:  # block i copied out of its all-gather output while the unit before it
            # still has its own (see peak_plan's docstring); that unit's whole weights are
            # already resharded (the root's are kept)
            parts = dict(base, **{"block whole": padded[index],
                                  "all-gather output": padded[index],
                                  "previous all-gather output": padded[index - 1] if index
                                  else root_padded, "activations": sum(
                                      layer["saved"] for layer in layers[:_first(layers, index)])})
            points.append((f"forward of blocks.{index}", parts))
        before = layers[:_last(layers, index) + 1]  # then it computes, its saved tensors made
        parts = dict(base, **{"block whole": padded[index],
                              "activations": sum(layer["saved"] for layer in before)})
        if gather:  # beside its own all-gather output, kept until the next unit's copy-out
            parts["all-gather output"] = padded[index]
        points.append((f"forward of blocks.{index}", parts))

    def grads_of(index):
        unit = layers[index]["unit"]
        done = sum(sharded_grad[u] for u in range(len(units)) if unit is None or u > unit)
        root_made = sum(layer["weights"] for layer in layers[index:] if layer["unit"] is None)
        made = sum(layer["weights"] for layer in layers[index:] if layer["unit"] == unit
                   and unit is not None)
        return {"sharded gradients": done, "root's gradients": root_made,
                "block's gradients": made}

    def extra(index):
        unit = layers[index]["unit"]
        if unit is None:  # the root's layers: the head first, the stem after every block
            after_blocks = units and scatter and index < _last(layers, 0)
            return {"reduce-scatter input": padded[0]} if after_blocks else {}
        parts = {"block whole": padded[unit]}
        if gather and unit > 0:
            parts["prefetched all-gather output"] = padded[unit - 1]
        if scatter and unit + 1 < len(units):
            parts["reduce-scatter input"] = padded[unit + 1]
        return parts

    points += backward_points(layers, base, grads_of, extra)
    # Each unit's post_backward: its weights resharded, then its reduce-scatter input and
    # output allocated while its unsharded gradients are still held
    # (_fsdp_param_group.py:607-680; _fsdp_collectives.py:597-612).
    head = sum(layer["weights"] for layer in layers[_last(layers, len(units) - 1):]
               if layer["unit"] is None) if units else 0
    for index in reversed(range(len(units))):
        parts = dict(base, **{
            "sharded gradients": sum(sharded_grad[index + 1:]), "root's gradients": head,
            "block's gradients": sum(layer["weights"] for layer in layers
                                     if layer["unit"] == index),
            "activations": sum(layer["saved"] for layer in layers[:_first(layers, index)])})
        if scatter:
            parts.update({"reduce-scatter input": padded[index],
                          "reduce-scatter output": sharded_grad[index]})
        if gather and index > 0:
            parts["prefetched all-gather output"] = padded[index - 1]
        points.append((f"reduce-scatter of blocks.{index}", parts))
    parts = {key: base[key] for key in ("parameters", "optimizer", "batch")}
    parts.update({"sharded gradients": sum(sharded_grad), "root's gradients": sum(
        layer["weights"] for layer in layers if layer["unit"] is None)})
    if scatter:
        parts.update({"reduce-scatter input": root_padded,
                      "reduce-scatter output": root_padded // ranks})
    points.append(("reduce-scatter of the root", parts))
    return points


def _first(layers, unit):
    """Index of the first layer of `unit`."""
    return min(i for i, layer in enumerate(layers) if layer["unit"] == unit)


def _last(layers, unit):
    """Index of the last layer of `unit`."""
    return max(i for i, layer in enumerate(layers) if layer["unit"] == unit)


def padded_bytes(params, ranks, dtype):
    """Bytes of these tensors gathered whole: each first dimension padded to ceil(d/N) x N
    rows, as the all-gather output and the unsharded weights are allocated."""
    return sum(nbytes(chunk_rows(p.shape[0] if p.dim() else 1, ranks, 0)[0] * ranks
                      * (p[0].numel() if p.dim() else 1), dtype) for p in params)
