"""Snapshots as files: the format `dds plan --snapshot` reads, and what `dump_snapshot` writes (JSON; YAML is read too).

Format (camelCase keys, Kubernetes quantities where Kubernetes uses them). Required: the names (a group's id, a pool's,
a node's and a pod's name), a group's minSize, maxSize, cpu, memory and maxGpusPerNode, and a device's id and model;
every other key is optional, every top-level key too:

    now: 1000                                # seconds (the planner's clock)
    gpuModelLabel: nvidia.com/gpu.product    # the label pods select a GPU model with
    groups:                                  # DDS node groups (NodeGroupSpec)
      - {id: gpu, minSize: 0, maxSize: 5, replicas: 2, cpu: "8", memory: 32Gi, ephemeralStorage: 100Gi,
         maxPods: 110, maxGpusPerNode: 4, initialGpus: 0, gpuModels: [A30], fabricPool: pool-a,
         gpuResource: nvidia.com/gpu, labels: {}, taints: [], templateMode: spec-fixed,
         gpuIdleCooldownSeconds: 600, nodeIdleCooldownSeconds: 600, forceDetach: false}
    pools:     [{name: pool-a, free: {A30: 6}, maxSlotsPerNode: null, freeCxlMemory: 256Gi}]
    upcomingNodes: {gpu: 0}                  # nodes on their way, per group
    nodes:
      - {name: worker-1, group: gpu, providerID: "", labels: {}, taints: [{key, value, effect}],
         unschedulable: false, ready: true, allocatable: {cpu: "8", memory: 32Gi, pods: 110, nvidia.com/gpu: 1},
         gpuResource: nvidia.com/gpu, devices: [{id: a30-7, model: A30, pool: pool-a, attachedAt: 0}],
         attaching: 0, detaching: [], createdAt: 0, gpusIdleSince: null, emptySince: null, beingDeleted: false,
         cxlChunks: [{id: mem-3, model: cxl-memory, pool: pool-a, attachedAt: 0}], cxlAttaching: 0,
         cxlIdleSince: null}                 # CXL memory (docs/cxl-memory.md); a group's maxCxlMemory, cxlMemoryChunk
    pods:
      - {namespace: default, name: train, uid: "", node: null, labels: {},
         containers: [{requests: {cpu: "1", nvidia.com/gpu: 1}}],
         initContainers: [{requests: {...}, restartPolicy: Always}],   # Always = a sidecar
         overhead: {}, nodeSelector: {}, priority: 0, owner: ReplicaSet, createdAt: 0,
         nodeAffinity: [{matchExpressions: [{key, operator, values}], matchFields: [...]}],   # required terms (ORed)
         tolerations: [{key, operator, value, effect}], hostPorts: [{port: 8080, protocol: TCP, hostIP: 0.0.0.0}],
         podAffinity: [{labelSelector: {matchLabels: {}, matchExpressions: []}, topologyKey: kubernetes.io/hostname,
                        namespaces: []}],
         podAntiAffinity: [...], unsupported: [], notMovable: null,
         podGroup: null, podGroupMinMember: 0}                   # optional: the pod's gang and its minimum

A group's `cpu`/`memory`/`ephemeralStorage` are quantities (the model's milliCpu/memory/ephemeralStorage integers
are accepted too). Unknown keys are errors, so a typo never silently changes a plan. Errors name the field:
`pods[2].containers[0].requests.cpu: not a quantity: 'lots'`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Mapping, Optional, TypeVar

import yaml
from pydantic import ValidationError

from dds.model.groups import NodeGroupSpec, SourceRef, Taint
from dds.model.quantity import QuantityError, to_int, to_milli
from dds.model.resources import Resources
from dds.planner.selectors import LABEL_OPERATORS, NODE_OPERATORS
from dds.model.snapshot import (ContainerRequests, Device, HostPort, LabelSelector, NodeInfo, NodeSelectorTerm,
                                PodAffinityTerm, PodInfo, PoolInfo, SelectorRequirement, Snapshot, Toleration)

T = TypeVar("T")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
PROTOCOLS = ("TCP", "UDP", "SCTP")


class SnapshotFormatError(ValueError):
    """A snapshot file that does not follow the format; the message names the field."""


class _Obj:
    """A mapping being read, with its path for error messages and a check that every key was understood."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, Mapping):
            raise SnapshotFormatError(f"{path or 'snapshot'}: expected a mapping, got {type(data).__name__}")
        self.data, self.path, self.seen = data, path, set()

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, default: Any = None) -> Any:
        self.seen.add(key)
        value = self.data.get(key, default)
        return default if value is None else value

    def need(self, key: str) -> Any:
        self.seen.add(key)
        if self.data.get(key) in (None, ""):
            raise SnapshotFormatError(f"{self.at(key)}: required")
        return self.data[key]

    def typed(self, key: str, kind: type, default: Any = None) -> Any:
        value = self.get(key, default)
        if value is not None and not isinstance(value, kind):
            raise SnapshotFormatError(f"{self.at(key)}: expected {kind.__name__}, got {value!r}")
        return value

    def text(self, key: str, default: str = "") -> str:
        value = self.get(key, default)
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise SnapshotFormatError(f"{self.at(key)}: expected a string, got {value!r}")
        return str(value)

    def number(self, key: str, default: Optional[float] = 0.0) -> Optional[float]:
        value = self.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SnapshotFormatError(f"{self.at(key)}: expected a number, got {value!r}")
        return float(value)

    def integer(self, key: str, default: int = 0) -> int:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise SnapshotFormatError(f"{self.at(key)}: expected an integer, got {value!r}")
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise SnapshotFormatError(f"{self.at(key)}: expected true or false, got {value!r}")
        return value

    def strings(self, key: str) -> dict[str, str]:
        value = self.get(key, {})
        if not isinstance(value, Mapping):
            raise SnapshotFormatError(f"{self.at(key)}: expected a mapping of strings")
        return {str(k): str(v) for k, v in value.items()}

    def items(self, key: str, read: Callable[[Any, str], T]) -> tuple[T, ...]:
        value = self.get(key, [])
        if not isinstance(value, list):
            raise SnapshotFormatError(f"{self.at(key)}: expected a list")
        return tuple(read(item, f"{self.at(key)}[{i}]") for i, item in enumerate(value))

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.seen)
        if unknown:
            raise SnapshotFormatError(f"{self.path or 'snapshot'}: unknown key(s) {', '.join(map(repr, unknown))}")


