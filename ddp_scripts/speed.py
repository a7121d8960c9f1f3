"""The machinery behind train_fast.py's levers (chapter 10): options, refusals, loaders.

train_fast.py is train_ddp.py with the lines marked FAST added or changed; each lever is a
line of its own there, taken where it takes effect, with its reason beside it. What those
lines call lives here. One GPU is train_fast.py as a world of one process
(torchrun --nproc_per_node 1); several GPUs, the same script on N processes.

    --data-on-device      the data set is copied to the GPU once; batches are index operations there
    --workers N           batches made in N worker processes (data on the CPU) ...
    --pin-memory          ... into page-locked memory, so that the host need not wait for the copy
    --augment             random crop (4 pixels of padding) and horizontal flip, where batches are made
    --amp {off,bf16,fp16} autocast to 16-bit floats; fp16 with a gradient scaler
    --channels-last       NHWC memory layout for the model and for each batch, where it is made
    --compile {off,default,reduce-overhead}
                          torch.compile of the model's forward and backward; reduce-overhead also
                          replays them as CUDA graphs

Every option is off by default, and then train_fast.py trains exactly what train_ddp.py trains:
the loader is data.make_loader's DataLoader, autocast and the gradient scaler are disabled,
and the memory format is the default one. What a run used is recorded in metrics.jsonl and
run.json (`lever_settings`).
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddp_scripts.cli import UsageError, say
from ddp_scripts.data import keep_batch, make_loader
from ddp_scripts.options import non_negative_int

AMP_DTYPES = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}
COMPILE_MODES = ("off", "default", "reduce-overhead")
PADDING = 4  # pixels added on each side before a random 32x32 crop: the standard CIFAR-10 recipe


def add_speed_options(parser):
    """The options of chapter 10, added to a script's parser (options.build_parser); returns it."""
    g = parser.add_argument_group("keeping the GPU busy (chapter 10); all off by default")
    g.add_argument("--data-on-device", action="store_true",
                   help="copy the data set to the GPU once and cut batches there by indexing "
                        "(no per-batch copy; on a CPU run it changes nothing)")
    g.add_argument("--workers", type=non_negative_int, default=0, metavar="N",
                   help="data on the CPU: make batches in N worker processes (default 0: in "
                        "the training process)")
    g.add_argument("--pin-memory", action="store_true",
                   help="data on the CPU: batches in page-locked memory, copied with "
                        "non_blocking=True, so that the host queues the next work without "
                        "waiting for the copy (no effect without a CUDA GPU)")
    g.add_argument("--augment", action="store_true",
                   help="random crop with 4 pixels of padding and horizontal flip, on the CPU "
                        "(in the workers) or on the GPU with --data-on-device; seeded per rank")
    g.add_argument("--amp", choices=list(AMP_DTYPES), default="off",
                   help="mixed precision: the forward pass and the loss under autocast, in "
                        "bfloat16 or float16 where it is safe; fp16 scales the loss "
                        "(GradScaler). The scaler's state is not checkpointed: a resumed fp16 "
                        "run starts its scale afresh")
    g.add_argument("--channels-last", action="store_true",
                   help="NHWC memory layout for the model's weights and each batch, the layout "
                        "tensor cores read without transposing")
    g.add_argument("--compile", choices=list(COMPILE_MODES), default="off",
                   help="torch.compile the DDP model: its forward and backward become fused "
                        "kernels, split at DDP's buckets; reduce-overhead also replays them as "
                        "CUDA graphs (GPU only). The loss, the optimizer's step and zero_grad "
                        "stay eager. Compiling happens in the first epoch")
    return parser


