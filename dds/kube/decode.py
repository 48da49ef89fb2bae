"""Raw API JSON (camelCase dicts, as orjson parses a response body) -> the lean records the observer and planner read.

The hot path never builds kubernetes.client model objects: for 50,000 pods they cost most of a LIST's time (the
client's deserializer walks every field through reflection). These functions read only the fields the planner uses and
mirror dds/kube/convert.py, which does the same from model objects; tests/unit/kube/test_decode.py checks that both give
the same PodInfo for the same pod.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Optional

from dds.kube.convert import ANN_MIRROR, ANN_SAFE_TO_EVICT, HOSTNAME_TOPOLOGY, TAINT_TO_BE_DELETED
from dds.model.groups import Taint
from dds.model.resources import Resources
from dds.planner.snapshot import (ContainerRequests, HostPort, LabelSelector, NodeSelectorTerm, PodAffinityTerm,
                                  PodInfo, SelectorRequirement, Toleration)

Obj = Mapping[str, Any]
_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A pod as DDS keeps it: what the planner sees, plus the two status facts the observer needs."""

    info: PodInfo
    terminal: bool  # Succeeded or Failed: holds no resources
    unschedulable_since: Optional[float]  # PodScheduled=False/Unschedulable since, for pending pods
    resource_version: str = ""

    @property
    def key(self) -> str:
        return self.info.key


@dataclass(frozen=True, slots=True)
class NodeRecord:
    name: str
    provider_id: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    unschedulable: bool
    ready: bool
    allocatable: Resources
    created_at: float
    marked_for_deletion: bool  # deletionTimestamp set, or CA's ToBeDeleted taint
    resource_version: str = ""

    @property
    def key(self) -> str:
        return self.name


@lru_cache(maxsize=4096)
def timestamp(value: Optional[str]) -> float:
    """RFC 3339 seconds ("2026-11-23T23:53:46Z") as epoch seconds; 0.0 when absent. Cached: most stamps repeat."""
    if not value:
        return 0.0
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _meta(obj: Obj) -> Obj:
    return obj.get("metadata") or _EMPTY


def object_key(obj: Obj) -> str:
    """namespace/name for namespaced objects, name for cluster-scoped ones (the cache's key)."""
    meta = _meta(obj)
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name', '')}" if namespace else str(meta.get("name", ""))


def resource_version(obj: Obj) -> str:
    return str(_meta(obj).get("resourceVersion") or "")


# --- pods ---

def _requirements(items: Optional[Iterable[Obj]]) -> tuple[SelectorRequirement, ...]:
    return tuple(SelectorRequirement(r.get("key", ""), r.get("operator", ""), tuple(r.get("values") or ()))
                 for r in items or ())


def _label_selector(selector: Optional[Obj]) -> LabelSelector:
    if selector is None:
        return LabelSelector()
    return LabelSelector(dict(selector.get("matchLabels") or {}), _requirements(selector.get("matchExpressions")))


def _affinity_terms(terms: Optional[Iterable[Obj]], kind: str, unsupported: list[str]) -> tuple[PodAffinityTerm, ...]:
    out = []
    for term in terms or ():
        topology = term.get("topologyKey", "")
        if topology != HOSTNAME_TOPOLOGY:
            unsupported.append(f"required {kind} on topology {topology!r} (only {HOSTNAME_TOPOLOGY} is simulated)")
            continue
        if term.get("namespaceSelector") is not None:
            unsupported.append(f"required {kind} with a namespaceSelector")
            continue
        if term.get("matchLabelKeys") or term.get("mismatchLabelKeys"):
            unsupported.append(f"required {kind} with matchLabelKeys")
            continue
        out.append(PodAffinityTerm(_label_selector(term.get("labelSelector")), topology,
                                   tuple(term.get("namespaces") or ())))
    return tuple(out)


def resources(values: Optional[Mapping[str, Any]]) -> Resources:
    """A resource list as Resources, shared between the many pods that ask for the same amounts (it is frozen)."""
    return _resources(tuple(values.items())) if values else _NO_RESOURCES


@lru_cache(maxsize=4096)
def _resources(items: tuple[tuple[str, Any], ...]) -> Resources:
    return Resources.parse(dict(items))


_NO_RESOURCES = Resources.parse({})


def _containers(containers: Optional[Iterable[Obj]], init: bool = False) -> tuple[ContainerRequests, ...]:
    out = []
    for c in containers or ():
        requests = (c.get("resources") or _EMPTY).get("requests")
        out.append(ContainerRequests(resources(requests),
                                     restartable_init=init and c.get("restartPolicy") == "Always"))
    return tuple(out)


def _host_ports(spec: Obj) -> tuple[HostPort, ...]:
    ports = []
    for c in list(spec.get("containers") or ()) + list(spec.get("initContainers") or ()):
        for p in c.get("ports") or ():
            if p.get("hostPort"):
                ports.append(HostPort(int(p["hostPort"]), p.get("protocol") or "TCP", p.get("hostIP") or "0.0.0.0"))
    return tuple(ports)


def _owner_kind(meta: Obj) -> Optional[str]:
    if ANN_MIRROR in (meta.get("annotations") or _EMPTY):
        return "Node"
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller"):
            return ref.get("kind")
    return None


def _not_movable_reason(meta: Obj, spec: Obj, owner_kind: Optional[str]) -> Optional[str]:
    if (meta.get("annotations") or _EMPTY).get(ANN_SAFE_TO_EVICT) == "false":
        return f"annotated {ANN_SAFE_TO_EVICT}=false"
    if owner_kind is None:
        return "not managed by a controller (nothing would recreate it)"
    for volume in spec.get("volumes") or ():
        empty_dir = volume.get("emptyDir")
        if empty_dir is not None and (empty_dir.get("medium") or "") != "Memory":
            return f"uses local storage (emptyDir {volume.get('name')})"
    return None


