"""Facts about a node's GPUs (capacity, free slots, model, pool) and `SimNode`, the plain mutable simulated node.

The fast planner keeps the same facts in arrays (dds/planner/state.py); the reference planner, nodes on their way and
new nodes use SimNode. Both read the facts from `gpu_facts`, so they cannot disagree on what a node holds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence

from dds.model.groups import LABEL_GPU_MODEL, NodeGroupSpec, Taint
from dds.model.resources import PODS, Resources
from dds.planner.requests import HOSTNAME_TOPOLOGY, PodRequest, RequestCache
from dds.model.snapshot import HostPort, NodeInfo, PodInfo, PoolInfo, Snapshot


@dataclass(frozen=True, slots=True)
class GpuFacts:
    capacity: int  # GPUs pods can count on: visible or attached, minus those detaching, plus those attaching
    occupied: int  # GPUs taking the node's slots now (detaching ones still do)
    free_slots: int  # GPUs that may still be attached (0 when the node cannot get GPUs)
    model: Optional[str]  # the model the node holds (nodes hold one model at a time); None = no GPUs yet
    allowed_models: tuple[str, ...]  # models an attach may bring: (model,) once it has one; default model first
    pool: Optional[str]
    attachable: bool
    not_attachable_reason: str = ""


def node_model(node: NodeInfo, group: Optional[NodeGroupSpec], label: str, visible: int) -> Optional[str]:
    """The GPU model the node holds or is getting: its devices, else its labels or group when it shows GPUs."""
    if node.devices:
        first = node.devices[0].model
        if all(d.model == first for d in node.devices):
            return first
        counts = Counter(d.model for d in node.devices)  # mixed (mid-swap): the majority, then the name
        return min(counts, key=lambda m: (-counts[m], m))
    if visible > 0:
        default = group.default_gpu_model if group else None
        return node.labels.get(label) or node.labels.get(LABEL_GPU_MODEL) or default
    if node.attaching > 0:
        return node.labels.get(LABEL_GPU_MODEL) or (group.default_gpu_model if group else None)
    return None


def free_cpu_memory(node: NodeInfo, snapshot: Snapshot, cache: RequestCache) -> tuple[int, int]:
    """The node's allocatable millicores and memory its bound pods' requests leave."""
    bound = [cache.requests(p) for p in snapshot.pods_on(node.name)]
    return (node.allocatable.milli_cpu - sum(r.milli_cpu for r in bound),
            node.allocatable.memory - sum(r.memory for r in bound))


def group_slots(group: NodeGroupSpec, pool: Optional[PoolInfo]) -> int:
    """GPUs a node of `group` can hold at most: the group's max, capped by its pool's per-node limit."""
    if pool is None or pool.max_slots_per_node is None:
        return group.max_gpus_per_node
    return min(group.max_gpus_per_node, pool.max_slots_per_node)


def allowed_models(group: NodeGroupSpec, pool: Optional[PoolInfo]) -> tuple[str, ...]:
    """Models a node of `group` may hold: the group's list (default first), else every model its pool knows."""
    if group.gpu_models:
        return tuple(dict.fromkeys(group.gpu_models))
    return tuple(sorted(pool.free)) if pool is not None else ()


def group_allowed(config_groups: Optional[Sequence[str]], group_id: str) -> bool:
    return config_groups is None or group_id in config_groups


def gpu_facts(node: NodeInfo, snapshot: Snapshot, config_groups: Optional[Sequence[str]]) -> GpuFacts:
    group = snapshot.group(node.group_id) if node.group_id else None
    visible = node.allocatable.get(node.gpu_resource)
    present = max(visible, len(node.devices))  # a device may be attached before the device plugin shows it
    leaving = len(set(node.detaching) & {d.id for d in node.devices}) if node.detaching else 0
    capacity = max(0, present - leaving) + node.attaching
    occupied = present + node.attaching
    model = node_model(node, group, snapshot.gpu_model_label, visible)
    if group is None:
        reason = "not a DDS node" if node.group_id is None else f"group {node.group_id} is unknown"
        return GpuFacts(capacity, occupied, 0, model, (model,) if model else (), None, False, reason)
    pool = snapshot.pool(group.fabric_pool)
    models = (model,) if model else allowed_models(group, pool)
    reason = ""
    if not group_allowed(config_groups, group.id):
        reason = f"group {group.id} is not part of this pass"
    elif pool is None:
        reason = f"pool {group.fabric_pool} is not known to the fabric"
    elif not node.ready:
        reason = "node is not ready"
    elif node.being_deleted:
        reason = "node is being deleted"
    slots = max(0, group.max_gpus_per_node - occupied)
    if pool is not None and pool.max_slots_per_node is not None:
        slots = min(slots, max(0, pool.max_slots_per_node - len(node.devices) - node.attaching))
    if reason:
        slots = 0
    return GpuFacts(capacity, occupied, slots, model, models, group.fabric_pool, not reason, reason)


def effective_labels(labels: Mapping[str, str], model: Optional[str], label: str) -> Mapping[str, str]:
    """What the node will be labelled once it holds `model` (GPU feature discovery labels the product)."""
    if model is None or labels.get(label) == model:
        return labels
    out = dict(labels)
    out[label] = model
    return out


