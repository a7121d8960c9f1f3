"""Chapter 5's figures, fed one run of ddp_scripts/recorders/ddp_anatomy.py on 4 gloo CPU ranks: what each
drawing shows is what the ranks recorded, and the simulated ring ends where the all-reduce did."""
import copy

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from ddp_scripts.launcher import run_command, torchrun_command
from notebooks import ddp_figures
from helpers import sampler_orders

WORLD = 4


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ch05-anatomy")
    run_command(torchrun_command("recorders/ddp_anatomy.py", WORLD, ["--out", str(out)]),
                env={"OMP_NUM_THREADS": "1"}, echo=lambda line: None)
    return ddp_figures.load_anatomy(out)



def test_the_job_figure_shows_each_process_as_it_described_itself(ranks, figure):
    drawn = ddp_figures.draw_job(figure()[1], ranks)
    assert [lines[:3] for lines in drawn["processes"]] == [
        [f"rank {r['job']['rank']}", f"local rank {r['job']['local_rank']}", f"pid {r['job']['pid']}"]
        for r in ranks]
    assert sorted(r["job"]["rank"] for r in ranks) == list(range(WORLD))
    assert drawn["group"] == f"process group: world size {WORLD}, backend gloo"


def test_the_sampler_figure_deals_the_ranks_shares_and_marks_the_padding(ranks, figure):
    drawn = ddp_figures.draw_sampler(figure()[1], ranks)
    assert drawn["shares"] == {r: ranks[r]["sampler"]["indices"] for r in range(WORLD)}
    size = ranks[0]["sampler"]["dataset_size"]
    assert size % WORLD, "the recorder must pick a data set the world size does not divide"
    order = drawn["order"]
    assert [order[p] for p in range(1, len(order), WORLD)] == ranks[1]["sampler"]["indices"]
    assert sorted(set(order)) == list(range(size))          # every sample at least once
    assert drawn["padded"] == order[size:] == order[:len(order) - size]  # the first ones again
    repeated = sorted(i for i in set(order) if order.count(i) > 1)
    assert repeated == sorted(drawn["padded"])


def test_the_gradient_figure_shows_each_ranks_own_and_the_averaged_gradient(ranks, figure):
    drawn = ddp_figures.draw_gradients(figure(2, 1)[1], ranks)
    before = torch.tensor([r["gradients"]["before"] for r in ranks])
    after = torch.tensor([r["gradients"]["after"] for r in ranks])
    assert drawn["before"] == [[f"{v:.2f}" for v in row] for row in before.tolist()]
    assert drawn["after"] == [[f"{v:.2f}" for v in row] for row in after.tolist()]
    assert not torch.equal(before[0], before[1])                # each rank its own samples
    assert all(torch.equal(after[0], row) for row in after)     # one average on every rank
    torch.testing.assert_close(after[0], before.mean(0))


def test_the_simulated_ring_ends_where_the_ranks_all_reduce_did(ranks):
    frames = ddp_figures.ring_steps([r["gradients"]["before"] for r in ranks])
    assert len(frames) == 1 + 2 * (WORLD - 1)
    result = torch.tensor(ranks[0]["gradients"]["after"], dtype=torch.float64)
    for row in frames[-1]["values"]:
        torch.testing.assert_close(row, result, rtol=1e-6, atol=1e-6)
    # halfway, after reduce-scatter, rank r holds the finished chunk r, as in gloo's ring
    middle = frames[WORLD - 1]["values"]
    bounds = torch.tensor([0] + frames[WORLD - 1]["chunks"]).cumsum(0).tolist()
    for rank in range(WORLD):
        span = slice(bounds[rank], bounds[rank + 1])
        torch.testing.assert_close(middle[rank, span], result[span], rtol=1e-6, atol=1e-6)
    for frame in frames[1:]:
        # every rank sends one chunk to rank - 1, and receives one from rank + 1
        assert sorted((sender, to) for sender, to, _ in frame["sends"]) == [
            (rank, (rank - 1) % WORLD) for rank in range(WORLD)]
        # a chunk marked finished holds the whole sum; one not marked does not yet
        for rank in range(WORLD):
            for chunk in range(WORLD):
                span = slice(bounds[chunk], bounds[chunk + 1])
                whole = torch.allclose(frame["values"][rank, span], result[span], atol=1e-6)
                assert whole == ((rank, chunk) in frame["finished"]), (frame["title"], rank)
    assert len(frames[-1]["finished"]) == WORLD * WORLD


