"""ProvisioningRequests of DDS's class: capacity gathered for a job before its pods exist, booked until they bind.

Kueue creates a request (autoscaling.x-k8s.io/v1) naming pod sets (count x PodTemplate) and admits the job only once
the request is `Provisioned=True` (docs/kueue.md). This decides, per request of DDS's class and on one snapshot (no
I/O, no clock), what the control loop does for it (dds/controller/provisioning.py carries it out):

| request's state                       | decision                                                                                    |
|---------------------------------------|---------------------------------------------------------------------------------------------|
| malformed (`error`)                   | `Failed=True` (reason `InvalidRequest`), an Event; nothing planned                          |
| not yet provisioned                   | its pod sets planned as one gang of virtual pending pods, all or nothing (gangs.py): attaches on live nodes first, new nodes only for what attaches cannot serve. The nodes it uses are booked (taint `dds.cdi.dev/booked-for=<uid>:NoSchedule`, which only its pods tolerate). All pods fit as the nodes are: `Provisioned=True`; GPUs or nodes still coming: `Provisioned=False` with what is coming; the gang does not fit whole: `Failed=True` with why, nothing booked or attached |
| provisioned, pods not all bound       | its pods (annotation `autoscaling.x-k8s.io/consume-provisioning-request`) get the toleration; the booked nodes, as they are, no longer hold the pods still to come (a node deleted, NotReady or being removed, GPUs failed or detached by someone else): `CapacityRevoked=True` with why, an Event, the nodes released (Kueue deactivates the job); past `booking_seconds` after `Provisioned`: `BookingExpired=True`, the nodes released |
| provisioned, pods all bound           | its nodes released; `Provisioned` stays True with reason `CapacityConsumed` (the booking served its pods: a pod replaced later is never taken for capacity lost) |
| failed; expired; revoked              | its nodes released                                                                          |
| deleted (its uid on a node, no request) | its nodes released (only when every request was read)                                     |

Requests of cluster-autoscaler's `best-effort-atomic-scale-up.autoscaling.x-k8s.io` class are CA's: it writes their
conditions, and its scale-up for one reaches DDS as an IncreaseSize with no pod behind it. DDS plans them only inside
that call (`plan_atomic_scale_up`: the same gang planning and booking, Events and no condition); each pass then holds
what was booked for them (`_hold_for_cluster_autoscaler`: the pods let in; released once they bound, at the booking's
bound, or when CA ends the request), with Events only. No `CapacityRevoked` is said of them (docs/kueue.md).

Why a taint and a toleration: the same reason as reservations (docs/reservations.md): kube-scheduler must not give
the gathered GPUs to another pod at any instant, and only a taint the waiting pods tolerate does that without a race.
A released node's idle GPUs go back with the ordinary idle scale-down; while booked, they are kept from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence

from dds.model.groups import Taint
from dds.model.plan import Attach, PlannerConfig, PodDecision, ScaleUpPlan, Verdict
from dds.model.provisioning import (ACCEPTED, BOOKED_EFFECT, BOOKED_TAINT_KEY, BOOKING_EXPIRED, CAPACITY_CONSUMED,
                                    CAPACITY_REVOKED, DEFAULT_CLASS, FAILED, PROVISIONED, ProvisioningRequest,
                                    ProvisioningView)
from dds.model.snapshot import NodeInfo, PodInfo, Snapshot, Toleration
from dds.planner import plan_scale_up
from dds.planner.equip import equip_every_group
from dds.planner.gangs import GANG_LARGER_THAN_CLUSTER, placed_pods, whole_gangs_after_cut
from dds.planner.existing import FastExisting
from dds.planner.memos import PlannerMemos
from dds.planner.requests import RequestCache, scheduling_order
from dds.planner.state import ClusterState

# Condition reasons DDS writes (Kueue shows the message; the reason is for people and tools).
REASON_ACCEPTED = "AcceptedByDDS"
REASON_PROVISIONING = "AttachingCapacity"
REASON_PROVISIONED = "CapacityAttached"
REASON_NOT_FOUND = "CapacityNotFound"
REASON_TOO_LARGE = "LargerThanCluster"
REASON_INVALID = "InvalidRequest"
REASON_EXPIRED = "BookingExpired"
# Provisioned stays True once every pod bound; the reason says the booking has served them (so a pod replaced later is
# never taken for capacity lost). Kueue reads only the status once admitted (controller.go, syncCheckStates).
REASON_CONSUMED = CAPACITY_CONSUMED
REASON_REVOKED = "BookedCapacityLost"  # CapacityRevoked=True: Kueue deactivates the job (it would wait for nothing)
EVENT_REVOKED = "CapacityRevoked"

WithAttaches = Callable[[Snapshot, Sequence[Attach]], Snapshot]


@dataclass(frozen=True)
class ProvisioningConfig:
    class_name: str = DEFAULT_CLASS  # settings.provisioning_class ("" = DDS serves no ProvisioningRequest)
    booking_seconds: float = 600.0  # settings.provisioning_booking_seconds: how long booked capacity waits for pods

    @property
    def enabled(self) -> bool:
        return bool(self.class_name)


@dataclass(frozen=True)
class ConditionChange:
    kind: str  # Accepted, Provisioned, Failed, BookingExpired, CapacityRevoked
    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class RequestDecision:
    """What this pass does for one request: its conditions (only those that change) and an Event."""

    request: ProvisioningRequest
    conditions: tuple[ConditionChange, ...] = ()
    event_reason: str = ""  # empty: no Event
    event_message: str = ""
    warning: bool = False


@dataclass(frozen=True)
class ProvisioningPlan:
    decisions: tuple[RequestDecision, ...] = ()
    book: tuple[tuple[str, str], ...] = ()  # (node, request uid): taint now
    release: tuple[str, ...] = ()  # nodes whose booked-for taint goes
    tolerate: tuple[tuple[str, str], ...] = ()  # (pod key, request uid): the pod gets the booking's toleration
    attaches: tuple[Attach, ...] = ()
    new_nodes: Optional[ScaleUpPlan] = None  # nodes the requests need that attaches cannot serve
    booked_by: tuple[tuple[str, str], ...] = ()  # (node, uid) booked after this pass
    consumers: frozenset[str] = frozenset()  # pending pods whose capacity is booked: not the fast path's to serve
    served: tuple[str, ...] = ()  # plan_atomic_scale_up: the requests whose every pod has its capacity (keys)

    @property
    def booked(self) -> frozenset[str]:
        """Nodes booked after this pass: kept from scale-down, moves and headroom."""
        return frozenset(node for node, _ in self.booked_by)

    def as_booked(self, snapshot: Snapshot) -> Snapshot:
        """`snapshot` as it is once this plan's bookings are on the nodes."""
        return _as_booked(snapshot, dict(self.booked_by))

    @property
    def changes_cluster(self) -> bool:
        return bool(self.book or self.release or self.attaches or (self.new_nodes and self.new_nodes.new_nodes))


