"""Chapter 9's practice programs (ddp_scripts/practice/): what each demonstrates holds, in the
run chapter 9 made when the book was built.

The chapter runs every demonstration with one torchrun start of two processes (everyday.py);
these tests read the JSON files that run wrote in the build's copy (_build/src/runs), so it
is made once per build, not again here. Nothing here depends on how fast the machine is:
times are recorded by the programs, never compared with a threshold.
"""
import json

import pytest

from book_files import built_run
from ddp_scripts.practice.everyday import DEMOS


@pytest.fixture(scope="module")
def practice():
    """{demonstration: its results}, from chapter 9's run of everyday.py on two processes."""
    out = built_run("ch09-practice")
    results = {name: json.loads((out / f"{name}.json").read_text()) for name in DEMOS}
    results["out"] = out
    return results


def test_by_hand_all_reduce_trains_exactly_what_ddp_trains(practice):
    hand = practice["by_hand"]
    assert hand["dtype"] == "float64" and hand["world_size"] == 2
    assert hand["largest_difference_hand_vs_ddp"] <= 1e-12
    assert hand["identical_on_every_rank"]
    assert hand["all_reduces_per_step_by_hand"] == hand["parameter_tensors"] > 1
    assert hand["all_reduces_per_step_ddp"] == 1  # the small model fits in one bucket
    assert hand["all_reduces_per_step_ddp_small_buckets"] > 1
    assert hand["all_reduces_first_step_ddp_small_buckets"] == 1  # one bucket before rebuilding
    assert hand["numbers_per_step_ddp"] == hand["numbers_per_step_ddp_small_buckets"] \
        == hand["parameters"]
    assert hand["checkpoint_read_after_barrier_matches"]


def test_only_the_default_bucket_cap_keeps_a_small_first_bucket(practice):
    buckets = practice["buckets"]
    default = buckets["bucket_mib_per_step"]["bucket_cap_mb=None (the default)"]
    explicit = buckets["bucket_mib_per_step"]["bucket_cap_mb=25"]
    whole = [buckets["model_mib"]]
    assert default[0] == explicit[0] == whole              # the first step: one bucket
    assert len(default[1]) == 2 and default[1][0] < default[1][1]
    assert buckets["first_bucket_cap_mib_default"] <= default[1][0] < 2 * buckets[
        "first_bucket_cap_mib_default"]
    assert sum(default[1]) == pytest.approx(buckets["model_mib"], abs=1e-2)
    assert explicit[1] == explicit[2] == whole             # 25 passed: no small first bucket


def test_no_sync_saves_all_reduces_and_ends_with_the_same_model(practice):
    acc = practice["accumulation"]
    assert acc["all_reduces_without_no_sync"] == acc["micro_batches"] == 20
    assert acc["all_reduces_with_no_sync"] == acc["optimizer_steps"] == 5
    assert acc["largest_difference"] <= 1e-12


def test_synchronised_batch_norm_uses_the_global_batch(practice):
    bn = practice["batchnorm"]
    per_rank, synced = bn["mean_per_rank"], bn["mean_synced_per_rank"]
    assert per_rank[0] != per_rank[1]
    assert synced[0] == synced[1]
    assert synced[0] == pytest.approx(bn["mean_of_global_batch"], abs=1e-12)
    assert bn["synced_vs_one_process"] <= 1e-12 < 1e-3 < bn["per_rank_vs_one_process"]
    assert bn["sync_batchnorm_on_cpu"].startswith("ValueError")  # CPU tensors: GPUs only
    running = bn["ddp_running_means"]
    assert not running["equal_after_training"]  # each rank updated them in its last forward
    assert running["equal_after_an_eval_forward_through_ddp"]  # rank 0's, broadcast again
    # A forward that follows one without gradients (the evaluation) starts without the
    # broadcast; the one after a training forward starts with it.
    assert not running["broadcast_first_training_forward_after_eval"]
    assert running["broadcast_next_training_forward"]


