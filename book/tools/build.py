"""Build the book: execute every notebook once, with nbmake, then render the HTML.

    python book/tools/build.py                 # what `make book` runs
    python book/tools/build.py --render-only   # re-render the notebooks executed last time
                                               # with the current front matter and config

1. The sources are copied to _build/src, so the committed notebooks stay without outputs.
   In the copy, a chapter's title loses its number ("# 5. DDP" -> "# DDP"): the table of
   contents numbers the chapters, and the number would otherwise show twice. The committed
   notebook keeps it, for readers who open it alone (on Colab, say). Code cells tagged
   `solution` get the tag `hide-cell`: on the page they are collapsed, like {solution}s.
   JUPYTERHUB_URL, when set, replaces launch_buttons.jupyterhub_url in the copy's _config.yml.
2. pytest --nbmake --overwrite executes each notebook there, one after the other (several
   of them time things, and must not share the cores with another notebook).
3. The execution-times page is written from nbmake's timings, and the executed copies are
   made ready for the page (book/tools/page_outputs.py): consecutive stream outputs of one
   name become one block, the build machine's paths and name are taken out of the outputs,
   and every cell tagged `gpu-output` gets the output recorded on GPU machines
   (results/gpu-runs/, book/tools/gpu_recordings.py), labelled, and marked stale where the
   cell's code changed since; stale recordings are also listed in the build's output.
   The site's JavaScript (widgets, require.js, MathJax) is unpacked into the copy from the
   pinned npm packages of book/tools/offline_assets.py, so the pages need no CDN.
4. jupyter-book renders _build/src with execution off (the outputs are already in), from
   scratch, and fails on any warning. The site lands in _build/html; its downloadable
   notebooks (the executed copies) get their numbered titles back.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import offline_assets  # noqa: E402
import page_outputs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "_build"
SRC = BUILD / "src"
HTML = BUILD / "html"
FRONT_MATTER = ["_config.yml", "_toc.yml", "book", "results"]
SOURCES = FRONT_MATTER + ["notebooks", "ddp_scripts"]
TIMINGS = BUILD / "notebook-timings.xml"
MACHINE = BUILD / "notebook-machine.txt"   # what the timings were measured on
NOTEBOOK_TIMEOUT_S = 900
NUMBERED_TITLE = re.compile(r"\A(\s*#\s+)\d+\.\s+")


class BuildError(Exception):
    """Bad input to the build: reported as one line, exit status 2."""


def stage(notebooks=True):
    """A fresh copy of the book's sources in _build/src.

    With notebooks=False (--render-only), only the front matter and the configuration are
    refreshed: the executed notebooks, and the scripts they ran, stay as they were.
    """
    names = SOURCES if notebooks else FRONT_MATTER
    if notebooks and SRC.exists():
        shutil.rmtree(SRC)
    SRC.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", "*.pyc")
    for name in names:
        source, target = ROOT / name, SRC / name
        if target.is_dir():
            shutil.rmtree(target)
        if source.is_dir():
            shutil.copytree(source, target, ignore=ignore)
        elif source.exists():
            shutil.copy2(source, target)
    if notebooks:
        for notebook in sorted((SRC / "notebooks").glob("*.ipynb")):
            prepare_for_the_book(notebook)
        # nbmake skips notebooks under a `_build` folder; this plugin collects them.
        shutil.copy2(ROOT / "book" / "tools" / "nbmake_build_copy.py", SRC / "conftest.py")
    hub = jupyterhub_url()
    if hub:
        set_jupyterhub_url(SRC / "_config.yml", hub)
    try:
        versions = offline_assets.install(SRC / "_assets")
    except offline_assets.AssetError as error:
        raise BuildError(str(error)) from None
    print("Served from the site: " + ", ".join(f"{name}@{version}"
                                               for name, version in versions.items()), flush=True)


def prepare_for_the_book(notebook):
    """Two changes to the build copy of a chapter, for the page (not for the notebook):

    - '# 5. Distributed data parallel' -> '# Distributed data parallel' in the first cell;
    - code cells tagged `solution` are collapsed (tag `hide-cell`), like the {solution}s.
    """
    data = json.loads(notebook.read_text())
    cells = data.get("cells", [])
    if cells and cells[0].get("cell_type") == "markdown":
        source = "".join(cells[0]["source"])
        cells[0]["source"] = NUMBERED_TITLE.sub(r"\1", source, count=1)
    for cell in cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if "solution" in tags and not {"hide-cell", "remove-cell"} & set(tags):
            cell["metadata"]["tags"] = [*tags, "hide-cell"]
    notebook.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def restore_titles(folder):
    """The downloadable notebooks (the executed copies) get their numbered titles back."""
    for notebook in sorted(folder.glob("*.ipynb")):
        committed = ROOT / "notebooks" / notebook.name
        if not committed.exists():
            continue
        title = json.loads(committed.read_text())["cells"][0]
        data = json.loads(notebook.read_text())
        if data["cells"] and data["cells"][0].get("cell_type") == "markdown" == title["cell_type"]:
            data["cells"][0]["source"] = title["source"]
            notebook.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def jupyterhub_url():
    """JUPYTERHUB_URL from the environment ('' when unset); a bad value stops the build."""
    hub = os.environ.get("JUPYTERHUB_URL", "").strip()
    if hub and not re.fullmatch(r"https?://[^\s/]+(/[^\s]*)?", hub):
        raise BuildError(f"JUPYTERHUB_URL must be an http(s) address, got {hub!r}")
    return hub.rstrip("/")


def set_jupyterhub_url(config_path, hub):
    config = yaml.safe_load(config_path.read_text())
    config.setdefault("launch_buttons", {})["jupyterhub_url"] = hub
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    print(f"JupyterHub launch buttons point at {hub}", flush=True)


def execute():
    """Run every notebook of the copy with nbmake, outputs written back into the copy."""
    TIMINGS.unlink(missing_ok=True)
    command = [sys.executable, "-m", "pytest", "--nbmake", "--overwrite",
               f"--nbmake-timeout={NOTEBOOK_TIMEOUT_S}", "-p", "no:cacheprovider",
               f"--junitxml={TIMINGS}", "-o", "junit_family=xunit1",
               "-o", "addopts=",  # the repository's test options are not for this run
               "--rootdir", str(SRC),
               str(SRC / "notebooks")]
    print("+", " ".join(command), flush=True)
    MACHINE.write_text(describe_machine() + "\n")
    return subprocess.run(command, cwd=SRC).returncode


def write_execution_times():
    """book/execution-times.md in the copy: how long each chapter took to execute."""
    rows = []
    for case in ET.parse(TIMINGS).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        name = Path(case.get("file") or case.get("name")).stem
        rows.append((name, float(case.get("time", 0)), "failed" if failed else "passed"))
    page = SRC / "book" / "execution-times.md"
    machine = MACHINE.read_text().strip() if MACHINE.exists() else "an unrecorded machine"
    lines = ["# Execution times", "",
             "How long each chapter took to execute, top to bottom, in the build that "
             "produced this site: `make book` runs every notebook once with nbmake, one "
             f"after the other, on the build machine ({machine}).", "",
             "| Chapter | Notebook | Seconds | Result |", "| --- | --- | ---: | --- |"]
    lines += [f"| {{doc}}`../notebooks/{name}` | `{name}.ipynb` | {seconds:.1f} | {result} |"
              for name, seconds, result in sorted(rows)]
    lines += ["", f"Total: {sum(r[1] for r in rows):.1f} s.", ""]
    page.write_text("\n".join(lines))


def describe_machine():
    """The build machine, as the execution times were measured on it."""
    sys.path.insert(0, str(ROOT))
    from ddp_scripts.hardware import describe_hardware
    return describe_hardware()["label"]


def render():
    """The HTML, from scratch (--all), failing on any warning."""
    command = [sys.executable, "-c", "from jupyter_book.cli.main import main; main()",
               "build", str(SRC), "--all", "-W", "-n", "--keep-going"]
    print("+", " ".join(command), flush=True)
    start = time.perf_counter()
    status = subprocess.run(command, cwd=ROOT).returncode
    seconds = time.perf_counter() - start
    if status == 0:
        if HTML.exists():
            shutil.rmtree(HTML)
        shutil.copytree(SRC / "_build" / "html", HTML)
        restore_titles(HTML / "_sources" / "notebooks")
        print(f"Rendered in {seconds:.1f} s. The book is in {HTML / 'index.html'}", flush=True)
    else:
        print(f"error: jupyter-book failed (exit status {status}, warnings count as errors); "
              f"_build/html was left as it was", file=sys.stderr)
    return status


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render-only", action="store_true",
                        help="skip execution: render the notebooks executed last time, with "
                             "the current front matter and configuration")
    args = parser.parse_args()
    try:
        jupyterhub_url()
        if args.render_only:
            if not (TIMINGS.exists() and (SRC / "notebooks").exists()):
                raise BuildError("nothing executed yet: run without --render-only first")
            stage(notebooks=False)
        else:
            stage()
            if execute() != 0:
                print("error: a notebook failed to execute (see above); the book was not "
                      "built", file=sys.stderr)
                return 1
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    write_execution_times()
    page_outputs.prepare(sorted((SRC / "notebooks").glob("*.ipynb")), build_copy=SRC)
    return render()


if __name__ == "__main__":
    sys.exit(main())
