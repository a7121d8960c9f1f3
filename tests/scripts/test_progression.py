"""The scripts are a tree: train_single.py -> train_dp.py, and train_single.py -> train_ddp.py ->
train_fast.py / train_fsdp.py. The diff between a script and its parent is the lesson, so it stays
short and marked."""
import ast
import difflib
import io
import re
import tokenize

import pytest

from helpers import SCRIPTS

# (parent, child, mark): every pair a chapter prints, and the mark on each changed line.
PAIRS = [("train_single.py", "train_dp.py", "DP"),    # chapter 4
         ("train_single.py", "train_ddp.py", "DDP"),  # chapter 5
         ("train_ddp.py", "train_fast.py", "FAST"),   # chapter 10
         ("train_ddp.py", "train_fsdp.py", "FSDP")]   # chapter 11
MOST_CHANGED = 40  # code lines added + removed, for every pair
LEVER_FREE = ["train_single.py", "train_dp.py", "train_ddp.py"]


def code_lines(path):
    """The script's lines without its comment lines and blank lines: its docstrings count (the
    chapters print them in the diff), and so does a trailing comment (it carries the mark)."""
    text = path.read_text()
    return [line for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def hunks(before, after):
    """(removed lines, added lines) for each place where the two scripts differ."""
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    return [(before[i1:i2], after[j1:j2])
            for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]


@pytest.mark.parametrize("parent, child, mark", PAIRS)
def test_the_diff_is_short_and_every_change_is_marked(parent, child, mark):
    changes = hunks(code_lines(SCRIPTS / parent), code_lines(SCRIPTS / child))
    changed = sum(len(old) + len(new) for old, new in changes)
    assert 0 < changed <= MOST_CHANGED, f"{parent} -> {child}: {changed} code lines changed"
    for removed, added in changes:
        if removed[:1] and removed[0].startswith('"""'):
            continue  # the docstring's first line: what the script is (it names its topic)
        # a line of the parent is only ever replaced, by a line that says why it changed
        assert added, f"{child} drops lines of {parent} without a marked replacement: {removed}"
        assert any(re.search(rf"#.*\b{mark}\b", line) for line in added), (
            f"a change in {child} is not marked {mark}:\n" + "\n".join(removed + ["---"] + added))


def statement_spans(text):
    """Line number -> (first, last) line of the innermost statement holding it; of a compound
    statement (if, for, with, def), its header only, up to its body."""
    spans = {}
    for node in ast.walk(ast.parse(text)):  # outer statements first: the innermost stays
        if isinstance(node, ast.stmt):
            body = getattr(node, "body", None)
            last = body[0].lineno - 1 if isinstance(body, list) and body else node.end_lineno
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            for line in range(first, last + 1):
                spans[line] = (first, last)
    return spans


def read_lines(text, mark):
    """(the lines that hold code, the lines whose comment carries the mark), read by Python's
    tokenizer: a `#` inside a string is neither a comment nor a mark."""
    code, marked = set(), set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            if re.search(rf"\b{mark}\b", token.string):
                marked.add(token.start[0])
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                                tokenize.ENDMARKER):
            code.update(range(token.start[0], token.end[0] + 1))
    return code, marked


def unmarked_changes(parent_text, child_text, mark):
    """The child's changed code lines (not comments, not the module's docstring) whose
    statement carries the mark on none of its lines: a statement wrapped over two lines is
    marked once. A comment added alone explains a change; it is not one."""
    def code(text):
        lines = text.splitlines()
        return [(number, lines[number - 1]) for number in sorted(read_lines(text, mark)[0])]
    parent, child = code(parent_text), code(child_text)
    marked = read_lines(child_text, mark)[1]
    tree = ast.parse(child_text)
    docstring = tree.body[0].end_lineno if ast.get_docstring(tree) is not None else 0
    spans = statement_spans(child_text)
    matcher = difflib.SequenceMatcher(a=[line for _, line in parent], b=[line for _, line in child],
                                      autojunk=False)
    unmarked = []
    for tag, _, _, first, last in matcher.get_opcodes():
        for number, line in child[first:last] if tag != "equal" else []:
            start, end = spans.get(number, (number, number))
            if number > docstring and not marked & set(range(start, end + 1)):
                unmarked.append(line.strip())
    return unmarked


def test_planted_a_changed_statement_without_its_mark_is_found():
    parent = "x = 1\nsave(x, y)\n"
    marked = "x = 2  # DDP: why\nsave(x,  # DDP\n     y, z)\n"  # wrapped, marked once
    assert unmarked_changes(parent, marked, "DDP") == []
    plain = "x = 2  # DDP: why\nif x:\n    save(x, y, z)\n"  # the `if` is not its body
    assert unmarked_changes(parent, plain, "DDP") == ["if x:", "save(x, y, z)"]
    in_strings = 'x = 2  # DDP: why\nsave(x, "# DDP",\n     """\n# DDP: not a comment\n""")\n'
    assert unmarked_changes(parent, in_strings, "DDP") == [
        'save(x, "# DDP",', '"""', "# DDP: not a comment", '""")']


