"""The levers that keep a GPU busy, as options of the training scripts (chapter 10).

train_single.py, train_dp.py and train_ddp.py take the same options and use each of them in a
line of its own, with the reason beside it; this module holds what those lines call:

    --data-on-device      the data set is copied to the GPU once; batches are index operations there
    --workers N           batches made in N worker processes (data on the CPU) ...
    --pin-memory          ... into page-locked memory, copied to the GPU with non_blocking
    --augment             random crop (4 pixels of padding) and horizontal flip, where batches are made
    --amp {off,bf16,fp16} autocast to 16-bit floats; fp16 with a gradient scaler
    --channels-last       NHWC memory layout for the model and its input
    --compile {off,default,reduce-overhead}
                          torch.compile; reduce-overhead also replays the step as CUDA graphs

Every option is off by default, and then nothing here changes a single number of a run: the
loader is the DataLoader of common.make_loader, autocast and the gradient scaler are disabled,
and the memory format is the default one. What a run used is recorded in metrics.jsonl and
run.json (`Levers.record`).
"""
import contextlib
import copy
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ddp_scripts.common import UsageError, keep_batch, say, synchronize

AMP_DTYPES = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}
COMPILE_MODES = ("off", "default", "reduce-overhead")
PADDING = 4  # pixels added on each side before a random 32x32 crop: the standard CIFAR-10 recipe


def add_speed_options(parser):
    """The options of chapter 10, added to a script's parser (common.build_parser); returns it."""
    g = parser.add_argument_group("keeping the GPU busy (chapter 10); all off by default")
    g.add_argument("--data-on-device", action="store_true",
                   help="copy the data set to the GPU once and cut batches there by indexing "
                        "(no per-batch copy; on a CPU run it changes nothing)")
    g.add_argument("--workers", type=int, default=0, metavar="N",
                   help="data on the CPU: make batches in N worker processes (default 0: in "
                        "the training process)")
    g.add_argument("--pin-memory", action="store_true",
                   help="data on the CPU: batches in page-locked memory, copied to the GPU "
                        "asynchronously (no effect without a CUDA GPU)")
    g.add_argument("--augment", action="store_true",
                   help="random crop with 4 pixels of padding and horizontal flip, on the CPU "
                        "(in the workers) or on the GPU with --data-on-device; seeded per rank")
    g.add_argument("--amp", choices=list(AMP_DTYPES), default="off",
                   help="mixed precision: the forward pass in bfloat16 or float16 where it is "
                        "safe (autocast); fp16 scales the loss (GradScaler). The gradient "
                        "scaler's state is not checkpointed: a resumed fp16 run starts its "
                        "scale afresh")
    g.add_argument("--channels-last", action="store_true",
                   help="NHWC memory layout for the model's weights and each batch, the layout "
                        "tensor cores read without transposing")
    g.add_argument("--compile", choices=list(COMPILE_MODES), default="off",
                   help="torch.compile the training model: fused kernels; reduce-overhead also "
                        "records the step once and replays it as CUDA graphs (GPU only). "
                        "Compiled before the first epoch; the time is reported as compile_s")
    return parser


