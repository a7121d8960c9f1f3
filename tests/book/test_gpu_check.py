"""`make gpu-check` without a GPU: the steps it runs and in which order, a step past its time
limit ended with its process group, what a recorded notebook writes, the steps it records, and a check
without CUDA that runs a notebook on the CPU and records nothing. Then how a recording says it was
made (busy machines, the one label)."""
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from book_files import ROOT, cell_source, load_notebook

from book.tools import gpu_check, gpu_recordings
from ddp_scripts.hardware import hardware_label

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
    assert sorted(keys[:len(names)]) == [f"notebook:{name}" for name in names]
    assert keys[len(names):] == ["tests", "micro", "benchmark:full", "benchmark:resnet18"]
    by_key = dict(gpu_check.commands(["tests", "benchmark"], "1x-h200"))
    assert list(by_key) == ["tests", "benchmark:full", "benchmark:resnet18"]
    assert by_key["tests"][by_key["tests"].index("-m", 2) + 1] == "gpu"
    assert "--tuned" in by_key["benchmark:full"] and "{out}/1x-h200-full.json" in by_key["benchmark:full"]
    one = gpu_check.commands(["notebooks/05_distributed_data_parallel.ipynb"], "1x-h200")
    assert [key for key, _ in one] == ["notebook:05_distributed_data_parallel.ipynb"]


def counts(current, stale, missing):
    return {"boxes": current + stale + missing, "current": current, "stale": stale, "missing": missing}


# Chapters 8 to 11 never recorded, chapter 7 mostly stale, chapter 3 a little, chapter 1 current.
PLANTED_COUNTS = {"01_devices.ipynb": counts(3, 0, 0), "03_choosing_gpus.ipynb": counts(5, 1, 0),
                  "07_experiment.ipynb": counts(1, 6, 4), "08_troubleshooting.ipynb": counts(0, 0, 11),
                  "09_ddp_in_practice.ipynb": counts(0, 0, 4), "10_keeping_the_gpu_busy.ipynb": counts(0, 0, 10),
                  "11_fsdp.ipynb": counts(0, 0, 2)}


def test_the_chapters_with_no_box_current_go_first_then_the_stale_then_the_rest():
    order = gpu_check.plan_order(sorted(PLANTED_COUNTS), PLANTED_COUNTS)
    assert order == ["08_troubleshooting.ipynb", "10_keeping_the_gpu_busy.ipynb", "09_ddp_in_practice.ipynb",
                     "11_fsdp.ipynb", "07_experiment.ipynb", "03_choosing_gpus.ipynb", "01_devices.ipynb"]
    keys = [key for key, _ in gpu_check.commands(["notebooks"], "1x-h200", PLANTED_COUNTS)]
    assert keys[:4] == [f"notebook:{name}" for name in order[:4]]


def test_planted_a_chapter_recorded_current_since_goes_last():
    recorded = dict(PLANTED_COUNTS, **{"08_troubleshooting.ipynb": counts(11, 0, 0)})
    order = gpu_check.plan_order(sorted(recorded), recorded)
    assert order[0] == "10_keeping_the_gpu_busy.ipynb"
    assert order[-2:] == ["01_devices.ipynb", "08_troubleshooting.ipynb"]