def _choice(value: str, allowed: tuple[str, ...] | frozenset[str], path: str) -> str:
    if value not in allowed:
        raise SnapshotFormatError(f"{path}: {value!r} is not one of {', '.join(sorted(allowed))}")
    return value


def _resources(data: Any, path: str) -> Resources:
    if data is None:
        return Resources()
    if not isinstance(data, Mapping):
        raise SnapshotFormatError(f"{path}: expected a resource list such as {{cpu: '500m', memory: 1Gi}}")
    try:
        return Resources.parse({str(k): v for k, v in data.items()})
    except (QuantityError, TypeError) as exc:
        bad = next((k for k, v in data.items() if not _is_quantity(v)), "?")
        raise SnapshotFormatError(f"{path}.{bad}: {exc}") from exc


def _is_quantity(value: Any) -> bool:
    try:
        to_int(value)
        return True
    except (QuantityError, TypeError, ValueError):
        return False


def _requirement(data: Any, path: str, operators: frozenset[str]) -> SelectorRequirement:
    o = _Obj(data, path)
    values = o.typed("values", list, [])
    requirement = SelectorRequirement(key=o.text("key") or _missing(o, "key"),
                                      operator=_choice(o.text("operator"), operators, o.at("operator")),
                                      values=tuple(str(v) for v in values))
    o.done()
    return requirement


