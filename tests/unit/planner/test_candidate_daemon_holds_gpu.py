"""Case 3: CA asks to delete a node whose only pods are DaemonSet pods, one of them using a GPU. CA counts such a node
empty and does not evict its daemons, so that GPU stays in use for as long as the node lives: removing the node would
wait forever for a GPU that is never released (force-detach off). The node stays and only its idle GPUs go, as the
idle scan (case 4) already decides for the same node."""

from __future__ import annotations

from dds.planner import plan_scale_down
from dds.model.plan import PlannerConfig
from tests.unit.planner.builders import make_group, make_node, make_pod, make_snapshot

NOW = 1000.0


def test_a_candidate_whose_daemon_uses_a_gpu_stays_and_releases_its_idle_gpus() -> None:
    node = make_node("w1", gpus=3, being_deleted=True)  # CA's ToBeDeleted taint
    other = make_node("w2", gpus=1)
    daemon = make_pod("agent", gpus=1, node="w1", owner="DaemonSet")
    snapshot = make_snapshot([node, other], [daemon], now=NOW, groups=[make_group()])

    plan = plan_scale_down(snapshot, PlannerConfig(), ["w1"])

    assert plan.removals == ()
    [kept] = [k for k in plan.kept if k.node == "w1"]
    assert "agent" in kept.reason and "force-detach is off" in kept.reason
    assert [(d.node, d.device_ids, d.force) for d in plan.detaches] == [("w1", ("w1-gpu-2", "w1-gpu-1"), False)]


def test_with_force_detach_the_candidate_goes_with_all_its_gpus() -> None:
    node = make_node("w1", gpus=3, being_deleted=True)
    daemon = make_pod("agent", gpus=1, node="w1", owner="DaemonSet")
    snapshot = make_snapshot([node, make_node("w2")], [daemon], now=NOW, groups=[make_group(force_detach=True)])

    plan = plan_scale_down(snapshot, PlannerConfig(), ["w1"])

    assert [r.node for r in plan.removals] == ["w1"]
    assert [(d.node, len(d.device_ids), d.force) for d in plan.detaches] == [("w1", 3, True)]


def test_a_candidate_whose_gpu_user_is_work_that_moves_is_still_removed() -> None:
    node = make_node("w1", gpus=2, being_deleted=True)
    other = make_node("w2", gpus=1)
    pod = make_pod("train", gpus=1, node="w1")  # a ReplicaSet's: CA's drain moves it, then its GPU is released
    snapshot = make_snapshot([node, other], [pod], now=NOW, groups=[make_group()])

    plan = plan_scale_down(snapshot, PlannerConfig(), ["w1"])

    assert [r.node for r in plan.removals] == ["w1"]
