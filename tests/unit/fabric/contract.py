"""The fabric contract: what every backend promises DDS, as tests over a `Harness`.

Each backend's test module builds a harness (the backend on a fresh world: one pool `POOL` holding `TOTAL` devices of
`MODEL`, at most `SLOTS` devices per node, nodes `NODE_A`/`NODE_B`/`NODE_C`; a harness may name its own `model` and
`pool`, and `slots = None` for devices that take no slot: CXL memory chunks) and runs `CONTRACT` against it:
tests/unit/fabric/test_contract.py (simulated, Redfish emulator) and tests/integration/fabric/ (ComposabilityRequest on the
real apiserver with CoHDI's composable-resource-operator running, harness/cdi_operator.py).
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol

import pytest

from dds.fabric.base import (AttachRequest, DetachRequest, DeviceState, ErrorCode, Fabric, FabricError, Operation,
                             OperationState)

POOL, MODEL = "default", "A30"
TOTAL, SLOTS = 4, 3
NODE_A, NODE_B, NODE_C = "node-a", "node-b", "node-c"


class Harness(Protocol):
    fabric: Fabric

    def settle(self, key: str) -> Operation:
        """Let time pass until the operation `key` is done (advance a virtual clock, or poll on wall time)."""
        ...

    def restart(self) -> Fabric:
        """Throw the backend away without closing it (kill -9) and build a new one on the same state; return it."""
        ...

    def mark_in_use(self, device_id: str) -> bool:
        """Make a device busy; False when the backend cannot know (the test is then skipped)."""
        ...


def kind(h: Harness) -> tuple[str, str]:
    """The model and pool the harness's world holds TOTAL devices of."""
    return getattr(h, "model", MODEL), getattr(h, "pool", POOL)


def free(fabric: Fabric, model: str = MODEL, pool_name: str = POOL) -> int:
    [pool] = [p for p in fabric.pools() if p.name == pool_name]
    return pool.free.get(model, 0)


def online(fabric: Fabric, node: str) -> list[str]:
    return sorted(d.id for d in fabric.devices(node) if d.state == DeviceState.ONLINE)


def attach(h: Harness, key: str, node: str, count: int) -> Operation:
    model, pool = kind(h)
    return h.fabric.attach(AttachRequest(key=key, node=node, pool=pool, model=model, count=count, reason="test"))


def attached(h: Harness, key: str, node: str, count: int) -> Operation:
    attach(h, key, node, count)
    op = h.settle(key)
    assert op.state == OperationState.SUCCEEDED, op
    return op


def assert_counts_add_up(fabric: Fabric, model: str = MODEL, pool_name: str = POOL) -> None:
    devices = fabric.devices()
    ids = [d.id for d in devices]
    assert len(ids) == len(set(ids)), f"a device is on two nodes: {ids}"
    [pool] = [p for p in fabric.pools() if p.name == pool_name]
    on_nodes = sum(1 for d in devices if d.model == model and d.pool == pool_name)
    assert pool.free[model] + on_nodes == pool.total[model] == TOTAL


def refused_with(call: Callable[[], Operation], settle: Callable[[str], Operation], key: str) -> Optional[ErrorCode]:
    """A refusal may come at once (FabricError) or as a FAILED operation: the error code either way."""
    try:
        op = call()
    except FabricError as exc:
        return exc.code
    if not op.state.done:
        op = settle(key)
    return op.error.code if op.state == OperationState.FAILED and op.error else None


# --- the contract ---

def test_attach_puts_devices_on_the_node_and_takes_them_from_the_pool(h: Harness) -> None:
    op = attached(h, "attach-2", NODE_A, 2)
    assert len(op.devices) == 2
    assert online(h.fabric, NODE_A) == sorted(op.devices)
    assert free(h.fabric, *kind(h)) == TOTAL - 2
    assert_counts_add_up(h.fabric, *kind(h))


