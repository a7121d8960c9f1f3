"""`make gpu-check` without a GPU: the planner keeps to its budget, a second call continues the
first, busy machines are labelled, recordings say how they were made, the dry run plans from
the committed files alone. The clock and the commands are stand-ins: nothing waits on time."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from book_files import ROOT, cell_source, load_notebook

from book.tools import gpu_check, gpu_recordings
from ddp_scripts.measure.hardware import hardware_label

RECORDINGS = gpu_recordings.load_recordings()
H200 = next(r for r in RECORDINGS if r[0].name == "2026-11-30-h200")
GPU_MACHINE = {"gpus": [{"name": "NVIDIA H200"}], "cores": 16, "slug": "1x-h200",
               "label": H200[1]["hardware"]}


def steps():
    return gpu_check.candidate_steps(GPU_MACHINE, RECORDINGS)


def run_gpu_check(*args):
    return subprocess.run([sys.executable, "-m", "book.tools", "gpu-check", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


class Clock:
    """A clock that moves only when a stand-in command says it ran."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def stand_in(clock, ran, seconds_of=lambda command: None):
    """A run_command that takes seconds_of(command) (default 10 s) and passes, or times out."""
    def execute(command, cwd, timeout, log):
        seconds = seconds_of(command) or 10.0
        ran.append(command)
        if timeout is not None and seconds > timeout:
            clock.now += timeout
            return "timeout", None, timeout
        clock.now += seconds
        return "passed", 0, seconds
    return execute


# --- the plan -----------------------------------------------------------------------------

def test_every_notebook_and_every_kind_of_step_is_in_the_plan_in_order_of_value():
    planned = steps()
    keys = [s["key"] for s in planned]
    assert len(keys) == len(set(keys))
    for path in (ROOT / "notebooks").glob("[0-9]*.ipynb"):
        assert f"notebook:{path.name}" in keys, path.name
    kinds = [s["kind"] for s in planned]
    assert kinds.index("tests") < kinds.index("micro") < kinds.index("benchmark")
    first, rest = planned[:kinds.index("tests")], planned[kinds.index("benchmark") + 2:]
    assert all(s["title"].endswith("(to record)") for s in first), "stale or unrecorded first"
    assert all(s["title"].endswith("(to validate)") for s in rest), "the others last"
    stale = {path.name for path in (ROOT / "notebooks").glob("[0-9]*.ipynb")
             if gpu_recordings.annotate(load_notebook(path), path.name, RECORDINGS)}
    assert stale == {s["key"].split(":")[1] for s in first}
    tuned = next(s for s in planned if s["key"] == "benchmark:full")["command"]
    assert "--tuned" in tuned and "--size" in tuned and "full" in tuned


def test_the_plan_keeps_to_the_budget_with_its_margins():
    for budget in (200, 540, 900):
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


def test_estimates_are_what_this_hardware_measured_else_assumed(tmp_path):
    folder = tmp_path / "2026-12-01-1x-h200"
    folder.mkdir()
    (folder / gpu_check.STATE_FILE).write_text(json.dumps({"done": {"micro": {"seconds": 42.5}}}))
    other = tmp_path / "2026-12-02-1x-a100"
    other.mkdir()
    (other / gpu_check.STATE_FILE).write_text(json.dumps({"done": {"tests": {"seconds": 1.0}}}))
    run = {"date": "2026-12-01", "commit": "abc1234", "gpus": 1}
    recordings = [*RECORDINGS, (folder, dict(run, hardware=GPU_MACHINE["label"]), {}),
                  (other, dict(run, hardware="another machine"), {})]
    by_key = {s["key"]: s for s in gpu_check.candidate_steps(GPU_MACHINE, recordings)}
    assert (by_key["micro"]["estimate_s"], by_key["micro"]["estimate_from"]) == (
        42.5, "measured in 2026-12-01-1x-h200")
    assert (by_key["tests"]["estimate_s"], by_key["tests"]["estimate_from"]) == (
        gpu_check.ASSUMED_S["tests"], "assumed")


def test_a_call_stops_at_the_budget_and_the_next_continues_where_it_stopped(tmp_path):
    clock, ran = Clock(), []
    budget = 540
    planned, _ = gpu_check.fit(steps(), budget)
    state = gpu_check.run(planned, GPU_MACHINE, tmp_path, False, "abc1234", budget, clock=clock,
                          execute=stand_in(clock, ran))
    assert clock.now <= budget - gpu_check.CLOSE_S, "stopped cleanly before the budget"
    done_first = set(json.loads((tmp_path / gpu_check.STATE_FILE).read_text())["done"])
    assert done_first == {s["key"] for s in planned} == set(state["done"])
    assert [r["result"] for r in state["calls"][-1]["ran"]] == ["passed"] * len(planned)

    clock2 = Clock()
    planned2, _ = gpu_check.fit(steps(), budget, done_first)
    assert planned2 and not {s["key"] for s in planned2} & done_first
    gpu_check.run(planned2, GPU_MACHINE, tmp_path, False, "abc1234", budget, clock=clock2,
                  execute=stand_in(clock2, []))
    state = json.loads((tmp_path / gpu_check.STATE_FILE).read_text())
    assert len(state["calls"]) == 2 and set(state["done"]) == done_first | {
        s["key"] for s in planned2}


