"""The committed sources of the book: table of contents, notebooks, set-up cell, exercises."""
import ast
import os
import re
import stat
import subprocess
import sys
import textwrap

import pytest
from markdown_it import MarkdownIt
from mdit_py_plugins.colon_fence import colon_fence_plugin

from book_files import (ROOT, SETUP_CELL, cell_source, chapter_id, chapters, config,
                        first_code_cell, load_notebook, source_path, toc_entries)


CHAPTERS = chapters()
CHAPTER_IDS = [path.stem for path, _ in CHAPTERS]

# The block parser MyST uses for fences and colon fences.
PARSER = MarkdownIt("commonmark").use(colon_fence_plugin)


def fence_problems(markdown):
    """Directive fences closed early by a fence inside them, as messages (empty: none).

    ```{solution} ... ```python ... ``` ... ``` ends at the inner closing fence: the rest of
    the answer falls outside the solution, visible. The fence around must be longer
    (````{solution}) or use colons (:::{solution}, with myst's colon_fence).
    """
    problems = []
    for token in PARSER.parse(markdown):
        match = re.match(r"\s*\{([\w-]+)\}", token.info or "")
        if token.type not in ("fence", "colon_fence") or token.map is None or not match:
            continue
        name, char, length = match.group(1), token.markup[0], len(token.markup)
        for offset, line in enumerate(token.content.splitlines(), start=1):
            inner = re.match(r" {0,3}(`{3,}|~{3,}|:{3,})", line)
            if inner and inner.group(1)[0] == char and len(inner.group(1)) >= length:
                problems.append(f"the {{{name}}} block at line {token.map[0] + 1} is closed "
                                f"early by the fence at line {token.map[0] + 1 + offset}: "
                                f"open it with a longer fence ({char * (length + 1)}{{{name}}})")
                break
    return problems



def test_readme_gives_the_two_commands_and_ci_runs_the_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make book" in readme and "make test" in readme
    commands = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert commands[-1] == "make test", f".ci/run must end with `make test`, not {commands[-1]!r}"


def test_every_toc_entry_has_a_source_file():
    missing = [entry for entry, _ in toc_entries() if not source_path(entry).exists()]
    assert not missing, f"in _toc.yml but not in the repository: {missing}"


def test_every_notebook_is_in_the_toc():
    listed = {path for path, _ in CHAPTERS}
    orphans = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb") if p not in listed)
    assert not orphans, f"notebooks missing from _toc.yml (the book would not show them): {orphans}"


def test_toc_numbers_the_chapters_in_file_order():
    assert [number for _, number in CHAPTERS] == [chapter_id(p) for p, _ in CHAPTERS]


@pytest.fixture(params=CHAPTERS, ids=CHAPTER_IDS)
def chapter(request):
    path, number = request.param
    if not path.exists():
        pytest.fail(f"{path.relative_to(ROOT)} is listed in _toc.yml but does not exist",
                    pytrace=False)
    return path, number, load_notebook(path)