def _missing(o: _Obj, key: str) -> str:
    raise SnapshotFormatError(f"{o.at(key)}: required")


def _term(data: Any, path: str) -> NodeSelectorTerm:
    o = _Obj(data, path)
    term = NodeSelectorTerm(
        match_expressions=o.items("matchExpressions", lambda d, p: _requirement(d, p, NODE_OPERATORS)),
        match_fields=o.items("matchFields", lambda d, p: _requirement(d, p, frozenset({"In", "NotIn"}))))
    o.done()
    return term


def _label_selector(data: Any, path: str) -> LabelSelector:
    o = _Obj(data or {}, path)
    selector = LabelSelector(match_labels=o.strings("matchLabels"),
                             match_expressions=o.items("matchExpressions",
                                                       lambda d, p: _requirement(d, p, LABEL_OPERATORS)))
    o.done()
    return selector


def _affinity_term(data: Any, path: str) -> PodAffinityTerm:
    o = _Obj(data, path)
    term = PodAffinityTerm(label_selector=_label_selector(o.get("labelSelector", {}), o.at("labelSelector")),
                           topology_key=str(o.need("topologyKey")),
                           namespaces=tuple(str(n) for n in o.typed("namespaces", list, [])))
    o.done()
    return term


def _toleration(data: Any, path: str) -> Toleration:
    o = _Obj(data, path)
    effect = o.text("effect")
    if effect:
        _choice(effect, TAINT_EFFECTS, o.at("effect"))
    toleration = Toleration(key=o.text("key"), operator=_choice(o.text("operator", "Equal"), ("Equal", "Exists"),
                                                                o.at("operator")),
                            value=o.text("value"), effect=effect)
    o.done()
    return toleration


def _taint(data: Any, path: str) -> Taint:
    o = _Obj(data, path)
    taint = Taint(key=str(o.need("key")), value=o.text("value"),
                  effect=_choice(o.text("effect"), TAINT_EFFECTS, o.at("effect")))
    o.done()
    return taint


def _port(data: Any, path: str) -> HostPort:
    o = _Obj(data, path)
    port = o.integer("port")
    if not 0 < port < 65536:
        raise SnapshotFormatError(f"{o.at('port')}: expected 1..65535, got {port}")
    host_port = HostPort(port=port, protocol=_choice(o.text("protocol", "TCP"), PROTOCOLS, o.at("protocol")),
                         host_ip=o.text("hostIP", "0.0.0.0"))
    o.done()
    return host_port


def _container(data: Any, path: str, init: bool) -> ContainerRequests:
    o = _Obj(data, path)
    requests = _resources(o.get("requests"), o.at("requests"))
    policy = o.text("restartPolicy") if init else ""
    if policy:
        _choice(policy, ("Always",), o.at("restartPolicy"))
    o.done()
    return ContainerRequests(requests, restartable_init=policy == "Always")


def _pod(data: Any, path: str) -> PodInfo:
    o = _Obj(data, path)
    pod = PodInfo(
        namespace=o.text("namespace", "default"), name=str(o.need("name")), uid=o.text("uid"),
        labels=o.strings("labels"),
        containers=o.items("containers", lambda d, p: _container(d, p, False)),
        init_containers=o.items("initContainers", lambda d, p: _container(d, p, True)),
        overhead=_resources(o.get("overhead"), o.at("overhead")),
        node_name=o.text("node") or None, node_selector=o.strings("nodeSelector"),
        required_node_affinity=o.items("nodeAffinity", _term), tolerations=o.items("tolerations", _toleration),
        host_ports=o.items("hostPorts", _port), required_pod_affinity=o.items("podAffinity", _affinity_term),
        required_pod_anti_affinity=o.items("podAntiAffinity", _affinity_term), priority=o.integer("priority"),
        owner_kind=o.text("owner") or None, created_at=o.number("createdAt") or 0.0,
        unsupported=tuple(str(u) for u in o.typed("unsupported", list, [])),
        not_movable_reason=o.text("notMovable") or None, pod_group=o.text("podGroup") or None,
        pod_group_min_member=o.integer("podGroupMinMember"))
    o.done()
    return pod


