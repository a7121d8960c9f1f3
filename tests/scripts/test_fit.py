"""python -m ddp_scripts.fit: the rules' peak agrees with torch's tracker on models of every
family, under every optimizer, precision, checkpointing and strategy; a rule left out makes
the check fail; DDP's bucket rule holds in a real gloo run; bad input is one line."""
import json
import os
import subprocess
import sys

import pytest
import torch

from ddp_scripts.fit import rules
from ddp_scripts.fit.__main__ import report
from ddp_scripts.fit.check import TOLERANCE, fit, memory_size
from ddp_scripts.fit.trace import build, units_of
from ddp_scripts.launcher import run_command, torchrun_command
from helpers import ROOT, assert_one_line_error, run_in_process

MODELS = ROOT / "tests" / "fit_models.py"
BN_CNN = f"{MODELS}:bn_cnn"
IMAGES = ((3, 32, 32), torch.float32)
TOKENS = ((32,), torch.long)
# (model, kwargs, input, batch per rank, optimizer, precision, checkpointing, strategy, ranks)
CASES = [
    (BN_CNN, {}, IMAGES, 8, "sgd-momentum", "float32", False, "single", 1),
    (BN_CNN, {}, IMAGES, 8, "adam", "bf16-autocast", False, "ddp", 2),
    (BN_CNN, {}, IMAGES, 8, "sgd", "float32", True, "fsdp", 2),
    (BN_CNN, {}, IMAGES, 8, "adamw", "bf16", False, "fsdp-keep", 3),
    ("torchvision.models:resnet18", {}, IMAGES, 4, "sgd-momentum", "float32", False, "single", 1),
    ("torchvision.models:resnet18", {}, IMAGES, 4, "adamw", "float32", True, "ddp", 2),
    ("torchvision.models:resnet18", {}, IMAGES, 4, "adam", "bf16-autocast", False, "fsdp", 2),
    ("torchvision.models:resnet18", {}, IMAGES, 4, "sgd", "bf16", True, "fsdp", 4),
    ("ddp_scripts.models:Decoder", {}, TOKENS, 4, "adamw", "float32", False, "single", 1),
    ("ddp_scripts.models:Decoder", {}, TOKENS, 4, "adam", "bf16-autocast", True, "single", 1),
    ("ddp_scripts.models:Decoder", {}, TOKENS, 4, "sgd-momentum", "bf16", False, "ddp", 2),
    ("ddp_scripts.models:Decoder", {}, TOKENS, 4, "adamw", "float32", False, "fsdp", 2),
    ("ddp_scripts.models:Decoder", {}, TOKENS, 4, "adamw", "bf16-autocast", True, "fsdp", 4),
    ("ddp_scripts.models:Decoder", {"layers": 3}, TOKENS, 2, "sgd", "float32", False, "fsdp-keep", 2),
    ("ddp_scripts.sharding:WideMLP", {}, IMAGES, 8, "sgd-momentum", "float32", False, "single", 1),
    ("ddp_scripts.sharding:WideMLP", {}, IMAGES, 8, "adam", "float32", True, "ddp", 4),
    ("ddp_scripts.sharding:WideMLP", {}, IMAGES, 8, "sgd-momentum", "float32", False, "fsdp", 2),
    ("ddp_scripts.sharding:WideMLP", {}, IMAGES, 8, "adamw", "bf16", True, "fsdp", 3),
    ("ddp_scripts.sharding:WideMLP", {"width": 96, "depth": 3}, IMAGES, 4, "sgd", "bf16-autocast",
     False, "fsdp-keep", 2),
    ("ddp_scripts.models:Net", {}, IMAGES, 8, "adamw", "float32", False, "single", 1),
    ("ddp_scripts.models:Net", {}, IMAGES, 8, "sgd-momentum", "bf16-autocast", True, "ddp", 2),
    ("ddp_scripts.models:Net", {}, IMAGES, 8, "adam", "float32", False, "fsdp", 2),
    # chapter 11's model as its runs train it: float64, SGD with momentum, 4 ranks
    ("ddp_scripts.sharding:WideMLP", {"width": 256, "depth": 4}, IMAGES, 8, "sgd-momentum",
     "float64", False, "fsdp", 4),
    ("ddp_scripts.models:Decoder", {}, TOKENS, 2, "adam", "float64", True, "ddp", 2),
    # and its narrow case with a large batch: the batch is most of the peak
    ("ddp_scripts.sharding:WideMLP", {"width": 128, "depth": 2}, IMAGES, 512, "sgd-momentum",
     "float64", False, "fsdp", 2),
    # a vocabulary far wider than the model: cross entropy's gradients are most of the peak
    ("ddp_scripts.models:Decoder", {"layers": 2, "hidden": 32, "heads": 2, "vocab": 32000, "seq": 64},
     ((64,), torch.long), 16, "sgd", "float32", False, "fsdp", 2),
    # no block that repeats: the whole model is the head
    (f"{MODELS}:flat", {}, IMAGES, 4, "adamw", "float32", False, "single", 1),
    # a model whose initialisation reads values (trunc_normal_): built once, on meta
    ("torchvision.models:vit_b_16", {"image_size": 32, "num_classes": 10}, IMAGES, 2, "adamw",
     "bf16-autocast", True, "fsdp", 2),
    # a dict for output: the loss is taken of its logits
    (f"{MODELS}:named", {}, ((32,), torch.float32), 8, "adam", "float32", False, "ddp", 2),
]


