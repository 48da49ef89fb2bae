# The README's two commands: `make demo` and `make test`. Everything else is a building block.
# Everything runs in the project's virtual environment (.venv, made by hack/setup.sh), never the machine's Python.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
PYTEST_ARGS ?=
# make test and make test-compat run in parallel workers (pytest-xdist; harness/xdist_plugin.py says what each worker
# keeps to itself): most of an e2e test is waiting on a latency, a scan interval or a cooldown, so more workers than
# cores pay off. 0 runs in one process. Chosen by measurement on the 2-core machine (README, "How long").
DDS_TEST_WORKERS ?= 6
PARALLEL := -n $(DDS_TEST_WORKERS) --dist loadgroup --durations=25
# The compatibility run's Kubernetes profile (hack/versions.env; docs/versions.md): the previous minor, kept working.
COMPAT_PROFILE := $(shell sed -n 's/^DDS_COMPAT_K8S_PROFILE=//p' hack/versions.env)
COMPAT_TESTS := tests/e2e/test_demo.py tests/e2e/test_demo_dra.py tests/e2e/test_gangs_on_the_real_scheduler.py \
	tests/e2e/test_dra_pool_mode.py

.PHONY: demo demo-dra demo-cdi test test-compat unit setup setup-demo setup-python binaries protos bench bench-cdi bench-scale soak lint

setup:  ## Python dependencies into .venv and the pinned binaries (control plane + cluster-autoscaler), built from source
	bash hack/setup.sh

setup-demo:  ## Python dependencies and only the binaries `make demo` runs (the default profile's control plane and cluster-autoscaler)
	bash hack/setup.sh demo

setup-python:  ## Python dependencies into .venv only: no Go, no binaries (enough for unit, lint, protos, bench)
	bash hack/setup.sh python

binaries:  ## The default Kubernetes profile's binaries (DDS_K8S_PROFILE=<profile> for another; --all: every profile)
	bash hack/build-binaries.sh

demo: setup-demo  ## The talk's demo end to end: control plane, DDS, the real cluster-autoscaler, simulated fabric, kwok nodes; its timeline drawn in demo-timeline.png beside its logs
	DDS_BINARIES=demo $(PYTHON) -m harness.demo

demo-dra: setup  ## The same demo with GPUs asked for through ResourceClaims (node-local DRA: docs/dra.md)
	$(PYTHON) -m harness.demo --dra

.PHONY: demo-cxl
demo-cxl: setup-demo  ## The same demo with CXL memory in the pool: the memory-heavy pods get memory attached to a worker, no node added (docs/cxl-memory.md)
	DDS_BINARIES=demo $(PYTHON) -m harness.demo --cxl-memory

demo-cdi: setup  ## The same demo through CoHDI's real CDI operator and the fabric-manager emulator (GPUs claimed from NVIDIA's DRA driver)
	$(PYTHON) -m harness.demo --fabric composability

test: setup  ## Every test: lint contracts, unit, integration (real apiserver), e2e (DDS driven by the real cluster-autoscaler); the long soak variants are `make soak`
	$(VENV)/bin/lint-imports
	$(PYTHON) -m pytest tests -m "not slow" $(PARALLEL) $(PYTEST_ARGS)

test-compat: setup  ## The compatibility run on the previous Kubernetes minor and its cluster-autoscaler: the demo, the DRA demo, gangs and DRA pool mode
	DDS_K8S_PROFILE=$(COMPAT_PROFILE) $(PYTHON) -m pytest $(COMPAT_TESTS) -m "not slow" $(PARALLEL) $(PYTEST_ARGS)

unit: setup-python  ## The unit tests only: no control-plane binaries needed, none built
	$(PYTHON) -m pytest tests/unit $(PYTEST_ARGS)

protos: setup-python  ## Regenerate dds/provider/gen from protos/
	PYTHON=$(abspath $(PYTHON)) bash hack/gen-protos.sh

bench: setup-python  ## Planner benchmarks (ratios and percentiles)
	$(PYTHON) -m tests.bench.planner

bench-cdi: setup  ## The GPU path through the real CDI operator: pending pod -> Running, step by step (docs/composability.md)
	$(PYTHON) -m tests.bench.cdi_operator $(BENCH_CDI_ARGS)

bench-scale: setup  ## DDS at 1k nodes/10k pods and 5k/50k on the real control plane: watch cache vs LIST per call (docs/scale.md)
	$(PYTHON) -m tests.bench.scale $(BENCH_SCALE_ARGS)
	$(PYTHON) -m tests.bench.scale_ca $(BENCH_SCALE_CA_ARGS)

soak: setup  ## The long reliability campaign
	DDS_SOAK=1 $(PYTHON) -m pytest tests -m slow $(PYTEST_ARGS)

lint: setup-python  ## The import-layering contracts: no control-plane binaries needed, none built
	$(VENV)/bin/lint-imports

.PHONY: chart chart-schema dashboard
chart: setup  ## The Helm chart, alerts and dashboard checked by helm, promtool and a real apiserver (part of make test)
	$(PYTHON) -m pytest tests/integration/chart $(PYTEST_ARGS)

dashboard: setup-python  ## Regenerate charts/dds/files/dashboard.json from hack/gen-dashboard.py
	$(PYTHON) hack/gen-dashboard.py

sim-tables: setup-python  ## Regenerate docs/simulation.md's tables from the simulator (hack/sim_tables.py; about five minutes)
	$(PYTHON) hack/sim_tables.py
.PHONY: sim-tables

chart-schema: setup-python  ## Regenerate values.schema.json's `settings` and `fabric.settings` from dds/config.py's Settings
	$(PYTHON) hack/gen-chart-schema.py

image-lock: setup-python  ## Re-lock the image's dependencies (requirements.lock: pyproject.toml's, pinned with their hashes; the Dockerfile installs only those)
	$(VENV)/bin/uv pip compile pyproject.toml --generate-hashes --python-version 3.11 --python-platform linux -o requirements.lock
.PHONY: image-lock

values-docs: setup-python  ## Regenerate docs/install.md's table of the chart's values from values.schema.json and values.yaml
	$(PYTHON) hack/gen-values-docs.py
.PHONY: values-docs

manifests: setup-python  ## Regenerate manifests/' DDS and cluster-autoscaler objects, RBAC and CRDs from charts/dds (hack/gen-manifests.py, with helm; hack/manifests-values.yaml)
	$(PYTHON) hack/gen-manifests.py
.PHONY: manifests