def test_right_case_the_committed_chapters_go_in_the_order_of_their_boxes():
    """Today's chapters: every one with no box current before any with one."""
    counted = gpu_recordings.box_counts_by_notebook(sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")))
    keys = [key.split(":", 1)[1] for key, _ in gpu_check.commands(["notebooks"], "1x-h200")]
    never = [name for name in keys if counted[name]["current"] == 0 and counted[name]["boxes"]]
    assert keys[:len(never)] == never
    assert all(counted[name]["current"] or not counted[name]["boxes"] for name in keys[len(never):])


# --- the budget and the plan -------------------------------------------------------------------

class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def fake_runs(clock, took):
    """run_one for run_steps: each step takes `took[key]` seconds of the fake clock."""
    def run_one(key, command, limit_s):
        clock.now += min(took[key], limit_s)
        return {"key": key, "result": "passed" if took[key] <= limit_s else "timeout", "limit_s": limit_s}
    return run_one


def test_planted_steps_over_the_budget_are_not_started_and_the_rest_still_run():
    expected = {"a": (10, "x"), "b": (100, "x"), "c": (5, "x"), "d": (60, "x")}
    steps = [(key, ["true"]) for key in expected]
    clock = FakeClock()
    entries = gpu_check.run_steps(steps, expected, 50, fake_runs(clock, {"a": 10, "b": 100, "c": 5, "d": 60}), clock, 0)
    assert [(e["key"], e["result"]) for e in entries] == [
        ("a", "passed"), ("b", "not started: budget"), ("c", "passed"), ("d", "not started: budget")]
    assert entries[2]["limit_s"] == 40 and clock.now == 15
    assert [row[3] for row in gpu_check.plan(list(expected), expected, 50)] == [10, None, 15, None]


def test_planted_a_step_that_runs_over_is_ended_with_the_budget_and_nothing_starts_after():
    expected = {"a": (10, "x"), "b": (5, "x")}
    clock = FakeClock()
    entries = gpu_check.run_steps([("a", []), ("b", [])], expected, 30, fake_runs(clock, {"a": 80, "b": 5}), clock, 0)
    assert [(e["key"], e["result"]) for e in entries] == [("a", "timeout"), ("b", "not started: budget")]
    assert entries[0]["limit_s"] == 30 and clock.now == 30


def test_right_case_without_a_budget_every_step_runs_with_its_own_limit():
    expected = {"a": (10_000, "x"), "b": (5, "x")}
    clock = FakeClock()
    entries = gpu_check.run_steps([("a", []), ("b", [])], expected, None, fake_runs(clock, {"a": 9, "b": 5}), clock, 0)
    assert [e["result"] for e in entries] == ["passed", "passed"]
    assert {e["limit_s"] for e in entries} == {gpu_check.STEP_TIMEOUT_S}


def test_the_plan_takes_its_seconds_from_the_newest_gpu_recording_then_the_last_build(tmp_path):
    old, new = tmp_path / "2026-11-30-h200", tmp_path / "2026-12-24-1x-h100"
    old.mkdir()
    new.mkdir()
    (old / "check-log.txt").write_text("98.23s call     notebooks/08_x.ipynb::08_x.ipynb\n"
                                       "7.00s call     notebooks/01_y.ipynb::01_y.ipynb\n")
    (new / gpu_check.STEPS_FILE).write_text(json.dumps([
        {"key": "notebook:01_y.ipynb", "result": "passed", "seconds": 4.5},
        {"key": "tests", "result": "failed", "seconds": 99.0}]))
    timings = tmp_path / "timings.xml"
    timings.write_text('<testsuite><testcase file="notebooks/09_z.ipynb" time="312.5"/>'
                       '<testcase file="notebooks/08_x.ipynb" time="400"/></testsuite>')
    expected = gpu_check.expected_seconds(["notebook:08_x.ipynb", "notebook:01_y.ipynb", "notebook:09_z.ipynb",
                                           "tests"], tmp_path, timings)
    assert expected["notebook:08_x.ipynb"] == (98.23, "results/gpu-runs/2026-11-30-h200/check-log.txt")
    assert expected["notebook:01_y.ipynb"] == (4.5, "results/gpu-runs/2026-12-24-1x-h100/steps.json")
    assert expected["notebook:09_z.ipynb"][0] == 312.5 and expected["notebook:09_z.ipynb"][1].startswith("last build")
    assert expected["tests"] == (gpu_check.UNTIMED_STEP_S, "untimed: assumed")   # a failed step times nothing


def test_the_h200_recording_times_its_notebooks_for_the_plan():
    timed, file = gpu_check.logged_seconds(H200[0])
    assert file == "check-log.txt" and set(timed) >= {f"notebook:{name}" for name in H200[2]}
    assert all(seconds > 0 for seconds in timed.values())


def test_a_dry_run_plans_keeps_the_books_and_packs_without_running_anything(tmp_path):
    packed = tmp_path / "out" / "gpu-check.tgz"
    result = run_gpu_check("--dry-run", "--budget-s", "1", "--pack", str(packed), "tests", "notebooks/01_devices.ipynb")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "plan: 2 step(s), budget 1 s" in result.stdout
    with tarfile.open(packed) as archive:
        names = archive.getnames()
        folder = next(name for name in names if name.count("/") == 2)
        steps = json.load(archive.extractfile(f"{folder}/{gpu_check.STEPS_FILE}"))
        readme = archive.extractfile(f"{folder}/README.md").read().decode()
    assert folder.startswith("results/gpu-runs/") and f"{folder}/{gpu_recordings.RUN_FILE}" not in names
    assert [(s["key"], s["result"]) for s in steps] == [("tests", "not started: budget"),
                                                        ("notebook:01_devices.ipynb", "not started: budget")]
    assert readme.startswith("# A dry run") and "not started: budget" in readme
    plan = run_gpu_check("--plan", "--budget-s", "540")
    assert plan.returncode == 0 and "notebook:08_troubleshooting.ipynb" in plan.stdout, plan.stderr
    assert run_gpu_check("--plan", "--budget-s", "0").returncode == 2


@pytest.mark.parametrize("budget", ["nan", "inf", "-inf", "-5", "0"])
def test_planted_a_budget_that_is_no_number_of_seconds_is_one_line_and_nothing_runs(budget):
    for mode in ("--plan", "--dry-run"):
        result = run_gpu_check(mode, f"--budget-s={budget}", "tests")
        assert result.returncode == 2 and "--budget-s" in result.stderr, result.stdout + result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "plan:" not in result.stdout and "tests:" not in result.stdout


def test_planted_a_pack_target_that_cannot_be_written_stops_before_any_step(tmp_path):
    for target in ("/proc/nope/gpu-check.tgz", str(tmp_path)):
        result = run_gpu_check("--dry-run", "--pack", target, "tests")
        assert result.returncode == 2 and target in result.stderr, result.stdout + result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "tests:" not in result.stdout


def refused(*args):
    """The call's one error line, after checking it ran nothing."""
    result = run_gpu_check("--dry-run", *args, "tests")
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "plan:" not in result.stdout and "tests:" not in result.stdout
    return result.stderr.strip()


def test_planted_a_pack_target_that_is_a_file_gpu_check_did_not_write_is_kept(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# a page\n")
    other = tmp_path / "other.tgz"   # a gzip tar, but not of one gpu-runs folder
    with tarfile.open(other, "w:gz") as archive:
        archive.add(readme, arcname="README.md")
    for target in (readme, other, Path("/proc/version")):
        before = target.read_bytes()
        line = refused("--pack", str(target))
        assert str(target) in line and "gpu-check" in line, line
        assert target.read_bytes() == before


def test_right_case_the_archive_gpu_check_wrote_is_packed_again(tmp_path):
    packed = tmp_path / "gpu-check.tgz"
    for _ in range(2):   # a later call the same day packs over the same run's archive
        result = run_gpu_check("--dry-run", "--pack", str(packed), "tests")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    folder = tmp_path / "2026-12-24-1x-h100"
    folder.mkdir()
    (folder / "steps.json").write_text("[]")
    gpu_check.pack(folder, packed)   # another day's folder, packed by a real run
    gpu_check.check_pack_target(packed)


def test_planted_an_empty_pack_target_is_refused():
    assert "--pack" in refused("--pack", "")
    assert "--pack" in refused("--pack=")


def test_planted_a_pack_folder_that_cannot_take_a_file_names_the_real_one(tmp_path):
    line = refused("--pack", "/proc/nope.tgz")
    assert "/proc takes no new file" in line and "No such file or directory" not in line, line
    plain = tmp_path / "plain"
    plain.write_text("x")
    line = refused("--pack", str(plain / "sub" / "gpu-check.tgz"))
    assert f"{plain} is a file" in line, line


def test_planted_a_refused_dry_run_makes_no_folder_for_the_pack(tmp_path):
    target = tmp_path / "new" / "deeper" / "gpu-check.tgz"
    result = run_gpu_check("--dry-run", "--pack", str(target), "no-such-step")
    assert result.returncode == 2 and not (tmp_path / "new").exists(), result.stderr
    gpu_check.check_pack_target(target)
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("budget", ["1e309", "-1e309", "NaN", "0x10", "ten"])
def test_planted_a_refused_budget_is_echoed_as_typed(budget):
    for mode in ("--plan", "--dry-run"):
        result = run_gpu_check(mode, f"--budget-s={budget}", "tests")
        assert result.returncode == 2 and f"--budget-s {budget}:" in result.stderr, result.stdout + result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def planned(budget_s):
    """The plan of PLANTED_COUNTS' chapters, chapter 11 timed at 458 s (a CPU build's time), then the tests."""
    keys = [f"notebook:{name}" for name in gpu_check.plan_order(sorted(PLANTED_COUNTS), PLANTED_COUNTS)]
    expected = {key: (458.0 if "11_fsdp" in key else 30.0, "x") for key in keys} | {"tests": (200.0, "x")}
    return gpu_check.plan([*keys, "tests"], expected, budget_s)


def test_planted_a_never_recorded_chapter_over_the_budget_is_named_with_the_second_call(capsys):
    gpu_check.print_plan(planned(300), 300, PLANTED_COUNTS)
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("No box current"))
    assert "11_fsdp.ipynb" in line and "08_troubleshooting" not in line
    assert 'STEPS="notebooks/11_fsdp.ipynb tests"' in out


def test_right_case_every_chapter_fits_and_no_second_call_is_asked(capsys):
    gpu_check.print_plan(planned(2000), 2000, PLANTED_COUNTS)
    out = capsys.readouterr().out
    assert "No box current" not in out and "STEPS=" not in out


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
    return boxes_annotate_makes_files(folder, [p.name for p in sorted(Path(folder).glob("*.ipynb"))], recordings)


def boxes_annotate_makes_files(folder, names, recordings):
    headers = {state: gpu_recordings.words("en")[f"gpu_header_{state}"].split("{")[0].split(" ·")[0]
               for state in ("current", "stale", "missing")}
    counted = dict.fromkeys(headers, 0)
    for path in (Path(folder) / name for name in names):
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
    words = build.gpu_box_words(build.EDITIONS["en"])
    assert {key: value for key, value in build.gpu_box_words(build.EDITIONS["zh"]).items() if key != "gpu_table"} \
        == {key: value for key, value in words.items() if key != "gpu_table"}
    assert {key: words[key] for key in map("gpu_{}".format, counts)} \
        == {f"gpu_{state}": str(number) for state, number in counts.items()}
    # both front pages state every count, the table and the GPUs recorded
    for page in ("book/intro.md", "book/zh/intro.md"):
        text = (ROOT / page).read_text(encoding="utf-8")
        assert all(f"{{{{ gpu_{state} }}}}" in text for state in [*counts, "table", "machines"]), page


def table_rows(table):
    """{chapter stem or "total": [current, stale, not recorded]} of a gpu_table."""
    rows = {}
    for line in table.splitlines()[2:]:
        first, *numbers = [cell.strip().strip("*") for cell in line.strip("|").split("|")]
        chapter = re.search(r"notebooks/(\w+)`", first)
        rows[chapter.group(1) if chapter else "total"] = [int(n) for n in numbers]
    return rows


def test_the_front_pages_table_has_a_row_of_each_chapters_boxes_and_the_books():
    from book.tools import build
    for language in ("en", "zh"):
        rows = table_rows(build.gpu_box_words(build.EDITIONS[language])["gpu_table"])
        for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
            shown = boxes_annotate_makes_one(path, RECORDINGS)
            assert rows.get(path.stem, [0, 0, 0]) == shown, (language, path.name)
        total = gpu_recordings.box_counts(sorted((ROOT / "notebooks").glob("*.ipynb")))
        assert rows["total"] == [total["current"], total["stale"], total["missing"]]
        assert build.words(language)["gpu_table_total"] in build.gpu_box_words(build.EDITIONS[language])["gpu_table"]


def boxes_annotate_makes_one(path, recordings):
    """[current, stale, not recorded] boxes annotate gives one notebook."""
    folder = Path(path).parent
    counted = boxes_annotate_makes_files(folder, [Path(path).name], recordings)
    return [counted["current"], counted["stale"], counted["missing"]]


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


def test_planted_a_new_recording_moves_its_chapter_in_the_front_pages_table(tmp_path):
    """What the table says follows the recordings: chapter 8 recorded (a fake run on the H200's
    hardware) goes from not recorded to current, in its row and the book's."""
    from book.tools import build
    recordings = tmp_path / "gpu-runs"
    shutil.copytree(H200[0], recordings / H200[0].name)
    before = table_rows(build.gpu_box_words(build.EDITIONS["en"], recordings)["gpu_table"])
    folder = fake_recording(tmp_path, "08_troubleshooting.ipynb", recordings / "2026-12-24-1x-h200")
    after = table_rows(build.gpu_box_words(build.EDITIONS["en"], recordings)["gpu_table"])
    cells = len(json.loads((folder / gpu_recordings.CELLS_FILE).read_text())["08_troubleshooting.ipynb"])
    assert before["08_troubleshooting"] == [0, 0, cells] and after["08_troubleshooting"] == [cells, 0, 0]
    assert after["total"] == [before["total"][0] + cells, before["total"][1], before["total"][2] - cells]
    assert {k: v for k, v in after.items() if k not in ("08_troubleshooting", "total")} \
        == {k: v for k, v in before.items() if k not in ("08_troubleshooting", "total")}


def fake_recording(tmp_path, name, folder):
    """A recorded run of one chapter, as gpu-check writes it: every gpu-output cell printed."""
    executed = tmp_path / "_build" / "gpu-check" / "src" / "notebooks"
    executed.mkdir(parents=True, exist_ok=True)
    notebook = load_notebook(ROOT / "notebooks" / name)
    for cell in gpu_recordings.gpu_cells(notebook):
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": f"{cell['id']} on the GPU\n"}]
    (executed / name).write_text(json.dumps(notebook))
    folder.mkdir(parents=True, exist_ok=True)
    entry = {"key": f"notebook:{name}", "date": "2026-12-24T10:00:00+00:00", "commit": "abc1234",
             "result": "passed", "exit_status": 0, "seconds": 5.0,
             "load_average_before": [0.3, 0.2, 0.1], "load_average_after": [0.9, 0.4, 0.2]}
    original = gpu_check.WORK
    gpu_check.WORK = tmp_path / "_build" / "gpu-check"
    try:
        gpu_check.record_notebook(name, entry, folder, GPU_MACHINE)
    finally:
        gpu_check.WORK = original
    gpu_check.write_readme(folder, GPU_MACHINE, "abc1234", [entry])
    return folder


def test_the_packed_folder_is_a_recording_the_build_reads_as_it_is(tmp_path):
    """Round trip: a fake run recorded and packed as on the GPU machine, unpacked at a
    repository's root here, read by gpu_recordings: its cells current on the pages."""
    name = "10_keeping_the_gpu_busy.ipynb"
    there = tmp_path / "there"
    folder = fake_recording(there, name, there / "results" / "gpu-runs" / "2026-12-24-1x-h100")
    gpu_check.pack(folder, tmp_path / "out" / "gpu-check.tgz")
    here = tmp_path / "here"
    with tarfile.open(tmp_path / "out" / "gpu-check.tgz") as archive:
        archive.extractall(here, filter="data")
    (recorded,) = gpu_recordings.load_recordings(here / "results" / "gpu-runs")
    assert recorded[0].name == folder.name and recorded[1]["commit"] == "abc1234"
    assert recorded[1]["hardware"] == GPU_MACHINE["label"] and recorded[1]["date"] == "2026-12-24"
    assert (recorded[0] / "README.md").read_text().startswith("# Recorded GPU run: 1 x NVIDIA H200, 2026-12-24")
    cells = len(gpu_recordings.gpu_cells(load_notebook(ROOT / "notebooks" / name)))
    counted = gpu_recordings.box_counts_by_notebook([ROOT / "notebooks" / name], here / "results" / "gpu-runs")
    assert counted == {name: {"boxes": cells, "current": cells, "stale": 0, "missing": 0}}
    notebook = load_notebook(ROOT / "notebooks" / name)
    assert gpu_recordings.annotate(notebook, name, [recorded]) == []   # no stale line
