"""Build the book: execute every notebook once, with nbmake, then render the HTML.

    python -m book.tools build                 # what `make book` runs
    python -m book.tools build --render-only   # re-render the notebooks executed last time
                                               # with the current front matter and config
    python -m book.tools build --edition zh    # one edition only (en or zh; both by default)

The site has two editions (book/tools/translations.py keeps them in step): the English one
at its root, _build/html, and the Chinese one (中文版) under _build/html/zh. Each is built
from its own copy, the same way: the Chinese copy, _build/src-zh, is the English copy with
the Chinese pages in place of the English ones (notebooks/zh/x.ipynb staged as
notebooks/x.ipynb, book/zh/x.md as book/x.md), the Chinese table of contents, and the
configuration with book/zh/_config.yml's settings on top. So both editions have the same
page names, and a page's link to the other edition is the same path on the other side
(book/extensions/editions.py). Both copies are executed, each notebook once.

1. The sources are copied to _build/src, so the committed notebooks stay without outputs.
   In the copy, a chapter's title loses its number ("# 5. DDP" -> "# DDP"): the table of
   contents numbers the chapters, and the number would otherwise show twice. The committed
   notebook keeps it, for readers who open it alone (on Colab, say). Code cells tagged
   `solution` get the tag `hide-cell`: on the page they are collapsed, like {solution}s.
   JUPYTERHUB_URL, when set, replaces launch_buttons.jupyterhub_url in the copy's _config.yml.
2. pytest --nbmake --overwrite executes each notebook there once: the chapters whose
   measurements depend on how many cores they have one at a time, alone (ALONE, below); the
   others two at a time, sharing the cores, their pages saying so. A companion-script
   command both editions launch runs once, for the first, and is replayed for the second
   (RECORDS, below).
3. The execution-times page is written from nbmake's timings, and the executed copies are
   made ready for the page (book/tools/page_outputs.py): the build machine's paths and name
   are taken out of the outputs,
   and every cell tagged `gpu-output` gets the output recorded on GPU machines
   (results/gpu-runs/, book/tools/gpu_recordings.py), labelled, and marked stale where the
   cell's code changed since; stale recordings are also listed in the build's output.
   The site's JavaScript (widgets, require.js, MathJax) is unpacked into the copy from the
   pinned npm packages of book/tools/offline_assets.py, so the pages need no CDN.
4. jupyter-book renders each copy with execution off (the outputs are already in), from
   scratch, both editions at once, and fails on any warning. The site lands in _build/html; its downloadable
   notebooks (the executed copies) get their numbered titles back.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

from book.tools import offline_assets, page_outputs
from book.tools.notebooks import read_notebook, write_notebook

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "_build"
HTML = BUILD / "html"
FRONT_MATTER = ["_config.yml", "_toc.yml", "book", "results"]
SOURCES = FRONT_MATTER + ["notebooks", "ddp_scripts"]
MACHINE = BUILD / "notebook-machine.txt"   # what the timings were measured on
ZH = "zh"   # the Chinese pages' folder, beside the English ones


class Edition:
    """One edition of the book: where its sources are, its build copy, its part of the site."""

    def __init__(self, name, src, html, timings, notebooks, pages):
        self.name, self.src, self.html, self.timings = name, src, html, timings
        self.notebooks, self.pages = notebooks, pages   # the committed chapters and pages


EDITIONS = {
    "en": Edition("en", BUILD / "src", HTML, BUILD / "notebook-timings.xml",
                  ROOT / "notebooks", ROOT / "book"),
    "zh": Edition("zh", BUILD / "src-zh", HTML / ZH, BUILD / "notebook-timings-zh.xml",
                  ROOT / "notebooks" / ZH, ROOT / "book" / ZH),
}
# The two limits of an nbmake run, each passed on its command line: nbmake's own limit is per
# cell; pytest-timeout's (the repository sets one for the tests) would otherwise end a whole
# notebook after the tests' limit, so the build sets its own, per notebook.
CELL_TIMEOUT_S = 900
NOTEBOOK_TIMEOUT_S = 1800
NUMBERED_TITLE = re.compile(r"\A(\s*#\s+)\d+\.\s+")


class BuildError(Exception):
    """Bad input to the build: reported as one line, exit status 2."""


def stage(edition, notebooks=True, site=True):
    """A fresh copy of one edition's sources in its build folder (_build/src, _build/src-zh).

    With notebooks=False (--render-only), only the front matter and the configuration are
    refreshed: the executed notebooks, and the scripts they ran, stay as they were. With
    site=False (gpu_check.py: a copy to execute, never rendered) the site's JavaScript and
    launch buttons are left out.
    """
    src = edition.src
    names = SOURCES if notebooks else FRONT_MATTER
    if notebooks and src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", "*.pyc")
    for name in names:
        source, target = ROOT / name, src / name
        if target.is_dir():
            shutil.rmtree(target)
        if source.is_dir():
            shutil.copytree(source, target, ignore=ignore)
        elif source.exists():
            shutil.copy2(source, target)
    if edition.name == ZH:
        put_chinese_pages_in_place(src, notebooks)
    for folder in (src / "notebooks" / ZH, src / "book" / ZH):
        if folder.exists():   # each copy holds one edition: nbmake runs what is there
            shutil.rmtree(folder)
    if notebooks:
        for notebook in sorted((src / "notebooks").glob("*.ipynb")):
            prepare_for_the_book(notebook)
        # nbmake skips notebooks under a `_build` folder; this plugin collects them.
        shutil.copy2(ROOT / "book" / "tools" / "nbmake_build_copy.py", src / "conftest.py")
    if not site:
        return
    hub = jupyterhub_url()
    if hub:
        set_jupyterhub_url(src / "_config.yml", hub)
    try:
        versions = offline_assets.install(src / "_assets")
    except offline_assets.AssetError as error:
        raise BuildError(str(error)) from None
    print(f"[{edition.name}] served from the site: " + ", ".join(
        f"{name}@{version}" for name, version in versions.items()), flush=True)


def put_chinese_pages_in_place(src, notebooks=True):
    """The Chinese copy: Chinese pages under the English pages' names, Chinese toc, config."""
    if notebooks:
        for chapter in sorted((ROOT / "notebooks" / ZH).glob("*.ipynb")):
            shutil.copy2(chapter, src / "notebooks" / chapter.name)
    for page in sorted((ROOT / "book" / ZH).glob("*.md")):
        shutil.copy2(page, src / "book" / page.name)
    shutil.copy2(ROOT / "book" / ZH / "_toc.yml", src / "_toc.yml")
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    merge(config, yaml.safe_load((ROOT / "book" / ZH / "_config.yml").read_text()))
    # The search splits Chinese text into words with jieba; the glossary's terms are words
    # to it too, so that a search for 进程组 or 全归约 finds the pages that use them.
    words = src / "search-words.txt"
    words.write_text("".join(f"{word} 1000\n" for word in
                             glossary_words(ROOT / "book" / ZH / "glossary.md")),
                     encoding="utf-8")
    merge(config, {"sphinx": {"config": {"html_search_options": {"dict": str(words)}}}})
    (src / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False,
                                                    allow_unicode=True))


