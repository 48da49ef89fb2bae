"""No starvation of large GPU requests: reserve one node for a large pod that has waited too long.

The problem: a pod asking for most of a node's GPU slots (an 8-GPU training job on 8-slot nodes) only fits once that
many GPUs are free on one node at the same instant. kube-scheduler keeps binding the small pods that arrive meanwhile,
and DDS keeps attaching GPUs for them, so the large pod can wait for hours.

The mechanism (decided here, carried out at the edge):

1. **Reserve.** A pending pod whose GPU request is more than `large_fraction` of a node's GPU slots and that is older
   than `min_age_seconds` gets one node: a node it could start on as soon as free and idle GPUs reach it, else, of
   the nodes that could gather what they lack from the free pool and other nodes' idle GPUs, the one holding the
   most GPUs, then the fewest in use; when every node would also wait for GPUs other nodes' pods use, the one with
   the most GPUs in use (expected to drain last, so the others' GPUs move while it drains); then by name. At most `per_pool` reservations per pool at a time. With `quiet_age_seconds` set,
   it gets one sooner, from that age on, while at most `quiet_pending` other pending pods could use the node's GPUs:
   what a reservation costs is the wait it adds to the pods queued behind it, so the cheapest moment is when few are.
2. **Fence.** The edge taints the node `dds.cdi.dev/reserved-for=<pod uid>:NoSchedule` and adds the matching
   toleration to the waiting pod (tolerations may be added to a live pod). kube-scheduler itself then keeps every
   other new pod off the node — nothing has to win a race against it — while the pods already running there finish
   normally (NoSchedule evicts nothing). The planner sees the taint in its snapshot like any other, so it stops
   attaching GPUs there for other pods too, and the reservation survives restarts: the taint is the state.
3. **Gather.** Every loop, GPUs go to the node until it holds what the pod asks for: free pool devices first (before
   any other attach of the pass), then idle GPUs of other nodes of the same pool, detached at once without waiting
   for their idle cooldown (a GPU idle on another node is the quickest source). The node's own idle GPUs are kept:
   scale-down must not return them to the pool (`keep_reserved`).
4. **Claim.** When the pool and the idle GPUs cannot cover the rest, the GPUs must come from other nodes' running
   pods as they finish, and kube-scheduler would hand each one to the next small pod the instant it frees. So the
   fewest such nodes (most GPUs first) are fenced too, with `dds.cdi.dev/gpus-claimed-by=<pod uid>:NoSchedule`, only
   until they have released their share (recomputed every pass: the fence lifts as soon as it is not needed).
5. **Move.** Which node drains first is not known when the reservation is made, so every pass judges it again
   (`_moved`): a reserved node still waiting for GPUs running pods use hands the reservation to a node the pod can
   start on now, or, once it has drained itself, to the busiest claimed node, whose pods it would wait for anyway
   (its own idle GPUs then move while that node drains). The node left stays claimed for that pass.
6. **Release.** When the pod is bound (or gone) every taint of its reservation goes.

Why not attach all of its GPUs at once: the pool rarely holds that many free devices while small pods run, and a
half-gathered set is exactly what other pods then take. The taint makes the gathered GPUs the waiting pod's alone,
using only what kube-scheduler already honours.

Pure: reads the snapshot, returns a plan; the controller or the simulator applies it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Optional, Sequence

from dds.model.groups import Taint
from dds.planner.device_modes import nodes_held_by_load
from dds.planner.filters import STATIC_FILTERS, first_reject
from dds.planner.gangs import gang_of
from dds.planner.nodes import GpuFacts, free_cpu_memory, gpu_facts, sim_node
from dds.planner.nodes import group_slots
from dds.model.plan import Attach, Detach, Keep, PlannerConfig, ScaleDownPlan
from dds.planner.memos import PlannerMemos
from dds.planner.requests import RequestCache, scheduling_order
from dds.model.snapshot import NodeInfo, PodAffinityTerm, PodInfo, Snapshot, Toleration

RESERVATION_TAINT_KEY = "dds.cdi.dev/reserved-for"
CLAIM_TAINT_KEY = "dds.cdi.dev/gpus-claimed-by"
RESERVATION_EFFECT = "NoSchedule"


@dataclass(frozen=True)
class ReservationConfig:
    enabled: bool = True
    # A pod is large when it asks for more than this share of a node's GPU slots (default: more than half).
    large_fraction: float = 0.5
    # How long a large pod waits on its own before it gets a node reserved.
    min_age_seconds: float = 300.0
    # From this age on (None: never), a large pod gets its reservation before `min_age_seconds` while at most
    # `quiet_pending` other pending pods could use the node's GPUs. Every pod waiting behind a reservation waits
    # longer by the time the node takes to drain and the large pod to run, so a reservation made while the queue is
    # short costs least; past `min_age_seconds` the large pod gets one however long the queue.
    quiet_age_seconds: Optional[float] = None
    quiet_pending: int = 1
    # Reservations at a time per fabric pool: each one drains a node, so they are kept few.
    per_pool: int = 1


@dataclass(frozen=True, slots=True)
class Reservation:
    pod: str  # namespace/name
    token: str  # the taint's value: the pod's uid (its key when it has none)
    node: str
    pool: str
    gpus: int  # what the pod asks for: the node gathers this many
    reason: str
    moved_from: Optional[str] = None  # the node reserved for the pod until this pass (_moved)

    @property
    def taint(self) -> Taint:
        return reservation_taint(self.token)

    @property
    def toleration(self) -> Toleration:
        return reservation_toleration(self.token)


@dataclass(frozen=True)
class ReservationPlan:
    reservations: tuple[Reservation, ...] = ()  # in force after this pass: the nodes to keep tainted
    new: tuple[Reservation, ...] = ()  # of those, the ones to taint now (and whose pod gets the toleration)
    released: tuple[str, ...] = ()  # nodes whose reservation taint goes (its pod is bound or gone)
    attaches: tuple[Attach, ...] = ()  # free pool devices for the reserved nodes, before any other attach
    detaches: tuple[Detach, ...] = ()  # idle GPUs of other nodes, released for the reserved nodes now
    # Nodes to keep fenced (claim taint, value: the token) because a reservation needs GPUs their pods still use.
    claimed: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(r.node for r in self.reservations)

    @property
    def is_empty(self) -> bool:
        """Nothing for the edge to change, given the claim taints it already shows."""
        return not (self.new or self.released or self.attaches or self.detaches or self.claims_changed)

    claims_changed: bool = False  # the set of claimed nodes differs from the claim taints in the snapshot


def pod_token(pod: PodInfo) -> str:
    return pod.uid or f"{pod.namespace}.{pod.name}"


def reservation_taint(token: str) -> Taint:
    return Taint(key=RESERVATION_TAINT_KEY, value=token, effect=RESERVATION_EFFECT)


def claim_taint(token: str) -> Taint:
    return Taint(key=CLAIM_TAINT_KEY, value=token, effect=RESERVATION_EFFECT)


def claimed_token(node: NodeInfo) -> Optional[str]:
    return next((t.value for t in node.taints if t.key == CLAIM_TAINT_KEY), None)


def reservation_toleration(token: str) -> Toleration:
    return Toleration(key=RESERVATION_TAINT_KEY, operator="Equal", value=token, effect=RESERVATION_EFFECT)


def reserved_token(node: NodeInfo) -> Optional[str]:
    return next((t.value for t in node.taints if t.key == RESERVATION_TAINT_KEY), None)


class _NoPods:
    """Static filters never look at other pods; a cluster view for their signature."""

    def any_pod_matches(self, term: PodAffinityTerm, namespace: str) -> bool:
        return False


def plan_reservations(snapshot: Snapshot, config: ReservationConfig = ReservationConfig(), *,
                      planner: PlannerConfig = PlannerConfig(),
                      memos: Optional[PlannerMemos] = None) -> ReservationPlan:
    """Which nodes are reserved for which pending pods after this pass, and the GPUs to move towards them. `planner`:
    the pass's planner settings (which nodes the CDI operator detaches from only once idle); `memos`: the caller's
    (their lasting requests), a fresh one without it."""
    shown = tuple(sorted((n.name, t) for n in snapshot.nodes if (t := claimed_token(n)) is not None))
    if not config.enabled:
        return ReservationPlan(released=tuple(n.name for n in snapshot.nodes if reserved_token(n) is not None),
                               claims_changed=bool(shown))
    cache = RequestCache(memos.requests if memos is not None else None)
    pending = {pod_token(p): p for p in snapshot.pending_pods()}
    used = _gpus_in_use(snapshot, cache)
    kept, released, left = _existing(snapshot, pending, cache, used)
    kept, moved = _moved(snapshot, config, pending, kept, cache, used)
    new = moved + _new_reservations(snapshot, config, pending, kept + moved, cache, used)
    reservations = kept + new
    tainting = {r.node for r in new}
    released = tuple(n for n in released if n not in tainting) + tuple(r.moved_from for r in moved if r.moved_from)
    gathered = _gather(snapshot, reservations, cache, planner, used)
    # The node a reservation left stays fenced this pass, until its idle GPUs are on their way to the new one.
    claimed = tuple(sorted(set(gathered.claimed) | set(left)
                           | {(r.moved_from, r.token) for r in moved if r.moved_from}))
    return ReservationPlan(reservations=reservations, new=new, released=released,
                           attaches=tuple(gathered.attaches), detaches=tuple(gathered.detaches), claimed=claimed,
                           notes=tuple(gathered.notes),
                           claims_changed=claimed != shown)


def _existing(snapshot: Snapshot, pending: dict[str, PodInfo], cache: RequestCache, used: dict[str, int]
              ) -> tuple[tuple[Reservation, ...], tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The reservations in force, the nodes whose reservation taint goes, and of those the ones left by a pod still
    reserved elsewhere (node, token): they stay claimed this pass."""
    kept: dict[str, Reservation] = {}
    released: list[str] = []
    left: list[tuple[str, str]] = []
    # Two nodes tainted for one pod: the edge stopped between the two writes of a move. The busier one is kept (the
    # node a move goes to, or, for a move to a node the pod can start on now, the node it leaves: the next pass moves
    # it again); the other is released, so GPUs are never gathered on two nodes for one pod.
    for node in sorted(snapshot.nodes, key=lambda n: (-used.get(n.name, 0), n.name)):
        token = reserved_token(node)
        if token is None:
            continue
        pod = pending.get(token)
        if pod is None or token in kept:
            released.append(node.name)
            if pod is not None:
                left.append((node.name, token))
            continue
        facts = gpu_facts(node, snapshot, None)
        kept[token] = Reservation(pod.key, token, node.name, facts.pool or "", cache.get(pod).gpus(node.gpu_resource),
                                  reason=f"reserved for {pod.key}")
    return tuple(sorted(kept.values(), key=lambda r: r.node)), tuple(sorted(released)), tuple(left)


