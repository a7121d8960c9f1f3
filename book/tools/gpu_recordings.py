"""Recorded GPU runs: what the `gpu-output` cells printed on a GPU machine, shown on the pages.

results/gpu-runs/<date>-<hardware>/ (by `make gpu-check`): cells.json, each tagged cell's code hash and
outputs; run.json, the label; conditions.json, how each notebook ran. prepare() is build.py's page step.
"""
import hashlib
import html
import itertools
import json
import os
import re
import socket
import sys
from pathlib import Path

from book.tools import ROOT, words
from book.tools.notebooks import joined, read_notebook, source_of, tags_of, write_notebook
from ddp_scripts.measure import links

RECORDINGS = ROOT / "results" / "gpu-runs"
CELLS_FILE, RUN_FILE, CONDITIONS_FILE = "cells.json", "run.json", "conditions.json"
GPU_TAG, MULTI_GPU_TAG = "gpu-output", "multi-gpu"
MARKER = "gpu_recording"     # metadata key of the outputs this module adds to a cell


def read_json(path, default=None):
    return json.loads(Path(path).read_text(encoding="utf-8")) if Path(path).exists() else default


def write_json(path, data):
    Path(path).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def source_hash(source):
    """sha256 of a cell's code, blind to trailing spaces and the final newline."""
    lines = [line.rstrip() for line in source.replace("\r\n", "\n").strip("\n").split("\n")]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def gpu_cells(notebook):
    return [cell for cell in notebook["cells"]
            if cell["cell_type"] == "code" and GPU_TAG in tags_of(cell)]


def merge_streams(outputs):
    """Consecutive streams of one name as one: a run's lines, one block on the page."""
    merged = []
    for (stream, _), run in itertools.groupby(outputs, lambda o: (o.get("output_type") == "stream", o.get("name"))):
        run = list(run)
        merged += [dict(run[0], text="".join(joined(output["text"]) for output in run))] if stream else run
    return merged


def record(executed, committed):
    """{cell id: code hash and outputs} of the committed notebook's gpu-output cells as they ran."""
    ran = {cell.get("id"): cell for cell in read_notebook(executed)["cells"]}
    return {cell["id"]: {"source_sha256": source_hash(source_of(ran[cell["id"]])),
                         "outputs": merge_streams(ran[cell["id"]].get("outputs", []))}
            for cell in gpu_cells(read_notebook(committed)) if cell["id"] in ran}


def load_recordings(root=RECORDINGS):
    """[(folder, run, cells)], oldest first; run["conditions"] is the folder's conditions.json."""
    folders = [folder for folder in sorted(Path(root).glob("*"))
               if (folder / RUN_FILE).exists() and (folder / CELLS_FILE).exists()]
    return [(folder, {"conditions": read_json(folder / CONDITIONS_FILE), **read_json(folder / RUN_FILE)},
             read_json(folder / CELLS_FILE)) for folder in folders]


def newest_with(recordings, name, cell_id):
    """Per hardware, the newest recording that has this cell, else the newest of that hardware."""
    ordered = sorted(recordings, key=lambda recording: recording[0].name)
    newest = {recording[1]["hardware"]: recording for recording in ordered}
    having = {recording[1]["hardware"]: recording for recording in ordered if cell_id in recording[2].get(name, {})}
    return [having.get(machine, newest[machine]) for machine in newest]


def text_of(output):
    """What a reader sees of one output as text (images and HTML are the caller's)."""
    if output.get("output_type") == "stream":
        text = joined(output.get("text", ""))
    elif output.get("output_type") == "error":
        text = f"{output.get('ename')}: {output.get('evalue', '')}\n"
    else:
        text = joined(output.get("data", {}).get("text/plain", "")) + "\n"
    return links.ESCAPE_CODES.sub("", text)


def page_output(output):
    """A recorded output for the page: a figure or a table as it was, text as display data (myst-nb
    would merge a stream into the build machine's, above the label)."""
    data = output.get("data", {})
    if "image/png" in data or "<table" in joined(data.get("text/html", "")):
        data = {kind: data[kind] for kind in ("image/png", "text/html", "text/plain") if kind in data}
    else:
        data = {"text/plain": text_of(output)}
    return {"output_type": "display_data", "metadata": {MARKER: "output"}, "data": data}


