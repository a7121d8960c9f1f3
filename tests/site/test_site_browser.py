"""The built site in a real browser (headless Chromium): what a reader sees and clicks.

Screenshots are kept in _build/screenshots/ for review. The tests run on one pytest worker
(one browser); a test that only reads a page shares it with the others that read it
(`opened`), loaded once; one that clicks or moves on gets a tab of its own (`page`).
"""
import re
import subprocess

import pytest
import yaml

from book_files import HTML, ROOT, chapters, site_config, toc_entries

pytestmark = pytest.mark.xdist_group("browser")

CHAPTERS = chapters()
# The two editions: where each is on the site, and its title (the Chinese one under zh/).
EDITIONS = {"en": "", "zh": "/zh"}
TITLES = {"en": "Training and testing PyTorch models on GPUs", "zh": "在 GPU 上训练和测试 PyTorch 模型"}
BROKEN_IMAGES = """() => Array.from(document.querySelectorAll('article img'))
    .filter(img => !(img.complete && img.naturalWidth > 0)).map(img => img.src)"""


def open_page(page, url):
    page.goto(url, wait_until="load")
    page.wait_for_selector("article.bd-article")
    return page


def check_navigation(page):
    """The sidebar lists every page of the table of contents."""
    nav = page.locator("nav.bd-docs-nav")
    assert nav.is_visible(), "no navigation sidebar"
    hrefs = nav.locator("a.reference").evaluate_all("links => links.map(a => a.href)")
    for entry, _ in toc_entries()[1:]:
        assert any(href.split("#")[0].endswith(f"/{entry}.html") for href in hrefs), (
            f"the sidebar has no link to {entry}")


@pytest.mark.parametrize("edition", EDITIONS)
def test_front_page(page, server, screenshots, edition):
    open_page(page, server + EDITIONS[edition] + "/")   # index.html: to the introduction
    page.wait_for_url(re.compile(r".*/book/intro\.html$"))
    title = page.locator("article h1").first
    assert title.inner_text().startswith(TITLES[edition])
    check_navigation(page)
    chapter_links = page.locator("article a.reference.internal[href*='notebooks/']")
    assert chapter_links.count() >= len(CHAPTERS)
    page.screenshot(path=str(screenshots / f"00_front_page-{edition}.png"))
    assert not page.errors, page.errors


# One chapter of each edition in the browser, each with figures: what the theme's
# JavaScript does (copy buttons, launch and download menus, solution toggles) is the same on
# every page of an edition, and the file tests (test_site_html.py, test_site_editions.py)
# check each page of both editions as built: its heading, buttons, solutions, images.
IN_THE_BROWSER = {"05_distributed_data_parallel": "en", "02_tensors_and_models": "zh"}
CHAPTER_EDITIONS = [(path_number, IN_THE_BROWSER[path_number[0].stem])
                    for path_number in CHAPTERS if path_number[0].stem in IN_THE_BROWSER]


@pytest.mark.parametrize("path_number, edition", CHAPTER_EDITIONS,
                         ids=[f"{path.stem}-{edition}" for (path, _), edition in CHAPTER_EDITIONS])
