"""ProvisioningRequests of DDS's class carried out on the cluster (the plan: dds/planner/provisioning.py).

Each pass, before reservations and the fast path (so a request's gang gets its capacity first), in this order:

| plan part   | what is done here                                                                                |
|-------------|--------------------------------------------------------------------------------------------------|
| release     | the node's `dds.cdi.dev/booked-for` taint goes (`BookingReleased` Event on the node)              |
| book        | the node gets the taint `dds.cdi.dev/booked-for=<request uid>:NoSchedule` (`BookedForRequest`)    |
| tolerate    | a pod consuming a provisioned request gets the booking's toleration                               |
| attaches    | started through the applier, as every attach (key `provisioning/...`)                             |
| new nodes   | the loop adds them through the applier (`Controller._add_nodes`), as for pods with claims         |
| conditions  | on the request (Accepted, Provisioned, Failed, BookingExpired, CapacityRevoked), an Event why    |

A request whose node could not be booked this pass gets no condition written: `Provisioned=True` is never said of
capacity another pod could still take; the next pass tries again. The taints are the state: after a restart, or with
another replica leading, the next plan finds the bookings on the nodes and carries on.
"""

from __future__ import annotations

import logging
import uuid
from typing import Callable, Protocol, Sequence

from dds import metrics
from dds.controller.apply import Actions
from dds.controller.journal import DecisionJournal
from dds.kube.errors import ApiError
from dds.model.events import NORMAL, WARNING, EventRecorder, ObjectRef
from dds.model.plan import Case
from dds.model.provisioning import API_GROUP, API_VERSION, BOOKED_EFFECT, BOOKED_TAINT_KEY, ProvisioningView
from dds.model.snapshot import Toleration
from dds.planner.provisioning import ProvisioningConfig, ProvisioningPlan, RequestDecision, booking_toleration
from dds.scaling.node_actions import node_ref, pod_ref

log = logging.getLogger(__name__)


class ProvisioningReads(Protocol):
    """dds.kube.provisioning.ProvisioningRequestReader."""

    def read(self) -> ProvisioningView: ...


class ProvisioningWrites(Protocol):
    """dds.kube.provisioning.ProvisioningRequestWriter; raises ApiError when refused."""

    def set_conditions(self, namespace: str, name: str, changes: Sequence[tuple[str, str, str, str]],
                       now: float) -> None: ...


class PodTolerations(Protocol):
    """dds.kube.pods.ReservationWrites: the one pod write DDS makes; raises ApiError when refused."""

    def tolerate(self, namespace: str, name: str, toleration: Toleration) -> None: ...


def request_ref(decision: RequestDecision) -> ObjectRef:
    request = decision.request
    return ObjectRef("ProvisioningRequest", request.name, request.namespace, f"{API_GROUP}/{API_VERSION}",
                     request.uid)


class ProvisioningRequests:
    def __init__(self, reads: ProvisioningReads, writes: ProvisioningWrites, pods: PodTolerations, actions: Actions,
                 events: EventRecorder, journal: DecisionJournal, config: ProvisioningConfig,
                 clock: Callable[[], float]) -> None:
        self._reads = reads
        self._writes = writes
        self._pods = pods
        self._actions = actions
        self._events = events
        self._journal = journal
        self._config = config
        self._clock = clock

    @property
    def config(self) -> ProvisioningConfig:
        return self._config

    def read(self) -> ProvisioningView:
        return self._reads.read() if self._config.enabled else ProvisioningView()

    def apply(self, plan: ProvisioningPlan) -> ProvisioningPlan:
        """Carry out `plan` (see the module docstring); returns it, as carried out."""
        unbooked = self.book(plan)
        for pod, uid in plan.tolerate:
            self._tolerate(pod, uid)
        if plan.attaches:
            self._journal.record(Case.PROVISIONING.value, "control loop: ProvisioningRequests of class "
                                 f"{self._config.class_name} to provision", "gpu",
                                 "\n".join(f"attach {a.count} x {a.model} from pool {a.pool} to {a.node}: {a.reason}"
                                           for a in plan.attaches))
            metrics.DECISIONS.labels(Case.PROVISIONING.value, "gpu").inc()
            self._actions.attach_all(plan.attaches, f"provisioning/{uuid.uuid4().hex[:8]}", Case.PROVISIONING)
        self.record(plan, unbooked)
        return plan

    def book(self, plan: ProvisioningPlan) -> set[str]:
        """The plan's releases and bookings; returns the uids of the requests a node could not be booked for."""
        for node in plan.release:
            self._release(node)
        return {uid for node, uid in plan.book if not self._book(node, uid)}

    def record(self, plan: ProvisioningPlan, unbooked: set[str]) -> None:
        """The plan's conditions and Events, but for the requests a node could not be booked for (said next time)."""
        for decision in plan.decisions:
            if decision.request.uid not in unbooked:
                self._record(decision)

    def _release(self, node: str) -> None:
        try:
            self._actions.untaint(node, BOOKED_TAINT_KEY)
        except ApiError as exc:
            if not exc.not_found:
                log.warning("booking taint of %s not lifted (%s %s); the next pass tries again", node, exc.status,
                            exc.reason)
            return
        self._events.emit(node_ref(node), NORMAL, "BookingReleased",
                          f"{node} is open to every pod again: the ProvisioningRequest it was booked for is consumed, "
                          f"expired, failed or gone")

    def _book(self, node: str, uid: str) -> bool:
        try:
            self._actions.taint(node, BOOKED_TAINT_KEY, uid, BOOKED_EFFECT)
        except ApiError as exc:
            log.warning("booking of %s for ProvisioningRequest %s not made (%s %s); the next pass tries again", node,
                        uid, exc.status, exc.reason)
            return False
        self._events.emit(node_ref(node), NORMAL, "BookedForRequest",
                          f"{node}'s GPUs are booked for ProvisioningRequest uid {uid}: only its pods may land here "
                          f"until they are bound or the booking ends")
        return True

    def _tolerate(self, pod: str, uid: str) -> None:
        namespace, _, name = pod.partition("/")
        try:
            self._pods.tolerate(namespace, name, booking_toleration(uid))
        except ApiError as exc:
            log.warning("booking toleration not added to %s (%s %s); the next pass tries again", pod, exc.status,
                        exc.reason)
            self._events.emit(pod_ref(pod), WARNING, "BookingNotTolerated",
                              f"DDS could not let this pod onto the capacity booked for its ProvisioningRequest "
                              f"({exc.status} {exc.reason}: manifests/rbac/reservations grants the pod write)")

    def _record(self, decision: RequestDecision) -> None:
        request = decision.request
        if decision.conditions:
            try:
                self._writes.set_conditions(request.namespace, request.name,
                                            [(c.kind, c.status, c.reason, c.message) for c in decision.conditions],
                                            self._clock())
            except ApiError as exc:
                log.warning("conditions of ProvisioningRequest %s not written (%s %s); the next pass tries again",
                            request.key, exc.status, exc.reason)
                return
        if decision.event_reason:
            log.info("ProvisioningRequest %s: %s: %s", request.key, decision.event_reason, decision.event_message)
            self._journal.record(Case.PROVISIONING.value, f"ProvisioningRequest {request.key}", "request",
                                 f"{decision.event_reason}: {decision.event_message}")
            self._events.emit(request_ref(decision), WARNING if decision.warning else NORMAL, decision.event_reason,
                              decision.event_message)
