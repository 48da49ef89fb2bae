"""The DDS control loop: observe -> snapshot -> plan -> act -> record, once per `loop_interval`.

The plan is `plan_pass` (dds/planner/passes.py: every decision of a pass, in order), the function `dds simulate` runs
too; every action goes through the applier, `Actions` (dds/controller/apply.py), which the simulator uses as well.

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
from typing import Any, Callable, Optional, Sequence, TypeVar

from dds import metrics
from dds.controller.apply import Actions
from dds.controller.calls_first import CallsFirst
from dds.controller.cxl_visibility import MemoryVisibility
from dds.controller.gang_attaches import GangAttaches
from dds.controller.gpu_gauges import GpuGauges
from dds.controller.gpu_label import GpuLabelKeeper
from dds.controller.journal import DecisionJournal
from dds.controller.observe import ClusterObserver, Observation
from dds.controller.orphans import NodeHoldingFabric, OrphanFinder
from dds.controller.pod_groups import PodGroupObserver
from dds.controller.provisioning import ProvisioningReads, ProvisioningRequests, ProvisioningWrites
from dds.controller.refusals import RefusalReporter
from dds.controller.removals import REMOVAL_TAINT, NodeRemovals
from dds.controller.reservations import ClusterWrites, Reservations
from dds.controller.unheld import UnheldDevices
from dds.crashpoints import crashpoint
from dds.scaling.node_actions import node_ref
from dds.fabric.base import Fabric, FabricError, Operation, OperationKind
from dds.kube.podgroups import PodGroupReader
from dds.model.events import WARNING, EventRecorder
from dds.model.groups import GpuApi, TemplateMode
from dds.planner import render_scale_down, render_scale_up
from dds.model.plan import Attach, Case, Detach, PlannerConfig, ScaleDownPlan, ScaleUpPlan, by_device_kind
from dds.model.snapshot import Snapshot
from dds.planner.passes import PassInputs, PassPlan, PassSettings, plan_pass
from dds.planner.reservations import ReservationConfig, ReservationPlan
from dds.model.provisioning import ProvisioningView
from dds.planner.provisioning import ProvisioningConfig, ProvisioningPlan
from dds.controller.dra_binding import PoolModeBinder
from dds.planner.equip import equip_new_nodes
from dds.planner.gangs import GANG_INCOMPLETE, GANG_LARGER_THAN_CLUSTER
from dds.planner.refusals import POOL_EMPTY
from dds.planner.memos import PlannerMemos

log = logging.getLogger(__name__)

ANN_INITIAL_GPUS_DONE = "dds.cdi.dev/initial-gpus-attached"


_Decision = TypeVar("_Decision")
_Result = TypeVar("_Result")


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
    release_idle_gpus: bool = False  # settings.release_idle_gpus: the moves of move_idle_gpus alone
    # settings.provisioning_class, provisioning_booking_seconds; see dds/controller/provisioning.py
    provisioning: ProvisioningConfig = ProvisioningConfig(class_name="")
    # settings.cxl_memory_visible_timeout_seconds; see dds/controller/cxl_visibility.py
    cxl_memory_visible_timeout_seconds: float = 600.0
    # settings.composability.unheld_device_grace_seconds with the CDI operator (None: not judged); see
    # dds/controller/unheld.py
    unheld_grace_seconds: Optional[float] = None


@dataclass(frozen=True)
class ClusterPorts:
    """What the controller reads and writes on the cluster besides the observer and the applier's node writes, built by
    the app over dds.kube (dds/app.py): the raw ApiClient never reaches the controller."""

    pod_groups: PodGroupReader  # gangs (coscheduling PodGroups, Workloads)
    reservation_writes: ClusterWrites  # tolerations and reservation taints (dds/controller/reservations.py)
    gpu_labels: GpuLabelKeeper  # CA's GPU label (dds/controller/gpu_label.py)
    pool_binder: PoolModeBinder  # DRA pool mode (dds/controller/dra_binding.py)
    # ProvisioningRequests of DDS's class (dds/controller/provisioning.py); None: none is served.
    provisioning_reads: Optional[ProvisioningReads] = None
    provisioning_writes: Optional[ProvisioningWrites] = None


@dataclass(frozen=True)
class CaCallPorts:
    """What CA's request handlers (dds/controller/ca_requests.py) get of the controller, and nothing more: the one
    decide-then-act protocol (so a call and a loop pass never count on the same GPU), the observer, the applier, the
    planner's memos, where decisions are told, and a hook run on every loop pass. Built by
    `Controller.ca_call_ports`."""

    decide_then_act: Callable[[Callable[[], Any], Callable[[Any], Any]], Any]
    observe: Callable[[], Observation]
    actions: Actions  # every attach, detach, node add, removal, taint
    memos: PlannerMemos
    journal: DecisionJournal  # /decisions: what was decided and why
    refusals: RefusalReporter  # pods DDS cannot help: one Event per pod and reason
    events: EventRecorder
    gangs: GangAttaches  # attaches started for gangs, rolled back when a gang cannot start
    request_removal: Callable[[str, str], None]  # case 3: node, group id; GPUs first, the node next
    on_every_pass: Callable[[Callable[[Observation], None]], None]
    fabric_operations: Callable[[], Sequence[Operation]]
    clock: Callable[[], float]
    # ProvisioningRequests: CA's IncreaseSize with no pending pod behind it is planned for CA's atomic class's
    # requests; their bookings and Events are made as the loop makes its own class's (dds/controller/provisioning.py).
    provisioning: ProvisioningRequests


class _RemovalTaints:
    """The removal lifecycle's node writes and fresh read (dds/controller/removals.py), made through the applier."""

    def __init__(self, actions: Actions) -> None:
        self._actions = actions

    def taint(self, node: str) -> None:
        self._actions.taint(node, REMOVAL_TAINT, "true", "NoSchedule")

    def lift_taint(self, node: str) -> None:
        self._actions.untaint(node, REMOVAL_TAINT)

    def work_on(self, node: str) -> list[str]:
        return self._actions.work_on(node)