def booked_token(node_taints: Sequence[Taint]) -> Optional[str]:
    return next((t.value for t in node_taints if t.key == BOOKED_TAINT_KEY), None)


def booking_toleration(uid: str) -> Toleration:
    return Toleration(key=BOOKED_TAINT_KEY, operator="Equal", value=uid, effect=BOOKED_EFFECT)


def virtual_pods(request: ProvisioningRequest) -> list[PodInfo]:
    """The request's pod sets as the pending pods Kueue will create: one gang, all of them needed at once."""
    total = request.pods
    toleration = booking_toleration(request.uid)
    pods = []
    for index, pod_set in enumerate(request.pod_sets):
        for number in range(pod_set.count):
            pods.append(replace(pod_set.template, namespace=request.namespace,
                                name=f"{request.name}.podset-{index}.{number}", uid="", node_name=None,
                                created_at=request.created_at, pod_group=f"provisioningrequest.{request.name}",
                                pod_group_min_member=total, workload_ref=None, scheduling_group=None,
                                consumes_provisioning_request=None,
                                tolerations=pod_set.template.tolerations + (toleration,)))
    return pods


@dataclass
class _Pass:
    snapshot: Snapshot
    config: ProvisioningConfig
    planner: PlannerConfig
    memos: PlannerMemos
    with_attaches: WithAttaches
    booked: dict[str, str] = field(default_factory=dict)  # node -> uid, as it will be after this pass
    decisions: list[RequestDecision] = field(default_factory=list)
    book: list[tuple[str, str]] = field(default_factory=list)
    release: list[str] = field(default_factory=list)
    tolerate: list[tuple[str, str]] = field(default_factory=list)
    attaches: list[Attach] = field(default_factory=list)
    new_nodes: list[ScaleUpPlan] = field(default_factory=list)
    consumers: set[str] = field(default_factory=set)


