"""New nodes the pool cannot equip are not added; the pods planned on them get what live nodes can give instead.

A new node of a group draws its GPUs — the boot-time ones included — from the group's fabric pool. When every pod
planned on it needs a GPU and the pool is short, the node would come up without them and serve nobody (and CA, seeing
its pods still pending, would ask for another). Such nodes are dropped from the plan; CA is told OutOfResources for
them (dds/controller/ca_requests.py). The pods that were planned on them may still fit on a live node with a GPU attached
from what the pool has left — a batch plan that packs two pods onto one new node hides that — so they are planned
again on live nodes alone, and those attaches join the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

from dds.model.groups import NodeGroupSpec
from dds.model.plan import PlannerConfig, ScaleUpPlan, Verdict
from dds.planner.requests import effective_requests
from dds.model.snapshot import PoolInfo, Snapshot
from dds.planner.memos import PlannerMemos


@dataclass(frozen=True)
class Unequipped:
    nodes: int  # new nodes of the plan the pool cannot equip
    pods: tuple[str, ...]  # the pods that were planned on them and get nothing else
    gpus: int  # what those nodes would have needed from the pool
    free: int  # what the pool has for them
    pool: str
    model: str
    group: str

    @property
    def message(self) -> str:
        return (f"pool {self.pool} has {self.free} free {self.model} for {', '.join(self.pods)}: {self.nodes} new "
                f"node(s) of {self.group} would come up without the {self.gpus} GPU(s) they need (a node's GPUs, "
                f"boot-time ones included, come from that pool)")


def nodes_without_gpus(pods_need_gpus: Sequence[bool], gpus_per_new_node: Sequence[int], pool_free: int) -> int:
    """How many of a plan's new nodes (each needing `gpus_per_new_node[i]` devices: boot-time plus attaches) the pool
    cannot equip, when every pod planned on them needs a GPU — such nodes would serve nobody. 0 when some pod needs no
    GPU (the nodes serve it; their GPUs follow when devices free up) or the pool covers them, taken in plan order."""
    if not gpus_per_new_node or not pods_need_gpus or not all(pods_need_gpus):
        return 0
    equipped = 0
    for need in gpus_per_new_node:
        if need > pool_free:
            break
        pool_free -= need
        equipped += 1
    return len(gpus_per_new_node) - equipped


def pool_free(snapshot: Snapshot, group: NodeGroupSpec) -> int:
    pool = snapshot.pool(group.fabric_pool)
    if pool is None:
        return 0
    return sum(pool.free.get(model, 0) for model in (group.gpu_models or tuple(pool.free)))


def equip_new_nodes(snapshot: Snapshot, plan: ScaleUpPlan, group: NodeGroupSpec, config: PlannerConfig, *,
                    memos: Optional[PlannerMemos] = None) -> tuple[ScaleUpPlan, Optional[Unequipped]]:
    """The plan without `group`'s new nodes the pool cannot equip, plus attaches on live nodes for the pods that were
    planned on them; the dropped nodes are described (None when none is dropped)."""
    kept, unequipped = without_unequipped_nodes(snapshot, plan, group)
    if unequipped is None:
        return plan, None
    stranded = [p for p in snapshot.pending_pods() if p.key in set(unequipped.pods)]
    kept = with_live_attaches(snapshot, kept, stranded, config, memos)
    served = {d.pod for d in kept.decisions if d.verdict == Verdict.FITS_AFTER_GPUS}
    left = tuple(p for p in unequipped.pods if p not in served)
    free = pool_free(snapshot, group) - sum(a.count for a in kept.attaches if a.pool == group.fabric_pool)
    return kept, replace(unequipped, pods=left, free=max(0, free))


def without_unequipped_nodes(snapshot: Snapshot, plan: ScaleUpPlan,
                             group: NodeGroupSpec) -> tuple[ScaleUpPlan, Optional[Unequipped]]:
    """The plan without the new nodes of `group` that would come up without the GPUs their pods wait for."""
    mine = [n for n in plan.new_nodes if n.group == group.id]
    if not mine:
        return plan, None
    pods_by_key = {p.key: p for p in snapshot.pods}
    pods = tuple(p for n in mine for p in n.pods)
    needs_gpu = [key in pods_by_key and effective_requests(pods_by_key[key]).get(group.gpu_resource) > 0
                 for key in pods]
    per_node = [group.initial_gpus + (n.gpus_per_node[i] if i < len(n.gpus_per_node) else 0)
                for n in mine for i in range(n.count)]
    free = pool_free(snapshot, group) - sum(a.count for a in plan.attaches if a.pool == group.fabric_pool)
    short = nodes_without_gpus(needs_gpu, per_node, max(0, free))
    if not short:
        return plan, None
    kept, drop = [], short
    for new in reversed(plan.new_nodes):
        if new.group == group.id and drop:
            taken = min(drop, new.count)
            drop -= taken
            if new.count > taken:
                kept.append(replace(new, count=new.count - taken, gpus_per_node=new.gpus_per_node[:new.count - taken]))
            continue
        kept.append(new)
    unequipped = Unequipped(short, pods, sum(per_node), max(0, free), group.fabric_pool,
                            group.default_gpu_model or "GPU", group.id)
    return replace(plan, new_nodes=tuple(reversed(kept))), unequipped


def with_live_attaches(snapshot: Snapshot, plan: ScaleUpPlan, pods: Sequence, config: PlannerConfig,
                       memos: Optional[PlannerMemos] = None) -> ScaleUpPlan:
    """`plan` plus the attaches that put `pods` on live nodes, from what the pool has left after `plan`'s attaches."""
    from dds.planner import plan_scale_up  # the package's entry point; this module is one of its parts

    if not pods:
        return plan
    left = _pools_after(snapshot, plan)
    extra = plan_scale_up(replace(snapshot, pools=left), replace(config, allow_new_nodes=False), pods, memos=memos)
    served = {d.pod: d for d in extra.decisions if d.verdict == Verdict.FITS_AFTER_GPUS}
    if not served:
        return plan
    attaches = tuple(a for a in extra.attaches if set(a.pods) & set(served))
    decisions = tuple(served.get(d.pod, d) for d in plan.decisions)
    return replace(plan, attaches=plan.attaches + attaches, decisions=decisions)


