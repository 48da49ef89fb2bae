"""Placing pods on SimNodes: nodes that are on their way, new nodes this plan adds, and (in the reference planner)
every live node rebuilt from scratch.

`first_fit_on` is the literal "attach GPUs one at a time and re-simulate" rule for one node: k = 0, 1, 2, ... up to
the node's free slots, for each GPU model the pod may get there, stopping at the first k where every filter passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import numpy as np

from dds.model.groups import NodeGroupSpec
from dds.model.resources import CPU, MEMORY, PODS
from dds.planner.filters import FILTERS, ClusterView, first_reject
from dds.planner.nodes import SimNode, group_allowed, template_node
from dds.model.plan import PlannerConfig, Reject
from dds.planner.requests import PodRequest
from dds.planner.scoring import Candidates, rank
from dds.model.snapshot import Snapshot

PoolFree = dict[tuple[str, str], int]  # (pool, model) -> free devices left in this plan


@dataclass(frozen=True)
class SimChoice:
    node: int  # index in the list the caller passed
    attach: int
    model: Optional[str]
    score: float


def model_order(node: SimNode) -> tuple[Optional[str], ...]:
    """Models to try on a node without one: its group's default first, then the others in name order."""
    if node.model is not None:
        return (node.model,)
    if not node.allowed_models:
        return (None,)
    return (node.allowed_models[0],) + tuple(sorted(node.allowed_models[1:]))


def first_fit_on(req: PodRequest, node: SimNode, cluster: ClusterView, pool_free: Optional[PoolFree],
                 allow_attach: bool) -> Optional[tuple[int, Optional[str]]]:
    """(GPUs to attach, model) for the first k at which the pod fits `node`, or None. pool_free None = the pool is not
    a limit (new nodes: their GPUs come with the node)."""
    wants_gpus = req.gpus(node.gpu_resource) > 0
    if not _could_fit(req, node, allow_attach):
        return None
    # k = 0: as the node is (a node of a group that has GPUs but no model yet can still take any allowed model).
    now_models = model_order(node) if (wants_gpus and node.model is None and node.gpus > 0 and node.virtual) \
        else (None,)
    for model in now_models:
        if first_reject(FILTERS, req, node.with_model(model), cluster) is None:
            return 0, model
    if not (allow_attach and wants_gpus and node.attachable and node.free_slots > 0):
        return None
    gpu, present = node.gpu_resource, node.gpus
    for model in model_order(node):
        for k in range(1, node.free_slots + 1):
            if pool_free is not None and pool_free.get((node.pool or "", model or ""), 0) < k:
                break
            node.allocatable[gpu] = present + k  # one more virtual GPU, then re-simulate
            try:
                verdict = first_reject(FILTERS, req, node.with_model(model), cluster)
            finally:
                node.allocatable[gpu] = present
            if verdict is None:
                return k, model
            if verdict.resource != gpu:
                break  # something other than GPUs is missing: more GPUs cannot help
    return None


def _could_fit(req: PodRequest, node: SimNode, allow_attach: bool) -> bool:
    """A cheap necessary condition (no labels, no other pods): resources other than GPUs never grow, and GPUs grow at
    most to the node's slots. Most full nodes of a large plan fail here, before the filter chain."""
    r = req.requests
    if node.free(PODS) < 1 or node.free(CPU) < r.milli_cpu or node.free(MEMORY) < r.memory:
        return False
    gpus = req.gpus(node.gpu_resource)
    headroom = node.free(node.gpu_resource) + (node.free_slots if allow_attach and node.attachable else 0)
    return gpus <= headroom


def candidates_for(req: PodRequest, nodes: Sequence[SimNode], picks: Sequence[tuple[int, int]],
                   order: Sequence[int]) -> Candidates:
    """Scoring inputs for (node index, GPUs attached) picks, measured as the fast planner measures them."""
    def arr(values) -> np.ndarray:
        return np.array(list(values), dtype=np.int64)

    chosen = [nodes[i] for i, _ in picks]
    attach = arr(k for _, k in picks)
    gpus = arr(req.gpus(n.gpu_resource) for n in chosen)
    present = arr(n.gpus for n in chosen)
    free_gpus = arr(n.free(n.gpu_resource) for n in chosen)
    return Candidates(
        order=arr(order), attach=attach,
        cpu_used=arr(n.capacity(CPU) - n.free(CPU) + req.requests.milli_cpu for n in chosen),
        cpu_capacity=arr(n.capacity(CPU) for n in chosen),
        memory_used=arr(n.capacity(MEMORY) - n.free(MEMORY) + req.requests.memory for n in chosen),
        memory_capacity=arr(n.capacity(MEMORY) for n in chosen),
        gpu_request=gpus, gpu_free_before=free_gpus + attach, gpu_used=present - free_gpus + gpus,
        gpu_present=present + attach, gpu_slots=arr(n.gpu_slots for n in chosen),
        has_model=np.array([n.model is not None for n in chosen], dtype=bool))


