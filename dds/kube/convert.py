"""Kubernetes API objects -> the planner's snapshot types. The one place that knows both shapes.

Anything on a pod that the simulation does not model is listed in `PodInfo.unsupported`, so the planner never promises
such a pod a fit (it says why instead).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

from dds.model.groups import Taint
from dds.model.resources import Resources, check_pod_totals
from dds.model.dra_records import PodClaimRef
from dds.model.provisioning import CONSUME_ANNOTATION
from dds.model.snapshot import (ContainerRequests, HostPort, LabelSelector, NodeSelectorTerm, PodAffinityTerm, PodInfo,
                                SelectorRequirement, Toleration, WorkloadRef)

TAINT_TO_BE_DELETED = "ToBeDeletedByClusterAutoscaler"
ANN_SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
ANN_MIRROR = "kubernetes.io/config.mirror"
HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"


def _ts(value: Any) -> float:
    return value.timestamp() if value is not None else 0.0


def _requirements(items: Optional[Iterable[Any]]) -> tuple[SelectorRequirement, ...]:
    return tuple(SelectorRequirement(r.key, r.operator, tuple(r.values or ())) for r in items or ())


def _label_selector(selector: Any) -> LabelSelector:
    if selector is None:
        return LabelSelector()
    return LabelSelector(dict(selector.match_labels or {}), _requirements(selector.match_expressions))


def _affinity_terms(terms: Optional[Iterable[Any]], kind: str, unsupported: list[str]) -> tuple[PodAffinityTerm, ...]:
    out = []
    for term in terms or ():
        if term.topology_key != HOSTNAME_TOPOLOGY:
            unsupported.append(f"required {kind} on topology {term.topology_key!r} (only {HOSTNAME_TOPOLOGY} is simulated)")
            continue
        if getattr(term, "namespace_selector", None) is not None:
            unsupported.append(f"required {kind} with a namespaceSelector")
            continue
        if getattr(term, "match_label_keys", None) or getattr(term, "mismatch_label_keys", None):
            unsupported.append(f"required {kind} with matchLabelKeys")
            continue
        out.append(PodAffinityTerm(_label_selector(term.label_selector), term.topology_key, tuple(term.namespaces or ())))
    return tuple(out)


def _containers(containers: Optional[Iterable[Any]], init: bool = False) -> tuple[ContainerRequests, ...]:
    out = []
    for c in containers or ():
        requests = (c.resources.requests if c.resources and c.resources.requests else None) or {}
        # A container with limits but no requests gets requests = limits from the apiserver's defaulting already.
        out.append(ContainerRequests(Resources.parse(requests),
                                     restartable_init=init and getattr(c, "restart_policy", None) == "Always"))
    return tuple(out)


def _host_ports(spec: Any) -> tuple[HostPort, ...]:
    ports = []
    for c in list(spec.containers or ()) + list(spec.init_containers or ()):
        for p in c.ports or ():
            if p.host_port:
                ports.append(HostPort(int(p.host_port), p.protocol or "TCP", p.host_ip or "0.0.0.0"))
    return tuple(ports)


def _owner_kind(meta: Any) -> Optional[str]:
    if ANN_MIRROR in (meta.annotations or {}):
        return "Node"
    for ref in meta.owner_references or ():
        if ref.controller:
            return ref.kind
    return None


def _not_movable_reason(pod: Any, owner_kind: Optional[str]) -> Optional[str]:
    annotations = pod.metadata.annotations or {}
    if annotations.get(ANN_SAFE_TO_EVICT) == "false":
        return f"annotated {ANN_SAFE_TO_EVICT}=false"
    if owner_kind is None:
        return "not managed by a controller (nothing would recreate it)"
    for volume in pod.spec.volumes or ():
        if volume.empty_dir is not None and (volume.empty_dir.medium or "") != "Memory":
            return f"uses local storage (emptyDir {volume.name})"
    return None


def _unsupported(spec: Any) -> list[str]:
    reasons = []
    for constraint in spec.topology_spread_constraints or ():
        if constraint.when_unsatisfiable == "DoNotSchedule":
            reasons.append(f"topologySpreadConstraints on {constraint.topology_key!r}")
    for volume in spec.volumes or ():
        if volume.persistent_volume_claim is not None:
            reasons.append(f"persistentVolumeClaim volume {volume.name!r} (volume topology is not simulated)")
    return reasons


def pod_claims(pod: Any) -> tuple[PodClaimRef, ...]:
    """spec.resourceClaims, each with the claim generated for its template (status.resourceClaimStatuses)."""
    statuses = getattr(pod.status, "resource_claim_statuses", None) if pod.status else None
    generated = {s.name: s.resource_claim_name for s in statuses or ()}
    refs = tuple(PodClaimRef(c.name or "", getattr(c, "resource_claim_name", None) or None,
                             getattr(c, "resource_claim_template_name", None) or None, generated.get(c.name) or None)
                 for c in getattr(pod.spec, "resource_claims", None) or ())
    # Extended resources served by DRA (KEP-5004), as dds/kube/decode.py pod_claims reads them.
    extended = getattr(pod.status, "extended_resource_claim_status", None) if pod.status else None
    if extended is not None and extended.resource_claim_name:
        resources = tuple(sorted({m.resource_name or "" for m in extended.request_mappings or ()}))
        refs += (PodClaimRef("", generated_name=extended.resource_claim_name, extended_resources=resources),)
    return refs


def _workload_ref(spec: Any) -> Optional[WorkloadRef]:
    # `spec.workloadRef` exists in the 1.35 API only: client releases made for later APIs drop it when they build the
    # model (they know `schedulingGroup` instead), so this LIST path sees it only with a client that models it. The
    # watch cache reads the raw JSON (dds/kube/decode.py) and always sees it.
    ref = getattr(spec, "workload_ref", None)
    if ref is None or not getattr(ref, "name", None):
        return None
    return WorkloadRef(ref.name, getattr(ref, "pod_group", None) or "", getattr(ref, "pod_group_replica_key", None) or "")


def pod_info(pod: Any) -> PodInfo:
    """A kubernetes.client V1Pod as the simulation sees it."""
    meta, spec = pod.metadata, pod.spec
    unsupported = _unsupported(spec)
    affinity = spec.affinity
    node_terms: tuple[NodeSelectorTerm, ...] = ()
    pod_affinity: tuple[PodAffinityTerm, ...] = ()
    anti_affinity: tuple[PodAffinityTerm, ...] = ()
    if affinity is not None:
        na = affinity.node_affinity
        if na is not None and na.required_during_scheduling_ignored_during_execution is not None:
            node_terms = tuple(
                NodeSelectorTerm(_requirements(t.match_expressions), _requirements(t.match_fields))
                for t in na.required_during_scheduling_ignored_during_execution.node_selector_terms or ())
        if affinity.pod_affinity is not None:
            pod_affinity = _affinity_terms(affinity.pod_affinity.required_during_scheduling_ignored_during_execution,
                                           "pod affinity", unsupported)
        if affinity.pod_anti_affinity is not None:
            anti_affinity = _affinity_terms(
                affinity.pod_anti_affinity.required_during_scheduling_ignored_during_execution,
                "pod anti-affinity", unsupported)
    owner_kind = _owner_kind(meta)
    containers, init_containers = _containers(spec.containers), _containers(spec.init_containers, init=True)
    overhead = Resources.parse(spec.overhead or {})
    check_pod_totals([*(c.requests for c in containers + init_containers), overhead])
    return PodInfo(
        namespace=meta.namespace or "default",
        name=meta.name,
        uid=meta.uid or "",
        labels=dict(meta.labels or {}),
        containers=containers,
        init_containers=init_containers,
        overhead=overhead,
        node_name=spec.node_name or None,
        node_selector=dict(spec.node_selector or {}),
        required_node_affinity=node_terms,
        tolerations=tuple(Toleration(t.key or "", t.operator or "Equal", t.value or "", t.effect or "")
                          for t in spec.tolerations or ()),
        host_ports=_host_ports(spec),
        required_pod_affinity=pod_affinity,
        required_pod_anti_affinity=anti_affinity,
        priority=int(spec.priority or 0),
        owner_kind=owner_kind,
        created_at=_ts(meta.creation_timestamp),
        unsupported=tuple(unsupported),
        not_movable_reason=_not_movable_reason(pod, owner_kind),
        workload_ref=_workload_ref(spec),
        scheduling_group=getattr(getattr(spec, "scheduling_group", None), "pod_group_name", None) or None,
        resource_claims=pod_claims(pod),
        consumes_provisioning_request=(meta.annotations or {}).get(CONSUME_ANNOTATION) or None,
    )


def pod_is_terminal(pod: Any) -> bool:
    return (pod.status.phase if pod.status else None) in ("Succeeded", "Failed")


def pod_unschedulable_since(pod: Any) -> Optional[float]:
    """When the scheduler last said it could not place the pod (PodScheduled=False, reason Unschedulable)."""
    for condition in (pod.status.conditions if pod.status else None) or ():
        if condition.type == "PodScheduled" and condition.status == "False" and condition.reason == "Unschedulable":
            return _ts(condition.last_transition_time) or _ts(pod.metadata.creation_timestamp)
    return None


def node_taints(node: Any) -> tuple[Taint, ...]:
    return tuple(Taint(key=t.key, value=t.value or "", effect=t.effect) for t in node.spec.taints or ())


def node_ready(node: Any) -> bool:
    for condition in (node.status.conditions if node.status else None) or ():
        if condition.type == "Ready":
            return condition.status == "True"
    return False


def node_allocatable(node: Any) -> Resources:
    status = node.status
    return Resources.parse((status.allocatable if status else None) or (status.capacity if status else None) or {})


def node_marked_for_deletion(node: Any) -> bool:
    if node.metadata.deletion_timestamp is not None:
        return True
    return any(t.key == TAINT_TO_BE_DELETED for t in node.spec.taints or ())


def labels_of(obj: Any) -> Mapping[str, str]:
    return dict(obj.metadata.labels or {})
