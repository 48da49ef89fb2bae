"""The simulated fabric without a state store (`persist=False`, the trace simulator's fabric): the same behaviour as a
persisted one, nothing written anywhere."""

from __future__ import annotations

import pytest

from dds.config import FaultSpec, LatencySpec, PoolSpec, SimulatedFabricSettings
from dds.fabric.base import AttachRequest, DetachRequest, OperationState
from dds.fabric.simulated import SimulatedFabric
from dds.fabric.state import InMemoryFabricStateStore
from tests.unit.fabric.harnesses import FakeClock

SETTINGS = SimulatedFabricSettings(pools=[PoolSpec(name="pool-a", devices={"A30": 4}, max_slots_per_node=3)],
                                   attach_latency=LatencySpec(min=20, max=40), detach_latency=LatencySpec(min=5, max=10),
                                   faults=FaultSpec(partial_attach=0.5, seed=3))


def story(fabric: SimulatedFabric, clock: FakeClock) -> list[tuple]:
    """A few attaches and detaches; what a caller sees of them."""
    seen: list[tuple] = []
    for step in range(3):
        op = fabric.attach(AttachRequest(key=f"a{step}", node=f"n{step % 2}", pool="pool-a", model="A30", count=2))
        seen.append((op.key, op.state, op.error.code if op.error else None))
        clock.advance(50)
        done = fabric.operation(op.key)
        seen.append((done.key, done.state, done.devices, done.finished_at))
        if done.devices:
            gone = fabric.detach(DetachRequest(key=f"d{step}", node=done.node, device_ids=done.devices))
            clock.advance(20)
            seen.append((gone.key, fabric.operation(gone.key).state))
    seen.append(tuple((d.id, d.node, d.state) for d in fabric.devices()))
    seen.append(tuple((p.name, dict(p.free)) for p in fabric.pools()))
    return seen


def test_without_a_store_the_fabric_tells_the_same_story_as_with_one():
    store = InMemoryFabricStateStore()
    persisted_clock, volatile_clock = FakeClock(), FakeClock()
    persisted = story(SimulatedFabric(SETTINGS, clock=persisted_clock, store=store), persisted_clock)
    volatile = story(SimulatedFabric(SETTINGS, clock=volatile_clock, persist=False), volatile_clock)
    assert volatile == persisted
    assert any(entry[1] == OperationState.FAILED for entry in persisted if len(entry) == 4), "a partial attach shows"


def test_a_store_and_persist_off_together_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="persist=False"):
        SimulatedFabric(SETTINGS, clock=FakeClock(), store=InMemoryFabricStateStore(), persist=False)
