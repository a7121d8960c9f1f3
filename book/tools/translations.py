"""The Chinese edition (中文版), kept in step with the English one.

    python -m book.tools translations check            # what is out of step (exit 1 if any)
    python -m book.tools translations check --diff     # ... and how the English changed
    python -m book.tools translations sync [PAGE ...]  # code cells and cell order from English
    python -m book.tools translations accept PAGE [ID ...]   # translation brought up to date
    python -m book.tools translations export PAGE      # English prose as blocks, to translate
    python -m book.tools translations import PAGE BLOCKS     # those blocks, translated, back in

The Chinese pages are committed beside the English ones: a chapter notebooks/NN_x.ipynb has
notebooks/zh/NN_x.ipynb, and a page book/x.md has book/zh/x.md. A Chinese notebook has the
English notebook's cells, in the same order and with the same ids; its code cells are the
English code cells, character for character (`sync` copies them), and each prose cell records
which English text it translates: metadata {"translation": {"en": SHA}}, the first 12 hex
digits of the SHA-256 of the English cell's source. A Chinese page records the same, one
MyST comment line `% en: SHA` before each section (a heading and what follows it, up to the
next heading), and keeps the English page's fenced code blocks as they are.

When an English prose cell or section changes, its hash no longer matches, and `check` (run
by the tests) names the Chinese passage now out of date and shows what changed in the
English, from git history. Translate the change, then `accept` the page (or just the cells
named) to record the new English hash.
"""
import argparse
import difflib
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

from book.tools.notebooks import read_notebook as read, write_notebook as write

ROOT = Path(__file__).resolve().parents[2]
ZH = "zh"
MARKER = re.compile(r"^% en: ([0-9a-f]{12}|new)\s*$")
BLOCK = re.compile(r"^<!-- cell (\S+) -->\s*$")
HEADING = re.compile(r"^#{1,6} \S")
LABEL = re.compile(r"^\([\w-]+\)=\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|:{3,})")
# Five or more English words in a row, outside code, links' targets and markup: a sentence
# left in English. Names, options and short phrases ("torch.compile", "CPU 上", "DDP
# 的 all-reduce") are shorter.
ENGLISH_RUN = re.compile(r"(?:\b[A-Za-z][A-Za-z'’-]*[ ,;:]+){4,}[A-Za-z][A-Za-z'’-]*\b")

