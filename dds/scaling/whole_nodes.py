"""The simplest answer to CA's scale requests: whole nodes through a `NodeProvisioner`, no GPU planning.

What `dds serve --node-groups FILE` runs (no cluster, no planner); in a cluster the planner-backed deciders of
dds/controller/ca_requests.py take their place behind the same interface (dds/scaling/requests.py). Nodes are asked for
and removed through `NodeActions` (dds/scaling/node_actions.py), the port the cluster mode's applier uses too; without
a cluster its Events are log lines.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional, Sequence

from dds.model.events import EventRecorder, LogEventRecorder
from dds.model.groups import NodeGroupSpec
from dds.model.plan import Case, NewNodes, RemoveNode
from dds.nodes.base import MachinePhase, NodeProvisioner
from dds.scaling.instances import ERROR_CLASS_OTHER, InstanceKind, InstanceRecord, InstanceTracker
from dds.scaling.node_actions import NodeActions
from dds.scaling.requests import DeleteTarget, Placeholder, ScaleUpRefused

log = logging.getLogger(__name__)


InstanceFactoryFn = Callable[[NodeGroupSpec, InstanceKind, str, str], InstanceRecord]


class AddNodesDecider:
    """Default scale-up: every unit of `delta` is a whole node from the provisioner (no GPU planning)."""

    def __init__(self, provisioner: NodeProvisioner, tracker: InstanceTracker, new_instance: InstanceFactoryFn,
                 events: Optional[EventRecorder] = None) -> None:
        self._provisioner = provisioner
        self._nodes = NodeActions(provisioner, events or LogEventRecorder())
        self._tracker = tracker
        self._new_instance = new_instance

    def increase(self, group: NodeGroupSpec, delta: int, request_key: str) -> Sequence[InstanceRecord]:
        reason = f"cluster-autoscaler asked for {delta} node(s); this decider adds whole nodes"
        records = self._tracker.add_all([self._new_instance(group, InstanceKind.NODE, reason, request_key)
                                         for _ in range(delta)])
        try:
            self._nodes.add_nodes(NewNodes(group=group.id, count=delta, pods=(), reason=reason), group,
                                  key=request_key, case=Case.SCALE_UP)
        except Exception as exc:
            for record in records:
                self._tracker.remove(record.id)
            raise ScaleUpRefused(f"node backend did not accept {delta} node(s) for {group.id}: {exc}") from exc
        return records

    def reconcile(self, groups: Sequence[NodeGroupSpec]) -> None:
        """Complete node instances whose machine is running, fail those whose machine failed (called on Refresh)."""
        for group in groups:
            records = [r for r in self._tracker.list(group.id) if r.kind == InstanceKind.NODE and not r.failed]
            if not records:
                continue
            machines = self._provisioner.machines(group)
            failed = [m for m in machines if m.phase == MachinePhase.FAILED]
            provisioning = sum(1 for m in machines if m.phase == MachinePhase.PROVISIONING)
            # Oldest instances first: a machine does not say which request made it, so match by count.
            for record, machine in zip(records, failed):
                self._tracker.fail(record.id, "MachineFailed", machine.error or f"machine {machine.name} failed",
                                   ERROR_CLASS_OTHER)
            waiting = records[len(failed):]
            for record in waiting[: max(0, len(waiting) - provisioning)]:
                self._tracker.complete(record.id)
                log.info("instance %s of %s is done: its node is up", record.id, group.id)


class RemoveNodesDecider:
    """Default scale-down: remove exactly the live nodes CA named."""

    def __init__(self, provisioner: NodeProvisioner, events: Optional[EventRecorder] = None) -> None:
        self._nodes = NodeActions(provisioner, events or LogEventRecorder())

    def delete_nodes(self, group: NodeGroupSpec, nodes: Sequence[DeleteTarget], request_key: str) -> None:
        for node in nodes:
            if isinstance(node, Placeholder):
                # The provisioner has no "cancel this request" call: a node already asked for may still arrive;
                # DDS's own scale-down removes it once it is empty.
                log.info("CA gave up on %s of %s (%s)", node.name, group.id, node.reason or "no reason given")
                continue
            self._nodes.remove_node(RemoveNode(node.name, group.id, "cluster-autoscaler found it unneeded"), group,
                                    key=f"{request_key}/{node.name}", case=Case.SCALE_DOWN)
