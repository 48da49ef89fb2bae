"""Case 2 through the fast path: a GPU pod CA cannot serve (its group is at max size, so CA never asks) waits out the
pending debounce (long here, 30 s, to watch both sides of it), then DDS's own loop attaches; within the debounce DDS
does nothing. A pod CA is already serving through IncreaseSize is planned once."""

from __future__ import annotations

import pytest

from dds.fabric.base import OperationKind
from tests.integration.controller.harness import DEBOUNCE_SECONDS, ControllerHarness

pytestmark = pytest.mark.integration


def test_a_pod_pending_past_the_debounce_while_the_group_is_at_max_gets_a_gpu_from_the_loop(dds: ControllerHarness):
    dds.create_group("workers", replicas=1, max_size=1)  # at max: CA cannot add a node
    [node] = dds.node_names()
    dds.create_pod("train-0", gpus=1)
    dds.wait_unschedulable("train-0")

    dds.run_once()
    dds.clock.advance(DEBOUNCE_SECONDS - 5)
    dds.run_once()
    assert dds.operations() == [], "within the debounce DDS does nothing"

    dds.clock.advance(10)
    dds.run_once()

    [attach] = dds.operations()
    assert (attach.kind, attach.node, attach.requested) == (OperationKind.ATTACH, node, 1)
    assert attach.key.startswith("fast-path/")
    assert dds.events("Pod", "train-0", "AttachingGPU")
    dds.pass_attach_latency()
    dds.wait_running("train-0", node)
    dds.run_once()
    assert len(dds.operations()) == 1


def test_a_pod_ca_is_already_serving_is_not_planned_again_by_the_loop(dds: ControllerHarness):
    group = dds.create_group("workers", replicas=1)
    [node] = dds.node_names()
    dds.create_pod("train-0", gpus=1)
    dds.wait_unschedulable("train-0")
    [instance] = dds.app.scale_up.increase(group, 1, "ca-request-1")

    dds.clock.advance(DEBOUNCE_SECONDS + 1)  # past the debounce, the attach still on its way
    assert dds.app.fabric.operation(dds.operations()[0].key).state.done is False
    dds.run_once()
    dds.run_once()

    [attach] = dds.operations()
    assert attach.key.startswith(instance.id), "only CA's attach: the loop found the pod covered"

    dds.pass_attach_latency()
    dds.wait_running("train-0", node)
    assert dds.app.tracker.get(instance.id) is None
    dds.run_once()
    assert len(dds.operations()) == 1