# The edition's terms. Each row: a variant the edition does not use (a regular expression
# over a line of Chinese prose, with inline code blanked out unless the row says "code"),
# where the same words are right (a pattern whose matches are left alone: the gloss after
# the English term, "Jupyter 内核"), and what to write instead. A line quoted from elsewhere
# (a Markdown quotation, "> ...") keeps its words and is not read.
TERMS = [
    (r"进程序号", r"rank\s?（(?:本机)?进程序号）|本地进程序号|全局进程序号",
     "rank（进程序号） on a chapter's first use, then rank, rank 0; "
     "某个 rank or 某个进程 for “a rank”"),
    (r"本地进程序号", None, "local rank（本机进程序号）, then local rank"),
    (r"全局进程序号|全局序号", None, "全局 rank"),
    (r"[0-9]+\s?号进程|(?<![每个])进程\s?[0-9]+(?!\s?[0-9/*×x+.个块秒次轮步张份倍%s-])", None,
     "rank 0, rank 1"),
    (r"世界", r"(?:真实|现实|全)世界|世界上", "world size（进程总数）; never 世界"),
    (r"汇合|会面|碰头", None, "rendezvous（会合）, 会合点"),
    (r"个\s?(?:GPU|显卡)",
     r"个\s?GPU\s?(?:kernel|核函数|进程|张量|任务|上下文|流|操作|算子|函数|事件)",
     "块 GPU (单卡, 多卡 where natural)"),
    (r"(?<![`\w.-])epochs?(?![`\w-])", r"轮\s?（epochs?）|\|\s?epochs?\s?\|",
     "轮（epoch） on a chapter's first use, then 轮"),
    (r"批归一化|批标准化|批量标准化|批规范化|批量规范化", None, "批量归一化（BatchNorm）"),
    (r"内核", r"Jupyter\s?内核",
     "Jupyter 内核 (the notebook's process); kernel（核函数） (a function run on the GPU)"),
    (r"分发\s?（scatter）|scatter\s?（分发）", None, "分散（scatter）"),
    (r"数据并行\s?[（(]\s?(?:`?(?:nn\.|torch\.nn\.)?DataParallel`?|DP)\s?[）)]", "code",
     "`DataParallel`（DP）: 数据并行 is the concept, which DDP and FSDP are too"),
    (r"调节手段", None, "优化手段 (in prose), 选项 (a script's option)"),
    (r"诚实", None, "可信; 公平、可复现"),
    (r"CUDA graphs?\b|CUDA Graphs\b|CUDA 图(?!）)", r"CUDA Graph（CUDA 图）",
     "CUDA Graph（CUDA 图） on first use, then CUDA Graph"),
    (r"(?<!主机)内存中转", None, "经由主机内存中转"),
    (r"全归约|全收集|归约散射",
     r"all-reduce\s?（全归约）|all-gather\s?（全收集）|reduce-scatter\s?（归约散射）",
     "all-reduce（全归约） on first use, then all-reduce; the same for all-gather（全收集）, "
     "reduce-scatter（归约散射）"),
    (r"激活检查点", None, "激活重计算（activation checkpointing）"),
    (r"前置知识|前置要求", None, "预备知识"),
    (r"预计时间", None, "预计用时"),
    (r"学完本章(?!，你将能够：)", None, "学完本章，你将能够："),
    (r"硬件给本章带来的变化", None, "硬件对本章的影响"),
    (r"(?<=\d) x (?=\d)", None, "× (4 × 256)"),
    (r"(?<=[\u4e00-\u9fff，。])\.\.\.|\.\.\.(?=[\u4e00-\u9fff])", None, "……"),
]
TERMS = [(re.compile(variant), allowed, use) for variant, allowed, use in TERMS]


class TranslationError(Exception):
    """Bad input: reported as one line, exit status 2."""


def sha(text):
    return hashlib.sha256(text.strip().encode("utf-8")).hexdigest()[:12]


def source(cell):
    return "".join(cell.get("source", ""))


# --- pairs of pages ---------------------------------------------------------------------

def english_pages():
    """Every English page of the book that has (or must have) a Chinese page."""
    return (sorted((ROOT / "notebooks").glob("*.ipynb"))
            + sorted((ROOT / "book").glob("*.md")))


def chinese_page(english):
    english = Path(english)
    return english.parent / ZH / english.name


def english_page(chinese):
    chinese = Path(chinese)
    if chinese.parent.name != ZH:
        raise TranslationError(f"{chinese} is not a Chinese page (those live in a zh/ folder)")
    return chinese.parent.parent / chinese.name


def resolve(path):
    """An English or Chinese page's path, as given on the command line: (english, chinese)."""
    path = Path(path)
    if not path.is_absolute():
        path = (Path.cwd() / path).resolve()
    if path.parent.name == ZH:
        path = english_page(path)
    if not path.exists():
        raise TranslationError(f"no such page: {path}")
    return path, chinese_page(path)


def relative(path):
    try:
        return str(Path(path).relative_to(ROOT))
    except ValueError:
        return str(path)


# --- notebooks ----------------------------------------------------------------------------

def cell_ids(notebook, path):
    ids = [cell.get("id") for cell in notebook["cells"]]
    if None in ids or len(set(ids)) != len(ids):
        raise TranslationError(f"{relative(path)}: every cell needs its own id (nbformat 4.5)")
    return ids


def recorded(cell):
    return cell.get("metadata", {}).get("translation", {}).get("en")