def _moved(snapshot: Snapshot, config: ReservationConfig, pending: dict[str, PodInfo], kept: Sequence[Reservation],
           cache: RequestCache, used: dict[str, int]) -> tuple[tuple[Reservation, ...], tuple[Reservation, ...]]:
    """The reservations that stay on their node, and those that move to a node where their pod starts sooner.

    A reservation is fixed when it is made, but which node drains first is not known then. Each pass, one whose node
    must still wait for GPUs that running pods use moves (`_better_node`): to a node that could take the pod and
    gather the rest from the pool and idle GPUs at once, else, once its own node has drained, to the claimed node
    with the most GPUs in use, so the drained node's GPUs move while that one drains rather than after. The pod's
    toleration is for its token, so it holds on any node."""
    reserved = {r.node for r in kept}
    nodes = {n.name: n for n in snapshot.nodes}
    stay: list[Reservation] = []
    moved: list[Reservation] = []
    for r in kept:
        better = _better_node(snapshot, config, r, pending[r.token], nodes, used, reserved, cache)
        if better is None:
            stay.append(r)
            continue
        node, why = better
        reserved.discard(r.node)
        reserved.add(node.name)
        moved.append(replace(r, node=node.name, moved_from=r.node,
                             reason=f"reservation for {r.pod} moved from {r.node} to {node.name}: {why}"))
    return tuple(stay), tuple(moved)


