"""What train_fsdp.py needs to shard a model: its options, a model worth sharding, each rank's
shards made without the whole model, a global batch that survives a change of world size, and
what each rank holds. Its checkpoints are in fsdp_out_dir.py. A run saved by N ranks resumes on M,
and --global-batch-size keeps the training the same when the number of ranks changes:

    torchrun --standalone --nproc_per_node 2 ddp_scripts/train_fsdp.py --model mlp --width 1024 \
        --global-batch-size 64 --dataset synthetic --out runs/fsdp-mlp --stop-after-epoch 1
    torchrun --standalone --nproc_per_node 1 ddp_scripts/train_fsdp.py --model mlp --width 1024 \
        --global-batch-size 64 --dataset synthetic --out runs/fsdp-mlp --resume

Everything that takes an FSDP model or its optimizer is a collective: every rank calls it.
"""
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from torch.distributed.tensor import DTensor

from ddp_scripts.cli import UsageError
from ddp_scripts.models import build_model
from ddp_scripts.options import ArgumentParser, build_parser, count

MODELS = ["cnn", "resnet18", "mlp"]


# ---------------------------------------------------------------------------------------
# train_fsdp.py's options: options.py's, and what sharding adds
# ---------------------------------------------------------------------------------------
def fsdp_parser(description):
    """options.py's options (build_parser), with --model and --resume replaced, and FSDP's own."""
    p = ArgumentParser(description=description, conflict_handler="resolve",
                       parents=[build_parser(description)])
    p.add_argument("--model", choices=MODELS, default="cnn", help="mlp: a wide MLP worth sharding")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.dcp, on any number of ranks")
    p.add_argument("--width", type=count, default=256, help="mlp: width of each block")
    p.add_argument("--depth", type=count, default=4, help="mlp: number of blocks")
    p.add_argument("--global-batch-size", type=count, default=None,
                   help="split over the ranks (default: --batch-size each)")
    p.add_argument("--no-reshard-after-forward", action="store_true",
                   help="keep each block's gathered weights until backward")
    p.add_argument("--mixed-precision", choices=["bfloat16"], default=None, help="compute in it, reduce in float32")
    p.add_argument("--activation-checkpointing", action="store_true", help="recompute each block's forward in backward")
    p.add_argument("--cpu-offload", action="store_true",
                   help="GPU runs: shards, gradients and optimizer step on the CPU")
    return p


def parse_args(description):
    """train_fsdp.py's options; --global-batch-size becomes each rank's --batch-size, split over
    torchrun's WORLD_SIZE (before the ranks meet: a split that cannot be is said at once)."""
    args = fsdp_parser(description).parse_args()
    args.batch_size = per_rank_batch(args, int(os.environ.get("WORLD_SIZE", "1")))
    return args


# ---------------------------------------------------------------------------------------
# A model worth sharding
# ---------------------------------------------------------------------------------------
class Block(nn.Module):
    """A transformer's feed-forward half: x + W2 gelu(W1 layernorm(x)), 8 width^2 weights."""

    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class WideMLP(nn.Module):
    """The 3x32x32 image flattened, `depth` residual blocks of `width`, ten classes.

    About (3072 + 8 x depth x width) x width parameters: width 256 and depth 4 (the default,
    for CI) make 2.9 million; width 8192 and depth 8 make 4.3 billion, which with their
    gradients and SGD's momentum take 52 GB in float32, more than a 40 GB GPU holds.
    """

    def __init__(self, width=256, depth=4):
        super().__init__()
        self.stem = nn.Linear(3 * 32 * 32, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 10))

    def forward(self, images):
        x = self.stem(torch.flatten(images, 1))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_fsdp_model(args, dtype):
    """models.py's models, or the wide MLP; the same seed gives the same weights on every rank.
    With --activation-checkpointing each block recomputes its forward in backward."""
    if args.model != "mlp":
        model = build_model(args.model, args.seed, dtype)
    else:
        torch.manual_seed(args.seed)
        model = WideMLP(args.width, args.depth).to(dtype)
    if args.activation_checkpointing:
        for block in blocks_of(model):
            checkpoint_activations(block)
    return model


def blocks_of(model):
    """The submodules that become FSDP units of their own, each gathered just before it runs
    and freed after it. Whatever is left (the MLP's stem and head) belongs to the root's unit."""
    if isinstance(model, WideMLP):
        return list(model.blocks)
    if hasattr(model, "layer4"):  # torchvision's ResNet
        return [model.layer1, model.layer2, model.layer3, model.layer4]
    return [module for module in model.children() if any(True for _ in module.parameters())]


