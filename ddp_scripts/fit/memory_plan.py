"""Memory per rank, predicted: what each rank holds after a step, and its peak during one.

    from ddp_scripts.fit.memory_plan import peak_plan, plan
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

Any nn.Module can be planned, built on the meta device: `sample_shape` gives one input
sample's shape, or `make_input` a batch of another kind (token ids for nn.Embedding), and
`units` the modules fully_shard makes units of their own (their names name the points of the
step). The optimizer is SGD with momentum or Adam (STATES_PER_PARAMETER). Every rank also
holds the model's buffers whole (BatchNorm's running statistics).

The model's parameters give the shapes; its dtype is replaced by `dtype`. A frozen parameter
(requires_grad=False) is held and gathered like any other, with no gradient and no optimizer
state. plan() leaves out
the communication buffers: DDP's buckets (another G, unless gradient_as_bucket_view=True),
which the Reducer allocates once and keeps from step to step, and FSDP's, which live only
during the step. peak_plan() walks the step's points with them and names the point of the
peak. Neither counts mixed precision's second copy, the CUDA context, NCCL's buffers,
cuBLAS's workspace or the caching allocator's slack: on a GPU, compare the peak with the free
bytes torch.cuda.mem_get_info() reports once the CUDA context exists.
"""
import copy
import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

STRATEGIES = ("one process", "DDP", "ZeRO-1", "FSDP")
PARTS = ("parameters", "gradients", "optimizer", "activations", "gathered")
# Tensors of optimizer state per parameter, each the parameter's size: SGD's momentum; Adam's
# two moments, exp_avg and exp_avg_sq.
STATES_PER_PARAMETER = {"sgd-momentum": 1, "adam": 2}
# State-sized temporaries the step makes, all alive at once. SGD with momentum updates the
# momentum and the weights in place (optim/sgd.py, _single_tensor_sgd: buf.mul_(...).add_
# and param.add_; _multi_tensor_sgd: torch._foreach_mul_ and torch._foreach_add_): none. Adam
# in its foreach form, PyTorch's default on CUDA (optim/optimizer.py,
# _default_to_fused_or_foreach) and planned here, takes the square root of every exp_avg_sq
# at once into new tensors (optim/adam.py, _multi_tensor_adam, the branch not capturable:
# exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)) and updates the rest in place:
# one state's size. (Its for-loop form, the default on a CPU, makes two temporaries of one
# parameter at a time instead.)
STEP_TEMPORARIES = {"sgd-momentum": 0, "adam": 1}
# Optimizers that keep a step count per parameter: a number of its own, on the CPU unless
# Adam is capturable or fused (optim/adam.py, Adam._init_group, the lazy state
# initialization: state["step"]), in torch's scalar dtype.
COUNTS_STEPS = {"adam"}


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


def make_batch(batch, dtype, sample_shape=(3, 32, 32), make_input=None):
    """The batch on the meta device: (inputs, labels). By default `batch` samples of
    sample_shape in dtype and one class label (int64) each; make_input(batch) gives any other
    (token ids, say: torch.zeros(batch, seq, dtype=torch.long)), made on the meta device."""
    with torch.device("meta"):
        if make_input is not None:
            inputs, labels = make_input(batch)
            return inputs.to("meta"), labels.to("meta")
        return (torch.zeros(batch, *sample_shape, dtype=dtype),
                torch.zeros(batch, dtype=torch.long))


def held_by_the_model(model):
    """Storages of the model's parameters and buffers (BatchNorm's running statistics)."""
    return {t.untyped_storage()._cdata for t in [*model.parameters(), *model.buffers()]}


def buffer_bytes(model, dtype):
    """Bytes of the model's buffers as .to(dtype) leaves them (floating ones in dtype)."""
    return sum(nbytes(b.numel(), dtype if b.is_floating_point() else b.dtype)
               for b in model.buffers())


def step_counts(numels, optimizer):
    """Bytes of the optimizer's step counts for these parameters (see COUNTS_STEPS)."""
    if optimizer not in COUNTS_STEPS:
        return 0
    from torch.optim.optimizer import _get_scalar_dtype
    return nbytes(len(numels), _get_scalar_dtype())


