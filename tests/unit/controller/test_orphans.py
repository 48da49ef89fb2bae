"""Orphaned devices (dds/controller/orphans.py): devices on a node that is gone come back after the timeout, a node that
returns keeps its devices, and an attach that never ends is cancelled — a young one never."""

from __future__ import annotations

from dds.controller.orphans import OrphanFinder
from dds.fabric.base import DeviceState, FabricDevice, Operation, OperationKind, OperationState

TIMEOUT = 60.0


def device(device_id: str, node: str | None, state: DeviceState = DeviceState.ONLINE) -> FabricDevice:
    return FabricDevice(device_id, "A30", "default", node, state, attached_at=0.0 if node else None)


def attach_op(key: str, node: str, started_at: float, state: OperationState = OperationState.RUNNING) -> Operation:
    return Operation(key=key, kind=OperationKind.ATTACH, node=node, state=state, requested=1, model="A30",
                     pool="default", started_at=started_at)


def test_devices_of_a_missing_node_are_reclaimed_after_the_timeout_only():
    finder = OrphanFinder(TIMEOUT)
    devices = [device("d2", "gone"), device("d1", "gone", DeviceState.FAILED), device("d3", "alive"), device("d4", None)]
    assert finder.find(devices, [], {"alive"}, now=100.0) == []
    assert finder.find(devices, [], {"alive"}, now=100.0 + TIMEOUT - 1) == []
    [reclaim] = finder.find(devices, [], {"alive"}, now=100.0 + TIMEOUT)
    assert (reclaim.node, reclaim.device_ids) == ("gone", ("d1", "d2"))
    assert "gone for 60s" in reclaim.reason


def test_a_node_that_comes_back_starts_the_clock_again():
    finder = OrphanFinder(TIMEOUT)
    devices = [device("d1", "flaky")]
    finder.find(devices, [], set(), now=0.0)
    finder.find(devices, [], {"flaky"}, now=30.0)  # an apiserver blip: it was there all along
    assert finder.find(devices, [], set(), now=70.0) == []
    assert len(finder.find(devices, [], set(), now=130.0)) == 1


def test_devices_in_flight_on_a_missing_node_wait_for_their_operation():
    finder = OrphanFinder(TIMEOUT)
    devices = [device("d1", "gone", DeviceState.DETACHING), device("d2", "gone", DeviceState.ATTACHING)]
    finder.find(devices, [attach_op("a", "gone", started_at=95.0)], set(), now=0.0)
    assert finder.find(devices, [attach_op("a", "gone", started_at=95.0)], set(), now=100.0) == []


def test_an_attach_running_past_the_timeout_is_cancelled_by_a_detach_of_its_devices():
    finder = OrphanFinder(TIMEOUT)
    devices = [device("d1", "n1", DeviceState.ATTACHING), device("d2", "n1", DeviceState.ATTACHING)]
    ops = [attach_op("hung", "n1", started_at=0.0)]
    assert finder.find(devices, ops, {"n1"}, now=TIMEOUT - 1) == []
    [reclaim] = finder.find(devices, ops, {"n1"}, now=TIMEOUT)
    assert (reclaim.node, reclaim.device_ids) == ("n1", ("d1", "d2"))
    assert "attach hung" in reclaim.reason


def test_a_young_attach_on_the_same_node_keeps_an_old_one_from_being_cancelled():
    finder = OrphanFinder(TIMEOUT)
    devices = [device("d1", "n1", DeviceState.ATTACHING), device("d2", "n1", DeviceState.ATTACHING)]
    ops = [attach_op("hung", "n1", started_at=0.0), attach_op("young", "n1", started_at=100.0),
           attach_op("done", "n1", started_at=0.0, state=OperationState.SUCCEEDED)]
    assert finder.find(devices, ops, {"n1"}, now=110.0) == []


def test_a_node_being_deleted_that_waits_for_dds_has_its_settled_devices_reclaimed_at_once():
    finder = OrphanFinder(TIMEOUT)
    devices = [device("d1", "deleting"), device("d2", "deleting", DeviceState.DETACHING), device("d3", "alive")]
    [reclaim] = finder.find(devices, [], {"alive"}, now=0.0, deleted={"deleting"})
    # Only what is settled: a device already going back is followed by its own detach.
    assert (reclaim.node, reclaim.device_ids) == ("deleting", ("d1",))
    assert "is being deleted with 1 A30 device(s) attached" in reclaim.reason


def test_a_missing_nodes_devices_are_reclaimed_one_model_at_a_time():
    finder = OrphanFinder(TIMEOUT)
    devices = [device("d1", "gone"), FabricDevice("d2", "H100", "default", "gone", DeviceState.ONLINE, attached_at=0.0)]
    reclaims = finder.find(devices, [], set(), now=0.0, deleted={"gone"})
    assert sorted(r.device_ids for r in reclaims) == [("d1",), ("d2",)]