def test_notebook_is_committed_without_outputs_or_widget_state(chapter):
    path, _, notebook = chapter
    dirty = [i for i, cell in enumerate(notebook["cells"]) if cell["cell_type"] == "code"
             and (cell.get("outputs") or cell.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: code cells {dirty} have outputs or execution counts"
    assert "widgets" not in notebook.get("metadata", {}), f"{path.name} holds widget state"


def test_notebook_uses_the_python3_kernel(chapter):
    path, _, notebook = chapter
    kernel = notebook.get("metadata", {}).get("kernelspec", {})
    assert (kernel.get("name"), kernel.get("language")) == ("python3", "python"), path.name


def test_title_carries_the_chapter_number_of_the_toc(chapter):
    path, number, notebook = chapter
    first = notebook["cells"][0]
    assert first["cell_type"] == "markdown", f"{path.name}: the first cell must be the title"
    title = cell_source(first).lstrip().splitlines()[0]
    assert re.match(rf"# {number}\. \S", title), (
        f"{path.name}: title {title!r} should start with '# {number}. ' (its place in _toc.yml)")
    titles = [token for cell in notebook["cells"] if cell["cell_type"] == "markdown"
              for token in PARSER.parse(cell_source(cell))
              if token.type == "heading_open" and token.tag == "h1"]
    assert len(titles) == 1, f"{path.name}: one '#' title only, then '##' sections"


def test_first_code_cell_is_the_setup_cell(chapter):
    path, _, notebook = chapter
    cell = first_code_cell(notebook)
    assert cell is not None and cell_source(cell).rstrip("\n") == SETUP_CELL.read_text().rstrip(
        "\n"), (f"{path.name}: the first code cell differs from book/tools/setup_cell.py "
                "(python -m book.tools setup-cell copies it in)")


def test_chapter_ends_with_summary_and_exercises(chapter):
    path, _, notebook = chapter
    text = "\n".join(cell_source(c) for c in notebook["cells"] if c["cell_type"] == "markdown")
    sections = re.findall(r"^## (.+?)\s*$", text, flags=re.M)
    assert "Summary" in sections and "Exercises" in sections, f"{path.name}: {sections}"


def directive_blocks(notebook, name):
    """(cell index, argument line, body) of every ```{name} block in the markdown cells."""
    found = []
    pattern = re.compile(rf"^(?P<fence>`{{3,}}|:{{3,}})\{{{name}\}}[ \t]*(?P<arg>.*)$\n"
                         rf"(?P<body>(?:.*\n)*?)(?P=fence)\s*$", re.M)
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] == "markdown":
            found += [(index, m.group("arg").strip(), m.group("body"))
                      for m in pattern.finditer(cell_source(cell) + "\n")]
    return found


def test_exercises_have_labelled_collapsed_solutions(chapter):
    path, number, notebook = chapter
    exercises = directive_blocks(notebook, "exercise")
    assert exercises, f"{path.name} has no {{exercise}}"
    labels = [re.search(r"^:label:\s*(\S+)", body, re.M) for _, _, body in exercises]
    assert all(labels), f"{path.name}: every exercise needs a :label:"
    labels = [m.group(1) for m in labels]
    prefix = f"ch{number:02d}-"
    assert all(label.startswith(prefix) for label in labels), (
        f"{path.name}: labels must start with {prefix}: {labels}")
    solutions = directive_blocks(notebook, "solution")
    for _, target, body in solutions:
        assert target in labels, f"{path.name}: solution to unknown exercise {target!r}"
        assert re.search(r"^:class:\s*dropdown\s*$", body, re.M), (
            f"{path.name}: the solution to {target} must be collapsed (:class: dropdown)")
    tagged = [c for c in notebook["cells"] if "solution" in c.get("metadata", {}).get("tags", [])]
    assert solutions or tagged, f"{path.name}: no solution at all"
    assert not any("{solution-start}" in cell_source(c) for c in notebook["cells"]), (
        f"{path.name}: gated solutions ({{solution-start}}) crash sphinx-exercise 1.2; "
        "use {solution} with :class: dropdown")


def test_directive_fences_are_nested_correctly(chapter):
    path, _, notebook = chapter
    problems = [f"cell {i}: {problem}" for i, cell in enumerate(notebook["cells"])
                if cell["cell_type"] == "markdown" for problem in fence_problems(cell_source(cell))]
    assert not problems, f"{path.name}: " + "; ".join(problems)


def tags(cell):
    return cell.get("metadata", {}).get("tags", [])


def exercise_shape_problems(notebook):
    """What departs from the one shape of an exercise (book/instructor-guide.md, "Exercises and self-checks"):

    1. a markdown cell that ends with one {exercise} block (prose only before the first);
    2. for an exercise with a value to check: a code cell tagged `answer` where the student
       writes it, then a code cell tagged `self-check` that calls notebooks.selfcheck.check
       and compares nothing itself (no `==`, no answer in sight);
    3. a markdown cell that is one {solution} block for that exercise, collapsed.
    Solutions are never code cells: a student copy drops the {solution} blocks, and nothing
    after them can depend on them.
    """
    cells, problems = notebook["cells"], []
    for index, cell in enumerate(cells):
        if "solution" in tags(cell):
            problems.append(f"cell {index} is tagged 'solution': write solutions as "
                            "{solution} blocks in markdown")
    starts = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
              and directive_blocks({"cells": [c]}, "exercise")]
    if not starts:
        return problems + ["no {exercise}"]
    index = starts[0]
    while index < len(cells):
        cell = cells[index]
        exercises = directive_blocks({"cells": [cell]}, "exercise")
        if cell["cell_type"] != "markdown" or len(exercises) != 1:
            problems.append(f"cell {index}: expected one {{exercise}} in a markdown cell")
            break
        source = cell_source(cell).rstrip()
        if not re.search(r"^(`{3,}|:{3,})\s*$", source.splitlines()[-1]) or (
                index != starts[0] and not re.match(r"(`{3,}|:{3,})\{exercise\}", source)):
            problems.append(f"cell {index}: the {{exercise}} block must be the whole cell "
                            "(the first may follow the section's prose)")
        label = re.search(r"^:label:\s*(\S+)", exercises[0][2], re.M)
        label = label.group(1) if label else None
        if "`" in exercises[0][1]:  # seen with sphinx-exercise 1.x: the build then fails
            problems.append(f"{label}: no code in an exercise's title; sphinx-exercise "
                            "leaves its label undefined")
        index += 1
        kinds = []
        while index < len(cells) and cells[index]["cell_type"] == "code":
            kinds.append((index, [t for t in tags(cells[index]) if t in ("answer", "self-check")]))
            index += 1
        if [k for _, k in kinds] not in ([], [["answer"], ["self-check"]]):
            problems.append(f"{label}: between the exercise and its solution, either nothing "
                            "or an `answer` cell then a `self-check` cell; found "
                            f"{[k for _, k in kinds]} in cells {[i for i, _ in kinds]}")
        for at, kind in kinds:
            if kind == ["self-check"]:
                code = cell_source(cells[at])
                tree = ast.parse(code)
                calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                         and getattr(n.func, "id", None) == "check"]
                compares = [n for n in ast.walk(tree) if isinstance(n, ast.Compare)
                            and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in n.ops)]
                if "from notebooks.selfcheck import check" not in code or not calls:
                    problems.append(f"{label}: the self-check (cell {at}) must call "
                                    "check() from notebooks.selfcheck")
                if compares:
                    problems.append(f"{label}: the self-check (cell {at}) compares with == "
                                    "itself: the compared value is an answer in plain view")
        solutions = (directive_blocks({"cells": [cells[index]]}, "solution")
                     if index < len(cells) and cells[index]["cell_type"] == "markdown" else [])
        if len(solutions) != 1 or solutions[0][1] != label:
            problems.append(f"{label}: cell {index} should be its {{solution}}, alone")
            break
        if cell_source(cells[index]).strip().splitlines()[-1].strip("`:") != "" or not \
                re.match(r"(`{3,}|:{3,})\{solution\}", cell_source(cells[index]).strip()):
            problems.append(f"{label}: the {{solution}} block must be the whole cell {index}")
        index += 1
    return problems


