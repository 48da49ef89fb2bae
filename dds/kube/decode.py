"""Raw API JSON (camelCase dicts, as orjson parses a response body) -> the lean records the observer and planner read.

The hot path never builds kubernetes.client model objects: for 50,000 pods they cost most of a LIST's time (the
client's deserializer walks every field through reflection). These functions read only the fields the planner uses and
mirror dds/kube/convert.py, which does the same from model objects; tests/unit/kube/test_decode.py checks that both give
the same PodInfo for the same pod.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Optional

from dds.metrics import OBJECTS_REFUSED
from dds.model.text import bounded_text
from dds.kube.convert import ANN_MIRROR, ANN_SAFE_TO_EVICT, HOSTNAME_TOPOLOGY, TAINT_TO_BE_DELETED
from dds.model.provisioning import CONSUME_ANNOTATION
from dds.model.groups import Taint
from dds.model.resources import Resources, check_pod_totals
from dds.model.quantity import to_int
from dds.model.dra_records import (EXACT_COUNT, AllocatedDeviceInfo, DeviceClassInfo, DeviceRequestInfo,
                                   DeviceTaintInfo, DraDevice, PodClaimRef, ResourceClaimInfo,
                                   ResourceClaimTemplateInfo, ResourceSliceInfo)
from dds.model.snapshot import (NOT_READABLE, ContainerRequests, HostPort, LabelSelector, NodeSelectorTerm,
                                PodAffinityTerm, PodInfo, SelectorRequirement, Toleration, WorkloadRef)

log = logging.getLogger(__name__)

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
    return reasons


def pod_claims(pod: Obj) -> tuple[PodClaimRef, ...]:
    """spec.resourceClaims, each with the claim generated for its template (status.resourceClaimStatuses)."""
    status = pod.get("status") or _EMPTY
    generated = {s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or ()}
    refs = tuple(PodClaimRef(c.get("name") or "", c.get("resourceClaimName") or None,
                             c.get("resourceClaimTemplateName") or None, generated.get(c.get("name")) or None)
                 for c in (pod.get("spec") or _EMPTY).get("resourceClaims") or ())
    # Extended resources served by DRA (KEP-5004): kube-scheduler made a claim for them and names it here.
    extended = status.get("extendedResourceClaimStatus") or _EMPTY
    if extended.get("resourceClaimName"):
        resources = tuple(sorted({m.get("resourceName") or "" for m in extended.get("requestMappings") or ()}))
        refs += (PodClaimRef("", generated_name=extended["resourceClaimName"], extended_resources=resources),)
    return refs


def _workload_ref(spec: Obj) -> Optional[WorkloadRef]:
    ref = spec.get("workloadRef")
    if not ref or not ref.get("name"):
        return None
    return WorkloadRef(ref["name"], ref.get("podGroup") or "", ref.get("podGroupReplicaKey") or "")


def _scheduling_group(spec: Obj) -> Optional[str]:
    """`spec.schedulingGroup.podGroupName` (Kubernetes 1.36): the PodGroup the pod belongs to."""
    return (spec.get("schedulingGroup") or _EMPTY).get("podGroupName") or None


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
    containers, init_containers = _containers(spec.get("containers")), _containers(spec.get("initContainers"), True)
    overhead = resources(spec.get("overhead"))
    check_pod_totals([*(c.requests for c in containers + init_containers), overhead])
    return PodInfo(
        namespace=meta.get("namespace") or "default",
        name=meta.get("name", ""),
        uid=meta.get("uid") or "",
        labels=dict(meta.get("labels") or {}),
        containers=containers,
        init_containers=init_containers,
        overhead=overhead,
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
        workload_ref=_workload_ref(spec),
        scheduling_group=_scheduling_group(spec),
        resource_claims=pod_claims(pod),
        consumes_provisioning_request=(meta.get("annotations") or _EMPTY).get(CONSUME_ANNOTATION) or None,
    )


UNREADABLE_ERROR_CHARS = 300  # of a decoder's error, in the log and a refused pod's Event


def noted_unreadable(kind: str, key: str, exc: Exception, outcome: str) -> str:
    """Log and count an object of `kind` DDS cannot read (`outcome`: what becomes of it); the error as bounded text."""
    error = bounded_text(f"{type(exc).__name__}: {exc}", UNREADABLE_ERROR_CHARS)
    OBJECTS_REFUSED.labels(kind, NOT_READABLE).inc()
    log.warning("%s %s: cannot read it (%s); %s", kind, key, error, outcome,
                extra={"object": key, "reason": NOT_READABLE})
    return error


def unreadable_pod_record(pod: Obj, error: str) -> PodRecord:
    """A pod `pod_record` could not read, as the planner sees it: refused with the error (never promised a fit, an
    Event tells its owner), named and placed as the apiserver has it. Reads nothing but strings where it expects them:
    the rest of the object may be of any shape."""
    meta, spec, status = (_as_mapping(pod.get(k)) for k in ("metadata", "spec", "status"))
    why = f"DDS cannot read the pod's spec ({error})"
    info = PodInfo(namespace=_as_text(meta.get("namespace")) or "default", name=_as_text(meta.get("name")),
                   uid=_as_text(meta.get("uid")), node_name=_as_text(spec.get("nodeName")) or None,
                   unsupported=(why,), dra_refusal=why, dra_refusal_reason=NOT_READABLE, claims_lowered=True)
    return PodRecord(info=info, terminal=status.get("phase") in ("Succeeded", "Failed"), unschedulable_since=None,
                     resource_version=_as_text(meta.get("resourceVersion")))


def _as_mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else _EMPTY


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else ""


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


# --- Dynamic Resource Allocation (resource.k8s.io/v1) ---

def _qualified(name: str, driver: str) -> str:
    # A name without a domain belongs to the driver's domain (resource.k8s.io/v1 Device.attributes).
    return name if "/" in name else f"{driver}/{name}"


def _attribute(value: Obj) -> Any:
    for kind in ("string", "int", "bool", "version"):
        if kind in value:
            return value[kind]
    return None


def _taints(items: Optional[Iterable[Obj]]) -> tuple[DeviceTaintInfo, ...]:
    return tuple(DeviceTaintInfo(t.get("key") or "", t.get("value") or "", t.get("effect") or "",
                                 t.get("operator") or "") for t in items or ())


def dra_device(device: Obj, driver: str, pool: str) -> DraDevice:
    attributes = {_qualified(k, driver): _attribute(v or _EMPTY) for k, v in (device.get("attributes") or {}).items()}
    capacity = {_qualified(k, driver): to_int((v or _EMPTY).get("value") or 0)
                for k, v in (device.get("capacity") or {}).items()}
    return DraDevice(name=device.get("name") or "", driver=driver, pool=pool,
                     attributes=MappingProxyType({k: v for k, v in attributes.items() if v is not None}),
                     capacity=MappingProxyType(capacity), binds_to_node=bool(device.get("bindsToNode")),
                     binding_conditions=tuple(device.get("bindingConditions") or ()),
                     binding_failure_conditions=tuple(device.get("bindingFailureConditions") or ()),
                     allow_multiple_allocations=bool(device.get("allowMultipleAllocations")),
                     consumes_counters=tuple(c.get("counterSet") or "" for c in device.get("consumesCounters") or ()),
                     taints=_taints(device.get("taints")))


def resource_slice(obj: Obj) -> ResourceSliceInfo:
    spec = obj.get("spec") or _EMPTY
    driver, pool = spec.get("driver") or "", spec.get("pool") or _EMPTY
    pool_name = pool.get("name") or ""
    return ResourceSliceInfo(name=_meta(obj).get("name") or "", driver=driver, pool=pool_name,
                             pool_generation=int(pool.get("generation") or 0), node_name=spec.get("nodeName") or None,
                             devices=tuple(dra_device(d, driver, pool_name) for d in spec.get("devices") or ()),
                             shared_counters=tuple(c.get("name") or "" for c in spec.get("sharedCounters") or ()))


def _selectors(items: Optional[Iterable[Obj]]) -> tuple[str, ...]:
    return tuple((s.get("cel") or _EMPTY).get("expression") or "" for s in items or () if s.get("cel"))


def device_class(obj: Obj) -> DeviceClassInfo:
    spec = obj.get("spec") or _EMPTY
    return DeviceClassInfo(_meta(obj).get("name") or "", _selectors(spec.get("selectors")),
                           extended_resource_name=spec.get("extendedResourceName") or None,
                           created_at=timestamp(_meta(obj).get("creationTimestamp")))


def device_requests(spec: Obj) -> tuple[DeviceRequestInfo, ...]:
    out = []
    for request in ((spec.get("devices") or _EMPTY).get("requests") or ()):
        exactly = request.get("exactly")
        if exactly is None:
            out.append(DeviceRequestInfo(request.get("name") or "", first_available=bool(request.get("firstAvailable"))))
            continue
        # Every field of `exactly` is read: one the planner cannot honour is refused there (dds/planner/dra.py),
        # never dropped here and planned as a plain request for whole GPUs.
        capacity = ((exactly.get("capacity") or _EMPTY).get("requests") or _EMPTY).items()
        out.append(DeviceRequestInfo(request.get("name") or "", exactly.get("deviceClassName") or "",
                                     _selectors(exactly.get("selectors")), exactly.get("allocationMode") or EXACT_COUNT,
                                     int(exactly.get("count") or 1), admin_access=bool(exactly.get("adminAccess")),
                                     tolerations=_taints(exactly.get("tolerations")),
                                     capacity=MappingProxyType({k: to_int(v) for k, v in capacity})))
    return tuple(out)


def resource_claim(obj: Obj) -> ResourceClaimInfo:
    meta, spec, status = _meta(obj), obj.get("spec") or _EMPTY, obj.get("status") or _EMPTY
    allocation = status.get("allocation")
    allocated = None if allocation is None else tuple(
        AllocatedDeviceInfo(r.get("request") or "", r.get("driver") or "", r.get("pool") or "", r.get("device") or "")
        for r in (allocation.get("devices") or _EMPTY).get("results") or ())
    annotations = meta.get("annotations") or _EMPTY
    return ResourceClaimInfo(namespace=meta.get("namespace") or "default", name=meta.get("name") or "",
                             requests=device_requests(spec), allocated=allocated,
                             reserved_for=tuple(r.get("name") or "" for r in status.get("reservedFor") or ()
                                                if r.get("resource") == "pods"),
                             constraints=len((spec.get("devices") or _EMPTY).get("constraints") or ()),
                             uid=meta.get("uid") or "",
                             allocated_at=(allocation or _EMPTY).get("allocationTimestamp") or "",
                             allocated_node=_allocated_node(allocation),
                             true_conditions=MappingProxyType({
                                 d.get("device") or "": tuple(c.get("type") or "" for c in d.get("conditions") or ()
                                                              if c.get("status") == "True")
                                 for d in status.get("devices") or ()}),
                             fabric_devices=tuple(x for x in (annotations.get(ANN_FABRIC_DEVICES) or "").split(",") if x))


ANN_FABRIC_DEVICES = "dds.cdi.dev/fabric-devices"  # on a claim: the fabric devices DDS attached for it (pool mode)


def _allocated_node(allocation: Optional[Obj]) -> Optional[str]:
    """The node of an allocation restricted to one (matchFields metadata.name In [node]), as kube-scheduler writes it
    for node-local devices and devices that bind to a node."""
    for term in ((allocation or _EMPTY).get("nodeSelector") or _EMPTY).get("nodeSelectorTerms") or ():
        for field in term.get("matchFields") or ():
            values = field.get("values") or ()
            if field.get("key") == "metadata.name" and field.get("operator") == "In" and len(values) == 1:
                return values[0]
    return None


def resource_claim_template(obj: Obj) -> ResourceClaimTemplateInfo:
    meta, spec = _meta(obj), ((obj.get("spec") or _EMPTY).get("spec") or _EMPTY)
    return ResourceClaimTemplateInfo(namespace=meta.get("namespace") or "default", name=meta.get("name") or "",
                                     requests=device_requests(spec),
                                     constraints=len((spec.get("devices") or _EMPTY).get("constraints") or ()))