def plan_provisioning(snapshot: Snapshot, view: ProvisioningView, config: ProvisioningConfig,
                      planner: PlannerConfig, with_attaches: WithAttaches, *,
                      memos: Optional[PlannerMemos] = None) -> ProvisioningPlan:
    """The pass's decisions for every request of `view` (oldest first: an older request's gang is planned before a
    younger one's, on what it leaves). `with_attaches`: the snapshot as it is once attaches are started
    (dds/planner/passes.py)."""
    if not config.enabled:
        return ProvisioningPlan()
    work = _Pass(snapshot, config, planner, memos if memos is not None else PlannerMemos(), with_attaches)
    for node in snapshot.nodes:
        token = booked_token(node.taints)
        if token is not None:
            work.booked[node.name] = token
    live = {r.uid for r in view.requests}
    if view.complete:
        for node, token in sorted(work.booked.items()):
            if token not in live:
                _release_nodes(work, token)
    for request in sorted(view.requests, key=lambda r: (r.created_at, r.key)):
        _decide(work, request)
    return _plan_of(work)


def _plan_of(work: _Pass, served: Sequence[str] = ()) -> ProvisioningPlan:
    new_nodes = None
    if work.new_nodes:
        new_nodes = ScaleUpPlan(new_nodes=tuple(n for p in work.new_nodes for n in p.new_nodes),
                                decisions=tuple(d for p in work.new_nodes for d in p.decisions))
    return ProvisioningPlan(decisions=tuple(d for d in work.decisions if d.conditions or d.event_reason),
                            book=tuple(work.book), release=tuple(work.release), tolerate=tuple(work.tolerate),
                            attaches=tuple(work.attaches), new_nodes=new_nodes,
                            booked_by=tuple(sorted(work.booked.items())), consumers=frozenset(work.consumers),
                            served=tuple(served))


def _decide(work: _Pass, request: ProvisioningRequest) -> None:
    if request.cluster_autoscalers:
        _hold_for_cluster_autoscaler(work, request)
        return
    accepted = () if request.is_true(ACCEPTED) else (
        ConditionChange(ACCEPTED, "True", REASON_ACCEPTED, f"DDS serves class {work.config.class_name}"),)
    if request.error is not None:
        if not request.is_true(FAILED):
            work.decisions.append(RequestDecision(request, accepted + (
                ConditionChange(FAILED, "True", REASON_INVALID, request.error),), event_reason=REASON_INVALID,
                event_message=f"refused: {request.error}", warning=True))
        return
    if request.is_true(FAILED) or request.is_true(BOOKING_EXPIRED) or request.is_true(CAPACITY_REVOKED):
        _release_nodes(work, request.uid)
        return
    if request.is_true(PROVISIONED):
        _provisioned(work, request)
        return
    _provision(work, request, accepted)


def _release_nodes(work: _Pass, uid: str) -> None:
    for node in sorted(n for n, token in work.booked.items() if token == uid):
        del work.booked[node]
        work.release.append(node)


def _consumers(snapshot: Snapshot, request: ProvisioningRequest) -> list[PodInfo]:
    """The request's pods: pending, bound, and those that were bound and have ended (a short job's pod may bind and
    end between two passes; missing it would keep its booking until it expires)."""
    return [p for p in (*snapshot.pods, *snapshot.ended_consumers)
            if p.namespace == request.namespace and p.consumes_provisioning_request == request.name]


