"""Observe: read the cluster (nodes, pods, Machines) and the fabric once, and freeze it into the planner's Snapshot.

Reads are plain LISTs each loop: simple and always consistent with the apiserver; at thousands of nodes a watch cache
would replace them (noted in the README), the planner does not change.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from kubernetes import client

from dds.controller.idle import IdleTracker, NodeUsage
from dds.controller.devices import devices_by_node
from dds.fabric.base import Fabric, OperationKind
from dds.kube import capi, convert
from dds.model.groups import NodeGroupSpec
from dds.planner.snapshot import NodeInfo, PodInfo, PoolInfo, Snapshot

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class MachineRef:
    namespace: str
    name: str
    group_id: str
    provider_id: str
    node_name: Optional[str]
    deleting: bool  # being deleted, or marked for the next scale-down (cluster.x-k8s.io/delete-machine)
    terminating: bool = False  # deletionTimestamp set: no longer one of its MachineSet's replicas


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


def _gpu_requests(pod: PodInfo, resource: str) -> int:
    from dds.planner import effective_requests  # the planner owns kube-scheduler's request rule

    return effective_requests(pod).get(resource)


def _is_work(pod: PodInfo) -> bool:
    return pod.owner_kind not in ("DaemonSet", "Node")


class ClusterObserver:
    def __init__(self, api: client.ApiClient, fabric: Fabric, groups: Callable[[], Sequence[NodeGroupSpec]],
                 clock: Callable[[], float], idle: IdleTracker, gpu_model_label: str,
                 machineset_namespaces: Sequence[str] = ()) -> None:
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._fabric = fabric
        self._groups = groups
        self._clock = clock
        self.idle = idle
        self._gpu_model_label = gpu_model_label
        self._namespaces = tuple(machineset_namespaces)
        self._capi = capi.CapiObjects(api)

    # --- Machines: the Cluster API link from a Node to its MachineSet (= node group) ---
    def machines(self) -> tuple[MachineRef, ...]:
        try:
            items = self._capi.list(capi.MACHINES, self._namespaces)
        except capi.CapiNotInstalled:
            return ()  # no Cluster API: no node belongs to a MachineSet group
        except client.ApiException as exc:
            if exc.status == 404:  # the version in use stopped being served (Cluster API upgraded)
                self._capi.forget_version()
            raise
        out = []
        for item in items:
            owner = capi.owner_machineset(item)
            if owner is None:
                continue
            namespace = capi.namespace_of(item)
            out.append(MachineRef(
                namespace=namespace, name=capi.name_of(item), group_id=f"MachineSet/{namespace}/{owner['name']}",
                provider_id=capi.provider_id(item), node_name=capi.node_ref_name(item),
                deleting=capi.is_deleting(item) or capi.marked_for_deletion(item), terminating=capi.is_deleting(item)))
        return tuple(out)

    def machineset_replicas(self) -> dict[str, int]:
        """spec.replicas per MachineSet group id, read now (the group catalog may be a loop old)."""
        try:
            items = self._capi.list(capi.MACHINESETS, self._namespaces)
        except capi.CapiNotInstalled:
            return {}
        out = {}
        for item in items:
            replicas = capi.spec_replicas(item)
            if replicas is not None:
                out[f"MachineSet/{capi.namespace_of(item)}/{capi.name_of(item)}"] = replicas
        return out

    # --- the snapshot ---
    def observe(self) -> Observation:
        now = self._clock()
        groups = tuple(self._groups())
        group_ids = {g.id for g in groups}
        machines = self.machines()
        group_of_provider = {m.provider_id: m.group_id for m in machines if m.provider_id}
        group_of_node = {m.node_name: m.group_id for m in machines if m.node_name}
        deleting_nodes = {m.node_name for m in machines if m.deleting and m.node_name}

        raw_pods = [p for p in self._core.list_pod_for_all_namespaces().items if not convert.pod_is_terminal(p)]
        pods = tuple(convert.pod_info(p) for p in raw_pods)
        unschedulable = {}
        for raw, info in zip(raw_pods, pods):
            if info.node_name is None:
                since = convert.pod_unschedulable_since(raw)
                if since is not None:
                    unschedulable[info.key] = since

        grouped = devices_by_node(self._fabric.devices())
        online_by_node, detaching_by_node = grouped.online, grouped.detaching
        attaching_by_node: dict[str, int] = {}
        for op in self._fabric.operations():
            if op.kind == OperationKind.ATTACH and not op.state.done:
                online = sum(1 for dev in online_by_node.get(op.node, ()) if dev.id in op.devices)
                attaching_by_node[op.node] = attaching_by_node.get(op.node, 0) + max(0, op.requested - online)

        nodes = []
        usages = []
        pods_by_node: dict[str, list[PodInfo]] = {}
        for pod in pods:
            if pod.node_name:
                pods_by_node.setdefault(pod.node_name, []).append(pod)
        for raw in self._core.list_node().items:
            name = raw.metadata.name
            provider_id = raw.spec.provider_id or ""
            group_id = group_of_provider.get(provider_id) or group_of_node.get(name)
            if group_id not in group_ids:
                group_id = None
            group = next((g for g in groups if g.id == group_id), None)
            gpu_resource = group.gpu_resource if group else "nvidia.com/gpu"
            devices = tuple(sorted(online_by_node.get(name, ()), key=lambda d: (d.attached_at, d.id)))
            bound = pods_by_node.get(name, [])
            if group is not None:
                usages.append(NodeUsage(name=name, fabric_gpus=len(devices),
                                        used_gpus=sum(_gpu_requests(p, gpu_resource) for p in bound),
                                        has_work=any(_is_work(p) for p in bound)))
            nodes.append(NodeInfo(
                name=name, provider_id=provider_id, group_id=group_id, labels=convert.labels_of(raw),
                taints=convert.node_taints(raw), unschedulable=bool(raw.spec.unschedulable),
                ready=convert.node_ready(raw), allocatable=convert.node_allocatable(raw), gpu_resource=gpu_resource,
                devices=devices, attaching=attaching_by_node.get(name, 0),
                detaching=tuple(detaching_by_node.get(name, ())),
                created_at=raw.metadata.creation_timestamp.timestamp() if raw.metadata.creation_timestamp else 0.0,
                being_deleted=convert.node_marked_for_deletion(raw) or name in deleting_nodes))
        self.idle.observe(usages, now)
        nodes = [_with_idle(n, self.idle) for n in nodes]

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
        pools = tuple(PoolInfo(p.name, dict(p.free)) for p in self._fabric.pools())
        snapshot = Snapshot(now=now, nodes=tuple(nodes), pods=pods, groups=groups, pools=pools,
                            upcoming_nodes=upcoming, gpu_model_label=self._gpu_model_label)
        return Observation(snapshot=snapshot, unschedulable_since=unschedulable, machines=machines, replicas=replicas)


def _with_idle(node: NodeInfo, idle: IdleTracker) -> NodeInfo:
    if node.group_id is None:
        return node
    from dataclasses import replace

    return replace(node, gpus_idle_since=idle.gpus_idle_since(node.name), empty_since=idle.empty_since(node.name))
