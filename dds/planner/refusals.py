"""Why DDS cannot help a pending pod, in a user's words: the kinds of "no" that no attach and no new node can fix.

The scheduling simulation says *that* a pod fits nowhere, listing every node and group it rejected. A user wants the
one sentence behind it — the GPU model no pool holds, more GPUs than a node can take, an empty pool — which is what
`cannot_serve` finds from the node groups and pools alone. The controller puts it in an Event on the pod (once per pod
and reason) and `dds plan` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from dataclasses import replace

from dds.model.groups import ANN_GPU_API, DEFAULT_GPU_RESOURCE, NodeGroupSpec, is_dra_gpu_resource
from dds.planner.nodes import group_slots
from dds.model.plan import PodDecision, ScaleUpPlan, Verdict
from dds.planner.requests import effective_requests
from dds.model.snapshot import PodInfo, PoolInfo, Snapshot

NO_SUCH_MODEL = "NoMatchingGPU"
TOO_MANY_GPUS = "TooManyGPUs"
POOL_EMPTY = "NoFreeGPU"
FITS_NOWHERE = "FitsNowhere"  # the simulation's own verdict, when none of the above says it better
UNSUPPORTED = "UnsupportedConstraint"
NO_MATCHING_DEVICE = "NoMatchingDevice"  # a ResourceClaim no GPU DDS can attach satisfies (dds/planner/dra.py)
# A ResourceClaim asking for what DDS does not plan: adminAccess, partitions of a GPU, shares of a device's capacity,
# firstAvailable, constraints (dds/planner/dra.py): never planned as a request for whole GPUs.
CLAIM_NOT_PLANNED = "ClaimNotPlanned"
# A claim whose selectors this pass had no CEL budget left to evaluate (cel_evaluations_per_pass): judged next pass.
SELECTOR_BUDGET_SPENT = "SelectorBudgetSpent"
NO_GROUP_FOR_API = "NoNodeGroupForGPUAPI"  # GPUs asked through an API (extended resource, claims) no group exposes


@dataclass(frozen=True)
class CannotServe:
    reason: str  # the Event reason: one of the constants above
    message: str


def cannot_serve(pod: PodInfo, snapshot: Snapshot, *, pool_checked: bool = True) -> Optional[CannotServe]:
    """The reason no DDS node group can give `pod` its GPUs now, or None when it is not (only) about GPUs.

    `pool_checked=False` leaves out "the pool is empty": that one is only true when the simulation found no GPU for
    the pod on any node (a pod may fit on GPUs already attached or on their way although the pool is empty)."""
    groups = [g for g in snapshot.groups if g.max_gpus_per_node > 0]
    wrong_api = _api_unserved(pod, groups)
    if wrong_api is not None:
        return wrong_api
    wanted = _gpus_wanted(pod, groups)
    if wanted == 0:
        return None
    if not groups:
        return CannotServe(NO_SUCH_MODEL, f"asks for {_gpus(wanted)} but no DDS node group offers GPUs")
    asked = effective_requests(pod)
    groups = [g for g in groups if asked.get(g.gpu_resource) > 0]  # the groups of the pod's GPU API
    models = selected_models(pod, snapshot.gpu_model_label)
    if models:
        serving = [g for g in groups if set(_group_models(g, snapshot)) & models]
        if not serving:
            return CannotServe(NO_SUCH_MODEL, _no_such_model(models, groups, snapshot))
        groups = serving
    most = max(_slots(g, snapshot) for g in groups)
    if wanted > most:
        biggest = max(groups, key=lambda g: _slots(g, snapshot))
        return CannotServe(TOO_MANY_GPUS, f"needs {_gpus(wanted)} on one node, but a node holds at most {most} "
                                          f"({biggest.id}: max-gpus-per-node {biggest.max_gpus_per_node})")
    if pool_checked:
        return _pool_empty(groups, models, snapshot)
    return None


def with_refusals(plan: ScaleUpPlan, snapshot: Snapshot) -> ScaleUpPlan:
    """The plan with each pod DDS cannot help explained: the user's-words reason first, the simulation's after it."""
    pods = {p.key: p for p in snapshot.pending_pods()}
    decisions = tuple(_explained(d, pods.get(d.pod), snapshot) for d in plan.decisions)
    return replace(plan, decisions=decisions) if decisions != plan.decisions else plan


def _explained(decision: PodDecision, pod: Optional[PodInfo], snapshot: Snapshot) -> PodDecision:
    if decision.refusal is not None:
        return decision  # already explained where it was decided (a gang left out: dds/planner/gangs.py)
    if pod is not None and pod.dra_refusal and decision.verdict in (Verdict.UNSCHEDULABLE, Verdict.UNSUPPORTED):
        return replace(decision, refusal=pod.dra_refusal_reason or NO_MATCHING_DEVICE, reason=pod.dra_refusal)
    if decision.verdict == Verdict.UNSUPPORTED:
        return replace(decision, refusal=UNSUPPORTED)
    if decision.verdict != Verdict.UNSCHEDULABLE or pod is None:
        return decision
    found = cannot_serve(pod, snapshot)
    if found is None:
        return replace(decision, refusal=FITS_NOWHERE)
    return replace(decision, refusal=found.reason, reason=f"{found.message} (simulation: {decision.reason})")


def selected_models(pod: PodInfo, model_label: str) -> frozenset[str]:
    """The GPU models the pod accepts through `model_label` (nodeSelector, or an `In` requirement present in every
    required node-affinity term); empty = any model."""
    if model_label in pod.node_selector:
        return frozenset({pod.node_selector[model_label]})
    per_term = [frozenset(v for r in term.match_expressions if r.key == model_label and r.operator == "In"
                          for v in r.values)
                for term in pod.required_node_affinity]
    if per_term and all(per_term):
        return frozenset().union(*per_term)
    return frozenset()


def _api_unserved(pod: PodInfo, groups: Sequence[NodeGroupSpec]) -> Optional[CannotServe]:
    """A pod asking for GPUs through an API (the extended resource, ResourceClaims) that no group with GPUs exposes
    them by: every group's GPUs go through exactly one (dds.cdi.dev/gpu-api), so no node can serve it."""
    requests = effective_requests(pod)
    dra_groups = [g.id for g in groups if g.gpu_api.dra]
    extended = {g.gpu_resource for g in groups if not g.gpu_api.dra}
    # Each DRA driver's GPUs are counted in a resource of their own (dds.cdi.dev/<driver>): any of them is a claim.
    by_claims = any(is_dra_gpu_resource(name) and count > 0 for name, count in requests.scalar.items())
    by_resource = sorted(r for r in extended | {DEFAULT_GPU_RESOURCE} if requests.get(r) > 0)
    if by_claims and by_resource:
        return CannotServe(NO_GROUP_FOR_API, f"asks for GPUs both as {by_resource[0]} and through ResourceClaims, but "
                                             f"a node group exposes its GPUs through one of the two only "
                                             f"({ANN_GPU_API})")
    if by_claims and not dra_groups and groups:
        return CannotServe(NO_GROUP_FOR_API, f"asks for GPUs through ResourceClaims, but every DDS node group exposes "
                                             f"its GPUs as an extended resource; DRA groups are annotated "
                                             f"{ANN_GPU_API}: dra-node-local or dra-pool")
    unserved = [r for r in by_resource if r not in extended]
    if unserved and dra_groups:
        return CannotServe(NO_GROUP_FOR_API, f"asks for {unserved[0]}, but no DDS node group exposes its GPUs as "
                                             f"{unserved[0]}: {', '.join(sorted(dra_groups))} take(s) them through "
                                             f"ResourceClaims only ({ANN_GPU_API})")
    return None