def _better_node(snapshot: Snapshot, config: ReservationConfig, r: Reservation, pod: PodInfo,
                 nodes: dict[str, NodeInfo], used: dict[str, int], reserved: set[str], cache: RequestCache
                 ) -> Optional[tuple[NodeInfo, str]]:
    """Where `r` should move, and why; None to keep it where it is."""
    node = nodes.get(r.node)
    if node is None:
        return None
    facts = gpu_facts(node, snapshot, None)
    others = reserved - {r.node}
    spare = _spare_gpus(snapshot, used, others)  # r.node's own idle GPUs count for the others, not for itself
    waiting = _short(r.gpus, node, facts, used, spare)
    if waiting <= 0:
        return None  # what it lacks is free or idle now
    hosts = _hosts(snapshot, config, r, pod, _model_of(facts), others, cache)
    ready = [(n, f) for n, f in hosts if _ready(snapshot, n, f, r.gpus, pod, used, spare, cache)]
    if ready:
        best, best_facts = min(ready, key=lambda o: (-o[1].capacity, used.get(o[0].name, 0), o[0].name))
        return best, (f"{r.node} waits for {waiting} GPU(s) that running pods use, {best.name} can take {r.pod} "
                      f"with the {best_facts.capacity} GPU(s) it holds and the rest free now")
    if used.get(node.name, 0):
        return None  # still draining: the GPUs it gathers move to it meanwhile
    busy = [(n, f) for n, f in hosts if used.get(n.name, 0) and r.gpus - f.capacity <= f.free_slots]
    if not busy:
        return None
    best, _ = min(busy, key=lambda o: (-used[o[0].name], -o[1].capacity, o[0].name))
    return best, (f"{r.node} has drained but lacks {waiting} GPU(s) that only running pods can free; {best.name} has "
                  f"{used[best.name]} in use (the most of those nodes: expected to drain last), so {r.node}'s "
                  f"GPUs move to it while it drains")


