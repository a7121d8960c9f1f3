"""The Chinese edition (中文版) in step with the English one, from the sources.

book/tools/translations.py says how the two are kept in step; these tests run its checks on
the committed pages, and show on copies that a change to the English is caught and named.
"""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from book_files import ROOT, cell_source, load_notebook, toc_entries

from book.tools import translations

ZH_TOC = ROOT / "book" / "zh" / "_toc.yml"
ENGLISH_PAGES = translations.english_pages()
PAGE_IDS = [path.name for path in ENGLISH_PAGES]


def test_every_english_page_has_a_chinese_page():
    missing = [str(translations.chinese_page(p).relative_to(ROOT)) for p in ENGLISH_PAGES
               if not translations.chinese_page(p).exists()]
    assert not missing, f"English pages without their Chinese page: {missing}"
    listed = {entry for entry, _ in toc_entries()}
    for path in ENGLISH_PAGES:   # and every page the site shows is one of them
        entry = str(path.relative_to(ROOT).with_suffix(""))
        assert entry in listed or path.suffix == ".md", f"{entry} is not in _toc.yml"


def test_the_chinese_table_of_contents_lists_the_same_pages_in_the_same_order():
    english = yaml.safe_load((ROOT / "_toc.yml").read_text())
    chinese = yaml.safe_load(ZH_TOC.read_text(encoding="utf-8"))
    assert chinese["root"] == english["root"]
    assert [[c["file"] for c in part["chapters"]] for part in chinese["parts"]] == \
           [[c["file"] for c in part["chapters"]] for part in english["parts"]]
    assert [part.get("numbered") for part in chinese["parts"]] == \
           [part.get("numbered") for part in english["parts"]]
    untranslated = [part["caption"] for part in chinese["parts"]
                    if part["caption"] in {p["caption"] for p in english["parts"]}]
    assert not untranslated, f"captions left in English: {untranslated}"


@pytest.mark.parametrize("english", [p for p in ENGLISH_PAGES if p.suffix == ".ipynb"],
                         ids=lambda p: p.stem)
def test_a_chinese_chapter_has_the_english_code_cells_character_for_character(english):
    chinese = translations.chinese_page(english)
    assert chinese.exists(), f"{chinese.relative_to(ROOT)} is missing"
    en, zh = load_notebook(english), load_notebook(chinese)
    assert [c["id"] for c in zh["cells"]] == [c["id"] for c in en["cells"]]
    assert [c["cell_type"] for c in zh["cells"]] == [c["cell_type"] for c in en["cells"]]
    for en_cell, zh_cell in zip(en["cells"], zh["cells"]):
        if en_cell["cell_type"] == "code":
            assert cell_source(zh_cell) == cell_source(en_cell), (
                f"{chinese.name}, cell {en_cell['id']}: code differs from the English cell")
            assert zh_cell.get("metadata", {}).get("tags", []) == \
                en_cell.get("metadata", {}).get("tags", [])
            assert not zh_cell.get("outputs") and zh_cell.get("execution_count") is None, (
                f"{chinese.name}: committed with outputs")
    assert "widgets" not in zh.get("metadata", {})


def problems_of(english, chinese):
    return translations.compare(english, chinese)[0]


@pytest.mark.parametrize("english", ENGLISH_PAGES, ids=PAGE_IDS)
def test_the_chinese_page_translates_the_english_page_as_it_is_now(english):
    """Every prose cell or section translated, none out of date, no English sentence left."""
    problems = problems_of(english, translations.chinese_page(english))
    assert not problems, "\n".join(problems + [
        "After translating, record it: python -m book.tools translations accept PAGE"])


# --- a changed English paragraph is caught, and named --------------------------------------

@pytest.fixture
def copies(tmp_path):
    """A translated chapter and page, English and Chinese, copied where they may be changed."""
    english = ROOT / "notebooks" / "05_distributed_data_parallel.ipynb"
    page = ROOT / "book" / "how-to-run.md"
    for source in (english, translations.chinese_page(english), page,
                   translations.chinese_page(page)):
        target = tmp_path / source.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    en = tmp_path / english.relative_to(ROOT)
    md = tmp_path / page.relative_to(ROOT)
    return en, translations.chinese_page(en), md, translations.chinese_page(md)


