"""The reference pages' numbers (book/grading.md, book/summaries.md and their Chinese twins) are
read from results/ by book/extensions/recorded.py: every one the pages name exists, each follows
its file, and the worked example's grades hold for the run it grades."""
import json
import re
import shutil

import pytest

from book.extensions import recorded
from book_files import ROOT

PAGES = ["book/grading.md", "book/summaries.md", "book/zh/grading.md", "book/zh/summaries.md"]
ROLE = re.compile(r"\{recorded\}`([^`]+)`")
TABLE = re.compile(r"```\{benchmark-table\} (\S+)")
OUTPUT = re.compile(r"```\{recorded-output\} (\S+) (\S+)")


def copy_of_results(tmp_path):
    shutil.copytree(ROOT / "results", tmp_path / "results")
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks",
                    ignore=shutil.ignore_patterns("zh", "__pycache__"))
    return tmp_path


def edit_json(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def unknown_names(text):
    return [name for name in ROLE.findall(text) if name not in recorded.FACTS]


@pytest.mark.parametrize("page", PAGES)
def test_right_case_every_number_named_on_a_page_is_read_from_a_file(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    assert ROLE.findall(text), page
    assert not unknown_names(text)
    for name in ROLE.findall(text):
        assert recorded.FACTS[name](ROOT)
    for path in TABLE.findall(text):
        assert recorded.benchmark_rows(ROOT, path)[1]
    for notebook, cell in OUTPUT.findall(text):
        assert all(note for _, note in recorded.recorded_output(ROOT, notebook, cell))


def test_planted_a_name_no_fact_answers_is_found():
    assert unknown_names("{recorded}`grading.ddp.samples` and {recorded}`grading.nothing`") == \
        ["grading.nothing"]


def test_the_two_editions_show_the_same_numbers():
    for english in ("grading.md", "summaries.md"):
        names = ROLE.findall((ROOT / "book" / english).read_text(encoding="utf-8"))
        chinese = ROLE.findall((ROOT / "book" / "zh" / english).read_text(encoding="utf-8"))
        assert sorted(names) == sorted(chinese)


def test_planted_a_changed_run_changes_the_page(tmp_path):
    root = copy_of_results(tmp_path)
    before = {name: fact(root) for name, fact in recorded.FACTS.items()}

    def faster(data):
        recorded.run_of(data, "ddp")["samples_per_s"] *= 2
    edit_json(root / recorded.GRADING, faster)
    edit_json(root / recorded.ARTICLE, lambda data: data["wall_s"].update(ddp=30.0))
    micro = root / recorded.H200 / "micro.txt"
    micro.write_text(micro.read_text().replace("223173", "335000"))
    exits = root / recorded.EXITS
    exits.write_text(exits.read_text().replace('"hung": 3', '"hung": 4', 1))
    after = {name: fact(root) for name, fact in recorded.FACTS.items()}
    changed = {name for name in before if before[name] != after[name]}
    assert {"grading.ddp.samples", "grading.ddp-over-cpu", "article.ddp", "article.dp-over-ddp",
            "h200.micro.b512", "exits.after.hung"} <= changed
    assert "grading.cpu.samples" not in changed


def test_planted_a_missing_file_fails_the_fact(tmp_path):
    root = copy_of_results(tmp_path)
    (root / recorded.ARTICLE).unlink()
    with pytest.raises(FileNotFoundError):
        recorded.FACTS["article.dp"](root)


def test_right_case_the_worked_example_grades_the_run_committed():
    assert recorded.grading_premises(ROOT) == []


def test_planted_a_reliable_run_contradicts_the_grades(tmp_path):
    root = copy_of_results(tmp_path)

    def reliable(data):
        for run in data["runs"]:
            run["reliable"] = True
    edit_json(root / recorded.GRADING, reliable)
    assert recorded.grading_premises(root) == ["Explanation 0: the file marks both rows unreliable"]


def test_planted_a_reliable_row_is_shown_measured(tmp_path):
    root = copy_of_results(tmp_path)
    status = {row[0]: row[-1] for row in recorded.benchmark_rows(root, recorded.GRADING)[1]}
    assert status["ddp"] == "unreliable" and status["gpu"].startswith("skipped")

    def reliable(data):
        for run in data["runs"]:
            run["reliable"] = True
    edit_json(root / recorded.GRADING, reliable)
    status = {row[0]: row[-1] for row in recorded.benchmark_rows(root, recorded.GRADING, "zh")[1]}
    assert status["ddp"] == "已测"


def test_planted_changed_code_marks_a_recording_stale(tmp_path):
    root = copy_of_results(tmp_path)
    path = root / "notebooks" / "01_devices.ipynb"
    notebook = json.loads(path.read_text())
    cell = next(cell for cell in notebook["cells"] if cell.get("id") == "ch01-02")
    cells = json.loads((root / recorded.H200 / "cells.json").read_text())
    # the recording made from exactly this code: current
    cells["01_devices.ipynb"]["ch01-02"]["source_sha256"] = recorded_hash(cell)
    (root / recorded.H200 / "cells.json").write_text(json.dumps(cells))
    [(text, note)] = recorded.recorded_output(root, "01_devices.ipynb", "ch01-02")
    assert text and "changed since" not in note
    cell["source"] = "".join(cell["source"]) + "\nprint('one more line')"
    path.write_text(json.dumps(notebook))
    [(_, note)] = recorded.recorded_output(root, "01_devices.ipynb", "ch01-02")
    assert "changed since" in note


def recorded_hash(cell):
    from book.tools.gpu_recordings import source_hash
    return source_hash("".join(cell["source"]))
