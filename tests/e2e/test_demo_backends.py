"""The talk's demo through the two other fabric backends (issue 6 part 7, "Done when"): the same scenario and the same
assertions as tests/e2e/test_demo.py, with DDS driving

- `composability-request`: DDS writes ComposabilityRequests on the real apiserver; the stand-in CDI operator
  (harness/cro_operator.py) runs in this process and reconciles them against a simulated CDI manager. As the real
  operator makes an attached GPU visible (it restarts the device plugin, which publishes the node's GPUs), the
  stand-in's manager publishes each node's online devices as its GPU capacity (dds.kube.nodes.gpu_capacity_hook).
- `redfish`: DDS composes GPU resource blocks into ComputerSystems of the Redfish emulator on loopback
  (harness/redfish_emulator.py). The servers' side — a ComputerSystem per machine, and the device plugin publishing
  the GPUs composed into it — is played by harness/redfish_hosts.py, reading the emulator, never DDS.

One stack per backend (module-scoped, parametrized): two runs of ~2 minutes each.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

import tests.e2e.test_demo as reference
from dds.config import LatencySpec, PoolSpec, SimulatedFabricSettings
from harness.demo import Demo, DemoOptions, DemoResult
from dds.fabric.simulated import SimulatedFabric
from dds.kube.nodes import gpu_capacity_hook
from harness.cro_operator import StandInOperator
from harness.redfish_emulator import EmulatorConfig, RedfishEmulator
from harness.redfish_hosts import RedfishHosts
from harness.stack import StackOptions

pytestmark = pytest.mark.e2e

BACKENDS = ("composability-request", "redfish")
POOL_SIZE = 8


def _options(workdir, backend: str, dds_settings: dict) -> DemoOptions:
    return DemoOptions(workdir=workdir, step_timeout_seconds=180.0, echo=True, stack=StackOptions(
        attach_latency=reference.ATTACH_LATENCY, detach_latency=(1.0, 2.0), node_provisioning_seconds=12.0,
        gpu_idle_cooldown_seconds=8.0, node_idle_cooldown_seconds=10.0, pool_size=POOL_SIZE,
        dds_settings={"fabric": backend, **dds_settings}))


def _start_cro_operator(demo: Demo, cleanup: ExitStack) -> None:
    options = demo.options.stack
    manager = SimulatedFabric(
        SimulatedFabricSettings(pools=[PoolSpec(name="default", devices={"A30": options.pool_size})],
                                attach_latency=LatencySpec(min=min(options.attach_latency),
                                                           max=max(options.attach_latency)),
                                detach_latency=LatencySpec(min=min(options.detach_latency),
                                                           max=max(options.detach_latency))),
        clock=time.time, on_node_devices_changed=gpu_capacity_hook(demo.stack.control_plane.api_client()),
        name="cdi-manager")
    operator = StandInOperator(demo.stack.control_plane.api_client(), manager, poll_interval_s=0.2).start()
    cleanup.callback(operator.stop)
    demo.step("stand-in CDI operator running (reconciles ComposabilityRequests; the device plugin's part publishes "
              "each node's online GPUs)")


def _start_redfish_hosts(demo: Demo, emulator: RedfishEmulator, cleanup: ExitStack) -> None:
    hosts = RedfishHosts(demo.stack.control_plane.api_client(), emulator).start()
    cleanup.callback(hosts.stop)
    demo.step(f"Redfish emulator on {emulator.url}; a ComputerSystem per machine, and the device plugin's part "
              f"publishes the GPUs composed into each")


def _run(backend: str, workdir) -> DemoResult:
    with ExitStack() as cleanup:
        settings: dict = {}
        emulator = None
        if backend == "redfish":
            # Composition takes as long as the simulated fabric's attach (fixed: the emulator has one latency).
            emulator = RedfishEmulator(EmulatorConfig(systems=[], gpus={"default": {"A30": POOL_SIZE}},
                                                      composition_latency_s=sum(reference.ATTACH_LATENCY) / 2,
                                                      decomposition_latency_s=1.5))
            settings["redfish"] = {"endpoint": emulator.start()}
            cleanup.callback(emulator.stop)
        demo = Demo(_options(workdir, backend, settings), sys.stdout)
        cleanup.callback(demo.close)
        demo.start()
        # Right after the stack starts: the workers' systems must exist (and the operator run) before DDS composes
        # their boot-time GPUs, which it does once they are Ready (node_provisioning_seconds later).
        if emulator is not None:
            _start_redfish_hosts(demo, emulator, cleanup)
        else:
            _start_cro_operator(demo, cleanup)
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
