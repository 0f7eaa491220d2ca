# Thin wrappers: every command in the README goes through here.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: venv demo test check lint format pytest bench migration regen screenshots clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "pgflow-gen needs Python 3.11+"'
	@echo "==> creating the virtual environment $(VENV) with $$($(PYTHON) --version)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> upgrading pip"
	$(BIN)/pip install --quiet --upgrade pip
	@echo "==> installing pgflow-gen and its development tools (about a minute the first time)"
	$(BIN)/pip install --progress-bar off --no-color -e '.[dev]'
	@echo "==> $(VENV) is ready"
	touch $(STAMP)

venv: $(STAMP)

## demo: build the examples, then run 50 community_threads runs on per-step worker processes
demo: venv
	cd examples/community_threads && $(CURDIR)/$(BIN)/pgflow-gen build flows --out app/pgflow
	$(BIN)/python examples/community_threads/demo.py

## test: create the virtual environment, install everything, lint, type-check and run every test
test: venv lint pytest

## check: what CI checks (formatting, lint, types, tests)
check: test

lint: venv
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Two processes, a test file each at a time (each with its own embedded server): the suite
# waits on databases and worker processes more than it computes, so this halves it on 2 cores.
pytest: venv
	$(BIN)/pytest -q -n 2 --dist loadfile

## bench: engine throughput next to raw PGMQ (not part of `make test`)
bench: venv
	$(BIN)/python benchmarks/engine_throughput.py

## migration: write the next engine migration from what changed in pgflow_gen/runtime/sql/source/
##            (make migration NAME=what_it_changes; docs/engine.md, "How to change the engine")
migration: venv
	@test -n "$(NAME)" || { echo "usage: make migration NAME=what_it_changes" >&2; exit 2; }
	$(BIN)/python -m pgflow_gen.runtime.sql.writer $(NAME)

## regen: rewrite the committed generated files: JSON Schema, golden cases, examples
regen: venv
	$(BIN)/python -m pgflow_gen.spec.schema > schemas/flow.schema.json
	$(BIN)/python -m tests.golden.golden
	for example in examples/*/ tests/e2e/project/ benchmarks/project/; do \
	  if [ -d "$$example/flows" ]; then \
	    (cd "$$example" && $(CURDIR)/$(BIN)/pgflow-gen build flows --out app/pgflow); \
	  fi; \
	done

## screenshots: refresh docs/images/dashboard-*.png from the browser test (Debian's chromium)
screenshots: venv
	PGFLOW_SCREENSHOTS=docs/images $(BIN)/pytest -q tests/dashboard/test_browser.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache dist build
