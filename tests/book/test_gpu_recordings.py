"""Recorded GPU runs (results/gpu-runs/) and the executed chapters made ready for the page
(book/tools/gpu_recordings.py). `make gpu-check` itself: tests/book/test_gpu_check.py. No site
build is needed."""
import copy
import json
import re
import sys
from pathlib import Path

from book_files import ROOT, cell_source, chapters, load_notebook

from book.tools import gpu_recordings
from ddp_scripts.measure import links

CHAPTERS = chapters()
RECORDINGS = gpu_recordings.load_recordings()


def stream(text, name="stdout"):
    return {"output_type": "stream", "name": name, "text": text}


# --- which cells depend on a GPU ----------------------------------------------------------

def test_every_chapter_up_to_7_marks_its_gpu_dependent_cells():
    for path, number in CHAPTERS:
        cells = gpu_recordings.gpu_cells(load_notebook(path))
        if number <= 7:
            assert cells, f"{path.name}: no cell tagged {gpu_recordings.GPU_TAG}"


def test_multi_gpu_cells_are_gpu_output_cells_with_ids():
    for path, _ in CHAPTERS:
        for cell in load_notebook(path)["cells"]:
            tags = cell.get("metadata", {}).get("tags", [])
            if gpu_recordings.MULTI_GPU_TAG in tags:
                assert gpu_recordings.GPU_TAG in tags, (path.name, cell.get("id"))
            if gpu_recordings.GPU_TAG in tags:
                assert cell["cell_type"] == "code" and cell.get("id"), (path.name, cell)


# --- the recorded runs ----------------------------------------------------------------------

def test_recorded_runs_are_labelled_with_hardware_date_and_commit():
    assert RECORDINGS, f"no recorded GPU run under {gpu_recordings.RECORDINGS}"
    for folder, run, cells in RECORDINGS:
        assert run["hardware"] and run["gpus"] >= 1, folder
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", run["date"]), folder
        assert re.fullmatch(r"[0-9a-f]{7,40}(-modified)?", run["commit"]), folder
        assert folder.name.startswith(run["date"])
        assert (folder / "README.md").exists(), folder
        for name, entries in cells.items():
            assert (ROOT / "notebooks" / name).exists(), f"{folder.name}: {name}"
            for cell_id, entry in entries.items():
                assert re.fullmatch(r"[0-9a-f]{64}", entry["source_sha256"]), cell_id


def test_h200_recording_covers_every_gpu_cell_of_the_commit_it_ran():
    folder, run, cells = next(r for r in RECORDINGS if r[0].name == "2026-11-30-h200")
    assert run["commit"] == "27a4f98" and run["gpus"] == 1 and "H200" in run["hardware"]
    recorded = {(name, cell_id) for name, entries in cells.items() for cell_id in entries}
    assert len(recorded) >= 40
    # chapter 2's pinned copy, as the H200 printed it (nothing typed in: from the notebook)
    pinned = cells["02_tensors_and_models.ipynb"]["ch02-31"]["outputs"]
    assert "pinned, .to(device)" in "".join(gpu_recordings.text_of(o) for o in pinned)


def test_recorded_results_files_have_no_terminal_escape_codes():
    """The benchmark's files; cells.json keeps the outputs as nbmake wrote them."""
    for folder, _, _ in RECORDINGS:
        results = [p for p in folder.glob("*.json")
                   if p.name not in (gpu_recordings.CELLS_FILE, gpu_recordings.RUN_FILE)]
        assert results, f"{folder}: no results files"
        for path in results:
            assert "\\u001b" not in path.read_text(encoding="utf-8"), path


def test_nvidia_smis_escape_codes_never_reach_a_results_file(monkeypatch):
    """Why gpu-check cleans no results file: links.py takes them out as it reads nvidia-smi."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(links, "_nvidia_smi", lambda arguments: "\x1b[4mGPU0\tCPU\x1b[0m\nGPU0\t X")
    assert links.gpu_interconnect(1)["topology"] == "GPU0\tCPU\nGPU0\t X"


def chapter_two_with_recording():
    """Chapter 2 and the H200 recording, its cells ch02-31 and ch02-33 recorded as the code is
    now (the recorded outputs kept), so the tests do not depend on the chapter's edits."""
    path = ROOT / "notebooks" / "02_tensors_and_models.ipynb"
    notebook = load_notebook(path)
    folder, run, cells = next(r for r in RECORDINGS if r[0].name == "2026-11-30-h200")
    cells = copy.deepcopy(cells)
    for cell in notebook["cells"]:
        if cell.get("id") in ("ch02-31", "ch02-33"):
            cells["02_tensors_and_models.ipynb"][cell["id"]]["source_sha256"] = (
                gpu_recordings.source_hash(cell_source(cell)))
    return notebook, (folder, run, cells)