def test_exercises_have_the_one_shape(chapter):
    path, _, notebook = chapter
    problems = exercise_shape_problems(notebook)
    assert not problems, f"{path.name}: " + "; ".join(problems)


def shaped(*cells):
    """A notebook of (kind, source, tags) cells, for the tests of the shape check itself."""
    return {"cells": [{"cell_type": kind, "source": source, "metadata": {"tags": list(tags)}}
                      for kind, source, tags in cells]}


EXERCISE = ("markdown", "## Exercises\n\n```{exercise} Q\n:label: ch09-q\nAsk.\n```", ())
ANSWER = ("code", "answer = None", ("answer",))
CHECK = ("code", 'from notebooks.selfcheck import check\ncheck(answer, "ch09-q:00")', ("self-check",))
SOLUTION = ("markdown", "```{solution} ch09-q\n:class: dropdown\nTell.\n```", ())


def test_the_shape_check_accepts_the_shape_and_finds_each_departure():
    assert exercise_shape_problems(shaped(EXERCISE, ANSWER, CHECK, SOLUTION)) == []
    assert exercise_shape_problems(shaped(EXERCISE, SOLUTION)) == []
    departures = {
        "solution before the answer": shaped(EXERCISE, SOLUTION, ANSWER, CHECK),
        "check without an answer cell": shaped(EXERCISE, CHECK, SOLUTION),
        "answer after the check": shaped(EXERCISE, CHECK, ANSWER, SOLUTION),
        "an untagged code cell": shaped(EXERCISE, ("code", "x = 1", ()), SOLUTION),
        "a solution as a code cell": shaped(EXERCISE, ("code", "print(2)", ("solution",))),
        "a check in plain view": shaped(EXERCISE, ANSWER, (
            "code", "from notebooks.selfcheck import check\ncheck(answer, 'x')\n"
                    "print(answer == 2)", ("self-check",)), SOLUTION),
        "a check without check()": shaped(EXERCISE, ANSWER, ("code", "print(answer)",
                                                             ("self-check",)), SOLUTION),
        "two exercises in one cell": shaped(
            ("markdown", EXERCISE[1] + "\n\n" + EXERCISE[1].split("\n\n", 1)[1], ()), SOLUTION),
        "the solution shares its cell": shaped(
            EXERCISE, ("markdown", SOLUTION[1] + "\n\nMore prose.", ())),
        "a solution to another exercise": shaped(
            EXERCISE, ("markdown", SOLUTION[1].replace("ch09-q", "ch09-r"), ())),
        "no exercise at all": shaped(("markdown", "## Exercises", ())),
        "code in a title": shaped(("markdown", EXERCISE[1].replace("} Q", "} `Q`"), ()),
                                  SOLUTION),
    }
    for name, notebook in departures.items():
        assert exercise_shape_problems(notebook), f"not found: {name}"