def best_on(req: PodRequest, nodes: Sequence[SimNode], cluster: ClusterView, pool_free: Optional[PoolFree],
            allow_attach: bool, policy: str, order: Optional[Sequence[int]] = None) -> Optional[SimChoice]:
    fits: list[tuple[int, int, Optional[str]]] = []
    for i, node in enumerate(nodes):
        found = first_fit_on(req, node, cluster, pool_free, allow_attach)
        if found is not None:
            fits.append((i, found[0], found[1]))
    if not fits:
        return None
    positions = [i for i, _, _ in fits] if order is None else [order[i] for i, _, _ in fits]
    ranked, score = rank(policy, candidates_for(req, nodes, [(i, k) for i, k, _ in fits], positions))
    best = int(ranked[0])
    i, k, model = fits[best]
    return SimChoice(i, k, model, float(score[best]))


def commit_on(node: SimNode, req: PodRequest, attach: int, model: Optional[str]) -> None:
    node.attach(attach, model)
    if req.gpus(node.gpu_resource) and model is not None and node.model is None:
        node.model, node.allowed_models, node.new_model = model, (model,), True
    node.add_pod(req)


# --- nodes on their way -------------------------------------------------------------------------------------------

def upcoming_nodes(snapshot: Snapshot) -> list[SimNode]:
    """Nodes a previous scale-up asked for, as CA sees them: the group's template with every GPU slot filled (the
    GPUs beyond the initial ones are attached once the node is up, from the pods then waiting for it)."""
    out: list[SimNode] = []
    for group_id, count in sorted(snapshot.upcoming_nodes.items()):
        group = snapshot.group(group_id)
        if group is None:
            continue
        for j in range(max(0, int(count))):
            node = template_node(group, f"upcoming:{group.id}#{j + 1}", group.max_gpus_per_node, 0, snapshot)
            node.virtual = True
            out.append(node)
    return out


# --- new nodes ----------------------------------------------------------------------------------------------------

@dataclass
class NewNodeResult:
    group: Optional[str]  # the group taking the pod (or that would, when new nodes are not allowed)
    node: Optional[SimNode]  # the virtual node it lands on (None when no node is opened)
    attach: int = 0
    model: Optional[str] = None
    score: Optional[float] = None
    opened: bool = False
    blocked: str = ""  # why no node is added although a group would fit (new nodes not allowed, group at max)
    rejects: tuple[Reject, ...] = ()


@dataclass
class OpenedGroup:
    group: NodeGroupSpec
    nodes: list[SimNode] = field(default_factory=list)


