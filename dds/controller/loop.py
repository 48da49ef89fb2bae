"""The DDS control loop: observe -> snapshot -> plan -> act -> record, once per `loop_interval`.

Ownership, so DDS never races cluster-autoscaler (one owner per decision):

| decision                                                                                   | owner                                                                   | where                             |
|--------------------------------------------------------------------------------------------|-------------------------------------------------------------------------|-----------------------------------|
| scale-up CA asked for (case 1)                                                             | CA's IncreaseSize -> planner                                            | `ca_requests.PlannerScaleUp`      |
| pending pods that fit live nodes once GPUs are attached: the fast path (serves case 2 too) | this loop, after `pending_debounce` (2 s)                               | `_serve_pending_by_attach`        |
| pending pods that need a new node                                                          | CA (IncreaseSize, case 1)                                               | `ca_requests.PlannerScaleUp`      |
| pending pods with ResourceClaims that need a new node (CA's templates carry no DRA devices) | this loop, after `pending_debounce`                                     | `_add_nodes_for_claims`           |
| CA's scale-up for pods whose GPUs are already on their way                                 | nobody: the plan is covered; CA's GPU instance ends with those attaches | `ca_requests.PlannerScaleUp`      |
| warm headroom (idle GPUs a group keeps)                                                    | this loop                                                               | `_refill_headroom`, `_scale_down` |
| room headroom (idle GPUs for one more pod on each node with room; move_idle_gpus)          | this loop                                                               | `_keep_room_headroom`             |
| node removal CA asked for (case 3)                                                         | CA's DeleteNodes -> planner                                             | `ca_requests.PlannerScaleDown`    |
| idle GPUs anywhere (case 4)                                                                | this loop                                                               | `_scale_down`                     |
| empty nodes of spec-fixed groups (case 4)                                                  | this loop (CA never sees those nodes)                                   | `_scale_down`                     |
| empty nodes of observed groups                                                             | CA (this loop only detaches their idle GPUs)                            |                                   |

Capacity already on its way (attaches in flight, nodes provisioning) is part of every snapshot, so a pod that CA and
this loop both see is planned once: whoever comes second finds it covered.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence, TypeVar

from dds import metrics
from dds.controller.apply import Actions
from dds.controller.calls_first import CallsFirst
from dds.controller.executor import Executor, OperationWatcher, node_ref
from dds.controller.gang_attaches import GangAttaches
from dds.controller.gpu_gauges import GpuGauges
from dds.controller.gpu_label import GpuLabelKeeper
from dds.controller.journal import DecisionJournal
from dds.controller.observe import ClusterObserver, Observation
from dds.controller.orphans import NodeHoldingFabric, OrphanFinder
from dds.controller.pod_groups import PodGroupObserver, watched_gangs
from dds.controller.refusals import RefusalReporter
from dds.controller.reservations import Reservations
from dds.crashpoints import crashpoint
from dds.fabric.base import Fabric, FabricError, OperationKind
from dds.kube import ApiClient
from dds.kube.convert import TAINT_TO_BE_DELETED
from dds.kube.nodes import add_taint, label_node, remove_taint, work_on_node
from dds.kube.podgroups import PodGroupReader
from dds.kube.pods import ReservationWrites
from dds.model.events import NORMAL, EventRecorder
from dds.model.groups import TemplateMode
from dds.planner import plan_scale_down, plan_scale_up, render_scale_down, render_scale_up
from dds.planner.headroom import hungry_pools, plan_warm_refill
from dds.planner.moves import plan_moves, plan_room_headroom
from dds.planner.snapshot import PodInfo
from dds.planner.plan import Attach, Case, Detach, PlannerConfig, RemoveNode, ScaleDownPlan, ScaleUpPlan
from dds.planner.reservations import ReservationConfig, keep_reserved
from dds.controller.dra_binding import PoolModeBinder
from dds.planner.dra import pods_needing_nodes
from dds.planner.equip import equip_new_nodes
from dds.planner.gangs import GANG_INCOMPLETE, GANG_LARGER_THAN_CLUSTER, equip_every_group, whole_gangs_after_cut
from dds.planner.refusals import POOL_EMPTY
from dds.planner.requests import is_work
from dds.planner.snapshot import Snapshot

log = logging.getLogger(__name__)

REMOVAL_TAINT = "dds.cdi.dev/removing"
ANN_INITIAL_GPUS_DONE = "dds.cdi.dev/initial-gpus-attached"


_Decision = TypeVar("_Decision")
_Result = TypeVar("_Result")


def _with_attaches(snapshot: Snapshot, attaches: Sequence[Attach]) -> Snapshot:
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


@dataclass(frozen=True)
class PassDecisions:
    """What one pass of the loop plans, before it acts."""

    pending: tuple[PodInfo, ...]  # unschedulable pods
    waiting: tuple[PodInfo, ...]  # ...of which past the debounce: the fast path's
    fast_path: Optional[ScaleUpPlan]  # None when no pod waits
    headroom: tuple[Attach, ...]
    scale_down: ScaleDownPlan
    claim_nodes: Optional[ScaleUpPlan] = None  # new nodes for DRA pods no live node can take (docs/dra.md)
    moves: tuple[Detach, ...] = ()  # idle GPUs released now for pods the fast path leaves waiting (move_idle_gpus)
    room_headroom: tuple[Attach, ...] = ()  # idle GPUs for one more pod on each node with room (move_idle_gpus)


@dataclass(frozen=True)
class LoopConfig:
    interval_seconds: float = 5.0
    pending_debounce_seconds: float = 2.0
    gang_start_timeout_seconds: float = 300.0  # see dds/controller/gang_attaches.py
    dra_binding_timeout_seconds: float = 600.0  # kube-scheduler's; see dds/controller/dra_binding.py
    planner: PlannerConfig = PlannerConfig()
    orphan_timeout_seconds: float = 600.0  # settings.orphan_attach_timeout_seconds; see dds/controller/orphans.py
    reservations: ReservationConfig = ReservationConfig(enabled=False)  # see dds/controller/reservations.py
    move_idle_gpus: bool = False  # settings.move_idle_gpus; see dds/planner/moves.py


class Controller:
    def __init__(self, observer: ClusterObserver, executor: Executor, watcher: OperationWatcher, fabric: Fabric,
                 api: ApiClient, events: EventRecorder, config: LoopConfig,
                 clock: Callable[[], float], is_leader: Callable[[], bool] = lambda: True,
                 journal: Optional[DecisionJournal] = None) -> None:
        # Gangs (coscheduling PodGroups, Workloads) are filled into every snapshot, the loop's and CA's RPCs' alike.
        self.observer = PodGroupObserver(observer, PodGroupReader(api, cached=watched_gangs(observer)))
        self.executor = executor
        self.watcher = watcher
        self.fabric = fabric
        self._api = api
        self.events = events
        self.config = config
        self.clock = clock
        self.is_leader = is_leader
        self.journal = journal or DecisionJournal(clock)  # what was decided and why: /decisions on the ops port
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.RLock()  # one planning pass at a time (loop and CA's RPCs share the fabric)
        self.calls_first = CallsFirst()  # CA's calls have a deadline, the loop has none: it steps aside for them
        # node -> (group id, the case that decided it): detaching first, removal next
        self._pending_removals: dict[str, tuple[str, Case]] = {}
        self._removals_resumed = False  # the removals a previous process left half done are picked up once
        self.orphans = OrphanFinder(config.orphan_timeout_seconds)
        self.listeners: list[Callable[[Observation], None]] = []  # e.g. the instance tracker's reconcile
        self.actions = Actions(executor, watcher)  # the one way every attach and detach is started and followed
        # CA's GPU label follows each node's GPUs; every detach, whoever plans it, goes through this executor.
        self.gpu_labels = GpuLabelKeeper(api, fabric)
        executor.before_detach = self.gpu_labels.before_detach
        self.refusals = RefusalReporter(events)  # pods DDS cannot help: one Event per pod and reason
        self.gangs = GangAttaches(self.actions, fabric, events, config.gang_start_timeout_seconds, clock)
        self.reservations = Reservations(ReservationWrites(api), self.actions, events, self.journal, config.reservations)
        # DRA pool mode, for the groups annotated dds.cdi.dev/gpu-api: dra-pool (none: it writes nothing).
        self.gpu_gauges = GpuGauges()  # GPUs per node, idle GPUs past the cooldown: set from each pass's decisions
        self.pool_binder = PoolModeBinder(api, fabric, self.actions,
                                          binding_timeout_seconds=config.dra_binding_timeout_seconds, clock=clock)

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    # --- lifecycle ---
    def start(self) -> None:
        adopted = self.watcher.adopt_in_flight()
        if adopted:
            log.info("resumed %d fabric operation(s) left in flight by a previous process", adopted)
        self.gpu_labels.start()
        self._thread = threading.Thread(target=self._run, name="dds-controller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.gpu_labels.stop()

    def _run(self) -> None:
        failing: Optional[str] = None  # the failure being reported: an outage is one line, not one per second
        failed_passes = 0
        while not self._stop.is_set():
            if self.is_leader():
                try:
                    self.run_once()
                    if failing is not None:
                        log.info("control loop recovered after %d failed pass(es) (%s)", failed_passes, failing)
                    failing, failed_passes = None, 0
                except Exception as exc:  # one bad loop must not end the controller; the next loop starts fresh
                    failed_passes += 1
                    summary = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
                    if summary != failing:
                        failing = summary
                        log.error("control loop failed (%s); retrying every %.1fs until it passes", summary,
                                  self.config.interval_seconds, exc_info=True)
            self._stop.wait(self.config.interval_seconds)

    # --- one pass ---
    def decide_then_act(self, decide: Callable[[], _Decision], act: Callable[[_Decision], _Result]) -> _Result:
        """Decide without the lock, act under it. Deciding (observe and plan) is most of a pass, so the loop and CA's
        calls do not wait for each other's planning; a decision taken on a snapshot older than a change started since
        (any attach, detach, node added or removed: `Executor.generation`) is taken again under the lock, on a fresh
        snapshot, so no two decisions ever count on the same free GPU or miss each other's capacity."""
        with self.calls_first.call():
            generation = self.executor.generation
            decision = decide()
            with self._lock:
                if self.executor.generation != generation:
                    decision = decide()
                return act(decision)

    def run_once(self) -> Observation:
        started, waited = time.monotonic(), [0.0]
        try:
            return self._pass(waited)
        finally:
            # The pass's own work: the time it stepped aside for CA's calls is counted apart.
            metrics.LOOP_LATENCY.observe(max(0.0, time.monotonic() - started - waited[0]))

    def _pass(self, waited: list[float]) -> Observation:
        with self._lock:
            tick = getattr(self.fabric, "tick", None)
            if callable(tick):
                tick()
            self.watcher.poll()
        self._record_pools()
        waited[0] += self._step_aside_for_calls()
        generation, labels_mark = self.executor.generation, self.gpu_labels.mark()
        observation = self.observer.observe()
        # The GPU label is bookkeeping for CA, not a decision: written by a thread of its own (dds/controller/
        # gpu_label.py), as thousands of label writes on a first pass must neither hold CA's calls nor the pass.
        self.gpu_labels.offer(observation.snapshot, since=labels_mark)
        waited[0] += self._step_aside_for_calls()
        decisions = self._decide(observation)
        waited[0] += self._step_aside_for_calls()
        with self._lock:
            for listener in self.listeners:
                listener(observation)
            self.gangs.reconcile(observation.snapshot)
            self.reservations.reconcile(observation.snapshot)  # before the fast path: its GPUs go first
            self._resume_removals(observation)
            self._attach_initial_gpus(observation)
            if self.executor.generation != generation:  # something started since the snapshot: decide on it
                observation = self.observer.observe()
                decisions = self._decide(observation)
            # Before acting: a pass that fails while acting still shows the idle GPUs it meant to release.
            self.gpu_gauges.record(observation.snapshot, decisions.scale_down)
            self._act(observation, decisions)
            self.pool_binder.reconcile(observation.snapshot)
            self._reclaim_orphans(observation)
        return observation

    def _step_aside_for_calls(self) -> float:
        """Wait while CA's calls are under way (dds/controller/calls_first.py). Never under the lock: a call waiting
        for the lock would wait for this pass, and this pass for it, until the wait's bound."""
        if self._lock._is_owned():  # type: ignore[attr-defined]  # RLock's own check, as threading.Condition uses
            raise RuntimeError("the control loop must not wait for CA's calls while it holds the planning lock")
        waited = self.calls_first.wait_for_calls()
        metrics.LOOP_WAITED.inc(waited)
        return waited

    def _decide(self, observation: Observation) -> "PassDecisions":
        """Everything this pass would do, planned on one snapshot (no I/O, no lock)."""
        snapshot = observation.snapshot
        pending = [p for p in snapshot.pending_pods() if p.key in observation.unschedulable_since]
        debounce = self.config.pending_debounce_seconds
        waiting = [p for p in pending if observation.unschedulable_since[p.key] + debounce <= snapshot.now]
        # Gangs being rolled back are planned whole once that is done; reserved pods get GPUs by their reservation.
        waiting = self.reservations.not_reserved(self.gangs.not_held(waiting))
        fast_path = None
        if waiting:
            with metrics.PLAN_LATENCY.labels("scale-up").time():
                fast_path = plan_scale_up(snapshot, replace(self.config.planner, allow_new_nodes=False), waiting)
        hungry = hungry_pools(snapshot, pending)  # no warm headroom is kept or refilled from these
        with metrics.PLAN_LATENCY.labels("scale-down").time():
            scale_down = plan_scale_down(snapshot, replace(self.config.planner, node_removal_enabled=True),
                                         hungry_pools=hungry)
        scale_down = keep_reserved(scale_down, self.reservations.nodes)  # their idle GPUs are being gathered
        # Headroom counts on the pool as observed, which is current only if the fast path attaches nothing.
        room: tuple[Attach, ...] = ()
        headroom: tuple[Attach, ...] = ()
        if fast_path is None or not fast_path.attaches:
            room = self._plan_room_headroom(snapshot, hungry, scale_down)
            # As `dds simulate` does: room headroom first, warm headroom on what it leaves (its GPUs count as warm).
            headroom = plan_warm_refill(_with_attaches(snapshot, room), self.config.planner, hungry)
        return PassDecisions(pending=tuple(pending), waiting=tuple(waiting), fast_path=fast_path,
                             headroom=tuple(headroom), scale_down=scale_down,
                             claim_nodes=self._plan_nodes_for_claims(snapshot, waiting, fast_path),
                             moves=self._plan_moves(snapshot, waiting, fast_path, scale_down), room_headroom=room)

    def _plan_room_headroom(self, snapshot: Snapshot, hungry: frozenset[str],
                            scale_down: ScaleDownPlan) -> tuple[Attach, ...]:
        """Idle GPUs from the free pool for one more GPU pod on every node with room (move_idle_gpus; see
        dds/planner/moves.py). Never onto a reserved node (its GPUs are the reservation's to gather), one this pass's
        scale-down detaches from or removes, or one whose removal is under way and not yet tainted (its GPUs are
        being released first); the planner itself leaves out tainted, cordoned and busy nodes."""
        if not self.config.move_idle_gpus:
            return ()
        skip = set(self.reservations.nodes) | set(self._pending_removals)
        skip |= {d.node for d in scale_down.detaches} | {r.node for r in scale_down.removals}
        return plan_room_headroom(snapshot, hungry, frozenset(skip))

    def _plan_moves(self, snapshot: Snapshot, waiting: Sequence[PodInfo], fast_path: Optional[ScaleUpPlan],
                    scale_down: ScaleDownPlan) -> tuple[Detach, ...]:
        """Idle GPUs of other nodes to release now, for waiting pods the fast path could not serve (move_idle_gpus).
        Never from a reserved node (its idle GPUs are being gathered for the pod it is reserved for), nor from a node
        this pass's scale-down already detaches from or removes."""
        if not self.config.move_idle_gpus or fast_path is None:
            return ()
        busy = set(self.reservations.nodes) | {d.node for d in scale_down.detaches}
        busy |= {r.node for r in scale_down.removals}
        steps = plan_moves(snapshot, replace(self.config.planner, allow_new_nodes=False), fast_path, plan_scale_up,
                           waiting)
        return tuple(step for step in steps if step.node not in busy)

    def _plan_nodes_for_claims(self, snapshot: Snapshot, waiting: Sequence[PodInfo],
                               fast_path: Optional[ScaleUpPlan]) -> Optional[ScaleUpPlan]:
        """Pods with ResourceClaims that no live node takes even with GPUs attached: CA cannot serve them (its
        externalgrpc templates carry no ResourceSlices, so no template satisfies a claim), so this loop adds the
        nodes. Planned with every pod waiting, so nodes already on their way are counted, and only for the claims'
        pods."""
        pods = pods_needing_nodes(fast_path, waiting) if fast_path is not None else ()
        if not pods:
            return None
        config = self.config.planner
        # All or nothing after the cut to what the pools can equip, too: a gang gets all its new nodes or none.
        return whole_gangs_after_cut(plan_scale_up(snapshot, config, pods),
                                     lambda plan: equip_every_group(snapshot, plan),
                                     lambda chosen: plan_scale_up(snapshot, config, chosen), snapshot, pods).plan

    def _act(self, observation: Observation, decisions: "PassDecisions") -> None:
        if not self._serve_pending_by_attach(observation, decisions):
            self._keep_room_headroom(decisions.room_headroom)
            self._refill_headroom(decisions.headroom)
        self._move_idle_gpus(decisions.moves)
        self._add_nodes_for_claims(observation, decisions.claim_nodes)
        self._scale_down(observation, decisions.scale_down)

    def _record_pools(self) -> None:
        for pool in self.fabric.pools():
            for model, total in pool.total.items():
                free = pool.free.get(model, 0)
                metrics.POOL_DEVICES.labels(pool.name, model, "free").set(free)
                metrics.POOL_DEVICES.labels(pool.name, model, "used").set(total - free)

    # --- new nodes for DRA pods (CA cannot see what a DRA group's new node would offer) ---
    def _add_nodes_for_claims(self, observation: Observation, plan: Optional[ScaleUpPlan]) -> None:
        for decision in plan.decisions if plan is not None else ():
            if decision.refusal in (GANG_INCOMPLETE, GANG_LARGER_THAN_CLUSTER):  # gangs left out: say why
                self.refusals.tell(decision.pod, decision.refusal, decision.reason)
        if plan is None or not plan.new_nodes:
            return
        snapshot = observation.snapshot
        for step in plan.new_nodes:
            group = snapshot.group(step.group)
            if group is None:
                continue
            equipped, unequipped = equip_new_nodes(snapshot, replace(plan, new_nodes=(step,), attaches=()), group,
                                                   self.config.planner)
            if unequipped is not None:
                for pod in unequipped.pods:
                    self.refusals.tell(pod, POOL_EMPTY, f"no node added: {unequipped.message}")
            for kept in equipped.new_nodes:
                rendered = render_scale_up(replace(plan, new_nodes=(kept,), attaches=()))
                self.journal.record(Case.SCALE_UP.value, "control loop: pods with ResourceClaims need a new node "
                                    "(cluster-autoscaler's templates carry no DRA devices)", "node", rendered)
                metrics.DECISIONS.labels(Case.SCALE_UP.value, "node").inc()
                self.executor.add_nodes(kept, group, key=f"claims/{uuid.uuid4().hex[:8]}", case=Case.SCALE_UP)

    # --- new nodes get the GPUs their group composes at creation ---
    def _attach_initial_gpus(self, observation: Observation) -> None:
        snapshot = observation.snapshot
        for node in snapshot.nodes:
            group = snapshot.group(node.group_id) if node.group_id else None
            if group is None or group.initial_gpus == 0 or not node.ready or node.being_deleted:
                continue
            if node.labels.get(ANN_INITIAL_GPUS_DONE) == "true":
                continue
            missing = group.initial_gpus - len(node.devices) - node.attaching
            model = group.default_gpu_model
            if missing > 0 and model:
                step = Attach(node=node.name, pool=group.fabric_pool, model=model, count=missing, pods=(),
                              reason=f"group {group.id} composes {group.initial_gpus} GPU(s) into each new node")
                try:
                    self.actions.attach(step, f"initial/{node.name}/{node.provider_id}", Case.SCALE_UP)
                except FabricError:
                    continue
                crashpoint("initial-gpus.attached")
            label_node(self._api, node.name, {ANN_INITIAL_GPUS_DONE: "true"})

    # --- the fast path (and case 2): pending pods that fit on live nodes once GPUs are attached ---
    def _serve_pending_by_attach(self, observation: Observation, decisions: "PassDecisions") -> bool:
        """Attach GPUs for pods unschedulable for `pending_debounce_seconds` that fit a live node once the GPUs are
        there; pods that need a new node stay CA's. Returns whether anything was attached."""
        snapshot = observation.snapshot
        metrics.PENDING_PODS.set(len(snapshot.pending_pods()))
        self.refusals.forget_all_but(p.key for p in decisions.pending)
        self.refusals.report_without_planning(snapshot, list(decisions.pending))
        plan = decisions.fast_path
        if plan is None:
            return False
        self.refusals.report_plan(plan, nodes_allowed=False)
        if not plan.attaches:
            return False
        rendered = render_scale_up(plan)
        waiting = len(decisions.waiting)
        log.info("fast path: %d pending pod(s) unschedulable for %.0fs or more; plan:\n%s", waiting,
                 self.config.pending_debounce_seconds, rendered)
        self.journal.record(Case.FAST_PATH.value, f"control loop: {waiting} pending pod(s) fit live nodes once "
                            "GPUs are attached", "gpu", rendered)
        metrics.DECISIONS.labels(Case.FAST_PATH.value, "gpu").inc()
        started = self.actions.attach_all(plan.attaches, f"fast-path/{uuid.uuid4().hex[:8]}", Case.FAST_PATH)
        self.gangs.started(snapshot, [step for step, _ in started], [op.key for _, op in started])
        return True

    # --- idle GPUs moved to where pods wait (move_idle_gpus) ---
    def _move_idle_gpus(self, steps: Sequence[Detach]) -> None:
        if not steps:
            return
        rendered = render_scale_down(ScaleDownPlan(detaches=tuple(steps)))
        log.info("moving idle GPUs to pending pods:\n%s", rendered)
        self.journal.record(Case.FAST_PATH.value, "control loop: pending pods would get GPUs idle on other nodes",
                            "move", rendered)
        metrics.DECISIONS.labels(Case.FAST_PATH.value, "move").inc()
        for step in steps:
            self.actions.detach(step, f"move/{step.node}/{uuid.uuid4().hex[:8]}", Case.FAST_PATH)

    # --- warm headroom: idle GPUs kept attached ahead of demand ---
    def _refill_headroom(self, attaches: Sequence[Attach]) -> None:
        self._attach_headroom(attaches, "warm headroom", "control loop: groups below their warm-gpus", "warm")

    # --- room headroom (move_idle_gpus): idle GPUs for one more pod on each node with room ---
    def _keep_room_headroom(self, attaches: Sequence[Attach]) -> None:
        # Warm headroom's case, as in `dds simulate`: both attach idle GPUs ahead of demand from the free pool; the
        # journal's trigger, the key prefix and each step's reason (in its AttachingGPU Event) tell them apart.
        self._attach_headroom(attaches, "room headroom", "control loop: nodes with room for one more GPU pod keep "
                              "idle GPUs for it (move_idle_gpus)", "room")

    def _attach_headroom(self, attaches: Sequence[Attach], what: str, trigger: str, key_prefix: str) -> None:
        if not attaches:
            return
        log.info("%s: %s", what, "; ".join(f"{a.count} x {a.model} to {a.node} ({a.reason})" for a in attaches))
        self.journal.record(Case.WARM_HEADROOM.value, trigger, "gpu",
                            "\n".join(f"attach {a.count} x {a.model} from pool {a.pool} to {a.node}: {a.reason}"
                                       for a in attaches))
        metrics.DECISIONS.labels(Case.WARM_HEADROOM.value, "gpu").inc()
        self.actions.attach_all(attaches, f"{key_prefix}/{uuid.uuid4().hex[:8]}", Case.WARM_HEADROOM)

    # --- cases 3/4 driven by idleness: idle GPUs everywhere, empty nodes of spec-fixed groups ---
    def _scale_down(self, observation: Observation, plan: ScaleDownPlan) -> None:
        snapshot = observation.snapshot
        owned_removals = []
        for removal in plan.removals:
            group = snapshot.group(removal.group)
            if group is not None and group.template_mode == TemplateMode.SPEC_FIXED:
                owned_removals.append(removal)
        removing = {r.node for r in owned_removals} | set(self._pending_removals)
        detaches = [d for d in plan.detaches
                    if d.node in removing or self._detach_is_ours(snapshot, d.node)]
        if not detaches and not owned_removals and not self._pending_removals:
            return
        if detaches or owned_removals:
            rendered = render_scale_down(plan)
            log.info("scale-down plan:\n%s", rendered)
            self.journal.record(Case.SCALE_DOWN_BLOCKED.value, "control loop: idle GPUs / empty nodes past cooldown",
                                "node" if owned_removals else "gpu", rendered)
        in_flight = {op.node for op in self.watcher.in_flight()}
        for index, step in enumerate(detaches):
            if step.node in in_flight:
                continue  # a detach already runs there; idleness is judged again when it ends
            operation = self.actions.detach(step, f"detach/{uuid.uuid4().hex[:8]}/{index}", Case.SCALE_DOWN_BLOCKED)
            if operation is not None:
                self.observer.idle.reset(step.node)
        if detaches and not owned_removals:
            metrics.DECISIONS.labels(Case.SCALE_DOWN_BLOCKED.value, "gpu").inc(len(detaches))
        for removal in owned_removals:
            self._pending_removals.setdefault(removal.node, (removal.group, Case.SCALE_DOWN_BLOCKED))
        self._finish_removals(observation)

    def _detach_is_ours(self, snapshot, node_name: str) -> bool:
        node = next((n for n in snapshot.nodes if n.name == node_name), None)
        return node is not None and node.group_id is not None

    def request_removal(self, node: str, group_id: str) -> None:
        """Case 3: CA asked to delete this node; its GPUs are being released, the node goes when they are gone."""
        with self._lock:
            self._pending_removals.setdefault(node, (group_id, Case.SCALE_DOWN))

    def _operations_on(self, node_name: str) -> bool:
        return any(op.node == node_name for op in self.watcher.in_flight())

    def _finish_removals(self, observation: Observation) -> None:
        snapshot = observation.snapshot
        removed: dict[str, int] = {}  # group id -> nodes this pass took out of it
        for node_name, (group_id, case) in list(self._pending_removals.items()):
            node = next((n for n in snapshot.nodes if n.name == node_name), None)
            group = snapshot.group(group_id)
            if node is None:
                self._pending_removals.pop(node_name, None)
                continue
            if group is None:
                self._give_up_removal(node_name, node.taints, f"its group {group_id} is no longer served")
                continue
            if node.devices or node.detaching or node.attaching or self._operations_on(node_name):
                continue  # GPUs are released first (and their operations seen to the end: a backend may drop the
                # record of an operation on a node that is gone, as the CDI operator deletes its requests)
            work = [p for p in snapshot.pods_on(node_name) if is_work(p)]
            if work and not self._is_ca_drained(node):
                self._give_up_removal(node_name, node.taints, f"it holds work again ({', '.join(p.key for p in work)})")
                continue
            if self._leaves_group_below_min(observation, node, group, removed.get(group_id, 0)):
                self._give_up_removal(node_name, node.taints,
                                      f"group {group_id} would go below its min size {group.min_size}")
                continue
            if not self._cordon_and_recheck(node_name):
                self._pending_removals.pop(node_name, None)
                continue
            crashpoint("remove.cordoned")
            self.executor.remove_node(
                RemoveNode(node_name, group_id, "its GPUs are released and it holds no work"), group,
                key=f"remove/{node_name}/{node.provider_id}", case=case)
            if case == Case.SCALE_DOWN_BLOCKED:  # CA's removals (case 3) are counted when DeleteNodes decides them
                metrics.DECISIONS.labels(case.value, "node").inc()
            self._pending_removals.pop(node_name, None)
            if not node.being_deleted:
                removed[group_id] = removed.get(group_id, 0) + 1

    @staticmethod
    def _leaves_group_below_min(observation: Observation, node, group, removed_this_pass: int) -> bool:
        """The min size was checked when the removal was planned; a removal resumed after a restart (or one that
        waited for its GPUs) may find the group smaller by now. A node whose Machine is already marked is past that."""
        if any(m.node_name == node.name and m.deleting for m in observation.machines):
            return False
        others = sum(1 for n in observation.snapshot.nodes
                     if n.group_id == group.id and n.name != node.name and not n.being_deleted)
        return others - removed_this_pass < group.min_size

    def _give_up_removal(self, node_name: str, taints, why: str) -> None:
        """Keep the node after all; lift our removal taint if it carries it (else it would take no pod ever again)."""
        self._pending_removals.pop(node_name, None)
        log.info("keeping %s: %s", node_name, why)
        if any(t.key == REMOVAL_TAINT for t in taints):
            self._lift_removal_taint(node_name)

    def _lift_removal_taint(self, node_name: str) -> None:
        remove_taint(self._api, node_name, REMOVAL_TAINT)

    def _resume_removals(self, observation: Observation) -> None:
        """Once, on the first pass: a node carrying our removal taint (or CA's ToBeDeleted taint) was being removed by a
        previous process (pending removals live in memory) — cordoned, maybe its Machine already marked. Resume it:
        `_finish_removals` removes it with the same idempotency key if it still holds no work and no GPUs, or keeps it
        and lifts the taint."""
        if self._removals_resumed:
            return
        self._removals_resumed = True
        for node in observation.snapshot.nodes:
            if node.group_id and any(t.key == REMOVAL_TAINT for t in node.taints):
                log.info("resuming the removal of %s, cordoned by a previous process", node.name)
                self._pending_removals.setdefault(node.name, (node.group_id, Case.SCALE_DOWN_BLOCKED))
            elif node.group_id and self._is_ca_drained(node):
                # CA's DeleteNodes was accepted (request_removal), its GPUs maybe still being released: CA counts the
                # node as deleted and will neither ask again nor lift its taint. (A drain CA has under way right now
                # is resumed too: the node then goes when it holds no work, as CA's DeleteNodes would have it.)
                log.info("resuming the removal of %s, which cluster-autoscaler asked for", node.name)
                self._pending_removals.setdefault(node.name, (node.group_id, Case.SCALE_DOWN))

    # --- orphaned devices: on nodes that are gone, or held by attaches that never end ---
    def _reclaim_orphans(self, observation: Observation) -> None:
        live = {n.name for n in observation.snapshot.nodes}
        deleted: set[str] = set()
        if isinstance(self.fabric, NodeHoldingFabric):
            deleted = self.fabric.deleted_nodes_to_reclaim([n.name for n in observation.snapshot.nodes
                                                            if n.being_deleted])
        busy = {op.node for op in self.watcher.in_flight() if op.kind == OperationKind.DETACH}
        reclaims = self.orphans.find(self.fabric.devices(), self.fabric.operations(), live - deleted,
                                     observation.snapshot.now, deleted=deleted)
        for reclaim in reclaims:
            if reclaim.node in busy:
                continue  # a detach already runs there; judged again when it ends
            step = Detach(reclaim.node, reclaim.device_ids, force=True, reason=reclaim.reason)
            if self.actions.detach(step, f"orphan/{uuid.uuid4().hex[:8]}", Case.ORPHAN_RECLAIM) is not None:
                metrics.ORPHANS_RECLAIMED.inc(len(reclaim.device_ids))

    @staticmethod
    def _is_ca_drained(node) -> bool:
        return any(t.key == TAINT_TO_BE_DELETED for t in node.taints)

    def _cordon_and_recheck(self, node_name: str) -> bool:
        """Taint the node NoSchedule, then look again: a pod that landed meanwhile keeps the node (and lifts the taint)."""
        add_taint(self._api, node_name, REMOVAL_TAINT, "true", "NoSchedule")
        work = work_on_node(self._api, node_name)
        if work:
            remove_taint(self._api, node_name, REMOVAL_TAINT)
            self.events.emit(node_ref(node_name), NORMAL, "RemovalCancelled",
                             f"kept: pods arrived before removal ({', '.join(work)})")
            return False
        return True

