"""Node adds and removals over a `NodeProvisioner`: the node half of the applier, in every mode.

In a cluster the applier (dds/controller/apply.py `Actions`, through its `Executor`) hands node steps here; without one
(`dds serve --node-groups FILE`) the whole-node deciders (dds/scaling/whole_nodes.py) do. Either way a node asked for or
removed is counted (metrics), logged and told as an Event the same way.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext
from typing import Callable

from dds import metrics
from dds.model.events import NORMAL, EventRecorder, ObjectRef
from dds.model.groups import NodeGroupSpec
from dds.model.plan import Case, NewNodes, RemoveNode
from dds.nodes.base import NodeProvisioner

log = logging.getLogger(__name__)


def pod_ref(key: str) -> ObjectRef:
    namespace, _, name = key.partition("/")
    return ObjectRef("Pod", name, namespace)


def node_ref(name: str) -> ObjectRef:
    return ObjectRef("Node", name)


def machineset_ref(group: NodeGroupSpec) -> ObjectRef:
    src = group.source
    if src.kind in ("MachineSet", "MachineDeployment"):
        return ObjectRef(src.kind, src.name, src.namespace, src.api_version or "cluster.x-k8s.io/v1beta2", src.uid)
    return ObjectRef("NodeGroup", group.id)


class NodeActions:
    """Ask the provisioner for nodes and remove them; each raises what the provisioner raises (nothing is counted or
    told then)."""

    def __init__(self, provisioner: NodeProvisioner, events: EventRecorder,
                 changing: Callable[[], AbstractContextManager[None]] = nullcontext) -> None:
        self.provisioner = provisioner
        self.events = events
        # Spans every change the provisioner makes (the executor's generation: a decision taken on a snapshot that may
        # not show a change is taken again before it acts).
        self._changing = changing

    def add_nodes(self, step: NewNodes, group: NodeGroupSpec, key: str, case: Case) -> None:
        with self._changing():
            self.provisioner.add_nodes(group, step.count, key)
        metrics.NODES_ADDED.labels(group.id).inc(step.count)
        message = (f"adding {step.count} node(s) to {group.id} for {', '.join(step.pods) or 'capacity'}: "
                   f"{step.reason}")
        log.info(message, extra={"case": case.value, "key": key, "group": group.id})
        self.events.emit(machineset_ref(group), NORMAL, "AddingNode", message)
        for pod in step.pods:
            self.events.emit(pod_ref(pod), NORMAL, "AddingNode", message)

    def remove_node(self, step: RemoveNode, group: NodeGroupSpec, key: str, case: Case) -> None:
        with self._changing():
            self.provisioner.remove_node(group, step.node, key)
        metrics.NODES_REMOVED.labels(group.id).inc()
        message = f"removing node {step.node} from {group.id}: {step.reason}"
        log.info(message, extra={"case": case.value, "key": key, "node": step.node})
        self.events.emit(node_ref(step.node), NORMAL, "RemovingNode", message)
        self.events.emit(machineset_ref(group), NORMAL, "RemovingNode", message)