def first_words(text, width=60):
    line = next((line.strip() for line in text.splitlines() if line.strip()
                 and not LABEL.match(line.strip()) and not MARKER.match(line)), "")
    return line if len(line) <= width else line[:width - 1] + "…"


def notebook_problems(english_path, chinese_path):
    """What is out of step between an English notebook and its Chinese notebook."""
    name = relative(chinese_path)
    if not chinese_path.exists():
        return [f"{name}: missing (the Chinese page of {relative(english_path)})"]
    english, chinese = read(english_path), read(chinese_path)
    cell_ids(english, english_path)
    by_id = {cell.get("id"): cell for cell in chinese["cells"]}
    problems = []
    if [c.get("id") for c in chinese["cells"]] != [c["id"] for c in english["cells"]]:
        problems.append(f"{name}: its cells are not the English notebook's cells in the "
                        f"same order (run: python -m book.tools translations sync)")
    for number, cell in enumerate(english["cells"], 1):
        zh = by_id.get(cell["id"])
        where = f"{name}, cell {number} (id {cell['id']})"
        if zh is None or zh["cell_type"] != cell["cell_type"]:
            continue   # reported above
        if cell["cell_type"] == "code":
            if source(zh) != source(cell):
                problems.append(f"{where}: code differs from the English cell "
                                f"(run: python -m book.tools translations sync)")
            continue
        if recorded(zh) is None or recorded(zh) == "new":
            problems.append(f"{where}: not translated yet: “{first_words(source(cell))}”")
        elif recorded(zh) != sha(source(cell)):
            problems.append(f"{where}: out of date: “{first_words(source(zh))}” translates "
                            f"an older version of the English cell "
                            f"“{first_words(source(cell))}”")
        else:
            problems += [f"{where}: English left untranslated: “{run}”"
                         for run in english_runs(source(zh))]
            problems += [f"{where}: {difference}" for difference
                         in structure_differences(source(cell), source(zh))]
            problems += term_problems(where, source(zh))
    return problems


def sync_notebook(english_path, chinese_path):
    """The Chinese notebook with the English notebook's cells, order and code.

    Prose cells keep their translation; a new English prose cell comes in English, marked
    not translated yet (check reports it); a cell the English notebook lost is dropped.
    """
    english = read(english_path)
    cell_ids(english, english_path)
    chinese = read(chinese_path) if chinese_path.exists() else {"cells": []}
    by_id = {cell.get("id"): cell for cell in chinese["cells"]}
    cells = []
    for cell in english["cells"]:
        zh = by_id.get(cell["id"])
        if cell["cell_type"] == "code" or zh is None or zh["cell_type"] != cell["cell_type"]:
            copy = json.loads(json.dumps(cell))
            if cell["cell_type"] == "markdown":
                copy.setdefault("metadata", {})["translation"] = {"en": "new"}
            cells.append(copy)
        else:
            zh["metadata"] = {**cell.get("metadata", {}),
                              "translation": zh.get("metadata", {}).get("translation", {})}
            cells.append(zh)
    result = {**english, "cells": cells}
    chinese_path.parent.mkdir(parents=True, exist_ok=True)
    write(chinese_path, result)


def accept_notebook(english_path, chinese_path, ids):
    english, chinese = read(english_path), read(chinese_path)
    current = {cell["id"]: sha(source(cell)) for cell in english["cells"]
               if cell["cell_type"] == "markdown"}
    unknown = set(ids) - set(current)
    if unknown:
        raise TranslationError(f"{relative(english_path)} has no prose cell with id "
                               f"{sorted(unknown)[0]}")
    for cell in chinese["cells"]:
        if cell.get("id") in current and (not ids or cell["id"] in ids):
            cell.setdefault("metadata", {})["translation"] = {"en": current[cell["id"]]}
    write(chinese_path, chinese)


