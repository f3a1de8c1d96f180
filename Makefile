# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast install lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch==2.13.0 is the CPU build; a looser pin would pull a multi-GB CUDA build.
	$(BIN)/python -m pip install --quiet -e '.[torch,test]'
	touch $(STAMP)

install: $(STAMP)

## Profile the bundled PyTorch example and print the top table.
demo: $(STAMP)
	$(BIN)/dlprof run examples/torch_cnn.py

## Install everything and run the whole test suite.
test: $(STAMP)
	$(BIN)/python -m pytest -q

## The suite without the tests marked slow.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) dlprof-runs .pytest_cache

## Static checks: ruff and mypy --strict.
lint: $(STAMP)
	$(BIN)/ruff check dlprof tests
	$(BIN)/mypy
