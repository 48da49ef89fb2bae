"""The pure parts of the Cluster API node backend: the request record, the group -> MachineSet mapping, how a
Machine reads as MachineInfo, and which Machine a node is."""

from __future__ import annotations

import json

import pytest

from dds.kube import capi
from dds.model.groups import SourceRef
from dds.nodes.base import MachinePhase
from dds.nodes.machineset import (ANN_SCALE_REQUESTS, AppliedRequest, RequestKind, find_request, history_text,
                                  ScalableRef, machine_info, machine_of_node, machine_phase, read_history,
                                  scalable_ref,
                                  with_request)
from tests.unit.nodes.builders import make_group, make_machine, make_machineset


def add(key: str, replicas: int) -> AppliedRequest:
    return AppliedRequest(key=key, kind=RequestKind.ADD, replicas=replicas, count=1, at=12.5)


def test_history_round_trips_through_the_annotation() -> None:
    history = (add("a", 2), AppliedRequest(key="b", kind=RequestKind.REMOVE, replicas=1, machine="gpu-workers-x"))
    text = history_text(history)
    assert read_history({ANN_SCALE_REQUESTS: text}) == history
    assert json.loads(text)[1] == {"key": "b", "kind": "remove", "replicas": 1, "machine": "gpu-workers-x"}


def test_history_keeps_the_newest_entries_only() -> None:
    history: tuple[AppliedRequest, ...] = ()
    for index in range(7):
        history = with_request(history, add(f"k{index}", index), limit=5)
    assert [e.key for e in history] == ["k2", "k3", "k4", "k5", "k6"]
    assert find_request(history, "k1") is None
    assert find_request(history, "k6") == add("k6", 6)


@pytest.mark.parametrize("text", ["not json", '[{"kind": "add"}]', '[{"key": "a", "kind": "grow", "replicas": 1}]'],
                         ids=["not-json", "no-key", "unknown-kind"])
def test_an_unreadable_history_counts_as_empty(text: str) -> None:
    assert read_history({ANN_SCALE_REQUESTS: text}) == ()


def test_machineset_of_a_group_comes_from_its_source() -> None:
    assert scalable_ref(make_group("gpu-workers", "team-a")) == ScalableRef("MachineSet", "team-a", "gpu-workers")


def test_a_machinedeployment_group_scales_its_machinedeployment() -> None:
    source = SourceRef(kind="MachineDeployment", name="md-0", namespace="team-a")
    group = make_group().model_copy(update={"id": "MachineDeployment/team-a/md-0", "source": source})
    ref = scalable_ref(group)
    assert (ref, ref.plural) == (ScalableRef("MachineDeployment", "team-a", "md-0"), "machinedeployments")


def test_machineset_of_a_group_falls_back_to_its_id() -> None:
    group = make_group().model_copy(update={"source": SourceRef(kind="File", name="groups.yaml#x")})
    assert scalable_ref(group) == ScalableRef("MachineSet", "default", "gpu-workers")


def test_a_group_that_is_no_machineset_is_refused_with_its_source() -> None:
    group = make_group().model_copy(update={"id": "small", "source": SourceRef(kind="File", name="groups.yaml#small")})
    with pytest.raises(ValueError, match="small .*groups.yaml#small.* not a Cluster API MachineSet or MachineDeploym"):
        scalable_ref(group)


@pytest.mark.parametrize(("machine", "phase"), [
    (make_machine("m", phase=""), MachinePhase.PROVISIONING),
    (make_machine("m", phase="Provisioning"), MachinePhase.PROVISIONING),
    (make_machine("m", phase="Provisioned"), MachinePhase.PROVISIONING),
    (make_machine("m", phase="Running"), MachinePhase.PROVISIONING),  # no nodeRef yet
    (make_machine("m", phase="Running", node="m"), MachinePhase.RUNNING),
    (make_machine("m", phase="Running", node="m", marked=True), MachinePhase.DELETING),
    (make_machine("m", phase="Running", node="m", deleting=True), MachinePhase.DELETING),
    (make_machine("m", phase="Deleting"), MachinePhase.DELETING),
    (make_machine("m", phase="Failed"), MachinePhase.FAILED),
    (make_machine("m", phase="Provisioning", failure="quota exceeded"), MachinePhase.FAILED),
], ids=["new", "provisioning", "provisioned", "running-without-node", "running", "marked", "deleting",
        "deleting-phase", "failed", "failure-message"])
def test_machine_phase(machine: dict, phase: MachinePhase) -> None:
    assert machine_phase(machine) == phase


def test_machine_info_carries_node_provider_id_and_error() -> None:
    info = machine_info("MachineSet/default/gpu-workers",
                        make_machine("gpu-workers-abc", phase="Failed", failure="no capacity",
                                     created="2026-01-01T00:00:10Z"))
    assert (info.name, info.provider_id, info.node_name, info.error) == (
        "gpu-workers-abc", "kwok://gpu-workers-abc", None, "no capacity")
    assert info.created_at == 1767225610.0


def test_v1beta2_failure_message_is_read_from_its_deprecated_home() -> None:
    machine = make_machine("m")
    machine["status"] = {"phase": "Failed", "deprecated": {"v1beta1": {"failureMessage": "boom"}}}
    assert capi.failure_message(machine) == "boom"


def test_a_node_is_found_by_its_node_ref_then_by_machine_name() -> None:
    registered = make_machine("ms-a", node="worker-1")
    pending = make_machine("ms-b")
    assert machine_of_node([registered, pending], "worker-1") is registered
    assert machine_of_node([registered, pending], "ms-b") is pending
    assert machine_of_node([registered, pending], "worker-9") is None


def test_ownership_needs_the_machineset_name_namespace_and_uid() -> None:
    machineset = make_machineset(uid="uid-1")
    assert capi.owned_by(make_machine("a", owner_uid="uid-1"), machineset)
    assert not capi.owned_by(make_machine("a", owner_uid="uid-old"), machineset)  # recreated under the same name
    assert not capi.owned_by(make_machine("a", owner="other"), machineset)
    assert not capi.owned_by(make_machine("a", namespace="elsewhere"), machineset)
