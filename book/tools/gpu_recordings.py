"""Recorded GPU runs: what the GPU-dependent cells printed on a real GPU machine.

The book is built on whatever machine runs `make book`, often one without a GPU, where every
GPU branch prints what it would show. A recorded run (results/gpu-runs/<date>-<hardware>/)
holds what those cells printed when the notebooks ran on a GPU machine: written by
`make gpu-check` (book/tools/gpu_check.py) from the executed notebooks, never by hand.

    python -m book.tools recordings record EXECUTED_DIR OUT_DIR --results RESULTS.json...
        --commit C   # OUT_DIR/cells.json from the executed notebooks, OUT_DIR/run.json labelled
                     # from the benchmark's results file (hardware, date), the results files
                     # copied beside them without terminal escape codes
    python -m book.tools recordings status   # every recording: current or stale, per cell
    python -m book.tools recordings conditions FOLDER --concurrent-notebooks 4 --source TEXT
                     # FOLDER/conditions.json for a recording made before gpu_check.py wrote one

Which cells depend on a GPU is said once, in the committed notebooks, by cell tags:
`gpu-output` (its output differs on a GPU machine) and, with it, `multi-gpu` (what it shows
needs two or more GPUs). A recording keeps, for each tagged cell (found by its cell id), a
hash of the source that ran and the outputs as nbformat wrote them. At build time
(book/tools/build.py) every tagged cell gets, after its own outputs, per recording a labelled
box and then the outputs recorded there, as outputs of the cell that myst-nb renders like the
build machine's (figures, tables, text); a recording whose source hash differs from the
cell's source now is marked stale on the page and in the build's output, never shown as
current.

How a recording was made goes with it, in its conditions.json: how many notebooks ran at once,
the machine's cores, and each notebook's load average (1 min) before and after it ran. Every box
says so: a recording made while other work ran ("loaded": several notebooks at once, or a load
before the notebook of half the cores or more, the rule chapter 7 applies to benchmark files)
is labelled loaded, with the load it recorded, so no timing from a loaded machine is shown as
if the machine had been idle. Several recordings of the same hardware (several calls of
`make gpu-check --budget`, each recording what it had time for) are one source: each cell shows
the newest recording of that hardware that has it.
"""
import argparse
import copy
import hashlib
import html
import json
import re
import sys
from pathlib import Path

from book.tools.notebooks import read_notebook
from ddp_scripts import hardware

ROOT = Path(__file__).resolve().parents[2]
RECORDINGS = ROOT / "results" / "gpu-runs"
CELLS_FILE = "cells.json"
RUN_FILE = "run.json"
CONDITIONS_FILE = "conditions.json"
GPU_TAG = "gpu-output"
MULTI_GPU_TAG = "multi-gpu"
MARKER = "gpu_recording"     # metadata key of the outputs this module adds to a cell


def source_of(cell):
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def source_hash(source):
    """sha256 of a cell's code, blind to trailing spaces and the final newline."""
    lines = [line.rstrip() for line in source.replace("\r\n", "\n").strip("\n").split("\n")]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def tags_of(cell):
    return cell.get("metadata", {}).get("tags", [])


def gpu_cells(notebook):
    """The code cells tagged gpu-output, in order."""
    return [cell for cell in notebook["cells"]
            if cell["cell_type"] == "code" and GPU_TAG in tags_of(cell)]


def merge_streams(outputs):
    """Consecutive stream outputs of the same name (stdout, stderr) as one output."""
    merged = []
    for output in outputs:
        previous = merged[-1] if merged else None
        if (output.get("output_type") == "stream" and previous is not None
                and previous.get("output_type") == "stream"
                and previous.get("name") == output.get("name")):
            previous["text"] = source_of({"source": previous["text"]}) + source_of(
                {"source": output["text"]})
        else:
            merged.append(copy.deepcopy(output))
    return merged


