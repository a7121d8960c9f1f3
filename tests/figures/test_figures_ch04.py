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


# The chapter's verdicts: each fed the flaw it exists to catch, and a right case.

def test_planted_another_model_inside_the_wrapper_is_neither_the_model_nor_its_output():
    plain, other = build_model("cnn", seed=0), build_model("cnn", seed=1)
    wrapped = nn.DataParallel(other, device_ids=[])   # no GPU: it calls the module itself
    images = torch.randn(8, 3, 32, 32)
    assert wrapped.module is not plain
    assert not torch.equal(wrapped(images), plain(images))


def test_right_case_dataparallel_without_gpus_calls_the_model_itself():
    plain = build_model("cnn", seed=0)
    wrapped = nn.DataParallel(plain, device_ids=[])
    images = torch.randn(8, 3, 32, 32)
    assert wrapped.module is plain and torch.equal(wrapped(images), plain(images))


def test_planted_one_replica_is_drawn_as_computed_not_as_a_scatter_noted():
    seen = [("cuda:0", (30, 3, 32, 32))]   # one GPU: one forward pass, the whole batch
    pieces, gathered_on, how = dp_figures.step_to_draw(seen, "cuda:0", 30, 4)
    assert how == "for 4 GPUs, from Tensor.chunk (not run here)"
    assert pieces == {"cuda:0": 8, "cuda:1": 8, "cuda:2": 8, "cuda:3": 6}


def test_right_case_the_pieces_the_replicas_noted_are_drawn():
    seen = [("cuda:1", (15, 3, 32, 32)), ("cuda:0", (15, 3, 32, 32))]
    pieces, gathered_on, how = dp_figures.step_to_draw(seen, torch.device("cuda", 0), 30, 4)
    assert how == "as the replicas on 2 GPUs noted it"
    assert list(pieces.items()) == [("cuda:0", 15), ("cuda:1", 15)] and gathered_on == "cuda:0"


def test_planted_no_measured_peaks_the_title_says_not_measured():
    title = dp_figures.loads_title("ResNet-18", 512, 4, None)
    assert title.endswith("computed from\ntensor sizes on a CPU, not measured")


def test_right_case_measured_peaks_are_said_to_be_measured():
    title = dp_figures.loads_title("ResNet-18", 256, 2, {"cuda:0": 5, "cuda:1": 3}, "NVIDIA H200")
    assert title == "ResNet-18, batch 256: parts computed, peaks (|) measured\non 2 x NVIDIA H200"


def test_planted_a_checkpoint_of_the_wrapper_has_the_module_prefix():
    assert dp_figures.has_module_prefix(nn.DataParallel(Net()).state_dict())


def test_right_case_a_checkpoint_of_the_model_inside_has_none():
    assert not dp_figures.has_module_prefix(nn.DataParallel(Net()).module.state_dict())
