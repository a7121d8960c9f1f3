"""Models that tests/scripts/test_fit.py asks `python -m ddp_scripts.fit` about, by file path
as a reader's own model would be: a small CNN with BatchNorm, a model with no repeating
block, one that returns a dict, one with a parameter of no dimensions."""
import torch
import torch.nn as nn


class ConvBlock(nn.Module):
    def __init__(self, into, out):
        super().__init__()
        self.conv = nn.Conv2d(into, out, 3, padding=1, bias=False)
        self.norm = nn.BatchNorm2d(out)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.norm(self.conv(x)))


def bn_cnn(width=16, classes=10):
    """Three conv-BatchNorm-ReLU blocks, pooled, and a linear head."""
    return nn.Sequential(ConvBlock(3, width), nn.MaxPool2d(2), ConvBlock(width, 2 * width),
                         nn.MaxPool2d(2), ConvBlock(2 * width, 4 * width),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, classes))


class Flat(nn.Module):
    """No module that repeats: no units, the whole model is the head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 32, 3, padding=1)
        self.norm = nn.BatchNorm2d(32)
        self.pool = nn.AdaptiveAvgPool2d(4)
        self.fc = nn.Linear(32 * 16, 10)

    def forward(self, x):
        return self.fc(self.pool(self.norm(self.conv(x)).relu()).flatten(1))


def flat():
    return Flat()


class Named(nn.Module):
    """Returns a dict, as many libraries' models do: the loss is taken of its "logits"."""

    def __init__(self, width=32):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(2))
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        hidden = x
        for block in self.blocks:
            hidden = block(hidden)
        return {"hidden": hidden, "logits": self.head(hidden)}


def named(width=32):
    return Named(width)


class Scalar(nn.Module):
    """A learned scale of no dimensions, which FSDP's fully_shard refuses."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 10)
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x):
        return self.fc(x) * self.scale


def scalar():
    return Scalar()


class Stage(nn.Sequential):
    """A block written as a subclass of nn.Sequential: a block, not a plain container."""

    def __init__(self, width):
        super().__init__(nn.Linear(width, width), nn.GELU())


def stages(width=16, depth=3):
    """Stages between two Linear layers, and BatchNorm that reads its step count's value in
    forward (momentum=None: float(num_batches_tracked))."""
    return nn.Sequential(nn.Linear(8, width), *[Stage(width) for _ in range(depth)],
                         nn.BatchNorm1d(width, momentum=None), nn.Linear(width, 10))