def export_notebook(english_path):
    english = read(english_path)
    cell_ids(english, english_path)
    return "".join(f"<!-- cell {cell['id']} -->\n{source(cell).rstrip()}\n\n"
                   for cell in english["cells"] if cell["cell_type"] == "markdown")


def import_notebook(english_path, chinese_path, blocks_text):
    """Translated blocks (export's format) -> the Chinese notebook, each cell accepted."""
    blocks, current = {}, None
    for line in blocks_text.splitlines():
        match = BLOCK.match(line)
        if match:
            current = match.group(1)
            blocks[current] = []
        elif current is not None:
            blocks[current].append(line)
    sync_notebook(english_path, chinese_path)
    chinese = read(chinese_path)
    english = {cell["id"]: cell for cell in read(english_path)["cells"]}
    for cell in chinese["cells"]:
        lines = blocks.get(cell.get("id"))
        if cell["cell_type"] != "markdown" or lines is None:
            continue
        text = join_chinese_lines("\n".join(lines).strip("\n"))
        cell["source"] = [line + "\n" for line in text.split("\n")]
        cell["source"][-1] = cell["source"][-1].rstrip("\n")
        cell["metadata"]["translation"] = {"en": sha(source(english[cell["id"]]))}
    write(chinese_path, chinese)
    missing = [i for i, cell in english.items() if cell["cell_type"] == "markdown"
               and i not in blocks]
    return missing


# --- Markdown pages -----------------------------------------------------------------------

def scan(text):
    """Each line of a Markdown text, with what it is: 'code-fence' or 'fence' (a line that
    opens or closes a code block, or a directive such as ```{exercise}), 'code' (inside a
    code block), 'directive' (inside a directive: prose), 'text' (outside every fence)."""
    fences = []   # the open fences, innermost last: (fence, holds code)
    for line in text.split("\n"):
        match = FENCE.match(line)
        in_code = any(code for _, code in fences)
        if match:
            mark = match.group(2)
            if fences and line.strip() == mark and mark.startswith(fences[-1][0]):
                yield line, "code-fence" if fences.pop()[1] else "fence"
                continue
            if not in_code:   # ``` and ```python hold code; ```{directive} holds prose
                code = mark.startswith("`") and "{" not in line
                fences.append((mark[0] * len(mark), code))
                yield line, "code-fence" if code else "fence"
                continue
        yield line, "code" if in_code else "directive" if fences else "text"


def sections(text):
    """A page's sections: a heading (with the label lines just above it) and what follows,
    up to the next heading; text before the first heading is a section of its own."""
    lines = text.splitlines()
    starts = [0]
    for number, (line, kind) in enumerate(scan("\n".join(lines))):
        if kind == "text" and HEADING.match(line) and number:
            start = number
            while start > 0 and (LABEL.match(lines[start - 1]) or not lines[start - 1].strip()):
                start -= 1
            while start < number and not lines[start].strip():
                start += 1
            starts.append(start)
    starts.append(len(lines))
    parts = ["\n".join(lines[a:b]).strip("\n") for a, b in zip(starts, starts[1:])]
    return [part for part in parts if part.strip()]


def chinese_sections(text):
    """[(recorded English hash, section text)] of a Chinese page, split at its markers."""
    result = []
    for line in text.splitlines():
        match = MARKER.match(line)
        if match:
            result.append([match.group(1), []])
        elif result:
            result[-1][1].append(line)
    return [(mark, "\n".join(lines).strip("\n")) for mark, lines in result]


def fenced_blocks(text):
    """The fenced code blocks (``` only: directives' bodies are prose) of a page, in order."""
    blocks, current = [], None
    for line, kind in scan(text):
        if kind == "code-fence" and current is None:
            current = [line]
        elif current is not None:
            current.append(line)
            if kind == "code-fence":
                blocks.append("\n".join(current))
                current = None
    return blocks


