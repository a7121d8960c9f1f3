"""Chapter 5's ring animation on a phone, the scroll cue only where a figure scrolls, and the
Chinese pages without a word of the theme in English.

On a phone (390 px) the animation is drawn as wide as the figures, in the same box that scrolls
sideways, so that its text is as large as theirs; its controls stay on one line under it; its
frame opens at full size (book/theme/figures.js, book.css). The Chinese pages are read as
built: every page of zh/, for the words the themes' templates and matplotlib's player write in
English (book/extensions/editions.py gives them in Chinese).
"""
import re
from pathlib import Path

import matplotlib
import pytest
import yaml

from book_files import HTML, ROOT, built_run

pytestmark = pytest.mark.xdist_group("browser")

PHONE = 390                 # CSS px: a phone held upright
SMALLEST_TEXT = 11          # CSS px: the smallest text a reader reads without zooming
EDITIONS = {"en": "", "zh": "zh/"}
RING_PAGE = "notebooks/05_distributed_data_parallel.html"


@pytest.fixture(scope="module")
def ring_drawing():
    """The ring animation's figure, drawn frame by frame from the run the page shows (the
    build's copy of ch05-anatomy): its width in inches and its smallest text in points."""
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    from notebooks import ddp_figures
    drawn = {}

    def keep(fig, draw_frame, frames, interval_ms=None):
        drawn.update(fig=fig, draw_frame=draw_frame, frames=frames)
        return None
    ranks = ddp_figures.load_anatomy(built_run("ch05-anatomy"))
    original, ddp_figures.animate = ddp_figures.animate, keep
    try:
        ddp_figures.ring_animation(ranks)
    finally:
        ddp_figures.animate = original
    fig, sizes = drawn["fig"], []
    for frame in range(drawn["frames"]):
        drawn["draw_frame"](frame)
        fig.canvas.draw()
        sizes += [text.get_fontsize() for text in fig.findobj(Text)
                  if text.get_visible() and text.get_text().strip()]
    plt.close(fig)
    return {"inches": fig.get_figwidth(), "points": min(sizes)}


RING = """(animation) => {
    const img = animation.querySelector('img');
    const buttons = Array.from(animation.querySelectorAll('.anim-buttons button'));
    const modes = Array.from(animation.querySelectorAll('form.anim-state label, form.anim-state input'));
    // On one row: every box overlaps every other vertically.
    const oneRow = boxes => Math.max(...boxes.map(e => e.getBoundingClientRect().top))
        < Math.min(...boxes.map(e => e.getBoundingClientRect().bottom));
    const shown = e => e.getBoundingClientRect().width > 0
        && e.getBoundingClientRect().left >= 0 && e.getBoundingClientRect().right <= innerWidth;
    const link = img.closest('a.figure-full-size');
    return {width: img.getBoundingClientRect().width, natural: img.naturalWidth,
            link: link ? link.href : null, title: link ? link.title : null,
            buttons: buttons.length, buttonsOneRow: oneRow(buttons),
            buttonsShown: buttons.every(shown),
            modes: modes.length, modesOneRow: oneRow(modes),
            modesShown: modes.every(shown)};
}"""
# The link's image: the bytes it leads to, against those of the frame shown.
SAME_IMAGE = """async (animation) => {
    const img = animation.querySelector('img');
    const link = img.closest('a.figure-full-size');
    const bytes = async address => new Uint8Array(await (await fetch(address)).arrayBuffer());
    const [led, frame] = [await bytes(link.href), await bytes(img.src)];
    return led.length === frame.length && led.every((b, i) => b === frame[i]);
}"""


def ring(opened, edition):
    page = opened(EDITIONS[edition] + RING_PAGE, PHONE)
    animation = page.locator("article div.animation").first
    animation.scroll_into_view_if_needed()
    page.wait_for_function("a => { const img = a.querySelector('img');"
                           " return img.complete && img.naturalWidth > 0; }",
                           arg=animation.element_handle())
    return page, animation


