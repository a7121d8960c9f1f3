"""The book's two editions on one site: English at the site's root, Chinese under zh/.

A Sphinx extension, loaded by both builds (_config.yml, sphinx.local_extensions); the
Chinese build sets `book_edition: zh` (book/zh/_config.yml). Both editions have the same
pages under the same names (the Chinese chapter notebooks/zh/05_x.ipynb is staged as
notebooks/05_x in its build copy, book/tools/build.py), so:

- every page's header gets a link to the same page in the other edition (the template
  edition-switch.html, placed before the theme's own header buttons);
- on the Chinese edition the launch buttons (Colab, JupyterHub) open the Chinese notebook,
  notebooks/zh/05_x.ipynb in the repository, not the English one its page name suggests.
"""
from pathlib import Path

from sphinx.search import zh

TEMPLATES = Path(__file__).resolve().parent / "templates"
# edition -> (its language code, the name of the language in it, its folder on the site)
EDITIONS = {"en": ("en", "English", ""), "zh": ("zh-CN", "中文", "zh/")}


def other_edition(edition):
    return "zh" if edition == "en" else "en"


def switch_link(pagename, edition):
    """The relative address of `pagename` in the other edition, from `pagename` in this one."""
    depth = pagename.count("/") + (1 if EDITIONS[edition][2] else 0)
    return "../" * depth + EDITIONS[other_edition(edition)][2] + pagename + ".html"


def add_switch_to_header(app, config):
    if config.book_edition not in EDITIONS:
        raise ValueError(f"book_edition must be one of {sorted(EDITIONS)}, "
                         f"not {config.book_edition!r}")
    config.templates_path = [*config.templates_path, str(TEMPLATES)]
    options = dict(config.html_theme_options or {})
    options["article_header_end"] = ["edition-switch.html", "article-header-buttons.html"]
    config.html_theme_options = options


def chinese_notebook(url, pagename):
    """A launch URL for notebooks/x.ipynb, pointed at notebooks/zh/x.ipynb."""
    folder, _, name = pagename.rpartition("/")
    english = f"{folder}/{name}.ipynb" if folder else f"{name}.ipynb"
    chinese = f"{folder}/zh/{name}.ipynb" if folder else f"zh/{name}.ipynb"
    return url.replace(english, chinese)


def retarget(buttons, pagename):
    """The launch buttons' links (sphinx-book-theme's group labelled launch-buttons)."""
    for group in buttons:
        if group.get("label") == "launch-buttons":
            for button in group.get("buttons", []):
                if "url" in button:
                    button["url"] = chinese_notebook(button["url"], pagename)


def link_other_edition(app, pagename, templatename, context, doctree):
    edition = app.config.book_edition
    language, name, _ = EDITIONS[other_edition(edition)]
    context["edition_switch"] = {"href": switch_link(pagename, edition), "lang": language,
                                 "text": name}


def launch_chinese_notebooks(app, pagename, templatename, context, doctree):
    if app.config.book_edition == "zh" and pagename.startswith("notebooks/"):
        retarget(context.get("header_buttons", []), pagename)


class ChineseSearch(zh.SearchChinese):
    """Sphinx's Chinese search index, with the Latin words it has met kept in a set.

    Sphinx 7 keeps them in a list, which grows with every page, and looks every word up in
    it: indexing the Chinese edition took about half of its render. Sphinx 8.1 made it a set
    (sphinx-doc/sphinx#12995); jupyter-book 1.x stays on Sphinx 7. The same words are
    indexed, each stemmed the same way.
    """

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
    app.add_search_language(ChineseSearch)   # the Chinese edition's search index, quicker
    app.connect("config-inited", add_switch_to_header)
    # Before the theme drops the header templates that render empty (priority 500).
    app.connect("html-page-context", link_other_edition, priority=400)
    # After sphinx-book-theme's own handlers (priority 501), which make the launch buttons.
    app.connect("html-page-context", launch_chinese_notebooks, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