def page_problems(english_path, chinese_path):
    name = relative(chinese_path)
    if not chinese_path.exists():
        return [f"{name}: missing (the Chinese page of {relative(english_path)})"]
    english = sections(english_path.read_text(encoding="utf-8"))
    chinese_text = chinese_path.read_text(encoding="utf-8")
    chinese = chinese_sections(chinese_text)
    problems = []
    if len(chinese) != len(english):
        problems.append(f"{name}: {len(chinese)} marked sections for the English page's "
                        f"{len(english)} (a `% en: SHA` line before each; see "
                        f"python -m book.tools translations export {relative(english_path)})")
    for number, (section, (mark, zh)) in enumerate(zip(english, chinese), 1):
        where = f"{name}, section {number}"
        if mark == "new":
            problems.append(f"{where}: not translated yet: “{first_words(section)}”")
        elif mark != sha(section):
            problems.append(f"{where}: out of date: “{first_words(zh)}” translates an older "
                            f"version of the English section “{first_words(section)}”")
        else:
            problems += [f"{where}: English left untranslated: “{run}”"
                         for run in english_runs(zh)]
            problems += [f"{where}: {difference}"
                         for difference in structure_differences(section, zh)]
    if fenced_blocks(chinese_text) != fenced_blocks(english_path.read_text(encoding="utf-8")):
        problems.append(f"{name}: its code blocks differ from the English page's")
    translated = "\n".join(translated_lines(chinese_text))
    problems += term_problems(name, translated)
    return problems


def translated_lines(text):
    """A Chinese page's lines, with those of sections not translated yet blanked (so that
    line numbers stay the file's)."""
    mark = None
    for line in text.splitlines():
        match = MARKER.match(line)
        mark = match.group(1) if match else mark
        yield "" if mark == "new" else line


def accept_page(english_path, chinese_path, numbers):
    english = sections(english_path.read_text(encoding="utf-8"))
    lines, section = [], 0
    for line in chinese_path.read_text(encoding="utf-8").splitlines():
        if MARKER.match(line):
            section += 1
            if section <= len(english) and (not numbers or section in numbers):
                line = f"% en: {sha(english[section - 1])}"
        lines.append(line)
    chinese_path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def export_page(english_path):
    return "\n\n".join(f"% en: {sha(section)}\n{section}"
                       for section in sections(english_path.read_text(encoding="utf-8"))) + "\n"


# --- English left in Chinese prose --------------------------------------------------------

def prose_only(text):
    """Chinese prose without what stays English: code, links' targets, roles, directives'
    names and options, labels, HTML, math, URLs."""
    kept = [line for line, kind in scan(text) if kind in ("text", "directive")
            and not MARKER.match(line) and not LABEL.match(line.strip())
            and not re.match(r"^\s*:[\w-]+:", line)]                # directive options
    prose = "\n".join(kept)
    for pattern in (r"`[^`]*`",                 # code, and the text of roles
                    r"\{[\w-]+\}",              # roles' names
                    r"\]\([^)]*\)",              # links' targets
                    r"https?://\S+", r"<[^>]+>", r"\$[^$]*\$"):
        prose = re.sub(pattern, " ", prose)
    return prose


# Chinese characters and full-width punctuation: a line break between two of them is a
# space on the page (HTML, and Jupyter's Markdown), which Chinese text does not have.
CJK = "\u3000-\u303f\u4e00-\u9fff\uff00-\uffef"
BROKEN_CHINESE_LINE = re.compile(rf"(?<=[{CJK}])[ \t]*\n[ \t]*(?=[{CJK}])")


def join_chinese_lines(text):
    """Lines of one Chinese paragraph joined where they break between Chinese characters
    (code blocks left as they are)."""
    parts, block = [], []

    def flush():
        if block:
            parts.append(BROKEN_CHINESE_LINE.sub("", "\n".join(block)))
            block.clear()
    for line, kind in scan(text):
        if kind in ("text", "directive"):
            block.append(line)
        else:
            flush()
            parts.append(line)
    flush()
    return "\n".join(parts)


