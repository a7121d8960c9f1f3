"""Build the book: stage each edition's copy, execute the English notebooks with nbmake, render.

    python -m book.tools build [--render-only]

The Chinese notebooks are not executed: their code cells are the English ones, character for
character, with the same ids, so each takes the outputs of the English cell it translates.
"""
import argparse
import copy
import html
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from book.tools import ROOT, ToolError, gpu_recordings, offline_assets, words
from book.tools.notebooks import read_notebook, write_notebook
from book.tools.translations import ZH, relative
from ddp_scripts.hardware import describe_hardware, usable_cores

BUILD = ROOT / "_build"
HTML = BUILD / "html"
FRONT_MATTER = ["_config.yml", "_toc.yml", "book", "results"]
SOURCES = FRONT_MATTER + ["notebooks", "ddp_scripts"]
MACHINE = BUILD / "notebook-machine.txt"   # what the timings were measured on
# nbmake limits each cell; pytest-timeout each notebook (in place of the tests' own limit).
CELL_TIMEOUT_S = 900
NOTEBOOK_TIMEOUT_S = 1800
# The chapters whose measurements depend on how many cores they have execute alone (2 and 10
# measure the CPU by threads, 7 compares one process with two); the others two at a time,
# sharing every core (chapter 8's thread counts need more than one), their pages saying so.
ALONE = {"02_tensors_and_models", "07_experiment", "10_keeping_the_gpu_busy"}
SIDE_BY_SIDE = 2
# The repository as a zip beside how-to-run in each edition (its pages link it), unpacking
# into one folder.
SOURCE_ARCHIVE, ARCHIVE_FOLDER = "book-source.zip", "pytorch-gpu-book"
# What a copy without git leaves out of it: what the build and the runs write.
ARCHIVE_LEAVES_OUT = {".git", "_build", "data", "runs", "__pycache__", ".ipynb_checkpoints",
                      ".pytest_cache", ".ruff_cache", ".offline-assets", ".gpu-wheels"}
LAUNCH = re.compile(r"\b(run_script|run_command|Popen)\(")

# timings: the nbmake timings its execution-times page shows (the English ones, for both).
Edition = namedtuple("Edition", "name src html timings notebooks pages")   # the last two committed
EDITIONS = {
    "en": Edition("en", BUILD / "src", HTML, BUILD / "notebook-timings.xml",
                  ROOT / "notebooks", ROOT / "book"),
    "zh": Edition("zh", BUILD / "src-zh", HTML / ZH, BUILD / "notebook-timings.xml",
                  ROOT / "notebooks" / ZH, ROOT / "book" / ZH),
}
EXECUTED = EDITIONS["en"]   # the one edition executed; the other shows its outputs
# Notebook metadata that goes with the outputs: the widgets' state (their views are outputs),
# the language the outputs' code is highlighted as (as jupyter-cache merges them).
OUTPUT_METADATA = ("language_info", "widgets")


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
        shutil.rmtree(src / name, ignore_errors=True)   # a file is copied over
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
    notebook gets the number back)."""
    if cells and cells[0]["cell_type"] == "markdown":
        cells[0]["source"] = re.sub(r"\A(\s*#\s+)\d+\.\s+", r"\1", cells[0]["source"], count=1)


def configure(edition, site):
    """The copy's _config.yml, with the Chinese settings and search words, or JUPYTERHUB_URL,
    and the front page's counts of GPU boxes."""
    path = edition.src / "_config.yml"
    config = yaml.safe_load(path.read_text())
    if edition.name == ZH:
        merge(config, yaml.safe_load((edition.pages / "_config.yml").read_text()))
        config["sphinx"]["config"]["html_search_options"] = {"dict": str(search_words(edition))}
    hub = os.environ.get("JUPYTERHUB_URL", "").strip().rstrip("/") if site else ""
    if hub:   # used as given: the page's button is the hub's address, with the chapter's path
        config["launch_buttons"]["jupyterhub_url"] = hub
        print(f"JupyterHub launch buttons point at {hub}", flush=True)
    config["parse"]["myst_substitutions"] = gpu_box_words(edition)
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))