def conditions_html(run, name, language="en"):
    """How this notebook was recorded ('' if unknown); loaded: several notebooks at once, or a load
    before it of half the cores or more (chapter 7's rule)."""
    conditions, text = run.get("conditions"), words(language)
    if not conditions:
        return ""
    mine = conditions.get("notebooks", {}).get(name, {})
    before = (mine.get("load_average_before") or [None])[0]
    after = (mine.get("load_average_after") or ["?"])[0]
    cores, concurrent = conditions.get("cores"), conditions.get("concurrent_notebooks", 1)
    busy = before is not None and bool(cores) and before >= cores / 2
    load = (text["gpu_no_load"] if before is None
            else text["gpu_load"].format(before=before, after=after, cores=cores))
    if concurrent == 1 and not busy:
        return f'<p class="gpu-recording-conditions">{text["gpu_alone"].format(load=load)}</p>'
    how = (text["gpu_concurrent"].format(n=concurrent) if concurrent > 1 else text["gpu_busy"]) + load
    return f'<p class="gpu-recording-conditions gpu-recording-loaded">{text["gpu_loaded"].format(how=how)}</p>'


def state_of(entry, current_hash):
    """A box's state: "current" (recorded from this code), "stale" (from older code) or
    "missing" (this cell not recorded on that machine)."""
    return "missing" if entry is None else "stale" if entry["source_sha256"] != current_hash else "current"


def box_counts_by_notebook(notebooks, recordings_root=RECORDINGS):
    """{notebook name: {"boxes", "current", "stale", "missing"}}: how many boxes of recorded GPU
    output each page of `notebooks` shows, as annotate makes them (one per gpu-output cell and
    recorded machine), by state; a notebook without a gpu-output cell is left out."""
    recordings, counted = load_recordings(recordings_root), {}
    for path in map(Path, notebooks):
        counts = dict.fromkeys(("current", "stale", "missing"), 0)
        for cell in gpu_cells(read_notebook(path)):
            for _, _, cells in newest_with(recordings, path.name, cell["id"]):
                counts[state_of(cells.get(path.name, {}).get(cell["id"]), source_hash(source_of(cell)))] += 1
        if any(counts.values()):
            counted[path.name] = {"boxes": sum(counts.values()), **counts}
    return counted


def box_counts(notebooks, recordings_root=RECORDINGS):
    """The boxes of all `notebooks` together, by state: {"boxes", "current", "stale", "missing"}.
    The front page states them (build.py)."""
    total = dict.fromkeys(("boxes", "current", "stale", "missing"), 0)
    for counts in box_counts_by_notebook(notebooks, recordings_root).values():
        total = {state: total[state] + counts[state] for state in total}
    return total


def box(run, entry, current_hash, multi_gpu, language="en", name=""):
    """(outputs, stale): one recording's box for a cell, a line (the GPU, torch, the date, and
    whether it is current) with the rest collapsed, then what the cell printed there."""
    text = words(language)
    title = html.escape(f"{run['hardware']}; {run['date']}; commit {run['commit']}")
    state = state_of(entry, current_hash)
    conditions = "" if entry is None else conditions_html(run, name, language)
    said = text[f"gpu_{state}"].format(title=title)
    shown = f'<p class="gpu-recording-label">{said}</p>' + conditions
    if multi_gpu and run.get("gpus", 0) < 2:
        shown += f'<p class="gpu-recording-multi">{text["gpu_one_gpu"]}</p>'
    if entry is not None and not entry["outputs"]:
        shown += f"<p><em>{text['gpu_no_output']}</em></p>"
    torch = re.search(r"torch ([^\s,;]+)", run["hardware"])
    line = text[f"gpu_header_{state}"].format(gpu=run["hardware"].split(";")[0].strip(), date=run["date"],
                                              torch=torch.group(1) if torch else "?")
    line += text["gpu_header_loaded"] if "gpu-recording-loaded" in conditions else ""
    kind = "gpu-recording-current" if state == "current" else "gpu-recording-stale"
    page = (f'<div class="gpu-recording {kind}"><details><summary class="gpu-recording-header">'
            f"{html.escape(line)}</summary>{shown}</details></div>")
    label = {"output_type": "display_data", "metadata": {MARKER: "label"},
             "data": {"text/html": page, "text/plain": re.sub(r"<[^>]+>", " ", page)}}
    return [label, *map(page_output, entry["outputs"] if entry else [])], state != "current"


