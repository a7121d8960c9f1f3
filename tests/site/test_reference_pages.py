"""The built reference pages show the committed runs' numbers, and print a chapter a page."""
import html

import pytest

from book.extensions import recorded
from book_files import ROOT


@pytest.mark.parametrize("edition", ["", "zh/"])
def test_the_grading_page_shows_the_graded_run(site, edition):
    page = html.unescape((site / edition / "book" / "grading.html").read_text(encoding="utf-8"))
    for name in ("grading.ddp.samples", "grading.cpu.samples", "grading.ddp-over-cpu",
                 "h200.gpu-over-cpu", "exits.after.hung"):
        assert recorded.FACTS[name](ROOT) in page, name
    assert "recorded-output" in page and "recorded-table" in page
    assert "recorded:" not in page   # no fact failed to render


@pytest.mark.parametrize("edition", ["", "zh/"])
def test_the_summaries_print_a_chapter_a_page(site, edition):
    page = (site / edition / "book" / "summaries.html").read_text(encoding="utf-8")
    assert page.count('class="summary-page') == 11
    assert "summaries-print.css" in page
