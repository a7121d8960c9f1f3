"""Chapter 10's figures, fed their data: one profiled training step of the scripts' own
`train_one_epoch`, and the H200 recording the chapter reads (results/gpu-runs/*/micro.txt)."""
import re
from pathlib import Path
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import pandas as pd
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from ddp_scripts import train_single
from ddp_scripts.data import TensorImages, make_loader, synthetic_cifar
from ddp_scripts.models import build_model
from notebooks import timeline_figures

ROOT = Path(__file__).resolve().parents[2]
MICRO = ROOT / "results" / "gpu-runs" / "2026-11-30-h200" / "micro.txt"


@pytest.fixture(scope="module")
def events():
    (images, labels), _ = synthetic_cifar(192, 10)
    loader = make_loader(TensorImages(images, labels, "synthetic"), 64, None)
    model = build_model("cnn")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train_single.train_one_epoch(model, loader, optimizer, torch.device("cpu"))
    return prof.events()



def test_a_step_is_the_loader_then_forward_backward_and_the_optimizer(events):
    rows = timeline_figures.step_rows(events, step=1)
    assert list(rows) == ["CPU: main thread"]   # on the CPU, backward runs on the caller's thread
    kinds = [kind for _, _, kind in rows["CPU: main thread"]]
    # zero_grad and step are both "optimizer": the step begins with the loader and ends with it
    assert kinds[0] == "data" and "forward" in kinds and "backward" in kinds
    assert kinds.index("forward") < kinds.index("backward") < len(kinds) - 1 - kinds[::-1].index("optimizer")
    starts = [start for start, _, _ in rows["CPU: main thread"]]
    assert starts == sorted(starts) and starts[0] == 0.0
    # The intervals are the profiler's own: the step's backward spans its autograd events.
    top = sorted((e for e in events if e.cpu_parent is None), key=lambda e: e.time_range.start)
    begins = [e.time_range.start for e in top if e.name.startswith("enumerate(DataLoader)")]
    backward = [e for e in top if e.name.startswith("autograd::engine")
                and begins[1] <= e.time_range.start < begins[2]]
    start, stop, _ = next(r for r in rows["CPU: main thread"] if r[2] == "backward")
    assert start == pytest.approx((backward[0].time_range.start - begins[1]) / 1e3)
    assert stop == pytest.approx((max(e.time_range.end for e in backward) - begins[1]) / 1e3)


def notes_drawn(ax):
    return [t.get_text() for t in ax.texts if t.get_text() == timeline_figures.NO_GPU_ROW]


def test_planted_no_gpu_kernels_the_step_figure_says_its_gpu_row_needs_a_gpu(events, figure):
    _, ax = figure()
    drawn = timeline_figures.draw_step(ax, events, step=1)
    rows = timeline_figures.step_rows(events, step=1)
    assert "GPU" not in rows  # a profile of the CPU only
    expected = {label: [(s, e - s, k) for s, e, k in spans] for label, spans in rows.items()}
    # The GPU row is always there: empty, with the note that it needs a GPU
    assert drawn == {"GPU": [], **expected}
    assert len(notes_drawn(ax)) == 1


def kernel(start_us, end_us, name="void gemm_kernel"):
    """A profiler event as a CUDA kernel gives it: on the GPU, with no CPU parent."""
    return SimpleNamespace(name=name, cpu_parent=None, thread=0,
                           device_type=torch.autograd.DeviceType.CUDA,
                           time_range=SimpleNamespace(start=start_us, end=end_us))


def test_right_case_a_step_with_kernels_draws_them_without_the_note(events, figure):
    top = sorted((e for e in events if e.cpu_parent is None), key=lambda e: e.time_range.start)
    begin = [e.time_range.start for e in top if e.name.startswith("enumerate(DataLoader)")][1]
    kernels = [kernel(begin + 100, begin + 300), kernel(begin + 400, begin + 450, "Memcpy HtoD")]
    _, ax = figure()
    drawn = timeline_figures.draw_step(ax, [*events, *kernels], step=1)
    assert [kind for _, _, kind in drawn["GPU"]] == ["compute", "copy"]
    spans = [value for start, width, _ in drawn["GPU"] for value in (start, width)]
    assert spans == pytest.approx([0.1, 0.2, 0.4, 0.05])  # ms from the step's start
    assert notes_drawn(ax) == []


def test_a_step_past_the_profile_is_refused(events):
    with pytest.raises(ValueError, match="asked for step 5"):
        timeline_figures.step_rows(events, step=5)


