"""The naive reference planner: for every pod, every node and every virtual GPU, the world is rebuilt from the snapshot
and the decisions so far, and the scalar filters run on it. No arrays, no caches, no shortcuts but one (a node whose
failure is not about GPUs stops adding GPUs: more cannot help).

It exists to be obviously right: tests cross-check the fast planner against it on seeded random snapshots (same pods
placed, never more GPUs), and the benchmark reports how much faster the fast planner is (naive_ratio).
"""

from __future__ import annotations

from collections import Counter
from typing import Optional, Sequence

from dds.planner.existing import MAX_REJECTS, Explanation
from dds.planner.filters import FILTERS, first_reject, term_matches_pod
from dds.planner.gangs import plan_all_or_nothing
from dds.planner.nodes import SimNode, sim_node
from dds.model.plan import PlannerConfig, Reject, ScaleUpPlan
from dds.planner.memos import PlannerMemos
from dds.planner.requests import PodRequest, RequestCache
from dds.planner.scale_up import drive, pending_requests
from dds.planner.scoring import check_policy, rank
from dds.model.snapshot import PodAffinityTerm, PodInfo, Snapshot
from dds.planner.state import Choice
from dds.planner.virtual import candidates_for, commit_on, model_order


class _World:
    """The cluster rebuilt from scratch: live nodes with their bound pods and every decision committed so far.
    `coming[i]`: node i's GPUs on their way that no pod counts on (pods take visible GPUs first)."""

    def __init__(self, nodes: list[SimNode], elsewhere: Sequence[PodInfo], coming: list[int]) -> None:
        self.nodes = nodes
        self.elsewhere = elsewhere
        self.coming = coming

    def any_pod_matches(self, term: PodAffinityTerm, namespace: str) -> bool:
        pods = [p for n in self.nodes for p in n.placed] + list(self.elsewhere)
        return any(term_matches_pod(term, namespace, p) for p in pods)