def activation_bytes(model, batch, dtype, sample_shape=(3, 32, 32), classes=10,
                     make_input=None):
    """Bytes autograd saves for backward in one forward pass and the loss (cross entropy), the
    weights and buffers left out, each storage once; counted on the meta device (nothing is
    allocated)."""
    if batch == 0:
        return 0
    meta = copy.deepcopy(model).to(device="meta", dtype=dtype)
    weights = held_by_the_model(meta)
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage._cdata not in weights:
            saved[storage._cdata] = storage.nbytes()
        return tensor

    images, labels = make_batch(batch, dtype, sample_shape, make_input)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        F.cross_entropy(meta(images), labels)
    return sum(saved.values())


def plan(model, batch, ranks, dtype=torch.float32, optimizer="sgd-momentum", units=(),
         sample_shape=(3, 32, 32), make_input=None):
    """{strategy: [{part: bytes} for each rank]} for STRATEGIES (one process: one rank).

    model: any nn.Module whose forward takes the batch's inputs (build it on the meta device:
    only the shapes are read). batch: the global batch, split evenly over the ranks. units: the
    modules that fully_shard makes units of their own (the rest belongs to the root).
    optimizer: a key of STATES_PER_PARAMETER. sample_shape: one input sample's shape;
    make_input: a batch of another kind (see make_batch)."""
    check_setup(model, batch, ranks, units)
    if optimizer not in STATES_PER_PARAMETER:
        raise ValueError(f"the calculator plans {', '.join(STATES_PER_PARAMETER)} only, "
                         f"not {optimizer!r}")
    k = STATES_PER_PARAMETER[optimizer]
    params = list(model.parameters())
    numels = [p.numel() for p in params]
    # Only a parameter that requires grad gets a gradient (autograd makes none for a frozen
    # one) and so optimizer state (torch's optimizers skip a parameter whose .grad is None).
    trained = [p.requires_grad for p in params]
    whole = nbytes(sum(numels), dtype)
    learned = nbytes(sum(n for n, t in zip(numels, trained) if t), dtype)
    one = activation_bytes(model, batch, dtype, sample_shape, make_input=make_input)
    per_rank = activation_bytes(model, batch // ranks, dtype, sample_shape, make_input=make_input)
    replicated = dict(parameters=whole, gradients=learned, optimizer=k * learned, gathered=0)
    result = {"one process": [dict(replicated, activations=one)],
              "DDP": [dict(replicated, activations=per_rank) for _ in range(ranks)]}
    owners = zero1_owners(numels, ranks)  # every parameter given to the optimizer is placed
    result["ZeRO-1"] = [dict(replicated, activations=per_rank, optimizer=k * nbytes(
        sum(n for n, owner, t in zip(numels, owners, trained) if owner == rank and t), dtype))
        for rank in range(ranks)]
    result["FSDP"] = []
    for rank in range(ranks):
        allocated = real = grads = state = 0
        for p in params:
            row = p[0].numel() if p.dim() else 1
            size, rows = chunk_rows(p.shape[0] if p.dim() else 1, ranks, rank)
            allocated, real = allocated + size * row, real + rows * row
            if p.requires_grad:
                grads, state = grads + size * row, state + rows * row
        result["FSDP"].append(dict(parameters=nbytes(allocated, dtype),
                                   gradients=nbytes(grads, dtype),
                                   optimizer=k * nbytes(state, dtype), activations=per_rank,
                                   gathered=gathered_bytes(model, units, dtype)))
    return result


def check_setup(model, batch, ranks, units):
    """A ValueError of one line unless the ranks are 1 or more, the batch splits evenly over
    them, and the units are distinct submodules of the model, none inside another."""
    if ranks < 1:
        raise ValueError(f"the calculator plans at least 1 rank, not {ranks}")
    if batch % ranks:
        raise ValueError(f"a global batch of {batch} does not split evenly over {ranks} rank(s)")
    names = {id(module): name for name, module in model.named_modules()}
    units = list(units)
    for index, unit in enumerate(units):
        if unit is model:
            raise ValueError("a unit cannot be the model itself: the root is what no unit holds")
        if id(unit) not in names:
            raise ValueError(f"unit {index} ({type(unit).__name__}) is not a submodule of the "
                             "model")
        if any(unit is other for other in units[:index]):
            raise ValueError(f"unit {names[id(unit)]} is given twice")
        for other in units:
            if other is not unit and any(unit is inner for inner in other.modules()):
                raise ValueError(f"unit {names[id(unit)]} is inside unit {names[id(other)]}: "
                                 "units cannot nest")


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
RULES = {"bucket": True, "all-gather buffers": True, "reduce-scatter buffer": True,
         "step temporaries": True}
# Ops whose backward hands the gradient of their output on as the gradient of their inputs,
# with no new tensor: a sum passes it to both terms (tools/autograd/derivatives.yaml in
# PyTorch's repository, add.Tensor: "self: handle_r_to_c(self.scalar_type(), grad)", and
# maybe_multiply returns grad when alpha is 1); a view's gradient is a view of it.
PASSES_THE_GRADIENT_ON = {"add", "__add__", "flatten", "view", "reshape", "t", "transpose",
                          "squeeze", "unsqueeze", "permute", "contiguous"}
# Functions whose backward is two ops, each making a gradient of the input's size:
# cross_entropy is log_softmax then nll_loss (nll_loss_backward, then
# _log_softmax_backward_data while the first is alive).
SCRATCH_GRADIENTS = {"cross_entropy": 1}
# How far a prediction may be from torch's tracker. Under FakeTensorMode, with a fake process
# group, the tracker counts each tensor's bytes once, as a run allocates them, with no
# allocator rounding and no communication thread: the rules count the same tensors, so
# nothing is known to differ and a prediction must equal it to the byte. A real gloo run may
# hold one thing more (peaks_side_by_side says what): the clone of a reduce-scatter input that
# ProcessGroupGloo all-reduces (ProcessGroupGloo.cpp, reduce_scatter_tensor_coalesced:
# buffers.push_back(inputTensors[i].clone())), made on the calling thread and freed by gloo's
# worker thread, at the reduce-scatter or, when that thread is late, at a later point.
EXACT = 0


def peak_agrees(predicted, tracked, allowed=EXACT):
    """Whether a predicted peak is the tracked one, to within `allowed` bytes either way."""
    return abs(tracked - predicted) <= allowed


def op_trace(model, batch, dtype, sample_shape=(3, 32, 32), units=(), make_input=None):
    """The forward pass and the loss (cross entropy), op by op, traced on the meta device
    (nothing is allocated), and what autograd holds at each op in forward and in backward.

    Returns the ops in forward order and the batch's bytes. Each op is a dict:
    - "name": the module that runs it, as the model names it ("" for the model's own code and
      the loss); "unit": the index of the unit holding it (None: the root);
    - "weights": the bytes of the parameters it uses that require grad (their gradients are
      made in its backward; a frozen one gets none);
    - "saved": the bytes autograd saves first at this op;
    - "before", "forward": the bytes of activations alive just before it starts, and while it
      runs (what autograd saved, and what a later op still needs);
    - "backward": the bytes alive at each moment of its backward, as (saved tensors,
      gradients), and "after": the same once it is done.
    The rules of backward are autograd's engine's (its headers: torch/include/torch/csrc/
    autograd/): the ops run in reverse order; an op's saved tensors are freed once it has run
    (each node's release_variables, generated/Functions.h); the gradient of a tensor is made by the first op to run that
    used it, and freed once the op that made the tensor has run; a tensor used twice gets its
    two gradients summed into a new one (input_buffer.h: "avoid modifying the passed values
    in-place"); the loss's gradient, 1, is kept by the graph's root to the end
    (functions/basic_ops.h, GraphRoot::outputs), and the loss by the caller.
    The input batch, the weights and the buffers are left out: the caller counts them."""
    unit_of = {id(m): index for index, unit in enumerate(units) for m in unit.modules()}
    meta = copy.deepcopy(model).to(device="meta", dtype=dtype)
    names = {copied: name for (name, _), copied in zip(model.named_modules(), meta.modules())}
    units_of = {copied: unit_of.get(id(original))
                for original, copied in zip(model.modules(), meta.modules())}
    running = []  # the modules whose forward has started and not ended, innermost last

    def leave(module, inputs, output):
        running.pop()

    for module in meta.modules():
        module.register_forward_pre_hook(lambda m, inputs: running.append(m))
        module.register_forward_hook(leave)
    images, labels = make_batch(batch, dtype, sample_shape, make_input)
    weights = {p.untyped_storage()._cdata for p in meta.parameters() if p.requires_grad}
    left_out = held_by_the_model(meta) | {images.untyped_storage()._cdata,
                                          labels.untyped_storage()._cdata}
    ops, packed, keep = [], [], []

    def pack(tensor):
        packed.append(tensor)
        return tensor

    class Trace(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            packed.clear()
            output = func(*args, **(kwargs or {}))
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            outputs = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)]
            keep.extend([*tensors, *outputs, *packed])  # no storage freed, none reused
            module = running[-1] if running else None
            ops.append({"func": getattr(func, "__name__", str(func)),
                        "name": names.get(module, ""), "unit": units_of.get(module),
                        "weights": sum(_storage(t)[1] for t in tensors if _storage(t)[0] in weights),
                        "inputs": [t for t in tensors if _storage(t)[0] not in left_out],
                        "outputs": outputs, "packed": list(packed)})
            return output

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), Trace():
        F.cross_entropy(meta(images), labels)
    _lifetimes(ops, left_out)
    return ops, _gradient_bytes(images) + _gradient_bytes(labels)