def prose_cells(notebook):
    return [(number, cell) for number, cell in enumerate(notebook["cells"], 1)
            if cell["cell_type"] == "markdown"]


def test_a_changed_english_prose_cell_names_its_chinese_passage(copies):
    english, chinese, _, _ = copies
    before = problems_of(english, chinese)   # the edition's terms, if any
    notebook = json.loads(english.read_text())
    number, cell = prose_cells(notebook)[3]
    cell["source"] = cell_source(cell) + "\nOne more English sentence, added later on."
    english.write_text(json.dumps(notebook))
    translated = [c for c in load_notebook(chinese)["cells"] if c["id"] == cell["id"]][0]
    problems = [p for p in problems_of(english, chinese) if p not in before]
    assert len(problems) == 1, problems
    assert f"cell {number} (id {cell['id']}): out of date" in problems[0]
    assert translations.first_words(cell_source(translated)) in problems[0]
    diffs = list(translations.english_history(english, translations.compare(english, chinese)[1]))
    assert len(diffs) == 1 and "+One more English sentence, added later on." in diffs[0], diffs
    translations.accept(english, chinese, [cell["id"]])
    assert problems_of(english, chinese) == before


def test_a_changed_english_section_names_its_chinese_section(copies):
    _, _, english, chinese = copies
    before = problems_of(english, chinese)   # the edition's terms, if any
    text = english.read_text()
    sections = translations.sections(text)
    english.write_text(text.replace(sections[2], sections[2] + "\n\nA new English paragraph."))
    problems = [p for p in problems_of(english, chinese) if p not in before]
    assert len(problems) == 1 and "section 3: out of date" in problems[0], problems
    translations.accept(english, chinese, ["3"])
    assert problems_of(english, chinese) == before


def test_changed_code_is_caught_and_sync_copies_it(copies):
    english, chinese, _, _ = copies
    before = problems_of(english, chinese)   # the edition's terms, if any
    notebook = json.loads(english.read_text())
    code = next(cell for cell in notebook["cells"] if cell["cell_type"] == "code"
                and "import" not in cell_source(cell))
    code["source"] = cell_source(code) + "\nprint('changed')"
    new = {"cell_type": "markdown", "id": "a-new-cell", "metadata": {},
           "source": "A paragraph the Chinese edition has not seen."}
    notebook["cells"].insert(5, new)
    english.write_text(json.dumps(notebook))
    problems = problems_of(english, chinese)
    assert any("code differs" in p for p in problems), problems
    assert any("not the English notebook's cells" in p for p in problems), problems
    translations.sync_notebook(english, chinese)
    problems = problems_of(english, chinese)
    unnumbered = {re.sub(r"cell \d+ ", "cell ", p) for p in before}   # a cell moved down
    assert [p for p in problems if re.sub(r"cell \d+ ", "cell ", p) not in unnumbered] == [
        f"{translations.relative(chinese)}, cell 6 (id a-new-cell): not "
        f"translated yet: “A paragraph the Chinese edition has not seen.”"]


def test_a_changed_code_block_of_a_page_is_caught(copies):
    _, _, english, chinese = copies
    lines = english.read_text().split("\n")
    fence = next(n for n, (_, kind) in enumerate(translations.scan("\n".join(lines)))
                 if kind == "code-fence")
    english.write_text("\n".join(lines[:fence + 1] + ["# one more line"] + lines[fence + 1:]))
    problems = problems_of(english, chinese)
    assert any("code blocks differ" in p for p in problems), problems


@pytest.mark.parametrize("text, runs", [
    ("这是中文，只有 `torch.compile` 和 DDP 的 all-reduce。", []),
    ("用 `torchrun --nproc-per-node 2 ddp_scripts/train_ddp.py --epochs 3`。", []),
    ("见[这一页](https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)。", []),
    ("```{admonition} 注意\n中文。\n```\n```python\nfor images, labels in loader:\n```", []),
    ("这句话 was left in English by mistake.", ["was left in English by mistake"]),
    ("```{exercise} 张量在哪里？\n:label: ch01-where-is-the-tensor\nStill in English, this "
     "one.\n```", ["Still in English, this one"]),
])
def test_english_left_in_chinese_prose_is_found(text, runs):
    assert translations.english_runs(text) == runs


