"""The invariants of the crash campaign, read only where a user can read them: the apiserver (Nodes, Pods,
Machines, MachineSets, the simulated fabric's state ConfigMap and the in-flight instances ConfigMap in dds-system) and
DDS's gRPC API with the client certificate cluster-autoscaler uses. Nothing is asked of the DDS process's memory.

| invariant                       | holds                                                                          |
|---------------------------------|--------------------------------------------------------------------------------|
| device-attached-at-most-once    | always: each device is listed once, on at most one node, held by at most one  |
|                                 | running operation; in-flight devices are held, free ones are not               |
| pool-counts-add-up              | always: per pool and model, free + attached + in flight = the configured total |
| node-gpu-slots                  | always: no node holds more devices than its group's max GPUs per node          |
| node-gpus-match-fabric          | settled (or for `visibility_bound` s in a row while DDS lives): a Node's GPU    |
|                                 | allocatable = its ONLINE devices in the fabric                                  |
| no-node-removed-with-work       | always (needs the `ClusterHistory` monitor): no Node disappeared while a pod    |
|                                 | that is not a DaemonSet's was bound to it                                       |
| no-orphaned-devices             | a device on a Node that is gone stays at most orphan timeout + slack (history)  |
| ca-view-consistent              | whenever DDS answers: NodeGroupTargetSize = the entries NodeGroupNodes lists,   |
|                                 | and the instances listed = the instances persisted in ConfigMap dds-instances   |
| converged                       | settled: no fabric operation in flight, no instance listed to CA (a spec-fixed |
|                                 | group's companion `<id>#live` lists its live nodes, not instances), MachineSet |
|                                 | replicas = Machines = Ready Nodes, no node left cordoned by DDS, no Machine    |
|                                 | marked for deletion, every workload pod Running                                |

`check_invariants(stack)` reads once and checks what holds at any instant (plus, with `settled=True`, what must hold
once everything has come to rest). `ClusterHistory` polls in a thread and checks what needs a history: a node's
removal against the pods it held, how long a device has sat on a missing node, how long a node's GPUs stayed wrong.
`wait_converged` retries the settled check within a bound: "CA's view converges" is that bound.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import yaml
from kubernetes import client

from dds.kube import capi
from dds.kube.capi import MACHINES, MACHINESETS, CapiObjects
from dds.kube.configmap import INSTANCES_CONFIGMAP
from dds.model.groups import ANN_CAPI_MIN, ANN_ENABLED, ANN_MAX_GPUS, ANN_TEMPLATE_MODE, DEFAULT_GPU_RESOURCE, LABEL_NODE_GROUP

log = logging.getLogger(__name__)

DEVICE_ONCE = "device-attached-at-most-once"
POOL_COUNTS = "pool-counts-add-up"
NODE_SLOTS = "node-gpu-slots"
GPUS_VISIBLE = "node-gpus-match-fabric"
NO_WORK_LOST = "no-node-removed-with-work"
NO_ORPHANS = "no-orphaned-devices"
CA_VIEW = "ca-view-consistent"
CONVERGED = "converged"

REMOVAL_TAINT = "dds.cdi.dev/removing"  # dds/controller/removals.py
STATE_KEY = "state.json"
IN_FLIGHT = ("attaching", "detaching")
CA_VIEW_POLLS = 3  # the history counts a CA-view inconsistency seen this many polls in a row


@dataclass(frozen=True)
class Violation:
    invariant: str
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.invariant}] {self.subject}: {self.detail}"


# --- what is read ---

@dataclass(frozen=True)
class DeviceRow:
    id: str
    pool: str
    model: str
    node: Optional[str]
    state: str


@dataclass(frozen=True)
class OperationRow:
    key: str
    kind: str
    node: str
    state: str
    held: tuple[str, ...]
    started_at: float

    @property
    def running(self) -> bool:
        return self.state in ("pending", "running")


@dataclass(frozen=True)
class FabricReading:
    devices: tuple[DeviceRow, ...]
    operations: tuple[OperationRow, ...]


@dataclass(frozen=True)
class NodeRow:
    name: str
    group_label: Optional[str]
    gpus_allocatable: int
    ready: bool
    removal_taint: bool


@dataclass(frozen=True)
class PodRow:
    key: str
    uid: str
    node: Optional[str]
    phase: str
    deleting: bool
    daemonset: bool

    @property
    def is_work(self) -> bool:
        return not self.daemonset and self.phase not in ("Succeeded", "Failed")


@dataclass(frozen=True)
class GroupRow:
    """A DDS MachineSet: its node group id, what it wants and what exists."""

    id: str
    spec_fixed: bool
    min_size: int
    max_gpus_per_node: int
    replicas: int
    machines: int  # not deleting, not marked
    marked: tuple[str, ...]  # Machines marked cluster.x-k8s.io/delete-machine
    ready_nodes: int


COMPANION_SUFFIX = "#live"  # dds/provider/membership.py: the node group of a spec-fixed group's live nodes


@dataclass(frozen=True)
class CaGroupView:
    id: str
    target_size: int
    listed: tuple[str, ...]  # ids NodeGroupNodes lists
    instances_failed: int

    @property
    def companion(self) -> bool:
        """`<id>#live`: the live nodes of a spec-fixed group, listed by providerID; never work in flight."""
        return self.id.endswith(COMPANION_SUFFIX)


@dataclass(frozen=True)
class Reading:
    fabric: FabricReading
    pools: Mapping[tuple[str, str], int]  # configured (pool, model) -> devices
    nodes: tuple[NodeRow, ...]
    pods: tuple[PodRow, ...]
    groups: tuple[GroupRow, ...]
    stored_instances: frozenset[str]
    ca: Optional[tuple[CaGroupView, ...]]  # None: DDS did not answer (dead or restarting)
    at: float = 0.0


# --- pure checks ---

def check_devices(fabric: FabricReading) -> list[Violation]:
    out = []
    seen: dict[str, int] = {}
    for device in fabric.devices:
        seen[device.id] = seen.get(device.id, 0) + 1
    for device_id, times in seen.items():
        if times > 1:
            out.append(Violation(DEVICE_ONCE, device_id, f"listed {times} times in the fabric state"))
    holders: dict[str, list[str]] = {}
    for op in fabric.operations:
        if op.running:
            for device_id in op.held:
                holders.setdefault(device_id, []).append(op.key)
        elif op.held:
            out.append(Violation(DEVICE_ONCE, op.key, f"finished {op.kind} still holds {', '.join(op.held)}"))
    known = {d.id for d in fabric.devices}
    for device_id, keys in holders.items():
        if len(keys) > 1:
            out.append(Violation(DEVICE_ONCE, device_id, f"held by {len(keys)} running operations: {', '.join(keys)}"))
        if device_id not in known:
            out.append(Violation(DEVICE_ONCE, device_id, f"held by {keys[0]} but not in the fabric"))
    for device in fabric.devices:
        held = device.id in holders
        if device.state in IN_FLIGHT and not held:
            out.append(Violation(DEVICE_ONCE, device.id, f"{device.state} on {device.node} but no running operation "
                                                         "holds it"))
        if held and device.state not in IN_FLIGHT:
            out.append(Violation(DEVICE_ONCE, device.id, f"{device.state} but held by {holders[device.id][0]}"))
        if device.node is None and device.state != "online":
            out.append(Violation(DEVICE_ONCE, device.id, f"free in the pool but {device.state}"))
    return out


def check_pools(fabric: FabricReading, configured: Mapping[tuple[str, str], int]) -> list[Violation]:
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for device in fabric.devices:
        bucket = counts.setdefault((device.pool, device.model), {"free": 0, "attached": 0, "in_flight": 0})
        if device.node is None:
            bucket["free"] += 1
        elif device.state in IN_FLIGHT:
            bucket["in_flight"] += 1
        else:
            bucket["attached"] += 1
    out = []
    for key in sorted(set(counts) | set(configured)):
        bucket = counts.get(key, {"free": 0, "attached": 0, "in_flight": 0})
        total = configured.get(key, 0)
        found = bucket["free"] + bucket["attached"] + bucket["in_flight"]
        if found != total:
            out.append(Violation(POOL_COUNTS, f"pool {key[0]} {key[1]}",
                                 f"free {bucket['free']} + attached {bucket['attached']} + in flight "
                                 f"{bucket['in_flight']} = {found}, configured {total}"))
    return out


def check_slots(reading: Reading) -> list[Violation]:
    limit_of = {_label_value(g.id): g.max_gpus_per_node for g in reading.groups}
    per_node: dict[str, int] = {}
    for device in reading.fabric.devices:
        if device.node is not None:
            per_node[device.node] = per_node.get(device.node, 0) + 1
    out = []
    for node in reading.nodes:
        limit = limit_of.get(node.group_label or "")
        if limit is not None and per_node.get(node.name, 0) > limit:
            out.append(Violation(NODE_SLOTS, node.name, f"holds {per_node[node.name]} devices, its group allows "
                                                        f"{limit}"))
    return out


def visibility_mismatches(reading: Reading) -> dict[str, tuple[int, int]]:
    """node -> (GPUs the Node shows, ONLINE devices the fabric has for it), for DDS nodes where they differ and no
    operation is in flight on the node."""
    online: dict[str, int] = {}
    for device in reading.fabric.devices:
        if device.node is not None and device.state == "online":
            online[device.node] = online.get(device.node, 0) + 1
    busy = {op.node for op in reading.fabric.operations if op.running}
    return {n.name: (n.gpus_allocatable, online.get(n.name, 0)) for n in reading.nodes
            if n.group_label and n.name not in busy and n.gpus_allocatable != online.get(n.name, 0)}


def check_ca_view(reading: Reading) -> list[Violation]:
    if reading.ca is None:
        return []
    out = []
    listed_instances: set[str] = set()
    for view in reading.ca:
        if view.target_size != len(view.listed):
            out.append(Violation(CA_VIEW, view.id, f"NodeGroupTargetSize {view.target_size} but NodeGroupNodes lists "
                                                   f"{len(view.listed)} ({', '.join(view.listed) or 'none'})"))
        listed_instances |= {i for i in view.listed if i.startswith("dds://")}
        if view.companion and any(i.startswith("dds://") for i in view.listed):
            out.append(Violation(CA_VIEW, view.id, f"a companion lists in-flight instances: {', '.join(view.listed)}"))
    if listed_instances != set(reading.stored_instances):
        out.append(Violation(CA_VIEW, "instances", f"listed to CA {sorted(listed_instances)} but persisted "
                                                   f"{sorted(reading.stored_instances)}"))
    return out


def check_settled(reading: Reading) -> list[Violation]:
    """What must hold once the workload and DDS have come to rest."""
    out = []
    for op in reading.fabric.operations:
        if op.running:
            out.append(Violation(CONVERGED, op.key, f"{op.kind} to {op.node} still in flight"))
    for node, (shown, fabric) in sorted(visibility_mismatches(reading).items()):
        out.append(Violation(GPUS_VISIBLE, node, f"shows {shown} GPU(s), the fabric has {fabric} online"))
    live = {n.name for n in reading.nodes}
    for device in reading.fabric.devices:
        if device.node is not None and device.node not in live:
            out.append(Violation(NO_ORPHANS, device.id, f"{device.state} on {device.node}, which is gone"))
    if reading.ca is None:
        out.append(Violation(CONVERGED, "dds", "DDS does not answer gRPC"))
    else:
        for view in reading.ca:
            if view.listed and not view.companion:
                out.append(Violation(CONVERGED, view.id, f"CA still sees {len(view.listed)} instance(s) in flight "
                                                         f"({view.instances_failed} failed): {', '.join(view.listed)}"))
    for group in reading.groups:
        if not (group.replicas == group.machines == group.ready_nodes):
            out.append(Violation(CONVERGED, group.id, f"replicas {group.replicas}, Machines {group.machines}, Ready "
                                                      f"Nodes {group.ready_nodes}"))
        if group.marked:
            out.append(Violation(CONVERGED, group.id, f"Machines marked for deletion: {', '.join(group.marked)}"))
    for node in reading.nodes:
        if node.removal_taint:
            out.append(Violation(CONVERGED, node.name, f"still carries {REMOVAL_TAINT}"))
    for pod in reading.pods:
        if pod.is_work and not pod.deleting and pod.phase != "Running":
            out.append(Violation(CONVERGED, pod.key, f"{pod.phase} on {pod.node or 'no node'}"))
    return out


def instant_violations(reading: Reading) -> list[Violation]:
    return (check_devices(reading.fabric) + check_pools(reading.fabric, reading.pools) + check_slots(reading)
            + check_ca_view(reading))


# --- reading the cluster ---

def _label_value(group_id: str) -> str:
    from dds.groups.labels import node_group_label_value

    return node_group_label_value(group_id)


def parse_fabric(document: Mapping[str, Any]) -> FabricReading:
    devices = tuple(DeviceRow(str(d["id"]), str(d["pool"]), str(d["model"]), d.get("node"), str(d["state"]))
                    for d in document.get("devices", ()))
    operations = tuple(OperationRow(str(o["key"]), str(o["kind"]), str(o["node"]), str(o["state"]),
                                    tuple(o.get("held", ())), float(o.get("started_at", 0.0)))
                       for o in document.get("operations", ()))
    return FabricReading(devices, operations)


def configured_pools(dds_config: Path) -> dict[tuple[str, str], int]:
    settings = yaml.safe_load(dds_config.read_text()) or {}
    pools = (settings.get("simulated_fabric") or {}).get("pools") or [{"name": "default", "devices": {"A30": 8}}]
    return {(p["name"], model): int(count) for p in pools for model, count in p["devices"].items()}


class ClusterReader:
    """Reads a `Reading` through the apiserver and DDS's gRPC API (CA's client certificate, from the cloud-config)."""

    def __init__(self, api: client.ApiClient, dds_config: Path, cloud_config: Path,
                 namespace: str = "dds-system", grpc_timeout: float = 5.0) -> None:
        self._core = client.CoreV1Api(api)
        self._capi = CapiObjects(api)
        self._pools = configured_pools(dds_config)
        settings = yaml.safe_load(dds_config.read_text()) or {}
        self._fabric_configmap = (settings.get("simulated_fabric") or {}).get("state_configmap",
                                                                             "dds-simulated-fabric")
        self._namespace = namespace
        self._cloud_config = cloud_config
        self._grpc_timeout = grpc_timeout

    @classmethod
    def for_stack(cls, stack: Any) -> "ClusterReader":
        from dds import certs

        return cls(stack.api, stack.config_path, stack.tls_dir / certs.CLOUD_CONFIG)

    def read(self) -> Reading:
        # Pods before Nodes: a pod bound to a node that is then deleted shows up as bound to a missing node (what the
        # history looks for); the other order would see pods bound to a node created after the node list.
        fabric = self.fabric()
        pods = self.pods()
        nodes = self.nodes()
        return Reading(fabric=fabric, pools=self._pools, nodes=nodes, pods=pods, groups=self.groups(nodes),
                       stored_instances=self.stored_instances(), ca=self.ca_view(), at=time.time())

    def _configmap_document(self, name: str) -> dict[str, Any]:
        try:
            config_map = self._core.read_namespaced_config_map(name, self._namespace)
        except client.ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        return json.loads((config_map.data or {}).get(STATE_KEY) or "{}")

    def fabric(self) -> FabricReading:
        return parse_fabric(self._configmap_document(self._fabric_configmap))

    def stored_instances(self) -> frozenset[str]:
        return frozenset(self._configmap_document(INSTANCES_CONFIGMAP))

    def nodes(self) -> tuple[NodeRow, ...]:
        rows = []
        for node in self._core.list_node().items:
            labels = node.metadata.labels or {}
            resource = DEFAULT_GPU_RESOURCE
            rows.append(NodeRow(
                name=node.metadata.name, group_label=labels.get(LABEL_NODE_GROUP),
                gpus_allocatable=int((node.status.allocatable or {}).get(resource, "0")),
                ready=any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or ()),
                removal_taint=any(t.key == REMOVAL_TAINT for t in node.spec.taints or ())))
        return tuple(rows)

    def pods(self) -> tuple[PodRow, ...]:
        return tuple(PodRow(
            key=f"{p.metadata.namespace}/{p.metadata.name}", uid=p.metadata.uid, node=p.spec.node_name,
            phase=p.status.phase or "Pending", deleting=p.metadata.deletion_timestamp is not None,
            daemonset=any(o.kind == "DaemonSet" for o in p.metadata.owner_references or ()))
            for p in self._core.list_pod_for_all_namespaces().items)

    def groups(self, nodes: Sequence[NodeRow]) -> tuple[GroupRow, ...]:
        machinesets = [m for m in self._capi.list(MACHINESETS) if capi.annotations_of(m).get(ANN_ENABLED) == "true"]
        machines = self._capi.list(MACHINES)
        ready = {n.name for n in nodes if n.ready}
        rows = []
        for machineset in machinesets:
            owned = [m for m in machines if capi.owned_by(m, machineset)]
            alive = [m for m in owned if not capi.is_deleting(m)]
            annotations = capi.annotations_of(machineset)
            rows.append(GroupRow(
                id=f"MachineSet/{capi.namespace_of(machineset)}/{capi.name_of(machineset)}",
                spec_fixed=annotations.get(ANN_TEMPLATE_MODE, "spec-fixed") == "spec-fixed",
                min_size=int(annotations.get(ANN_CAPI_MIN, "0") or 0),
                max_gpus_per_node=int(annotations.get(ANN_MAX_GPUS, "0") or 0),
                replicas=capi.spec_replicas(machineset) or 0,
                machines=sum(1 for m in alive if not capi.marked_for_deletion(m)),
                marked=tuple(sorted(capi.name_of(m) for m in alive if capi.marked_for_deletion(m))),
                ready_nodes=sum(1 for m in alive if capi.node_ref_name(m) in ready)))
        return tuple(rows)

    def ca_view(self) -> Optional[tuple[CaGroupView, ...]]:
        """NodeGroups, then per group TargetSize and Nodes, as CA asks; None when DDS does not answer."""
        import grpc

        from harness.provider_client import ExternalGrpcClient, ProviderError, load_cloud_config, open_channel

        config = load_cloud_config(self._cloud_config)
        channel = open_channel(config)
        try:
            grpc_client = ExternalGrpcClient(channel, self._grpc_timeout)
            groups = grpc_client.node_groups()
            views = []
            for group in groups:
                target = grpc_client.target_size(group.id)
                listed = grpc_client.nodes(group.id)
                views.append(CaGroupView(group.id, target, tuple(i.id for i in listed),
                                         sum(1 for i in listed if i.error is not None)))
            return tuple(views)
        except (ProviderError, grpc.RpcError):
            return None
        finally:
            channel.close()


def check_invariants(stack: Any, history: Optional["ClusterHistory"] = None, settled: bool = False,
                     reader: Optional[ClusterReader] = None) -> list[Violation]:
    """One reading of `stack`: what must hold at any instant, what `history` saw, and (settled) what must hold at rest.

    The CA view is read twice when it looks inconsistent: TargetSize and NodeGroupNodes are two RPCs, and an instance
    that completes between them is not a violation."""
    reader = reader or ClusterReader.for_stack(stack)
    violations: list[Violation] = []
    for attempt in range(3):
        reading = reader.read()
        violations = instant_violations(reading)
        if settled:
            violations += check_settled(reading)
        if not any(v.invariant in (CA_VIEW, CONVERGED) for v in violations) or attempt == 2:
            break
        time.sleep(0.5)
    if history is not None:
        violations += history.violations()
    return _unique(violations)


def wait_converged(stack: Any, timeout: float, history: Optional["ClusterHistory"] = None,
                   reader: Optional[ClusterReader] = None, interval: float = 2.0,
                   until: Optional[Callable[[], list[Violation]]] = None) -> tuple[list[Violation], float]:
    """Retry the settled check (and `until`, a caller's own condition) until it passes or `timeout` runs out:
    (the violations left, seconds it took)."""
    reader = reader or ClusterReader.for_stack(stack)
    started = time.monotonic()
    while True:
        violations = check_invariants(stack, settled=True, reader=reader)
        if until is not None and not violations:
            violations = until()
        elapsed = time.monotonic() - started
        if not violations or elapsed >= timeout:
            # What the history saw meanwhile counts too, but waiting longer cannot undo it.
            return _unique(violations + (history.violations() if history is not None else [])), elapsed
        time.sleep(interval)


def _unique(violations: Iterable[Violation]) -> list[Violation]:
    return list(dict.fromkeys(violations))


# --- the history: a monitor thread ---

@dataclass
class HistoryBounds:
    orphan_seconds: float  # DDS's orphan_attach_timeout_seconds plus the time to detach (slack)
    visibility_seconds: float = 30.0  # a Node's GPUs may lag the fabric this long while DDS lives


@dataclass
class ClusterHistory:
    """Polls the cluster every `interval` seconds in a thread and keeps the violations that need a history.

    `excuse_node(name)`: a node the test removes itself (a machine failure it injects) is not DDS's removal.
    `note_dds_start()`: DDS keeps its orphan clock and publishes GPUs only while it runs; both bounds count from
    its latest start."""

    reader: ClusterReader
    bounds: HistoryBounds
    interval: float = 1.0
    polls: int = 0
    failed_polls: int = 0
    checks: int = 0  # invariant evaluations (one per invariant per poll)
    activity: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("gpus_attached", "gpus_detached", "nodes_added", "nodes_removed"), 0))  # seen between polls
    _previous: Optional[Reading] = None
    _first_nodes: set[str] = field(default_factory=set)
    _nodes_seen: set[str] = field(default_factory=set)
    _bound_work: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> pod uid -> pod key
    _missing_since: dict[str, float] = field(default_factory=dict)
    _mismatch_since: dict[str, tuple[tuple[int, int], float]] = field(default_factory=dict)
    _excused: set[str] = field(default_factory=set)
    _suspects: set[str] = field(default_factory=set)
    _streaks: dict[Violation, int] = field(default_factory=dict)
    _dds_started: float = field(default_factory=time.time)
    _found: list[Violation] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: Optional[threading.Thread] = None
    last_error: Optional[str] = None

    def __enter__(self) -> "ClusterHistory":
        self._thread = threading.Thread(target=self._run, name="cluster-history", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def excuse_node(self, name: str) -> None:
        with self._lock:
            self._excused.add(name)

    def note_dds_start(self, at: Optional[float] = None) -> None:
        with self._lock:
            self._dds_started = at if at is not None else time.time()

    def violations(self) -> list[Violation]:
        with self._lock:
            return list(self._found)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.observe(self.reader.read(), time.time())
                self.last_error = None
            except Exception as exc:  # an apiserver hiccup: the next poll reads again
                self.failed_polls += 1
                self.last_error = str(exc)
                log.debug("cluster history: poll failed: %s", exc)
            self._stop.wait(self.interval)

    def observe(self, reading: Reading, now: float) -> None:
        """One poll (public for tests: feed readings with chosen times)."""
        found = self._steady(instant_violations(reading))
        self._count_activity(reading)
        found += self._removals(reading)
        found += self._orphans(reading, now)
        found += self._visibility(reading, now)
        with self._lock:
            self.polls += 1
            self.checks += 7
            for violation in found:
                if violation not in self._found:
                    log.error("invariant violated: %s", violation)
                    self._found.append(violation)

    def _count_activity(self, reading: Reading) -> None:
        """GPUs that came online on a node or went back to the pool, DDS nodes that appeared or went, since the last
        poll (a poll a second sees them all: cooldowns and latencies are longer)."""
        previous, self._previous = self._previous, reading
        if previous is None:
            self._first_nodes = {n.name for n in reading.nodes if n.group_label}
            self._nodes_seen = set(self._first_nodes)
            return
        before = {d.id: d for d in previous.fabric.devices}
        for device in reading.fabric.devices:
            old = before.get(device.id)
            if old is None:
                continue
            if device.node is not None and device.state == "online" and (old.node != device.node
                                                                         or old.state == "attaching"):
                self.activity["gpus_attached"] += 1
            if device.node is None and old.node is not None:
                self.activity["gpus_detached"] += 1
        current = {n.name for n in reading.nodes if n.group_label}
        self._nodes_seen |= current
        self.activity["nodes_added"] = len(self._nodes_seen - self._first_nodes)
        self.activity["nodes_removed"] = len(self._nodes_seen - current)

    def _steady(self, found: list[Violation]) -> list[Violation]:
        """CA's view is two RPCs and a ConfigMap read apart: an instance that completes in between differs once. Only
        what `CA_VIEW_POLLS` polls in a row see counts; the other instant invariants are about one document."""
        streaks = {v: self._streaks.get(v, 0) + 1 for v in found if v.invariant == CA_VIEW}
        self._streaks = streaks
        return [v for v in found if v.invariant != CA_VIEW or streaks[v] >= CA_VIEW_POLLS]

    def _removals(self, reading: Reading) -> list[Violation]:
        live = {n.name for n in reading.nodes}
        pods_now = {p.uid: p for p in reading.pods}
        out = []
        with self._lock:
            excused = set(self._excused)
        for node, bound in self._bound_work.items():
            if node in live or node in excused:
                continue
            for uid, key in bound.items():
                pod = pods_now.get(uid)
                if pod is not None and pod.node == node and not pod.deleting:
                    out.append(Violation(NO_WORK_LOST, node, f"removed while pod {key} was bound to it"))
        # A pod bound to a node that is gone, seen in two polls in a row (one could be a pod created and bound between
        # the pod and node reads).
        suspects = {pod.uid for pod in reading.pods
                    if pod.node and pod.node not in live and pod.is_work and not pod.deleting
                    and pod.node not in excused}
        for pod in reading.pods:
            if pod.uid in suspects and pod.uid in self._suspects:
                out.append(Violation(NO_WORK_LOST, pod.node or "", f"gone while pod {pod.key} is bound to it"))
        self._suspects = suspects
        self._bound_work = {}
        for pod in reading.pods:
            if pod.node and pod.is_work and not pod.deleting:
                self._bound_work.setdefault(pod.node, {})[pod.uid] = pod.key
        return out

    def _orphans(self, reading: Reading, now: float) -> list[Violation]:
        live = {n.name for n in reading.nodes}
        missing = {d.node for d in reading.fabric.devices if d.node is not None and d.node not in live}
        for node in missing:
            self._missing_since.setdefault(node, now)
        for node in set(self._missing_since) - missing:
            del self._missing_since[node]
        with self._lock:
            since_start = self._dds_started
        out = []
        for node in sorted(missing):
            waited = now - max(self._missing_since[node], since_start)
            if waited > self.bounds.orphan_seconds:
                out.append(Violation(NO_ORPHANS, node, f"gone, but the fabric still holds devices for it after "
                                                       f"{self.bounds.orphan_seconds:.0f}s of DDS running"))
        return out

    def _visibility(self, reading: Reading, now: float) -> list[Violation]:
        mismatches = visibility_mismatches(reading)
        with self._lock:
            since_start = self._dds_started
        for node in set(self._mismatch_since) - set(mismatches):
            del self._mismatch_since[node]
        out = []
        for node, pair in mismatches.items():
            previous = self._mismatch_since.get(node)
            if previous is None or previous[0] != pair:
                self._mismatch_since[node] = (pair, now)
                continue
            waited = now - max(previous[1], since_start)
            if waited > self.bounds.visibility_seconds:
                out.append(Violation(GPUS_VISIBLE, node, f"shows {pair[0]} GPU(s) while the fabric has {pair[1]} "
                                                         f"online, for over {self.bounds.visibility_seconds:.0f}s "
                                                         "of DDS running"))
        return out


def describe(violations: Sequence[Violation]) -> str:
    return "\n".join(str(v) for v in violations) or "(none)"
