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


def test_ca_acting_while_the_loop_decides_is_seen_before_the_loop_acts(dds: ControllerHarness, monkeypatch):
    """The loop plans outside the controller's lock; CA's IncreaseSize may start its attach in that window. The loop's
    plan then predates that attach, so it plans again before acting, and the pod is served once."""
    import threading

    group = dds.create_group("workers", replicas=1)
    dds.create_pod("train-0", gpus=1)
    dds.wait_unschedulable("train-0")
    dds.clock.advance(DEBOUNCE_SECONDS + 1)  # the loop's fast path would attach for the pod now
    observer = dds.controller.observer
    observe = observer.observe
    instances = []

    def observe_then_ca_scales_up():
        observation = observe()
        if not instances:  # once: CA's call runs to its end while the loop is still deciding
            instances.append(None)
            ca = threading.Thread(target=lambda: instances.extend(dds.app.scale_up.increase(group, 1, "ca-1")))
            ca.start()
            ca.join()
        return observation

    monkeypatch.setattr(observer, "observe", observe_then_ca_scales_up)
    dds.run_once()

    [instance] = instances[1:]
    [attach] = dds.operations()
    assert attach.key.startswith(instance.id), "the loop planned again and found the pod covered by CA's attach"


def test_the_loop_acting_while_ca_decides_is_seen_before_ca_acts(dds: ControllerHarness, monkeypatch):
    """The other way round: CA's IncreaseSize plans outside the lock while the loop's fast path attaches for the same
    pod; CA's plan then predates that attach, so it plans again and finds the pod covered."""
    import threading

    group = dds.create_group("workers", replicas=1)
    dds.create_pod("train-0", gpus=1)
    dds.wait_unschedulable("train-0")
    dds.clock.advance(DEBOUNCE_SECONDS + 1)
    observer = dds.controller.observer
    observe = observer.observe
    passes = []

    def observe_then_the_loop_runs():
        observation = observe()
        if not passes:  # once, on CA's first look: a whole loop pass runs before CA acts
            passes.append(None)
            monkeypatch.setattr(observer, "observe", observe)
            loop = threading.Thread(target=dds.run_once)
            loop.start()
            loop.join()
        return observation

    monkeypatch.setattr(observer, "observe", observe_then_the_loop_runs)
    # The pass runs past its step boundaries, where it would wait for CA's call under way (which waits for it here).
    monkeypatch.setattr(dds.controller.calls_first, "wait_for_calls", lambda: 0.0)
    instances = dds.app.scale_up.increase(group, 1, "ca-1")

    [attach] = dds.operations()
    assert attach.key.startswith("fast-path/"), "CA planned again and found the pod covered by the loop's attach"
    assert [i.kind.value for i in instances] == ["gpu"]