def _storage(tensor):
    storage = tensor.untyped_storage()
    return storage._cdata, storage.nbytes()


def _gradient_bytes(tensor):
    return tensor.numel() * tensor.element_size()


def _lifetimes(ops, left_out):
    """Fill each op's "saved", "before", "forward", "backward" and "after" (see op_trace)."""
    size, made, last_use, saver = {}, {}, {}, {}
    for index, op in enumerate(ops):
        for tensor in op["inputs"]:
            key, _ = _storage(tensor)
            last_use[key] = index
        for tensor in [*op["outputs"], *op["packed"]]:
            key, nbytes_ = _storage(tensor)
            if key not in left_out:
                size.setdefault(key, nbytes_)
                made.setdefault(key, index)
        for tensor in op["packed"]:
            key, _ = _storage(tensor)
            if key not in left_out:
                saver.setdefault(key, index)  # freed when the first op that saved it has run
    for index, op in enumerate(ops):
        op["saved"] = sum(size[key] for key, first in saver.items() if first == index)
        op["before"] = sum(size[key] for key, at in made.items() if at < index and (
            last_use.get(key, -1) >= index or saver.get(key, len(ops)) < index))
        op["forward"] = sum(size[key] for key, at in made.items() if at <= index and (
            last_use.get(key, -1) >= index or saver.get(key, len(ops)) <= index or at == index))
    # Backward: the loss and its gradient stay alive (the caller holds the loss); gradients
    # are counted by the tensor that holds them, so a gradient handed on counts once.
    grads, held, count = {}, {}, [0]

    def new(nbytes_):
        count[0] += 1
        held[count[0]] = nbytes_
        return count[0]

    def alive(*extra):
        return sum(held[token] for token in set(grads.values()) | {seed, *extra})

    loss = ops[-1]["outputs"][0]
    seed = new(_gradient_bytes(loss))  # the loss's gradient, 1: the engine keeps it to the end
    grads[_storage(loss)[0]] = seed
    saved = sum(op["saved"] for op in ops) + _gradient_bytes(loss)  # and the caller the loss
    for index in reversed(range(len(ops))):
        op = ops[index]
        outputs = [_storage(t)[0] for t in op["outputs"]]
        arriving = [grads[key] for key in outputs if key in grads]
        op["backward"] = []
        if not arriving:  # nothing needs this op's gradient: its backward does not run
            op["after"] = (saved, alive())
            continue
        made_now = {}
        for tensor in op["inputs"]:
            if not tensor.requires_grad:
                continue
            key, _ = _storage(tensor)
            if op["func"] in PASSES_THE_GRADIENT_ON:
                made_now.setdefault(key, arriving[0])
            else:
                made_now.setdefault(key, new(_gradient_bytes(tensor)))
        scratch = [new(_gradient_bytes(t)) for t in op["inputs"][:1]] * SCRATCH_GRADIENTS.get(
            op["func"], 0)
        op["backward"].append((saved, alive(*made_now.values(), *scratch)))
        for token in scratch:
            del held[token]
        for key in outputs:  # the op has run: its saved tensors and its output's gradient go
            grads.pop(key, None)
        saved -= op["saved"]
        for key, token in made_now.items():
            if key in grads and grads[key] != token:  # a second use: the two are summed
                summed = new(held[token])
                op["backward"].append((saved, alive(token, summed)))
                grads[key] = summed
            else:
                grads[key] = token
        op["after"] = (saved, alive())