def gpu_box_words(edition, recordings=ROOT / "results" / "gpu-runs"):
    """The front page's counts of the boxes of recorded GPU output, {{ gpu_boxes }} and the
    like in book/intro.md, {{ gpu_table }}, the same per chapter, and {{ gpu_machines }}, the
    GPUs recorded: counted over the committed chapters and recordings, as
    gpu_recordings.prepare shows them."""
    counted = gpu_recordings.box_counts_by_notebook(sorted(edition.notebooks.glob("*.ipynb")), recordings)
    total = {state: sum(counts[state] for counts in counted.values())
             for state in ("boxes", "current", "stale", "missing")}
    machines = dict.fromkeys(f"{run['hardware'].split(';')[0].strip()} ({run['date']})"
                             for _, run, _ in gpu_recordings.load_recordings(recordings))
    return {**{f"gpu_{state}": str(number) for state, number in total.items()},
            "gpu_machines": ", ".join(machines) or "-",
            "gpu_table": gpu_table(counted, total, words(edition.name))}


def gpu_table(counted, total, text):
    """A markdown table: a row per chapter of its boxes, current, stale and not recorded, then
    the book's (each chapter linked by its page title)."""
    states = ("current", "stale", "missing")
    rows = [text["gpu_table_header"], "| --- | ---: | ---: | ---: |"]
    rows += [f"| {{doc}}`../notebooks/{Path(name).stem}` | " + " | ".join(str(counts[s]) for s in states) + " |"
             for name, counts in sorted(counted.items())]
    rows.append(f"| **{text['gpu_table_total']}** | " + " | ".join(f"**{total[s]}**" for s in states) + " |")
    return "\n".join(rows) + "\n"


def search_words(edition):
    """A jieba dictionary of the Chinese glossary's terms ('显存不足（OOM）' -> 显存不足), so that
    a search for 进程组 finds the pages that use it: its path."""
    glossary = (edition.pages / "glossary.md").read_text(encoding="utf-8")
    terms = re.findall(r"^\|([^|\n]+)\|[^|\n]+\|\s*$", glossary, re.M)   # a two-column row's first cell
    words = {word for term in terms for word in re.findall(r"[\u4e00-\u9fff]{2,}", term)}
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


def execute(edition):
    """Every notebook of edition once, outputs written into its copy and the timings into
    edition.timings: first the lanes, then ALONE's one at a time. Whether every one passed."""
    MACHINE.write_text(describe_hardware()["label"] + "\n")
    parts = edition.timings.with_suffix("")
    shutil.rmtree(parts, ignore_errors=True)
    parts.mkdir(parents=True)
    runs = [([path], parts / f"beside-{path.stem}.xml")
            for path in beside_order(edition.src / "notebooks")]
    # SIDE_BY_SIDE lanes, fewer on fewer cores (pinning a lane to a core made no build quicker);
    # they take the runs in order.
    with ThreadPoolExecutor(min(SIDE_BY_SIDE, usable_cores())) as lanes:
        statuses = list(lanes.map(lambda run: nbmake(edition, *run), runs))
    alone = sorted(path for path in (edition.src / "notebooks").glob("*.ipynb") if path.stem in ALONE)
    if alone:
        statuses.append(nbmake(edition, alone, parts / "alone.xml"))
    suite = ET.Element("testsuite", name="notebooks")   # one JUnit file, each chapter marked
    for junit in sorted(parts.glob("*.xml")):            # alone or beside
        for case in ET.parse(junit).getroot().iter("testcase"):
            case.set("executed", junit.stem.split("-")[0])
            suite.append(case)
    ET.ElementTree(suite).write(edition.timings, encoding="unicode")
    return not any(statuses)


def source_archive(target):
    """The repository's files as this build reads them, in a zip for readers who can open the
    site but not the repository: the files git tracks, as they are in the working tree; in a
    reader's copy unpacked from this zip (no git), every file but what the build and the runs
    write. Returns target."""
    if (ROOT / ".git").exists():
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"],
                                capture_output=True, text=True)
        if listed.returncode:
            raise ToolError(f"git ls-files failed: {listed.stderr.strip()}")
        paths = [ROOT / name for name in listed.stdout.split("\0") if name]
    else:
        paths = [path for path in sorted(ROOT.rglob("*"))
                 if not (ARCHIVE_LEAVES_OUT & set(parts := path.relative_to(ROOT).parts)
                         or parts[0].startswith(".venv") or path.suffix == ".pyc")]
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in paths:
            if path.is_file():   # not a file deleted since its commit
                archive.write(path, f"{ARCHIVE_FOLDER}/{path.relative_to(ROOT)}")
    return target


