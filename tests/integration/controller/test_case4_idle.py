"""Case 4, DDS's own loop: GPUs idle for the group's cooldown are detached, GPUs in use never (force-detach is the
operator's explicit exception); an empty node of a spec-fixed group (CA never sees those) is removed after its
cooldown while the group stays at or above its min size; a pod that lands between the cordon and the removal keeps
the node."""

from __future__ import annotations

from typing import Any

import pytest

from dds.controller.removals import REMOVAL_TAINT
from dds.kube import nodes
from dds.kube.nodes import add_taint
from dds.fabric.base import OperationKind
from tests.integration.controller.harness import ControllerHarness

pytestmark = pytest.mark.integration

COOLDOWN = 60.0  # the groups' gpu-idle-cooldown and node-idle-cooldown (harness default "60s")


def test_idle_gpus_go_after_the_cooldown_and_the_gpu_in_use_stays(dds: ControllerHarness):
    dds.create_group("workers", replicas=1, min_size=1)
    [node] = dds.node_names()
    dds.attach_gpus(node, 2)
    dds.create_pod("train-0", gpus=1)
    dds.wait_running("train-0", node)

    dds.run_once()
    dds.clock.advance(COOLDOWN - 10)
    dds.run_once()
    assert dds.operations() == [], "idle for less than the cooldown"

    dds.clock.advance(11)
    dds.run_once()

    [detach] = dds.operations()
    assert (detach.kind, detach.node, detach.requested) == (OperationKind.DETACH, node, 1)
    assert dds.events("Node", node, "DetachingGPU")
    dds.pass_detach_latency()
    assert dds.gpus_allocatable(node) == 1
    for _ in range(3):  # cooldown after cooldown, the GPU in use stays
        dds.clock.advance(COOLDOWN + 1)
        dds.run_once()
    assert len(dds.operations()) == 1 and len(dds.devices(node)) == 1
    assert dds.pod_node("train-0") == node


@pytest.mark.parametrize("force_detach", [False, True], ids=["force-detach-off", "force-detach-on"])
def test_a_gpu_held_by_a_daemonset_pod_is_detached_only_with_force_detach(dds: ControllerHarness, force_detach: bool):
    # The node holds no work (a DaemonSet pod is not work) but that pod uses the node's GPU.
    dds.create_group("workers", replicas=1, force_detach=force_detach)
    [node] = dds.node_names()
    dds.attach_gpus(node, 1)
    dds.create_pod("gpu-agent", gpus=1, owner=dds.daemonset_owner("gpu-agent"))
    dds.wait_running("gpu-agent", node)

    dds.run_once()
    dds.clock.advance(COOLDOWN + 1)
    dds.run_once()

    if not force_detach:
        assert dds.operations() == []
        dds.clock.advance(COOLDOWN + 1)
        dds.run_once()
        assert dds.operations() == [] and len(dds.devices(node)) == 1
        assert dds.replicas("workers") == 1
        return
    [detach] = dds.operations()
    assert (detach.kind, detach.node) == (OperationKind.DETACH, node)
    [detaching] = dds.events("Node", node, "DetachingGPU")
    assert "force-detach is on" in detaching.message
    dds.pass_detach_latency()
    assert dds.devices(node) == (), [(op.key, op.kind) for op in dds.operations()]
    assert dds.machine_removed(node) and dds.replicas("workers") == 0


def test_an_empty_node_goes_after_its_cooldown_and_the_group_keeps_its_min_size(dds: ControllerHarness):
    dds.create_group("workers", replicas=2, min_size=1)
    first, second = dds.node_names()

    dds.run_once()
    dds.clock.advance(COOLDOWN - 10)
    dds.run_once()
    assert dds.replicas("workers") == 2, "empty for less than the cooldown"

    dds.clock.advance(11)
    dds.run_once()

    assert dds.replicas("workers") == 1
    assert dds.machine_removed(first) and not dds.machine_removed(second)
    assert dds.events("Node", first, "RemovingNode")
    dds.nodes.wait_ready_nodes(1)
    for _ in range(3):  # the last node is the group's min size
        dds.clock.advance(COOLDOWN + 1)
        dds.run_once()
    assert dds.replicas("workers") == 1 and dds.node_names() == [second]


def test_a_pod_arriving_between_cordon_and_removal_keeps_the_node(dds: ControllerHarness, monkeypatch):
    """Right after DDS cordons the node a pod is bound to it: the pod the scheduler had placed there a moment before
    the taint arrived. The race the recheck exists for, made certain."""
    dds.create_group("workers", replicas=1)
    [node] = dds.node_names()

    def cordon_then_a_pod_arrives(api: Any, name: str, key: str, value: str, effect: str) -> None:
        add_taint(api, name, key, value, effect)
        if key == REMOVAL_TAINT:
            dds.create_pod("late", bind_to=name)

    monkeypatch.setattr(nodes, "add_taint", cordon_then_a_pod_arrives)  # the one node write every taint goes through
    dds.run_once()
    dds.clock.advance(COOLDOWN + 1)

    dds.run_once()

    assert dds.pod_node("late") == node
    assert dds.replicas("workers") == 1 and not dds.machine_removed(node)
    assert REMOVAL_TAINT not in dds.taint_keys(node), "the kept node takes pods again"
    [cancelled] = dds.events("Node", node, "RemovalCancelled")
    assert "late" in cancelled.message
    dds.wait_running("late", node)
