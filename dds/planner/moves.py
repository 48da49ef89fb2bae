"""Where idle GPUs wait: moved straight to the node that needs them, and one pod's worth on every node with room.

Pool-then-attach makes a pending pod wait for a GPU idle on another node to pass its cooldown (minutes in production)
before it is detached, and only then attached where the pod fits. When a scale-up plan leaves GPU pods without
capacity and the pool is short, this asks the planner what would happen if the idle GPUs were back in the pool: if
that places pods the real plan could not, exactly as many idle GPUs as that plan attaches beyond the pool are
released now (KubeComp's GPU choice: from the nodes holding the fewest idle GPUs first, which are the likeliest
fragments), and the next pass attaches them where the pods fit.

Where idle GPUs sit also decides where the next pods land: kube-scheduler binds a GPU pod only on a node with a free
GPU, so while idle GPUs sit on some nodes only, a pod goes there whatever its cpu and memory would prefer, and can
fragment the node a larger pod needed (KubeComp workload 1: a 40-core pod filling the 80-core hole of the node that
had an idle GPU, instead of the fuller node). `plan_room_headroom` keeps, on every node with cpu, memory and a pod slot
left for one more GPU pod of a shape the cluster runs or waits for, idle GPUs for that one pod, attached from the
free pool: the scheduler then chooses among all the nodes with room, as the planner would with attaches, and the
pod starts without one. Never from a pool a pending pod waits on (the pods first), never past a node's slots.
The control loop and `dds simulate` run it in a pass that attaches nothing else when `move_idle_gpus` is on (one
decision pass for both: dds/planner/passes.py).

Pure: `plan_scale_up` is passed in (no import cycle), results are tuples of detaches or attaches for the edge.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional, Sequence

from dds.planner.device_modes import nodes_held_by_load
from dds.planner.nodes import free_cpu_memory, group_slots
from dds.model.plan import Attach, Detach, PlannerConfig, ScaleUpPlan, Verdict
from dds.planner.refusals import selected_models
from dds.planner.memos import PlannerMemos
from dds.planner.requests import RequestCache
from dds.model.snapshot import Device, NodeInfo, PodInfo, PoolInfo, Snapshot

PlanFn = Callable[[Snapshot, PlannerConfig, Optional[Sequence[PodInfo]]], ScaleUpPlan]
_UNSERVED = (Verdict.NEEDS_NODE, Verdict.UNSCHEDULABLE)


def idle_devices(snapshot: Snapshot, skip: frozenset[str] = frozenset(), *,
                 memos: Optional[PlannerMemos] = None) -> dict[str, tuple[Device, ...]]:
    """Per DDS node not in `skip`, the attached devices no bound pod uses (newest attached first). `memos`: the
    caller's (their lasting requests), a fresh one without it."""
    cache = RequestCache(memos.requests if memos is not None else None)
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
               pods: Optional[Sequence[PodInfo]] = None, *, memos: Optional[PlannerMemos] = None
               ) -> tuple[Detach, ...]:
    """Idle GPUs to release now because pods `plan` left unserved would get them (see the module docstring)."""
    unserved = {d.pod for d in plan.decisions if d.verdict in _UNSERVED}
    if not unserved:
        return ()
    # Not from a device-plugin node with GPU load: the operator would refuse the detach until the node is idle.
    held = nodes_held_by_load(snapshot, config, RequestCache(memos.requests if memos is not None else None))
    idle = idle_devices(snapshot, frozenset(a.node for a in plan.attaches) | held, memos=memos)
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


def plan_room_headroom(snapshot: Snapshot, hungry: frozenset[str] = frozenset(),
                       skip: frozenset[str] = frozenset(), *, memos: Optional[PlannerMemos] = None
                       ) -> tuple[Attach, ...]:
    """Attaches from the free pool so that every node with room for one more GPU pod holds idle GPUs for it.

    A node's room is its allocatable cpu, memory and pods less what its bound pods request; the pods it could take are
    the shapes (cpu, memory, GPUs, models) of the pods bound or pending now, so the rule follows the workload without
    knowing how long anything runs. A node wants the GPUs of the largest such pod that fits its room, counting the
    idle GPUs it holds. Nodes in `skip` (reserved, or with an operation under way) and pools in `hungry` (a pending
    pod waits for their devices) are left alone. `memos`: the caller's (their lasting requests), a fresh one without
    it."""
    cache = RequestCache(memos.requests if memos is not None else None)
    shapes = _gpu_pod_shapes(snapshot, cache)
    if not shapes:
        return ()
    idle = idle_devices(snapshot, skip, memos=memos)
    free = {p.name: dict(p.free) for p in snapshot.pools}
    attaches: list[Attach] = []
    for node in sorted(snapshot.nodes, key=lambda n: n.name):
        group = snapshot.group(node.group_id) if node.group_id else None
        if group is None or group.fabric_pool in hungry or not _may_take_headroom(node, skip):
            continue
        model = group.default_gpu_model or (node.devices[0].model if node.devices else None)
        pool = free.get(group.fabric_pool, {})
        if model is None or pool.get(model, 0) <= 0:
            continue
        wanted = _one_more_pod(node, snapshot, shapes.get(node.gpu_resource, set()), model, cache)
        present = max(node.allocatable.get(node.gpu_resource), len(node.devices))
        slots = group_slots(group, snapshot.pool(group.fabric_pool)) - present
        count = min(wanted - len(idle.get(node.name, ())), pool[model], slots)
        if count > 0:
            pool[model] -= count
            attaches.append(Attach(node=node.name, pool=group.fabric_pool, model=model, count=count, pods=(), reason=(
                f"{node.name} has room for one more pod of {wanted} GPU(s): its idle GPUs are kept at that")))
    return tuple(attaches)


def _may_take_headroom(node: NodeInfo, skip: frozenset[str]) -> bool:
    """Not a node that is going away, cordoned, tainted (reserved or claimed), or with GPUs on their way in or out."""
    return not (node.name in skip or not node.ready or node.unschedulable or node.being_deleted or node.taints
                or node.attaching or node.detaching)


# One pod as the headroom sees it: milli-cpu, memory, GPUs, the GPU models it accepts (empty: any).
_Shape = tuple[int, int, int, frozenset[str]]


def _gpu_pod_shapes(snapshot: Snapshot, cache: RequestCache) -> dict[str, set[_Shape]]:
    """Per GPU resource, the shapes of the pods bound or pending that ask for it."""
    resources = {n.gpu_resource for n in snapshot.nodes}
    shapes: dict[str, set[_Shape]] = {}
    for pod in snapshot.pods:
        requests = cache.requests(pod)
        for resource in resources:
            gpus = requests.get(resource)
            if gpus > 0:
                models = selected_models(pod, snapshot.gpu_model_label)
                shapes.setdefault(resource, set()).add((requests.milli_cpu, requests.memory, gpus, models))
    return shapes


def _one_more_pod(node: NodeInfo, snapshot: Snapshot, shapes: set[_Shape], model: str, cache: RequestCache) -> int:
    """The GPUs of the largest pod of `shapes` (accepting `model`) that the node's free cpu and memory still take."""
    bound = snapshot.pods_on(node.name)
    if node.allocatable.pods and len(bound) >= node.allocatable.pods:
        return 0
    cpu, memory = free_cpu_memory(node, snapshot, cache)
    return max((gpus for shape_cpu, shape_memory, gpus, models in shapes
                if shape_cpu <= cpu and shape_memory <= memory and (not models or model in models)), default=0)
