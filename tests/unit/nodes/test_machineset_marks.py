"""A delete-machine mark is not inert under real Cluster API (its next scale-down deletes marked Machines first), so
the machineset backend takes back a mark whose replica write failed, and releases marks a crash left at start."""

from __future__ import annotations

import copy
from typing import Any, Optional

import pytest

from dds.kube.capi import MACHINES, MACHINESETS
from dds.kube.errors import ApiError
from dds.model.groups import ANN_CAPI_DELETE_MACHINE
from dds.nodes.errors import MachineSetNotFound, NodeBackendError, NodeBackendUnavailable
from dds.nodes.machineset import (ANN_SCALE_REQUESTS, MARK_PREFIX, AppliedRequest, MachineSetProvisioner,
                                  RequestKind, history_text)
from tests.unit.nodes.builders import make_group, make_machine, make_machineset


class FakeCapi:
    """MachineSets and Machines in memory; a MachineSet patch can be made to fail (status) or to conflict."""

    def __init__(self, machineset: dict[str, Any], machines: list[dict[str, Any]]) -> None:
        self.objects = {(MACHINESETS, machineset["metadata"]["name"]): machineset,
                        **{(MACHINES, m["metadata"]["name"]): m for m in machines}}
        self.fail_machineset_patch: Optional[int] = None
        self.conflicts = 0

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.objects[(plural, name)])

    def list(self, plural: str, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for (p, _), o in self.objects.items() if p == plural]

    def patch(self, plural: str, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        if plural == MACHINESETS and self.conflicts:
            self.conflicts -= 1
            raise ApiError(409, "Conflict", "the object has been modified")
        if plural == MACHINESETS and self.fail_machineset_patch:
            raise ApiError(self.fail_machineset_patch, "Forbidden", "denied")
        obj = self.objects[(plural, name)]
        annotations = obj["metadata"].setdefault("annotations", {})
        for key, value in (body.get("metadata", {}).get("annotations") or {}).items():
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value
        obj["spec"].update(body.get("spec") or {})
        return copy.deepcopy(obj)

    def marks(self) -> dict[str, str]:
        return {name: o["metadata"]["annotations"][ANN_CAPI_DELETE_MACHINE] for (p, name), o in self.objects.items()
                if p == MACHINES and ANN_CAPI_DELETE_MACHINE in o["metadata"].get("annotations", {})}


def provisioner_on(fake: FakeCapi) -> MachineSetProvisioner:
    provisioner = MachineSetProvisioner(api=None, clock=lambda: 1000.0)  # type: ignore[arg-type]
    provisioner._capi = fake  # type: ignore[assignment]
    return provisioner


def two_machines() -> list[dict[str, Any]]:
    return [make_machine("gpu-workers-a", node="node-a", phase="Running"),
            make_machine("gpu-workers-b", node="node-b", phase="Running")]


@pytest.mark.parametrize("status, error", [(403, NodeBackendError), (503, NodeBackendUnavailable)])
def test_a_failed_replica_write_takes_back_the_mark_it_set(status: int, error: type) -> None:
    fake = FakeCapi(make_machineset(replicas=2), two_machines())
    fake.fail_machineset_patch = status

    with pytest.raises(error):
        provisioner_on(fake).remove_node(make_group(), "node-b", key="k1")

    assert fake.marks() == {}
    assert fake.objects[(MACHINESETS, "gpu-workers")]["spec"]["replicas"] == 2


def test_conflicts_to_the_end_take_back_the_mark_too() -> None:
    fake = FakeCapi(make_machineset(replicas=2), two_machines())
    fake.conflicts = 1000

    with pytest.raises(NodeBackendUnavailable, match="kept changing"):
        provisioner_on(fake).remove_node(make_group(), "node-b", key="k1")

    assert fake.marks() == {}


def test_a_mark_someone_else_set_stays_when_the_write_fails() -> None:
    machines = two_machines()
    machines[1]["metadata"]["annotations"][ANN_CAPI_DELETE_MACHINE] = "2026-01-01T00:00:00Z"  # cluster-autoscaler's
    fake = FakeCapi(make_machineset(replicas=2), machines)
    fake.fail_machineset_patch = 403

    with pytest.raises(NodeBackendError):
        provisioner_on(fake).remove_node(make_group(), "node-b", key="k1")

    assert fake.marks() == {"gpu-workers-b": "2026-01-01T00:00:00Z"}


def test_a_completed_removal_keeps_its_mark_for_cluster_api() -> None:
    fake = FakeCapi(make_machineset(replicas=2), two_machines())

    provisioner_on(fake).remove_node(make_group(), "node-b", key="k1")

    assert fake.marks() == {"gpu-workers-b": f"{MARK_PREFIX}1000"}
    assert fake.objects[(MACHINESETS, "gpu-workers")]["spec"]["replicas"] == 1


def test_only_dds_marks_without_a_recorded_removal_are_released() -> None:
    machines = [make_machine("gpu-workers-a", node="node-a"), make_machine("gpu-workers-b", node="node-b"),
                make_machine("gpu-workers-c", node="node-c"), make_machine("gpu-workers-d", node="node-d"),
                make_machine("gpu-workers-e", node="node-e", deleting=True)]
    marks = {"gpu-workers-a": f"{MARK_PREFIX}900",  # a crash between the mark and the replica write
             "gpu-workers-b": f"{MARK_PREFIX}901",  # removal recorded: Cluster API is deleting it
             "gpu-workers-c": "2026-01-01T00:00:00Z",  # cluster-autoscaler's or a user's
             "gpu-workers-e": f"{MARK_PREFIX}902"}  # already deleting: the mark no longer chooses anything
    for machine in machines:
        name = machine["metadata"]["name"]
        if name in marks:
            machine["metadata"]["annotations"][ANN_CAPI_DELETE_MACHINE] = marks[name]
    machineset = make_machineset(replicas=3)
    machineset["metadata"]["annotations"] = {ANN_SCALE_REQUESTS: history_text(
        [AppliedRequest(key="r1", kind=RequestKind.REMOVE, replicas=3, machine="gpu-workers-b")])}
    fake = FakeCapi(machineset, machines)

    released = provisioner_on(fake).release_leftover_marks(make_group())

    assert released == ("gpu-workers-a",)
    assert sorted(fake.marks()) == ["gpu-workers-b", "gpu-workers-c", "gpu-workers-e"]


def test_a_machineset_being_deleted_gets_no_replica() -> None:
    """Cluster API holds a deleted MachineSet (its finalizer) while it deletes the Machines: a replica written then
    would be a node asked for that never comes."""
    machineset = make_machineset(replicas=2)
    machineset["metadata"]["deletionTimestamp"] = "2026-11-29T06:00:00Z"
    fake = FakeCapi(machineset, two_machines())

    with pytest.raises(MachineSetNotFound, match="gpu-workers is being deleted; nothing changed"):
        provisioner_on(fake).add_nodes(make_group(), 1, key="k1")

    assert fake.objects[(MACHINESETS, "gpu-workers")]["spec"]["replicas"] == 2
    assert ANN_SCALE_REQUESTS not in fake.objects[(MACHINESETS, "gpu-workers")]["metadata"].get("annotations", {})
