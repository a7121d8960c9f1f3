# Two commands do all the set-up on a fresh machine with Python 3.10+:
#   make book   create .venv, execute every notebook, write the HTML to _build/html
#   make test   make book, then run every test (scripts, launcher, faults, the built site)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: book test browser student-copies clean

$(INSTALLED): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -r requirements.txt
	touch $@

book: $(INSTALLED)
	$(BIN)/python book/tools/build.py

# Debian's Chromium, for the tests that open the built pages in a real browser.
browser:
	@command -v chromium >/dev/null || { apt-get update -q && apt-get install -y -q chromium; }

test: book browser
	$(BIN)/python -m pytest -n 2 --dist loadgroup tests

student-copies: $(INSTALLED)
	$(BIN)/python book/tools/student_copies.py

clean:
	rm -rf _build runs
