"""The planner behind cluster-autoscaler's calls: IncreaseSize (case 1) and DeleteNodes (case 3).

Both answer within CA's gRPC deadline: they plan on a fresh snapshot (milliseconds), start the work (fabric attaches are
asynchronous, node adds are a MachineSet patch) and return. Progress reaches CA through the in-flight instances the
provider lists (TargetSize / NodeGroupNodes): one instance per unit of `delta`, completed when its work is done, failed
with errorInfo when it cannot be done (CA then backs off and deletes the placeholder).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence


from dds import metrics
from dds.planner import attach_failures
from dds.scaling.node_actions import machineset_ref, node_ref, pod_ref
from dds.controller.gpu_retries import GpuInstanceRetries, InstanceOutcomes
from dds.crashpoints import crashpoint
from dds.controller.loop import CaCallPorts
from dds.controller.observe import Observation
from dds.fabric.base import ErrorCode, FabricError, OperationKind
from dds.kube.convert import TAINT_TO_BE_DELETED
from dds.model.events import NORMAL, WARNING
from dds.model.groups import NodeGroupSpec, TemplateMode
from dds.planner import plan_scale_down, plan_scale_up, render_scale_down, render_scale_up
from dds.model.plan import Attach, Case, NewNodes, PlannerConfig, ScaleDownPlan, ScaleUpPlan
from dds.planner.equip import Unequipped, equip_new_nodes
from dds.planner.gangs import AfterCut, whole_gangs_after_cut
from dds.planner.passes import with_attaches
from dds.planner.provisioning import REASON_PROVISIONED, ProvisioningPlan, plan_atomic_scale_up
from dds.model.provisioning import CA_ATOMIC_CLASS
from dds.planner.refusals import POOL_EMPTY
from dds.model.snapshot import PodInfo, Snapshot
# The servicer's own: it answers RESOURCE_EXHAUSTED (CA backs the group off). A class of our own here was answered
# INTERNAL, with a traceback in the log, for every "nothing to add" (pool empty and group at max, or no pod fits).
from dds.scaling.requests import ScaleUpRefused
from dds.scaling.instances import InstanceKind, InstanceRecord, InstanceTracker
from dds.scaling.requests import DeleteTarget, Placeholder

log = logging.getLogger(__name__)

ERROR_CLASS_OUT_OF_RESOURCES = attach_failures.ERROR_CLASS_OUT_OF_RESOURCES
ERROR_CLASS_OTHER = attach_failures.ERROR_CLASS_OTHER


@dataclass(frozen=True)
class _ScaleUpDecision:
    observation: Observation
    config: PlannerConfig
    pods: list[PodInfo]  # the unschedulable pods planned for
    plan: ScaleUpPlan
    # No pending pod explains the call: the requests of CA's atomic class it may be for, planned (None: none waits).
    atomic: Optional[ProvisioningPlan] = None


class PlannerScaleUp:
    """Case 1: CA asked group `group` for `delta` nodes."""

    def __init__(self, ports: CaCallPorts, tracker: InstanceTracker, planner: PlannerConfig,
                 new_instance: Callable[[NodeGroupSpec, InstanceKind, str, str], InstanceRecord],
                 max_node_provision_seconds: float) -> None:
        self.ports = ports  # what these handlers get of the controller (dds/controller/loop.py)
        self.tracker = tracker
        self.planner = planner
        self.new_instance = new_instance
        self.max_node_provision_seconds = max_node_provision_seconds
        # GPU instances' attaches, retries and fallbacks: a table-driven lifecycle (dds/controller/gpu_retries.py).
        self.gpu_instances = GpuInstanceRetries(
            ports.clock,
            start_attach=lambda step, key, on_done: ports.actions.attach(step, key, Case.SCALE_UP, on_done=on_done),
            watch=lambda operation, on_done: ports.actions.watcher.watch(operation, on_done=on_done),
            operations=ports.fabric_operations)
        ports.on_every_pass(self.reconcile)

    def increase(self, group: NodeGroupSpec, delta: int, request_key: str) -> Sequence[InstanceRecord]:
        return self.ports.decide_then_act(lambda: self._decide(group),
                                               lambda decision: self._act(group, delta, request_key, decision))

    def _decide(self, group: NodeGroupSpec) -> "_ScaleUpDecision":
        observation = self.ports.observe()
        pods = [p for p in observation.snapshot.pending_pods() if p.key in observation.unschedulable_since]
        config = replace(self.planner, groups=(group.id,))
        with metrics.PLAN_LATENCY.labels("scale-up").time():
            plan = plan_scale_up(observation.snapshot, config, pods, memos=self.ports.memos)
            atomic = None
            if plan.is_empty and not self._covered(plan):
                atomic = self._plan_atomic(group, observation.snapshot, config)
        return _ScaleUpDecision(observation, config, pods, plan, atomic)

    def _plan_atomic(self, group: NodeGroupSpec, snapshot: Snapshot,
                     config: PlannerConfig) -> Optional[ProvisioningPlan]:
        """The waiting requests of CA's atomic class, planned (dds/planner/provisioning.py): CA's best-effort-atomic
        scale-up reaches DDS as this IncreaseSize, with the request's pods not made yet. None when none waits."""
        provisioning = self.ports.provisioning
        view = provisioning.read()
        if not any(r.cluster_autoscalers for r in view.requests):
            return None
        plan = plan_atomic_scale_up(snapshot, view, provisioning.config, config, with_attaches,
                                    f"cluster-autoscaler's scale-up of {group.id} (IncreaseSize, class "
                                    f"{CA_ATOMIC_CLASS})", memos=self.ports.memos)
        return plan if plan.decisions or plan.served else None

    def _act(self, group: NodeGroupSpec, delta: int, request_key: str,
             decision: "_ScaleUpDecision") -> Sequence[InstanceRecord]:
        observation, config, plan = decision.observation, decision.config, decision.plan
        metrics.PENDING_PODS.set(len(decision.pods))
        self.ports.refusals.report_plan(plan)
        rendered = render_scale_up(plan)
        log.info("case 1: CA asked %s for %d node(s); plan:\n%s", group.id, delta, rendered)
        trigger = f"cluster-autoscaler IncreaseSize {group.id} +{delta}"
        if decision.atomic is not None:
            return self._serve_atomic(group, delta, request_key, decision, decision.atomic, trigger)
        if plan.is_empty and not decision.pods:
            return self._stale(group, delta, trigger, rendered)
        if plan.is_empty and not self._covered(plan):
            metrics.DECISIONS.labels(Case.SCALE_UP.value, "none").inc()
            self.ports.journal.record(Case.SCALE_UP.value, trigger, "none", rendered)
            raise ScaleUpRefused(_refusal(plan, group))
        after = self._equip_whole_gangs(group, decision)
        plan, unequipped = after.plan, after.taken
        if unequipped is not None:
            rendered += f"\n  not added: {unequipped.message}"
        rendered += "".join(f"\n  left out: {why}" for why in after.dropped.values())
        if after.gangs_dropped and plan.is_empty and unequipped is None:
            # Every gang the pool could not equip was dropped and nothing else is left: refused (RESOURCE_EXHAUSTED),
            # so CA backs the group off instead of asking again for nodes that would serve part of a gang.
            metrics.DECISIONS.labels(Case.SCALE_UP.value, "none").inc()
            self.ports.journal.record(Case.SCALE_UP.value, trigger, "none", rendered)
            raise ScaleUpRefused(f"DDS cannot add capacity to {group.id}: " + "; ".join(after.dropped.values()))
        self.ports.journal.record(Case.SCALE_UP.value, trigger,
                                       "error" if unequipped and plan.is_empty else _outcome(plan, group), rendered)
        if unequipped is None:
            return self._execute(group, delta, plan, request_key, observation.snapshot)
        # CA's units go first to the nodes the pool cannot equip (each one an OutOfResources instance: the part CA
        # asked for that cannot be served), the rest to the plan. The plan's attaches are carried out either way:
        # a unit of CA's that failed says "no node", not "no GPU for the pods a live node can take".
        failing = delta if plan.is_empty else min(delta, unequipped.nodes)
        records = self._out_of_resources(group, failing, unequipped, request_key)
        if delta > failing:
            records += self._execute(group, delta - failing, plan, request_key, observation.snapshot)
        elif plan.device_attaches:
            self._attach_without_instance(observation.snapshot, plan.device_attaches, key_prefix=records[0].id)
        return records

    def _stale(self, group: NodeGroupSpec, delta: int, trigger: str, rendered: str) -> Sequence[InstanceRecord]:
        """No pending pod and no waiting request of CA's atomic class: the pod CA asked for has been bound since CA
        looked (or deleted). Answered with success and nothing added: TargetSize stays as it is, so CA's clusterstate
        finds no upcoming node at its next loop and closes the scale-up as done (clusterstate.go, updateScaleRequests),
        instead of backing the whole group off for 5 minutes as it does after a refusal (executor.go)."""
        metrics.DECISIONS.labels(Case.SCALE_UP.value, "none").inc()
        why = (f"no pending pod waits for capacity and no ProvisioningRequest of class {CA_ATOMIC_CLASS} waits: the "
               f"pod CA asked for was bound (or deleted) since CA looked; nothing added, target size unchanged")
        log.info("case 1: CA asked %s for %d node(s): %s", group.id, delta, why)
        self.ports.journal.record(Case.SCALE_UP.value, trigger, "none", f"{rendered}\n  {why}")
        return []

    def _serve_atomic(self, group: NodeGroupSpec, delta: int, request_key: str, decision: "_ScaleUpDecision",
                      atomic: ProvisioningPlan, trigger: str) -> Sequence[InstanceRecord]:
        """CA's IncreaseSize for its atomic class's requests (`atomic`, planned as DDS's own class is): the nodes
        booked first, then the attaches started as this call's GPU instances and the nodes added as its node
        instances. While they run, TargetSize counts them (CA waits, as for nodes on their way); once the GPUs are
        attached the instances complete and TargetSize is the live nodes again, so CA's clusterstate closes the
        scale-up as done, never waiting for a node that does not come. Every pod already fitting: success with
        nothing added. No request served whole: refused (CA marks the request Provisioned=False and retries)."""
        provisioning = self.ports.provisioning
        rendered = "\n".join(f"  {d.request.key}: {d.event_message}" for d in atomic.decisions if d.event_reason)
        log.info("case 1: CA asked %s for %d node(s), no pending pod behind it; requests of class %s:\n%s",
                 group.id, delta, CA_ATOMIC_CLASS, rendered)
        unbooked = provisioning.book(atomic)
        provisioning.record(atomic, unbooked)
        booked = {node: uid for node, uid in atomic.booked_by if uid not in unbooked}
        served_keys = set(atomic.served) - {d.request.key for d in atomic.decisions if d.request.uid in unbooked}
        if not served_keys:
            metrics.DECISIONS.labels(Case.SCALE_UP.value, "none").inc()
            self.ports.journal.record(Case.SCALE_UP.value, trigger, "none", rendered)
            reasons = "; ".join(f"{d.request.key}: {d.event_message}" for d in atomic.decisions if d.warning) \
                or "a node could not be booked for it (the next call tries again)"
            raise ScaleUpRefused(f"DDS cannot add capacity to {group.id}: no pending pod fits this group, and no "
                                 f"ProvisioningRequest of class {CA_ATOMIC_CLASS} fits whole: {reasons}")
        attaches = tuple(a for a in atomic.attaches if booked.get(a.node) is not None)
        new_nodes = tuple(n for n in (atomic.new_nodes.new_nodes if atomic.new_nodes else ()) if n.group == group.id)
        plan = ScaleUpPlan(attaches=attaches, new_nodes=new_nodes,
                           decisions=atomic.new_nodes.decisions if atomic.new_nodes else ())
        # Served requests not all in place yet: GPUs or nodes still coming, this call's or an earlier one's.
        waiting = bool(served_keys - {d.request.key for d in atomic.decisions if d.event_reason == REASON_PROVISIONED})
        self.ports.journal.record(Case.SCALE_UP.value, trigger, _outcome(plan, group) if not plan.is_empty else
                                  "none", rendered)
        if plan.is_empty and not waiting:
            metrics.DECISIONS.labels(Case.SCALE_UP.value, "none").inc()
            log.info("case 1: every pod of %s fits now on what is booked for it: nothing added, target size "
                     "unchanged", ", ".join(sorted(served_keys)))
            return []
        return self._execute(group, delta, plan, request_key, decision.observation.snapshot)

    def _equip_whole_gangs(self, group: NodeGroupSpec, decision: "_ScaleUpDecision") -> AfterCut[Unequipped]:
        """The plan without the new nodes the pool cannot equip (equip_new_nodes), and without every gang that cut
        leaves short: all or nothing holds after the cut too (whole_gangs_after_cut). The gangs' members are told."""
        snapshot, config = decision.observation.snapshot, decision.config
        memos = self.ports.memos
        after = whole_gangs_after_cut(decision.plan, lambda plan: equip_new_nodes(snapshot, plan, group, config,
                                                                                  memos=memos),
                                      lambda pods: plan_scale_up(snapshot, config, pods, memos=memos), snapshot,
                                      decision.pods,
                                      describe=_lacking, memos=memos)
        if after.gangs_dropped:
            for why in after.dropped.values():
                log.info("case 1: %s", why)
            self.ports.refusals.report_plan(after.plan)
        return after

    def _out_of_resources(self, group: NodeGroupSpec, count: int, unequipped: Unequipped,
                          request_key: str) -> list[InstanceRecord]:
        """Units of CA's scale-up that only GPU-less nodes could serve: listed to CA as failed (OutOfResources) at
        once, so it backs off or tries another group instead of waiting for nodes that would not help."""
        records = self.tracker.add_all([self.new_instance(group, InstanceKind.NODE, unequipped.message, request_key)
                                        for _ in range(count)])
        for record in records:
            self._fail(record, ErrorCode.OUT_OF_RESOURCES, unequipped.message, klass=ERROR_CLASS_OUT_OF_RESOURCES)
        message = f"no node added: {unequipped.message}; cluster-autoscaler is told OutOfResources"
        self.ports.events.emit(machineset_ref(group), WARNING, "NoFreeGPU", message)
        for pod in unequipped.pods:
            self.ports.refusals.tell(pod, POOL_EMPTY, message)
        return records

    @staticmethod
    def _covered(plan: ScaleUpPlan) -> bool:
        """Every pod this group could serve already fits (capacity on its way): the scale-up is satisfied as it stands.
        A pod that fits nowhere, not even on a new node of this group at max GPUs, is not what CA asked this group for
        (CA simulates the same template): it must not turn the answer into a refusal, which backs the group off."""
        from dds.model.plan import Verdict

        verdicts = {d.verdict for d in plan.decisions}
        return Verdict.FITS_NOW in verdicts and verdicts <= {Verdict.FITS_NOW, Verdict.UNSCHEDULABLE}

    def _execute(self, group: NodeGroupSpec, delta: int, plan: ScaleUpPlan, request_key: str,
                 snapshot: Snapshot) -> list[InstanceRecord]:
        nodes_wanted = min(sum(n.count for n in plan.new_nodes if n.group == group.id), delta)
        gpu_slots = delta - nodes_wanted
        outcome = "mixed" if plan.device_attaches and nodes_wanted else ("node" if nodes_wanted else "gpu")
        metrics.DECISIONS.labels(Case.SCALE_UP.value, outcome if not plan.is_empty else "none").inc()
        instances: list[InstanceRecord] = []
        if nodes_wanted:
            pods = tuple(p for n in plan.new_nodes for p in n.pods)
            reason = "; ".join(n.reason for n in plan.new_nodes)
            instances += self.tracker.add_all([self.new_instance(group, InstanceKind.NODE, reason, request_key)
                                               for _ in range(nodes_wanted)])
            crashpoint("scale-up.node-instance-recorded")
            self.ports.actions.add_nodes(NewNodes(group=group.id, count=nodes_wanted, pods=pods, reason=reason),
                                              group, key=instances[0].id, case=Case.SCALE_UP)
        gpu_instances = self.tracker.add_all([self.new_instance(group, InstanceKind.GPU, reason, request_key)
                                              for reason in _gpu_instance_reasons(plan.device_attaches, gpu_slots)])
        instances += gpu_instances
        if gpu_instances:
            crashpoint("scale-up.gpu-instance-recorded")
        for instance in gpu_instances:
            self.gpu_instances.start(instance.id)
        if gpu_instances and not plan.device_attaches:
            # The pods fit on capacity already on its way: each instance stays "creating" until the attaches in
            # flight end, so CA sees the scale-up it asked for as upcoming instead of asking again every loop.
            self._wait_for_in_flight_attaches(gpu_instances)
        if gpu_instances:
            self._attach_for_instances(snapshot, plan.device_attaches, gpu_instances)
        elif plan.device_attaches:
            # CA asked for nodes only (delta used up by nodes); the attaches serve the rest of the pods meanwhile.
            self._attach_without_instance(snapshot, plan.device_attaches, key_prefix=instances[0].id)
        return instances

    def _attach_for_instances(self, snapshot: Snapshot, attaches: Sequence[Attach],
                              instances: Sequence[InstanceRecord]) -> None:
        """The plan's attaches, shared out over CA's GPU instances, started at once (a burst is one fabric
        transaction where the fabric has them); an instance whose attach the fabric refuses fails with its error."""
        owners = [instances[_owner_index(index, len(instances))] for index in range(len(attaches))]
        keyed = [(step, f"{owner.id}#{index}") for index, (step, owner) in enumerate(zip(attaches, owners))]
        for (step, key), owner in zip(keyed, owners):
            self.gpu_instances.expect(owner.id, key, step)
        done = [self.gpu_instances.reporter(owner.id) for owner in owners]
        results = self.ports.actions.attach_keyed(keyed, Case.SCALE_UP, on_done=done)
        started_steps, started_keys = [], []
        for (step, key), owner, result in zip(keyed, owners, results):
            if isinstance(result, FabricError):
                self.gpu_instances.refused_at_start(owner.id)
                self._fail(owner, result.code, result.message)
                continue
            started_steps.append(step)
            started_keys.append(key)
        self.ports.gangs.started(snapshot, started_steps, started_keys)

    def _attach_without_instance(self, snapshot: Snapshot, attaches: Sequence[Attach], key_prefix: str) -> None:
        """Attaches that no GPU instance of CA's stands for: CA's units went to nodes. Keyed by the first of those
        instances, so the same request never attaches twice."""
        started = self.ports.actions.attach_all(attaches, f"{key_prefix}#gpu", Case.SCALE_UP)
        self.ports.gangs.started(snapshot, [step for step, _ in started], [op.key for _, op in started])

    def _wait_for_in_flight_attaches(self, instances: list[InstanceRecord]) -> None:
        watcher = self.ports.actions.watcher
        in_flight = [op for op in watcher.in_flight() if op.kind == OperationKind.ATTACH and not op.state.done]
        for instance in instances:
            for operation in in_flight:
                self.gpu_instances.wait_for(instance.id, operation)

    # --- progress ---
    def reconcile(self, observation: Observation) -> None:
        """Called every controller loop: finish GPU instances whose attaches ended, node instances whose node is up."""
        now = observation.snapshot.now
        self.gpu_instances.forget_ended(self._live_gpu_instance)
        for group in observation.snapshot.groups:
            records = self.tracker.list(group.id)
            self._reconcile_gpu(group, [r for r in records if r.kind == InstanceKind.GPU and not r.error_code],
                                observation)
            self._reconcile_nodes(group, observation, now,
                                  [r for r in records if r.kind == InstanceKind.NODE and not r.error_code])

    def _reconcile_gpu(self, group: NodeGroupSpec, records: list[InstanceRecord], observation: Observation) -> None:
        done: list[str] = []
        outcomes = InstanceOutcomes(has_room=lambda: self._has_room(group, observation),
                                    fall_back_to_node=lambda record, reason: self._fall_back_to_node(group, record,
                                                                                                     reason),
                                    fail=lambda record, code, message, klass: self._fail(record, code, message,
                                                                                          klass=klass),
                                    tell=self._tell)
        try:
            self.gpu_instances.follow(group, records, observation.snapshot, outcomes, done)
        finally:
            self.tracker.complete_all(done)

    def _live_gpu_instance(self, instance_id: str) -> bool:
        record = self.tracker.get(instance_id)
        return record is not None and not record.failed

    def _has_room(self, group: NodeGroupSpec, observation: Observation) -> bool:
        live = sum(1 for n in observation.snapshot.nodes if n.group_id == group.id)
        nodes_in_flight = sum(1 for r in self.tracker.list(group.id) if r.kind == InstanceKind.NODE and not r.failed)
        return live + nodes_in_flight < group.max_size

    def _fall_back_to_node(self, group: NodeGroupSpec, record: InstanceRecord, reason: str) -> None:
        """Attaching cannot serve this instance but a new node can: turn the GPU instance into a node instance."""
        replacement = self.tracker.add(self.new_instance(group, InstanceKind.NODE, reason, record.request_key))
        self.tracker.complete(record.id)
        self.ports.actions.add_nodes(NewNodes(group=group.id, count=1, pods=(), reason=reason), group,
                                          key=replacement.id, case=Case.SCALE_UP)
        metrics.DECISIONS.labels(Case.SCALE_UP.value, "node").inc()

    def _tell(self, kind: str, reason: str, message: str, nodes: Sequence[str], pods: Sequence[str]) -> None:
        for node in sorted(set(nodes)):
            self.ports.events.emit(node_ref(node), kind, reason, message)
        for pod in pods:
            self.ports.events.emit(pod_ref(pod), kind, reason, message)

    def _reconcile_nodes(self, group: NodeGroupSpec, observation: Observation, now: float,
                         records: list[InstanceRecord]) -> None:
        upcoming = self._still_coming(group, observation)
        # Nodes that are up no longer need an instance: complete the oldest beyond what is still coming.
        self.tracker.complete_all(r.id for r in sorted(records, key=lambda r: r.created_at)
                                  [:max(0, len(records) - upcoming)])
        for record in records:
            if now - record.created_at > self.max_node_provision_seconds and self.tracker.get(record.id):
                self._fail(record, ErrorCode.TIMEOUT,
                           f"node not up within {self.max_node_provision_seconds:.0f}s", klass=ERROR_CLASS_OTHER)

    @staticmethod
    def _still_coming(group: NodeGroupSpec, observation: Observation) -> int:
        """Machines of the group whose node is not there yet. In observed mode a registered node is listed to CA as a
        live node from then on, so its instance must go at registration (else CA counts it twice); in spec-fixed mode
        CA never sees the node, so the instance stays until the node is Ready and can take the pods."""
        nodes = {n.name: n for n in observation.snapshot.nodes}
        observed_mode = group.template_mode == TemplateMode.OBSERVED

        def arrived(node_name: Optional[str]) -> bool:
            node = nodes.get(node_name) if node_name else None
            return node is not None and (observed_mode or node.ready)

        return sum(1 for m in observation.machines
                   if m.group_id == group.id and not m.deleting and not arrived(m.node_name)) \
            + observation.replicas_without_machine(group.id)

    def _fail(self, record: InstanceRecord, code: ErrorCode, message: str, klass: int | None = None) -> None:
        if klass is None:
            klass = ERROR_CLASS_OUT_OF_RESOURCES if code in (ErrorCode.OUT_OF_RESOURCES, ErrorCode.SLOTS_FULL) \
                else ERROR_CLASS_OTHER
        self.tracker.fail(record.id, code.value, message, klass)
        metrics.DECISIONS.labels(Case.SCALE_UP.value, "error").inc()
        log.warning("instance %s of %s failed: %s: %s", record.id, record.group_id, code.value, message)


