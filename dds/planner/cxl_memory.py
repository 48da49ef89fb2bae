"""CXL memory, the second device type: planned like GPUs, chunk by chunk (docs/cxl-memory.md).

Scale-up: the GPU plan first. For each pod it leaves needing a node (or fitting nowhere), in scheduling order, the
live nodes of groups that take CXL memory are tried: chunks are attached to a node in simulation and the whole
scheduling check (the GPU planner, so GPUs are attached as well when the pod needs both) is run again. Attaching
memory changes only the node's memory, and the memory check is monotone in it, so the first chunk count at which the
pod could fit is the node's memory shortfall (after its bound pods and the pods this plan already puts there) in
chunks: it is computed, then *verified* by the re-run, exactly as dds/planner/existing.py does for GPUs. The node
needing the fewest chunks that the re-run confirms is taken; no pod the plan served before may lose its place. A pod no
live node takes even with every free chunk attached keeps its node (or unschedulable) verdict, with the memory options
that were rejected and why.

Scale-down: a node's chunks its pods' *requests* do not need (usage never counts: a pod may grow to its request at any
time) are detached once the node has had them for the group's idle cooldown (`gpu-idle-cooldown`), newest first.
Memory that requests need is never detached.

Pure: no I/O, no clock (Snapshot.now).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from dds.model.cxl import chunks_text, memory_text
from dds.model.groups import NodeGroupSpec
from dds.model.plan import (DEVICE_CXL_MEMORY, Detach, MemoryAttach, PlannerConfig, PodDecision, Reject, ScaleDownPlan, ScaleUpPlan,
                            Verdict)
from dds.model.resources import MEMORY, Resources
from dds.model.snapshot import NodeInfo, PodInfo, Snapshot
from dds.planner.requests import effective_requests, scheduling_order

# Live nodes verified by a re-run of the scheduling check per waiting pod (the fewest chunks first): each re-run is a
# whole plan, so the search is bounded; the pod's decision says when candidates were left untried.
MAX_VERIFIED_NODES = 4
_SERVED = (Verdict.FITS_NOW, Verdict.FITS_AFTER_GPUS, Verdict.FITS_AFTER_MEMORY)
_WAITING = (Verdict.NEEDS_NODE, Verdict.UNSCHEDULABLE)

PlanGpus = Callable[[Snapshot], ScaleUpPlan]


def takes_cxl_memory(snapshot: Snapshot) -> bool:
    """Whether any group of the snapshot takes CXL memory: the memory pass costs nothing otherwise."""
    return any(g.max_cxl_chunks for g in snapshot.groups)


def with_cxl_chunks(snapshot: Snapshot, grants: dict[str, int]) -> Snapshot:
    """The snapshot as the scheduling check sees it once the chunks on their way and `grants` (node -> chunks) are
    attached: each node's memory grows by them."""
    nodes = []
    changed = False
    for node in snapshot.nodes:
        group = snapshot.group(node.group_id) if node.group_id else None
        chunks = node.cxl_attaching + grants.get(node.name, 0)
        if group is None or not chunks or not group.cxl_memory_chunk:
            nodes.append(node)
            continue
        a = node.allocatable
        grown = Resources(a.milli_cpu, a.memory + chunks * group.cxl_memory_chunk, a.ephemeral_storage, a.pods,
                          a.scalar)
        nodes.append(replace(node, allocatable=grown))
        changed = True
    return replace(snapshot, nodes=tuple(nodes)) if changed else snapshot


@dataclass(frozen=True)
class _Candidate:
    node: NodeInfo
    group: NodeGroupSpec
    chunks: int  # the pod's memory shortfall on the node, in chunks (0: memory is not what it lacks there)
    free_chunks: int  # chunks the node can still take


