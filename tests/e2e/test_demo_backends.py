"""The talk's demo through the other fabric backends (issue 6 part 7, "Done when"): the same scenario and the same
assertions as tests/e2e/test_demo.py, with DDS driving

- `redfish`: DDS composes GPU resource blocks into ComputerSystems of the Redfish emulator on loopback
  (harness/redfish_emulator.py). The servers' side — a ComputerSystem per machine, and the device plugin publishing
  the GPUs composed into it — is played by harness/redfish_hosts.py, reading the emulator, never DDS.

The `composability-request` backend runs the demo through CoHDI's real CDI operator in tests/e2e/test_cdi_operator.py
(DRA mode, GPUs claimed from NVIDIA's driver: the operator's device-plugin mode cannot attach at its pinned commit).

One stack per backend (module-scoped, parametrized): a run of ~2 minutes each.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

import tests.e2e.test_demo as reference
from harness.demo import Demo, DemoOptions, DemoResult
from harness.redfish_emulator import EmulatorConfig, RedfishEmulator
from harness.redfish_hosts import RedfishHosts
from harness.stack import StackOptions

pytestmark = pytest.mark.e2e

BACKENDS = ("redfish",)
POOL_SIZE = 8


def _options(workdir, backend: str, dds_settings: dict) -> DemoOptions:
    return DemoOptions(workdir=workdir, step_timeout_seconds=180.0, echo=True, stack=StackOptions(
        attach_latency=reference.ATTACH_LATENCY, detach_latency=(1.0, 2.0), node_provisioning_seconds=12.0,
        gpu_idle_cooldown_seconds=8.0, node_idle_cooldown_seconds=10.0, pool_size=POOL_SIZE,
        dds_settings={"fabric": backend, **dds_settings}))


def _start_redfish_hosts(demo: Demo, emulator: RedfishEmulator, cleanup: ExitStack) -> None:
    hosts = RedfishHosts(demo.stack.control_plane.api_client(), emulator).start()
    cleanup.callback(hosts.stop)
    demo.step(f"Redfish emulator on {emulator.url}; a ComputerSystem per machine, and the device plugin's part "
              f"publishes the GPUs composed into each")


def _run(backend: str, workdir) -> DemoResult:
    with ExitStack() as cleanup:
        assert backend == "redfish", backend
        # Composition takes as long as the simulated fabric's attach (fixed: the emulator has one latency).
        emulator = RedfishEmulator(EmulatorConfig(systems=[], gpus={"default": {"A30": POOL_SIZE}},
                                                  composition_latency_s=sum(reference.ATTACH_LATENCY) / 2,
                                                  decomposition_latency_s=1.5))
        settings = {"redfish": {"endpoint": emulator.start()}}
        cleanup.callback(emulator.stop)
        demo = Demo(_options(workdir, backend, settings), sys.stdout)
        cleanup.callback(demo.close)
        demo.start()
        # Right after the stack starts: the workers' systems must exist before DDS composes their boot-time GPUs,
        # which it does once they are Ready (node_provisioning_seconds later).
        _start_redfish_hosts(demo, emulator, cleanup)
        return demo.run()


@pytest.fixture(scope="module", params=BACKENDS)
def demo(request, tmp_path_factory) -> Iterator[DemoResult]:
    yield _run(request.param, tmp_path_factory.mktemp(f"demo-{request.param}"))


def test_the_gpu_path_attaches_and_adds_no_node(demo: DemoResult):
    reference.test_the_gpu_path_attaches_and_adds_no_node(demo)


def test_gpu_path_time_is_the_fabric_latency_plus_bounded_overhead(demo: DemoResult):
    reference.test_gpu_path_time_is_the_fabric_latency_plus_bounded_overhead(demo)


def test_memory_heavy_pods_get_exactly_one_new_node(demo: DemoResult):
    reference.test_memory_heavy_pods_get_exactly_one_new_node(demo)


def test_scale_down_detaches_then_removes_the_empty_node(demo: DemoResult):
    reference.test_scale_down_detaches_then_removes_the_empty_node(demo)


def test_gpu_counts_add_up_in_metrics(demo: DemoResult):
    reference.test_gpu_counts_add_up_in_metrics(demo)


def test_the_configured_backend_did_the_work(demo: DemoResult, request):
    # The attach latency histogram is labelled by the backend that reported the attaches.
    backend = request.node.callspec.params["demo"]
    counts = {k: v for k, v in demo.metrics.items() if k.startswith("dds_attach_duration_seconds_count{")}
    assert counts.get(f'dds_attach_duration_seconds_count{{backend="{backend}"}}', 0) >= 2, counts
    assert set(counts) == {f'dds_attach_duration_seconds_count{{backend="{backend}"}}'}, counts