def test_the_same_key_twice_is_one_operation(h: Harness) -> None:
    first = attach(h, "once", NODE_A, 1)
    second = attach(h, "once", NODE_A, 1)
    assert (second.key, second.started_at, second.requested) == (first.key, first.started_at, first.requested)
    h.settle("once")
    assert attach(h, "once", NODE_A, 1).state == OperationState.SUCCEEDED
    assert len(online(h.fabric, NODE_A)) == 1
    assert free(h.fabric, *kind(h)) == TOTAL - 1
    assert [o.key for o in h.fabric.operations()].count("once") == 1


def test_detach_returns_devices_to_the_pool(h: Harness) -> None:
    op = attached(h, "attach-for-detach", NODE_A, 2)
    h.fabric.detach(DetachRequest(key="detach-2", node=NODE_A, device_ids=op.devices, reason="test"))
    done = h.settle("detach-2")
    assert done.state == OperationState.SUCCEEDED, done
    assert len(done.devices) == 2
    assert online(h.fabric, NODE_A) == []
    assert free(h.fabric, *kind(h)) == TOTAL
    assert_counts_add_up(h.fabric, *kind(h))


def test_asking_for_more_than_the_pool_holds_fails_out_of_resources(h: Harness) -> None:
    attached(h, "take-2", NODE_A, 2)
    code = refused_with(lambda: attach(h, "too-many", NODE_B, 3), h.settle, "too-many")
    assert code == ErrorCode.OUT_OF_RESOURCES
    assert online(h.fabric, NODE_B) == []
    assert free(h.fabric, *kind(h)) == TOTAL - 2


def test_a_node_without_free_slots_fails_slots_full(h: Harness) -> None:
    if getattr(h, "slots", SLOTS) is None:
        pytest.skip("these devices take no slot (CXL memory: a node's memory has its group's maximum instead)")
    attached(h, "fill", NODE_A, SLOTS)
    code = refused_with(lambda: attach(h, "one-more", NODE_A, 1), h.settle, "one-more")
    assert code == ErrorCode.SLOTS_FULL
    assert len(online(h.fabric, NODE_A)) == SLOTS


def test_detaching_a_device_in_use_without_force_is_refused(h: Harness) -> None:
    op = attached(h, "busy", NODE_A, 1)
    if not h.mark_in_use(op.devices[0]):
        pytest.skip("this backend cannot know whether a device is in use")
    code = refused_with(lambda: h.fabric.detach(DetachRequest(key="unforced", node=NODE_A, device_ids=op.devices)),
                        h.settle, "unforced")
    assert code == ErrorCode.DEVICE_IN_USE
    assert online(h.fabric, NODE_A) == list(op.devices)


def test_operations_lists_the_ones_in_flight(h: Harness) -> None:
    attach(h, "in-flight", NODE_A, 1)
    listed = {o.key: o for o in h.fabric.operations()}
    assert "in-flight" in listed and not listed["in-flight"].state.done


def test_a_restarted_backend_resumes_an_attach_exactly_once(h: Harness) -> None:
    attach(h, "across-restart", NODE_A, 2)
    fabric = h.restart()
    assert "across-restart" in {o.key for o in fabric.operations()}
    attach(h, "across-restart", NODE_A, 2)  # a caller retrying its key after the restart changes nothing
    done = h.settle("across-restart")
    assert done.state == OperationState.SUCCEEDED, done
    assert online(fabric, NODE_A) == sorted(done.devices)
    assert free(fabric, *kind(h)) == TOTAL - 2
    assert_counts_add_up(fabric, *kind(h))


CONTRACT = [
    test_attach_puts_devices_on_the_node_and_takes_them_from_the_pool,
    test_the_same_key_twice_is_one_operation,
    test_detach_returns_devices_to_the_pool,
    test_asking_for_more_than_the_pool_holds_fails_out_of_resources,
    test_a_node_without_free_slots_fails_slots_full,
    test_detaching_a_device_in_use_without_force_is_refused,
    test_operations_lists_the_ones_in_flight,
    test_a_restarted_backend_resumes_an_attach_exactly_once,
]