def answer(case, rules_used=None, track=True):
    spec, kwargs, (shape, dtype), batch, optimizer, precision, checkpointing, strategy, ranks = case
    model = build(spec, kwargs)
    setup = {"model": spec, "kwargs": json.dumps(kwargs), "input_shape": shape, "input_dtype": dtype,
             "batch": batch, "optimizer": optimizer, "precision": precision,
             "checkpointing": checkpointing, "strategy": strategy, "ranks": ranks}
    saved = dict(rules.RULES)
    try:
        rules.RULES.update(rules_used or {})
        return fit(model, units_of(model), setup, track=track)
    finally:
        rules.RULES.clear()
        rules.RULES.update(saved)


def case_id(case):
    spec, kwargs, _, _, optimizer, precision, checkpointing, strategy, ranks = case
    name = spec.rsplit(":", 1)[1]
    return f"{name}-{optimizer}-{precision}-{'ckpt-' if checkpointing else ''}{strategy}{ranks}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_right_case_the_rules_agree_with_torchs_tracker(case):
    for row in answer(case)["ranks"]:
        share = row["gap_bytes"] / row["tracker_peak_bytes"]
        assert row["agrees"] and abs(share) <= TOLERANCE, (row["rank"], share, row["peak_point"],
                                                           row["tracker_point"])


def test_the_cases_span_every_choice():
    """Every optimizer, precision, strategy and checkpointing, on four families."""
    columns = list(zip(*CASES))
    assert set(columns[4]) == {"sgd", "sgd-momentum", "adam", "adamw"}
    assert set(columns[5]) == {"float32", "bf16-autocast", "bf16", "float64"}
    assert set(columns[6]) == {True, False}
    assert set(columns[7]) == {"single", "ddp", "fsdp", "fsdp-keep"}
    assert len(CASES) >= 20


# Each rule left out, and a case where it decides the peak: the check must then fail. DDP's
# buckets are added to the tracker's peak as well as to the prediction, so a real gloo run
# checks that rule instead (test_the_bucket_rule_holds_in_a_gloo_run).
FLAWS = {
    "optimizer state": CASES[14 + 1],   # WideMLP, Adam: the state is most of the peak
    "gradients": CASES[15],
    "step temporaries": CASES[15],
    "gathered": ("ddp_scripts.sharding:WideMLP", {}, IMAGES, 8, "sgd", "float32", False, "fsdp", 2),
    "activations": CASES[8],
    "recompute": ("ddp_scripts.models:Decoder", {}, TOKENS, 8, "sgd", "float32", True, "single", 1),
    "flowing": CASES[2],
    "reduce-scatter": ("ddp_scripts.sharding:WideMLP", {"width": 1024, "depth": 4}, IMAGES, 2, "sgd",
                       "float32", False, "fsdp", 2),
}


@pytest.mark.parametrize("rule", sorted(FLAWS))
def test_planted_a_rule_left_out_fails_the_check(rule):
    assert set(FLAWS) | {"buckets"} == set(rules.RULES)
    honest = answer(FLAWS[rule])["ranks"]
    assert all(row["agrees"] for row in honest)
    planted = answer(FLAWS[rule], {rule: 0})["ranks"]
    assert not all(row["agrees"] for row in planted), rule


def test_planted_a_rule_left_out_is_named_by_its_kind():
    """Where the check fails, the report says which kind of bytes differs most."""
    planted = answer(FLAWS["activations"], {"activations": 0})
    assert {row["differs"] for row in planted["ranks"]} == {"activations"}
    assert "differs most in activations: the rules have" in report(planted)


