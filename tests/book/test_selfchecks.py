"""Self-checks (notebooks/selfcheck.py): right answers pass, wrong ones fail, and no student
copy shows an answer, neither written out nor as code that computes it.

The right answers live here, in the tests, and nowhere a student reads them; where the book's
own code can work an answer out (a sampler's indices, a chunk's sizes), it is worked out here
rather than typed in, so a digest that went stale fails.
"""
import ast
import contextlib
import io
import os
import re
import subprocess

import pytest

from book_files import ROOT, SETUP_CELL, cell_source, chapters, load_notebook
from helpers import fresh_venv

from book.tools import student_copies

from notebooks.selfcheck import canonical, check, digest, is_right

CHAPTERS = [path for path, _ in chapters()]


def article_times():
    """The article's four times, from the results file chapter 7 reads them from."""
    import json
    return json.loads((ROOT / "results" / "article" / "titan-xp.json").read_text())["wall_s"]


def right_and_wrong_answers():
    """{digest label: (right answer, a wrong one, places)}; per-machine answers keyed by case."""
    from torch import arange
    from torch.utils.data.distributed import DistributedSampler

    def shares(n, world, rank=None):
        ranks = range(world) if rank is None else [rank]
        return [list(DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=False))
                for r in ranks]

    times = article_times()
    return {
        "ch01-ex-needs-gpu": ({"b", "d"}, {"a", "b", "d"}, None),
        "ch01-ex-try-device": ({"0": ["cpu", "cpu", "cpu"], "1": ["cuda:0", "cpu", "cpu"],
                                "2+": ["cuda:0", "cuda:1", "cpu"]},
                               ["cuda:0", "cuda:1", "cuda:99"], None),
        "ch02-ex-bug": (2, 4, None),
        "ch03-ex-renumber": ((2, 1), (2, 3), None),
        "ch04-ex-chunks": ([len(piece) for piece in arange(5).chunk(4)], [2, 1, 1, 1], None),
        "ch05-ex-sampler": (shares(10, 3, rank=1)[0], [1, 4, 7], None),
        "ch06-ex-rank.world-size": (3 * 8, 8, None),
        "ch06-ex-rank.global-rank": (2 * 8 + 5, 2 * 3 + 5, None),
        "ch07-ex-efficiency": (times["gpu"] / times["ddp"] / 2, times["gpu"] / times["dp"] / 2, 2),
        "ch08-ex-padding": (sum(map(len, shares(1000, 6))) - 1000, 4, None),
        "ch09-ex-accumulation": ((8 * 3 * 2, 3 * 2), (24, 3), None),
        "ch09-ex-uneven": (5 + 1, 5, None),
        # a global batch of 4096 on 8 GPUs of 128 images: micro-batches, all-reduce rounds saved
        "ch10-ex-no-sync": ((4096 // (8 * 128), 4096 // (8 * 128) - 1), (4, 4), None),
        # 7e9 parameters x (weight + gradient + Adam's two moments) x 4 bytes, over 8 GPUs, in GB
        "ch11-ex-fit": (7e9 * (1 + 1 + 2) * 4 / 8 / 1e9, 7e9 * (1 + 1 + 2) * 4 / 1e9, 0),
    }


ANSWERS = right_and_wrong_answers()


# ---------------------------------------------------------------------------------------
# What the notebooks' self-check cells contain
# ---------------------------------------------------------------------------------------
def self_checks(notebook):
    """[(cell index, label, digest or {case: digest}, places)] of every check(...) call."""
    found = []
    for index, cell in enumerate(notebook["cells"]):
        if "self-check" not in cell.get("metadata", {}).get("tags", []):
            continue
        for node in ast.walk(ast.parse(cell_source(cell))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "check":
                expected = ast.literal_eval(node.args[1])
                places = next((ast.literal_eval(k.value) for k in node.keywords
                               if k.arg == "places"), None)
                first = expected if isinstance(expected, str) else next(iter(expected.values()))
                found.append((index, first.split(":", 1)[0], expected, places))
    return found


ALL_CHECKS = [(path, *found) for path in CHAPTERS for found in self_checks(load_notebook(path))]
CHECK_IDS = [label for _, _, label, _, _ in ALL_CHECKS]


def test_every_chapter_has_a_self_check_and_every_check_a_known_answer():
    labels = [label for _, _, label, _, _ in ALL_CHECKS]
    without = [p.name for p in CHAPTERS if not self_checks(load_notebook(p))]
    assert not without, f"chapters without a self-check: {without}"
    assert len(labels) == len(set(labels)), f"a digest label used twice: {labels}"
    assert sorted(labels) == sorted(ANSWERS), (
        "tests/book/test_selfchecks.py must know the answer of every self-check: "
        f"unknown {sorted(set(labels) - set(ANSWERS))}, gone {sorted(set(ANSWERS) - set(labels))}")


def printed_by_check(*args, **kwargs):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        check(*args, **kwargs)
    return out.getvalue()


@pytest.mark.parametrize("path, index, label, expected, places", ALL_CHECKS, ids=CHECK_IDS)
def test_the_right_answer_passes_and_a_wrong_one_fails(path, index, label, expected, places):
    right, wrong, known_places = ANSWERS[label]
    assert places == known_places, f"{label}: compared to {places} places, expected {known_places}"
    cases = expected if isinstance(expected, dict) else {None: expected}
    rights = right if isinstance(expected, dict) else {None: right}
    assert set(rights) == set(cases), f"{label}: cases {sorted(cases)}"
    for case, digest_ in cases.items():
        assert is_right(rights[case], digest_, places), f"{label} ({case}): the right answer fails"
        assert not is_right(wrong, digest_, places), f"{label} ({case}): a wrong answer passes"
        shown = printed_by_check(rights[case], expected, case=case, places=places)
        assert shown.endswith("right.\n"), shown
        shown = printed_by_check(wrong, expected, hint="a hint", case=case, places=places)
        assert "not quite" in shown and "a hint" in shown, shown
        assert canonical(rights[case], places) not in shown
    assert "Not answered yet" in printed_by_check(None, expected, case=next(iter(cases)))


def test_digests_are_salted_with_the_label_and_ignore_order_and_type():
    assert digest("ch01-a", {"b", "d"}) == digest("ch01-a", {"d", "b"})
    assert digest("ch01-a", (2, 1)) == digest("ch01-a", [2, 1])
    assert digest("ch01-a", 24) == digest("ch01-a", 24.0)
    assert digest("ch01-a", 2) != digest("ch01-b", 2)  # the same answer, another exercise
    assert digest("ch01-a", 2) != digest("ch01-a", 3)
    assert is_right(0.8749, digest("x", 0.875, 2), places=2)
    assert not is_right(0.86, digest("x", 0.875, 2), places=2)


# ---------------------------------------------------------------------------------------
# No answer in a student copy
# ---------------------------------------------------------------------------------------
OPERATORS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
             ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b,
             ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
             ast.Pow: lambda a, b: a ** b}


def visible_value(node):
    """The value a reader sees in `node` without running anything: a constant, a literal
    container of them, or arithmetic on them (`3 * 8`). ValueError for anything else."""
    if isinstance(node, ast.Constant) and node.value is not None:
        return node.value
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = [visible_value(item) for item in node.elts]
        return set(items) if isinstance(node, ast.Set) else list(items)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -visible_value(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left, right = visible_value(node.left), visible_value(node.right)
        if isinstance(left, (int, float)) and isinstance(right, (int, float)):
            return OPERATORS[type(node.op)](left, right)
    raise ValueError("not visible without running the code")


def visible_values(code):
    values = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.expr):
            try:
                values.append(visible_value(node))
            except (ValueError, TypeError, ZeroDivisionError, OverflowError):
                pass
    return values


def written_forms(answer, places):
    """How an answer could be written out in prose or code (for answers longer than a digit)."""
    if isinstance(answer, float):
        return {f"{answer:.{places or 3}f}", f"{answer:.3f}", f"{answer:.{places or 2}%}"}
    if isinstance(answer, (set, list, tuple)):
        items = sorted(answer) if isinstance(answer, set) else list(answer)
        forms = set()
        for quote in ("'", '"'):
            inner = ", ".join(f"{quote}{i}{quote}" if isinstance(i, str) else str(i)
                              for i in items)
            forms |= {f"{{{inner}}}", f"[{inner}]", f"({inner})"}
        return forms
    return set()


def leaks(answer, places, code_cells, text):
    """Where `answer` shows: a visible value in the exercise's code, a written form anywhere."""
    found = []
    for code in code_cells:
        for value in visible_values(code):
            try:
                if canonical(value, places) == canonical(answer, places):
                    found.append(f"the value {value!r} in the code")
            except TypeError:
                pass
    found += [f"{form!r} in the text" for form in written_forms(answer, places) if form in text]
    return found


def test_the_leak_finder_finds_the_answers_the_chapters_used_to_show():
    """The forms the self-checks had before they were hashed are all found."""
    assert leaks({"b", "d"}, None, ['if needs_gpu == {"b", "d"}:\n    print("Right")'], "")
    assert leaks(24, None, ["right = (world_size == 3 * 8, global_rank == 2 * 8 + 5)"], "")
    assert leaks(21, None, ["right = (world_size == 3 * 8, global_rank == 2 * 8 + 5)"], "")
    assert leaks((2, 1), None, ["ok = (count, physical) == (2, 1)"], "")
    assert leaks([1, 4, 7, 0], None, [], "Rank 1 gets `[1, 4, 7, 0]`.")
    assert leaks(0.8203, 2, [], "Right: 0.820.")
    assert not leaks(2, None, ['check(wrong_line, "ch02-ex-bug:8fa23a077f6b1cc2")'], "")


@pytest.fixture(scope="module")
def handout(tmp_path_factory):
    out = tmp_path_factory.mktemp("student")
    student_copies.write_copies(CHAPTERS, out)
    return out


@pytest.mark.parametrize("path, index, label, expected, places", ALL_CHECKS, ids=CHECK_IDS)
def test_student_copy_shows_no_answer(handout, path, index, label, expected, places):
    copy = load_notebook(handout / "notebooks" / path.name)
    cells = copy["cells"]
    at = next(i for i, c in enumerate(cells)
              if cell_source(c) == cell_source(load_notebook(path)["cells"][index]))
    question = max(i for i in range(at) if cells[i]["cell_type"] == "markdown")
    code = [cell_source(c) for c in cells[question:at + 1] if c["cell_type"] == "code"]
    text = "\n".join(cell_source(c) for c in cells)
    right = ANSWERS[label][0]
    for answer in (right.values() if isinstance(right, dict) else [right]):
        found = leaks(answer, places, code, text)
        assert not found, f"{path.name}, {label}: the student copy shows the answer: {found}"


def test_student_copy_imports_the_self_checks_from_its_own_folder(handout, tmp_path):
    """In a student's own Python, where the book is not installed, the set-up cell, run in the
    copy's notebooks/, installs the copy and imports notebooks.selfcheck from there."""
    code = (SETUP_CELL.read_text() + "\nimport notebooks.selfcheck as s\n"
            "print(s.__file__)\ns.check(None, 'x:0')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    result = subprocess.run([str(fresh_venv(tmp_path / "venv")), "-c", code],
                            cwd=handout / "notebooks", env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    where, message = result.stdout.splitlines()[:2]
    assert where == str(handout / "notebooks" / "selfcheck.py")
    assert message.startswith("Not answered yet")


def test_the_command_line_prints_the_digest_a_check_compares_with(capsys):
    from notebooks.selfcheck import main
    assert main(["ch06-ex-rank.world-size", "24"]) == 0
    assert capsys.readouterr().out.strip() == digest("ch06-ex-rank.world-size", 24)
    assert main(["ch07-ex-efficiency", "0.8203", "2"]) == 0
    assert is_right(0.82, capsys.readouterr().out.strip(), places=2)
    assert main(["only-a-label"]) == 2


# ---------------------------------------------------------------------------------------
# The hints in the reader's language
# ---------------------------------------------------------------------------------------
def chapter_hints():
    """{label: the chapter's hint as written, an f-string's fields as {name}}."""
    hints = {}
    for path in CHAPTERS:
        for cell in load_notebook(path)["cells"]:
            if "self-check" not in cell.get("metadata", {}).get("tags", []):
                continue
            for node in ast.walk(ast.parse(cell_source(cell))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "check":
                    expected = ast.literal_eval(node.args[1])
                    first = expected if isinstance(expected, str) else next(iter(expected.values()))
                    value = next((k.value for k in node.keywords if k.arg == "hint"), None)
                    if isinstance(value, ast.JoinedStr):
                        text = "".join(part.value if isinstance(part, ast.Constant)
                                       else "{" + ast.unparse(part.value) + "}" for part in value.values)
                    else:
                        text = ast.literal_eval(value) if value is not None else ""
                    hints[first.split(":", 1)[0]] = text
    return hints


def test_every_hint_has_its_chinese_translation_of_the_english_as_it_is_now():
    import json
    from notebooks import selfcheck
    table = json.loads(selfcheck.HINTS_ZH.read_text(encoding="utf-8"))
    hints = chapter_hints()
    assert sorted(hints) == sorted(table), "notebooks/selfcheck_zh.json: labels differ from the chapters'"
    changed = {label: (hints[label], table[label]["en"]) for label in hints
               if hints[label] != table[label]["en"]}
    assert not changed, f"English hints changed since translated (chapter, table): {changed}"
    assert all(re.search(r"[\u4e00-\u9fff]", entry["zh"]) for entry in table.values())


def test_the_chinese_notebooks_say_it_in_chinese_with_the_english_hint_s_values(monkeypatch, tmp_path):
    from notebooks import selfcheck
    monkeypatch.delenv("BOOK_LANGUAGE", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    assert selfcheck.language() == "en"
    (tmp_path / "zh").mkdir()
    monkeypatch.chdir(tmp_path / "zh")   # where Jupyter starts a notebooks/zh/ notebook's kernel
    assert selfcheck.language() == "zh"
    hint = "try_device(0), (1) and (99) on a machine with 3 GPU(s): which exist?"
    shown = printed_by_check("wrong", digest("ch01-ex-try-device", "right"), hint=hint, name="devices")
    assert shown == "devices：还不对。在有 3 块 GPU 的机器上调用 try_device(0)、(1) 和 (99)：哪些设备存在？\n"
    assert "正确" in printed_by_check("right", digest("ch01-ex-try-device", "right"))
    monkeypatch.setenv("BOOK_LANGUAGE", "en")   # the reader's choice wins
    assert "not quite" in printed_by_check("wrong", digest("ch01-ex-try-device", "right"), hint=hint)