def _provisioned(work: _Pass, request: ProvisioningRequest) -> None:
    """Booked capacity waits for the request's pods: they tolerate it, and it is released once they are all bound
    (`Provisioned` then says so), once the booking's bound has passed (`BookingExpired`), or once the booked nodes can
    no longer hold the pods still to come (`CapacityRevoked`)."""
    provisioned = request.conditions[PROVISIONED]
    if provisioned.reason == REASON_CONSUMED:
        return  # the booking served its pods: a pod replaced since is an ordinary pod
    pods = _consumers(work.snapshot, request)
    bound = sum(1 for p in pods if p.node_name is not None)
    if bound >= request.pods:
        nodes = _booked_for(work, request.uid)
        _release_nodes(work, request.uid)
        where = f"the booking on {', '.join(nodes)} is released" if nodes else "nothing is booked for them any more"
        work.decisions.append(RequestDecision(request, (ConditionChange(
            PROVISIONED, "True", REASON_CONSUMED, f"all {request.pods} pod(s) of the request bound: {where}"),)))
        return
    lost = _capacity_lost(work, request, pods)
    if lost:
        _release_nodes(work, request.uid)
        message = (f"{bound} of the request's {request.pods} pod(s) bound; the capacity booked for the others is "
                   f"lost: {lost}; what is left of the booking is released")
        work.decisions.append(RequestDecision(request, (
            ConditionChange(CAPACITY_REVOKED, "True", REASON_REVOKED, message),), event_reason=EVENT_REVOKED,
            event_message=message, warning=True))
        return
    waited = work.snapshot.now - provisioned.since
    if waited >= work.config.booking_seconds:
        nodes = _booked_for(work, request.uid)
        _release_nodes(work, request.uid)
        message = (f"{bound} of the request's {request.pods} pod(s) bound within {work.config.booking_seconds:.0f}s "
                   f"of Provisioned (provisioning_booking_seconds): the capacity booked on {', '.join(nodes)} is "
                   f"released to other pods")
        work.decisions.append(RequestDecision(request, (
            ConditionChange(BOOKING_EXPIRED, "True", REASON_EXPIRED, message),), event_reason=REASON_EXPIRED,
            event_message=message, warning=True))
        return
    _let_consumers_in(work, request, pods)


def _let_consumers_in(work: _Pass, request: ProvisioningRequest, pods: Sequence[PodInfo]) -> None:
    """The request's pending pods get the booking's toleration, and are left to it (not the fast path's to serve)."""
    toleration = booking_toleration(request.uid)
    for pod in pods:
        if pod.node_name is None:
            work.consumers.add(pod.key)
            if toleration not in pod.tolerations:
                work.tolerate.append((pod.key, request.uid))


def _booked_for(work: _Pass, uid: str) -> list[str]:
    return sorted(n for n, token in work.booked.items() if token == uid)


def _capacity_lost(work: _Pass, request: ProvisioningRequest, consumers: Sequence[PodInfo]) -> str:
    """Why the nodes booked for a provisioned request can no longer hold its pods not bound yet, as they are now (a
    booked node deleted, NotReady or being removed, booked GPUs failed or detached by someone else); "" while they
    can. Only what is live and attached counts: no attach, no new node, no node of another booking."""
    waiting = _waiting_pods(request, consumers)
    if not waiting:
        return ""
    booked = {n.name: n for n in work.snapshot.nodes if work.booked.get(n.name) == request.uid}
    if not booked:
        return "no node booked for it is left (deleted)"
    usable = tuple(n for n in booked.values() if n.ready and not n.being_deleted)
    memos = PlannerMemos()
    cache = RequestCache(memos.requests)
    # The booked nodes and their pods only: a pass asks this of every booked request, not of the whole cluster.
    on_them = tuple(p for n in usable for p in work.snapshot.pods_on(n.name))
    view = replace(work.snapshot, nodes=usable, pods=on_them, pools=(), upcoming_nodes={}, ended_consumers=())
    live = FastExisting(ClusterState(view, cache, None, extra_pods=waiting, memos=memos), work.planner.policy)
    short, why = 0, ""
    for pod in sorted(waiting, key=scheduling_order):  # one after the other, each taking what it fits in
        req = cache.get(pod)
        choice = live.fits_now(req)
        if choice is None:
            short += 1
            why = why or live.explain(req, with_gpus=False).summary()
            continue
        live.commit(req, choice)
    if not short:
        return ""
    states = "; ".join(f"{n.name} ({_node_state(n)})" for n in sorted(booked.values(), key=lambda n: n.name))
    return f"{short} pod(s) no longer fit the booked nodes: {states} ({why})"


def _node_state(node: NodeInfo) -> str:
    state = "NotReady" if not node.ready else "being removed" if node.being_deleted else "Ready"
    return f"{state}, {len(node.devices)} GPU(s) attached"


