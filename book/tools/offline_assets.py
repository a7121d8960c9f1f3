"""The JavaScript the site needs, served from the site itself: widgets, require.js, MathJax.

    python -m book.tools assets           # fetch the pinned packages (npm pack), once
    python -m book.tools assets --check   # only say whether they are all there

The built pages must render the same with no internet (an air-gapped lab server, a cluster's
login node): chapter 1's device menu and chapter 7's run form need the Jupyter widgets'
HTML manager and require.js, and every formula needs MathJax. jupyter-book would load all
three from a CDN. Instead, this fetches each package at a pinned version from the npm registry
with npm's own client (`npm pack`: the package's tarball alone, no dependencies), checks the
tarball against the pinned sha512 (the registry's `dist.integrity`), and keeps it in
.offline-assets/ (not committed; `make clean` leaves it, so rebuilds need no network).
book/tools/build.py unpacks the files the pages use into the build copy, where
_config.yml's `mathjax_path` and `nb_ipywidgets_js` find them (under _static/offline/).

Fetching needs npm and the registry once, like `pip install -r requirements.txt`; after
that, building needs neither. To change a version: `npm view NAME@VERSION dist.integrity`.
"""
import argparse
import base64
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".offline-assets"

# name: (version, sha512 of the tarball as the registry publishes it, files the site serves).
# html-manager 1.0.x is the embedding manager of ipywidgets 8 (widget models 2.0.0); its
# embed-amd.js bundles the base, controls and output widgets, and the fonts beside it.
PACKAGES = {
    "@jupyter-widgets/html-manager": (
        "1.0.15",
        "sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47b"
        "CrJ3CQA==",
        ["dist/embed-amd.js", "dist/*.woff2", "dist/*.woff", "dist/*.ttf", "dist/*.eot",
         "dist/*.svg", "LICENSE"]),
    "requirejs": (
        "2.3.7",
        "sha512-DouTG8T1WanGok6Qjg2SXuCMzszOo0eHeH9hDZ5Y4x8Je+9JB38HdTLT4/VA8OaUhBa0JPVHJ0pyBkM1z"
        "+pDsw==",
        ["require.js", "README.md"]),
    # MathJax 3, as Sphinx's default (tex-mml-chtml.js), with the parts it loads on demand:
    # TeX extensions, the CHTML fonts, the menu and the accessibility components.
    "mathjax": (
        "3.2.2",
        "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+ge"
        "W0OhGw==",
        ["es5/tex-mml-chtml.js", "es5/input/**", "es5/output/chtml/**", "es5/output/chtml.js",
         "es5/a11y/**", "es5/ui/**", "es5/adaptors/**", "es5/sre/**", "LICENSE"]),
}
# Where each package's files land, under the site's _static/.
FOLDERS = {"@jupyter-widgets/html-manager": "offline/html-manager",
           "requirejs": "offline/requirejs", "mathjax": "offline/mathjax"}


class AssetError(Exception):
    """An asset is missing or wrong: one line for the user."""


def tarball_name(name, version):
    """npm pack's file name: '@jupyter-widgets/html-manager' -> 'jupyter-widgets-html-manager'."""
    return f"{name.lstrip('@').replace('/', '-')}-{version}.tgz"


def integrity(data):
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def cached(name):
    """The cached tarball of a package, if it is there and matches its pin; else None."""
    version, expected, _ = PACKAGES[name]
    path = CACHE / tarball_name(name, version)
    if path.exists() and integrity(path.read_bytes()) == expected:
        return path
    return None


def missing():
    return [f"{name}@{PACKAGES[name][0]}" for name in PACKAGES if cached(name) is None]


def fetch():
    """npm pack every package that is not cached yet; check each against its pin."""
    wanted = [name for name in PACKAGES if cached(name) is None]
    if not wanted:
        return []
    if shutil.which("npm") is None:
        raise AssetError("npm is not installed (Debian: apt-get install npm); it is needed "
                         "once, to fetch " + ", ".join(missing()))
    CACHE.mkdir(exist_ok=True)
    specs = [f"{name}@{PACKAGES[name][0]}" for name in wanted]
    print("+ npm pack " + " ".join(specs), flush=True)
    result = subprocess.run(["npm", "pack", *specs, "--pack-destination", str(CACHE),
                             "--json", "--silent"], capture_output=True, text=True)
    if result.returncode != 0:
        raise AssetError(f"npm pack failed (exit status {result.returncode}): "
                         f"{result.stderr.strip()[-500:]}")
    for name in wanted:
        version, expected, _ = PACKAGES[name]
        path = CACHE / tarball_name(name, version)
        got = integrity(path.read_bytes()) if path.exists() else "nothing"
        if got != expected:
            path.unlink(missing_ok=True)
            raise AssetError(f"{name}@{version}: the registry sent {got}, pinned {expected}")
    return specs


def matches(member, patterns):
    """'package/es5/input/tex.js' against 'es5/input/**', 'dist/*.woff' and plain names."""
    relative = Path(member).relative_to("package")
    for pattern in patterns:
        if pattern.endswith("/**"):
            if relative.is_relative_to(pattern[:-3]):
                return True
        elif relative.match(pattern) and len(relative.parts) == len(Path(pattern).parts):
            return True
    return False


def install(target):
    """Unpack the served files of every package into target/offline/..., fetching if needed.

    Returns {package: version}. Raises AssetError when a package cannot be had.
    """
    try:
        fetch()
    except (AssetError, OSError) as error:
        raise AssetError(f"the site's offline JavaScript is missing ({', '.join(missing())}) "
                         f"and could not be fetched: {error}. Run `python -m "
                         f"book.tools assets` once with access to the npm "
                         f"registry") from None
    versions = {}
    if Path(target).exists():
        shutil.rmtree(target)   # nothing left over from other versions
    for name, (version, _, patterns) in PACKAGES.items():
        folder = Path(target) / FOLDERS[name]
        with tarfile.open(fileobj=io.BytesIO(cached(name).read_bytes())) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and matches(m.name, patterns)]
            if not members:
                raise AssetError(f"{name}@{version}: none of {patterns} in the tarball")
            for member in members:
                destination = folder / Path(member.name).relative_to("package")
                destination.parent.mkdir(parents=True, exist_ok=True)
                destination.write_bytes(tar.extractfile(member).read())
        (folder / "VERSION").write_text(f"{name}@{version} from the npm registry\n")
        versions[name] = version
    # The widget manager asks for its icon fonts beside its scripts (html-manager/dist/) or,
    # depending on which of its scripts loads first, in offline/ itself: serve them in both.
    for font in (Path(target) / "offline" / "html-manager" / "dist").glob("*"):
        if font.suffix in (".woff2", ".woff", ".ttf", ".eot", ".svg"):
            shutil.copy2(font, Path(target) / "offline" / font.name)
    return versions


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only check that every pinned package is cached (exit status 1 "
                             "if not)")
    args = parser.parse_args(argv)
    if args.check:
        absent = missing()
        print(f"missing: {', '.join(absent)}" if absent else f"all {len(PACKAGES)} cached in "
              f"{CACHE}")
        return 1 if absent else 0
    try:
        fetched = fetch()
    except AssetError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps({"fetched": fetched, "cache": str(CACHE),
                      "pinned": {n: v for n, (v, _, _) in PACKAGES.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