def record(executed_dir, committed_dir=ROOT / "notebooks", names=None):
    """{notebook name: {cell id: {...}}} for every gpu-output cell, from executed notebooks.

    The tags come from the committed notebooks (they say which cells depend on a GPU); the
    source hash and the outputs from the executed ones (what ran, and what it printed).
    names: only these notebooks (the ones that ran); default every one found executed.
    """
    cells = {}
    for committed in sorted(Path(committed_dir).glob("*.ipynb")):
        if names is not None and committed.name not in names:
            continue
        wanted = gpu_cells(read_notebook(committed))
        if not wanted:
            continue
        executed_path = Path(executed_dir) / committed.name
        if not executed_path.exists():
            continue
        executed = {cell.get("id"): cell for cell in read_notebook(executed_path)["cells"]}
        entries = {}
        for cell in wanted:
            ran = executed.get(cell.get("id"))
            if ran is None:
                continue
            outputs = [o for o in merge_streams(ran.get("outputs", []))
                       if MARKER not in o.get("metadata", {})]
            entries[cell["id"]] = {"source_sha256": source_hash(source_of(ran)),
                                   "execution_count": ran.get("execution_count"),
                                   "outputs": outputs}
        cells[committed.name] = entries
    return cells


ESCAPED_CODES = re.compile(r"\\u001b" + hardware.ESCAPE_SEQUENCE)   # as JSON writes them


def clean_results_file(source, target):
    """Copy a results file, with terminal escape codes (as JSON writes them) taken out.

    `nvidia-smi topo -m` underlines its header with escape codes, and the benchmark stores
    its output as it came; on a page they are noise. Everything else stays byte for byte.
    Returns how many escape codes were removed.
    """
    text = Path(source).read_text(encoding="utf-8")
    cleaned, count = ESCAPED_CODES.subn("", text)
    Path(target).write_text(cleaned, encoding="utf-8")
    return count


def write_json(path, data):
    Path(path).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def write_recording(folder, run, cells, conditions=None):
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / RUN_FILE, run)
    write_json(folder / CELLS_FILE, cells)
    if conditions is not None:
        write_json(folder / CONDITIONS_FILE, conditions)


RECORDED_LOAD = re.compile(r"load average \(1 min\) before/after the runs: ([\d.]+) / ([\d.]+) "
                           r"on (\d+) cores")


def conditions_of_earlier_run(cells, concurrent_notebooks, source, cores=None):
    """conditions.json for a recording made before gpu_check.py wrote one: how many notebooks
    ran at once (from its README or log: `source` says where), and the load averages that
    its own recorded outputs printed (chapter 7's benchmark cell prints them)."""
    notebooks = {}
    for name, entries in cells.items():
        for cell_id, entry in entries.items():
            for output in entry["outputs"]:
                found = RECORDED_LOAD.search(text_of(output))
                if found:
                    before, after, cores = float(found[1]), float(found[2]), int(found[3])
                    notebooks[name] = {"load_average_before": [before],
                                       "load_average_after": [after],
                                       "load_from": f"cell {cell_id}'s output: the load before "
                                                    "and after its benchmark runs"}
    return {"concurrent_notebooks": concurrent_notebooks, "cores": cores, "source": source,
            "notebooks": notebooks}


def notebook_conditions(run, name):
    """(loaded, concurrent, load before, load after, cores) of one notebook of a recording;
    None when the recording says nothing about how it was made."""
    conditions = run.get("conditions")
    if not conditions:
        return None
    mine = conditions.get("notebooks", {}).get(name, {})
    before = (mine.get("load_average_before") or [None])[0]
    after = (mine.get("load_average_after") or [None])[0]
    cores = conditions.get("cores")
    concurrent = conditions.get("concurrent_notebooks", 1)
    loaded = concurrent > 1 or (before is not None and cores and before >= cores / 2)
    return loaded, concurrent, before, after, cores


def run_from_results(results_file, commit, note=""):
    """run.json's contents from a benchmark results file: its hardware and the day it ran."""
    data = json.loads(Path(results_file).read_text(encoding="utf-8"))
    return {"hardware": hardware.hardware_label(data["hardware"]),
            "gpus": len(data["hardware"]["gpus"]), "date": data["created"][:10],
            "commit": commit, "note": note}


