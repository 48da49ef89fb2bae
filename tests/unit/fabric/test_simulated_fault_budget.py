"""`faults.max_faults` of the simulated fabric: a fault strikes that many times per kind, then the fabric behaves; the
count is part of the stored state, so a restarted DDS does not get a fresh budget."""

from __future__ import annotations

from dds.config import FaultSpec, LatencySpec, PoolSpec, SimulatedFabricSettings
from dds.fabric.base import AttachRequest, DetachRequest, OperationState
from dds.fabric.simulated import SimulatedFabric
from dds.fabric.state import InMemoryFabricStateStore


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def settings(**faults) -> SimulatedFabricSettings:
    return SimulatedFabricSettings(pools=[PoolSpec(name="p", devices={"A30": 4})],
                                   attach_latency=LatencySpec(min=1.0, max=1.0),
                                   detach_latency=LatencySpec(min=1.0, max=1.0), faults=FaultSpec(seed=3, **faults))


def attach(fabric: SimulatedFabric, clock: Clock, key: str, count: int = 1) -> OperationState:
    fabric.attach(AttachRequest(key=key, node="n1", pool="p", model="A30", count=count))
    clock.now += 2.0
    return fabric.operation(key).state


def test_a_fault_strikes_max_faults_times_then_the_fabric_behaves():
    clock = Clock()
    fabric = SimulatedFabric(settings(attach_error=1.0, max_faults=2), clock=clock)
    outcomes = [attach(fabric, clock, f"a{i}") for i in range(4)]
    assert outcomes == [OperationState.FAILED, OperationState.FAILED, OperationState.SUCCEEDED,
                        OperationState.SUCCEEDED]
    assert fabric.faults_injected() == {"attach_error": 2}
    assert fabric.pools()[0].free["A30"] == 2  # the failed attaches gave their devices back


def test_the_budget_survives_a_restart_and_counts_each_kind_apart():
    clock, store = Clock(), InMemoryFabricStateStore()
    first = SimulatedFabric(settings(attach_error=1.0, max_faults=1), clock=clock, store=store)
    assert attach(first, clock, "a0") == OperationState.FAILED
    restarted = SimulatedFabric(settings(attach_error=1.0, detach_error=1.0, max_faults=1), clock=clock, store=store)
    assert attach(restarted, clock, "a1") == OperationState.SUCCEEDED
    device = restarted.operation("a1").devices[0]
    restarted.detach(DetachRequest(key="d1", node="n1", device_ids=(device,)))
    clock.now += 2.0
    assert restarted.operation("d1").state == OperationState.FAILED  # detach_error has a budget of its own
    assert restarted.faults_injected() == {"attach_error": 1, "detach_error": 1}


def test_an_unused_budget_changes_no_outcome():
    runs = []
    for budget in (None, 100):
        clock = Clock()
        fabric = SimulatedFabric(settings(attach_error=0.3, partial_attach=0.3, max_faults=budget), clock=clock)
        outcomes = []
        for i in range(12):
            online = tuple(d.id for d in fabric.devices("n1"))
            if online:  # make room for the next attach
                fabric.detach(DetachRequest(key=f"free{i}", node="n1", device_ids=online))
                clock.now += 2.0
            state = attach(fabric, clock, f"k{i}", count=2)
            outcomes.append((state, fabric.operation(f"k{i}").devices))
        runs.append(outcomes)
    assert runs[0] == runs[1]
    assert {state for state, _ in runs[0]} == {OperationState.FAILED, OperationState.SUCCEEDED}