def test_chapter_renders_with_navigation_code_figures_and_solutions(page, server, screenshots,
                                                                    path_number, edition):
    path, number = path_number
    screenshots = screenshots / edition
    screenshots.mkdir(exist_ok=True)
    if not (HTML / EDITIONS[edition].lstrip("/") / "notebooks" / f"{path.stem}.html").exists():
        pytest.fail(f"no page for {path.name} in the built site ({edition})", pytrace=False)
    open_page(page, f"{server}{EDITIONS[edition]}/notebooks/{path.stem}.html")
    heading = page.locator("article h1").first.inner_text()
    assert heading.startswith(f"{number}. "), heading
    check_navigation(page)
    page.locator("nav.bd-docs-nav li.current a.current").first.wait_for(state="visible")

    # Code, with a copy button on each block.
    assert page.locator("article div.cell_input").count() > 0, "no code cells"
    assert page.locator("article div.cell_output").count() > 0, "no outputs: was it executed?"
    assert page.locator("article button.copybtn").count() > 0, "no copy buttons"
    # Figures: every image actually loaded.
    assert page.evaluate(BROKEN_IMAGES) == []
    page.screenshot(path=str(screenshots / f"{path.stem}.png"))
    figures = page.locator("article div.cell_output img")
    assert figures.count(), "no figure on a chapter chosen for its figures"
    figures.first.scroll_into_view_if_needed()
    figures.first.wait_for(state="visible")
    figures.first.screenshot(path=str(screenshots / f"{path.stem}-figure.png"))

    # Launch and download buttons, as a reader opens them.
    page.locator(".dropdown-launch-buttons button.dropdown-toggle").click()
    colab = page.locator(".dropdown-launch-buttons a:has-text('Colab')")
    colab.wait_for(state="visible")
    folder = "notebooks/zh" if edition == "zh" else "notebooks"
    assert colab.get_attribute("href").endswith(f"/{folder}/{path.name}")
    hub = site_config()["launch_buttons"].get("jupyterhub_url")
    hub_button = page.locator(".dropdown-launch-buttons a:has-text('JupyterHub')")
    if hub:
        hub_button.wait_for(state="visible")
    else:
        assert hub_button.count() == 0, "a JupyterHub button, but no hub is configured"
    page.keyboard.press("Escape")
    page.locator(".dropdown-download-buttons button.dropdown-toggle").click()
    page.locator(".dropdown-download-buttons a:has-text('.ipynb')").wait_for(state="visible")
    page.keyboard.press("Escape")

    # A solution is collapsed, and opens with its toggle ("Click to show").
    solution = page.locator("div.solution.dropdown").first
    assert solution.count() == 1, "no {solution} dropdown"
    content = solution.locator("section").first
    solution.scroll_into_view_if_needed()
    assert not content.is_visible(), "the solution is shown before it is asked for"
    solution.locator("button.toggle-button").click()
    content.wait_for(state="visible")
    solution.screenshot(path=str(screenshots / f"{path.stem}-solution.png"))
    assert not page.errors, page.errors


@pytest.mark.parametrize("edition", EDITIONS)
def test_execution_times_page_shows_a_row_per_chapter(page, server, screenshots, edition):
    open_page(page, f"{server}{EDITIONS[edition]}/book/execution-times.html")
    rows = page.locator("article table tbody tr")
    assert rows.count() == len(CHAPTERS)
    assert " cores" in page.locator("article").inner_text()  # the build machine's label
    page.screenshot(path=str(screenshots / f"execution-times-{edition}.png"))
    assert not page.errors, page.errors


@pytest.mark.parametrize("edition", EDITIONS)
@pytest.mark.parametrize("name", ["how-to-run", "instructor-guide", "cheat-sheet", "glossary"])
def test_front_matter_page_renders(opened, screenshots, name, edition):
    page = opened(f"{EDITIONS[edition]}/book/{name}.html".lstrip("/"))
    check_navigation(page)
    assert page.locator("article h1").first.is_visible()
    if name in ("how-to-run", "cheat-sheet"):
        assert page.locator("article button.copybtn").count() > 0
    page.screenshot(path=str(screenshots / f"book-{name}-{edition}.png"))
    assert not page.errors, page.errors


def test_the_browser_has_a_font_for_the_chinese_pages():
    """Without one, Chromium draws every Chinese character as a box, and the screenshots of
    the Chinese pages show nothing a reviewer can read."""
    fonts = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True)
    assert fonts.stdout.strip(), "no font with Chinese characters: run `make browser`"


def test_a_reader_switches_edition_and_back_on_the_same_page(page, server, screenshots):
    open_page(page, f"{server}/notebooks/05_distributed_data_parallel.html")
    page.locator("a.edition-switch:has-text('中文')").click()
    page.wait_for_url(re.compile(r".*/zh/notebooks/05_distributed_data_parallel\.html$"))
    page.wait_for_selector("article.bd-article")
    assert page.locator("html").get_attribute("lang") == "zh-CN"
    assert page.locator("article h1").first.inner_text().startswith("5. ")
    page.screenshot(path=str(screenshots / "edition-switch-zh.png"))
    page.locator("a.edition-switch:has-text('English')").click()
    page.wait_for_url(re.compile(r".*127\.0\.0\.1:\d+/notebooks/05_distributed_data_parallel"
                                 r"\.html$"))
    assert page.locator("html").get_attribute("lang") == "en"
    assert not page.errors, page.errors


@pytest.mark.parametrize("word, page_name", [("张量", "02_tensors_and_models"),
                                             ("进程组", "05_distributed_data_parallel")])
def test_the_chinese_search_finds_chinese_words(page, server, word, page_name):
    page.goto(f"{server}/zh/search.html?q={word}", wait_until="load")
    results = page.locator("#search-results ul.search li")
    results.first.wait_for(state="visible")
    links = results.locator("a").evaluate_all("links => links.map(a => a.href)")
    assert any(f"/zh/notebooks/{page_name}.html" in link for link in links), links
    assert not page.errors, page.errors


