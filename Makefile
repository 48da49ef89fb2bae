# The README's two commands: `make demo` and `make test`. Everything else is a building block.
# Everything runs in the project's virtual environment (.venv, made by hack/setup.sh), never the machine's Python.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: demo demo-dra demo-cdi test unit setup binaries protos bench bench-cdi bench-scale soak lint

setup:  ## Python dependencies into .venv and the pinned binaries (control plane + cluster-autoscaler), built from source
	bash hack/setup.sh

binaries:
	bash hack/build-binaries.sh

demo: setup  ## The talk's demo end to end: control plane, DDS, the real cluster-autoscaler, simulated fabric, kwok nodes
	$(PYTHON) -m harness.demo

demo-dra: setup  ## The same demo with GPUs asked for through ResourceClaims (node-local DRA: docs/dra.md)
	$(PYTHON) -m harness.demo --dra

demo-cdi: setup  ## The same demo through CoHDI's real CDI operator and the fabric-manager emulator (GPUs claimed from NVIDIA's DRA driver)
	$(PYTHON) -m harness.demo --fabric composability

test: setup  ## Every test: lint contracts, unit, integration (real apiserver), e2e (DDS driven by the real cluster-autoscaler); the long soak variants are `make soak`
	$(VENV)/bin/lint-imports
	$(PYTHON) -m pytest tests -m "not slow" $(PYTEST_ARGS)

unit: setup
	$(PYTHON) -m pytest tests/unit $(PYTEST_ARGS)

protos: setup  ## Regenerate dds/provider/gen from protos/
	PYTHON=$(abspath $(PYTHON)) bash hack/gen-protos.sh

bench: setup  ## Planner benchmarks (ratios and percentiles)
	$(PYTHON) -m tests.bench.planner

bench-cdi: setup  ## The GPU path through the real CDI operator: pending pod -> Running, step by step (docs/composability.md)
	$(PYTHON) -m tests.bench.cdi_operator $(BENCH_CDI_ARGS)

bench-scale: setup  ## DDS at 1k nodes/10k pods and 5k/50k on the real control plane: watch cache vs LIST per call (docs/scale.md)
	$(PYTHON) -m tests.bench.scale $(BENCH_SCALE_ARGS)

soak: setup  ## The long reliability campaign
	DDS_SOAK=1 $(PYTHON) -m pytest tests -m slow $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/lint-imports
