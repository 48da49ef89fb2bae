"""Builders for planner snapshots small enough to work out by hand.

Defaults: a group "gpu" of 8-core / 32 GiB nodes taking up to 4 A30 GPUs from pool "pool-a"; nodes labelled with
their hostname and, when they hold GPUs, the GPU product (as GPU feature discovery would).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from dds.model.groups import NodeGroupSpec, SourceRef, Taint
from dds.model.resources import Resources
from dds.model.snapshot import (ContainerRequests, Device, HostPort, LabelSelector, NodeInfo, NodeSelectorTerm,
                                PodAffinityTerm, PodInfo, PoolInfo, SelectorRequirement, Snapshot, Toleration)

GiB = 2**30
GPU = "nvidia.com/gpu"
PRODUCT = "nvidia.com/gpu.product"
HOSTNAME = "kubernetes.io/hostname"


def make_group(id: str = "gpu", *, min_size: int = 0, max_size: int = 10, replicas: int = 0, cores: int = 8,
               memory_gib: int = 32, max_gpus: int = 4, initial_gpus: int = 0, models: Sequence[str] = ("A30",),
               pool: str = "pool-a", gpu_cooldown: float = 600.0, node_cooldown: float = 600.0,
               force_detach: bool = False, labels: Optional[Mapping[str, str]] = None,
               taints: Sequence[Taint] = ()) -> NodeGroupSpec:
    return NodeGroupSpec(id=id, min_size=min_size, max_size=max_size, replicas=replicas, milli_cpu=cores * 1000,
                         memory=memory_gib * GiB, max_gpus_per_node=max_gpus, initial_gpus=initial_gpus,
                         gpu_models=tuple(models), fabric_pool=pool, gpu_idle_cooldown_seconds=gpu_cooldown,
                         node_idle_cooldown_seconds=node_cooldown, force_detach=force_detach,
                         labels=dict(labels or {}), taints=tuple(taints),
                         source=SourceRef(kind="File", name="test"))


def make_node(name: str, *, gpus: int = 0, model: str = "A30", group: Optional[str] = "gpu", cores: int = 8,
              memory_gib: int = 32, pods: int = 110, pool: str = "pool-a", attaching: int = 0,
              labels: Optional[Mapping[str, str]] = None, taints: Sequence[Taint] = (), unschedulable: bool = False,
              ready: bool = True, being_deleted: bool = False, gpus_idle_since: Optional[float] = None,
              empty_since: Optional[float] = None, fixed_gpus: int = 0, detaching: Sequence[str] = (),
              extra: Optional[Mapping[str, int]] = None) -> NodeInfo:
    """A node with `gpus` fabric devices of `model` attached (ids <name>-gpu-<i>, attached at t=i) and `fixed_gpus`
    that are not fabric devices."""
    devices = tuple(Device(id=f"{name}-gpu-{i}", model=model, pool=pool, attached_at=float(i)) for i in range(gpus))
    all_labels = {HOSTNAME: name}
    if gpus or fixed_gpus:
        all_labels[PRODUCT] = model
    all_labels.update(labels or {})
    scalar = {GPU: gpus + fixed_gpus} if gpus + fixed_gpus else {}
    scalar.update(extra or {})
    return NodeInfo(name=name, provider_id=f"test://{name}", group_id=group, labels=all_labels, taints=tuple(taints),
                    unschedulable=unschedulable, ready=ready,
                    allocatable=Resources(milli_cpu=cores * 1000, memory=memory_gib * GiB,
                                          ephemeral_storage=100 * GiB, pods=pods, scalar=scalar),
                    devices=devices, attaching=attaching, detaching=tuple(detaching), gpus_idle_since=gpus_idle_since,
                    empty_since=empty_since, being_deleted=being_deleted)


def make_pod(name: str, *, gpus: int = 0, cores: float = 1, memory_gib: float = 1, node: Optional[str] = None,
             namespace: str = "default", model: Optional[str] = None, priority: int = 0, created: float = 0.0,
             labels: Optional[Mapping[str, str]] = None, node_selector: Optional[Mapping[str, str]] = None,
             affinity: Sequence[NodeSelectorTerm] = (), tolerations: Sequence[Toleration] = (),
             ports: Sequence[int] = (), pod_affinity: Sequence[PodAffinityTerm] = (),
             anti_affinity: Sequence[PodAffinityTerm] = (), owner: Optional[str] = "ReplicaSet",
             not_movable: Optional[str] = None, unsupported: Sequence[str] = (),
             init: Sequence[tuple[Resources, bool]] = (), overhead: Resources = Resources(),
             extra: Optional[Mapping[str, int]] = None) -> PodInfo:
    scalar = {GPU: gpus} if gpus else {}
    scalar.update(extra or {})
    requests = Resources(milli_cpu=int(cores * 1000), memory=int(memory_gib * GiB), scalar=scalar)
    selector = dict(node_selector or {})
    if model:
        selector[PRODUCT] = model
    return PodInfo(namespace=namespace, name=name, uid=f"uid-{name}", labels=dict(labels or {"app": name}),
                   containers=(ContainerRequests(requests),),
                   init_containers=tuple(ContainerRequests(r, restartable_init=sidecar) for r, sidecar in init),
                   overhead=overhead, node_name=node, node_selector=selector, required_node_affinity=tuple(affinity),
                   tolerations=tuple(tolerations), host_ports=tuple(HostPort(p) for p in ports),
                   required_pod_affinity=tuple(pod_affinity), required_pod_anti_affinity=tuple(anti_affinity),
                   priority=priority, owner_kind=owner, created_at=created, unsupported=tuple(unsupported),
                   not_movable_reason=not_movable)


def make_pool(name: str = "pool-a", max_slots: Optional[int] = None, **free: int) -> PoolInfo:
    return PoolInfo(name=name, free=dict(free), max_slots_per_node=max_slots)


def make_snapshot(nodes: Sequence[NodeInfo] = (), pods: Sequence[PodInfo] = (),
                  groups: Sequence[NodeGroupSpec] = (), pools: Sequence[PoolInfo] = (), now: float = 1000.0,
                  upcoming: Optional[Mapping[str, int]] = None) -> Snapshot:
    return Snapshot(now=now, nodes=tuple(nodes), pods=tuple(pods), groups=tuple(groups) or (make_group(),),
                    pools=tuple(pools) if pools else (make_pool(A30=6),), upcoming_nodes=dict(upcoming or {}))


def term(key: str, operator: str, *values: str) -> NodeSelectorTerm:
    return NodeSelectorTerm(match_expressions=(SelectorRequirement(key, operator, tuple(values)),))


def same_host(**match: str) -> PodAffinityTerm:
    return PodAffinityTerm(LabelSelector(match_labels=dict(match)), HOSTNAME)


def demo_snapshot() -> Snapshot:
    """The talk's demo: two workers with one busy A30 each, max 4 GPUs, a pool with 6 free A30, one pending pod."""
    nodes = [make_node("worker-1", gpus=1), make_node("worker-2", gpus=1)]
    pods = [make_pod("busy-1", gpus=1, node="worker-1"), make_pod("busy-2", gpus=1, node="worker-2"),
            make_pod("train", gpus=1, created=10.0)]
    return make_snapshot(nodes, pods, groups=[make_group(replicas=2)], pools=[make_pool(A30=6)])
