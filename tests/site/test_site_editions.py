"""The built site's two editions: English at the root, Chinese (中文版) under zh/.

Every page links to the same page in the other edition; the Chinese pages show the English
chapters' execution, search Chinese words, and launch the Chinese notebooks.
"""
import json
import re
from urllib.parse import urlsplit

import pytest

from book_files import BUILD, HTML, ROOT, Page, chapters, site_config, toc_entries

from book.tools import build, gpu_recordings

ZH = HTML / "zh"
CHAPTERS = chapters()


def content_pages(root, skip=()):
    """The HTML pages Sphinx wrote for one edition (not its static files or sources)."""
    return sorted(p for p in root.rglob("*.html")
                  if not {"_static", "_sources", *skip} & set(p.relative_to(root).parts)
                  and p.name != "index.html")   # index.html only redirects to the introduction


@pytest.fixture(scope="module")
def editions(site):
    if not (ZH / "book" / "intro.html").exists():
        pytest.fail(f"the Chinese edition is missing ({ZH}): run `make book`", pytrace=False)
    return {"en": content_pages(HTML, skip={"zh"}), "zh": content_pages(ZH)}


def switch_of(path):
    links = [attrs for attrs in Page(path).with_class("edition-switch", "a")]
    assert len(links) == 1, f"{path.relative_to(HTML)}: {len(links)} links to the other edition"
    return links[0]


def test_both_editions_have_every_page_of_the_table_of_contents(editions):
    for entry, _ in toc_entries():
        for root in (HTML, ZH):
            assert (root / f"{entry}.html").exists(), f"no {root / entry}.html"
    english = {p.relative_to(HTML) for p in editions["en"]}
    chinese = {p.relative_to(ZH) for p in editions["zh"]}
    assert english == chinese, (sorted(english - chinese), sorted(chinese - english))


@pytest.mark.parametrize("edition", ["en", "zh"])
def test_every_page_links_to_the_same_page_in_the_other_edition(editions, edition):
    root, other, language = (HTML, ZH, "zh-CN") if edition == "en" else (ZH, HTML, "en")
    for path in editions[edition]:
        link = switch_of(path)
        target = (path.parent / link["href"]).resolve()
        assert target == (other / path.relative_to(root)).resolve(), (
            f"{path.relative_to(HTML)} links to {link['href']}")
        assert target.exists(), f"{path.relative_to(HTML)}: {link['href']} does not exist"
        assert link.get("hreflang") == language
        back = switch_of(target)   # and the other page links back here
        assert (target.parent / back["href"]).resolve() == path.resolve()


def test_each_edition_says_its_language(editions):
    for edition, language in (("en", "en"), ("zh", "zh-CN")):
        for path in editions[edition][:5] + [p for p in editions[edition] if "notebooks" in p.parts]:
            head = path.read_text(encoding="utf-8")[:400]
            assert f'<html lang="{language}"' in head, f"{path}: {head[:120]}"


def outputs_by_id(notebook):
    """{code cell id: its outputs} of a notebook as the site offers it for download, without
    what the page step writes in each edition's language: the boxes of recorded GPU output, a
    shortened traceback's left-out line and the whole traceback's box."""
    left_out = [build.words(language)["traceback_left_out"].split("{frames}")[0]
                for language in ("en", "zh")]

    def as_run(output):
        if output.get("output_type") == "error" and output.get("metadata", {}).get(build.SHORTENED):
            return dict(output, traceback=[part for part in output["traceback"]
                                           if not part.startswith(tuple(left_out))])
        return output
    return {cell["id"]: [as_run(output) for output in cell["outputs"]
                         if gpu_recordings.MARKER not in output.get("metadata", {})
                         and not (output.get("output_type") == "display_data"
                                  and output.get("metadata", {}).get(build.SHORTENED))]
            for cell in notebook["cells"] if cell["cell_type"] == "code"}


def test_the_chinese_chapters_show_the_english_chapters_execution():
    """The build executes the English notebooks only, and gives each Chinese code cell the
    outputs of the English cell with its id (book/tools/build.py): the Chinese notebooks
    offered for download are the Chinese ones, with the English outputs."""
    assert not (BUILD / "src-zh" / "runs").exists(), "a Chinese chapter was executed"
    for path, _ in CHAPTERS:
        english, chinese = (json.loads((root / "_sources" / "notebooks" / path.name).read_text())
                            for root in (HTML, ZH))
        title = "".join(chinese["cells"][0]["source"])
        assert re.search(r"[\u4e00-\u9fff]", title), f"{path.name}: not the Chinese notebook"
        shown = outputs_by_id(chinese)
        assert any(shown.values()), f"{path.name}: no outputs"
        assert shown == outputs_by_id(english), f"{path.name}: not the English outputs"
        assert chinese["metadata"].get("widgets") == english["metadata"].get("widgets")


