"""Gangs: pods that are useless until a minimum number of them run together (distributed training).

Planning pod by pod can attach GPUs for 3 of a 4-worker gang and leave them idle: the costliest waste there is. A
gang's minimum is planned as one unit instead: every member up to the minimum gets capacity in the same plan (fits
now, fits after GPUs, or a new node) — or none does, and each member's decision says why.

Recognised gangs (the edge fills `PodInfo.pod_group` / `pod_group_min_member`; the label is a fallback):

| source                                   | group name                                | minimum                     |
|------------------------------------------|-------------------------------------------|-----------------------------|
| scheduler-plugins coscheduling PodGroup  | label `scheduling.x-k8s.io/pod-group`     | PodGroup `spec.minMember`   |
| Kubernetes 1.35 Workload API (alpha)     | `spec.workloadRef.name` (+ `podGroup`)    | the gang policy's `minCount`|

A minimum of 0 (unknown) means every member the snapshot shows. Members already bound count towards the minimum.

`plan_all_or_nothing(plan_pods, snapshot, config, pods)` wraps a pod-by-pod planner: it plans, drops every gang that
fell short and plans again (until no gang falls short), so the capacity those gangs could not use goes to the other
pods in the same pass. A gang may have fallen short only because another short gang took its capacity (a gang larger
than the pool, ahead of it in the queue, would otherwise block every gang after it for ever), so each dropped gang
is then offered again on its own, in scheduling order, and kept when it fits whole. Without gangs it is one call, as
before; with k gangs left out, k + 2 calls at most.

A plan can still lose capacity after it was made: the edge cuts it to what it can carry out (new nodes the pool cannot
equip: dds/planner/equip.py). `whole_gangs_after_cut(plan, cut, replan, snapshot, pods)` re-checks the gangs the plan
served whole after such a cut: every gang the cut left short is dropped — planned again without it, then cut again, so
none of its attaches or new nodes survive — and its members are told what it lacks (the cut's own words).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Generic, Mapping, Optional, Protocol, Sequence, TypeVar

from dds.model.plan import PlannerConfig, PodDecision, ScaleUpPlan, Verdict
from dds.planner.memos import PlannerMemos
from dds.planner.requests import RequestCache, scheduling_order
from dds.model.snapshot import POD_GROUP_LABEL, PodInfo, Snapshot

# The refusal (Event reason) of a member of a gang left out: its whole minimum does not get capacity in this plan.
GANG_INCOMPLETE = "GangDoesNotFit"
# The refusal when the gang's minimum asks for more GPUs than the cluster has in all (every node's GPUs and every
# pool's free devices): no attach and no new node can ever make it fit, so it is said even where new nodes are CA's.
GANG_LARGER_THAN_CLUSTER = "GangLargerThanGpus"

PlanPods = Callable[[Snapshot, PlannerConfig, Optional[Sequence[PodInfo]]], ScaleUpPlan]


def gang_of(pod: PodInfo) -> Optional[str]:
    """The pod's gang as `namespace/name`, or None."""
    name = pod.pod_group or pod.labels.get(POD_GROUP_LABEL)
    return f"{pod.namespace}/{name}" if name else None


@dataclass(frozen=True)
class Gang:
    key: str
    min_member: int  # pods that must run at once
    pending: tuple[str, ...]  # keys of the members being planned, in scheduling order
    bound: int  # members already bound to nodes

    @property
    def needed(self) -> int:
        """Members still to place so the gang reaches its minimum."""
        return max(0, self.min_member - self.bound)


def find_gangs(snapshot: Snapshot, pending: Sequence[PodInfo]) -> dict[str, Gang]:
    """The gangs among `pending`, with their minimum and the members already bound (from the snapshot)."""
    members: dict[str, list[PodInfo]] = {}
    for pod in sorted(pending, key=scheduling_order):
        key = gang_of(pod)
        if key is not None and pod.node_name is None:
            members.setdefault(key, []).append(pod)
    if not members:
        return {}
    bound: dict[str, int] = {}
    declared: dict[str, int] = {}
    for pod in tuple(snapshot.pods) + tuple(pending):
        key = gang_of(pod)
        if key in members:
            declared[key] = max(declared.get(key, 0), pod.pod_group_min_member)
    for pod in snapshot.pods:
        key = gang_of(pod)
        if key in members and pod.node_name is not None:
            bound[key] = bound.get(key, 0) + 1
    return {key: Gang(key, declared[key] or len(pods) + bound.get(key, 0), tuple(p.key for p in pods),
                      bound.get(key, 0))
            for key, pods in members.items()}


_PLACED = (Verdict.FITS_NOW, Verdict.FITS_AFTER_GPUS)