def glossary_words(glossary):
    """The Chinese terms of the Chinese glossary's table (中文 | English), Chinese only, also
    where they gloss an English headword: '显存不足（OOM）' -> 显存不足, '卡住、挂起' -> 卡住,
    挂起, 'all-reduce（全归约）' -> 全归约."""
    words = []
    for line in glossary.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 2 and line.startswith("|") and cells[1] != "English":
            words += re.findall(r"[\u4e00-\u9fff]{2,}", cells[0])
    return sorted(set(words))


def merge(base, overrides):
    """base, with overrides' settings on top (nested settings merged, not replaced)."""
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = value
    return base


def prepare_for_the_book(notebook):
    """Two changes to the build copy of a chapter, for the page (not for the notebook):

    - '# 5. Distributed data parallel' -> '# Distributed data parallel' in the first cell;
    - code cells tagged `solution` are collapsed (tag `hide-cell`), like the {solution}s.
    """
    data = read_notebook(notebook)
    cells = data.get("cells", [])
    if cells and cells[0].get("cell_type") == "markdown":
        cells[0]["source"] = NUMBERED_TITLE.sub(r"\1", cells[0]["source"], count=1)
    for cell in cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if "solution" in tags and not {"hide-cell", "remove-cell"} & set(tags):
            cell["metadata"]["tags"] = [*tags, "hide-cell"]
    write_notebook(notebook, data)