def test_a_step_still_running_when_the_budget_ends_is_left_not_failed(tmp_path):
    clock = Clock()
    step = dict(next(s for s in steps() if s["key"] == "tests"), estimate_s=10.0)
    state = gpu_check.run([step], GPU_MACHINE, tmp_path, False, "abc1234", 200, clock=clock,
                          execute=stand_in(clock, [], lambda command: 10_000))
    call = state["calls"][-1]
    assert call["ran"] == [] and "tests" not in state["done"]
    assert call["left"][0]["key"] == "tests" and "out of budget" in call["left"][0]["why"]
    # Stopped at the room the plan has (200 - 45 - 20 s), so that a step which passes always fits
    # the next plan of the same budget; a step longer than that is said to need a larger one.
    assert clock.now == 200 - gpu_check.START_UP_S - gpu_check.CLOSE_S
    _, left = gpu_check.fit([dict(step, estimate_s=clock.now + 1)], 200)
    assert "give it a larger --budget" in gpu_check.describe(left[0])


def test_a_plan_is_made_against_this_hardware_s_own_recordings(tmp_path):
    """A machine whose own recording is current records nothing first, whatever is stale in the
    recordings of other machines (the H200's, here)."""
    current = {}
    for path in (ROOT / "notebooks").glob("[0-9]*.ipynb"):
        cells = gpu_recordings.gpu_cells(load_notebook(path))
        current[path.name] = {cell["id"]: {"source_sha256": gpu_recordings.source_hash(
            cell_source(cell)), "outputs": []} for cell in cells}
    a100 = dict(GPU_MACHINE, label="1 x NVIDIA A100; a test", slug="1x-a100")
    mine = (tmp_path / "2026-12-02-1x-a100", {"hardware": a100["label"], "date": "2026-12-02",
                                              "commit": "abc1234", "gpus": 1}, current)
    planned = gpu_check.candidate_steps(a100, [*RECORDINGS, mine])
    assert not [s for s in planned if s["title"].endswith("(to record)")]
    assert any(s["title"].endswith("(to record)") for s in steps()) == any(
        gpu_recordings.annotate(load_notebook(path), path.name, RECORDINGS)
        for path in (ROOT / "notebooks").glob("[0-9]*.ipynb"))


def test_without_cuda_the_gpu_steps_are_skipped_with_the_reason(tmp_path):
    clock, ran = Clock(), []
    cpu = dict(GPU_MACHINE, gpus=[])
    micro = next(s for s in steps() if s["key"] == "micro")
    state = gpu_check.run([micro], cpu, tmp_path, False, "abc1234", None, clock=clock,
                          execute=stand_in(clock, ran))
    assert ran == [] and state["calls"][-1]["ran"] == [{"key": "micro", "result": "skipped: no CUDA"}]


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
    planned = re.search(r"Planned: (\d+) step\(s\), about (\d+) s of the (\d+) s", out)
    assert planned and int(planned[2]) <= int(planned[3]) == 540 - gpu_check.START_UP_S - \
        gpu_check.CLOSE_S
    assert re.findall(r"^- .*: about \d+ s \((assumed|measured in .+)\)$", out, flags=re.M)
    assert "Left for the next call:" in out
    if not gpu_check.this_machine()["gpus"]:
        assert "no CUDA GPU here: the GPU steps are skipped and nothing is recorded" in out
    assert sorted(p.name for p in gpu_recordings.RECORDINGS.iterdir()) == before


# --- busy machines and how a recording was made -------------------------------------------

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
                if cell["id"] in H200[2].get(path.name, {}):
                    assert all(words in shown for shown in boxes), (path.name, cell["id"], language)
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


def test_one_label_names_the_hardware_of_every_result():
    """The H200 recording's run.json has the label of its benchmark file's machine, the label
    gpu_check.py gives the machine it runs on, so a newer recording of the same hardware
    replaces this one on the pages."""
    run = json.loads((H200[0] / "run.json").read_text())
    machine = json.loads((H200[0] / "h200-full.json").read_text())["hardware"]
    assert run["hardware"] == hardware_label(machine) == (
        "1 x NVIDIA H200; Intel(R) Xeon(R) Processor, 16 cores; driver 580.159.04, "
        "torch 2.11.0+cu130, CUDA 13.0")
    here = gpu_check.this_machine()
    assert here["label"] == hardware_label(here)


