"""The Chinese edition (中文版), kept in step with the English one.

    python -m book.tools translations check [--diff]   # what is out of step (exit 1 if any)
    python -m book.tools translations sync [PAGE ...]  # code cells and cell order from English
    python -m book.tools translations accept PAGE [ID ...]   # translation brought up to date

notebooks/NN_x.ipynb has notebooks/zh/NN_x.ipynb: the English cells in the same order, with
the same ids, the code character for character (`sync` copies it), and in each prose cell's
metadata {"translation": {"en": SHA}}, the first 12 hex digits of the SHA-256 of the English
cell's source; a code cell that draws a numbered figure keeps its own caption and alt text
(metadata mystnb.figure, mystnb.image), marked the same way with the hash of the English ones.
book/x.md has book/zh/x.md: the English fenced code blocks as they are (their comments, from
# to the end of a line, may be translated: a line for a line), and a
line `% en: SHA` before each section (a heading and what follows, up to the next heading).
When English prose changes, `check` names its Chinese passage, out of date, until `accept`.
The edition's terms are checked there and in READER_TEXTS, the other Chinese a reader sees.
"""
import argparse
import difflib
import hashlib
import json
import re
import subprocess
from collections import namedtuple
from pathlib import Path

import yaml

from book.tools import ROOT, ToolError
from book.tools.notebooks import read_notebook as read, write_notebook as write

ZH = "zh"
SYNC = "run: python -m book.tools translations sync"
MARKER = re.compile(r"^% en: ([0-9a-f]{12}|new)\s*$")
HEADING = re.compile(r"^#{1,6} \S")
LABEL = re.compile(r"^\([\w-]+\)=\s*$")
OPTION = re.compile(r"^\s*:[\w-]+:")   # a directive's option
FENCE = re.compile(r"^(\s*)(`{3,}|:{3,})")
DIRECTIVE_TITLE = re.compile(r"^\s*(?:`{3,}|:{3,})\{(?:admonition|dropdown|exercise)\}\s*(\S.*)$")
CODE, LINK_TARGET, URL, HTML = r"`[^`]*`", r"\]\([^)]*\)", r"https?://\S+", r"<[^>]+>"
# Five English words in a row or more: a sentence left in English ("DDP 的 all-reduce" is not).
ENGLISH_RUN = re.compile(r"(?:\b[A-Za-z][A-Za-z'’-]*[ ,;:]+){4,}[A-Za-z][A-Za-z'’-]*\b")
# The edition's terms: book/zh/terms.yml says what each field means.
TERMS = [(re.compile(term["variant"]), term.get("allowed") if term.get("allowed") in (None, "code")
          else re.compile(term["allowed"]), term["use"])
         for term in yaml.safe_load((ROOT / "book" / ZH / "terms.yml").read_text(encoding="utf-8"))]
# The Chinese a reader sees outside the pages: the build's words, the self-checks' hints and
# lines, the set-up cell's message, the theme's words, the table of contents.
READER_TEXTS = ["book/zh/words.yml", "book/zh/_toc.yml", "book/zh/_config.yml",
                "notebooks/selfcheck_zh.json", "notebooks/selfcheck.py", "book/tools/setup_cell.py",
                "book/extensions/editions.py", "book/theme/figures.js",
                "book/theme/fit-calculator.js"]
CHINESE = re.compile(r"[\u4e00-\u9fff]")
# What a reader does not see of a line of them: a YAML key, a comment.
KEY_OR_COMMENT = re.compile(r"^\s*[\w.-]+:\s|\s#\s.*$")
# A Chinese notebook says so in its metadata, for the self-checks' hints wherever it is opened
# (notebooks/selfcheck.py, language()).
EDITION = {"book_edition": ZH}
# What a translation keeps of its English passage (links' text translated, targets not).
STRUCTURE = {"headings": r"(?m)^#{1,6} ", "exercises": r"\{exercise\}", "links": r"\]\(",
             "solutions": r"\{solution\}", "{doc} links": r"\{doc\}", "{ref} links": r"\{ref\}"}
# A prose cell or section (key: its id or number) and its translation, which starts on line
# first_line of its file; mark is the hash of the English it translates, or "new".
Passage = namedtuple("Passage", "key label english chinese mark first_line")


def sha(text):
    return hashlib.sha256(text.strip().encode("utf-8")).hexdigest()[:12]


def relative(path):
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def english_pages():
    return sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "book").glob("*.md"))


def chinese_page(english):
    return english.parent / ZH / english.name