VISIBLE_SEARCH = """() => Array.from(document.querySelectorAll(
    '.search-button__button, form.bd-search input, input[type=search]'))
    .filter(e => e.offsetParent !== null && e.getBoundingClientRect().width > 0)
    .map(e => e.className)"""


def test_chapter_1_menu_renders_offline(page, server, screenshots):
    """The device menu: an ipywidgets Dropdown, drawn by the widget JavaScript the site serves."""
    open_page(page, f"{server}/notebooks/01_devices.html")
    menu = page.locator("article .widget-dropdown select").first
    menu.wait_for(state="visible")
    # The widget draws the select first and fills in its options after: wait for them.
    menu.locator("option", has_text="cpu").first.wait_for(state="attached")
    page.locator("article .widget-dropdown", has_text="Device:").first.wait_for(state="attached")
    options = menu.locator("option").all_inner_texts()
    assert any(option.strip() == "cpu" for option in options), options
    assert "Device:" in page.locator("article .widget-dropdown").first.inner_text()
    menu.scroll_into_view_if_needed()
    page.screenshot(path=str(screenshots / "offline-ch01-menu.png"))
    assert not page.blocked, f"requests to outside the site: {page.blocked}"
    assert not page.failed, page.failed
    assert not page.errors, page.errors


def test_chapter_7_form_and_formulas_render_offline(opened, screenshots):
    page = opened("notebooks/07_experiment.html", width=1024)
    configs = page.locator("article .widget-select-multiple select").first
    configs.wait_for(state="visible")
    configs.locator("option", has_text="ddp").first.wait_for(state="attached")
    assert {"cpu", "gpu", "dp", "ddp"} <= {o.strip() for o in
                                           configs.locator("option").all_inner_texts()}
    page.locator("article .widget-button:has-text('Run')").first.wait_for(state="visible")
    assert page.locator("article .widget-dropdown select").count() >= 1      # size
    configs.scroll_into_view_if_needed()
    page.screenshot(path=str(screenshots / "offline-ch07-form.png"))
    check_formulas(page)
    assert not page.blocked, f"requests to outside the site: {page.blocked}"
    assert not page.failed, page.failed
    assert not page.errors, page.errors


def check_formulas(page):
    """Every formula typeset by MathJax (served by the site); no raw TeX left on the page."""
    formulas = page.locator("article .math")
    count = formulas.count()
    assert count > 0, "no formula on this page"
    page.wait_for_function(f"document.querySelectorAll('article mjx-container').length >= {count}")
    article = page.locator("article").inner_text()
    assert "\\(" not in article and "\\[" not in article, "raw TeX on the page"


@pytest.mark.parametrize("name", ["book/intro", "book/instructor-guide"])
def test_formulas_render_offline_on_the_front_matter(opened, name):
    page = opened(f"{name}.html")
    check_formulas(page)
    assert not page.blocked, f"requests to outside the site: {page.blocked}"
    assert not page.failed, page.failed


@pytest.mark.parametrize("width", [1280, 600])
def test_one_search_box(opened, width):
    page = opened("notebooks/02_tensors_and_models.html", width=width)
    visible = page.evaluate(VISIBLE_SEARCH)
    assert len(visible) == 1, f"{width} px wide: {len(visible)} search controls: {visible}"


def test_setup_cell_collapsed_with_its_code_one_click_away(page, server):
    open_page(page, f"{server}/notebooks/03_choosing_gpus.html")
    setup = page.locator("article div.cell.tag_hide-input").first
    code = setup.locator("div.cell_input")
    assert "REPOSITORY = " in code.text_content()   # in the page, and
    assert not code.is_visible(), "the set-up cell's code is shown before it is asked for"
    setup.locator("summary").first.click()
    code.wait_for(state="visible")


CUT_OFF = """() => Array.from(document.querySelectorAll('article div.cell_output pre'))
    .filter(pre => pre.offsetParent !== null && pre.scrollWidth > pre.clientWidth + 1)
    .map(pre => pre.innerText.slice(0, 80))"""
WIDE_TABLES = """() => Array.from(document.querySelectorAll('article div.cell_output table'))
    .filter(t => t.offsetParent !== null)
    .map(t => {
        const article = document.querySelector('article');
        let box = t.parentElement, scrolls = false;
        while (box && box !== article) {   // a box of its own that scrolls sideways
            scrolls = scrolls || (['auto', 'scroll'].includes(getComputedStyle(box).overflowX)
                && box.getBoundingClientRect().right <= article.getBoundingClientRect().right + 1);
            box = box.parentElement;
        }
        return {scrolls: scrolls,
                fits: t.getBoundingClientRect().right <= article.getBoundingClientRect().right + 1,
                text: t.innerText.slice(0, 60)};
    })"""


