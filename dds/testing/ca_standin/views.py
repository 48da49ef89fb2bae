"""The parts of Nodes and Pods the stand-in looks at, as plain frozen values.

Built from the apiserver's JSON (camelCase manifests, as `kubectl get -o json` prints them) or, for a template, from the
protobuf Node a provider returns. Quantities are kept as integers in milli-units (1 cpu = 1000, 1 byte = 1000), so every
resource is compared the same exact way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping, Optional

from dds.model.quantity import QuantityError, to_milli

TAINT_TO_BE_DELETED = "ToBeDeletedByClusterAutoscaler"
TAINT_DELETION_CANDIDATE = "DeletionCandidateOfClusterAutoscaler"
FAKE_NODE_REASON_ANNOTATION = "k8s.io/cluster-autoscaler/fake-node-reason"
FAKE_NODE_CREATE_ERROR = "create-error"
FAKE_NODE_UNREGISTERED = "unregistered"
ANNOTATION_SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
ANNOTATION_SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
ANNOTATION_MIRROR_POD = "kubernetes.io/config.mirror"
LABEL_HOSTNAME = "kubernetes.io/hostname"
# The extended resources cluster-autoscaler treats as GPUs (utils/gpu GPUVendorResourceNames).
GPU_RESOURCES = ("nvidia.com/gpu", "habana.ai/gaudi", "gpu.intel.com/xe", "amd.com/gpu", "microsoft.com/directx")
# Taints the node lifecycle controller puts on a node that is not ready: CA counts such a node as not ready.
NOT_READY_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/disk-pressure",
                              "node.kubernetes.io/network-unavailable"})
PODS = "pods"


class ManifestError(ValueError):
    """A Node or Pod manifest the stand-in cannot read."""


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True)
class SelectorRequirement:
    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeSelectorTerm:
    match_expressions: tuple[SelectorRequirement, ...] = ()
    match_fields: tuple[SelectorRequirement, ...] = ()  # only metadata.name exists upstream


@dataclass(frozen=True)
class NodeView:
    name: str
    provider_id: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    allocatable: Mapping[str, int] = field(default_factory=dict)  # milli-units; includes "pods"
    capacity: Mapping[str, int] = field(default_factory=dict)
    ready: bool = True
    # When readiness last changed (latest transition of Ready/DiskPressure/NetworkUnavailable), epoch seconds.
    ready_since: float = 0.0
    created: float = 0.0
    has_ready_condition: bool = True

    def has_taint(self, key: str) -> bool:
        return any(t.key == key for t in self.taints)

    @property
    def to_be_deleted(self) -> bool:
        return self.has_taint(TAINT_TO_BE_DELETED)

    def gpu_allocatable(self) -> tuple[str, int]:
        """The first GPU resource with a non-zero allocatable, and its count; ("", 0) when none."""
        for resource in GPU_RESOURCES:
            if self.allocatable.get(resource, 0) > 0:
                return resource, self.allocatable[resource] // 1000
        return "", 0


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    node_name: str = ""
    phase: str = "Pending"
    requests: Mapping[str, int] = field(default_factory=dict)  # effective requests, milli-units
    node_selector: Mapping[str, str] = field(default_factory=dict)
    required_node_affinity: Optional[tuple[NodeSelectorTerm, ...]] = None
    tolerations: tuple[Toleration, ...] = ()
    unschedulable: bool = False  # PodScheduled=False with reason Unschedulable
    created: float = 0.0
    deleting: bool = False
    controller_kind: str = ""  # kind of the owner reference with controller=true
    annotations: Mapping[str, str] = field(default_factory=dict)
    local_storage: bool = False  # an emptyDir or hostPath volume
    priority: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def is_daemonset(self) -> bool:
        return self.controller_kind == "DaemonSet"

    @property
    def is_mirror(self) -> bool:
        return ANNOTATION_MIRROR_POD in self.annotations

    def requests_gpu(self) -> bool:
        return any(self.requests.get(r, 0) > 0 for r in GPU_RESOURCES)


def parse_time(value: Optional[str]) -> float:
    """RFC 3339 (as the apiserver writes it) to epoch seconds; 0 when absent."""
    if not value:
        return 0.0
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _quantities(raw: Mapping[str, Any], where: str) -> dict[str, int]:
    result = {}
    for name, value in (raw or {}).items():
        try:
            result[name] = to_milli(value)
        except QuantityError as exc:
            raise ManifestError(f"{where}: resource {name!r}: {exc}") from exc
    return result


def _taints(raw: Optional[list[dict[str, Any]]]) -> tuple[Taint, ...]:
    return tuple(Taint(t.get("key", ""), t.get("value", "") or "", t.get("effect", "")) for t in raw or ())


def _readiness(conditions: list[dict[str, Any]], taints: tuple[Taint, ...],
               taint_times: dict[str, float]) -> tuple[bool, float, bool]:
    """cluster-autoscaler's node readiness: Ready=True, no DiskPressure/NetworkUnavailable, no not-ready taint."""
    ready, found, since = True, False, 0.0
    for condition in conditions:
        kind, status = condition.get("type"), condition.get("status")
        if kind not in ("Ready", "DiskPressure", "NetworkUnavailable"):
            continue
        since = max(since, parse_time(condition.get("lastTransitionTime")))
        if kind == "Ready":
            found = True
            ready = ready and status == "True"
        elif status == "True":
            ready = False
    for taint in taints:
        if taint.key in NOT_READY_TAINTS:
            ready = False
            since = max(since, taint_times.get(taint.key, 0.0))
    return ready and found, since, found