def placed_pods(plan: ScaleUpPlan) -> set[str]:
    """Pods the plan gives capacity: fits now, fits after its attaches, or on one of its new nodes."""
    on_new_nodes = {p for n in plan.new_nodes for p in n.pods}
    return {d.pod for d in plan.decisions if d.verdict in _PLACED or d.pod in on_new_nodes}


def short_gangs(gangs: Mapping[str, Gang], plan: ScaleUpPlan,
                unplaced: frozenset[str] = frozenset()) -> list[tuple[Gang, int]]:
    """The gangs the plan leaves below their minimum, with how many of their members it placed (`unplaced`: pods
    the plan still names but that a cut may have left without capacity)."""
    placed = placed_pods(plan) - unplaced
    out = []
    for gang in gangs.values():
        count = sum(1 for p in gang.pending if p in placed)
        if count < gang.needed:
            out.append((gang, count))
    return out


def plan_all_or_nothing(plan_pods: PlanPods, snapshot: Snapshot, config: PlannerConfig,
                        pods: Optional[Sequence[PodInfo]] = None, *, memos: Optional[PlannerMemos] = None
                        ) -> ScaleUpPlan:
    """`plan_pods` with every gang's minimum planned as one unit (see the module docstring). `memos`: the caller's
    (their lasting requests), a fresh one without it."""
    pending = list(snapshot.pending_pods() if pods is None else pods)
    gangs = find_gangs(snapshot, pending)
    if not gangs:
        return plan_pods(snapshot, config, pods)
    dropped: dict[str, str] = {}
    while True:
        plan = plan_pods(snapshot, config, [p for p in pending if gang_of(p) not in dropped])
        short = short_gangs({k: g for k, g in gangs.items() if k not in dropped}, plan)
        if not short:
            break
        for gang, count in short:
            dropped[gang.key] = _reason(gang, count)
    for key in [k for k in gangs if k in dropped]:  # gangs iterate in scheduling order
        trial = {k: v for k, v in dropped.items() if k != key}
        candidate = plan_pods(snapshot, config, [p for p in pending if gang_of(p) not in trial])
        if not short_gangs({k: g for k, g in gangs.items() if k not in trial}, candidate):
            dropped, plan = trial, candidate
    lasting = memos.requests if memos is not None else None
    return _with_dropped(plan, pending, gangs, dropped, snapshot, RequestCache(lasting))


def _reason(gang: Gang, count: int) -> str:
    running = f", {gang.bound} already running" if gang.bound else ""
    return (f"gang {gang.key} needs {gang.min_member} pod(s) at once{running}; only {count} of the "
            f"{gang.needed} still needed would get capacity, so nothing is attached or added for it (all or nothing)")


def gpus_in_cluster(snapshot: Snapshot) -> int:
    """Every GPU the cluster could ever give pods: those on nodes (attached, attaching, built in, or being detached:
    back in a pool soon) and the pools' free devices. New nodes get theirs from the same pools."""
    on_nodes = 0
    for node in snapshot.nodes:
        if node.being_deleted:
            continue
        visible = max(node.allocatable.get(node.gpu_resource), len(node.devices))
        on_nodes += visible + len(node.detaching) + node.attaching
    return on_nodes + sum(sum(p.free.values()) for p in snapshot.pools)


def gang_gpus(gang: Gang, pending: Sequence[PodInfo], snapshot: Snapshot, cache: RequestCache) -> int:
    """GPUs the gang's members still needed for its minimum ask for (the first ones in scheduling order)."""
    members = {p.key: p for p in pending}
    resources = sorted({g.gpu_resource for g in snapshot.groups} | {n.gpu_resource for n in snapshot.nodes}) or [
        "nvidia.com/gpu"]
    needed = [members[k] for k in gang.pending[:gang.needed] if k in members]
    return sum(max(cache.requests(p).get(r) for r in resources) for p in needed)


def _with_dropped(plan: ScaleUpPlan, pending: Sequence[PodInfo], gangs: Mapping[str, Gang],
                  dropped: Mapping[str, str], snapshot: Snapshot, cache: RequestCache) -> ScaleUpPlan:
    """The plan with a decision for every member of the gangs left out, in the order the pods were given."""
    if not dropped:
        return plan
    by_pod = {d.pod: d for d in plan.decisions}
    total = gpus_in_cluster(snapshot)
    for key, reason in dropped.items():
        need = gang_gpus(gangs[key], pending, snapshot, cache)
        refusal = GANG_INCOMPLETE
        if need > total:
            reason = (f"gang {key} needs {need} GPU(s) for its {gangs[key].needed} pod(s) still to run at once, more "
                      f"than the {total} GPU(s) the cluster has in all (on nodes and free in pools): nothing is "
                      f"attached or added for it")
            refusal = GANG_LARGER_THAN_CLUSTER
        for pod in gangs[key].pending:
            by_pod[pod] = PodDecision(pod, Verdict.UNSCHEDULABLE, reason=reason, refusal=refusal)
    seen: set[str] = set()
    decisions = []
    for pod in sorted(pending, key=scheduling_order):
        if pod.key in by_pod and pod.key not in seen and pod.node_name is None:
            seen.add(pod.key)
            decisions.append(by_pod[pod.key])
    notes = plan.notes + tuple(dropped[k] for k in sorted(dropped))
    return replace(plan, decisions=tuple(decisions), notes=notes)


