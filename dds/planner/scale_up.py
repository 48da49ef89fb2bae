"""Scale-up (the talk's cases 1 and 2): which pending pods fit now, which fit after attaching GPUs, which need nodes.

For the pending pods in scheduling order (priority, age, name):
1. existing capacity: live nodes as they are, then the GPUs already attaching to them (filled tightly, the pods asking
   for most GPUs first: they were ordered for pods still pending), then nodes already on their way;
2. for the rest, GPUs attached one at a time to live DDS nodes, within their free slots and their pool's free devices
   of a model the pod accepts (pool counts are shared by the whole plan), the node chosen by the policy's score;
3. what still does not fit goes to new nodes (a node this plan already adds, else a new node of the best group).
`drive` is shared by the fast planner and the reference planner; only the live-node search differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from dds.planner.existing import ExistingCapacity, Explanation
from dds.planner.nodes import SimNode
from dds.model.plan import Attach, NewNodes, PlannerConfig, PodDecision, ScaleUpPlan, Verdict
from dds.planner.requests import PodRequest, RequestCache, scheduling_order
from dds.model.snapshot import PodInfo, Snapshot
from dds.planner.virtual import NewNodePlanner, NewNodeResult, best_on, commit_on, upcoming_nodes


def gpus_text(count: int, model: Optional[str] = None) -> str:
    kind = f"{model} GPU" if model else "GPU"
    return f"{count} {kind}" if count == 1 else f"{count} {kind}s"


def pending_requests(snapshot: Snapshot, pods: Optional[Sequence[PodInfo]], cache: RequestCache
                     ) -> tuple[list[PodRequest], list[str]]:
    """The pods to plan, in scheduling order, each once; bound pods are skipped with a note."""
    notes: list[str] = []
    chosen: dict[str, PodInfo] = {}
    for pod in (snapshot.pending_pods() if pods is None else pods):
        if pod.node_name is not None:
            notes.append(f"{pod.key} is bound to {pod.node_name}; not planned")
            continue
        chosen.setdefault(pod.key, pod)
    return [cache.get(p) for p in sorted(chosen.values(), key=scheduling_order)], notes


@dataclass
class _AttachStep:
    node: str
    pool: str
    model: str
    count: int = 0
    pods: list[str] = field(default_factory=list)
    score: Optional[float] = None


def drive(snapshot: Snapshot, config: PlannerConfig, reqs: Sequence[PodRequest], existing: ExistingCapacity,
          notes: Sequence[str] = ()) -> ScaleUpPlan:
    """The greedy scale-up plan for `reqs` (in scheduling order) with `existing` as the live-node search."""
    run = _ScaleUp(snapshot, config, existing)
    waiting = run.place_on_existing_capacity(reqs)
    needs_node = run.attach_gpus(waiting)
    run.add_nodes(needs_node)
    return run.plan(reqs, notes)


class _ScaleUp:
    def __init__(self, snapshot: Snapshot, config: PlannerConfig, existing: ExistingCapacity) -> None:
        self.snapshot, self.config, self.existing, self.policy = snapshot, config, existing, config.policy
        self.elsewhere: list[PodInfo] = []  # pods placed on nodes on their way and on new nodes...
        existing.see_elsewhere(self.elsewhere)  # ...which pod affinity's "does any pod match" must see too
        self.decisions: dict[str, PodDecision] = {}
        self.steps: dict[tuple[str, str, str], _AttachStep] = {}
        self.new_nodes = NewNodePlanner(snapshot, config, existing.cluster, {})

    def place_on_existing_capacity(self, reqs: Sequence[PodRequest]) -> list[PodRequest]:
        """1. Live nodes as they are now, then the GPUs already on their way to them, then nodes on their way. Returns
        the pods still waiting, in scheduling order."""
        upcoming = upcoming_nodes(self.snapshot)
        coming = self.existing.gpus_coming()
        deferred: list[PodRequest] = []  # to try on the GPUs on their way, all together
        waiting: list[PodRequest] = []
        for req in reqs:
            if req.unsupported:
                self.decisions[req.key] = PodDecision(req.key, Verdict.UNSUPPORTED, reason=(
                    f"not simulated ({'; '.join(req.unsupported)}): DDS never promises it a fit"))
            elif (choice := self.existing.fits_now(req, coming=False)) is not None:
                # A pod that fits needs no "why not": its rejected options are the candidates that scored lower.
                self.existing.commit(req, choice)
                node = self.existing.node_name(choice)
                self.decisions[req.key] = PodDecision(req.key, Verdict.FITS_NOW, node=node, score=choice.score,
                                                      reason=f"fits now on {node} ({self.policy} {choice.score:.2f})",
                                                      rejected=choice.alternatives)
            elif coming:
                deferred.append(req)
            elif not self._place_on_upcoming_node(req, upcoming):
                waiting.append(req)
        for req in self._place_on_coming_gpus(deferred):
            if not self._place_on_upcoming_node(req, upcoming):
                waiting.append(req)
        return waiting

    def _place_on_coming_gpus(self, reqs: Sequence[PodRequest]) -> list[PodRequest]:
        """GPUs already attaching were ordered by an earlier pass for pods that are still pending, most likely these.
        Re-placing them by the policy's score could spread them over those GPUs so that they no longer fit (and more
        GPUs get ordered); filling them tightly, the pods asking for most GPUs first, keeps the earlier pass's
        arithmetic. Returns the pods that still do not fit, in scheduling order."""
        resources = sorted({n.gpu_resource for n in self.snapshot.nodes})
        placed: set[str] = set()
        # sorted() is stable: scheduling order among pods asking for as many GPUs.
        for req in sorted(reqs, key=lambda r: _gpu_demand(r, resources), reverse=True):
            if not _gpu_demand(req, resources) or (choice := self.existing.fits_on_coming(req)) is None:
                continue
            self.existing.commit(req, choice)
            node = self.existing.node_name(choice)
            placed.add(req.key)
            self.decisions[req.key] = PodDecision(
                req.key, Verdict.FITS_NOW, node=node, score=choice.score, rejected=choice.alternatives,
                reason=f"fits on {node} once the GPUs already attaching there are online (tightest fit; "
                       f"{self.policy} {choice.score:.2f})")
        return [req for req in reqs if req.key not in placed]

    def _place_on_upcoming_node(self, req: PodRequest, upcoming: list[SimNode]) -> bool:
        found = best_on(req, upcoming, self.existing.cluster, None, False, self.policy)
        if found is None:
            return False
        node = upcoming[found.node]
        commit_on(node, req, 0, found.model)
        self.elsewhere.append(req.pod)
        group = node.group.id if node.group else None
        self.decisions[req.key] = PodDecision(
            req.key, Verdict.FITS_NOW, group=group, score=found.score,
            reason=f"fits on a node of {group} already on its way ({node.name}, as its template: "
                   f"{gpus_text(node.gpus)}); no live node fits now",
            rejected=self.existing.explain(req, with_gpus=False).rejects)
        return True

    def attach_gpus(self, waiting: Sequence[PodRequest]) -> list[tuple[PodRequest, Explanation]]:
        """2. GPUs attached to live DDS nodes, one virtual GPU at a time. Returns the pods that need nodes."""
        needs_node: list[tuple[PodRequest, Explanation]] = []
        for req in waiting:
            choice = self.existing.fits_after_gpus(req)
            if choice is None:
                needs_node.append((req, self.existing.explain(req, with_gpus=True)))
                continue
            self.existing.commit(req, choice)
            node, pool, model = self.existing.node_name(choice), self.existing.pool_of(choice) or "", choice.model or ""
            step = self.steps.setdefault((node, pool, model), _AttachStep(node, pool, model, score=choice.score))
            step.count += choice.attach
            step.pods.append(req.key)
            self.decisions[req.key] = PodDecision(
                req.key, Verdict.FITS_AFTER_GPUS, node=node, gpus_added=choice.attach, score=choice.score,
                reason=f"fits on {node} after {gpus_text(choice.attach, choice.model)} "
                       f"({self.policy} {choice.score:.2f})",
                rejected=choice.alternatives)
        return needs_node

    def add_nodes(self, needs_node: Sequence[tuple[PodRequest, Explanation]]) -> None:
        """3. New nodes for the rest (their GPUs counted against what the attaches left in the pools)."""
        self.new_nodes.pool_free = self.existing.pool_free()
        for req, explanation in needs_node:
            result = self.new_nodes.place(req)
            if result.node is not None:
                self.elsewhere.append(req.pod)
            self.decisions[req.key] = _new_node_decision(req, result, explanation, self.policy)

    def plan(self, reqs: Sequence[PodRequest], notes: Sequence[str]) -> ScaleUpPlan:
        attaches = tuple(
            Attach(node=s.node, pool=s.pool, model=s.model, count=s.count, pods=tuple(s.pods), score=s.score,
                   reason=f"{gpus_text(s.count, s.model)} from pool {s.pool} so {_names(s.pods)} "
                          f"fit{'s' if len(s.pods) == 1 else ''} on {s.node}")
            for s in self.steps.values())
        new_nodes = []
        for opened in self.new_nodes.opened.values():
            group = opened.group
            pods = tuple(p.key for n in opened.nodes for p in n.placed)
            extra = tuple(n.gpus - group.initial_gpus for n in opened.nodes)
            gpu_note = f"; GPUs to attach once up: {', '.join(map(str, extra))}" if any(extra) else ""
            new_nodes.append(NewNodes(
                group=group.id, count=len(opened.nodes), pods=pods, gpus_per_node=extra,
                reason=f"{_names(pods)} fit{'s' if len(pods) == 1 else ''} no live node even with GPUs attached; "
                       f"{len(opened.nodes)} new node(s) of {group.id}{gpu_note}"))
        plan_notes = list(notes)
        for (pool, model), missing in sorted(self.new_nodes.pool_shortfall.items()):
            plan_notes.append(f"the new nodes need {gpus_text(missing, model)} more than pool {pool} has free; "
                              f"they are attached when devices free up")
        return ScaleUpPlan(attaches=attaches, new_nodes=tuple(new_nodes),
                           decisions=tuple(self.decisions[r.key] for r in reqs), policy=self.policy, solver="greedy",
                           notes=tuple(plan_notes))


def _gpu_demand(req: PodRequest, resources: Sequence[str]) -> int:
    """The GPUs a pod asks for (under whichever GPU resource name the nodes use)."""
    return max((req.gpus(name) for name in resources), default=0)


def _names(pods: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(pods[:limit])
    return shown if len(pods) <= limit else f"{shown} and {len(pods) - limit} more"


def _new_node_decision(req: PodRequest, result: NewNodeResult, explanation: Explanation, policy: str
                       ) -> PodDecision:
    live = explanation.summary()
    rejected = explanation.rejects + result.rejects
    if result.node is not None:
        after = f", then {gpus_text(result.attach, result.model)} attached once it is up" if result.attach else ""
        where = "a new node" if result.opened else f"new node {result.node.name} of this plan"
        return PodDecision(req.key, Verdict.NEEDS_NODE, group=result.group, gpus_added=result.attach,
                           score=result.score, rejected=rejected,
                           reason=f"needs {where} of {result.group}{after} (live nodes, even with GPUs attached: "
                                  f"{live})")
    if result.group is not None and result.blocked.startswith("new nodes are not allowed"):
        return PodDecision(req.key, Verdict.NEEDS_NODE, group=result.group, rejected=rejected,
                           reason=f"needs a new node of {result.group}, but {result.blocked} (live nodes, even with "
                                  f"GPUs attached: {live})")
    if result.blocked:
        return PodDecision(req.key, Verdict.UNSCHEDULABLE, group=result.group, rejected=rejected,
                           reason=f"fits no live node even with GPUs attached ({live}) and {result.blocked}")
    groups = "; ".join(r.message() for r in result.rejects) or "no node groups"
    return PodDecision(req.key, Verdict.UNSCHEDULABLE, rejected=rejected,
                       reason=f"fits nowhere, not even on a new node at max GPUs (live nodes: {live}; groups: "
                              f"{groups})")