def test_unused_parameters_fail_then_find_unused_and_static_graph_train(practice):
    unused = practice["unused_parameters"]
    assert unused["steps_before_the_error"] == 1 and unused["error_on_every_rank"]
    assert "find_unused_parameters=True" in unused["error"]
    assert unused["spare_head_grad_is_none"]
    assert unused["error_in_a_world_of_one"].split(". ")[0] == unused["error"].split(". ")[0]
    assert set(unused["median_step_us"]) == {"no spare head, plain DDP",
                                             "find_unused_parameters=True", "static_graph=True"}
    assert all(value > 0 for value in unused["median_step_us"].values())


def test_uneven_inputs_time_out_by_hand_and_finish_with_join(practice):
    uneven = practice["uneven_inputs"]
    assert uneven["batches_per_rank"] == [5, 4]
    first, second = uneven["by_hand_outcome_per_rank"]
    assert first.startswith("RuntimeError") and second == "finished"
    assert uneven["join_steps_per_rank"] == uneven["batches_per_rank"]
    assert uneven["join_models_identical"]


def test_join_leaves_the_momentum_unequal_and_a_broadcast_keeps_the_replicas_one(practice):
    uneven = practice["uneven_inputs"]
    assert uneven["join_models_identical"] and not uneven["join_momentum_identical"]
    assert uneven["join_drifted_after_one_more_epoch"]
    assert uneven["join_with_state_broadcast_identical_after_one_more_epoch"]
    assert uneven["join_one_number_all_reduces_per_step"][0] >= 2  # two flags every forward


def test_the_flight_recorder_names_the_collective_rank_1_never_joined(practice):
    from ddp_scripts.practice.uneven_inputs import analyse_flight_records, analyser_reads_gloo
    folder = practice["out"] / practice["uneven_inputs"]["flight_recorder"]
    assert sorted(p.name for p in folder.iterdir()) == ["rank_0", "rank_1"]
    if not analyser_reads_gloo():
        pytest.skip("this torch's Flight Recorder analyser reads NCCL's records, not gloo's")
    text = analyse_flight_records(folder)
    mismatch = text[text.index("Not all ranks joining collective"):]
    assert text.count("Not all ranks joining collective") == 1
    assert "short_fuse" in mismatch and "missing ranks: {1}" in mismatch
    assert "train_by_hand" in mismatch


def test_the_same_seed_repeats_augmentation_and_seed_plus_rank_does_not(practice):
    seeding = practice["seeding"]
    assert seeding["same_seed_identical"] and seeding["same_seed"][0] == seeding["same_seed"][1]
    assert not seeding["seed_plus_rank_identical"]
    assert seeding["seed_plus_rank"][0] == seeding["same_seed"][0]  # rank 0: seed + 0


def test_fsdp_keeps_each_ranks_own_initialisation(practice):
    fsdp = practice["seeding"]["fsdp_weights_seeded_per_rank"]
    rows = fsdp["rows_per_rank"]
    assert fsdp["row_from_rank"] == [0] * rows + [1] * rows  # stitched, dim 0 in rank order
    assert not fsdp["equal_to_rank_0s_init"]


def test_compression_hooks_send_fewer_bytes_and_end_near_plain_ddp(practice):
    hooks = practice["compression"]["hooks"]
    plain = hooks["plain all-reduce (DDP's default)"]
    assert plain["bytes_per_step"] == 4 * practice["compression"]["parameters"]  # float32
    assert plain["largest_difference_from_plain"] == 0
    for name in ("fp16_compress_hook", "bf16_compress_hook"):
        assert hooks[name]["bytes_per_step"] * 2 == plain["bytes_per_step"]
        assert 0 < hooks[name]["largest_difference_from_plain"] < 1e-2
    power = hooks["powerSGD_hook, rank 1"]
    assert power["bytes_per_step"] < hooks["fp16_compress_hook"]["bytes_per_step"]
    assert power["largest_difference_from_plain"] > 0


def test_zero_redundancy_optimizer_shards_the_state_and_trains_the_same_model(practice):
    zero = practice["zero"]
    plain, sharded = zero["state_bytes_per_rank_plain"], zero["state_bytes_per_rank_zero"]
    assert plain[0] == plain[1] and sum(sharded) == plain[0]
    assert all(0 < share < plain[0] for share in sharded)
    assert zero["largest_difference_zero_vs_plain"] <= 1e-12
