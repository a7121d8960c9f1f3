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


def planted_grading(tmp_path, change=None, log=None):
    """The worked example's premises on a copy of results/ whose file (change) or log was changed."""
    root = copy_of_results(tmp_path)
    if change:
        edit_json(root / recorded.GRADING, change)
    if log:
        path = root / recorded.GRADING_LOG
        path.write_text(log(path.read_text(encoding="utf-8")), encoding="utf-8")
    return recorded.grading_premises(root)


def test_the_log_gives_each_configurations_train_loss_epoch_by_epoch():
    losses = recorded.train_losses(ROOT)
    assert set(losses) == {"cpu", "ddp"} and len(losses["cpu"]) == 2 and len(losses["cpu"][0]) == 3
    assert recorded.FACTS["grading.loss.ddp"](ROOT).count(", ") == 2


def test_planted_a_ddp_loss_that_differs_breaks_the_same_training(tmp_path):
    def changed(text):   # the second "2.3002" is DDP's second epoch in round 1
        first = text.index("train_loss=2.3002")
        at = text.index("train_loss=2.3002", first + 1)
        return text[:at] + "train_loss=2.3010" + text[at + len("train_loss=2.3002"):]
    assert planted_grading(tmp_path, log=changed) == ["the feedback: the same train loss, epoch by epoch"]


def test_planted_an_accuracy_above_chance_breaks_chance_level(tmp_path):
    def learned(data):
        for config in ("cpu", "ddp"):
            recorded.run_of(data, config)["test_accuracy"] = 0.75
    assert planted_grading(tmp_path, learned) == ["the feedback: test accuracy at chance level"]


def test_planted_a_full_size_run_breaks_the_smoke_size_in_the_grade(tmp_path):
    assert planted_grading(tmp_path, lambda data: data.update(size="full")) == [
        "It works 1: the smoke size, not the full size asked"]


def test_planted_one_thread_in_the_one_process_breaks_both_cores_too(tmp_path):
    def one_thread(data):
        recorded.run_of(data, "cpu")["threads_per_process"] = 1
    assert planted_grading(tmp_path, one_thread) == ["Explanation 0: the one process had both cores too"]


def test_planted_four_cores_break_on_two_cores(tmp_path):
    def four_cores(data):
        data["hardware"]["cpu"]["usable_cores"] = 4
        recorded.run_of(data, "cpu")["threads_per_process"] = 4
    assert planted_grading(tmp_path, four_cores) == ["Explanation 0: on two cores, both used by the one process"]


LOSSES = "the feedback: the log gives each configuration's train loss, cpu's and ddp's"


def test_planted_a_log_without_train_losses_breaks_the_loss_facts(tmp_path):
    assert planted_grading(tmp_path, log=lambda text: text.replace("train_loss=", "loss=")) == [LOSSES]


def test_planted_a_log_without_ddp_rounds_is_one_premise_not_a_key_error(tmp_path):
    def no_ddp(text):
        return re.sub(r"(\[benchmark\] round \d+/\d+, )ddp:", r"\1cpu:", text)
    assert planted_grading(tmp_path, log=no_ddp) == [LOSSES]


def test_planted_one_round_without_train_losses_breaks_the_loss_facts(tmp_path):
    def one_round_empty(text):   # the log's last round prints no epoch
        at = text.rindex("[benchmark] round")
        return text[:at] + text[at:].replace("train_loss=", "loss=")
    assert planted_grading(tmp_path, log=one_round_empty) == [LOSSES]


def test_right_case_the_reference_outputs_words_hold_for_the_files_committed():
    assert recorded.reference_premises(ROOT) == []


def test_planted_ddp_accuracy_apart_breaks_the_same_training_to_rounding(tmp_path):
    root = copy_of_results(tmp_path)

    def apart(data):
        recorded.run_of(data, "ddp")["test_accuracy"] -= 0.02
    edit_json(root / recorded.CPU_2CORE, apart)
    assert recorded.reference_premises(root) == ["3: the same training, to float32 rounding"]


def test_planted_a_gpu_twice_as_fast_breaks_only(tmp_path):
    root = copy_of_results(tmp_path)

    def faster(data):
        recorded.run_of(data, "gpu")["samples_per_s"] = 2 * recorded.run_of(data, "cpu")["samples_per_s"]
    edit_json(root / recorded.H200 / "h200-full.json", faster)
    assert recorded.reference_premises(root) == ["4: only a little faster (below 2 times)"]