class Levers:
    """The chapter-9 options of one run, checked against the device: each refusal is one line.

    The scripts use its parts in lines of their own: `memory_format` (--channels-last),
    `loader` (--data-on-device, --workers, --pin-memory, --augment), `autocast` and `scaler`
    (--amp), `compile` and `warm_up` (--compile).
    """

    def __init__(self, args, device):
        self.args, self.device = args, device
        self.compile_s = None
        self._refuse_what_cannot_work(args, device)
        self._drop_what_does_nothing_here(args, device)
        self.amp_dtype = AMP_DTYPES[args.amp]
        self.memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
        # fp16 has 5 exponent bits: gradients below 6e-8 become zero. The scaler multiplies the
        # loss (so every gradient) by a large factor, divides it out before the step, and skips
        # a step whose gradients overflowed. Disabled, each of its calls is a plain pass-through.
        self.scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")

    @staticmethod
    def _refuse_what_cannot_work(args, device):
        if args.workers < 0:
            raise UsageError(f"--workers must be 0 or more, got {args.workers}")
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

    @staticmethod
    def _drop_what_does_nothing_here(args, device):
        """Options that change nothing on this device: said once per node, recorded as off."""
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

    # --- --amp ----------------------------------------------------------------------------
    def autocast(self):
        """The forward pass under autocast: matrix products and convolutions in bf16/fp16,
        reductions such as the loss in float32. With --amp off, a context that does nothing."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    # --- --compile ------------------------------------------------------------------------
    def compile(self, model):
        """The model as the training loop calls it: itself, or compiled (--compile).

        Only the training steps use it; evaluation and checkpoints use the model itself, so
        a checkpoint's keys are the same with and without --compile. Static shapes
        (dynamic=False): the last, smaller batch of an epoch gets a graph of its own, made
        in `warm_up` with the others.
        """
        if isinstance(model, nn.DataParallel):
            if self.args.compile != "off":
                raise UsageError("--compile does not work with DataParallel, which copies the "
                                 "model to every GPU at every step: use train_ddp.py")
            if self.args.amp == "bf16":
                raise UsageError("--amp bf16 under DataParallel would run in float16: its "
                                 "replica threads autocast with the default dtype. Use --amp "
                                 "fp16, or train_ddp.py")
        if self.args.compile == "off":
            return model
        return torch.compile(model, mode=self.args.compile, dynamic=False)

    def warm_up(self, train_one_epoch, train_model, model, optimizer, loader):
        """Compile before the clock starts, and undo what the compiling steps changed.

        With --compile, the first call of each batch shape compiles (seconds to a minute).
        The script's own train_one_epoch runs on the first images of the training set, once
        per batch size an epoch has (three times each with reduce-overhead, which records
        its CUDA graphs at the second call); then the model's parameters and buffers, the
        optimizer and the gradient scaler get back the state they had. Returns the seconds
        taken, also kept as `compile_s`; without --compile it does nothing and returns None.
        """
        if self.args.compile == "off":
            return None
        images, labels = loader.dataset.images, loader.dataset.labels
        steps = len(loader.sampler)
        sizes = [size for size in (loader.batch_size, steps % loader.batch_size) if size]
        batches = [(images[:size], labels[:size]) for size in sizes]
        repeats = 3 if self.args.compile == "reduce-overhead" else 1
        saved = (copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()),
                 self.scaler.state_dict())
        start = time.perf_counter()
        train_one_epoch(train_model, batches * repeats, optimizer, self.device, self)
        synchronize(self.device)
        self.compile_s = time.perf_counter() - start
        model.load_state_dict(saved[0])  # in place: the compiled graphs keep their tensors
        optimizer.load_state_dict(saved[1])
        if self.scaler.is_enabled():
            self.scaler.load_state_dict(saved[2])
        say(f"compiled ({self.args.compile}) in {self.compile_s:.1f} s, before the first epoch")
        return self.compile_s

    # --- --data-on-device, --workers, --pin-memory, --augment -----------------------------
    def loader(self, dataset, batch_size, sampler, augment=False):
        """The batches of `dataset` in the order of `sampler`, made where the options say."""
        crop_flip = RandomCropFlip(self.args.seed) if augment else None
        if self.args.data_on_device:
            return DeviceBatches(dataset, batch_size, sampler, self.device, crop_flip)
        if crop_flip is not None:
            dataset = AugmentedImages(dataset, crop_flip)
        return EpochLoader(dataset, batch_size=batch_size, sampler=sampler,
                           collate_fn=keep_batch, num_workers=self.args.workers,
                           pin_memory=self.args.pin_memory,
                           worker_init_fn=_start_worker if crop_flip is not None else None)

    def record(self):
        """What metrics.jsonl and run.json record about the levers: what took effect."""
        a = self.args
        return {"data_on_device": a.data_on_device, "workers": a.workers,
                "pin_memory": a.pin_memory, "augment": a.augment, "amp": a.amp,
                "channels_last": a.channels_last, "compile": a.compile,
                "compile_s": self.compile_s}


# ---------------------------------------------------------------------------------------
# Batches cut out on the device
# ---------------------------------------------------------------------------------------
class DeviceBatches:
    """The data set's tensors on the device, copied once; each batch is one index operation.

    The order comes from the same sampler a DataLoader would use (RandomSampler, or
    DistributedSampler under DDP), drawn once per epoch as one index tensor: the batches are
    those of the DataLoader, without a copy from the host per batch.
    """

    def __init__(self, dataset, batch_size, sampler, device, crop_flip=None):
        self.images = dataset.images.to(device)
        self.labels = dataset.labels.to(device)
        self.dataset, self.batch_size, self.sampler = dataset, batch_size, sampler
        self.device, self.crop_flip = device, crop_flip

    def __len__(self):
        return -(-len(self.sampler) // self.batch_size)

    def __iter__(self):
        order = torch.as_tensor(list(self.sampler), dtype=torch.long).to(self.device)
        if self.crop_flip is not None:
            self.crop_flip.start_epoch(epoch_key(self.sampler), self.device)
        for start in range(0, len(order), self.batch_size):
            index = order[start:start + self.batch_size]
            images = self.images[index]
            if self.crop_flip is not None:
                images = self.crop_flip(images)
            yield images, self.labels[index]


# ---------------------------------------------------------------------------------------
# Augmentation: random crop with padding, and horizontal flip, a whole batch at once
# ---------------------------------------------------------------------------------------
class RandomCropFlip:
    """The standard CIFAR-10 training augmentation, for a batch on any device: every image
    is padded by 4 pixels (reflected), cut back to 32x32 at a random offset, and mirrored
    left-right with probability 1/2, in one gather.

    Its random numbers come from a generator seeded with (seed, rank, epoch, worker): the
    ranks of a DDP run, and the worker processes of one rank, draw different crops; a run
    repeated, or resumed at an epoch, draws the same ones.
    """

    def __init__(self, seed):
        self.seed, self.epoch, self.generator = seed, 0, None
        self.rank = dist.get_rank() if dist.is_initialized() else 0

    def start_epoch(self, epoch, device="cpu", worker=0):
        self.epoch = epoch
        self.start_worker(worker, device)

    def start_worker(self, worker, device="cpu"):
        key = hash((self.seed, self.rank, self.epoch, worker)) & (2**63 - 1)
        self.generator = torch.Generator(device).manual_seed(key)

    def __getstate__(self):  # a worker started by spawn gets its generator in start_worker
        return {**self.__dict__, "generator": None}

    def __call__(self, images):
        n, channels, height, width = images.shape
        device = images.device
        padded = F.pad(images, (PADDING,) * 4, mode="reflect")
        dx, dy = torch.randint(0, 2 * PADDING + 1, (2, n), generator=self.generator,
                               device=device)
        flip = torch.rand(n, generator=self.generator, device=device) < 0.5
        across = torch.arange(width, device=device)
        across = torch.where(flip[:, None], width - 1 - across, across)  # mirrored: read right to left
        rows = (dy[:, None] + torch.arange(height, device=device))[:, None, :, None]
        cols = (dx[:, None] + across)[:, None, None, :]
        batch = torch.arange(n, device=device)[:, None, None, None]
        channel = torch.arange(channels, device=device)[None, :, None, None]
        return padded[batch, channel, rows, cols]


class AugmentedImages(torch.utils.data.Dataset):
    """A TensorImages set whose batches come out augmented (in a worker, with --workers)."""

    def __init__(self, dataset, crop_flip):
        self.dataset, self.crop_flip = dataset, crop_flip
        self.images, self.labels, self.source = dataset.images, dataset.labels, dataset.source

    def __len__(self):
        return len(self.dataset)

    def __getitems__(self, indices):
        images, labels = self.dataset.__getitems__(indices)
        return self.crop_flip(images), labels


class EpochLoader(torch.utils.data.DataLoader):
    """A DataLoader that tells the augmentation which epoch begins before it starts workers."""

    def __iter__(self):
        if isinstance(self.dataset, AugmentedImages):
            self.dataset.crop_flip.start_epoch(epoch_key(self.sampler))
        return super().__iter__()


def _start_worker(worker_id):
    """worker_init_fn: each worker process draws crops of its own."""
    info = torch.utils.data.get_worker_info()
    info.dataset.crop_flip.start_worker(worker_id + 1)


def epoch_key(sampler):
    """A number that changes with every epoch: DistributedSampler's epoch (set_epoch), or the
    seed of a RandomSampler's generator (the scripts seed it with seed + epoch); else 0."""
    if hasattr(sampler, "epoch"):
        return sampler.epoch
    generator = getattr(sampler, "generator", None)
    return generator.initial_seed() if generator is not None else 0
