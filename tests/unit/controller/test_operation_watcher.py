"""The operation watcher (dds/controller/executor.py) follows started operations to their end on the real simulated
fabric and a fake clock: each ends once, its callbacks run once, in the order the operations were started."""

from __future__ import annotations

from dds.config import FaultSpec, LatencySpec, PoolSpec, SimulatedFabricSettings
from dds.controller.executor import OperationWatcher
from dds.fabric.base import AttachRequest
from dds.fabric.simulated import SimulatedFabric
from dds.model.events import ObjectRef


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Events:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def emit(self, involved: ObjectRef, event_type: str, reason: str, message: str) -> None:
        self.reasons.append(reason)


def started(count: int) -> tuple[Clock, Events, OperationWatcher, list[str]]:
    clock, events = Clock(), Events()
    settings = SimulatedFabricSettings(pools=[PoolSpec(name="pool-a", devices={"A30": 4})],
                                       attach_latency=LatencySpec(min=1.0, max=1.0), faults=FaultSpec(seed=0))
    fabric = SimulatedFabric(settings, clock=clock, persist=False)
    watcher = OperationWatcher(fabric, events, clock)
    ended: list[str] = []
    for index in range(count):
        operation = fabric.attach(AttachRequest(key=f"k{index}", node=f"w{index}", pool="pool-a", model="A30", count=1))
        watcher.watch(operation, on_done=lambda op: ended.append(op.key))
    return clock, events, watcher, ended


def test_operations_end_once_in_the_order_they_started() -> None:
    clock, events, watcher, ended = started(3)
    assert watcher.poll() == [] and ended == []
    clock.now = 2.0
    assert [op.key for op in watcher.poll()] == ["k0", "k1", "k2"]
    assert watcher.poll() == [] and ended == ["k0", "k1", "k2"] and watcher.in_flight() == ()
    assert events.reasons == ["AttachedGPU"] * 3


def test_a_poll_of_some_keys_leaves_the_others_followed() -> None:
    clock, _, watcher, ended = started(3)
    clock.now = 2.0
    assert [op.key for op in watcher.poll(keys={"k2", "k0"})] == ["k0", "k2"]
    assert ended == ["k0", "k2"] and [op.key for op in watcher.in_flight()] == ["k1"]
    watcher.poll()
    assert ended == ["k0", "k2", "k1"]
