"""Models that tests/scripts/test_fit.py asks `python -m ddp_scripts.fit` about, by file path
as a reader's own model would be: a small CNN with BatchNorm."""
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
