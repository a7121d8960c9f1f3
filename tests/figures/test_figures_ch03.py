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
    assert (device_figures.NO_GPU in ax.get_title()) == (not physical)
    matplotlib.pyplot.close(fig)


def test_each_local_rank_is_drawn_with_the_device_its_worker_recorded(tmp_path):
    from ddp_scripts.launcher import run_command, torchrun_command
    from notebooks.node_figures import read_workers
    command = torchrun_command("recorders/who_am_i.py", nproc=2, script_args=["--out", str(tmp_path)])
    run_command(command, env={"CUDA_VISIBLE_DEVICES": "2,3"}, timeout=300, echo=lambda line: None)
    workers = read_workers(tmp_path)
    assert [w["LOCAL_RANK"] for w in workers] == ["0", "1"]
    assert all(w["visible_parsed"] == [2, 3] for w in workers)
    fig, ax = new_figure()
    drawn = device_figures.draw_local_ranks(ax, workers)
    for (rank, device, physical), worker in zip(drawn, workers):
        assert rank == f"LOCAL_RANK {worker['LOCAL_RANK']}"
        if worker["device"].startswith("cuda"):
            index = int(worker["device"].split(":")[1])
            assert (device, physical) == (f"pick_device: {worker['device']}",
                                          f"physical GPU {[2, 3][index]}")
        elif worker["device"] == "cpu":
            assert (device, physical) == ("pick_device: cpu", "the CPU")
        else:   # pick_device refused: fewer visible GPUs than local ranks
            assert worker["device"].startswith("none: local rank")
            assert (device, physical) == ("no device", "error (too few GPUs)")
    shown = {t.get_text() for t in ax.texts}
    assert {label for row in drawn for label in row} <= shown
    assert "[2, 3]" in ax.get_title()
    on_cpu = all(worker["device"] == "cpu" for worker in workers)
    assert (device_figures.NO_GPU in ax.get_title()) == on_cpu
    matplotlib.pyplot.close(fig)