def restore_titles(folder, committed_folder):
    """The downloadable notebooks (the executed copies) get their numbered titles back."""
    for notebook in sorted(folder.glob("*.ipynb")):
        committed = committed_folder / notebook.name
        if not committed.exists():
            continue
        title = read_notebook(committed)["cells"][0]
        data = read_notebook(notebook)
        if data["cells"] and data["cells"][0].get("cell_type") == "markdown" == title["cell_type"]:
            data["cells"][0]["source"] = title["source"]
            write_notebook(notebook, data)


def jupyterhub_url():
    """JUPYTERHUB_URL from the environment ('' when unset); a bad value stops the build."""
    hub = os.environ.get("JUPYTERHUB_URL", "").strip()
    if hub and not re.fullmatch(r"https?://[^\s/]+(/[^\s]*)?", hub):
        raise BuildError(f"JUPYTERHUB_URL must be an http(s) address, got {hub!r}")
    return hub.rstrip("/")


def set_jupyterhub_url(config_path, hub):
    config = yaml.safe_load(config_path.read_text())
    config.setdefault("launch_buttons", {})["jupyterhub_url"] = hub
    config_path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    print(f"JupyterHub launch buttons point at {hub}", flush=True)


# The chapters whose measurements depend on how many cores they have execute alone: no
# other notebook shares the machine meanwhile. Chapter 2 measures the CPU's arithmetic and
# copies with all its threads, chapter 7 compares one process with two and one thread with
# two, chapter 10 compares the levers' speeds and probes the CPU by threads. The others
# execute two at a time, sharing every core: each sees the machine's cores (chapter 8's
# thread counts need more than one), and the two notebooks' work interleaves on them. Their
# pages say so (TIMES_PAGE's beside_note): the speeds they print (their training lines, a
# step time) are then those of a shared machine.
ALONE = {"02_tensors_and_models", "07_experiment", "10_keeping_the_gpu_busy"}
SIDE_BY_SIDE = 2
# Both editions' chapters launch the same companion-script commands: each is run once per
# build, by the first edition that launches it, and replayed for the other from RUN_RECORDS
# (ddp_scripts/run_records.py; the replayed output says so). A failed run is never
# recorded, nor one that a fault injector watches (chapter 8's killed rank): they always run.
RECORDS = BUILD / "run-records"