def gangs_ready(snapshot: Snapshot, plan: ScaleUpPlan) -> dict[str, bool]:
    """Per gang among the pending pods: whether the plan gives its whole minimum capacity. For the edge, e.g. to
    bind or start a gang's attaches only together."""
    gangs = find_gangs(snapshot, snapshot.pending_pods())
    short = {g.key for g, _ in short_gangs(gangs, plan)}
    return {key: key not in short for key in gangs}


class CutTaken(Protocol):
    """What a cut took from a plan (dds/planner/equip.py's Unequipped)."""

    @property
    def pods(self) -> tuple[str, ...]:
        """The pods that may have lost their capacity: a plan names a group's new nodes' pods together, not per node,
        so a pod the cut names counts as unplaced even if its own node was kept (a gang is never served in part)."""

    @property
    def message(self) -> str:
        """What was taken and why, for people."""


Taken = TypeVar("Taken", bound=CutTaken)


@dataclass(frozen=True)
class AfterCut(Generic[Taken]):
    """A plan after a cut, with every gang served whole or not at all."""

    plan: ScaleUpPlan  # cut, without the gangs the cut left short; their members' decisions say why
    taken: Optional[Taken]  # what the last cut took from the plan it was given (None: nothing)
    dropped: Mapping[str, str]  # gang -> why it gets nothing, for the gangs this check left out

    @property
    def gangs_dropped(self) -> bool:
        return bool(self.dropped)


def whole_gangs_after_cut(plan: ScaleUpPlan, cut: Callable[[ScaleUpPlan], tuple[ScaleUpPlan, Optional[Taken]]],
                          replan: Callable[[Sequence[PodInfo]], ScaleUpPlan], snapshot: Snapshot,
                          pods: Sequence[PodInfo], describe: Callable[[Taken], str] = lambda t: t.message, *,
                          memos: Optional[PlannerMemos] = None) -> AfterCut[Taken]:
    """`cut(plan)` with the all-or-nothing rule kept: a gang `plan` served whole that the cut leaves short is dropped.

    `cut` returns the plan it leaves and what it took (None when it took nothing); `replan(pods)` plans `pods` as the
    plan was planned. Both are pure. With a gang dropped, the rest is planned again without it and cut again — the cut
    may take less, or more, from the new plan — until no gang the plans served whole falls short; each round drops at
    least one gang, so there are at most as many rounds as gangs. Without gangs, or when the cut takes nothing, it is
    `cut(plan)` alone. `memos`: the caller's (their lasting requests), a fresh one without it."""
    cut_plan, taken = cut(plan)
    pending = [p for p in pods if p.node_name is None]
    gangs = find_gangs(snapshot, pending)
    if taken is None or not gangs:
        return AfterCut(cut_plan, taken, {})
    dropped: dict[str, str] = {}
    while True:
        served_whole = set(gangs) - {g.key for g, _ in short_gangs(gangs, plan)}  # the plan's own drops stay its
        unplaced = frozenset(taken.pods) if taken is not None else frozenset()
        short = short_gangs({k: gangs[k] for k in served_whole if k not in dropped}, cut_plan, unplaced)
        if not short:
            break
        lacking = describe(taken) if taken is not None else "the plan was cut"
        for gang, count in short:
            dropped[gang.key] = _cut_reason(gang, count, lacking)
        plan = replan([p for p in pending if gang_of(p) not in dropped])
        cut_plan, taken = cut(plan)
    return AfterCut(_with_dropped(cut_plan, pending, gangs, dropped, snapshot,
                                  RequestCache(memos.requests if memos is not None else None)), taken, dropped)


def _cut_reason(gang: Gang, count: int, lacking: str) -> str:
    running = f", {gang.bound} already running" if gang.bound else ""
    served = f"at most {count}" if count else "none"
    return (f"gang {gang.key} needs {gang.min_member} pod(s) at once{running}, but {served} of the {gang.needed} "
            f"still needed would get capacity: {lacking}; so nothing is attached or added for it (all or nothing)")
