"""Nodes asked for and removed without a cluster (`dds serve --node-groups FILE`, dds/scaling/whole_nodes.py) go through
the same port as the cluster mode's applier (dds/scaling/node_actions.py `NodeActions`): the provisioner gets the
request, the node is counted and told as an Event; a refused request leaves nothing behind."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from dds import metrics
from dds.model.events import ObjectRef
from dds.nodes.memory import MemoryProvisioner
from dds.scaling.instances import InstanceFactory, InstanceTracker
from dds.scaling.requests import LiveNode, ScaleUpRefused
from dds.scaling.whole_nodes import AddNodesDecider, RemoveNodesDecider
from tests.unit.planner.builders import make_group

GROUP = make_group("workers")


@dataclass
class Events:
    told: list[tuple[str, str, str]] = field(default_factory=list)  # (object, reason, message)

    def emit(self, involved: ObjectRef, event_type: str, reason: str, message: str) -> None:
        self.told.append((involved.describe(), reason, message))


class RefusingProvisioner(MemoryProvisioner):
    def add_nodes(self, group, count, key):  # type: ignore[no-untyped-def]
        raise RuntimeError("the MachineSet is gone")


def added() -> float:
    return metrics.NODES_ADDED.labels(GROUP.id)._value.get()


def test_a_scale_up_without_a_cluster_asks_the_provisioner_counts_and_tells_it():
    provisioner, events, tracker = MemoryProvisioner(lambda: 0.0), Events(), InstanceTracker()
    before = added()
    records = AddNodesDecider(provisioner, tracker, InstanceFactory(lambda: 0.0), events).increase(GROUP, 2, "ca-1")
    assert len(records) == 2 and len(provisioner.machines(GROUP)) == 2
    assert added() == before + 2
    [(_, reason, message)] = events.told
    assert reason == "AddingNode" and message.startswith("adding 2 node(s) to workers for capacity: ")


def test_a_scale_up_the_provisioner_refuses_leaves_no_instance_and_counts_nothing():
    tracker, events = InstanceTracker(), Events()
    before = added()
    decider = AddNodesDecider(RefusingProvisioner(lambda: 0.0), tracker, InstanceFactory(lambda: 0.0), events)
    with pytest.raises(ScaleUpRefused, match="node backend did not accept 1 node"):
        decider.increase(GROUP, 1, "ca-1")
    assert tracker.list(GROUP.id) == () and added() == before and events.told == []


def test_a_node_ca_deletes_without_a_cluster_is_removed_and_told():
    provisioner, events = MemoryProvisioner(lambda: 0.0), Events()
    provisioner.add_nodes(GROUP, 1, key="boot")
    [machine] = provisioner.machines(GROUP)
    RemoveNodesDecider(provisioner, events).delete_nodes(GROUP, [LiveNode(machine.name)], "ca-delete-1")
    assert provisioner.machines(GROUP) == ()
    assert [reason for _, reason, _ in events.told] == ["RemovingNode", "RemovingNode"]  # the node and its group
    assert events.told[0][2] == f"removing node {machine.name} from workers: cluster-autoscaler found it unneeded"
