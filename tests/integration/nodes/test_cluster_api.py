"""Cluster API's own manager (v1.14, as shipped) and the harness's kwok infrastructure provider on the real apiserver:
a MachineSet's replicas become Machines with nodeRefs and kwok Nodes; lowering replicas deletes the Machine marked
`cluster.x-k8s.io/delete-machine`, its host and its Node; v1beta1 is served through the manager's conversion webhook.
Then DDS's node backend (as its ServiceAccount) against those controllers: its removal takes the node asked for, a
Machine carrying DDS's pre-terminate hook waits, drained, with its host and Node still there until DDS releases the
hook, and a mark a crash left is released before Cluster API acts on it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from dds.controller.observe import MachineRef, machine_refs
from dds.groups.sources import MachineSetSource
from dds.kube.capi import DDS_PRE_TERMINATE_HOOK
from dds.kube.machinesets import MachineSetLister
from dds.model.groups import ANN_CAPI_DELETE_MACHINE
from dds.nodes.machineset import MARK_PREFIX, MachineSetProvisioner
from harness.capi_stack import ClusterApi, cluster_api_on
from harness.kwok_provider import BOOTSTRAP_SECRET, PROVIDER_PREFIX, infrastructure_ref
from tests.integration.nodes.harness import open_grant, wait_for

pytestmark = pytest.mark.integration

GROUP, V1BETA2 = "cluster.x-k8s.io", "v1beta2"
NODE_ANN_CLUSTER_NAMESPACE = "cluster.x-k8s.io/cluster-namespace"


@pytest.fixture
def capi(control_plane: Any, namespace: str) -> Iterator[tuple[ClusterApi, client.ApiClient]]:
    cluster_api = cluster_api_on(control_plane)
    cluster_api.workload_cluster(namespace)
    cluster_api.machine_template(namespace, "workers", {"labels": {"node.kubernetes.io/instance-type": "kwok-4c"}})
    api = control_plane.api_client()
    yield cluster_api, api
    core = client.CoreV1Api(api)  # Nodes are cluster-wide: the namespace's deletion does not take them
    for node in core.list_node().items:
        if (node.metadata.annotations or {}).get(NODE_ANN_CLUSTER_NAMESPACE) == namespace or \
                node.metadata.name.startswith(f"{namespace}-"):
            core.delete_node(node.metadata.name)
    api.close()


def machineset(namespace: str, name: str, replicas: int) -> dict[str, Any]:
    labels = {"dds.test/set": name}
    return {"apiVersion": f"{GROUP}/{V1BETA2}", "kind": "MachineSet",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterName": "kwok", "replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"clusterName": "kwok", "bootstrap": {"dataSecretName": BOOTSTRAP_SECRET},
                                           "infrastructureRef": infrastructure_ref("workers")}}}}


def machines(custom: client.CustomObjectsApi, namespace: str) -> list[dict[str, Any]]:
    return custom.list_namespaced_custom_object(GROUP, V1BETA2, namespace, "machines")["items"]


def with_node_refs(custom: client.CustomObjectsApi, namespace: str, count: int) -> list[dict[str, Any]]:
    """The namespace's Machines when exactly `count` exist and all have a nodeRef, else []."""
    found = machines(custom, namespace)
    ready = [m for m in found if (m.get("status") or {}).get("nodeRef")]
    return ready if len(found) == len(ready) == count else []


def scale(custom: client.CustomObjectsApi, namespace: str, name: str, replicas: int) -> None:
    custom.patch_namespaced_custom_object(GROUP, V1BETA2, namespace, "machinesets", name,
                                          {"spec": {"replicas": replicas}})


def test_replicas_become_machines_with_nodes_and_the_marked_machine_is_the_one_deleted(
        capi: tuple[ClusterApi, client.ApiClient], namespace: str) -> None:
    cluster_api, api = capi
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    name = f"{namespace}-ms"
    custom.create_namespaced_custom_object(GROUP, V1BETA2, namespace, "machinesets", machineset(namespace, name, 0))

    scale(custom, namespace, name, 2)
    running = wait_for("2 Machines with nodeRefs", lambda: with_node_refs(custom, namespace, 2), timeout=120)
    for machine in running:
        node = core.read_node(machine["status"]["nodeRef"]["name"])
        assert node.spec.provider_id == machine["spec"]["providerID"] == PROVIDER_PREFIX + machine["metadata"]["name"]
        assert node.metadata.labels["node.kubernetes.io/instance-type"] == "kwok-4c"
        # Cluster API itself annotated the Node with its Machine: the ownership chain DDS reads.
        assert node.metadata.annotations["cluster.x-k8s.io/machine"] == machine["metadata"]["name"]

    # The one a user (or DDS) chose: by name Cluster API's default order would take the other one first.
    marked = max(m["metadata"]["name"] for m in running)
    kept = min(m["metadata"]["name"] for m in running)
    custom.patch_namespaced_custom_object(GROUP, V1BETA2, namespace, "machines", marked,
                                          {"metadata": {"annotations": {ANN_CAPI_DELETE_MACHINE: "test"}}})
    scale(custom, namespace, name, 1)

    wait_for(f"Machine {marked} deleted", lambda: marked not in {m["metadata"]["name"]
                                                                 for m in machines(custom, namespace)}, timeout=120)
    assert marked in cluster_api.provider.removed_hosts
    wait_for(f"Node {marked} deleted by Cluster API",
             lambda: marked not in {n.metadata.name for n in core.list_node().items}, timeout=60)
    left = machines(custom, namespace)
    assert [m["metadata"]["name"] for m in left] == [kept]
    assert core.read_node(kept).spec.provider_id == PROVIDER_PREFIX + kept