# What a translation keeps of its English passage: the headings, the exercises and
# solutions, the cross-references and links (their text translated, their targets not).
STRUCTURE = {"headings": re.compile(r"^#{1,6} ", re.M), "exercises": re.compile(r"\{exercise\}"),
             "solutions": re.compile(r"\{solution\}"), "{doc} links": re.compile(r"\{doc\}"),
             "{ref} links": re.compile(r"\{ref\}"), "links": re.compile(r"\]\(")}


def structure_differences(english, chinese):
    """['2 headings for the English 3', ...]: what the Chinese passage lost or gained."""
    found = []
    for name, pattern in STRUCTURE.items():
        en, zh = len(pattern.findall(english)), len(pattern.findall(chinese))
        if en != zh:
            found.append(f"{zh} {name} for the English {en}")
    return found


def english_runs(text):
    return [match.group(0) for match in ENGLISH_RUN.finditer(prose_only(text))]


def term_hits(text):
    """[(line number, variant, term to use)]: the variants of the edition's terms in a
    passage of Chinese prose (its code, links' targets, URLs, HTML and quotations left out)."""
    hits = []
    for number, (line, kind) in enumerate(scan(text), 1):
        if (kind not in ("text", "directive") or MARKER.match(line)
                or LABEL.match(line.strip()) or re.match(r"^\s*(?::[\w-]+:|>)", line)):
            continue
        for pattern in (r"\]\([^)]*\)", r"https?://\S+", r"<[^>]+>"):
            line = re.sub(pattern, lambda m: " " * len(m.group(0)), line)
        # a role's text is prose the reader sees: {term}`rank（进程序号） <rank>`
        line = re.sub(r"\{[\w-]+\}`([^`]*)`", lambda m: " " * (len(m.group(0)) - len(
            m.group(1)) - 2) + " " + m.group(1) + " ", line)
        blanked = re.sub(r"`[^`]*`", lambda m: "`" + " " * (len(m.group(0)) - 2) + "`", line)
        for variant, allowed, use in TERMS:
            read = line if allowed == "code" else blanked
            spans = ([m.span() for m in re.finditer(allowed, read)]
                     if allowed and allowed != "code" else [])
            hits += [(number, m.group(0), use) for m in variant.finditer(read)
                     if not any(a <= m.start() and m.end() <= b for a, b in spans)]
    return hits


def term_problems(where, text, first_line=1):
    return [f"{where}, line {number + first_line - 1}: “{variant}”: write {use}"
            for number, variant, use in term_hits(text)]


# --- the command line ---------------------------------------------------------------------

def problems():
    found = []
    for english in english_pages():
        check = notebook_problems if english.suffix == ".ipynb" else page_problems
        found += check(english, chinese_page(english))
    for folder in (ROOT / "notebooks" / ZH, ROOT / "book" / ZH):
        for page in sorted(folder.glob("*.ipynb")) + sorted(folder.glob("*.md")):
            if not english_page(page).exists():
                found.append(f"{relative(page)}: no English page {relative(english_page(page))}")
    return found


