"""CXL memory through the Redfish backend with the real cluster-autoscaler and kube-scheduler: DDS binds pooled memory
of DMTF's `public-cxl` mockup (served by harness/redfish_emulator.py) to a worker's ComputerSystem with a CXL fabric
Connection, the worker's memory follows the binding (harness/redfish_hosts.py, the servers' side, reading the emulator
only), the memory-bound pod runs there and no node is added; once the pod is gone the idle chunks' Connection is
deleted after the cooldown and the worker is back at its own memory.

Two workers of 64 GiB with no GPUs, each with a 48 GiB pod (16 GiB free); the group takes up to 64 GiB of CXL memory
per node in 16 GiB chunks from zone 3 of the mockup's CXL fabric, which holds 8 of them beside DMTF's own; a 5 s idle
cooldown. In file order.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import replace

import pytest

from dds.model.cxl import cxl_model
from dds.model.groups import ANN_CAPACITY_PREFIX, ANN_CXL_MEMORY_CHUNK, ANN_FABRIC_POOL, ANN_MAX_CXL_MEMORY
from harness.redfish_emulator import EmulatorConfig, RedfishEmulator, mockup_path
from harness.redfish_hosts import RedfishHosts
from harness.stack import Stack, StackOptions, group_of, is_ready, machineset, pod, start_stack
from tests.e2e.cluster_facts import dds_events, describe, machineset_replicas, pods_running

pytestmark = pytest.mark.e2e

TIMEOUT = 60.0
COOLDOWN = 5.0
GiB, MiB = 2**30, 2**20
# The zone of DMTF's pooled Type 3 device in public-cxl. It also holds a 16 GiB chunk of the mockup host's own Type 3
# device (Chassis/CXLType3, CXL-System's local memory): DDS must never take it for pool memory.
ZONE, CHUNK_MIB, CHUNKS = "3", 16384, 8
MODEL = cxl_model(CHUNK_MIB * MiB)


def memory_by_node(stack: Stack) -> dict[str, int]:
    return {n.metadata.name: int(n.status.allocatable["memory"]) // GiB for n in stack.nodes()}


def node_of(stack: Stack, name: str) -> str:
    return next(p.spec.node_name for p in stack.pods() if p.metadata.name == name)


def shown(stack: Stack, emulator: RedfishEmulator) -> str:
    return (f"{describe(stack)} | memory GiB: {memory_by_node(stack)} | bound MiB: {emulator.bound_memory_mib()} | "
            f"DDS: {[e.line() for e in dds_events(stack)][-8:]}")


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[tuple[Stack, RedfishEmulator]]:
    with ExitStack() as cleanup:
        emulator = RedfishEmulator(EmulatorConfig(systems=[], gpus={}, mockup=mockup_path("public-cxl"),
                                                  memory={ZONE: {CHUNK_MIB: CHUNKS}}, composition_latency_s=2.0,
                                                  decomposition_latency_s=1.0))
        url = emulator.start()
        cleanup.callback(emulator.stop)
        options = StackOptions(
            node_provisioning_seconds=8.0, gpu_idle_cooldown_seconds=COOLDOWN, node_idle_cooldown_seconds=600.0,
            machineset_annotations={ANN_MAX_CXL_MEMORY: "64Gi", ANN_CXL_MEMORY_CHUNK: "16Gi", ANN_FABRIC_POOL: ZONE,
                                    ANN_CAPACITY_PREFIX + "gpu-count": "0"},
            dds_settings={"fabric": "redfish", "redfish": {"endpoint": url},
                          "pools": [{"name": ZONE, "devices": {MODEL: CHUNKS}}]})
        own = group_of(machineset(options)).memory  # the servers' own memory: the MachineSet's
        # The servers' side, before the MachineSet exists: a ComputerSystem per machine, and each node's memory as a
        # kubelet following hot-added memory would report it.
        options = replace(options, fabric_side=lambda stack: RedfishHosts(
            stack.control_plane.api_client(), emulator, own_memory=lambda node: own))
        stack = cleanup.enter_context(start_stack(tmp_path_factory.mktemp("cxl-memory-redfish"), options))
        stack.wait_for("two Ready workers", lambda: len([n for n in stack.nodes() if is_ready(n)]) == 2, TIMEOUT,
                       lambda: shown(stack, emulator))
        for name in ("busy-0", "busy-1"):  # 48 of 64 GiB each: one per worker, 16 GiB left on each
            stack.core.create_namespaced_pod("demo", pod(name, memory_gib=48))
        stack.wait_for("busy pods Running", lambda: pods_running(stack, ["busy-0", "busy-1"]), TIMEOUT,
                       lambda: shown(stack, emulator))
        yield stack, emulator


def test_a_memory_bound_pod_is_served_by_a_cxl_connection_and_no_node_is_added(world):
    stack, emulator = world
    stack.core.create_namespaced_pod("demo", pod("mem-0", memory_gib=24))
    stack.wait_for("mem-0 Running", lambda: pods_running(stack, ["mem-0"]), TIMEOUT, lambda: shown(stack, emulator))
    node = node_of(stack, "mem-0")
    # 8 GiB short on a worker: one 16 GiB chunk, bound by a Connection to the worker's ComputerSystem.
    assert emulator.bound_memory_mib()[node] == CHUNK_MIB, shown(stack, emulator)
    assert memory_by_node(stack)[node] == 64 + 16, shown(stack, emulator)
    assert machineset_replicas(stack) == 2 and len(stack.nodes()) == 2, shown(stack, emulator)
    assert not [e for e in dds_events(stack) if e.reason in ("AttachFailed", "RetryingAttach")], shown(stack, emulator)
    assert [e for e in dds_events(stack) if e.involved == "pod/mem-0" and e.reason == "AttachingMemory"
            and f"1 CXL memory chunk of 16 GiB (16 GiB) from pool {ZONE}" in e.message], shown(stack, emulator)


def test_the_idle_chunk_is_disconnected_after_the_cooldown(world):
    stack, emulator = world
    node = node_of(stack, "mem-0")
    stack.core.delete_namespaced_pod("mem-0", "demo", grace_period_seconds=0)
    stack.wait_for("the chunk's Connection deleted and the worker back at its own memory",
                   lambda: emulator.bound_memory_mib()[node] == 0 and memory_by_node(stack)[node] == 64, TIMEOUT,
                   lambda: shown(stack, emulator))
    stack.wait_for("DDS's DetachedMemory Event", lambda: [
        e for e in dds_events(stack) if e.involved == f"node/{node}" and e.reason == "DetachedMemory"], 10.0,
        lambda: shown(stack, emulator))
    assert machineset_replicas(stack) == 2 and pods_running(stack, ["busy-0", "busy-1"]), shown(stack, emulator)