def test_a_translation_that_drops_a_link_or_a_heading_is_caught(copies):
    english, chinese, _, _ = copies
    notebook = json.loads(chinese.read_text())
    number, cell = next((n, c) for n, c in prose_cells(notebook)
                        if "{doc}" in cell_source(c) and "## " in cell_source(c))
    cell["source"] = re.sub(r"\{doc\}`[^`]*`", "", cell_source(cell).replace("## ", "", 1))
    chinese.write_text(json.dumps(notebook, ensure_ascii=False))
    problems = problems_of(english, chinese)
    assert any(f"cell {number} " in p and "{doc} links for the English" in p
               for p in problems), problems
    assert any(f"cell {number} " in p and "headings for the English" in p
               for p in problems), problems


# --- the edition's terms ---------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "rank（进程序号）是进程在作业中的序号；rank 0 负责写日志。",
    "local rank（本机进程序号）决定用哪块 GPU。",
    "修改之后要重启 Jupyter 内核。",
    "`DataParallel`（DP）和 DDP 都属于数据并行。",
    "训练两轮（epoch），每轮调用 `sampler.set_epoch(epoch)`，即 `--epochs 2`。",
    "DDP 的 all-reduce（全归约）与反向传播重叠。",
    "每个进程 256 / 4 = 64 张图像，全局批量 4 × 256。",
    "见 {term}`rank（进程序号） <rank>`，[链接](https://example.com/世界/内核)。",
    "> 其中rank是主機的編號，world_size表示分布式主機的個數。",
    "```python\n# 内核 epoch 世界\nprint('进程 0')\n```",
    "运行下一个代码单元格；FSDP 在这个单元运行之前收集它的权重。",
    "CUDA Graph 录制一次，之后每步重放。",
    "在有张量核心（Tensor Core）的 GPU 上更快。",
    "从数据加载器取下一个批次；批量 64 和批量 512，全局批量大小。",
    "它的输入层（stem）先把图像缩小；程序卡住时，把梯度复制到 GPU。",
    "打出一段回溯信息（traceback）；DataLoader 的工作进程（worker）和 `num_workers`。",
    "每个微批次都跳过 all-reduce；local rank（本机进程序号）决定 GPU。",
    ":::{admonition} 细节：下载很慢时\n先看文件的大小。\n:::",
    "*N* 个批量为 *b* 的进程与一个批量为 *N·b* 的进程；批量 64、批量 8。",
    "全局批量等于每个进程的批量乘以 world size；批量归一化；批量大小分别为 64 和 512。",
    "更大的批量；能用多大的批量；每块 GPU 上的批量较小时；批量越大，模型和批量越大。",
    "取下一个批次；所有进程的批次上的平均梯度；批次形状变化时；单元格仍持有的那批数据。",
    "CUDA 从 0 开始给它们编号；GPU 1 重新编号为 `cuda:0`；`nvidia-smi` 按 PCI 总线编号。",
    "`cuda:N` 里的序号属于进程；local rank 给机器上的进程编号，而不是给机器编号。",
    "原文说“rank是主机的编号”，其实 rank 是进程的序号。",
    "依据的是 PyTorch 的源代码和文档。",
    "`nvidia-smi` 给每块 GPU 编号；批量为 64 的进程。",
    "输入是 token id 时加上 `--input-dtype long`；序列 2048 个 token。",
])
def test_the_edition_s_terms_pass_where_they_are_used_as_chosen(text):
    assert translations.term_hits(text) == []