def added_boxes(cell):
    """The labels the recordings added to a cell (HTML)."""
    return [gpu_recordings.source_of({"source": o["data"]["text/html"]}) for o in cell["outputs"]
            if o.get("metadata", {}).get(gpu_recordings.MARKER) == "label"]


def added_outputs(cell):
    """The outputs the recordings added after their labels."""
    return [o for o in cell["outputs"] if o.get("metadata", {}).get(gpu_recordings.MARKER) == "output"]


def test_a_recorded_output_is_shown_current_and_labelled():
    notebook, recording = chapter_two_with_recording()
    cell = next(c for c in notebook["cells"] if c.get("id") == "ch02-31")
    cell["outputs"] = [stream("Not measured here\n")]
    stale = gpu_recordings.annotate(notebook, "02_tensors_and_models.ipynb", [recording])
    assert not any("ch02-31" in line for line in stale)
    assert cell["outputs"][0] == stream("Not measured here\n"), "the build's own output first"
    [shown] = added_boxes(cell)
    assert "gpu-recording-current" in shown and "Stale" not in shown
    # one line to read, the rest one click away
    line, rest = re.fullmatch(r'<div class="gpu-recording [\w-]+"><details><summary class='
                              r'"gpu-recording-header">(.*?)</summary>(.*)</details></div>',
                              shown, re.S).groups()
    assert line.startswith("Recorded on 1 x NVIDIA H200 · torch 2.11.0+cu130 · 2026-11-30")
    assert "commit 27a4f98" in rest and "commit" not in line
    assert recording[1]["date"] in shown and "commit 27a4f98" in shown and "H200" in shown
    # after the label, what the cell printed there: outputs of the cell that myst-nb renders,
    # text as display data (a stream would be merged into the build machine's, above)
    recorded = added_outputs(cell)
    assert cell["outputs"].index(recorded[0]) == cell["outputs"].index(
        next(o for o in cell["outputs"] if o.get("metadata", {}).get(gpu_recordings.MARKER))) + 1
    assert all(o["output_type"] == "display_data" for o in recorded)
    assert "pinned, .to(device)" in "".join(map(gpu_recordings.text_of, recorded))
    assert "pinned, .to(device)" not in shown


def test_a_changed_cell_is_detected_as_stale_on_the_page_and_in_the_build_output(tmp_path):
    notebook, recording = chapter_two_with_recording()
    cell = next(c for c in notebook["cells"] if c.get("id") == "ch02-31")
    cell["source"] = cell_source(cell) + "\nprint('changed')"
    executed = tmp_path / "02_tensors_and_models.ipynb"
    executed.write_text(json.dumps(notebook))
    printed = []
    folder = tmp_path / "gpu-runs" / recording[0].name
    folder.mkdir(parents=True)
    gpu_recordings.write_json(folder / gpu_recordings.RUN_FILE, recording[1])
    gpu_recordings.write_json(folder / gpu_recordings.CELLS_FILE, recording[2])
    root = folder.parent
    stale = gpu_recordings.prepare([executed], recordings_root=root, report=printed.append)
    assert [line for line in stale if "ch02-31" in line] == [
        f"stale GPU recording: 02_tensors_and_models.ipynb cell ch02-31 in "
        f"results/gpu-runs/{recording[0].name} (its code changed since)"]
    assert any(line.startswith("warning: stale GPU recording: 02_tensors_and_models.ipynb "
                               "cell ch02-31") for line in printed), printed
    cells = {c.get("id"): c for c in json.loads(executed.read_text())["cells"]}
    shown = added_boxes(cells["ch02-31"])
    assert len(shown) == 1 and "gpu-recording-stale" in shown[0]
    assert "Stale recording" in shown[0] and "make gpu-check" not in shown[0]   # for maintainers
    header = re.search(r'<summary class="gpu-recording-header">(.*?)</summary>', shown[0]).group(1)
    assert header == ("Stale recording · 1 x NVIDIA H200 · torch 2.11.0+cu130 · 2026-11-30 · "
                      "the code changed since · loaded machine"), header
    # the cells that did not change stay current
    assert "gpu-recording-current" in added_boxes(cells["ch02-33"])[0]


