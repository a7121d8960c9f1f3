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