@dataclass
class SimNode:
    """A node in the simulation: its capacity, what is placed on it, and how many more GPUs it may get."""

    name: str
    base_labels: Mapping[str, str]
    taints: Sequence[Taint]
    unschedulable: bool
    ready: bool
    being_deleted: bool
    gpu_resource: str
    gpu_model_label: str
    allocatable: dict[str, int]  # the GPU resource counts the GPUs pods can count on
    group: Optional[NodeGroupSpec]
    pool: Optional[str]
    model: Optional[str]
    allowed_models: tuple[str, ...]
    free_slots: int
    attachable: bool
    not_attachable_reason: str = ""
    requested: dict[str, int] = field(default_factory=dict)
    placed: list[PodInfo] = field(default_factory=list)
    ports: list[HostPort] = field(default_factory=list)
    gpus_attached: int = 0  # virtual GPUs attached in this plan
    new_model: bool = False  # the model was chosen by this plan (the node had none)
    virtual: bool = False  # not a live node (on its way, or added by this plan): its GPUs' model is still open

    # --- NodeView ---
    @property
    def labels(self) -> Mapping[str, str]:
        return effective_labels(self.base_labels, self.model, self.gpu_model_label)

    def free(self, resource: str) -> int:
        return self.allocatable.get(resource, 0) - self.requested.get(resource, 0)

    def capacity(self, resource: str) -> int:
        return self.allocatable.get(resource, 0)

    def host_ports(self) -> Iterable[HostPort]:
        return self.ports

    def pods(self) -> Iterable[PodInfo]:
        return self.placed

    # --- GPU helpers ---
    @property
    def gpus(self) -> int:
        return self.allocatable.get(self.gpu_resource, 0)

    @property
    def gpu_slots(self) -> int:
        """The most GPUs this node can hold for pods: what it has plus what may still be attached."""
        return self.gpus + self.free_slots

    def with_model(self, model: Optional[str]) -> "ModelView":
        return ModelView(self, model)

    # --- changes ---
    def add_pod(self, req: PodRequest) -> None:
        r = req.requests
        for name in r.names():
            amount = r.get(name)
            if amount:
                self.requested[name] = self.requested.get(name, 0) + amount
        self.requested[PODS] = self.requested.get(PODS, 0) + 1
        self.placed.append(req.pod)
        self.ports.extend(p for p in req.pod.host_ports if p.port > 0)

    def attach(self, count: int, model: Optional[str]) -> None:
        if count <= 0:
            return
        if count > self.free_slots:
            raise ValueError(f"{self.name}: {count} GPU(s) do not fit {self.free_slots} free slot(s)")
        if self.model is None and model is not None:
            self.model, self.allowed_models, self.new_model = model, (model,), True
        self.allocatable[self.gpu_resource] = self.gpus + count
        self.free_slots -= count
        self.gpus_attached += count


class ModelView:
    """A node seen as if it held `model` (for judging a node that has no GPUs yet)."""

    def __init__(self, node: SimNode, model: Optional[str]) -> None:
        self._node = node
        self.name = node.name
        self.labels = effective_labels(node.base_labels, model or node.model, node.gpu_model_label)
        self.taints = node.taints
        self.unschedulable = node.unschedulable
        self.ready = node.ready
        self.being_deleted = node.being_deleted
        self.gpu_resource = node.gpu_resource

    def free(self, resource: str) -> int:
        return self._node.free(resource)

    def capacity(self, resource: str) -> int:
        return self._node.capacity(resource)

    def host_ports(self) -> Iterable[HostPort]:
        return self._node.host_ports()

    def pods(self) -> Iterable[PodInfo]:
        return self._node.pods()


def _allocatable(resources: Resources) -> dict[str, int]:
    return {name: resources.get(name) for name in resources.names() if resources.get(name)}


def sim_node(node: NodeInfo, snapshot: Snapshot, config_groups: Optional[Sequence[str]]) -> SimNode:
    """A live node as the simulation starts from it (bound pods are added by the caller)."""
    facts = gpu_facts(node, snapshot, config_groups)
    allocatable = _allocatable(node.allocatable)
    allocatable[node.gpu_resource] = facts.capacity
    group = snapshot.group(node.group_id) if node.group_id else None
    return SimNode(name=node.name, base_labels=node.labels, taints=node.taints, unschedulable=node.unschedulable,
                   ready=node.ready, being_deleted=node.being_deleted, gpu_resource=node.gpu_resource,
                   gpu_model_label=snapshot.gpu_model_label, allocatable=allocatable, group=group, pool=facts.pool,
                   model=facts.model, allowed_models=facts.allowed_models, free_slots=facts.free_slots,
                   attachable=facts.attachable, not_attachable_reason=facts.not_attachable_reason)


def template_node(group: NodeGroupSpec, name: str, gpus: int, free_slots: int, snapshot: Snapshot) -> SimNode:
    """A node of `group` that does not exist yet (on its way, or planned here) with `gpus` GPUs present and its CXL
    memory at the group's maximum: like the GPUs a new node needs beyond its boot GPUs, that memory is attached once it
    is up (the memory pass serves its pods then, dds/planner/cxl_memory.py)."""
    labels = dict(group.labels)
    labels.setdefault(HOSTNAME_TOPOLOGY, name)
    allocatable = _allocatable(group.node_allocatable(gpus, group.max_cxl_chunks))
    allocatable[group.gpu_resource] = gpus
    pool = snapshot.pool(group.fabric_pool)
    return SimNode(name=name, base_labels=labels, taints=group.taints, unschedulable=False, ready=True,
                   being_deleted=False, gpu_resource=group.gpu_resource, gpu_model_label=snapshot.gpu_model_label,
                   allocatable=allocatable, group=group, pool=group.fabric_pool, model=None,
                   allowed_models=allowed_models(group, pool), free_slots=free_slots, attachable=True)
