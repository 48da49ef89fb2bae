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

`ideal(scenario, reservations=...)` is the same pool under the queue discipline DDS keeps for large GPU requests
(dds/planner/reservations.py): the bound for a policy that runs with reservations (`ideal-reserving`). A pending job
asking for more than `large_fraction` of a node's GPU slots gets a hold by the planner's rule: from
`min_age_seconds`, or from `quiet_age_seconds` while at most `quiet_pending` other GPU jobs wait; one per pool; gangs
never. The held node is the one the planner would reserve (on an ideal pool, the one with the most GPUs in use); it
takes no other job, and no other job takes the pool's free GPUs that the held node has free slots for: they are the
held job's the instant they free, where DDS drains, fences, detaches and attaches (DDS gathers only into the node's
free slots; the rest waits on the node's own pods, and the pool's other GPUs serve other jobs meanwhile). The held
job starts the instant a node and the pool can take it, its own node or another; jobs without GPUs still start on
any other node. Without holds the large jobs of a busy queue wait until the pool happens to empty: kube-scheduler's
order, not a bound for a policy that serves them. The two bounds differ by what serving large jobs costs the others
(hack/starvation_bound.py's oracle searches their start times for the least such cost).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Optional, Sequence

from dds.model.cxl import cxl_memory_of, is_cxl_model
from dds.model.groups import NodeGroupSpec
from dds.planner.reservations import ReservationConfig, earliest_reservation_age
from dds.sim.engine import Counters, JobRecord, Sample, SimResult
from dds.sim.scenario import Scenario
from dds.sim.trace import Job, gang_minimums

IDEAL_POLICY = "ideal"
IDEAL_RESERVING = "ideal-reserving"  # the ideal pool under DDS's reservations for large GPU requests


@dataclass(frozen=True)
class _Hold:
    """A pending large job's reservation: its node takes no other job, its pool's GPUs are its own until it starts."""

    job: Job
    node: "_Node"


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
    models: dict[str, frozenset[str]] = field(default_factory=dict)  # pool -> the GPU models it has at all
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

    def could_ever_take(self, job: Job, node: _Node) -> bool:
        """Whether some GPU model of the node's pool is one the job and the node's group accept."""
        allowed = set(node.group.gpu_models) if node.group.gpu_models else None
        return any((allowed is None or m in allowed) and job.gpu_model in (None, m)
                   for m in self.models.get(node.group.fabric_pool, ()))

    def place(self, job: Job, holds: Sequence[_Hold] = ()) -> Optional[tuple[_Node, Optional[str]]]:
        """Best fit by cores; with `holds`, never on a held node nor with GPUs a held job of the pool still lacks."""
        best: Optional[tuple[int, int, _Node, Optional[str]]] = None
        for index, node in enumerate(self.nodes):
            if not node.fits(job, self.cxl_free.get(node.group.fabric_pool, 0)):
                continue
            model = self.model_for(job, node)
            if model == "" or (holds and _held_back(self, job, node, holds)):
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


def asks_for_reservations(scenario: Scenario, rule: ReservationConfig) -> bool:
    """Whether some job is large under `rule` on some group: only then can the reserving bound differ from the plain
    one."""
    slots = [scenario.cluster.slots(g) for g in scenario.cluster.groups]
    return rule.enabled and any(rule.large_fraction * n < j.gpus <= n for j in scenario.jobs if not j.group
                                for n in slots)


def _held_back(world: _World, job: Job, node: _Node, holds: Sequence[_Hold]) -> bool:
    """Whether a hold keeps `job` off `node`: no job but the held one goes to the held node, nor takes
    the pool's free GPUs that the held node has free slots for (DDS gathers GPUs only into the node's free slots;
    what it cannot gather waits on the node's own pods, and the pool's other GPUs serve other jobs meanwhile)."""
    for hold in holds:
        if hold.job is job:
            return False  # it tolerates its node's fence and goes wherever it fits first, as the pod would
        if node is hold.node:
            return True
        pool = hold.node.group.fabric_pool
        if job.gpus and node.group.fabric_pool == pool:
            gathering = min(hold.job.gpus, hold.node.slots - hold.node.gpus_used)
            if sum(world.free[pool].values()) - job.gpus < gathering:
                return True
    return False


def ideal(scenario: Scenario, reservations: Optional[ReservationConfig] = None) -> SimResult:
    """The scenario's jobs on an ideal pool (see the module's docstring), as a result `dds simulate` compares; with
    `reservations` (enabled), large jobs get holds by that rule (`ideal-reserving`)."""
    rule = reservations if reservations is not None and reservations.enabled else None
    cluster = scenario.cluster
    cxl = {p.name: cxl_memory_of(p.devices) for p in cluster.pools}
    world = _World(
        nodes=[_Node(name=f"{g.id}-{i}", group=g, slots=cluster.slots(g), cpu_free=g.milli_cpu, memory_free=g.memory,
                     cxl_max=g.max_cxl_memory if cxl[g.fabric_pool] else 0)
               for g in cluster.groups for i in range(max(g.max_size, cluster.initial_nodes.get(g.id, 0)))],
        free={p.name: {m: c for m, c in p.devices.items() if not is_cxl_model(m)} for p in cluster.pools},
        cxl_free=cxl, models={p.name: frozenset(m for m, c in p.devices.items() if c and not is_cxl_model(m))
                              for p in cluster.pools})
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
    holds: dict[str, _Hold] = {}  # pool -> the hold in force there
    while index < len(arrivals) or world.running:
        upcoming = [world.running[0][0]] if world.running else []
        if rule is not None:  # a hold may come with age alone
            upcoming += [t for j in pending if j.gpus for t in _hold_ages(j, rule) if t > now]
        now = min(upcoming + [arrivals[index].arrival_s] if index < len(arrivals) else upcoming)
        while world.running and world.running[0][0] <= now:
            _, _, name, node_name, model = heapq.heappop(world.running)
            world.take(by_name[name], nodes[node_name], model, sign=-1)
            finishes[name] = now
        while index < len(arrivals) and arrivals[index].arrival_s <= now:
            pending.append(arrivals[index])
            index += 1
        if rule is not None:
            _add_holds(world, pending, holds, rule, now)
        for job, node, model in _schedule(world, pending, minimums, holds):
            holds = {pool: h for pool, h in holds.items() if h.job is not job}
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
    policy = IDEAL_POLICY if rule is None else IDEAL_RESERVING
    return SimResult(scenario=scenario.name, policy=policy, jobs=jobs, timeline=tuple(timeline),
                     counters=Counters(), end_s=now, total_pool_gpus=cluster.total_gpus())


def _hold_ages(job: Job, rule: ReservationConfig) -> tuple[float, ...]:
    ages = (rule.min_age_seconds,) if rule.quiet_age_seconds is None else (rule.min_age_seconds,
                                                                           rule.quiet_age_seconds)
    return tuple(job.arrival_s + age for age in ages)


def _add_holds(world: _World, pending: Sequence[Job], holds: dict[str, _Hold], rule: ReservationConfig,
               now: float) -> None:
    """The planner's rule (dds/planner/reservations.py) on the ideal pool: the oldest large jobs first, one per pool,
    from `min_age_seconds`, or from `quiet_age_seconds` while few other GPU jobs wait."""
    held_nodes = {h.node.name for h in holds.values()}
    for job in pending:
        waited = now - job.arrival_s
        if not job.gpus or job.group or waited < earliest_reservation_age(rule):
            continue
        if any(h.job is job for h in holds.values()):
            continue
        node = _hold_node(world, job, rule, held_nodes, holds)
        if node is None:
            continue
        queued = sum(1 for other in pending if other is not job and other.gpus)
        if waited < rule.min_age_seconds and queued > rule.quiet_pending:
            continue
        holds[node.group.fabric_pool] = _Hold(job, node)
        held_nodes.add(node.name)


def _hold_node(world: _World, job: Job, rule: ReservationConfig, held_nodes: set[str], holds: dict[str, _Hold]
               ) -> Optional[_Node]:
    """The node a large job would get held: of a pool with no hold yet, one that could ever take it, the one the
    planner picks (`_choose_node`), then the first. The planner takes first a node the job could start on now (on an
    ideal pool the job would simply start: no hold), then the most GPUs held among the nodes that can gather the rest
    without waiting on other nodes' pods, else the most GPUs in use; on an ideal pool every GPU held is in use and
    the node with the most in use is always among the first, so both come to the most in use. Where the planner
    moves a reservation to the node that frees first (`_moved`), the held job here starts on whichever node can take
    it first."""
    def eligible(node: _Node) -> bool:
        group = node.group
        return not (node.name in held_nodes or group.fabric_pool in holds
                    or job.gpus <= rule.large_fraction * node.slots or job.gpus > node.slots
                    or job.milli_cpu > group.milli_cpu
                    or job.memory > group.memory + node.cxl_max or not world.could_ever_take(job, node))

    # min() keeps the first of equals: the most GPUs in use, then the first node
    return min((n for n in world.nodes if eligible(n)), key=lambda n: -n.gpus_used, default=None)


def _schedule(world: _World, pending: list[Job], minimums: dict[str, int], holds: dict[str, _Hold] | None = None
              ) -> list[tuple[Job, _Node, Optional[str]]]:
    """Start what fits now, held jobs first, then oldest first; a gang only when its minimum fits together. What
    starts is taken in `world`, removed from `pending` and returned."""
    started: list[tuple[Job, _Node, Optional[str]]] = []
    tried_gangs: set[str] = set()
    held = list((holds or {}).values())
    for hold in list(held):
        spot = world.place(hold.job, held)
        if spot is not None:
            world.take(hold.job, *spot)
            started.append((hold.job, *spot))
            held.remove(hold)
    for job in [j for j in pending if all(j is not s[0] for s in started)]:
        if job.group:
            if job.group in tried_gangs:
                continue
            tried_gangs.add(job.group)
            started += _place_together(world, [j for j in pending if j.group == job.group], minimums[job.group],
                                       held)
        else:
            spot = world.place(job, held)
            if spot is not None:
                world.take(job, *spot)
                started.append((job, *spot))
    for job, _, _ in started:
        pending.remove(job)
    return started


def _place_together(world: _World, members: Sequence[Job], minimum: int, holds: Sequence[_Hold] = ()
                    ) -> list[tuple[Job, _Node, Optional[str]]]:
    """As many of a gang's pending members as fit at once, if that reaches its minimum (capped by the members still
    pending); else none. What is returned stays taken in `world`."""
    placed = []
    for member in members:
        spot = world.place(member, holds)
        if spot is not None:
            world.take(member, *spot)
            placed.append((member, *spot))
    if len(placed) >= min(minimum, len(members)):
        return placed
    for member, node, model in placed:
        world.take(member, node, model, sign=-1)
    return []