@pytest.mark.parametrize("text, variant", [
    ("一个进程序号（rank）等待一个永远不会到来的伙伴。", "进程序号"),
    ("只有 0 号进程写日志。", "0 号进程"),
    ("只有进程 0 写日志。", "进程 0"),
    ("进程总数为 1 的世界中的 rank 0。", "世界"),
    ("到会面点报到。", "会面"),
    ("修改之后要重启内核。", "内核"),
    ("数据并行（`DataParallel`）是一个进程驱动所有 GPU。", "数据并行（`DataParallel`）"),
    ("在两个 GPU 上运行。", "个 GPU"),
    ("训练两个 epoch。", "epoch"),
    ("见 {term}`全归约 <all-reduce>`。", "全归约"),
    ("**学习目标。** 学完本章后，你能够", "学完本章"),
    ("全局批量是 4 x 256。", " x "),
    ("全局批次是 4 × 256。", "全局批次"),
    ("批次大小为 32。", "批次大小"),
    ("在有 tensor core 的 GPU 上更快。", "tensor core"),
    ("运行下一个代码单元。", "代码单元"),
    ("下面是在 H200 上录制的输出。", "录制"),
    ("从数据加载器取下一个批量。", "批量"),
    ("它的起始层先把图像缩小。", "起始层"),
    ("程序卡死了。", "卡死"),
    ("把梯度拷贝到 GPU。", "拷贝"),
    ("节点 1 打出一段 traceback。", "traceback"),
    ("各个 worker 只是连接到它。", "worker"),
    ("除最后一个微批量外。", "微批量"),
    ("再加本机序号。", "本机序号"),
    (":::{admonition} 详情：下载很慢时\n先看文件的大小。\n:::", "详情"),
    ("```{dropdown} 详情\n先看文件的大小。\n```", "详情"),
    ("于是每个进程拿到的，都是所有进程的批量上的平均梯度。", "批量"),
    ("各个 rank 大小为 *b* 的批量合起来。", "批量"),
    ("想要的批量放不进显存时，就把它拆开。", "批量"),
    ("批量形状变化时，这能减少碎片。", "批量"),
    ("再加上单元格仍持有的批量数据。", "批量"),
    ("GPU 的 UUID 永远不变，而它的编号却可能改变。", "编号"),
    ("代码完全不需要设备编号。", "编号"),
    ("local rank 是进程在本机上的编号。", "编号"),
    ("依据的是 PyTorch 的源码。", "源码"),
    ("显存以批量为单位增长。", "批量"),
    ("一个以批量为参数的函数。", "批量"),
    ("`nvidia-smi` 给出每块 GPU 编号。", "编号"),
    ("输入是词元 id 时。", "词元"),
])


def test_a_variant_of_the_edition_s_terms_is_named(text, variant):
    assert [hit[1] for hit in translations.term_hits(text)] == [variant]


def test_the_chinese_a_reader_sees_outside_the_pages_is_read_for_the_terms(tmp_path, monkeypatch):
    """The build's words, the self-checks' hints, the set-up cell's message: checked too."""
    assert {"book/zh/words.yml", "notebooks/selfcheck_zh.json",
            "notebooks/selfcheck.py"} <= set(translations.READER_TEXTS)
    assert all((ROOT / name).exists() for name in translations.READER_TEXTS)
    hints = tmp_path / "hints.json"
    hints.write_text('{"ch10": {"en": "micro-batch", "zh": "每个微批量"}}', encoding="utf-8")
    words = tmp_path / "words.yml"
    words.write_text("traceback_whole: 完整的回溯信息\nhang: 程序卡死了\n", encoding="utf-8")
    code = tmp_path / "cell.py"
    code.write_text('print("请把 zip 拷贝到这里")  # 拷贝 in a comment is not shown\n')
    monkeypatch.setattr(translations, "ROOT", tmp_path)
    monkeypatch.setattr(translations, "READER_TEXTS", [path.name for path in (hints, words, code)])
    assert [problem.split(": write")[0] for problem in translations.reader_text_problems()] == [
        "hints.json, line 1: “微批量”", "words.yml, line 2: “卡死”", "cell.py, line 1: “拷贝”"]


def plant_in_a_translated_cell(english, chinese, text):
    """Append `text` to the first Chinese prose cell that is in step with its English one:
    (its number, the cell, the problems the check reports that it did not before)."""
    before = problems_of(english, chinese)
    notebook = json.loads(chinese.read_text())
    current = {c["id"]: translations.sha(cell_source(c))
               for c in json.loads(english.read_text())["cells"]}
    number, cell = next((n, c) for n, c in prose_cells(notebook)
                        if c["metadata"].get("translation") == {"en": current[c["id"]]})
    cell["source"] = cell_source(cell) + text
    chinese.write_text(json.dumps(notebook, ensure_ascii=False))
    return number, cell, [p for p in problems_of(english, chinese) if p not in before]


