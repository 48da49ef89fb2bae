"""No GPU stays attached for a gang that cannot start.

The planner gives a gang's minimum capacity as one unit or not at all (dds/planner/gangs.py). What it planned can still
fall apart: one member's attach fails, or the gang does not start in time (a member the scheduler will not place).
Then the GPUs attached for it would sit idle until the idle cooldown. This keeps, per gang, the attaches started for
it, and rolls them back — detaches the GPUs that no pod uses, with an Event on every member saying why — when one of
them failed, or when the gang has not reached its minimum `timeout_seconds` after its attaches started. A gang that
reaches its minimum is forgotten. (The memory is per process: after a restart, what remains idle goes with the
cooldown, as any idle GPU.)
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from dds import metrics
from dds.controller.apply import Actions
from dds.scaling.node_actions import pod_ref
from dds.fabric.base import Fabric, OperationState
from dds.model.events import WARNING, EventRecorder
from dds.planner.gangs import find_gangs, gang_of
from dds.model.plan import Attach, Case, Detach, PlannerConfig
from dds.planner.device_modes import held_by_node_load, held_reason
from dds.planner.memos import PlannerMemos
from dds.planner.requests import RequestCache
from dds.planner.usage import gpu_usage
from dds.model.snapshot import PodInfo, Snapshot

log = logging.getLogger(__name__)


@dataclass
class _GangWork:
    started_at: float
    min_member: int
    operations: set[str] = field(default_factory=set)  # keys of the attaches started for the gang


class GangAttaches:
    def __init__(self, actions: Actions, fabric: Fabric, events: EventRecorder, timeout_seconds: float,
                 clock: Callable[[], float], memos: Optional[PlannerMemos] = None,
                 planner: PlannerConfig = PlannerConfig()) -> None:
        self._actions = actions
        # Which nodes the CDI operator detaches from only once idle (dds/planner/device_modes.py).
        self._planner = planner
        # The controller's planner memos: a rollback reads the pods' requests from the ones they already hold.
        self._memos = memos if memos is not None else PlannerMemos()
        self._fabric = fabric
        self._events = events
        self._timeout = timeout_seconds
        self._clock = clock
        self._gangs: dict[str, _GangWork] = {}
        # Gangs not to plan in this pass: those the latest reconcile rolled back (the pass plans on a snapshot taken
        # before their detaches started, in which their GPUs still look free), and those with a failed attach whose
        # other attaches have not ended yet (a failure voids the whole set: it is rolled back, then planned whole).
        self._held: set[str] = set()

    def started(self, snapshot: Snapshot, steps: Sequence[Attach], keys: Sequence[str]) -> None:
        """Remember the attaches (`keys[i]` started `steps[i]`) that were planned for members of a gang."""
        pending = snapshot.pending_pods()  # attaches are planned for pending pods only
        pods = {p.key: p for p in pending}
        gangs = find_gangs(snapshot, pending)
        now = self._clock()
        for step, key in zip(steps, keys):
            for gang in {gang_of(pods[p]) for p in step.pods if p in pods} - {None}:
                work = self._gangs.setdefault(gang, _GangWork(now, gangs[gang].min_member if gang in gangs else 0))
                work.operations.add(key)

    def reconcile(self, snapshot: Snapshot) -> None:
        """Forget gangs that started; roll back those whose attaches failed or that outlived the timeout."""
        self._held.clear()
        if not self._gangs:
            return
        now = self._clock()
        bound: dict[str, int] = {}
        for pod in snapshot.pods:
            gang = gang_of(pod)
            if gang in self._gangs and pod.node_name is not None:
                bound[gang] = bound.get(gang, 0) + 1
        for gang, work in list(self._gangs.items()):
            if work.min_member and bound.get(gang, 0) >= work.min_member:
                del self._gangs[gang]
                continue
            operations = [op for op in (self._fabric.operation(k) for k in work.operations) if op is not None]
            failed = [op for op in operations if op.state == OperationState.FAILED]
            if failed and not all(op.state.done for op in operations):
                self._held.add(gang)  # rolled back once every attach has ended: GPUs on their way would sit idle
            elif failed:
                self._roll_back(snapshot, gang, work, f"the attach of {len(failed)} of its GPU set(s) failed "
                                                      f"({failed[0].error.message if failed[0].error else 'no reason'})")
            elif now - work.started_at > self._timeout and all(op.state.done for op in operations):
                self._roll_back(snapshot, gang, work, f"it did not reach its {work.min_member} running pod(s) within "
                                                      f"{self._timeout:g}s of its GPUs being attached")

    def not_held(self, pods: Sequence[PodInfo]) -> list[PodInfo]:
        """`pods` without the members of gangs being rolled back (they are planned whole again after it)."""
        return [p for p in pods if gang_of(p) not in self._held]

    def holds_any(self, pods: Sequence[PodInfo]) -> bool:
        """Whether a gang of `pods` is held now: a plan made for them before the latest reconcile must not be acted on
        (more GPUs for a gang whose set already failed would complete it just before its rollback detaches them)."""
        return any(gang_of(p) in self._held for p in pods)

    def _roll_back(self, snapshot: Snapshot, gang: str, work: _GangWork, why: str) -> None:
        """Detach the gang's GPUs that no pod uses (in use ones stay: a member that did start keeps its GPUs)."""
        del self._gangs[gang]
        self._held.add(gang)
        attached: dict[str, set[str]] = {}
        for key in work.operations:
            op = self._fabric.operation(key)
            if op is not None:
                attached.setdefault(op.node, set()).update(op.devices)
        cache = RequestCache(self._memos.requests)
        released = 0
        stay: list[str] = []
        for node in snapshot.nodes:
            mine = attached.get(node.name)
            if not mine:
                continue
            usage = gpu_usage(node, snapshot.pods_on(node.name), cache)
            idle = [d.id for d in usage.idle if d.id in mine]
            if not idle:
                continue
            group = snapshot.group(node.group_id) if node.group_id else None
            if held_by_node_load(self._planner, group, usage.in_use):
                # Asked now, the detach would only sit in the operator's retries; scale-down releases them once the
                # node's GPU pods are gone.
                stay.append(f"{node.name}: {held_reason(usage.in_use, len(idle))}")
                continue
            step = Detach(node.name, tuple(idle), reason=f"gang {gang} cannot start: {why}")
            if self._actions.detach(step, f"gang-rollback/{uuid.uuid4().hex[:8]}", Case.GANG_ROLLBACK):
                released += len(idle)
        message = f"gang {gang} cannot start: {why}; {released} GPU(s) attached for it released"
        if stay:
            message += f"; kept for now: {'; '.join(stay)}"
        log.warning(message)
        metrics.DECISIONS.labels(Case.GANG_ROLLBACK.value, "gpu").inc()
        for pod in snapshot.pods:
            if gang_of(pod) == gang and pod.node_name is None:
                self._events.emit(pod_ref(pod.key), WARNING, "GangRolledBack", message)