def _pools_after(snapshot: Snapshot, plan: ScaleUpPlan) -> tuple[PoolInfo, ...]:
    taken: dict[tuple[str, str], int] = {}
    for attach in plan.attaches:
        taken[(attach.pool, attach.model)] = taken.get((attach.pool, attach.model), 0) + attach.count
    return tuple(replace(p, free={m: max(0, n - taken.get((p.name, m), 0)) for m, n in p.free.items()})
                 for p in snapshot.pools)


@dataclass(frozen=True)
class NodesNotEquipped:
    """What `equip_every_group` took: the new nodes of one or more groups the pools cannot equip."""

    pods: tuple[str, ...]
    message: str


def equip_every_group(snapshot: Snapshot, plan: ScaleUpPlan) -> tuple[ScaleUpPlan, Optional[NodesNotEquipped]]:
    """The plan's new nodes, each group's cut to what its pool can equip (`without_unequipped_nodes`), with no attaches:
    the cut of a plan that only adds nodes (the loop's nodes for pods with ResourceClaims). Every pod of a group
    whose nodes were cut is named as having lost its capacity (no live attach makes up for it on this path)."""
    kept, taken = [], []
    for step in plan.new_nodes:
        group = snapshot.group(step.group)
        if group is None:
            continue
        equipped, unequipped = without_unequipped_nodes(snapshot, replace(plan, new_nodes=(step,), attaches=()), group)
        kept.extend(equipped.new_nodes)
        if unequipped is not None:
            taken.append(unequipped)
    cut = replace(plan, new_nodes=tuple(kept), attaches=())
    if not taken:
        return cut, None
    return cut, NodesNotEquipped(tuple(p for u in taken for p in u.pods), "; ".join(u.message for u in taken))