def _short(gpus: int, node: NodeInfo, facts: GpuFacts, used: dict[str, int],
           spare: dict[tuple[str, str], dict[str, int]]) -> int:
    """GPUs a pod asking for `gpus` on `node` would wait for running pods to free (its node's or others'): what its
    node's idle GPUs, and the pool's and other nodes' idle GPUs its free slots can take, cannot cover now."""
    idle = facts.capacity - used.get(node.name, 0)
    return gpus - idle - min(_spare_elsewhere(spare, node, facts), facts.free_slots)


def _ready(snapshot: Snapshot, node: NodeInfo, facts: GpuFacts, gpus: int, pod: PodInfo, used: dict[str, int],
           spare: dict[tuple[str, str], dict[str, int]], cache: RequestCache) -> bool:
    """Whether the pod could start on `node` as soon as free and idle GPUs reach it: nothing to wait for."""
    return (_short(gpus, node, facts, used, spare) <= 0
            and _fits_beside(snapshot, node, facts, gpus, pod, used.get(node.name, 0), cache))


def _hosts(snapshot: Snapshot, config: ReservationConfig, r: Reservation, pod: PodInfo, model: str,
           reserved: set[str], cache: RequestCache) -> list[tuple[NodeInfo, GpuFacts]]:
    """Other nodes of the reservation's pool and GPU model that could hold the pod once drained: not reserved, and
    claimed by no other reservation (this one's claim would become the reservation)."""
    found = []
    for other in snapshot.nodes:
        if other.name == r.node or other.name in reserved or claimed_token(other) not in (None, r.token):
            continue
        unfenced = replace(other, taints=tuple(t for t in other.taints if t.key != CLAIM_TAINT_KEY))
        hosting = _could_host(snapshot, config, pod, unfenced, cache)
        if hosting is not None and hosting[0].pool == r.pool and _model_of(hosting[0]) in ("", model):
            found.append((other, hosting[0]))
    return found


