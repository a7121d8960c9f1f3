"""Build the book: execute every notebook once, with nbmake, then render the HTML.

    python book/tools/build.py          # what `make book` runs
    python book/tools/build.py --render-only   # re-render the last executed copy

1. The sources are copied to _build/src, so the committed notebooks stay without outputs.
2. pytest --nbmake --overwrite executes each notebook there, one after the other (several
   of them time things, and must not share the two cores with another notebook).
3. The execution-times page is written from nbmake's timings.
4. jupyter-book renders _build/src with execution off (the outputs are already in), and
   fails on any warning. The site lands in _build/html.
"""
import argparse
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "_build"
SRC = BUILD / "src"
HTML = BUILD / "html"
SOURCES = ["_config.yml", "_toc.yml", "book", "notebooks", "ddp_scripts", "results"]
TIMINGS = BUILD / "notebook-timings.xml"
NOTEBOOK_TIMEOUT_S = 900


def stage():
    """A fresh copy of the book's sources in _build/src."""
    if SRC.exists():
        shutil.rmtree(SRC)
    SRC.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", "*.pyc")
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, SRC / name, ignore=ignore)
        elif source.exists():
            shutil.copy2(source, SRC / name)


def execute():
    """Run every notebook of the copy with nbmake, outputs written back into the copy."""
    command = [sys.executable, "-m", "pytest", "--nbmake", "--overwrite",
               f"--nbmake-timeout={NOTEBOOK_TIMEOUT_S}", "-p", "no:cacheprovider",
               f"--junitxml={TIMINGS}", "-o", "junit_family=xunit1", "--rootdir", str(SRC),
               str(SRC / "notebooks")]
    print("+", " ".join(command), flush=True)
    return subprocess.run(command, cwd=SRC).returncode


def write_execution_times():
    """book/execution-times.md in the copy: how long each chapter took to execute."""
    rows = []
    for case in ET.parse(TIMINGS).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        name = Path(case.get("file") or case.get("name")).name
        rows.append((name, float(case.get("time", 0)), "failed" if failed else "passed"))
    page = SRC / "book" / "execution-times.md"
    lines = ["# Execution times", "",
             "How long each chapter took to execute, top to bottom, in the build that "
             "produced this site (`make book`, on the build machine's CPUs, one notebook "
             "at a time).", "",
             "| Chapter | Seconds | Result |", "| --- | ---: | --- |"]
    lines += [f"| {name} | {seconds:.1f} | {result} |" for name, seconds, result in sorted(rows)]
    lines += ["", f"Total: {sum(r[1] for r in rows):.1f} s.", ""]
    page.write_text("\n".join(lines))


def render():
    command = [sys.executable, "-m", "jupyter_book", "build", str(SRC), "-W", "-n",
               "--keep-going"]
    print("+", " ".join(command), flush=True)
    status = subprocess.run(command, cwd=ROOT).returncode
    if status == 0:
        if HTML.exists():
            shutil.rmtree(HTML)
        shutil.copytree(SRC / "_build" / "html", HTML)
        print(f"The book is in {HTML / 'index.html'}")
    return status


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render-only", action="store_true",
                        help="skip execution; render the copy executed last time")
    args = parser.parse_args()
    if not args.render_only:
        stage()
        if execute() != 0:
            print("error: a notebook failed to execute (see above); the book was not built",
                  file=sys.stderr)
            return 1
        write_execution_times()
    elif not TIMINGS.exists():
        print("error: nothing executed yet: run without --render-only first", file=sys.stderr)
        return 2
    return render()


if __name__ == "__main__":
    sys.exit(main())
