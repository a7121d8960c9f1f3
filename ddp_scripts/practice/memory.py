"""What a training step holds in GPU memory, read with PyTorch's memory tools.

`step_memory(device)` runs a few steps of a small network on a CUDA device and returns the
caching allocator's numbers: the peak of what tensors held (`max_memory_allocated`), the
peak of what the allocator kept from the GPU (`max_memory_reserved`, a safe upper bound of
what the step needs), how often it had to free its cache and retry (`num_alloc_retries`), and
`memory_summary`; with `snapshot` it records the history of every
allocation and writes the snapshot that pytorch.org/memory_viz draws.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def make_model(width=2048, depth=4):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def static_bytes(model, optimizer_states_per_parameter=1):
    """Parameters, gradients and SGD-with-momentum state: the part of a step that stays."""
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"parameters": parameters, "gradients": parameters,
            "optimizer state": parameters * optimizer_states_per_parameter}


def step_memory(device, steps=3, batch=256, snapshot=None):
    """Allocator numbers for `steps` steps of SGD with momentum on `device` (CUDA only)."""
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 2048, device=device)
    if snapshot:
        torch.cuda.memory._record_memory_history(max_entries=100_000)
    torch.cuda.reset_peak_memory_stats(device)   # a peak since this line, not since start
    for _ in range(steps):
        optimizer.zero_grad()
        F.mse_loss(model(x), x).backward()
        optimizer.step()
    torch.cuda.synchronize(device)
    if snapshot:
        torch.cuda.memory._dump_snapshot(str(snapshot))
        torch.cuda.memory._record_memory_history(enabled=None)   # stop recording
    return {"static": static_bytes(model),
            "allocated": torch.cuda.memory_allocated(device),
            "max_allocated": torch.cuda.max_memory_allocated(device),
            "reserved": torch.cuda.memory_reserved(device),
            "max_reserved": torch.cuda.max_memory_reserved(device),
            "alloc_retries": torch.cuda.memory_stats(device).get("num_alloc_retries", 0),
            "summary": torch.cuda.memory_summary(device, abbreviated=True)}