def latest_per_hardware(recordings):
    """Of several recordings of the same hardware, the newest only (folders start with dates)."""
    newest = {}
    for recording in recordings:
        folder, run, _ = recording
        known = newest.get(run["hardware"])
        if known is None or folder.name > known[0].name:
            newest[run["hardware"]] = recording
    return [r for r in recordings if newest[r[1]["hardware"]] is r]


def load_recordings(root=RECORDINGS):
    """[(folder, run, cells)] for every recorded run, oldest first."""
    found = []
    for folder in sorted(Path(root).glob("*")):
        if (folder / RUN_FILE).exists() and (folder / CELLS_FILE).exists():
            run = json.loads((folder / RUN_FILE).read_text())
            if (folder / CONDITIONS_FILE).exists():
                run["conditions"] = json.loads((folder / CONDITIONS_FILE).read_text())
            found.append((folder, run, json.loads((folder / CELLS_FILE).read_text())))
    return found


def newest_with(recordings, name, cell_id):
    """Per hardware, the newest recording that has this cell (or, where none has it, the
    newest of that hardware): what a page shows for one cell."""
    newest, newest_having = {}, {}
    for recording in sorted(recordings, key=lambda r: r[0].name):   # folders start with dates
        machine = recording[1]["hardware"]
        newest[machine] = recording
        if cell_id in recording[2].get(name, {}):
            newest_having[machine] = recording
    return [newest_having.get(machine, newest[machine]) for machine in newest]


def label(run):
    """'1 x NVIDIA H200; Intel(R) Xeon(R) Processor, 16 cores; driver 580.159.04, torch
    2.11.0+cu130, CUDA 13.0; 2026-11-30; commit 27a4f98'."""
    return f"{run['hardware']}; {run['date']}; commit {run['commit']}"


# What the boxes say, in each edition's language ({title}: the recording's label).
WORDS = {
    "en": {
        "missing": "Not recorded on {title}: this cell is newer than the recording. Run "
                   "<code>make gpu-check</code> on a GPU machine to record it.",
        "stale": "<strong>Stale recording</strong> from {title}: this cell's code has changed "
                 "since, so what it prints there now is not known. Below, what the earlier "
                 "code printed. Run <code>make gpu-check</code> on a GPU machine to record it "
                 "again.",
        "current": "Recorded on a GPU machine ({title}): what this cell printed there. Above "
                   "it, what this build's machine printed.",
        "one_gpu": "No multi-GPU recording exists yet: this recording has one GPU, and this "
                   "cell shows its multi-GPU behaviour only with two or more.",
        "none": "No GPU recording exists yet.",
        "none_multi": " No multi-GPU recording exists yet either.",
        "no_output": "(no output)",
        "loaded": "<strong>Recorded on a loaded machine</strong>: {how}. Its timings are not "
                  "those of an idle machine.",
        "alone": "Recorded with this notebook alone on the machine ({load}).",
        "concurrent": "{n} notebooks ran at once there",
        "load": "load average (1 min) {before} → {after} while it ran, on {cores} cores",
        "busy_load": "other work was running: load average (1 min) {before} → {after} while it "
                     "ran, on {cores} cores",
        "no_load": "the load average was not recorded for this notebook",
    },
    "zh": {
        "missing": "{title} 上没有记录：这个单元比那次记录新。在有 GPU 的机器上运行 "
                   "<code>make gpu-check</code> 来记录它。",
        "stale": "<strong>过时的记录</strong>，来自 {title}：这个单元的代码此后改过，它现在在那里"
                 "会输出什么并不知道。下面是旧代码当时的输出。在有 GPU 的机器上运行 "
                 "<code>make gpu-check</code> 来重新记录。",
        "current": "在 GPU 机器上记录（{title}）：这个单元在那里的输出。上面是本次构建所用机器的"
                   "输出。",
        "one_gpu": "还没有多 GPU 的记录：这次记录只有一块 GPU，而这个单元要有两块或更多 GPU "
                   "才显示它的多 GPU 行为。",
        "none": "还没有 GPU 记录。",
        "none_multi": "也还没有多 GPU 的记录。",
        "no_output": "（没有输出）",
        "loaded": "<strong>记录时机器负载较重</strong>：{how}。其中的计时不是空闲机器上的结果。",
        "alone": "记录时机器上只运行着这一个笔记本（{load}）。",
        "concurrent": "当时有 {n} 个笔记本同时运行",
        "load": "运行期间的平均负载（1 分钟）从 {before} 变为 {after}，共 {cores} 个核",
        "busy_load": "当时还有别的任务在运行：运行期间的平均负载（1 分钟）从 {before} 变为 {after}，"
                     "共 {cores} 个核",
        "no_load": "这个笔记本的平均负载没有记录",
    },
}


