"""`make gpu-check` without a GPU: the planner keeps to its budget, a second call continues the
first, busy machines are labelled, recordings say how they were made, the dry run plans from
the committed files alone. The clock and the commands are stand-ins: nothing waits on time."""
import argparse
import copy
import json
import re
import subprocess
import sys
from pathlib import Path

from book_files import ROOT, cell_source, load_notebook

from book.tools import gpu_check, gpu_recordings
from ddp_scripts.hardware import hardware_label

RECORDINGS = gpu_recordings.load_recordings()
H200 = next(r for r in RECORDINGS if r[0].name == "2026-11-30-h200")
GPU_MACHINE = {"cuda": True, "gpus": ["NVIDIA H200"], "cores": 16, "slug": "1x-h200",
               "label": H200[1]["hardware"]}
ARGS = argparse.Namespace(dataset="synthetic", step_timeout_s=3600)


def steps():
    return gpu_check.candidate_steps(GPU_MACHINE, H200, ARGS)


def run_gpu_check(*args):
    return subprocess.run([sys.executable, "-m", "book.tools", "gpu-check", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


class Clock:
    """A clock that moves only when a stand-in command says it ran."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def stand_in(clock, ran, seconds_of=lambda step_command: None):
    """A run_command that takes each command's estimate (or seconds_of) and passes."""
    def execute(command, cwd, timeout, log):
        seconds = seconds_of(command) or 10.0
        ran.append(command)
        if seconds > timeout:
            clock.now += timeout
            return "timeout", None, timeout
        clock.now += seconds
        return "passed", 0, seconds
    return execute


# --- the plan -----------------------------------------------------------------------------

def test_every_gpu_output_cell_and_every_kind_of_step_is_in_the_plan():
    keys = [s["key"] for s in steps()]
    assert len(keys) == len(set(keys))
    for name in gpu_check.committed_notebooks():
        assert f"notebook:{name}" in keys, name
    for key in ("tests", "micro", "benchmark:cnn", "benchmark:resnet18"):
        assert key in keys
    groups = [s["group"] for s in steps()]
    assert groups == sorted(groups), "in order of value"
    first = [s for s in steps() if s["group"] == 1]
    for step in first:   # stale or never recorded: the most valuable
        name = step["key"].split(":", 1)[1]
        assert gpu_check.notebook_status(name, H200)[0] in ("stale", "unrecorded")
    tuned = next(s for s in steps() if s["key"] == "benchmark:cnn")["command"]
    assert "--tuned" in tuned and "--size" in tuned and "full" in tuned


def test_the_plan_keeps_to_the_budget_with_its_margins():
    for budget in (120, 300, 540, 900):
        planned, left = gpu_check.fit(steps(), budget)
        room = budget - gpu_check.START_UP_S - gpu_check.CLOSE_S
        assert sum(s["estimate_s"] for s in planned) <= room, budget
        assert planned and len(planned) + len(left) == len(steps())
        used = 0.0
        for step in steps():   # a step is left only because it did not fit where it came
            if step in planned:
                used += step["estimate_s"]
            else:
                assert step["estimate_s"] > room - used
    everything, nothing = gpu_check.fit(steps(), None)
    assert len(everything) == len(steps()) and not nothing


def test_estimates_come_from_the_last_recording():
    by_key = {s["key"]: s for s in steps()}
    ch05 = by_key["notebook:05_distributed_data_parallel.ipynb"]
    assert ch05["estimate_s"] == 112.5 and "4 at a time" in ch05["estimate_from"]
    cnn = by_key["benchmark:cnn"]
    assert "h200-full.json" in cnn["estimate_from"] and cnn["estimate_s"] > 0
    micro = by_key["micro"]
    assert micro["estimate_from"] == "never timed: assumed"


def test_a_call_stops_at_the_budget_and_the_next_continues_where_it_stopped(tmp_path):
    estimates = {s["key"]: s["estimate_s"] for s in steps()}
    clock, ran = Clock(), []

    def seconds_of(command):
        text = " ".join(command)
        for key, seconds in estimates.items():
            name = key.split(":", 1)[-1]
            if name in text or (key == "tests" and "-m gpu" in text):
                return seconds
        return None

    budget = 540
    first = gpu_check.Check(GPU_MACHINE, tmp_path, False, "abc1234", budget, ARGS, clock=clock,
                            execute=stand_in(clock, ran, seconds_of))
    planned, left = gpu_check.fit(steps(), budget)
    call = first.run(planned)
    assert clock.now <= budget - gpu_check.CLOSE_S, "stopped cleanly before the budget"
    done_first = set(json.loads((tmp_path / gpu_check.STATE_FILE).read_text())["done"])
    assert done_first == {s["key"] for s in planned} and [r["result"] for r in call["ran"]] == [
        "passed"] * len(planned)

    clock2, ran2 = Clock(), []
    second = gpu_check.Check(GPU_MACHINE, tmp_path, False, "abc1234", budget, ARGS,
                             clock=clock2, execute=stand_in(clock2, ran2, seconds_of))
    planned2, _ = gpu_check.fit(steps(), budget, second.state["done"])
    assert planned2 and not {s["key"] for s in planned2} & done_first
    second.run(planned2)
    state = json.loads((tmp_path / gpu_check.STATE_FILE).read_text())
    assert len(state["calls"]) == 2 and set(state["done"]) == done_first | {
        s["key"] for s in planned2}


def test_a_step_still_running_when_the_budget_ends_is_left_not_failed(tmp_path):
    clock, ran = Clock(), []
    step = dict(next(s for s in steps() if s["key"] == "tests"), estimate_s=10.0)
    check = gpu_check.Check(GPU_MACHINE, tmp_path, False, "abc1234", 200, ARGS, clock=clock,
                            execute=stand_in(clock, ran, lambda command: 10_000))
    call = check.run([step])
    assert not check.failed and call["ran"] == []
    assert call["left"][0]["key"] == "tests" and "budget ran out" in call["left"][0]["why"]
    assert "tests" not in check.state.get("done", {})


def test_without_cuda_the_gpu_steps_are_skipped_with_the_reason(tmp_path):
    clock, ran = Clock(), []
    cpu = dict(GPU_MACHINE, cuda=False, gpus=[])
    check = gpu_check.Check(cpu, tmp_path, False, "abc1234", None, ARGS, clock=clock,
                            execute=stand_in(clock, ran))
    micro = next(s for s in steps() if s["key"] == "micro")
    call = check.run([micro])
    assert ran == [] and call["ran"] == [{"key": "micro", "result": "skipped: no CUDA"}]


def test_budget_and_notebook_errors_are_one_line():
    for args, message in ((["--budget", "30", "--dry-run"], "--budget must be more than"),
                          (["--only", "notebooks/99_missing.ipynb", "--dry-run"],
                           "no such notebook")):
        result = run_gpu_check(*args)
        assert result.returncode == 2 and message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_the_dry_run_plans_from_the_committed_files_and_fits_the_budget():
    before = sorted(p.name for p in gpu_recordings.RECORDINGS.iterdir())
    result = run_gpu_check("--dry-run", "--budget", "540")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "estimates from results/gpu-runs/2026-11-30-h200" in out
    planned = re.search(r"Planned: (\d+) step\(s\), about (\d+) s of the (\d+) s", out)
    assert planned and int(planned[2]) <= int(planned[3]) == 540 - gpu_check.START_UP_S - \
        gpu_check.CLOSE_S
    assert re.findall(r"^- .*: about \d+ s \(", out, flags=re.M), "every step has its estimate"
    assert "Left for the next call" in out
    if not gpu_check.describe_hardware()["cuda"]:
        assert "No CUDA GPU on this machine" in out and "(needs CUDA: skipped here)" in out \
            or "needs CUDA" not in out
    assert sorted(p.name for p in gpu_recordings.RECORDINGS.iterdir()) == before


# --- busy machines and how a recording was made -------------------------------------------

def test_a_busy_benchmark_file_is_labelled_so(tmp_path):
    data = json.loads((H200[0] / "h200-resnet18.json").read_text())
    assert data["hardware"]["load_average_before"][0] >= 16 / 2   # recorded as it was
    lines = gpu_check.headline_ratios(H200[0] / "h200-resnet18.json")
    assert lines[0].startswith("BUSY: load average (1 min) 27.18 before the runs on 16 cores")
    idle = copy.deepcopy(data)
    idle["hardware"]["load_average_before"] = [0.5, 0.5, 0.5]
    (tmp_path / "idle.json").write_text(json.dumps(idle))
    assert not gpu_check.headline_ratios(tmp_path / "idle.json")[0].startswith("BUSY")


def test_headline_ratios_from_the_h200_results_file():
    lines = gpu_check.headline_ratios(H200[0] / "h200-full.json")
    assert lines[0].startswith("cpu: 21,641 samples/s")
    assert lines[1] == "gpu: 26,286 samples/s, 1.21x cpu"
    assert lines[2].startswith("dp: skipped (only one GPU")


def test_every_box_of_the_h200_recording_says_it_was_made_on_a_loaded_machine():
    assert H200[1]["conditions"]["concurrent_notebooks"] == 4
    for path in sorted((ROOT / "notebooks").glob("0*.ipynb")):
        notebook = load_notebook(path)
        for language, words in (("en", "Recorded on a loaded machine"),
                                ("zh", "记录时机器负载较重")):
            gpu_recordings.annotate(notebook, path.name, [H200], language)
            for cell in gpu_recordings.gpu_cells(notebook):
                boxes = [o["data"]["text/html"] for o in cell["outputs"]
                         if o.get("metadata", {}).get(gpu_recordings.MARKER) == "label"]
                recorded = [b for b in boxes if "gpu-recording-label" in b
                            and "gpu-recording-stale" not in b or "Stale" in b or "过时" in b]
                for shown in recorded:
                    if cell["id"] in H200[2].get(path.name, {}):
                        assert words in shown, (path.name, cell["id"], language)
    ch07 = gpu_recordings.conditions_html(H200[1], "07_experiment.ipynb")
    assert "4 notebooks ran at once" in ch07 and "4.18 → 6.21" in ch07 and "16 cores" in ch07


def test_a_notebook_recorded_alone_on_an_idle_machine_says_so():
    run = {"conditions": {"concurrent_notebooks": 1, "cores": 16, "notebooks": {
        "a.ipynb": {"load_average_before": [0.4], "load_average_after": [1.1]},
        "b.ipynb": {"load_average_before": [9.0], "load_average_after": [9.5]}}}}
    alone = gpu_recordings.conditions_html(run, "a.ipynb")
    assert "alone on the machine" in alone and "0.4 → 1.1" in alone
    assert "只运行着这一个笔记本" in gpu_recordings.conditions_html(run, "a.ipynb", "zh")
    busy = gpu_recordings.conditions_html(run, "b.ipynb")
    assert "loaded machine" in busy and "other work was running" in busy
    assert gpu_recordings.conditions_html({}, "a.ipynb") == ""


def test_each_cell_shows_the_newest_recording_of_its_hardware_that_has_it():
    old = (Path("2026-11-30-h200"), {"hardware": "A"}, {"n.ipynb": {"x": {}, "y": {}}})
    new = (Path("2026-12-24-1x-h200"), {"hardware": "A"}, {"n.ipynb": {"x": {}}})
    other = (Path("2026-11-01-2x-a100"), {"hardware": "B"}, {})
    assert gpu_recordings.newest_with([old, other, new], "n.ipynb", "x") == [other, new]
    assert gpu_recordings.newest_with([old, other, new], "n.ipynb", "y") == [other, old]
    assert gpu_recordings.newest_with([old, new], "n.ipynb", "z") == [new]


def test_the_conditions_of_the_earlier_run_come_from_its_own_files():
    derived = gpu_recordings.conditions_of_earlier_run(H200[2], 4, "source")
    kept = json.loads((H200[0] / gpu_recordings.CONDITIONS_FILE).read_text())
    assert derived["notebooks"] == kept["notebooks"] and derived["cores"] == kept["cores"] == 16
    assert "four at a time" in (H200[0] / "README.md").read_text()
    assert "-n 4" in (H200[0] / "check.sh").read_text()


def test_the_label_comes_from_the_results_file_as_gpu_check_writes_it():
    """One label for every result (ddp_scripts/hardware.py): the recording's run.json has the
    label of its benchmark results file's machine, as gpu_check.py labels a run it makes, so a
    newer recording of the same hardware replaces this one on the pages."""
    run = gpu_recordings.run_from_results(H200[0] / "h200-full.json", "27a4f98")
    assert run["hardware"] == ("1 x NVIDIA H200; Intel(R) Xeon(R) Processor, 16 cores; "
                               "driver 580.159.04, torch 2.11.0+cu130, CUDA 13.0")
    assert (run["gpus"], run["date"]) == (1, "2026-11-30")
    assert json.loads((H200[0] / "run.json").read_text())["hardware"] == run["hardware"]
    machine = json.loads((H200[0] / "h200-full.json").read_text())["hardware"]
    assert run["hardware"] == hardware_label(machine)
    if not gpu_check.describe_hardware()["cuda"]:   # this machine's label, the same function's
        assert gpu_check.describe_hardware()["label"].endswith(", no GPU")


def test_a_recorded_notebook_writes_its_cells_and_conditions_at_once(tmp_path, monkeypatch):
    executed = tmp_path / "_build" / "gpu-check" / "src" / "notebooks"
    executed.mkdir(parents=True)
    name = "01_devices.ipynb"
    notebook = load_notebook(ROOT / "notebooks" / name)
    cell = gpu_recordings.gpu_cells(notebook)[0]
    cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "on the GPU\n"}]
    (executed / name).write_text(json.dumps(notebook))
    monkeypatch.setattr(gpu_check, "WORK", tmp_path / "_build" / "gpu-check")
    check = gpu_check.Check(GPU_MACHINE, tmp_path / "rec", True, "abc1234", None, ARGS)
    entry = {"key": f"notebook:{name}", "result": "passed", "exit_status": 0, "seconds": 5.0,
             "load_average_before": [0.3], "load_average_after": [0.9], "commit": "abc1234"}
    check.state.setdefault("done", {})[entry["key"]] = entry
    check.after_step({"kind": "notebook", "key": entry["key"]}, entry)
    cells = json.loads((tmp_path / "rec" / gpu_recordings.CELLS_FILE).read_text())
    assert cells[name][cell["id"]]["source_sha256"] == gpu_recordings.source_hash(
        cell_source(cell))
    conditions = json.loads((tmp_path / "rec" / gpu_recordings.CONDITIONS_FILE).read_text())
    assert conditions["concurrent_notebooks"] == 1
    assert conditions["notebooks"][name]["load_average_before"] == [0.3]
    gpu_check.write_run(tmp_path / "rec", GPU_MACHINE, check.state)
    gpu_check.write_readme(tmp_path / "rec", GPU_MACHINE, check.state, [])
    readme = (tmp_path / "rec" / "README.md").read_text()
    assert "nothing here was edited by hand" in readme and "one notebook at a time" in readme
    assert f"| notebook:{name} | passed | 5.0 | 0.3 → 0.9 on 16 cores | idle |" in readme


