"""A Cluster API infrastructure provider for kwok nodes: what a cloud does, and nothing of Cluster API's own work.

Cluster API's real manager (harness/capi.py) runs the MachineSets and Machines; this provider only answers for the
"hardware" they ask for, as an infrastructure provider's controller would:

| it sees                                        | it does (as a cloud would)                                       |
|------------------------------------------------|------------------------------------------------------------------|
| a KwokMachine (cloned by Cluster API from the   | adds its finalizer; once the provisioning delay has passed since |
| MachineSet's KwokMachineTemplate), owned by a  | the KwokMachine was created, makes the host: a kwok Node named   |
| Machine, not yet provisioned                   | after it, spec.providerID kwok://<name>, shaped by the template's |
|                                                | `node` (labels, taints, capacity); sets the same providerID on    |
|                                                | the KwokMachine and status.initialization.provisioned: true       |
| a KwokMachine being deleted                    | removes the host and its finalizer (Cluster API deletes the Node |
|                                                | itself afterwards, as after any cloud instance is gone)          |
| `fail_host(name)` (a test)                     | the host dies: its Node stops being kept Ready, reports Unknown  |

A template's `provisioningDelaySeconds` (copied by Cluster API to each KwokMachine) overrides the provider's delay for
its hosts, as instance types boot at their own pace.

`install_cluster` makes what a workload cluster needs for worker Machines to get a nodeRef without bootstrap or
control-plane providers: the externally managed KwokControlPlane reporting `controlPlaneInitialized`, the Cluster
pointing at it, and the `<cluster>-kubeconfig` Secret (the same apiserver, the admin credential a workload cluster's
kubeconfig holds). The provider's CRDs carry the contract label Cluster API looks for (`cluster.x-k8s.io/v1beta2:
v1alpha1`), and a ClusterRole labelled to aggregate into the manager's role lets the manager read and write them.

`install_infrastructure` (called by `install_cluster`) gives the Cluster its infrastructure, a provisioned KwokCluster,
as every provider does: Cluster API's MachineHealthCheck controller checks no Machine of a Cluster without it.

Harness-only: the hardware's stand-in, never in the `dds` wheel.
"""

from __future__ import annotations

import argparse
import base64
import copy
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Optional

from kubernetes import client

from dds.groups.labels import LABEL_HOSTNAME, template_labels
from dds.model.groups import LABEL_ATTACHED_GPU, NodeGroupSpec
from harness.capi import AGGREGATE_TO_MANAGER, AGGREGATED_ROLE
from harness.install import AdminApi
from harness.reconcile_loop import ReconcileLoop

log = logging.getLogger(__name__)

INFRA_GROUP = "infrastructure.harness.dds.cdi.dev"
CONTROL_PLANE_GROUP = "controlplane.harness.dds.cdi.dev"
VERSION = "v1alpha1"
CONTRACT_LABEL = "cluster.x-k8s.io/v1beta2"  # value: the provider's API version that implements the v1beta2 contract
MACHINE_KIND, MACHINES = "KwokMachine", "kwokmachines"
TEMPLATE_KIND, TEMPLATES = "KwokMachineTemplate", "kwokmachinetemplates"
CLUSTER_KIND, CLUSTERS = "KwokCluster", "kwokclusters"
CONTROL_PLANE_KIND, CONTROL_PLANES = "KwokControlPlane", "kwokcontrolplanes"
FINALIZER = f"{INFRA_GROUP}/host"
PROVIDER_PREFIX = "kwok://"
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
LABEL_CLUSTER_NAME = "cluster.x-k8s.io/cluster-name"
PAUSED_ANNOTATION = "cluster.x-k8s.io/paused"
BOOTSTRAP_SECRET = "kwok-bootstrap"  # a MachineSet template's bootstrap.dataSecretName: the bootstrap phase is skipped
DEFAULT_CAPACITY = {"cpu": "4", "memory": "16Gi", "pods": "110"}
CLUSTER_ROLE = "capi-kwok-provider"