def resolve(page):
    """A page named on the command line, English or Chinese: (english, chinese)."""
    path = Path(page).resolve()
    english = path.parent.parent / path.name if path.parent.name == ZH else path
    if not english.exists():
        raise ToolError(f"no such page: {english}")
    return english, chinese_page(english)


def first_words(text, width=60):
    line = next((line.strip() for line in text.splitlines()
                 if line.strip() and not LABEL.match(line.strip())), "")
    return line if len(line) <= width else line[:width - 1] + "…"


def read_english(path):
    notebook = read(path)
    ids = [cell.get("id") for cell in notebook.cells]
    if None in ids or len(set(ids)) != len(ids):
        raise ToolError(f"{relative(path)}: every cell needs its own id (nbformat 4.5)")
    return notebook


def notebook_passages(english_path, chinese_path, name):
    """(what is out of step in a Chinese notebook's cells and code, its prose cells)."""
    english, chinese = read_english(english_path), read(chinese_path)
    found, passages = [], []
    if [c.get("id") for c in chinese["cells"]] != [c["id"] for c in english["cells"]]:
        found.append(f"{name}: its cells are not the English notebook's cells in the same "
                     f"order ({SYNC})")
    by_id = {cell.get("id"): cell for cell in chinese["cells"]}
    for number, cell in enumerate(english["cells"], 1):
        zh, label = by_id.get(cell["id"]), f"cell {number} (id {cell['id']})"
        if zh is None or zh["cell_type"] != cell["cell_type"]:
            continue   # reported above
        mark = zh.get("metadata", {}).get("translation", {}).get("en")
        if cell["cell_type"] != "code":
            passages.append(Passage(cell["id"], label, cell.source, zh.source, mark, 1))
            continue
        if zh.source != cell.source:
            found.append(f"{name}, {label}: code differs from the English cell ({SYNC})")
        if figure_text(cell) is not None:   # its name, if not the English: -W fails a reference
            passages.append(Passage(cell["id"], f"figure caption of {label}", figure_text(cell),
                                    figure_text(zh) or "", mark, 1))
    return found, passages


def figure_text(cell):
    """A figure cell's caption and alt text (metadata mystnb.figure.caption and mystnb.image.alt),
    as one text to translate; None for a cell that draws no numbered figure."""
    options = cell.get("metadata", {}).get("mystnb", {})
    caption = options.get("figure", {}).get("caption")
    return None if caption is None else f"{caption}\n\n{options.get('image', {}).get('alt', '')}"


def sync_notebook(english_path, chinese_path):
    """The English cells, order and code into the Chinese notebook: a prose cell keeps its
    translation, a new one comes in English, marked "new" (check reports it)."""
    english = read_english(english_path)
    chinese = read(chinese_path) if chinese_path.exists() else {"cells": []}
    by_id = {cell.get("id"): cell for cell in chinese["cells"]}
    cells = []
    for cell in english["cells"]:
        zh = by_id.get(cell["id"])
        kept = zh is not None and zh["cell_type"] == cell["cell_type"]
        translation = zh.get("metadata", {}).get("translation", {}) if kept else {"en": "new"}
        if cell["cell_type"] != "code":
            cell = {**(zh if kept else cell),
                    "metadata": {**cell.get("metadata", {}), "translation": translation}}
        elif figure_text(cell) is not None:   # the code is English; the caption keeps its translation
            translated = zh.get("metadata", {}).get("mystnb") if kept and figure_text(zh) else None
            mystnb = translated or cell["metadata"]["mystnb"]
            cell = {**cell, "metadata": {**cell["metadata"], "mystnb": mystnb,
                                         "translation": translation if translated else {"en": "new"}}}
        cells.append(cell)
    write(chinese_path, {**english, "metadata": {**english.get("metadata", {}), **EDITION},
                         "cells": cells})


def scan(text):
    """Each line of a Markdown text and what it is: 'code-fence' or 'fence' (opening or closing
    a code block, or a directive: ```{exercise}), 'code', 'directive' (prose) or 'text'."""
    fences = []   # the open fences, innermost last: (fence, holds code)
    for line in text.split("\n"):
        in_code = any(code for _, code in fences)
        match = FENCE.match(line)
        mark = match.group(2) if match else ""
        if mark and fences and line.strip() == mark and mark.startswith(fences[-1][0]):
            yield line, "code-fence" if fences.pop()[1] else "fence"
        elif mark and not in_code:   # ``` and ```python hold code; ```{directive} holds prose
            code = mark.startswith("`") and "{" not in line
            fences.append((mark[0] * len(mark), code))
            yield line, "code-fence" if code else "fence"
        else:
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


