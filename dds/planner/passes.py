"""One pass of DDS's decisions, in the order the control loop takes them — written once, for `dds serve` and
`dds simulate` alike.

`plan_pass` decides everything one pass of the control loop does on one snapshot, and nothing else: no I/O, no clock,
no state. The control loop (dds/controller/loop.py) carries its `PassPlan` out on the cluster; `dds simulate`
(dds/sim/engine.py) carries the same plan out on its simulated world, so the policy a simulation evaluates is the one
production runs. The order, and why:

| step           | what                                                                       | why here                                                                                  |
|----------------|----------------------------------------------------------------------------|-------------------------------------------------------------------------------------------|
| reservations   | nodes gathered for large pods that waited too long (`plan_reservations`)   | first: their GPUs are claimed before any other attach; applied, then the pass is planned again on what they changed, with the pool less what they still lack (`without_gathered`) |
| fast path      | GPUs attached for pending pods that fit live nodes once attached            | pods first; pods a reservation serves are left to it                                      |
| scale-down     | idle GPUs past their cooldown, empty nodes                                  | never from a pool a pending pod waits on (warm headroom), never a reserved node's GPUs    |
| room headroom  | idle GPUs for one more pod on each node with room (`move_idle_gpus`)        | only in a pass whose fast path attaches nothing: it counts on the pool as observed        |
| warm refill    | groups back to their warm GPUs                                              | after room headroom, on what it leaves (its GPUs count as warm)                           |
| nodes for claims | new nodes for pods with ResourceClaims no live node takes                 | cluster-autoscaler's templates carry no DRA devices, so the loop adds them                |
| moves          | idle GPUs released now for pods the fast path leaves waiting                | never from a reserved node or one this pass's scale-down already detaches from or removes |

Removals are the scale-down's `removals`: the node's GPUs are released first and the node goes once they are gone —
a lifecycle carried out by whoever applies the plan (dds/controller/removals.py; the simulator's own nodes).

What differs between the loop and the simulator is in `PassSettings` (what the caller asks for, e.g. the simulator
standing in for cluster-autoscaler as well) and `PassInputs` (what the caller observed), never in the order.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, Optional, Sequence

from dds.model.plan import Attach, Detach, PlannerConfig, ScaleDownPlan, ScaleUpPlan
from dds.model.snapshot import POD_GROUP_LABEL, PodInfo, Snapshot
from dds.planner import plan_scale_up
from dds.planner.dra import pods_needing_nodes
from dds.planner.equip import equip_every_group
from dds.planner.gangs import whole_gangs_after_cut
from dds.planner.headroom import hungry_pools, plan_warm_refill
from dds.planner.moves import plan_moves, plan_room_headroom
from dds.model.provisioning import ProvisioningView
from dds.planner.provisioning import ProvisioningConfig, ProvisioningPlan, plan_provisioning
from dds.planner.reservations import (ReservationConfig, ReservationPlan, keep_reserved, plan_reservations,
                                      without_gathered)
from dds.planner.scale_down import plan_scale_down
from dds.planner.memos import PlannerMemos

StageTimer = Callable[[str], AbstractContextManager]  # e.g. a latency histogram's timer, per stage ("scale-up", ...)


def _untimed(stage: str) -> AbstractContextManager:
    return nullcontext()


@dataclass(frozen=True)
class PassSettings:
    """What the caller asks of every pass (settings, not observations)."""

    planner: PlannerConfig = PlannerConfig()
    move_idle_gpus: bool = False  # settings.move_idle_gpus: moves and room headroom (dds/planner/moves.py)
    release_idle_gpus: bool = False  # settings.release_idle_gpus: the moves alone, without room headroom
    reservations: ReservationConfig = ReservationConfig(enabled=False)  # dds/planner/reservations.py
    # `dds simulate` stands in for cluster-autoscaler too: its fast path also adds the nodes CA's IncreaseSize would
    # (in production CA asks for those, and ca_requests.PlannerScaleUp plans them with the same planner).
    fast_path_adds_nodes: bool = False
    # The `gang-unaware` baseline of `dds simulate`: the fast path and its moves plan as if no pod belonged to a gang.
    gang_aware: bool = True
    # ProvisioningRequests of DDS's class (dds/planner/provisioning.py); off unless the caller serves them.
    provisioning: ProvisioningConfig = ProvisioningConfig(class_name="")


@dataclass(frozen=True)
class PassInputs:
    """What the caller observed besides the snapshot."""

    pending: tuple[PodInfo, ...]  # unschedulable pods
    waiting: tuple[PodInfo, ...]  # ...of which the fast path's (past the debounce, gangs not being rolled back)
    removing: frozenset[str] = frozenset()  # nodes whose removal is under way (their GPUs are being released)
    # The reservation plan already carried out this pass (the pass is planned again after it): not planned twice.
    reservations: Optional[ReservationPlan] = None
    # False when the caller knows no idle GPU or empty node is past its cooldown (the simulator's shortcut).
    scale_down_due: bool = True
    provisioning: ProvisioningView = ProvisioningView()  # the requests of DDS's class, read this pass
    # The provisioning plan already carried out this pass (the pass is planned again after it): not planned twice.
    provisioning_done: Optional[ProvisioningPlan] = None


@dataclass(frozen=True)
class PassPlan:
    """Every step one pass decided, in the order it is applied; each step carries its reason (Attach.reason,
    Detach.reason, the scale-down's `kept` and `notes`, the scale-up's decisions), and `notes` say why a step was
    left out."""

    reservations: ReservationPlan
    pending: tuple[PodInfo, ...]
    waiting: tuple[PodInfo, ...]  # the fast path's pods: `PassInputs.waiting` less those a reservation serves
    fast_path: Optional[ScaleUpPlan]  # None when no pod waits
    scale_down: ScaleDownPlan
    room_headroom: tuple[Attach, ...] = ()
    warm_refill: tuple[Attach, ...] = ()
    claim_nodes: Optional[ScaleUpPlan] = None  # new nodes for DRA pods no live node can take (docs/dra.md)
    moves: tuple[Detach, ...] = ()
    hungry_pools: frozenset[str] = frozenset()  # pools a pending pod waits on: no headroom kept or refilled there
    notes: tuple[str, ...] = ()
    provisioning: ProvisioningPlan = ProvisioningPlan()  # first of all: requests' gangs get their capacity first

    @property
    def fast_path_attaches(self) -> bool:
        return self.fast_path is not None and bool(self.fast_path.device_attaches)


def plan_pass(snapshot: Snapshot, inputs: PassInputs, settings: PassSettings,
              timer: StageTimer = _untimed, *, memos: Optional[PlannerMemos] = None) -> PassPlan:
    """Everything one pass does, planned on `snapshot` in production's order (see the module docstring). `memos`: the
    caller's PlannerMemos, kept from pass to pass (dds/planner/memos.py); without it, one for this pass's plans."""
    memos = memos if memos is not None else PlannerMemos()
    provisioning = inputs.provisioning_done
    if provisioning is None:
        provisioning = plan_provisioning(snapshot, inputs.provisioning, settings.provisioning, settings.planner,
                                         with_attaches, memos=memos)
        # Planned on what the requests take: their bookings on the nodes, their attaches on their way.
        snapshot = provisioning.as_booked(with_attaches(snapshot, provisioning.attaches))
    reservations = inputs.reservations or plan_reservations(snapshot, settings.reservations, planner=settings.planner,
                                                            memos=memos)
    reserved_pods = frozenset(r.pod for r in reservations.reservations)
    reserved_nodes = reservations.nodes | provisioning.booked  # their idle GPUs are the reservation's, the booking's
    waiting = tuple(p for p in inputs.waiting if p.key not in reserved_pods and p.key not in provisioning.consumers)
    snapshot = without_gathered(snapshot, reservations)  # the rest of the pass leaves them what they still lack
    fast_path = _fast_path(snapshot, waiting, settings, timer, memos) if waiting else None
    hungry = hungry_pools(snapshot, inputs.pending)
    scale_down = ScaleDownPlan()
    if inputs.scale_down_due:
        with timer("scale-down"):
            scale_down = plan_scale_down(snapshot, replace(settings.planner, node_removal_enabled=True),
                                         hungry_pools=hungry, memos=memos)
        scale_down = keep_reserved(scale_down, reserved_nodes)  # their idle GPUs are being gathered
    room: tuple[Attach, ...] = ()
    warm: tuple[Attach, ...] = ()
    notes: list[str] = []
    if fast_path is None or not fast_path.attaches:
        room = _room_headroom(snapshot, hungry, scale_down, reserved_nodes | inputs.removing, settings, memos)
        warm = plan_warm_refill(with_attaches(snapshot, room), settings.planner, hungry, memos=memos)
    else:
        notes.append("no headroom this pass: the fast path attaches, and headroom counts on the pool as observed")
    return PassPlan(reservations=reservations, pending=tuple(inputs.pending), waiting=waiting, fast_path=fast_path,
                    scale_down=scale_down, room_headroom=room, warm_refill=tuple(warm),
                    claim_nodes=_nodes_for_claims(snapshot, waiting, fast_path, settings, memos),
                    moves=_moves(snapshot, waiting, fast_path, scale_down, reserved_nodes, settings, memos),
                    hungry_pools=hungry, notes=tuple(notes), provisioning=provisioning)


def _fast_path_config(settings: PassSettings) -> PlannerConfig:
    return replace(settings.planner, allow_new_nodes=settings.fast_path_adds_nodes)


def _gang_view(snapshot: Snapshot, pods: Sequence[PodInfo], settings: PassSettings
               ) -> tuple[Snapshot, Sequence[PodInfo]]:
    if settings.gang_aware:
        return snapshot, pods
    return replace(snapshot, pods=tuple(without_gang(p) for p in snapshot.pods)), [without_gang(p) for p in pods]


def _fast_path(snapshot: Snapshot, waiting: Sequence[PodInfo], settings: PassSettings,
               timer: StageTimer, memos: PlannerMemos) -> ScaleUpPlan:
    seen, pods = _gang_view(snapshot, waiting, settings)
    with timer("scale-up"):
        return plan_scale_up(seen, _fast_path_config(settings), list(pods), memos=memos)


def _room_headroom(snapshot: Snapshot, hungry: frozenset[str], scale_down: ScaleDownPlan, skip: frozenset[str],
                   settings: PassSettings, memos: PlannerMemos) -> tuple[Attach, ...]:
    """Idle GPUs from the free pool for one more GPU pod on every node with room (move_idle_gpus). Never onto a
    reserved node (its GPUs are the reservation's to gather), one this pass's scale-down detaches from or removes, or
    one whose removal is under way (its GPUs are being released first); the planner itself leaves out tainted,
    cordoned and busy nodes."""
    if not settings.move_idle_gpus:
        return ()
    skip = skip | {d.node for d in scale_down.detaches} | {r.node for r in scale_down.removals}
    return plan_room_headroom(snapshot, hungry, frozenset(skip), memos=memos)


def _moves(snapshot: Snapshot, waiting: Sequence[PodInfo], fast_path: Optional[ScaleUpPlan],
           scale_down: ScaleDownPlan, reserved: frozenset[str], settings: PassSettings,
           memos: PlannerMemos) -> tuple[Detach, ...]:
    """Idle GPUs of other nodes to release now, for waiting pods the fast path could not serve (move_idle_gpus or
    release_idle_gpus): an idle GPU waits out its cooldown on its node only while no pending pod elsewhere could use
    it, so a long cooldown strands nothing. Never from a reserved node (its idle GPUs are being gathered for the pod it is reserved for), nor from a node
    this pass's scale-down already detaches from or removes."""
    if not (settings.move_idle_gpus or settings.release_idle_gpus) or fast_path is None:
        return ()
    busy = set(reserved) | {d.node for d in scale_down.detaches} | {r.node for r in scale_down.removals}
    seen, pods = _gang_view(snapshot, waiting, settings)
    steps = plan_moves(seen, _fast_path_config(settings), fast_path, partial(plan_scale_up, memos=memos), pods,
                       memos=memos)
    return tuple(step for step in steps if step.node not in busy)


def _nodes_for_claims(snapshot: Snapshot, waiting: Sequence[PodInfo], fast_path: Optional[ScaleUpPlan],
                      settings: PassSettings, memos: PlannerMemos) -> Optional[ScaleUpPlan]:
    """Pods with ResourceClaims that no live node takes even with GPUs attached: CA cannot serve them (its
    externalgrpc templates carry no ResourceSlices, so no template satisfies a claim), so the loop adds the nodes.
    Planned with every pod waiting, so nodes already on their way are counted, and only for the claims' pods. A fast
    path that adds nodes itself (the simulator's) has planned them already."""
    if settings.fast_path_adds_nodes or fast_path is None:
        return None
    pods = pods_needing_nodes(fast_path, waiting)
    if not pods:
        return None
    config = settings.planner
    # All or nothing after the cut to what the pools can equip, too: a gang gets all its new nodes or none.
    return whole_gangs_after_cut(plan_scale_up(snapshot, config, pods, memos=memos),
                                 lambda plan: equip_every_group(snapshot, plan),
                                 lambda chosen: plan_scale_up(snapshot, config, chosen, memos=memos), snapshot,
                                 pods, memos=memos).plan


def with_attaches(snapshot: Snapshot, attaches: Sequence[Attach]) -> Snapshot:
    """`snapshot` as it will be once `attaches` are started: their devices taken from the pools and on their way to
    the nodes, so a plan made after them on the same snapshot neither counts on those devices nor misses them."""
    if not attaches:
        return snapshot
    taken: dict[tuple[str, str], int] = {}
    coming: dict[str, int] = {}
    for a in attaches:
        taken[(a.pool, a.model)] = taken.get((a.pool, a.model), 0) + a.count
        coming[a.node] = coming.get(a.node, 0) + a.count
    pools = tuple(replace(p, free={m: c - taken.get((p.name, m), 0) for m, c in p.free.items()})
                  for p in snapshot.pools)
    nodes = tuple(replace(n, attaching=n.attaching + coming[n.name]) if n.name in coming else n
                  for n in snapshot.nodes)
    return replace(snapshot, pools=pools, nodes=nodes)


def without_gang(pod: PodInfo) -> PodInfo:
    """The pod as a gang-unaware planner sees it."""
    if pod.pod_group is None:
        return pod
    labels = {k: v for k, v in pod.labels.items() if k != POD_GROUP_LABEL}
    return replace(pod, pod_group=None, pod_group_min_member=0, labels=labels)
