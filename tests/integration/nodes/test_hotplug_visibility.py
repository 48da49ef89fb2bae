"""Hot-plug made visible: a pod asking for a GPU stays Pending on a kwok node with 0 GPUs, and the real scheduler binds
it (kwok runs it) once the node's capacity shows the GPU — written directly, or by the simulated fabric's visibility
hook when a device attaches."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from dds.config import LatencySpec, PoolSpec, SimulatedFabricSettings
from dds.fabric.base import AttachRequest, DetachRequest, OperationState
from dds.fabric.simulated import SimulatedFabric
from dds.kube.nodes import NodeNotFound, gpu_capacity_hook, set_gpu_capacity
from tests.integration.nodes.harness import NodeGroupHarness, gpu_pod, unschedulable, wait_for

pytestmark = pytest.mark.integration

GPU = "nvidia.com/gpu"


@pytest.fixture
def worker(control_plane: Any, namespace: str, dds_api: Any) -> Iterator[tuple[NodeGroupHarness, str]]:
    """One Ready kwok worker of a DDS group, booted with 0 GPUs."""
    harness = NodeGroupHarness(control_plane, namespace, dds_api=dds_api)
    group = harness.create_machineset("gpu-workers")
    harness.provisioner.add_nodes(group, 1, key="boot")
    [node] = harness.wait_ready_nodes(1)
    yield harness, node
    harness.close()


def running_on(core: client.CoreV1Api, namespace: str, name: str, node: str) -> bool:
    pod = core.read_namespaced_pod(name, namespace)
    return pod.spec.node_name == node and pod.status.phase == "Running"


def gpus(core: client.CoreV1Api, node: str) -> tuple[str, str]:
    status = core.read_node(node).status
    return (status.capacity or {}).get(GPU, ""), (status.allocatable or {}).get(GPU, "")


def test_a_gpu_pod_waits_until_the_node_shows_the_gpu_then_runs(worker: tuple[NodeGroupHarness, str]) -> None:
    h, node = worker
    core = h.core
    core.create_namespaced_pod(h.namespace, gpu_pod("train-0", node))
    message = wait_for("the scheduler to find train-0 unschedulable",
                       lambda: unschedulable(core, h.namespace, "train-0"))
    assert GPU in message
    assert core.read_namespaced_pod("train-0", h.namespace).spec.node_name is None

    set_gpu_capacity(h.dds_api, node, GPU, 1)
    set_gpu_capacity(h.dds_api, node, GPU, 1)  # idempotent

    assert gpus(core, node) == ("1", "1")
    wait_for("train-0 bound to the node and Running", lambda: running_on(core, h.namespace, "train-0", node))
    time.sleep(1.0)  # a kwok heartbeat later the count is still there
    assert gpus(core, node) == ("1", "1")


def test_the_fabric_hook_makes_an_attached_gpu_visible_and_a_detached_one_go(
        worker: tuple[NodeGroupHarness, str]) -> None:
    h, node = worker
    core = h.core
    fabric = SimulatedFabric(
        SimulatedFabricSettings(pools=[PoolSpec(name="default", devices={"A30": 2})],
                                attach_latency=LatencySpec(min=0.0, max=0.0),
                                detach_latency=LatencySpec(min=0.0, max=0.0)),
        clock=time.time, on_node_devices_changed=gpu_capacity_hook(h.dds_api))
    core.create_namespaced_pod(h.namespace, gpu_pod("train-0", node))
    wait_for("train-0 unschedulable", lambda: unschedulable(core, h.namespace, "train-0"))

    fabric.attach(AttachRequest(key="attach-1", node=node, pool="default", model="A30", count=1, reason="test"))
    wait_for("the attach to finish", lambda: (fabric.tick(), fabric.operation("attach-1"))[1].state.done)
    assert fabric.operation("attach-1").state == OperationState.SUCCEEDED
    assert gpus(core, node) == ("1", "1")
    wait_for("train-0 Running on the node", lambda: running_on(core, h.namespace, "train-0", node))

    [device] = fabric.devices(node)
    fabric.detach(DetachRequest(key="detach-1", node=node, device_ids=(device.id,), force=True, reason="test"))
    wait_for("the detach to finish", lambda: (fabric.tick(), fabric.operation("detach-1"))[1].state.done)
    assert gpus(core, node) == ("0", "0")
    fabric.close()


def test_a_missing_node_is_a_clear_error(dds_api: Any) -> None:
    api = dds_api
    with pytest.raises(NodeNotFound, match="node no-such-node: setting nvidia.com/gpu .* to 2: the Node does not"):
        set_gpu_capacity(api, "no-such-node", GPU, 2)
    hook = gpu_capacity_hook(api)
    hook("no-such-node", {})  # gone and holding nothing: nothing to show
    with pytest.raises(NodeNotFound):
        hook("no-such-node", {"A30": 1})  # devices on a node that is gone: the fabric retries, and says so
