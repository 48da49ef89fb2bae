"""The planner behind cluster-autoscaler's calls: IncreaseSize (case 1) and DeleteNodes (case 3).

Both answer within CA's gRPC deadline: they plan on a fresh snapshot (milliseconds), start the work (fabric attaches are
asynchronous, node adds are a MachineSet patch) and return. Progress reaches CA through the in-flight instances the
provider lists (TargetSize / NodeGroupNodes): one instance per unit of `delta`, completed when its work is done, failed
with errorInfo when it cannot be done (CA then backs off and deletes the placeholder).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence

from kubernetes import client

from dds import metrics
from dds.controller.executor import node_ref
from dds.crashpoints import crashpoint
from dds.controller.loop import Controller
from dds.controller.observe import Observation
from dds.fabric.base import ErrorCode, FabricError, Operation, OperationKind, OperationState
from dds.model.events import NORMAL
from dds.model.groups import NodeGroupSpec, TemplateMode
from dds.planner import plan_scale_down, plan_scale_up, render_scale_down, render_scale_up
from dds.planner.plan import Case, NewNodes, PlannerConfig, ScaleUpPlan
from dds.provider.instances import InstanceKind, InstanceRecord, InstanceTracker
from dds.provider.registry import DeleteTarget, Placeholder

log = logging.getLogger(__name__)

ERROR_CLASS_OUT_OF_RESOURCES = 1
ERROR_CLASS_OTHER = 99


class ScaleUpRefused(Exception):
    """Nothing DDS can do for this group now (pool empty and group at max, or no pod fits it): CA should back off."""


@dataclass
class _GpuInstanceWork:
    pending: set[str] = field(default_factory=set)  # operation keys still running
    failed: list[Operation] = field(default_factory=list)
    attached: int = 0
    attached_elsewhere: bool = False  # waits on another request's attaches: their failure is not this instance's


class PlannerScaleUp:
    """Case 1: CA asked group `group` for `delta` nodes."""

    def __init__(self, controller: Controller, tracker: InstanceTracker, planner: PlannerConfig,
                 new_instance: Callable[[NodeGroupSpec, InstanceKind, str, str], InstanceRecord],
                 max_node_provision_seconds: float) -> None:
        self.controller = controller
        self.tracker = tracker
        self.planner = planner
        self.new_instance = new_instance
        self.max_node_provision_seconds = max_node_provision_seconds
        self._work: dict[str, _GpuInstanceWork] = {}
        self._lock = threading.Lock()
        controller.listeners.append(self.reconcile)

    def increase(self, group: NodeGroupSpec, delta: int, request_key: str) -> Sequence[InstanceRecord]:
        with self.controller.lock:
            observation = self.controller.observer.observe()
            pods = [p for p in observation.snapshot.pending_pods() if p.key in observation.unschedulable_since]
            config = replace(self.planner, groups=(group.id,))
            with metrics.PLAN_LATENCY.labels("scale-up").time():
                plan = plan_scale_up(observation.snapshot, config, pods)
            metrics.PENDING_PODS.set(len(pods))
            rendered = render_scale_up(plan)
            log.info("case 1: CA asked %s for %d node(s); plan:\n%s", group.id, delta, rendered)
            trigger = f"cluster-autoscaler IncreaseSize {group.id} +{delta}"
            if plan.is_empty and not self._covered(plan):
                metrics.DECISIONS.labels(Case.SCALE_UP.value, "none").inc()
                self.controller.journal.record(Case.SCALE_UP.value, trigger, "none", rendered)
                raise ScaleUpRefused(_refusal(plan, group))
            self.controller.journal.record(Case.SCALE_UP.value, trigger, _outcome(plan, group), rendered)
            return self._execute(group, delta, plan, request_key)

    @staticmethod
    def _covered(plan: ScaleUpPlan) -> bool:
        """Every pod the plan looked at already fits (capacity on its way): the scale-up is satisfied as it stands."""
        from dds.planner.plan import Verdict

        return bool(plan.decisions) and all(d.verdict == Verdict.FITS_NOW for d in plan.decisions)

    def _execute(self, group: NodeGroupSpec, delta: int, plan: ScaleUpPlan, request_key: str) -> list[InstanceRecord]:
        executor = self.controller.executor
        nodes_wanted = min(sum(n.count for n in plan.new_nodes if n.group == group.id), delta)
        gpu_slots = delta - nodes_wanted
        outcome = "mixed" if plan.attaches and nodes_wanted else ("node" if nodes_wanted else "gpu")
        metrics.DECISIONS.labels(Case.SCALE_UP.value, outcome if not plan.is_empty else "none").inc()
        instances: list[InstanceRecord] = []
        if nodes_wanted:
            pods = tuple(p for n in plan.new_nodes for p in n.pods)
            reason = "; ".join(n.reason for n in plan.new_nodes)
            for _ in range(nodes_wanted):
                instances.append(self.tracker.add(self.new_instance(group, InstanceKind.NODE, reason, request_key)))
            crashpoint("scale-up.node-instance-recorded")
            executor.add_nodes(NewNodes(group=group.id, count=nodes_wanted, pods=pods, reason=reason), group,
                               key=instances[0].id, case=Case.SCALE_UP)
        gpu_instances = [self.tracker.add(self.new_instance(
            group, InstanceKind.GPU, "; ".join(a.reason for a in plan.attaches) or "capacity already on its way",
            request_key)) for _ in range(gpu_slots)]
        instances += gpu_instances
        if gpu_instances:
            crashpoint("scale-up.gpu-instance-recorded")
        for instance in gpu_instances:
            self._work[instance.id] = _GpuInstanceWork()
        if gpu_instances and not plan.attaches:
            # The pods fit on capacity already on its way: each instance stays "creating" until the attaches in
            # flight end, so CA sees the scale-up it asked for as upcoming instead of asking again every loop.
            self._wait_for_in_flight_attaches(gpu_instances)
        if gpu_instances:
            for index, step in enumerate(plan.attaches):
                owner = gpu_instances[index % len(gpu_instances)]
                key = f"{owner.id}#{index}"
                try:
                    operation = executor.attach(step, key=key, case=Case.SCALE_UP)
                except FabricError as exc:
                    self._fail(owner, exc.code, exc.message)
                    continue
                self._work[owner.id].pending.add(key)
                self.controller.watcher.watch(operation, on_done=lambda op, iid=owner.id: self._on_attach_done(iid, op))
        elif plan.attaches:
            # CA asked for nodes only (delta used up by nodes); the attaches serve the rest of the pods meanwhile.
            for index, step in enumerate(plan.attaches):
                try:
                    operation = executor.attach(step, key=f"{instances[0].id}#gpu{index}", case=Case.SCALE_UP)
                except FabricError:
                    continue
                self.controller.watcher.watch(operation)
        return instances

    def _wait_for_in_flight_attaches(self, instances: list[InstanceRecord]) -> None:
        watcher = self.controller.watcher
        in_flight = [op for op in watcher.in_flight() if op.kind == OperationKind.ATTACH and not op.state.done]
        for instance in instances:
            work = self._work[instance.id]
            for operation in in_flight:
                work.pending.add(operation.key)
                work.attached_elsewhere = True
                watcher.watch(operation, on_done=lambda op, iid=instance.id: self._on_attach_done(iid, op))

    # --- progress ---
    def _on_attach_done(self, instance_id: str, operation: Operation) -> None:
        with self._lock:
            work = self._work.get(instance_id)
            if work is None:
                return
            work.pending.discard(operation.key)
            work.attached += len(operation.devices)
            if operation.state == OperationState.FAILED:
                work.failed.append(operation)

    def reconcile(self, observation: Observation) -> None:
        """Called every controller loop: finish GPU instances whose attaches ended, node instances whose node is up."""
        now = observation.snapshot.now
        for group in observation.snapshot.groups:
            records = self.tracker.list(group.id)
            self._reconcile_gpu(group, [r for r in records if r.kind == InstanceKind.GPU and not r.error_code])
            self._reconcile_nodes(group, observation, now,
                                  [r for r in records if r.kind == InstanceKind.NODE and not r.error_code])

    def _reconcile_gpu(self, group: NodeGroupSpec, records: list[InstanceRecord]) -> None:
        for record in records:
            work = self._work.get(record.id)
            if work is None:
                # Left by a previous process: follow the fabric operations it started (keys carry its id).
                work = self._adopt(record)
            if work.pending:
                continue
            crashpoint("scale-up.gpu-instance-done")
            if work.failed and work.attached == 0 and not work.attached_elsewhere:
                error = work.failed[0].error or FabricError(ErrorCode.BACKEND, "attach failed")
                if not self._fall_back_to_node(group, record, error):
                    self._fail(record, error.code, error.message)
            else:
                self.tracker.complete(record.id)
            self._work.pop(record.id, None)

    def _adopt(self, record: InstanceRecord) -> _GpuInstanceWork:
        work = _GpuInstanceWork()
        for operation in self.controller.fabric.operations():
            if operation.key.startswith(f"{record.id}#"):
                if operation.state.done:
                    work.attached += len(operation.devices)
                    if operation.state == OperationState.FAILED:
                        work.failed.append(operation)
                else:
                    work.pending.add(operation.key)
                    self.controller.watcher.watch(
                        operation, on_done=lambda op, iid=record.id: self._on_attach_done(iid, op))
        self._work[record.id] = work
        return work

    def _fall_back_to_node(self, group: NodeGroupSpec, record: InstanceRecord, error: FabricError) -> bool:
        """The pool could not serve: turn this GPU instance into a node, if the group has room."""
        if error.code != ErrorCode.OUT_OF_RESOURCES:
            return False
        live = sum(1 for n in self.controller.observer.observe().snapshot.nodes if n.group_id == group.id)
        nodes_in_flight = sum(1 for r in self.tracker.list(group.id) if r.kind == InstanceKind.NODE)
        if live + nodes_in_flight >= group.max_size:
            return False
        reason = f"pool {group.fabric_pool} could not serve ({error.message}); adding a node instead"
        replacement = self.tracker.add(self.new_instance(group, InstanceKind.NODE, reason, record.request_key))
        self.tracker.complete(record.id)
        self.controller.executor.add_nodes(NewNodes(group=group.id, count=1, pods=(), reason=reason), group,
                                           key=replacement.id, case=Case.SCALE_UP)
        metrics.DECISIONS.labels(Case.SCALE_UP.value, "node").inc()
        return True

    def _reconcile_nodes(self, group: NodeGroupSpec, observation: Observation, now: float,
                         records: list[InstanceRecord]) -> None:
        upcoming = self._still_coming(group, observation)
        # Nodes that are up no longer need an instance: complete the oldest beyond what is still coming.
        for record in sorted(records, key=lambda r: r.created_at)[:max(0, len(records) - upcoming)]:
            self.tracker.complete(record.id)
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
                   if m.group_id == group.id and not m.deleting and not arrived(m.node_name))

    def _fail(self, record: InstanceRecord, code: ErrorCode, message: str, klass: int | None = None) -> None:
        if klass is None:
            klass = ERROR_CLASS_OUT_OF_RESOURCES if code in (ErrorCode.OUT_OF_RESOURCES, ErrorCode.SLOTS_FULL) \
                else ERROR_CLASS_OTHER
        self.tracker.fail(record.id, code.value, message, klass)
        metrics.DECISIONS.labels(Case.SCALE_UP.value, "error").inc()
        log.warning("instance %s of %s failed: %s: %s", record.id, record.group_id, code.value, message)


def _outcome(plan: ScaleUpPlan, group: NodeGroupSpec) -> str:
    nodes = any(n.group == group.id for n in plan.new_nodes)
    return "mixed" if plan.attaches and nodes else "node" if nodes else "gpu"


def _refusal(plan: ScaleUpPlan, group: NodeGroupSpec) -> str:
    reasons = "; ".join(f"{d.pod}: {d.reason}" for d in plan.decisions[:5]) or "no pending pod fits this group"
    return f"DDS cannot add capacity to {group.id}: {reasons}"


class PlannerScaleDown:
    """Case 3: CA asked to delete nodes of a group (observed mode), or placeholders of failed instances."""

    def __init__(self, controller: Controller, tracker: InstanceTracker, planner: PlannerConfig,
                 api: client.ApiClient) -> None:
        self.controller = controller
        self.tracker = tracker
        self.planner = planner
        self._core = client.CoreV1Api(api)

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
        with self.controller.lock:
            observation = self.controller.observer.observe()
            plan = plan_scale_down(observation.snapshot, replace(self.planner, node_removal_enabled=True), names)
            rendered = render_scale_down(plan)
            log.info("case 3: CA asked to remove %s from %s; plan:\n%s", ", ".join(names), group.id, rendered)
            removed = any(r.node in names for r in plan.removals)
            self.controller.journal.record(Case.SCALE_DOWN.value,
                                           f"cluster-autoscaler DeleteNodes {group.id}: {', '.join(names)}",
                                           "node" if removed else "gpu", rendered)
            executor = self.controller.executor
            for index, step in enumerate(d for d in plan.detaches if d.node in names):
                operation = executor.detach(step, key=f"{request_key}/detach/{index}", case=Case.SCALE_DOWN)
                if operation is not None:
                    self.controller.watcher.watch(operation)
            for removal in plan.removals:
                if removal.node in names:
                    self.controller.request_removal(removal.node, group.id)
                    metrics.DECISIONS.labels(Case.SCALE_DOWN.value, "node").inc()
            for keep in plan.kept:
                if keep.node in names:
                    self._untaint(keep.node)
                    metrics.DECISIONS.labels(Case.SCALE_DOWN.value, "gpu").inc()
                    self.controller.events.emit(node_ref(keep.node), NORMAL, "KeptNode",
                                                f"CA asked to remove it; only idle GPUs are released: {keep.reason}")

    def _untaint(self, node_name: str) -> None:
        node = self._core.read_node(node_name)
        taints = [t for t in node.spec.taints or [] if t.key != "ToBeDeletedByClusterAutoscaler"]
        self._core.patch_node(node_name, {"spec": {"taints": [t.to_dict() for t in taints],
                                                   "unschedulable": False}})
