"""Node removals (dds/controller/removals.py): the table as a table, and what users see — a node goes only once its GPUs
are released and it holds no work, a removal given up lifts our taint, a pod that lands before the taint keeps the
node, and a restarted DDS resumes the removals a previous process left half done."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import pytest

from dds.controller.observe import MachineRef, Observation
from dds.controller.removals import (NODE_REMOVAL_LIFECYCLE, REMOVAL_TAINT, NodeRemovals, PendingRemoval,
                                     RemovalEvent, RemovalState)
from dds.fabric.base import Operation, OperationKind, OperationState
from dds.kube.convert import TAINT_TO_BE_DELETED
from dds.model.events import ObjectRef
from dds.model.groups import NodeGroupSpec, Taint
from dds.model.lifecycle import IllegalTransition
from dds.model.plan import Case, RemoveNode
from dds.model.snapshot import NodeInfo, PodInfo
from tests.unit.model.tables import every_pair, pair_id
from tests.unit.planner.builders import make_group, make_node, make_pod, make_snapshot

OURS = Taint(key=REMOVAL_TAINT, value="true", effect="NoSchedule")
CAS = Taint(key=TAINT_TO_BE_DELETED, value="1", effect="NoSchedule")


@pytest.mark.parametrize("state, event, target", every_pair(NODE_REMOVAL_LIFECYCLE), ids=pair_id)
def test_every_row_goes_where_it_says_and_every_other_pair_raises(state, event, target):
    if target is None:
        with pytest.raises(IllegalTransition):
            NODE_REMOVAL_LIFECYCLE.next(state, event)
    else:
        assert NODE_REMOVAL_LIFECYCLE.next(state, event) == target


@dataclass
class Cluster:
    """The node writes, the fresh read of a node's pods, the node backend and the Events, as the removals see them."""

    tainted: set[str] = field(default_factory=set)
    work: dict[str, list[str]] = field(default_factory=dict)  # what a fresh read finds on a node
    removed: list[tuple[str, str, Case]] = field(default_factory=list)  # (node, key, case)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (object, reason, message)
    in_flight: list[Operation] = field(default_factory=list)
    taint_fails: bool = False

    def taint(self, node: str) -> None:
        if self.taint_fails:
            raise ConnectionError("apiserver unavailable")
        self.tainted.add(node)

    def lift_taint(self, node: str) -> None:
        self.tainted.discard(node)

    def work_on(self, node: str) -> list[str]:
        return list(self.work.get(node, []))

    def remove_node(self, step: RemoveNode, group: NodeGroupSpec, key: str, case: Case) -> None:
        self.removed.append((step.node, key, case))

    def emit(self, involved: ObjectRef, event_type: str, reason: str, message: str) -> None:
        self.events.append((involved.describe(), reason, message))

    def removals(self) -> NodeRemovals:
        return NodeRemovals(self, self, self, lambda: self.in_flight)


def observe(nodes: Sequence[NodeInfo], pods: Sequence[PodInfo] = (), min_size: int = 0,
            machines: Sequence[MachineRef] = ()) -> Observation:
    return Observation(make_snapshot(nodes, pods, groups=[make_group(min_size=min_size)]), machines=tuple(machines))


def test_a_node_cas_asked_for_goes_once_its_gpus_are_released():
    cluster = Cluster()
    removals = cluster.removals()
    removals.request("worker-1", "gpu")
    removals.finish(observe([make_node("worker-1", gpus=1)]))
    assert removals.get("worker-1") == PendingRemoval("worker-1", "gpu", Case.SCALE_DOWN, RemovalState.REQUESTED)
    assert cluster.removed == [] and cluster.tainted == set(), "nothing is done while a GPU is on the node"
    cluster.in_flight = [Operation(key="detach/1", kind=OperationKind.DETACH, node="worker-1",
                                   state=OperationState.RUNNING, requested=1)]
    removals.finish(observe([make_node("worker-1")]))
    assert cluster.removed == [], "a detach still running on the node is seen to its end first"
    cluster.in_flight = []
    removals.finish(observe([make_node("worker-1")]))
    assert cluster.removed == [("worker-1", "remove/worker-1/test://worker-1", Case.SCALE_DOWN)]
    assert cluster.tainted == {"worker-1"} and removals.nodes() == frozenset()


def test_a_pod_that_lands_before_the_taint_keeps_the_node_and_the_taint_is_lifted():
    cluster = Cluster(work={"worker-1": ["default/late"]})
    removals = cluster.removals()
    removals.plan("worker-1", "gpu")
    removals.finish(observe([make_node("worker-1")]))
    assert cluster.removed == [] and cluster.tainted == set()
    assert cluster.events == [("Node worker-1", "RemovalCancelled", "kept: pods arrived before removal (default/late)")]
    assert removals.nodes() == frozenset(), "kept is final: a later scale-down asks again"