class _MemoryPass:
    def __init__(self, snapshot: Snapshot, config: PlannerConfig, plan_gpus: PlanGpus) -> None:
        self.snapshot, self.config, self.plan_gpus = snapshot, config, plan_gpus
        self.grants: dict[str, int] = {}
        self.pool_free = {p.name: p.free_cxl_memory for p in snapshot.pools}
        self.served: dict[str, tuple[str, int]] = {}  # pod -> (node, chunks attached for it)
        self.rejected: dict[str, tuple[Reject, ...]] = {}
        self.pods = {p.key: p for p in snapshot.pods}

    def live_nodes(self) -> list[tuple[NodeInfo, NodeGroupSpec]]:
        out = []
        for node in self.snapshot.nodes:
            group = self.snapshot.group(node.group_id) if node.group_id else None
            if group is None or not group.max_cxl_chunks:
                continue
            if self.config.groups is not None and group.id not in self.config.groups:
                continue
            if node.ready and not node.being_deleted and not node.unschedulable:
                out.append((node, group))
        return out

    def memory_free(self, node: NodeInfo, group: NodeGroupSpec, plan: ScaleUpPlan) -> int:
        """The node's memory not requested by its bound pods nor by the pods `plan` puts on it, with the chunks on
        their way and those granted so far attached."""
        grown = node.allocatable.memory + (node.cxl_attaching + self.grants.get(node.name, 0)) * group.cxl_memory_chunk
        bound = sum(effective_requests(p).memory for p in self.snapshot.pods_on(node.name))
        planned = sum(effective_requests(self.pods[d.pod]).memory for d in plan.decisions
                      if d.node == node.name and d.verdict in _SERVED and d.pod in self.pods)
        return grown - bound - planned

    def candidates(self, pod: PodInfo, plan: ScaleUpPlan) -> tuple[list[_Candidate], list[Reject]]:
        wanted = effective_requests(pod).memory
        fits: list[_Candidate] = []
        rejects: list[Reject] = []
        for node, group in self.live_nodes():
            chunk = group.cxl_memory_chunk
            free_chunks = (group.max_cxl_chunks - len(node.cxl_chunks) - node.cxl_attaching
                           - self.grants.get(node.name, 0))
            shortfall = wanted - self.memory_free(node, group, plan)
            chunks = max(0, math.ceil(shortfall / chunk))
            if not chunks:
                continue  # memory is not what it lacks there: more memory changes nothing (the GPU plan's reject)
            if chunks > free_chunks:
                rejects.append(Reject(node.name, "cxl-memory-full", resource=MEMORY, requested=chunks * chunk,
                                      free=max(free_chunks, 0) * chunk, capacity=group.max_cxl_memory))
                continue
            if self.pool_free.get(group.fabric_pool, 0) < chunks * chunk:
                rejects.append(Reject(node.name, "cxl-pool-exhausted", resource=f"{group.fabric_pool}/cxl-memory",
                                      requested=chunks * chunk, free=self.pool_free.get(group.fabric_pool, 0)))
                continue
            fits.append(_Candidate(node, group, chunks, free_chunks))
        fits.sort(key=lambda c: (c.chunks, c.node.name))
        return fits, rejects

    def try_pod(self, pod: PodInfo, plan: ScaleUpPlan) -> ScaleUpPlan:
        """`plan` with memory attached for `pod` when a live node takes it then (verified by a re-run), else as is."""
        candidates, rejects = self.candidates(pod, plan)
        served_before = {d.pod for d in plan.decisions if d.verdict in _SERVED}
        for tried, candidate in enumerate(candidates):
            if tried == MAX_VERIFIED_NODES:
                rejects.append(Reject(f"{len(candidates) - tried} more node(s)",
                                      f"not verified (at most {MAX_VERIFIED_NODES} nodes per pod)"))
                break
            name, chunk = candidate.node.name, candidate.group.cxl_memory_chunk
            grants = {**self.grants, name: self.grants.get(name, 0) + candidate.chunks}
            trial = self.plan_gpus(with_cxl_chunks(self.snapshot, grants))
            decision = next((d for d in trial.decisions if d.pod == pod.key), None)
            lost = served_before - {d.pod for d in trial.decisions if d.verdict in _SERVED}
            if decision is not None and decision.verdict in _SERVED and decision.node == name and not lost:
                self.grants = grants
                self.pool_free[candidate.group.fabric_pool] -= candidate.chunks * chunk
                self.served[pod.key] = (name, candidate.chunks)
                self.rejected[pod.key] = tuple(rejects)
                return trial
            why = (f"would take {', '.join(sorted(lost))}'s place" if lost and decision and decision.verdict in _SERVED
                   else f"still does not fit with {chunks_text(candidate.chunks, chunk)} attached"
                   + (f" ({decision.reason})" if decision is not None and decision.node != name else ""))
            rejects.append(Reject(name, why, resource=MEMORY, requested=effective_requests(pod).memory))
        self.rejected[pod.key] = tuple(rejects)
        return plan

    def finish(self, plan: ScaleUpPlan) -> ScaleUpPlan:
        attaches: dict[str, list[str]] = {}
        for pod, (node, _) in self.served.items():
            attaches.setdefault(node, []).append(pod)
        groups = {n.name: self.snapshot.group(n.group_id) for n in self.snapshot.nodes if n.group_id}
        memory_attaches = []
        for node, pods in sorted(attaches.items()):
            group = groups[node]
            assert group is not None
            chunks = self.grants[node]
            memory_attaches.append(MemoryAttach(
                node=node, pool=group.fabric_pool, chunks=chunks, chunk_bytes=group.cxl_memory_chunk,
                pods=tuple(pods), reason=f"{chunks_text(chunks, group.cxl_memory_chunk)} from pool "
                                         f"{group.fabric_pool} so {', '.join(pods)} fit{'s' if len(pods) == 1 else ''} "
                                         f"on {node} (no new node)"))
        decisions = tuple(self.explained(d) for d in plan.decisions)
        return replace(plan, decisions=decisions, memory_attaches=tuple(memory_attaches))

    def explained(self, decision: PodDecision) -> PodDecision:
        rejects = self.rejected.get(decision.pod)
        if decision.pod in self.served:
            node, chunks = self.served[decision.pod]
            group = self.snapshot.group(self.node_group(node))
            assert group is not None
            gpus = f" and {decision.gpus_added} GPU(s)" if decision.gpus_added else ""
            return replace(decision, verdict=Verdict.FITS_AFTER_MEMORY, refusal=None, memory_added=chunks * group.cxl_memory_chunk,
                           reason=f"fits on {node} after {chunks_text(chunks, group.cxl_memory_chunk)}{gpus} "
                                  f"(the fewest chunks of any live node; verified by re-running the scheduling "
                                  f"check) instead of a new node",
                           rejected=tuple(rejects or ()) + decision.rejected)
        if rejects is None or decision.verdict not in _WAITING:
            return decision
        memory = ("no live node takes CXL memory" if not self.live_nodes() and not rejects else
                  "no live node fits it even with the CXL memory it can still attach")
        return replace(decision, reason=f"{decision.reason}; {memory}", rejected=tuple(rejects) + decision.rejected)

    def node_group(self, name: str) -> str:
        return next(n.group_id or "" for n in self.snapshot.nodes if n.name == name)