@pytest.mark.parametrize("parent, child, mark", PAIRS)
def test_every_changed_statement_carries_its_mark(parent, child, mark):
    """The chapters say each change is marked: each statement the diff changes carries the
    mark, on one of its lines."""
    unmarked = unmarked_changes((SCRIPTS / parent).read_text(), (SCRIPTS / child).read_text(), mark)
    assert unmarked == [], f"{child}: changed, not marked {mark}: {unmarked}"


def test_the_marker_is_only_on_changed_lines():
    """A `# DDP` on a line that train_single.py also has would point at nothing."""
    for parent, child, mark in PAIRS:
        parent_lines = set(code_lines(SCRIPTS / parent))
        for line in code_lines(SCRIPTS / child):
            if re.search(rf"#.*\b{mark}\b", line):
                assert line not in parent_lines, f"{child}: {line.strip()}"


@pytest.mark.parametrize("script", LEVER_FREE)
def test_the_lever_free_scripts_show_the_canonical_step(script):
    text = (SCRIPTS / script).read_text()
    for step in (".to(device)", "optimizer.zero_grad()", "model(images)", "F.cross_entropy(",
                 "loss.backward()", "optimizer.step()", "for epoch in range("):
        assert step in text, f"{script} does not show {step}"
    assert "speed" not in re.findall(r"^(?:from|import) (\S+)", text, re.M) and \
        "ddp_scripts.speed" not in text, f"{script} imports chapter 10's options"
    assert "scaler" not in text and "autocast" not in text and "levers" not in text


@pytest.mark.parametrize("script", ["train_fast.py", "train_fsdp.py"])
def test_the_children_keep_the_parents_step(script):
    text = (SCRIPTS / script).read_text()
    for step in ("model(images)", "F.cross_entropy(", "backward()", "step(optimizer)"
                 if script == "train_fast.py" else "optimizer.step()", "for epoch in range("):
        assert step in text, f"{script} does not show {step}"


WIDTH = 100  # columns: the code's width (pyproject.toml), what a phone or a printed page shows
SCRIPT_NAMES = ["train_single.py", "train_dp.py", "train_ddp.py", "train_fast.py", "train_fsdp.py"]


def too_wide(text):
    """(line number, columns) for each line of `text` wider than WIDTH."""
    return [(number, len(line)) for number, line in enumerate(text.splitlines(), 1)
            if len(line) > WIDTH]


def test_planted_a_line_of_101_columns_is_found():
    planted = ("import torch\n"
               + "x = 1  # " + "a" * (WIDTH - 9) + "\n"           # 100 columns: it fits
               + "    y = 2  # " + "b" * (WIDTH - 12) + "\n")     # 101 columns
    assert too_wide(planted) == [(3, WIDTH + 1)]


@pytest.mark.parametrize("script", SCRIPT_NAMES)
def test_every_line_of_a_script_fits_the_page(script):
    """The chapters print the scripts whole and as diffs: a line past 100 columns wraps on a
    phone and runs off a printed page."""
    assert too_wide((SCRIPTS / script).read_text()) == [], f"{script}: (line, columns) past {WIDTH}"


ROOM_SIZE = 300  # lines: a reader opens the module a script imports a name from, and reads it


def ddp_scripts_imports(path):
    """The ddp_scripts modules a file imports: `from ddp_scripts.X import ...` and
    `from ddp_scripts import X` (where X is a module, not a name in __init__.py)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "ddp_scripts":
            found |= {alias.name for alias in node.names if (SCRIPTS / f"{alias.name}.py").exists()}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ddp_scripts."):
            found.add(node.module.removeprefix("ddp_scripts."))
        elif isinstance(node, ast.Import):
            found |= {alias.name.removeprefix("ddp_scripts.") for alias in node.names
                      if alias.name.startswith("ddp_scripts.")}
    return {SCRIPTS / (name.replace(".", "/") + ".py") for name in found}


@pytest.mark.parametrize("script", ["train_single.py", "train_ddp.py", "train_fsdp.py"])
def test_every_module_a_script_reads_from_is_short(script):
    """The plumbing is in rooms named for what they hold (cli, options, devices, data, models,
    out_dir, resume, ranks; sharding and fsdp_out_dir for FSDP): a reader who wants to know how
    a script loads its data opens a short file. Followed through the modules' own imports."""
    seen, todo = set(), ddp_scripts_imports(SCRIPTS / script)
    while todo:
        module = todo.pop()
        assert module.exists(), f"{script} imports {module.name}, which does not exist"
        seen.add(module)
        todo |= ddp_scripts_imports(module) - seen
    assert len(seen) >= 8, sorted(module.name for module in seen)  # the rooms are found
    for module in sorted(seen):
        lines = len(module.read_text().splitlines())
        assert lines <= ROOM_SIZE, f"{module.name} ({script} reads from it) has {lines} lines"