def test_instructor_guide_lists_the_chapter_with_its_own_time(chapter):
    path, _, notebook = chapter
    stated = re.search(r"\*\*Estimated time\.\*\*\D*(\d+) min", cell_source(notebook["cells"][0]))
    assert stated, f"{path.name}: the first cell should give '**Estimated time.** N minutes'"
    guide = (ROOT / "book" / "instructor-guide.md").read_text()
    row = re.search(rf"^\| {{doc}}`../notebooks/{path.stem}` \|.*?\| (\d+) min \|", guide, re.M)
    assert row, f"book/instructor-guide.md has no row for {path.stem}"
    assert row.group(1) == stated.group(1), (
        f"instructor guide says {row.group(1)} min for {path.stem}, the chapter {stated.group(1)}")


# ---------------------------------------------------------------------------------------
# The set-up cell: finds the companion scripts, or fetches them from the repository
# ---------------------------------------------------------------------------------------
def test_setup_cell_names_the_repository_of_the_config():
    match = re.search(r'^REPOSITORY = "([^"]+)"$', SETUP_CELL.read_text(), re.M)
    assert match, "setup_cell.py must define REPOSITORY = \"...\""
    assert match.group(1) == config()["repository"]["url"]


def test_repository_address_written_in_the_docs_is_the_configured_one():
    """Clone commands in the README and the front matter name the repository of _config.yml."""
    url = config()["repository"]["url"].rstrip("/")
    docs = [ROOT / "README.md", *sorted((ROOT / "book").glob("*.md"))]
    others = {f"{doc.name}: {found}" for doc in docs
              for found in re.findall(r"https://github\.com/[\w.-]+/[\w.-]+", doc.read_text())
              if found.rstrip(".") != url}
    assert not others, f"the repository is {url}; the docs also name {sorted(others)}"


