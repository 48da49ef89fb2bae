"""A failed attach whose new ComposableResource the operator has not taken up yet (state ""), which the operator then
brings Online after all (dds/fabric/composability.py `_owing_give_back`, `_give_back_owed`).

The operator's objects are in-memory stand-ins of dds.kube.composability.ComposabilityObjects, moved by the test as the
operator would move them; the same sequence on the running operator: tests/integration/fabric/
test_composability_contract.py `test_a_failed_attach_not_yet_picked_up_gives_back_its_own_resource_not_the_gpu_in_use`.
The outcome is reported once and stays: stored FAILED when it is first read, never SUCCEEDED afterwards."""

from __future__ import annotations

import copy
import json
from typing import Any, Mapping, Optional

import pytest
from prometheus_client import REGISTRY

from dds.config import ComposabilitySettings, PoolSpec
from dds.fabric.base import AttachRequest, DeviceState, ErrorCode, FabricError, OperationState
from dds.fabric.composability import (ANN_DELETE_DEVICE, ANN_OPERATIONS, ComposabilityRequestFabric, request_name)
from dds.kube.composability import NodeHold
from dds.model.events import ObjectRef

NODE = "node-a"
NAME = request_name("dds-", NODE, "gpu", "A30")
WAIT_BOUND_S = 60.0


class Objects:
    """The requests and resources as the apiserver keeps them: every write bumps resourceVersion, a replace carrying
    an older one is refused (409 -> False)."""

    def __init__(self) -> None:
        self.requests: dict[str, dict[str, Any]] = {}
        self.resources: dict[str, dict[str, Any]] = {}
        self._version = 0
        self.refusing = False  # every replace refused as a conflict (another writer, the operator's webhook)

    def _bump(self, obj: dict[str, Any]) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)

    def get_request(self, name: str) -> Optional[dict[str, Any]]:
        return copy.deepcopy(self.requests.get(name))

    def list_requests(self, label_selector: Optional[str] = None) -> list[dict[str, Any]]:
        return [copy.deepcopy(r) for r in self.requests.values()]

    def list_resources(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(r) for r in self.resources.values()]

    def create_request(self, body: dict[str, Any]) -> bool:
        if body["metadata"]["name"] in self.requests:
            return False
        self.requests[body["metadata"]["name"]] = copy.deepcopy(body)
        self._bump(self.requests[body["metadata"]["name"]])
        return True

    def replace_request(self, name: str, body: dict[str, Any]) -> bool:
        current = self.requests.get(name)
        if self.refusing or current is None or \
                current["metadata"].get("resourceVersion") != body["metadata"].get("resourceVersion"):
            return False
        self.requests[name] = copy.deepcopy(body)
        self._bump(self.requests[name])
        return True

    def annotate_resource(self, name: str, annotations: Mapping[str, Optional[str]]) -> bool:
        resource = self.resources.get(name)
        if resource is None:
            return False
        current = resource["metadata"].setdefault("annotations", {})
        for key, value in annotations.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value
        return True

    def force_detach_resource(self, name: str, force: bool = True) -> bool:
        if name not in self.resources:
            return False
        self.resources[name]["spec"]["force_detach"] = force
        return True

    def hold_node(self, name: str) -> Optional[NodeHold]:
        return NodeHold(name, held=True, deleting=False)

    # --- what the operator does ---
    def operator_takes_up_size(self, entries: Mapping[str, str]) -> None:
        """The operator has applied the request's size: `entries` listed (name -> state) and created, Running."""
        request = self.requests[NAME]
        size = request["spec"]["resource"]["size"]
        request["status"] = {"state": "Running", "scalarResource": {"size": size},
                             "resources": {n: {"node_name": NODE, "state": s} for n, s in entries.items()}}
        self._bump(request)
        for name, state in entries.items():
            resource = self.resources.setdefault(name, {
                "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": NAME},
                             "creationTimestamp": f"2026-11-29T00:00:0{len(self.resources)}Z"},
                "spec": {"type": "gpu", "model": "A30", "target_node": NODE}, "status": {}})
            resource["status"] = {"state": state, "device_id": f"GPU-{name}" if state == "Online" else ""}


class Events:
    def __init__(self) -> None:
        self.emitted: list[tuple[str, str, str, str]] = []

    def emit(self, involved: ObjectRef, event_type: str, reason: str, message: str) -> None:
        self.emitted.append((involved.describe(), event_type, reason, message))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fabric_on(objects: Objects, clock: Clock, events: Events) -> ComposabilityRequestFabric:
    fabric = ComposabilityRequestFabric(
        None, ComposabilitySettings(operator_wait_bound_seconds=WAIT_BOUND_S),  # type: ignore[arg-type]
        [PoolSpec(name="default", devices={"A30": 4})], clock=clock, events=events)
    fabric._objects = objects  # type: ignore[assignment]
    return fabric