def checkpoint_activations(block):
    """Activation checkpointing: the block keeps only its input for backward and runs its
    forward again there (torch.utils.checkpoint, non-reentrant, which FSDP2 supports)."""
    forward = block.forward
    block.forward = lambda *inputs: torch.utils.checkpoint.checkpoint(forward, *inputs,
                                                                      use_reentrant=False)


def fsdp_policies(args, device, root=False):
    """fully_shard's options, from the script's: whether a block frees its gathered weights
    after forward (--no-reshard-after-forward keeps them until backward), in which precision
    to compute and to reduce, where the shards live. With --mixed-precision the root's output, the logits, is cast back
    to float32: MixedPrecisionPolicy casts parameters, it is not autocast, and without
    output_dtype the loss would be computed in bfloat16."""
    if args.cpu_offload and device.type != "cuda":
        raise UsageError(f"--cpu-offload moves a GPU run's shards, gradients and optimizer step "
                         f"to the CPU; this run is on {device.type} already: leave it out")
    if args.mixed_precision and args.dtype != "float32":
        raise UsageError(f"--mixed-precision computes in {args.mixed_precision} from float32 "
                         f"weights; this run's weights are {args.dtype}: use --dtype float32")
    precision = MixedPrecisionPolicy()  # compute and reduce in the weights' own dtype
    if args.mixed_precision:
        precision = MixedPrecisionPolicy(param_dtype=getattr(torch, args.mixed_precision),
                                         reduce_dtype=torch.float32,
                                         output_dtype=torch.float32 if root else None)
    policies = {"mp_policy": precision,
                "offload_policy": CPUOffloadPolicy() if args.cpu_offload else OffloadPolicy()}
    if not root:  # the root is left to PyTorch's default: kept whole from forward to backward
        policies["reshard_after_forward"] = not args.no_reshard_after_forward
    return policies


# ---------------------------------------------------------------------------------------
# Each rank's shards, made without the whole model
# ---------------------------------------------------------------------------------------
# Layers whose constructor draws their weights with the layer's own reset_parameters, in
# order: Linear and Conv2d uniform (weight, then bias), LayerNorm ones and zeros.
REPLAYABLE = (nn.Linear, nn.Conv2d, nn.LayerNorm)