@pytest.mark.parametrize("stem", ["05_distributed_data_parallel", "07_experiment"])
def test_printed_output_wraps_and_tables_scroll_in_their_own_box(opened, stem):
    page = opened(f"notebooks/{stem}.html", width=1024)
    assert page.evaluate(CUT_OFF) == [], "printed lines run past their box"
    tables = page.evaluate(WIDE_TABLES)
    assert tables, "no table on this page"
    unreachable = [t["text"] for t in tables if not (t["fits"] or t["scrolls"])]
    assert not unreachable, f"tables cut off, with no scroll bar: {unreachable}"


def test_launcher_output_is_one_block_per_cell(opened):
    page = opened("notebooks/05_distributed_data_parallel.html", width=1024)
    per_cell = page.evaluate("""() => Array.from(document.querySelectorAll('article div.cell'))
        .map(cell => cell.querySelectorAll(':scope > div.cell_output > div.output.stream').length)""")
    assert max(per_cell) >= 1
    adjacent = page.evaluate("""() => Array.from(document.querySelectorAll(
        'article div.cell_output > div.output.stream + div.output.stream')).length""")
    assert adjacent == 0, "consecutive stream outputs shown as separate boxes"


def test_recorded_gpu_output_is_shown_beside_the_build_machine_output(opened, screenshots):
    page = opened("notebooks/02_tensors_and_models.html")
    recorded = page.locator("article div.cell.tag_gpu-output div.gpu-recording")
    assert recorded.count() >= 10
    # After the build machine's output, the label, then what the cell printed there: outputs
    # of the cell, rendered as the build's are, and marked by the label's border.
    after_label = "div.cell_output > div.output:has(> div.gpu-recording) ~ div.output"
    cell = page.locator(f"article div.cell.tag_gpu-output:has({after_label}"
                        ":has-text('pinned, .to(device)'))").first
    cell.scroll_into_view_if_needed()
    box = cell.locator("div.gpu-recording").first   # current or stale: one line, then details
    header = box.locator("summary").inner_text()
    assert "H200" in header and "torch 2.11" in header and "\n" not in header.strip(), header
    assert box.locator("details").evaluate("d => !d.open"), "the details should start collapsed"
    assert "4 notebooks ran at once" not in box.inner_text()
    box.locator("summary").click()
    text = box.inner_text()
    assert "Recorded on" in text or "Stale recording from" in text, text[:300]
    assert "4 notebooks ran at once" in text, text[:300]
    shown = cell.locator(after_label).first
    assert "pinned, .to(device)" in " ".join(cell.locator(after_label).all_inner_texts())
    assert shown.evaluate("e => getComputedStyle(e).borderLeftWidth") == "4px"
    cell.locator("div.cell_output").screenshot(path=str(screenshots / "gpu-recording-ch02.png"))


PHONE = 390   # CSS px: a phone held upright
# What sticks out past the screen: elements of the page whose right edge is beyond it and
# that no box of their own lets the reader scroll to (a cut title reads as cut, even when the
# page itself does not scroll).
STICKING_OUT = """(width) => Array.from(document.querySelectorAll(
        '.bd-header-article *, article.bd-article *'))
    .filter(e => {
        const box = e.getBoundingClientRect();
        if (box.width === 0 || box.right <= width + 1 || e.closest('mjx-container')) return false;
        for (let up = e.parentElement; up && up !== document.body; up = up.parentElement) {
            if (['auto', 'scroll'].includes(getComputedStyle(up).overflowX)
                && up.getBoundingClientRect().right <= width + 1) return false;
        }
        return true;
    })
    .map(e => `${e.tagName.toLowerCase()}.${e.className} (${Math.round(e.getBoundingClientRect().right)} px): `
              + e.textContent.trim().slice(0, 50))"""
# Text cut at the edge of its own box: a title, or the next and previous chapters' names.
CUT_TEXT = """() => Array.from(document.querySelectorAll('article.bd-article h1, .prev-next-area a'))
    .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.textContent.trim().slice(0, 50))"""
FIGURES_WITHOUT_LINK = """() => Array.from(document.querySelectorAll('article.bd-article img'))
    .filter(img => !img.closest('.widget-area, .jupyter-widgets'))
    .filter(img => !(img.closest('a.figure-full-size') || img.closest('a[href]')))
    .map(img => img.src.slice(-60))"""


