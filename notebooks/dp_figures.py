"""Chapter 4's figures: one DataParallel step, and what each device holds during it.

    from notebooks.dp_figures import scatter_pieces, draw_step, device_bytes, draw_loads
    from notebooks.dp_figures import step_to_draw, loads_title, has_module_prefix

The numbers come from torch itself: the pieces from `Tensor.chunk` (what DataParallel's scatter
uses when it is given no chunk sizes), the bytes from the tensors of a model run on the meta
device (shapes and types, no data), and on GPUs from the inputs each replica received.
"""
import torch
import torch.nn.functional as F

from notebooks.figures import colour

MIB = 2**20


def scatter_pieces(batch_size, devices):
    """The rows of a batch each device gets: `Tensor.chunk(devices)` along the batch dimension,
    as torch's `comm.scatter` cuts it; a device past the last piece gets nothing (0)."""
    pieces = [len(piece) for piece in torch.empty(batch_size).chunk(devices)]
    return pieces + [0] * (devices - len(pieces))


def pieces_seen(seen):
    """{device: rows} from (device, input shape) records, as replicas' hooks noted them."""
    pieces = {}
    for device, shape in seen:
        pieces[device] = pieces.get(device, 0) + shape[0]
    return pieces


def step_to_draw(seen, output_device, batch_size=30, devices=4):
    """What the figure of one step draws, and how it says it was found: (pieces, gathered on,
    how). The pieces the replicas noted (`seen`: (device, input shape) records) where more
    than one replica ran, a scatter; else Tensor.chunk's pieces for `devices` GPUs, said to be
    computed, not run here."""
    if len({device for device, _ in seen}) > 1:
        pieces = dict(sorted(pieces_seen(seen).items(), key=lambda item: int(item[0][5:])))
        return pieces, str(output_device), f"as the replicas on {len(pieces)} GPUs noted it"
    pieces = {f"cuda:{i}": rows for i, rows in enumerate(scatter_pieces(batch_size, devices))}
    return pieces, "cuda:0", f"for {devices} GPUs, from Tensor.chunk (not run here)"


def draw_step(ax, pieces, output_device):
    """One DataParallel forward pass: the batch cut into pieces (scatter), a replica per
    device that got one, and the outputs put back together on output_device (gather).

    pieces: {device label: rows}, in scatter order. Returns what was drawn, for a test:
    {"scatter": [(device, first row, rows)], "replicas": [device], "gathered": (device, rows)}.
    """
    drawn = {"scatter": [], "replicas": [], "gathered": None}
    total = sum(pieces.values())
    start = 0
    for index, (device, rows) in enumerate(pieces.items()):
        if not rows:
            continue
        fill = colour("", index)
        for left, text in ((0.0, f"{rows} rows"), (4.0, f"{rows} rows")):
            ax.add_patch(_box(left, start, 1.4, rows, fill))
            ax.text(left + 0.7, start + rows / 2, text, ha="center", va="center", fontsize=10)
        ax.add_patch(_box(2.0, start + 0.1 * rows, 1.4, 0.8 * rows, "white", edge=fill))
        ax.text(2.7, start + rows / 2, f"replica\n{device}", ha="center", va="center",
                fontsize=10)
        for left in (1.45, 3.45):
            ax.annotate("", (left + 0.5, start + rows / 2), (left, start + rows / 2),
                        arrowprops=dict(arrowstyle="->", color="#333333"))
        drawn["scatter"].append((device, start, rows))
        drawn["replicas"].append(device)
        start += rows
    drawn["gathered"] = (output_device, total)
    for left, title in ((0.7, "batch, cut\n(scatter)"), (2.7, "forward\n(parallel_apply)"),
                        (4.7, f"outputs on\n{output_device}\n(gather)")):
        ax.text(left, -0.04 * total, title, ha="center", va="bottom", fontsize=10)
    ax.set_xlim(-0.1, 5.5)
    ax.set_ylim(total * 1.02, -0.3 * total)   # the first row on top, room for the titles
    ax.set_yticks([tick for tick in ax.get_yticks() if 0 <= tick <= total])
    ax.set_ylabel("rows of the batch")
    ax.set_xticks([])
    ax.spines["bottom"].set_visible(False)
    return drawn


