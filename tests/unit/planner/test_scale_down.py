"""Scale-down (cases 3 and 4): idle GPUs, empty nodes, and the nodes CA asks to delete."""

from __future__ import annotations

import pytest

from dds.planner import plan_scale_down, render_scale_down
from dds.model.plan import PlannerConfig
from tests.unit.planner.builders import make_group, make_node, make_pod, make_snapshot

CONFIG = PlannerConfig()
NOW = 1000.0


def detached(plan) -> dict[str, tuple[str, ...]]:
    return {d.node: d.device_ids for d in plan.detaches}


@pytest.mark.parametrize("idle_since, in_use, expected", [
    pytest.param(NOW - 100, 0, {}, id="cooldown-not-reached"),
    pytest.param(NOW - 600, 0, {"w1": ("w1-gpu-2", "w1-gpu-1", "w1-gpu-0")}, id="cooldown-reached-newest-first"),
    pytest.param(NOW - 600, 1, {"w1": ("w1-gpu-2", "w1-gpu-1")}, id="in-use-gpu-kept"),
    pytest.param(NOW - 600, 3, {}, id="all-in-use"),
    pytest.param(None, 0, {}, id="never-idle"),
])
def test_idle_gpus_are_released_after_the_cooldown(idle_since, in_use, expected) -> None:
    pods = [make_pod("job", gpus=in_use, node="w1")]
    snapshot = make_snapshot([make_node("w1", gpus=3, gpus_idle_since=idle_since)], pods, now=NOW,
                             groups=[make_group(gpu_cooldown=600)])
    plan = plan_scale_down(snapshot, CONFIG)
    assert detached(plan) == expected
    assert plan.removals == ()
    assert all(not d.force for d in plan.detaches)
    assert all("idle" in d.reason for d in plan.detaches)


def test_a_detach_in_flight_is_not_repeated() -> None:
    node = make_node("w1", gpus=2, gpus_idle_since=0.0, detaching=["w1-gpu-1"])
    plan = plan_scale_down(make_snapshot([node], [make_pod("job", node="w1")], now=NOW), CONFIG)
    assert plan.detaches == ()


def test_node_being_deleted_releases_idle_gpus_at_once() -> None:
    node = make_node("w1", gpus=2, gpus_idle_since=NOW, being_deleted=True)
    plan = plan_scale_down(make_snapshot([node], [make_pod("job", gpus=1, node="w1")], now=NOW), CONFIG)
    assert detached(plan) == {"w1": ("w1-gpu-1",)}


def test_empty_node_is_removed_after_its_devices_are_released() -> None:
    nodes = [make_node("w1", gpus=2, empty_since=0.0), make_node("w2", gpus=1)]
    pods = [make_pod("job", gpus=1, node="w2"), make_pod("agent", node="w1", owner="DaemonSet")]
    plan = plan_scale_down(make_snapshot(nodes, pods, now=NOW, groups=[make_group(min_size=1)]), CONFIG)
    assert detached(plan) == {"w1": ("w1-gpu-0", "w1-gpu-1")}
    assert [(r.node, r.group) for r in plan.removals] == [("w1", "gpu")]
    assert plan.removals[0].reason.startswith("no work for 1000s (cooldown 10m)")


@pytest.mark.parametrize("empty_since, min_size, expected_keep", [
    pytest.param(NOW - 60, 0, "empty for 1m; removed after 10m", id="cooldown-not-reached"),
    pytest.param(0.0, 2, "at its min size 2", id="min-size-respected"),
])
def test_empty_node_is_kept(empty_since, min_size, expected_keep) -> None:
    nodes = [make_node("w1", empty_since=empty_since), make_node("w2")]
    plan = plan_scale_down(make_snapshot(nodes, [make_pod("job", node="w2")], now=NOW,
                                         groups=[make_group(min_size=min_size)]), CONFIG)
    assert plan.removals == ()
    assert any(k.node == "w1" and expected_keep in k.reason for k in plan.kept)


def test_min_size_counts_removals_of_the_same_plan() -> None:
    nodes = [make_node(f"w{i}", empty_since=0.0) for i in range(3)]
    plan = plan_scale_down(make_snapshot(nodes, [], now=NOW, groups=[make_group(min_size=1)]), CONFIG)
    assert [r.node for r in plan.removals] == ["w0", "w1"]
    assert [k.node for k in plan.kept] == ["w2"]