class NewNodePlanner:
    """Pods no live node can take go to new nodes: first to a node this plan already adds, else to a new node of the
    group whose template (at max GPUs) the pod fits best."""

    def __init__(self, snapshot: Snapshot, config: PlannerConfig, cluster: ClusterView, pool_free: PoolFree) -> None:
        self.snapshot = snapshot
        self.config = config
        self.cluster = cluster
        self.pool_free = pool_free
        self.groups = tuple(sorted(snapshot.groups, key=lambda g: g.id))
        self.opened: dict[str, OpenedGroup] = {}
        self.pool_shortfall: dict[tuple[str, str], int] = {}
        live = {}
        for node in snapshot.nodes:
            if node.group_id:
                live[node.group_id] = live.get(node.group_id, 0) + 1
        self.live = live

    def room(self, group: NodeGroupSpec) -> int:
        """Nodes the group may still add: max size - max(replicas, live nodes) - nodes on their way - added here."""
        size = max(group.replicas, self.live.get(group.id, 0))
        planned = len(self.opened[group.id].nodes) if group.id in self.opened else 0
        return max(0, group.max_size - size - int(self.snapshot.upcoming_nodes.get(group.id, 0)) - planned)

    def place(self, req: PodRequest) -> NewNodeResult:
        nodes = [n for g in self.opened.values() for n in g.nodes]
        found = best_on(req, nodes, self.cluster, None, True, self.config.policy)
        if found is not None:
            node = nodes[found.node]
            self._commit(node, req, found.attach, found.model)
            return NewNodeResult(node.group.id if node.group else None, node, found.attach, found.model, found.score)
        return self._open(req)

    def _open(self, req: PodRequest) -> NewNodeResult:
        rejects: list[Reject] = []
        fitting: list[tuple[NodeGroupSpec, SimNode]] = []
        for group in self.groups:
            target = f"group:{group.id}"
            if not group_allowed(self.config.groups, group.id):
                rejects.append(Reject(target, "group not part of this pass"))
                continue
            # Does the pod fit the group's node at all (its template at max GPUs, as CA simulates it)?
            full = template_node(group, f"new:{group.id}", group.max_gpus_per_node, 0, self.snapshot)
            full.virtual = True
            if first_fit_on(req, full, self.cluster, None, False) is None:
                probe = full.with_model(full.allowed_models[0] if full.allowed_models else None)
                rejects.append(_retarget(first_reject(FILTERS, req, probe, self.cluster), target)
                               or Reject(target, "no GPU model the pod accepts"))
                continue
            fitting.append((group, template_node(group, f"new:{group.id}#{self._next_index(group)}",
                                                 group.initial_gpus, group.max_gpus_per_node - group.initial_gpus,
                                                 self.snapshot)))
        if not fitting:
            return NewNodeResult(None, None, rejects=tuple(rejects))
        blocked: list[str] = []
        open_now = []
        for group, node in fitting:
            node.virtual = True
            if not self.config.allow_new_nodes:
                blocked.append(f"new nodes are not allowed in this pass ({group.id} would fit)")
            elif self.room(group) <= 0:
                blocked.append(f"group {group.id} is at its max size {group.max_size}")
                rejects.append(Reject(f"group:{group.id}", "group at max size", resource="nodes", requested=1,
                                      free=0, capacity=group.max_size))
            else:
                open_now.append((group, node))
        if not open_now:
            return NewNodeResult(fitting[0][0].id, None, blocked="; ".join(blocked), rejects=tuple(rejects))
        # The tightest template wins (least waste), then the group id: best-fit over the candidate templates.
        order = [self.groups.index(g) for g, _ in open_now]
        found = best_on(req, [n for _, n in open_now], self.cluster, None, True, "best-fit", order)
        if found is None:
            # Unreachable in practice (each template took the pod at max GPUs, so attaching up to max fits too), but
            # a pod is never promised a node the simulation did not place it on.
            return NewNodeResult(None, None, rejects=tuple(rejects))
        group, node = open_now[found.node]
        self.opened.setdefault(group.id, OpenedGroup(group)).nodes.append(node)
        self._take_initial(node, group)
        self._commit(node, req, found.attach, found.model)
        return NewNodeResult(group.id, node, found.attach, found.model, found.score, opened=True,
                             rejects=tuple(rejects))

    def _next_index(self, group: NodeGroupSpec) -> int:
        return (len(self.opened[group.id].nodes) if group.id in self.opened else 0) + 1

    def _take_initial(self, node: SimNode, group: NodeGroupSpec) -> None:
        if group.initial_gpus and group.default_gpu_model:
            self._take(node.pool or "", group.default_gpu_model, group.initial_gpus)

    def _commit(self, node: SimNode, req: PodRequest, attach: int, model: Optional[str]) -> None:
        commit_on(node, req, attach, model)
        if attach and model is not None:
            self._take(node.pool or "", model, attach)

    def _take(self, pool: str, model: str, count: int) -> None:
        """New nodes' GPUs come from their pool too: count them, so attaches never double-book, and remember what the
        pool cannot cover (the node's GPUs then wait for devices to free up)."""
        have = self.pool_free.get((pool, model), 0)
        taken = min(have, count)
        self.pool_free[(pool, model)] = have - taken
        if count > taken:
            self.pool_shortfall[(pool, model)] = self.pool_shortfall.get((pool, model), 0) + count - taken


def _retarget(reject: Optional[Reject], target: str) -> Optional[Reject]:
    return None if reject is None else replace(reject, target=target)