def _fits_beside(snapshot: Snapshot, node: NodeInfo, facts: GpuFacts, gpus: int, pod: PodInfo, in_use: int,
                 cache: RequestCache) -> bool:
    """Whether the pod fits beside the node's running pods (which use `in_use` of its GPUs): GPU slots, cores and
    memory."""
    if gpus + in_use > facts.capacity + facts.free_slots:
        return False
    cpu, memory = free_cpu_memory(node, snapshot, cache)
    want = cache.get(pod).requests
    return want.milli_cpu <= cpu and want.memory <= memory


def node_slots(node: NodeInfo, snapshot: Snapshot) -> int:
    """GPUs the node can hold at most: its group's max, capped by its pool's per-node limit."""
    group = snapshot.group(node.group_id) if node.group_id else None
    if group is None:
        return 0
    return group_slots(group, snapshot.pool(group.fabric_pool))


def _new_reservations(snapshot: Snapshot, config: ReservationConfig, pending: dict[str, PodInfo],
                      kept: Sequence[Reservation], cache: RequestCache, used: dict[str, int]
                      ) -> tuple[Reservation, ...]:
    taken = {r.token for r in kept}
    busy_nodes = {r.node for r in kept}
    per_pool: dict[str, int] = {}
    for r in kept:
        per_pool[r.pool] = per_pool.get(r.pool, 0) + 1
    out: list[Reservation] = []
    for pod in sorted(pending.values(), key=scheduling_order):
        waited = snapshot.now - pod.created_at
        if (pod_token(pod) in taken or waited < earliest_reservation_age(config) or pod.unsupported
                or gang_of(pod) is not None):
            continue  # a gang member alone is no use: gangs get capacity all or nothing (gangs.py), not reservations
        choice = _choose_node(snapshot, config, pod, cache, used, busy_nodes, per_pool)
        if choice is None:
            continue
        node, pool, gpus = choice
        queued = _queued_behind(pending.values(), pod, node, cache)
        if waited < config.min_age_seconds and queued > config.quiet_pending:
            continue  # too early to reserve while others queue: the pods behind the reservation would pay for it
        when = (f"has waited {waited:.0f}s" if waited >= config.min_age_seconds else
                f"has waited {waited:.0f}s while {queued} other pending pod(s) could use {node.name}'s GPUs")
        out.append(Reservation(pod.key, pod_token(pod), node.name, pool, gpus, reason=(
            f"{pod.key} asks for {gpus} GPUs (more than {config.large_fraction:.0%} of {node.name}'s "
            f"{node_slots(node, snapshot)} slots) and {when}: {node.name} is reserved for it "
            f"({used.get(node.name, 0)} GPU(s) in use there to drain)")))
        busy_nodes.add(node.name)
        per_pool[pool] = per_pool.get(pool, 0) + 1
    return tuple(out)


def earliest_reservation_age(config: ReservationConfig) -> float:
    """The youngest a large pod may be when it gets a reservation (quiet or not)."""
    if config.quiet_age_seconds is None:
        return config.min_age_seconds
    return min(config.min_age_seconds, config.quiet_age_seconds)


