"""Chapter 10's figures, fed their data: one profiled training step of the scripts' own
`train_one_epoch`, and the H200 recording the chapter reads (results/gpu-runs/*/micro.txt)."""
import re
from pathlib import Path

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


def test_the_step_figure_draws_the_rows(events, figure):
    _, ax = figure()
    drawn = timeline_figures.draw_step(ax, events, step=1)
    rows = timeline_figures.step_rows(events, step=1)
    expected = {label: [(s, e - s, k) for s, e, k in spans] for label, spans in rows.items()}
    # The GPU row is always there: its kernels, or, without them, the note that it needs a GPU
    assert drawn == {"GPU": [], **expected}
    notes = [t.get_text() for t in ax.texts if t.get_text() == timeline_figures.NO_GPU_ROW]
    assert len(notes) == (0 if "GPU" in rows else 1)


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