def english_history(english_path, chinese_path):
    """For each out-of-date passage, how the English changed since it was translated: a
    diff of the English it translated (found in git history by its hash) and the English now."""
    if not chinese_path.exists():
        return []
    if english_path.suffix == ".ipynb":
        now = {c["id"]: source(c) for c in read(english_path)["cells"]}
        stale = {cell["id"]: (recorded(cell), now[cell["id"]], f"cell {cell['id']}")
                 for cell in read(chinese_path)["cells"] if cell["cell_type"] == "markdown"
                 and cell.get("id") in now and recorded(cell) not in (None, "new")
                 and recorded(cell) != sha(now[cell["id"]])}
    else:
        now = sections(english_path.read_text(encoding="utf-8"))
        marks = chinese_sections(chinese_path.read_text(encoding="utf-8"))
        stale = {number: (mark, now[number - 1], f"section {number}")
                 for number, (mark, _) in enumerate(marks, 1)
                 if number <= len(now) and mark != "new" and mark != sha(now[number - 1])}
    log = subprocess.run(["git", "log", "--format=%H", "--", relative(english_path)],
                         cwd=ROOT, capture_output=True, text=True).stdout.split()
    shown = []
    for key, (mark, current, name) in stale.items():
        old = None
        for commit in log:
            version = subprocess.run(["git", "show", f"{commit}:{relative(english_path)}"],
                                     cwd=ROOT, capture_output=True, text=True)
            if version.returncode:
                continue
            texts = ([source(c) for c in json.loads(version.stdout)["cells"]]
                     if english_path.suffix == ".ipynb" else sections(version.stdout))
            old = next((text for text in texts if sha(text) == mark), None)
            if old is not None:
                where = f"{relative(english_path)} {name}, as translated ({commit[:10]})"
                break
        if old is None:
            shown.append(f"{relative(english_path)} {name}: the English it translated is not "
                         f"in the history; compare with the English now.")
            continue
        shown.append("".join(difflib.unified_diff(
            old.splitlines(True), current.splitlines(True), where,
            f"{relative(english_path)} {name}, now")))
    return shown


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="what is out of step (exit status 1 if any)")
    check.add_argument("--diff", action="store_true",
                       help="also show how each out-of-date English cell changed")
    sync = commands.add_parser("sync", help="code cells and cell order from the English notebooks")
    sync.add_argument("pages", nargs="*", help="English or Chinese notebooks; all when none is given")
    accept = commands.add_parser("accept", help="record that a page's translation is current")
    accept.add_argument("page")
    accept.add_argument("cells", nargs="*", help="cell ids (notebooks) or section numbers "
                                                 "(pages); all when none is given")
    export = commands.add_parser("export", help="a page's English prose, as blocks to translate")
    export.add_argument("page")
    imp = commands.add_parser("import", help="translated blocks into the Chinese notebook")
    imp.add_argument("page")
    imp.add_argument("blocks")
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            found = problems()
            print("\n".join(found) if found else "The Chinese edition is in step with the English.")
            if found and not args.diff:
                print("How the English changed: python -m book.tools translations check --diff; "
                      "after translating: python -m book.tools translations accept PAGE [ID ...]")
            if args.diff:
                for english in english_pages():
                    for diff in english_history(english, chinese_page(english)):
                        print(diff)
            return 1 if found else 0
        if args.command == "sync":
            chosen = [resolve(page)[0] for page in args.pages] or english_pages()
            for english in chosen:
                if english.suffix == ".ipynb":
                    sync_notebook(english, chinese_page(english))
            return 0
        english, chinese = resolve(args.page)
        if args.command == "export":
            sys.stdout.write(export_notebook(english) if english.suffix == ".ipynb"
                             else export_page(english))
        elif args.command == "import":
            if english.suffix != ".ipynb":
                raise TranslationError("import is for notebooks; a page is translated in place")
            blocks = Path(args.blocks)
            if not blocks.exists():
                raise TranslationError(f"no such file: {blocks}")
            missing = import_notebook(english, chinese, blocks.read_text(encoding="utf-8"))
            for cell in missing:
                print(f"not translated yet: cell {cell}")
        elif args.command == "accept":
            if not chinese.exists():
                raise TranslationError(f"no Chinese page yet: {relative(chinese)}")
            if english.suffix == ".ipynb":
                accept_notebook(english, chinese, args.cells)
            else:
                if not all(c.isdigit() for c in args.cells):
                    raise TranslationError("a page's sections are given by number: 1, 2, ...")
                accept_page(english, chinese, {int(c) for c in args.cells})
        return 0
    except TranslationError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
