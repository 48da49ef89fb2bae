"""Tell users about the pods DDS cannot help: one Warning Event on the pod (and one log line) per pod and reason.

A pending pod is looked at on every control-loop pass and on every IncreaseSize; without memory it would get the same
Event each time. The memory is per process: after a restart each pod still waiting is told once more.
"""

from __future__ import annotations

import logging
from typing import Iterable

from dds.metrics import OBJECTS_REFUSED
from dds.scaling.node_actions import pod_ref
from dds.model.events import WARNING, EventRecorder
from dds.planner.gangs import GANG_INCOMPLETE
from dds.model.plan import ScaleUpPlan
from dds.planner.refusals import cannot_serve
from dds.model.snapshot import PodInfo, Snapshot

log = logging.getLogger(__name__)


class RefusalReporter:
    def __init__(self, events: EventRecorder) -> None:
        self._events = events
        self._told: dict[str, set[str]] = {}  # pod key -> Event reasons it was given

    def tell(self, pod: str, reason: str, message: str) -> None:
        told = self._told.setdefault(pod, set())
        if reason in told:
            return
        told.add(reason)
        OBJECTS_REFUSED.labels("pods", reason).inc()
        log.info("pod %s: DDS cannot help (%s): %s", pod, reason, message, extra={"pod": pod, "reason": reason})
        self._events.emit(pod_ref(pod), WARNING, reason, message)

    def report_plan(self, plan: ScaleUpPlan, nodes_allowed: bool = True) -> None:
        """`nodes_allowed=False` (the loop's fast path, which leaves new nodes to CA): a gang that would fit with a new
        node is not refused, so gangs left out are not told here."""
        for decision in plan.decisions:
            if decision.refusal is None or (decision.refusal == GANG_INCOMPLETE and not nodes_allowed):
                continue
            self.tell(decision.pod, decision.refusal, decision.reason)

    def report_without_planning(self, snapshot: Snapshot, pods: Iterable[PodInfo]) -> None:
        """The refusals that need no simulation (a GPU model no pool holds, more GPUs than a node takes), for pods the
        loop does not plan yet: told as soon as the pod is seen."""
        for pod in pods:
            found = cannot_serve(pod, snapshot, pool_checked=False)
            if found is not None:
                self.tell(pod.key, found.reason, found.message)

    def forget_all_but(self, pending: Iterable[str]) -> None:
        """Drop the memory of pods no longer pending (they ran, or were deleted)."""
        keep = set(pending)
        for key in [k for k in self._told if k not in keep]:
            del self._told[key]
