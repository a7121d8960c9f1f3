"""Build the book: stage each edition's copy, execute every notebook once with nbmake, render.

    python -m book.tools build [--render-only] [--edition en|zh]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from book.tools import ToolError, gpu_recordings, offline_assets, words
from book.tools.notebooks import read_notebook, write_notebook
from ddp_scripts.hardware import describe_hardware, usable_cores

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "_build"
HTML = BUILD / "html"
FRONT_MATTER = ["_config.yml", "_toc.yml", "book", "results"]
SOURCES = FRONT_MATTER + ["notebooks", "ddp_scripts"]
MACHINE = BUILD / "notebook-machine.txt"   # what the timings were measured on
ZH = "zh"   # the Chinese pages' folder, beside the English ones
# nbmake limits each cell; pytest-timeout each notebook (in place of the tests' own limit).
CELL_TIMEOUT_S = 900
NOTEBOOK_TIMEOUT_S = 1800
# The chapters whose measurements depend on how many cores they have execute alone (2 and 10
# measure the CPU by threads, 7 compares one process with two); the others two at a time,
# sharing every core (chapter 8's thread counts need more than one), their pages saying so.
ALONE = {"02_tensors_and_models", "07_experiment", "10_keeping_the_gpu_busy"}
SIDE_BY_SIDE = 2
RECORDS = BUILD / "run-records"   # each companion-script run, replayed for the second edition
LAUNCH = re.compile(r"\b(run_script|run_command|Popen)\(")

Edition = namedtuple("Edition", "name src html timings notebooks pages")   # the last two committed
EDITIONS = {
    "en": Edition("en", BUILD / "src", HTML, BUILD / "notebook-timings.xml",
                  ROOT / "notebooks", ROOT / "book"),
    "zh": Edition("zh", BUILD / "src-zh", HTML / ZH, BUILD / "notebook-timings-zh.xml",
                  ROOT / "notebooks" / ZH, ROOT / "book" / ZH),
}


def notebooks_in(folder):
    """(path, notebook) for each notebook of folder, written back after the loop's body."""
    for path in sorted(Path(folder).glob("*.ipynb")):
        notebook = read_notebook(path)
        yield path, notebook
        write_notebook(path, notebook)


def stage(edition, notebooks=True, site=True):
    """A fresh copy of one edition's sources, the Chinese pages under the English names (so a
    page's other edition is the same path there). notebooks=False keeps the executed notebooks;
    site=False (a copy to execute only) leaves out the JavaScript and the JupyterHub URL."""
    src = edition.src
    if notebooks:
        shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True, exist_ok=True)
    # book/zh and notebooks/zh left out: nbmake executes every notebook it finds.
    ignore = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", "*.pyc", ZH)
    for name in SOURCES if notebooks else FRONT_MATTER:
        if (src / name).is_dir():
            shutil.rmtree(src / name)
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, src / name)
    if edition.name == ZH:
        copies = [(page, src / "book") for page in edition.pages.glob("*.md")]
        if notebooks:
            copies += [(chapter, src / "notebooks") for chapter in edition.notebooks.glob("*.ipynb")]
        for source, folder in [*copies, (edition.pages / "_toc.yml", src)]:
            shutil.copy2(source, folder / source.name)
    if notebooks:
        for _, notebook in notebooks_in(src / "notebooks"):
            prepare_for_the_page(notebook["cells"])
        # nbmake skips notebooks under a `_build` folder; this plugin collects them.
        shutil.copy2(Path(__file__).with_name("nbmake_build_copy.py"), src / "conftest.py")
    configure(edition, site)
    if site:
        offline_assets.install(src / "_assets")


def prepare_for_the_page(cells):
    """'# 5. DDP' -> '# DDP', as the table of contents numbers the chapters (the downloadable
    notebook gets the number back); code cells tagged `solution` collapsed (hide-cell)."""
    if cells and cells[0]["cell_type"] == "markdown":
        cells[0]["source"] = re.sub(r"\A(\s*#\s+)\d+\.\s+", r"\1", cells[0]["source"], count=1)
    for cell in cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if "solution" in tags and not {"hide-cell", "remove-cell"} & set(tags):
            cell["metadata"]["tags"] = [*tags, "hide-cell"]


def configure(edition, site):
    """The copy's _config.yml, with the Chinese settings and search words, or JUPYTERHUB_URL."""
    path = edition.src / "_config.yml"
    config = yaml.safe_load(path.read_text())
    hub = jupyterhub_url() if site else ""
    if edition.name == ZH:
        merge(config, yaml.safe_load((edition.pages / "_config.yml").read_text()))
        config["sphinx"]["config"]["html_search_options"] = {"dict": str(search_words(edition))}
    if hub:
        config.setdefault("launch_buttons", {})["jupyterhub_url"] = hub
        print(f"JupyterHub launch buttons point at {hub}", flush=True)
    if hub or edition.name == ZH:
        path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))