def _unsupported(spec: Obj) -> list[str]:
    reasons = []
    for constraint in spec.get("topologySpreadConstraints") or ():
        if constraint.get("whenUnsatisfiable") == "DoNotSchedule":
            reasons.append(f"topologySpreadConstraints on {constraint.get('topologyKey')!r}")
    for volume in spec.get("volumes") or ():
        if volume.get("persistentVolumeClaim") is not None:
            reasons.append(f"persistentVolumeClaim volume {volume.get('name')!r} (volume topology is not simulated)")
    if spec.get("resourceClaims"):
        reasons.append("dynamic resource allocation claims")
    return reasons


def pod_info(pod: Obj) -> PodInfo:
    """The simulation's view of one pod (the same as convert.pod_info on the model object)."""
    meta, spec = _meta(pod), pod.get("spec") or _EMPTY
    unsupported = _unsupported(spec)
    affinity = spec.get("affinity") or _EMPTY
    node_terms: tuple[NodeSelectorTerm, ...] = ()
    required = (affinity.get("nodeAffinity") or _EMPTY).get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is not None:
        node_terms = tuple(NodeSelectorTerm(_requirements(t.get("matchExpressions")),
                                            _requirements(t.get("matchFields")))
                           for t in required.get("nodeSelectorTerms") or ())
    pod_affinity = _affinity_terms((affinity.get("podAffinity") or _EMPTY).get(
        "requiredDuringSchedulingIgnoredDuringExecution"), "pod affinity", unsupported)
    anti_affinity = _affinity_terms((affinity.get("podAntiAffinity") or _EMPTY).get(
        "requiredDuringSchedulingIgnoredDuringExecution"), "pod anti-affinity", unsupported)
    owner_kind = _owner_kind(meta)
    return PodInfo(
        namespace=meta.get("namespace") or "default",
        name=meta.get("name", ""),
        uid=meta.get("uid") or "",
        labels=dict(meta.get("labels") or {}),
        containers=_containers(spec.get("containers")),
        init_containers=_containers(spec.get("initContainers"), init=True),
        overhead=resources(spec.get("overhead")),
        node_name=spec.get("nodeName") or None,
        node_selector=dict(spec.get("nodeSelector") or {}),
        required_node_affinity=node_terms,
        tolerations=tuple(Toleration(t.get("key") or "", t.get("operator") or "Equal", t.get("value") or "",
                                     t.get("effect") or "") for t in spec.get("tolerations") or ()),
        host_ports=_host_ports(spec),
        required_pod_affinity=pod_affinity,
        required_pod_anti_affinity=anti_affinity,
        priority=int(spec.get("priority") or 0),
        owner_kind=owner_kind,
        created_at=timestamp(meta.get("creationTimestamp")),
        unsupported=tuple(unsupported),
        not_movable_reason=_not_movable_reason(meta, spec, owner_kind),
    )


def pod_is_terminal(pod: Obj) -> bool:
    return (pod.get("status") or _EMPTY).get("phase") in ("Succeeded", "Failed")


def pod_unschedulable_since(pod: Obj) -> Optional[float]:
    for condition in (pod.get("status") or _EMPTY).get("conditions") or ():
        if (condition.get("type") == "PodScheduled" and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"):
            return timestamp(condition.get("lastTransitionTime")) or timestamp(_meta(pod).get("creationTimestamp"))
    return None


def pod_record(pod: Obj) -> PodRecord:
    return PodRecord(info=pod_info(pod), terminal=pod_is_terminal(pod),
                     unschedulable_since=pod_unschedulable_since(pod), resource_version=resource_version(pod))


# --- nodes ---

def node_record(node: Obj) -> NodeRecord:
    meta, spec, status = _meta(node), node.get("spec") or _EMPTY, node.get("status") or _EMPTY
    taints = tuple(Taint(key=t.get("key", ""), value=t.get("value") or "", effect=t.get("effect", ""))
                   for t in spec.get("taints") or ())
    ready = next((c.get("status") == "True" for c in status.get("conditions") or () if c.get("type") == "Ready"),
                 False)
    return NodeRecord(
        name=meta.get("name", ""), provider_id=spec.get("providerID") or "", labels=dict(meta.get("labels") or {}),
        taints=taints, unschedulable=bool(spec.get("unschedulable")), ready=ready,
        allocatable=resources(status.get("allocatable") or status.get("capacity")),
        created_at=timestamp(meta.get("creationTimestamp")),
        marked_for_deletion=bool(meta.get("deletionTimestamp")) or any(t.key == TAINT_TO_BE_DELETED for t in taints),
        resource_version=resource_version(node))


# --- Cluster API objects: kept as dicts (dds/kube/capi.py reads them), minus what nobody reads ---

def lean_object(obj: Obj) -> dict[str, Any]:
    """The object without metadata.managedFields (often most of its size) and without its last-applied annotation."""
    out = dict(obj)
    meta = dict(_meta(obj))
    meta.pop("managedFields", None)
    annotations = meta.get("annotations")
    if annotations and "kubectl.kubernetes.io/last-applied-configuration" in annotations:
        meta["annotations"] = {k: v for k, v in annotations.items()
                               if k != "kubectl.kubernetes.io/last-applied-configuration"}
    out["metadata"] = meta
    return out