def test_the_animation_is_offline_html_of_every_step(ranks):
    html, frames = ddp_figures.ring_animation(ranks)
    assert html.data.count("data:image/png;base64") == len(frames) <= 12
    fig, ax = matplotlib.pyplot.subplots()
    sends = frames[1]["sends"]
    assert ddp_figures.draw_ring(ax, WORLD, sends) == sends
    arrows = [t for t in ax.texts if isinstance(t, matplotlib.text.Annotation)]
    assert [t.get_text() for t in ax.texts if t not in arrows] == [
        f"rank {rank}" for rank in range(WORLD)]
    assert len(arrows) == len(sends) == WORLD
    matplotlib.pyplot.close(fig)
    assert "cdnjs" not in html.data and len(html.data) < 1_500_000


def stroke(box):
    """A drawn rectangle's outline, in pixels: (outer, inner) boxes, the two edges of its line."""
    corners = box.get_transform().transform(box.get_path().vertices)
    (x0, y0), (x1, y1) = corners.min(0), corners.max(0)
    half = box.get_linewidth() * box.figure.dpi / 72 / 2
    return (x0 - half, y0 - half, x1 + half, y1 + half), (x0 + half, y0 + half, x1 - half, y1 - half)


def inside(a, b):
    return b[0] < a[0] and b[1] < a[1] and a[2] < b[2] and a[3] < b[3]


def apart(a, b):
    return a[2] < b[0] or b[2] < a[0] or a[3] < b[1] or b[3] < a[1]


def test_the_rings_orange_and_green_outlines_never_overlap(ranks):
    frames = ddp_figures.ring_steps([r["gradients"]["before"] for r in ranks])
    for number, frame in enumerate(frames):
        fig, (ring_ax, ax) = ddp_figures.ring_figure()
        boxes = ddp_figures.draw_ring_frame(ring_ax, ax, frame, ddp_figures.value_labels(ranks[0]))
        fig.canvas.draw()
        assert sorted(boxes["received"]) == sorted(frame["received"])
        assert sorted(boxes["finished"]) == sorted(frame["finished"])
        for orange in boxes["received"].values():
            for green in boxes["finished"].values():
                (o_out, o_in), (g_out, g_in) = stroke(orange), stroke(green)
                assert apart(o_out, g_out) or inside(g_out, o_in) or inside(o_out, g_in), number
        matplotlib.pyplot.close(fig)
    both = [i for i, f in enumerate(frames) if set(f["received"]) & set(f["finished"])]
    assert both, "a chunk both just received and finished: the case the outlines must keep apart"


def test_the_timeline_draws_the_hooks_times(ranks, figure):
    drawn = ddp_figures.draw_timeline(figure(2, 1)[1], ranks)
    for step in (1, 2):
        events = ranks[0]["timeline"][step - 1]["events"]
        buckets = sorted((e for e in events if e["kind"] == "all-reduce"),
                         key=lambda e: e["bucket"])
        assert [drawn[step][f"rank 0 bucket {e['bucket']}"] for e in buckets] == [
            [(e["start"], e["end"] - e["start"], "all-reduce")] for e in buckets]
        kinds = [kind for _, _, kind in drawn[step]["rank 0 compute"]]
        assert kinds == ["forward", "backward", "wait"]
    first, second = (ranks[0]["timeline"][i]["events"] for i in (0, 1))
    last_gradient = max(e["at"] for e in first if e["kind"] == "gradient")
    assert [e["start"] >= last_gradient for e in first if e["kind"] == "all-reduce"] == [True]
    assert sum(e["kind"] == "all-reduce" for e in second) > 1
    # from step 2 on, the first bucket is sent before backward has made the last gradient
    first_send = min(e["start"] for e in second if e["kind"] == "all-reduce")
    assert first_send < max(e["at"] for e in second if e["kind"] == "gradient")