def _queued_behind(pending: Iterable[PodInfo], pod: PodInfo, node: NodeInfo, cache: RequestCache) -> int:
    """Other pending pods asking for the node's kind of GPU: the pods a reservation of the node would make wait."""
    return sum(1 for other in pending if other is not pod and cache.get(other).gpus(node.gpu_resource))


def _gpus_in_use(snapshot: Snapshot, cache: RequestCache) -> dict[str, int]:
    """GPUs of each node's kind its bound pods ask for, by node name."""
    resource = {n.name: n.gpu_resource for n in snapshot.nodes}
    used: dict[str, int] = {}
    for pod in snapshot.pods:
        if pod.node_name in resource:
            used[pod.node_name] = used.get(pod.node_name, 0) + cache.requests(pod).get(resource[pod.node_name])
    return used


def _choose_node(snapshot: Snapshot, config: ReservationConfig, pod: PodInfo, cache: RequestCache,
                 used: dict[str, int], busy_nodes: set[str], per_pool: dict[str, int]
                 ) -> Optional[tuple[NodeInfo, str, int]]:
    """The node to reserve for `pod`. First one it could start on as soon as free and idle GPUs reach it (`_ready`),
    the one holding most GPUs. Else, of the nodes that could gather what they lack from the free pool and other
    nodes' idle GPUs alone, the one already holding most GPUs (fewest to bring; its own come back as its pods end),
    then the fewest in use. Where every node must also wait for GPUs other nodes' pods still use (claims), the one
    with most GPUs in use: the node whose pods end last in expectation (the last of more running pods ends later),
    so the other nodes' GPUs are detached and attached while it drains instead of after (a detach and an attach on
    the pod's path otherwise)."""
    candidates: list[tuple[NodeInfo, GpuFacts, int]] = []
    for node in snapshot.nodes:
        if node.name in busy_nodes:
            continue
        hosting = _could_host(snapshot, config, pod, node, cache)
        if hosting is None or per_pool.get(hosting[0].pool or "", 0) >= config.per_pool:
            continue
        candidates.append((node, *hosting))
    if not candidates:
        return None
    spare = _spare_gpus(snapshot, used, busy_nodes)
    ready = [c for c in candidates if _ready(snapshot, c[0], c[1], c[2], pod, used, spare, cache)]
    unclaimed = [c for c in candidates if c[2] - c[1].capacity - _spare_elsewhere(spare, c[0], c[1]) <= 0]
    if ready:  # it can start as soon as free and idle GPUs reach it
        node, facts, gpus = min(ready, key=lambda c: (-c[1].capacity, used.get(c[0].name, 0), c[0].name))
    elif unclaimed:
        node, facts, gpus = min(unclaimed, key=lambda c: (-c[1].capacity, used.get(c[0].name, 0), c[0].name))
    else:
        node, facts, gpus = min(candidates, key=lambda c: (-used.get(c[0].name, 0), -c[1].capacity, c[0].name))
    return node, facts.pool or "", gpus


def _could_host(snapshot: Snapshot, config: ReservationConfig, pod: PodInfo, node: NodeInfo, cache: RequestCache
                ) -> Optional[tuple[GpuFacts, int]]:
    """The node's GPU facts and the GPUs `pod` asks for there, when the pod is large for the node and the node could
    hold it once drained and gathered; else None."""
    req = cache.get(pod)
    gpus = req.gpus(node.gpu_resource)
    slots = node_slots(node, snapshot)
    if not gpus or gpus <= config.large_fraction * slots or gpus > slots:
        return None
    facts = gpu_facts(node, snapshot, None)
    if not facts.attachable or facts.pool is None:
        return None
    a = node.allocatable
    if req.requests.milli_cpu > a.milli_cpu or req.requests.memory > a.memory:
        return None  # it could never hold the pod, however long it drains
    view = sim_node(node, snapshot, None).with_model(_model_of(facts) or None)
    if first_reject(STATIC_FILTERS, req, view, _NoPods()) is not None:
        return None
    return facts, gpus