def _unit_parameters(model, units):
    """The parameters of each unit, then the root's (those no unit holds)."""
    in_units = {id(p) for unit in units for p in unit.parameters()}
    return [*(list(unit.parameters()) for unit in units),
            [p for p in model.parameters() if id(p) not in in_units]]


def _point_name(op):
    return op["name"] or "the root"


def _unit_names(model, units):
    names = {id(module): name for name, module in model.named_modules()}
    return [names.get(id(unit), f"unit {index}") for index, unit in enumerate(units)]


def backward_points(ops, held, grads_of, extra=lambda index: {}):
    """[(where, {part: bytes})] at each moment of each op's backward, last op first: what is
    `held` all step, the saved activations not yet freed and the activations' gradients
    alive (op_trace), and grads_of(i), the weights' gradients made so far. extra(i) adds
    what a strategy keeps beside them."""
    points = []
    for index in reversed(range(len(ops))):
        for saved, flowing in ops[index]["backward"]:
            parts = dict(held, activations=saved, **{"activation gradients": flowing},
                         **grads_of(index), **extra(index))
            points.append((f"backward of {_point_name(ops[index])}", parts))
    return points


def peak_plan(model, batch, ranks, dtype=torch.float32, optimizer="sgd-momentum", units=(),
              sample_shape=(3, 32, 32), rules=None, make_input=None):
    """{strategy: [{"peak", "at", "parts", "points"} for each rank]} for PEAK_STRATEGIES, in a
    step after the first (the optimizer state exists, the gradients were set to None);
    "points" gives the highest total at each point of the step, named by the model's own
    modules ("forward of blocks.0", "backward of blocks.1.up", "backward of the root" for the
    loss and the model's own code). FSDP's rows add "gloo clone": the most a gloo run's
    reduce-scatter may hold beside them (see EXACT). The arguments are plan's.

    Each rule below is PyTorch 2.14.1's (torch/ paths):
    - Autograd (op_trace): an op's saved tensors are freed once its backward has run, and the
      gradients of its weights are made then (AccumulateGrad keeps the new tensor as .grad).
      The gradients of the activations flow from op to op, each freed once used.
    - DDP: the Reducer allocates its buckets once, a second copy of every gradient
      (nn/parallel/distributed.py:731-741, "the saved memory size will be equal to the total
      gradients size"; the Reducer gets gradient_as_bucket_view at lines 1440-1455). With
      gradient_as_bucket_view=True .grad is a view of the bucket, but each gradient is made
      first as autograd's own tensor and then copied in: one op's weight gradients on top.
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
      (_fsdp_param_group.py:402-414) but still copies into a reduce-scatter input.
    - The optimizer step: the weights, their gradients (sharded under FSDP, whose root is
      resharded after backward), the state and the step's temporaries (STEP_TEMPORARIES).
    Every rank holds the model's buffers whole, and Adam's step counts (COUNTS_STEPS: a
    CPU's memory, as the tracker counts it on a CPU; a GPU's only when capturable or fused)."""
    rules = dict(RULES, **(rules or {}))
    check_setup(model, batch, ranks, units)
    steady = plan(model, batch, ranks, dtype, optimizer, units, sample_shape, make_input)
    unit_names = _unit_names(model, units)
    numels = [p.numel() for p in model.parameters()]
    owners = zero1_owners(numels, ranks)
    result = {}
    for strategy in PEAK_STRATEGIES:
        per_rank = batch if strategy == "one process" else batch // ranks
        ops, inputs = op_trace(model, per_rank, dtype, sample_shape, units, make_input)
        ranks_here = 1 if strategy == "one process" else ranks
        rows = []
        for rank in range(ranks_here):
            held = dict(steady["FSDP" if strategy == "FSDP" else strategy.split(",")[0]][rank])
            own = [n for n, owner in zip(numels, owners) if owner == rank] if (
                strategy == "ZeRO-1") else numels
            held.update(buffers=buffer_bytes(model, dtype), counts=step_counts(own, optimizer),
                        temporaries=held["optimizer"] // STATES_PER_PARAMETER[optimizer]
                        * STEP_TEMPORARIES[optimizer] * rules["step temporaries"])
            if strategy == "FSDP":
                points = fsdp_points(model, ops, units, unit_names, ranks, dtype, held, inputs,
                                     rules)
            else:
                points = replicated_points(strategy, ops, held, inputs, rules)
            at, parts = max(points, key=lambda point: sum(point[1].values()))
            highest = {}  # the highest total at each named point, as the tracker names them
            for where, point in points:
                highest[where] = max(highest.get(where, 0), sum(point.values()))
            rows.append({"peak": sum(parts.values()), "at": at, "parts": parts,
                         "points": highest})
            if strategy == "FSDP":  # what a gloo run may hold beside (see EXACT)
                rows[-1]["gloo clone"] = max(padded_bytes([p for p in params if p.requires_grad],
                                                          ranks, dtype)
                                             for params in _unit_parameters(model, units))
        result[strategy] = rows
    return result