def fake_git(bin_dir, log, clone_works, hangs=False):
    """A `git` that logs its arguments and 'clones' by creating ddp_scripts/common.py; or
    fails; or never answers (a clone stalled on a slow network)."""
    bin_dir.mkdir()
    script = bin_dir / "git"
    body = textwrap.dedent(f"""\
        #!{sys.executable}
        import pathlib, sys, time
        with open({str(log)!r}, "a") as f:
            f.write(" ".join(sys.argv[1:]) + "\\n")
        target = pathlib.Path(sys.argv[-1])
        target.mkdir(parents=True)   # git makes the folder before it fetches anything
        if {hangs!r}:
            time.sleep(3600)
        if not {clone_works!r}:
            print("fatal: unable to access the repository", file=sys.stderr)
            sys.exit(128)
        (target / "ddp_scripts").mkdir()
        (target / "ddp_scripts" / "common.py").write_text("")
        """)
    script.write_text(body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def run_setup_cell(cwd, bin_dir, **environment):
    code = SETUP_CELL.read_text() + "\nprint('ROOT=' + str(ROOT))\nprint('RUNS=' + str(RUNS))\n"
    env = {key: value for key, value in os.environ.items() if not key.startswith("BOOK_")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", **environment)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)


def printed(result, name):
    return next(line.split("=", 1)[1] for line in result.stdout.splitlines()
                if line.startswith(name + "="))


def test_setup_cell_inside_the_repository_finds_root_without_git(tmp_path):
    inside = ROOT / "_build" / f"setup-cell-test-{os.getpid()}" / "notebooks"
    inside.mkdir(parents=True)
    try:
        log = tmp_path / "git.log"
        result = run_setup_cell(inside, fake_git(tmp_path / "bin", log, clone_works=False))
        assert result.returncode == 0, result.stderr
        assert printed(result, "ROOT") == str(ROOT)
        assert printed(result, "RUNS") == str(ROOT / "runs")
        assert not log.exists(), "git was called although the scripts were there"
    finally:
        import shutil
        shutil.rmtree(inside.parent)


def test_setup_cell_alone_clones_the_repository_once(tmp_path):
    alone = tmp_path / "content"
    alone.mkdir()
    log = tmp_path / "git.log"
    result = run_setup_cell(alone, fake_git(tmp_path / "bin", log, clone_works=True))
    assert result.returncode == 0, result.stderr
    assert printed(result, "ROOT") == str(alone / "gpu-book")
    assert log.read_text().split() == ["clone", "--depth", "1", config()["repository"]["url"],
                                       str(alone / "gpu-book")]
    # Run again (a restarted Colab kernel): the clone is found, git is not called again.
    again = run_setup_cell(alone, tmp_path / "bin")
    assert again.returncode == 0, again.stderr
    assert printed(again, "ROOT") == str(alone / "gpu-book")
    assert len(log.read_text().splitlines()) == 1


def clone_failed(result, url, clone):
    """The set-up cell's one-line message: what failed, and what to do instead."""
    message = result.stderr.strip().splitlines()[-1]
    return (result.returncode != 0 and "Traceback" not in result.stderr
            and "ROOT=" not in result.stdout and message.startswith(f"Could not clone {url}")
            and "zip" in message and "BOOK_REPO_URL" in message and str(clone) in message
            and not clone.exists())


def test_setup_cell_alone_without_network_fails_with_one_line_that_says_what_to_do(tmp_path):
    alone = tmp_path / "content"
    alone.mkdir()
    result = run_setup_cell(alone, fake_git(tmp_path / "bin", tmp_path / "git.log",
                                            clone_works=False))
    assert clone_failed(result, config()["repository"]["url"], alone / "gpu-book"), result.stderr


def test_setup_cell_ends_a_clone_that_never_answers_at_its_time_limit(tmp_path):
    alone = tmp_path / "content"
    alone.mkdir()
    log = tmp_path / "git.log"
    result = run_setup_cell(alone, fake_git(tmp_path / "bin", log, clone_works=True, hangs=True),
                            BOOK_CLONE_TIMEOUT="1")
    assert clone_failed(result, config()["repository"]["url"], alone / "gpu-book"), result.stderr
    assert "time limit 1 s" in result.stderr
    assert len(log.read_text().splitlines()) == 1


def test_setup_cell_clones_from_the_mirror_named_by_book_repo_url(tmp_path):
    alone = tmp_path / "content"
    alone.mkdir()
    log = tmp_path / "git.log"
    mirror = "https://gitee.com/example/pytorch-gpu-book"
    result = run_setup_cell(alone, fake_git(tmp_path / "bin", log, clone_works=True),
                            BOOK_REPO_URL=mirror)
    assert result.returncode == 0, result.stderr
    assert printed(result, "ROOT") == str(alone / "gpu-book")
    assert log.read_text().split() == ["clone", "--depth", "1", mirror, str(alone / "gpu-book")]


LITERALINCLUDE = re.compile(r"```\{literalinclude\} ([^\n]+)\n((?::[^\n]*\n)*)")


def literal_includes():
    """(page, included file, options) of every literalinclude in the chapters and front matter."""
    pages = [(path, "\n".join(cell_source(cell) for cell in load_notebook(path)["cells"]
                              if cell["cell_type"] == "markdown")) for path, _ in chapters()]
    pages += [(path, path.read_text()) for path in sorted((ROOT / "book").glob("*.md"))]
    return [(page, (page.parent / match.group(1).strip()).resolve(),
             dict(re.findall(r":([\w-]+):\s*(.*)", match.group(2))))
            for page, text in pages for match in LITERALINCLUDE.finditer(text)]


@pytest.mark.parametrize("page, included, options", literal_includes(),
                         ids=lambda value: value.name if hasattr(value, "name") else None)
def test_included_code_is_still_there(page, included, options):
    """A script changed under a chapter's literalinclude would fail the build much later:
    every file, marker line and function a chapter includes must still exist."""
    assert included.exists(), f"{page.name} includes {included}, which does not exist"
    text = included.read_text()
    for key in ("start-at", "end-at", "start-after", "end-before"):
        if key in options:
            assert options[key] in text, f"{page.name}: {key} {options[key]!r} not in {included.name}"
    if "pyobject" in options:
        assert re.search(rf"^\s*(def|class) {options['pyobject']}\b", text, re.M), (
            f"{page.name}: no {options['pyobject']} in {included.name}")


def test_a_solution_closed_early_by_its_own_code_fence_is_found():
    early = "```{solution} ch09-a\n:class: dropdown\n```python\nleak()\n```\n```\n"
    assert "closed early" in fence_problems(early)[0]
    assert fence_problems(early.replace("```{solution}", "````{solution}", 1)
                          .rstrip("\n").rsplit("\n", 1)[0] + "\n````\n") == []


def test_the_code_passes_the_linter():
    """ruff, with the settings of pyproject.toml, over the scripts, tools, tests and notebooks."""
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]


def top_level_imports(source):
    """The top-level package of each import statement in source ('' where it does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:   # a cell with IPython magic; the chapters import in plain cells
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_readers_requirements_cover_what_the_chapters_and_scripts_import():
    """requirements.txt is the reader's install: every package a chapter or a companion script
    imports comes from it, and nothing the build or the tests alone need is in it."""
    from importlib.metadata import packages_distributions

    def names(path):
        return {re.split(r"[<>=!~;\s\[]", line.strip())[0].lower()
                for line in path.read_text().splitlines()
                if line.strip() and not line.lstrip().startswith(("#", "-r"))}

    reader, developer = names(ROOT / "requirements.txt"), names(ROOT / "requirements-dev.txt")
    sources = [path.read_text() for path in (ROOT / "ddp_scripts").rglob("*.py")]
    sources += [path.read_text() for path in (ROOT / "notebooks").glob("*.py")]
    sources += [cell_source(cell) for path, _ in CHAPTERS
                for cell in load_notebook(path)["cells"] if cell["cell_type"] == "code"]
    imported = set().union(*map(top_level_imports, sources))
    local = {"ddp_scripts", "notebooks", "book", "chapter_tools", "selfcheck", "machine_check"}
    providers = packages_distributions()
    outside = imported - local - set(sys.stdlib_module_names)
    providers["IPython"] = ["ipykernel"]   # the kernel brings IPython: the chapters need both
    missing = {name: providers.get(name) for name in outside
               if not {dist.lower() for dist in providers.get(name, [])} & reader}
    assert not missing, f"imported but not in requirements.txt: {missing}"
    assert not reader & developer, f"in both requirement files: {reader & developer}"
    assert {"nbmake", "pytest", "jupyter-book", "ruff"} <= developer and not {"nbmake", "pytest"} & reader
