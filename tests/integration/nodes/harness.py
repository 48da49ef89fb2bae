"""A DDS node group on the real apiserver: an opted-in MachineSet in a test namespace of a workload cluster, the node
backend that scales it, and Cluster API's own manager with the harness's kwok infrastructure provider (started with the
session's control plane, harness/pytest_plugin.py) turning its replicas into Machines and kwok Nodes."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from kubernetes import client

from dds.config import NamespaceGrant
from dds.kube.capi import NODE_ANN_CLUSTER_NAMESPACE
from dds.kube.machinesets import MachineSetLister
from dds.model.groups import NodeGroupSpec
from dds.nodes.machineset import MachineSetProvisioner
from dds.groups.sources import MachineSetSource
from harness import kwok_provider
from harness.capi_stack import ClusterApi, cluster_api_on
from harness.controlplane import ControlPlane

GROUP = "cluster.x-k8s.io"
GPU_LABEL = "nvidia.com/gpu.product"
GPU = "nvidia.com/gpu"
CLUSTER = "demo"
PAUSED = kwok_provider.PAUSED_ANNOTATION  # Cluster API's controllers leave an object so marked alone


def open_grant(namespace: str) -> dict[str, NamespaceGrant]:
    """The test namespace may ask for anything (every pool, force detach, any cooldown): these tests are about
    scaling, and the grants have tests of their own (tests/integration/controller/test_node_group_access.py)."""
    return {namespace: NamespaceGrant(pools=["*"], force_detach=True, min_idle_cooldown_seconds=0)}


def machineset_manifest(name: str, *, replicas: int = 0, max_size: int = 6, taints: str = "",
                        version: str = "v1beta2") -> dict[str, Any]:
    """An opted-in MachineSet of the workload cluster `demo` on kwok hosts (its KwokMachineTemplate has its name), as a
    user writes it for Cluster API v1.14 (v1beta2), or for an earlier release (`version="v1beta1"`)."""
    annotations = {
        "dds.cdi.dev/enabled": "true",
        "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "0",
        "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": str(max_size),
        "capacity.cluster-autoscaler.kubernetes.io/cpu": "16",
        "capacity.cluster-autoscaler.kubernetes.io/memory": "64Gi",
        "capacity.cluster-autoscaler.kubernetes.io/maxPods": "110",
        "capacity.cluster-autoscaler.kubernetes.io/labels": "node.kubernetes.io/instance-type=cdi-16c64g",
        "dds.cdi.dev/max-gpus-per-node": "4",
        "dds.cdi.dev/gpu-models": "A30",
    }
    if taints:
        annotations["capacity.cluster-autoscaler.kubernetes.io/taints"] = taints
    labels = {"cluster.x-k8s.io/cluster-name": CLUSTER, "cluster.x-k8s.io/set-name": name}
    if version == "v1beta1":  # an object reference by apiVersion, as v1beta1 has it
        infrastructure = {"apiVersion": f"{kwok_provider.INFRA_GROUP}/{kwok_provider.VERSION}",
                          "kind": kwok_provider.TEMPLATE_KIND, "name": name}
    else:
        infrastructure = kwok_provider.infrastructure_ref(name)
    return {
        "apiVersion": f"{GROUP}/{version}", "kind": "MachineSet",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"clusterName": CLUSTER, "replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"clusterName": CLUSTER,
                                       "bootstrap": {"dataSecretName": kwok_provider.BOOTSTRAP_SECRET},
                                       "infrastructureRef": infrastructure}}},
    }


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 60.0, interval: float = 0.2) -> Any:
    """Poll until `predicate()` is truthy; fail naming `what` (a generous bound: these tests check behaviour)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