def _waiting_pods(request: ProvisioningRequest, consumers: Sequence[PodInfo]) -> list[PodInfo]:
    """The request's pods not bound yet, as the booking must hold them: those Kueue made that are pending (with the
    booking's toleration), and for those not made yet the pod sets' templates (one per consumer crossed off, the one
    of its shape first). Planned each on its own merits, not as a gang: only their joint fit is asked."""
    toleration = booking_toleration(request.uid)
    left = virtual_pods(request)
    for consumer in consumers:
        if not left:
            break
        same = next((i for i, v in enumerate(left) if v.containers == consumer.containers), 0)
        del left[same]
    pending = [p if toleration in p.tolerations else replace(p, tolerations=p.tolerations + (toleration,))
               for p in consumers if p.node_name is None]
    return [replace(p, pod_group=None, pod_group_min_member=0) for p in (*pending, *left)]


def _provision(work: _Pass, request: ProvisioningRequest, accepted: tuple[ConditionChange, ...]) -> None:
    snapshot = _as_booked(work.with_attaches(work.snapshot, work.attaches), work.booked)
    pods = virtual_pods(request)
    plan = _plan_gang(work, snapshot, pods)
    keys = {p.key for p in pods}
    placed = placed_pods(plan) & keys
    mine = [d for d in plan.decisions if d.pod in keys]
    if len(placed) < len(pods):
        _release_nodes(work, request.uid)  # all or nothing: what an earlier pass gathered goes too
        refused = next((d for d in mine if d.pod not in placed), None)
        why = refused.reason if refused is not None and refused.reason else "no capacity found for every pod at once"
        reason = REASON_NOT_FOUND
        if refused is not None and refused.refusal == GANG_LARGER_THAN_CLUSTER:
            reason = REASON_TOO_LARGE
        message = f"{request.pods} pod(s) cannot all get GPUs at once, nothing attached or added: {why}"
        work.decisions.append(RequestDecision(request, accepted + (
            ConditionChange(FAILED, "True", reason, message),), event_reason=reason, event_message=message,
            warning=True))
        return
    nodes = sorted({d.node for d in mine if d.node})
    for node in sorted(n for n, token in work.booked.items() if token == request.uid and n not in nodes):
        del work.booked[node]  # booked in an earlier pass for a placement this plan no longer uses
        work.release.append(node)
    for node in nodes:
        if work.booked.get(node) != request.uid:
            work.booked[node] = request.uid
            work.book.append((node, request.uid))
    if _all_in_place(snapshot, plan, mine):
        message = f"{request.pods} pod(s) fit now on {_where(snapshot, mine)}; booked for them for " \
                  f"{work.config.booking_seconds:.0f}s"
        work.decisions.append(RequestDecision(request, accepted + (
            ConditionChange(PROVISIONED, "True", REASON_PROVISIONED, message),), event_reason=REASON_PROVISIONED,
            event_message=message))
        return
    work.attaches.extend(plan.attaches)
    if plan.new_nodes:
        work.new_nodes.append(replace(plan, attaches=()))
    message = _coming(snapshot, plan, mine)
    changes = accepted + (ConditionChange(PROVISIONED, "False", REASON_PROVISIONING, message),)
    current = request.conditions.get(PROVISIONED)
    if current is not None and (current.status, current.reason, current.message) == ("False", REASON_PROVISIONING,
                                                                                    message):
        changes = accepted
    if plan.attaches or plan.new_nodes:  # something started this pass: said once, not every pass it is awaited
        work.decisions.append(RequestDecision(request, changes, event_reason=REASON_PROVISIONING,
                                              event_message=message))
    else:
        work.decisions.append(RequestDecision(request, changes))


def _all_in_place(snapshot: Snapshot, plan: ScaleUpPlan, decisions: Sequence[PodDecision]) -> bool:
    """Every pod fits a live, ready node whose GPUs are all online: not once GPUs already attaching are there, not on
    a node on its way (the planner says FITS_NOW of both)."""
    if plan.attaches or plan.new_nodes:
        return False
    nodes = {n.name: n for n in snapshot.nodes}
    for decision in decisions:
        node = nodes.get(decision.node or "")
        if decision.verdict != Verdict.FITS_NOW or node is None or not node.ready or node.attaching:
            return False
    return True


