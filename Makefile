# One virtualenv for everything. The pinned CPU build of torch goes in first:
# a bare `torch` requirement would pull the newest release with gigabytes of
# CUDA packages.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: test lint demo clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

test: $(VENV)/.installed
	$(VENV)/bin/ruff check optsched tests experiments
	$(PY) -m pytest -q

demo: $(VENV)/.installed
	$(VENV)/bin/optsched info example:bert_l3
	$(VENV)/bin/optsched solve example:bert_l3 --mem 1GB --solver heuristic -o schedule.json
	$(VENV)/bin/optsched simulate example:bert_l3 schedule.json --mem 1GB

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis schedule.json
