"""Which nodes are short of GPUs for the pods bound to them (dds/planner/shortfalls.py), on plain data."""

from __future__ import annotations

from dds.model.groups import Taint
from dds.planner.shortfalls import Restore, gpu_shortfalls
from dds.model.snapshot import PoolInfo, Snapshot
from tests.unit.planner.builders import make_group, make_node, make_pod


def test_shortfalls_are_nodes_whose_bound_pods_ask_for_more_gpus_than_they_have():
    group = make_group(initial_gpus=1)
    snapshot = Snapshot(now=0.0, groups=(group,), pools=(PoolInfo("pool-a", {"A30": 4}),), nodes=(
        make_node("short", gpus=1), make_node("coming", gpus=1, attaching=1), make_node("fine", gpus=2),
        make_node("other", gpus=0, group=None), make_node("leaving", gpus=0, being_deleted=True),
        make_node("cordoned", gpus=0, taints=(Taint(key="dds.cdi.dev/removing", value="true", effect="NoSchedule"),))), pods=(
        make_pod("a", gpus=1, node="short"), make_pod("b", gpus=1, node="short"),
        make_pod("c", gpus=2, node="coming"), make_pod("d", gpus=2, node="fine"),
        make_pod("e", gpus=1, node="other"), make_pod("f", gpus=1, node="leaving"),
        make_pod("g", gpus=1, node="cordoned", owner="DaemonSet")))
    assert gpu_shortfalls(snapshot) == [Restore("short", "pool-a", "A30", 1, requested=2, have=1)]
