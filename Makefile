# Everyday commands. `make setup` once, then `make demo`, `make test`, `make check`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-all check bench

setup:
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install torch==2.13.0
	$(VENV)/bin/pip install -c constraints.txt -e '.[dev]'

demo:
	$(VENV)/bin/sapo demo

test:  # the fast suite (no whole-swarm tests)
	$(PY) -m pytest

test-all:  # everything, the slow whole-swarm tests too; .ci/run runs the same in two steps
	$(PY) -m pytest -m ''

check:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench:
	$(PY) benchmarks/ledger_bench.py