def test_the_timelines_top_panel_numbers_its_time_axis(ranks, figure):
    fig, axes = figure(2, 1, height=5.0, sharex=True)   # as the chapter draws it
    ddp_figures.draw_timeline(axes, ranks)
    fig.canvas.draw()
    top, bottom = ([label.get_text() for label in ax.get_xticklabels()] for ax in axes)
    assert top == bottom and len(top) > 1


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """A short run of train_single.py: its metrics, its checkpoint, and where it started."""
    from ddp_scripts.resume import load_checkpoint
    from ddp_scripts.launcher import run_script
    from ddp_scripts.models import build_model
    out = tmp_path_factory.mktemp("ch05-single")
    metrics = run_script("train_single.py", out=out, epochs=2, batch_size=16, dataset="synthetic",
                         train_samples=64, test_samples=32, device="cpu", threads=1,
                         echo=lambda line: None)
    return metrics, load_checkpoint(out / "checkpoint.pt")["model"], build_model("cnn", seed=0)


def test_the_metrics_figure_draws_what_rank_0_logged(small_run, figure):
    metrics = small_run[0]
    left_right = figure(1, 2)[1]
    drawn = ddp_figures.draw_metrics(*left_right, metrics)
    for label, column in (("train loss", "train_loss"), ("test loss", "test_loss"),
                          ("test accuracy", "test_accuracy")):
        assert drawn[label] == (list(metrics["epoch"]), list(metrics[column]))


def test_the_equivalence_figure_draws_the_tables_gaps_and_changes(small_run, figure):
    import pandas as pd
    _, trained, start = small_run
    start = start.state_dict()
    moved = max((trained[k] - start[k]).abs().max().item() for k in trained)
    smallest = min((trained[k] - start[k]).abs().max().item() for k in trained)
    table = pd.DataFrame({"largest |difference|": [smallest, moved],
                          "largest change by training": [moved, moved]},
                         index=["float32, smallest layer change", "float64, largest"])
    ax = figure()[1]
    drawn = ddp_figures.draw_equivalence(ax, table)
    assert drawn["bars"] == list(zip(table.index, table["largest |difference|"]))
    # each dtype's bars have a legend entry of their own
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "largest |difference|, float32", "largest |difference|, float64",
        "largest change by training"]
    assert drawn["ticks"] == list(zip(table.index, table["largest change by training"]))


# Chapter 5's checks of DDP against one process, fed two real trainings of a small model: one
# as one process with the whole batch, one as DDP computes it (each rank's mean gradient over
# its share, averaged over the ranks). The planted flaws are differences in what the two runs
# compute: the ranks' gradients summed, not averaged; DDP's learning rate 0.1% higher; one
# sample left out of one rank's share in the first step.
STEPS = 40


def trained_two_ways(dtype, averaged=True, ranks=4, batch=8, steps=STEPS, ddp_lr=0.1,
                     dropped_sample=False):
    """The largest parameter difference between the two trainings, and the largest change
    training made."""
    torch.manual_seed(0)
    start = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 5)).to(dtype)
    images = torch.randn(steps, ranks * batch, 20, dtype=dtype)
    labels = torch.randint(0, 5, (steps, ranks * batch))
    one, ddp = (copy.deepcopy(start) for _ in range(2))
    optimizers = [torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9)
                  for m, lr in ((one, 0.1), (ddp, ddp_lr))]
    loss = torch.nn.functional.cross_entropy
    for step, (x, y) in enumerate(zip(images, labels)):
        for optimizer in optimizers:
            optimizer.zero_grad()
        loss(one(x), y).backward()
        for rank, (x_rank, y_rank) in enumerate(zip(x.chunk(ranks), y.chunk(ranks))):
            if dropped_sample and step == rank == 0:
                x_rank, y_rank = x_rank[1:], y_rank[1:]
            loss(ddp(x_rank), y_rank).backward()   # accumulates: the sum over the ranks
        if averaged:
            for p in ddp.parameters():
                p.grad /= ranks
        for optimizer in optimizers:
            optimizer.step()

    def largest(a, b):
        return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))
    return largest(one, ddp), largest(ddp, start)


def both_types(**flaw):
    return [trained_two_ways(dtype, **flaw) for dtype in (torch.float32, torch.float64)]


DIFFERENT = "so the runs compute different things"


