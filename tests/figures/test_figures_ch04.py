"""Chapter 4's figures (notebooks/dp_figures.py), fed what torch and a run give them: the
pieces are the scatter's, the bytes are the tensors', the bars are those numbers."""
import matplotlib

matplotlib.use("Agg")

import pytest
import torch
import torch.nn as nn

from ddp_scripts.models import Net, build_model
from notebooks import dp_figures

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0



@pytest.mark.parametrize("batch, devices", [(30, 4), (5, 4), (7, 2), (3, 8)])
def test_the_pieces_are_tensor_chunk_s_with_none_for_devices_past_the_last(batch, devices):
    pieces = dp_figures.scatter_pieces(batch, devices)
    chunks = [len(c) for c in torch.arange(batch).chunk(devices)]
    assert pieces[:len(chunks)] == chunks and not any(pieces[len(chunks):])
    assert len(pieces) == devices and sum(pieces) == batch


@pytest.mark.gpu
@pytest.mark.skipif(GPUS < 2, reason="comm.scatter needs two or more CUDA GPUs")
def test_the_pieces_are_what_torch_s_scatter_puts_on_each_gpu():
    from torch.nn.parallel import comm
    batch = torch.randn(30, 3)
    scattered = comm.scatter(batch, list(range(GPUS)))
    assert [len(t) for t in scattered] == [p for p in dp_figures.scatter_pieces(30, GPUS) if p]


def test_the_step_draws_each_piece_a_replica_and_the_gathered_batch(axes):
    seen = []

    class Noting(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = Net()

        def forward(self, x):
            seen.append((str(x.device), tuple(x.shape)))
            return self.net(x)

    module = Noting().to("cuda:0" if GPUS > 1 else "cpu")   # with one GPU the wrapper moves it
    outputs = nn.DataParallel(module)(torch.randn(30, 3, 32, 32))
    recorded = dict(sorted(dp_figures.pieces_seen(seen).items()))
    if GPUS < 2:   # no scatter without GPUs: the module got the whole batch
        assert recorded == {"cpu": 30} if not GPUS else sum(recorded.values()) == 30
        pieces = {f"cuda:{i}": r for i, r in enumerate(dp_figures.scatter_pieces(30, 4))}
    else:
        pieces = recorded
    drawn = dp_figures.draw_step(axes, pieces, str(outputs.device))
    rows = [r for r in pieces.values() if r]
    assert [size for _, _, size in drawn["scatter"]] == rows
    assert [start for _, start, _ in drawn["scatter"]] == [sum(rows[:i]) for i in range(len(rows))]
    assert drawn["gathered"] == (str(outputs.device), len(outputs))
    heights = [round(p.get_height(), 6) for p in axes.patches]
    assert heights.count(8) >= 2 * rows.count(8)   # each piece, cut and gathered
    texts = [t.get_text() for t in axes.texts]
    assert all(f"replica\n{device}" in texts for device in drawn["replicas"])


def test_layer_outputs_on_the_meta_device_are_the_bytes_of_a_real_forward_pass():
    model = build_model("cnn", seed=0)
    sizes = []
    hooks = [m.register_forward_hook(lambda m, i, o: sizes.append(o.numel() * o.element_size()))
             for m in model.modules() if not list(m.children())]
    with torch.no_grad():
        model(torch.randn(6, 3, 32, 32))
    for hook in hooks:
        hook.remove()
    assert dp_figures.layer_output_bytes(model, 6) == sum(sizes) > 0
    assert dp_figures.layer_output_bytes(model, 0) == 0


def test_only_the_first_device_holds_gradients_momentum_and_the_gathered_outputs(axes):
    model = build_model("cnn", seed=0)
    loads = dp_figures.device_bytes(model, 30, 4)
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    assert loads["cuda:0"]["gradients"] == loads["cuda:0"]["SGD momentum"] == parameters
    assert loads["cuda:0"]["gathered outputs"] == 30 * 10 * 4
    assert loads["cuda:0"]["input rows"] == 30 * 3 * 32 * 32 * 4
    assert all("gradients" not in loads[f"cuda:{i}"] for i in (1, 2, 3))
    assert loads["cuda:3"]["layer outputs of its piece"] == dp_figures.layer_output_bytes(model, 6)
    drawn = dp_figures.draw_loads(axes, loads)
    for device, parts in loads.items():
        assert [(part, value) for part, _, value in drawn[device]] == [
            (part, size / dp_figures.MIB) for part, size in parts.items()]


@pytest.mark.gpu
@pytest.mark.skipif(GPUS < 2, reason="measured peaks need two or more CUDA GPUs")
def test_the_first_gpu_s_measured_peak_is_the_largest():
    peaks = dp_figures.measured_peaks("cnn", 64 * GPUS, GPUS)
    assert max(peaks, key=peaks.get) == "cuda:0"