class NodeGroupHarness:
    def __init__(self, plane: ControlPlane, namespace: str, clock: Callable[[], float] = time.time, *,
                 dds_api: client.ApiClient) -> None:
        """The admin client is Cluster API's side and the test's inspection; DDS's parts (the MachineSet provisioner
        and reader) use `dds_api`, its ServiceAccount's client (harness/rbac.py)."""
        self.api = plane.api_client()
        self.dds_api = dds_api
        self.namespace = namespace
        self.core = client.CoreV1Api(self.api)
        self.objects = client.CustomObjectsApi(self.api)
        self.provisioner = MachineSetProvisioner(dds_api, clock)
        self.cluster_api: ClusterApi = cluster_api_on(plane)
        self.cluster_api.workload_cluster(namespace, CLUSTER)

    def create_machineset(self, name: str, *, provisioning_delay_seconds: Optional[float] = None,
                          **kwargs: Any) -> NodeGroupSpec:
        self.create(machineset_manifest(name, **kwargs), provisioning_delay_seconds=provisioning_delay_seconds)
        return self.group(name)

    def create(self, manifest: dict[str, Any], *, provisioning_delay_seconds: Optional[float] = None) -> None:
        """Write an opted-in MachineSet, with the KwokMachineTemplate of its name shaping its hosts as its group's
        template node (coming up after `provisioning_delay_seconds` of wall time, default at once)."""
        manifest = {**manifest, "metadata": {**manifest["metadata"], "namespace": self.namespace}}
        kwok_provider.create_template(self.cluster_api.api, kwok_provider.template_for(
            manifest, GPU_LABEL, provisioning_delay_seconds=provisioning_delay_seconds))
        version = manifest["apiVersion"].rpartition("/")[2]
        self.objects.create_namespaced_custom_object(GROUP, version, self.namespace, "machinesets", manifest)

    def group(self, name: str) -> NodeGroupSpec:
        """The group as DDS reads it (MachineSet source and parser)."""
        read = MachineSetSource(MachineSetLister(self.dds_api, [self.namespace]), open_grant(self.namespace)).read()
        assert not read.errors, read.errors
        return next(g for g in read.groups if g.source.name == name)

    def machineset(self, name: str) -> dict[str, Any]:
        return self.objects.get_namespaced_custom_object(GROUP, "v1beta2", self.namespace, "machinesets", name)

    def replicas(self, name: str) -> int:
        return int(self.machineset(name)["spec"]["replicas"])

    def machines(self) -> list[dict[str, Any]]:
        return self.objects.list_namespaced_custom_object(GROUP, "v1beta2", self.namespace, "machines")["items"]

    def machines_paused(self, name: str) -> Any:
        """Cluster API makes and deletes no Machine of MachineSet `name` meanwhile (a context manager)."""
        return kwok_provider.machineset_paused(self.api, self.namespace, name)

    def nodes(self) -> dict[str, client.V1Node]:
        """The Nodes of this namespace's Machines (Cluster API annotates a Node with its Machine's namespace)."""
        return {n.metadata.name: n for n in self.core.list_node().items
                if (n.metadata.annotations or {}).get(NODE_ANN_CLUSTER_NAMESPACE) == self.namespace}

    def ready_nodes(self) -> dict[str, client.V1Node]:
        return {name: n for name, n in self.nodes().items()
                if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or ())}

    def wait_ready_nodes(self, count: int, timeout: float = 60.0) -> dict[str, client.V1Node]:
        """Wait until the namespace has exactly `count` Nodes, all Ready and each its Machine's nodeRef: a host's
        Node is Ready (kwok) a moment before Cluster API links it to its Machine, and DDS counts a node from then."""
        def ready() -> Optional[dict[str, client.V1Node]]:
            nodes = self.ready_nodes()
            if len(nodes) != count or len(self.nodes()) != count:
                return None
            linked = {((m.get("status") or {}).get("nodeRef") or {}).get("name") for m in self.machines()}
            return nodes if set(nodes) <= linked else None
        return wait_for(f"{count} Ready kwok node(s) with their Machines' nodeRef in {self.namespace}", ready, timeout)

    def close(self) -> None:
        """Remove the cluster-scoped Nodes of this namespace's hosts (the namespace fixture removes the rest)."""
        for name in self.nodes():
            try:
                self.core.delete_node(name)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise


def gpu_pod(name: str, node: str) -> dict[str, Any]:
    # Pinned to the test's node: other tests' nodes share the session's control plane.
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                     "containers": [{"name": "train", "image": "example.com/train:1",
                                     "resources": {"limits": {GPU: "1"}}}]}}


def unschedulable(core: client.CoreV1Api, namespace: str, name: str) -> Optional[str]:
    pod = core.read_namespaced_pod(name, namespace)
    condition = next((c for c in pod.status.conditions or () if c.type == "PodScheduled"), None)
    if condition is not None and condition.status == "False" and condition.reason == "Unschedulable":
        return condition.message or "unschedulable"
    return None


def one_node_and_a_pending_gpu_pod(harness: "NodeGroupHarness", namespace: str, pod_name: str = "train-0") -> str:
    """MachineSet gpu-workers with one Ready node (no GPU) and a 1-GPU pod pinned to it, Pending as Unschedulable;
    returns the node's name."""
    group = harness.create_machineset("gpu-workers")
    harness.provisioner.add_nodes(group, 1, key="boot")
    [node] = harness.wait_ready_nodes(1)
    core = client.CoreV1Api(harness.api)
    core.create_namespaced_pod(namespace, gpu_pod(pod_name, node))
    wait_for(f"{pod_name} unschedulable", lambda: unschedulable(core, namespace, pod_name), timeout=30)
    return node
