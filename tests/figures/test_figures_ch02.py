"""Chapter 2's figures (notebooks/loop_figures.py), fed a short run of the chapter's kind: what
they draw is what the run recorded."""
import math
import time

import matplotlib

matplotlib.use("Agg")

import torch
import torch.nn.functional as F

from ddp_scripts.data import load_datasets, make_loader
from ddp_scripts.models import build_model
from notebooks import loop_figures



def test_the_loss_curves_are_the_losses_the_run_recorded(axes):
    train_set, test_set = load_datasets("synthetic", train_samples=128, test_samples=64)
    loader = make_loader(train_set, batch_size=32, sampler=None)
    model = build_model("cnn", seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    history, batch_losses = [], []
    for epoch in (1, 2):
        losses = []
        for images, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        with torch.no_grad():
            test_loss = F.cross_entropy(model(test_set.images), test_set.labels).item()
        batch_losses += losses
        history.append({"epoch": epoch, "train_loss": sum(losses) / len(losses),
                        "test_loss": test_loss})
    drawn = loop_figures.loss_curves(axes, history, batch_losses, len(loader))
    lines = {line.get_label(): line for line in axes.get_lines()}
    assert list(lines["train loss, each batch"].get_ydata()) == batch_losses
    assert list(lines["train loss, each batch"].get_xdata()) == [0.25, 0.5, 0.75, 1.0,
                                                                 1.25, 1.5, 1.75, 2.0]
    assert list(lines["train loss, epoch mean"].get_xdata()) == [0.5, 1.5]
    assert list(lines["train loss, epoch mean"].get_ydata()) == [r["train_loss"] for r in history]
    assert list(lines["test loss"].get_ydata()) == [r["test_loss"] for r in history]
    assert lines["guessing (ln 10)"].get_ydata()[0] == math.log(10)
    assert drawn["test loss"] == ([1, 2], [r["test_loss"] for r in history])


def test_the_clock_bars_are_the_times_measured_and_skip_what_was_not(axes):
    a = torch.randn(128, 128)
    start = time.perf_counter()
    a @ a
    queued = (time.perf_counter() - start) * 1000
    done = (time.perf_counter() - start) * 1000
    timings = {"cpu": {"clock, no wait (ms)": queued, "clock after wait (ms)": done,
                       "CUDA events (ms)": float("nan")}}
    drawn = loop_figures.clock_bars(axes, timings)
    assert drawn == {"cpu": [("clock, no wait (ms)", queued), ("clock after wait (ms)", done)]}
    assert sorted(p.get_width() for p in axes.patches) == sorted([queued, done])
    assert [t.get_text() for t in axes.get_yticklabels()] == ["cpu"]