def replicated_points(strategy, ops, held, inputs, rules):
    """One process, DDP and ZeRO-1: every rank holds every weight."""
    base = _held_all_step(held, inputs)
    if strategy in ("DDP", "ZeRO-1", "DDP, bucket view") and rules["bucket"]:
        base["DDP buckets"] = held["gradients"]
    view = strategy == "DDP, bucket view"

    def grads_of(index):
        made = ops[index:] if not view else ops[index:index + 1]
        return {"gradients being made" if view else "gradients":
                sum(op["weights"] for op in made)}

    points = backward_points(ops, base, grads_of)
    points.append(_step_point(base, held, 0 if view else held["gradients"]))
    return points


def _held_all_step(held, inputs):
    """What a rank holds from one step to the next: its weights, its optimizer state, the
    model's buffers, the step counts (if any), and the batch."""
    base = {"parameters": held["parameters"], "optimizer": held["optimizer"]}
    base.update({part: held[key] for part, key in (("buffers", "buffers"),
                                                  ("step counts", "counts")) if held[key]})
    base["batch"] = inputs
    return base


def _step_point(base, held, gradients, kind="gradients"):
    """The optimizer step: the gradients beside what is held, and the step's temporaries."""
    parts = dict(base, **{kind: gradients})
    if held["temporaries"]:
        parts["step temporaries"] = held["temporaries"]
    return "optimizer step", parts