@pytest.mark.parametrize("edition", EDITIONS)
def test_the_ring_animation_reads_on_a_phone(opened, screenshots, ring_drawing, edition):
    page, animation = ring(opened, edition)
    seen = animation.evaluate(RING)
    # The figure's smallest text, in CSS px, at the width the page draws it.
    text = ring_drawing["points"] / 72 * seen["width"] / ring_drawing["inches"]
    assert text >= SMALLEST_TEXT, (
        f"the animation's smallest text is {text:.1f} CSS px at {PHONE} px "
        f"(drawn {seen['width']:.0f} px wide, {ring_drawing['points']} pt in {ring_drawing['inches']} in)")
    assert seen["buttons"] >= 9 and seen["buttonsOneRow"] and seen["buttonsShown"], seen
    assert seen["modes"] >= 6 and seen["modesOneRow"] and seen["modesShown"], seen
    assert seen["link"], "the animation's frame opens at full size from no link"
    folder = screenshots / "phone"
    folder.mkdir(exist_ok=True)
    animation.screenshot(path=str(folder / f"ring-animation-{edition}.png"))
    assert not page.errors, page.errors


def test_the_ring_animation_s_link_opens_the_frame_shown(opened):
    page, animation = ring(opened, "en")
    assert animation.evaluate(SAME_IMAGE), "the link leads to another image than the frame"
    first = animation.evaluate("a => a.querySelector('img').src")
    animation.locator("button[title='Next frame']").click()
    page.wait_for_function("([a, first]) => a.querySelector('img').src !== first",
                           arg=[animation.element_handle(), first])
    assert animation.evaluate(SAME_IMAGE), "after a step, the link still leads to the first frame"
    animation.locator("button[title='First frame']").click()


@pytest.mark.parametrize("page_name", ["notebooks/07_experiment.html", RING_PAGE])
def test_no_scroll_cue_where_nothing_scrolls(opened, page_name):
    """On a wide screen the figures fit: no shadow, no "swipe" line."""
    page = opened(page_name, 1280)
    boxes = page.locator("article.bd-article div.figure-box")
    assert boxes.count() > 0, "no figure in a box of its own"
    cues = page.evaluate("""() => Array.from(document.querySelectorAll('article.bd-article div.figure-box'))
        .filter(box => ['::before', '::after'].some(edge => getComputedStyle(box, edge).opacity !== '0')
                       || (box.nextElementSibling && box.nextElementSibling.offsetParent !== null))
        .map(box => box.querySelector('img').src.slice(-60))""")
    assert cues == [], f"scroll cues on figures that fit: {cues}"


def english_words():
    """What the themes' templates and matplotlib's animation player write in English: the
    titles, aria-labels and placeholders they write as plain text, the player's labels, and
    the words the Chinese edition gives in Chinese (book/zh/_config.yml's theme_words)."""
    import matplotlib._animation_data as player
    import pydata_sphinx_theme
    import sphinx
    import sphinx_book_theme
    templates = [Path(module.__file__).parent / "theme" for module in
                 (sphinx_book_theme, pydata_sphinx_theme)] + [Path(sphinx.__file__).parent / "themes"]
    said = re.compile(r'\b(?:title|aria-label|placeholder)="([A-Za-z][^"{}]*)"')
    words = {word for folder in templates for path in folder.rglob("*.html")
             for word in said.findall(path.read_text(encoding="utf-8"))}
    words |= set(said.findall(player.DISPLAY_TEMPLATE))
    words |= set(re.findall(r"<label [^>]*>([^<]+)</label>", player.DISPLAY_TEMPLATE))
    chinese = yaml.safe_load((ROOT / "book/zh/_config.yml").read_text(encoding="utf-8"))
    words |= {word for word in chinese["sphinx"]["config"]["theme_words"] if "{}" not in word}
    return words


def test_the_english_words_looked_for_include_the_theme_s_and_the_player_s():
    words = english_words()
    assert {"Toggle primary sidebar", "Toggle secondary sidebar", "Main", "Previous frame",
            "Repetition mode", "Once", "Loop", "Reflect"} <= words


