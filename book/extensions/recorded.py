"""Numbers on the reference pages, read from the committed results files when the book builds.

    {recorded}`grading.ddp.samples`                 one number, named in FACTS
    ```{benchmark-table} results/cpu-2core-2026-11-30.json
    ```                                             a benchmark results file as a table
    ```{recorded-output} 02_tensors_and_models.ipynb ch02-18
    ```                                             a cell's output on a recorded GPU machine

Each reads the build copy's results/ (Sphinx's source folder), so a changed file changes the
page, and a fact whose file is gone fails the build. Nothing here is typed in but labels.
"""
import json
import re
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive

RESULTS = Path("results")
GRADING = RESULTS / "grading-example" / "benchmark.json"
GRADING_LOG = GRADING.with_suffix(".log")
CPU_2CORE = RESULTS / "cpu-2core-2026-11-30.json"
H200 = RESULTS / "gpu-runs" / "2026-11-30-h200"
ARTICLE = RESULTS / "article" / "titan-xp.json"
EXITS = RESULTS / "exit-benchmark.jsonl"


def read(root, path):
    return json.loads((Path(root) / path).read_text(encoding="utf-8"))


def run_of(results, config):
    return next(run for run in results["runs"] if run["config"] == config)


def samples(root, path, config):
    return f"{run_of(read(root, path), config)['samples_per_s']:,.0f}"


def ratio(root, path, config, over):
    results = read(root, path)
    return f"{run_of(results, config)['samples_per_s'] / run_of(results, over)['samples_per_s']:.1f}"


def spread(root, path, config):
    return f"{run_of(read(root, path), config)['spread']:.2f}"


def load(root, path):
    hardware = read(root, path)["hardware"]
    return f"{hardware['load_average_before'][0]} → {hardware['load_average_after'][0]}"


def article_ratio(root, slower, faster):
    wall = read(root, ARTICLE)["wall_s"]
    return f"{wall[slower] / wall[faster]:.1f}"


def article_seconds(root, config):
    return f"{read(root, ARTICLE)['wall_s'][config]:.1f}"


def micro_rows(root):
    """micro.txt's rows: {label: samples/s} (its first line names torch and the GPU)."""
    lines = (Path(root) / H200 / "micro.txt").read_text(encoding="utf-8").splitlines()[1:]
    rows = [re.fullmatch(r"(.+?)\s+(\d+) samples/s", line.strip()) for line in lines if line.strip()]
    return {row[1]: int(row[2]) for row in rows}


def micro_ratio(root, batch):
    rows = micro_rows(root)
    on_gpu, scripts = f"cnn {batch}: data on GPU", f"cnn {batch}: scripts' path (CPU tensors, DataLoader)"
    return f"{rows[on_gpu] / rows[scripts]:.1f}"


def exits(root, freed):
    """(hung, runs) of the exit benchmark's rows whose model was freed before the group or not."""
    lines = (Path(root) / EXITS).read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    chosen = [row for row in rows if row["frees_model_first"] is freed]
    return sum(row["hung"] for row in chosen), sum(row["runs"] for row in chosen)


# A benchmark log's lines: a configuration's round starts, and each epoch of rank 0.
ROUND_LINE = re.compile(r"^\[benchmark\] round \d+/\d+, (\w+):", re.M)
EPOCH_LINE = re.compile(r"^\[rank 0\] epoch \d+/\d+ train_loss=([\d.]+)", re.M)


def train_losses(root, path=GRADING_LOG):
    """{config: [[train loss of each epoch] of each round]}, as the benchmark's log printed them."""
    text = (Path(root) / path).read_text(encoding="utf-8")
    starts = list(ROUND_LINE.finditer(text))
    losses = {}
    for start, after in zip(starts, [*starts[1:], None]):
        part = text[start.end():after.start() if after else len(text)]
        losses.setdefault(start[1], []).append(EPOCH_LINE.findall(part))
    return losses


def first_losses(root, config):
    return ", ".join(train_losses(root)[config][0])


