"""The data: CIFAR-10, or a synthetic stand-in, as whole tensors; batches cut out by index.

Under DDP the ranks check that they all loaded the same data. How CIFAR-10 is fetched, once
per job, is in cifar10.py.
"""

import torch
import torch.nn.functional as F

from ddp_scripts.cli import RunStopped, UsageError
from ddp_scripts.ranks import agree_on_data_source, world_size

class TensorImages(torch.utils.data.Dataset):
    """Images and labels held as two tensors. `__getitems__` lets a DataLoader fetch a whole
    batch with one indexing operation, not one call per image (keep_batch passes it on)."""

    def __init__(self, images, labels, source):
        self.images, self.labels, self.source = images, labels, source

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.images[index], self.labels[index]

    def __getitems__(self, indices):
        indices = torch.as_tensor(indices)
        return self.images[indices], self.labels[indices]


def keep_batch(batch):
    """collate_fn for TensorImages: the batch is already two stacked tensors."""
    return batch


def synthetic_cifar(train_samples=50_000, test_samples=10_000, seed=1234):
    """A learnable stand-in for CIFAR-10: same shapes, ten classes, offline. An image is its
    class's smooth colour pattern, shifted by up to 8 pixels, scaled, under strong noise: the
    CNN learns it over several epochs, and the test split (other images) measures that."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(10, 3, 4, 4, generator=g)
    patterns = F.interpolate(coarse, size=(40, 40), mode="bicubic", align_corners=False)

    def make(n, split_seed):
        g_split = torch.Generator().manual_seed(split_seed)
        labels = torch.randint(0, 10, (n,), generator=g_split)
        dx, dy = torch.randint(0, 9, (2, n), generator=g_split)
        images = _shifted_crops(patterns, labels, dx, dy)
        # The pattern is faint (a sixth of the noise, or less): CIFAR-like difficulty.
        scale = (0.3 + 0.7 * torch.rand(n, 1, 1, 1, generator=g_split)) / 6
        images = scale * images + torch.randn(n, 3, 32, 32, generator=g_split)
        return images, labels

    try:
        return make(train_samples, seed + 1), make(test_samples, seed + 2)
    except RuntimeError as error:  # more images than the memory holds: one line
        from ddp_scripts.mishaps import too_many_images
        raise too_many_images(train_samples + test_samples, error) from None


def _shifted_crops(patterns, labels, dx, dy):
    """32x32 windows of each label's 40x40 pattern, starting at (dy, dx), without a loop."""
    rows = (dy[:, None] + torch.arange(32))[:, None, :, None]    # (n, 1, 32, 1)
    cols = (dx[:, None] + torch.arange(32))[:, None, None, :]    # (n, 1, 1, 32)
    channel = torch.arange(3)[None, :, None, None]                # (1, 3, 1, 1)
    return patterns[labels[:, None, None, None], channel, rows, cols]


def load_datasets(dataset="cifar10", data_dir="data", train_samples=None, test_samples=None,
                  dtype="float32", fallback=True):
    """Train and test sets as TensorImages. CIFAR-10 falls back to synthetic, announced (or,
    with fallback=False, stops the run in one line). The ranks check that they all loaded
    the same data."""
    loaded, source = None, "synthetic"
    if dataset == "cifar10":
        from ddp_scripts.cifar10 import cifar10_or_why  # the download machinery, only when asked
        loaded, source = cifar10_or_why(data_dir, fallback)  # says why it falls back
    agree_on_data_source(source, data_dir)
    if isinstance(loaded, RunStopped):  # --no-synthetic-fallback: every rank stops, together
        raise loaded
    (x_train, y_train), (x_test, y_test) = loaded or synthetic_cifar(train_samples or 50_000,
                                                                     test_samples or 10_000)
    dtype = getattr(torch, dtype)  # [:None] below: every image
    return (TensorImages(x_train[:train_samples].to(dtype), y_train[:train_samples], source),
            TensorImages(x_test[:test_samples].to(dtype), y_test[:test_samples], source))


def check_batch_fits(batch_size, train_samples):
    """A global batch (batch_size x processes) larger than the training set: one line."""
    processes = world_size()
    if batch_size * processes > train_samples:
        raise UsageError(f"a global batch of {batch_size * processes} ({processes} x "
                         f"--batch-size {batch_size}) is larger than the {train_samples} "
                         "training images: lower --batch-size")


def make_loader(dataset, batch_size, sampler):
    """A DataLoader over a TensorImages set: one indexing operation per batch."""
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler,
                                       collate_fn=keep_batch)
