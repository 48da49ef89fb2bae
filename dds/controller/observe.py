"""Observe: read the cluster (nodes, pods, Machines, MachineSets) and the fabric, and freeze it into the planner's Snapshot.

Two readers of the cluster, one answer:

| reader                   | when                                                   | cost per observe()                    |
|--------------------------|--------------------------------------------------------|---------------------------------------|
| the watch cache          | `cache` given and synced (dds/kube/cache.py)           | no request: dicts of decoded records  |
| the `ClusterReader` port | no cache, or the cache is relisting after a lost watch | a LIST of each kind, decoded per call |

Falling back to LISTs while the cache relists keeps a decision from ever being taken on a store known to have missed
events; the price is a slow call during that window, never a wrong one.
"""

from __future__ import annotations

import logging
import time
from itertools import chain
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Optional, Protocol, Sequence

from dds.controller.idle import IdleTracker, NodeUsage
from dds.controller.devices import devices_by_node
from dds.fabric.base import Fabric, OperationKind
from dds.kube import capi
from dds.kube.cache import ClusterCache
from dds.kube.decode import NodeRecord, PodRecord
from dds.model.dra_records import DraState
from dds.model.groups import NodeGroupSpec
from dds.planner.cxl_memory import unneeded_chunks
from dds.planner.dra import CelLimits, lower_observed, mark_claimed
from dds.model.resources import Resources
# The planner owns kube-scheduler's request rule and remembers it per pod object: with the watch cache the same
# PodInfo comes back every observe until the pod changes, so only changed pods are computed again.
from dds.planner.requests import LastingRequests, is_work
from dds.model.cxl import cxl_memory_of, is_cxl_model
from dds.model.snapshot import Device, NodeInfo, PodInfo, PoolInfo, Snapshot

log = logging.getLogger(__name__)


class ClusterReader(Protocol):
    """The reads the observer makes of the cluster itself when the watch cache cannot answer: each a LIST, decoded.
    Failures raise `dds.kube.errors.ApiError` (dds.kube.controller_ports.KubeClusterReader: the apiserver)."""

    def machines(self) -> Sequence[Mapping[str, Any]]:
        """Cluster API Machines, as objects; none when Cluster API is not installed."""
        ...

    def machinesets(self) -> Sequence[Mapping[str, Any]]:
        """Cluster API MachineSets and MachineDeployments (each with its `kind`), as objects; none when Cluster API is
        not installed."""
        ...

    def pod_records(self) -> Sequence[PodRecord]:
        """Every pod, finished ones included."""
        ...

    def node_records(self) -> Sequence[NodeRecord]: ...

    def dra(self) -> DraState:
        """The DRA objects (ResourceClaims, templates, slices, DeviceClasses); the watch cache's when it holds them."""
        ...

@dataclass(frozen=True)
class MachineRef:
    namespace: str
    name: str
    group_id: str
    provider_id: str
    node_name: Optional[str]
    deleting: bool  # being deleted, or marked for the next scale-down (cluster.x-k8s.io/delete-machine)
    terminating: bool = False  # deletionTimestamp set: no longer one of its MachineSet's replicas
    uid: str = ""
    api_version: str = ""
    refused: str = ""  # why its status.nodeRef is not counted (capi.node_claims): node_name is then None
    hooked: bool = False  # carries DDS's pre-terminate hook (dds/controller/machine_hooks.py)
    awaiting_pre_terminate: bool = False  # Cluster API drained its node and waits for the pre-terminate hooks


@dataclass(frozen=True)
class Observation:
    snapshot: Snapshot
    unschedulable_since: Mapping[str, float] = field(default_factory=dict)  # pending pod key -> since
    machines: tuple[MachineRef, ...] = ()
    replicas: Mapping[str, int] = field(default_factory=dict)  # MachineSet spec.replicas per group, read after machines

    def node(self, name: str) -> Optional[NodeInfo]:
        return next((n for n in self.snapshot.nodes if n.name == name), None)

    def replicas_without_machine(self, group_id: str) -> int:
        return replicas_without_machine(self.machines, self.replicas, group_id)


def replicas_without_machine(machines: Sequence[MachineRef], replicas: Mapping[str, int], group_id: str) -> int:
    """Replicas a MachineSet asks for whose Machine Cluster API has not made yet (its controller, or the apiserver, has
    not caught up): nodes on their way as much as a Machine without its Node. Counting only Machines ends a node
    instance before its node exists, and CA, seeing its scale-up gone while the pods still wait, asks again."""
    made = sum(1 for m in machines if m.group_id == group_id and not m.terminating)
    return max(0, replicas.get(group_id, made) - made)