def execute(editions):
    """Every notebook of every edition once, outputs written back into each copy: first the
    chapters that may run beside another, two at a time, then those of ALONE, one at a time.
    Each edition's timings land in one JUnit file (edition.timings), each chapter marked
    alone or beside another. Returns {edition name: exit status}."""
    MACHINE.write_text(describe_machine() + "\n")
    shutil.rmtree(RECORDS, ignore_errors=True)
    runs = []   # (edition, notebooks, how, junit file)
    for order, edition in enumerate(editions):
        parts = edition.timings.with_suffix("")
        shutil.rmtree(parts, ignore_errors=True)
        parts.mkdir(parents=True)
        runs += [(edition, [notebook], "beside", parts / f"{notebook.stem}.xml")
                 for notebook in beside_order(edition.src / "notebooks", first=order == 0)]
    statuses = {edition.name: 0 for edition in editions}
    queue = list(runs)
    lock = threading.Lock()

    def lane():
        while True:
            with lock:
                if not queue:
                    return
                edition, notebooks, _, junit = queue.pop(0)
            status = nbmake(edition, notebooks, junit)
            with lock:
                statuses[edition.name] = max(statuses[edition.name], status)
    lanes = [threading.Thread(target=lane) for _ in range(lanes_for_this_machine())]
    for thread in lanes:
        thread.start()
    for thread in lanes:
        thread.join()
    for edition in editions:
        alone = [notebook for notebook in sorted((edition.src / "notebooks").glob("*.ipynb"))
                 if notebook.stem in ALONE]
        junit = edition.timings.with_suffix("") / "alone.xml"
        if alone:
            status = nbmake(edition, alone, junit)
            statuses[edition.name] = max(statuses[edition.name], status)
            runs.append((edition, alone, "alone", junit))
    for edition in editions:
        merge_timings([(how, junit) for e, _, how, junit in runs if e is edition],
                      edition.timings)
    return statuses


def beside_order(folder, first=True):
    """The chapters of `folder` that run beside another, in the order the lanes take them.
    The first edition's, those that launch the most runs first (the longest, so that the
    lanes end together); the second's in the opposite order, so that each starts once the
    first edition's has run, and replays its runs (RECORDS)."""
    return sorted((notebook for notebook in folder.glob("*.ipynb") if notebook.stem not in ALONE),
                  key=lambda notebook: (launches(notebook), notebook.name), reverse=first)


LAUNCH = re.compile(r"\b(run_script|run_command|Popen)\(")


def launches(notebook):
    """How many calls that start a companion script a chapter's code makes: the measure of
    its length the side-by-side lanes are filled by (the starts are most of the time)."""
    cells = read_notebook(notebook)["cells"]
    return sum(len(LAUNCH.findall(cell["source"]))
               for cell in cells if cell["cell_type"] == "code")


def lanes_for_this_machine():
    """How many chapters execute side by side: SIDE_BY_SIDE, or one where there is one core.
    The lanes are not pinned to cores of their own: pinned, a chapter's child processes
    would see one core each (chapter 8's thread counts), and measured on two cores the
    build took as long either way."""
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    return SIDE_BY_SIDE if len(cores) >= SIDE_BY_SIDE else 1


def nbmake(edition, notebooks, junit):
    """nbmake over some notebooks of one edition's copy. Their runs are recorded and
    replayed (RECORDS)."""
    command = nbmake_command(edition.src, notebooks, junit)
    print(f"[{edition.name}] + " + " ".join(command), flush=True)
    return subprocess.run(command, cwd=edition.src,
                          env={**os.environ, "RUN_RECORDS": str(RECORDS)}).returncode


def merge_timings(parts, target):
    """The JUnit files of one edition's nbmake runs as one, each chapter (testcase) marked
    with how it ran (`executed`: alone or beside). A run that wrote no file could not start;
    its exit status has failed the edition already."""
    suite = ET.Element("testsuite", name="notebooks")
    for how, junit in parts:
        if not junit.exists():
            continue
        for case in ET.parse(junit).getroot().iter("testcase"):
            case.set("executed", how)
            suite.append(case)
    ET.ElementTree(suite).write(target, encoding="unicode")


def nbmake_command(src, targets, timings, cell_timeout_s=CELL_TIMEOUT_S,
                   notebook_timeout_s=NOTEBOOK_TIMEOUT_S):
    """pytest --nbmake over targets (notebooks or folders) of the copy src, outputs written
    back, timings to a JUnit file (gpu_check.py runs the same command, one notebook at a time).
    cell_timeout_s limits each cell (nbmake); notebook_timeout_s each notebook (pytest-timeout)."""
    return [sys.executable, "-m", "pytest", "--nbmake", "--overwrite",
            f"--nbmake-timeout={cell_timeout_s}", "-o", f"timeout={notebook_timeout_s}",
            "-p", "no:cacheprovider",
            f"--junitxml={timings}", "-o", "junit_family=xunit1",
            "-o", "addopts=",  # the repository's test options are not for this run
            "--rootdir", str(src), *map(str, targets)]