def _device(data: Any, path: str) -> Device:
    o = _Obj(data, path)
    device = Device(id=str(o.need("id")), model=str(o.need("model")), pool=str(o.need("pool")),
                    attached_at=o.number("attachedAt") or 0.0)
    o.done()
    return device


def _node(data: Any, path: str) -> NodeInfo:
    o = _Obj(data, path)
    node = NodeInfo(
        name=str(o.need("name")), provider_id=o.text("providerID"), group_id=o.text("group") or None,
        labels=o.strings("labels"), taints=o.items("taints", _taint), unschedulable=o.flag("unschedulable"),
        ready=o.flag("ready", True), allocatable=_resources(o.get("allocatable"), o.at("allocatable")),
        gpu_resource=o.text("gpuResource", "nvidia.com/gpu"), devices=o.items("devices", _device),
        attaching=o.integer("attaching"), detaching=tuple(str(d) for d in o.typed("detaching", list, [])),
        created_at=o.number("createdAt") or 0.0, gpus_idle_since=o.number("gpusIdleSince", None),
        empty_since=o.number("emptySince", None), being_deleted=o.flag("beingDeleted"),
        cxl_chunks=o.items("cxlChunks", _device), cxl_attaching=o.integer("cxlAttaching"),
        cxl_idle_since=o.number("cxlIdleSince", None))
    o.done()
    return node


def _pool(data: Any, path: str) -> PoolInfo:
    o = _Obj(data, path)
    free = o.get("free", {})
    if not isinstance(free, Mapping) or any(isinstance(v, bool) or not isinstance(v, int) or v < 0
                                            for v in free.values()):
        raise SnapshotFormatError(f"{o.at('free')}: expected model -> free device count (integers >= 0)")
    slots = o.get("maxSlotsPerNode")
    if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int) or slots < 0):
        raise SnapshotFormatError(f"{o.at('maxSlotsPerNode')}: expected an integer >= 0, got {slots!r}")
    cxl = o.get("freeCxlMemory", 0)
    try:
        free_cxl = to_int(cxl)
    except (QuantityError, TypeError):
        raise SnapshotFormatError(f"{o.at('freeCxlMemory')}: expected a memory quantity such as 256Gi, "
                                  f"got {cxl!r}") from None
    pool = PoolInfo(name=str(o.need("name")), free={str(k): v for k, v in free.items()}, max_slots_per_node=slots,
                    free_cxl_memory=free_cxl)
    o.done()
    return pool


_GROUP_QUANTITIES = {"cpu": ("milli_cpu", to_milli), "memory": ("memory", to_int),
                     "ephemeralStorage": ("ephemeral_storage", to_int),
                     "maxCxlMemory": ("max_cxl_memory", to_int), "cxlMemoryChunk": ("cxl_memory_chunk", to_int)}


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def _file_key(name: str) -> str:
    """A model field as the file names it (an error must name the key the user wrote): max_size -> maxSize."""
    return "cpu" if name == "milli_cpu" else _camel(name)  # the file's `cpu` (a quantity; `milliCpu` is accepted too)


def _group(data: Any, path: str, source: str) -> NodeGroupSpec:
    if not isinstance(data, Mapping):
        raise SnapshotFormatError(f"{path}: expected a mapping")
    fields: dict[str, Any] = {}
    for key, value in data.items():
        if key in _GROUP_QUANTITIES and not isinstance(value, int):
            name, parse = _GROUP_QUANTITIES[key]
            try:
                fields[name] = parse(value)
            except (QuantityError, TypeError) as exc:
                raise SnapshotFormatError(f"{path}.{key}: {exc}") from exc
        elif key == "cpu":
            fields["milli_cpu"] = value * 1000
        else:
            fields["milli_cpu" if key == "milliCpu" else _snake(key)] = value
    fields.setdefault("source", SourceRef(kind="File", name=source))
    try:
        return NodeGroupSpec.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(_file_key(p) if isinstance(p, str) else str(p) for p in first["loc"]) or "group"
        raise SnapshotFormatError(f"{path}.{where}: {first['msg']}") from exc