# A figure wider than a phone scrolls in its own box, and the box says so (book/theme/figures.js,
# book.css): a shadow at the edge with more to see, and under it a line in the page's language.
HINTS = {"en": "swipe", "zh": "滑动"}
WIDE_FIGURES = """(hint) => Array.from(document.querySelectorAll('article.bd-article a.figure-full-size'))
    .filter(link => link.scrollWidth > link.clientWidth + 1)
    .map(link => {
        const box = link.parentElement, line = box.nextElementSibling;
        const edge = getComputedStyle(box, '::after');
        const said = line && line.matches('.figure-hint') && line.offsetParent !== null
            && line.getBoundingClientRect().height > 0 && line.innerText.includes(hint);
        return {figure: link.querySelector('img').src.slice(-60), said: said,
                shadow: edge.opacity === '1' && parseFloat(edge.width) > 0
                        && Math.abs(box.getBoundingClientRect().right
                                    - link.getBoundingClientRect().right) < 1};
    })"""
PAGES = [entry for entry, _ in toc_entries()]


@pytest.mark.parametrize("edition", EDITIONS)
@pytest.mark.parametrize("entry", PAGES, ids=[entry.rpartition("/")[2] for entry in PAGES])
def test_every_page_reads_on_a_phone(page, server, screenshots, entry, edition):
    """At 390 px nothing sticks out sideways (long inline code and titles wrap; tables, code
    and wide figures scroll in their own box, which says it does), and every figure opens at
    full size."""
    stem = entry.rpartition("/")[2]
    page.set_viewport_size({"width": PHONE, "height": 844})
    open_page(page, f"{server}{EDITIONS[edition]}/{entry}.html")
    page.evaluate("""async () => { await document.fonts.ready;   // fonts, formulas drawn
        if (window.MathJax && MathJax.startup) await MathJax.startup.promise; }""")
    width = page.evaluate("() => document.documentElement.scrollWidth")
    sticking_out = page.evaluate(STICKING_OUT, PHONE)
    assert width <= PHONE and not sticking_out, (
        f"{width} px wide at {PHONE} px: {sticking_out[:5]}")
    assert page.evaluate(CUT_TEXT) == [], "text cut off at the edge of its box"
    assert page.evaluate(FIGURES_WITHOUT_LINK) == [], "figures with no way to open them larger"
    wide = page.evaluate(WIDE_FIGURES, HINTS[edition])
    assert [f["figure"] for f in wide if not f["said"]] == [], "wide figures with no line under them"
    assert [f["figure"] for f in wide if not f["shadow"]] == [], "wide figures with no shadow at the edge"
    links = page.locator("article.bd-article a.figure-full-size")
    if links.count():   # the link leads to the figure itself
        first = links.first
        assert first.get_attribute("href") == first.locator("img").evaluate("img => img.src")
    folder = screenshots / "phone"
    folder.mkdir(exist_ok=True)
    page.screenshot(path=str(folder / f"{stem}-{edition}.png"))


def search_results(page, server, words, edition=""):
    """The pages a search lists, once it has listed them all (it says how many)."""
    page.goto(f"{server}{edition}/search.html?q={words}", wait_until="load")
    page.wait_for_function("() => (document.querySelector('#search-results p.search-summary')"
                           " || {}).innerText")
    return set(page.locator("#search-results ul.search li a").evaluate_all(
        "links => links.map(a => a.href.split('#')[0])"))


@pytest.mark.parametrize("edition", EDITIONS)
def test_search_finds_all_reduce_however_it_is_spelt(page, server, edition):
    found = {spelling: search_results(page, server, spelling, EDITIONS[edition])
             for spelling in ("all_reduce", "all-reduce", "allreduce")}
    assert found["all_reduce"] == found["all-reduce"] == found["allreduce"], found
    assert any("05_distributed_data_parallel" in link for link in found["all_reduce"])


def test_the_chinese_pages_give_the_theme_s_words_in_chinese(opened):
    chinese = yaml.safe_load((ROOT / "book/zh/_config.yml").read_text(encoding="utf-8"))
    theme_words = chinese["sphinx"]["config"]["theme_words"]
    page = opened("zh/notebooks/05_distributed_data_parallel.html")
    words = page.evaluate("""() => Array.from(document.querySelectorAll(
        '.bd-header-article *, .bd-header *, .bd-sidebar-primary *, .bd-search *'))
        .flatMap(e => ['aria-label', 'title', 'data-bs-title', 'placeholder']
                      .map(name => e.getAttribute(name)))
        .filter(Boolean)""")
    english = [word for word in words if word in theme_words or word.startswith("Launch on")]
    assert not english, f"the theme's words in English on a Chinese page: {sorted(set(english))}"
    assert theme_words["Search this book..."] in words
