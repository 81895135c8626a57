# aiworker — the two set-up commands: `make demo` (main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install compile demo dev test lint typecheck bench docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# Byte-compile the packages even where PYTHONDONTWRITEBYTECODE is set: the
# workflow sandbox re-imports workflow modules for every run, and without
# .pyc files each run compiles them from source (measured: most of a short
# pipeline's worker CPU).
compile: $(STAMP)
	$(BIN)/python -m compileall -q aiworker schemas activities workflows workers bench >/dev/null

## Start the embedded Temporal server + UI + worker, run the sample pipeline, print the result.
demo: compile
	$(BIN)/aiworker demo $(DEMO_ARGS)

## Embedded Temporal server + UI + worker, until Ctrl-C.
dev: compile
	$(BIN)/aiworker dev

## Lint, type-check and run the whole test suite against a real Temporal server.
test: $(STAMP)
	$(BIN)/ruff check aiworker schemas activities workflows workers tests bench examples
	$(BIN)/mypy
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

## Regenerate schemas/json/ and docs/reference/ from the models, specs and settings.
docs: $(STAMP)
	$(BIN)/aiworker schemas export

bench: compile
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .aiworker .pytest_cache .mypy_cache .ruff_cache