def test_a_removal_given_up_lifts_our_taint():
    # A restarted DDS resumes a node it had tainted; a pod has arrived on it since (the taint came after the pod).
    node = make_node("worker-1", taints=[OURS])
    cluster = Cluster(tainted={"worker-1"})
    removals = cluster.removals()
    removals.resume(observe([node]))
    removals.finish(observe([node], pods=[make_pod("web", node="worker-1")]))
    assert cluster.tainted == set(), "the node takes pods again"
    assert cluster.removed == [] and removals.nodes() == frozenset()


def test_a_node_cas_draining_goes_even_with_its_pods_still_on_it():
    node = make_node("worker-1", taints=[CAS])
    cluster = Cluster()
    removals = cluster.removals()
    removals.request("worker-1", "gpu")
    removals.finish(observe([node], pods=[make_pod("web", node="worker-1")]))
    assert [(n, case) for n, _, case in cluster.removed] == [("worker-1", Case.SCALE_DOWN)]


def test_removals_stop_at_the_groups_min_size_within_one_pass():
    cluster = Cluster()
    removals = cluster.removals()
    for name in ("worker-1", "worker-2"):
        removals.plan(name, "gpu")
    nodes = [make_node("worker-1"), make_node("worker-2"), make_node("worker-3")]
    removals.finish(observe(nodes, min_size=2))
    assert [n for n, _, _ in cluster.removed] == ["worker-1"]
    assert removals.nodes() == frozenset(), "the second is kept: the group would go below its min size"


def test_a_node_whose_machine_is_already_marked_is_past_the_min_size_check():
    cluster = Cluster()
    removals = cluster.removals()
    removals.plan("worker-1", "gpu")
    marked = MachineRef("default", "m-1", "gpu", "test://worker-1", "worker-1", deleting=True)
    removals.finish(observe([make_node("worker-1")], min_size=1, machines=[marked]))
    assert [n for n, _, _ in cluster.removed] == ["worker-1"]


def test_a_node_gone_or_a_group_no_longer_served_ends_the_removal_without_a_write():
    cluster = Cluster()
    removals = cluster.removals()
    removals.request("worker-1", "gpu")
    removals.request("worker-2", "retired-group")
    removals.finish(observe([make_node("worker-2", group="retired-group")]))
    assert removals.nodes() == frozenset() and cluster.removed == [] and cluster.tainted == set()


def test_a_restarted_dds_resumes_our_removals_and_cas_once():
    ours, cas, other = make_node("worker-1", taints=[OURS]), make_node("worker-2", taints=[CAS]), make_node("worker-3")
    cluster = Cluster()
    removals = cluster.removals()
    removals.resume(observe([ours, cas, other]))
    assert {n: removals.get(n).case for n in removals.nodes()} == {"worker-1": Case.SCALE_DOWN_BLOCKED,
                                                                  "worker-2": Case.SCALE_DOWN}
    removals.finish(observe([ours, cas, other]))
    assert sorted(cluster.removed) == [("worker-1", "remove/worker-1/test://worker-1", Case.SCALE_DOWN_BLOCKED),
                                       ("worker-2", "remove/worker-2/test://worker-2", Case.SCALE_DOWN)]
    removals.resume(observe([make_node("worker-4", taints=[OURS])]))
    assert removals.nodes() == frozenset(), "resuming happens on the first pass only"


def test_asking_again_keeps_the_first_request():
    cluster = Cluster()
    removals = cluster.removals()
    removals.request("worker-1", "gpu")
    removals.plan("worker-1", "gpu")
    removals.resume(observe([make_node("worker-1", gpus=1, taints=[OURS])]))
    assert removals.get("worker-1").case == Case.SCALE_DOWN


def test_a_failed_taint_write_leaves_the_removal_requested_for_the_next_pass():
    cluster = Cluster(taint_fails=True)
    removals = cluster.removals()
    removals.request("worker-1", "gpu")
    with pytest.raises(ConnectionError):
        removals.finish(observe([make_node("worker-1")]))
    assert removals.get("worker-1").state == RemovalState.REQUESTED
    cluster.taint_fails = False
    removals.finish(observe([make_node("worker-1")]))
    assert [n for n, _, _ in cluster.removed] == ["worker-1"]


def test_judge_names_the_event_each_pass_makes_of_a_removal():
    removals = Cluster().removals()
    pending = PendingRemoval("worker-1", "gpu", Case.SCALE_DOWN)
    group = make_group()
    cases = [
        (None, group, RemovalEvent.NODE_GONE),
        (make_node("worker-1"), None, RemovalEvent.GROUP_GONE),
        (make_node("worker-1", attaching=1), group, RemovalEvent.GPUS_HELD),
        (make_node("worker-1", detaching=["A30-1"]), group, RemovalEvent.GPUS_HELD),
        (make_node("worker-1"), group, RemovalEvent.RELEASED),
    ]
    observation = observe([make_node("worker-1")])
    assert [removals.judge(pending, node, g, observation, 0)[0] for node, g, _ in cases] == [e for _, _, e in cases]
