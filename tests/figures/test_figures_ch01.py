"""Chapter 1's figures, fed what this machine's runs report: the children's view of the GPUs
under CUDA_VISIBLE_DEVICES, and where a tensor and a model live before and after .to()."""
import matplotlib

matplotlib.use("Agg")

import torch

from notebooks import device_figures


def test_the_visible_devices_figure_draws_what_each_child_saw(axes):
    values = [None, "1", ""]
    reports = device_figures.visible_devices_runs(values)
    assert [r["visible"] for r in reports] == values
    assert reports[1]["parsed"] == [1] and reports[2]["parsed"] == []
    physical = device_figures.physical_gpus()
    drawn = device_figures.draw_visible_devices(axes, physical, reports)
    assert len(drawn["physical"]) == len(physical)
    uuids = [gpu["uuid"] for gpu in physical]
    for column, report in zip(drawn["columns"], reports):
        assert column["count"] == report["count"] == len(report["devices"])
        assert column["logical"] == {f"cuda:{d['index']}": uuids.index(d["uuid"])
                                     for d in report["devices"]}
        assert column["setting"] in {t.get_text() for t in axes.texts}
    assert drawn["columns"][2]["logical"] == {}  # "" hides every GPU, on any machine
    # Without GPUs the figure itself says that its cuda:N boxes need them
    assert (device_figures.NO_GPU in axes.get_title()) == (not physical)


def test_the_placement_figure_draws_each_tensor_on_its_device(axes):
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    run = device_figures.placements(device)
    assert run["same_weight"]                      # model.to() keeps its Parameter objects
    assert run["same_x"] == (device.type == "cpu")  # x.to(its own device) returns x itself
    drawn = device_figures.draw_placements(axes, run)
    for stage in ("before", "after"):
        for record in run[stage]:
            label = f"{record['name']}  {device_figures.size_label(record['bytes'])}"
            assert label in drawn[stage][record["device"]]
    assert sum(map(len, drawn["after"].values())) == len(run["after"]) == 4
    assert [t.get_text() for t in axes.get_xticklabels()] == list(drawn["before"])
    # One lane only: the figure says that a GPU device would add its own
    assert ("moves nothing" in axes.get_title()) == (list(drawn["before"]) == ["cpu"])


# The chapter's verdicts: each fed the flaw it exists to catch, and a right case.

def test_planted_another_index_is_another_device():
    # torch.device('cuda', 1) == torch.device('cuda:1') prints True only where both name one GPU
    assert torch.device("cuda", 0) != torch.device("cuda:1")


def test_right_case_two_spellings_of_one_device_are_equal():
    assert torch.device("cuda", 1) == torch.device("cuda:1")


# The GPU code of torch 2.14.1's CUDA 13.0 wheel, as its torch.cuda.get_arch_list() gives it
CU130 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
CARDS = {"NVIDIA TITAN Xp": (6, 1), "Tesla V100": (7, 0), "Tesla T4": (7, 5)}


def test_planted_a_card_older_than_the_builds_code_has_no_code():
    fits = device_figures.code_for_cards(CARDS, CU130)
    assert fits == {"NVIDIA TITAN Xp": False, "Tesla V100": False, "Tesla T4": True}


def test_right_case_a_build_with_sm_50_code_runs_on_a_titan_xp():
    fits = device_figures.code_for_cards(CARDS, ["sm_50", "sm_60", "sm_70", "sm_75"])
    assert fits == {"NVIDIA TITAN Xp": True, "Tesla V100": True, "Tesla T4": True}


def test_planted_a_move_that_makes_new_tensors_is_said_and_drawn(axes):
    # the meta device stands for a move that makes new tensors and new Parameters
    run = device_figures.placements(torch.device("meta"))
    assert not run["same_x"] and not run["same_weight"]
    drawn = device_figures.draw_placements(axes, run)
    assert "x.to(device) is x: False" in axes.get_xlabel()
    assert "same Parameter: False" in axes.get_xlabel()
    assert list(drawn["after"]) == ["cpu", "meta"] and "moves nothing" not in axes.get_title()


def test_right_case_a_move_to_the_cpu_moves_nothing(axes):
    run = device_figures.placements(torch.device("cpu"))
    device_figures.draw_placements(axes, run)
    assert "x.to(device) is x: True" in axes.get_xlabel()
    assert "same Parameter: True" in axes.get_xlabel()
    assert "moves nothing" in axes.get_title()


def fake_gpus(count):
    return [{"index": i, "name": f"NVIDIA H200 {i}", "uuid": f"GPU-{i}"} for i in range(count)]


def child_report(visible, parsed, gpus):
    return {"visible": visible, "parsed": parsed, "count": len(gpus),
            "devices": [dict(gpu, index=i) for i, gpu in enumerate(gpus)]}


def test_planted_no_gpu_the_figure_says_its_gpu_part_is_missing(axes):
    reports = [child_report(None, list(range(64)), []), child_report("1", [1], [])]
    drawn = device_figures.draw_visible_devices(axes, [], reports)
    assert device_figures.NO_GPU in axes.get_title()
    assert all(column["logical"] == {} for column in drawn["columns"])


def test_right_case_each_childs_gpu_is_drawn_in_its_physical_row_without_the_note(axes):
    physical = fake_gpus(2)
    reports = [child_report("1", [1], [physical[1]]),
               child_report("1,0", [1, 0], [physical[1], physical[0]])]
    drawn = device_figures.draw_visible_devices(axes, physical, reports)
    assert device_figures.NO_GPU not in axes.get_title()
    assert [column["logical"] for column in drawn["columns"]] == [
        {"cuda:0": 1}, {"cuda:0": 1, "cuda:1": 0}]
