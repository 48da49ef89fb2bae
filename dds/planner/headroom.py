"""Warm headroom: idle GPUs a group keeps attached so the next pods start without waiting for an attach.

After the idle cooldown every GPU would go back to the pool, and the next burst pays a full attach again; classic
over-provisioning (CA's CapacityBuffer, pause pods) exists for exactly that. A group's `warm_gpus` (its
`dds.cdi.dev/warm-gpus` annotation, else its pool's default) is how many idle GPUs stay attached across its nodes:

- the scale-down keeps up to that many idle GPUs past the cooldown (`WarmBudget`), the oldest attached first;
- the refill attaches what is missing once pods took some (`plan_warm_refill`), onto the group's nodes with free
  slots, never past a node's slots;
- neither happens for a pool some pending pod is waiting on (`hungry_pools`): headroom must never starve another
  group, so then the warm GPUs go back after the cooldown like any idle GPU and the pod gets them.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

from dds.model.groups import NodeGroupSpec
from dds.planner.nodes import group_slots
from dds.model.plan import Attach, PlannerConfig
from dds.planner.refusals import selected_models
from dds.planner.memos import PlannerMemos
from dds.planner.requests import RequestCache, effective_requests
from dds.planner.usage import gpu_usage
from dds.model.snapshot import NodeInfo, PodInfo, Snapshot


def warm_target(group: NodeGroupSpec, config: PlannerConfig) -> int:
    if group.warm_gpus is not None:
        return group.warm_gpus
    return config.warm_gpus_by_pool.get(group.fabric_pool, 0)


def hungry_pools(snapshot: Snapshot, waiting: Iterable[PodInfo]) -> frozenset[str]:
    """Pools with no free device of a model that a waiting (unschedulable) GPU pod would take."""
    hungry = set()
    for pod in waiting:
        if not any(effective_requests(pod).get(g.gpu_resource) for g in snapshot.groups):
            continue
        models = selected_models(pod, snapshot.gpu_model_label)
        for pool in snapshot.pools:
            usable = [m for m in pool.free if not models or m in models]
            if usable and sum(pool.free[m] for m in usable) == 0:
                hungry.add(pool.name)
    return frozenset(hungry)


class WarmBudget:
    """How many more idle GPUs each group may keep past the cooldown in one scale-down pass."""

    def __init__(self, snapshot: Snapshot, config: PlannerConfig, hungry: frozenset[str]) -> None:
        self._left = {g.id: (0 if g.fabric_pool in hungry else warm_target(g, config)) for g in snapshot.groups}

    def reserve(self, group: NodeGroupSpec, idle: int) -> int:
        """Take up to `idle` from the group's budget; returns how many to keep."""
        keep = min(idle, self._left.get(group.id, 0))
        self._left[group.id] = self._left.get(group.id, 0) - keep
        return keep


def plan_warm_refill(snapshot: Snapshot, config: PlannerConfig, hungry: frozenset[str], *,
                     memos: Optional[PlannerMemos] = None) -> tuple[Attach, ...]:
    """Attaches that bring each group back to its warm headroom from what its pool has free. `memos`: the caller's
    (their lasting requests), a fresh one without it."""
    if not any(warm_target(group, config) > 0 for group in snapshot.groups):
        return ()  # the usual case: no group keeps warm GPUs, and nothing below is worth a walk over every pod
    cache = RequestCache(memos.requests if memos is not None else None)
    pods_on: dict[str, list[PodInfo]] = {}
    for pod in snapshot.pods:
        if pod.node_name:
            pods_on.setdefault(pod.node_name, []).append(pod)
    free = {p.name: dict(p.free) for p in snapshot.pools}
    attaches: list[Attach] = []
    for group in sorted(snapshot.groups, key=lambda g: g.id):
        target = warm_target(group, config)
        if target <= 0 or group.fabric_pool in hungry or group.fabric_pool not in free:
            continue
        nodes = [n for n in snapshot.nodes if _can_hold_warm(n, group)]
        warm = sum(len(gpu_usage(n, pods_on.get(n.name, ()), cache).idle) + n.attaching for n in nodes)
        model = _model(group, free[group.fabric_pool])
        if model is None:
            continue
        slots = {n.name: _free_slots(n, group, snapshot) for n in nodes}
        placed: dict[str, int] = {}
        for _ in range(max(0, target - warm)):
            if free[group.fabric_pool].get(model, 0) <= 0:
                break
            node = _roomiest(nodes, slots, pods_on)
            if node is None:
                break
            slots[node.name] -= 1
            free[group.fabric_pool][model] -= 1
            placed[node.name] = placed.get(node.name, 0) + 1
        for name, count in sorted(placed.items()):
            attaches.append(Attach(node=name, pool=group.fabric_pool, model=model, count=count, pods=(),
                                   reason=f"warm headroom of {group.id}: {warm} of {target} idle GPU(s) attached"))
    return tuple(attaches)


def _can_hold_warm(node: NodeInfo, group: NodeGroupSpec) -> bool:
    return (node.group_id == group.id and node.ready and not node.being_deleted and not node.unschedulable
            and not node.detaching)


def _free_slots(node: NodeInfo, group: NodeGroupSpec, snapshot: Snapshot) -> int:
    present = max(node.allocatable.get(node.gpu_resource), len(node.devices))
    return max(0, group_slots(group, snapshot.pool(group.fabric_pool)) - present - node.attaching)


def _model(group: NodeGroupSpec, free: dict[str, int]) -> Optional[str]:
    if group.default_gpu_model:
        return group.default_gpu_model
    return max(sorted(free), key=lambda m: free[m], default=None)


def _roomiest(nodes: Sequence[NodeInfo], slots: dict[str, int], pods_on: dict[str, list[PodInfo]]
              ) -> Optional[NodeInfo]:
    """The node where a warm GPU is most likely used: free slots first, a node with work (it is not going away) next,
    then the name, for a deterministic choice."""
    open_nodes = [n for n in nodes if slots[n.name] > 0]
    if not open_nodes:
        return None
    return min(open_nodes, key=lambda n: (-slots[n.name], n.empty_since is not None, n.name))