def test_planted_summed_gradients_are_not_rounding():
    (gap32, change32), (gap64, change64) = both_types(averaged=False)
    line = ddp_figures.rounding_line(gap32, gap64, STEPS)
    assert line.endswith(f"both gaps are beyond it, {DIFFERENT}"), line
    assert ddp_figures.same_training_line("float32", gap32, change32).endswith(": False")
    assert ddp_figures.same_training_line("float64", gap64, change64).endswith(": False")


def test_planted_a_learning_rate_0_1_percent_higher_is_not_rounding():
    # float32 cannot tell it from its roundings; float64 can, by billions of epsilons
    (gap32, _), (gap64, _) = both_types(ddp_lr=0.1 * 1.001)
    line = ddp_figures.rounding_line(gap32, gap64, STEPS)
    assert gap32 / torch.finfo(torch.float32).eps < ddp_figures.ROUNDING_PER_STEP * STEPS
    assert line.endswith(f"the float64 gap is beyond it, {DIFFERENT}"), line


def test_planted_a_sample_left_out_once_is_not_rounding():
    (gap32, _), (gap64, _) = both_types(dropped_sample=True)
    line = ddp_figures.rounding_line(gap32, gap64, STEPS)
    assert DIFFERENT in line and "so it is rounding" not in line, line


def test_right_case_averaged_gradients_differ_by_rounding_only():
    (gap32, change32), (gap64, change64) = both_types()
    assert 0 < gap64 < gap32   # the two orders of addition round differently, more so in float32
    line = ddp_figures.rounding_line(gap32, gap64, STEPS)
    assert line.endswith("both gaps are within it, so it is rounding"), line
    assert ddp_figures.same_training_line("float32", gap32, change32).endswith(": True")
    assert ddp_figures.same_training_line("float64", gap64, change64).endswith(": True")
    # the build's epoch 1 (32 steps): float32's roundings compounded to 69 epsilons, float64's
    # stayed at 0.56; both far inside the bound
    line = ddp_figures.rounding_line(8.26e-06, 1.25e-16, 32)
    assert "the float32 gap is 69 epsilons, the float64 gap 0.56" in line, line
    assert line.endswith("so it is rounding"), line
    # identical runs leave nothing to explain; a float64 pair identical to the bit, only rounding
    assert "no gap to explain" in ddp_figures.rounding_line(0.0, 0.0, STEPS)
    assert ddp_figures.rounding_line(gap32, 0.0, STEPS).endswith("so it is rounding")


def test_the_rounding_bound_grows_with_the_steps_taken():
    eps32, eps64 = (torch.finfo(dtype).eps for dtype in (torch.float32, torch.float64))
    per_step = ddp_figures.ROUNDING_PER_STEP
    gap32 = 2 * per_step * 10 * eps32   # twice what 10 steps allow, half of what 40 allow
    assert ddp_figures.rounding_line(gap32, eps64, 10).endswith(
        f"the float32 gap is beyond it, {DIFFERENT}")
    assert ddp_figures.rounding_line(gap32, eps64, 40).endswith("so it is rounding")


# The ring against the ranks' all-reduce (ch05-ring): the simulation must end where the ranks'
# own all-reduce did, within float32's rounding, and nowhere else.

def test_planted_a_ring_a_step_short_does_not_equal_the_all_reduce(ranks):
    frames = ddp_figures.ring_steps([r["gradients"]["before"] for r in ranks])
    assert not ddp_figures.ring_agrees(frames[:-1], ranks)   # one all-gather step left out


def test_planted_an_all_reduce_that_summed_does_not_equal_the_ring(ranks):
    summed = copy.deepcopy(ranks)
    for record in summed:   # the sum, not the average: a hook that did not divide
        record["gradients"]["after"] = [WORLD * v for v in record["gradients"]["after"]]
    frames = ddp_figures.ring_steps([r["gradients"]["before"] for r in ranks])
    assert not ddp_figures.ring_agrees(frames, summed)


def test_right_case_the_ring_ends_where_the_ranks_all_reduce_did(ranks):
    frames = ddp_figures.ring_steps([r["gradients"]["before"] for r in ranks])
    assert ddp_figures.ring_agrees(frames, ranks)


# The buckets' timing (ch05-08, ch05-16): step 1 sends one bucket after backward, by design;
# from step 2 the first bucket leaves while backward still runs.