def test_node_removal_disabled_releases_gpus_only() -> None:
    nodes = [make_node("w1", gpus=1, empty_since=0.0, gpus_idle_since=0.0), make_node("w2")]
    plan = plan_scale_down(make_snapshot(nodes, [], now=NOW), PlannerConfig(node_removal_enabled=False))
    assert plan.removals == ()
    assert detached(plan) == {"w1": ("w1-gpu-0",)}
    assert any("disabled" in n for n in plan.notes)


def test_ca_candidate_whose_pods_fit_elsewhere_is_removed() -> None:
    nodes = [make_node("w1", gpus=1), make_node("w2", gpus=2)]
    pods = [make_pod("job", gpus=1, node="w1"), make_pod("other", gpus=1, node="w2")]
    plan = plan_scale_down(make_snapshot(nodes, pods, now=NOW), CONFIG, ["w1"])
    assert [r.node for r in plan.removals] == ["w1"]
    assert "default/job -> w2" in plan.removals[0].reason
    # The GPU in use goes only once the pod has moved: force-detach is off.
    assert detached(plan) == {}
    assert "released once its pods have moved" in plan.removals[0].reason


def test_ca_candidate_with_force_detach_releases_gpus_in_use() -> None:
    nodes = [make_node("w1", gpus=1), make_node("w2", gpus=2)]
    pods = [make_pod("job", gpus=1, node="w1")]
    plan = plan_scale_down(make_snapshot(nodes, pods, now=NOW, groups=[make_group(force_detach=True)]), CONFIG,
                           ["w1"])
    assert [(d.node, d.device_ids, d.force) for d in plan.detaches] == [("w1", ("w1-gpu-0",), True)]
    assert [r.node for r in plan.removals] == ["w1"]


def test_ca_candidate_with_a_pod_that_cannot_move_keeps_the_node_and_releases_idle_gpus() -> None:
    nodes = [make_node("w1", gpus=3), make_node("w2", gpus=4)]
    pods = [make_pod("db", gpus=1, node="w1", not_movable="PodDisruptionBudget db-pdb allows 0 disruptions")]
    plan = plan_scale_down(make_snapshot(nodes, pods, now=NOW), CONFIG, ["w1"])
    assert plan.removals == ()
    assert [k.node for k in plan.kept] == ["w1"]
    assert "cannot move (PodDisruptionBudget db-pdb" in plan.kept[0].reason
    assert detached(plan) == {"w1": ("w1-gpu-2", "w1-gpu-1")}  # GPU-only removal, no cooldown: CA asked


def test_ca_candidate_whose_pods_fit_nowhere_is_kept() -> None:
    nodes = [make_node("w1", gpus=1), make_node("w2")]
    pods = [make_pod("job", gpus=1, node="w1")]
    plan = plan_scale_down(make_snapshot(nodes, pods, now=NOW), CONFIG, ["w1"])
    assert plan.removals == ()
    assert "fits no other node" in plan.kept[0].reason and "Insufficient nvidia.com/gpu" in plan.kept[0].reason


def test_two_candidates_cannot_both_count_on_the_same_room() -> None:
    nodes = [make_node("a", cores=8), make_node("b", cores=8), make_node("c", cores=8)]
    pods = [make_pod("pa", cores=6, node="a"), make_pod("pb", cores=6, node="b")]
    plan = plan_scale_down(make_snapshot(nodes, pods, now=NOW), CONFIG, ["a", "b"])
    assert [r.node for r in plan.removals] == ["a"]
    assert [k.node for k in plan.kept] == ["b"]


def test_ca_candidate_at_min_size_is_kept() -> None:
    nodes = [make_node("w1", gpus=1), make_node("w2")]
    plan = plan_scale_down(make_snapshot(nodes, [], now=NOW, groups=[make_group(min_size=2)]), CONFIG, ["w1"])
    assert plan.removals == () and "below its min size 2" in plan.kept[0].reason
    assert detached(plan) == {"w1": ("w1-gpu-0",)}


def test_unknown_candidate_is_kept_with_a_reason() -> None:
    plan = plan_scale_down(make_snapshot([make_node("w1")], [], now=NOW), CONFIG, ["ghost"])
    assert [(k.node, k.reason) for k in plan.kept] == [("ghost", "CA asked to remove it, but it is not in the "
                                                                 "snapshot")]


def test_render_lists_every_step() -> None:
    nodes = [make_node("w1", gpus=1, empty_since=0.0), make_node("w2")]
    text = render_scale_down(plan_scale_down(make_snapshot(nodes, [], now=NOW), CONFIG))
    assert "detach w1-gpu-0 from w1" in text and "remove w1 (gpu)" in text
