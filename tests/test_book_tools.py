"""The build's own tools: recorded GPU runs, outputs made ready for the page, the set-up cell's
tag and the site's offline JavaScript (`make gpu-check`: tests/test_gpu_check.py). No site
build is needed."""
import ast
import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from book_files import ROOT, cell_source, chapters, first_code_cell, load_notebook

from book.tools import build, gpu_recordings, offline_assets, page_outputs, sync_setup_cell
from book.tools.notebooks import read_notebook, write_notebook

CHAPTERS = chapters()
RECORDINGS = gpu_recordings.load_recordings()


def stream(text, name="stdout"):
    return {"output_type": "stream", "name": name, "text": text}


# --- one package, one command line -----------------------------------------------------------

# Code that changes the import path: only the notebooks' set-up cell (a notebook opened
# anywhere finds ddp_scripts with it) and the scripts run as files under torchrun (their
# bootstrap, as in ddp_scripts/), never a tool or a test module.
BOOTSTRAPS = {ROOT / "book" / "tools" / "setup_cell.py", ROOT / "tests" / "ranks_probe.py"}


def changes_the_path(tree):
    """Whether a module's code calls sys.path.insert/append/extend or assigns to sys.path[...]."""
    def is_sys_path(node):
        return (isinstance(node, ast.Attribute) and node.attr == "path"
                and isinstance(node.value, ast.Name) and node.value.id == "sys")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("insert", "append", "extend") and is_sys_path(node.func.value)):
            return True
        if isinstance(node, (ast.Assign, ast.AugAssign)) and any(
                isinstance(target, ast.Subscript) and is_sys_path(target.value)
                for target in getattr(node, "targets", [getattr(node, "target", None)])):
            return True
    return False


def test_no_tool_or_test_changes_the_import_path():
    modules = sorted({*(ROOT / "book").rglob("*.py"), *(ROOT / "tests").rglob("*.py")} - BOOTSTRAPS)
    found = [str(path.relative_to(ROOT)) for path in modules
             if changes_the_path(ast.parse(path.read_text(encoding="utf-8")))]
    assert len(modules) > 20 and not found, found
    assert all(changes_the_path(ast.parse(path.read_text())) for path in BOOTSTRAPS)


def test_every_committed_notebook_is_in_nbformats_layout(tmp_path):
    """What the tools write (book/tools/notebooks.py) is how the notebooks are committed, so a
    tool that rewrites one changes only what it means to change."""
    committed = sorted((ROOT / "notebooks").rglob("*.ipynb"))
    differing = []
    for path in committed:
        rewritten = tmp_path / path.name
        write_notebook(rewritten, read_notebook(path))
        if rewritten.read_bytes() != path.read_bytes():
            differing.append(str(path.relative_to(ROOT)))
    assert len(committed) >= 22 and not differing, differing