FACTS = {
    "grading.hardware": lambda root: read(root, GRADING)["hardware"]["label"],
    "grading.torch": lambda root: read(root, GRADING)["hardware"]["torch"],
    "grading.load": lambda root: load(root, GRADING),
    "grading.cpu.samples": lambda root: samples(root, GRADING, "cpu"),
    "grading.ddp.samples": lambda root: samples(root, GRADING, "ddp"),
    "grading.ddp-over-cpu": lambda root: ratio(root, GRADING, "ddp", "cpu"),
    "grading.cpu.spread": lambda root: spread(root, GRADING, "cpu"),
    "grading.ddp.spread": lambda root: spread(root, GRADING, "ddp"),
    "grading.limit": lambda root: f"{read(root, GRADING)['reliable_spread']}",
    "grading.cpu-model": lambda root: read(root, GRADING)["hardware"]["cpu"]["model"],
    "grading.cores": lambda root: f"{read(root, GRADING)['hardware']['cpu']['usable_cores']}",
    "grading.size": lambda root: read(root, GRADING)["size"],
    "grading.cpu.threads": lambda root: f"{run_of(read(root, GRADING), 'cpu')['threads_per_process']}",
    "grading.ddp.threads": lambda root: f"{run_of(read(root, GRADING), 'ddp')['threads_per_process']}",
    "grading.loss.cpu": lambda root: first_losses(root, "cpu"),
    "grading.loss.ddp": lambda root: first_losses(root, "ddp"),
    "grading.accuracy.cpu": lambda root: f"{run_of(read(root, GRADING), 'cpu')['test_accuracy']:.4f}",
    "grading.accuracy.ddp": lambda root: f"{run_of(read(root, GRADING), 'ddp')['test_accuracy']:.4f}",
    "cpu2.accuracy.cpu": lambda root: f"{run_of(read(root, CPU_2CORE), 'cpu')['test_accuracy']:.4f}",
    "cpu2.accuracy.ddp": lambda root: f"{run_of(read(root, CPU_2CORE), 'ddp')['test_accuracy']:.4f}",
    "cpu2.test-samples-apart": lambda root: str(test_samples_apart(root)),
    "cpu2.test-samples": lambda root: f"{run_of(read(root, CPU_2CORE), 'ddp')['test_samples']:,}",
    "cpu2.hardware": lambda root: read(root, CPU_2CORE)["hardware"]["label"],
    "h200.gpu": lambda root: read(root, H200 / "h200-full.json")["hardware"]["gpus"][0]["name"],
    "h200.memory": lambda root: f"{read(root, H200 / 'h200-full.json')['hardware']['gpus'][0]['memory_gib']}",
    "h200.cores": lambda root: f"{read(root, H200 / 'h200-full.json')['hardware']['cpu']['usable_cores']}",
    "h200.gpu-over-cpu": lambda root: ratio(root, H200 / "h200-full.json", "gpu", "cpu"),
    "h200.micro.hardware": lambda root: read(root, H200 / "micro.json")["hardware"],
    "h200.micro.b64": lambda root: micro_ratio(root, "b64"),
    "h200.micro.b512": lambda root: micro_ratio(root, "b512"),
    "article.hardware": lambda root: read(root, ARTICLE)["hardware"],
    "article.cpu-over-gpu": lambda root: article_ratio(root, "cpu", "gpu"),
    "article.dp-over-ddp": lambda root: article_ratio(root, "dp", "ddp"),
    "article.dp": lambda root: article_seconds(root, "dp"),
    "article.ddp": lambda root: article_seconds(root, "ddp"),
    "exits.after.hung": lambda root: str(exits(root, False)[0]),
    "exits.after.runs": lambda root: str(exits(root, False)[1]),
    "exits.before.hung": lambda root: str(exits(root, True)[0]),
    "exits.before.runs": lambda root: str(exits(root, True)[1]),
}

# Chance level on ten classes: a test accuracy below this says the run learned (next to) nothing.
CHANCE_BOUND = 2 / 10
# "The same training, to float32 rounding": the two runs' test accuracies at most this far apart.
SAME_TRAINING = 0.005
# "Only N times faster": N below this.
ONLY = 2


def test_samples_apart(root):
    """How many test images the 2-core file's one process and DDP classified differently, net."""
    cpu, ddp = run_of(read(root, CPU_2CORE), "cpu"), run_of(read(root, CPU_2CORE), "ddp")
    return round(abs(cpu["test_accuracy"] - ddp["test_accuracy"]) * ddp["test_samples"])