def beside_order(folder):
    """folder's chapters that run beside another, as the lanes take them: the longest first,
    so the lanes end together."""
    return sorted((path for path in folder.glob("*.ipynb") if path.stem not in ALONE),
                  key=lambda path: (launches(path), path.name), reverse=True)


def launches(notebook):
    """How many companion-script starts a chapter's code makes: most of its time."""
    return sum(len(LAUNCH.findall(cell["source"])) for cell in read_notebook(notebook)["cells"]
               if cell["cell_type"] == "code")


def nbmake(edition, notebooks, junit):
    command = nbmake_command(edition.src, notebooks, junit)
    print(f"[{edition.name}] + " + " ".join(command), flush=True)
    return subprocess.run(command, cwd=edition.src).returncode


def nbmake_command(src, targets, timings):
    """pytest --nbmake over targets of the copy src, outputs written back, timings to JUnit."""
    return [sys.executable, "-m", "pytest", "--nbmake", "--overwrite",
            f"--nbmake-timeout={CELL_TIMEOUT_S}", "-o", f"timeout={NOTEBOOK_TIMEOUT_S}",
            "-p", "no:cacheprovider", f"--junitxml={timings}", "-o", "junit_family=xunit1",
            "-o", "addopts=",  # the repository's test options are not for this run
            "--rootdir", str(src), *map(str, targets)]


def twins(english, translated, name):
    """[(English cell, translated cell)] for each code cell of the translated notebook, matched
    by id; a cell with no English twin, or with other code than its twin's, is a ToolError
    naming it (`python -m book.tools translations sync` copies the code)."""
    cells = {cell.get("id"): cell for cell in english["cells"]   # not a recording's added cell
             if cell["cell_type"] == "code" and not gpu_recordings.added_cell(cell)}
    pairs = [(cells.pop(cell.get("id"), None), cell) for cell in translated["cells"]
             if cell["cell_type"] == "code"]
    unlike = [cell.get("id") for twin, cell in pairs if twin is None or twin["source"] != cell["source"]]
    if unlike or cells:
        raise ToolError(f"{name} cell {[*unlike, *cells][0]}: not the code of the English cell of "
                        "its id; run `python -m book.tools translations sync`")
    return pairs


def same_code(english, translation):
    """A ToolError unless every committed notebook of the translation has its English
    notebook's code cells (english and translation: Editions)."""
    # A Chinese notebook with no English one: `translations check` names it.
    for path in sorted(translation.notebooks.glob("*.ipynb")):
        twins(read_notebook(english.notebooks / path.name), read_notebook(path), relative(path))


def copy_outputs(english, translation):
    """Each code cell of the translation's staged notebooks given the outputs (and count) of
    the cell of the same id in the English edition's executed notebook of the same name, as
    they are (text, images, widgets' views); the boxes of recorded GPU output are left for
    gpu_recordings.prepare to add in the page's language."""
    for path, notebook in notebooks_in(translation.src / "notebooks"):
        executed = read_notebook(english.src / "notebooks" / path.name)
        for twin, cell in twins(executed, notebook, relative(translation.notebooks / path.name)):
            cell["outputs"] = [copy.deepcopy(output) for output in twin.get("outputs", [])
                               if gpu_recordings.MARKER not in output.get("metadata", {})]
            cell["execution_count"] = twin.get("execution_count")
        metadata = {key: value for key, value in notebook["metadata"].items() if key not in OUTPUT_METADATA}
        notebook["metadata"] = {**metadata, **copy.deepcopy(
            {key: value for key, value in executed["metadata"].items() if key in OUTPUT_METADATA})}


# A deliberate error on the page: the reader's own line, the last frame and the message; the
# frames between (PyTorch's own code, mostly) in the full traceback, collapsed below it.
ANSI = re.compile(r"\x1b\[[0-9;]*m")
SHORTENED = "shortened"   # output metadata: done (--render-only meets the page again)