def stored(objects: Objects, key: str) -> dict[str, Any]:
    records = json.loads(objects.requests[NAME]["metadata"]["annotations"][ANN_OPERATIONS])
    return {r["key"]: r for r in records}[key]


def size(objects: Objects) -> int:
    return int(objects.requests[NAME]["spec"]["resource"]["size"])


def attach(fabric: ComposabilityRequestFabric, key: str) -> None:
    fabric.attach(AttachRequest(key=key, node=NODE, pool="default", model="A30", count=1))


@pytest.fixture
def failed_not_picked_up() -> tuple[Objects, Clock, Events, ComposabilityRequestFabric]:
    """A GPU in use on the node; a second attach whose resource the operator created but has not taken up (its one
    resource worker busy elsewhere) read past its wait bound: FAILED."""
    objects, clock, events = Objects(), Clock(), Events()
    fabric = fabric_on(objects, clock, events)
    attach(fabric, "first")
    objects.operator_takes_up_size({"gpu-in-use": "Online"})
    assert fabric.operation("first").state == OperationState.SUCCEEDED
    attach(fabric, "second")
    objects.operator_takes_up_size({"gpu-in-use": "Online", "gpu-new": ""})
    clock.now += WAIT_BOUND_S + 1
    return objects, clock, events, fabric


def test_the_failure_is_stored_at_once_with_its_give_back_owed_and_no_size_change_meanwhile(
        failed_not_picked_up: tuple[Objects, Clock, Events, ComposabilityRequestFabric]) -> None:
    objects, clock, events, fabric = failed_not_picked_up
    failed = fabric.operation("second")
    assert failed.state == OperationState.FAILED and failed.error is not None
    assert failed.error.code == ErrorCode.TIMEOUT
    assert "gpu-new not picked up by the operator" in failed.error.message
    assert "the give-back waits until the operator has taken up gpu-new" in failed.error.message
    record = stored(objects, "second")
    assert record["state"] == OperationState.FAILED.value and record["give_back_owed"] == ["gpu-new"]
    assert size(objects) == 2, "given back now, the operator would remove the GPU in use"
    with pytest.raises(FabricError, match="second .* still owes its give-back") as refused:
        attach(fabric, "third")  # the give-back could take this attach's resource instead
    assert refused.value.code == ErrorCode.BACKEND and size(objects) == 2


def test_a_failed_attach_whose_resource_then_comes_online_stays_failed_and_the_gpu_is_an_ordinary_one(
        failed_not_picked_up: tuple[Objects, Clock, Events, ComposabilityRequestFabric]) -> None:
    objects, clock, events, fabric = failed_not_picked_up
    reported = fabric.operation("second")
    assert reported.state == OperationState.FAILED

    objects.operator_takes_up_size({"gpu-in-use": "Online", "gpu-new": "Online"})  # the worker free: attached
    clock.now += 5
    for read in (fabric.operation("second"), *[op for op in fabric.operations() if op.key == "second"],
                 fabric_on(objects, clock, Events()).operation("second")):  # and a restarted DDS
        assert (read.state, read.devices) == (reported.state, reported.devices), read
        assert read.error is not None and reported.error is not None
        assert (read.error.code, read.error.message) == (reported.error.code, reported.error.message)
    record = stored(objects, "second")
    assert record["state"] == OperationState.FAILED.value and "give_back_owed" not in record
    assert record["arrived_late"] == ["gpu-new"]
    assert size(objects) == 2, "the late GPU is not given back: it is attached and counted"
    assert not objects.resources["gpu-new"]["metadata"].get("annotations", {}).get(ANN_DELETE_DEVICE)
    assert sorted((d.id, d.state) for d in fabric.devices(NODE)) == [("gpu-in-use", DeviceState.ONLINE),
                                                                    ("gpu-new", DeviceState.ONLINE)]
    [late] = [e for e in events.emitted if e[2] == "LateAttach"]
    assert late[:2] == (f"Node {NODE}", "Normal") and "gpu-new of the failed attach second" in late[3]
    assert "stays failed" in late[3]
    # No longer owing, the request takes size changes again: the next attach is written.
    attach(fabric, "third")
    assert size(objects) == 3