def search_words(edition):
    """A jieba dictionary of the Chinese glossary's terms ('显存不足（OOM）' -> 显存不足), so that
    a search for 进程组 finds the pages that use it: its path."""
    words = set()
    for line in (edition.pages / "glossary.md").read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 2 and cells[1] != "English":
            words.update(re.findall(r"[\u4e00-\u9fff]{2,}", cells[0]))
    path = edition.src / "search-words.txt"
    path.write_text("".join(f"{word} 1000\n" for word in sorted(words)), encoding="utf-8")
    return path


def merge(base, overrides):
    """base, with overrides' settings on top (nested settings merged, not replaced)."""
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = value


def jupyterhub_url():
    """JUPYTERHUB_URL from the environment ('' when unset); a bad value stops the build."""
    hub = os.environ.get("JUPYTERHUB_URL", "").strip()
    if hub and not re.fullmatch(r"https?://[^\s/]+(/[^\s]*)?", hub):
        raise ToolError(f"JUPYTERHUB_URL must be an http(s) address, got {hub!r}")
    return hub.rstrip("/")


def execute(editions):
    """Every notebook of every edition once, outputs written into its copy and the timings into
    edition.timings: first the lanes, then ALONE's one at a time. The editions that failed."""
    MACHINE.write_text(describe_hardware()["label"] + "\n")
    shutil.rmtree(RECORDS, ignore_errors=True)
    beside, alone = [], []   # (edition, notebooks, JUnit file)
    for order, edition in enumerate(editions):
        parts = edition.timings.with_suffix("")
        shutil.rmtree(parts, ignore_errors=True)
        parts.mkdir(parents=True)
        beside += [(edition, [path], parts / f"beside-{path.stem}.xml")
                   for path in beside_order(edition.src / "notebooks", first=order == 0)]
        chapters = [path for path in sorted((edition.src / "notebooks").glob("*.ipynb"))
                    if path.stem in ALONE]
        if chapters:
            alone.append((edition, chapters, parts / "alone.xml"))
    # SIDE_BY_SIDE lanes, fewer on fewer cores (pinning a lane to a core made no build quicker);
    # they take the runs in order.
    with ThreadPoolExecutor(min(SIDE_BY_SIDE, usable_cores())) as lanes:
        statuses = list(lanes.map(lambda run: nbmake(*run), beside))
    statuses += [nbmake(*run) for run in alone]
    for edition in editions:   # one JUnit file each, every chapter marked alone or beside
        suite = ET.Element("testsuite", name="notebooks")
        for junit in sorted(edition.timings.with_suffix("").glob("*.xml")):
            for case in ET.parse(junit).getroot().iter("testcase"):
                case.set("executed", junit.stem.split("-")[0])
                suite.append(case)
        ET.ElementTree(suite).write(edition.timings, encoding="unicode")
    return {run[0].name for run, status in zip(beside + alone, statuses) if status != 0}


def beside_order(folder, first=True):
    """folder's chapters that run beside another, as the lanes take them: the first edition's
    longest first, so the lanes end together; the second's reversed, to replay its runs."""
    return sorted((path for path in folder.glob("*.ipynb") if path.stem not in ALONE),
                  key=lambda path: (launches(path), path.name), reverse=first)


def launches(notebook):
    """How many companion-script starts a chapter's code makes: most of its time."""
    return sum(len(LAUNCH.findall(cell["source"])) for cell in read_notebook(notebook)["cells"]
               if cell["cell_type"] == "code")


def nbmake(edition, notebooks, junit):
    command = nbmake_command(edition.src, notebooks, junit)
    print(f"[{edition.name}] + " + " ".join(command), flush=True)
    return subprocess.run(command, cwd=edition.src,
                          env={**os.environ, "RUN_RECORDS": str(RECORDS)}).returncode


def nbmake_command(src, targets, timings, cell_timeout_s=CELL_TIMEOUT_S,
                   notebook_timeout_s=NOTEBOOK_TIMEOUT_S):
    """pytest --nbmake over targets of the copy src, outputs written back, timings to JUnit."""
    return [sys.executable, "-m", "pytest", "--nbmake", "--overwrite",
            f"--nbmake-timeout={cell_timeout_s}", "-o", f"timeout={notebook_timeout_s}",
            "-p", "no:cacheprovider", f"--junitxml={timings}", "-o", "junit_family=xunit1",
            "-o", "addopts=",  # the repository's test options are not for this run
            "--rootdir", str(src), *map(str, targets)]