def test_check_names_a_planted_variant_with_its_page_cell_and_line(copies):
    english, chinese, english_page, chinese_page = copies
    number, cell, problems = plant_in_a_translated_cell(english, chinese, "\n\n修改之后要重启内核。")
    line = cell_source(cell).count("\n") + 1
    assert problems == [f"{translations.relative(chinese)}, cell {number} (id {cell['id']}), "
                        f"line {line}: “内核”: write "
                        f"{dict((v.pattern, u) for v, _, u in translations.TERMS)['内核']}"]
    text = chinese_page.read_text(encoding="utf-8")
    before = problems_of(english_page, chinese_page)
    chinese_page.write_text(text + "\n只有 0 号进程写日志。\n", encoding="utf-8")
    problems = [p for p in problems_of(english_page, chinese_page)
                if p not in before]
    last = len(translations.sections(english_page.read_text(encoding="utf-8")))
    line = len(text.splitlines()) + 2
    assert len(problems) == 1 and problems[0].startswith(
        f"{translations.relative(chinese_page)}, section {last}, line {line}: “0 号进程”"), problems
    assert chinese_page.read_text(encoding="utf-8").endswith("0 号进程写日志。\n")  # reports only


@pytest.mark.parametrize("planted, variant, line", [
    ("\n\n:::{admonition} 详情：下载很慢时\n先看文件的大小。\n:::", "详情", 3),
    ("\n\n每个进程拿到的，都是所有进程的批量上的平均梯度。", "批量", 3),
    ("\n\n而它的编号却可能改变。", "编号", 3),
    ("\n\n依据的是 PyTorch 的源码。", "源码", 3),
])
def test_check_names_each_planted_variant_of_the_style_list(copies, planted, variant, line):
    """细节 for Details, 批次 for a batch, 序号 for an index, 源代码: each variant named."""
    english, chinese, _, _ = copies
    number, cell, problems = plant_in_a_translated_cell(english, chinese, planted)
    line += cell_source(cell).count("\n") - planted.count("\n")
    assert [p.split(": write")[0] for p in problems] == [
        f"{translations.relative(chinese)}, cell {number} (id {cell['id']}), line {line}: "
        f"“{variant}”"], problems


