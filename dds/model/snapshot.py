"""The planner's input: a frozen picture of the cluster at one instant. Built at the edge (dds/kube, dds/sim), read-only here.

Everything is plain data: no clients, no clock (`now` is a field), so the same snapshot always gives the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Optional, Sequence

from dds.model.dra_records import DraState, PodClaimRef
from dds.model.groups import NodeGroupSpec, Taint
from dds.model.resources import Resources

# The coscheduling plugin's label naming a pod's gang (PodGroup): read by the decoder and the planner alike.
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"


def _empty() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # "" = all effects


@dataclass(frozen=True, slots=True)
class SelectorRequirement:
    """A node-selector or label-selector requirement (In, NotIn, Exists, DoesNotExist, Gt, Lt)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """Requirements ANDed; a pod's terms are ORed (requiredDuringSchedulingIgnoredDuringExecution)."""

    match_expressions: tuple[SelectorRequirement, ...] = ()
    match_fields: tuple[SelectorRequirement, ...] = ()  # only metadata.name is meaningful


@dataclass(frozen=True, slots=True)
class LabelSelector:
    match_labels: Mapping[str, str] = field(default_factory=_empty)
    match_expressions: tuple[SelectorRequirement, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkloadRef:
    """A pod's `spec.workloadRef` (Kubernetes 1.35 Workload API, alpha): the Workload in the pod's namespace, the pod
    group within it, and the replica of that group (each replica is a gang of its own)."""

    name: str
    pod_group: str
    replica_key: str = ""

    @property
    def gang_name(self) -> str:
        """The gang's name within the namespace, unique per Workload, pod group and replica."""
        return "/".join(part for part in (self.name, self.pod_group, self.replica_key) if part)


@dataclass(frozen=True, slots=True)
class PodAffinityTerm:
    label_selector: LabelSelector
    topology_key: str
    namespaces: tuple[str, ...] = ()  # empty = the pod's own namespace


@dataclass(frozen=True, slots=True)
class HostPort:
    port: int
    protocol: str = "TCP"
    host_ip: str = "0.0.0.0"


@dataclass(frozen=True, slots=True)
class ContainerRequests:
    requests: Resources
    restartable_init: bool = False  # a sidecar (init container with restartPolicy Always)


# The Event reason for an object DDS cannot read or judge (a pod, one of its ResourceClaims, their DeviceClass): that
# object is refused with the error, the rest is planned (dds/kube/cache.py, dds/planner/dra.py).
NOT_READABLE = "CannotReadObject"


@dataclass(frozen=True, slots=True)
class PodInfo:
    """A pod as the scheduling simulation needs it. `node_name` set = bound."""

    namespace: str
    name: str
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=_empty)
    containers: tuple[ContainerRequests, ...] = ()
    init_containers: tuple[ContainerRequests, ...] = ()
    overhead: Resources = Resources()
    node_name: Optional[str] = None
    node_selector: Mapping[str, str] = field(default_factory=_empty)
    required_node_affinity: tuple[NodeSelectorTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    host_ports: tuple[HostPort, ...] = ()
    required_pod_affinity: tuple[PodAffinityTerm, ...] = ()
    required_pod_anti_affinity: tuple[PodAffinityTerm, ...] = ()
    priority: int = 0
    owner_kind: Optional[str] = None  # DaemonSet, ReplicaSet, Job, StatefulSet, Node (mirror pod), None (bare)
    created_at: float = 0.0
    # Constraints seen on the pod that the simulation does not model (e.g. "topologySpreadConstraints"): a pod with
    # any of them is never promised a fit.
    unsupported: tuple[str, ...] = ()
    # Set when a PodDisruptionBudget, annotation or local storage forbids evicting it (it cannot move).
    not_movable_reason: Optional[str] = None
    # The gang the pod belongs to (a coscheduling PodGroup, or the Workload of `spec.workloadRef`), by name in the
    # pod's namespace, and how many of its pods must run at once (PodGroup minMember, the Workload's gang minCount;
    # 0 = unknown: every member the snapshot shows). Filled at the edge; see dds/planner/gangs.py.
    pod_group: Optional[str] = None
    pod_group_min_member: int = 0
    # Dynamic Resource Allocation: the pod's spec.resourceClaims (with the claims generated for templates), and why no
    # GPU DDS can attach satisfies them, when that is so (set by dds/planner/dra.py, which also turns satisfiable claims
    # into GPU requests before planning).
    resource_claims: tuple[PodClaimRef, ...] = ()
    dra_refusal: Optional[str] = None
    dra_refusal_reason: str = ""  # the Event reason of `dra_refusal` (dds/planner/refusals.py)
    claims_lowered: bool = False  # the claims are already counted in `containers` / the node affinity
    # `spec.workloadRef` as the pod carries it; whether it makes a gang depends on the Workload's policy, which the
    # edge reads (dds/kube/podgroups.py) to fill the two fields above.
    workload_ref: Optional[WorkloadRef] = None
    # `spec.schedulingGroup.podGroupName` (Kubernetes 1.36 Workload API, scheduling.k8s.io/v1alpha2): the PodGroup in
    # the pod's namespace; its policy (gang or basic) is read by the edge as for `workload_ref`.
    scheduling_group: Optional[str] = None
    # Annotation `autoscaling.x-k8s.io/consume-provisioning-request` (set by Kueue on an admitted job's pods): the
    # ProvisioningRequest, in the pod's namespace, whose booked capacity the pod is to use (dds/planner/provisioning.py).
    consumes_provisioning_request: Optional[str] = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Device:
    """A fabric device attached (or being attached) to a node."""

    id: str
    model: str
    pool: str
    attached_at: float = 0.0
    in_claim: bool = False  # allocated to a ResourceClaim: a detach never takes it (dds/planner/dra.py)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A live node. `allocatable` counts only the GPUs the node exposes now (status.allocatable)."""

    name: str
    provider_id: str = ""
    group_id: Optional[str] = None  # None = not a DDS node (never gets GPUs, never removed by DDS)
    labels: Mapping[str, str] = field(default_factory=_empty)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    ready: bool = True
    allocatable: Resources = Resources()
    gpu_resource: str = "nvidia.com/gpu"
    devices: tuple[Device, ...] = ()  # fabric devices attached and visible
    attaching: int = 0  # devices on their way (in-flight attaches): capacity promised, not yet visible
    detaching: tuple[str, ...] = ()  # device ids on their way out
    created_at: float = 0.0
    # Since when the node has had at least one idle GPU / no pods that count as work (None = not idle), kept by the
    # controller across loops because idleness is a duration.
    gpus_idle_since: Optional[float] = None
    empty_since: Optional[float] = None
    being_deleted: bool = False  # tainted ToBeDeletedByClusterAutoscaler or a Machine marked for deletion
    # CXL memory chunks attached from the fabric (their bytes are in `allocatable.memory` once the node reports them),
    # chunks on their way (promised, not yet reported), and since when the node has had a chunk its pods' requests do
    # not need (None = none), kept by the controller like `gpus_idle_since` (docs/cxl-memory.md).
    cxl_chunks: tuple[Device, ...] = ()
    cxl_attaching: int = 0
    cxl_idle_since: Optional[float] = None


@dataclass(frozen=True, slots=True)
class PoolInfo:
    """Free devices of a fabric pool by model."""

    name: str
    free: Mapping[str, int] = field(default_factory=_empty)  # type: ignore[assignment]
    # A fabric-side limit on devices per node from this pool (PoolSpec.max_slots_per_node); None = only the group's
    # max_gpus_per_node applies.
    max_slots_per_node: Optional[int] = None
    # CXL memory the pool can still attach, in bytes (its memory devices' free chunks).
    free_cxl_memory: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    nodes: tuple[NodeInfo, ...] = ()
    pods: tuple[PodInfo, ...] = ()  # bound and pending
    groups: tuple[NodeGroupSpec, ...] = ()
    pools: tuple[PoolInfo, ...] = ()
    # Nodes on their way per group (node adds in flight), counted as capacity-to-come by the planner.
    upcoming_nodes: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    # Label key a pod uses to ask for a GPU model (nodeSelector / required affinity).
    gpu_model_label: str = "nvidia.com/gpu.product"
    # ResourceClaims, templates, slices and device classes (Dynamic Resource Allocation), for dds/planner/dra.py.
    dra: DraState = DraState()
    # Pods of ProvisioningRequests (`consumes_provisioning_request`) that were bound and have ended (Succeeded or
    # Failed): not in `pods`, yet bound as their request's booking counts them (dds/planner/provisioning.py). A job's
    # pod may bind and end between two passes.
    ended_consumers: tuple[PodInfo, ...] = ()
    # Bound pods by node, built on the first `pods_on` call: asking per node would otherwise scan every pod for every
    # node (nodes x pods per pass). The snapshot is frozen, so the index never goes stale.
    _pods_by_node: dict[str, tuple[PodInfo, ...]] = field(default_factory=dict, init=False, repr=False,
                                                          compare=False)

    # Pools by name, built on the first `pool` call (asked once per node by every plan).
    _pools_by_name: dict[str, PoolInfo] = field(default_factory=dict, init=False, repr=False, compare=False)

    # The pending pods, computed on the first `pending_pods` call (a one-element list: the snapshot itself is frozen).
    _pending: list[tuple[PodInfo, ...]] = field(default_factory=list, init=False, repr=False, compare=False)

    # Groups by id, built on the first `group` call (asked once per node or more by every plan).
    _groups_by_id: dict[str, NodeGroupSpec] = field(default_factory=dict, init=False, repr=False, compare=False)

    def group(self, group_id: str) -> Optional[NodeGroupSpec]:
        index = self._groups_by_id
        if not index and self.groups:
            for g in reversed(self.groups):  # the first of a repeated id wins, as a scan in order would find it
                index[g.id] = g
        return index.get(group_id)

    def pool(self, name: str) -> Optional[PoolInfo]:
        index = self._pools_by_name
        if not index and self.pools:
            for p in reversed(self.pools):  # the first of a repeated name wins, as a scan in order would find it
                index[p.name] = p
        return index.get(name)

    def pending_pods(self) -> tuple[PodInfo, ...]:
        found = self._pending
        if not found:  # asked several times per plan; a scan of every pod each time is what this saves
            found.append(tuple(p for p in self.pods if p.node_name is None))
        return found[0]

    def index_pods(self, by_node: Mapping[str, Sequence[PodInfo]], pending: Optional[Sequence[PodInfo]] = None
                   ) -> None:
        """Take a caller's index of `pods` by node (bound pods only), and its pending pods (in the order of `pods`),
        when it has walked them already: the observer does, and a second walk over tens of thousands of pods per
        decision is what this saves."""
        if not self._pods_by_node:
            self._pods_by_node.update({name: tuple(pods) for name, pods in by_node.items()})
            self._pods_by_node[""] = ()
        if pending is not None and not self._pending:
            self._pending.append(tuple(pending))

    def pods_on(self, node_name: str) -> tuple[PodInfo, ...]:
        index = self._pods_by_node
        if not index and self.pods:
            by_node: dict[str, list[PodInfo]] = {}
            for pod in self.pods:
                if pod.node_name is not None:
                    by_node.setdefault(pod.node_name, []).append(pod)
            index.update({name: tuple(pods) for name, pods in by_node.items()})
            index[""] = ()  # built, even when no pod is bound
        return index.get(node_name, ())