# The generated execution-times page, in each edition's language.
TIMES_PAGE = {
    "en": {"title": "# Execution times",
           "intro": "How long each chapter took to execute, top to bottom, in the build that "
                    "produced this site: `make book` runs every notebook once with nbmake, on "
                    "the build machine ({machine}). The chapters whose measurements depend "
                    "on how many cores they have execute alone; the others two at a time, "
                    "beside another chapter. A companion-script command that both "
                    "editions launch runs once, for the English edition; the Chinese pages "
                    "show that run again, and say so where they do.",
           "header": "| Chapter | Notebook | Seconds | Result | Executed |",
           "result": {"passed": "passed", "failed": "failed"},
           "total": "Total: {total:.1f} s.",
           "unknown": "an unrecorded machine",
           "ran": {"alone": "alone", "beside": "beside another chapter"},
           "beside_note": "```{note}\nThe build executed this page beside another chapter, "
                          "the two sharing the build machine's cores ({machine}): any speed "
                          "it prints (samples/s) is that of a machine busy with other work "
                          "too, not the machine's alone. The chapters whose measurements "
                          "depend on how many cores they have execute alone.\n```"},
    "zh": {"title": "# 执行时间",
           "intro": "生成本网站的那次构建中，每一章从头到尾执行所用的时间：`make book` 用 "
                    "nbmake 把每个笔记本执行一遍，在构建机器（{machine}）上。测量结果取决于"
                    "核心数量的各章单独执行；其余各章两章同时执行。两个版本都会启动的配套脚本命令只运行一次"
                    "（为英文版运行），中文页面展示的是那次运行的结果，并在展示处注明。",
           "header": "| 章 | 笔记本 | 秒 | 结果 | 执行方式 |",
           "result": {"passed": "通过", "failed": "失败"},
           "total": "合计：{total:.1f} s。",
           "unknown": "一台未记录的机器",
           "ran": {"alone": "单独", "beside": "与另一章同时"},
           "beside_note": "```{note}\n构建本书时，这一页与另一章同时执行，两章共用构建机器"
                          "（{machine}）的核心：页面上打印的速度（samples/s）是机器同时忙于别的工作时的"
                          "速度，不是整台机器单独运行的速度。测量结果取决于核心数量的各章单独执行。\n```"},
}


def write_execution_times(edition):
    """book/execution-times.md in the copy: how long each chapter took to execute."""
    words = TIMES_PAGE[edition.name]
    rows = []
    for case in ET.parse(edition.timings).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        name = Path(case.get("file") or case.get("name")).stem
        rows.append((name, float(case.get("time", 0)), "failed" if failed else "passed",
                     case.get("executed", "alone")))
    page = edition.src / "book" / "execution-times.md"
    machine = MACHINE.read_text().strip() if MACHINE.exists() else words["unknown"]
    lines = [words["title"], "", words["intro"].format(machine=machine), "",
             words["header"], "| --- | --- | ---: | --- | --- |"]
    lines += [f"| {{doc}}`../notebooks/{name}` | `{name}.ipynb` | {seconds:.1f} | "
              f"{words['result'][result]} | {words['ran'][how]} |"
              for name, seconds, result, how in sorted(rows)]
    lines += ["", words["total"].format(total=sum(r[1] for r in rows)), ""]
    page.write_text("\n".join(lines), encoding="utf-8")
    beside = {name for name, _, _, how in rows if how == "beside"}
    for notebook in sorted((edition.src / "notebooks").glob("*.ipynb")):
        if notebook.stem in beside:
            say_it_ran_beside_another(notebook, words["beside_note"].replace("{machine}", machine))