def timeline_step(step, gradients_at, sent_at):
    events = [{"kind": "gradient", "at": at} for at in gradients_at]
    events += [{"kind": "all-reduce", "bucket": i, "start": at, "end": at + 1.0}
               for i, at in enumerate(sent_at)]
    return {"job": {"rank": 1}, "timeline": [{"step": step, "events": events}]}


def test_planted_a_first_bucket_sent_after_the_last_gradient_is_no_overlap():
    line = ddp_figures.first_bucket_line(timeline_step(2, [1.0, 2.0, 3.0], [3.5, 4.0]), step=2)
    assert line == ("rank 1, step 2: 2 buckets; the first left 0.5 ms after the last gradient: "
                    "no overlap in this run")


def test_planted_the_recorded_first_step_has_no_overlap(ranks):
    assert ddp_figures.first_bucket_line(ranks[0], step=1).endswith(": no overlap in this run")


def test_right_case_a_bucket_sent_during_backward_left_before_the_last_gradient():
    line = ddp_figures.first_bucket_line(timeline_step(2, [1.0, 2.0, 3.0], [1.5, 3.2]), step=2)
    assert line == "rank 1, step 2: 2 buckets; the first left 1.5 ms before the last gradient"


@pytest.fixture
def group_of_one(tmp_path):
    """This process as rank 0 of a gloo group of one, as chapter 5's notebook joins one."""
    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1),
                            rank=0, world_size=1)
    yield dist
    if dist.is_initialized():
        dist.destroy_process_group()


