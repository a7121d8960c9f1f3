"""The verdicts chapter 11 prints from ddp_scripts/recorders/fsdp_anatomy.py, each seen to say
so with the flaw it exists to catch planted: one torchrun start of tests/scripts/anatomy_probe.py
on 2 gloo ranks, which takes each as the script takes it, then planted (see its docstring)."""
import json

import pytest
from helpers import ROOT

from ddp_scripts.launcher import run_command, torchrun_command
from notebooks.fsdp_memory import held_whole_line


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    out = tmp_path_factory.mktemp("anatomy")
    run_command(torchrun_command(str(ROOT / "tests" / "scripts" / "anatomy_probe.py"), 2,
                                 [str(out)]),
                timeout=300, env={"PYTHONPATH": str(ROOT)}, echo=lambda line: None)
    return json.loads((out / "probe.json").read_text())


def test_right_case_train_fsdps_shards_hold_build_models_weights(probe):
    made = probe["right"]["making"]
    assert made["same_weights_as_build_model"] is True
    assert made["largest_tensor_train_fsdp"] < made["largest_tensor_whole_model"]


def test_planted_shards_made_with_another_seed_are_not_build_models_weights(probe):
    assert probe["planted"]["shards made with another seed"]["same_weights_as_build_model"] is False


def test_right_case_ddp_copies_rank_0s_weights_at_the_wrap(probe):
    assert probe["right"]["initial"]["ddp_equals_rank_0_on_every_rank"] is True


def test_planted_a_wrap_that_does_not_broadcast_leaves_each_rank_its_own_replica(probe):
    initial = probe["planted"]["a wrap that does not broadcast"]
    assert initial["ddp_equals_rank_0_on_every_rank"] is False


def test_right_case_fsdps_rows_are_each_ranks_own(probe):
    assert probe["right"]["initial"]["fsdp_rows_are_each_rank_own"] == [True, True]


def test_planted_one_seed_on_every_rank_gives_fsdp_rank_0s_rows_everywhere(probe):
    initial = probe["planted"]["one seed on every rank"]
    assert initial["fsdp_rows_are_each_rank_own"] == [True, False]


def root_and_block(steps):
    """The root's bytes (the first all-gather) and one block's (the second), as the chapter
    reads them from the fsdp set-up."""
    collectives = steps["fsdp"]["collectives"]
    return collectives[0]["bytes"], collectives[1]["bytes"]


def test_right_case_fsdp_holds_at_most_the_root_and_one_block_whole(probe):
    steps = probe["right"]["steps"]
    line = held_whole_line("fsdp", steps["fsdp"], *root_and_block(steps))
    assert ": the root " in line and "NOT" not in line


def test_planted_one_flat_unit_holds_more_than_the_root_and_one_block(probe):
    steps = probe["right"]["steps"]
    line = held_whole_line("fsdp-one-unit", steps["fsdp-one-unit"], *root_and_block(steps))
    assert ": NOT the root " in line
