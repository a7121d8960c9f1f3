"""The committed sources of the book. What a page or a notebook must look like is checked by
`python -m book.tools check` (book/tools/sources.py, beside the set-up cell's and the
translations' checks), which `make check` runs on the committed sources before these tests; here
each of its editorial checks finds a flaw planted in a copy. Then what the sources do: the
set-up cell run alone, the README's and CI's commands, the reader's requirements."""
import ast
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest

from book_files import ROOT, SETUP_CELL, cell_source, chapters, config, load_notebook
from helpers import fresh_venv

from book.tools import sources
from book.tools.sources import exercise_shape_problems

CHAPTERS = chapters()


def test_readme_gives_the_two_commands_and_ci_runs_the_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make book" in readme and "make test" in readme
    commands = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert "make test" in commands, f".ci/run must run the README's `make test`: {commands}"
    # then the chapters on the oldest torch requirements.txt allows, so the floor is checked
    assert commands[commands.index("make test") + 1:] == ["make oldest-torch"], commands


# ---------------------------------------------------------------------------------------
# Each editorial check finds a flaw planted in a copy of the sources
# ---------------------------------------------------------------------------------------
@pytest.fixture
def copy(tmp_path):
    """What the editorial checks read, copied: the settings, the English chapters, the front
    matter, the set-up cell and the scripts the chapters include."""
    for name in ("_toc.yml", "_config.yml", "README.md", "pyproject.toml", "book/tools/setup_cell.py",
                 "book/zh/intro.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    for folder, pattern in (("notebooks", "*.ipynb"), ("book", "*.md")):
        (tmp_path / folder).mkdir(exist_ok=True)
        for path in (ROOT / folder).glob(pattern):
            shutil.copy(path, tmp_path / folder / path.name)
    shutil.copytree(ROOT / "ddp_scripts", tmp_path / "ddp_scripts",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def first_chapter(root):
    return sources.chapters(root)[0][0]


def edit_notebook(root, change):
    """Change the first chapter's notebook: change(notebook), its cells' sources as strings."""
    path = first_chapter(root)
    notebook = json.loads(path.read_text())
    for cell in notebook["cells"]:
        cell["source"] = cell_source(cell)
    change(notebook)
    path.write_text(json.dumps(notebook))


def edit_text(path, change):
    path.write_text(change(path.read_text()))


def code_cell(notebook):
    return next(cell for cell in notebook["cells"][1:] if cell["cell_type"] == "code")


def append_markdown(text):
    return lambda notebook: notebook["cells"].append(
        {"cell_type": "markdown", "id": "planted", "metadata": {}, "source": text})


def lengthen_the_first_chapter_in_the_guide(root):
    stem = first_chapter(root).stem
    edit_text(root / "book" / "instructor-guide.md", lambda text: re.sub(
        rf"^(\| {{doc}}`../notebooks/{stem}` \|.*?\| )(\d+)( min \|)",
        lambda m: f"{m.group(1)}{int(m.group(2)) + 1}{m.group(3)}", text, flags=re.M))


def lengthen_the_first_chapter_on_the_landing_page(root):
    stem = first_chapter(root).stem
    edit_text(root / "book" / "intro.md", lambda text: re.sub(
        rf"^(\| {{doc}}`../notebooks/{stem}` \| )(\d+)( min \|)",
        lambda m: f"{m.group(1)}{int(m.group(2)) + 1}{m.group(3)}", text, flags=re.M))


def a_figure_without_alt_text(notebook):
    notebook["cells"].insert(2, {"cell_type": "code", "id": "planted-figure", "execution_count": None,
                                 "outputs": [], "source": "plt.show()", "metadata": {"mystnb": {
                                     "figure": {"name": "fig-ch01-planted",
                                                "caption": "A figure a reader cannot read."}}}})


PLANTED = {   # a flaw: (the check that must find it, how to plant it in the copy)
    "a notebook not in the toc": (
        sources.notebooks_in_the_toc,
        lambda root: shutil.copy(first_chapter(root), root / "notebooks" / "99_extra.ipynb")),
    "a title with another number": (
        sources.the_title_carries_the_chapter_number, lambda root: edit_notebook(
            root, lambda nb: nb["cells"][0].update(
                source=re.sub(r"^# \d+\.", "# 99.", nb["cells"][0]["source"].lstrip())))),
    "a second title": (
        sources.the_title_carries_the_chapter_number,
        lambda root: edit_notebook(root, append_markdown("# A second title"))),
    "no Summary section": (
        sources.ends_with_summary_and_exercises, lambda root: edit_text(
            first_chapter(root), lambda text: text.replace("## Summary", "## Recap"))),
    "an open solution": (
        sources.exercises_have_the_one_shape, lambda root: edit_text(
            first_chapter(root), lambda text: text.replace(":class: dropdown", ":class: tip"))),
    "an exercise labelled for another chapter": (
        sources.exercises_have_the_one_shape, lambda root: edit_text(
            first_chapter(root), lambda text: re.sub(r"(:label: ch)\d\d-", r"\g<1>99-", text))),
    "a solution closed early by its own code fence": (
        sources.exercises_have_the_one_shape, lambda root: edit_notebook(root, append_markdown(
            "```{solution} ch01-planted\n:class: dropdown\n```python\nleak()\n```\n```"))),
    "a solution as a code cell": (
        sources.exercises_have_the_one_shape, lambda root: edit_notebook(
            root, lambda nb: nb["cells"][-1].update(cell_type="code", execution_count=None, outputs=[],
                                                    metadata={"tags": ["solution"]}))),
    "another time in the instructor guide": (
        sources.every_page_gives_each_chapter_its_own_time,
        lengthen_the_first_chapter_in_the_guide),
    "another time on the landing page": (
        sources.every_page_gives_each_chapter_its_own_time,
        lengthen_the_first_chapter_on_the_landing_page),
    "a figure without alt text": (
        sources.figures_are_captioned_and_described,
        lambda root: edit_notebook(root, a_figure_without_alt_text)),
    "the set-up cell fetching another repository": (
        sources.the_repository_named_is_the_configured_one, lambda root: edit_text(
            root / "book/tools/setup_cell.py",
            lambda text: re.sub(r'^REPOSITORY = ".*"$', 'REPOSITORY = "https://github.com/a/b"', text,
                                flags=re.M))),
    "the README naming another repository": (
        sources.the_repository_named_is_the_configured_one, lambda root: edit_text(
            root / "README.md", lambda text: text + "\ngit clone https://github.com/someone/else\n")),
}


def test_every_editorial_check_has_a_planted_flaw():
    assert {check.__name__ for check, _ in PLANTED.values()} == {
        check.__name__ for check in sources.CHECKS}


@pytest.mark.parametrize("flaw", PLANTED)
def test_each_editorial_check_finds_its_planted_flaw(flaw, copy):
    check, plant = PLANTED[flaw]
    before = set(check(copy))
    plant(copy)
    found = set(check(copy)) - before
    assert found, f"not found: {flaw}"
    assert all(problem.count("\n") == 0 and ":" in problem for problem in found), found


def test_a_problem_makes_the_check_command_say_it_and_fail(copy, monkeypatch, capsys):
    PLANTED["an open solution"][1](copy)
    monkeypatch.setattr(sources, "ROOT", copy)
    assert sources.main([]) == 1
    said = capsys.readouterr().out
    assert "must be collapsed (:class: dropdown)" in said and "No problems" not in said


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


def test_a_solution_closed_early_by_its_own_code_fence_is_found():
    early = "```{solution} ch09-q\n:class: dropdown\n```python\nleak()\n```\n```"
    found = exercise_shape_problems(shaped(EXERCISE, ("markdown", early, ())))
    assert "closed it early" in found[0]
    longer = early.replace("```{solution}", "````{solution}", 1).rsplit("\n", 1)[0] + "\n````"
    assert exercise_shape_problems(shaped(EXERCISE, ("markdown", longer, ()))) == []


# ---------------------------------------------------------------------------------------
# The set-up cell: finds the companion scripts, or fetches them from the repository
# ---------------------------------------------------------------------------------------
def fake_git(bin_dir, log, clone_works, hangs=False):
    """A `git` that logs its arguments and 'clones' by creating ddp_scripts/train_single.py; or
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
        (target / "ddp_scripts" / "train_single.py").write_text("")
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
        assert "notice" not in result.stdout   # the installed book is this one
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


def test_setup_cell_installs_the_scripts_where_python_lacks_them_and_imports_them_at_once(tmp_path):
    """A kernel whose Python lacks the book's code (Colab's, say): the cell installs it from
    ROOT (pip install -e) and the same process imports it, with no restart and no sys.path
    entry of its own; the unpacked zip stands for the clone."""
    python = fresh_venv(tmp_path / "venv")
    repository = tmp_path / "content" / "pytorch-gpu-book-main"
    (repository / "ddp_scripts").mkdir(parents=True)
    for name in ("pyproject.toml", "requirements.txt"):
        shutil.copy(ROOT / name, repository / name)
    for name in ("__init__.py", "train_single.py"):
        (repository / "ddp_scripts" / name).write_text("")
    code = (SETUP_CELL.read_text() + "\nimport ddp_scripts\nprint('FROM=' + ddp_scripts.__file__)\n"
            "print('ON_PATH=' + str(str(ROOT) in sys.path))\n")
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    result = subprocess.run([str(python), "-c", code], cwd=repository.parent, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert printed(result, "FROM") == str(repository / "ddp_scripts" / "__init__.py")
    assert printed(result, "ON_PATH") == "False"
    assert "notice" not in result.stdout   # it uses the copy at ROOT


def test_setup_cell_where_pip_fails_says_in_one_line_what_to_run_by_hand(tmp_path):
    """A Python with no pip (the same path as a read-only site-packages, or offline without
    setuptools): one line in each language, with pip's own error and the command to run by
    hand, and no traceback."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=300)
    repository = tmp_path / "content" / "pytorch-gpu-book-main"
    (repository / "ddp_scripts").mkdir(parents=True)
    (repository / "ddp_scripts" / "train_single.py").write_text("")
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    result = subprocess.run([str(venv / "bin" / "python"), "-c", SETUP_CELL.read_text()],
                            cwd=repository.parent, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    english, chinese = result.stderr.strip().splitlines()
    assert english.startswith("Could not install the book's code with pip (")
    assert "No module named pip" in english and f"pip install -e {repository} by hand" in english
    assert chinese.startswith("无法用 pip 安装本书代码") and f"pip install -e {repository}" in chinese


def clone_failed(result, url, clone):
    """The set-up cell's message, a line in each edition's language: what failed, and what to
    do instead."""
    english, chinese = result.stderr.strip().splitlines()[-2:]
    return (result.returncode != 0 and "Traceback" not in result.stderr
            and "ROOT=" not in result.stdout and english.startswith(f"Could not clone {url}")
            and "book-source.zip" in english and "BOOK_REPO_URL" in english
            and str(clone.parent) in english and chinese.startswith(f"无法克隆 {url}")
            and "book-source.zip" in chinese and not clone.exists())


def test_setup_cell_finds_the_site_s_source_archive_unpacked_beside_the_notebook(tmp_path):
    import zipfile
    from book.tools import build
    alone = tmp_path / "content"
    alone.mkdir()
    with zipfile.ZipFile(build.source_archive(tmp_path / "source.zip")) as archive:
        archive.extractall(alone)
    log = tmp_path / "git.log"
    result = run_setup_cell(alone, fake_git(tmp_path / "bin", log, clone_works=False))
    assert result.returncode == 0, result.stderr
    assert printed(result, "ROOT") == str(alone / build.ARCHIVE_FOLDER)
    assert not log.exists(), "git was called although the unpacked archive was there"


def test_setup_cell_finds_a_repository_zip_unpacked_under_its_own_name(tmp_path):
    """A "Download ZIP" of the repository or a mirror unpacks to pytorch-gpu-book-main/."""
    alone = tmp_path / "content"
    (alone / "pytorch-gpu-book-main" / "ddp_scripts").mkdir(parents=True)
    (alone / "pytorch-gpu-book-main" / "ddp_scripts" / "train_single.py").write_text("")
    log = tmp_path / "git.log"
    result = run_setup_cell(alone, fake_git(tmp_path / "bin", log, clone_works=False))
    assert result.returncode == 0, result.stderr
    assert printed(result, "ROOT") == str(alone / "pytorch-gpu-book-main")
    assert not log.exists(), "git was called although the unpacked zip was there"


def test_setup_cell_says_when_this_python_uses_the_book_s_code_from_another_copy(tmp_path):
    """This Python has the book installed from ROOT (tests run the editable install); a
    notebook beside another copy gets one line, in each edition's language, saying which copy
    it uses and how to use its own."""
    alone = tmp_path / "content"
    other = alone / "pytorch-gpu-book-main"
    (other / "ddp_scripts").mkdir(parents=True)
    (other / "ddp_scripts" / "train_single.py").write_text("")
    result = run_setup_cell(alone, fake_git(tmp_path / "bin", tmp_path / "git.log",
                                            clone_works=False))
    assert result.returncode == 0, result.stderr
    english, chinese = [line for line in result.stdout.splitlines() if "ROOT=" not in line
                        and "RUNS=" not in line]
    assert english.startswith(f"notice: this Python uses the book's code installed from {ROOT}, "
                              f"not {other}'s: pip install -e {other}"), english
    assert chinese.startswith("注意：") and str(ROOT) in chinese and str(other) in chinese, chinese


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
    texts = [path.read_text() for path in (ROOT / "ddp_scripts").rglob("*.py")]
    texts += [path.read_text() for path in (ROOT / "notebooks").glob("*.py")]
    texts += [cell_source(cell) for path, _ in CHAPTERS
                for cell in load_notebook(path)["cells"] if cell["cell_type"] == "code"]
    imported = set().union(*map(top_level_imports, texts))
    local = {"ddp_scripts", "notebooks", "book", "chapter_tools", "selfcheck", "machine_check"}
    providers = packages_distributions()
    outside = imported - local - set(sys.stdlib_module_names)
    providers["IPython"] = ["ipykernel"]   # the kernel brings IPython: the chapters need both
    missing = {name: providers.get(name) for name in outside
               if not {dist.lower() for dist in providers.get(name, [])} & reader}
    assert not missing, f"imported but not in requirements.txt: {missing}"
    assert not reader & developer, f"in both requirement files: {reader & developer}"
    assert {"nbmake", "pytest", "jupyter-book", "ruff"} <= developer and not {"nbmake", "pytest"} & reader