def test_a_failed_attach_whose_resource_is_taken_up_but_not_attached_gives_it_back_marked(
        failed_not_picked_up: tuple[Objects, Clock, Events, ComposabilityRequestFabric]) -> None:
    objects, clock, events, fabric = failed_not_picked_up
    assert fabric.operation("second").state == OperationState.FAILED
    assert size(objects) == 2  # still not taken up: nothing given back on a second read
    assert fabric.operation("second").state == OperationState.FAILED and size(objects) == 2

    objects.operator_takes_up_size({"gpu-in-use": "Online", "gpu-new": "Attaching"})
    # Attaching with no error (the fabric's call under way): lowered now, the size would cancel an attach the fabric
    # may complete, its device then held by no resource. Waited for.
    assert fabric.operation("second").state == OperationState.FAILED
    assert size(objects) == 2 and "give_back_owed" in stored(objects, "second")
    objects.resources["gpu-new"]["status"]["error"] = "fabric switch sw-3 is down"  # the fabric refused it
    assert fabric.operation("second").state == OperationState.FAILED
    assert size(objects) == 1
    # Marked: should it come Online before the operator reads the size, it is still the one removed, not the GPU in use.
    assert objects.resources["gpu-new"]["metadata"]["annotations"][ANN_DELETE_DEVICE] == "true"
    assert not objects.resources["gpu-in-use"]["metadata"].get("annotations", {}).get(ANN_DELETE_DEVICE)
    record = stored(objects, "second")
    assert "give_back_owed" not in record and "arrived_late" not in record
    assert not [e for e in events.emitted if e[2] == "LateAttach"]
    assert fabric.operation("second").state == OperationState.FAILED and size(objects) == 1  # given back once


def test_a_failure_whose_write_is_refused_stays_failed_when_its_gpu_then_comes_online() -> None:
    """The attach's resource taken up but failing past the error bound: FAILED, reported, but every write of the
    request refused meanwhile. The GPU then comes Online: what was reported stays (in memory until stored), it is
    stored FAILED once writes go through, and the late GPU is kept, not given back in place of the GPU in use."""
    objects, clock, events = Objects(), Clock(), Events()
    fabric = fabric_on(objects, clock, events)
    attach(fabric, "first")
    objects.operator_takes_up_size({"gpu-in-use": "Online"})
    attach(fabric, "second")
    objects.operator_takes_up_size({"gpu-in-use": "Online", "gpu-new": "Attaching"})
    objects.resources["gpu-new"]["status"]["error"] = "fabric switch sw-3 is down"
    clock.now += ComposabilitySettings().operator_error_bound_seconds + 1
    objects.refusing = True
    reported = fabric.operation("second")
    assert reported.state == OperationState.FAILED and reported.error is not None
    assert "sw-3 is down" in reported.error.message

    objects.operator_takes_up_size({"gpu-in-use": "Online", "gpu-new": "Online"})
    again = fabric.operation("second")
    assert again.state == OperationState.FAILED and again.error is not None
    assert again.error.message == reported.error.message
    objects.refusing = False
    for _ in range(2):  # stored with its give-back owed, then settled
        assert fabric.operation("second").state == OperationState.FAILED
    record = stored(objects, "second")
    assert record["state"] == OperationState.FAILED.value and record["arrived_late"] == ["gpu-new"]
    assert size(objects) == 2, "given back now, the operator would remove the GPU in use or the late one"
    assert [e[2] for e in events.emitted] == ["LateAttach"]


# --- the owed give-back's bound: a hung operator worker never takes the resource up ---

def stranded_count() -> float:
    return REGISTRY.get_sample_value("dds_gpus_stranded_total") or 0.0


def test_an_owed_give_back_past_its_bound_leaves_the_resource_stranded_beside_a_gpu_in_use_and_frees_the_request(
        failed_not_picked_up: tuple[Objects, Clock, Events, ComposabilityRequestFabric]) -> None:
    objects, clock, events, fabric = failed_not_picked_up
    assert fabric.operation("second").state == OperationState.FAILED  # stored, its give-back owed
    ended = stored(objects, "second")["finished_at"]
    clock.now = ended + WAIT_BOUND_S - 1
    assert fabric.operation("second").state == OperationState.FAILED
    assert "give_back_owed" in stored(objects, "second") and not events.emitted, "waits until its bound"
    stranded_before = stranded_count()

    clock.now = ended + WAIT_BOUND_S
    assert fabric.operation("second").state == OperationState.FAILED
    record = stored(objects, "second")
    assert "give_back_owed" not in record and record["stranded"] == ["gpu-new"], record
    assert size(objects) == 2, "given back now, the operator would remove the GPU in use"
    assert not objects.resources["gpu-in-use"]["metadata"].get("annotations", {}).get(ANN_DELETE_DEVICE)
    [overdue] = events.emitted
    assert overdue[:3] == (f"Node {NODE}", "Warning", "GiveBackOverdue"), overdue
    for said in (f"ComposabilityRequest {NAME} (Running)", "has not taken up gpu-new", "gpu-new stranded",
                 "failed attach second", "no longer held"):
        assert said in overdue[3], overdue[3]
    assert stranded_count() - stranded_before == 1
    fabric.operation("second")
    assert len(events.emitted) == 1 and stranded_count() - stranded_before == 1, "reported once"

    # The request takes size changes again; the stranded resource is no later attach's, and once the operator
    # takes it up and attaches it, it is an ordinary GPU of the node.
    attach(fabric, "third")
    assert size(objects) == 3
    objects.operator_takes_up_size({"gpu-in-use": "Online", "gpu-new": "Online", "gpu-third": "Online"})
    third = fabric.operation("third")
    assert (third.state, third.devices) == (OperationState.SUCCEEDED, ("gpu-third",)), third
    assert sorted((d.id, d.state) for d in fabric.devices(NODE)) == [
        ("gpu-in-use", DeviceState.ONLINE), ("gpu-new", DeviceState.ONLINE), ("gpu-third", DeviceState.ONLINE)]


