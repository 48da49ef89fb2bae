"""The simulated fabric beyond the contract: faults, latencies, visibility, persistence, bad input, invariants."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pytest
from hypothesis import given, settings as hyp_settings, strategies as st

from dds.config import FaultSpec, LatencySpec, PoolSpec, SimulatedFabricSettings
from dds.fabric.base import (AttachRequest, DetachRequest, DeviceState, ErrorCode, FabricError, OperationState)
from dds.fabric.simulated import SimulatedFabric
from dds.fabric.state import InMemoryFabricStateStore
from tests.unit.fabric.harnesses import FakeClock

DAY = 86400.0


def make_settings(faults: Optional[FaultSpec] = None, a30: int = 4, slots: Optional[int] = 4,
                  attach: tuple[float, float] = (20, 40),
                  detach: tuple[float, float] = (5, 10)) -> SimulatedFabricSettings:
    return SimulatedFabricSettings(pools=[PoolSpec(name="pool-a", devices={"A30": a30, "H100": 2},
                                                   max_slots_per_node=slots)],
                                   attach_latency=LatencySpec(min=attach[0], max=attach[1]),
                                   detach_latency=LatencySpec(min=detach[0], max=detach[1]),
                                   faults=faults or FaultSpec(seed=7))


@dataclass
class World:
    fabric: SimulatedFabric
    clock: FakeClock
    store: InMemoryFabricStateStore
    visible: list[tuple[str, dict[str, int]]]


def make_world(settings: Optional[SimulatedFabricSettings] = None) -> World:
    clock, store, visible = FakeClock(), InMemoryFabricStateStore(), []
    fabric = SimulatedFabric(settings or make_settings(), clock=clock, store=store,
                             on_node_devices_changed=lambda node, counts: visible.append((node, counts)))
    return World(fabric, clock, store, visible)


def attach(world: World, key: str, count: int, node: str = "n1", model: str = "A30"):
    return world.fabric.attach(AttachRequest(key=key, node=node, pool="pool-a", model=model, count=count))


def free_a30(world: World) -> int:
    return world.fabric.pools()[0].free["A30"]


# --- faults: each one at probability 1 ---

@pytest.mark.parametrize("faults,count,state,attached,code", [
    pytest.param(FaultSpec(attach_error=1, seed=1), 2, OperationState.FAILED, 0, ErrorCode.BACKEND, id="attach-error"),
    pytest.param(FaultSpec(partial_attach=1, seed=1), 3, OperationState.FAILED, "fewer", ErrorCode.BACKEND,
                 id="partial-attach"),
    pytest.param(FaultSpec(seed=1), 2, OperationState.SUCCEEDED, 2, None, id="no-fault"),
])
def test_attach_faults_end_the_operation_as_the_spec_says(faults, count, state, attached, code) -> None:
    world = make_world(make_settings(faults))
    attach(world, "k", count)
    world.clock.advance(41)
    op = world.fabric.operation("k")
    assert op.state == state
    assert (op.error.code if op.error else None) == code
    if attached == "fewer":
        assert len(op.devices) < count
    else:
        assert len(op.devices) == attached
    assert free_a30(world) == 4 - len(op.devices)  # devices not attached went back to the pool
    world.fabric.check_invariants()


def test_a_hung_attach_never_completes_until_force_detached() -> None:
    world = make_world(make_settings(FaultSpec(attach_hang=1, seed=1)))
    attach(world, "hangs", 2)
    world.clock.advance(DAY)
    assert world.fabric.operation("hangs").state == OperationState.RUNNING
    held = [d.id for d in world.fabric.devices("n1")]
    assert [d.state for d in world.fabric.devices("n1")] == [DeviceState.ATTACHING] * 2
    with pytest.raises(FabricError) as refused:
        world.fabric.detach(DetachRequest(key="unforced", node="n1", device_ids=(held[0],)))
    assert refused.value.code == ErrorCode.INVALID
    world.fabric.detach(DetachRequest(key="cancel", node="n1", device_ids=(held[0],), force=True))
    cancelled = world.fabric.operation("hangs")
    assert (cancelled.state, cancelled.error.code) == (OperationState.FAILED, ErrorCode.TIMEOUT)
    world.clock.advance(11)
    assert world.fabric.operation("cancel").state == OperationState.SUCCEEDED
    assert free_a30(world) == 4
    world.fabric.check_invariants()


def test_a_device_failing_after_attach_turns_failed_and_leaves_the_node_capacity() -> None:
    world = make_world(make_settings(FaultSpec(device_failure_after_attach=1, seed=3)))
    attach(world, "k", 1)
    world.clock.advance(41)
    assert world.fabric.operation("k").state == OperationState.SUCCEEDED
    assert world.visible[-1] == ("n1", {"A30": 1})
    world.clock.advance(41)
    world.fabric.tick()
    [device] = world.fabric.devices("n1")
    assert device.state == DeviceState.FAILED
    assert world.visible[-1] == ("n1", {})
    # A failed device can be detached (to be replaced).
    world.fabric.detach(DetachRequest(key="replace", node="n1", device_ids=(device.id,)))
    world.clock.advance(11)
    assert world.fabric.operation("replace").state == OperationState.SUCCEEDED


def test_a_failed_detach_leaves_the_devices_on_the_node() -> None:
    world = make_world(make_settings(FaultSpec(detach_error=1, seed=1)))
    attach(world, "k", 2)
    world.clock.advance(41)
    devices = world.fabric.operation("k").devices
    world.fabric.detach(DetachRequest(key="d", node="n1", device_ids=devices))
    world.clock.advance(11)
    op = world.fabric.operation("d")
    assert (op.state, op.error.code, op.devices) == (OperationState.FAILED, ErrorCode.BACKEND, ())
    assert [d.state for d in world.fabric.devices("n1")] == [DeviceState.ONLINE] * 2
    world.fabric.check_invariants()


# --- latency and determinism ---

def test_an_attach_completes_within_its_latency_range_on_virtual_time() -> None:
    world = make_world(make_settings(attach=(20, 40)))
    attach(world, "k", 1)
    world.clock.advance(19.9)
    assert world.fabric.operation("k").state == OperationState.RUNNING
    world.clock.advance(20.2)
    op = world.fabric.operation("k")
    assert op.state == OperationState.SUCCEEDED
    assert 20 <= op.finished_at - op.started_at <= 40


def test_the_same_seed_gives_the_same_story() -> None:
    outcomes = []
    for _ in range(2):
        world = make_world(make_settings(FaultSpec(partial_attach=0.5, attach_error=0.3, seed=42)))
        for index in range(4):
            attach(world, f"k{index}", 1, node=f"n{index}")
        world.clock.advance(41)
        outcomes.append([(o.state, o.finished_at) for o in world.fabric.operations()])
    assert outcomes[0] == outcomes[1]


# --- visibility ---

def test_the_visibility_hook_hears_online_counts_and_a_failed_call_is_retried_by_tick() -> None:
    calls: list[tuple[str, dict[str, int]]] = []
    broken = {"yes": True}

    def hook(node: str, counts: dict[str, int]) -> None:
        if broken["yes"]:
            raise RuntimeError("apiserver down")
        calls.append((node, counts))

    clock = FakeClock()
    fabric = SimulatedFabric(make_settings(), clock=clock, on_node_devices_changed=hook)
    fabric.attach(AttachRequest(key="k", node="n1", pool="pool-a", model="A30", count=2))
    clock.advance(41)
    assert fabric.operation("k").state == OperationState.SUCCEEDED
    assert calls == []
    broken["yes"] = False
    fabric.tick()
    assert calls == [("n1", {"A30": 2})]
    fabric.tick()
    assert calls == [("n1", {"A30": 2})]  # nothing new: not called again


# --- persistence ---

def test_a_new_instance_on_the_same_store_finishes_what_the_old_one_accepted() -> None:
    world = make_world(make_settings(FaultSpec(seed=None)))  # unseeded: the random salt is persisted
    accepted = attach(world, "k", 2)
    reborn = SimulatedFabric(make_settings(FaultSpec(seed=None)), clock=world.clock, store=world.store)
    assert reborn.operation("k") == accepted
    world.clock.advance(41)
    assert reborn.operation("k").state == OperationState.SUCCEEDED
    assert reborn.operation("k") == world.fabric.operation("k")  # the same due time: the draw was stored


def test_queries_do_not_write_the_store_when_nothing_is_due() -> None:
    world = make_world()
    attach(world, "k", 1)
    saves = world.store.saves
    for _ in range(3):
        world.fabric.pools(), world.fabric.devices(), world.fabric.operations()
    assert world.store.saves == saves


def test_a_burst_of_attaches_is_one_write_and_each_is_answered_as_alone() -> None:
    """attach_many: one durable write for the lot; a refusal (an unknown pool, too few free devices) is that request's
    alone; a retried key is answered with its operation; the rest completes as single attaches would."""
    world = make_world(make_settings(a30=4, slots=None))
    first = attach(world, "before", 1, node="n0")
    saves = world.store.saves
    # The retried key comes before the last free device is asked for: answering it takes nothing from the pool.
    requests = [AttachRequest(key="a", node="n1", pool="pool-a", model="A30", count=2),
                AttachRequest(key="unknown-pool", node="n1", pool="nowhere", model="A30", count=1),
                AttachRequest(key="before", node="n0", pool="pool-a", model="A30", count=1),
                AttachRequest(key="b", node="n2", pool="pool-a", model="A30", count=1),
                AttachRequest(key="too-many", node="n3", pool="pool-a", model="A30", count=5),
                AttachRequest(key="no-h200", node="n3", pool="pool-a", model="H200", count=1)]

    results = world.fabric.attach_many(requests)

    assert world.store.saves == saves + 1
    a, unknown_pool, before, b, too_many, no_h200 = results
    assert isinstance(unknown_pool, FabricError) and unknown_pool.code == ErrorCode.NOT_FOUND
    assert isinstance(no_h200, FabricError) and no_h200.code == ErrorCode.NOT_FOUND
    assert too_many.state == OperationState.FAILED and too_many.error.code == ErrorCode.OUT_OF_RESOURCES
    assert before == first
    assert (a.state, b.state) == (OperationState.RUNNING, OperationState.RUNNING)
    world.clock.advance(41)
    assert [d.node for d in world.fabric.devices() if d.state == DeviceState.ONLINE].count("n1") == 2
    assert world.fabric.operation("b").state == OperationState.SUCCEEDED
    assert free_a30(world) == 0
    world.fabric.check_invariants()


def test_two_instances_on_one_store_never_hand_out_a_device_twice() -> None:
    world = make_world()
    stale = SimulatedFabric(make_settings(), clock=world.clock, store=world.store)
    attach(world, "first", 2, node="n1")
    stale.attach(AttachRequest(key="second", node="n2", pool="pool-a", model="A30", count=2))  # conflict -> re-read
    world.clock.advance(41)
    devices = [d.id for d in stale.devices()]
    assert len(devices) == len(set(devices)) == 4
    stale.check_invariants()


def test_a_grown_pool_in_the_configuration_adds_devices_to_the_stored_state() -> None:
    world = make_world(make_settings(a30=4))
    attach(world, "k", 1)
    grown = SimulatedFabric(make_settings(a30=6), clock=world.clock, store=world.store)
    assert grown.pools()[0].total["A30"] == 6
    assert grown.pools()[0].free["A30"] == 5


# --- bad input ---

@pytest.mark.parametrize("request_,code", [
    pytest.param(AttachRequest(key="k", node="n1", pool="pool-a", model="A30", count=0), ErrorCode.INVALID,
                 id="zero-count"),
    pytest.param(AttachRequest(key="", node="n1", pool="pool-a", model="A30", count=1), ErrorCode.INVALID, id="no-key"),
    pytest.param(AttachRequest(key="k", node="n1", pool="nope", model="A30", count=1), ErrorCode.NOT_FOUND,
                 id="unknown-pool"),
    pytest.param(AttachRequest(key="k", node="n1", pool="pool-a", model="V100", count=1), ErrorCode.NOT_FOUND,
                 id="unknown-model"),
    pytest.param(DetachRequest(key="d", node="n1", device_ids=("pool-a/A30-000",)), ErrorCode.NOT_FOUND,
                 id="detach-a-free-device"),
    pytest.param(DetachRequest(key="d", node="n1", device_ids=()), ErrorCode.INVALID, id="detach-nothing"),
])
def test_requests_the_fabric_can_never_serve_are_refused_with_a_code(request_, code) -> None:
    world = make_world()
    call = world.fabric.attach if isinstance(request_, AttachRequest) else world.fabric.detach
    with pytest.raises(FabricError) as refused:
        call(request_)
    assert refused.value.code == code
    assert world.fabric.operations() == ()


@pytest.mark.parametrize("pools,field", [
    pytest.param([PoolSpec(name="a", devices={}), PoolSpec(name="a", devices={})], "pools[1]", id="duplicate-pool"),
    pytest.param([PoolSpec(name="a", devices={"A30": -1})], "pools[0] ('a').devices['A30']", id="negative-count"),
    pytest.param([PoolSpec(name="a/b", devices={})], "pools[0]", id="slash-in-name"),
])
def test_a_malformed_pool_configuration_names_the_field(pools, field) -> None:
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        SimulatedFabric(SimulatedFabricSettings(pools=pools), clock=FakeClock())


# --- property: whatever happens, the books balance ---

step = st.one_of(
    st.tuples(st.just("attach"), st.sampled_from(["n1", "n2", "n3"]), st.integers(1, 3)),
    st.tuples(st.just("detach"), st.sampled_from(["n1", "n2", "n3"]), st.integers(1, 2)),
    st.tuples(st.just("wait"), st.just(""), st.integers(1, 50)),
)


@hyp_settings(max_examples=60, deadline=None)
@given(st.lists(step, max_size=25), st.floats(0, 1), st.floats(0, 1))
def test_any_sequence_of_calls_keeps_every_device_in_exactly_one_place(steps, error_rate, partial_rate) -> None:
    world = make_world(make_settings(FaultSpec(attach_error=error_rate, partial_attach=partial_rate,
                                               device_failure_after_attach=0.2, detach_error=0.2, seed=5)))
    for index, (kind, node, amount) in enumerate(steps):
        if kind == "attach":
            attach(world, f"a{index}", amount, node=node)
        elif kind == "detach":
            ready = [d.id for d in world.fabric.devices(node) if d.state in (DeviceState.ONLINE, DeviceState.FAILED)]
            if ready:
                world.fabric.detach(DetachRequest(key=f"d{index}", node=node, device_ids=tuple(ready[:amount])))
        else:
            world.clock.advance(amount)
        world.fabric.check_invariants()
        pool = world.fabric.pools()[0]
        assert pool.free["A30"] + sum(1 for d in world.fabric.devices() if d.model == "A30") == pool.total["A30"]
        for node_name in ("n1", "n2", "n3"):
            assert len(world.fabric.devices(node_name)) <= 4  # the slot limit holds