def code_lines(text):
    """The lines of a page's fenced code blocks (``` only: directives' bodies are prose), each
    without its comment."""
    return [without_comment(line) for line, kind in scan(text) if kind in ("code", "code-fence")]


def without_comment(line):
    """A code line with its comment (# to the end of the line, outside quotes, at the start or
    after a space) set aside, and the spaces before it: the Chinese page may translate it."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            quote = None if char == quote and line[index - 1] != "\\" else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].rstrip()
    return line


def page_passages(english_path, chinese_path, name):
    """(what is out of step in a Chinese page's sections and code, its sections)."""
    english_text, chinese_text = (path.read_text(encoding="utf-8") for path in (english_path, chinese_path))
    english, lines = sections(english_text), chinese_text.splitlines()
    starts = [number for number, line in enumerate(lines) if MARKER.match(line)]
    marked = [(MARKER.match(lines[a])[1], "\n".join(lines[a + 1:b]), a + 2)   # after its marker
              for a, b in zip(starts, starts[1:] + [len(lines)])]
    found = []
    if len(marked) != len(english):
        found.append(f"{name}: {len(marked)} marked sections for the English page's "
                     f"{len(english)} (a `% en: SHA` line before each)")
    if code_lines(chinese_text) != code_lines(english_text):
        found.append(f"{name}: its code blocks differ from the English page's")
    return found, [Passage(str(number), f"section {number}", section, zh, mark, first)
                   for number, (section, (mark, zh, first)) in enumerate(zip(english, marked), 1)]


def prose_lines(text):
    """(line number, line) of a passage's prose: outside code, labels and options; a
    directive's title (:::{admonition} 细节：…) is prose too."""
    for number, (line, kind) in enumerate(scan(text), 1):
        title = DIRECTIVE_TITLE.match(line) if kind == "fence" else None
        if title:
            yield number, " " * title.start(1) + title.group(1)
        elif kind in ("text", "directive") and not (LABEL.match(line.strip()) or OPTION.match(line)):
            yield number, line


def english_runs(text):
    """The English sentences left in Chinese prose (code, links' targets and markup left out)."""
    prose = "\n".join(line for _, line in prose_lines(text))
    for pattern in (CODE, r"\{[\w-]+\}", LINK_TARGET, URL, HTML, r"\$[^$]*\$"):
        prose = re.sub(pattern, " ", prose)
    return ENGLISH_RUN.findall(prose)


def term_hits(text):
    """[(line number, variant, term to use)] in Chinese prose, quotations left out."""
    hits = []
    for number, line in prose_lines(text):
        if line.lstrip().startswith(">"):
            continue
        for pattern in (LINK_TARGET, URL, HTML):
            line = re.sub(pattern, " ", line)
        line = re.sub(r"\{[\w-]+\}`([^`]*)`", r" \1 ", line)   # a role's text is prose
        blanked = re.sub(CODE, "` `", line)
        for variant, allowed, use in TERMS:
            read = line if allowed == "code" else blanked
            if allowed not in (None, "code"):   # where the words are right: blanked out
                read = allowed.sub(lambda right: "\0" * len(right.group()), read)
            hits += [(number, m.group(0), use) for m in variant.finditer(read)]
    return hits


def reader_text_problems():
    """The terms of the Chinese a reader sees outside the pages (READER_TEXTS), line by line."""
    return [f"{name}, line {number}: “{variant}”: write {use}" for name in READER_TEXTS
            for number, line in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1)
            if CHINESE.search(line) for _, variant, use in term_hits(KEY_OR_COMMENT.sub(" ", line))]


def passage_problems(where, passage):
    """Not translated yet, out of date, or English left in it, structure lost, terms not used."""
    english, chinese = passage.english, passage.chinese
    if passage.mark in (None, "new"):
        return [f"{where}: not translated yet: “{first_words(english)}”"]
    if passage.mark != sha(english):
        return [f"{where}: out of date: “{first_words(chinese)}” translates an older version "
                f"of the English {passage.label.split()[0]} “{first_words(english)}”"]
    counts = {name: (len(re.findall(pattern, english)), len(re.findall(pattern, chinese)))
              for name, pattern in STRUCTURE.items()}
    return ([f"{where}: English left untranslated: “{run}”" for run in english_runs(chinese)]
            + [f"{where}: {zh} {name} for the English {en}"
               for name, (en, zh) in counts.items() if en != zh]
            + [f"{where}, line {number + passage.first_line - 1}: “{variant}”: write {use}"
               for number, variant, use in term_hits(chinese)])


