"""The book's two editions on one site: English at the root, Chinese under zh/ (Sphinx extension).

Both builds load it; the Chinese one sets `book_edition: zh`. The editions' pages have the same
names (book/tools/build.py): each page links to its other edition, and the Chinese launch
buttons open notebooks/zh/x.ipynb.
"""
import re
from pathlib import Path

from sphinx import locale
from sphinx.search import en, zh

# edition -> the other edition: its language code, its language's name in it, its folder on the site
OTHER = {"en": ("zh-CN", "中文", "zh/"), "zh": ("en", "English", "")}


def switch_link(pagename, edition):
    """The relative address of `pagename` in the other edition, from `pagename` in this one."""
    up = pagename.count("/") + (edition == "zh")   # the Chinese site is one folder down
    return "../" * up + OTHER[edition][2] + pagename + ".html"


def add_switch_to_header(app, config):
    config.templates_path = [*config.templates_path, str(Path(__file__).with_name("templates"))]
    header = ["edition-switch.html", "article-header-buttons.html"]   # the switch, then the theme's
    options = {**(config.html_theme_options or {}), "article_header_end": header}
    if "Search this book..." in config.theme_words:   # jupyter-book sets it in English
        options["search_bar_text"] = config.theme_words["Search this book..."]
    config.html_theme_options = options


def retarget(buttons, pagename, launch_on=None):
    """The launch buttons' links (sphinx-book-theme's group launch-buttons) to notebooks/zh/,
    and their tooltips from `launch_on` ("在 {} 中打开"): the theme puts a translated "Launch
    on" before the service's name, an order Chinese does not have."""
    folder, _, name = pagename.rpartition("/")
    launch = [group for group in buttons if group.get("label") == "launch-buttons"]
    for button in [button for group in launch for button in group.get("buttons", []) if "url" in button]:
        button["url"] = button["url"].replace(f"{folder}/{name}.ipynb", f"{folder}/zh/{name}.ipynb")
        if launch_on and button.get("text"):
            button["tooltip"] = launch_on.format(button["text"])


def link_other_edition(app, pagename, templatename, context, doctree):
    language, name, _ = OTHER[app.config.book_edition]
    context["edition_switch"] = {"href": switch_link(pagename, app.config.book_edition),
                                 "lang": language, "text": name}


def launch_chinese_notebooks(app, pagename, templatename, context, doctree):
    if app.config.book_edition == "zh" and pagename.startswith("notebooks/"):
        retarget(context.get("header_buttons", []), pagename, app.config.theme_words.get("Launch on {}"))


# Search finds a name however it is spelt: `all_reduce`, all-reduce, "all reduce" and
# allreduce (NCCL's and Horovod's spelling) are the same words to it. The index and the search
# box both split words at an underscore too, and allreduce in two.
WORDS = re.compile(r"(?i:all(?=reduce))|[^\W_]+")
SPLIT_QUERY = r"""var splitQuery = (query) => query.replace(/(all)(?=reduce)/giu, "$1 ")
    .split(/[^\p{Letter}\p{Number}\p{Emoji_Presentation}]+/gu).filter(term => term);"""


class EnglishSearch(en.SearchEnglish):
    _word_re = WORDS
    js_splitter_code = SPLIT_QUERY


class LatinTerms(set):
    """The Latin words Sphinx 7's Chinese search has met: a set it extends as it did its list, and
    looks every word up in quickly (half the Chinese render; Sphinx 8.1 does the same,
    sphinx-doc/sphinx#12995)."""
    extend = set.update


class ChineseSearch(zh.SearchChinese):
    latin1_letters = re.compile(r"(?i:all(?=reduce))|[a-zA-Z0-9]+")   # all_reduce, allreduce: all, reduce
    js_splitter_code = SPLIT_QUERY

    def init(self, options):
        super().init(options)
        self.latin_terms = LatinTerms()


def calculator_scripts(app, pagename, templatename, context, doctree):
    """Chapter 11's memory calculator, on the page that holds its <div>: the rules in JavaScript,
    which the build makes (book/tools/build.py, ddp_scripts/fit/page.py), then the form."""
    if 'id="fit-calculator"' in context.get("body", ""):
        app.add_js_file("fit-rules.js")
        app.add_js_file("fit-calculator.js")


def theme_words_in_chinese(app):
    """The edition's theme words (its _config.yml's `theme_words`), put into the catalogues the
    themes and the templates' _() ask, in place: the templates hold the "sphinx" catalogue
    already, and both are .mo files of the pinned packages (a catalogue without one fails
    here, not silently)."""
    if app.config.theme_words:
        for catalog in ("sphinx", "booktheme"):
            locale.init([], app.config.language, catalog)[0]._catalog.update(app.config.theme_words)


# What the theme's templates (sphinx-book-theme 1.3's sidebar toggles, its sidebar's aria-label)
# and matplotlib's animation player (its buttons, its Once / Loop / Reflect) write in English
# without asking a catalogue: a tooltip, a name a screen reader says, a label.
SAID = re.compile(r'\b(title|aria-label)="([^"<>]+)"')
PLAYER_LABEL = re.compile(r'(<label for="_anim_radio\d_[^"]*">)([^<]+)(</label>)')


def translate_page(page, words):
    """The page's HTML with those words in the edition's language (`words`: theme_words)."""
    page = SAID.sub(lambda m: f'{m[1]}="{words.get(m[2], m[2])}"', page)
    return PLAYER_LABEL.sub(lambda m: m[1] + words.get(m[2].strip(), m[2]) + m[3], page)


def theme_words_in_written_pages(app):
    """Each page as the templates render it, with translate_page's words in Chinese."""
    if app.config.theme_words and hasattr(app.builder, "templates"):
        render = app.builder.templates.render
        app.builder.templates.render = lambda template, context: translate_page(
            render(template, context), app.config.theme_words)


def translate_scripts(static, words):
    """The scripts in `static` (the site's _static/) with translate_page's words in the
    edition's language: sphinx-togglebutton's writes its button's aria-label in English into
    the page as it runs. Only the scripts that change are written."""
    for path in sorted(Path(static).rglob("*.js")):
        script = path.read_text(encoding="utf-8")
        if (translated := SAID.sub(lambda m: f'{m[1]}="{words.get(m[2], m[2])}"', script)) != script:
            path.write_text(translated, encoding="utf-8")


def theme_words_in_written_scripts(app, exception):
    if exception is None and app.config.theme_words and app.builder.format == "html":
        translate_scripts(Path(app.outdir) / "_static", app.config.theme_words)


def setup(app):
    app.add_config_value("book_edition", "en", "html")
    app.add_config_value("theme_words", {}, "html")
    app.add_search_language(EnglishSearch)
    app.add_search_language(ChineseSearch)
    app.add_js_file("figures.js")   # every figure a link to its full-size image (book/theme/)
    app.connect("builder-inited", theme_words_in_chinese)
    app.connect("builder-inited", theme_words_in_written_pages)
    app.connect("build-finished", theme_words_in_written_scripts)
    app.connect("config-inited", add_switch_to_header)
    # Before the theme drops the header templates that render empty (priority 500).
    app.connect("html-page-context", link_other_edition, priority=400)
    # After sphinx-book-theme's own handlers (priority 501), which make the launch buttons.
    app.connect("html-page-context", launch_chinese_notebooks, priority=600)
    app.connect("html-page-context", calculator_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