def _model_of(facts: GpuFacts) -> str:
    """The GPU model a node takes: the one it holds, else the first its group allows ("" when it allows any)."""
    return facts.model or (facts.allowed_models[0] if facts.allowed_models else "")


def _spare_gpus(snapshot: Snapshot, used: dict[str, int], reserved: set[str]) -> dict[tuple[str, str], dict[str, int]]:
    """Per (pool, model): the free devices (under the key "") and each unreserved node's GPUs no pod uses."""
    spare: dict[tuple[str, str], dict[str, int]] = {}
    for pool in snapshot.pools:
        for model, count in pool.free.items():
            spare.setdefault((pool.name, model), {})[""] = max(0, int(count))
    for node in snapshot.nodes:
        if node.name in reserved or node.group_id is None:
            continue
        facts = gpu_facts(node, snapshot, None)
        idle = facts.capacity - used.get(node.name, 0)
        if facts.pool is not None and facts.model and idle > 0:
            spare.setdefault((facts.pool, facts.model), {})[node.name] = idle
    return spare


def _spare_elsewhere(spare: dict[tuple[str, str], dict[str, int]], node: NodeInfo, facts: GpuFacts) -> int:
    """GPUs a reservation of `node` could gather without waiting for any pod: free in its pool, idle on other nodes."""
    model = _model_of(facts)
    return sum(count for name, count in spare.get((facts.pool or "", model), {}).items() if name != node.name)


@dataclass
class _Gathered:
    attaches: list[Attach]
    detaches: list[Detach]
    claimed: list[tuple[str, str]]
    notes: list[str]


def without_gathered(snapshot: Snapshot, plan: ReservationPlan) -> Snapshot:
    """`snapshot` less the free pool devices its reservations still lack: what the rest of a pass may attach.

    A pass plans its reservations first and is planned again once they are carried out; devices that reached the pool
    in between (a detach that completed, another node's GPUs released) are the reservation's to gather on its next
    pass, not the fast path's or headroom's to give to the next small pod (which would fill the slots the large pod
    waits on, and a reservation could then wait for ever)."""
    short: dict[tuple[str, str], int] = {}
    nodes = {n.name: n for n in snapshot.nodes}
    for r in plan.reservations:
        node = nodes.get(r.node)
        if node is None:
            continue
        facts = gpu_facts(node, snapshot, None)
        missing = min(r.gpus - facts.capacity, facts.free_slots)
        model = _model_of(facts)
        if missing > 0:
            short[(r.pool, model)] = short.get((r.pool, model), 0) + missing
    if not short:
        return snapshot
    pools = tuple(replace(p, free={m: max(0, c - short.get((p.name, m), 0)) for m, c in p.free.items()})
                  if any(pool == p.name for pool, _ in short) else p for p in snapshot.pools)
    return replace(snapshot, pools=pools)