def test_a_cell_newer_than_the_recording_is_said_to_be_unrecorded():
    notebook, (folder, run, cells) = chapter_two_with_recording()
    cells = copy.deepcopy(cells)
    del cells["02_tensors_and_models.ipynb"]["ch02-33"]
    stale = gpu_recordings.annotate(notebook, "02_tensors_and_models.ipynb",
                                    [(folder, run, cells)])
    assert any("ch02-33" in line and "not recorded" in line for line in stale)
    cell = next(c for c in notebook["cells"] if c.get("id") == "ch02-33")
    assert "Not recorded on" in added_boxes(cell)[0]


def test_multi_gpu_cells_say_no_multi_gpu_recording_exists():
    notebook = load_notebook(ROOT / "notebooks" / "04_data_parallel.ipynb")
    gpu_recordings.annotate(notebook, "04_data_parallel.ipynb", RECORDINGS)
    by_id = {c.get("id"): c for c in notebook["cells"]}
    for cell in gpu_recordings.gpu_cells(notebook):
        multi = gpu_recordings.MULTI_GPU_TAG in cell["metadata"]["tags"]
        below = by_id.get(f"{cell['id']}-gpu")   # a figure's recording: in the cell below
        text = " ".join(added_boxes(cell) + (added_boxes(below) if below else []))
        assert ("No multi-GPU recording exists yet" in text) == (
            multi and not any(run["gpus"] >= 2 for _, run, _ in RECORDINGS)), cell["id"]


def test_annotating_twice_gives_the_same_notebook():
    notebook, recording = chapter_two_with_recording()
    gpu_recordings.annotate(notebook, "02_tensors_and_models.ipynb", [recording])
    once = copy.deepcopy(notebook)
    gpu_recordings.annotate(notebook, "02_tensors_and_models.ipynb", [recording])
    assert notebook == once


def test_record_reads_tags_from_the_committed_notebooks_and_hashes_what_ran(tmp_path):
    committed, executed = tmp_path / "committed", tmp_path / "executed"
    committed.mkdir()
    executed.mkdir()
    cells = [{"cell_type": "code", "id": "a", "metadata": {"tags": ["gpu-output"]},
              "source": "print(1)", "outputs": [], "execution_count": None},
             {"cell_type": "code", "id": "b", "metadata": {}, "source": "print(2)",
              "outputs": [], "execution_count": None}]
    notebook = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (committed / "09_x.ipynb").write_text(json.dumps(notebook))
    ran = copy.deepcopy(notebook)
    for cell in ran["cells"]:
        cell["metadata"] = {}
        cell["outputs"] = [stream("on cuda:0\n"), stream("done\n")]
    (executed / "09_x.ipynb").write_text(json.dumps(ran))
    recorded = gpu_recordings.record(executed / "09_x.ipynb", committed / "09_x.ipynb")
    assert list(recorded) == ["a"]
    entry = recorded["a"]
    assert entry["source_sha256"] == gpu_recordings.source_hash("print(1)\n")
    assert entry["outputs"] == [stream("on cuda:0\ndone\n")]