def text_of(output):
    """What a reader sees of one output, as text (images and HTML handled by the caller)."""
    kind = output.get("output_type")
    if kind == "stream":
        return hardware.ESCAPE_CODES.sub("", source_of({"source": output.get("text", "")}))
    if kind == "error":
        return f"{output.get('ename')}: {hardware.ESCAPE_CODES.sub('', output.get('evalue', ''))}\n"
    data = output.get("data", {})
    return hardware.ESCAPE_CODES.sub("", source_of({"source": data.get("text/plain", "")})) + "\n"


def page_output(output):
    """One recorded output as an output of the page's cell, for myst-nb to render as it renders
    the build machine's own: a figure or a table as it was, printed text as text. Text goes as
    display data, not as a stream: myst-nb (nb_merge_streams) would otherwise merge it into
    the build machine's stream of the same name, above the label."""
    data = output.get("data", {})
    table = "<table" in source_of({"source": data.get("text/html", "")})
    if "image/png" in data or table:
        data = {kind: data[kind] for kind in ("image/png", "text/html", "text/plain") if kind in data}
    else:
        data = {"text/plain": text_of(output)}
    return {"output_type": "display_data", "metadata": {MARKER: "output"}, "data": data}


def conditions_html(run, name, language="en"):
    """The line that says how the recording of this notebook was made ('' if unknown)."""
    found = notebook_conditions(run, name)
    if found is None:
        return ""
    words = WORDS[language]
    loaded, concurrent, before, after, cores = found
    if before is None:
        load = words["no_load"]
    else:
        load = words["busy_load" if concurrent == 1 and loaded else "load"].format(
            before=before, after=after if after is not None else "?", cores=cores)
    if not loaded:
        return f'<p class="gpu-recording-conditions">{words["alone"].format(load=load)}</p>'
    how = (words["concurrent"].format(n=concurrent) + ("; " if language == "en" else "；") + load
           if concurrent > 1 else load)
    return (f'<p class="gpu-recording-conditions gpu-recording-loaded">'
            f'{words["loaded"].format(how=how)}</p>')


def box(run, entry, current_hash, multi_gpu, language="en", name=""):
    """What one recording adds after a cell, and whether it is stale: its label (HTML: the
    machine, how it ran there, current or stale), then what the cell printed there."""
    words = WORDS[language]
    title = html.escape(label(run))
    if entry is None:
        body = f'<p class="gpu-recording-label">{words["missing"].format(title=title)}</p>'
        return [head(f'<div class="gpu-recording gpu-recording-stale">{body}</div>')], True
    stale = entry["source_sha256"] != current_hash
    said = words["stale" if stale else "current"].format(title=title)
    shown = f'<p class="gpu-recording-label">{said}</p>' + conditions_html(run, name, language)
    if multi_gpu and run.get("gpus", 0) < 2:
        shown += f'<p class="gpu-recording-multi">{words["one_gpu"]}</p>'
    if not entry["outputs"]:
        shown += f"<p><em>{words['no_output']}</em></p>"
    kind = "gpu-recording-stale" if stale else "gpu-recording-current"
    return ([head(f'<div class="gpu-recording {kind}">{shown}</div>')]
            + [page_output(output) for output in entry["outputs"]]), stale


def head(shown):
    """A recording's label as an output of the cell (HTML, and its words as plain text)."""
    return {"output_type": "display_data", "metadata": {MARKER: "label"},
            "data": {"text/html": shown, "text/plain": re.sub(r"<[^>]+>", " ", shown)}}