def _plan_gang(work: _Pass, snapshot: Snapshot, pods: list[PodInfo]) -> ScaleUpPlan:
    """Attaches on live nodes first; only when they cannot serve the whole gang, new nodes for the rest (cut to what
    the pools can equip, all or nothing)."""
    live = replace(work.planner, allow_new_nodes=False)
    plan = plan_scale_up(snapshot, live, pods, memos=work.memos)
    if len(placed_pods(plan) & {p.key for p in pods}) == len(pods):
        return plan
    config = replace(work.planner, allow_new_nodes=True)

    def cut(full: ScaleUpPlan):
        equipped, taken = equip_every_group(work.with_attaches(snapshot, full.attaches), full)
        return replace(equipped, attaches=full.attaches), taken

    return whole_gangs_after_cut(plan_scale_up(snapshot, config, pods, memos=work.memos), cut,
                                 lambda chosen: plan_scale_up(snapshot, config, chosen, memos=work.memos),
                                 snapshot, pods, memos=work.memos).plan


def _as_booked(snapshot: Snapshot, booked: dict[str, str]) -> Snapshot:
    """The snapshot with this pass's bookings already on the nodes: a younger request is never planned onto them."""
    changed = False
    nodes = []
    for node in snapshot.nodes:
        token = booked.get(node.name)
        if token is not None and booked_token(node.taints) != token:
            taints = tuple(t for t in node.taints if t.key != BOOKED_TAINT_KEY)
            node = replace(node, taints=taints + (Taint(key=BOOKED_TAINT_KEY, value=token, effect=BOOKED_EFFECT),))
            changed = True
        nodes.append(node)
    return replace(snapshot, nodes=tuple(nodes)) if changed else snapshot


def _where(snapshot: Snapshot, decisions: Sequence[PodDecision]) -> str:
    per_node: dict[str, int] = {}
    for d in decisions:
        if d.node:
            per_node[d.node] = per_node.get(d.node, 0) + 1
    nodes = {n.name: n for n in snapshot.nodes}
    parts = []
    for name, count in sorted(per_node.items()):
        node = nodes.get(name)
        models = sorted({dev.model for dev in node.devices}) if node is not None else []
        gpus = f", {len(node.devices)} GPU(s) attached ({', '.join(models)})" if node is not None and node.devices \
            else ""
        parts.append(f"{name} ({count} pod(s){gpus})")
    return "; ".join(parts)


def _coming(snapshot: Snapshot, plan: ScaleUpPlan, decisions: Sequence[PodDecision]) -> str:
    """What the request still waits for: this pass's attaches and new nodes, or those already on their way."""
    parts = [f"{a.count} x {a.model} from pool {a.pool} to {a.node}" for a in plan.attaches]
    parts += [f"{n.count} new node(s) of group {n.group}" for n in plan.new_nodes]
    if parts:
        return "attaching " + "; ".join(parts)
    nodes = {n.name: n for n in snapshot.nodes}
    attaching = sorted({d.node for d in decisions if d.node in nodes and nodes[d.node].attaching})
    groups = sorted({d.group for d in decisions if d.node is None and d.group})
    waits = [f"the GPUs already attaching to {', '.join(attaching)}"] if attaching else []
    waits += [f"the node(s) of group {', '.join(groups)} on their way"] if groups else []
    return "waiting for " + (" and ".join(waits) or "the nodes to be ready")


# --- cluster-autoscaler's atomic class (best-effort-atomic-scale-up.autoscaling.x-k8s.io) ---
#
# CA writes every condition of these requests. Its scale-up for one reaches DDS as `NodeGroupIncreaseSize(group,
# delta)` with no pod behind it (the job's pods do not exist until Kueue admits it; externalgrpc has no
# AtomicIncreaseSize), and CA writes `Provisioned=True` as soon as that call succeeds (besteffortatomic/
# provisioning_class.go). So DDS plans such a request only inside CA's call (plan_atomic_scale_up), exactly as its own
# class (`_provision`), and the loop's passes only hold what was booked for it until its pods bind or the bound passes.

REASON_RELEASED = "BookingReleased"
EVENT_CONSUMED = "CapacityConsumed"  # the Event saying a CA request's pods all bound (REASON_CONSUMED, as an Event)