def added_cell(cell):
    """A cell that annotate added below a figure for its recordings."""
    outputs = cell.get("outputs", [])
    return (str(cell.get("id", "")).endswith("-gpu") and bool(outputs)
            and all(MARKER in o.get("metadata", {}) for o in outputs))


def annotate(notebook, name, recordings, language="en"):
    """Give every gpu-output cell its recordings' boxes, in place, replacing any added before; returns
    the stale lines."""
    stale_lines = []
    notebook["cells"] = [cell for cell in notebook["cells"] if not added_cell(cell)]
    for cell in gpu_cells(notebook):
        own = [o for o in cell.get("outputs", []) if MARKER not in o.get("metadata", {})]
        recorded = []
        for folder, run, cells in newest_with(recordings, name, cell["id"]):
            entry = cells.get(name, {}).get(cell["id"])
            shown, stale = box(run, entry, source_hash(source_of(cell)), MULTI_GPU_TAG in tags_of(cell),
                               language, name)
            recorded += shown
            if stale:
                why = "not recorded" if entry is None else "its code changed since"
                stale_lines.append(f"stale GPU recording: {name} cell {cell['id']} in "
                                   f"results/gpu-runs/{folder.name} ({why})")
        cell["outputs"] = own + recorded
        if recorded and "figure" in cell.get("metadata", {}).get("mystnb", {}):
            # myst-nb puts each display output of a figure cell in that figure: the recorded
            # figure goes in a cell of its own just below, its box labelling it.
            cell["outputs"] = own
            below = {"cell_type": "code", "id": f"{cell['id']}-gpu", "metadata": {"tags": ["remove-input"]},
                     # myst-nb leaves out a cell with no code at all
                     "source": "# what the cell above printed on a GPU",
                     "execution_count": None, "outputs": recorded}
            notebook["cells"].insert(notebook["cells"].index(cell) + 1, below)
    return stale_lines


def scrubber(build_copy=None):
    """A function str -> str that takes the build machine's paths and host name out of a text."""
    places = [(build_copy, "."), (ROOT, "."), (sys.prefix, "VENV"), (sys.base_prefix, "PYTHON"),
              (os.environ.get("VIRTUAL_ENV"), "VENV"), (Path.home(), "~")]
    names = {str(form): name for path, name in places if path for form in (Path(path), Path(path).resolve())}
    longest_first = sorted((form for form in names if len(form) > 1), key=len, reverse=True)
    paths = re.compile("|".join(rf"{re.escape(form)}(?=[/\\\s'\":,)\]]|$)" for form in longest_first))
    host = socket.gethostname().split(".")[0]
    # A short or generic host name would match ordinary words: left as it is.
    host_name = (re.escape(host) if len(host) >= 3 and host not in ("localhost", "HOST") else "(?!)")
    host_name = re.compile(rf"(?<![\w.-]){host_name}(?![\w-])")
    return lambda text: host_name.sub("HOST", paths.sub(lambda found: names[found.group(0)], text))


TEXT_FIELDS = {"text", "traceback", "evalue", "text/plain", "text/html", "text/markdown", "text/latex"}


def scrub_outputs(outputs, scrub):
    """The outputs, every text in them (a string or a list of strings) scrubbed in place."""
    for output in outputs:
        for fields in (output, output.get("data", {})):
            for key in TEXT_FIELDS & set(fields):
                text = fields[key]
                fields[key] = [scrub(part) for part in text] if isinstance(text, list) else scrub(text)
    return outputs


def prepare(notebooks, build_copy=None, recordings_root=RECORDINGS, report=print, language="en"):
    """Make every executed notebook ready for the page, in place. Returns the stale lines."""
    recordings, scrub = load_recordings(recordings_root), scrubber(build_copy)
    stale, shown = [], 0
    for path in map(Path, notebooks):
        notebook = read_notebook(path)
        for cell in notebook["cells"]:
            scrub_outputs(cell.get("outputs", []), scrub)
        stale += annotate(notebook, path.name, recordings, language)
        shown += len(gpu_cells(notebook))
        write_notebook(path, notebook)
    runs = ", ".join(f"{run['date']} {run['hardware'].split(',')[0]}" for _, run, _ in recordings)
    report(f"GPU recordings: {len(recordings)} recorded run(s) ({runs or 'none'}) shown in {shown} "
           f"gpu-output cells; {len(stale)} stale")
    for line in stale:
        report(f"warning: {line}: the page says so; run `make gpu-check` on a GPU machine to record "
               "it again")
    return stale