def fsdp_points(model, ops, units, unit_names, ranks, dtype, held, inputs, rules):
    """FSDP2: the points of forward and backward where a unit is whole, with the all-gather
    and reduce-scatter buffers that torch keeps beside it."""
    *padded, root_padded = [padded_bytes(params, ranks, dtype)
                            for params in _unit_parameters(model, units)]
    gather = rules["all-gather buffers"] and ranks > 1
    scatter = rules["reduce-scatter buffer"]
    # the gradients, and so the reduce-scatter buffers, of the parameters that require grad
    *scattered, root_scattered = [padded_bytes([p for p in params if p.requires_grad], ranks,
                                               dtype)
                                  for params in _unit_parameters(model, units)]
    sharded_grad = [scattered[i] // ranks for i in range(len(units))]
    base = dict(_held_all_step(held, inputs), **{"root whole": root_padded})
    points = []
    for index, name in enumerate(unit_names):
        first, last = _first(ops, index), _last(ops, index)
        if gather:  # block i copied out of its all-gather output while the unit before it
            # still has its own (see peak_plan's docstring); that unit's whole weights are
            # already resharded (the root's are kept)
            parts = dict(base, **{"block whole": padded[index],
                                  "all-gather output": padded[index],
                                  "previous all-gather output": padded[index - 1] if index
                                  else root_padded, "activations": ops[first]["before"]})
            points.append((f"forward of {name}", parts))
        for op in ops[first:last + 1]:  # then it computes, its activations made
            parts = dict(base, **{"block whole": padded[index], "activations": op["forward"]})
            if gather:  # beside its own all-gather output, kept until the next unit's copy-out
                parts["all-gather output"] = padded[index]
            points.append((f"forward of {name}", parts))

    def grads_of(index):
        unit = ops[index]["unit"]
        done = sum(sharded_grad[u] for u in range(len(units)) if unit is None or u > unit)
        root_made = sum(op["weights"] for op in ops[index:] if op["unit"] is None)
        made = sum(op["weights"] for op in ops[index:] if op["unit"] == unit
                   and unit is not None)
        return {"sharded gradients": done, "root's gradients": root_made,
                "block's gradients": made}

    def extra(index):
        unit = ops[index]["unit"]
        if unit is None:  # the root's ops: the head first, the stem after every block
            after_blocks = units and scatter and index < _first(ops, 0)
            return {"reduce-scatter input": scattered[0]} if after_blocks else {}
        parts = {"block whole": padded[unit]}
        if gather and unit > 0:
            parts["prefetched all-gather output"] = padded[unit - 1]
        if scatter and unit + 1 < len(units):
            parts["reduce-scatter input"] = scattered[unit + 1]
        return parts

    points += backward_points(ops, base, grads_of, extra)
    # Each unit's post_backward: its weights resharded and the reduce-scatter input kept from
    # the unit after it freed (_fsdp_param_group.py:607-680); then the reduce-scatter input
    # allocated and the unsharded gradients copied in, which are freed only then
    # (_fsdp_collectives.py:597-606, "Only after the copy-in finishes can we free the
    # gradients"); then the reduce-scatter output (lines 610-614), with the gradients gone.
    head = sum(op["weights"] for op in ops[_last(ops, len(units) - 1):]
               if op["unit"] is None) if units else 0
    for index, name in reversed(list(enumerate(unit_names))):
        saved, flowing = ops[_first(ops, index)]["after"]
        parts = dict(base, **{
            "sharded gradients": sum(sharded_grad[index + 1:]), "root's gradients": head,
            "activations": saved, "activation gradients": flowing})
        if gather and index > 0:
            parts["prefetched all-gather output"] = padded[index - 1]
        points += _reduce_scatter(f"reduce-scatter of {name}", parts, scatter, scattered[index],
                                  ranks, sum(op["weights"] for op in ops if op["unit"] == index),
                                  "block's gradients")
    parts = {key: value for key, value in base.items() if key != "root whole"}
    parts["sharded gradients"] = sum(sharded_grad)
    points += _reduce_scatter("reduce-scatter of the root", parts, scatter, root_scattered, ranks,
                              sum(op["weights"] for op in ops if op["unit"] is None),
                              "root's gradients")
    points.append(_step_point(parts, held, held["gradients"], "sharded gradients"))
    return points


def _reduce_scatter(where, parts, scatter, padded, ranks, gradients, kind):
    """The two moments of a unit's reduce-scatter: the copy-in, beside the unit's unsharded
    gradients (`kind`), and the output allocated once they are freed."""
    copy_in = dict(parts, **{kind: gradients})
    if not scatter:  # the rule left out: the gradients, and no buffer
        return [(where, copy_in)]
    copy_in["reduce-scatter input"] = padded
    output = dict(parts, **{"reduce-scatter input": padded,
                            "reduce-scatter output": padded // ranks})
    return [(where, copy_in), (where, output)]


def _first(ops, unit):
    """Index of the first op of `unit`."""
    return min(i for i, op in enumerate(ops) if op["unit"] == unit)


def _last(ops, unit):
    """Index of the last op of `unit`."""
    return max(i for i, op in enumerate(ops) if op["unit"] == unit)


def padded_bytes(params, ranks, dtype):
    """Bytes of these tensors gathered whole: each first dimension padded to ceil(d/N) x N
    rows, as the all-gather output and the unsharded weights are allocated."""
    return sum(nbytes(chunk_rows(p.shape[0] if p.dim() else 1, ranks, 0)[0] * ranks
                      * (p[0].numel() if p.dim() else 1), dtype) for p in params)
