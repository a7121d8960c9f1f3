"""Chapter 3's figure of CUDA_VISIBLE_DEVICES, fed the reports of children started with the
settings the chapter uses: each logical cuda:N is drawn beside the physical GPU it is."""
import matplotlib

matplotlib.use("Agg")

from notebooks import device_figures
from notebooks.figures import new_figure

SETTINGS = ["1", "1,0", "0,0"]


def test_each_child_s_gpus_are_drawn_in_the_row_of_the_same_physical_gpu():
    reports = device_figures.visible_devices_runs(SETTINGS)
    # torch reads the list in order, and a GPU named twice gives an empty list
    assert [r["parsed"] for r in reports] == [[1], [1, 0], []]
    physical = device_figures.physical_gpus()
    fig, ax = new_figure()
    drawn = device_figures.draw_visible_devices(ax, physical, reports)
    rows = {gpu["uuid"]: row for row, gpu in enumerate(physical)}
    for column, report in zip(drawn["columns"], reports):
        assert column["logical"] == {f"cuda:{d['index']}": rows[d["uuid"]]
                                     for d in report["devices"]}
        assert column["count"] == len(column["logical"])
    shown = [t.get_text() for t in ax.texts]
    assert [c["setting"] for c in drawn["columns"]] == ["=1\nreads [1]", "=1,0\nreads [1,0]",
                                                  "=0,0\nreads []"]
    assert all(c["setting"] in shown for c in drawn["columns"])
    assert shown.count("cuda:0") == sum("cuda:0" in c["logical"] for c in drawn["columns"])
    matplotlib.pyplot.close(fig)
