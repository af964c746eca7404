# gpuheal: two commands on a fresh machine.
#   make demo   local control plane, 20 fake GPU nodes, a GPU Deployment, the GPU state
#   make test   lint, type check, every test tier
# Both install what they need: a virtualenv (.venv) and the control-plane
# binaries built from the Go module proxy (.cache/testenv, rebuilt only when testenv/ changes).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint unit integration e2e testenv venv clean bench

demo: $(STAMP) testenv
	$(BIN)/gpuheal demo

test: lint testenv
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -m unit

integration: $(STAMP) testenv
	$(BIN)/pytest -m integration

e2e: $(STAMP) testenv
	$(BIN)/pytest -m e2e

testenv:
	testenv/build.sh

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

clean:
	rm -rf $(VENV) .cache .mypy_cache .pytest_cache .ruff_cache

bench: $(STAMP) testenv
	$(BIN)/python bench/controlplane_start.py --runs 5
	$(BIN)/python bench/agent.py --seconds 20