def _gpus_wanted(pod: PodInfo, groups: Sequence[NodeGroupSpec]) -> int:
    requests = effective_requests(pod)
    resources = {g.gpu_resource for g in groups} or {"nvidia.com/gpu"}
    return max(requests.get(name) for name in resources)


def _group_models(group: NodeGroupSpec, snapshot: Snapshot) -> tuple[str, ...]:
    if group.gpu_models:
        return group.gpu_models
    pool = snapshot.pool(group.fabric_pool)
    return tuple(pool.free) if pool is not None else ()


def _slots(group: NodeGroupSpec, snapshot: Snapshot) -> int:
    return group_slots(group, snapshot.pool(group.fabric_pool))


def _no_such_model(models: frozenset[str], groups: Sequence[NodeGroupSpec], snapshot: Snapshot) -> str:
    asked = " or ".join(sorted(models))
    pools = {p.name: p for p in snapshot.pools}
    held = "; ".join(f"pool {name} holds {', '.join(sorted(pools[name].free)) or 'nothing'}"
                     for name in sorted({g.fabric_pool for g in groups}) if name in pools)
    in_a_pool = any(m in p.free for p in snapshot.pools for m in models)
    if in_a_pool:
        return f"asks for {asked} GPUs, but no DDS node group takes {asked} ({held})"
    return f"asks for {asked} GPUs, but no pool holds {asked} ({held or 'no pools'})"


def _pool_empty(groups: Sequence[NodeGroupSpec], models: frozenset[str], snapshot: Snapshot) -> Optional[CannotServe]:
    pools: list[PoolInfo] = [p for p in (snapshot.pool(n) for n in sorted({g.fabric_pool for g in groups})) if p]
    if not pools:
        return None
    usable = [(p, m) for p in pools for m in p.free if not models or m in models]
    if sum(p.free[m] for p, m in usable) > 0:
        return None
    which = " or ".join(sorted({m for _, m in usable})) or "GPU"
    names = ", ".join(p.name for p in pools)
    return CannotServe(POOL_EMPTY, f"pool {names} has no free {which}: the pod waits until one is released")


def _gpus(count: int) -> str:
    return f"{count} GPU{'s' if count != 1 else ''}"