def execution_rows(root):
    """[(notebook, seconds)] of an edition's execution-times page."""
    page = (root / "book" / "execution-times.html").read_text(encoding="utf-8")
    return re.findall(r'<span class="pre">(\w+\.ipynb)</span></code></p></td>\s*<td[^>]*><p>([\d.]+)</p>',
                      page)


def test_the_chinese_execution_times_are_the_english_ones():
    english = execution_rows(HTML)
    assert len(english) == len(CHAPTERS) and execution_rows(ZH) == english


def test_the_chinese_launch_buttons_open_the_chinese_notebooks(editions):
    config = site_config()
    colab = urlsplit(config["launch_buttons"]["colab_url"]).netloc
    for path, _ in CHAPTERS:
        page = Page(ZH / "notebooks" / f"{path.stem}.html")
        links = [href for href in page.links if urlsplit(href).netloc == colab]
        assert len(links) == 1, links
        notebook = urlsplit(links[0]).path.split("/blob/", 1)[1].split("/", 1)[1]
        assert notebook == f"notebooks/zh/{path.name}" and (ROOT / notebook).exists()


def search_index(root):
    """{word: [page numbers]} of one edition's search index (body and titles), page names."""
    text = (root / "searchindex.js").read_text(encoding="utf-8")
    index = json.loads(text[text.index("(") + 1:text.rindex(")")])
    words = {}
    for part in ("terms", "titleterms"):
        for word, found in index[part].items():
            words.setdefault(word, set()).update(found if isinstance(found, list) else [found])
    return words, index["docnames"]


@pytest.mark.parametrize("word, page", [("张量", "notebooks/02_tensors_and_models"),
                                        ("进程组", "notebooks/05_distributed_data_parallel"),
                                        ("全归约", "notebooks/05_distributed_data_parallel"),
                                        ("检查点", "notebooks/09_ddp_in_practice"),
                                        ("梯度", "notebooks/11_fsdp")])
def test_the_chinese_search_index_holds_chinese_words(word, page):
    """jieba splits the Chinese text into words (the glossary's terms among them); without
    it, no Chinese word would be indexed."""
    words, docnames = search_index(ZH)
    assert word in words, f"{word} is not in the Chinese search index"
    assert docnames.index(page) in words[word], f"{word}: not found on {page}"


def test_the_chinese_pages_generated_at_build_time_are_in_chinese():
    times = (ZH / "book" / "execution-times.html").read_text(encoding="utf-8")
    assert "执行时间" in times and "合计" in times
    labels = [p for path, _ in CHAPTERS
              for p in re.findall(r'<p class="gpu-recording-label">(.*?)</p>',
                                  (ZH / "notebooks" / f"{path.stem}.html").read_text("utf-8"))]
    assert labels, "no recorded GPU output on the Chinese pages"
    assert all(re.search(r"[\u4e00-\u9fff]", label) for label in labels), labels[:3]


def boxes_on_page(page, language):
    """[current, stale, not recorded] boxes of recorded GPU output on one chapter's page."""
    return [page.count('class="gpu-recording gpu-recording-current"'),
            page.count('class="gpu-recording gpu-recording-stale"')
            - page.count(gpu_recordings.words(language)["gpu_header_missing"]),
            page.count(gpu_recordings.words(language)["gpu_header_missing"])]


def front_page_table(intro):
    """{chapter stem: [current, stale, not recorded]} of the front page's table of GPU boxes,
    and its last row's numbers (the book's)."""
    rows = {}
    for row in intro.split("<tr")[1:]:
        cells = re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.S)
        numbers = [re.sub(r"<[^>]+>", "", cell).strip() for cell in cells[1:]]
        if len(cells) == 4 and all(n.isdigit() for n in numbers):
            chapter = re.search(r'href="\.\./notebooks/(\w+)\.html"', cells[0])
            rows[chapter.group(1) if chapter else "total"] = [int(n) for n in numbers]
    return rows


@pytest.mark.parametrize("language, root", [("en", HTML), ("zh", ZH)])
def test_the_front_page_states_the_gpu_boxes_the_chapters_show(editions, language, root):
    """book/intro.md's counts (build.gpu_box_words): the table, a row per chapter, against the
    boxes on that chapter's page, and the first paragraph's totals."""
    shown = {path.stem: boxes_on_page((root / "notebooks" / f"{path.stem}.html").read_text(encoding="utf-8"),
                                      language) for path, _ in CHAPTERS}
    shown = {stem: counts for stem, counts in shown.items() if any(counts)}
    html_text = (root / "book" / "intro.html").read_text(encoding="utf-8")
    table = front_page_table(html_text)
    total = [sum(counts[i] for counts in shown.values()) for i in range(3)]
    assert table == {**shown, "total": total}, table
    first = re.sub(r"<[^>]+>", "", html_text.split("</h1>", 1)[1].split("<p>", 1)[1].split("</p>", 1)[0])
    stated = [int(n) for n in re.findall(r"\d+", first)][:4]
    assert stated == [sum(total), *total], first
