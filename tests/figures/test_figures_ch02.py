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


# The chapter's verdicts: each fed the flaw it exists to catch, and a right case.

def test_planted_a_move_to_another_device_returns_another_tensor():
    # "the same object": False where .to made a new tensor, which the code must keep
    original = torch.tensor([0, 6, 2, 0])
    assert original.to("meta") is not original


def test_right_case_to_its_own_device_returns_the_tensor_itself():
    original = torch.tensor([0, 6, 2, 0])
    assert original.to(original.device) is original


def test_planted_a_move_to_meta_leaves_the_optimizer_with_the_old_parameters():
    row = loop_figures.made_before_the_move(torch.device("meta"))
    assert row["returns net itself"] and not row["optimizer holds net's weight"]
    assert row["optimizer's weight"].startswith("cpu") and row["net's weight"].startswith("meta")


def test_right_case_a_move_to_float64_keeps_the_parameters():
    row = loop_figures.made_before_the_move(torch.float64)
    assert row["returns net itself"] and row["optimizer holds net's weight"]
    assert row["optimizer's weight"] == row["net's weight"] == "cpu, torch.float64"


def test_planted_outside_inference_mode_the_output_requires_grad():
    out = build_model("cnn", seed=0)(torch.randn(2, 3, 32, 32))
    assert out.requires_grad and not out.is_inference()


def test_right_case_inside_inference_mode_the_output_is_an_inference_tensor():
    with torch.inference_mode():
        out = build_model("cnn", seed=0)(torch.randn(2, 3, 32, 32))
    assert not out.requires_grad and out.is_inference()


ALONE = {"copy alone": 0.70, "product alone": 2.00}


def test_planted_a_second_stream_that_gained_nothing_is_said():
    line = loop_figures.streams_line(ALONE, one=2.70, two=2.69)
    assert "the product waited for the copy" in line
    assert line.endswith("no clear gain from the second stream here.")


def test_planted_one_stream_faster_than_the_two_added_up_is_said():
    line = loop_figures.streams_line(ALONE, one=2.00, two=2.00)
    assert "clearly less than their sum" in line


def test_right_case_the_copy_ran_beside_the_product():
    line = loop_figures.streams_line(ALONE, one=2.70, two=2.05)
    assert "the product waited for the copy" in line
    assert line.endswith("0.65 ms less: the copy ran beside the product.")


def machine_load_at(monkeypatch, load, cores):
    from notebooks import chapter_tools
    monkeypatch.setattr(chapter_tools.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(chapter_tools.os, "sched_getaffinity", lambda pid: set(range(cores)),
                        raising=False)
    return chapter_tools.machine_load()


def test_planted_more_work_than_cores_is_called_busy(monkeypatch):
    assert "busy: more work than cores" in machine_load_at(monkeypatch, 5.6, 2)


def test_right_case_a_machine_with_cores_to_spare_is_not_called_busy(monkeypatch):
    line = machine_load_at(monkeypatch, 1.5, 2)
    assert line == "load average (1 min) 1.50 on 2 usable cores"