def test_v1beta1_is_served_through_the_managers_conversion_webhook(
        capi: tuple[ClusterApi, client.ApiClient], namespace: str) -> None:
    _, api = capi
    custom = client.CustomObjectsApi(api)
    name = f"{namespace}-old"
    custom.create_namespaced_custom_object(GROUP, V1BETA2, namespace, "machinesets", machineset(namespace, name, 0))

    old = custom.get_namespaced_custom_object(GROUP, "v1beta1", namespace, "machinesets", name)

    ref = old["spec"]["template"]["spec"]["infrastructureRef"]
    assert ref["apiVersion"].startswith("infrastructure.harness.dds.cdi.dev/") and "apiGroup" not in ref


# --- DDS's node backend against the real controllers (as DDS's ServiceAccount) ---

def dds_machineset(namespace: str, name: str) -> dict[str, Any]:
    manifest = machineset(namespace, name, 0)
    manifest["metadata"]["annotations"] = {
        "dds.cdi.dev/enabled": "true",
        "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "0",
        "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "4",
        "capacity.cluster-autoscaler.kubernetes.io/cpu": "4", "capacity.cluster-autoscaler.kubernetes.io/memory": "16Gi",
        "dds.cdi.dev/max-gpus-per-node": "4", "dds.cdi.dev/gpu-models": "A30"}
    return manifest


def dds_group(dds_api: client.ApiClient, namespace: str, name: str) -> Any:
    read = MachineSetSource(MachineSetLister(dds_api, [namespace]), open_grant(namespace)).read()
    assert not read.errors, read.errors
    return next(g for g in read.groups if g.source.name == name)


def refs(custom: client.CustomObjectsApi, namespace: str) -> dict[str, MachineRef]:
    return {m.name: m for m in machine_refs(machines(custom, namespace))}


def dds_group_with_two_nodes(custom: client.CustomObjectsApi, dds_api: client.ApiClient, namespace: str
                             ) -> tuple[Any, MachineSetProvisioner, list[dict[str, Any]]]:
    """A DDS group on a MachineSet scaled to 2 by DDS's backend; returns it, the backend and the running Machines."""
    name = f"{namespace}-gpu"
    custom.create_namespaced_custom_object(GROUP, V1BETA2, namespace, "machinesets", dds_machineset(namespace, name))
    group = dds_group(dds_api, namespace, name)
    provisioner = MachineSetProvisioner(dds_api, time.time)
    provisioner.add_nodes(group, 2, key="up-1")
    return group, provisioner, wait_for("2 Machines with nodeRefs", lambda: with_node_refs(custom, namespace, 2),
                                        timeout=120)


def test_a_dds_removal_takes_the_node_asked_for_and_its_host_waits_for_ddss_pre_terminate_hook(
        capi: tuple[ClusterApi, client.ApiClient], namespace: str, dds_api: client.ApiClient) -> None:
    cluster_api, api = capi
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    group, provisioner, running = dds_group_with_two_nodes(custom, dds_api, namespace)
    chosen = max(m["metadata"]["name"] for m in running)  # Cluster API's own order would take the other first
    node = next(m["status"]["nodeRef"]["name"] for m in running if m["metadata"]["name"] == chosen)
    provisioner.set_hook(group, chosen, DDS_PRE_TERMINATE_HOOK, held=True)  # its node holds GPUs

    provisioner.remove_node(group, node, key="down-1")

    held = wait_for(f"Machine {chosen} waiting for DDS's pre-terminate hook",
                    lambda: refs(custom, namespace)[chosen].awaiting_pre_terminate, timeout=120)
    assert held
    others = [m for m in refs(custom, namespace).values() if m.name != chosen]
    assert [(m.terminating, m.awaiting_pre_terminate) for m in others] == [(False, False)]
    # Drained, but the host and its Node are still there: DDS can still detach the node's GPUs through the fabric.
    assert chosen in cluster_api.provider.hosts and core.read_node(node).spec.unschedulable

    provisioner.set_hook(group, chosen, DDS_PRE_TERMINATE_HOOK, held=False)

    wait_for(f"Machine {chosen} gone", lambda: chosen not in refs(custom, namespace), timeout=120)
    assert chosen in cluster_api.provider.removed_hosts
    wait_for(f"Node {node} deleted", lambda: node not in {n.metadata.name for n in core.list_node().items}, timeout=60)