def _owner_index(attach_index: int, instances: int) -> int:
    """Which of CA's GPU instances carries the plan's attach `attach_index`: dealt out in turn."""
    return attach_index % instances


def _gpu_instance_reasons(attaches: Sequence[Attach], instances: int) -> list[str]:
    """Each GPU instance's reason: the attaches it carries (`_owner_index`), not the whole plan's (a hundred instances
    of a 500-pod plan each repeating every attach's reason made their ConfigMap too large to store)."""
    carried: list[list[str]] = [[] for _ in range(instances)]
    for index, attach in enumerate(attaches):
        carried[_owner_index(index, instances)].append(attach.reason)
    shared = f"shares this scale-up's {len(attaches)} attach(es), carried by the others"
    return ["; ".join(reasons) or (shared if attaches else "capacity already on its way") for reasons in carried]


def _outcome(plan: ScaleUpPlan, group: NodeGroupSpec) -> str:
    nodes = any(n.group == group.id for n in plan.new_nodes)
    return "mixed" if plan.attaches and nodes else "node" if nodes else "gpu"


def _lacking(unequipped: Unequipped) -> str:
    return f"the new nodes it needs cannot be equipped ({unequipped.message})"


def _refusal(plan: ScaleUpPlan, group: NodeGroupSpec) -> str:
    reasons = "; ".join(f"{d.pod}: {d.reason}" for d in plan.decisions[:5]) or "no pending pod fits this group"
    return f"DDS cannot add capacity to {group.id}: {reasons}"