class NaiveExisting:
    def __init__(self, snapshot: Snapshot, config: PlannerConfig, cache: RequestCache) -> None:
        self.snapshot, self.config, self.cache = snapshot, config, cache
        self.names = sorted(n.name for n in snapshot.nodes)
        self.committed: list[tuple[PodRequest, int, int, Optional[str]]] = []
        self.elsewhere: list[PodInfo] = []
        self.cluster = self

    def see_elsewhere(self, pods: list[PodInfo]) -> None:
        self.elsewhere = pods

    def any_pod_matches(self, term: PodAffinityTerm, namespace: str) -> bool:
        return self._world().any_pod_matches(term, namespace)

    def _world(self) -> _World:
        by_name = {n.name: n for n in self.snapshot.nodes}
        nodes = [sim_node(by_name[name], self.snapshot, self.config.groups) for name in self.names]
        index = {name: i for i, name in enumerate(self.names)}
        for pod in self.snapshot.pods:
            if pod.node_name in index:
                nodes[index[pod.node_name]].add_pod(self.cache.get(pod))
        coming = [min(max(0, by_name[name].attaching), max(0, node.free(node.gpu_resource)))
                  for name, node in zip(self.names, nodes)]
        for req, i, attach, model in self.committed:
            commit_on(nodes[i], req, attach, model)
            coming[i] = min(coming[i], max(0, nodes[i].free(nodes[i].gpu_resource)))
        return _World(nodes, self.elsewhere, coming)

    def pool_free(self) -> dict[tuple[str, str], int]:
        free = {(p.name, m): max(0, int(c)) for p in self.snapshot.pools for m, c in p.free.items()}
        world = self._world()
        for _, i, attach, model in self.committed:
            key = (world.nodes[i].pool or "", model or "")
            if attach and key in free:
                free[key] -= attach
        return free

    def _choose(self, req: PodRequest, fits: list[tuple[int, int, Optional[str]]], world: _World,
                tightest: bool = False) -> Choice:
        ranked, score = rank(self.config.policy, candidates_for(req, world.nodes, [(i, k) for i, k, _ in fits],
                                                                [i for i, _, _ in fits]))
        best = int(ranked[0])
        if tightest:  # fewest free GPUs left after placement first; the policy's order among equals
            left = {p: world.nodes[fits[p][0]].free(world.nodes[fits[p][0]].gpu_resource)
                    - req.gpus(world.nodes[fits[p][0]].gpu_resource) for p in range(len(fits))}
            best = min((int(p) for p in ranked), key=lambda p: left[p])  # min keeps the first of equals
        i, attach, model = fits[best]
        return Choice(node=i, attach=attach, model=model, score=float(score[best]))

    def fits_now(self, req: PodRequest, coming: bool = True) -> Optional[Choice]:
        world = self._world()
        fits = [(i, 0, None) for i, node in enumerate(world.nodes)
                if self._fits_as_is(req, world, i, hide=0 if coming else world.coming[i])]
        return self._choose(req, fits, world) if fits else None

    def gpus_coming(self) -> bool:
        return any(self._world().coming)

    def fits_on_coming(self, req: PodRequest) -> Optional[Choice]:
        world = self._world()
        fits = [(i, 0, None) for i in range(len(world.nodes)) if self._fits_as_is(req, world, i, hide=0)]
        return self._choose(req, fits, world, tightest=True) if fits else None

    @staticmethod
    def _fits_as_is(req: PodRequest, world: _World, i: int, hide: int) -> bool:
        """The filters' verdict on node i with `hide` of its GPUs taken away (those still on their way)."""
        node = world.nodes[i]
        node.allocatable[node.gpu_resource] = node.gpus - hide
        try:
            return first_reject(FILTERS, req, node.with_model(None), world) is None
        finally:
            node.allocatable[node.gpu_resource] = node.gpus + hide

    def fits_after_gpus(self, req: PodRequest) -> Optional[Choice]:
        base = self._world()
        pool = self.pool_free()
        fits: list[tuple[int, int, Optional[str]]] = []
        for i, node in enumerate(base.nodes):
            if not (node.attachable and node.free_slots > 0 and req.gpus(node.gpu_resource) > 0):
                continue
            found = self._first_k(req, i, node, pool)
            if found is not None:
                fits.append((i, found[0], found[1]))
        return self._choose(req, fits, base) if fits else None

    def _first_k(self, req: PodRequest, i: int, node: SimNode, pool: dict[tuple[str, str], int]
                 ) -> Optional[tuple[int, Optional[str]]]:
        for model in model_order(node):
            for k in range(1, node.free_slots + 1):
                if pool.get((node.pool or "", model or ""), 0) < k:
                    break
                world = self._world()  # from scratch, for this one virtual GPU count
                fresh = world.nodes[i]
                fresh.attach(k, model)
                verdict = first_reject(FILTERS, req, fresh.with_model(model), world)
                if verdict is None:
                    return k, model
                if verdict.resource != fresh.gpu_resource:
                    break
        return None

    def commit(self, req: PodRequest, choice: Choice) -> None:
        self.committed.append((req, choice.node, choice.attach, choice.model))

    def node_name(self, choice: Choice) -> str:
        return self.names[choice.node]

    def pool_of(self, choice: Choice) -> Optional[str]:
        return self._world().nodes[choice.node].pool

    def explain(self, req: PodRequest, with_gpus: bool) -> Explanation:
        world = self._world()
        rejects: list[Reject] = []
        for node in world.nodes:
            found = first_reject(FILTERS, req, node.with_model(None), world)
            if found is None:
                continue
            if with_gpus and found.resource == node.gpu_resource and node.attachable:
                shortfall = req.gpus(node.gpu_resource) - node.free(node.gpu_resource)
                found = Reject(node.name, "gpu-slots-full" if shortfall > node.free_slots else "pool-exhausted")
            rejects.append(found)
        counts = Counter(r.reason for r in rejects)
        return Explanation(nodes=len(world.nodes), rejects=tuple(rejects[:MAX_REJECTS]),
                           counts=tuple(sorted(counts.items(), key=lambda item: (-item[1], item[0]))))


def plan_scale_up_reference(snapshot: Snapshot, config: PlannerConfig, pods: Optional[Sequence[PodInfo]] = None, *,
                            memos: Optional[PlannerMemos] = None) -> ScaleUpPlan:
    """The greedy scale-up plan, computed naively (no batch solver); gangs as in `plan_scale_up`. `memos`: the
    caller's (their lasting requests), a fresh one without it."""
    check_policy(config.policy)
    memos = memos if memos is not None else PlannerMemos()  # one for every plan of this call (gangs plan again)

    def plan_pods(snapshot: Snapshot, config: PlannerConfig, pods: Optional[Sequence[PodInfo]]) -> ScaleUpPlan:
        return _plan_pods(snapshot, config, pods, memos)

    return plan_all_or_nothing(plan_pods, snapshot, config, pods, memos=memos)


def _plan_pods(snapshot: Snapshot, config: PlannerConfig, pods: Optional[Sequence[PodInfo]],
               memos: PlannerMemos) -> ScaleUpPlan:
    cache = RequestCache(memos.requests)
    reqs, notes = pending_requests(snapshot, pods, cache)
    return drive(snapshot, config, reqs, NaiveExisting(snapshot, config, cache), notes)