def test_the_h200_bars_are_the_recorded_samples_per_second(figure):
    rows = []
    for line in MICRO.read_text().splitlines()[1:]:
        m = re.match(r"(\w+) b(\d+): (.+?)\s+(\d+) samples/s$", line)
        rows.append({"model": m[1], "batch": int(m[2]), "path": m[3], "samples/s": int(m[4])})
    micro = pd.DataFrame(rows)
    panels = timeline_figures.micro_panels(micro)
    _, axes = figure(2, 2, height=5.2)
    drawn = timeline_figures.draw_micro(axes.flat, panels)
    assert list(drawn) == list(panels) == [("cnn", 64), ("cnn", 512), ("resnet18", 64),
                                           ("resnet18", 512)]
    for key, bars in drawn.items():
        recorded = micro[(micro["model"] == key[0]) & (micro["batch"] == key[1])]
        assert [parts[0][2] for parts in bars.values()] == recorded["samples/s"].tolist()
        graph = ["CUDA graph" in path for path in recorded["path"]]
        assert [parts[0][0] == timeline_figures.GRAPH_ROWS for parts in bars.values()] == graph
    widths = sorted(p.get_width() for p in axes.flat[0].patches)
    assert widths == sorted(micro[(micro["model"] == "cnn") & (micro["batch"] == 64)]["samples/s"])


# The lines chapter 10 prints under its tables ---------------------------------------------------
def test_planted_a_lever_that_moves_the_accuracy_more_than_augment_is_said():
    accuracy = {"untuned": 0.40, "--augment": 0.36, "--amp bf16": 0.33, "--workers 2": None}
    line = timeline_figures.accuracy_line(accuracy, "--augment")
    assert line.endswith("--augment moves it NOT most")
    assert "--augment 0.040 apart, every other lever within 0.070" in line


def test_right_case_augment_moving_the_accuracy_most_is_said():
    accuracy = pd.Series({"untuned": 0.40, "--augment": 0.32, "--amp bf16": 0.41,
                          "--tf32": float("nan")})
    line = timeline_figures.accuracy_line(accuracy, "--augment")
    assert line.endswith("--augment moves it most")
    assert "--augment 0.080 apart, every other lever within 0.010" in line


# Two standard errors of the difference of two accuracies near 0.5 on 1,024 test images: 0.044
def test_planted_a_loss_within_the_noise_gets_no_share_won_back():
    line = timeline_figures.scaling_line([0.50, 0.47, 0.52, 0.51], 1024)
    assert "within the noise of 1,024 test images (two standard errors of the difference, 0.044)" in line
    assert "wins back" not in line and "%" not in line


def test_planted_a_gain_beyond_the_noise_is_not_called_a_loss():
    line = timeline_figures.scaling_line([0.50, 0.55, 0.52, 0.51], 1024)
    assert line.startswith("8x batch, same lr: accuracy +0.050; a gain beyond the noise")
    assert "wins back" not in line


def test_right_case_a_loss_beyond_the_noise_is_won_back_in_part():
    line = timeline_figures.scaling_line([0.60, 0.40, 0.55, 0.56], 1024)
    assert line == ("8x batch, same lr: accuracy -0.200; the linear rule wins back 75% of it; "
                    "warm-up then changes the accuracy by +0.010")


@pytest.fixture
def world_of_one():
    import torch.distributed as dist

    from ddp_scripts.launcher import free_port
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def ddp_step(bucket_view):
    """Two steps of a small model under DDP (the buckets rebuilt after the first, as the
    chapter's cell takes them); returns the model and the buffers its hook was given."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP
    buffers = []

    def hook(state, bucket):
        buffers.append(bucket.buffer())
        return allreduce_hook(dist.group.WORLD, bucket)

    torch.manual_seed(0)
    ddp = DDP(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)),
              gradient_as_bucket_view=bucket_view)
    ddp.register_comm_hook(None, hook)
    for _ in range(2):
        buffers.clear()
        ddp(torch.randn(4, 8)).sum().backward()
    return ddp, buffers


def test_planted_gradients_copied_into_the_buckets_are_not_views_of_them(world_of_one):
    ddp, buffers = ddp_step(bucket_view=False)
    assert not timeline_figures.grads_in_buckets(ddp.parameters(), buffers)
    ddp, buffers = ddp_step(bucket_view=True)  # views, but of another tensor than a bucket
    elsewhere = torch.zeros(1000)
    for p in ddp.parameters():
        p.grad = elsewhere[:p.numel()].view_as(p)
    assert not timeline_figures.grads_in_buckets(ddp.parameters(), buffers)
    for p in ddp.parameters():  # no backward yet: no .grad, in a bucket or anywhere
        p.grad = None
    assert not timeline_figures.grads_in_buckets(ddp.parameters(), buffers)


def test_right_case_gradient_as_bucket_view_makes_every_grad_a_view_of_a_bucket(world_of_one):
    ddp, buffers = ddp_step(bucket_view=True)
    assert timeline_figures.grads_in_buckets(ddp.parameters(), buffers)