class PlannerScaleDown:
    """Case 3: CA asked to delete nodes of a group (observed mode), or placeholders of failed instances."""

    def __init__(self, ports: CaCallPorts, tracker: InstanceTracker, planner: PlannerConfig) -> None:
        self.ports = ports  # what these handlers get of the controller (dds/controller/loop.py)
        self.tracker = tracker
        self.planner = planner

    def delete_nodes(self, group: NodeGroupSpec, nodes: Sequence[DeleteTarget], request_key: str) -> None:
        names = []
        for node in nodes:
            if isinstance(node, Placeholder):
                # The registry already dropped its instance (a failed or never-registered one CA gave up on): no
                # node exists, so nothing is planned for it.
                log.info("CA deleted placeholder %s of %s (%s)", node.name or node.provider_id, group.id,
                         node.reason or "no reason given")
                continue
            names.append(node.name)
        if not names:
            return
        config = replace(self.planner, node_removal_enabled=True)
        self.ports.decide_then_act(
            lambda: plan_scale_down(self.ports.observe().snapshot, config, names,
                                    memos=self.ports.memos),
            lambda plan: self._act(group, names, plan, request_key))

    def _act(self, group: NodeGroupSpec, names: list[str], plan: ScaleDownPlan, request_key: str) -> None:
        rendered = render_scale_down(plan)
        log.info("case 3: CA asked to remove %s from %s; plan:\n%s", ", ".join(names), group.id, rendered)
        removed = any(r.node in names for r in plan.removals)
        self.ports.journal.record(Case.SCALE_DOWN.value,
                                       f"cluster-autoscaler DeleteNodes {group.id}: {', '.join(names)}",
                                       "node" if removed else "gpu", rendered)
        for index, step in enumerate(d for d in plan.detaches if d.node in names):
            self.ports.actions.detach(step, f"{request_key}/detach/{index}", Case.SCALE_DOWN)
        for removal in plan.removals:
            if removal.node in names:
                self.ports.request_removal(removal.node, group.id)
                metrics.DECISIONS.labels(Case.SCALE_DOWN.value, "node").inc()
        for keep in plan.kept:
            if keep.node in names:
                self._untaint(keep.node)
                metrics.DECISIONS.labels(Case.SCALE_DOWN.value, "gpu").inc()
                self.ports.events.emit(node_ref(keep.node), NORMAL, "KeptNode",
                                       f"CA asked to remove it; DDS keeps the node: {keep.reason}")

    def _untaint(self, node_name: str) -> None:
        """CA tainted the node it asked to delete (and cordoned it, with --cordon-node-before-terminating); DDS keeps
        it, so CA's taint goes, and CA's cordon with it — an administrator's cordon stays (dds/kube/nodes.py)."""
        self.ports.actions.untaint(node_name, TAINT_TO_BE_DELETED, uncordon_if_cordoned_with_it=True)
