"""The models the scripts train, built alike in every process (build_model), and their test;
and a GPT-style decoder (Decoder) that chapter 11 and `python -m ddp_scripts.fit` ask about.
train_fsdp.py's third model, a wide MLP, is in sharding.py, with what shows its shards.

cnn is the CNN of PyTorch's CIFAR-10 tutorial (Net); resnet18 is ResNet-18 as CIFAR-10 papers
use it. evaluate() sums the loss and the correct predictions over a test loader.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    """The CNN of PyTorch's CIFAR-10 tutorial, which the source article trains."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def build_model(name="cnn", seed=0, dtype=torch.float32):
    """The same seed gives the same initial weights in every process."""
    torch.manual_seed(seed)
    model = Net() if name == "cnn" else cifar_resnet18()
    return model.to(dtype)


def cifar_resnet18():
    """ResNet-18 as CIFAR-10 papers use it: a 3x3 stride-1 stem and no max-pool, where
    torchvision's ImageNet stem would shrink a 32x32 image to 8x8 before the first block."""
    import torchvision  # imported only here: it costs seconds at start-up
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")  # as torchvision's
    model.maxpool = nn.Identity()
    return model


@torch.no_grad()
def evaluate(model, loader, device):
    """Returns (sum of losses, correct predictions, samples) as a tensor on `device`."""
    model.eval()
    totals = torch.zeros(3, device=device, dtype=torch.float64)
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        outputs = model(images)
        totals[0] += F.cross_entropy(outputs, labels, reduction="sum")
        totals[1] += (outputs.argmax(1) == labels).sum()
        totals[2] += len(labels)
    return totals


class DecoderBlock(nn.Module):
    """One block of a GPT-style decoder: causal self-attention, then a 4x-wide MLP, each
    after a LayerNorm and added back to its input."""

    def __init__(self, hidden, heads):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} does not split into {heads} heads")
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, seq, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, hidden))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Decoder(nn.Module):
    """A GPT-style decoder: token and position embeddings, `layers` blocks, a LayerNorm and a
    head to the vocabulary. Tokens in (batch, seq), logits out (batch, seq, vocab).
    32 layers of 4096 with a vocabulary of 32000 make 6.7 billion parameters."""

    def __init__(self, layers=2, hidden=64, heads=4, vocab=256, seq=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(DecoderBlock(hidden, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
