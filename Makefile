# Two entry points: `make run` (dashboard + gateway server on the embedded default) and `make test` (the whole suite).
# Both build a local virtual environment in .venv from the hashed locks (requirements*.txt), which
# `make lock` regenerates from the direct dependencies declared in pyproject.toml.

PYTHON ?= python3
VENV := .venv
DASHBOARD_PORT ?= 8501
GATEWAY_PORT ?= 8000
PY := $(VENV)/bin/python

.PHONY: run test test-unit test-integration test-e2e lint unit e2e bench lock clean

$(VENV)/.runtime: requirements.txt
	@echo "installing the runtime dependencies into $(VENV) (first run: about a minute; progress below)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --progress-bar on --require-hashes -r requirements.txt
	touch $@

$(VENV)/.dev: requirements-dev.txt requirements.txt $(VENV)/.runtime
	@echo "installing the test tools into $(VENV)"
	$(PY) -m pip install --quiet --require-hashes -r requirements-dev.txt
	touch $@

# Formatting, lint and types; .ci/run runs this before the tests.
lint: $(VENV)/.dev
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	@! grep -rniIE --include='*.py' '\bissues? #?[0-9]+' app core db ui kvcache \
	  || { echo "lint: comments say why in the present tense; issue numbers and history go in commit messages"; exit 1; }

# Regenerates the hashed locks from pyproject.toml (needs `uv`: pip install uv).
lock:
	uv pip compile pyproject.toml --generate-hashes --python-version 3.11 -o requirements.txt -q --custom-compile-command "make lock"
	uv pip compile pyproject.toml --extra dev --generate-hashes --python-version 3.11 -o requirements-dev.txt -q --custom-compile-command "make lock"

# The dashboard and the gateway server together (both 127.0.0.1); Ctrl-C stops both.
run: $(VENV)/.runtime
	$(PY) -m app.launch --dashboard-port $(DASHBOARD_PORT) --gateway-port $(GATEWAY_PORT)

# The whole suite, all three tiers (what .ci/run runs): starts PostgreSQL, installs what is missing.
test: $(VENV)/.dev
	bash scripts/test.sh

# The inner loop: no processes, no sockets, no PostgreSQL; about 2-3 minutes on 2 cores.
test-unit: $(VENV)/.dev
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest tests/unit -m "not postgres" -n 2 --dist worksteal

# Real processes, loopback upstreams, PostgreSQL (TEST_POSTGRES_URL; scripts/test.sh starts one).
test-integration: $(VENV)/.dev
	bash scripts/test.sh integration

# The browser tests (Debian's chromium driven by Playwright).
test-e2e: $(VENV)/.dev
	bash scripts/test.sh e2e

unit: test-unit

bench: $(VENV)/.dev
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) .pytest_cache benchmarks/_work