class Controller:
    def __init__(self, observer: ClusterObserver, actions: Actions, fabric: Fabric, cluster: ClusterPorts,
                 events: EventRecorder, config: LoopConfig,
                 clock: Callable[[], float], is_leader: Callable[[], bool] = lambda: True,
                 journal: Optional[DecisionJournal] = None) -> None:
        # Gangs (coscheduling PodGroups, Workloads) are filled into every snapshot, the loop's and CA's RPCs' alike.
        self.observer = PodGroupObserver(observer, cluster.pod_groups)
        self.actions = actions  # the applier: every attach, detach, node add and removal, taint and label
        self.executor = actions.executor
        self.watcher = actions.watcher
        self.fabric = fabric
        self.events = events
        self.config = config
        self.clock = clock
        self.is_leader = is_leader
        self.journal = journal or DecisionJournal(clock)  # what was decided and why: /decisions on the ops port
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.RLock()  # one planning pass at a time (loop and CA's RPCs share the fabric)
        self.calls_first = CallsFirst()  # CA's calls have a deadline, the loop has none: it steps aside for them
        # Node removals, CA's and the loop's: GPUs released first, the node next (a table: dds/controller/removals.py).
        self.removals = NodeRemovals(actions, _RemovalTaints(actions), events, self.watcher.in_flight)
        self.orphans = OrphanFinder(config.orphan_timeout_seconds)
        self.unheld = UnheldDevices(config.unheld_grace_seconds) if config.unheld_grace_seconds is not None else None
        self.listeners: list[Callable[[Observation], None]] = []  # e.g. the instance tracker's reconcile
        self.memory_visibility = MemoryVisibility(events, config.cxl_memory_visible_timeout_seconds)
        # CA's GPU label follows each node's GPUs; every detach, whoever plans it, goes through this executor.
        self.gpu_labels = cluster.gpu_labels
        self.executor.before_detach = self.gpu_labels.before_detach
        self.refusals = RefusalReporter(events)  # pods DDS cannot help: one Event per pod and reason
        # What planning keeps between decisions, for the loop's passes and CA's calls alike (PlannerMemos says why
        # sharing it between their concurrent decisions is safe).
        self.memos = PlannerMemos()
        self.gangs = GangAttaches(self.actions, fabric, events, config.gang_start_timeout_seconds, clock,
                                  memos=self.memos, planner=config.planner)
        self.reservations = Reservations(cluster.reservation_writes, self.actions, events, self.journal,
                                         config.reservations)
        self.provisioning = _provisioning(cluster, actions, events, self.journal, config.provisioning, clock)
        # DRA pool mode, for the groups annotated dds.cdi.dev/gpu-api: dra-pool (none: it writes nothing).
        self.gpu_gauges = GpuGauges()  # GPUs per node, idle GPUs past the cooldown: set from each pass's decisions
        self.pool_binder = cluster.pool_binder

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    def ca_call_ports(self) -> CaCallPorts:
        # `observe` looks the observer up on each call: the observer's method is what runs, whenever it was bound.
        return CaCallPorts(decide_then_act=self.decide_then_act, observe=lambda: self.observer.observe(),
                           actions=self.actions,
                           memos=self.memos, journal=self.journal, refusals=self.refusals, events=self.events,
                           gangs=self.gangs, request_removal=self.request_removal,
                           on_every_pass=self.listeners.append, fabric_operations=self.fabric.operations,
                           clock=self.clock, provisioning=self.provisioning)

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
        calls do not wait for each other's planning; a decision taken on a snapshot that may miss a change (any attach,
        detach, node added or removed, finished since or under way then: `Executor.changed_since`) is taken again
        under the lock, on a fresh snapshot, so no two decisions ever count on the same free GPU or miss each other's
        capacity."""
        with self.calls_first.call():
            mark = self.executor.mark()
            decision = decide()
            with self._lock:
                if self.executor.changed_since(mark):
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
        changes, labels_mark = self.executor.mark(), self.gpu_labels.mark()
        observation = self.observer.observe()
        # The GPU label is bookkeeping for CA, not a decision: written by a thread of its own (dds/controller/
        # gpu_label.py), as thousands of label writes on a first pass must neither hold CA's calls nor the pass.
        self.gpu_labels.offer(observation.snapshot, since=labels_mark)
        requests = self.provisioning.read()
        waited[0] += self._step_aside_for_calls()
        decisions = self._decide(observation, requests=requests)
        waited[0] += self._step_aside_for_calls()
        with self._lock:
            for listener in self.listeners:
                listener(observation)
            self.gangs.reconcile(observation.snapshot)
            # Before reservations and the fast path: a request's gang gets its capacity first.
            provisioning = self.provisioning.apply(decisions.provisioning)
            self._add_nodes(observation.snapshot, provisioning.new_nodes, "control loop: a ProvisioningRequest's "
                            "pods need a new node that attaches on live nodes cannot make up for", "provisioning")
            self.memory_visibility.check(observation.snapshot)
            # Before the fast path: its GPUs go first.
            reservations = self.reservations.apply(decisions.reservations, observation.snapshot)
            self.removals.resume(observation)
            self._attach_initial_gpus(observation)
            # Decide again on what changed since the snapshot: something started, or a gang this plan serves is now
            # held for its rollback (the plan was made before the reconcile that held it).
            if self.executor.changed_since(changes) or self.gangs.holds_any(decisions.waiting):
                observation = self.observer.observe()
                decisions = self._decide(observation, reservations, requests, provisioning)
            # Before acting: a pass that fails while acting still shows the idle GPUs it meant to release.
            self.gpu_gauges.record(observation.snapshot, decisions.scale_down)
            self._act(observation, decisions)
            self.pool_binder.reconcile(observation.snapshot)
            self._reclaim_orphans(observation)
            self._report_unheld(observation.snapshot)
        return observation

    def _step_aside_for_calls(self) -> float:
        """Wait while CA's calls are under way (dds/controller/calls_first.py). Never under the lock: a call waiting
        for the lock would wait for this pass, and this pass for it, until the wait's bound."""
        if self._lock._is_owned():  # type: ignore[attr-defined]  # RLock's own check, as threading.Condition uses
            raise RuntimeError("the control loop must not wait for CA's calls while it holds the planning lock")
        waited = self.calls_first.wait_for_calls()
        metrics.LOOP_WAITED.inc(waited)
        return waited

    def _decide(self, observation: Observation, reservations: Optional[ReservationPlan] = None,
                requests: ProvisioningView = ProvisioningView(),
                provisioning: Optional[ProvisioningPlan] = None) -> PassPlan:
        """Everything this pass would do, planned on one snapshot (no I/O, no lock): `plan_pass`, the one decision
        pass `dds simulate` runs too. `requests`: the ProvisioningRequests read this pass; `reservations`,
        `provisioning`: the plans already carried out this pass, when planning again."""
        snapshot = observation.snapshot
        pending = [p for p in snapshot.pending_pods() if p.key in observation.unschedulable_since]
        debounce = self.config.pending_debounce_seconds
        waiting = [p for p in pending if observation.unschedulable_since[p.key] + debounce <= snapshot.now]
        # Gangs being rolled back are planned whole once that is done (reserved pods: the pass leaves them out).
        inputs = PassInputs(pending=tuple(pending), waiting=tuple(self.gangs.not_held(waiting)),
                            removing=self.removals.nodes(), reservations=reservations, provisioning=requests,
                            provisioning_done=provisioning)
        # The reservations' settings are those of the Reservations that carry them out (one place says what they are).
        settings = PassSettings(planner=self.config.planner, move_idle_gpus=self.config.move_idle_gpus,
                                release_idle_gpus=self.config.release_idle_gpus,
                                reservations=self.reservations.config, provisioning=self.provisioning.config)
        return plan_pass(snapshot, inputs, settings,
                         timer=lambda stage: metrics.PLAN_LATENCY.labels(stage).time(), memos=self.memos)

    def _act(self, observation: Observation, decisions: PassPlan) -> None:
        if not self._serve_pending_by_attach(observation, decisions):
            self._keep_room_headroom(decisions.room_headroom)
            self._refill_headroom(decisions.warm_refill)
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
        self._add_nodes(observation.snapshot, plan, "control loop: pods with ResourceClaims need a new node "
                        "(cluster-autoscaler's templates carry no DRA devices)", "claims")

    def _add_nodes(self, snapshot: Snapshot, plan: Optional[ScaleUpPlan], trigger: str, key_prefix: str) -> None:
        """The plan's new nodes, each equipped with the GPUs its pods need from its pool (a node the pool cannot
        equip is not added: its pods are told why)."""
        if plan is None or not plan.new_nodes:
            return
        for step in plan.new_nodes:
            group = snapshot.group(step.group)
            if group is None:
                continue
            equipped, unequipped = equip_new_nodes(snapshot, replace(plan, new_nodes=(step,), attaches=()), group,
                                                   self.config.planner, memos=self.memos)
            if unequipped is not None:
                for pod in unequipped.pods:
                    self.refusals.tell(pod, POOL_EMPTY, f"no node added: {unequipped.message}")
            for kept in equipped.new_nodes:
                rendered = render_scale_up(replace(plan, new_nodes=(kept,), attaches=()))
                self.journal.record(Case.SCALE_UP.value, trigger, "node", rendered)
                metrics.DECISIONS.labels(Case.SCALE_UP.value, "node").inc()
                self.actions.add_nodes(kept, group, key=f"{key_prefix}/{uuid.uuid4().hex[:8]}", case=Case.SCALE_UP)

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
            self.actions.label(node.name, {ANN_INITIAL_GPUS_DONE: "true"})

    # --- the fast path (and case 2): pending pods that fit on live nodes once GPUs are attached ---
    def _serve_pending_by_attach(self, observation: Observation, decisions: PassPlan) -> bool:
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
        steps = plan.device_attaches  # GPUs and CXL memory chunks alike
        if not steps:
            return False
        rendered = render_scale_up(plan)
        waiting = len(decisions.waiting)
        log.info("fast path: %d pending pod(s) unschedulable for %.0fs or more; plan:\n%s", waiting,
                 self.config.pending_debounce_seconds, rendered)
        self.journal.record(Case.FAST_PATH.value, f"control loop: {waiting} pending pod(s) fit live nodes once "
                            "GPUs are attached", "gpu", rendered)
        metrics.DECISIONS.labels(Case.FAST_PATH.value, "gpu").inc()
        started = self.actions.attach_all(steps, f"fast-path/{uuid.uuid4().hex[:8]}", Case.FAST_PATH)
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
        removing = {r.node for r in owned_removals} | self.removals.nodes()
        detaches = [d for d in plan.detaches
                    if d.node in removing or self._detach_is_ours(snapshot, d.node)]
        if not detaches and not owned_removals and not self.removals:
            return
        if detaches or owned_removals:
            rendered = render_scale_down(plan)
            log.info("scale-down plan:\n%s", rendered)
            self.journal.record(Case.SCALE_DOWN_BLOCKED.value, "control loop: idle GPUs / empty nodes past cooldown",
                                "node" if owned_removals else "gpu", rendered)
        in_flight = self.watcher.in_flight()
        for index, step in enumerate(detaches):
            if detach_waits_for_in_flight(step, snapshot, in_flight):
                continue  # an operation on these devices' model runs there; idleness is judged again when it ends
            operation = self.actions.detach(step, f"detach/{uuid.uuid4().hex[:8]}/{index}", Case.SCALE_DOWN_BLOCKED)
            if operation is not None:
                self.observer.idle.reset(step.node)
        if detaches and not owned_removals:
            metrics.DECISIONS.labels(Case.SCALE_DOWN_BLOCKED.value, "gpu").inc(len(detaches))
        for removal in owned_removals:
            self.removals.plan(removal.node, removal.group)
        self.removals.finish(observation)

    def _detach_is_ours(self, snapshot, node_name: str) -> bool:
        node = next((n for n in snapshot.nodes if n.name == node_name), None)
        return node is not None and node.group_id is not None

    def request_removal(self, node: str, group_id: str) -> None:
        """Case 3: CA asked to delete this node; its GPUs are being released, the node goes when they are gone."""
        with self._lock:
            self.removals.request(node, group_id)

    # --- orphaned devices: on nodes that are gone, or held by attaches that never end ---
    def _reclaim_orphans(self, observation: Observation) -> None:
        live = {n.name for n in observation.snapshot.nodes}
        deleted: set[str] = set()
        if isinstance(self.fabric, NodeHoldingFabric):
            deleted = self.fabric.deleted_nodes_to_reclaim([n.name for n in observation.snapshot.nodes
                                                            if n.being_deleted])
        busy = {op.node for op in self.watcher.in_flight() if op.kind == OperationKind.DETACH}
        devices = self.fabric.devices()
        models = {d.id: d.model for d in devices}
        reclaims = self.orphans.find(devices, self.fabric.operations(), live - deleted, observation.snapshot.now,
                                     deleted=deleted)
        for reclaim in reclaims:
            if reclaim.node in busy:
                continue  # a detach already runs there; judged again when it ends
            for step in by_device_kind(Detach(reclaim.node, reclaim.device_ids, force=True, reason=reclaim.reason),
                                       models):
                if self.actions.detach(step, f"orphan/{uuid.uuid4().hex[:8]}", Case.ORPHAN_RECLAIM) is not None:
                    metrics.ORPHANS_RECLAIMED.inc(len(step.device_ids))

    # --- devices a node shows that no fabric record holds: reported, as DDS cannot detach them ---
    def _report_unheld(self, snapshot: Snapshot) -> None:
        if self.unheld is None:
            return
        judged = {n.name: n for n in snapshot.nodes if n.ready and not n.being_deleted and n.group_id is not None
                  and (group := snapshot.group(n.group_id)) is not None and group.gpu_api is GpuApi.EXTENDED_RESOURCE}
        held: dict[str, int] = {}
        for device in self.fabric.devices():
            if device.node in judged:
                held[device.node] = held.get(device.node, 0) + 1
        shown = {name: node.allocatable.get(node.gpu_resource) for name, node in judged.items()}
        found = self.unheld.find(shown, held, snapshot.now)
        metrics.UNHELD_DEVICES.set(sum(u.count for u in found))
        for unheld in self.unheld.newly_reported(found):
            node = judged[unheld.node]
            message = (f"{unheld.node} shows {unheld.shown} {node.gpu_resource} where the fabric's records of devices "
                       f"on it (and its own GPUs) account for {unheld.held}, for {snapshot.now - unheld.since:.0f} s "
                       f"(grace {self.unheld.grace_seconds:g} s): {unheld.count} device(s) attached that no "
                       f"ComposableResource holds. DDS cannot detach them and its pools do not count them; the CDI "
                       f"operator's upstream syncer releases such a device after its 10-minute grace. Check the "
                       f"fabric for devices of this node's machine that no ComposableResource names")
            log.warning(message)
            self.events.emit(node_ref(unheld.node), WARNING, "UnheldDevice", message)