def _gather(snapshot: Snapshot, reservations: Sequence[Reservation], cache: RequestCache, planner: PlannerConfig,
            used: dict[str, int]) -> _Gathered:
    """Free pool devices first, then idle GPUs of unreserved nodes of the same pool, then claims on the GPUs other
    nodes' pods still use (`used`: GPUs in use per node), up to each reserved node's shortfall. A busy device-plugin node gives no idle GPU now (the
    operator would refuse the detach until the node is idle): it can only be claimed, and then gives all of its GPUs
    once its pods end."""
    nodes = {n.name: n for n in snapshot.nodes}
    reserved = {r.node for r in reservations}
    pool_free = {(p.name, m): max(0, int(c)) for p in snapshot.pools for m, c in p.free.items()}
    held = nodes_held_by_load(snapshot, planner, cache)
    idle = _idle_devices(snapshot, used, reserved | held)
    out = _Gathered([], [], [], [])
    claimed: set[str] = set()
    for r in reservations:
        node = nodes[r.node]
        facts = gpu_facts(node, snapshot, None)
        missing = min(r.gpus - facts.capacity, facts.free_slots)
        if missing <= 0:
            continue
        model = _model_of(facts)
        take = min(missing, pool_free.get((r.pool, model), 0))
        if take:
            pool_free[(r.pool, model)] -= take
            out.attaches.append(Attach(node=r.node, pool=r.pool, model=model, count=take, pods=(r.pod,),
                                       reason=f"{take} {model} GPU(s) gathered on {r.node}, reserved for {r.pod}"))
        still = missing - take
        donors = [name for name in idle if gpu_facts(nodes[name], snapshot, None).pool == r.pool]
        for other in donors:
            if still <= 0:
                break
            chosen = tuple(d.id for d in idle[other] if d.model == model)[:still]
            if not chosen:
                continue
            idle[other] = tuple(d for d in idle[other] if d.id not in chosen)
            still -= len(chosen)
            out.detaches.append(Detach(node=other, device_ids=chosen, reason=(
                f"{len(chosen)} idle GPU(s) of {other} released now for {r.node}, reserved for {r.pod}")))
        for other in _busy_donors(snapshot, r, model, used, reserved | claimed):
            if still <= 0:
                break
            claimed.add(other.name)
            out.claimed.append((other.name, r.token))
            of_model = sum(1 for d in other.devices if d.model == model)
            still -= of_model if other.name in held else min(used.get(other.name, 0), of_model)
        if still > 0:
            out.notes.append(f"{r.node} (reserved for {r.pod}) lacks {still} GPU(s) the pool cannot supply")
    return out


def _busy_donors(snapshot: Snapshot, r: Reservation, model: str, used: dict[str, int], skip: set[str]
                 ) -> list[NodeInfo]:
    """Unreserved nodes of the reservation's pool whose pods use GPUs of its model, most such GPUs first."""
    found = []
    for node in snapshot.nodes:
        if node.name in skip or node.group_id is None or not used.get(node.name):
            continue
        if gpu_facts(node, snapshot, None).pool != r.pool or not any(d.model == model for d in node.devices):
            continue
        found.append(node)
    return sorted(found, key=lambda n: (-min(used[n.name], len(n.devices)), n.name))


def _idle_devices(snapshot: Snapshot, used: dict[str, int], reserved: Iterable[str]) -> dict[str, tuple]:
    """Per unreserved DDS node (name order), its attached devices no bound pod uses, newest attached first."""
    skip = set(reserved)
    out: dict[str, tuple] = {}
    for node in sorted(snapshot.nodes, key=lambda n: n.name):
        if node.name in skip or node.group_id is None or not node.devices:
            continue
        leaving = set(node.detaching)
        active = [d for d in node.devices if d.id not in leaving]
        idle = len(active) - used.get(node.name, 0)
        if idle > 0:  # a device allocated to a ResourceClaim is never taken
            out[node.name] = tuple(sorted((d for d in active if not d.in_claim), key=lambda d: (d.attached_at, d.id), reverse=True)[:idle])
    return out


def keep_reserved(plan: ScaleDownPlan, nodes: Iterable[str]) -> ScaleDownPlan:
    """Scale-down without the reserved nodes: their idle GPUs are being gathered, not left over."""
    reserved = set(nodes)
    if not reserved:
        return plan
    dropped = {d.node for d in plan.detaches if d.node in reserved} | {r.node for r in plan.removals
                                                                          if r.node in reserved}
    if not dropped:
        return plan
    kept = plan.kept + tuple(Keep(n, "reserved for a large pending pod: its GPUs are being gathered, not released")
                             for n in sorted(dropped))
    return replace(plan, detaches=tuple(d for d in plan.detaches if d.node not in reserved),
                   removals=tuple(r for r in plan.removals if r.node not in reserved), kept=kept,
                   idle_past_cooldown=tuple(i for i in plan.idle_past_cooldown if i.node not in reserved))
