"""Case 3, observed mode: cluster-autoscaler found a node unneeded, tainted it ToBeDeletedByClusterAutoscaler and calls
DeleteNodes; DDS's planner decides between releasing only the node's idle GPUs (its work cannot move: the node stays,
CA's taint is lifted) and removing the node (its GPUs go back to the pool first, then its Machine). A placeholder of an
instance CA gave up on names no node: nothing is planned for it."""

from __future__ import annotations

import pytest

from dds.fabric.base import OperationKind
from dds.scaling.requests import Placeholder
from tests.integration.controller.harness import CA_TAINT, ControllerHarness

pytestmark = pytest.mark.integration


def test_a_node_whose_work_cannot_move_stays_and_only_its_idle_gpus_are_released(dds: ControllerHarness):
    group = dds.create_group("workers", replicas=1, mode="observed")
    [node] = dds.node_names()
    dds.attach_gpus(node, 2)
    dds.create_pod("notebook", gpus=1)  # a bare pod: nothing would recreate it elsewhere
    dds.wait_running("notebook", node)
    dds.add_taint(node, CA_TAINT)

    dds.app.scale_down.delete_nodes(group, [dds.live_node(node, group)], "ca-delete-1")

    [detach] = dds.operations()
    assert (detach.kind, detach.node, detach.requested) == (OperationKind.DETACH, node, 1)
    assert CA_TAINT not in dds.taint_keys(node), "the node takes pods again"
    [kept] = dds.events("Node", node, "KeptNode")
    assert "notebook" in kept.message and "cannot move" in kept.message
    dds.pass_detach_latency()
    assert dds.gpus_allocatable(node) == 1
    assert dds.pod_node("notebook") == node
    dds.run_once()
    assert dds.replicas("workers") == 1 and not dds.machine_removed(node)


def test_an_empty_node_gives_its_gpus_back_first_then_its_machine_goes(dds: ControllerHarness):
    group = dds.create_group("workers", replicas=2, min_size=1, mode="observed")
    node, other = dds.node_names()
    dds.attach_gpus(node, 1)
    dds.add_taint(node, CA_TAINT)

    dds.app.scale_down.delete_nodes(group, [dds.live_node(node, group)], "ca-delete-1")

    [detach] = dds.operations()
    assert (detach.kind, detach.node) == (OperationKind.DETACH, node)
    dds.run_once()
    assert not dds.machine_removed(node), "the node stays until its GPU is back in the pool"

    dds.pass_detach_latency()

    assert dds.devices(node) == ()
    assert dds.machine_removed(node)
    assert dds.replicas("workers") == 1
    assert dds.events("Node", node, "RemovingNode")
    dds.wait_nodes_gone(node)
    assert dds.node_names() == [other]
    assert dds.app.fabric.free_count("default", "A30") == 4


def test_a_placeholder_plans_nothing(dds: ControllerHarness):
    group = dds.create_group("workers", replicas=1, mode="observed")
    [node] = dds.node_names()
    dds.attach_gpus(node, 1)
    placeholder = Placeholder(name=f"dds://{group.id}/gpu/0123456789", provider_id=f"dds://{group.id}/gpu/0123456789",
                              reason="create-error")

    dds.app.scale_down.delete_nodes(group, [placeholder], "ca-delete-1")
    dds.run_once()

    assert dds.operations() == []
    assert dds.replicas("workers") == 1 and len(dds.devices(node)) == 1


def test_a_node_whose_daemon_holds_a_gpu_stays_and_only_its_idle_gpus_are_released(dds: ControllerHarness):
    # CA calls the node empty (DaemonSet pods are not work) and does not drain its daemon: the GPU it uses would
    # never come back, so removing the node would wait forever. Force-detach is off.
    group = dds.create_group("workers", replicas=2, min_size=1, mode="observed")
    node, _ = dds.node_names()
    dds.attach_gpus(node, 3)
    dds.create_pod("gpu-agent", gpus=1, owner=dds.daemonset_owner("gpu-agent"), node=node)
    dds.wait_running("gpu-agent", node)
    dds.add_taint(node, CA_TAINT)

    dds.app.scale_down.delete_nodes(group, [dds.live_node(node, group)], "ca-delete-1")

    [detach] = dds.operations()
    assert (detach.kind, detach.node, detach.requested) == (OperationKind.DETACH, node, 2)
    assert CA_TAINT not in dds.taint_keys(node)
    [kept] = dds.events("Node", node, "KeptNode")
    assert "gpu-agent" in kept.message and "force-detach is off" in kept.message
    dds.pass_detach_latency()
    dds.run_once()
    assert dds.gpus_allocatable(node) == 1 and not dds.machine_removed(node)