def shorten_tracebacks(notebook, language="en"):
    """Each error output of more than one frame between the reader's cell and the raising one
    cut to those two and the message, in place; the whole traceback follows, collapsed."""
    text = words(language)
    for cell in notebook["cells"]:
        outputs = []
        for output in cell.get("outputs", []):
            outputs.append(output)
            trace = output.get("traceback", [])
            # header line(s), the cell's frame, frames..., the raising frame, the message
            first = next((i for i, part in enumerate(trace) if ANSI.sub("", part).startswith("Cell In")), None)
            if (output.get("output_type") != "error" or output.get("metadata", {}).get(SHORTENED)
                    or first is None or len(trace) - first <= 4):
                continue
            left_out = len(trace) - first - 3
            output["traceback"] = [*trace[:first + 1],
                                   text["traceback_left_out"].format(frames=left_out),
                                   *trace[-2:]]
            output.setdefault("metadata", {})[SHORTENED] = True
            whole = html.escape(ANSI.sub("", "\n".join(trace)))
            summary = text["traceback_whole"].format(lines=whole.count("\n") + 1)
            outputs.append({"output_type": "display_data", "metadata": {SHORTENED: True},
                            "data": {"text/html": f'<details class="full-traceback"><summary>'
                                                  f"{summary}</summary><pre>{whole}</pre></details>",
                                     "text/plain": summary}})
        if "outputs" in cell:
            cell["outputs"] = outputs


def write_execution_times(edition):
    """book/execution-times.md in the copy, from its timings: how each chapter executed, alone
    or beside another (whose speeds are then a shared machine's: the page says so, once)."""
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


def render(editions):
    """The editions' HTML, both at once, from scratch, any warning an error; each one's output
    shown and its site put in place. {edition name: exit status}. (Ctrl-C reaches jupyter-book
    too: it is in the terminal's process group.)"""
    def jupyter_book(edition):
        command = [sys.executable, "-c", "from jupyter_book.cli.main import main; main()",
                   "build", str(edition.src), "--all", "-W", "-n", "--keep-going"]
        print(f"[{edition.name}] + " + " ".join(command), flush=True)
        return subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    statuses = {}
    with ThreadPoolExecutor(len(editions)) as runs:
        for edition, done in zip(editions, runs.map(jupyter_book, editions)):
            print(done.stdout, end="", flush=True)
            statuses[edition.name] = done.returncode
            if done.returncode == 0:
                put_site_in_place(edition)
            else:
                print(f"error: jupyter-book failed on the {edition.name} edition (warnings count "
                      f"as errors); {edition.html} was left as it was", file=sys.stderr)
    return statuses


def put_site_in_place(edition):
    """The rendered site in place of the old, the other edition's folder (zh/) left alone; its
    downloadable notebooks get their numbered titles back."""
    edition.html.mkdir(parents=True, exist_ok=True)
    for old in edition.html.iterdir():
        if edition.name == ZH or old.name != ZH:   # the Chinese site, inside the English one, stays
            (shutil.rmtree if old.is_dir() else Path.unlink)(old)
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
    args = parser.parse_args(argv)
    editions, translation = list(EDITIONS.values()), EDITIONS[ZH]
    same_code(EXECUTED, translation)   # before the execution: a mismatch would waste it
    if args.render_only and not (EXECUTED.timings.exists() and (EXECUTED.src / "notebooks").exists()):
        raise ToolError("nothing executed yet: build it first")
    BUILD.mkdir(exist_ok=True)
    archive = source_archive(BUILD / SOURCE_ARCHIVE)
    # Chapter 11's calculator: ddp_scripts/fit's rules in JavaScript, made here, never committed.
    calculator = BUILD / "fit-rules.js"
    if subprocess.run([sys.executable, "-m", "ddp_scripts.fit.page", str(calculator)], cwd=ROOT).returncode:
        raise ToolError("python -m ddp_scripts.fit.page failed (above): the calculator's script")
    for edition in editions:   # the translation's notebooks are made again from the execution
        stage(edition, notebooks=not args.render_only or edition is translation)
        shutil.copy2(archive, edition.src / "book" / SOURCE_ARCHIVE)   # how-to-run links it
        shutil.copy2(calculator, edition.src / "_assets" / calculator.name)   # into _static/
    if not args.render_only and not execute(EXECUTED):
        print("error: a notebook failed to execute (see above); the book was not built", file=sys.stderr)
        return 1
    copy_outputs(EXECUTED, translation)
    for edition in editions:
        write_execution_times(edition)
        for path, notebook in notebooks_in(edition.src / "notebooks"):
            shorten_tracebacks(notebook, edition.name)
        # The outputs name the executed copy's paths, which the page leaves out.
        gpu_recordings.prepare(sorted((edition.src / "notebooks").glob("*.ipynb")),
                               build_copy=EXECUTED.src,
                               recordings_root=edition.src / "results" / "gpu-runs",
                               language=edition.name)
    return max(render(editions).values())