def grading_premises(root):
    """What the worked example's grades say of its run, each checked against the file: the
    problems found (none when the page's reasons hold)."""
    results = read(root, GRADING)
    cpu, ddp = run_of(results, "cpu"), run_of(results, "ddp")
    problems = []
    if cpu.get("reliable", True) or ddp.get("reliable", True):
        problems.append("Explanation 0: the file marks both rows unreliable")
    if results["hardware"]["cpu"]["usable_cores"] != 2:
        problems.append("Explanation 0: on two cores, both used by the one process")
    elif cpu["threads_per_process"] < 2:
        problems.append("Explanation 0: the one process had both cores too")
    if cpu["test_accuracy"] != ddp["test_accuracy"]:
        problems.append("both reached the same test accuracy")
    losses = train_losses(root)
    if {"cpu", "ddp"} - set(losses) or not all(rounds and all(rounds) for rounds in losses.values()):
        problems.append("the feedback: the log gives each configuration's train loss, cpu's and ddp's")
    elif any(epochs != losses["cpu"][0] for epochs in losses["cpu"] + losses["ddp"]):
        problems.append("the feedback: the same train loss, epoch by epoch")
    if max(cpu["test_accuracy"], ddp["test_accuracy"]) >= CHANCE_BOUND:
        problems.append("the feedback: test accuracy at chance level")
    if results["size"] == "full":
        problems.append("It works 1: the smoke size, not the full size asked")
    if any(run_of(results, config)["status"] != "skipped" for config in ("gpu", "dp")):
        problems.append("It works 1: gpu and dp skipped")
    if ddp["samples_per_s"] <= cpu["samples_per_s"]:
        problems.append("the student's claim: DDP faster")
    return problems


def reference_premises(root):
    """What the words around assignments 3 and 4's reference numbers say, each checked against
    its file: the problems found."""
    two_core, h200 = read(root, CPU_2CORE), read(root, H200 / "h200-full.json")
    problems = []
    if abs(run_of(two_core, "cpu")["test_accuracy"] - run_of(two_core, "ddp")["test_accuracy"]) > SAME_TRAINING:
        problems.append("3: the same training, to float32 rounding")
    if run_of(h200, "gpu")["samples_per_s"] / run_of(h200, "cpu")["samples_per_s"] >= ONLY:
        problems.append("4: only a little faster (below 2 times)")
    return problems


def check_premises(app):
    """The build fails when a committed file no longer bears out the page's words."""
    from sphinx.errors import ExtensionError
    problems = grading_premises(app.srcdir) + reference_premises(app.srcdir)
    if problems:
        raise ExtensionError(f"book/grading.md's words no longer hold for results/: {'; '.join(problems)}")


WORDS = {
    "en": {"config": "configuration", "processes": "processes", "samples": "samples/s",
           "accuracy": "test accuracy", "spread": "spread", "speed": "× cpu", "status": "status",
           "measured": "measured", "unreliable": "unreliable", "skipped": "skipped",
           "caption": "{file}: {hardware}; torch {torch}; {dataset} data, {train} training "
                      "samples, {epochs} epochs, global batch {batch}; 1-minute load {load}; "
                      "written {created}.",
           "current": "Recorded on {hardware}, {date}, commit {commit} ({file}, cell {cell}).",
           "stale": "Recorded on {hardware}, {date}, commit {commit} ({file}, cell {cell}); "
                    "the cell's code has changed since, so today's output may differ.",
           "missing": "No recording of cell {cell} of {notebook} in {file}."},
    "zh": {"config": "配置", "processes": "进程数", "samples": "样本/秒", "accuracy": "测试准确率",
           "spread": "离散度", "speed": "相对 cpu", "status": "状态", "measured": "已测",
           "unreliable": "不可靠", "skipped": "跳过",
           "caption": "{file}：{hardware}；torch {torch}；{dataset} 数据，{train} 个训练样本，"
                      "{epochs} 轮，全局批量 {batch}；1 分钟负载 {load}；写于 {created}。",
           "current": "记录于 {hardware}，{date}，提交 {commit}（{file}，单元格 {cell}）。",
           "stale": "记录于 {hardware}，{date}，提交 {commit}（{file}，单元格 {cell}）；"
                    "此后该单元格的代码已改动，今天的输出可能不同。",
           "missing": "{file} 中没有 {notebook} 的单元格 {cell} 的记录。"},
}


