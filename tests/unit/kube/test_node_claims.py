"""Which Node is which Machine's (dds/kube/capi.py `node_claims`) and which group a Node is then in
(dds/controller/observe.py `machine_refs`): through the ownership Cluster API records (ownerReference and the
cluster.x-k8s.io/set-name label it writes) and status.nodeRef, never spec.providerID; a Node two Machines name stays
with the Machine that had it first. Refused claims are told once, on the Machine (dds/controller/node_claims.py)."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from dds import metrics
from dds.controller.node_claims import NodeClaimReporter
from dds.controller.observe import Observation, machine_refs
from dds.kube import capi
from dds.model.snapshot import Snapshot

from tests.unit.provider.conftest import RecordingEvents


def machine(namespace: str, name: str, *, owner: Optional[str] = "workers", label: Optional[str] = "same",
            node: Optional[str] = None, provider_id: str = "", created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    labels = {} if label is None else {capi.LABEL_SET_NAME: owner if label == "same" else label}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": labels,
                            "creationTimestamp": created}
    if owner is not None:
        meta["ownerReferences"] = [{"kind": "MachineSet", "name": owner, "uid": f"uid-ms-{owner}", "controller": True}]
    return {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": meta,
            "spec": {"providerID": provider_id}, "status": {"nodeRef": {"name": node}} if node else {}}


def group_of_each_node(machines: list[dict[str, Any]]) -> dict[str, str]:
    return {ref.node_name: ref.group_id for ref in machine_refs(machines) if ref.node_name}


TEAM_B_MACHINE = machine("team-b", "b-1", owner="gpu", node="node-b", provider_id="kwok://node-b",
                         created="2026-01-01T00:00:00Z")


@pytest.mark.parametrize("machines, expected", [
    pytest.param([TEAM_B_MACHINE], {"node-b": "MachineSet/team-b/gpu"}, id="owned-with-noderef"),
    pytest.param([machine("team-a", "a-1", provider_id="kwok://node-b")], {},
                 id="providerID-alone-is-not-enough"),
    pytest.param([machine("team-a", "a-1", owner=None, node="node-a")], {}, id="no-owner-reference"),
    pytest.param([machine("team-a", "a-1", label=None, node="node-a")], {}, id="no-set-name-label"),
    pytest.param([machine("team-a", "a-1", label="other", node="node-a")], {}, id="label-names-another-machineset"),
    pytest.param([TEAM_B_MACHINE, machine("team-a", "copy", node="node-b", provider_id="kwok://node-b",
                                          created="2026-01-02T00:00:00Z")],
                 {"node-b": "MachineSet/team-b/gpu"}, id="copied-providerID-later-loses"),
    pytest.param([machine("team-a", "copy", node="node-b", provider_id="kwok://node-b",
                          created="2026-01-02T00:00:00Z"), TEAM_B_MACHINE],
                 {"node-b": "MachineSet/team-b/gpu"}, id="listed-first-still-loses"),
])
def test_a_node_is_in_a_group_only_through_ownership_cluster_api_records(machines, expected):
    assert group_of_each_node(machines) == expected


def test_the_long_machineset_name_label_is_cluster_apis_hash():
    name = "a" * 70
    assert capi.set_name_label(name) == "hash_WQR0Cw_z"  # FNV-32a of the name, as Cluster API's MustFormatValue
    assert group_of_each_node([machine("ns", "m", owner=name, label=capi.set_name_label(name), node="n")]) == {
        "n": f"MachineSet/ns/{name}"}


def test_the_refused_machine_is_kept_without_its_node_and_says_why():
    copy = machine("team-a", "copy", node="node-b", created="2026-01-02T00:00:00Z")
    refs = {ref.name: ref for ref in machine_refs([TEAM_B_MACHINE, copy])}
    assert refs["b-1"].refused == "" and refs["b-1"].node_name == "node-b"
    assert refs["copy"].node_name is None
    assert "Node node-b, which Machine team-b/b-1 (created before it) has" in refs["copy"].refused
    assert "not counted in MachineSet team-a/workers" in refs["copy"].refused


def test_a_refused_claim_is_told_once_on_the_machine():
    copy = machine("team-a", "copy", node="node-b", created="2026-01-02T00:00:00Z")
    events = RecordingEvents()
    reporter = NodeClaimReporter(events)
    observation = Observation(snapshot=Snapshot(now=0.0, nodes=(), pods=(), groups=(), pools=()),
                              machines=machine_refs([TEAM_B_MACHINE, copy]))
    before = metrics.MACHINE_CLAIMS_REFUSED._value.get()

    reporter.run(observation)
    reporter.run(observation)

    (involved, event_type, reason, message), = events.events
    assert (involved.kind, involved.namespace, involved.name, involved.uid) == ("Machine", "team-a", "copy", "uid-copy")
    assert (event_type, reason) == ("Warning", "InvalidNodeGroup") and "node-b" in message
    assert metrics.MACHINE_CLAIMS_REFUSED._value.get() == before + 1
