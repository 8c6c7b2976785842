# The two commands of the README. Both create .venv when it is missing and install
# torch==2.13.0 *first*: that is the CPU build this machine kind has on disk, and
# installing the project first would let pip pull a multi-GB CUDA build instead.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.troupe-installed
# openapi-python-client (the test of a client generated from the document) pins an
# older typer than the CLI wants: it gets a virtual environment of its own.
OPENAPI_VENV ?= .venv-openapi
OPENAPI_STAMP := $(OPENAPI_VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8765

.PHONY: run test lint typecheck unit integration bench clean screenshots cli-reference

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

$(OPENAPI_STAMP):
	test -x $(OPENAPI_VENV)/bin/python || $(PYTHON) -m venv $(OPENAPI_VENV)
	$(OPENAPI_VENV)/bin/pip install -q openapi-python-client==0.29.1
	touch $(OPENAPI_STAMP)

run: $(STAMP)
	$(VENV)/bin/troupe start --host $(HOST) --port $(PORT) --examples examples

lint: $(STAMP)
	$(VENV)/bin/ruff check troupe tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Two pytest-xdist workers: most tests wait on a server, a browser or an agent, so two at a
# time halve the wall time on the 2-core CI machine (tests/conftest.py keeps a module's
# tests together, and the LAN tests on one worker).
test: lint typecheck $(OPENAPI_STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup

# The images of README.md and docs/, shot by the browser tests (run by hand; make test
# writes its shots to a temporary folder).
# The README's and docs/ui.md's pictures: one server with a morning's runs, each view
# shot at 1440x900 (tests/e2e/showcase.py), and the classroom's and a shared card's
# from their tests. Run by hand; `make test` writes its shots to a temporary folder.
screenshots: $(STAMP)
	$(PY) -m tests.e2e.showcase docs/images
	TROUPE_SCREENSHOTS=$(CURDIR)/docs/images $(PY) -m pytest -q tests/e2e/test_classroom.py \
		tests/e2e/test_panels.py tests/e2e/test_fair_share_page.py -k "teacher or share_a_card or fairly"

# docs/cli.md's list of every command and option, rendered from the CLI (run by hand
# after changing a command; a test says when it is out of date).
cli-reference: $(STAMP)
	$(PY) -m troupe.cli.reference docs/cli.md

bench: $(STAMP)
	$(PY) bench/queue.py

clean:
	rm -rf $(VENV) $(OPENAPI_VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