def annotate(notebook, name, recordings, language="en"):
    """Add the recorded outputs to every gpu-output cell of one executed notebook, in place.

    Idempotent: outputs added by an earlier call are replaced. Returns the stale findings,
    one line each, for the build's output.
    """
    stale_lines = []
    for cell in gpu_cells(notebook):
        outputs = [o for o in cell.get("outputs", []) if MARKER not in o.get("metadata", {})]
        current = source_hash(source_of(cell))
        multi_gpu = MULTI_GPU_TAG in tags_of(cell)
        boxes = []
        for folder, run, cells in newest_with(recordings, name, cell.get("id")):
            entry = cells.get(name, {}).get(cell.get("id"))
            shown, stale = box(run, entry, current, multi_gpu, language, name)
            boxes += shown
            if stale:
                why = "not recorded" if entry is None else "its code changed since"
                stale_lines.append(f"stale GPU recording: {name} cell {cell.get('id')} in "
                                   f"results/gpu-runs/{folder.name} ({why})")
        if not recordings:
            words = WORDS[language]
            note = words["none"] + (words["none_multi"] if multi_gpu else "")
            boxes.append(head(f'<div class="gpu-recording gpu-recording-none"><p>{note}</p></div>'))
        cell["outputs"] = outputs + boxes
    return stale_lines


def status(recordings=None, committed_dir=ROOT / "notebooks"):
    """Lines: every gpu-output cell of the committed notebooks against every recording."""
    recordings = load_recordings() if recordings is None else recordings
    lines, stale = [], 0
    for path in sorted(Path(committed_dir).glob("*.ipynb")):
        notebook = read_notebook(path)
        for line in annotate(notebook, path.name, recordings):
            lines.append(line)
            stale += 1
        cells = gpu_cells(notebook)
        if cells:
            lines.append(f"{path.name}: {len(cells)} gpu-output cells")
    lines.append(f"{len(recordings)} recording(s), {stale} stale cell(s)")
    return lines, stale


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="write a recording from executed notebooks")
    rec.add_argument("executed_dir")
    rec.add_argument("out_dir")
    rec.add_argument("--results", nargs="+", required=True,
                     help="the benchmark's results files of the same run; the first one "
                          "gives the hardware and the date")
    rec.add_argument("--commit", required=True, help="the commit the run executed")
    rec.add_argument("--note", default="", help="anything else a reader should know")
    commands.add_parser("status", help="which recordings are stale")
    cond = commands.add_parser("conditions", help="write conditions.json for a recording made "
                                                  "before gpu_check.py wrote one")
    cond.add_argument("folder")
    cond.add_argument("--concurrent-notebooks", type=int, required=True,
                      help="how many notebooks ran at once in that run")
    cond.add_argument("--source", required=True, help="where that number is recorded")
    args = parser.parse_args(argv)
    if args.command == "conditions":
        folder = Path(args.folder)
        if not (folder / CELLS_FILE).is_file():
            print(f"error: {folder} holds no {CELLS_FILE}: not a recording", file=sys.stderr)
            return 2
        if args.concurrent_notebooks < 1:
            print("error: --concurrent-notebooks must be 1 or more", file=sys.stderr)
            return 2
        conditions = conditions_of_earlier_run(json.loads((folder / CELLS_FILE).read_text()),
                                               args.concurrent_notebooks, args.source)
        write_json(folder / CONDITIONS_FILE, conditions)
        print(f"wrote {folder / CONDITIONS_FILE}: {args.concurrent_notebooks} notebook(s) at "
              f"once, load recorded for {len(conditions['notebooks'])} notebook(s)")
        return 0
    if args.command == "record":
        cells = record(args.executed_dir)
        run = run_from_results(args.results[0], args.commit, args.note)
        write_recording(args.out_dir, run, cells)
        for results in args.results:
            removed = clean_results_file(results, Path(args.out_dir) / Path(results).name)
            print(f"{Path(results).name}: {removed} terminal escape codes removed")
        print(f"recorded {sum(map(len, cells.values()))} cells into {args.out_dir}: "
              f"{label(run)}")
        return 0
    lines, stale = status()
    print("\n".join(lines))
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
