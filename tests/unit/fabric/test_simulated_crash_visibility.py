"""A DDS killed between storing a fabric change and publishing it on the Node: the next process publishes it.

The simulated fabric stores every change before it calls the visibility hook (which patches the Node's GPU capacity).
A SIGKILL in between leaves a Node showing GPUs the fabric took back; the restarted process must owe every node its
stored state names — also a node with no device left, which a "nodes holding devices" rule would never visit."""

from __future__ import annotations

from dds.fabric.base import AttachRequest, DetachRequest, OperationState
from dds.fabric.simulated import SimulatedFabric
from dds.fabric.state import InMemoryFabricStateStore
from tests.unit.fabric.harnesses import FakeClock
from tests.unit.fabric.test_simulated import make_settings


def test_a_restarted_fabric_publishes_a_node_whose_last_device_left_before_the_crash() -> None:
    clock, store = FakeClock(), InMemoryFabricStateStore()
    dying = SimulatedFabric(make_settings(), clock=clock, store=store)  # its hook never ran: killed before it
    dying.attach(AttachRequest(key="a", node="n1", pool="pool-a", model="A30", count=1))
    clock.advance(41)
    [device] = dying.devices("n1")
    dying.detach(DetachRequest(key="d", node="n1", device_ids=(device.id,)))
    clock.advance(11)
    assert dying.operation("d").state == OperationState.SUCCEEDED  # stored: n1 holds nothing now

    heard: list[tuple[str, dict[str, int]]] = []
    restarted = SimulatedFabric(make_settings(), clock=clock, store=store,
                                on_node_devices_changed=lambda node, counts: heard.append((node, counts)))
    restarted.tick()
    assert heard == [("n1", {})]
    restarted.tick()
    assert heard == [("n1", {})]  # delivered once


def test_a_failed_publication_for_a_node_without_devices_is_retried() -> None:
    clock, store = FakeClock(), InMemoryFabricStateStore()
    broken = {"yes": False}
    heard: list[tuple[str, dict[str, int]]] = []

    def hook(node: str, counts: dict[str, int]) -> None:
        if broken["yes"]:
            raise RuntimeError("apiserver down")
        heard.append((node, counts))

    fabric = SimulatedFabric(make_settings(), clock=clock, store=store, on_node_devices_changed=hook)
    fabric.attach(AttachRequest(key="a", node="n1", pool="pool-a", model="A30", count=1))
    clock.advance(41)
    fabric.tick()
    [device] = fabric.devices("n1")
    broken["yes"] = True
    fabric.detach(DetachRequest(key="d", node="n1", device_ids=(device.id,)))  # n1 loses its GPU: publish fails
    clock.advance(11)
    fabric.tick()
    broken["yes"] = False
    fabric.tick()
    assert heard[-1] == ("n1", {})
