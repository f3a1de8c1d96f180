# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast install lint tools clean gpu-check gpu-wheels test-torch-versions torch-envs test-tf-versions tf-envs

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch==2.13.0 is the CPU build; a looser pin would pull a multi-GB CUDA build. The papi and
	# gpu extras are small: their tests check CUPTI's record types and say, for real, why PAPI,
	# NVML and CUPTI cannot count on a machine without a PMU or a GPU. spark: the tests run every
	# analysis on Apache Spark in local mode too (Java from `make tools`).
	$(BIN)/python -m pip install --quiet -e '.[torch,tf,test,papi,gpu,spark]'
	touch $(STAMP)

install: $(STAMP)

## Profile the bundled PyTorch example and print the top table.
demo: $(STAMP)
	$(BIN)/dlprof run examples/torch_cnn.py

## Install everything and run the whole test suite.
test: $(STAMP) tools
	$(BIN)/python -m pytest -q

## Programs some tests need: `go tool pprof` (golang-go) to read pprof exports back, headless
## Chromium to load the HTML report, and Java 17 for Apache Spark (the engine tests). Installed
## with apt when missing and root; otherwise the tests that need them are skipped, each saying why.
TOOLS := go:golang-go chromium:chromium java:openjdk-17-jre-headless
tools:
	@missing=""; for pair in $(TOOLS); do \
	  command -v "$${pair%%:*}" >/dev/null 2>&1 || missing="$$missing $${pair##*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing$$missing"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) || \
	      echo "could not install$$missing: the tests that need them will be skipped"; \
	  else echo "missing$$missing (not root): the tests that need them will be skipped"; fi; fi

## The suite without the tests marked slow.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) .venv-torch-* .venv-tf-* dlprof-runs .pytest_cache

## The torch-related tests on other torch releases, and the TensorFlow ones on an older
## TensorFlow, each in a cached environment of its own (.venv-torch-2.4, .venv-tf-2.15 and so on,
## under FRAMEWORK_ENV_DIR: made once, so a rerun downloads nothing). An environment holds
## dlprof's dependencies and that release; the tests run this tree's code (PYTHONPATH), so one
## environment serves every checkout, and it is made again only when pyproject.toml changes (its
## hash names the stamp). PyPI's torch wheels other than 2.13.0+cpu are CUDA builds: with their
## nvidia-* packages they import and run on a machine without a GPU.
## PIP_CONSTRAINT=/dev/null: a machine-wide pip constraint (one may cap torch at the release its
## disk holds) must not choose the release under test; it applies to these environments only.
## `make test-torch-versions TORCH_VERSIONS=2.8.0` tests one release by hand.
TORCH_VERSIONS ?= 2.4.1 2.11.0 2.15.0
TF_VERSIONS ?= 2.20.0
FRAMEWORK_ENV_DIR ?= .
TORCH_TESTS ?= tests/support/test_torch_features.py tests/support/test_torch_ranges.py \
	tests/collectors/test_torch.py tests/collectors/test_layers.py tests/collectors/test_dataloader.py \
	tests/importers/test_torch_formats.py tests/tools/gpu_check/test_programs.py
TF_TESTS ?= tests/collectors/test_tensorflow.py tests/cli/test_keras_example.py
DEPS_HASH := $(shell sha256sum pyproject.toml | cut -c1-12)
TORCH_ENVS := $(foreach version,$(TORCH_VERSIONS),$(FRAMEWORK_ENV_DIR)/.venv-torch-$(basename $(version)))
TF_ENVS := $(foreach version,$(TF_VERSIONS),$(FRAMEWORK_ENV_DIR)/.venv-tf-$(basename $(version)))

# $(call framework_envs,SHORT NAME,PACKAGE,VERSIONS,DLPROF'S EXTRAS): the rule that makes
# .venv-SHORT-X.Y. The TensorFlow environments take the pinned torch too (the CPU build), as the
# main one has it: the tests of a Keras program check that torch.profiler waits for an import.
TORCH_ENV_EXTRAS := test
TF_ENV_EXTRAS := test,torch
define framework_envs
$(FRAMEWORK_ENV_DIR)/.venv-$(1)-%/.installed-$(DEPS_HASH):
	rm -rf $$(@D)
	$(PYTHON) -m venv $$(@D)
	PIP_CONSTRAINT=/dev/null $$(@D)/bin/python -m pip install --quiet --upgrade pip
	PIP_CONSTRAINT=/dev/null $$(@D)/bin/python -m pip install --quiet "$(2)==$$(filter $$*.%,$(3))" '.[$(4)]'
	touch $$@
endef
$(eval $(call framework_envs,torch,torch,$(TORCH_VERSIONS),$(TORCH_ENV_EXTRAS)))
$(eval $(call framework_envs,tf,tensorflow-cpu,$(TF_VERSIONS),$(TF_ENV_EXTRAS)))

# $(call test_in_envs,ENVIRONMENTS,TESTS,WHAT TO PRINT OF THE ENVIRONMENT)
test_in_envs = status=0; for env in $(1); do \
	  echo "== $$env: $$($$env/bin/python -c '$(3)' 2>/dev/null)"; \
	  PYTHONPATH=$(CURDIR) $$env/bin/python -m pytest -q -p no:cacheprovider $(2) || status=1; \
	done; exit $$status

torch-envs: $(addsuffix /.installed-$(DEPS_HASH),$(TORCH_ENVS))
tf-envs: $(addsuffix /.installed-$(DEPS_HASH),$(TF_ENVS))

test-torch-versions: torch-envs
	@$(call test_in_envs,$(TORCH_ENVS),$(TORCH_TESTS),import torch; print("torch " + torch.__version__))

test-tf-versions: tf-envs
	@$(call test_in_envs,$(TF_ENVS),$(TF_TESTS),import tensorflow as tf; print("tensorflow " + tf.__version__))

## Static checks: ruff and mypy --strict.
lint: $(STAMP)
	$(BIN)/ruff check dlprof tests tools bench
	$(BIN)/mypy

## On a machine with an NVIDIA GPU and no network: prove every GPU path in one go (at most 8 minutes),
## into gpu-check.json, .md and .log beside the recordings it brings back ($DLPROF_GPU_CHECK_OUT when set).
## Installs only what the machine's Python lacks, from .whl into .gpu-venv, never from the network. Exit 0
## all passed, 1 a check failed, 3 no NVIDIA GPU here, 4 nothing failed but a check could not run (make
## shows it as Error N).
GPU_PYTHON ?= python3
gpu-check:
	@$(GPU_PYTHON) -m tools.gpu_check $(GPU_CHECK_ARGS)

## Where the package index is reachable: the wheels gpu-check needs on a GPU machine, into .whl
## (CPython 3.12, manylinux x86-64; cupti-python for a CUDA 13 driver, GPU_CUDA="--cuda 12" for a
## CUDA 12 one). Fails if the tree and the wheels pass the 64 MiB a GPU machine receives.
gpu-wheels:
	$(PYTHON) -m tools.gpu_check.wheels --dest .whl $(GPU_CUDA)