def test_an_owed_give_back_past_its_bound_on_a_request_holding_nothing_else_is_given_back() -> None:
    """The node's first attach fails while the operator never takes its resource up: nothing else is on the request,
    so lowering the size removes exactly that resource."""
    objects, clock, events = Objects(), Clock(), Events()
    fabric = fabric_on(objects, clock, events)
    attach(fabric, "only")
    objects.operator_takes_up_size({"gpu-new": ""})
    clock.now += WAIT_BOUND_S + 1
    assert fabric.operation("only").state == OperationState.FAILED
    assert stored(objects, "only")["give_back_owed"] == ["gpu-new"] and size(objects) == 1
    stranded_before = stranded_count()

    clock.now += WAIT_BOUND_S
    assert fabric.operation("only").state == OperationState.FAILED
    record = stored(objects, "only")
    assert "give_back_owed" not in record and "stranded" not in record, record
    assert size(objects) == 0
    assert objects.resources["gpu-new"]["metadata"]["annotations"][ANN_DELETE_DEVICE] == "true"
    [overdue] = events.emitted
    assert overdue[:3] == (f"Node {NODE}", "Warning", "GiveBackOverdue") and "given back" in overdue[3], overdue
    assert stranded_count() == stranded_before


def test_an_owed_resource_read_while_the_operator_attaches_it_is_waited_for_and_kept_once_online(
        failed_not_picked_up: tuple[Objects, Clock, Events, ComposabilityRequestFabric]) -> None:
    """DDS reads on every pass: it sees the resource taken up and attaching (no error) before it is Online. Given
    back then, the size decrease would cancel the attach under way; it waits, and the GPU is kept once Online."""
    objects, clock, events, fabric = failed_not_picked_up
    assert fabric.operation("second").state == OperationState.FAILED
    objects.operator_takes_up_size({"gpu-in-use": "Online", "gpu-new": "Attaching"})
    for _ in range(3):
        clock.now += 1
        assert fabric.operation("second").state == OperationState.FAILED and size(objects) == 2
    assert not objects.resources["gpu-new"]["metadata"].get("annotations", {}).get(ANN_DELETE_DEVICE)
    objects.operator_takes_up_size({"gpu-in-use": "Online", "gpu-new": "Online"})
    assert fabric.operation("second").state == OperationState.FAILED
    assert stored(objects, "second")["arrived_late"] == ["gpu-new"] and size(objects) == 2
    assert [e[2] for e in events.emitted] == ["LateAttach"]


def test_an_owed_resource_still_attaching_at_the_bound_is_given_back_and_said(
        failed_not_picked_up: tuple[Objects, Clock, Events, ComposabilityRequestFabric]) -> None:
    objects, clock, events, fabric = failed_not_picked_up
    assert fabric.operation("second").state == OperationState.FAILED
    objects.operator_takes_up_size({"gpu-in-use": "Online", "gpu-new": "Attaching"})
    clock.now = stored(objects, "second")["finished_at"] + WAIT_BOUND_S
    assert fabric.operation("second").state == OperationState.FAILED
    assert size(objects) == 1 and "stranded" not in stored(objects, "second")
    assert objects.resources["gpu-new"]["metadata"]["annotations"][ANN_DELETE_DEVICE] == "true"
    [overdue] = events.emitted
    assert overdue[:3] == (f"Node {NODE}", "Warning", "GiveBackOverdue"), overdue
    assert "has not finished attaching gpu-new (no error)" in overdue[3] and "given back" in overdue[3], overdue