@dataclass(frozen=True)
class NodePods:
    """A node's pods (not terminal) and what idle tracking reads of them, derived from the node's pod records."""

    records: Sequence[PodRecord]  # what it was derived from, compared by identity
    pods: tuple[PodInfo, ...]
    extended: tuple[Resources, ...]  # requests of the pods naming extended resources (GPUs among them; most name none)
    working: bool  # a pod that counts as work runs there
    claims: bool  # a pod has resource claims (Dynamic Resource Allocation)
    # Ended pods (Succeeded or Failed) that consumed a ProvisioningRequest: bound, for the request's booking.
    ended_consumers: tuple[PodInfo, ...] = ()
    _used: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def used(self, resource: str) -> int:
        """How much of `resource` the node's pods request (its GPUs in use), summed once per resource."""
        found = self._used.get(resource)
        if found is None:
            found = self._used[resource] = sum(r.get(resource) for r in self.extended)
        return found

    @classmethod
    def of(cls, records: Sequence[PodRecord], lasting_requests: LastingRequests,
           pods: Optional[Sequence[PodInfo]] = None) -> "NodePods":
        infos = tuple(r.info for r in records if not r.terminal) if pods is None else tuple(pods)
        lasting = lasting_requests.get
        requests = [lasting(pod) for pod in infos]
        ended = tuple(r.info for r in records if r.terminal and r.info.consumes_provisioning_request)
        return cls(records, infos, tuple(r for r in requests if r.scalar), any(is_work(pod) for pod in infos),
                   any(pod.resource_claims for pod in infos), ended)


_NO_PODS = NodePods((), (), (), False, False)


def _attach_order(device: Any) -> tuple:
    return device.attached_at, device.id


def _grouped_by_node(pods: Sequence[PodInfo], lasting_requests: LastingRequests) -> dict[str, NodePods]:
    by_node: dict[str, list[PodInfo]] = {}
    for pod in pods:
        if pod.node_name:
            by_node.setdefault(pod.node_name, []).append(pod)
    return {name: NodePods.of((), lasting_requests, on) for name, on in by_node.items()}


