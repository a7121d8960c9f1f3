"""The editorial checks of the book's sources, each problem said on one line.

    python -m book.tools sources   # the editorial checks alone (exit 1 if any problem)

They check the table of contents, each chapter's shape and exercises, figures and times, and
the repository's address: what no library checks for this book. What one does is left to it:
ruff lints, nbstripout keeps outputs out of the notebooks (`make check` runs both), and the
build's `jupyter-book -W` fails on a missing page or included code that moved.
`python -m book.tools check` runs them beside the set-up cell's and the translations' checks.
Each check takes the repository's root and returns its problems: the file, the cell or line,
and what is wrong.
"""
import argparse
import functools
import json
import re
from pathlib import Path

import yaml
from markdown_it import MarkdownIt
from mdit_py_plugins.colon_fence import colon_fence_plugin

from book.tools import ROOT
from book.tools.notebooks import source_of as cell_source, tags_of as tags

# The block parser MyST uses for fences and colon fences.
PARSER = MarkdownIt("commonmark").use(colon_fence_plugin)
CHECKS = []


def check(function):
    """A check of the whole repository: function(root) -> [problem, ...]."""
    CHECKS.append(function)
    return function


def each_chapter(function):
    """A check of one chapter, function(root, path, number, notebook) -> [problem, ...], run
    over every chapter of the table of contents that exists (jupyter-book -W fails on one missing)."""
    @functools.wraps(function)
    def over_the_chapters(root):
        return [problem for path, number in chapters(root) if path.exists()
                for problem in function(root, path, number, load_notebook(path))]
    return check(over_the_chapters)


# --- reading the sources ----------------------------------------------------------------------