def test_the_command_line_runs_each_tool_and_refuses_an_unknown_command():
    def tools(*args):
        return subprocess.run([sys.executable, "-m", "book.tools", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    listed = tools("--help")
    assert listed.returncode == 0 and all(f"python -m book.tools {command}" in listed.stdout
                                          for command in ("build", "check", "sync", "gpu-check"))
    checked = tools("check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "in step" in checked.stdout   # the translations' part ran after the set-up cell's
    unknown = tools("publish")
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1
    assert unknown.stderr.startswith("error: no command 'publish'")


# --- the set-up cell ------------------------------------------------------------------------

def test_setup_cell_is_collapsed_on_the_page_in_every_chapter():
    untagged = [path.name for path, _ in CHAPTERS if sync_setup_cell.SETUP_TAG not in
                first_code_cell(load_notebook(path)).get("metadata", {}).get("tags", [])]
    assert not untagged, (f"set-up cell without the tag {sync_setup_cell.SETUP_TAG!r} in "
                          f"{untagged}: run python -m book.tools setup-cell")


def test_sync_tool_check_passes_on_the_committed_notebooks(capsys):
    assert sync_setup_cell.main(["--check"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("path_number", CHAPTERS[:2], ids=lambda p: p[0].stem)
def test_sync_tool_restores_the_tag_and_keeps_the_file_layout(tmp_path, path_number):
    path = path_number[0]
    original = path.read_text(encoding="utf-8")
    copy_path = tmp_path / path.name
    copy_path.write_text(original, encoding="utf-8")
    notebook = read_notebook(copy_path)
    first_code_cell(notebook)["metadata"]["tags"].remove(sync_setup_cell.SETUP_TAG)
    write_notebook(copy_path, notebook)
    assert copy_path.read_text(encoding="utf-8") != original
    assert sync_setup_cell.main(["--check", str(copy_path)]) == 1
    assert sync_setup_cell.main([str(copy_path)]) == 0
    assert copy_path.read_text(encoding="utf-8") == original, "only the tag may change"


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
        assert (folder / "README.md").exists() or (folder / "report.md").exists(), folder
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


def test_clean_results_file_removes_only_escape_codes(tmp_path):
    source, target = tmp_path / "in.json", tmp_path / "out.json"
    source.write_text('{"topology": "\\u001b[4mGPU0\\tCPU\\u001b[0m\\nGPU0\\t X"}\n')
    assert gpu_recordings.clean_results_file(source, target) == 2
    assert target.read_text() == '{"topology": "GPU0\\tCPU\\nGPU0\\t X"}\n'
    assert json.loads(target.read_text())["topology"].startswith("GPU0\tCPU")


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
    root = tmp_path / "gpu-runs"
    gpu_recordings.write_recording(root / recording[0].name, recording[1], recording[2])
    stale = page_outputs.prepare([executed], recordings_root=root, report=printed.append)
    assert [line for line in stale if "ch02-31" in line] == [
        f"stale GPU recording: 02_tensors_and_models.ipynb cell ch02-31 in "
        f"results/gpu-runs/{recording[0].name} (its code changed since)"]
    assert any(line.startswith("warning: stale GPU recording: 02_tensors_and_models.ipynb "
                               "cell ch02-31") for line in printed), printed
    cells = {c.get("id"): c for c in json.loads(executed.read_text())["cells"]}
    shown = added_boxes(cells["ch02-31"])
    assert len(shown) == 1 and "gpu-recording-stale" in shown[0]
    assert "Stale recording" in shown[0] and "make gpu-check" in shown[0]
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
    for cell in gpu_recordings.gpu_cells(notebook):
        multi = gpu_recordings.MULTI_GPU_TAG in cell["metadata"]["tags"]
        text = " ".join(added_boxes(cell))
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
    recorded = gpu_recordings.record(executed, committed)
    assert list(recorded["09_x.ipynb"]) == ["a"]
    entry = recorded["09_x.ipynb"]["a"]
    assert entry["source_sha256"] == gpu_recordings.source_hash("print(1)\n")
    assert entry["outputs"] == [stream("on cuda:0\ndone\n")]


# --- outputs made ready for the page --------------------------------------------------------

def test_consecutive_streams_of_one_name_merge_and_nothing_else_moves():
    display = {"output_type": "display_data", "data": {"text/plain": "table"}, "metadata": {}}
    outputs = [stream("a\n"), stream("b"), stream("c\n"), stream("warn\n", "stderr"),
               stream("d\n"), display, stream("e\n")]
    assert gpu_recordings.merge_streams(outputs) == [
        stream("a\nbc\n"), stream("warn\n", "stderr"), stream("d\n"), display, stream("e\n")]
    assert gpu_recordings.merge_streams(outputs[:1]) == outputs[:1]


def test_build_machine_paths_are_taken_out_of_outputs(tmp_path):
    copy_dir = tmp_path / "_build" / "src"
    scrub = page_outputs.scrubber(copy_dir)
    venv = Path(sys.prefix)
    traceback = (f"File {venv}/lib/python3.11/site-packages/torch/cuda/__init__.py:591, in f\n"
                 f"saved {copy_dir}/runs/x.pt; home {Path.home()}/.cache/torch; "
                 f"repo {ROOT}/data")
    text = scrub(traceback)
    assert "VENV/lib/python3.11/site-packages/torch/cuda/__init__.py:591" in text
    assert "saved ./runs/x.pt" in text and "~/.cache/torch" in text and "repo ./data" in text
    for private in {str(venv), str(venv.resolve()), str(ROOT), str(copy_dir)}:
        assert private not in text
    outputs = page_outputs.scrub_outputs(
        [{"output_type": "error", "ename": "E", "evalue": f"at {ROOT}/x",
          "traceback": [traceback]}], scrub)
    assert str(ROOT) not in json.dumps(outputs)


def test_display_tags_follow_the_committed_notebook(tmp_path):
    committed = ROOT / "notebooks" / "01_devices.ipynb"
    notebook = load_notebook(committed)
    for cell in notebook["cells"]:
        cell.get("metadata", {}).pop("tags", None)
    page_outputs.sync_display_tags(notebook, committed)
    assert sync_setup_cell.SETUP_TAG in first_code_cell(notebook)["metadata"]["tags"]
    ids = [c["id"] for c in gpu_recordings.gpu_cells(load_notebook(committed))]
    assert [c["id"] for c in gpu_recordings.gpu_cells(notebook)] == ids and ids


# --- the site's offline JavaScript ----------------------------------------------------------

def test_offline_packages_are_pinned_exactly_with_their_checksums():
    for name, (version, integrity, patterns) in offline_assets.PACKAGES.items():
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), name
        assert re.fullmatch(r"sha512-[A-Za-z0-9+/]{86}==", integrity), name
        assert patterns and name in offline_assets.FOLDERS


def test_config_loads_mathjax_and_widgets_from_the_offline_folders():
    from book_files import config
    sphinx = config()["sphinx"]["config"]
    folders = set(offline_assets.FOLDERS.values())
    assert any(sphinx["mathjax_path"].startswith(f + "/") for f in folders)
    for path in sphinx["nb_ipywidgets_js"]:
        assert not re.match(r"\w+://", path), f"{path} would need the internet"
        assert any(path.startswith(f + "/") for f in folders) or (
            ROOT / "book" / "theme" / path).exists(), path


def test_offline_packages_unpack_from_the_cache_with_their_files(tmp_path):
    absent = offline_assets.missing()
    assert not absent, (f"not in {offline_assets.CACHE}: {absent}; `make book` (or "
                        "python -m book.tools assets) fetches them once")
    assert offline_assets.install(tmp_path) == {n: v for n, (v, _, _) in
                                                offline_assets.PACKAGES.items()}
    assert (tmp_path / "offline/mathjax/es5/tex-mml-chtml.js").exists()
    assert (tmp_path / "offline/mathjax/es5/output/chtml/fonts/woff-v2").is_dir()
    assert (tmp_path / "offline/requirejs/require.js").exists()
    assert (tmp_path / "offline/html-manager/dist/embed-amd.js").exists()
    assert list((tmp_path / "offline/html-manager/dist").glob("*.woff2"))


def test_a_tampered_tarball_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setattr(offline_assets, "CACHE", tmp_path)
    name = "requirejs"
    version = offline_assets.PACKAGES[name][0]
    (tmp_path / offline_assets.tarball_name(name, version)).write_bytes(b"not the package")
    assert offline_assets.cached(name) is None
    assert f"{name}@{version}" in offline_assets.missing()


# --- how the build executes the notebooks ---------------------------------------------------

def test_the_chapters_that_run_alone_are_chapters_and_the_others_run_beside_one():
    names = {path.stem for path, _ in CHAPTERS}
    assert build.ALONE < names   # a renamed chapter would silently run beside another
    assert names - build.ALONE   # and some run two at a time


def test_the_lanes_take_the_longest_chapters_first_and_the_second_edition_in_reverse():
    beside = build.beside_order(ROOT / "notebooks")
    assert {path.stem for path in beside} == {path.stem for path, _ in CHAPTERS} - build.ALONE
    starts = [build.launches(path) for path in beside]
    assert starts == sorted(starts, reverse=True) and starts[0] > starts[-1]
    second = build.beside_order(ROOT / "notebooks" / "zh", first=False)
    assert [path.name for path in second] == [path.name for path in reversed(beside)]


def test_the_build_executes_every_notebook_with_the_run_records(monkeypatch, tmp_path):
    seen = {}

    def run(command, **options):
        seen.update(options)
        return subprocess.CompletedProcess(command, 0)
    monkeypatch.setattr(build.subprocess, "run", run)
    monkeypatch.setenv("RUN_RECORDS", "/somewhere/else")   # never the caller's records
    assert build.nbmake(build.EDITIONS["zh"], [Path("08_troubleshooting.ipynb")],
                        tmp_path / "timings.xml") == 0
    assert seen["env"]["RUN_RECORDS"] == str(build.RECORDS)


def test_two_chapters_execute_side_by_side_where_there_are_two_cores(monkeypatch):
    monkeypatch.setattr(build.os, "sched_getaffinity", lambda pid: {0, 3}, raising=False)
    assert build.lanes_for_this_machine() == build.SIDE_BY_SIDE == 2
    monkeypatch.setattr(build.os, "sched_getaffinity", lambda pid: {7}, raising=False)
    assert build.lanes_for_this_machine() == 1   # one core: one chapter at a time


def test_the_timings_of_one_edition_become_one_file_saying_how_each_chapter_ran(tmp_path):
    def junit(path, *names):
        cases = "".join(f'<testcase file="notebooks/{n}.ipynb" name="{n}" time="1.5"/>'
                        for n in names)
        path.write_text(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
        return path
    parts = [("beside", junit(tmp_path / "a.xml", "01_devices")),
             ("alone", junit(tmp_path / "b.xml", "02_tensors_and_models", "07_experiment")),
             ("beside", tmp_path / "never-written.xml")]
    build.merge_timings(parts, tmp_path / "all.xml")
    cases = build.ET.parse(tmp_path / "all.xml").getroot().iter("testcase")
    assert [(case.get("name"), case.get("executed")) for case in cases] == [
        ("01_devices", "beside"), ("02_tensors_and_models", "alone"), ("07_experiment", "alone")]