def compare(english_path, chinese_path):
    """(what is out of step between an English page and its Chinese page, its passages)."""
    name = relative(chinese_path)
    if not chinese_path.exists():
        return [f"{name}: missing (the Chinese page of {relative(english_path)})"], []
    pair = notebook_passages if english_path.suffix == ".ipynb" else page_passages
    found, passages = pair(english_path, chinese_path, name)
    return found + [problem for passage in passages
                    for problem in passage_problems(f"{name}, {passage.label}", passage)], passages


def accept(english_path, chinese_path, keys=()):
    """Record the English hash of the cells or sections named (by id or number; all if none)."""
    if not chinese_path.exists():
        raise ToolError(f"no Chinese page yet: {relative(chinese_path)}")
    passages = {p.key: p for p in compare(english_path, chinese_path)[1]}
    unknown = sorted(set(keys) - set(passages))
    if unknown:
        raise ToolError(f"{relative(chinese_path)} has no prose cell or section {unknown[0]}")
    chosen = {key: sha(p.english) for key, p in passages.items() if not keys or key in keys}
    if english_path.suffix == ".ipynb":
        chinese = read(chinese_path)
        for cell in [cell for cell in chinese["cells"] if cell.get("id") in chosen]:
            cell.setdefault("metadata", {})["translation"] = {"en": chosen[cell["id"]]}
        write(chinese_path, chinese)
    else:
        lines = chinese_path.read_text(encoding="utf-8").splitlines()
        for key, mark in chosen.items():
            lines[passages[key].first_line - 2] = f"% en: {mark}"   # the line before the section
        chinese_path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def english_history(english_path, passages):
    """For each out-of-date passage, a diff from the English it translates (from git) to now."""
    path, git = relative(english_path), ["git", "-C", str(ROOT)]
    stale = [p for p in passages if p.mark not in (None, "new") and p.mark != sha(p.english)]
    old = {}   # hash -> (where it was found, English text), the newest commit first
    log = subprocess.run([*git, "log", "--format=%H", "--", path], capture_output=True, text=True)
    for commit in log.stdout.split() if stale else []:
        version = subprocess.run([*git, "show", f"{commit}:{path}"], capture_output=True, text=True)
        if version.returncode:
            continue
        texts = (sections(version.stdout) if english_path.suffix == ".md"
                 else [figure_text(cell) or "" if cell["cell_type"] == "code" else
                       "".join(cell["source"]) for cell in json.loads(version.stdout)["cells"]])
        for text in texts:
            old.setdefault(sha(text), (f"commit {commit[:10]}", text))
        if all(p.mark in old for p in stale):
            break
    for p in stale:
        where, text = old.get(p.mark, ("not in the history", ""))
        yield "".join(difflib.unified_diff(
            text.splitlines(True), p.english.splitlines(True),
            f"{path} {p.label}, as translated ({where})", f"{path} {p.label}, now"))


def check(show_diff):
    found, diffs = [], []
    for english in english_pages():
        problems, passages = compare(english, chinese_page(english))
        found += problems
        diffs += english_history(english, passages) if show_diff else []
    found += [f"{relative(page)}: no English page {relative(page.parent.parent / page.name)}"
              for page in [*(ROOT / "notebooks" / ZH).glob("*.ipynb"), *(ROOT / "book" / ZH).glob("*.md")]
              if not (page.parent.parent / page.name).exists()]
    found += reader_text_problems()
    # diffs come only with out-of-date passages, which are problems found
    print("\n".join(found + diffs) if found else "The Chinese edition is in step with the English.")
    if found and not show_diff:
        print("How the English changed: python -m book.tools translations check --diff; "
              "after translating: python -m book.tools translations accept PAGE [ID ...]")
    return 1 if found else 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("check").add_argument("--diff", action="store_true")
    commands.add_parser("sync").add_argument("pages", nargs="*")
    accepting = commands.add_parser("accept")
    accepting.add_argument("page")
    accepting.add_argument("ids", nargs="*")
    args = parser.parse_args(argv)
    if args.command == "check":
        return check(args.diff)
    if args.command == "accept":
        accept(*resolve(args.page), args.ids)
    else:
        for english in [resolve(page)[0] for page in args.pages] or english_pages():
            if english.suffix == ".ipynb":
                sync_notebook(english, chinese_page(english))
    return 0