def noted_steps(model):
    """The notes of ch05-16, taken on two steps of DDP with small buckets: each gradient
    ready, and each bucket handed to the all-reduce, in order."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP
    events = []
    for name, parameter in model.named_parameters():
        parameter.register_post_accumulate_grad_hook(
            lambda p, name=name: events.append(f"  backward: gradient of {name} ready"))
    ddp_model = DDP(model, bucket_cap_mb=0.05)

    def noting_allreduce(state, bucket):
        events.append(f"  >> all-reduce bucket {bucket.index()}")
        return default_hooks.allreduce_hook(None, bucket)

    ddp_model.register_comm_hook(None, noting_allreduce)
    images, labels = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    steps = []
    for _ in range(2):
        events.clear()
        torch.nn.functional.cross_entropy(ddp_model(images), labels).backward()
        steps.append(list(events))
    return steps


def test_planted_the_first_step_sends_its_one_bucket_after_backward(group_of_one):
    from ddp_scripts.models import build_model
    first, _ = noted_steps(build_model("cnn", seed=0))
    assert ddp_figures.buckets_line(1, first) == (
        "step 1: 1 bucket(s); the first all-reduce starts before backward is over: False")


def test_right_case_the_rebuilt_buckets_start_during_backward(group_of_one):
    from ddp_scripts.models import build_model
    _, second = noted_steps(build_model("cnn", seed=0))
    line = ddp_figures.buckets_line(2, second)
    assert line.endswith("bucket(s); the first all-reduce starts before backward is over: True")
    assert not line.startswith("step 2: 1 bucket(s)")


# The wrapper and the group (ch05-12, ch05-17): torch decides (`is`, is_initialized); fed both.

def test_planted_a_copy_in_the_wrapper_is_not_the_model_itself(group_of_one):
    from torch.nn.parallel import DistributedDataParallel as DDP
    from ddp_scripts.models import build_model
    model = build_model("cnn", seed=0)
    assert DDP(copy.deepcopy(model)).module is not model


def test_right_case_ddp_keeps_the_model_itself(group_of_one):
    from torch.nn.parallel import DistributedDataParallel as DDP
    from ddp_scripts.models import build_model
    model = build_model("cnn", seed=0)
    assert DDP(model).module is model


def test_planted_a_group_not_destroyed_is_still_initialized(group_of_one):
    assert group_of_one.is_initialized()   # "process group destroyed: False"


def test_right_case_a_destroyed_group_is_gone(group_of_one):
    group_of_one.destroy_process_group()
    assert not group_of_one.is_initialized()


# The samplers (ch05-25, ch05-27, ch05-31), fed DistributedSampler's own shares.

def shares_of(samples, world, epoch=0, ranks=None, **options):
    from torch.utils.data.distributed import DistributedSampler
    shares = []
    for rank in (range(world) if ranks is None else ranks):
        sampler = DistributedSampler(samples, num_replicas=world, rank=rank, seed=0, **options)
        sampler.set_epoch(epoch)
        shares.append(list(sampler))
    return shares


def test_planted_every_rank_told_it_is_rank_0_does_not_see_every_sample_once():
    samples = list(range(12))
    assert not ddp_figures.every_sample_once(shares_of(samples, 3, ranks=[0, 0, 0]), samples)


def test_planted_padding_repeats_samples():
    samples = list(range(10))   # 10 over 3 ranks: padded to 12, samples 0 and 1 twice
    assert not ddp_figures.every_sample_once(shares_of(samples, 3), samples)


def test_right_case_every_rank_its_own_share_sees_every_sample_once():
    samples = list(range(12))
    for epoch in (0, 1):
        assert ddp_figures.every_sample_once(shares_of(samples, 3, epoch), samples)


def orders_over_epochs(set_epoch):
    return sampler_orders(set_epoch, num_replicas=3)


def test_planted_set_epoch_forgotten_gives_the_same_order_every_epoch():
    assert ddp_figures.same_order_every_epoch(orders_over_epochs(set_epoch=False))


def test_right_case_set_epoch_gives_each_epoch_its_own_order():
    assert not ddp_figures.same_order_every_epoch(orders_over_epochs(set_epoch=True))


def test_planted_the_same_samples_in_another_order_is_another_order():
    from torch.utils.data.distributed import DistributedSampler
    sampler = DistributedSampler(list(range(12)), num_replicas=1, rank=0, seed=0)
    orders = []
    for epoch in range(3):   # one rank: every epoch the same 12 samples, each in its own order
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    assert all(sorted(order) == sorted(orders[0]) for order in orders)
    assert not ddp_figures.same_order_every_epoch(orders)


def one_process_order(n, seed):
    from torch.utils.data import RandomSampler
    return list(RandomSampler(range(n), generator=torch.Generator().manual_seed(seed)))


def test_planted_one_process_shuffled_without_the_epoch_has_other_batches():
    shares = shares_of(range(256), 2, epoch=1)
    assert not ddp_figures.same_global_batches(one_process_order(256, 0), shares, 32)


def test_planted_ranks_without_set_epoch_have_other_batches():
    shares = shares_of(range(256), 2, epoch=0)   # the ranks' sampler still at epoch 0
    assert not ddp_figures.same_global_batches(one_process_order(256, 0 + 1), shares, 32)


def test_planted_a_later_batch_that_differs_is_caught():
    shares = shares_of(range(256), 2, epoch=0)
    one_process = one_process_order(256, 0)
    # swap one sample of batch 2 with one of batch 3: batches 0 and 1 still agree
    one_process[2 * 64], one_process[3 * 64] = one_process[3 * 64], one_process[2 * 64]
    assert not ddp_figures.same_global_batches(one_process, shares, 32)


def test_right_case_seed_plus_epoch_cuts_the_same_global_batches():
    for epoch in (0, 1, 2):
        shares = shares_of(range(256), 2, epoch=epoch)
        assert ddp_figures.same_global_batches(one_process_order(256, epoch), shares, 32)


# The old launcher's warning (ch05-49): torch's own FutureWarning, not a line of the script
# that mentions the word.

NOTICE = ("notice: --local-rank comes from the deprecated torch.distributed.launch; "
          "torchrun sets LOCAL_RANK instead")


def test_planted_the_scripts_notice_alone_is_not_the_launchers_warning():
    assert not ddp_figures.launcher_warned([NOTICE, "[rank 0] epoch 1/1"])


def test_right_case_the_launchers_own_warning_is_found():
    import subprocess
    import sys
    said = subprocess.run([sys.executable, "-m", "torch.distributed.launch", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert ddp_figures.launcher_warned((said.stderr + said.stdout).splitlines() + [NOTICE])
    torchrun = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--help"],
                              capture_output=True, text=True, timeout=120)
    assert not ddp_figures.launcher_warned((torchrun.stderr + torchrun.stdout).splitlines())
