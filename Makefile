# The README's two commands: `make demo` and `make test`. Everything else is a building block.
PYTHON ?= python3
PYTEST_ARGS ?=

.PHONY: demo test unit setup binaries protos bench soak lint

setup:  ## Python dependencies (editable install with dev extras) and the pinned control-plane binaries
	bash hack/setup.sh

binaries:
	bash hack/build-binaries.sh

demo: setup  ## The talk's demo end to end: control plane, DDS, autoscaler, simulated fabric, kwok nodes
	$(PYTHON) -m dds.demo

test: setup  ## Every test: unit, integration (real apiserver), e2e (DDS driven by the autoscaler); the long soak variants are `make soak`
	$(PYTHON) -m pytest tests -m "not slow" $(PYTEST_ARGS)

unit:
	$(PYTHON) -m pytest tests/unit $(PYTEST_ARGS)

protos:  ## Regenerate dds/provider/gen from protos/
	bash hack/gen-protos.sh

bench: setup  ## Planner benchmarks (ratios and percentiles)
	$(PYTHON) -m dds.planner.bench

soak: setup  ## The long reliability campaign
	DDS_SOAK=1 $(PYTHON) -m pytest tests -m slow $(PYTEST_ARGS)

lint:
	lint-imports
