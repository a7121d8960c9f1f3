# Two commands do all the set-up on a fresh machine with Python 3.10+ and npm (README.md):
#   make book    create .venv, execute every notebook, write the HTML to _build/html
#                (again only when a source changed since the last build)
#   make test    every check and test: first `make check` (minutes, no book needed), then the
#                book's build, then the tests of the built book (tests/site); no test runs twice
# and one more, once, for the tests that open the built pages in a browser:
#   make browser  install Debian's chromium and a Chinese font (needs root; elsewhere, install
#                 Chromium and any font with Chinese characters yourself)
# Quicker, while working on the code: `make check`, the fast lane: ruff, nbstripout --verify (no
# notebook committed with outputs), `python -m book.tools check` (the sources' own checks), then
# the tests that need no built book (tests/scripts, tests/figures and tests/book).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
PYTEST := $(BIN)/python -m pytest -n 2 --dist loadgroup
# The tests are in one folder for each thing they need: tests/scripts (the companion scripts),
# tests/figures (the figure helpers, fed real runs), tests/book (the sources and tools),
# tests/site (the built book: its pages, its chapters' runs).

.PHONY: book test check oldest-torch browser gpu-check gpu-plan gpu-bundle student-copies clean

# The book's own code (ddp_scripts, the chapters' helpers, book.tools) is installed editable
# (pyproject.toml), so scripts, notebooks and tests import it from anywhere.
$(INSTALLED): requirements.txt requirements-dev.txt pyproject.toml book/tools/offline_assets.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -r requirements-dev.txt -e .
	$(BIN)/python -m book.tools assets  # widgets, require.js, MathJax: pinned npm tarballs, once
	touch $@

# The book is rebuilt only when one of its sources changed since the last build: a real
# target, _build/html/.stamp, over every file the build reads. A fresh clone (and CI) has
# no _build, so it builds from scratch.
BOOK_STAMP := _build/html/.stamp
BOOK_SOURCES := _config.yml _toc.yml requirements.txt requirements-dev.txt $(shell find notebooks ddp_scripts book results \
	-type f -not -path '*/__pycache__/*' -not -path '*/.ipynb_checkpoints/*' 2>/dev/null)

book: $(BOOK_STAMP)

$(BOOK_STAMP): $(INSTALLED) $(BOOK_SOURCES)
	$(BIN)/python -m book.tools build
	touch $@

# check before book: a broken script or source fails in minutes, before the long build.
test: check book
	$(PYTEST) tests/site

NOTEBOOKS := $(wildcard notebooks/*.ipynb notebooks/zh/*.ipynb)
check: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/nbstripout --keep-id --verify $(NOTEBOOKS)
	$(BIN)/python -m book.tools check
	$(PYTEST) tests/scripts tests/figures tests/book

# Every English chapter against the oldest torch, torchvision and filelock that
# requirements.txt allows, in an environment of its own (.venv-oldest; pip fetches that torch,
# a few GB with CUDA), the test of how a rank leaves its group (the floor is where a rank once
# hung at exit), and the download's tests (filelock's floor holds its lock).
# Not part of `make test`, which runs the newest torch; .ci/run runs both.
TORCH_FLOOR := $(shell sed -n 's/^torch>=\([0-9.]*\).*/\1/p' requirements.txt)
VISION_FLOOR := $(shell sed -n 's/^torchvision>=\([0-9.]*\).*/\1/p' requirements.txt)
FILELOCK_FLOOR := $(shell sed -n 's/^filelock>=\([0-9.]*\).*/\1/p' requirements.txt)
OLDEST := .venv-oldest
oldest-torch:
	test -x $(OLDEST)/bin/python || $(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install -q -r requirements-dev.txt -e . "torch==$(TORCH_FLOOR).*" "torchvision==$(VISION_FLOOR).*" "filelock==$(FILELOCK_FLOOR).*"
	$(OLDEST)/bin/python -c "import filelock, torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'filelock', filelock.__version__)"
	$(OLDEST)/bin/python -m pytest --nbmake -n 2 -p no:cacheprovider -o addopts= -o timeout=1800 --nbmake-timeout=900 notebooks/*.ipynb tests/scripts/test_group_exit.py tests/scripts/test_data_download.py

# apt-get needs root: as root it runs directly, otherwise through sudo (a CI runner, say).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# A Chromium is found where the browser tests find it (tests/chromium.py: PATH or playwright's cache).
browser:
	@$(PYTHON) tests/chromium.py >/dev/null && fc-list :lang=zh | grep -q . || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium fonts-wqy-microhei; }

# On a machine with GPUs, with the interpreter it already has (no .venv is made):
#   PYTHON=python3 make gpu-check [STEPS="notebooks tests micro benchmark"] [BUDGET=540]
# runs each step (default: all four, the chapters most valuable first; a step may also be one
# notebook's path) and records it into results/gpu-runs/<date>-<hardware>/ as it ends; a later call
# the same day adds to that folder. BUDGET (seconds): no step started that would not end within it.
# `make gpu-plan BUDGET=540` prints that order and each step's expected seconds, anywhere.
# `make gpu-bundle` (on a machine with a package index) writes the wheels a GPU machine without
# one needs into .gpu-wheels/ and prints the command line to run there (MAINTAINING.md).
STEPS ?=
BUDGET ?=
gpu-check:
	$(PYTHON) -m book.tools gpu-check $(STEPS) $(if $(BUDGET),--budget-s $(BUDGET))

gpu-plan: $(INSTALLED)
	$(BIN)/python -m book.tools gpu-check --plan $(STEPS) $(if $(BUDGET),--budget-s $(BUDGET))

gpu-bundle: $(INSTALLED)
	$(BIN)/python -m book.tools gpu-check --bundle

student-copies: $(INSTALLED)
	$(BIN)/python -m book.tools student-copies

clean:
	rm -rf _build runs