def plan_atomic_scale_up(snapshot: Snapshot, view: ProvisioningView, config: ProvisioningConfig,
                         planner: PlannerConfig, with_attaches: WithAttaches, trigger: str, *,
                         memos: Optional[PlannerMemos] = None) -> ProvisioningPlan:
    """CA's IncreaseSize that no pending pod explains, planned for the requests of CA's atomic class CA has not said
    Provisioned of: each one gang, oldest first, each on what the earlier leave, with DDS's own class's planning
    (attaches on live nodes first, new nodes only for what attaches cannot serve, all or nothing; the nodes used
    booked for the request). `planner`: restricted to the group CA asked. `served`: the requests whose every pod has
    its capacity (now, or on its way). No condition is planned (CA's); each request gets an Event saying what is
    attached or added for it, or why nothing, `trigger` first."""
    work = _Pass(snapshot, config, planner, memos if memos is not None else PlannerMemos(), with_attaches)
    for node in snapshot.nodes:
        token = booked_token(node.taints)
        if token is not None:
            work.booked[node.name] = token
    served = []
    for request in sorted((r for r in view.requests if _awaits_cluster_autoscaler(r)),
                          key=lambda r: (r.created_at, r.key)):
        _provision(work, request, accepted=())
        decision = work.decisions.pop()
        if not decision.warning:
            served.append(request.key)
        message = f"{trigger}: {decision.event_message}" if decision.event_reason else ""
        work.decisions.append(replace(decision, conditions=(), event_message=message))
    return _plan_of(work, served)


def _awaits_cluster_autoscaler(request: ProvisioningRequest) -> bool:
    """Of CA's atomic class, readable, and not yet Provisioned, Failed or ended: what CA's scale-up may be for."""
    return (request.cluster_autoscalers and request.error is None
            and not any(request.is_true(k) for k in (PROVISIONED, FAILED, BOOKING_EXPIRED, CAPACITY_REVOKED)))


def _hold_for_cluster_autoscaler(work: _Pass, request: ProvisioningRequest) -> None:
    """A request of CA's atomic class in the loop's pass: what DDS booked for it in CA's IncreaseSize is held, its
    pods let in, until they have all bound, or the booking's bound passes (`provisioning_booking_seconds` from CA's
    `Provisioned=True`, as CA's own booking; or from CA's latest attempt, `Accepted`, while CA has not said Provisioned
    of it), or CA ends the request. Only Events are written: the conditions are CA's."""
    nodes = _booked_for(work, request.uid)
    if not nodes:
        return  # nothing booked (served by nodes only, or released already): nothing to hold
    where = ", ".join(nodes)
    if request.error is not None or any(request.is_true(k) for k in (FAILED, BOOKING_EXPIRED, CAPACITY_REVOKED)):
        ended = "unreadable" if request.error is not None else next(
            k for k in (FAILED, BOOKING_EXPIRED, CAPACITY_REVOKED) if request.is_true(k))
        _release(work, RequestDecision(request, event_reason=REASON_RELEASED,
                                       event_message=f"the request is {ended}: the booking on {where} is released"))
        return
    provisioned = request.conditions.get(PROVISIONED)
    if provisioned is None or provisioned.status != "True":
        accepted = request.conditions.get(ACCEPTED)
        since = max(request.created_at, accepted.since if accepted is not None else 0.0)
        _hold_expired(work, request, since, "cluster-autoscaler has not said Provisioned of the request since its "
                      "scale-up", where)
        return
    pods = _consumers(work.snapshot, request)
    bound = sum(1 for p in pods if p.node_name is not None)
    if bound >= request.pods:
        _release(work, RequestDecision(
            request, event_reason=EVENT_CONSUMED,
            event_message=f"all {request.pods} pod(s) of the request bound: the booking on {where} is released"))
        return
    if _hold_expired(work, request, provisioned.since,
                     f"{bound} of the request's {request.pods} pod(s) bound since Provisioned", where):
        return
    _let_consumers_in(work, request, pods)


def _hold_expired(work: _Pass, request: ProvisioningRequest, since: float, what: str, where: str) -> bool:
    """Past the booking's bound since `since`: the booking released, with `what` said of it."""
    if work.snapshot.now - since < work.config.booking_seconds:
        return False
    _release(work, RequestDecision(
        request, event_reason=REASON_EXPIRED, warning=True,
        event_message=f"{what}, within {work.config.booking_seconds:.0f}s (provisioning_booking_seconds): the "
                      f"booking on {where} is released to other pods"))
    return True


def _release(work: _Pass, decision: RequestDecision) -> None:
    """The booking of `decision`'s request released, and said (an Event only: the conditions are CA's)."""
    _release_nodes(work, decision.request.uid)
    work.decisions.append(decision)