def write_execution_times(edition):
    """book/execution-times.md in the copy, from its timings, and under the title of each
    chapter executed beside another, a note saying so (once: --render-only finds it there)."""
    text, rows = words(edition.name), []
    machine = MACHINE.read_text().strip() if MACHINE.exists() else text["machine"]
    for case in ET.parse(edition.timings).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        rows.append((Path(case.get("file") or case.get("name")).stem, float(case.get("time", 0)),
                     "failed" if failed else "passed", case.get("executed", "alone")))
    table = ["| --- | --- | ---: | --- | --- |"] + [
        f"| {{doc}}`../notebooks/{name}` | `{name}.ipynb` | {seconds:.1f} | "
        f"{text[result]} | {text[how]} |" for name, seconds, result, how in sorted(rows)]
    (edition.src / "book" / "execution-times.md").write_text(text["times_page"].format(
        machine=machine, rows="\n".join(table), total=sum(row[1] for row in rows)), encoding="utf-8")
    note = {"cell_type": "markdown", "id": "build-executed-beside", "metadata": {},
            "source": text["beside_note"].replace("{machine}", machine)}
    beside = {name for name, _, _, how in rows if how == "beside"}
    for path, notebook in notebooks_in(edition.src / "notebooks"):
        said = any(cell.get("id") == note["id"] for cell in notebook["cells"])
        if path.stem in beside and not said:
            notebook["cells"].insert(1, dict(note))


def render(editions):
    """The editions' HTML, both at once, from scratch, any warning an error; each one's output
    shown and its site put in place as it ends. {edition name: exit status}."""
    runs, statuses = [], {}
    try:
        for edition in editions:
            command = [sys.executable, "-c", "from jupyter_book.cli.main import main; main()",
                       "build", str(edition.src), "--all", "-W", "-n", "--keep-going"]
            print(f"[{edition.name}] + " + " ".join(command), flush=True)
            log = tempfile.TemporaryFile(mode="w+")
            runs.append((edition, log, subprocess.Popen(command, cwd=ROOT, stdout=log,
                                                        stderr=subprocess.STDOUT, text=True)))
        for edition, log, process in runs:
            statuses[edition.name] = process.wait()
            log.seek(0)
            print(log.read(), end="", flush=True)
            if statuses[edition.name] == 0:
                put_site_in_place(edition)
            else:
                print(f"error: jupyter-book failed on the {edition.name} edition (warnings count "
                      f"as errors); {edition.html} was left as it was", file=sys.stderr)
    finally:   # interrupted: no jupyter-book left running
        for _, log, process in runs:
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
    return statuses


def put_site_in_place(edition):
    """The rendered site in place of the old, the other edition's folder (zh/) left alone; its
    downloadable notebooks get their numbered titles back."""
    edition.html.mkdir(parents=True, exist_ok=True)
    for old in edition.html.iterdir():
        if edition.name != ZH and old.name == ZH:
            continue   # the Chinese site, inside the English one
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
    shutil.copytree(edition.src / "_build" / "html", edition.html, dirs_exist_ok=True)
    for path, notebook in notebooks_in(edition.html / "_sources" / "notebooks"):
        committed = edition.notebooks / path.name
        if committed.exists() and notebook["cells"] and notebook["cells"][0]["cell_type"] == "markdown":
            notebook["cells"][0]["source"] = read_notebook(committed)["cells"][0]["source"]
    print(f"[{edition.name}] rendered: {edition.html / 'index.html'}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render-only", action="store_true",
                        help="render the notebooks executed last time with the current pages and config")
    parser.add_argument("--edition", choices=sorted(EDITIONS), action="append",
                        help="build this edition only (repeatable; default: both)")
    args = parser.parse_args(argv)
    editions = [EDITIONS[name] for name in args.edition or EDITIONS]
    jupyterhub_url()   # a bad address stops the build before anything is done
    for edition in editions:
        if args.render_only and not (edition.timings.exists() and (edition.src / "notebooks").exists()):
            raise ToolError(f"nothing executed yet for the {edition.name} edition: build it first")
        stage(edition, notebooks=not args.render_only)
    failed = set() if args.render_only else execute(editions)
    for edition in editions:
        if edition.name in failed:
            print(f"error: a notebook of the {edition.name} edition failed to execute (see "
                  f"above); that edition was not built", file=sys.stderr)
            continue
        write_execution_times(edition)
        gpu_recordings.prepare(sorted((edition.src / "notebooks").glob("*.ipynb")),
                             build_copy=edition.src, committed_dir=edition.notebooks,
                             language=edition.name)
    rendered = render([edition for edition in editions if edition.name not in failed])
    return max([1 if failed else 0, *rendered.values()])