def say_it_ran_beside_another(notebook, note):
    """The page of a chapter executed beside another says so, under its title."""
    data = read_notebook(notebook)
    if any(cell.get("id") == "build-executed-beside" for cell in data["cells"]):
        return   # --render-only: said in the last build already
    data["cells"].insert(1, {"cell_type": "markdown", "id": "build-executed-beside",
                             "metadata": {}, "source": note})
    write_notebook(notebook, data)


def describe_machine():
    """The build machine, as the execution times were measured on it."""
    from ddp_scripts.hardware import describe_hardware
    return describe_hardware()["label"]


def render(editions):
    """The HTML of the editions, from scratch (--all), failing on any warning: both at once,
    each in its own copy (jupyter-book is one process per edition, on one core mostly), its
    output shown when it ends. Returns {edition name: exit status}."""
    started = {}
    for edition in editions:
        command = [sys.executable, "-c", "from jupyter_book.cli.main import main; main()",
                   "build", str(edition.src), "--all", "-W", "-n", "--keep-going"]
        print(f"[{edition.name}] + " + " ".join(command), flush=True)
        log = tempfile.TemporaryFile(mode="w+")
        started[edition.name] = (edition, log, time.perf_counter(),
                                 subprocess.Popen(command, cwd=ROOT, stdout=log,
                                                  stderr=subprocess.STDOUT, text=True))
    statuses = {}
    try:
        for name, (edition, log, start, process) in started.items():
            statuses[name] = process.wait()
            show_render(edition, log, statuses[name], time.perf_counter() - start)
    finally:   # interrupted: no jupyter-book left running
        for _, log, _, process in started.values():
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
    return statuses


def show_render(edition, log, status, seconds):
    """One edition's jupyter-book output, then its site put in place (if it built)."""
    log.seek(0)
    print(log.read(), end="", flush=True)
    if status != 0:
        print(f"error: jupyter-book failed on the {edition.name} edition (exit status {status}, "
              f"warnings count as errors); {edition.html} was left as it was", file=sys.stderr)
        return
    replace_site(edition.src / "_build" / "html", edition.html)
    restore_titles(edition.html / "_sources" / "notebooks", edition.notebooks)
    print(f"[{edition.name}] rendered within {seconds:.1f} s: {edition.html / 'index.html'}",
          flush=True)


def replace_site(built, target):
    """target := built, leaving the other edition's folder (zh/ in the English site) alone."""
    target.mkdir(parents=True, exist_ok=True)
    for old in target.iterdir():
        if target == HTML and old.name == ZH:
            continue
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    shutil.copytree(built, target, dirs_exist_ok=True)


def build(editions, render_only):
    """Stage, execute (unless render_only), prepare and render the editions: exit status."""
    if render_only:
        for edition in editions:
            if not (edition.timings.exists() and (edition.src / "notebooks").exists()):
                raise BuildError(f"nothing executed yet for the {edition.name} edition: run "
                                 f"without --render-only first")
            stage(edition, notebooks=False)
        statuses = {edition.name: 0 for edition in editions}
    else:
        for edition in editions:
            stage(edition)
        statuses = execute(editions)
    executed = []
    for edition in editions:
        if statuses[edition.name] != 0:
            print(f"error: a notebook of the {edition.name} edition failed to execute (see "
                  f"above); that edition was not built", file=sys.stderr)
            continue
        write_execution_times(edition)
        page_outputs.prepare(sorted((edition.src / "notebooks").glob("*.ipynb")),
                             build_copy=edition.src, committed_dir=edition.notebooks,
                             language=edition.name)
        executed.append(edition)
    statuses.update(render(executed))
    return max(statuses.values())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render-only", action="store_true",
                        help="skip execution: render the notebooks executed last time, with "
                             "the current front matter and configuration")
    parser.add_argument("--edition", choices=sorted(EDITIONS), action="append",
                        help="build this edition only (repeatable; default: every edition)")
    args = parser.parse_args(argv)
    try:
        jupyterhub_url()
        return build([EDITIONS[name] for name in args.edition or EDITIONS], args.render_only)
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