@dataclass(frozen=True)
class ProviderIds:
    """How this cloud names its machines: a KwokMachine's spec.providerID, copied by Cluster API to its Machine and
    matched to the Node, is `prefix` followed by `machine_id(host name)`. The default is kwok://<name>; a test cluster
    whose hosts stand for another infrastructure's servers names them as that infrastructure does
    (harness/cdi_stack.py: fsas-cdi://<uuid>, which the CDI operator reads in DRA mode)."""

    prefix: str = PROVIDER_PREFIX
    machine_id: Callable[[str], str] = str

    def of(self, host_name: str) -> str:
        return self.prefix + self.machine_id(host_name)


KWOK_PROVIDER_IDS = ProviderIds()


def _crd(kind: str, plural: str, group: str, *, status: bool = True) -> dict[str, Any]:
    preserve = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}", "labels": {CONTRACT_LABEL: VERSION}},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
                 "versions": [{"name": VERSION, "served": True, "storage": True,
                               **({"subresources": {"status": {}}} if status else {}),
                               "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                   "spec": preserve, "status": preserve}}}}]},
    }


def crds() -> list[dict[str, Any]]:
    return [_crd(MACHINE_KIND, MACHINES, INFRA_GROUP), _crd(TEMPLATE_KIND, TEMPLATES, INFRA_GROUP, status=False),
            _crd(CONTROL_PLANE_KIND, CONTROL_PLANES, CONTROL_PLANE_GROUP), _crd(CLUSTER_KIND, CLUSTERS, INFRA_GROUP)]


def manager_role() -> dict[str, Any]:
    """What the Cluster API manager needs on this provider's objects, aggregated into its role by label."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": CLUSTER_ROLE, "labels": {AGGREGATE_TO_MANAGER: "true"}},
            "rules": [{"apiGroups": [INFRA_GROUP, CONTROL_PLANE_GROUP], "resources": ["*"],
                       "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]}


def install(api: AdminApi) -> None:
    """The provider's CRDs (waited for until Established) and the manager's role on them."""
    for crd in crds():
        api.apply(crd)
    for crd in crds():
        api.wait_established(crd["metadata"]["name"])
    api.apply(manager_role())
    api.aggregate_cluster_role(AGGREGATED_ROLE)


def _collection(group: str, namespace: str, plural: str) -> str:
    return f"/apis/{group}/{VERSION}/namespaces/{namespace}/{plural}"


def install_cluster(api: AdminApi, namespace: str, cluster: str, workload_server: Optional[str] = None) -> None:
    """A workload cluster named `cluster` in `namespace` whose worker Machines get nodeRefs: the KwokControlPlane
    (externally managed, initialized), the Cluster, its kubeconfig Secret and the bootstrap data Secret. The Secret
    points at `workload_server` (default: the address the harness reaches the apiserver at; in a cluster, where Cluster
    API's manager runs as a pod, https://kubernetes.default.svc) with the admin credential `api` uses."""
    api.apply({"apiVersion": f"{CONTROL_PLANE_GROUP}/{VERSION}", "kind": CONTROL_PLANE_KIND,
               "metadata": {"name": cluster, "namespace": namespace}, "spec": {}},
              _collection(CONTROL_PLANE_GROUP, namespace, CONTROL_PLANES))
    api.merge_patch(f"{_collection(CONTROL_PLANE_GROUP, namespace, CONTROL_PLANES)}/{cluster}/status",
                    {"status": {"initialization": {"controlPlaneInitialized": True},
                                "externalManagedControlPlane": True}})
    api.apply({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
               "metadata": {"name": cluster, "namespace": namespace},
               "spec": {"controlPlaneRef": {"apiGroup": CONTROL_PLANE_GROUP, "kind": CONTROL_PLANE_KIND,
                                            "name": cluster}}},
              f"/apis/cluster.x-k8s.io/v1beta2/namespaces/{namespace}/clusters")
    kubeconfig = (f"apiVersion: v1\nkind: Config\ncurrent-context: {cluster}\n"
                  f"clusters:\n- name: {cluster}\n  cluster:\n    server: {workload_server or api.server}\n"
                  f"    certificate-authority-data: {base64.b64encode(api.ca_pem).decode()}\n"
                  f"users:\n- name: admin\n  user:\n    token: {api.session.headers['Authorization'].split()[1]}\n"
                  f"contexts:\n- name: {cluster}\n  context:\n    cluster: {cluster}\n    user: admin\n")
    secrets = f"/api/v1/namespaces/{namespace}/secrets"
    api.apply({"apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
               "metadata": {"name": f"{cluster}-kubeconfig", "namespace": namespace,
                            "labels": {LABEL_CLUSTER_NAME: cluster}},
               "stringData": {"value": kubeconfig}}, secrets)
    api.apply({"apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
               "metadata": {"name": BOOTSTRAP_SECRET, "namespace": namespace, "labels": {LABEL_CLUSTER_NAME: cluster}},
               "stringData": {"value": "#!/bin/sh\n# kwok nodes need no bootstrap\n"}}, secrets)
    install_infrastructure(api, namespace, cluster)


def install_infrastructure(api: AdminApi, namespace: str, cluster: str) -> None:
    """The Cluster's infrastructure, as every provider has one: a KwokCluster reporting provisioned, named in the
    Cluster's spec.infrastructureRef. Without one Cluster API leaves the Cluster's InfrastructureReady condition
    Unknown, and its MachineHealthCheck controller then checks no Machine (core/reconcilers/machinehealthcheck,
    machinehealthcheck_targets.go `needsRemediation`)."""
    api.apply({"apiVersion": f"{INFRA_GROUP}/{VERSION}", "kind": CLUSTER_KIND,
               "metadata": {"name": cluster, "namespace": namespace}, "spec": {}},
              _collection(INFRA_GROUP, namespace, CLUSTERS))
    api.merge_patch(f"{_collection(INFRA_GROUP, namespace, CLUSTERS)}/{cluster}/status",
                    {"status": {"initialization": {"provisioned": True}}})
    api.merge_patch(f"/apis/cluster.x-k8s.io/v1beta2/namespaces/{namespace}/clusters/{cluster}",
                    {"spec": {"infrastructureRef": {"apiGroup": INFRA_GROUP, "kind": CLUSTER_KIND, "name": cluster}}})


def node_capacity(group: NodeGroupSpec) -> dict[str, str]:
    """cpu, memory, ephemeral-storage and pods of the group's template node; the GPU resource present at 0 (the
    fabric's attaches raise it), or absent for a DRA group (its GPUs are ResourceSlice devices, never node capacity)."""
    capacity = group.node_allocatable(0).to_kubernetes()
    if group.gpu_api.dra:
        capacity.pop(group.gpu_resource, None)
    elif group.max_gpus_per_node > 0:
        capacity[group.gpu_resource] = "0"
    return capacity


def node_shape(group: NodeGroupSpec, gpu_label: str) -> dict[str, Any]:
    """A KwokMachineTemplate's `node` for hosts of a DDS group: the labels, taints and capacity the group's template
    node shows cluster-autoscaler (the real node must match what CA simulated), its GPUs at 0: they come from the
    fabric. The host's own name and CA's attached-GPU label are not in a template."""
    labels = template_labels(group, "", gpu_label)
    labels.pop(LABEL_HOSTNAME, None)
    labels.pop(LABEL_ATTACHED_GPU, None)  # a node boots with 0 GPUs visible: DDS labels it once its GPUs are usable
    return {"labels": labels, "capacity": node_capacity(group),
            "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in group.taints]}


def machine_template(namespace: str, name: str, node: Optional[Mapping[str, Any]] = None, *,
                     provisioning_delay_seconds: Optional[float] = None) -> dict[str, Any]:
    """A KwokMachineTemplate: `node` shapes the hosts made from it (labels, taints, capacity), as an instance type;
    `provisioning_delay_seconds`, when given, is how long its hosts take to come up (else the provider's delay)."""
    spec: dict[str, Any] = {"node": dict(node or {})}
    if provisioning_delay_seconds is not None:
        spec["provisioningDelaySeconds"] = provisioning_delay_seconds
    return {"apiVersion": f"{INFRA_GROUP}/{VERSION}", "kind": TEMPLATE_KIND,
            "metadata": {"name": name, "namespace": namespace}, "spec": {"template": {"spec": spec}}}


def node_group(obj: Mapping[str, Any]) -> NodeGroupSpec:
    """The DDS node group a MachineSet (or MachineDeployment) object is, as DDS parses it; one DDS would refuse is a
    ValueError with DDS's reasons."""
    from dds.groups.schema import parse_group
    from dds.groups.sources import group_input_from_machineset
    from dds.kube.machinesets import machineset_from_object

    group, problems = parse_group(group_input_from_machineset(machineset_from_object(obj)))
    if group is None:
        raise ValueError(f"{obj['kind']} {obj['metadata']['name']} is no DDS node group: {problems}")
    return group


def template_for(obj: Mapping[str, Any], gpu_label: str, *,
                 provisioning_delay_seconds: Optional[float] = None) -> dict[str, Any]:
    """The KwokMachineTemplate for a DDS node group's MachineSet (or MachineDeployment): of its name, its hosts
    shaped as the group's template node."""
    metadata = obj["metadata"]
    return machine_template(metadata["namespace"], metadata["name"], node_shape(node_group(obj), gpu_label),
                            provisioning_delay_seconds=provisioning_delay_seconds)


def create_template(api: AdminApi, template: dict[str, Any]) -> None:
    api.apply(template, _collection(INFRA_GROUP, template["metadata"]["namespace"], TEMPLATES))


def infrastructure_ref(template_name: str) -> dict[str, str]:
    """A MachineSet template's spec.infrastructureRef (v1beta2) to a KwokMachineTemplate."""
    return {"apiGroup": INFRA_GROUP, "kind": TEMPLATE_KIND, "name": template_name}


def on_kwok_hosts(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A MachineSet (or MachineDeployment) whose machines this provider makes: its template's infrastructureRef on the
    KwokMachineTemplate of the same name, the bootstrap phase skipped (kwok hosts need none)."""
    obj = copy.deepcopy(dict(obj))
    template = obj["spec"]["template"]["spec"]
    template["infrastructureRef"] = infrastructure_ref(obj["metadata"]["name"])
    template["bootstrap"] = {"dataSecretName": BOOTSTRAP_SECRET}
    return obj


@contextmanager
def machineset_paused(api_client: client.ApiClient, namespace: str, name: str) -> Iterator[None]:
    """Cluster API makes and deletes no Machine of the MachineSet meanwhile: its `cluster.x-k8s.io/paused` annotation,
    which its MachineSet controller honours (as while its controllers are still reconnecting, or a user paused it)."""
    custom = client.CustomObjectsApi(api_client)

    def annotate(value: Optional[str]) -> None:
        custom.patch_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", namespace, "machinesets", name,
                                              {"metadata": {"annotations": {PAUSED_ANNOTATION: value}}})

    annotate("")
    try:
        yield
    finally:
        annotate(None)


def _created_at(obj: Mapping[str, Any]) -> float:
    stamp = (obj.get("metadata") or {}).get("creationTimestamp") or ""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else 0.0


def node_object(name: str, shape: Mapping[str, Any], provider_ids: ProviderIds = KWOK_PROVIDER_IDS) -> dict[str, Any]:
    """The host's Node as its kubelet would register it; kwok then keeps it Ready."""
    capacity = {**DEFAULT_CAPACITY, **(shape.get("capacity") or {})}
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "type": "kwok", **(shape.get("labels") or {})}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels,
                         "annotations": {KWOK_NODE_ANNOTATION[0]: KWOK_NODE_ANNOTATION[1]}},
            "spec": {"providerID": provider_ids.of(name), "taints": list(shape.get("taints") or [])},
            "status": {"capacity": capacity, "allocatable": capacity}}


class KwokInfrastructureProvider(ReconcileLoop):
    """The provider's controller: one `reconcile_once()` pass, or `start()` for a background thread."""

    def __init__(self, api_client: client.ApiClient, *, provisioning_delay_seconds: float = 0.0,
                 interval_seconds: float = 0.2, active: Callable[[], bool] = lambda: True,
                 provider_ids: ProviderIds = KWOK_PROVIDER_IDS) -> None:
        """`active`: whether to run passes now (the harness pauses the provider while its manager is not running)."""
        super().__init__("kwok-infrastructure-provider", interval_seconds)
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self.provisioning_delay_seconds = provisioning_delay_seconds
        self.hosts: set[str] = set()  # the "machines" this cloud runs, by KwokMachine name
        self.removed_hosts: list[str] = []
        self._active = active
        self.provider_ids = provider_ids

    def reconcile_once(self) -> None:
        if not self._active():
            return
        machines = self._custom.list_cluster_custom_object(INFRA_GROUP, VERSION, MACHINES).get("items", [])
        for machine in machines:
            try:
                self._reconcile(machine)
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
                # Cluster API wrote the object since this pass read it: the next pass sees it fresh, and the others go
                # on (at thousands of Machines a pass ended at each conflict would list them all again for every one)
                log.debug("kwok provider: %s changed meanwhile", machine["metadata"]["name"])

    def _reconcile(self, machine: dict[str, Any]) -> None:
        if machine["metadata"].get("deletionTimestamp"):
            self._remove_host(machine)
        elif not ((machine.get("status") or {}).get("initialization") or {}).get("provisioned"):
            self._provision(machine)

    def fail_host(self, name: str) -> None:
        """The host `name` dies (power, board): its kubelet stops, so kwok no longer keeps its Node Ready, and its Node
        reports Ready Unknown, as the node lifecycle controller marks a node whose kubelet stopped posting status (that
        controller does not run here). The KwokMachine and its Machine stay: deleting them is Cluster API's or a
        user's call, as after a real failure."""
        self._core.patch_node(name, {"metadata": {"annotations": {KWOK_NODE_ANNOTATION[0]: None}}})
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        self._core.patch_node_status(name, {"status": {"conditions": [{
            "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown", "lastHeartbeatTime": now,
            "lastTransitionTime": now, "message": "Kubelet stopped posting node status."}]}})
        log.info("kwok provider: host %s died", name)

    def _provision(self, machine: dict[str, Any]) -> None:
        meta = machine["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        if FINALIZER not in (meta.get("finalizers") or []):
            self._custom.patch_namespaced_custom_object(
                INFRA_GROUP, VERSION, namespace, MACHINES, name,
                {"metadata": {"finalizers": [*(meta.get("finalizers") or []), FINALIZER],
                              "resourceVersion": meta["resourceVersion"]}})
            return  # the next pass sees the object with the finalizer
        if not any(o.get("kind") == "Machine" for o in meta.get("ownerReferences") or ()):
            return  # Cluster API sets its Machine as the owner right after cloning
        spec = machine.get("spec") or {}
        if time.time() - _created_at(machine) < float(spec.get("provisioningDelaySeconds",
                                                                self.provisioning_delay_seconds)):
            return
        shape = spec.get("node") or {}
        try:
            self._core.create_node(node_object(name, shape, self.provider_ids))
        except client.ApiException as exc:
            if exc.status != 409:  # made in an earlier pass whose status write failed
                raise
        self.hosts.add(name)
        self._custom.patch_namespaced_custom_object(INFRA_GROUP, VERSION, namespace, MACHINES, name,
                                                    {"spec": {"providerID": self.provider_ids.of(name)}})
        self._custom.patch_namespaced_custom_object_status(
            INFRA_GROUP, VERSION, namespace, MACHINES, name,
            {"status": {"initialization": {"provisioned": True},
                        "addresses": [{"type": "Hostname", "address": name}]}})
        log.info("kwok provider: host %s/%s is up", namespace, name)

    def _remove_host(self, machine: dict[str, Any]) -> None:
        meta = machine["metadata"]
        finalizers = meta.get("finalizers") or []
        if FINALIZER not in finalizers:
            return
        self.hosts.discard(meta["name"])
        self.removed_hosts.append(meta["name"])
        try:
            self._custom.patch_namespaced_custom_object(
                INFRA_GROUP, VERSION, meta["namespace"], MACHINES, meta["name"],
                {"metadata": {"finalizers": [f for f in finalizers if f != FINALIZER],
                              "resourceVersion": meta["resourceVersion"]}})
        except client.ApiException as exc:
            if exc.status != 404:  # gone meanwhile (its namespace deleted): nothing left to remove
                raise
        log.info("kwok provider: host %s/%s removed", meta["namespace"], meta["name"])


# --- as a program: the provider for a cluster of one's own (hack/kind-up.sh) ---

def main(argv: Optional[list[str]] = None) -> int:
    """Install the provider into the cluster a kubeconfig names, make the workload cluster and KwokMachineTemplates for
    the given MachineSets, create those MachineSets on kwok hosts, then run the provider until interrupted."""
    import types

    import yaml
    from kubernetes import config as kube_config

    from harness.capi import COLLECTIONS, ClusterApiError

    parser = argparse.ArgumentParser(prog="python -m harness.kwok_provider", description=main.__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--context")
    parser.add_argument("--token-file", required=True,
                        help="a bearer token with admin rights: the provider's writes and the workload cluster's "
                             "kubeconfig Secret (Cluster API reads the cluster's Nodes with it)")
    parser.add_argument("--workload-server", default="https://kubernetes.default.svc",
                        help="the apiserver as Cluster API's manager reaches it (default: from inside the cluster)")
    parser.add_argument("--machineset", action="append", default=[], metavar="FILE",
                        help="a DDS node group's MachineSet manifest, created on kwok hosts (repeatable)")
    parser.add_argument("--gpu-label", default="nvidia.com/gpu.product")
    parser.add_argument("--provisioning-delay", type=float, default=10.0, metavar="SECONDS")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    api_client = kube_config.new_client_from_config(config_file=args.kubeconfig, context=args.context)
    token = open(args.token_file).read().strip()
    admin = AdminApi(types.SimpleNamespace(server=api_client.configuration.host, token=token),
                     api_client.configuration.ssl_ca_cert, COLLECTIONS, ClusterApiError)
    install(admin)
    for path in args.machineset:
        obj = on_kwok_hosts(yaml.safe_load(open(path).read()))
        namespace = obj["metadata"].setdefault("namespace", "default")
        install_cluster(admin, namespace, obj["spec"]["clusterName"], workload_server=args.workload_server)
        create_template(admin, template_for(obj, args.gpu_label))
        plural, version = f"{obj['kind'].lower()}s", obj["apiVersion"].rpartition("/")[2]
        admin.apply(obj, f"/apis/cluster.x-k8s.io/{version}/namespaces/{namespace}/{plural}")
        log.info("kwok provider: %s %s/%s on kwok hosts", obj["kind"], namespace, obj["metadata"]["name"])
    provider = KwokInfrastructureProvider(api_client, provisioning_delay_seconds=args.provisioning_delay)
    try:
        provider.run_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