def snapshot_from_dict(data: Any, source: str = "snapshot") -> Snapshot:
    o = _Obj(data, "")
    upcoming = o.get("upcomingNodes", {})
    if not isinstance(upcoming, Mapping) or any(isinstance(v, bool) or not isinstance(v, int) or v < 0
                                                for v in upcoming.values()):
        raise SnapshotFormatError("upcomingNodes: expected group -> node count (integers >= 0)")
    snapshot = Snapshot(
        now=o.number("now") or 0.0,
        groups=o.items("groups", lambda d, p: _group(d, p, source)), pools=o.items("pools", _pool),
        nodes=o.items("nodes", _node), pods=o.items("pods", _pod), upcoming_nodes=dict(upcoming),
        gpu_model_label=o.text("gpuModelLabel", "nvidia.com/gpu.product"))
    o.done()
    _check_references(snapshot)
    return snapshot


def _check_references(snapshot: Snapshot) -> None:
    groups = {g.id for g in snapshot.groups}
    names: set[str] = set()
    for i, node in enumerate(snapshot.nodes):
        if node.name in names:
            raise SnapshotFormatError(f"nodes[{i}].name: {node.name!r} appears twice")
        names.add(node.name)
        if node.group_id and node.group_id not in groups:
            raise SnapshotFormatError(f"nodes[{i}].group: {node.group_id!r} is not one of the groups")
    keys: set[str] = set()
    for i, pod in enumerate(snapshot.pods):
        if pod.key in keys:
            raise SnapshotFormatError(f"pods[{i}]: {pod.key} appears twice")
        keys.add(pod.key)
        if pod.node_name and pod.node_name not in names:
            raise SnapshotFormatError(f"pods[{i}].node: {pod.node_name!r} is not one of the nodes")
    for group in snapshot.upcoming_nodes:
        if group not in groups:
            raise SnapshotFormatError(f"upcomingNodes: {group!r} is not one of the groups")


def load_snapshot(text: str, source: str = "snapshot") -> Snapshot:
    """A snapshot from JSON or YAML text; `source` names the file in errors and in the groups' SourceRef."""
    try:
        data = json.loads(text) if source.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SnapshotFormatError(f"{source}: not valid {'JSON' if source.endswith('.json') else 'YAML'}: {exc}"
                                  ) from exc
    try:
        return snapshot_from_dict(data, source)
    except SnapshotFormatError as exc:
        raise SnapshotFormatError(f"{source}: {exc}") from exc


# --- writing ----------------------------------------------------------------------------------------------------

def _resources_out(r: Resources) -> dict[str, Any]:
    return {k: v for k, v in r.to_kubernetes().items() if v not in ("0",)}


def _requirement_out(r: SelectorRequirement) -> dict[str, Any]:
    return {"key": r.key, "operator": r.operator, "values": list(r.values)}


def _affinity_out(t: PodAffinityTerm) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": dict(t.label_selector.match_labels),
                              "matchExpressions": [_requirement_out(r) for r in t.label_selector.match_expressions]},
            "topologyKey": t.topology_key, "namespaces": list(t.namespaces)}