def check_levers(args, device):
    """Refuse what cannot work here, one line each; options that change nothing on this
    device are said once per node and recorded as off."""
    if args.data_on_device and (args.workers or args.pin_memory):
        raise UsageError("--data-on-device cuts batches on the GPU; --workers and "
                         "--pin-memory make them on the CPU: choose one or the other")
    if args.amp != "off":
        if args.dtype != "float32":
            raise UsageError(f"--amp {args.amp} lowers float32 to 16 bits; --dtype "
                             f"{args.dtype} asks for more: choose one")
        if not torch.amp.is_autocast_available(device.type):
            raise UsageError(f"--amp: torch has no autocast for {device.type} here")
        if (args.amp == "bf16" and device.type == "cuda"
                and not torch.cuda.is_bf16_supported(including_emulation=False)):
            props = torch.cuda.get_device_properties(device)
            raise UsageError(f"--amp bf16: {props.name} (compute capability {props.major}."
                             f"{props.minor}) has no bfloat16 arithmetic, which needs 8.0 "
                             "(Ampere) or newer: use --amp fp16")
    if args.compile == "reduce-overhead" and device.type != "cuda":
        raise UsageError(f"--compile reduce-overhead replays CUDA graphs, which need a CUDA "
                         f"GPU; this run is on {device.type}: use --compile default")
    if args.compile != "off" and device.type == "cpu":
        try:
            from torch._inductor.cpp_builder import get_cpp_compiler
            get_cpp_compiler()
        except Exception:  # noqa: BLE001 - whatever the reason, there is no C++ compiler
            raise UsageError("--compile on the CPU generates C++ and needs a C++ compiler "
                             "(g++ or clang++), and none was found") from None
    notices = []
    if args.data_on_device and device.type == "cpu":
        args.data_on_device = False
        notices.append("--data-on-device changes nothing on the CPU: the data set is there "
                       "already (recorded as off)")
    if args.pin_memory and device.type != "cuda":
        args.pin_memory = False
        notices.append(f"--pin-memory changes nothing on {device.type}: pinned memory "
                       "speeds up copies to a CUDA GPU only (recorded as off)")
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        for notice in notices:
            say(notice)


def lever_settings(args):
    """What metrics.jsonl and run.json record about the levers: what took effect."""
    return {"data_on_device": args.data_on_device, "workers": args.workers,
            "pin_memory": args.pin_memory, "augment": args.augment, "amp": args.amp,
            "channels_last": args.channels_last, "compile": args.compile}


def memory_format(args):
    """--channels-last: the layout of the model's weights and of every batch."""
    return torch.channels_last if args.channels_last else torch.contiguous_format


def compiled(model, mode):
    """--compile: the DDP model compiled (static shapes: the last, smaller batch of an epoch
    gets a graph of its own), or the model itself. `model.module` stays the model as built,
    so evaluation and checkpoints use it uncompiled, with its own keys."""
    return model if mode == "off" else torch.compile(model, mode=mode, dynamic=False)


def train_batches(dataset, batch_size, sampler, args, device):
    """The training batches in the order of `sampler`, made where the options say: cut on
    the device (--data-on-device), or by a DataLoader on the CPU (--workers, --pin-memory);
    augmented (--augment) and laid out (--channels-last) where they are made. With every
    option off: data.make_loader's DataLoader, the loader of train_ddp.py.

    Worker processes start from a forkserver, not by fork: a process that runs NCCL is not
    safe to fork (chapter 9). They are started once and kept for every epoch
    (persistent_workers), so each batch carries its epoch and number to them (EpochBatches)."""
    crop_flip = RandomCropFlip(args.seed) if args.augment else None
    layout = memory_format(args)
    if args.data_on_device:
        return DeviceBatches(dataset, batch_size, sampler, device, crop_flip, layout)
    if crop_flip is None and not args.channels_last and not args.workers and not args.pin_memory:
        return make_loader(dataset, batch_size, sampler)
    workers = args.workers > 0
    return torch.utils.data.DataLoader(
        AugmentedImages(dataset, crop_flip, layout), batch_sampler=EpochBatches(sampler, batch_size),
        collate_fn=keep_batch, num_workers=args.workers, pin_memory=args.pin_memory,
        multiprocessing_context="forkserver" if workers else None, persistent_workers=workers)


