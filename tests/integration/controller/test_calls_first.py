"""CA's calls first: a loop pass that starts while one of cluster-autoscaler's calls is deciding waits at its step
boundary until the call is done (the call carries a deadline, the loop none), and counts that wait apart from its own
duration. Then it decides on a snapshot that includes what the call started."""

from __future__ import annotations

import threading

import pytest

from dds import metrics
from tests.integration.controller.harness import ControllerHarness

pytestmark = pytest.mark.integration


def test_a_pass_waits_for_the_call_under_way_then_sees_what_it_started(dds: ControllerHarness, monkeypatch) -> None:
    group = dds.create_group("workers", replicas=1)
    dds.create_pod("train-0", gpus=1)
    dds.wait_unschedulable("train-0")
    observer = dds.controller.observer
    observe = observer.observe
    call_observing, release_call = threading.Event(), threading.Event()
    loop_observed: list[int] = []  # attaches in flight when the loop's pass first observed

    def observe_in_order():
        if threading.current_thread().name == "ca-call":
            call_observing.set()
            release_call.wait(30)  # the call is deciding
        else:
            loop_observed.append(len(dds.operations()))
        return observe()

    monkeypatch.setattr(observer, "observe", observe_in_order)
    waited_before = metrics.LOOP_WAITED._value.get()
    instances: list = []
    call = threading.Thread(target=lambda: instances.extend(dds.app.scale_up.increase(group, 1, "ca-1")),
                            name="ca-call")
    call.start()
    assert call_observing.wait(30)
    loop = threading.Thread(target=dds.run_once, name="loop-pass")
    loop.start()
    loop.join(1.0)
    assert loop.is_alive() and loop_observed == [], "the pass waits at its first step while the call decides"
    release_call.set()
    call.join(30)
    loop.join(30)
    assert not loop.is_alive() and [i.kind.value for i in instances] == ["gpu"]
    assert loop_observed and loop_observed[0] == 1, "the pass observed after the call had started its attach"
    assert metrics.LOOP_WAITED._value.get() - waited_before >= 0.9
    [attach] = dds.operations()  # and planned nothing twice
    assert attach.key.startswith(instances[0].id)
