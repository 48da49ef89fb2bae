"""Case 1: cluster-autoscaler asked a group for nodes (IncreaseSize) and DDS's planner decides how: GPUs attached to a
live node when that is enough, a node through the MachineSet otherwise; pods whose capacity is already on its way get
instances that wait for it instead of new work."""

from __future__ import annotations

import pytest

from dds.controller.ca_requests import ScaleUpRefused
from dds.fabric.base import OperationKind, OperationState
from dds.scaling.instances import InstanceKind
from tests.integration.controller.harness import ControllerHarness

pytestmark = pytest.mark.integration


def test_a_gpu_only_plan_attaches_to_a_live_node_and_its_instance_ends_with_the_attach(dds: ControllerHarness):
    group = dds.create_group("workers", replicas=1)
    [node] = dds.node_names()
    dds.create_pod("train-0", gpus=1)
    dds.wait_unschedulable("train-0")

    instances = dds.app.scale_up.increase(group, 1, "ca-request-1")

    assert [i.kind for i in instances] == [InstanceKind.GPU]
    [attach] = dds.operations()
    assert (attach.kind, attach.node, attach.requested, attach.key.startswith(instances[0].id)) == \
        (OperationKind.ATTACH, node, 1, True)
    assert dds.replicas("workers") == 1, "no node for a pod that one GPU serves"
    assert dds.events("Pod", "train-0", "AttachingGPU"), "the pod says what is being done for it"

    dds.run_once()  # the attach is still on its way: CA keeps seeing the instance as upcoming
    assert dds.app.tracker.get(instances[0].id) is not None

    dds.pass_attach_latency()

    assert dds.app.tracker.get(instances[0].id) is None, "the instance ends when its attach ends"
    assert dds.app.fabric.operation(attach.key).state == OperationState.SUCCEEDED
    assert dds.gpus_allocatable(node) == 1
    dds.wait_running("train-0", node)
    assert dds.events("Node", node, "AttachedGPU")


def test_each_gpu_instance_says_which_attach_it_stands_for_also_after_a_restart(dds: ControllerHarness):
    """CA's GPU instances each carry their share of the plan's attaches, and their reason names that share only: a
    reason repeating every attach of a large plan in every instance made the in-flight ConfigMap too large (1 MiB) to
    store at 5,000 nodes. Restarted, DDS lists the same instances with the same reasons."""
    group = dds.create_group("workers", replicas=2)
    for name in ("train-a", "train-b"):  # 40Gi each on 64Gi nodes: one per node, 2 GPUs each
        dds.create_pod(name, gpus=2, memory="40Gi")
        dds.wait_unschedulable(name)

    instances = dds.app.scale_up.increase(group, 2, "ca-request-1")

    assert [i.kind for i in instances] == [InstanceKind.GPU, InstanceKind.GPU]
    reasons = sorted(i.reason for i in instances)
    assert len(dds.operations()) == 2
    assert "train-a" in reasons[0] and "train-b" not in reasons[0], reasons
    assert "train-b" in reasons[1] and "train-a" not in reasons[1], reasons
    restarted = dds.restart_dds()
    assert sorted(r.reason for r in restarted.tracker.list(group.id)) == reasons


def test_a_pod_no_live_node_can_hold_even_with_gpus_gets_a_node_through_the_machineset(dds: ControllerHarness):
    group = dds.create_group("workers", replicas=1)
    [first] = dds.node_names()
    dds.create_pod("resident", memory="40Gi")
    dds.wait_running("resident", first)
    dds.create_pod("big", memory="40Gi")  # 64Gi nodes: 24Gi left on the live one, and GPUs do not add memory
    dds.wait_unschedulable("big")

    instances = dds.app.scale_up.increase(group, 1, "ca-request-1")

    assert [i.kind for i in instances] == [InstanceKind.NODE]
    assert dds.replicas("workers") == 2
    assert dds.operations() == [], "no GPU attach helps a pod short of memory"
    [adding] = dds.events("MachineSet", "workers", "AddingNode")
    assert "big" in adding.message

    dds.nodes.wait_ready_nodes(2)
    dds.run_once()
    assert dds.app.tracker.get(instances[0].id) is None, "the node instance ends once its node is Ready"
    [second] = [n for n in dds.node_names() if n != first]
    dds.wait_running("big", second)


def test_instances_for_capacity_already_on_its_way_wait_for_the_attach_in_flight(dds: ControllerHarness):
    group = dds.create_group("workers", replicas=1)
    [node] = dds.node_names()
    dds.create_pod("train-0", gpus=1)
    dds.wait_unschedulable("train-0")
    [first] = dds.app.scale_up.increase(group, 1, "ca-request-1")

    # CA asks again while the GPU is on its way (its loop saw the pod still pending): nothing new to do.
    [second] = dds.app.scale_up.increase(group, 1, "ca-request-2")

    assert second.kind == InstanceKind.GPU and "on its way" in second.reason
    assert len(dds.operations()) == 1, "one GPU for one pod"
    dds.run_once()
    assert dds.app.tracker.get(first.id) and dds.app.tracker.get(second.id), \
        "both stay upcoming while the attach runs (else CA would ask a third time)"

    dds.pass_attach_latency()

    assert dds.app.tracker.get(first.id) is None and dds.app.tracker.get(second.id) is None
    dds.wait_running("train-0", node)
    assert len(dds.operations()) == 1


def test_a_pod_that_fits_nowhere_does_not_turn_a_covered_scale_up_into_a_refusal(dds: ControllerHarness):
    # A refusal backs CA's group off for minutes; a pod no node of the group could ever hold is not what CA asked for.
    group = dds.create_group("workers", replicas=1)
    dds.create_pod("train-0", gpus=1)
    dds.create_pod("impossible", memory="500Gi")
    dds.wait_unschedulable("train-0")
    dds.wait_unschedulable("impossible")
    [first] = dds.app.scale_up.increase(group, 1, "ca-request-1")

    [second] = dds.app.scale_up.increase(group, 1, "ca-request-2")

    assert second.kind == InstanceKind.GPU and len(dds.operations()) == 1
    dds.pass_attach_latency()
    assert dds.app.tracker.get(first.id) is None and dds.app.tracker.get(second.id) is None


def test_a_scale_up_nothing_can_serve_is_refused_with_the_reasons(dds: ControllerHarness):
    group = dds.create_group("workers", replicas=1)
    dds.create_pod("impossible", memory="500Gi")
    dds.wait_unschedulable("impossible")

    with pytest.raises(ScaleUpRefused, match="impossible: fits nowhere"):
        dds.app.scale_up.increase(group, 1, "ca-request-1")
    assert dds.operations() == [] and dds.replicas("workers") == 1