class ClusterObserver:
    def __init__(self, reader: ClusterReader, fabric: Fabric, groups: Callable[[], Sequence[NodeGroupSpec]],
                 clock: Callable[[], float], idle: IdleTracker, gpu_model_label: str,
                 cache: Optional[ClusterCache] = None, cel_limits: CelLimits = CelLimits()) -> None:
        self._reader = reader
        self._cel_limits = cel_limits
        self.cache = cache
        self._fabric = fabric
        self._groups = groups
        self._clock = clock
        self.idle = idle
        self._gpu_model_label = gpu_model_label
        # Each node's pods and what is derived from them, by node, from the last observe (see _pods_on_nodes).
        self._node_pods: dict[str, NodePods] = {}
        # The observed pods' effective requests, kept across observes (the planner keeps its own in PlannerMemos).
        self._requests = LastingRequests()
        # Each node's NodeInfo from the last observe, with what it was built from (see _node_infos).
        self._last_nodes: dict[str, tuple[tuple, NodeInfo]] = {}
        # The Machines as references, kept until the cache's Machines change (thousands of them, rarely changing).
        self._machine_refs: Optional[tuple[Any, tuple[MachineRef, ...]]] = None
        self._machine_maps_memo: Optional[tuple[tuple[MachineRef, ...], Any]] = None

    # --- Machines: the Cluster API link from a Node to its MachineSet (= node group) ---
    def machines(self) -> tuple[MachineRef, ...]:
        cached = self.cache.machines if self.cache is not None else None
        if cached is not None and cached.synced:
            generation = cached.generation  # read first: a change after it only makes the next call build again
            memo = self._machine_refs
            if memo is None or memo[0] != generation:
                memo = self._machine_refs = (generation, machine_refs(cached.values()))
            return memo[1]
        return machine_refs(self._reader.machines())

    def _machine_maps(self, machines: tuple[MachineRef, ...]) -> tuple[dict[str, str], set[str]]:
        """Group by node name (status.nodeRef, never the user-written providerID), nodes being deleted: kept while
        `machines` is the same tuple."""
        memo = self._machine_maps_memo
        if memo is None or memo[0] is not machines:
            memo = self._machine_maps_memo = (machines, (
                {m.node_name: m.group_id for m in machines if m.node_name},
                {m.node_name for m in machines if m.deleting and m.node_name}))
        return memo[1]

    def machineset_replicas(self) -> dict[str, int]:
        """spec.replicas per MachineSet and MachineDeployment group id, read now (the group catalog may be a loop
        old)."""
        cached = self.cache.machinesets if self.cache is not None else None
        deployments = self.cache.machinedeployments if self.cache is not None else None
        if cached is not None and cached.synced and (deployments is None or deployments.synced):
            return replicas_by_group((*cached.values(), *(deployments.values() if deployments is not None else ())))
        return replicas_by_group(self._reader.machinesets())

    # --- pods and nodes: from the cache when it is synced, else one LIST each ---
    def pod_buckets(self) -> Mapping[str, Sequence[PodRecord]]:
        """Pod records by node name ("": not bound). From the cache, a node's tuple stays the same object while its pods
        do not change, which `_pods_on_nodes` relies on to derive only what changed."""
        if self.cache is not None and self.cache.pods.synced:
            return self.cache.pods.buckets()
        by_node: dict[str, list[PodRecord]] = {}
        for record in self._reader.pod_records():
            by_node.setdefault(record.info.node_name or "", []).append(record)
        return by_node

    def _pods_on_nodes(self, buckets: Mapping[str, Sequence[PodRecord]]) -> dict[str, "NodePods"]:
        """What the snapshot and idle tracking need of each node's pods, derived again only for the nodes whose pods
        changed since the last observe: a pass over every pod (tens of thousands) is the cost this saves."""
        last, memo = self._node_pods, {}
        for name, records in buckets.items():
            if not name:
                continue
            entry = last.get(name)
            if entry is None or entry.records is not records:
                entry = NodePods.of(records, self._requests)
            memo[name] = entry
        self._node_pods = memo
        return memo

    def node_records(self) -> Sequence[NodeRecord]:
        if self.cache is not None and self.cache.nodes.synced:
            return self.cache.nodes.values()
        return self._reader.node_records()

    def _node_infos(self, seen: Sequence[tuple[NodeRecord, Optional[str], str, tuple]], attaching: Mapping[str, int],
                    detaching: Mapping[str, Sequence[str]], deleting: set[str]) -> list[NodeInfo]:
        """The snapshot's nodes. A node whose record, group, devices and idle times did not change since the last
        observe is given the same NodeInfo object again: the planner remembers what it derives from a node by that
        identity, so thousands of unchanged nodes cost it a lookup each instead of a derivation."""
        idle_since_of, empty_since_of = self.idle.lookups()
        last, memo = self._last_nodes, {}
        nodes = []
        for raw, group_id, gpu_resource, devices in seen:
            name = raw.name
            dds_node = group_id is not None
            key = (raw, group_id, gpu_resource, devices, attaching.get(name, 0), tuple(detaching.get(name, ())),
                   raw.marked_for_deletion or name in deleting,
                   idle_since_of(name) if dds_node else None, empty_since_of(name) if dds_node else None)
            found = last.get(name)
            if found is None or found[0] != key:
                _, _, _, _, attaching_now, detaching_now, being_deleted, idle_since, empty_since = key
                found = (key, NodeInfo(
                    name=name, provider_id=raw.provider_id, group_id=group_id, labels=raw.labels,
                    taints=raw.taints, unschedulable=raw.unschedulable, ready=raw.ready, allocatable=raw.allocatable,
                    gpu_resource=gpu_resource, devices=devices, attaching=attaching_now, detaching=detaching_now,
                    created_at=raw.created_at, being_deleted=being_deleted, gpus_idle_since=idle_since,
                    empty_since=empty_since))
            memo[name] = found
            nodes.append(found[1])
        self._last_nodes = memo
        return nodes

    # --- the snapshot ---
    def observe(self) -> Observation:
        now = self._clock()
        groups = tuple(self._groups())
        group_ids = {g.id for g in groups}
        machines = self.machines()
        group_of_node, deleting_nodes = self._machine_maps(machines)

        buckets = self.pod_buckets()
        on_nodes = self._pods_on_nodes(buckets)
        waiting = [r for r in buckets.get("", ()) if not r.terminal]
        pending = tuple(r.info for r in waiting)
        pods = (*chain.from_iterable(entry.pods for entry in on_nodes.values()), *pending)
        ended_consumers = tuple(chain.from_iterable(entry.ended_consumers for entry in on_nodes.values()))
        # ResourceClaims become the GPU requests they amount to before anything counts GPU use (docs/dra.md).
        dra = self._reader.dra()
        claims = any(entry.claims for entry in on_nodes.values()) or any(r.info.resource_claims for r in waiting)
        # A pending pod asking for an extended resource a DeviceClass serves is a claim too (KEP-5004, docs/dra.md).
        claims = claims or bool(dra.classes and waiting)
        # Operations before devices: an attach that ends between the two reads is then seen on its way and online
        # (counted twice for one pass: a later pod may wait a pass for the GPU), never neither — read the other way
        # round, its GPU was in no count and the pod it was for got a second one.
        operations = self._fabric.operations()
        fabric_devices = self._fabric.devices()
        # A vendor DRA driver names a GPU by its UUID; the fabric may call it otherwise (a ComposableResource's name).
        fabric_models = {d.serial: d.model for d in fabric_devices if d.serial}
        fabric_ids = {d.serial: d.id for d in fabric_devices if d.serial}
        lowered = lower_observed(pods, dra, {m for p in self._fabric.pools() for m in p.total},
                                 self._gpu_model_label, groups=groups, fabric_models=fabric_models,
                                 limits=self._cel_limits, clock=time.monotonic) if claims else pods
        if lowered is not pods and any(a is not b for a, b in zip(lowered, pods)):
            # Claims became requests: what was derived per node is derived again from the pods as lowered.
            pods = lowered
            on_nodes = _grouped_by_node(pods, self._requests)
            pending = tuple(p for p in pods if p.node_name is None)
        unschedulable = {r.info.key: r.unschedulable_since for r in waiting if r.unschedulable_since is not None}

        grouped = devices_by_node(fabric_devices)
        online_by_node, detaching_by_node = grouped.online, grouped.detaching
        attaching_by_node: dict[str, int] = {}
        cxl_attaching_by_node: dict[str, int] = {}
        online_ids: Optional[set[str]] = None  # built at the first attach in flight: most passes have none
        for op in operations:
            if op.kind == OperationKind.ATTACH and not op.state.done:
                if online_ids is None:
                    online_ids = {dev.id for devs in (*online_by_node.values(), *grouped.cxl_online.values())
                                  for dev in devs}
                online = sum(1 for device_id in op.devices if device_id in online_ids)
                into = cxl_attaching_by_node if is_cxl_model(op.model) else attaching_by_node
                into[op.node] = into.get(op.node, 0) + max(0, op.requested - online)

        seen = []
        usages = []
        cxl: dict[str, tuple[tuple[Device, ...], int]] = {}  # CXL memory per node: chunks online, chunks on their way
        groups_by_id = {g.id: g for g in groups}
        for raw in self.node_records():
            name = raw.name
            group_id = group_of_node.get(name)
            if group_id not in group_ids:
                group_id = None
            group = groups_by_id.get(group_id) if group_id is not None else None
            gpu_resource = group.gpu_resource if group else "nvidia.com/gpu"
            online = online_by_node.get(name, ())
            devices = tuple(sorted(online, key=_attach_order)) if len(online) > 1 else tuple(online)
            spare = 0
            if group is not None:
                entry = on_nodes.get(name, _NO_PODS)
                if group.cxl_memory_chunk:
                    cxl[name], spare = _cxl_memory(raw, group, grouped.cxl_online.get(name, ()),
                                                   cxl_attaching_by_node.get(name, 0), entry, self._requests)
                usages.append(NodeUsage(name=name, fabric_gpus=len(devices), used_gpus=entry.used(gpu_resource),
                                        has_work=entry.working, spare_cxl_chunks=spare))
            seen.append((raw, group_id, gpu_resource, devices))
        self.idle.observe(usages, now)
        nodes = self._node_infos(seen, attaching_by_node, detaching_by_node, deleting_nodes)
        if cxl:
            nodes = [replace(n, cxl_chunks=cxl[n.name][0], cxl_attaching=cxl[n.name][1],
                             cxl_idle_since=self.idle.cxl_idle_since(n.name)) if n.name in cxl else n for n in nodes]

        # A Machine whose node is not Ready yet is still capacity to come (CA counts such nodes as upcoming too).
        registered = {n.name for n in nodes if n.ready}
        upcoming: dict[str, int] = {}
        for m in machines:
            if not m.deleting and (m.node_name is None or m.node_name not in registered):
                upcoming[m.group_id] = upcoming.get(m.group_id, 0) + 1
        replicas = self.machineset_replicas()  # after the Machines: a replica and its new Machine are not both missed
        for group_id in group_ids:
            missing = replicas_without_machine(machines, replicas, group_id)
            if missing:
                upcoming[group_id] = upcoming.get(group_id, 0) + missing
        pools = tuple(PoolInfo(p.name, {m: c for m, c in p.free.items() if not is_cxl_model(m)},
                               free_cxl_memory=cxl_memory_of(p.free)) for p in self._fabric.pools())
        snapshot = mark_claimed(Snapshot(now=now, nodes=tuple(nodes), pods=pods, groups=groups, pools=pools,
                                         upcoming_nodes=upcoming, gpu_model_label=self._gpu_model_label, dra=dra,
                                         ended_consumers=ended_consumers),
                                fabric_ids=fabric_ids)
        snapshot.index_pods({name: entry.pods for name, entry in on_nodes.items()},
                            pending=pending)
        return Observation(snapshot=snapshot, unschedulable_since=unschedulable, machines=machines, replicas=replicas)