def node_from_manifest(manifest: Mapping[str, Any]) -> NodeView:
    meta, spec, status = manifest.get("metadata") or {}, manifest.get("spec") or {}, manifest.get("status") or {}
    name = meta.get("name", "")
    where = f"Node {name!r} status"
    taints = _taints(spec.get("taints"))
    taint_times = {t.get("key", ""): parse_time(t.get("timeAdded")) for t in spec.get("taints") or ()}
    ready, since, found = _readiness(status.get("conditions") or [], taints, taint_times)
    return NodeView(name=name, provider_id=spec.get("providerID", "") or "", labels=dict(meta.get("labels") or {}),
                    annotations=dict(meta.get("annotations") or {}), taints=taints,
                    unschedulable=bool(spec.get("unschedulable")),
                    allocatable=_quantities(status.get("allocatable") or {}, f"{where}.allocatable"),
                    capacity=_quantities(status.get("capacity") or {}, f"{where}.capacity"),
                    ready=ready, ready_since=since, created=parse_time(meta.get("creationTimestamp")),
                    has_ready_condition=found)


def node_from_proto(node: Any) -> NodeView:
    """A core/v1 Node protobuf (our subset) as a view: what a template from NodeGroupTemplateNodeInfo looks like."""
    name = node.metadata.name
    where = f"template Node {name!r} status"
    taints = tuple(Taint(t.key, t.value, t.effect) for t in node.spec.taints)
    conditions = [{"type": c.type, "status": c.status} for c in node.status.conditions]
    ready, _, found = _readiness(conditions, taints, {})
    return NodeView(name=name, provider_id=node.spec.providerID, labels=dict(node.metadata.labels),
                    annotations=dict(node.metadata.annotations), taints=taints,
                    unschedulable=node.spec.unschedulable,
                    allocatable=_quantities({k: q.string for k, q in node.status.allocatable.items()},
                                            f"{where}.allocatable"),
                    capacity=_quantities({k: q.string for k, q in node.status.capacity.items()}, f"{where}.capacity"),
                    ready=ready, has_ready_condition=found)


def _container_requests(containers: list[dict[str, Any]], where: str) -> list[dict[str, int]]:
    return [_quantities((c.get("resources") or {}).get("requests") or {}, f"{where} container {c.get('name')!r}")
            for c in containers or ()]


def effective_requests(spec: Mapping[str, Any], where: str) -> dict[str, int]:
    """What the scheduler charges a pod: max(sum of app containers (+ sidecars), each init container) + overhead."""
    total: dict[str, int] = {}
    for requests in _container_requests(spec.get("containers") or [], where):
        for name, value in requests.items():
            total[name] = total.get(name, 0) + value
    sidecars: dict[str, int] = {}
    for container, requests in zip(spec.get("initContainers") or [],
                                   _container_requests(spec.get("initContainers") or [], where)):
        if container.get("restartPolicy") == "Always":  # a sidecar runs alongside the app containers
            for name, value in requests.items():
                sidecars[name] = sidecars.get(name, 0) + value
                total[name] = total.get(name, 0) + value
        else:
            for name, value in requests.items():
                total[name] = max(total.get(name, 0), value + sidecars.get(name, 0))
    for name, value in _quantities(spec.get("overhead") or {}, f"{where} overhead").items():
        total[name] = total.get(name, 0) + value
    return total


def _requirements(raw: Optional[list[dict[str, Any]]]) -> tuple[SelectorRequirement, ...]:
    return tuple(SelectorRequirement(r.get("key", ""), r.get("operator", ""), tuple(r.get("values") or ()))
                 for r in raw or ())


def _required_affinity(spec: Mapping[str, Any]) -> Optional[tuple[NodeSelectorTerm, ...]]:
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return None
    return tuple(NodeSelectorTerm(_requirements(t.get("matchExpressions")), _requirements(t.get("matchFields")))
                 for t in required.get("nodeSelectorTerms") or ())


def pod_from_manifest(manifest: Mapping[str, Any]) -> PodView:
    meta, spec, status = manifest.get("metadata") or {}, manifest.get("spec") or {}, manifest.get("status") or {}
    namespace, name = meta.get("namespace", "default"), meta.get("name", "")
    unschedulable = any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                        and c.get("reason") == "Unschedulable" for c in status.get("conditions") or ())
    controller = next((ref.get("kind", "") for ref in meta.get("ownerReferences") or () if ref.get("controller")), "")
    tolerations = tuple(Toleration(t.get("key", "") or "", t.get("operator", "Equal") or "Equal",
                                   t.get("value", "") or "", t.get("effect", "") or "")
                        for t in spec.get("tolerations") or ())
    local_storage = any("emptyDir" in v or "hostPath" in v for v in spec.get("volumes") or ())
    return PodView(namespace=namespace, name=name, node_name=spec.get("nodeName", "") or "",
                   phase=status.get("phase", "Pending") or "Pending",
                   requests=effective_requests(spec, f"Pod {namespace}/{name}"),
                   node_selector=dict(spec.get("nodeSelector") or {}), required_node_affinity=_required_affinity(spec),
                   tolerations=tolerations, unschedulable=unschedulable,
                   created=parse_time(meta.get("creationTimestamp")), deleting=bool(meta.get("deletionTimestamp")),
                   controller_kind=controller, annotations=dict(meta.get("annotations") or {}),
                   local_storage=local_storage, priority=int(spec.get("priority") or 0))