def _box(left, bottom, width, height, fill, edge="#333333"):
    import matplotlib.pyplot as plt
    return plt.Rectangle((left, bottom), width, height, facecolor=fill, edgecolor=edge, lw=1.5)


def layer_output_bytes(model, rows, shape=(3, 32, 32)):
    """Bytes of every layer's output for a piece of `rows` images: the model is copied to the
    meta device and run there, so only shapes and types are computed, in no time."""
    import copy
    if rows == 0:
        return 0
    meta = copy.deepcopy(model).to("meta")
    total = []

    def note(module, inputs, output):
        total.append(output.numel() * output.element_size())

    leaves = [m for m in meta.modules() if not list(m.children())]
    hooks = [m.register_forward_hook(note) for m in leaves]
    try:
        with torch.no_grad():
            meta(torch.empty(rows, *shape, device="meta"))
    finally:
        for hook in hooks:
            hook.remove()
    return sum(total)


def device_bytes(model, batch_size, devices, classes=10):
    """What each device holds in a DataParallel training step with SGD and momentum, computed
    from tensor sizes: {device label: {part: bytes}}. Every device: a replica of the parameters
    and buffers, its rows of the input, and the layer outputs of its piece. The first device
    holds the whole input batch (it is scattered from there), and also the gradients, the
    momentum, and the whole batch's outputs, gathered."""
    model_bytes = sum(t.numel() * t.element_size()
                      for t in [*model.parameters(), *model.buffers()])
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    image_bytes = 3 * 32 * 32 * 4
    loads = {}
    for index, rows in enumerate(scatter_pieces(batch_size, devices)):
        load = {"parameters and buffers": model_bytes,
                "input rows": (batch_size if index == 0 else rows) * image_bytes,
                "layer outputs of its piece": layer_output_bytes(model, rows)}
        if index == 0:
            load.update({"gradients": parameter_bytes, "SGD momentum": parameter_bytes,
                         "gathered outputs": batch_size * classes * 4})
        loads[f"cuda:{index}"] = load
    return loads


def measured_peaks(model_name, batch_size, gpus):
    """Peak memory_allocated (bytes) per GPU over two DataParallel training steps of model_name
    with SGD and momentum, on random data: {cuda:i: bytes}. Needs two or more GPUs."""
    from ddp_scripts.models import build_model
    model = build_model(model_name, seed=0).to("cuda:0")
    data_parallel = torch.nn.DataParallel(model)
    optimizer = torch.optim.SGD(data_parallel.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(batch_size, 3, 32, 32, device="cuda:0")
    labels = torch.randint(0, 10, (batch_size,), device="cuda:0")
    for index in range(gpus):
        torch.cuda.reset_peak_memory_stats(index)
    for _ in range(2):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(data_parallel(images), labels).backward()
        optimizer.step()
    peaks = {}
    for index in range(gpus):
        torch.cuda.synchronize(index)
        peaks[f"cuda:{index}"] = torch.cuda.max_memory_allocated(index)
    del model, data_parallel, optimizer, images, labels
    torch.cuda.empty_cache()
    return peaks


def draw_loads(ax, loads, peaks=None):
    """Stacked bars of each device's load in MiB (figures.stacked_bars), with the measured
    peaks as ticks where there are any. Returns what stacked_bars drew."""
    from notebooks.figures import stacked_bars
    bars = {device: {part: size / MIB for part, size in parts.items()}
            for device, parts in loads.items()}
    total = {device: size / MIB for device, size in (peaks or {}).items()}
    return stacked_bars(ax, bars, unit="MiB", total=total or None)


def loads_title(model, batch_size, devices, peaks, gpu_name=None):
    """The title of the loads figure: measured only where there are measured peaks."""
    if peaks:
        return (f"{model}, batch {batch_size}: parts computed, peaks (|) measured\n"
                f"on {len(peaks)} x {gpu_name}")
    return (f"{model}, batch {batch_size}, {devices} GPUs: computed from\n"
            "tensor sizes on a CPU, not measured")


def has_module_prefix(names):
    """Whether a state_dict's names carry the `module.` that DataParallel and DDP add: a
    checkpoint saved from the wrapper, not from the model inside it."""
    return any(name.startswith("module.") for name in names)
