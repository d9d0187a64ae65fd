# Two entry points: `make run` (dashboard on the embedded default) and `make test` (the whole suite).
# Both build a local virtual environment in .venv from the pinned requirements.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test unit e2e bench clean

$(VENV)/.runtime: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

$(VENV)/.dev: requirements-dev.txt requirements.txt $(VENV)/.runtime
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

run: $(VENV)/.runtime
	$(PY) -m app dashboard

test: $(VENV)/.dev
	bash scripts/test.sh

unit: $(VENV)/.dev
	$(PY) -m pytest -m "not e2e" -n 2 --dist loadfile

bench: $(VENV)/.dev
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) .pytest_cache benchmarks/_work
