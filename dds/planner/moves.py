"""Move an idle GPU straight to the node that needs it, instead of waiting for its idle cooldown.

Pool-then-attach makes a pending pod wait for a GPU idle on another node to pass its cooldown (minutes in production)
before it is detached, and only then attached where the pod fits. When a scale-up plan leaves GPU pods without
capacity and the pool is short, this asks the planner what would happen if the idle GPUs were back in the pool: if
that places pods the real plan could not, exactly as many idle GPUs as that plan attaches beyond the pool are
released now (KubeComp's GPU choice: from the nodes holding the fewest idle GPUs first, which are the likeliest
fragments), and the next pass attaches them where the pods fit.

Pure: `plan_scale_up` is passed in (no import cycle), the result is a tuple of detaches for the edge.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional, Sequence

from dds.planner.plan import Detach, PlannerConfig, ScaleUpPlan, Verdict
from dds.planner.requests import RequestCache
from dds.planner.snapshot import Device, NodeInfo, PodInfo, PoolInfo, Snapshot

PlanFn = Callable[[Snapshot, PlannerConfig, Optional[Sequence[PodInfo]]], ScaleUpPlan]
_UNSERVED = (Verdict.NEEDS_NODE, Verdict.UNSCHEDULABLE)


def idle_devices(snapshot: Snapshot, skip: frozenset[str] = frozenset()) -> dict[str, tuple[Device, ...]]:
    """Per DDS node not in `skip`, the attached devices no bound pod uses (newest attached first)."""
    cache = RequestCache()
    used: dict[str, int] = {}
    resource = {n.name: n.gpu_resource for n in snapshot.nodes}
    for pod in snapshot.pods:
        if pod.node_name in resource:
            used[pod.node_name] = used.get(pod.node_name, 0) + cache.requests(pod).get(resource[pod.node_name])
    out: dict[str, tuple[Device, ...]] = {}
    for node in sorted(snapshot.nodes, key=lambda n: n.name):
        if node.name in skip or node.group_id is None or node.detaching or node.attaching or node.taints:
            continue
        free = [d for d in node.devices if not d.in_claim]  # a device allocated to a ResourceClaim never moves
        count = min(len(free), len(node.devices) - used.get(node.name, 0))
        if count > 0:
            out[node.name] = tuple(sorted(free, key=lambda d: (d.attached_at, d.id), reverse=True)[:count])
    return out


def plan_moves(snapshot: Snapshot, config: PlannerConfig, plan: ScaleUpPlan, plan_fn: PlanFn,
               pods: Optional[Sequence[PodInfo]] = None) -> tuple[Detach, ...]:
    """Idle GPUs to release now because pods `plan` left unserved would get them (see the module docstring)."""
    unserved = {d.pod for d in plan.decisions if d.verdict in _UNSERVED}
    if not unserved:
        return ()
    idle = idle_devices(snapshot, frozenset(a.node for a in plan.attaches))
    if not idle:
        return ()
    what_if = _with_idle_in_pools(snapshot, idle)
    alternative = plan_fn(what_if, replace(config, batch_solver="greedy"), pods)
    served = {d.pod for d in alternative.decisions if d.pod in unserved and d.verdict == Verdict.FITS_AFTER_GPUS}
    if not served:
        return ()
    needed = _attached_beyond_pools(snapshot, alternative)
    return _release(idle, needed, what_if, alternative)


def _with_idle_in_pools(snapshot: Snapshot, idle: dict[str, tuple[Device, ...]]) -> Snapshot:
    gone = {d.id for devices in idle.values() for d in devices}
    back: dict[tuple[str, str], int] = {}
    nodes: list[NodeInfo] = []
    for node in snapshot.nodes:
        leaving = idle.get(node.name, ())
        if not leaving:
            nodes.append(node)
            continue
        for d in leaving:
            back[(d.pool, d.model)] = back.get((d.pool, d.model), 0) + 1
        scalar = dict(node.allocatable.scalar)
        scalar[node.gpu_resource] = max(0, scalar.get(node.gpu_resource, 0) - len(leaving))
        nodes.append(replace(node, devices=tuple(d for d in node.devices if d.id not in gone),
                             allocatable=replace(node.allocatable, scalar=scalar)))
    pools = tuple(PoolInfo(p.name, {**p.free, **{m: p.free.get(m, 0) + c for (pool, m), c in back.items()
                                                  if pool == p.name}}, p.max_slots_per_node)
                  for p in snapshot.pools)
    return replace(snapshot, nodes=tuple(nodes), pools=pools)


def _attached_beyond_pools(snapshot: Snapshot, plan: ScaleUpPlan) -> dict[tuple[str, str], int]:
    """Per (pool, model): how many of the plan's attaches the real pool cannot supply."""
    wanted: dict[tuple[str, str], int] = {}
    for a in plan.attaches:
        wanted[(a.pool, a.model)] = wanted.get((a.pool, a.model), 0) + a.count
    free = {(p.name, m): int(c) for p in snapshot.pools for m, c in p.free.items()}
    return {key: count - free.get(key, 0) for key, count in wanted.items() if count > free.get(key, 0)}


def _release(idle: dict[str, tuple[Device, ...]], needed: dict[tuple[str, str], int], what_if: Snapshot,
             alternative: ScaleUpPlan) -> tuple[Detach, ...]:
    targets = {a.node for a in alternative.attaches}
    detaches: list[Detach] = []
    # Nodes with the fewest idle GPUs first (KubeComp Algorithm 1: the likeliest fragments), then by name.
    for node in sorted(idle, key=lambda n: (len(idle[n]), n)):
        if node in targets:
            continue
        chosen: list[str] = []
        for device in idle[node]:
            key = (device.pool, device.model)
            if needed.get(key, 0) > 0:
                needed[key] -= 1
                chosen.append(device.id)
        if chosen:
            detaches.append(Detach(node, tuple(chosen), reason=(
                f"{len(chosen)} idle GPU(s) of {node} released now: pending pods fit elsewhere once they are "
                f"attached there (moved straight, not after the idle cooldown)")))
    return tuple(detaches)
