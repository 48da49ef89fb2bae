# The README's two commands: `make demo` and `make test`. Everything else is a building block.
# Everything runs in the project's virtual environment (.venv, made by hack/setup.sh), never the machine's Python.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: demo demo-dra test unit setup binaries protos bench bench-scale soak lint

setup:  ## Python dependencies into .venv and the pinned binaries (control plane + cluster-autoscaler), built from source
	bash hack/setup.sh

binaries:
	bash hack/build-binaries.sh

demo: setup  ## The talk's demo end to end: control plane, DDS, the real cluster-autoscaler, simulated fabric, kwok nodes
	$(PYTHON) -m harness.demo

demo-dra: setup  ## The same demo with GPUs asked for through ResourceClaims (node-local DRA: docs/dra.md)
	$(PYTHON) -m harness.demo --dra

test: setup  ## Every test: lint contracts, unit, integration (real apiserver), e2e (DDS driven by the real cluster-autoscaler); the long soak variants are `make soak`
	$(VENV)/bin/lint-imports
	$(PYTHON) -m pytest tests -m "not slow" $(PYTEST_ARGS)

unit: setup
	$(PYTHON) -m pytest tests/unit $(PYTEST_ARGS)

protos: setup  ## Regenerate dds/provider/gen from protos/
	PYTHON=$(abspath $(PYTHON)) bash hack/gen-protos.sh

bench: setup  ## Planner benchmarks (ratios and percentiles)
	$(PYTHON) -m tests.bench.planner

bench-scale: setup  ## DDS at 1k nodes/10k pods and 5k/50k on the real control plane: watch cache vs LIST per call (docs/scale.md)
	$(PYTHON) -m tests.bench.scale $(BENCH_SCALE_ARGS)

soak: setup  ## The long reliability campaign
	DDS_SOAK=1 $(PYTHON) -m pytest tests -m slow $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/lint-imports
