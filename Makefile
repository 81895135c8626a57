# aiworker — the two set-up commands: `make demo` (main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo dev test lint typecheck bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

## Start the embedded Temporal server + UI + worker, run the sample pipeline, print the result.
demo: $(STAMP)
	$(BIN)/aiworker demo $(DEMO_ARGS)

## Embedded Temporal server + UI + worker, until Ctrl-C.
dev: $(STAMP)
	$(BIN)/aiworker dev

## Lint, type-check and run the whole test suite against a real Temporal server.
test: $(STAMP)
	$(BIN)/ruff check schemas activities workflows workers tests bench
	$(BIN)/mypy
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .aiworker .pytest_cache .mypy_cache .ruff_cache
