"""The figures on the built pages: numbered, captioned and described in both editions, and the
animation plays offline (notebooks/figures.py draws them; the cells' metadata captions them)."""
import re

import pytest

from book_files import HTML, chapters, load_notebook

from book.tools import sources

CHAPTERS = chapters()
EDITIONS = {"en": "", "zh": "zh/"}


def figures_on(html):
    """(figure id, caption text, alt texts of its images) for each numbered figure of a page."""
    found = []
    for figure in re.findall(r"<figure\b.*?</figure>", html, re.S):
        ident = re.search(r'\bid="([^"]+)"', figure)
        caption = re.search(r"<figcaption>(.*?)</figcaption>", figure, re.S)
        text = re.sub(r"<[^>]+>", "", caption.group(1)) if caption else ""
        found.append((ident.group(1) if ident else None, " ".join(text.split()),
                      re.findall(r'<img[^>]*\balt="([^"]*)"', figure)))
    return found


@pytest.mark.parametrize("edition", sorted(EDITIONS))
@pytest.mark.parametrize("path_number", CHAPTERS, ids=[p.stem for p, _ in CHAPTERS])
def test_every_chapter_shows_its_numbered_captioned_described_figures(site, path_number, edition):
    path, number = path_number
    page = HTML / EDITIONS[edition] / "notebooks" / f"{path.stem}.html"
    shown = figures_on(page.read_text(encoding="utf-8"))
    named = [cell["metadata"]["mystnb"]["figure"]["name"] for cell in load_notebook(path)["cells"]
             if "figure" in sources.figure_options(cell)]
    assert len(shown) >= sources.FIGURES_PER_CHAPTER, f"{page.name} ({edition}): {len(shown)} figures"
    assert sorted(i for i, _, _ in shown) == sorted(named), (page.name, edition)
    prefix = {"en": r"Fig\. \d+", "zh": r"图 ?\d+"}[edition]
    for ident, caption, alts in shown:
        assert re.match(prefix, caption), (page.name, edition, ident, caption[:60])
        if edition == "zh":
            assert re.search(r"[\u4e00-\u9fff]", caption[5:]), (page.name, ident, caption[:60])
        assert all(len(alt.split()) >= 3 or re.search(r"[\u4e00-\u9fff]{6}", alt) for alt in alts), (
            page.name, edition, ident, alts)


def animation_pages():
    return [path for path in sorted((HTML / "notebooks").glob("*.html"))
            if "anim-controls" in path.read_text(encoding="utf-8")]


@pytest.mark.xdist_group("browser")
def test_the_animation_plays_offline(site, page, server, screenshots):
    pages = animation_pages()
    assert pages, "no animation on any chapter page"
    page.goto(f"{server}/notebooks/{pages[0].name}", wait_until="load")
    frame = page.locator("div.animation img").first
    frame.scroll_into_view_if_needed()
    first = frame.get_attribute("src")
    assert first.startswith("data:image/png;base64,")
    page.locator("div.animation button[title='Next frame']").first.click()
    page.wait_for_function("first => document.querySelector('div.animation img').src !== first",
                           arg=first)
    page.locator("div.animation button[title='Play']").first.click()
    page.locator("div.animation").first.screenshot(path=str(screenshots / "animation.png"))
    assert not page.blocked, f"the page asked outside the site: {page.blocked[:3]}"
    assert not page.errors, page.errors