def test_a_recorded_notebook_writes_its_cells_and_conditions_at_once(tmp_path, monkeypatch):
    executed = tmp_path / "_build" / "gpu-check" / "src" / "notebooks"
    executed.mkdir(parents=True)
    name = "01_devices.ipynb"
    notebook = load_notebook(ROOT / "notebooks" / name)
    cell = gpu_recordings.gpu_cells(notebook)[0]
    cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "on the GPU\n"}]
    (executed / name).write_text(json.dumps(notebook))
    monkeypatch.setattr(gpu_check, "WORK", tmp_path / "_build" / "gpu-check")
    folder = tmp_path / "rec"
    step = {"key": f"notebook:{name}", "kind": "notebook", "command": ["true"], "estimate_s": 1}
    busy = lambda command: 5.0   # noqa: E731
    clock = Clock()
    loads = iter([(0.3, 0.2, 0.1), (0.9, 0.4, 0.2)])
    monkeypatch.setattr(gpu_check.os, "getloadavg", lambda: next(loads))
    state = gpu_check.run([step], GPU_MACHINE, folder, True, "abc1234", None, clock=clock,
                          execute=stand_in(clock, [], busy))
    cells = json.loads((folder / gpu_recordings.CELLS_FILE).read_text())
    assert cells[name][cell["id"]]["source_sha256"] == gpu_recordings.source_hash(
        cell_source(cell))
    conditions = json.loads((folder / gpu_recordings.CONDITIONS_FILE).read_text())
    assert conditions["concurrent_notebooks"] == 1
    assert conditions["notebooks"][name]["load_average_before"] == [0.3, 0.2, 0.1]
    assert conditions["notebooks"][name]["load_average_after"] == [0.9, 0.4, 0.2]
    run = json.loads((folder / gpu_recordings.RUN_FILE).read_text())
    assert (run["hardware"], run["gpus"], run["commit"]) == (GPU_MACHINE["label"], 1, "abc1234")
    assert run["date"] == state["calls"][0]["date"][:10]   # the day of the folder's first call
    assert gpu_recordings.load_recordings(tmp_path) == [(folder, dict(run, conditions=conditions), cells)]
    readme = gpu_check.summary(GPU_MACHINE, state, [], True)
    assert "nothing by hand" in readme and "one notebook at a time" in readme
    assert f"| notebook:{name} | 5.0 | 0.3 → 0.9 on 16 cores | idle |" in readme
    assert "`conditions.json`" in readme and "Complete." in readme


def test_a_step_that_started_on_a_busy_machine_is_labelled_so():
    entry = {"seconds": 60.0, "load_average_before": [9.0], "load_average_after": [9.5]}
    state = {"calls": [], "done": {"benchmark:full": entry}}
    readme = gpu_check.summary(GPU_MACHINE, state, [], True)
    assert "| benchmark:full | 60.0 | 9.0 → 9.5 on 16 cores | busy |" in readme


def test_the_micro_measurement_is_a_one_line_error_without_cuda():
    # An empty CUDA_VISIBLE_DEVICES hides every GPU, so this runs on a GPU machine too.
    result = subprocess.run([sys.executable, "-m", "ddp_scripts.measure.gpu_micro", "--out", "unused"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert not (ROOT / "unused").exists()


def test_the_micro_measurement_sets_gradients_to_none_before_capture():
    source = (ROOT / "ddp_scripts" / "measure" / "gpu_micro.py").read_text()
    capture = source[source.index("captured = torch.cuda.CUDAGraph()"):
                     source.index("with torch.cuda.graph(captured)")]
    assert "zero_grad(set_to_none=True)" in capture
    assert "set_to_none=False" not in source and "cudnn.benchmark" not in source.split('"""')[2]


def test_a_partial_check_runs_one_notebook_alone_and_records_nothing():
    before = sorted(p.name for p in gpu_recordings.RECORDINGS.iterdir())
    result = run_gpu_check("--only", "notebooks/01_devices.ipynb")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    readme = (gpu_check.WORK / "README.md").read_text()
    assert re.search(r"\| notebook:01_devices\.ipynb \| [\d.]+ \| [\d.]+ → [\d.]+ on \d+ cores", readme), readme
    assert "Nothing recorded" in readme and readme in result.stdout
    assert sorted(p.name for p in gpu_recordings.RECORDINGS.iterdir()) == before
    assert load_notebook(ROOT / "notebooks" / "01_devices.ipynb")["cells"][1]["outputs"] == []
