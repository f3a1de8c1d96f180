# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast install lint tools clean

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
test: $(STAMP) tools
	$(BIN)/python -m pytest -q

## Programs some tests read exports back with: `go tool pprof` (Debian's golang-go).
tools:
	@command -v go >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && apt-get install -y -qq golang-go >/dev/null) || \
	      echo "golang-go could not be installed: the go tool pprof test will be skipped"; \
	  else echo "go is not installed and this is not root: the go tool pprof test will be skipped"; fi; }

## The suite without the tests marked slow.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) dlprof-runs .pytest_cache

## Static checks: ruff and mypy --strict.
lint: $(STAMP)
	$(BIN)/ruff check dlprof tests
	$(BIN)/mypy