def english_on(page, words):
    """The words of `words` a page says in English: in a title, an aria-label, a tooltip, a
    placeholder, a label, or as a launch button's "Launch on"."""
    found = [value for value in re.findall(
        r'\b(?:title|aria-label|data-bs-title|placeholder)="([^"]*)"', page) if value in words]
    found += [label.strip() for label in re.findall(r"<label\b[^>]*>([^<]+)</label>", page)
              if label.strip() in words]
    return found + re.findall(r"Launch on \w+", page)


def test_planted_english_on_a_chinese_page_is_found():
    page = ('<button title="Toggle primary sidebar"></button><nav aria-label="Main"></nav>'
            '<label for="_anim_radio2_x">Loop</label><a title="Launch on Colab"></a>')
    assert english_on(page, english_words()) == [
        "Toggle primary sidebar", "Main", "Loop", "Launch on Colab"]


def test_right_case_a_chinese_page_s_own_words_are_not_english():
    page = ('<button title="显示或隐藏本书目录"></button><a title="在 Colab 中打开"></a>'
            '<label for="_anim_radio2_x">循环</label><p>Loop 是 torch 的词</p>')
    assert english_on(page, english_words()) == []


# Any tooltip, name a screen reader says, image text or placeholder (an attribute, in a page or
# in a script that writes one into the page) that has no Chinese character: English, unless
# each of its words is a name, the same in every language.
SAID = re.compile(r'(?<=\s)(?:title|aria-label|alt|placeholder|data-bs-title)="([^"]*)"')
CHINESE = re.compile(r"[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]")
# A name in code: a module, a call, a path, a device (all_reduce, torch.cuda, cuda:0, x.png),
# a class or a product in CamelCase (DataParallel, PyTorch, GitHub), an acronym (GPU, NCCL).
CODE = re.compile(r".*[_./:()=\[\]<>#\d].*|.*[a-z][A-Z].*|[A-Z]{2,}s?")
# The launch buttons' services, and the languages and the other edition, by their own names.
NAMES = {"Colab", "Binder", "Deepnote", "Jupyter", "Python", "English"}


def latin_only(text):
    """The values of SAID in `text` written in Latin words only, a word that is not a name among
    them: English on a Chinese page."""
    def named(word):
        word = word.strip(",;!?…\"'")
        return word in NAMES or bool(CODE.fullmatch(word)) or not re.search(r"[A-Za-z]", word)
    return [value for value in SAID.findall(text)
            if not CHINESE.search(value) and not all(named(word) for word in value.split())]


def test_planted_latin_words_on_a_chinese_page_are_found():
    page = ('<a class="headerlink" href="#term-rank" title="Link to this term">¶</a>'
            '<summary aria-label="Toggle hidden content">'
            '<img alt="Colab logo" src="logo_colab.png"><input placeholder="Search">'
            '`<button type="button" aria-label="Toggle hidden content">`')
    assert latin_only(page) == ["Link to this term", "Toggle hidden content", "Colab logo", "Search",
                                "Toggle hidden content"]


def test_right_case_names_and_chinese_on_a_chinese_page_are_not_english():
    page = ('<a title="在 Colab 中打开"><img alt="Colab 标志"></a><a title="Colab"></a>'
            '<code title="torch.distributed.all_reduce">x</code><a aria-label="GitHub"></a>'
            '<img alt="../_images/ab12.png"><span title="cuda:0 · NCCL"></span>'
            '<a href="#" aria-label="English"></a><p>Link to this term</p>'
            'img.alt="Image"')
    assert latin_only(page) == []


def test_no_chinese_page_says_the_theme_s_words_in_english(site):
    words = english_words()
    pages = sorted((HTML / "zh").rglob("*.html"))
    assert len(pages) >= 17, "the Chinese edition is missing from the built site"
    left = {str(path.relative_to(HTML)): sorted(set(found)) for path in pages
            if (found := english_on(path.read_text(encoding="utf-8"), words))}
    assert not left, f"English on {len(left)} Chinese pages: {dict(list(left.items())[:5])}"