def test_the_micro_measurement_is_a_one_line_error_without_cuda():
    if gpu_check.describe_hardware()["cuda"]:
        return
    result = subprocess.run([sys.executable, "-m", "book.tools.gpu_micro", "--out", "unused"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert not (ROOT / "unused").exists()


def test_the_micro_measurement_sets_gradients_to_none_before_capture():
    source = (ROOT / "book" / "tools" / "gpu_micro.py").read_text()
    capture = source[source.index("captured = torch.cuda.CUDAGraph()"):
                     source.index("with torch.cuda.graph(captured)")]
    assert "zero_grad(set_to_none=True)" in capture
    assert "set_to_none=False" not in source and "cudnn.benchmark" not in source.split('"""')[2]


def test_a_partial_check_runs_one_notebook_alone_and_records_nothing():
    before = sorted(p.name for p in gpu_recordings.RECORDINGS.iterdir())
    result = run_gpu_check("--only", "notebooks/01_devices.ipynb")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    report = (gpu_check.WORK / "report.md").read_text()
    assert re.search(r"- notebook:01_devices\.ipynb: passed \(\d+ s, load average", report), report
    assert sorted(p.name for p in gpu_recordings.RECORDINGS.iterdir()) == before
    assert load_notebook(ROOT / "notebooks" / "01_devices.ipynb")["cells"][1]["outputs"] == []