def benchmark_rows(root, path, language="en"):
    """(header, rows, caption) of a benchmark results file, every configuration in its order."""
    words = WORDS[language]
    results = read(root, path)
    cpu = next((run for run in results["runs"]
                if run["config"] == "cpu" and run["status"] == "measured"), None)
    header = [words["config"], words["processes"], words["samples"], words["spread"],
              words["accuracy"], words["speed"], words["status"]]
    rows = []
    for run in results["runs"]:
        if run["status"] != "measured":
            rows.append([run["config"], str(run["processes"]), "", "", "", "",
                         f"{words['skipped']}: {run.get('reason', '')}"])
            continue
        faster = f"{run['samples_per_s'] / cpu['samples_per_s']:.2f}" if cpu else ""
        reliable = run.get("reliable", True) and (cpu is None or cpu.get("reliable", True))
        rows.append([run["config"], str(run["processes"]), f"{run['samples_per_s']:,.0f}",
                     f"{run['spread']:.2f}" if "spread" in run else "",
                     f"{run['test_accuracy']:.4f}", faster,
                     words["measured"] if reliable else words["unreliable"]])
    settings, hardware = results["settings"], results["hardware"]
    train = settings["train_samples"] or results["runs"][0].get("train_samples", "")
    caption = words["caption"].format(
        file=str(path), hardware=hardware["label"], torch=hardware["torch"],
        dataset=settings["dataset"], train=train, epochs=settings["epochs"],
        batch=settings["batch_size"], load=load(root, path), created=results["created"][:10])
    return header, rows, caption


def recorded_output(root, notebook, cell, language="en", notebooks=None):
    """(text, note) of a cell's streams on each GPU recording under results/gpu-runs/, the
    newest first; the note names the machine and whether the code changed since."""
    from book.tools import gpu_recordings   # the book's own boxes use the same rules
    words = WORDS[language]
    source = next(c["source"] for c in read(notebooks or Path(root) / "notebooks", notebook)["cells"]
                  if c.get("id") == cell)
    source = "".join(source) if isinstance(source, list) else source
    found = []
    for folder, run, cells in reversed(gpu_recordings.load_recordings(Path(root) / RESULTS / "gpu-runs")):
        entry = cells.get(notebook, {}).get(cell)
        file = str((folder / gpu_recordings.CELLS_FILE).relative_to(root))
        if entry is None:
            found.append(("", words["missing"].format(cell=cell, notebook=notebook, file=file)))
            continue
        text = "".join("".join(output["text"]) for output in entry["outputs"]
                       if output.get("output_type") == "stream")
        state = gpu_recordings.state_of(entry, gpu_recordings.source_hash(source))
        found.append((text, words[state].format(hardware=run["hardware"], date=run["date"],
                                                commit=run["commit"], file=file, cell=cell)))
    return found


def language_of(env):
    return getattr(env.config, "book_edition", "en")


def recorded_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    env = inliner.document.settings.env
    try:
        value = FACTS[text.strip()](env.srcdir)
    except Exception as error:   # a missing file or key: the build's -W fails on the message
        message = inliner.reporter.error(f"recorded: {text}: {error!r}", line=lineno)
        return [inliner.problematic(rawtext, rawtext, message)], [message]
    return [nodes.Text(value)], []


class BenchmarkTable(Directive):
    required_arguments = 1

    def run(self):
        env = self.state.document.settings.env
        header, rows, caption = benchmark_rows(env.srcdir, self.arguments[0], language_of(env))
        env.note_dependency(str(Path(env.srcdir) / self.arguments[0]))
        table = nodes.table(classes=["recorded-table"])
        group = nodes.tgroup(cols=len(header))
        table += group
        group += [nodes.colspec(colwidth=1) for _ in header]
        for part, lines in ((nodes.thead(), [header]), (nodes.tbody(), rows)):
            for line in lines:
                row = nodes.row()
                row += [nodes.entry("", nodes.paragraph(text=cell)) for cell in line]
                part += row
            group += part
        return [table, nodes.paragraph(text=caption, classes=["recorded-caption"])]


class RecordedOutput(Directive):
    required_arguments = 2

    def run(self):
        env = self.state.document.settings.env
        result = []
        for text, note in recorded_output(env.srcdir, *self.arguments, language=language_of(env)):
            if text:
                result.append(nodes.literal_block(text, text, classes=["recorded-output"]))
            result.append(nodes.paragraph(text=note, classes=["recorded-caption"]))
        return result


SUMMARIES = "book/summaries"   # its chapters each start a printed page


def one_page_each(app, doctree):
    if app.env.docname == SUMMARIES:
        for section in doctree.findall(nodes.section):
            if isinstance(section.parent, nodes.section) and section.parent.parent is doctree:
                section["classes"].append("summary-page")


def setup(app):
    app.connect("builder-inited", check_premises)
    app.connect("doctree-read", one_page_each)
    app.add_role("recorded", recorded_role)
    app.add_directive("benchmark-table", BenchmarkTable)
    app.add_directive("recorded-output", RecordedOutput)
    app.add_css_file("summaries-print.css", media="print")   # book/theme/: a chapter a page
    return {"parallel_read_safe": True, "parallel_write_safe": True}
