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


# The chapter's verdicts on what a child saw, fed the UUIDs of a machine with four GPUs: each
# fed the flaw it exists to catch, and a right case.
KERNEL = ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]   # this kernel's cuda:0 to cuda:3


def test_planted_a_child_that_saw_another_gpu_is_not_called_renumbered():
    assert device_figures.renumbered_line(KERNEL, ["GPU-a"], physical=1) == (
        "The child saw cuda:0: NOT this kernel's cuda:1 alone as its cuda:0.")
    assert "NOT" in device_figures.renumbered_line(KERNEL, ["GPU-b", "GPU-a"], physical=1)
    assert "saw no GPU: NOT" in device_figures.renumbered_line(KERNEL[:1], [], physical=1)


def test_right_case_physical_gpu_2_alone_as_cuda_0():
    assert device_figures.renumbered_line(KERNEL, ["GPU-c"], physical=2) == (
        "The child's cuda:0 is this kernel's cuda:2: physical GPU 2, renumbered.")


def test_planted_a_setting_that_took_effect_is_not_called_too_late():
    line = device_figures.late_setting_line(KERNEL, ["GPU-c"], "2")
    assert line.endswith("the child has cuda:2, NOT all 4 of this kernel's in its order: the "
                         "setting took effect."), line


def test_planted_the_same_gpus_reordered_is_not_called_too_late():
    # CUDA_VISIBLE_DEVICES="1,0" that took effect: as many GPUs as this kernel's, in another order
    line = device_figures.late_setting_line(KERNEL[:2], ["GPU-b", "GPU-a"], "1,0")
    assert line == ("The variable says 1,0, and the child has cuda:1, cuda:0, NOT all 2 of this "
                    "kernel's in its order: the setting took effect.")


def test_right_case_every_gpu_kept_in_order_is_too_late():
    line = device_figures.late_setting_line(KERNEL, list(KERNEL), "2")
    assert line == ("The variable now says 2, yet the child still has all 4 GPU(s), and its "
                    "cuda:0 is this kernel's cuda:0: the setting came too late.")


def worker(local_rank, device, visible="2,3"):
    return {"LOCAL_RANK": str(local_rank), "device": device, "CUDA_VISIBLE_DEVICES": visible,
            "visible_parsed": [2, 3]}


def test_planted_workers_without_a_gpu_the_figure_says_there_is_none():
    fig, ax = new_figure()
    drawn = device_figures.draw_local_ranks(ax, [worker(0, "cpu"), worker(1, "cpu")])
    assert device_figures.NO_GPU in ax.get_title()
    assert [physical for _, _, physical in drawn] == ["the CPU", "the CPU"]
    matplotlib.pyplot.close(fig)


def test_right_case_workers_on_gpus_are_drawn_with_their_physical_gpu():
    fig, ax = new_figure()
    drawn = device_figures.draw_local_ranks(ax, [worker(1, "cuda:1"), worker(0, "cuda:0")])
    assert device_figures.NO_GPU not in ax.get_title()
    assert [physical for _, _, physical in drawn] == ["physical GPU 2", "physical GPU 3"]
    matplotlib.pyplot.close(fig)