def shard_rows(param):
    """The rows of the whole parameter that this rank's shard holds: FSDP2 cuts dim 0 as
    torch.chunk does, ceil(rows / N) to each rank in rank order (the last ones get fewer,
    padded to ceil(rows / N) in the memory FSDP2 allocates)."""
    rows, ranks = param.shape[0], param.device_mesh.size()
    per_rank = -(-rows // ranks)
    first = min(param.device_mesh.get_local_rank() * per_rank, rows)
    return first, min(first + per_rank, rows), per_rank


def replay_init(param, draw, generator):
    """Fill this rank's shard with what `draw` gives the whole parameter, drawing it one
    shard-sized piece at a time in row order, so that the random numbers come out in the
    order the whole tensor would take them and no tensor larger than a shard is made."""
    first, end, per_rank = shard_rows(param)
    local = param.to_local()
    for start in range(0, param.shape[0], per_rank):
        piece = torch.empty((min(per_rank, param.shape[0] - start), *param.shape[1:]))
        draw(piece, generator)  # float32, as the whole model is built, then cast below
        if start == first and end > first:
            local.copy_(piece)


def init_layer_shards(layer, generator):
    """What the layer's reset_parameters does to the whole tensors, done to the shards."""
    if isinstance(layer, nn.LayerNorm):
        layer.weight.to_local().fill_(1.0)
        layer.bias.to_local().zero_()
        return
    replay_init(layer.weight, lambda t, g: nn.init.kaiming_uniform_(t, a=math.sqrt(5), generator=g),
                generator)
    if layer.bias is not None:
        bound = 1 / math.sqrt(math.prod(layer.weight.shape[1:]))  # 1 / sqrt(fan_in), as reset_parameters does
        replay_init(layer.bias, lambda t, g: t.uniform_(-bound, bound, generator=g), generator)


def materialize_shards(model, device, args, dtype):
    """After fully_shard on a model built on the meta device: allocate this rank's shards on
    `device` (to_empty) and give them the values the whole model, built with --seed, would
    have, so that every script starts from the same weights. FSDP2, unlike DDP, never
    broadcasts rank 0's weights: every rank must compute the same ones.

    The CNN's and the MLP's layers draw their weights in order (REPLAYABLE): each rank replays
    the draws, shard-sized piece by piece, and keeps its own rows; the whole model never
    exists. ResNet-18's do not (torchvision draws the convolutions a second time after
    construction): rank 0 builds it in its host memory and set_model_state_dict sends each
    rank its shards (broadcast_from_rank0), so that no GPU ever holds it whole."""
    model.to_empty(device=device)
    layers = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    with torch.no_grad():
        if all(isinstance(m, REPLAYABLE) for m in layers) and not any(True for _ in model.buffers()):
            generator = torch.Generator().manual_seed(args.seed)  # the stream build_model draws from
            for layer in layers:
                init_layer_shards(layer, generator)
            return
    whole = build_fsdp_model(args, dtype).state_dict() if dist.get_rank() == 0 else {}
    set_model_state_dict(model, whole, options=StateDictOptions(full_state_dict=True,
                                                                broadcast_from_rank0=True))


# ---------------------------------------------------------------------------------------
# Batches: a global batch that survives a change of world size; forwards in step
# ---------------------------------------------------------------------------------------
def per_rank_batch(args, world_size):
    """--global-batch-size split over the ranks (or --batch-size, per rank, without it)."""
    if args.global_batch_size is None:
        return args.batch_size
    if args.global_batch_size < 1:
        raise UsageError(f"--global-batch-size must be at least 1, got {args.global_batch_size}")
    if args.global_batch_size % world_size:
        raise UsageError(f"a global batch of {args.global_batch_size} does not split over "
                         f"{world_size} ranks: use a multiple of {world_size}, or another "
                         "number of ranks")
    return args.global_batch_size // world_size


def check_same_number_of_batches(test_samples, batch_size, world_size):
    """Under FSDP every forward pass gathers weights from every rank: a rank with one test
    batch more than the others would wait for them forever."""
    counts = {-(-len(range(rank, test_samples, world_size)) // batch_size)
              for rank in range(world_size)}
    if len(counts) > 1:
        raise UsageError(f"{test_samples} test images in batches of {batch_size} give the "
                         f"{world_size} ranks {min(counts)} or {max(counts)} batches; under FSDP "
                         "each forward pass needs every rank: change --test-samples or "
                         "--batch-size")


# ---------------------------------------------------------------------------------------
# What each rank holds
# ---------------------------------------------------------------------------------------
def local_bytes(tensor):
    """Bytes of this rank's part of a tensor: its shard, for a DTensor."""
    if isinstance(tensor, DTensor):
        tensor = tensor.to_local()
    return tensor.numel() * tensor.element_size()


def bytes_per_rank(model, optimizer, device):
    """The largest rank's bytes of parameters, gradients and optimizer state (a collective),
    and on a GPU its peaks since the run started: what the caching allocator handed out to
    tensors (max_memory_allocated) and what it took from the GPU (max_memory_reserved, a safe
    upper bound of what the run needs: before an out-of-memory error the allocator frees its
    cache and tries again); what metrics.jsonl records for every epoch.

    The shards are counted where the optimizer holds them, not as model.parameters(): after
    a forward pass (the epoch's evaluation) the root module shows its gathered copy, since
    PyTorch keeps the root unsharded after forward, while its shards and their gradients
    stay allocated. That gathered copy, held beside the shards, is gathered_bytes_per_rank.
    The largest rank is rank 0: ceil(d / N) rows of every tensor, the size FSDP2 allocates
    on every rank (padding the shards that hold fewer rows)."""
    shards = [p for group in optimizer.param_groups for p in group["params"]]
    held = [sum(local_bytes(p) for p in shards),
            sum(local_bytes(p.grad) for p in shards if p.grad is not None),
            sum(local_bytes(value) for state in optimizer.state.values()
                for value in state.values() if torch.is_tensor(value) and value.dim() > 0),
            sum(local_bytes(p) for p in model.parameters() if not isinstance(p, DTensor))]
    gpu = device.type == "cuda"
    peaks = [torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)] \
        if gpu else [0, 0]
    largest = torch.tensor(held + peaks, dtype=torch.float64, device=device)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    params, grads, optimizer_bytes, gathered, allocated, reserved = (int(x) for x in largest.tolist())
    return {"param_bytes_per_rank": params, "grad_bytes_per_rank": grads,
            "optimizer_bytes_per_rank": optimizer_bytes, "gathered_bytes_per_rank": gathered,
            "parameters": sum(p.numel() for p in shards),
            "max_memory_allocated": allocated if gpu else None,
            "max_memory_reserved": reserved if gpu else None}
