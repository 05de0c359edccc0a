# semantic-orm developer tasks. Works on a fresh clone: the first target that needs the
# virtualenv creates .venv and installs the project (editable) with its dev extras.

PYTHON        ?= python3
VENV          ?= .venv
TORCH_VERSION ?= 2.13.0
PY            := $(VENV)/bin/python
PIP           := $(PY) -m pip
# Reinstall when the dependencies change, or when semantic_orm/__init__.py first appears
# (setuptools' editable finder records at install time whether the package is a namespace).
STAMP         := $(VENV)/.installed

# Tests and demos never download models.
export HF_HUB_OFFLINE        ?= 1
export TRANSFORMERS_OFFLINE  ?= 1
export TOKENIZERS_PARALLELISM ?= false

# ruff errors on paths that do not exist, so lint only the directories that do.
LINT_PATHS    := $(wildcard semantic_orm tests examples bench migrations)
PYTEST_ARGS   ?=

.DEFAULT_GOAL := help
OLDEST        ?= .venv-oldest
OLDEST_PINS   := .ci/oldest.txt

.PHONY: help venv .venv test lint fmt typecheck pytest test-oldest demo bench clean

help:
	@echo "make venv       create $(VENV) and install torch==$(TORCH_VERSION) + -e '.[dev]'"
	@echo "make test       lint + typecheck + pytest (what CI runs)"
	@echo "make lint       ruff check, import-linter contracts (lint-imports)"
	@echo "make fmt        ruff format + ruff check --fix"
	@echo "make typecheck  mypy (strict)  make pytest     pytest only (PYTEST_ARGS=...)"
	@echo "make test-oldest  pytest in $(OLDEST), on the oldest versions pyproject.toml allows"
	@echo "make demo       run examples/knowledge_base.py"
	@echo "make bench      run bench/ingest.py"
	@echo "make clean      remove $(VENV) and caches"

venv .venv: $(STAMP)

# torch first and pinned: an unpinned torch resolves to the multi-GB CUDA build.
$(STAMP): pyproject.toml $(wildcard semantic_orm/__init__.py)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install 'torch==$(TORCH_VERSION)'
	$(PIP) install -e '.[dev]'
	touch $@

test: lint typecheck pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/lint-imports

fmt: $(STAMP)
	$(VENV)/bin/ruff format $(LINT_PATHS)
	$(VENV)/bin/ruff check --fix $(LINT_PATHS)

typecheck: $(STAMP)
	@if ls semantic_orm/*.py >/dev/null 2>&1; then \
		echo "$(VENV)/bin/mypy"; $(VENV)/bin/mypy; \
	else \
		echo "mypy: semantic_orm/ has no Python files yet, skipped"; \
	fi

pytest: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# The lower bounds of pyproject.toml, tested: the same suite with the dependencies of
# $(OLDEST_PINS) at their floors (the rest resolved as usual). Not part of `make test`.
$(OLDEST)/.installed: pyproject.toml $(OLDEST_PINS) $(wildcard semantic_orm/__init__.py)
	test -x $(OLDEST)/bin/python || $(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install 'torch==$(TORCH_VERSION)'
	$(OLDEST)/bin/python -m pip install -c $(OLDEST_PINS) -e '.[dev]'
	touch $@

test-oldest: $(OLDEST)/.installed
	$(OLDEST)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) examples/knowledge_base.py

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) bench/ingest.py

clean:
	rm -rf $(VENV) $(OLDEST) .mypy_cache .ruff_cache .pytest_cache .hypothesis build dist *.egg-info
	find . -name __pycache__ -type d -prune -not -path './.git/*' -exec rm -rf {} +