def plan_with_cxl_memory(snapshot: Snapshot, config: PlannerConfig, plan_gpus: PlanGpus) -> ScaleUpPlan:
    """The scale-up plan with CXL memory attached where that serves a pod instead of a new node (module docstring).
    `plan_gpus(snapshot)` is the GPU planner over the same pods."""
    if not takes_cxl_memory(snapshot):
        return plan_gpus(snapshot)
    memory_pass = _MemoryPass(snapshot, config, plan_gpus)
    plan = plan_gpus(with_cxl_chunks(snapshot, {}))
    waiting = [d.pod for d in plan.decisions if d.verdict in _WAITING]
    for pod in sorted((memory_pass.pods[k] for k in waiting if k in memory_pass.pods), key=scheduling_order):
        plan = memory_pass.try_pod(pod, plan)
    return memory_pass.finish(plan)


# --- scale-down ----------------------------------------------------------------------------------------------------

def spare_chunks(node: NodeInfo, group: NodeGroupSpec, pods: Sequence[PodInfo]) -> int:
    """How many of the node's attached chunks its pods' requests do not need."""
    if not group.cxl_memory_chunk or not node.cxl_chunks:
        return 0
    requested = sum(effective_requests(p).memory for p in pods)
    return unneeded_chunks(len(node.cxl_chunks), group.cxl_memory_chunk, node.allocatable.memory, requested)


def unneeded_chunks(chunks: int, chunk_size: int, allocatable_memory: int, requested_memory: int) -> int:
    """Of `chunks` attached chunks of `chunk_size` bytes, how many a node with `allocatable_memory` (the chunks
    included) could give back and still hold `requested_memory`: the planner, the controller's observer and the
    simulator count spare memory this one way."""
    return max(0, min(chunks, (allocatable_memory - requested_memory) // chunk_size))


def release_idle_cxl_memory(snapshot: Snapshot, plan: ScaleDownPlan) -> ScaleDownPlan:
    """`plan` with the CXL memory chunks idle past their group's cooldown detached (newest first), never one that the
    requests of the node's pods need; nodes `plan` removes give theirs back with the node."""
    if not takes_cxl_memory(snapshot):
        return plan
    removed = {r.node for r in plan.removals}
    detaches: list[Detach] = []
    notes: list[str] = []
    for node in snapshot.nodes:
        group = snapshot.group(node.group_id) if node.group_id else None
        if group is None or not node.cxl_chunks or node.name in removed:
            continue
        pods = snapshot.pods_on(node.name)
        spare = spare_chunks(node, group, pods)
        requested = sum(effective_requests(p).memory for p in pods)
        needs = (f"its pods request {memory_text(requested)} of its {memory_text(node.allocatable.memory)}")
        if not spare:
            notes.append(f"CXL memory on {node.name} stays: {needs}, so none of its "
                         f"{len(node.cxl_chunks)} chunk(s) is free")
            continue
        idle_for = snapshot.now - node.cxl_idle_since if node.cxl_idle_since is not None else None
        cooldown = group.gpu_idle_cooldown_seconds
        if idle_for is None or idle_for < cooldown:
            shown = "just now" if idle_for is None else f"for {idle_for:g}s"
            notes.append(f"CXL memory on {node.name}: {spare} chunk(s) idle {shown}, detached after the cooldown "
                         f"({cooldown:g}s)")
            continue
        newest = sorted(node.cxl_chunks, key=lambda d: (-d.attached_at, d.id))[:spare]
        detaches.append(Detach(node=node.name, device_ids=tuple(d.id for d in newest), reason=(
            f"CXL memory idle on {node.name} for {idle_for:g}s (cooldown {cooldown:g}s): "
            f"{chunks_text(spare, group.cxl_memory_chunk)} not needed ({needs}; "
            f"{len(node.cxl_chunks) - spare} chunk(s) stay)"), kind=DEVICE_CXL_MEMORY))
    if not detaches and not notes:
        return plan
    return replace(plan, detaches=plan.detaches + tuple(detaches), notes=plan.notes + tuple(notes))

