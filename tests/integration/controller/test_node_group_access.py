"""The node group access boundary on the real apiserver, DDS as `dds serve` builds it under its shipped RBAC
(tests/unit/provider/test_node_group_access.py and tests/unit/kube/test_node_claims.py cover each rule):

- MachineSets asking for more than their namespace is granted (settings node_group_namespaces), or naming a key DDS
  does not know, are not served, and each gets an InvalidNodeGroup Event saying why, as `kubectl describe` shows it;
- a Machine of another namespace whose spec.providerID is a copy of a node's (and whose status.nodeRef Cluster API
  then sets to that node) does not take the node out of its group; the Machine gets an InvalidNodeGroup Event."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from dds import metrics
from dds.config import NamespaceGrant
from dds.groups.access import COOLDOWN_BELOW_FLOOR, FORCE_DETACH_NOT_ALLOWED, NAMESPACE_NOT_ALLOWED, POOL_NOT_ALLOWED
from dds.groups.schema import UNKNOWN_KEY
from dds.kube import capi
from dds.model import groups as g
from dds.scaling.requests import RequestNode
from tests.integration.controller.harness import ControllerHarness
from harness.kwok_provider import INFRA_GROUP
from tests.integration.nodes.harness import GROUP, PAUSED, machineset_manifest, open_grant, wait_for


def create_machineset(api: client.ApiClient, namespace: str, name: str, **annotations: str) -> dict[str, Any]:
    manifest = machineset_manifest(name)
    manifest["metadata"]["annotations"].update(annotations)
    return client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, "v1beta2", namespace, "machinesets",
                                                                        manifest)


def invalid_node_group_events(api: client.ApiClient, namespace: str, kind: str) -> dict[str, list[str]]:
    items = client.CoreV1Api(api).list_namespaced_event(namespace, field_selector=f"involvedObject.kind={kind}").items
    out: dict[str, list[str]] = {}
    for event in items:
        if event.reason == "InvalidNodeGroup":
            out.setdefault(event.involved_object.name, []).append(event.message)
    return out


REASONS = (NAMESPACE_NOT_ALLOWED, POOL_NOT_ALLOWED, FORCE_DETACH_NOT_ALLOWED, COOLDOWN_BELOW_FLOOR, UNKNOWN_KEY)


def counted(reason: str) -> float:
    return metrics.NODE_GROUP_CONFIG_ERRORS.labels("machineset", reason)._value.get()


def test_machinesets_asking_for_more_than_their_namespace_is_granted_are_refused_with_an_event(
        dds: ControllerHarness, control_plane: Any) -> None:
    admin, team, outsider = dds.api, dds.namespace, f"{dds.namespace}-out"
    control_plane.create_namespace(outsider)
    try:
        dds.settings = dds.settings.model_copy(update={
            "machineset_namespaces": [team, outsider],
            "node_group_namespaces": {team: NamespaceGrant(pools=["pool-a"])}})
        app = dds.restart_dds()
        before = {reason: counted(reason) for reason in REASONS}
        create_machineset(admin, outsider, "elsewhere", **{g.ANN_FABRIC_POOL: "pool-a"})
        create_machineset(admin, team, "good", **{g.ANN_FABRIC_POOL: "pool-a"})
        create_machineset(admin, team, "steal", **{g.ANN_FABRIC_POOL: "default"})
        create_machineset(admin, team, "force", **{g.ANN_FABRIC_POOL: "pool-a", g.ANN_FORCE_DETACH: "true",
                                                   g.ANN_GPU_IDLE_COOLDOWN: "0"})
        create_machineset(admin, team, "typo", **{g.ANN_FABRIC_POOL: "pool-a", "dds.cdi.dev/max-gpu-per-node": "8"})

        assert app.catalog.refresh()
        assert [spec.id for spec in app.catalog.groups()] == [f"MachineSet/{team}/good"]
        app.events.flush()

        ours = wait_for("an Event on each refused MachineSet", lambda: (
            lambda found: found if set(found) == {"steal", "force", "typo"} else None)(
                invalid_node_group_events(admin, team, "MachineSet")))
        theirs = wait_for("an Event on the MachineSet of the namespace not granted",
                          lambda: invalid_node_group_events(admin, outsider, "MachineSet"))
        assert "namespace " + outsider + " may not have node groups" in theirs["elsewhere"][0]
        assert any("pool default is not one namespace" in m for m in ours["steal"]), ours["steal"]
        assert {m.split(":")[0] for m in ours["force"]} == {g.ANN_FORCE_DETACH, g.ANN_GPU_IDLE_COOLDOWN}
        assert "did you mean dds.cdi.dev/max-gpus-per-node?" in ours["typo"][0]
        after = {reason: counted(reason) for reason in REASONS}
        assert all(after[reason] > before[reason] for reason in REASONS), (before, after)
    finally:
        control_plane.delete_namespace(outsider)


def test_a_machine_with_a_copied_provider_id_does_not_take_another_namespaces_node(
        dds: ControllerHarness, control_plane: Any) -> None:
    admin, team_b, team_a = dds.api, dds.namespace, f"{dds.namespace}-a"
    control_plane.create_namespace(team_a)
    try:
        group = dds.create_group("gpu", replicas=1)
        (node_name,) = dds.node_names()
        node = client.CoreV1Api(admin).read_node(node_name)
        dds.settings = dds.settings.model_copy(update={
            "machineset_namespaces": [team_b, team_a],
            "node_group_namespaces": {**open_grant(team_b), team_a: NamespaceGrant(pools=["pool-a"])}})
        app = dds.restart_dds()

        # Team A's user: a MachineSet of its own (not even opted in) and a Machine it owns, with team B's node's
        # providerID. Cluster API's machine controller then sets the Machine's status.nodeRef to that node: it looks
        # the Node up by spec.providerID and never asks whether another Machine has it
        # (core/reconcilers/machine/machine_controller_noderef.go); played here by the test, both objects paused so
        # that Cluster API's controllers leave them as written (team A has no hosts for them to make).
        objects = client.CustomObjectsApi(admin)
        plain = machineset_manifest("plain", replicas=1)
        del plain["metadata"]["annotations"][g.ANN_ENABLED]
        plain["metadata"]["annotations"][PAUSED] = ""
        owner = objects.create_namespaced_custom_object(GROUP, "v1beta2", team_a, "machinesets", plain)
        objects.create_namespaced_custom_object(GROUP, "v1beta2", team_a, "machines", {
            "apiVersion": f"{GROUP}/v1beta2", "kind": "Machine",
            "metadata": {"name": "copy", "labels": {capi.LABEL_SET_NAME: "plain"}, "annotations": {PAUSED: ""},
                         "ownerReferences": [{"apiVersion": f"{GROUP}/v1beta2", "kind": "MachineSet", "name": "plain",
                                              "uid": owner["metadata"]["uid"], "controller": True}]},
            "spec": {"clusterName": "demo", "providerID": node.spec.provider_id,
                     "bootstrap": {"dataSecretName": "plain-bootstrap"},
                     "infrastructureRef": {"apiGroup": INFRA_GROUP, "kind": "KwokMachine", "name": "copy"}}})
        objects.patch_namespaced_custom_object_status(GROUP, "v1beta2", team_a, "machines", "copy",
                                                      {"status": {"nodeRef": {"name": node_name}}})

        dds.run_once()
        observation = app.controller.observer.observe()
        assert {n.name: n.group_id for n in observation.snapshot.nodes}[node_name] == group.id
        # cluster-autoscaler asking which group the node is in gets team B's (a spec-fixed group's live nodes are in
        # its companion `<id>#live`).
        found = app.registry.group_for_node(RequestNode(name=node_name, provider_id=node.spec.provider_id))
        assert found is not None and found.id.partition("#")[0] == group.id
        app.events.flush()
        events = wait_for("an Event on the Machine naming another namespace's node",
                          lambda: invalid_node_group_events(admin, team_a, "Machine").get("copy"))
        assert f"names Node {node_name}" in events[0] and f"{team_b}/" in events[0], events
    finally:
        control_plane.delete_namespace(team_a)