# ---------------------------------------------------------------------------------------
# Batches cut out on the device
# ---------------------------------------------------------------------------------------
class DeviceBatches:
    """The data set's tensors on the device, copied once (in the memory format asked for);
    each batch is one index operation, which keeps that format.

    The order comes from the same sampler a DataLoader would use (RandomSampler, or
    DistributedSampler under DDP), drawn once per epoch as one index tensor: the batches are
    those of the DataLoader, without a copy from the host per batch.
    """
    pin_memory = False  # already on the device: nothing to copy, so nothing to wait for

    def __init__(self, dataset, batch_size, sampler, device, crop_flip=None,
                 layout=torch.contiguous_format):
        self.images = dataset.images.to(device).contiguous(memory_format=layout)
        self.labels = dataset.labels.to(device)
        self.dataset, self.batch_size, self.sampler = dataset, batch_size, sampler
        self.device, self.crop_flip, self.layout = device, crop_flip, layout

    def __len__(self):
        return -(-len(self.sampler) // self.batch_size)

    def __iter__(self):
        order = torch.as_tensor(list(self.sampler), dtype=torch.long).to(self.device)
        epoch = epoch_key(self.sampler)
        for number, start in enumerate(range(0, len(order), self.batch_size)):
            index = order[start:start + self.batch_size]
            images = self.images[index]
            if self.crop_flip is not None:
                images = self.crop_flip(images, epoch, number).contiguous(memory_format=self.layout)
            yield images, self.labels[index]


# ---------------------------------------------------------------------------------------
# Augmentation: random crop with padding, and horizontal flip, a whole batch at once
# ---------------------------------------------------------------------------------------
class RandomCropFlip:
    """The standard CIFAR-10 training augmentation, for a batch on any device: every image
    is padded by 4 pixels (reflected), cut back to 32x32 at a random offset, and mirrored
    left-right with probability 1/2, in one gather.

    The random numbers of a batch come from a generator seeded with (seed, rank, epoch,
    batch number): the ranks of a DDP run draw different crops, and a batch gets the same
    crops wherever it is made (in the training process, in any worker, on the GPU), so a
    run repeated, resumed at an epoch, or given more workers trains the same model.
    """

    def __init__(self, seed):
        self.seed = seed
        self.rank = dist.get_rank() if dist.is_initialized() else 0

    def generator(self, epoch, number, device):
        key = hash((self.seed, self.rank, epoch, number)) & (2**63 - 1)
        return torch.Generator(device).manual_seed(key)

    def __call__(self, images, epoch, number):
        """Batch `number` of `epoch`, cropped and flipped."""
        n, channels, height, width = images.shape
        device = images.device
        generator = self.generator(epoch, number, device)
        padded = F.pad(images, (PADDING,) * 4, mode="reflect")
        dx, dy = torch.randint(0, 2 * PADDING + 1, (2, n), generator=generator, device=device)
        flip = torch.rand(n, generator=generator, device=device) < 0.5
        across = torch.arange(width, device=device)
        across = torch.where(flip[:, None], width - 1 - across, across)  # mirrored: read right to left
        rows = (dy[:, None] + torch.arange(height, device=device))[:, None, :, None]
        cols = (dx[:, None] + across)[:, None, None, :]
        batch = torch.arange(n, device=device)[:, None, None, None]
        channel = torch.arange(channels, device=device)[None, :, None, None]
        return padded[batch, channel, rows, cols]


class AugmentedImages(torch.utils.data.Dataset):
    """A TensorImages set whose batches come out augmented (crop_flip, or None for none) and
    in the memory format asked for: made where the batch is made, in a worker with --workers.
    It is fetched by EpochBatches' batches: (epoch, batch number, indices)."""

    def __init__(self, dataset, crop_flip, layout=torch.contiguous_format):
        self.dataset, self.crop_flip, self.layout = dataset, crop_flip, layout
        self.images, self.labels, self.source = dataset.images, dataset.labels, dataset.source

    def __len__(self):
        return len(self.dataset)

    def __getitems__(self, batch):
        epoch, number, indices = batch
        images, labels = self.dataset.__getitems__(indices)
        if self.crop_flip is not None:
            images = self.crop_flip(images, epoch, number)
        return images.contiguous(memory_format=self.layout), labels


class EpochBatches(torch.utils.data.Sampler):
    """A DataLoader's batch_sampler: the batches of `sampler`, each as (epoch, batch number,
    indices). Worker processes kept between epochs learn the epoch from the batch itself."""

    def __init__(self, sampler, batch_size):
        self.sampler, self.batch_size = sampler, batch_size

    def __len__(self):
        return -(-len(self.sampler) // self.batch_size)

    def __iter__(self):
        epoch, order = epoch_key(self.sampler), list(self.sampler)
        for number, start in enumerate(range(0, len(order), self.batch_size)):
            yield epoch, number, order[start:start + self.batch_size]


def epoch_key(sampler):
    """A number that changes with every epoch: DistributedSampler's epoch (set_epoch), or the
    seed of a RandomSampler's generator (the scripts seed it with seed + epoch); else 0."""
    if hasattr(sampler, "epoch"):
        return sampler.epoch
    generator = getattr(sampler, "generator", None)
    return generator.initial_seed() if generator is not None else 0