def test_bad_input_is_one_line_and_exit_2():
    for args in (["accept", "notebooks/99_none.ipynb"],
                 ["accept", "book/intro.md", "one"]):   # a page's sections are numbered
        result = subprocess.run([sys.executable, "-m", "book.tools", "translations", *args], cwd=ROOT,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and result.stderr.startswith("error: "), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


# --- the glossary maps every term ----------------------------------------------------------

def glossary_terms(path):
    """The term lines of a page's {glossary} directive, entry by entry."""
    entries, current, inside = [], [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```{glossary}"):
            inside = True
        elif inside and line.startswith("```"):
            break
        elif inside and line and not line.startswith((" ", ":")):
            current.append(line.strip())
        elif inside and current:
            entries.append(current)
            current = []
    return entries


def test_the_chinese_glossary_gives_every_english_term_with_its_chinese_term():
    """Each Chinese entry: its Chinese term, then the English entry's terms, as they are (the
    Chinese pages link to the English terms: {term}`全归约 <all-reduce>`)."""
    english = glossary_terms(ROOT / "book" / "glossary.md")
    chinese = glossary_terms(ROOT / "book" / "zh" / "glossary.md")
    assert [terms[1:] for terms in chinese] == english
    assert all(any("\u4e00" <= ch <= "\u9fff" for ch in terms[0]) for terms in chinese), (
        "every entry's first term is Chinese")


# Chinese characters and full-width punctuation: a line break between two of them is a space
# on the page (HTML, and Jupyter's Markdown), which Chinese text does not have.
CJK = "\u3000-\u303f\u4e00-\u9fff\uff00-\uffef"
BROKEN_CHINESE_LINE = re.compile(rf"[{CJK}][ \t]*\n[ \t]*[{CJK}]")


def broken_between_chinese_characters(text):
    """Whether a line of prose (code left out) ends and the next begins with Chinese."""
    prose = "\n".join(line if kind in ("text", "directive") else ""
                      for line, kind in translations.scan(text))
    return bool(BROKEN_CHINESE_LINE.search(prose))


def test_no_chinese_line_is_broken_between_two_chinese_characters():
    """A line break inside Chinese text is a stray space on the page (and in Jupyter)."""
    broken = []
    for english in ENGLISH_PAGES:
        chinese = translations.chinese_page(english)
        texts = ([cell_source(c) for c in load_notebook(chinese)["cells"]
                  if c["cell_type"] == "markdown"] if chinese.suffix == ".ipynb"
                 else [chinese.read_text(encoding="utf-8")])
        broken += [f"{chinese.relative_to(ROOT)}: “{translations.first_words(text)}”"
                   for text in texts if broken_between_chinese_characters(text)]
    assert not broken, "join the lines broken between Chinese characters:\n" + "\n".join(broken)


# --- the site's two editions (book/extensions/editions.py) ---------------------------------

from book.extensions import editions


@pytest.mark.parametrize("pagename, edition, link", [
    ("notebooks/05_distributed_data_parallel", "en", "../zh/notebooks/05_distributed_data_parallel.html"),
    ("notebooks/05_distributed_data_parallel", "zh", "../../notebooks/05_distributed_data_parallel.html"),
    ("search", "en", "zh/search.html"),
    ("search", "zh", "../search.html"),
])
def test_the_link_to_the_other_edition(pagename, edition, link):
    assert editions.switch_link(pagename, edition) == link


def test_the_chinese_launch_buttons_open_the_chinese_notebook():
    hub = ("https://hub.example.org/hub/user-redirect/git-pull?repo=https://github.com/o/r&"
           "urlpath=lab/tree/r/notebooks/05_distributed_data_parallel.ipynb&branch=main")
    colab = ("https://colab.research.google.com/github/o/r/blob/main/notebooks/"
             "05_distributed_data_parallel.ipynb")
    download = "../_sources/notebooks/05_distributed_data_parallel.ipynb"
    buttons = [{"type": "group", "label": "launch-buttons",
                "buttons": [{"type": "link", "url": hub}, {"type": "link", "url": colab}]},
               {"type": "group", "label": "download-buttons",
                "buttons": [{"type": "link", "url": download}]}]
    editions.retarget(buttons, "notebooks/05_distributed_data_parallel")
    hub_now, colab_now = (b["url"] for b in buttons[0]["buttons"])
    assert hub_now == hub.replace("notebooks/05", "notebooks/zh/05")
    assert colab_now == colab.replace("notebooks/05", "notebooks/zh/05")
    assert buttons[1]["buttons"][0]["url"] == download   # the executed copy: this page's own


def chinese_theme_words():
    config = yaml.safe_load((ROOT / "book" / "zh" / "_config.yml").read_text(encoding="utf-8"))
    return config["sphinx"]["config"]["theme_words"]


def test_the_words_the_packages_write_in_english_are_chinese_on_a_chinese_page():
    """Sphinx's glossary links, myst-nb's hidden cells: written into the page in English."""
    page = ('<dt id="term-rank">rank<a class="headerlink" href="#term-rank" title="Link to this term">'
            '¶</a></dt><details class="admonition hide above-input">'
            '<summary aria-label="Toggle hidden content">')
    assert editions.translate_page(page, chinese_theme_words()) == (
        '<dt id="term-rank">rank<a class="headerlink" href="#term-rank" title="指向本术语的链接">'
        '¶</a></dt><details class="admonition hide above-input">'
        '<summary aria-label="显示或隐藏内容">')


def test_sphinx_togglebutton_s_script_labels_its_buttons_in_chinese(tmp_path):
    """Its script writes each dropdown's button, aria-label and all, into the page as it runs:
    the Chinese site's copy says it in Chinese."""
    import sphinx_togglebutton
    script = Path(sphinx_togglebutton.__file__).parent / "_static" / "togglebutton.js"
    (tmp_path / "togglebutton.js").write_text(script.read_text(encoding="utf-8"), encoding="utf-8")
    editions.translate_scripts(tmp_path, chinese_theme_words())
    translated = (tmp_path / "togglebutton.js").read_text(encoding="utf-8")
    assert 'aria-label="显示或隐藏内容"' in translated and "Toggle hidden content" not in translated


def test_the_launch_buttons_images_are_named_in_chinese():
    """sphinx-book-theme names a launch button's image "{service} {logo}", each word from its
    catalogue (book/extensions/editions.py puts theme_words there): "Colab 标志"."""
    import sphinx_book_theme
    buttons = Path(sphinx_book_theme.__file__).parent / "theme" / "sphinx_book_theme" / "macros" / "buttons.html"
    assert '{{ translate(text) }} {{ translate("logo") }}' in buttons.read_text(encoding="utf-8")
    assert chinese_theme_words()["logo"] == "标志"


@pytest.mark.parametrize("language", [editions.EnglishSearch, editions.ChineseSearch])
def test_search_finds_a_name_however_it_is_spelt(language):
    """`all_reduce`, all-reduce and "all reduce": the same words in the index, and the search
    box splits what a reader types the same way (its regular expression has no underscore)."""
    index = language({})
    for spelling in ("all_reduce", "all-reduce", "all reduce"):
        words = {word.lower() for word in index.split(f"torch.distributed.{spelling}")}
        assert {"all", "reduce"} <= words and "all_reduce" not in words, (spelling, words)
    assert "\\p{Number}\\p{Emoji_Presentation}]+" in language.js_splitter_code


@pytest.mark.parametrize("text, broken", [
    ("第一行，\n第二行。", True),
    ("在 GPU\n上训练。", False),                       # a space belongs there
    ("```python\n# 中文\n# 注释\n```", False),        # code is not prose
    ("```{literalinclude} x.py\n```\n\n第一行，\n第二行。", True),
    ("- 一项，\n  接着。\n- 另一项。", True),
])
def test_a_line_broken_between_chinese_characters_is_found(text, broken):
    assert broken_between_chinese_characters(text) == broken


def test_both_editions_have_the_same_words_with_the_same_placeholders():
    """What the tools write on the pages (book/words.yml, book/zh/words.yml): every entry in
    both languages, each with the same {placeholders}."""
    from book.tools import words
    english, chinese = words("en"), words("zh")
    assert english.keys() == chinese.keys()
    for key in english:
        assert re.findall(r"\{\w+", english[key]) == re.findall(r"\{\w+", chinese[key]), key


def test_a_figure_caption_is_translated_kept_by_sync_and_caught_when_the_english_changes(copies):
    english, chinese, _, _ = copies
    before = problems_of(english, chinese)
    notebook = json.loads(english.read_text())
    code = next(cell for cell in notebook["cells"] if cell["cell_type"] == "code")
    code["metadata"]["mystnb"] = {"figure": {"caption": "Each rank's share.", "name": "fig-x"},
                                  "image": {"alt": "Two bars."}}
    english.write_text(json.dumps(notebook))
    translations.sync_notebook(english, chinese)
    new = [p for p in problems_of(english, chinese) if p not in before]
    assert len(new) == 1 and "figure caption of cell" in new[0] and "not translated yet" in new[0]
    zh = json.loads(chinese.read_text())
    twin = next(cell for cell in zh["cells"] if cell["id"] == code["id"])
    twin["metadata"]["mystnb"] = {"figure": {"caption": "每个进程的一份。", "name": "fig-x"},
                                  "image": {"alt": "两根柱子。"}}
    chinese.write_text(json.dumps(zh))
    translations.accept(english, chinese, [code["id"]])
    assert problems_of(english, chinese) == before
    translations.sync_notebook(english, chinese)   # sync keeps the translated caption
    kept = next(c for c in json.loads(chinese.read_text())["cells"] if c["id"] == code["id"])
    assert kept["metadata"]["mystnb"]["figure"]["caption"] == "每个进程的一份。"
    code["metadata"]["mystnb"]["figure"]["caption"] = "Each rank's share, after the all-reduce."
    english.write_text(json.dumps(notebook))
    new = [p for p in problems_of(english, chinese) if p not in before]
    assert len(new) == 1 and "out of date" in new[0] and "每个进程的一份" in new[0], new


# --- a page's code comments may be in Chinese; its code may not differ ----------------------

@pytest.mark.parametrize("line, code", [
    ("x = 1   # one", "x = 1"),
    ("# a whole line", ""),
    ('print("# not a comment")  # a comment', 'print("# not a comment")'),
    ("url = 'https://example.org/#anchor'", "url = 'https://example.org/#anchor'"),
    ("echo ${#PATH}", "echo ${#PATH}"),
])
def test_a_code_line_without_its_comment(line, code):
    assert translations.without_comment(line) == code


def test_a_page_s_code_comment_in_chinese_passes_and_changed_code_is_still_caught(copies):
    _, _, english, chinese = copies
    before = problems_of(english, chinese)
    text = chinese.read_text()
    lines = text.split("\n")
    kinds = [kind for _, kind in translations.scan(text)]
    number = next(n for n, kind in enumerate(kinds) if kind == "code" and lines[n].strip())
    code = lines[number]
    lines[number] = code + "   # 中文注释"
    chinese.write_text("\n".join(lines))
    assert problems_of(english, chinese) == before
    lines[number] = code + "x   # 中文注释"
    chinese.write_text("\n".join(lines))
    assert any("code blocks differ" in p for p in problems_of(english, chinese))
    lines[number] = code
    lines.insert(number, "# 多出来的一行注释")
    chinese.write_text("\n".join(lines))
    assert any("code blocks differ" in p for p in problems_of(english, chinese))


# --- the self-checks speak the notebook's language, wherever it is opened --------------------

def test_sync_marks_a_chinese_notebook_as_the_chinese_edition_s(copies):
    english, chinese, _, _ = copies
    zh = json.loads(chinese.read_text())
    zh["metadata"].pop("book_edition", None)
    chinese.write_text(json.dumps(zh, ensure_ascii=False))
    translations.sync_notebook(english, chinese)
    assert json.loads(chinese.read_text())["metadata"]["book_edition"] == "zh"
    assert "book_edition" not in json.loads(english.read_text())["metadata"]


def test_the_self_checks_take_the_language_from_the_notebook_jupyter_names(monkeypatch, tmp_path):
    """An uploaded notebook (Kaggle, ModelScope) sits in no zh/ folder: its metadata says."""
    from notebooks import selfcheck
    monkeypatch.delenv("BOOK_LANGUAGE", raising=False)
    upload = tmp_path / "working"
    upload.mkdir()
    monkeypatch.chdir(upload)
    for name, metadata in (("en.ipynb", {}), ("zh.ipynb", {"book_edition": "zh"})):
        (upload / name).write_text(json.dumps({"cells": [], "metadata": metadata}))
    for session, expected in (("en.ipynb", "en"), (str(upload / "zh.ipynb"), "zh"),
                              ("elsewhere/zh.ipynb", "zh"),   # a path from the server's root
                              ("missing.ipynb", "en")):
        monkeypatch.setenv("JPY_SESSION_NAME", session)
        assert selfcheck.language() == expected, session
    monkeypatch.setenv("BOOK_LANGUAGE", "en")   # the reader's choice wins
    assert selfcheck.language() == "en"


@pytest.mark.parametrize("page", ["how-to-run.md", "zh/how-to-run.md"])
def test_the_colab_steps_set_the_chinese_self_checks(page):
    """Colab gives the kernel no notebook path to read the edition from: each edition's Colab
    section says to set BOOK_LANGUAGE=zh for a Chinese chapter."""
    text = (ROOT / "book" / page).read_text(encoding="utf-8")
    colab = re.search(r"^## [^\n]*Google Colab[^\n]*\n(.*?)^## ", text, re.MULTILINE | re.DOTALL)
    assert colab and "`%env BOOK_LANGUAGE=zh`" in colab[1], page
