"""The ideal pool: the bound every policy of `dds simulate` is measured against.

Not DDS and not a policy anyone can run: the same jobs on the same cluster, but every GPU of a pool is usable by any
node of that pool the instant a job needs it (no attach or detach latency, no idle cooldown, no GPU left idle on the
wrong node: no fragmentation), and every node a group may ever have is there from the start (no provisioning delay).
What it keeps of the real world is what no composable pool removes: a node's cores, memory and pod slots, its GPU
slots (a server takes at most that many), the pool a node draws from and the GPU models a job or group insists on, and
kube-scheduler's order (pending pods offered oldest first, a later one starts when an earlier one does not fit; a gang
starts only when its minimum fits at once). CXL memory (docs/cxl-memory.md) is pooled the same way: a node of a group
that takes it has its own memory plus, the instant a job needs it, as much of its pool's free CXL memory as its
group's maximum allows, in bytes (no chunks), given back as soon as its jobs no longer need it.

Placement is best-fit by cores (the node left with the fewest free cores after the job), which keeps large holes for
the jobs asking for many cores. It is a greedy scheduler, not an optimum over orderings: a bound on what placement and
GPU movement can win, not on what reordering the queue could (hack/starvation_bound.py searches start times for that).
GPUs held are the GPUs in use: an ideal pool holds nothing idle.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Optional, Sequence

from dds.model.cxl import cxl_memory_of, is_cxl_model
from dds.model.groups import NodeGroupSpec
from dds.sim.engine import Counters, JobRecord, Sample, SimResult
from dds.sim.scenario import Scenario
from dds.sim.trace import Job, gang_minimums

IDEAL_POLICY = "ideal"


@dataclass
class _Node:
    name: str
    group: NodeGroupSpec
    slots: int
    cpu_free: int
    memory_free: int  # of the node's own memory: below 0 when CXL memory makes up the rest
    cxl_max: int = 0  # CXL memory the node may draw from its pool (0: its group takes none, or the pool has none)
    gpus_used: int = 0
    pods: int = 0

    def fits(self, job: Job, cxl_free: int) -> bool:
        return (job.milli_cpu <= self.cpu_free and job.memory <= self.memory_free + self.cxl_max
                and self.cxl_drawn(job) <= cxl_free
                and self.gpus_used + job.gpus <= self.slots and self.pods < self.group.max_pods)

    @property
    def cxl_used(self) -> int:
        return max(0, -self.memory_free)

    def cxl_drawn(self, job: Job, sign: int = 1) -> int:
        """CXL memory taking (sign 1) or ending (-1) `job` draws from the pool (negative: gives back)."""
        return max(0, sign * job.memory - self.memory_free) - self.cxl_used

    def take(self, job: Job, sign: int = 1) -> None:
        self.cpu_free -= sign * job.milli_cpu
        self.memory_free -= sign * job.memory
        self.gpus_used += sign * job.gpus
        self.pods += sign


@dataclass
class _World:
    nodes: list[_Node]
    free: dict[str, dict[str, int]]  # pool -> model -> GPUs free
    cxl_free: dict[str, int] = field(default_factory=dict)  # pool -> bytes of CXL memory free
    running: list[tuple[float, int, str, str, Optional[str]]] = field(default_factory=list)  # end, seq, job, node, model

    def model_for(self, job: Job, node: _Node) -> Optional[str]:
        """The GPU model the job would take on `node` (None for a CPU-only job), or "" when none is free."""
        if job.gpus == 0:
            return None
        allowed = set(node.group.gpu_models) if node.group.gpu_models else None
        for model, count in sorted(self.free[node.group.fabric_pool].items()):
            if count >= job.gpus and (allowed is None or model in allowed) and job.gpu_model in (None, model):
                return model
        return ""

    def place(self, job: Job) -> Optional[tuple[_Node, Optional[str]]]:
        best: Optional[tuple[int, int, _Node, Optional[str]]] = None
        for index, node in enumerate(self.nodes):
            if not node.fits(job, self.cxl_free.get(node.group.fabric_pool, 0)):
                continue
            model = self.model_for(job, node)
            if model == "":
                continue
            left = node.cpu_free - job.milli_cpu
            if best is None or (left, index) < best[:2]:
                best = (left, index, node, model)
        return None if best is None else (best[2], best[3])

    def take(self, job: Job, node: _Node, model: Optional[str], sign: int = 1) -> None:
        if node.cxl_max:
            self.cxl_free[node.group.fabric_pool] -= node.cxl_drawn(job, sign)
        node.take(job, sign)
        if model is not None:
            self.free[node.group.fabric_pool][model] -= sign * job.gpus


def ideal(scenario: Scenario) -> SimResult:
    """The scenario's jobs on an ideal pool (see the module's docstring), as a result `dds simulate` compares."""
    cluster = scenario.cluster
    cxl = {p.name: cxl_memory_of(p.devices) for p in cluster.pools}
    world = _World(
        nodes=[_Node(name=f"{g.id}-{i}", group=g, slots=cluster.slots(g), cpu_free=g.milli_cpu, memory_free=g.memory,
                     cxl_max=g.max_cxl_memory if cxl[g.fabric_pool] else 0)
               for g in cluster.groups for i in range(max(g.max_size, cluster.initial_nodes.get(g.id, 0)))],
        free={p.name: {m: c for m, c in p.devices.items() if not is_cxl_model(m)} for p in cluster.pools},
        cxl_free=cxl)
    nodes = {n.name: n for n in world.nodes}
    by_name = {j.name: j for j in scenario.jobs}
    minimums = gang_minimums(scenario.jobs)
    arrivals = sorted(scenario.jobs, key=lambda j: j.arrival_s)
    starts: dict[str, tuple[float, str]] = {}
    finishes: dict[str, float] = {}
    pending: list[Job] = []
    timeline: list[Sample] = []
    seq = itertools.count()
    index, now = 0, 0.0
    while index < len(arrivals) or world.running:
        upcoming = [world.running[0][0]] if world.running else []
        now = min(upcoming + [arrivals[index].arrival_s] if index < len(arrivals) else upcoming)
        while world.running and world.running[0][0] <= now:
            _, _, name, node_name, model = heapq.heappop(world.running)
            world.take(by_name[name], nodes[node_name], model, sign=-1)
            finishes[name] = now
        while index < len(arrivals) and arrivals[index].arrival_s <= now:
            pending.append(arrivals[index])
            index += 1
        for job, node, model in _schedule(world, pending, minimums):
            starts[job.name] = (now, node.name)
            heapq.heappush(world.running, (now + job.duration_s, next(seq), job.name, node.name, model))
        used = sum(n.gpus_used for n in world.nodes)
        timeline.append(Sample(t_s=now, gpus_used=used, gpus_present=used, pending=len(pending),
                               nodes=sum(1 for n in world.nodes if n.pods),
                               cxl_memory=sum(n.cxl_used for n in world.nodes)))
    jobs = tuple(JobRecord(name=j.name, arrival_s=j.arrival_s, gpus=j.gpus,
                           start_s=starts[j.name][0] if j.name in starts else None,
                           finish_s=finishes.get(j.name), node=starts[j.name][1] if j.name in starts else None)
                 for j in scenario.jobs)
    return SimResult(scenario=scenario.name, policy=IDEAL_POLICY, jobs=jobs, timeline=tuple(timeline),
                     counters=Counters(), end_s=now, total_pool_gpus=cluster.total_gpus())


def _schedule(world: _World, pending: list[Job], minimums: dict[str, int]
              ) -> list[tuple[Job, _Node, Optional[str]]]:
    """Start what fits now, oldest first; a gang only when its minimum fits together. What starts is taken in
    `world`, removed from `pending` and returned."""
    started: list[tuple[Job, _Node, Optional[str]]] = []
    tried_gangs: set[str] = set()
    for job in list(pending):
        if job.group:
            if job.group in tried_gangs:
                continue
            tried_gangs.add(job.group)
            started += _place_together(world, [j for j in pending if j.group == job.group], minimums[job.group])
        else:
            spot = world.place(job)
            if spot is not None:
                world.take(job, *spot)
                started.append((job, *spot))
    for job, _, _ in started:
        pending.remove(job)
    return started


def _place_together(world: _World, members: Sequence[Job], minimum: int) -> list[tuple[Job, _Node, Optional[str]]]:
    """As many of a gang's pending members as fit at once, if that reaches its minimum (capped by the members still
    pending); else none. What is returned stays taken in `world`."""
    placed = []
    for member in members:
        spot = world.place(member)
        if spot is not None:
            world.take(member, *spot)
            placed.append((member, *spot))
    if len(placed) >= min(minimum, len(members)):
        return placed
    for member, node, model in placed:
        world.take(member, node, model, sign=-1)
    return []
