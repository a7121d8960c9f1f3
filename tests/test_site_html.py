"""The built site, read as files: pages, links, images, launch and download buttons."""
import re
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from book_files import (HTML, ROOT, TIMINGS, Page, cell_source, chapters, load_notebook,
                        page_for, site_config, toc_entries)

CHAPTERS = chapters()
CHAPTER_IDS = [path.stem for path, _ in CHAPTERS]


@pytest.fixture(scope="module")
def pages(site):
    """Every HTML page of the site (not the theme's static files), parsed once."""
    return {path: Page(path) for path in sorted(site.rglob("*.html"))
            if not {"_static", "_sources", "_images"} & set(path.relative_to(site).parts)}


@pytest.fixture(params=CHAPTERS, ids=CHAPTER_IDS)
def chapter_page(request, site):
    path, number = request.param
    html = page_for(f"notebooks/{path.stem}")
    if not html.exists():
        pytest.fail(f"no page for {path.relative_to(ROOT)}: {html.relative_to(ROOT)} missing",
                    pytrace=False)
    return path, number, Page(html)


def test_every_toc_entry_has_a_page(site):
    missing = [entry for entry, _ in toc_entries() if not page_for(entry).exists()]
    assert not missing, f"in _toc.yml but not in the site: {missing}"
    assert (site / "index.html").exists()


def internal(url):
    parts = urlsplit(url)
    return not (parts.scheme or parts.netloc or url.startswith(("mailto:", "javascript:")))


def test_no_broken_internal_links_or_missing_images(pages):
    broken, anchors = [], {}
    for path, page in pages.items():
        for url in page.links + page.images:
            if not internal(url) or url in ("", "#"):
                continue
            parts = urlsplit(url)
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{path.relative_to(HTML)}: {url}")
            elif parts.fragment and target.suffix == ".html":
                if target not in anchors:
                    anchors[target] = pages.get(target) or Page(target)
                if parts.fragment not in anchors[target].ids:
                    broken.append(f"{path.relative_to(HTML)}: {url} (no such anchor)")
    assert not broken, "broken links:\n" + "\n".join(broken[:40])


def test_chapter_heading_is_numbered_once(chapter_page):
    path, number, page = chapter_page
    text = page.path.read_text(encoding="utf-8")
    article = text[text.index('<article class="bd-article"'):]
    heading = re.search(r"<h1>(.*?)<a class=\"headerlink\"", article, re.S)
    assert heading, f"{page.path.name}: no title"
    plain = re.sub(r"<[^>]+>", "", heading.group(1)).strip()
    assert re.match(rf"{number}\. [^\d]", plain), f"{page.path.name}: title reads {plain!r}"


def launch_links(page, host):
    return [href for href in page.links if urlsplit(href).netloc == host]


def test_colab_button_opens_this_notebook_from_the_repository(chapter_page):
    path, _, page = chapter_page
    config = site_config()
    repo = urlsplit(config["repository"]["url"]).path.strip("/")
    colab = urlsplit(config["launch_buttons"]["colab_url"]).netloc
    links = launch_links(page, colab)
    assert len(links) == 1, f"{page.path.name}: {len(links)} Colab buttons"
    match = re.fullmatch(rf"/github/{re.escape(repo)}/blob/([^/]+)/(.+)", urlsplit(links[0]).path)
    assert match, f"{page.path.name}: Colab link {links[0]} does not name {repo}"
    branch, notebook = match.groups()
    assert branch == config["repository"]["branch"]
    assert notebook == f"notebooks/{path.name}" and (ROOT / notebook).exists()


def test_every_colab_link_names_a_notebook_that_exists(pages):
    colab = urlsplit(site_config()["launch_buttons"]["colab_url"]).netloc
    bad = [href for page in pages.values() for href in launch_links(page, colab)
           if not (ROOT / urlsplit(href).path.split("/blob/", 1)[-1].split("/", 1)[-1]).exists()]
    assert not bad, bad


def test_jupyterhub_button_pulls_the_repository_and_opens_this_notebook(chapter_page):
    path, _, page = chapter_page
    config = site_config()
    hub = config["launch_buttons"]["jupyterhub_url"].rstrip("/")
    links = [href for href in page.links if href.startswith(hub + "/hub/user-redirect/git-pull?")]
    assert len(links) == 1, f"{page.path.name}: no JupyterHub button for {hub}"
    query = parse_qs(urlsplit(links[0]).query)
    repo_url = config["repository"]["url"]
    prefix = {"jupyterlab": "lab/tree", "classic": "tree"}[
        config["launch_buttons"].get("notebook_interface", "classic")]
    assert query["repo"] == [repo_url]
    assert query["branch"] == [config["repository"]["branch"]]
    assert query["urlpath"] == [f"{prefix}/{repo_url.rstrip('/').rsplit('/', 1)[-1]}"
                                f"/notebooks/{path.name}"]


def test_download_button_offers_the_executed_notebook(chapter_page):
    path, number, page = chapter_page
    downloads = [attrs["href"] for tag, attrs in page.elements if tag == "a"
                 and "btn-download-source-button" in (attrs.get("class") or "")
                 and attrs.get("href", "").endswith(f"_sources/notebooks/{path.name}")]
    assert downloads, f"{page.path.name}: no .ipynb download button"
    copy = (page.path.parent / downloads[0]).resolve()
    notebook = load_notebook(copy)
    assert any(cell.get("outputs") for cell in notebook["cells"] if cell["cell_type"] == "code"), (
        f"{copy.name}: the downloadable notebook should carry the outputs readers see")
    assert cell_source(notebook["cells"][0]).startswith(f"# {number}. "), (
        f"{copy.name}: the downloadable notebook should keep its numbered title")


def test_solutions_are_collapsible_dropdowns(chapter_page):
    path, _, page = chapter_page
    written = sum(cell_source(c).count("{solution}") for c in load_notebook(path)["cells"]
                  if c["cell_type"] == "markdown")
    solutions = page.with_class("solution", "div")
    assert len(solutions) == written, f"{page.path.name}: {len(solutions)} of {written} shown"
    assert all("dropdown" in s["class"].split() for s in solutions)


def test_pages_load_the_copy_button(pages):
    without = [p.name for p in pages if p.relative_to(HTML).as_posix() != "index.html"
               and not any("copybutton.js" in link for link in pages[p].links)]
    assert not without, f"no copy button script on {without}"


def test_execution_times_page_lists_every_chapter(site):
    assert TIMINGS.exists(), "no nbmake timings: run `make book`"
    text = (site / "book" / "execution-times.html").read_text(encoding="utf-8")
    for path, _ in CHAPTERS:
        row = re.search(rf"<code[^>]*><span class=\"pre\">{re.escape(path.name)}</span></code>"
                        r"</p></td>\s*<td[^>]*><p>([\d.]+)</p></td>\s*<td[^>]*><p>(\w+)</p>", text)
        assert row, f"execution-times: no row for {path.name}"
        assert row.group(2) == "passed"
    assert "CPU cores" in text


def test_front_matter_pages_exist(site):
    for name in ("intro", "how-to-run", "instructor-guide", "cheat-sheet", "glossary",
                 "execution-times"):
        assert (site / "book" / f"{name}.html").exists(), name
