"""Which operation in flight holds a scale-down detach back: one on the same node and model only, so a stuck
operation (an attach the node never shows, a detach that never ends) stops nothing else (issue 38)."""

from __future__ import annotations

from dds.controller.loop import detach_waits_for_in_flight
from dds.fabric.base import Operation, OperationKind, OperationState
from dds.model.plan import Detach
from dds.model.snapshot import Device, NodeInfo, Snapshot

SNAPSHOT = Snapshot(now=100.0, nodes=(
    NodeInfo(name="w1", devices=(Device("gpu-a30", "A30", "p"), Device("gpu-h100", "H100", "p"))),
    NodeInfo(name="w2", devices=(Device("gpu-b", "A30", "p"),))))


def running(node: str, model: str, kind: OperationKind = OperationKind.ATTACH) -> Operation:
    return Operation(key=f"{kind.value}/{node}/{model}", kind=kind, node=node, state=OperationState.RUNNING,
                     requested=1, model=model, pool="p", started_at=0.0)


def test_a_stuck_operation_holds_back_a_detach_of_its_own_node_and_model() -> None:
    step = Detach("w1", ("gpu-a30",), reason="idle")
    assert detach_waits_for_in_flight(step, SNAPSHOT, [running("w1", "A30")])
    assert detach_waits_for_in_flight(step, SNAPSHOT, [running("w1", "A30", OperationKind.DETACH)])


def test_a_stuck_operation_on_another_model_or_node_holds_nothing_back() -> None:
    stuck = [running("w1", "H100"), running("w2", "A30", OperationKind.DETACH)]
    assert not detach_waits_for_in_flight(Detach("w1", ("gpu-a30",), reason="idle"), SNAPSHOT, stuck)
    assert not detach_waits_for_in_flight(Detach("w2", ("gpu-b",), reason="idle"), SNAPSHOT, [running("w1", "A30")])


def test_devices_the_snapshot_does_not_know_wait_for_any_operation_on_their_node() -> None:
    assert detach_waits_for_in_flight(Detach("w1", ("gone",), reason="idle"), SNAPSHOT, [running("w1", "H100")])