def test_a_mark_left_between_the_mark_and_the_replica_write_is_released_before_cluster_api_acts_on_it(
        capi: tuple[ClusterApi, client.ApiClient], namespace: str, dds_api: client.ApiClient) -> None:
    _, api = capi
    custom = client.CustomObjectsApi(api)
    group, provisioner, running = dds_group_with_two_nodes(custom, dds_api, namespace)
    # DDS marked this one, then died before lowering replicas (crashpoint nodes.remove.marked).
    leftover = max(m["metadata"]["name"] for m in running)
    custom.patch_namespaced_custom_object(GROUP, V1BETA2, namespace, "machines", leftover, {
        "metadata": {"annotations": {ANN_CAPI_DELETE_MACHINE: f"{MARK_PREFIX}1000"}}})

    assert provisioner.release_leftover_marks(group) == (leftover,)

    # Someone else now scales down by one: Cluster API's own order decides, not the forgotten mark.
    scale(custom, namespace, group.source.name, 1)
    wait_for("one Machine left", lambda: len(machines(custom, namespace)) == 1, timeout=120)
    assert [m["metadata"]["name"] for m in machines(custom, namespace)] == [leftover]


# --- a MachineDeployment node group: DDS scales the MachineDeployment, Cluster API's controllers do the rest ---

def dds_machinedeployment(namespace: str, name: str) -> dict[str, Any]:
    manifest = dds_machineset(namespace, name)
    manifest["kind"] = "MachineDeployment"
    return manifest


def test_a_machinedeployment_group_scales_the_machinedeployment_and_its_removal_takes_the_node_asked_for(
        capi: tuple[ClusterApi, client.ApiClient], namespace: str, dds_api: client.ApiClient) -> None:
    cluster_api, api = capi
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    name = f"{namespace}-md"
    custom.create_namespaced_custom_object(GROUP, V1BETA2, namespace, "machinedeployments",
                                           dds_machinedeployment(namespace, name))
    # Cluster API copies the MachineDeployment's annotations (the opt-in too) to its MachineSet: one group, no error.
    wait_for("the MachineDeployment's MachineSet", lambda: custom.list_namespaced_custom_object(
        GROUP, V1BETA2, namespace, "machinesets")["items"], timeout=60)
    group = dds_group(dds_api, namespace, name)
    assert (group.id, group.source.kind) == (f"MachineDeployment/{namespace}/{name}", "MachineDeployment")
    provisioner = MachineSetProvisioner(dds_api, time.time)

    provisioner.add_nodes(group, 2, key="up-md")

    running = wait_for("2 Machines with nodeRefs", lambda: with_node_refs(custom, namespace, 2), timeout=120)
    assert custom.get_namespaced_custom_object(GROUP, V1BETA2, namespace, "machinedeployments", name)[
        "spec"]["replicas"] == 2
    assert sorted(m.name for m in provisioner.machines(group)) == sorted(m["metadata"]["name"] for m in running)
    # The observer counts them in the MachineDeployment's group (the label its controller puts on its Machines).
    assert {m.group_id for m in refs(custom, namespace).values()} == {group.id}
    chosen = max(m["metadata"]["name"] for m in running)  # the MachineSet's own order would take the other first
    kept = min(m["metadata"]["name"] for m in running)
    node = next(m["status"]["nodeRef"]["name"] for m in running if m["metadata"]["name"] == chosen)

    provisioner.remove_node(group, node, key="down-md")

    wait_for(f"Machine {chosen} deleted", lambda: chosen not in {m["metadata"]["name"]
                                                                 for m in machines(custom, namespace)}, timeout=120)
    assert chosen in cluster_api.provider.removed_hosts
    wait_for(f"Node {node} deleted by Cluster API",
             lambda: node not in {n.metadata.name for n in core.list_node().items}, timeout=60)
    assert [m["metadata"]["name"] for m in machines(custom, namespace)] == [kept]
    deployment = custom.get_namespaced_custom_object(GROUP, V1BETA2, namespace, "machinedeployments", name)
    assert deployment["spec"]["replicas"] == 1
    (machineset,) = custom.list_namespaced_custom_object(GROUP, V1BETA2, namespace, "machinesets")["items"]
    assert machineset["spec"]["replicas"] == 1  # the MachineDeployment controller passed the lower count on