def detach_waits_for_in_flight(step: Detach, snapshot: Snapshot, in_flight: Sequence[Operation]) -> bool:
    """Whether a scale-down detach waits for an operation in flight: one on the same node and model (a fabric changes
    one (node, model) at a time: the CDI operator keeps one request for it, and its size must not change twice at
    once). A stuck operation on another model of the node, or on another node, holds nothing back."""
    node = next((n for n in snapshot.nodes if n.name == step.node), None)
    wanted = set(step.device_ids)
    models = {d.model for d in (node.devices if node is not None else ()) if d.id in wanted}
    return any(op.node == step.node and (not models or not op.model or op.model in models) for op in in_flight)

def _provisioning(cluster: ClusterPorts, actions: Actions, events: EventRecorder, journal: DecisionJournal,
                  config: ProvisioningConfig, clock: Callable[[], float]) -> ProvisioningRequests:
    """The ProvisioningRequests the loop serves: none without the cluster's ports for them."""
    if cluster.provisioning_reads is None or cluster.provisioning_writes is None:
        return ProvisioningRequests(_NoRequests(), _NoWrites(), cluster.reservation_writes, actions, events, journal,
                                    ProvisioningConfig(class_name=""), clock)
    return ProvisioningRequests(cluster.provisioning_reads, cluster.provisioning_writes, cluster.reservation_writes,
                                actions, events, journal, config, clock)


class _NoRequests:
    def read(self) -> ProvisioningView:
        return ProvisioningView()


class _NoWrites:
    def set_conditions(self, namespace: str, name: str, changes: Sequence[tuple[str, str, str, str]],
                       now: float) -> None:
        raise RuntimeError("no ProvisioningRequest is served without the cluster's ports for them")