def _pod_out(p: PodInfo) -> dict[str, Any]:
    return {
        "namespace": p.namespace, "name": p.name, "uid": p.uid, "node": p.node_name, "labels": dict(p.labels),
        "containers": [{"requests": _resources_out(c.requests)} for c in p.containers],
        "initContainers": [{"requests": _resources_out(c.requests), **({"restartPolicy": "Always"}
                                                                        if c.restartable_init else {})}
                           for c in p.init_containers],
        "overhead": _resources_out(p.overhead), "nodeSelector": dict(p.node_selector),
        "nodeAffinity": [{"matchExpressions": [_requirement_out(r) for r in t.match_expressions],
                          "matchFields": [_requirement_out(r) for r in t.match_fields]}
                         for t in p.required_node_affinity],
        "tolerations": [{"key": t.key, "operator": t.operator, "value": t.value, "effect": t.effect}
                        for t in p.tolerations],
        "hostPorts": [{"port": h.port, "protocol": h.protocol, "hostIP": h.host_ip} for h in p.host_ports],
        "podAffinity": [_affinity_out(t) for t in p.required_pod_affinity],
        "podAntiAffinity": [_affinity_out(t) for t in p.required_pod_anti_affinity],
        "priority": p.priority, "owner": p.owner_kind, "createdAt": p.created_at, "unsupported": list(p.unsupported),
        "notMovable": p.not_movable_reason, **_gang_out(p)}


def _gang_out(p: PodInfo) -> dict[str, Any]:
    """Only pods in a gang carry the gang keys, so snapshots written before gangs existed read back unchanged."""
    if p.pod_group is None and not p.pod_group_min_member:
        return {}
    return {"podGroup": p.pod_group, "podGroupMinMember": p.pod_group_min_member}


def _node_out(n: NodeInfo) -> dict[str, Any]:
    return {
        "name": n.name, "providerID": n.provider_id, "group": n.group_id, "labels": dict(n.labels),
        "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in n.taints],
        "unschedulable": n.unschedulable, "ready": n.ready, "allocatable": _resources_out(n.allocatable),
        "gpuResource": n.gpu_resource,
        "devices": [{"id": d.id, "model": d.model, "pool": d.pool, "attachedAt": d.attached_at} for d in n.devices],
        "attaching": n.attaching, "detaching": list(n.detaching), "createdAt": n.created_at,
        "gpusIdleSince": n.gpus_idle_since, "emptySince": n.empty_since, "beingDeleted": n.being_deleted,
        **_cxl_out(n)}


def _cxl_out(n: NodeInfo) -> dict[str, Any]:
    """Only nodes with CXL memory carry its keys, so snapshots written before it read back unchanged."""
    if not n.cxl_chunks and not n.cxl_attaching and n.cxl_idle_since is None:
        return {}
    return {"cxlChunks": [{"id": d.id, "model": d.model, "pool": d.pool, "attachedAt": d.attached_at}
                          for d in n.cxl_chunks],
            "cxlAttaching": n.cxl_attaching, "cxlIdleSince": n.cxl_idle_since}


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _group_out(g: NodeGroupSpec) -> dict[str, Any]:
    data = g.model_dump(mode="json", exclude={"source", "milli_cpu"})
    out = {_camel(k): v for k, v in data.items()}
    out["milliCpu"] = g.milli_cpu
    return out


def snapshot_to_dict(snapshot: Snapshot) -> dict[str, Any]:
    return {"now": snapshot.now, "gpuModelLabel": snapshot.gpu_model_label,
            "groups": [_group_out(g) for g in snapshot.groups],
            "pools": [{"name": p.name, "free": dict(p.free), "maxSlotsPerNode": p.max_slots_per_node,
                       **({"freeCxlMemory": p.free_cxl_memory} if p.free_cxl_memory else {})}
                      for p in snapshot.pools],
            "upcomingNodes": dict(snapshot.upcoming_nodes),
            "nodes": [_node_out(n) for n in snapshot.nodes], "pods": [_pod_out(p) for p in snapshot.pods]}


def dump_snapshot(snapshot: Snapshot) -> str:
    """JSON text that `load_snapshot` reads back into an equal snapshot."""
    return json.dumps(snapshot_to_dict(snapshot), indent=2, sort_keys=False) + "\n"
