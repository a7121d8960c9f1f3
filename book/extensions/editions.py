"""The book's two editions on one site: English at the root, Chinese under zh/ (Sphinx extension).

Both builds load it; the Chinese one sets `book_edition: zh`. The editions' pages have the same
names (book/tools/build.py): each page links to its other edition, and the Chinese launch
buttons open notebooks/zh/x.ipynb.
"""
from pathlib import Path

from sphinx.search import zh

# edition -> the other edition: its language code, its language's name in it, its folder on the site
OTHER = {"en": ("zh-CN", "中文", "zh/"), "zh": ("en", "English", "")}


def switch_link(pagename, edition):
    """The relative address of `pagename` in the other edition, from `pagename` in this one."""
    up = pagename.count("/") + (edition == "zh")   # the Chinese site is one folder down
    return "../" * up + OTHER[edition][2] + pagename + ".html"


def add_switch_to_header(app, config):
    config.templates_path = [*config.templates_path, str(Path(__file__).with_name("templates"))]
    header = ["edition-switch.html", "article-header-buttons.html"]   # the switch, then the theme's
    config.html_theme_options = {**(config.html_theme_options or {}), "article_header_end": header}


def retarget(buttons, pagename):
    """The launch buttons' links (sphinx-book-theme's group launch-buttons) to notebooks/zh/."""
    folder, _, name = pagename.rpartition("/")
    for group in buttons:
        if group.get("label") == "launch-buttons":
            for button in group.get("buttons", []):
                if "url" in button:
                    button["url"] = button["url"].replace(f"{folder}/{name}.ipynb", f"{folder}/zh/{name}.ipynb")


def link_other_edition(app, pagename, templatename, context, doctree):
    language, name, _ = OTHER[app.config.book_edition]
    context["edition_switch"] = {"href": switch_link(pagename, app.config.book_edition),
                                 "lang": language, "text": name}


def launch_chinese_notebooks(app, pagename, templatename, context, doctree):
    if app.config.book_edition == "zh" and pagename.startswith("notebooks/"):
        retarget(context.get("header_buttons", []), pagename)


class ChineseSearch(zh.SearchChinese):
    """Sphinx 7's Chinese search, with the Latin words it has met in a set, not a list it looks
    every word up in (half the Chinese render; Sphinx 8.1 does the same, sphinx-doc/sphinx#12995)."""

    def init(self, options):
        super().init(options)
        self.latin_terms = set()

    def split(self, input):
        chinese = list(zh.jieba.cut_for_search(input)) if zh.JIEBA else []
        latin = [term.strip() for term in self.latin1_letters.findall(input)]
        self.latin_terms.update(latin)
        return chinese + latin


def setup(app):
    app.add_config_value("book_edition", "en", "html")
    app.add_search_language(ChineseSearch)
    app.connect("config-inited", add_switch_to_header)
    # Before the theme drops the header templates that render empty (priority 500).
    app.connect("html-page-context", link_other_edition, priority=400)
    # After sphinx-book-theme's own handlers (priority 501), which make the launch buttons.
    app.connect("html-page-context", launch_chinese_notebooks, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
