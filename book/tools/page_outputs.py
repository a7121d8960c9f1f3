"""The executed copies of the chapters, made ready for the page (run by build.py before rendering).

Two changes to the outputs of _build/src/notebooks/*.ipynb, none to the committed notebooks
(a run's lines, which the launcher echoes as they come, one stream output each, are shown
as one block by myst-nb itself: `nb_merge_streams` in _config.yml):

- The build machine's paths and name are taken out: the build copy and the repository become
  `.`, the virtual environment `VENV`, the Python installation `PYTHON`, the home folder `~`,
  the host name `HOST`. (Tracebacks name the files of the build's .venv; a page is no place
  for where the book happened to be built.)
- Every cell tagged `gpu-output` gets, after its own outputs, what it printed on the recorded
  GPU machines (book/tools/gpu_recordings.py), labelled, or said to be stale.

The display tags (`hide-input`, `gpu-output`, `multi-gpu`) are taken from the committed
notebook, cell by cell id, so `build.py --render-only` shows a change of tags without running
the notebooks again. Each change can be made again on the same copy (`build.py --render-only`) with the same result.
"""
import os
import re
import socket
import sys
from pathlib import Path

from book.tools import gpu_recordings
from book.tools.notebooks import read_notebook, write_notebook

ROOT = Path(__file__).resolve().parents[2]
TEXT_FIELDS = ("text/plain", "text/html", "text/markdown", "text/latex")
DISPLAY_TAGS = ("hide-input", gpu_recordings.GPU_TAG, gpu_recordings.MULTI_GPU_TAG)


def machine_names(build_copy=None):
    """[(string, replacement)], longest first: what identifies the build machine."""
    pairs = {}
    for path, name in [(build_copy, "."), (ROOT, "."),
                       (sys.prefix, "VENV"), (sys.base_prefix, "PYTHON"),
                       (os.environ.get("VIRTUAL_ENV"), "VENV"), (Path.home(), "~")]:
        if not path:
            continue
        for form in {str(Path(path)), str(Path(path).resolve())}:
            if form not in ("/", "") and len(form) > 1:
                pairs[form] = name
    return sorted(pairs.items(), key=lambda pair: -len(pair[0]))


def scrubber(build_copy=None):
    """A function str -> str that takes the build machine's paths and name out of a text."""
    names = machine_names(build_copy)
    paths = re.compile("|".join(rf"{re.escape(path)}(?=[/\\\s'\":,)\]]|$)"
                                for path, _ in names))
    replacement = dict(names)
    host = socket.gethostname().split(".")[0]
    host_pattern = (re.compile(rf"(?<![\w.-]){re.escape(host)}(?![\w-])")
                    if len(host) >= 3 and host not in ("localhost", "HOST") else None)

    def scrub(text):
        text = paths.sub(lambda match: replacement[match.group(0)], text)
        return host_pattern.sub("HOST", text) if host_pattern else text
    return scrub


def _apply(value, scrub):
    if isinstance(value, list):
        return [scrub(item) if isinstance(item, str) else item for item in value]
    return scrub(value) if isinstance(value, str) else value


def scrub_outputs(outputs, scrub):
    for output in outputs:
        if "text" in output:
            output["text"] = _apply(output["text"], scrub)
        if "traceback" in output:
            output["traceback"] = _apply(output["traceback"], scrub)
        if "evalue" in output:
            output["evalue"] = _apply(output["evalue"], scrub)
        for key in TEXT_FIELDS:
            if key in output.get("data", {}):
                output["data"][key] = _apply(output["data"][key], scrub)
    return outputs


def sync_display_tags(notebook, committed):
    """The display tags of each cell as the committed notebook has them (matched by cell id)."""
    if not committed.exists():
        return
    tags = {cell.get("id"): cell.get("metadata", {}).get("tags", [])
            for cell in read_notebook(committed)["cells"]}
    for cell in notebook["cells"]:
        if cell.get("id") not in tags:
            continue
        kept = [tag for tag in cell.get("metadata", {}).get("tags", []) if tag not in DISPLAY_TAGS]
        wanted = kept + [tag for tag in tags[cell.get("id")] if tag in DISPLAY_TAGS]
        if wanted:
            cell.setdefault("metadata", {})["tags"] = wanted
        else:
            cell.get("metadata", {}).pop("tags", None)


def prepare(notebooks, build_copy=None, recordings_root=None, report=print,
            committed_dir=ROOT / "notebooks", language="en"):
    """Make every executed notebook ready for the page, in place. Returns the stale lines."""
    root = recordings_root or (Path(build_copy) / "results" / "gpu-runs" if build_copy
                               else gpu_recordings.RECORDINGS)
    recordings = gpu_recordings.load_recordings(root)   # each cell: the newest that has it
    scrub = scrubber(build_copy)
    stale, shown = [], 0
    for path in notebooks:
        path = Path(path)
        notebook = read_notebook(path)
        sync_display_tags(notebook, Path(committed_dir) / path.name)
        for cell in notebook["cells"]:
            if cell["cell_type"] == "code":
                cell["outputs"] = scrub_outputs(cell.get("outputs", []), scrub)
        stale += gpu_recordings.annotate(notebook, path.name, recordings, language)
        shown += len(gpu_recordings.gpu_cells(notebook))
        write_notebook(path, notebook)
    report(f"GPU recordings: {len(recordings)} recorded run(s) "
           f"({', '.join(run['date'] + ' ' + run['hardware'].split(',')[0] for _, run, _ in recordings) or 'none'}) "
           f"shown in {shown} gpu-output cells; {len(stale)} stale")
    for line in stale:
        report(f"warning: {line}: the page says so; run `make gpu-check` on a GPU machine "
               f"to record it again")
    return stale