def test_no_chinese_page_or_script_says_anything_in_latin_words_only(site):
    """Every page of zh/, and every script it runs (sphinx-togglebutton's writes its buttons'
    aria-label into the page): no tooltip or label in English, whatever package wrote it."""
    files = sorted((HTML / "zh").rglob("*.html")) + sorted((HTML / "zh" / "_static").rglob("*.js"))
    assert len(files) >= 17, "the Chinese edition is missing from the built site"
    left = {}
    for path in files:
        for value in latin_only(path.read_text(encoding="utf-8", errors="replace")):
            left.setdefault(value, []).append(str(path.relative_to(HTML)))
    assert not left, "English on the Chinese pages: " + "; ".join(
        f"{value!r} ({len(where)} times, {where[0]})" for value, where in left.items())


def test_the_chinese_launch_buttons_say_where_in_chinese_word_order(site):
    page = (HTML / "zh" / RING_PAGE).read_text(encoding="utf-8")
    assert 'title="在 Colab 中打开"' in page


# Each word (letters, digits, _) in a table's cells that the page draws on two lines or more:
# broken inside, where a reader sees "DataParall" / "el".
BROKEN_WORDS = r"""(table) => {
    const broken = [];
    const walker = document.createTreeWalker(table, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        for (const word of node.textContent.matchAll(/\w+/g)) {
            const range = document.createRange();
            range.setStart(node, word.index);
            range.setEnd(node, word.index + word[0].length);
            const lines = new Set(Array.from(range.getClientRects())
                .filter(box => box.width > 0).map(box => Math.round(box.top)));
            if (lines.size > 1) broken.push(word[0]);
        }
    }
    return broken;
}"""


@pytest.mark.parametrize("edition", EDITIONS)
def test_the_front_page_s_tables_break_no_word_on_a_phone(opened, edition):
    """The table of recorded GPU boxes names each chapter by its title: on a phone the table
    scrolls sideways in its box, and each word of a title stays whole."""
    page = opened(EDITIONS[edition] + "book/intro.html", PHONE)
    tables = page.locator("article.bd-article table")
    assert page.locator("article.bd-article table a[href*='notebooks/']").count() >= 11, (
        "no table of the chapters on the front page")
    broken = [word for words in tables.evaluate_all(f"tables => tables.map({BROKEN_WORDS})")
              for word in words]
    assert broken == [], f"words broken inside at {PHONE} px: {broken}"


# The colour behind an element: that of the nearest box around it with a background of its own.
BEHIND = r"""(e) => {
    for (let up = e.parentElement; up; up = up.parentElement) {
        const rgba = getComputedStyle(up).backgroundColor.match(/[\d.]+/g).map(Number);
        if (rgba.length < 4 || rgba[3] > 0) return rgba.slice(0, 3).join(',');
    }
    return 'none';
}"""


def test_gpu_recordings_sit_on_the_page_s_background_in_dark_mode(page, server, screenshots):
    """A recorded GPU's label has its own tint for each mode; around it, no light panel."""
    page.goto(f"{server}/notebooks/02_tensors_and_models.html", wait_until="load")
    page.evaluate("() => { document.documentElement.dataset.theme = 'dark'; }")
    boxes = page.locator("article div.gpu-recording")
    assert boxes.count() >= 10
    assert page.locator("article div.gpu-recording-stale").count() >= 1, "no stale recording to look at"
    text = page.locator("article p").first.evaluate(BEHIND)
    behind = set(boxes.evaluate_all(f"boxes => boxes.map({BEHIND})"))
    assert behind == {text}, f"behind the labels: {behind}; behind the text: {text}"
    stale = page.locator("article div.gpu-recording-stale").first
    stale.scroll_into_view_if_needed()
    stale.locator("xpath=../..").screenshot(path=str(screenshots / "gpu-recording-dark.png"))
