"""The built site in a real browser (headless Chromium): what a reader sees and clicks.

Screenshots are kept in _build/screenshots/ for review.
"""
import re

import pytest

from book_files import HTML, chapters, toc_entries

CHAPTERS = chapters()
CHAPTER_IDS = [path.stem for path, _ in CHAPTERS]
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


def test_front_page(page, server, screenshots):
    open_page(page, server + "/")          # index.html redirects to the introduction
    page.wait_for_url(re.compile(r".*/book/intro\.html$"))
    title = page.locator("article h1").first
    assert title.inner_text().startswith("Training and testing PyTorch models on GPUs")
    check_navigation(page)
    chapter_links = page.locator("article a.reference.internal[href*='notebooks/']")
    assert chapter_links.count() >= len(CHAPTERS)
    page.screenshot(path=str(screenshots / "00_front_page.png"))
    assert not page.errors, page.errors


@pytest.mark.parametrize("path_number", CHAPTERS, ids=CHAPTER_IDS)
def test_chapter_renders_with_navigation_code_figures_and_solutions(page, server, screenshots,
                                                                    path_number):
    path, number = path_number
    if not (HTML / "notebooks" / f"{path.stem}.html").exists():
        pytest.fail(f"no page for {path.name} in the built site", pytrace=False)
    open_page(page, f"{server}/notebooks/{path.stem}.html")
    heading = page.locator("article h1").first.inner_text()
    assert heading.startswith(f"{number}. "), heading
    check_navigation(page)
    page.locator("nav.bd-docs-nav li.current a.current").first.wait_for(state="visible")

    # Code, with a copy button on each block.
    assert page.locator("article div.cell_input").count() > 0, "no code cells"
    assert page.locator("article div.cell_output").count() > 0, "no outputs: was it executed?"
    assert page.locator("article button.copybtn").count() > 0, "no copy buttons"
    # Figures, where the chapter has them: every image actually loaded.
    assert page.evaluate(BROKEN_IMAGES) == []
    page.screenshot(path=str(screenshots / f"{path.stem}.png"))
    figures = page.locator("article div.cell_output img")
    if figures.count():
        figures.first.scroll_into_view_if_needed()
        figures.first.wait_for(state="visible")
        figures.first.screenshot(path=str(screenshots / f"{path.stem}-figure.png"))

    # Launch and download buttons, as a reader opens them.
    page.locator(".dropdown-launch-buttons button.dropdown-toggle").click()
    page.locator(".dropdown-launch-buttons a:has-text('Colab')").wait_for(state="visible")
    page.locator(".dropdown-launch-buttons a:has-text('JupyterHub')").wait_for(state="visible")
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


def test_execution_times_page_shows_a_row_per_chapter(page, server, screenshots):
    open_page(page, f"{server}/book/execution-times.html")
    rows = page.locator("article table tbody tr")
    assert rows.count() == len(CHAPTERS)
    assert "CPU cores" in page.locator("article").inner_text()
    page.screenshot(path=str(screenshots / "execution-times.png"))
    assert not page.errors, page.errors


@pytest.mark.parametrize("name", ["how-to-run", "instructor-guide", "cheat-sheet", "glossary"])
def test_front_matter_page_renders(page, server, screenshots, name):
    open_page(page, f"{server}/book/{name}.html")
    check_navigation(page)
    assert page.locator("article h1").first.is_visible()
    if name in ("how-to-run", "cheat-sheet"):
        assert page.locator("article button.copybtn").count() > 0
    page.screenshot(path=str(screenshots / f"book-{name}.png"))
    assert not page.errors, page.errors