def _cxl_memory(raw: NodeRecord, group: NodeGroupSpec, online: Sequence[Device], attaching: int, pods: "NodePods",
                requests: LastingRequests) -> tuple[tuple[tuple[Device, ...], int], int]:
    """A node's CXL memory as the planner sees it: (chunks online, chunks on their way), and how many chunks its pods'
    requests do not need. A chunk the fabric has online but the node does not report yet (its memory not grown: a
    kubelet publishes hot-added memory only once the kernel has it online, docs/cxl-memory.md) is still on its way: it
    is neither ordered again nor counted as room."""
    chunk = group.cxl_memory_chunk
    reported = max(0, (raw.allocatable.memory - group.memory) // chunk)
    unreported = max(0, len(online) - reported)
    requested = sum(requests.get(pod).memory for pod in pods.pods)
    spare = unneeded_chunks(len(online) - unreported, chunk, raw.allocatable.memory, requested)
    chunks = tuple(sorted(online, key=_attach_order))
    return (chunks, attaching + unreported), spare


def machine_refs(items: Iterable[Mapping[str, Any]]) -> tuple[MachineRef, ...]:
    """Machines owned by a MachineSet as Cluster API records it, as references from a node to its group: through
    status.nodeRef, the Node counted for the Machine that had it first (capi.node_claims)."""
    out = []
    for claim in capi.node_claims(items):
        item, namespace = claim.machine, capi.namespace_of(claim.machine)
        out.append(MachineRef(
            namespace=namespace, name=capi.name_of(item), group_id=group_of_machine(item, claim.machineset),
            provider_id=capi.provider_id(item), node_name=claim.node,
            deleting=capi.is_deleting(item) or capi.marked_for_deletion(item), terminating=capi.is_deleting(item),
            uid=str(capi.meta(item).get("uid") or ""), api_version=str(item.get("apiVersion") or ""),
            refused=claim.refused,
            hooked=capi.DDS_PRE_TERMINATE_HOOK in capi.annotations_of(item),
            awaiting_pre_terminate=capi.waiting_for_pre_terminate_hooks(item)))
    return tuple(out)


def group_of_machine(machine: Mapping[str, Any], machineset: str) -> str:
    """The group id a Machine counts in: its MachineDeployment's when it has one (whose controller labels the Machines
    of its MachineSets with its name; a MachineSet a MachineDeployment owns is never a group of its own), else its
    MachineSet's."""
    namespace = capi.namespace_of(machine)
    deployment = (capi.meta(machine).get("labels") or {}).get(capi.LABEL_DEPLOYMENT_NAME)
    if deployment:
        return f"MachineDeployment/{namespace}/{deployment}"
    return f"MachineSet/{namespace}/{machineset}"


def replicas_by_group(items: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """spec.replicas by group id of MachineSets and MachineDeployments (by their `kind`)."""
    out = {}
    for item in items:
        replicas = capi.spec_replicas(item)
        if replicas is not None:
            kind = "MachineDeployment" if item.get("kind") == "MachineDeployment" else "MachineSet"
            out[f"{kind}/{capi.namespace_of(item)}/{capi.name_of(item)}"] = replicas
    return out

