"""CXL memory hot-plug made visible on a kwok node: a pod asking for more memory than the node has stays Pending, the
simulated fabric attaches memory chunks, the visibility hook grows the node's memory capacity and allocatable, and the
real scheduler binds the pod; detaching the chunks gives the node its own memory back. The GPU count is untouched."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from dds.config import LatencySpec, PoolSpec, SimulatedFabricSettings
from dds.fabric.base import AttachRequest, DetachRequest, OperationState
from dds.fabric.simulated import SimulatedFabric
from dds.kube.nodes import gpu_capacity_hook
from dds.model.cxl import cxl_model
from tests.integration.nodes.harness import NodeGroupHarness, unschedulable, wait_for

pytestmark = pytest.mark.integration

GiB = 2**30
CHUNK = cxl_model(16 * GiB)


@pytest.fixture
def worker(control_plane: Any, namespace: str, dds_api: Any) -> Iterator[tuple[NodeGroupHarness, str, int]]:
    """One Ready kwok worker (64 GiB of its own) and the memory of its group."""
    harness = NodeGroupHarness(control_plane, namespace, dds_api=dds_api)
    group = harness.create_machineset("mem-workers")
    harness.provisioner.add_nodes(group, 1, key="boot")
    [node] = harness.wait_ready_nodes(1)
    yield harness, node, group.memory
    harness.close()


def memory_pod(name: str, node: str, memory: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                     "containers": [{"name": "big", "image": "example.com/big:1",
                                     "resources": {"requests": {"memory": memory}}}]}}


def shown(core: client.CoreV1Api, node: str) -> tuple[str, str, str]:
    status = core.read_node(node).status
    return (status.capacity["memory"], status.allocatable["memory"], (status.capacity or {}).get("nvidia.com/gpu", "0"))


def test_attached_chunks_grow_the_node_memory_and_the_memory_bound_pod_runs(
        worker: tuple[NodeGroupHarness, str, int]) -> None:
    h, node, own = worker
    core = h.core
    fabric = SimulatedFabric(
        SimulatedFabricSettings(pools=[PoolSpec(name="default", devices={"A30": 2, CHUNK: 8})],
                                attach_latency=LatencySpec(min=0.0, max=0.0),
                                detach_latency=LatencySpec(min=0.0, max=0.0)),
        clock=time.time, on_node_devices_changed=gpu_capacity_hook(h.dds_api, own_memory=lambda _: own))
    core.create_namespaced_pod(h.namespace, memory_pod("mem-0", node, "90Gi"))
    message = wait_for("mem-0 unschedulable", lambda: unschedulable(core, h.namespace, "mem-0"))
    assert "Insufficient memory" in message

    fabric.attach(AttachRequest(key="mem-attach", node=node, pool="default", model=CHUNK, count=2, reason="test"))
    wait_for("the attach to finish", lambda: (fabric.tick(), fabric.operation("mem-attach"))[1].state.done)
    assert fabric.operation("mem-attach").state == OperationState.SUCCEEDED
    grown = str(own + 32 * GiB)
    assert shown(core, node) == (grown, grown, "0")
    wait_for("mem-0 Running on the node", lambda: (
        (pod := core.read_namespaced_pod("mem-0", h.namespace)).spec.node_name == node
        and pod.status.phase == "Running"))

    core.delete_namespaced_pod("mem-0", h.namespace, grace_period_seconds=0)
    chunks = tuple(d.id for d in fabric.devices(node))
    fabric.detach(DetachRequest(key="mem-detach", node=node, device_ids=chunks, reason="test"))
    wait_for("the detach to finish", lambda: (fabric.tick(), fabric.operation("mem-detach"))[1].state.done)
    assert shown(core, node) == (str(own), str(own), "0")
    fabric.close()
