"""GPUs back to the pool before the host goes, with Cluster API's own manager: DDS (built by `build_app` as `dds serve`
builds it, as its ServiceAccount, simulated fabric on a virtual clock) holds its pre-terminate hook on a Machine whose
node holds GPUs; when that Machine is deleted (by a user, a MachineHealthCheck, another autoscaler), Cluster API drains
the node and waits; DDS detaches the GPUs, then releases the hook; the host and the Node go and the pool is whole."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from dds.app import App, build_app
from dds.controller.observe import machine_refs
from dds.fabric.base import AttachRequest, OperationKind
from dds.kube.capi import DDS_PRE_TERMINATE_HOOK
from harness.capi_stack import ClusterApi, cluster_api_on
from harness.kwok_provider import BOOTSTRAP_SECRET, infrastructure_ref
from tests.integration.controller.harness import ATTACH_SECONDS, VirtualClock, settings_for
from tests.integration.nodes.harness import wait_for

pytestmark = pytest.mark.integration

GROUP, V1BETA2 = "cluster.x-k8s.io", "v1beta2"
POOL = 4


class Scene:
    def __init__(self, control_plane: Any, namespace: str, dds_api: client.ApiClient) -> None:
        self.cluster_api: ClusterApi = cluster_api_on(control_plane)
        self.cluster_api.workload_cluster(namespace)
        self.cluster_api.machine_template(namespace, "gpu", {"labels": {"dds.test/namespace": namespace}})
        self.api = control_plane.api_client()
        self.custom, self.core = client.CustomObjectsApi(self.api), client.CoreV1Api(self.api)
        self.namespace = namespace
        self.clock = VirtualClock()
        self.app: App = build_app(settings_for(namespace, POOL), dds_api, clock=self.clock)

    def machines(self) -> list[dict[str, Any]]:
        return self.custom.list_namespaced_custom_object(GROUP, V1BETA2, self.namespace, "machines")["items"]

    def machine(self, name: str) -> dict[str, Any] | None:
        return next((m for m in self.machines() if m["metadata"]["name"] == name), None)

    def close(self) -> None:
        self.app.stop()
        for node in self.core.list_node().items:
            if (node.metadata.labels or {}).get("dds.test/namespace") == self.namespace:
                self.core.delete_node(node.metadata.name)
        self.api.close()


@pytest.fixture
def scene(control_plane: Any, namespace: str, dds_api: client.ApiClient) -> Iterator[Scene]:
    made = Scene(control_plane, namespace, dds_api)
    yield made
    made.close()


def test_a_deleted_machines_gpus_return_to_the_pool_before_its_host_goes(scene: Scene) -> None:
    labels = {"dds.test/set": "gpu"}
    annotations = {"dds.cdi.dev/enabled": "true", "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "0",
                   "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "4",
                   "capacity.cluster-autoscaler.kubernetes.io/cpu": "16",
                   "capacity.cluster-autoscaler.kubernetes.io/memory": "64Gi",
                   "dds.cdi.dev/max-gpus-per-node": "4", "dds.cdi.dev/gpu-models": "A30"}
    scene.custom.create_namespaced_custom_object(GROUP, V1BETA2, scene.namespace, "machinesets", {
        "apiVersion": f"{GROUP}/{V1BETA2}", "kind": "MachineSet",
        "metadata": {"name": "gpu", "namespace": scene.namespace, "annotations": annotations},
        "spec": {"clusterName": "kwok", "replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"clusterName": "kwok", "bootstrap": {"dataSecretName": BOOTSTRAP_SECRET},
                                       "infrastructureRef": infrastructure_ref("gpu")}}}})
    [machine] = wait_for("the Machine's nodeRef", lambda: [m for m in scene.machines()
                                                           if (m.get("status") or {}).get("nodeRef")], timeout=120)
    name, node = machine["metadata"]["name"], machine["status"]["nodeRef"]["name"]
    fabric = scene.app.fabric
    scene.app.catalog.refresh()
    fabric.attach(AttachRequest(key="setup/1", node=node, pool="default", model="A30", count=2, reason="setup"))
    scene.clock.advance(ATTACH_SECONDS + 1)
    fabric.tick()
    assert len(fabric.devices(node)) == 2 and fabric.free_count("default", "A30") == POOL - 2

    scene.app.controller.run_once()
    assert DDS_PRE_TERMINATE_HOOK in scene.machine(name)["metadata"]["annotations"], "its node holds GPUs"

    scene.custom.delete_namespaced_custom_object(GROUP, V1BETA2, scene.namespace, "machines", name)

    def waiting_with_gpus() -> bool:
        scene.app.controller.run_once()  # sees the wait and starts the detach; the clock stands still: not done
        machine = scene.machine(name)
        return bool(machine and machine_refs([machine])[0].awaiting_pre_terminate and fabric.devices(node))
    wait_for("Cluster API drained the node and waits for DDS's hook, the GPUs still attached", waiting_with_gpus,
             timeout=120)
    assert name in scene.cluster_api.provider.hosts, "the host is still there while DDS detaches"
    assert any(op.kind == OperationKind.DETACH and op.node == node for op in fabric.operations())

    def gone() -> bool:
        scene.app.controller.run_once()
        if fabric.devices(node):
            assert name not in scene.cluster_api.provider.removed_hosts, "the host went with GPUs attached"
        scene.clock.advance(2.0)  # the detach's latency passes in virtual time
        return scene.machine(name) is None
    wait_for(f"Machine {name} gone once its GPUs are back", gone, timeout=120)
    assert name in scene.cluster_api.provider.removed_hosts
    wait_for(f"Node {node} deleted", lambda: node not in {n.metadata.name for n in scene.core.list_node().items},
             timeout=60)
    assert fabric.free_count("default", "A30") == POOL, "both GPUs back in the pool"