def fits_a_card_of(size_from_peak):
    """The fits verdict of CASES[0] for a card of its peak plus size_from_peak bytes."""
    peak = answer(CASES[0], track=False)["ranks"][0]["predicted_peak_bytes"]
    spec, kwargs, (shape, dtype), batch, optimizer, precision, ckpt, strategy, ranks = CASES[0]
    setup = {"model": spec, "kwargs": "{}", "input_shape": shape, "input_dtype": dtype,
             "batch": batch, "optimizer": optimizer, "precision": precision,
             "checkpointing": ckpt, "strategy": strategy, "ranks": ranks}
    model = build(BN_CNN, {})
    return fit(model, units_of(model), setup, track=False,
               gpu_memory=peak + size_from_peak)["ranks"][0]["fits"]


def test_planted_a_card_one_byte_short_does_not_fit():
    assert fits_a_card_of(-1) is False


def test_right_case_a_card_as_large_as_the_peak_fits():
    assert fits_a_card_of(0) is True


def test_memory_sizes_read_as_written():
    assert memory_size("80GB") == 80 * 10**9
    assert memory_size("24GiB") == 24 * 2**30
    assert memory_size("h100") == 80 * 2**30


def test_the_command_prints_json_for_each_rank():
    result = run_in_process("fit/__main__.py", "--model", "ddp_scripts.models:Decoder",
                            "--input-shape", "32", "--input-dtype", "long", "--batch-size", "2",
                            "--optimizer", "adam", "--strategy", "fsdp", "--ranks", "3",
                            "--gpu-memory", "1GB", "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    ranks = json.loads(result.stdout)["ranks"]
    assert [row["rank"] for row in ranks] == [0, 1, 2]
    for row in ranks:
        assert {"predicted_peak_bytes", "tracker_peak_bytes", "peak_point", "by_kind",
                "fits"} <= set(row)
        assert set(row["by_kind"]) == set(rules.KINDS)


def test_the_command_speaks_plainly():
    result = run_in_process("fit/__main__.py", "--model", BN_CNN, "--input-shape", "3,32,32",
                            "--strategy", "ddp", "--gpu-memory", "T4")
    assert result.returncode == 0, result.stderr
    assert "predicted peak" in result.stdout and "torch's tracker" in result.stdout
    assert "bucket" in result.stdout  # says how DDP's rank was tracked
    assert "fits 16.00 GiB: yes" in result.stdout


@pytest.mark.parametrize("args, fragment", [
    (["--model", "no_such_module:build"], "cannot import no_such_module"),
    (["--model", "torchvision.models:no_such_model"], "has no callable"),
    (["--model", "torchvision.models:resnet18", "--input-shape", "5,32,32"], "refuses a batch"),
    (["--model", "torchvision.models:resnet18", "--gpu-memory", "eighty"], "--gpu-memory"),
    (["--model", "torchvision.models:resnet18", "--strategy", "fsdp", "--ranks", "1"],
     "needs --ranks 2"),
    (["--model", "torchvision.models:resnet18", "--ranks", "4"], "runs one process"),
    (["--model", "torchvision.models:resnet18", "--kwargs", "{num_classes: 3}"], "not JSON"),
    (["--model", "torchvision.models:resnet18", "--kwargs", '{"nope": 3}'], "nope"),
    (["--model", "torchvision.models:resnet18", "--units", "Nothing"], "no module of that class"),
    (["--model", "torchvision.models:resnet18", "--gpu-memory", "80"], "--gpu-memory '80'"),
    (["--model", "torchvision.models:resnet18", "--input-shape", "3,,32"], "--input-shape '3,,32'"),
    (["--model", f"{MODELS}:scalar", "--input-shape", "8", "--strategy", "fsdp"], "(scale)"),
    (["--model", f"{MODELS}:no_such", "--input-shape", "8"], "has no callable"),
])
def test_bad_input_is_one_line(args, fragment):
    if "--input-shape" not in args:
        args = [*args, "--input-shape", "3,32,32"]
    assert_one_line_error(run_in_process("fit/__main__.py", *args), fragment)


def bucket_rule(spec, kwargs, rules_used=None):
    """The rules' communication buffers for rank 0 of 2 DDP ranks."""
    case = (spec, kwargs, IMAGES, 2, "sgd", "float32", False, "ddp", 2)
    return answer(case, rules_used, track=False)["ranks"][0]["by_kind"]["communication buffers"]


@pytest.fixture(scope="module", params=[("ddp_scripts.sharding:WideMLP", {}),
                                        ("torchvision.models:resnet18", {})], ids=["WideMLP", "resnet18"])
def gloo_buckets(request, tmp_path_factory):
    """(spec, kwargs, what a real 2-rank gloo run's buckets held)."""
    spec, kwargs = request.param
    out = tmp_path_factory.mktemp("buckets")
    run_command(torchrun_command(str(ROOT / "tests" / "scripts" / "buckets_probe.py"), 2,
                                 [str(out), spec, json.dumps(kwargs), "3,32,32", "2"]),
                timeout=300, echo=lambda line: None, env={"PYTHONPATH": str(ROOT)})
    return spec, kwargs, json.loads((out / "buckets.json").read_text())


@pytest.mark.xdist_group("fit_gloo_buckets")  # one worker starts the runs, once
def test_right_case_the_bucket_rule_holds_in_a_gloo_run(gloo_buckets):
    """DDP's buckets, read in a real 2-rank run, hold the bytes the rule says."""
    spec, kwargs, seen = gloo_buckets
    assert not seen["shared_with_gradients"]   # PyTorch's default: the buckets are a second copy
    assert bucket_rule(spec, kwargs) == seen["bucket_bytes"]


@pytest.mark.xdist_group("fit_gloo_buckets")
def test_planted_the_bucket_rule_left_out_misses_the_gloo_runs_buckets(gloo_buckets):
    spec, kwargs, seen = gloo_buckets
    assert bucket_rule(spec, kwargs, {"buckets": 0}) != seen["bucket_bytes"]


def test_the_exercise_will_it_fit_as_its_solution_says():
    """Chapter 11's solution: a 7-billion-parameter decoder with Adam on 8 cards of 80 GB
    does not fit under DDP; under FSDP it fits, with the activations its largest part."""
    kwargs = {"layers": 32, "hidden": 4096, "heads": 32, "vocab": 32000, "seq": 2048}
    model = build("ddp_scripts.models:Decoder", kwargs)
    rows = {}
    for strategy in ("ddp", "fsdp"):
        setup = {"input_shape": (2048,), "input_dtype": torch.long, "batch": 1, "optimizer": "adam",
                 "precision": "float32", "checkpointing": False, "strategy": strategy, "ranks": 8}
        rows[strategy] = fit(model, units_of(model), setup, track=False,
                             gpu_memory=memory_size("80GB"))["ranks"]
    assert not any(row["fits"] for row in rows["ddp"])
    assert all(row["fits"] for row in rows["fsdp"])
    assert all(max(row["by_kind"], key=row["by_kind"].get) == "activations" for row in rows["fsdp"])


def test_a_shape_a_linear_layer_refuses_is_one_line_in_a_real_process():
    """FakeTensorMode logs the failed op's traceback to the real stderr before it raises: an
    in-process run (run_in_process) would not see it, a real process does."""
    result = subprocess.run([sys.executable, "-m", "ddp_scripts.fit", "--model",
                             "ddp_scripts.sharding:WideMLP", "--input-shape", "3,16,16",
                             "--no-tracker"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert_one_line_error(result, "refuses a batch of shape (32, 3, 16, 16)")


def test_the_foreach_probe_says_what_the_tracker_does(monkeypatch):
    """track.counts_more_for_foreach_on_dtensors decides how an FSDP step is tracked: it must
    say True exactly where a foreach step, tracked as it is, misses the rules (torch 2.11)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from ddp_scripts.fit import track
    from ddp_scripts.ranks import leave_process_group
    case = CASES[16]   # the WideMLP, SGD with momentum, FSDP on 2 ranks
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=case[-1])
    try:
        mesh = init_device_mesh("cpu", (case[-1],))   # outside fake mode: it reads a tensor
        with torch._subclasses.fake_tensor.FakeTensorMode():
            says = track.counts_more_for_foreach_on_dtensors(mesh)
    finally:
        leave_process_group()
    monkeypatch.setattr(track, "counts_more_for_foreach_on_dtensors", lambda mesh: False)
    as_it_is = answer(case)["ranks"]
    assert says == (not all(row["agrees"] for row in as_it_is)), (says, [r["gap_bytes"] for r in as_it_is])


def test_a_block_that_subclasses_sequential_is_a_unit_and_a_buffers_value_is_read():
    model = build(f"{MODELS}:stages", {})
    units = units_of(model)
    assert [type(unit).__name__ for unit in units] == ["Stage"] * 3
    setup = {"input_shape": (8,), "input_dtype": torch.float32, "batch": 4, "optimizer": "sgd",
             "precision": "float32", "checkpointing": False, "strategy": "single", "ranks": 1}
    assert fit(model, units, setup)["ranks"][0]["agrees"]
