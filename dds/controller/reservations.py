"""Reservations carried out on the cluster: a large GPU pod that has waited too long gets a node gathered for it.

The planner decides (dds/planner/reservations.py: which pod, which node, which GPUs move); this applies its plan each
loop pass, before the fast path, so the GPUs it gathers go first:

| plan part       | what is done here                                                                               |
|-----------------|-------------------------------------------------------------------------------------------------|
| new reservation | the pod gets toleration `dds.cdi.dev/reserved-for=<uid>:NoSchedule`, then the node that taint   |
| attaches        | free pool devices attached to the reserved node                                                 |
| detaches        | idle GPUs of other nodes detached now (not after their cooldown), for the reserved node         |
| claims          | nodes whose running pods hold GPUs the reservation still needs: taint `dds.cdi.dev/gpus-claimed-by` while needed |
| moved           | the reserved node drained first: the busiest claimed node is reserved instead, the old one claimed |
| released        | the pod is bound or gone, or its reservation moved: the node's reservation taint goes (claims go with the next plan) |

Why a taint the waiting pod tolerates (and not the other ways to keep GPUs for it): kube-scheduler must not give the
gathered GPUs to a smaller pod at any instant, and only a taint does that without a race. Holding the node's GPUs
back and lifting a plain taint once all N are there leaves a window in which the large pod sits in the scheduler's
backoff queue while a small pod that just arrived is already in the active queue and takes a GPU; the toleration
lets the large pod be the only one that can land there from the first GPU on. The pod is changed only by gaining a
toleration, which the API allows on a live pod; docs/reservations.md has the whole argument.

The taints are the state: after a restart, or with another replica leading, the next plan finds the reservations on
the nodes and carries on.
"""

from __future__ import annotations

import logging
import uuid
from typing import Optional, Protocol, Sequence

from dds import metrics
from dds.controller.apply import Actions
from dds.scaling.node_actions import node_ref, pod_ref
from dds.controller.journal import DecisionJournal
from dds.kube.errors import ApiError
from dds.model.events import NORMAL, EventRecorder
from dds.model.plan import Case
from dds.planner.reservations import (CLAIM_TAINT_KEY, RESERVATION_EFFECT, RESERVATION_TAINT_KEY, Reservation,
                                      ReservationConfig, ReservationPlan, claimed_token)
from dds.model.snapshot import Snapshot, Toleration

log = logging.getLogger(__name__)


class ClusterWrites(Protocol):
    """The three writes a reservation makes (dds.kube.pods.ReservationWrites); each raises ApiError when refused."""

    def tolerate(self, namespace: str, name: str, toleration: Toleration) -> None: ...

    def taint(self, node: str, key: str, value: str, effect: str) -> None: ...

    def untaint(self, node: str, key: str) -> None: ...


class Reservations:
    def __init__(self, writes: ClusterWrites, actions: Actions, events: EventRecorder, journal: DecisionJournal,
                 config: ReservationConfig) -> None:
        self._writes = writes
        self._actions = actions
        self._events = events
        self._journal = journal
        self._config = config

    @property
    def config(self) -> ReservationConfig:
        return self._config

    def apply(self, plan: ReservationPlan, snapshot: Snapshot) -> ReservationPlan:
        """Carry out `plan`, planned on `snapshot` (the control loop's pass plans it: dds/planner/passes.py)."""
        made = all([self._reserve(reservation) for reservation in plan.new])
        if plan.claims_changed:  # before the releases: a node a reservation moved from stays fenced throughout
            self._set_claims(snapshot, plan.claimed)
        moved = {r.moved_from: r for r in plan.new if r.moved_from}
        for node in plan.released:
            self._release(node, moved.get(node))
        if made:  # GPUs gathered on a node not fenced yet would go to the first small pod; they move once it is
            self._move_gpus(plan)
        return plan

    def _reserve(self, reservation: Reservation) -> bool:
        """Toleration first, then the taint: the other way round the pod would be shut out of its own node."""
        namespace, _, name = reservation.pod.partition("/")
        try:
            self._writes.tolerate(namespace, name, reservation.toleration)
            self._writes.taint(reservation.node, RESERVATION_TAINT_KEY, reservation.token, RESERVATION_EFFECT)
        except ApiError as exc:
            log.warning("reservation of %s for %s not made (%s %s); the next pass tries again", reservation.node,
                        reservation.pod, exc.status, exc.reason)
            return False
        message = f"{reservation.reason}; other new pods are kept off it until {reservation.pod} is bound"
        log.info("reservation: %s", message)
        # The reason says which rule reserved it: the age, or a short queue before the age (quiet_age_seconds).
        self._journal.record(Case.RESERVATION.value, f"control loop: large pod {reservation.pod} waiting for GPUs",
                             "gpu", message)
        metrics.DECISIONS.labels(Case.RESERVATION.value, "gpu").inc()
        self._events.emit(pod_ref(reservation.pod), NORMAL, "GPUsReserved", message)
        self._events.emit(node_ref(reservation.node), NORMAL, "ReservedForPod", message)
        return True

    def _release(self, node: str, moved_to: Optional[Reservation] = None) -> None:
        try:
            self._writes.untaint(node, RESERVATION_TAINT_KEY)
        except ApiError as exc:
            if not exc.not_found:
                log.warning("reservation taint of %s not lifted (%s %s); the next pass tries again", node,
                            exc.status, exc.reason)
            return
        message = (f"{node} is open to every pod again: the pod it was reserved for is bound or gone"
                   if moved_to is None else
                   f"the reservation for {moved_to.pod} moved to {moved_to.node}: {node} stays claimed while its GPUs "
                   f"go there")
        self._events.emit(node_ref(node), NORMAL, "ReservationReleased", message)

    def _set_claims(self, snapshot: Snapshot, claimed: Sequence[tuple[str, str]]) -> None:
        wanted = dict(claimed)
        for node in snapshot.nodes:
            shown: Optional[str] = claimed_token(node)
            try:
                if shown is not None and wanted.get(node.name) != shown:
                    self._writes.untaint(node.name, CLAIM_TAINT_KEY)
                if node.name in wanted and wanted[node.name] != shown:
                    self._writes.taint(node.name, CLAIM_TAINT_KEY, wanted[node.name], RESERVATION_EFFECT)
                    self._events.emit(node_ref(node.name), NORMAL, "GPUsClaimed",
                                      f"{node.name} takes no new pods while its running pods free the GPUs a "
                                      f"reserved node still needs")
            except ApiError as exc:
                log.warning("claim taint of %s not changed (%s %s); the next pass tries again", node.name,
                            exc.status, exc.reason)

    def _move_gpus(self, plan: ReservationPlan) -> None:
        prefix = f"reservation/{uuid.uuid4().hex[:8]}"
        for index, step in enumerate(plan.detaches):
            self._actions.detach(step, f"{prefix}/detach/{index}", Case.RESERVATION)
        self._actions.attach_all(plan.attaches, f"{prefix}/attach", Case.RESERVATION)  # a refused one: next pass
