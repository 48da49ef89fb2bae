"""The scheduling filters: can this pod go on this node? One small named function per question, in one ordered tuple.

Each filter returns None (passes) or a coded `Reject` naming the node, the upstream-style reason and, for resources,
the numbers (resource, requested, free, capacity). The order is kube-scheduler's (cheap node checks first, resources
last), so the first reject is the one `kubectl describe pod` would most likely show.

Three families, which the fast planner treats differently:
- STATIC_FILTERS read only the pod spec and the node's labels/taints/flags: cached per (pod shape, node shape).
- PLACEMENT_FILTERS read the pods already on the node (host ports, pod affinity): evaluated per candidate.
- RESOURCE_FILTERS read free capacity; `gpus_fit` is separate because attaching GPUs changes its answer.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Optional, Protocol, Sequence

from dds.model.groups import Taint
from dds.model.resources import CPU, EPHEMERAL_STORAGE, MEMORY, PODS
from dds.model.plan import Reject
from dds.planner.requests import PodRequest
from dds.planner.selectors import label_selector_matches, node_affinity_matches
from dds.model.snapshot import HostPort, PodAffinityTerm, PodInfo, Toleration

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
# Placement reasons, shared with the fast planner's vector pre-screen (dds/planner/state.py).
PORTS_TAKEN = "node(s) didn't have free ports for the requested pod ports"
AFFINITY_UNMET = "node(s) didn't match pod affinity rules"
ANTI_AFFINITY_UNMET = "node(s) didn't match pod anti-affinity rules"
EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"
FILTERING_EFFECTS = ("NoSchedule", "NoExecute")  # PreferNoSchedule only affects scoring


class NodeView(Protocol):
    """What a filter may read of a node (SimNode and the fast planner's views both provide it)."""

    name: str
    labels: Mapping[str, str]  # effective labels: the GPU model label reflects the node's (virtual) GPUs
    taints: Sequence[Taint]
    unschedulable: bool
    ready: bool
    being_deleted: bool
    gpu_resource: str

    def free(self, resource: str) -> int: ...

    def capacity(self, resource: str) -> int: ...

    def host_ports(self) -> Iterable[HostPort]: ...

    def pods(self) -> Iterable[PodInfo]: ...


class ClusterView(Protocol):
    def any_pod_matches(self, term: PodAffinityTerm, namespace: str) -> bool:
        """Does any pod in the cluster (bound or placed in this plan) match the affinity term?"""
        ...


Filter = Callable[[PodRequest, NodeView, ClusterView], Optional[Reject]]


# --- static: node flags, labels, taints ---------------------------------------------------------------------------

def node_ready(req: PodRequest, node: NodeView, cluster: ClusterView) -> Optional[Reject]:
    return None if node.ready else Reject(node.name, "node(s) were not ready")


def node_not_being_deleted(req: PodRequest, node: NodeView, cluster: ClusterView) -> Optional[Reject]:
    return Reject(node.name, "node(s) were being deleted") if node.being_deleted else None


def tolerates(tolerations: Iterable[Toleration], taint: Taint) -> bool:
    for t in tolerations:
        if t.effect and t.effect != taint.effect:
            continue
        if t.operator == "Exists":
            if not t.key or t.key == taint.key:
                return True
        elif t.key == taint.key and t.value == taint.value:
            return True
    return False


def node_schedulable(req: PodRequest, node: NodeView, cluster: ClusterView) -> Optional[Reject]:
    if not node.unschedulable:
        return None
    if tolerates(req.pod.tolerations, Taint(key=UNSCHEDULABLE_TAINT, effect="NoSchedule")):
        return None
    return Reject(node.name, "node(s) were unschedulable")


def node_selector_matches(req: PodRequest, node: NodeView, cluster: ClusterView) -> Optional[Reject]:
    labels = node.labels
    if all(labels.get(k) == v for k, v in req.pod.node_selector.items()):
        return None
    return Reject(node.name, "node(s) didn't match Pod's node affinity/selector")


def node_affinity_satisfied(req: PodRequest, node: NodeView, cluster: ClusterView) -> Optional[Reject]:
    if node_affinity_matches(req.pod.required_node_affinity, node.name, node.labels):
        return None
    return Reject(node.name, "node(s) didn't match Pod's node affinity/selector")


def taints_tolerated(req: PodRequest, node: NodeView, cluster: ClusterView) -> Optional[Reject]:
    for taint in node.taints:
        if taint.effect in FILTERING_EFFECTS and not tolerates(req.pod.tolerations, taint):
            return Reject(node.name, f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}")
    return None


# --- placement: other pods on the node ----------------------------------------------------------------------------

def ports_conflict(a: HostPort, b: HostPort) -> bool:
    if a.port != b.port or a.protocol != b.protocol:
        return False
    return a.host_ip == b.host_ip or "0.0.0.0" in (a.host_ip, b.host_ip)


def host_ports_free(req: PodRequest, node: NodeView, cluster: ClusterView) -> Optional[Reject]:
    wanted = [p for p in req.pod.host_ports if p.port > 0]
    if not wanted:
        return None
    for used in node.host_ports():
        if any(ports_conflict(used, w) for w in wanted):
            return Reject(node.name, PORTS_TAKEN)
    return None


def term_matches_pod(term: PodAffinityTerm, owner_namespace: str, pod: PodInfo) -> bool:
    namespaces = term.namespaces or (owner_namespace,)
    return pod.namespace in namespaces and label_selector_matches(term.label_selector, pod.labels)


def pod_affinity_satisfied(req: PodRequest, node: NodeView, cluster: ClusterView) -> Optional[Reject]:
    """Every required affinity term needs a matching pod on this node (hostname topology). Upstream exception: if no
    pod anywhere matches a term and the pod matches its own term, it may go anywhere (the first of a group)."""
    pod = req.pod
    for term in pod.required_pod_affinity:
        if any(term_matches_pod(term, pod.namespace, other) for other in node.pods()):
            continue
        if not cluster.any_pod_matches(term, pod.namespace) and term_matches_pod(term, pod.namespace, pod):
            continue
        return Reject(node.name, AFFINITY_UNMET)
    return None


def pod_anti_affinity_satisfied(req: PodRequest, node: NodeView, cluster: ClusterView) -> Optional[Reject]:
    """The pod's own anti-affinity, and (symmetry) the anti-affinity of pods already on the node."""
    pod = req.pod
    others = tuple(node.pods())
    for term in pod.required_pod_anti_affinity:
        if any(term_matches_pod(term, pod.namespace, other) for other in others):
            return Reject(node.name, ANTI_AFFINITY_UNMET)
    for other in others:
        if any(term_matches_pod(term, other.namespace, pod) for term in other.required_pod_anti_affinity):
            return Reject(node.name, EXISTING_ANTI_AFFINITY)
    return None


# --- resources ----------------------------------------------------------------------------------------------------

def _insufficient(node: NodeView, resource: str, requested: int, reason: str) -> Optional[Reject]:
    free = node.free(resource)
    if requested <= free:
        return None
    return Reject(node.name, reason, resource=resource, requested=requested, free=free,
                  capacity=node.capacity(resource))


def resources_fit(req: PodRequest, node: NodeView, cluster: ClusterView) -> Optional[Reject]:
    """Pod count, cpu, memory, ephemeral storage and extended resources other than the node's GPU resource."""
    found = _insufficient(node, PODS, 1, "Too many pods")
    if found:
        return found
    r = req.requests
    for name, amount in ((CPU, r.milli_cpu), (MEMORY, r.memory), (EPHEMERAL_STORAGE, r.ephemeral_storage)):
        if amount:
            found = _insufficient(node, name, amount, f"Insufficient {name}")
            if found:
                return found
    for name, amount in r.scalar.items():
        if amount > 0 and name != node.gpu_resource:
            found = _insufficient(node, name, amount, f"Insufficient {name}")
            if found:
                return found
    return None


def gpus_fit(req: PodRequest, node: NodeView, cluster: ClusterView) -> Optional[Reject]:
    amount = req.gpus(node.gpu_resource)
    return _insufficient(node, node.gpu_resource, amount, f"Insufficient {node.gpu_resource}") if amount else None


STATIC_FILTERS: tuple[Filter, ...] = (node_ready, node_not_being_deleted, node_schedulable, node_selector_matches,
                                      node_affinity_satisfied, taints_tolerated)
PLACEMENT_FILTERS: tuple[Filter, ...] = (host_ports_free, pod_affinity_satisfied, pod_anti_affinity_satisfied)
RESOURCE_FILTERS: tuple[Filter, ...] = (resources_fit, gpus_fit)
FILTERS: tuple[Filter, ...] = STATIC_FILTERS + PLACEMENT_FILTERS + RESOURCE_FILTERS


def first_reject(filters: Sequence[Filter], req: PodRequest, node: NodeView, cluster: ClusterView) -> Optional[Reject]:
    for check in filters:
        found = check(req, node, cluster)
        if found is not None:
            return found
    return None
