"""The trimmed Cluster API CRDs DDS ships for clusters without Cluster API (manifests/crds/cluster-api), on a control
plane of this module's own that has them (the session's runs Cluster API's own CRDs and manager): the fields DDS reads
and writes, both served versions, the scale subresource, and schema validation doing its job."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from dds.kube.machinesets import MachineSetLister
from harness import rbac
from harness.controlplane import REPO_ROOT, ControlPlane
from harness.pytest_plugin import own_control_plane

pytestmark = pytest.mark.integration

GROUP = "cluster.x-k8s.io"
EXAMPLE = REPO_ROOT / "manifests" / "examples" / "machineset-gpu-workers.yaml"


@pytest.fixture(scope="module")
def control_plane(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A plane with the trimmed CRDs start_control_plane installs, and no Cluster API."""
    yield from own_control_plane(request, tmp_path_factory)


@pytest.fixture(scope="module")
def dds_kubeconfig(control_plane: ControlPlane) -> Path:
    return rbac.install(control_plane, rbac.DDS)


@pytest.fixture
def api(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    with control_plane.api_client() as api:
        yield api


@pytest.fixture
def objects(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def example_machineset(namespace: str) -> dict[str, Any]:
    """The example MachineSet (v1beta2) as a v1beta1 manifest of the same group: apiVersion, and the infrastructure
    reference by apiVersion instead of apiGroup, as manifests written for earlier Cluster API releases have it."""
    machineset = yaml.safe_load(Path(EXAMPLE).read_text())
    machineset["metadata"]["namespace"] = namespace
    machineset["apiVersion"] = f"{GROUP}/v1beta1"
    reference = machineset["spec"]["template"]["spec"]["infrastructureRef"]
    reference["apiVersion"] = f"{reference.pop('apiGroup')}/v1beta1"
    return machineset


def test_a_v1beta1_machineset_reads_back_whole_as_v1beta2(objects: client.CustomObjectsApi, namespace: str,
                                                          dds_api: client.ApiClient) -> None:
    written = example_machineset(namespace)
    objects.create_namespaced_custom_object(GROUP, "v1beta1", namespace, "machinesets", written)

    read = objects.get_namespaced_custom_object(GROUP, "v1beta2", namespace, "machinesets", "gpu-workers")
    assert read["apiVersion"] == f"{GROUP}/v1beta2"
    assert read["spec"] == written["spec"], "nothing the v1beta1 manifest carried is dropped"
    assert read["metadata"]["annotations"] == written["metadata"]["annotations"]

    [listed] = MachineSetLister(dds_api, namespaces=[namespace]).list()  # DDS's reader, as its ServiceAccount
    assert (listed.group_id, listed.api_version, listed.replicas) == (
        f"MachineSet/{namespace}/gpu-workers", f"{GROUP}/v1beta2", 1)
    assert listed.annotations["dds.cdi.dev/max-gpus-per-node"] == "4"


def test_the_scale_subresource_moves_spec_replicas_and_reports_status(objects: client.CustomObjectsApi,
                                                                      namespace: str) -> None:
    objects.create_namespaced_custom_object(GROUP, "v1beta1", namespace, "machinesets", example_machineset(namespace))
    objects.patch_namespaced_custom_object_scale(GROUP, "v1beta2", namespace, "machinesets", "gpu-workers",
                                                 {"spec": {"replicas": 3}})
    assert objects.get_namespaced_custom_object(
        GROUP, "v1beta1", namespace, "machinesets", "gpu-workers")["spec"]["replicas"] == 3

    selector = "cluster.x-k8s.io/cluster-name=demo,cluster.x-k8s.io/set-name=gpu-workers"
    objects.patch_namespaced_custom_object_status(GROUP, "v1beta2", namespace, "machinesets", "gpu-workers", {
        "status": {"replicas": 2, "readyReplicas": 1, "availableReplicas": 1, "selector": selector}})
    scale = objects.get_namespaced_custom_object_scale(GROUP, "v1beta2", namespace, "machinesets", "gpu-workers")
    assert (scale["spec"]["replicas"], scale["status"]["replicas"], scale["status"]["selector"]) == (3, 2, selector)


def test_a_machine_links_provider_id_and_node_in_both_versions(objects: client.CustomObjectsApi,
                                                               namespace: str) -> None:
    owner = objects.create_namespaced_custom_object(GROUP, "v1beta1", namespace, "machinesets",
                                                    example_machineset(namespace))
    machine = {
        "apiVersion": f"{GROUP}/v1beta2", "kind": "Machine",
        "metadata": {"name": "gpu-workers-abcde", "namespace": namespace,
                     "labels": {"cluster.x-k8s.io/set-name": "gpu-workers"},
                     "annotations": {"cluster.x-k8s.io/delete-machine": ""},
                     "ownerReferences": [{"apiVersion": owner["apiVersion"], "kind": "MachineSet",
                                          "name": "gpu-workers", "uid": owner["metadata"]["uid"],
                                          "controller": True}]},
        "spec": {"clusterName": "demo", "providerID": "kwok://gpu-workers-abcde",
                 "bootstrap": {"dataSecretName": "gpu-workers-bootstrap"},
                 "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KwokMachine",
                                       "name": "gpu-workers-abcde"},
                 "taints": [{"key": "dds.cdi.dev/booting", "effect": "NoSchedule", "propagation": "OnInitialization"}]}}
    objects.create_namespaced_custom_object(GROUP, "v1beta2", namespace, "machines", machine)
    objects.patch_namespaced_custom_object_status(GROUP, "v1beta2", namespace, "machines", "gpu-workers-abcde", {
        "status": {"phase": "Running", "nodeRef": {"name": "gpu-workers-abcde"},
                   "addresses": [{"type": "Hostname", "address": "gpu-workers-abcde"}]}})

    old = objects.get_namespaced_custom_object(GROUP, "v1beta1", namespace, "machines", "gpu-workers-abcde")
    assert old["spec"]["providerID"] == "kwok://gpu-workers-abcde"
    assert (old["status"]["phase"], old["status"]["nodeRef"]["name"]) == ("Running", "gpu-workers-abcde")
    assert old["metadata"]["ownerReferences"][0]["name"] == "gpu-workers"
    assert "cluster.x-k8s.io/delete-machine" in old["metadata"]["annotations"]
    assert old["spec"]["taints"] == machine["spec"]["taints"]


@pytest.mark.parametrize("breakage, field", [
    (lambda ms: ms["spec"].pop("clusterName"), "spec.clusterName"),
    (lambda ms: ms["spec"].update(replicas="two"), "spec.replicas"),
    (lambda ms: ms["spec"]["template"]["spec"].update(
        taints=[{"key": "gpu", "effect": "Sometimes", "propagation": "Always"}]), "effect"),
], ids=["no-cluster-name", "replicas-not-a-number", "unknown-taint-effect"])
def test_an_invalid_machineset_is_rejected_naming_the_field(objects: client.CustomObjectsApi, namespace: str,
                                                            breakage: Any, field: str) -> None:
    machineset = copy.deepcopy(example_machineset(namespace))
    breakage(machineset)
    with pytest.raises(client.ApiException) as raised:
        objects.create_namespaced_custom_object(GROUP, "v1beta1", namespace, "machinesets", machineset)
    assert raised.value.status == 422 and field in raised.value.body