def test_a_gpu_figure_is_recorded_and_shown_as_the_image_the_gpu_drew(tmp_path):
    """make gpu-check records a figure cell like any other: the PNG it drew there comes back
    on the page, below the build's own figure, in a box of its own."""
    figure = {"output_type": "display_data", "metadata": {},
              "data": {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure size 700x320>"}}
    cell = {"cell_type": "code", "id": "f", "source": "draw()", "execution_count": None,
            "metadata": {"tags": ["gpu-output"], "mystnb": {"figure": {"name": "fig-ch09-x",
                                                                      "caption": "A figure."}}},
            "outputs": []}
    notebook = {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "committed.ipynb").write_text(json.dumps(notebook))
    ran = copy.deepcopy(notebook)
    ran["cells"][0]["outputs"] = [figure]
    (tmp_path / "ran.ipynb").write_text(json.dumps(ran))
    recorded = gpu_recordings.record(tmp_path / "ran.ipynb", tmp_path / "committed.ipynb")
    assert recorded["f"]["outputs"] == [figure]
    run = {"hardware": "1 x NVIDIA H200; torch 2.11.0", "gpus": 1, "date": "2026-12-01",
           "commit": "abc1234"}
    page = copy.deepcopy(notebook)
    page["cells"][0]["outputs"] = [dict(figure, data={"image/png": "CPU", "text/plain": "cpu"})]
    gpu_recordings.annotate(page, "09_x.ipynb", [(tmp_path, run, {"09_x.ipynb": recorded})])
    own, below = page["cells"]
    assert [o["data"]["image/png"] for o in own["outputs"]] == ["CPU"]
    assert [o["data"]["image/png"] for o in added_outputs(below)] == ["iVBORw0KGgo="]


# --- outputs made ready for the page --------------------------------------------------------

def test_consecutive_streams_of_one_name_merge_and_nothing_else_moves():
    display = {"output_type": "display_data", "data": {"text/plain": "table"}, "metadata": {}}
    outputs = [stream("a\n"), stream("b"), stream("c\n"), stream("warn\n", "stderr"),
               stream("d\n"), display, stream("e\n")]
    assert gpu_recordings.merge_streams(outputs) == [
        stream("a\nbc\n"), stream("warn\n", "stderr"), stream("d\n"), display, stream("e\n")]
    assert gpu_recordings.merge_streams(outputs[:1]) == outputs[:1]


def test_build_machine_paths_and_name_are_taken_out_of_outputs(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_recordings.socket, "gethostname", lambda: "buildbox7.example.org")
    copy_dir = tmp_path / "_build" / "src"
    scrub = gpu_recordings.scrubber(copy_dir)
    assert scrub("rank 0 on buildbox7, rank 1 on buildbox70") == "rank 0 on HOST, rank 1 on buildbox70"
    venv = Path(sys.prefix)
    traceback = (f"File {venv}/lib/python3.11/site-packages/torch/cuda/__init__.py:591, in f\n"
                 f"saved {copy_dir}/runs/x.pt; home {Path.home()}/.cache/torch; "
                 f"repo {ROOT}/data")
    text = scrub(traceback)
    assert "VENV/lib/python3.11/site-packages/torch/cuda/__init__.py:591" in text
    assert "saved ./runs/x.pt" in text and "~/.cache/torch" in text and "repo ./data" in text
    for private in {str(venv), str(venv.resolve()), str(ROOT), str(copy_dir)}:
        assert private not in text
    outputs = gpu_recordings.scrub_outputs(
        [{"output_type": "error", "ename": "E", "evalue": f"at {ROOT}/x",
          "traceback": [traceback]}], scrub)
    assert str(ROOT) not in json.dumps(outputs)


def test_a_recorded_figure_gets_a_cell_of_its_own_below_the_numbered_one():
    """myst-nb puts every display output of a cell with mystnb.figure in that figure: the
    recorded image beside the build's would give two figures one name."""
    notebook, recording = chapter_two_with_recording()
    cell = next(c for c in notebook["cells"] if c.get("id") == "ch02-31")
    cell["metadata"]["mystnb"] = {"figure": {"caption": "A figure.", "name": "fig-t"}}
    own = [stream("built here\n"), {"output_type": "display_data", "metadata": {},
                                    "data": {"image/png": "iVBOR", "text/plain": "<Figure>"}}]
    cell["outputs"] = copy.deepcopy(own)
    gpu_recordings.annotate(notebook, "02_tensors_and_models.ipynb", [recording])
    assert cell["outputs"] == own
    below = notebook["cells"][notebook["cells"].index(cell) + 1]
    assert below["id"] == "ch02-31-gpu" and "mystnb" not in below["metadata"]
    assert below["source"].strip(), "myst-nb leaves out a code cell with no code"
    assert added_boxes(below) and added_outputs(below)
    gpu_recordings.annotate(notebook, "02_tensors_and_models.ipynb", [recording])   # again
    assert [c["id"] for c in notebook["cells"]].count("ch02-31-gpu") == 1


def test_the_boxes_per_chapter_add_up_to_the_books_and_leave_out_a_chapter_without_one(tmp_path):
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    per_chapter = gpu_recordings.box_counts_by_notebook(notebooks)
    total = gpu_recordings.box_counts(notebooks)
    assert {state: sum(counts[state] for counts in per_chapter.values()) for state in total} == total
    assert all(counts["boxes"] == len(gpu_recordings.gpu_cells(load_notebook(ROOT / "notebooks" / name)))
               * len({run["hardware"] for _, run, _ in RECORDINGS}) for name, counts in per_chapter.items())
    plain = tmp_path / "plain.ipynb"
    plain.write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert gpu_recordings.box_counts_by_notebook([plain]) == {}