def toc_entries(root):
    """[(file without suffix, chapter number or None)] in reading order, root first."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    entries, number = [(toc["root"], None)], 0
    for part in toc.get("parts", []):
        for chapter in part.get("chapters", []):
            number += bool(part.get("numbered"))
            entries.append((chapter["file"], number if part.get("numbered") else None))
    return entries


def chapters(root):
    """[(notebook path, chapter number)] for the notebooks in the table of contents."""
    return [(root / (entry + ".ipynb"), number) for entry, number in toc_entries(root)
            if entry.startswith("notebooks/")]


def load_notebook(path):
    return json.loads(Path(path).read_text())


def name(root, path):
    return str(path.relative_to(root))


# --- the table of contents ----------------------------------------------------------------------

@check
def notebooks_in_the_toc(root):
    listed = {path for path, _ in chapters(root)}
    return [f"{name(root, path)}: not in _toc.yml (the book would not show it)"
            for path in sorted((root / "notebooks").glob("*.ipynb")) if path not in listed]


# --- each chapter -------------------------------------------------------------------------------

@each_chapter
def the_title_carries_the_chapter_number(root, path, number, notebook):
    first = notebook["cells"][0]
    if first["cell_type"] != "markdown":
        return [f"{name(root, path)}, cell 0: the first cell must be the title"]
    found = []
    title = cell_source(first).lstrip().splitlines()[0]
    if not re.match(rf"# {number}\. \S", title):
        found.append(f"{name(root, path)}, cell 0: title {title!r} should start with "
                     f"'# {number}. ' (its place in _toc.yml)")
    titles = [index for index, cell in enumerate(notebook["cells"]) if cell["cell_type"] == "markdown"
              for token in PARSER.parse(cell_source(cell))
              if token.type == "heading_open" and token.tag == "h1"]
    if len(titles) != 1:
        found.append(f"{name(root, path)}, cells {titles}: one '#' title only, then '##' sections")
    return found


@each_chapter
def ends_with_summary_and_exercises(root, path, number, notebook):
    text = "\n".join(cell_source(c) for c in notebook["cells"] if c["cell_type"] == "markdown")
    sections = re.findall(r"^## (.+?)\s*$", text, flags=re.M)
    return [f"{name(root, path)}: no '## {section}' section (a chapter ends with Summary and Exercises)"
            for section in ("Summary", "Exercises") if section not in sections]


def directives(source, name):
    """(argument, body, first line, end line) of every {name} block of a markdown text, as the
    parser MyST uses sees it (options such as :label: are the body's first lines)."""
    return [(token.info.split(None, 1)[1].strip() if " " in token.info.strip() else "",
             token.content, *token.map)
            for token in PARSER.parse(source) if token.type in ("fence", "colon_fence")
            and re.match(rf"\{{{name}\}}", token.info)]


# ```{solution} ... ```python ... ``` ... ``` ends at the inner closing fence: the rest of the
# answer falls outside the solution, visible, and the block no longer ends its cell.
EARLY = " (or a fence inside it closed it early: open it with a longer one, ````{solution})"


def exercise_shape_problems(notebook, number=None):
    """What departs from the one shape of an exercise (book/instructor-guide.md, "Exercises and self-checks"):

    1. a markdown cell that ends with one {exercise} block (prose only before the first);
    2. for an exercise with a value to check: a code cell tagged `answer` where the student
       writes it, then a code cell tagged `self-check` that calls notebooks.selfcheck.check
       and compares nothing itself (no `==`, no answer in sight);
    3. a markdown cell that is one {solution} block for that exercise, collapsed.
    Each exercise has a label, chNN- first (chapter `number`) when it is given.
    Solutions are never code cells: a student copy drops the {solution} blocks, and nothing
    after them can depend on them.
    """
    cells = notebook["cells"]

    def blocks(index, name):
        """The cell's {name} blocks and its number of lines (none: not a markdown cell)."""
        if index >= len(cells) or cells[index]["cell_type"] != "markdown":
            return [], 0
        source = cell_source(cells[index]).strip("\n")
        return directives(source, name), source.count("\n") + 1

    problems = [f"cell {index} is tagged 'solution': write solutions as {{solution}} blocks in markdown"
                for index, cell in enumerate(cells) if "solution" in tags(cell)]
    starts = [index for index in range(len(cells)) if blocks(index, "exercise")[0]]
    index = starts[0] if starts else len(cells)
    problems += [] if starts else ["no {exercise}"]
    while index < len(cells):
        exercises, lines = blocks(index, "exercise")
        if len(exercises) != 1:
            problems.append(f"cell {index}: expected one {{exercise}} in a markdown cell")
            break
        title, body, first, end = exercises[0]
        if end != lines or (index != starts[0] and first != 0):
            problems.append(f"cell {index}: the {{exercise}} block must be the whole cell "
                            f"(the first may follow the section's prose){EARLY}")
        label = (re.findall(r"^:label:\s*(\S+)", body, re.M) or [None])[0]
        if label is None or (number and not label.startswith(f"ch{number:02d}-")):
            problems.append(f"cell {index}: the exercise needs a :label: ch{number or 0:02d}-<what>")
        if "`" in title:  # seen with sphinx-exercise 1.x: the build then fails
            problems.append(f"{label}: no code in an exercise's title; sphinx-exercise "
                            "leaves its label undefined")
        index += 1
        kinds = []
        while index < len(cells) and cells[index]["cell_type"] == "code":
            kinds.append([tag for tag in tags(cells[index]) if tag in ("answer", "self-check")])
            index += 1
        if kinds not in ([], [["answer"], ["self-check"]]):
            problems.append(f"{label}: between the exercise and its solution, either nothing "
                            f"or an `answer` cell then a `self-check` cell; found {kinds}")
        code = cell_source(cells[index - 1]) if kinds else ""
        if kinds and not re.search(r"^from notebooks\.selfcheck import check$.*\bcheck\(", code, re.M | re.S):
            problems.append(f"{label}: the self-check must call check() from notebooks.selfcheck")
        if re.search(r"[=!]=", code):
            problems.append(f"{label}: the self-check compares with == itself: the compared "
                            "value is an answer in plain view")
        solutions, lines = blocks(index, "solution")
        if len(solutions) != 1 or solutions[0][0] != label:
            problems.append(f"{label}: cell {index} should be its {{solution}}, alone")
            break
        if not re.search(r"^:class:\s*dropdown\s*$", solutions[0][1], re.M):
            problems.append(f"{label}: the solution (cell {index}) must be collapsed (:class: dropdown)")
        if solutions[0][2:] != (0, lines):
            problems.append(f"{label}: the {{solution}} block must be the whole cell {index}{EARLY}")
        index += 1
    return problems


@each_chapter
def exercises_have_the_one_shape(root, path, number, notebook):
    return [f"{name(root, path)}: {problem}" for problem in exercise_shape_problems(notebook, number)]


# The figures: a numbered figure is a code cell with metadata mystnb.figure {name, caption} and
# mystnb.image {alt}; each chapter shows at least this many.
FIGURES_PER_CHAPTER = 2


def figure_options(cell):
    return cell.get("metadata", {}).get("mystnb", {}) if cell["cell_type"] == "code" else {}


@each_chapter
def figures_are_captioned_and_described(root, path, number, notebook):
    """Sphinx (-W) fails on two figures of one name; a reader needs each one's caption and alt text."""
    figures = [(index, cell) for index, cell in enumerate(notebook["cells"]) if "figure" in figure_options(cell)]
    found = [] if len(figures) >= FIGURES_PER_CHAPTER else [
        f"{name(root, path)}: {len(figures)} numbered figure(s); each chapter shows at least {FIGURES_PER_CHAPTER}"]
    for index, cell in figures:
        where, options = f"{name(root, path)}, cell {index} (id {cell.get('id')})", figure_options(cell)
        if len(str(options["figure"].get("caption", "")).split()) < 4:
            found.append(f"{where}: its figure needs a caption of a sentence or more")
        if len(str(options.get("image", {}).get("alt", "")).split()) < 6:
            found.append(f"{where}: its figure needs alt text (mystnb.image.alt) saying what it shows")
    return found


@check
def every_page_gives_each_chapter_its_own_time(root):
    """The instructor guide and the landing page (and its Chinese page): a row per chapter with
    the minutes its first cell states; the landing page also the total of them all and of the
    core path, as it says them."""
    stated, problems = {}, []
    for path, number in chapters(root):
        found = re.search(r"\*\*Estimated time\.\*\*\D*(\d+) min", cell_source(load_notebook(path)["cells"][0]))
        stated[path.stem] = int(found.group(1)) if found else None
        problems += [] if found else [f"{name(root, path)}, cell 0: should give '**Estimated time.** N minutes'"]
    # The minutes are the first "N min" after the chapter's name; the landing page's then says core.
    row = re.compile(r"^\| \{doc\}`\.\./notebooks/(\w+)` \|.*?(\d+) (?:min|分钟) \|(.*)$", re.M)
    for page in ("book/instructor-guide.md", "book/intro.md", "book/zh/intro.md"):
        text = (root / page).read_text(encoding="utf-8")
        rows = {stem: (int(minutes), rest) for stem, minutes, rest in row.findall(text)}
        problems += [f"{page}: no row for {stem}" if stem not in rows else
                     f"{page}: {rows[stem][0]} min for {stem}, the chapter says {minutes}"
                     for stem, minutes in stated.items() if rows.get(stem, (None,))[0] != minutes]
        core = sum(stated.get(stem) or 0 for stem, (_, rest) in rows.items()
                   if re.match(r"\s*(core|核心)\s*\|", rest))
        every = sum(minutes or 0 for minutes in stated.values())
        for what, minutes in (("every chapter's", every), ("the core path's", core)):
            if page.endswith("intro.md") and not re.search(rf"[（(]{minutes} (?:minutes|分钟)[)）]", text):
                problems.append(f"{page}: should give {what} time, ({minutes} minutes)")
    return problems


# --- the repository's address -------------------------------------------------------------------

@check
def the_repository_named_is_the_configured_one(root):
    """The GitHub addresses in the README, the front matter and the set-up cell (which clones
    it) are the repository of _config.yml."""
    url = yaml.safe_load((root / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    docs = [root / "README.md", root / "book/tools/setup_cell.py", *sorted((root / "book").glob("*.md"))]
    return [f"{name(root, doc)}, line {text.count(chr(10), 0, found.start()) + 1}: names "
            f"{found.group()}, but the repository is {url} (_config.yml)"
            for doc in docs for text in [doc.read_text()]
            for found in re.finditer(r"https://github\.com/[\w.-]+/[\w.-]+", text)
            if found.group().rstrip(".") != url]


def main(argv=None):
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    found = [problem for function in CHECKS for problem in function(ROOT)]
    print("\n".join(found) if found else f"No problems: the {len(CHECKS)} editorial checks of the sources.")
    return 1 if found else 0
