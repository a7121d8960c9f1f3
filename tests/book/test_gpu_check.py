"""`make gpu-check` without a GPU: the steps it runs and in which order, a step past its time
limit ended with its process group, what a recorded notebook writes, the steps it records, and a check
without CUDA that runs a notebook on the CPU and records nothing. Then how a recording says it was
made (busy machines, the one label)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from book_files import ROOT, cell_source, load_notebook

from book.tools import gpu_check, gpu_recordings
from ddp_scripts.measure.hardware import hardware_label

RECORDINGS = gpu_recordings.load_recordings()
H200 = next(r for r in RECORDINGS if r[0].name == "2026-11-30-h200")
GPU_MACHINE = {"gpus": [{"name": "NVIDIA H200"}], "cores": 16, "slug": "1x-h200",
               "label": H200[1]["hardware"]}


def run_gpu_check(*args):
    return subprocess.run([sys.executable, "-m", "book.tools", "gpu-check", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_every_notebook_then_the_tests_the_micro_measurement_and_the_benchmarks():
    keys = [key for key, _ in gpu_check.commands([], "1x-h200")]
    names = sorted(path.name for path in (ROOT / "notebooks").glob("[0-9]*.ipynb"))
    assert keys == [f"notebook:{name}" for name in names] + [
        "tests", "micro", "benchmark:full", "benchmark:resnet18"]
    by_key = dict(gpu_check.commands(["tests", "benchmark"], "1x-h200"))
    assert list(by_key) == ["tests", "benchmark:full", "benchmark:resnet18"]
    assert by_key["tests"][by_key["tests"].index("-m", 2) + 1] == "gpu"
    assert "--tuned" in by_key["benchmark:full"] and "{out}/1x-h200-full.json" in by_key["benchmark:full"]
    one = gpu_check.commands(["notebooks/05_distributed_data_parallel.ipynb"], "1x-h200")
    assert [key for key, _ in one] == ["notebook:05_distributed_data_parallel.ipynb"]


def test_a_step_past_its_time_limit_is_ended_with_the_processes_it_started(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "STEP_TIMEOUT_S", 1)
    marker = tmp_path / "still-running"
    entry = gpu_check.run_step(["sh", "-c", f"(sleep 3; touch {marker}) & sleep 30"], tmp_path,
                               tmp_path / "gpu-check.log")
    assert entry["result"] == "timeout" and entry["seconds"] < 20, entry
    subprocess.run(["sleep", "4"])
    assert not marker.exists(), "the step's child outlived it"
    assert entry["load_average_before"] and entry["load_average_after"]
    assert gpu_check.run_step(["false"], tmp_path, tmp_path / "gpu-check.log")["result"] == "failed"


def test_a_wrong_step_is_one_line_and_nothing_runs():
    for step in ("notebooks/99_missing.ipynb", "everything"):
        result = run_gpu_check(step)
        assert result.returncode == 2 and f"no step {step!r}" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


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
    folder = tmp_path / "2026-12-24-1x-h200"
    folder.mkdir()
    entry = {"key": f"notebook:{name}", "date": "2026-12-24T10:00:00+00:00", "commit": "abc1234",
             "result": "passed", "exit_status": 0, "seconds": 5.0,
             "load_average_before": [0.3, 0.2, 0.1], "load_average_after": [0.9, 0.4, 0.2]}
    gpu_check.record_notebook(name, entry, folder, GPU_MACHINE)
    cells = json.loads((folder / gpu_recordings.CELLS_FILE).read_text())
    assert cells[name][cell["id"]]["source_sha256"] == gpu_recordings.source_hash(
        cell_source(cell))
    conditions = json.loads((folder / gpu_recordings.CONDITIONS_FILE).read_text())
    assert conditions["concurrent_notebooks"] == 1
    assert conditions["notebooks"][name]["load_average_before"] == [0.3, 0.2, 0.1]
    assert conditions["notebooks"][name]["load_average_after"] == [0.9, 0.4, 0.2]
    run = json.loads((folder / gpu_recordings.RUN_FILE).read_text())
    assert run == {"hardware": GPU_MACHINE["label"], "gpus": 1, "date": "2026-12-24", "commit": "abc1234"}
    assert gpu_recordings.load_recordings(tmp_path) == [(folder, dict(run, conditions=conditions), cells)]


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


def test_without_cuda_a_notebook_runs_on_the_cpu_the_gpu_steps_are_skipped_and_nothing_is_recorded():
    if gpu_check.this_machine()["gpus"]:
        pytest.skip("this machine has CUDA: gpu-check would record")
    before = sorted(p.name for p in gpu_recordings.RECORDINGS.iterdir())
    result = run_gpu_check("notebooks/01_devices.ipynb", "tests", "micro")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    steps = json.loads((gpu_check.WORK / "results" / gpu_check.STEPS_FILE).read_text())
    assert [(step["key"], step["result"]) for step in steps] == [
        ("notebook:01_devices.ipynb", "passed"), ("tests", "skipped: no CUDA"), ("micro", "skipped: no CUDA")]
    assert steps[0]["seconds"] > 0 and len(steps[0]["load_average_before"]) == 3
    assert "nothing recorded (no CUDA)" in result.stdout
    assert sorted(p.name for p in gpu_recordings.RECORDINGS.iterdir()) == before
    assert load_notebook(ROOT / "notebooks" / "01_devices.ipynb")["cells"][1]["outputs"] == []


# --- the front page's count of the boxes ----------------------------------------------------

def boxes_annotate_makes(folder, recordings):
    """{state: number} of the boxes gpu_recordings.annotate gives the notebooks of `folder`,
    read from their headers as a page shows them."""
    headers = {state: gpu_recordings.words("en")[f"gpu_header_{state}"].split("{")[0].split(" ·")[0]
               for state in ("current", "stale", "missing")}
    counted = dict.fromkeys(headers, 0)
    for path in sorted(Path(folder).glob("*.ipynb")):
        notebook = load_notebook(path)
        gpu_recordings.annotate(notebook, path.name, recordings)
        for cell in notebook["cells"]:
            for output in cell.get("outputs", []):
                if output.get("metadata", {}).get(gpu_recordings.MARKER) == "label":
                    summary = output["data"]["text/html"].split('class="gpu-recording-header">')[1]
                    counted[next(s for s, said in headers.items() if summary.startswith(said))] += 1
    return {"boxes": sum(counted.values()), **counted}


def test_the_front_page_counts_the_boxes_the_chapters_show():
    counts = gpu_recordings.box_counts(sorted((ROOT / "notebooks").glob("*.ipynb")))
    assert counts == boxes_annotate_makes(ROOT / "notebooks", RECORDINGS)
    assert counts["boxes"] == counts["current"] + counts["stale"] + counts["missing"] > 0
    from book.tools import build
    assert build.gpu_box_words(build.EDITIONS["zh"]) == build.gpu_box_words(build.EDITIONS["en"]) \
        == {f"gpu_{state}": str(number) for state, number in counts.items()}
    # both front pages state every count
    for page in ("book/intro.md", "book/zh/intro.md"):
        text = (ROOT / page).read_text(encoding="utf-8")
        assert all(f"{{{{ gpu_{state} }}}}" in text for state in counts), page


def test_planted_a_recorded_cell_whose_code_changed_counts_as_stale(tmp_path):
    """A copy of the chapters with one recorded, current cell changed: the count moves it from
    current to stale, as its box does."""
    for path in (ROOT / "notebooks").glob("*.ipynb"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    before = gpu_recordings.box_counts(sorted(tmp_path.glob("*.ipynb")))
    name, cells = next((name, cells) for name, cells in H200[2].items() if (tmp_path / name).exists())
    notebook = load_notebook(tmp_path / name)
    cell = next(c for c in gpu_recordings.gpu_cells(notebook)
                if cells.get(c["id"], {}).get("source_sha256") == gpu_recordings.source_hash(cell_source(c)))
    cell["source"] = cell_source(cell) + "\nprint('changed')"
    (tmp_path / name).write_text(json.dumps(notebook))
    after = gpu_recordings.box_counts(sorted(tmp_path.glob("*.ipynb")))
    assert after == dict(before, current=before["current"] - 1, stale=before["stale"] + 1)
    assert after == boxes_annotate_makes(tmp_path, RECORDINGS)
