"""Machines refused a Node they name (dds/kube/capi.py `node_claims`): each told once, with an InvalidNodeGroup Event
on the Machine saying which Machine has the Node, a log line and `dds_machine_node_claims_refused_total`. The
observation already leaves such a Machine's Node out of its group; this makes the refusal visible to whoever made it."""

from __future__ import annotations

import logging

from dds import metrics
from dds.controller.observe import Observation
from dds.model.events import WARNING, EventRecorder, ObjectRef

log = logging.getLogger(__name__)

REASON = "InvalidNodeGroup"


class NodeClaimReporter:
    """A listener of the control loop's passes (Controller.listeners)."""

    def __init__(self, events: EventRecorder) -> None:
        self._events = events
        self._told: set[tuple[str, str, str]] = set()  # (namespace, name, message) told, while still refused

    def run(self, observation: Observation) -> None:
        refused = {(m.namespace, m.name, m.refused): m for m in observation.machines if m.refused}
        for key in sorted(set(refused) - self._told):
            machine = refused[key]
            log.warning("Machine %s/%s: %s", machine.namespace, machine.name, machine.refused)
            metrics.MACHINE_CLAIMS_REFUSED.inc()
            try:
                self._events.emit(ObjectRef(kind="Machine", name=machine.name, namespace=machine.namespace,
                                            api_version=machine.api_version or "cluster.x-k8s.io/v1beta2",
                                            uid=machine.uid), WARNING, REASON, machine.refused)
            except Exception as exc:  # an Event is best effort: never let it stop the pass
                log.warning("could not record an Event for Machine %s/%s: %s", machine.namespace, machine.name, exc)
        self._told = set(refused)
